//! Framework tensors in and out: dtype mapping, input views of `TF_Tensor`s, and the output
//! allocator (`TF_AllocateOutput`) that kernel-core's call path asks for memory.

use crate::sys::*;
use kernel_core::op::OutputAllocator;
use kernel_core::{numel, with_i64_dims, DType, DTypeCodes, Error, Result, TensorMut, TensorRef};

/// TF's dtype codes.
pub const TF_DTYPES: DTypeCodes<TF_DataType> = DTypeCodes([
    TF_HALF,
    TF_BFLOAT16,
    TF_FLOAT,
    TF_DOUBLE,
    TF_INT32,
    TF_INT64,
    TF_BOOL,
]);

/// Owned `TF_Tensor*` handles, deleted on drop (the tensors stay alive in the context).
pub(crate) struct Tensors(pub Vec<*mut TF_Tensor>);
impl Drop for Tensors {
    fn drop(&mut self) {
        for &t in &self.0 {
            // SAFETY: returned by TF_GetInput / TF_AllocateOutput, owned by us.
            unsafe { TF_DeleteTensor(t) }
        }
    }
}

/// A view of an input tensor.
///
/// # Safety
/// `t` is a live tensor handle; the view lives no longer than its buffer.
pub(crate) unsafe fn input_view<'a>(t: *mut TF_Tensor) -> Result<TensorRef<'a>> {
    // SAFETY: `t` is live (this function's contract), as in every call below.
    let tf_dtype = unsafe { TF_TensorType(t) };
    let dtype = TF_DTYPES
        .dtype(tf_dtype)
        .ok_or_else(|| Error::invalid(format!("unsupported TF dtype code {tf_dtype}")))?;
    // SAFETY: as above.
    let rank = unsafe { TF_NumDims(t) };
    let shape: Vec<usize> = (0..rank)
        // SAFETY: as above; 0 <= d < rank, and a tensor's dims are >= 0.
        .map(|d| unsafe { TF_Dim(t, d) } as usize)
        .collect();
    // SAFETY: as above.
    let ptr = unsafe { TF_TensorData(t) } as *const u8;
    // SAFETY: TF tensors are dense row-major buffers of `shape`, alive for the compute call.
    Ok(unsafe { TensorRef::from_raw_contiguous(dtype, shape, ptr) })
}

/// Outputs allocated by TF (`TF_AllocateOutput`); the handles are released on drop, the
/// tensors stay in the context.
pub(crate) struct TfOutputs {
    pub ctx: *mut TF_OpKernelContext,
    pub keep: Tensors,
}

impl<'a> OutputAllocator<'a> for TfOutputs {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        let st = Status::new();
        // SAFETY: the kernel context is live for the compute call that made `self`; the byte
        // size was overflow-checked by kernel-core's call path.
        let t = with_i64_dims(shape, |dims| unsafe {
            TF_AllocateOutput(
                self.ctx,
                index as i32,
                TF_DTYPES.code(dtype),
                dims.as_ptr(),
                dims.len() as i32,
                numel(shape) * dtype.size(),
                st.0,
            )
        });
        if !st.ok() || t.is_null() {
            return Err(Error::internal(format!(
                "TF_AllocateOutput({index}, {shape:?}) failed: {}",
                st.message()
            )));
        }
        self.keep.0.push(t);
        // SAFETY: TF allocated a dense buffer of this shape and dtype for output `index`.
        Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, TF_TensorData(t) as *mut u8) })
    }
}
