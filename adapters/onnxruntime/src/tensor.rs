//! Framework tensors in and out: dtype mapping, input views of `OrtValue`s, and the output
//! allocator (`KernelContext_GetOutput`) that kernel-core's call path asks for memory.

use crate::sys::Api;
use kernel_core::op::OutputAllocator;
use kernel_core::{DType, DTypeCodes, Error, OpDef, OwnedTensor, Result, TensorMut, TensorRef};
use ort_sys::{ONNXTensorElementDataType as ET, OrtKernelContext, OrtValue};

/// ONNX element types of the polyop dtypes.
pub const ONNX_DTYPES: DTypeCodes<ET> = DTypeCodes([
    ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
    ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16,
    ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
    ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE,
    ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,
    ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
    ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL,
]);

/// ONNX's lower-case name of an element type, for error messages.
pub fn onnx_type_name(t: ET) -> String {
    let s = format!("{t:?}");
    s.trim_start_matches("ONNX_TENSOR_ELEMENT_DATA_TYPE_")
        .to_ascii_lowercase()
}

/// An element type the adapter cannot hand to a kernel, as a polyop error.
pub fn unsupported_type(op: &OpDef, i: usize, t: ET) -> Error {
    // A node input past the schema's is named by its position.
    let name = op
        .schema
        .tensor_args()
        .nth(i)
        .map_or_else(|| i.to_string(), |a| a.name.clone());
    op.unsupported_dtype(&name, &onnx_type_name(t))
}

/// The node's inputs as views (`None` for an absent optional input).
///
/// # Safety
/// `ctx` is the kernel context of the running compute call; the views live no longer.
pub(crate) unsafe fn inputs<'a>(
    api: Api,
    op: &OpDef,
    ctx: *mut OrtKernelContext,
) -> Result<Vec<Option<TensorRef<'a>>>> {
    // SAFETY: `ctx` is the live kernel context (this function's contract).
    let n_in = unsafe { api.input_count(ctx) }?;
    if n_in > op.num_inputs() {
        return Err(Error::invalid(format!(
            "expected at most {} input(s), got {n_in}",
            op.num_inputs()
        )));
    }
    let mut inputs = Vec::with_capacity(op.num_inputs());
    for i in 0..op.num_inputs() {
        let v = if i < n_in {
            // SAFETY: i < the context's input count.
            unsafe { api.input(ctx, i) }?
        } else {
            std::ptr::null()
        };
        if v.is_null() {
            inputs.push(None);
            continue;
        }
        // SAFETY: `v` is a live input value of this call (this function's contract).
        inputs.push(Some(unsafe { input_view(api, op, i, v, Ok) }?));
    }
    Ok(inputs)
}

/// A view of input value `v` (the op's input `i`, for errors), its shape passed through
/// `shape` first (the provider's 2-D view; `Ok` for the value's own shape).
///
/// # Safety
/// `v` is a live tensor value of the running compute call; the view lives no longer, and
/// `shape` keeps the element count.
pub(crate) unsafe fn input_view<'a>(
    api: Api,
    op: &OpDef,
    i: usize,
    v: *const OrtValue,
    shape: impl FnOnce(Vec<usize>) -> Result<Vec<usize>>,
) -> Result<TensorRef<'a>> {
    // SAFETY: `v` is a live tensor value (this function's contract).
    let (et, dims) = unsafe { api.value_type_shape(v) }?;
    let dtype = ONNX_DTYPES
        .dtype(et)
        .ok_or_else(|| unsupported_type(op, i, et))?;
    let dims = shape(dims)?;
    // SAFETY: as above.
    let ptr = unsafe { api.tensor_data(v) }?;
    // SAFETY: onnxruntime tensors are dense row-major buffers, alive for the compute call;
    // `shape` kept the element count (this function's contract).
    Ok(unsafe { TensorRef::from_raw_contiguous(dtype, dims, ptr) })
}

/// Outputs from `KernelContext_GetOutput`; an output the node leaves out gets scratch memory.
pub(crate) struct OrtOutputs {
    pub api: Api,
    pub ctx: *mut OrtKernelContext,
    pub n_out: usize,
    pub scratch: Vec<OwnedTensor>,
}

impl<'a> OutputAllocator<'a> for OrtOutputs {
    fn allocate(&mut self, i: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        let (api, ctx) = (self.api, self.ctx);
        let v = if i < self.n_out {
            // SAFETY: the kernel context is live for the compute call that made `self`.
            unsafe { api.output(ctx, i, shape) }?
        } else {
            std::ptr::null_mut()
        };
        if v.is_null() {
            let mut t = OwnedTensor::zeros(dtype, shape);
            let ptr = t.view_mut().ptr();
            // The heap buffer does not move with the OwnedTensor.
            self.scratch.push(t);
            // SAFETY: a fresh buffer of `dtype` elements of `shape`, owned by `self.scratch`
            // for the rest of the call.
            return Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, ptr) });
        }
        // Defensive (the kernel writes `dtype` elements of `shape` into this buffer): checked
        // without allocating on runtimes with the borrowed-shape API.
        // SAFETY: `v` is the output value onnxruntime just allocated.
        if !unsafe { api.value_is(v, ONNX_DTYPES.code(dtype), shape) }? {
            // SAFETY: as above.
            let (et, got) = unsafe { api.value_type_shape(v) }?;
            return Err(Error::internal(format!(
                "onnxruntime allocated output {i} as {} {got:?}, expected {dtype} {shape:?}",
                onnx_type_name(et)
            )));
        }
        // SAFETY: as above; its buffer has `dtype` elements of `shape` (checked).
        let ptr = unsafe { api.tensor_data(v) }?;
        // SAFETY: a dense output buffer of this dtype and shape, written only by this call.
        Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, ptr) })
    }
}
