//! Shape inference for TF graph construction, from kernel-core's shape functions.
//!
//! TF's C shape API (`tensorflow/c/ops.h`) can read input shapes and *type* attributes only:
//! there is no `TF_ShapeInferenceContext_GetAttrInt/Float/Bool/String`. So the shape function
//! is kernel-core's `OpDef::infer_unknown_attrs`: dims no attribute value can change stay
//! static, the others become unknown (`?`). `polyop.tensorflow` wrappers then set the exact
//! static shapes from the real attribute values.

use crate::sys::*;
use crate::tensor::TF_DTYPES;
use kernel_core::{ArgType, Dim, Error, OpDef, Result, TensorSpec};
use std::ffi::CString;

/// Which tensor arguments of `op` are present, given the number of flattened TF inputs.
/// Optional arguments are trailing lists of 0 or 1 tensors; when only some of several are
/// present the count alone cannot say which (`None`).
pub fn present_inputs(op: &OpDef, num_flat: usize) -> Option<Vec<bool>> {
    let args: Vec<_> = op.schema.tensor_args().collect();
    let optional = args
        .iter()
        .filter(|a| a.ty == ArgType::OptionalTensor)
        .count();
    let required = args.len() - optional;
    let extra = num_flat.checked_sub(required)?;
    if extra != 0 && extra != optional {
        return None;
    }
    Some(
        args.iter()
            .map(|a| a.ty != ArgType::OptionalTensor || extra == optional)
            .collect(),
    )
}

/// Owned shape handle.
struct Shape(*mut TF_ShapeHandle);
impl Drop for Shape {
    fn drop(&mut self) {
        // SAFETY: allocated by the TF C API; delete accepts null.
        unsafe { TF_DeleteShapeHandle(self.0) }
    }
}

/// The dims of input `i` (`None` = unknown rank).
///
/// # Safety
/// `ctx` is the context of a running shape function and `i` below its input count.
unsafe fn read_input_dims(
    ctx: *mut TF_ShapeInferenceContext,
    i: usize,
) -> Result<Option<Vec<Dim>>> {
    let st = Status::new();
    // SAFETY: a plain allocation, owned (and deleted) by `h`.
    let h = Shape(unsafe { TF_NewShapeHandle() });
    // SAFETY: `ctx` is live and `i` in range (this function's contract); `h.0` and `st.0` are
    // live handles owned here.
    unsafe { TF_ShapeInferenceContextGetInput(ctx, i as i32, h.0, st.0) };
    if !st.ok() {
        return Err(Error::internal(format!(
            "reading the shape of input {i}: {}",
            st.message()
        )));
    }
    // SAFETY: `ctx` is live; `h` now holds input `i`'s shape.
    if unsafe { TF_ShapeInferenceContextRankKnown(ctx, h.0) } == 0 {
        return Ok(None);
    }
    // SAFETY: as above; the rank is known.
    let rank = unsafe { TF_ShapeInferenceContextRank(ctx, h.0) };
    // SAFETY: a plain allocation, deleted below (nothing between returns early).
    let dh = unsafe { TF_NewDimensionHandle() };
    let mut dims = Vec::with_capacity(rank as usize);
    for d in 0..rank {
        // SAFETY: `ctx` and `h` as above, 0 <= d < rank; `dh` is live.
        unsafe { TF_ShapeInferenceContextDim(ctx, h.0, d, dh) };
        // SAFETY: `dh` is live and was just set.
        dims.push(if unsafe { TF_DimensionHandleValueKnown(dh) } != 0 {
            // SAFETY: as above; a known dim is >= 0.
            Dim::Known(unsafe { TF_DimensionHandleValue(dh) } as usize)
        } else {
            Dim::Unknown
        });
    }
    // SAFETY: allocated above, deleted once.
    unsafe { TF_DeleteDimensionHandle(dh) };
    Ok(Some(dims))
}

