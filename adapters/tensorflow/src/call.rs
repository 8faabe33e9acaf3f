//! TF CPU kernels: attributes read once at kernel construction, inputs as views of TF's
//! (contiguous, row-major) tensors, outputs allocated by TF (`TF_AllocateOutput`) to the shapes
//! kernel-core infers, then `op.compute` writes into them.

use crate::attrs::read_attrs;
use crate::error::status_of;
use crate::pool::pool;
use crate::register::OPS;
use crate::sys::*;
use crate::tensor::{input_view, Tensors, TfOutputs};
use kernel_core::{call, catch_panic, CallSite, Error, OpDef, Phase, Result};
use std::os::raw::c_void;

/// What a kernel instance keeps between calls.
pub struct KernelState {
    pub op: &'static OpDef,
    /// The bound attributes and the shapes inferred for recent input shapes.
    pub site: CallSite,
    /// Per tensor argument: present (optional lists have length 1) or absent.
    pub present: Vec<bool>,
}

/// One compute call.
///
/// # Safety
/// `ctx` is the context of a running compute call of `st`'s kernel.
pub unsafe fn compute(st: &KernelState, ctx: *mut TF_OpKernelContext) -> Result<()> {
    // SAFETY: `ctx` is the live context of this compute call.
    let n = unsafe { TF_NumInputs(ctx) } as usize;
    let expected = st.present.iter().filter(|p| **p).count();
    if n != expected {
        return Err(Error::internal(format!(
            "TF passed {n} input tensors, the node declares {expected}"
        )));
    }
    let mut ins = Tensors(Vec::with_capacity(n));
    let s = Status::new();
    for i in 0..n {
        let mut t: *mut TF_Tensor = std::ptr::null_mut();
        // SAFETY: i < the context's input count.
        unsafe { TF_GetInput(ctx, i as i32, &mut t, s.0) };
        if !s.ok() || t.is_null() {
            return Err(Error::internal(format!(
                "TF_GetInput({i}): {}",
                s.message()
            )));
        }
        ins.0.push(t);
    }
    let mut flat = ins.0.iter();
    let views = st
        .present
        .iter()
        .map(|&p| {
            // SAFETY: each handle is a live input tensor of this call (owned by `ins`, which
            // outlives the views); the views are used only within this call.
            p.then(|| unsafe { input_view(*flat.next().expect("counted")) })
                .transpose()
        })
        .collect::<Result<Vec<_>>>()?;
    let mut outs = TfOutputs {
        ctx,
        keep: Tensors(Vec::new()),
    };
    call::run(st.op, &views, &st.site, &mut outs, pool(), Phase::Compute)
}

pub unsafe extern "C" fn compute_tramp(state: *mut c_void, ctx: *mut TF_OpKernelContext) {
    if state.is_null() {
        return;
    }
    // SAFETY: created by create_tramp as a Box<KernelState>.
    let st = unsafe { &*(state as *const KernelState) };
    // SAFETY: TF calls the compute function with the context of this compute call.
    if let Err(e) = catch_panic(st.op, || unsafe { compute(st, ctx) }) {
        // SAFETY: `ctx` is live; TF copies the status.
        unsafe { TF_OpKernelContext_Failure(ctx, status_of(&e).0) };
    }
}

pub unsafe extern "C" fn delete_tramp(state: *mut c_void) {
    if !state.is_null() {
        // SAFETY: created by create_tramp as a Box<KernelState>.
        drop(unsafe { Box::from_raw(state as *mut KernelState) });
    }
}

/// Kernel construction for the op in slot `slot`.
///
/// # Safety
/// `ctx` is the context of a running kernel construction.
pub unsafe fn create(slot: usize, ctx: *mut TF_OpKernelConstruction) -> *mut c_void {
    let r = match OPS.get(slot) {
        // SAFETY: `ctx` is live (this function's contract).
        Some(op) => catch_panic(op, || unsafe { read_attrs(op, ctx) }),
        None => Err(Error::internal("kernel slot without an op")),
    };
    match r {
        Ok(st) => Box::into_raw(Box::new(st)) as *mut c_void,
        Err(e) => {
            // SAFETY: `ctx` is live (this function's contract); TF copies the status.
            unsafe { TF_OpKernelConstruction_Failure(ctx, status_of(&e).0) };
            std::ptr::null_mut()
        }
    }
}
