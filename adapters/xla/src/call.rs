//! The one generic XLA FFI handler: decodes a call frame (operand buffers, typed attributes by
//! name), and runs the op through kernel-core's call path with XLA's pre-allocated results
//! (checked against shape inference) on XLA's intra-op thread pool. Every failure becomes an
//! `XLA_FFI_Error`; no panic escapes.

use crate::attrs::{attrs_key, decode_attrs};
use crate::error::{make_error, FfiError};
use crate::pool::XlaPool;
use crate::register::{check_api, populate_metadata, PINNED_JAXLIB};
use crate::sys;
use crate::tensor::{decode_buffer, decode_inputs, xla_dtype_name, XLA_DTYPES};
use kernel_core::call::{self, Preallocated};
use kernel_core::{default_pool, CallSites, Error, OpDef, Phase, Registry, Result, ThreadPool};

/// Per exported symbol: the op (looked up once) and its call sites (attributes bound once per
/// distinct attribute set, keyed by their raw call-frame bytes, each with an inference cache).
/// What makes a repeated call (the jitted-program case) skip the registry lookup, attribute
/// decoding and binding, and shape inference. [`export!`](crate::export) gives every handler one.
pub struct OpState {
    op: std::sync::OnceLock<&'static OpDef>,
    sites: CallSites,
}

impl OpState {
    pub const fn new() -> Self {
        OpState {
            op: std::sync::OnceLock::new(),
            sites: CallSites::new(),
        }
    }

    fn op(&self, registry: &'static Registry, name: &str) -> Result<&'static OpDef> {
        if let Some(op) = self.op.get() {
            return Ok(op);
        }
        let op = registry.lookup(name)?;
        Ok(*self.op.get_or_init(|| op))
    }
}

impl Default for OpState {
    fn default() -> Self {
        Self::new()
    }
}

/// The generic handler: run the op at position `index` of `registry` on the call frame, with
/// the handler's own [`OpState`]. Every handler of [`export!`](crate::export)'s table calls
/// it with its position and state.
///
/// # Safety
/// `frame` is null or a call frame handed to an FFI handler by XLA (or a test that builds
/// one with the same guarantees).
pub unsafe fn handle(
    registry: &'static Registry,
    index: usize,
    state: &OpState,
    frame: *mut sys::XLA_FFI_CallFrame,
) -> FfiError {
    if frame.is_null() {
        return std::ptr::null_mut();
    }
    // (A position past the registry fails as an unknown op.)
    let op_name = registry.ops().nth(index).map_or("", |o| o.name);
    // SAFETY: a non-null frame from XLA (this function's contract).
    let api = unsafe { (*frame).api };
    call::boundary(
        (op_name, registry.namespace()),
        std::ptr::null_mut(),
        // SAFETY: as above.
        || unsafe { handle_inner(registry, op_name, state, frame) },
        // SAFETY: `api` is the frame's API table (checked before use by make_error).
        |e| unsafe { make_error(api, &e) },
    )
}

/// # Safety
/// `frame` is a non-null call frame with [`handle`]'s guarantees.
unsafe fn handle_inner(
    registry: &'static Registry,
    op_name: &str,
    state: &OpState,
    frame: *mut sys::XLA_FFI_CallFrame,
) -> Result<()> {
    // SAFETY: `frame` is a non-null call frame from XLA, live for this call (`handle`'s
    // contract, checked non-null there); `struct_size` leads it in every version and is read
    // through the raw pointer, before any reference to a whole frame exists.
    let size = unsafe { (*frame).struct_size };
    if size < sys::XLA_FFI_CallFrame_STRUCT_SIZE as usize {
        return Err(Error::unsupported(format!(
            "XLA_FFI_CallFrame is {} bytes, expected at least {} (built against jaxlib {PINNED_JAXLIB}); FFI version skew",
            size,
            sys::XLA_FFI_CallFrame_STRUCT_SIZE
        )));
    }
    // SAFETY: as above, and the frame is at least as large as our `XLA_FFI_CallFrame`.
    let f = unsafe { &*frame };
    // Metadata query first: XLA uses our answer to check compatibility itself.
    // SAFETY: `f` is a live call frame whose extension chain XLA built.
    if unsafe { populate_metadata(f)? } {
        return Ok(());
    }
    // SAFETY: `f.api` is null or the API table of the runtime that built the frame.
    unsafe { check_api(f.api)? };
    if f.stage != sys::XLA_FFI_ExecutionStage_XLA_FFI_ExecutionStage_EXECUTE {
        // Only an execute handler is registered; other stages have nothing to do.
        return Ok(());
    }
    let op = state.op(registry, op_name)?;
    if op.flags.inplace {
        return Err(Error::unsupported(
            "in-place ops exist only on the torch surface; use the out-of-place op with XLA",
        ));
    }
    if op.flags.data_dependent_shape {
        return Err(Error::unsupported(
            "the output shape depends on the input data, which XLA cannot express \
             (static shapes only); not available under XLA/JAX",
        ));
    }
    // SAFETY: `f.args` is the operand list of the live frame; the views it returns are used
    // only within this call, while XLA keeps the operand buffers alive.
    let inputs = unsafe { decode_inputs(op, &f.args)? };
    let site = state.sites.get_or_bind(
        // SAFETY: the frame's attributes are valid for the call.
        |key| unsafe { attrs_key(&f.attrs, key) },
        // SAFETY: as above.
        || unsafe { decode_attrs(op, &f.attrs) },
    )?;
    // Outputs: XLA pre-allocated them; they must be exactly what kernel-core infers.
    let rets = &f.rets;
    let mut buffers = Vec::with_capacity(rets.size.max(0) as usize);
    for i in 0..rets.size.max(0) as usize {
        // SAFETY: i < rets.size, arrays of that length.
        if unsafe { *rets.types.add(i) } != sys::XLA_FFI_RetType_XLA_FFI_RetType_BUFFER {
            return Err(Error::invalid(format!("result {i} is not a buffer")));
        }
        let name = || format!("result `{}`", op.schema.output_name(i));
        // SAFETY: as above.
        let b = unsafe { decode_buffer(*rets.rets.add(i), name)? };
        let dtype = XLA_DTYPES.dtype(b.xla_dtype).ok_or_else(|| {
            Error::invalid(format!(
                "{} has unsupported dtype {}",
                name(),
                xla_dtype_name(b.xla_dtype)
            ))
        })?;
        buffers.push((dtype, b.dims, b.data));
    }
    // SAFETY: XLA allocated each result buffer, dense row-major, for the call's duration.
    let mut outputs = unsafe { Preallocated::new(op, buffers)? };
    // SAFETY: api and ctx come from the live frame.
    let xla_pool = unsafe { XlaPool::from_call(f.api, f.ctx) };
    let pool: &dyn ThreadPool = match &xla_pool {
        Some(p) => p,
        None => default_pool(),
    };
    call::run(op, &inputs, &site, &mut outputs, pool, Phase::Compute)
}
