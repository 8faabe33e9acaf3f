//! Compiles the C++ layer (`cxx/aot.cpp`) with its `cxx` bridge (`src/sys.rs`) and the
//! per-op exports MindSpore finds by name: one `POLYOP_MS_OP1(slot, polyop_<name>)` line (or
//! `POLYOP_MS_OPN` for several outputs) per exported registry op, written from the registry
//! itself. Needs no MindSpore at build time: the one MindSpore type used is declared in
//! `cxx/aot.h`, and the library links nothing of MindSpore's.

use std::fmt::Write;

fn main() {
    for f in [
        "cxx/aot.cpp",
        "cxx/aot.h",
        "cxx/exports.map",
        "src/sys.rs",
        "build.rs",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    let mut exports = String::from("#include \"polyop-mindspore/cxx/aot.h\"\n");
    for (slot, op) in polyop_kernels::registry().ops().enumerate() {
        if op.flags.inplace {
            continue; // torch-only (src/register.rs `is_exported`)
        }
        let arity = if op.num_outputs() > 1 { "N" } else { "1" };
        writeln!(exports, "POLYOP_MS_OP{arity}({slot}, polyop_{})", op.name).unwrap();
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("exports.cpp");
    std::fs::write(&out, exports).unwrap();

    cxx_build::bridge("src/sys.rs")
        .std("c++17")
        .file("cxx/aot.cpp")
        .file(&out)
        // The libstdc++ ABI of the MindSpore wheel (std::string / std::vector in AotExtra and
        // the infer functions' signatures).
        .define("_GLIBCXX_USE_CXX11_ABI", "0")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-return-type-c-linkage")
        // Nothing in Rust references the exports: keep every object of the archive.
        .link_lib_modifier("+whole-archive")
        .compile("polyop_mindspore_cxx");
    // rustc's version script exports only Rust's symbols; the exports are C++'s.
    // References bind to this library's own definitions (cxx's runtime symbols are exported
    // by every cxx-built library).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    // MindSpore dlopens and dlcloses the library around every shape and type inference: never
    // unloaded, it is not loaded again (with its registry built again) on every call.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    // The script from OUT_DIR, not the checkout: this build's output (the link line) is kept
    // in a target directory CI shares between checkouts at different paths, and a relink from
    // a checkout elsewhere must not name a file in a clone that may be gone.
    let map = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("exports.map");
    std::fs::copy("cxx/exports.map", &map).unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
