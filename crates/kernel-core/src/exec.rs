//! Running an op outside any framework: outputs allocated as [`OwnedTensor`]s. Used by the
//! Rust tests and tools; the same [`call::run`](crate::call::run) path as every adapter.

use crate::call::{run, CallSite, Phase};
use crate::op::OutputAllocator;
use crate::{Attrs, DType, Error, OpDef, OwnedTensor, Result, TensorMut, TensorRef, ThreadPool};

/// Validate, infer, allocate and compute; data-dependent ops included.
pub fn run_op(
    op: &OpDef,
    inputs: &[Option<TensorRef>],
    attrs: &Attrs,
    pool: &dyn ThreadPool,
) -> Result<Vec<OwnedTensor>> {
    let mut alloc = OwnedAllocator::default();
    run(
        op,
        inputs,
        &CallSite::once(attrs.clone()),
        &mut alloc,
        pool,
        Phase::Compute,
    )?;
    Ok(alloc.outputs.into_iter().map(|b| *b).collect())
}

/// Outputs as [`OwnedTensor`]s, in allocation order (which [`run`] makes output order).
#[derive(Default)]
pub struct OwnedAllocator {
    // Boxed so each buffer's address stays put while the Vec grows.
    pub outputs: Vec<Box<OwnedTensor>>,
}

impl<'a> OutputAllocator<'a> for OwnedAllocator {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        if index != self.outputs.len() {
            return Err(Error::internal(format!(
                "output {index} allocated out of order"
            )));
        }
        let mut t = Box::new(OwnedTensor::zeros(dtype, shape));
        let ptr = t.view_mut().ptr();
        self.outputs.push(t);
        // SAFETY: the buffer lives in the Box held by `self.outputs` (its address does not
        // move when the Vec grows) until the caller takes it after the kernel has returned;
        // each index is handed out once, so the view is exclusive.
        Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, ptr) })
    }
}
