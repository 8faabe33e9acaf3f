//! Unary and binary elementwise ops.

use kernel_core::{
    dispatch_numeric, parallel_for, BwdInput, DType, Element, Error, InferCtx, KernelCtx, OpDef,
    Registry, Result, ShapeOut, SharedMut,
};

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder("negate(Tensor x) -> Tensor")
            .doc("-x")
            .dtypes(DType::NUMERIC)
            .infer(same_shape)
            .cpu(negate_cpu)
            .backward("negate", &[BwdInput::Grad(0)], &[0])
            .build()?,
    )?;
    Ok(())
}

/// Output 0 has the shape of input 0.
pub fn same_shape(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![ctx.input(0).shape.clone()])
}

/// Elements per parallel chunk for cheap elementwise work.
const GRAIN: usize = 1 << 15;

/// Apply `f` elementwise from input 0 into output 0, in parallel over fixed chunks.
pub fn unary_map<T: Element>(ctx: &mut KernelCtx, f: impl Fn(T) -> T + Sync) -> Result<()> {
    let x = ctx.input(0).contiguous::<T>()?;
    let out = ctx.outputs[0].as_mut_slice::<T>()?;
    if out.len() != x.len() {
        return Err(Error::internal("output size mismatch"));
    }
    let dst = SharedMut::new(out);
    parallel_for(ctx.pool, x.len(), GRAIN, |r| {
        // SAFETY: parallel_for ranges are disjoint and within bounds.
        let o = unsafe { dst.slice(r.start, r.len()) };
        for (o, &v) in o.iter_mut().zip(&x[r]) {
            *o = f(v);
        }
    });
    Ok(())
}

fn negate_cpu(ctx: &mut KernelCtx) -> Result<()> {
    dispatch_numeric!(ctx.input(0).dtype,
        T => unary_map::<T>(ctx, |v| -v),
        _ => Err(Error::internal("dtype")))
}
