//! Error sink: the boxed entry point turns a polyop error (or a caught panic) into a message
//! the C++ layer throws as `std::runtime_error`, which torch surfaces as `RuntimeError`.

use crate::call;
use crate::register::SLOTS;
use crate::sys as ffi;
use kernel_core::{catch_panic, Error};
use std::ffi::{c_char, CString};

/// The boxed entry point every trampoline calls (through a function pointer handed to the C++
/// layer, not an exported symbol, so several polyop libraries can live in one process). Never unwinds: returns null on success or an
/// error message (released by [`polyop_torch_free_error`]) that the C++ side throws as
/// `std::runtime_error`, which torch surfaces as Python's `RuntimeError`.
///
/// # Safety
/// Called by torch's boxed-kernel machinery with a stack of `max(num_args, num_outputs)`
/// StableIValues.
pub unsafe extern "C" fn polyop_torch_boxed_call(
    slot: u32,
    stack: *mut ffi::StableIValue,
    num_args: u64,
    num_outputs: u64,
) -> *mut c_char {
    let op = {
        let slots = SLOTS.read().unwrap_or_else(|e| e.into_inner());
        slots.get(slot as usize).copied()
    };
    let result = match op {
        // SAFETY: this function's contract; `st` is the op registered in `slot`, the one whose
        // trampoline torch called.
        Some(st) => catch_panic(st.op, || unsafe {
            call::call(st, stack, num_args, num_outputs)
        }),
        None => Err(Error::internal(format!("no op registered in slot {slot}"))),
    };
    match result {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => {
            let msg = e.to_string().replace('\0', "\\0");
            CString::new(msg).unwrap_or_default().into_raw()
        }
    }
}

/// Release an error message returned by [`polyop_torch_boxed_call`].
///
/// # Safety
/// `msg` must come from `polyop_torch_boxed_call` and be released once.
pub unsafe extern "C" fn polyop_torch_free_error(msg: *mut c_char) {
    if !msg.is_null() {
        // SAFETY: allocated by CString::into_raw above.
        drop(unsafe { CString::from_raw(msg) });
    }
}
