//! Running an op outside any framework: outputs allocated as [`OwnedTensor`]s. Used by the
//! Rust tests, the Python core (`polyop.run`) and adapters' scratch paths.

use crate::op::{KernelCtx, OutputAllocator};
use crate::{Attrs, DType, OpDef, OwnedTensor, Result, TensorMut, TensorRef, ThreadPool};

/// Validate, infer, allocate and compute. Handles data-dependent ops through an allocator.
pub fn run_op(
    op: &OpDef,
    inputs: &[Option<TensorRef>],
    attrs: &Attrs,
    pool: &dyn ThreadPool,
) -> Result<Vec<OwnedTensor>> {
    let specs = op.infer_concrete(inputs, attrs)?;
    if op.flags.data_dependent_shape {
        let mut alloc = OwnedAllocator {
            outputs: (0..specs.len()).map(|_| None).collect(),
        };
        {
            let mut no_outputs: [TensorMut; 0] = [];
            let mut ctx =
                KernelCtx::new(op, inputs, &mut no_outputs, attrs, pool).with_allocator(&mut alloc);
            op.compute(&mut ctx)?;
        }
        return alloc
            .outputs
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                o.map(|b| *b).ok_or_else(|| {
                    crate::Error::internal(format!("kernel did not allocate output {i}"))
                        .in_op(op.name)
                })
            })
            .collect();
    }
    let mut owned: Vec<OwnedTensor> = specs
        .iter()
        .map(|s| {
            OwnedTensor::zeros(
                s.dtype,
                &s.concrete()
                    .expect("static shapes for a non-data-dependent op"),
            )
        })
        .collect();
    {
        let mut views: Vec<TensorMut> = owned.iter_mut().map(|o| o.view_mut()).collect();
        let mut ctx = KernelCtx::new(op, inputs, &mut views, attrs, pool);
        op.compute(&mut ctx)?;
    }
    Ok(owned)
}

struct OwnedAllocator {
    // Boxed so the heap buffer's address stays put while the Vec is borrowed.
    outputs: Vec<Option<Box<OwnedTensor>>>,
}

impl<'a> OutputAllocator<'a> for OwnedAllocator {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        let slot = self
            .outputs
            .get_mut(index)
            .ok_or_else(|| crate::Error::internal(format!("no output {index}")))?;
        let mut t = Box::new(OwnedTensor::zeros(dtype, shape));
        let view = t.view_mut();
        // SAFETY: the tensor's storage lives in the Box owned by `self.outputs` until the caller
        // takes it after the kernel has returned; it is allocated once per index.
        let view = unsafe {
            TensorMut::from_raw(
                view.dtype,
                view.shape.clone(),
                view.strides.clone(),
                view.ptr(),
            )
        };
        *slot = Some(t);
        Ok(view)
    }
}
