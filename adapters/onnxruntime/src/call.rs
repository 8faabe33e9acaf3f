//! The kernel: created once per node (attributes read and bound, dtypes and known shapes
//! validated so a bad node fails session creation), then each compute call hands the node's
//! tensors to kernel-core's one call path.

use crate::error::guard;
use crate::pool::OrtPool;
use crate::register::{this, PolyOp};
use crate::shape::info_specs;
use crate::sys::Api;
use crate::tensor::{inputs, OrtOutputs};
use kernel_core::{call, CallSite, OpDef, Phase};
use ort_sys::{OrtApi, OrtCustomOp, OrtKernelContext, OrtKernelInfo, OrtStatusPtr};
use std::ffi::c_void;

/// Per-node state: the op, its bound attributes and inference cache.
struct Kernel {
    api: Api,
    op: &'static OpDef,
    site: CallSite,
}

pub(crate) unsafe extern "system" fn create_kernel_v2(
    op: *const OrtCustomOp,
    api: *const OrtApi,
    info: *const OrtKernelInfo,
    kernel: *mut *mut c_void,
) -> OrtStatusPtr {
    // SAFETY: onnxruntime calls this with an op we registered.
    let p: &PolyOp = unsafe { this(op) };
    // Prefer the table ONNX Runtime hands us here (same version we asked for).
    let api = if api.is_null() {
        p.api
    } else {
        // SAFETY: a non-null table from onnxruntime is static data of the loaded library,
        // never freed or written while it is loaded.
        Api(unsafe { &*api })
    };
    // SAFETY: `kernel` is onnxruntime's out-parameter.
    unsafe { *kernel = std::ptr::null_mut() };
    guard(api, p.op, || {
        // SAFETY: `info` is the kernel info of this CreateKernelV2 call.
        let attrs = unsafe { crate::attrs::from_kernel_info(api, p.op, info) }?;
        // SAFETY: as above.
        let specs = unsafe { info_specs(api, p.op, info) }?;
        p.op.infer(&specs, &attrs)?;
        let k = Box::new(Kernel {
            api,
            op: p.op,
            site: CallSite::new(attrs),
        });
        // SAFETY: as above; released by kernel_destroy.
        unsafe { *kernel = Box::into_raw(k) as *mut c_void };
        Ok(())
    })
}

pub(crate) unsafe extern "system" fn kernel_destroy(k: *mut c_void) {
    if !k.is_null() {
        // SAFETY: created by Box::into_raw in create_kernel_v2, destroyed once.
        drop(unsafe { Box::from_raw(k as *mut Kernel) });
    }
}

pub(crate) unsafe extern "system" fn kernel_compute_v2(
    k: *mut c_void,
    ctx: *mut OrtKernelContext,
) -> OrtStatusPtr {
    // SAFETY: created by create_kernel_v2 and alive until kernel_destroy.
    let k = unsafe { &*(k as *const Kernel) };
    guard(k.api, k.op, || {
        // SAFETY: `ctx` is the live context of this compute call; views do not outlive it.
        let ins = unsafe { inputs(k.api, k.op, ctx) }?;
        let mut outs = OrtOutputs {
            api: k.api,
            ctx,
            // SAFETY: as above.
            n_out: unsafe { k.api.output_count(ctx) }?,
            scratch: Vec::new(),
        };
        let pool = OrtPool { api: k.api, ctx };
        call::run(k.op, &ins, &k.site, &mut outs, &pool, Phase::Compute)
    })
}
