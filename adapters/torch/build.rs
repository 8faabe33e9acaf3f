//! Finds the PyTorch wheel (its headers and `libtorch_cpu.so`), compiles the thin C++
//! trampoline layer (`cxx/trampoline.cpp`) and links against the wheel with an rpath, so
//! `torch.ops.load_library(path)` works with nothing else set.
//!
//! Torch is located by `polyop_build::package_dir` (`$POLYOP_TORCH_DIR`, else the package of
//! `$POLYOP_PYTHON` or the workspace venv).

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=cxx/trampoline.cpp");
    println!("cargo:rerun-if-changed=build.rs");

    let torch = polyop_build::package_dir("torch", "POLYOP_TORCH_DIR")
        .unwrap_or_else(|e| panic!("polyop-torch: {e}"));
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
