//! Error sink: the boxed entry point turns a polyop error (or a caught panic) into an `Err`
//! the `cxx` bridge throws as a C++ exception, which torch surfaces as `RuntimeError`.

use crate::call;
use crate::register::SLOTS;
use crate::sys;
use kernel_core::{catch_panic, Error};

/// The boxed entry point every trampoline calls (through the `cxx` bridge, [`sys::bridge`]).
/// Never unwinds: a polyop error or a caught panic comes back as `Err(message)`, which the
/// bridge throws as `rust::Error` (a `std::exception`) and torch surfaces as Python's
/// `RuntimeError`. A probe call ([`sys::PROBE_SLOT`]) writes this library's identity instead.
///
/// # Safety
/// Called by torch's boxed-kernel machinery with a stack of `max(num_args, num_outputs)`
/// StableIValues (or, for a probe, one writable `u64`).
pub(crate) unsafe fn boxed_call(
    slot: u32,
    stack: *mut sys::StableIValue,
    num_args: u64,
    num_outputs: u64,
) -> Result<(), String> {
    if slot == sys::PROBE_SLOT {
        // SAFETY: a probe passes one writable u64 (this function's contract).
        unsafe { *stack = library_identity() };
        return Ok(());
    }
    let result = match SLOTS.get(slot as usize) {
        // SAFETY: this function's contract; `st` is the op registered in `slot`, the one whose
        // trampoline torch called.
        Some(st) => catch_panic(st.op, || unsafe {
            call::call(st, stack, num_args, num_outputs)
        }),
        None => Err(Error::internal(format!("no op registered in slot {slot}"))),
    };
    // A C++ exception's what() ends at the first NUL.
    result.map_err(|e| e.to_string().replace('\0', "\\0"))
}

/// What a probe writes: the address of this library's slot table, different in every library
/// that links the adapter.
pub(crate) fn library_identity() -> u64 {
    &SLOTS as *const _ as u64
}
