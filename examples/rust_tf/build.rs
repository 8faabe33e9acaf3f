//! Links the binary against the TensorFlow that `build.sh` describes in `tensorflow.pc`.
//! tensorflow-sys probes the same file, but the `-l:libtensorflow_cc.so.2` and rpath flags it
//! prints are link arguments, which cargo applies only to the package that printed them.
fn main() {
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if let Err(e) = pkg_config::Config::new()
        .cargo_metadata(true)
        .probe("tensorflow")
    {
        panic!("no tensorflow.pc: build with examples/rust_tf/build.sh ({e})");
    }
}
