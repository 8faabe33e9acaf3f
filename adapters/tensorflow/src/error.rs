//! Error sink: polyop errors become TF statuses (`InvalidArgumentError`, `UnimplementedError`,
//! `InternalError` in Python).

use crate::sys::*;
use kernel_core::ffi::c_message;
use kernel_core::{Error, ErrorKind};

/// Report `e` through `status` (interior NULs of the message made visible).
///
/// # Safety
/// `status` is a live `TF_Status`.
pub(crate) unsafe fn report(status: *mut TF_Status, e: &Error) {
    let msg = c_message(&e.to_string());
    // SAFETY: `status` is live (this function's contract); TF copies the message.
    unsafe { TF_SetStatus(status, status_code(e.kind), msg.as_ptr()) }
}

/// A new status carrying `e`, for the calls that take one to report a failure.
pub(crate) fn status_of(e: &Error) -> Status {
    let s = Status::new();
    // SAFETY: `s` is a live status owned here.
    unsafe { report(s.0, e) };
    s
}

fn status_code(kind: ErrorKind) -> TF_Code {
    match kind {
        ErrorKind::InvalidArgument => TF_INVALID_ARGUMENT,
        ErrorKind::Unsupported => TF_UNIMPLEMENTED,
        ErrorKind::Internal => TF_INTERNAL,
    }
}
