//! The kernel entry (`polyop_<name>`, MindSpore's AOT kernel ABI: inputs, then outputs, each
//! with its dims and dtype name, plus the primitive's attributes) -> kernel-core's call path,
//! with MindSpore's pre-allocated outputs checked against shape inference. Inputs left out
//! at the end are absent optional tensors.

use crate::attrs::decode;
use crate::error::entry;
use crate::sys::AotExtra;
use crate::tensor::{concrete, dims, dtype_of, view};
use kernel_core::call::{self, Preallocated};
use kernel_core::ffi::string_from_c;
use kernel_core::{default_pool, CallSite, Error, Phase};
use std::ffi::c_char;

/// # Safety
/// MindSpore's kernel call: `params`, `ndims`, `shapes` and `dtypes` are arrays of `nparam`
/// entries (inputs then outputs) describing dense buffers live for the call; `extra` is its
/// AotExtra.
pub(crate) unsafe fn launch(
    slot: usize,
    nparam: i32,
    params: usize,
    ndims: *const i32,
    shapes: usize,
    dtypes: usize,
    extra: *mut AotExtra,
) -> Result<(), String> {
    entry(slot, |op| {
        let (params, shapes) = (params as *const *mut u8, shapes as *const *const i64);
        let dtypes = dtypes as *const *const c_char;
        let n = (nparam.max(0) as usize)
            .checked_sub(op.num_outputs())
            .filter(|&n| n <= op.num_inputs())
            .ok_or_else(|| Error::invalid(format!("unexpected parameter count {nparam}")))?;
        // SAFETY: i < nparam, the length of MindSpore's arrays (this function's contract).
        let dtype_name = |i: usize| unsafe { string_from_c(*dtypes.add(i)) }.unwrap_or_default();
        let mut inputs = Vec::with_capacity(op.num_inputs());
        for (i, arg) in op.schema.tensor_args().enumerate() {
            inputs.push(match i < n {
                false => None,
                true => {
                    let dtype = dtype_of(op, &arg.name, &dtype_name(i))?;
                    // SAFETY: i < nparam; MindSpore's buffer of those dims and dtype.
                    Some(unsafe { view(dtype, &dims(ndims, shapes, i), *params.add(i))? })
                }
            });
        }
        let mut buffers = Vec::with_capacity(op.num_outputs());
        for k in n..n + op.num_outputs() {
            let dtype = dtype_of(op, "output", &dtype_name(k))?;
            // SAFETY: k < nparam, as above.
            let (shape, data) = unsafe { (concrete(&dims(ndims, shapes, k))?, *params.add(k)) };
            buffers.push((dtype, shape, data));
        }
        // SAFETY: MindSpore allocated each output, dense, for the call.
        let mut outputs = unsafe { Preallocated::new(op, buffers)? };
        let site = CallSite::once(decode(op, extra)?);
        call::run(
            op,
            &inputs,
            &site,
            &mut outputs,
            default_pool(),
            Phase::Compute,
        )
    })
}
