//! Finds the PyTorch wheel (its headers and `libtorch_cpu.so`), compiles the thin C++
//! trampoline layer (`cxx/trampoline.cpp`) with its `cxx` bridge (`src/sys.rs`) and links against the wheel without an absolute
//! RUNPATH, so the library can be moved: `torch.ops.load_library(path)` after `import torch`
//! works with nothing else set.
//!
//! Torch is located by `polyop_build::package_dir` (`$POLYOP_TORCH_DIR`, else the package of
//! `$POLYOP_PYTHON` or the workspace venv).

use std::path::Path;

fn main() {
    for f in ["cxx/trampoline.cpp", "cxx/trampoline.h", "src/sys.rs"] {
        println!("cargo:rerun-if-changed={f}");
    }
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

    // The cxx bridge (src/sys.rs) and the trampoline layer it declares, in one static library.
    cxx_build::bridge("src/sys.rs")
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
    // No absolute RUNPATH: the library must work wherever it is moved. Loaded the normal way
    // (`torch.ops.load_library` after `import torch`), the dynamic loader reuses the
    // libtorch_cpu.so torch already loaded (same soname). The one relative entry finds torch's
    // libraries from a wheel layout (site-packages/polyop/lib/ -> site-packages/torch/lib).
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/../../torch/lib");
    // References inside the library bind to its own definitions: the bridge's entry symbol has
    // the same name in every polyop-built torch library, and one loaded earlier with
    // RTLD_GLOBAL must not take this one's calls (checked at registration too).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
