//! Shape inference: kernel-core's `op.infer` on what ONNX Runtime knows of a node (unknown
//! dims and rank allowed), at session creation (`OrtKernelInfo`) and in ONNX Runtime's
//! output-shape inference (`InferOutputShapeFn`).

use crate::error::guard;
use crate::register::this;
use crate::sys::Api;
use crate::tensor::{unsupported_type, ONNX_DTYPES};
use kernel_core::{DType, Dim, OpDef, Result, TensorSpec};
use ort_sys::{
    ONNXTensorElementDataType as ET, OrtCustomOp, OrtKernelInfo, OrtShapeInferContext, OrtStatusPtr,
};

/// A spec from ONNX dims. Rank 0 is treated as unknown rank: ONNX Runtime reports a missing
/// shape as rank 0, and guessing "scalar" would reject valid models.
fn spec(op: &OpDef, i: usize, et: ET, dims: Vec<Dim>) -> Result<Option<TensorSpec>> {
    if et == ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED {
        return Ok(None);
    }
    let dtype: DType = ONNX_DTYPES
        .dtype(et)
        .ok_or_else(|| unsupported_type(op, i, et))?;
    Ok(Some(if dims.is_empty() {
        TensorSpec::unknown_rank(dtype)
    } else {
        TensorSpec::with_dims(dtype, dims)
    }))
}

/// The node's input specs at kernel creation.
///
/// # Safety
/// `info` is the kernel info of a running `CreateKernelV2`.
pub(crate) unsafe fn info_specs(
    api: Api,
    op: &OpDef,
    info: *const OrtKernelInfo,
) -> Result<Vec<Option<TensorSpec>>> {
    // SAFETY: this function's contract.
    let n = unsafe { api.info_input_count(info) }?;
    (0..op.num_inputs().max(n))
        .map(|i| {
            match (i < n)
                // SAFETY: `info` is live (this function's contract) and i < its input count.
                .then(|| unsafe { api.info_input_spec(info, i) })
                .flatten()
            {
                None => Ok(None),
                Some((et, dims)) => spec(op, i, et, dims),
            }
        })
        .collect()
}

/// `InferOutputShapeFn`: sets output element types and shapes. Unknown output dims get a
/// symbolic name; outputs of unknown rank are left alone.
pub(crate) unsafe extern "system" fn infer_output_shape(
    op: *const OrtCustomOp,
    ctx: *mut OrtShapeInferContext,
) -> OrtStatusPtr {
    // SAFETY: onnxruntime calls this with an op we registered.
    let p = unsafe { this(op) };
    let api = p.api;
    guard(api, p.op, || {
        // SAFETY: `ctx` is the live shape-inference context of this call.
        let n = unsafe { api.sic_input_count(ctx) }?;
        let mut specs = Vec::with_capacity(p.op.num_inputs().max(n));
        for i in 0..p.op.num_inputs().max(n) {
            // SAFETY: as above, i < n.
            specs.push(match (i < n).then(|| unsafe { api.sic_input(ctx, i) }) {
                Some(Ok((et, dims))) => spec(p.op, i, et, dims)?,
                _ => None,
            });
        }
        // SAFETY: as above.
        let attrs = unsafe { crate::attrs::from_shape_ctx(api, p.op, ctx) }?;
        for (i, o) in p.op.infer(&specs, &attrs)?.iter().enumerate() {
            if let Some(dims) = &o.shape {
                let prefix = format!("polyop_{}_{}", p.op.name, p.op.schema.output_name(i));
                // SAFETY: as above; i < the op's (and node's) output count.
                unsafe { api.sic_set_output(ctx, i, ONNX_DTYPES.code(o.dtype), dims, &prefix) }?;
            }
        }
        Ok(())
    })
}
