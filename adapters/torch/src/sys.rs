//! The libtorch stable C ABI (`torch/csrc/inductor/aoti_torch/c/shim.h` and
//! `torch/csrc/stable/c/shim.h`) that the adapter uses. The declarations are bindgen output,
//! committed in `sys/bindings.rs` and regenerated with `scripts/bindgen.conf` (`crates/polyop-build/scripts/regen-bindings.sh`); this file
//! keeps the rest: `SUCCESS`, the `cxx` bridge to the C++ trampoline layer
//! (`cxx/trampoline.cpp`) and `last_error`. Symbols resolve from `libtorch_cpu.so`.

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod bindings;
pub use bindings::*;

/// `AOTITorchError` of a successful call (the `AOTI_TORCH_SUCCESS` macro; bindgen types it u32).
pub const SUCCESS: AOTITorchError = AOTI_TORCH_SUCCESS as AOTITorchError;

/// The slot number of a probe call (`cxx/trampoline.cpp` passes `UINT32_MAX`), never a real
/// slot.
pub const PROBE_SLOT: u32 = u32::MAX;

/// The C++ layer (`cxx/trampoline.cpp`), crossed with `cxx`: torch calls a trampoline, the
/// trampoline calls [`crate::error::boxed_call`], and an `Err` it returns is thrown as
/// `rust::Error` (a `std::exception` with polyop's message) for torch to report.
#[cxx::bridge(namespace = "polyop_torch")]
pub mod bridge {
    extern "Rust" {
        unsafe fn boxed_call(
            slot: u32,
            stack: *mut u64,
            num_args: u64,
            num_outputs: u64,
        ) -> Result<()>;
    }
    unsafe extern "C++" {
        include!("polyop-torch/cxx/trampoline.h");
        #[namespace = ""]
        type TorchLibraryOpaque;
        fn num_slots() -> u32;
        unsafe fn impl_slot(lib: *mut TorchLibraryOpaque, name: &str, slot: u32) -> Result<()>;
        unsafe fn probe(token: *mut u64);
    }
}

use crate::error::boxed_call;

/// The message of the exception behind the last failed shim call on this thread.
pub fn last_error() -> String {
    // SAFETY: returns a borrowed, NUL-terminated string or null.
    unsafe { kernel_core::ffi::string_from_c(torch_exception_get_what_without_backtrace()) }
        .unwrap_or_else(|| "unknown torch error".to_string())
}
