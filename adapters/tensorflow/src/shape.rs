//! Shape inference for TF graph construction, from kernel-core's shape functions.
//!
//! TF's C shape API (`tensorflow/c/ops.h`) can read input shapes and *type* attributes only:
//! there is no `TF_ShapeInferenceContext_GetAttrInt/Float/Bool/String`. So the shape function
//! is kernel-core's `OpDef::infer_unknown_attrs`: dims no attribute value can change stay
//! static, the others become unknown (`?`). `polyop.tensorflow` wrappers then set the exact
//! static shapes from the real attribute values.

use crate::sys::*;
use crate::tensor::dtype_from_tf;
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

unsafe fn read_input_dims(
    ctx: *mut TF_ShapeInferenceContext,
    i: usize,
) -> Result<Option<Vec<Dim>>> {
    let st = Status::new();
    let h = Shape(unsafe { TF_NewShapeHandle() });
    unsafe { TF_ShapeInferenceContextGetInput(ctx, i as i32, h.0, st.0) };
    if !st.ok() {
        return Err(Error::internal(format!(
            "reading the shape of input {i}: {}",
            st.message()
        )));
    }
    if unsafe { TF_ShapeInferenceContextRankKnown(ctx, h.0) } == 0 {
        return Ok(None);
    }
    let rank = unsafe { TF_ShapeInferenceContextRank(ctx, h.0) };
    let dh = unsafe { TF_NewDimensionHandle() };
    let mut dims = Vec::with_capacity(rank as usize);
    for d in 0..rank {
        unsafe { TF_ShapeInferenceContextDim(ctx, h.0, d, dh) };
        dims.push(if unsafe { TF_DimensionHandleValueKnown(dh) } != 0 {
            Some(unsafe { TF_DimensionHandleValue(dh) } as usize)
        } else {
            None
        });
    }
    unsafe { TF_DeleteDimensionHandle(dh) };
    Ok(Some(dims))
}

/// A shape handle for known-rank `dims` (unknown dims as TF's unknown dimension).
unsafe fn make_shape(ctx: *mut TF_ShapeInferenceContext, dims: &[Dim]) -> Result<Shape> {
    let mut acc = Shape(unsafe { TF_ShapeInferenceContextScalar(ctx) });
    for d in dims {
        // TF_ShapeInferenceContextVectorFromSize forwards to InferenceContext::Vector(int64):
        // size_t(-1) becomes -1, TF's kUnknownDim.
        let size = d.unwrap_or(usize::MAX);
        let v = Shape(unsafe { TF_ShapeInferenceContextVectorFromSize(ctx, size) });
        let out = Shape(unsafe { TF_NewShapeHandle() });
        let st = Status::new();
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
pub unsafe fn shape_fn(
    op: &'static OpDef,
    ctx: *mut TF_ShapeInferenceContext,
    status: *mut TF_Status,
) -> Result<()> {
    let n = unsafe { TF_ShapeInferenceContextNumInputs(ctx) } as usize;
    let Some(present) = present_inputs(op, n) else {
        let st = Status::new();
        unsafe { TF_ShapeInferenceContextSetUnknownShape(ctx, st.0) };
        return Ok(());
    };
    let t = if op.input_types.contains(&kernel_core::TypeRule::T) {
        let st = Status::new();
        let mut t: TF_DataType = 0;
        let name = CString::new("T").unwrap();
        unsafe { TF_ShapeInferenceContext_GetAttrType(ctx, name.as_ptr(), &mut t, st.0) };
        if !st.ok() {
            return Err(Error::internal(format!("reading attr T: {}", st.message())));
        }
        Some(dtype_from_tf(t).ok_or_else(|| Error::invalid(format!("unsupported TF dtype {t}")))?)
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
        let dims = unsafe { read_input_dims(ctx, flat)? };
        flat += 1;
        specs.push(Some(TensorSpec { dtype, shape: dims }));
    }
    let outs = op.infer_unknown_attrs(&specs)?;
    if outs.iter().any(|s| s.shape.is_none()) {
        let st = Status::new();
        unsafe { TF_ShapeInferenceContextSetUnknownShape(ctx, st.0) };
    }
    for (i, s) in outs.iter().enumerate() {
        let Some(dims) = &s.shape else { continue };
        let h = unsafe { make_shape(ctx, dims)? };
        unsafe { TF_ShapeInferenceContextSetOutput(ctx, i as i32, h.0, status) };
        if unsafe { TF_GetCode(status) } != TF_OK {
            return Err(Error::internal(format!(
                "setting the shape of output {i}: {}",
                unsafe { message_of(status) }
            )));
        }
    }
    Ok(())
}
