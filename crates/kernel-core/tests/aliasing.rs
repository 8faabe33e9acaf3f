//! `call::run` never hands a kernel an input view that shares memory with an output view
//! (XLA's `input_output_aliases` gives the handler one buffer as both): the input is copied
//! first, and the result is what the kernel computes out of place.

use kernel_core::call::{self, Preallocated};
use kernel_core::op::KernelCtx;
use kernel_core::*;

/// `out[i] = x[n - 1 - i]`: reversing in place without a copy would read overwritten values.
fn reverse_cpu(ctx: &mut KernelCtx) -> Result<()> {
    let x = ctx.input(0).contiguous::<f32>()?.into_owned();
    let (xp, op) = (ctx.input(0).ptr() as usize, ctx.outputs[0].ptr() as usize);
    if xp == op {
        return Err(Error::internal("input and output views alias"));
    }
    let out = ctx.outputs[0].as_mut_slice::<f32>()?;
    // Read and write element by element, as a kernel streaming through memory would.
    let src = ctx.inputs[0].as_ref().expect("x").ptr() as *const f32;
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: `src` is the f32 input of `x.len() == out.len()` contiguous elements.
        *o = unsafe { *src.add(x.len() - 1 - i) };
    }
    Ok(())
}

fn same_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![ctx.dims(0).map(<[Dim]>::to_vec)])
}

#[test]
fn an_output_aliasing_an_input_gets_a_copy_of_the_input() {
    let op = OpDef::builder("reverse(Tensor x) -> Tensor")
        .infer(same_infer)
        .cpu(reverse_cpu)
        .build()
        .unwrap();
    let mut buf = vec![1.0f32, 2.0, 3.0, 4.0];
    let p = buf.as_mut_ptr() as *mut u8;
    // SAFETY: `buf` outlives the call; the input view and the output buffer are the same
    // memory on purpose, as XLA passes them under input_output_aliases.
    let x = unsafe { TensorRef::from_raw(DType::F32, vec![4], vec![1], p) };
    // SAFETY: as above.
    let mut out = unsafe { Preallocated::new(&op, vec![(DType::F32, vec![4], p)]) }.unwrap();
    let site = CallSite::once(Attrs::default());
    call::run(
        &op,
        &[Some(x)],
        &site,
        &mut out,
        &SerialPool,
        Phase::Compute,
    )
    .unwrap();
    assert_eq!(buf, [4.0, 3.0, 2.0, 1.0]);
}

#[test]
fn strided_and_disjoint_views_are_not_copied_needlessly() {
    // An input that does not overlap the output is passed as is (the kernel sees its pointer).
    let op = OpDef::builder("reverse(Tensor x) -> Tensor")
        .infer(same_infer)
        .cpu(reverse_cpu)
        .build()
        .unwrap();
    let x = [1.0f32, 2.0, 3.0];
    let mut y = [0.0f32; 3];
    let xv = TensorRef::from_slice(&x, &[3]).unwrap();
    // SAFETY: `y` outlives the call and is not otherwise used during it.
    let mut out =
        unsafe { Preallocated::new(&op, vec![(DType::F32, vec![3], y.as_mut_ptr() as *mut u8)]) }
            .unwrap();
    let site = CallSite::once(Attrs::default());
    call::run(
        &op,
        &[Some(xv)],
        &site,
        &mut out,
        &SerialPool,
        Phase::Compute,
    )
    .unwrap();
    assert_eq!(y, [3.0, 2.0, 1.0]);
}

#[test]
fn copy_of_a_strided_view_is_its_row_major_contents() {
    // [[0, 1, 2], [3, 4, 5]] viewed transposed: [[0, 3], [1, 4], [2, 5]].
    let x = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
    let t = TensorRef::from_slice(&x, &[2, 3])
        .unwrap()
        .restrided(vec![3, 2], vec![1, 3]);
    let c = OwnedTensor::copy_of(&t);
    assert_eq!(c.shape, [3, 2]);
    assert_eq!(c.as_slice::<f32>().unwrap(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    // rank 0 and empty
    let s = OwnedTensor::copy_of(&TensorRef::from_slice(&x[4..5], &[]).unwrap());
    assert_eq!(s.as_slice::<f32>().unwrap(), [4.0]);
    let e = OwnedTensor::copy_of(&TensorRef::from_slice(&x[..0], &[0, 3]).unwrap());
    assert_eq!(e.numel(), 0);
}
