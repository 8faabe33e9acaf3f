//! Error sink: polyop errors become `XLA_FFI_Error`s (XLA raises them as JAX runtime errors).

use crate::sys;
use kernel_core::{Error, ErrorKind};

pub type FfiError = *mut sys::XLA_FFI_Error;

/// Destroy an error returned to us by an API call.
///
/// # Safety
/// `api` is a valid API table and `err` an error it created.
pub unsafe fn destroy_error(api: *const sys::XLA_FFI_Api, err: FfiError) {
    if api.is_null() || err.is_null() {
        return;
    }
    // SAFETY: `api` is a non-null, valid API table (this function's contract); the field is
    // part of every API version (0.1 on).
    if let Some(destroy) = unsafe { (*api).XLA_FFI_Error_Destroy } {
        let mut args = sys::XLA_FFI_Error_Destroy_Args {
            struct_size: sys::XLA_FFI_Error_Destroy_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            error: err,
        };
        // SAFETY: `err` was created by this table (this function's contract) and is not used
        // again by the caller; `args` is a complete, correctly sized argument struct.
        unsafe { destroy(&mut args) };
    }
}

pub(crate) fn error_code(kind: ErrorKind) -> sys::XLA_FFI_Error_Code {
    match kind {
        ErrorKind::InvalidArgument => sys::XLA_FFI_Error_Code_XLA_FFI_Error_Code_INVALID_ARGUMENT,
        ErrorKind::Unsupported => sys::XLA_FFI_Error_Code_XLA_FFI_Error_Code_UNIMPLEMENTED,
        ErrorKind::Internal => sys::XLA_FFI_Error_Code_XLA_FFI_Error_Code_INTERNAL,
    }
}

/// Turn a polyop error into an FFI error owned by XLA. Returns null only when the API table
/// cannot create errors at all (then nothing better can be done).
///
/// # Safety
/// `api` is null or a valid API table.
pub unsafe fn make_error(api: *const sys::XLA_FFI_Api, err: &Error) -> FfiError {
    if api.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `api` is a non-null, valid API table (this function's contract); the field is
    // part of every API version (0.1 on).
    let Some(create) = (unsafe { (*api).XLA_FFI_Error_Create }) else {
        return std::ptr::null_mut();
    };
    let msg = kernel_core::ffi::c_message(&err.to_string());
    let mut args = sys::XLA_FFI_Error_Create_Args {
        struct_size: sys::XLA_FFI_Error_Create_Args_STRUCT_SIZE as usize,
        extension_start: std::ptr::null_mut(),
        message: msg.as_ptr(),
        errc: error_code(err.kind),
    };
    // SAFETY: `args` is a complete, correctly sized argument struct and `msg` a NUL-terminated
    // string alive across the call; XLA copies the message into its own status object.
    unsafe { create(&mut args) }
}
