//! Error sink: polyop errors (and panics, caught by kernel-core's boundary) become
//! `OrtStatus*` values; statuses from ONNX Runtime become polyop errors.

use crate::sys::Api;
use kernel_core::ffi::{c_message, string_from_c};
use kernel_core::{call, Error, ErrorKind, OpDef, Result};
use ort_sys::{OrtErrorCode, OrtStatus, OrtStatusPtr};

/// Run `f` at the FFI boundary: an error or a panic becomes an `OrtStatus*` naming `op`.
pub(crate) fn guard(api: Api, op: &OpDef, f: impl FnOnce() -> Result<()>) -> OrtStatusPtr {
    call::boundary(op, OrtStatusPtr(std::ptr::null_mut()), f, |e| {
        OrtStatusPtr(api.status(&e))
    })
}

impl Api {
    /// Turn a status into a result, releasing it.
    pub fn check(&self, st: OrtStatusPtr) -> Result<()> {
        if st.0.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null status from this API; released exactly once here.
        unsafe {
            let code = (self.0.GetErrorCode)(st.0);
            let msg = string_from_c((self.0.GetErrorMessage)(st.0)).unwrap_or_default();
            (self.0.ReleaseStatus)(st.0);
            let msg = format!("onnxruntime: {msg}");
            Err(if code == OrtErrorCode::ORT_INVALID_ARGUMENT {
                Error::invalid(msg)
            } else {
                Error::internal(msg)
            })
        }
    }

    /// Release a status without looking at it.
    pub fn release(&self, st: OrtStatusPtr) {
        if !st.0.is_null() {
            // SAFETY: as in `check`.
            unsafe { (self.0.ReleaseStatus)(st.0) }
        }
    }

    /// A new status for `err`: invalid arguments -> ORT_INVALID_ARGUMENT, everything else ->
    /// ORT_FAIL. The message is the error's Display ("polyop.<op>: ...").
    pub fn status(&self, err: &Error) -> *mut OrtStatus {
        let code = match err.kind {
            ErrorKind::InvalidArgument => OrtErrorCode::ORT_INVALID_ARGUMENT,
            ErrorKind::Unsupported | ErrorKind::Internal => OrtErrorCode::ORT_FAIL,
        };
        self.status_msg(code, &err.to_string())
    }

    pub fn status_msg(&self, code: OrtErrorCode, msg: &str) -> *mut OrtStatus {
        // SAFETY: CreateStatus copies the message.
        unsafe { (self.0.CreateStatus)(code, c_message(msg).as_ptr()).0 }
    }
}
