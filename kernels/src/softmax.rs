//! softmax and softmax_backward along one axis.
//!
//! Numerically stable: each lane has its maximum subtracted before `exp`, so huge finite values
//! (1e30) are fine. A lane that is all `-inf` (or contains `+inf` twice, or a NaN) gives NaN,
//! as in PyTorch. Sums run in the compute type (f32 for half types) in index order, one lane
//! per task, so results do not depend on the thread count.

use crate::common::Num;
use crate::common::{
    contiguous_lanes, dims_compatible, fmt_dims, in_ptr, lane_grain, load_strided, out_ptr,
    store_strided, with_float, Lanes, Real, Scalar,
};
use crate::elementwise::req;
use kernel_core::{
    normalize_axis, parallel_for, BwdInput, Error, InferCtx, KernelCtx, OpDef, Registry, Result,
    ShapeOut,
};
use num_traits::Float as _;

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder("softmax(Tensor x, int axis=-1) -> Tensor")
            .doc("exp(x - max) / sum(exp(x - max)) along axis (numerically stable)")
            .infer(softmax_infer)
            .cpu(softmax_cpu)
            .backward(
                "softmax_backward",
                &[BwdInput::Grad(0), BwdInput::Output(0)],
                &[0],
            )
            .build()?,
    )?;
    r.register(
        OpDef::builder("softmax_backward(Tensor grad, Tensor y, int axis=-1) -> Tensor")
            .doc("y * (grad - sum(grad * y, axis)) where y = softmax(x)")
            .infer(softmax_backward_infer)
            .cpu(softmax_backward_cpu)
            .backward_only()
            .build()?,
    )?;
    Ok(())
}

/// Validate `axis` against input `i`'s rank (when known).
pub(crate) fn check_axis(ctx: &InferCtx, i: usize) -> Result<()> {
    if let Some(rank) = ctx.input(i).rank() {
        normalize_axis(ctx.attrs.int("axis")?, rank)?;
    }
    Ok(())
}

fn softmax_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    check_axis(ctx, 0)?;
    Ok(vec![ctx.input(0).shape.clone()])
}

fn softmax_backward_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    check_axis(ctx, 1)?;
    if !dims_compatible(ctx.dims(1), ctx.dims(0)) {
        return Err(Error::invalid(format!(
            "grad has shape {} but y has shape {}",
            fmt_dims(ctx.dims(0).unwrap_or_default()),
            fmt_dims(ctx.dims(1).unwrap_or_default())
        )));
    }
    Ok(vec![ctx.input(1).shape.clone()])
}

fn softmax_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let x = req(inputs, 0)?;
    let axis = normalize_axis(ctx.attrs.int("axis")?, x.rank())?;
    let lin = Lanes::new(&x.shape, &x.strides, axis);
    let out = &mut ctx.outputs[0];
    let lout = contiguous_lanes(&out.shape, axis);
    let (p, o) = (in_ptr::<T>(x)?, out_ptr::<T>(out)?);
    let n = lin.n;
    if n == 0 || lin.count == 0 {
        return Ok(());
    }
    parallel_for(pool, lin.count, lane_grain(n), |range| {
        let mut buf = vec![T::C::ZERO; n];
        for lane in range {
            // SAFETY: lanes come from the tensors' own shapes and strides; each output lane is
            // written by one task.
            unsafe { load_strided(p, lin.base(lane), lin.stride, &mut buf) };
            let m = buf.iter().fold(T::C::neg_infinity(), |m, &v| m.max(v));
            let mut sum = T::C::ZERO;
            for v in buf.iter_mut() {
                *v = (*v - m).exp();
                sum = sum + *v;
            }
            for v in buf.iter_mut() {
                *v = *v / sum;
            }
            unsafe { store_strided(o, lout.base(lane), lout.stride, &buf) };
        }
    });
    Ok(())
}

fn softmax_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => softmax_k::<T>(ctx))
}

fn softmax_backward_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let (g, y) = (req(inputs, 0)?, req(inputs, 1)?);
    let axis = normalize_axis(ctx.attrs.int("axis")?, y.rank())?;
    let lg = Lanes::new(&g.shape, &g.strides, axis);
    let ly = Lanes::new(&y.shape, &y.strides, axis);
    let out = &mut ctx.outputs[0];
    let lout = contiguous_lanes(&out.shape, axis);
    let (pg, py, o) = (in_ptr::<T>(g)?, in_ptr::<T>(y)?, out_ptr::<T>(out)?);
    let n = ly.n;
    if n == 0 || ly.count == 0 {
        return Ok(());
    }
    parallel_for(pool, ly.count, lane_grain(n), |range| {
        let mut gb = vec![T::C::ZERO; n];
        let mut yb = vec![T::C::ZERO; n];
        for lane in range {
            // SAFETY: as in softmax.
            unsafe {
                load_strided(pg, lg.base(lane), lg.stride, &mut gb);
                load_strided(py, ly.base(lane), ly.stride, &mut yb);
            }
            let dot = gb
                .iter()
                .zip(&yb)
                .fold(T::C::ZERO, |acc, (&a, &b)| acc + a * b);
            for (gv, &yv) in gb.iter_mut().zip(&yb) {
                *gv = yv * (*gv - dot);
            }
            unsafe { store_strided(o, lout.base(lane), lout.stride, &gb) };
        }
    });
    Ok(())
}

fn softmax_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => softmax_backward_k::<T>(ctx))
}
