//! The part of the TensorFlow C API polyop uses (`tensorflow/c/{tf_status,tf_tensor,ops,
//! kernels}.h` from the wheel's `include/`). The declarations are bindgen output, committed in
//! `sys/bindings.rs` and regenerated with `scripts/bindgen.conf` (`crates/polyop-build/scripts/regen-bindings.sh`); this file keeps only what
//! the headers do not declare as such (macros, callback types, the two registration calls taking
//! non-null callbacks) and the `Status` RAII wrapper. Symbols resolve from
//! `libtensorflow_framework.so.2`.

#![allow(non_camel_case_types, non_snake_case)]

use std::os::raw::{c_uchar, c_void};

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

/// `TF_Bool` is a macro (`c_api_macros.h`): `unsigned char`.
pub type TF_Bool = c_uchar;

// `TF_OK` & co. are macros over the `TSL_Code` enum constants (`tf_status.h`).
pub const TF_OK: TF_Code = TSL_OK;
pub const TF_INVALID_ARGUMENT: TF_Code = TSL_INVALID_ARGUMENT;
pub const TF_UNIMPLEMENTED: TF_Code = TSL_UNIMPLEMENTED;
pub const TF_INTERNAL: TF_Code = TSL_INTERNAL;

// The callback parameter types of the registration calls, unnamed in the headers.
pub type ShapeFn = unsafe extern "C" fn(*mut TF_ShapeInferenceContext, *mut TF_Status);
pub type CreateFn = unsafe extern "C" fn(*mut TF_OpKernelConstruction) -> *mut c_void;

/// An owned `TF_Status`.
pub struct Status(pub *mut TF_Status);

impl Status {
    pub fn new() -> Self {
        // SAFETY: plain allocation.
        Status(unsafe { TF_NewStatus() })
    }
    pub fn ok(&self) -> bool {
        // SAFETY: self.0 is a live status.
        unsafe { TF_GetCode(self.0) == TF_OK }
    }
    pub fn message(&self) -> String {
        // SAFETY: self.0 is live.
        unsafe { message_of(self.0) }
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        // SAFETY: allocated by TF_NewStatus.
        unsafe { TF_DeleteStatus(self.0) }
    }
}

/// The message of a live status.
/// # Safety
/// `s` must be a live status.
pub unsafe fn message_of(s: *const TF_Status) -> String {
    // SAFETY: `TF_Message` returns null or a NUL-terminated string owned by the live status.
    unsafe { kernel_core::ffi::string_from_c(TF_Message(s)) }.unwrap_or_default()
}
