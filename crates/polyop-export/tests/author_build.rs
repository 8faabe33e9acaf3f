//! Compile-level test of the authoring path: the out-of-tree example (`examples/swiglu`, its
//! own workspace, with the adapters as `default-features = false` dependencies) must build an
//! author's registry through each adapter's `export!` macro — torch, TensorFlow, ONNX Runtime
//! and XLA. `cargo check` of that workspace (its own target dir); `ci/example.sh` goes on to
//! build the libraries and run them in every framework.

use std::path::PathBuf;
use std::process::Command;

/// This crate's directory, read when the test runs (cargo test sets it), not baked in at
/// compile time: CI shares one target directory between checkouts at different paths, and
/// cargo counts a test binary built in another checkout as fresh (it failed pointing into a
/// clone that had been deleted).
fn manifest_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo test"))
}

#[test]
fn an_authors_registry_builds_through_every_export_macro() {
    let manifest = manifest_dir().join("../../examples/swiglu/Cargo.toml");
    assert!(manifest.is_file(), "{}", manifest.display());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["check", "--workspace", "--all-targets", "--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo check of examples/swiglu failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every framework crate of the example was checked (each is one export! invocation).
    let err = String::from_utf8_lossy(&out.stderr);
    for fw in ["torch", "tensorflow", "onnxruntime", "xla"] {
        let lib = manifest_dir()
            .join("../../examples/swiglu")
            .join(fw)
            .join("src/lib.rs");
        let src = std::fs::read_to_string(&lib).expect("example source");
        assert!(
            src.contains(&format!("polyop_{fw}::export!(")),
            "{} does not use the export! macro ({err})",
            lib.display()
        );
    }
}
