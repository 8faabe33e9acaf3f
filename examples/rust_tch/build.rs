//! An rpath to the libtorch that torch-sys linked (the pip wheel's `torch/lib` with
//! `LIBTORCH_USE_PYTORCH=1`), so the program runs without `LD_LIBRARY_PATH`; and
//! `src/autograd.cpp`, polyop_tch's torch-autograd glue, compiled against that libtorch's C++
//! headers with the flags torch-sys compiles its own C++ with (`-std=c++17`, the libtorch's
//! `_GLIBCXX_USE_CXX11_ABI`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    println!("cargo:rerun-if-changed=src/autograd.cpp");
    // torch-sys's `links = "tch"` metadata: the libtorch lib directory it linked.
    let lib = PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB"),
    );
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // `<torch>/lib` -> `<torch>/include` (the wheel's and libtorch's layout alike)
    let root = lib.parent().expect("libtorch lib dir has a parent");
    let include = root.join("include");
    cc::Build::new()
        .cpp(true)
        .file("src/autograd.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={}", cxx11_abi()))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .warnings(false)
        .compile("polyop_tch_autograd");
}

/// The libtorch's C++ ABI: `LIBTORCH_CXX11_ABI` if set (torch-sys reads the same variable), else
/// asked of the torch Python package when tch uses it (`LIBTORCH_USE_PYTORCH`, as torch-sys
/// does), else 1 (every torch >= 2.7 build).
fn cxx11_abi() -> String {
    if let Ok(v) = std::env::var("LIBTORCH_CXX11_ABI") {
        return v;
    }
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    println!("cargo:rerun-if-env-changed=PYTHON_SYS_EXECUTABLE");
    if std::env::var_os("LIBTORCH_USE_PYTORCH").is_some() {
        let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python".into());
        let out = Command::new(&python)
            .args([
                "-c",
                "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))",
            ])
            .output()
            .unwrap_or_else(|e| panic!("running {python}: {e}"));
        assert!(
            out.status.success(),
            "{python}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    "1".into()
}
