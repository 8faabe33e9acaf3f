//! Error sink: polyop errors become TF statuses (`InvalidArgumentError`, `UnimplementedError`,
//! `InternalError` in Python).

use crate::sys::*;
use kernel_core::{Error, ErrorKind};

/// Report `e` through `status`.
///
/// # Safety
/// `status` is a live `TF_Status`.
pub(crate) unsafe fn report(status: *mut TF_Status, e: &Error) {
    // SAFETY: this function's contract.
    unsafe { set_status(status, status_code(e.kind), &e.to_string()) }
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
