//! Shape inference for TF graph construction, from kernel-core's shape functions.
//!
//! TF's C shape API (`tensorflow/c/ops.h`) can read input shapes and *type* attributes only:
//! there is no `TF_ShapeInferenceContext_GetAttrInt/Float/Bool/String`. So the shape function
//! runs kernel-core's inference over a set of probe values for the op's non-type attributes and
//! keeps what every successful probe agrees on: a dim the attributes cannot change stays
//! static, a dim they change (topk's `k` axis, conv2d's spatial dims) becomes unknown (`?`).
//! `polyop.tensorflow` wrappers then set the exact static shapes from the real attribute values.

use crate::sys::*;
use crate::tensor::dtype_from_tf;
use kernel_core::{ArgType, AttrValue, Attrs, DType, Dim, Error, OpDef, Result, TensorSpec};
use std::ffi::CString;

/// Most attribute combinations tried per inference.
const MAX_PROBES: usize = 1024;

/// Candidate values of one attribute; `None` when it cannot be probed (no default, not int,
/// float or bool).
fn probe_values(arg: &kernel_core::Arg) -> Option<Vec<AttrValue>> {
    let mut v: Vec<AttrValue> = Vec::new();
    if let Some(d) = &arg.default {
        if *d != AttrValue::None {
            v.push(d.clone());
        }
    }
    let extra: Vec<AttrValue> = match arg.ty {
        ArgType::Int => [0, 1, 2, 3, -1, -2].map(AttrValue::Int).to_vec(),
        ArgType::Float => [1.0, 0.5, 2.0].map(AttrValue::Float).to_vec(),
        ArgType::Bool => [true, false].map(AttrValue::Bool).to_vec(),
        _ => Vec::new(),
    };
    for e in extra {
        if !v.contains(&e) {
            v.push(e);
        }
    }
    (!v.is_empty()).then_some(v)
}

/// Every probe attribute set for `op` (the cartesian product), or `None` if some attribute
/// cannot be probed or there would be too many.
pub fn probe_attr_sets(op: &OpDef) -> Option<Vec<Attrs>> {
    let args: Vec<_> = op.schema.attr_args().collect();
    let values: Vec<Vec<AttrValue>> = args
        .iter()
        .map(|a| probe_values(a))
        .collect::<Option<_>>()?;
    let total: usize = values.iter().map(Vec::len).product();
    if total > MAX_PROBES {
        return None;
    }
    let mut out = Vec::with_capacity(total);
    for mut idx in 0..total {
        let mut given = Vec::with_capacity(args.len());
        for (a, vals) in args.iter().zip(&values) {
            given.push((a.name.as_str(), vals[idx % vals.len()].clone()));
            idx /= vals.len();
        }
        if let Ok(attrs) = op.bind_attrs(given) {
            out.push(attrs);
        }
    }
    Some(out)
}

/// Output specs of `op` for `inputs` when the attribute values are not known: dims every
/// successful probe agrees on are kept, others become unknown. An error only when the inputs
/// are invalid whatever the attributes (every probe fails with the same error).
pub fn infer_without_attrs(op: &OpDef, inputs: &[Option<TensorSpec>]) -> Result<Vec<TensorSpec>> {
    // dtypes and arity do not depend on attributes: check them first, for a precise error.
    let dtypes: Vec<Option<DType>> = inputs.iter().map(|s| s.as_ref().map(|s| s.dtype)).collect();
    op.check_inputs(&dtypes)?;
    let unknown = |op: &OpDef| -> Result<Vec<TensorSpec>> {
        // dtypes are still known: run with any attrs just for dtypes is not possible, so
        // derive them from the rules.
        let t = dtypes
            .iter()
            .zip(&op.input_types)
            .find_map(|(d, r)| (*r == kernel_core::TypeRule::T).then_some(*d).flatten());
        op.output_types
            .iter()
            .map(|r| {
                let dtype = match r {
                    kernel_core::TypeRule::Fixed(d) => *d,
                    kernel_core::TypeRule::T => {
                        t.ok_or_else(|| Error::internal("no input binds T").in_op(op.name))?
                    }
                };
                Ok(TensorSpec::unknown_rank(dtype))
            })
            .collect()
    };
    let Some(probes) = probe_attr_sets(op) else {
        return unknown(op);
    };
    let mut merged: Option<Vec<TensorSpec>> = None;
    let mut first_err: Option<Error> = None;
    let mut errors_agree = true;
    for attrs in &probes {
        match op.infer(inputs, attrs) {
            Ok(specs) => {
                merged = Some(match merged {
                    None => specs,
                    Some(m) => m.into_iter().zip(specs).map(|(a, b)| merge(a, b)).collect(),
                })
            }
            Err(e) => match &first_err {
                None => first_err = Some(e),
                Some(f) => errors_agree &= f.message == e.message,
            },
        }
    }
    match (merged, first_err) {
        (Some(m), _) => Ok(m),
        (None, Some(e)) if errors_agree => Err(e),
        _ => unknown(op),
    }
}

fn merge(a: TensorSpec, b: TensorSpec) -> TensorSpec {
    let shape = match (a.shape, b.shape) {
        (Some(x), Some(y)) if x.len() == y.len() => Some(
            x.into_iter()
                .zip(y)
                .map(|(p, q)| if p == q { p } else { None })
                .collect(),
        ),
        _ => None,
    };
    TensorSpec {
        dtype: a.dtype,
        shape,
    }
}

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
    let outs = infer_without_attrs(op, &specs)?;
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
