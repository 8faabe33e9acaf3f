//! Finds TensorFlow's `libtensorflow_framework.so.2` (where the C API symbols `TF_NewOpDefinitionBuilder`,
//! `TF_NewKernelBuilder`, `TF_AllocateOutput`, ... live in the pip wheel) and links it without an
//! absolute RUNPATH, so the library can be moved and `tf.load_op_library` after
//! `import tensorflow` needs nothing else (located by `polyop_build::package_dir`).

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());

    let tf_dir = polyop_build::package_dir("tensorflow", "POLYOP_TF_DIR").and_then(|d| {
        if d.join("libtensorflow_framework.so.2").exists() {
            Ok(d)
        } else {
            Err(format!(
                "{} has no libtensorflow_framework.so.2",
                d.display()
            ))
        }
    });
    let tf_dir = match tf_dir {
        Ok(d) => d,
        Err(e) => {
            println!(
                "cargo:warning=polyop-tensorflow: {e}; libpolyop_tensorflow.so is built \
                 without a link to libtensorflow_framework.so.2 and only loads into a process \
                 that already has it loaded globally"
            );
            return;
        }
    };
    let lib = tf_dir.join("libtensorflow_framework.so.2");
    println!("cargo:rerun-if-changed={}", lib.display());
    // The wheel ships only the versioned name; give the linker an unversioned one. The
    // NEEDED entry is the library's SONAME (libtensorflow_framework.so.2).
    let link = out.join("libtensorflow_framework.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link).expect("symlink libtensorflow_framework.so");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=dylib=tensorflow_framework");
    // No absolute RUNPATH (the library must work wherever it is moved): after
    // `import tensorflow` the loader reuses the loaded libtensorflow_framework.so.2 (same
    // soname); the relative entry finds it from a wheel layout (site-packages/polyop/lib/).
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/../../tensorflow");
    println!("cargo:rustc-env=POLYOP_TF_DIR={}", tf_dir.display());
}
