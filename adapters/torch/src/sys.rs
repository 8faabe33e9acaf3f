//! The libtorch stable C ABI (`torch/csrc/inductor/aoti_torch/c/shim.h` and
//! `torch/csrc/stable/c/shim.h`) that the adapter uses. The declarations are bindgen output,
//! committed in `sys/bindings.rs` and regenerated with `scripts/bindgen.conf` (`crates/polyop-build/scripts/regen-bindings.sh`); this file
//! keeps the hand-written rest: `SUCCESS`, the two calls taking non-null callbacks, the C++
//! trampoline layer (`cxx/trampoline.cpp`) and `last_error`. Symbols resolve from
//! `libtorch_cpu.so`.

use std::ffi::c_char;

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

/// The boxed kernel `torch_library_impl` takes (unnamed in the headers), non-null.
pub type BoxedFn = unsafe extern "C" fn(*mut StableIValue, u64, u64);

/// `AOTITorchError` of a successful call (the `AOTI_TORCH_SUCCESS` macro; bindgen types it u32).
pub const SUCCESS: AOTITorchError = AOTI_TORCH_SUCCESS as AOTITorchError;

// The C++ trampoline layer (cxx/trampoline.cpp).
extern "C" {
    pub fn polyop_torch_set_entry(
        call: unsafe extern "C" fn(u32, *mut StableIValue, u64, u64) -> *mut c_char,
        free_error: unsafe extern "C" fn(*mut c_char),
    );
    pub fn polyop_torch_num_slots() -> u32;
    pub fn polyop_torch_slot(i: u32) -> Option<BoxedFn>;
    pub fn polyop_torch_build_version() -> u64;
}

/// The message of the exception behind the last failed shim call on this thread.
pub fn last_error() -> String {
    // SAFETY: returns a borrowed, NUL-terminated string or null.
    unsafe {
        let p = torch_exception_get_what_without_backtrace();
        if p.is_null() {
            "unknown torch error".to_string()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}
