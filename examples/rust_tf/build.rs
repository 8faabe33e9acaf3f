//! Links the binary against the TensorFlow that `build.sh` describes in `tensorflow.pc`.
//! tensorflow-sys probes the same file, but the `-l:libtensorflow_cc.so.2` and rpath flags it
//! prints are link arguments, which cargo applies only to the package that printed them.
fn main() {
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    // relink when build.sh points the file at another TensorFlow
    for dir in std::env::var("PKG_CONFIG_PATH")
        .unwrap_or_default()
        .split(':')
    {
        let pc = std::path::Path::new(dir).join("tensorflow.pc");
        if pc.is_file() {
            println!("cargo:rerun-if-changed={}", pc.display());
        }
    }
    if let Err(e) = pkg_config::Config::new().probe("tensorflow") {
        panic!("no tensorflow.pc: build with examples/rust_tf/build.sh ({e})");
    }
}