/// A shape handle for known-rank `dims` (unknown dims as TF's unknown dimension).
///
/// # Safety
/// `ctx` is the context of a running shape function.
unsafe fn make_shape(ctx: *mut TF_ShapeInferenceContext, dims: &[Dim]) -> Result<Shape> {
    // SAFETY: `ctx` is live (this function's contract); the new handle is owned by `acc`.
    let mut acc = Shape(unsafe { TF_ShapeInferenceContextScalar(ctx) });
    for d in dims {
        // TF_ShapeInferenceContextVectorFromSize forwards to InferenceContext::Vector(int64):
        // size_t(-1) becomes -1, TF's kUnknownDim (TF has no symbolic dims: those are unknown).
        let size = d.known().unwrap_or(usize::MAX);
        // SAFETY: as above; owned by `v`.
        let v = Shape(unsafe { TF_ShapeInferenceContextVectorFromSize(ctx, size) });
        // SAFETY: a plain allocation, owned by `out`.
        let out = Shape(unsafe { TF_NewShapeHandle() });
        let st = Status::new();
        // SAFETY: `ctx` is live; `acc`, `v`, `out` and `st` are live handles owned here.
        unsafe { TF_ShapeInferenceContextConcatenateShapes(ctx, acc.0, v.0, out.0, st.0) };
        if !st.ok() {
            return Err(Error::internal(format!(
                "building a shape: {}",
                st.message()
            )));
        }
        acc = out;
    }
    Ok(acc)
}

/// The TF shape function of `op`.
///
/// # Safety
/// `ctx` and `status` are the arguments of a running TF shape function.
pub unsafe fn shape_fn(
    op: &'static OpDef,
    ctx: *mut TF_ShapeInferenceContext,
    status: *mut TF_Status,
) -> Result<()> {
    // SAFETY: `ctx` is live (this function's contract).
    let n = unsafe { TF_ShapeInferenceContextNumInputs(ctx) } as usize;
    let Some(present) = present_inputs(op, n) else {
        let st = Status::new();
        // SAFETY: `ctx` is live; `st` is a live status owned here.
        unsafe { TF_ShapeInferenceContextSetUnknownShape(ctx, st.0) };
        return Ok(());
    };
    let t = if op.input_types.contains(&kernel_core::TypeRule::T) {
        let st = Status::new();
        let mut t: TF_DataType = 0;
        let name = CString::new("T").unwrap();
        // SAFETY: `ctx` is live; `name` is NUL-terminated; `t` is a writable local; `st` a
        // live status.
        unsafe { TF_ShapeInferenceContext_GetAttrType(ctx, name.as_ptr(), &mut t, st.0) };
        if !st.ok() {
            return Err(Error::internal(format!("reading attr T: {}", st.message())));
        }
        Some(
            TF_DTYPES
                .dtype(t)
                .ok_or_else(|| Error::invalid(format!("unsupported TF dtype {t}")))?,
        )
    } else {
        None
    };
    let mut specs = Vec::with_capacity(present.len());
    let mut flat = 0usize;
    for (p, rule) in present.iter().zip(&op.input_types) {
        if !p {
            specs.push(None);
            continue;
        }
        let dtype = match rule {
            kernel_core::TypeRule::Fixed(d) => *d,
            kernel_core::TypeRule::T => t.expect("T read above"),
        };
        // SAFETY: `ctx` is live; `flat` counts the present inputs before this one, so it is
        // below `n`, the context's input count (`present_inputs` accounts for all `n`).
        let dims = unsafe { read_input_dims(ctx, flat)? };
        flat += 1;
        specs.push(Some(TensorSpec { dtype, shape: dims }));
    }
    let outs = op.infer_unknown_attrs(&specs)?;
    if outs.iter().any(|s| s.shape.is_none()) {
        let st = Status::new();
        // SAFETY: `ctx` is live; `st` is a live status owned here.
        unsafe { TF_ShapeInferenceContextSetUnknownShape(ctx, st.0) };
    }
    for (i, s) in outs.iter().enumerate() {
        let Some(dims) = &s.shape else { continue };
        // SAFETY: `ctx` is live.
        let h = unsafe { make_shape(ctx, dims)? };
        // SAFETY: `ctx` and `status` are live (this function's contract); `i` < the op's
        // output count, which is the node's; `h` is a live shape handle.
        unsafe { TF_ShapeInferenceContextSetOutput(ctx, i as i32, h.0, status) };
        // SAFETY: `status` is live.
        if unsafe { TF_GetCode(status) } != TF_OK {
            return Err(Error::internal(format!(
                "setting the shape of output {i}: {}",
                // SAFETY: `status` is live.
                unsafe { message_of(status) }
            )));
        }
    }
    Ok(())
}
