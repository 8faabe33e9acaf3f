//! An rpath to the libtorch that torch-sys linked (the pip wheel's `torch/lib` with
//! `LIBTORCH_USE_PYTORCH=1`), so the program runs without `LD_LIBRARY_PATH`.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
