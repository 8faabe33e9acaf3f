//! Finds the PyTorch wheel (its headers and `libtorch_cpu.so`), compiles the thin C++
//! trampoline layer (`cxx/trampoline.cpp`) and links against the wheel with an rpath, so
//! `torch.ops.load_library(path)` works with nothing else set.
//!
//! Torch is located through `$POLYOP_TORCH_DIR` (the `torch` package directory), else by
//! asking a Python interpreter: `$POLYOP_PYTHON`, else `<workspace>/.venv/bin/python`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn torch_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("POLYOP_TORCH_DIR") {
        return PathBuf::from(dir);
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.join("../..");
    let python = std::env::var("POLYOP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace.join(".venv/bin/python"));
    let out = Command::new(&python)
        .args([
            "-c",
            "import torch, os; print(os.path.dirname(torch.__file__))",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string())
        }
        Ok(o) => panic!(
            "polyop-torch: `{} -c 'import torch'` failed:\n{}\nSet POLYOP_PYTHON to a Python \
             with torch installed (or POLYOP_TORCH_DIR to the torch package directory).",
            python.display(),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!(
            "polyop-torch: cannot run Python `{}` ({e}) to locate torch. Create the project \
             venv (.venv) or set POLYOP_PYTHON to a Python with torch installed (or \
             POLYOP_TORCH_DIR to the torch package directory).",
            python.display()
        ),
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=POLYOP_PYTHON");
    println!("cargo:rerun-if-env-changed=POLYOP_TORCH_DIR");
    println!("cargo:rerun-if-changed=cxx/trampoline.cpp");
    println!("cargo:rerun-if-changed=build.rs");

    let torch = torch_dir();
    let include = torch.join("include");
    let lib = torch.join("lib");
    for (p, what) in [
        (&include, "headers"),
        (&lib.join("libtorch_cpu.so"), "libtorch_cpu.so"),
    ] {
        if !Path::new(p).exists() {
            panic!(
                "polyop-torch: torch {what} not found at {} (torch dir {})",
                p.display(),
                torch.display()
            );
        }
    }

    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("cxx/trampoline.cpp")
        .include(&include)
        // Target the stable ABI of the installed torch (2.13); the library keeps working on
        // later releases that honour that ABI version.
        .define("TORCH_TARGET_VERSION", "0x020d000000000000ULL")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("polyop_torch_cxx");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    // Resolve libtorch_cpu.so from the wheel when loaded outside Python; inside Python the
    // already-loaded copy (same soname) is reused.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
