//! Error sink: every entry point runs under [`entry`], which turns a polyop error (or a caught
//! panic) into an `Err(message)`; the `cxx` bridge throws it as `rust::Error`, a
//! `std::exception` whose `what()` MindSpore puts in its own error ("For polyop_<name>,
//! operator failed ... Error message is polyop.<name>: ...").

use crate::register::op_at;
use kernel_core::{catch_panic, OpDef, Result};

/// Run `f` for the op of export slot `slot`; no panic escapes.
pub(crate) fn entry<T>(
    slot: usize,
    f: impl FnOnce(&'static OpDef) -> Result<T>,
) -> Result<T, String> {
    let op = op_at(slot).map_err(|e| e.to_string())?;
    // A C++ exception's what() ends at the first NUL.
    catch_panic(op, || f(op)).map_err(|e| e.to_string().replace('\0', "\\0"))
}
