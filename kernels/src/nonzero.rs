//! nonzero: int64 `[n, rank]` coordinates of the non-zero elements in row-major order (like
//! `numpy.argwhere`). A data-dependent output shape: the kernel counts, allocates through
//! `KernelCtx::alloc_output`, then fills. NaN counts as non-zero, `-0.0` as zero. A rank-0
//! input gives `[n, 0]` with n in {0, 1}.
//!
//! Counting and filling run over fixed chunks (boundaries depend only on the element count);
//! each chunk writes its rows at the offset given by the counts of the chunks before it.

use crate::common::{with_numeric, OutPtr, GRAIN};
use crate::elementwise::req;
use kernel_core::{
    parallel::chunks, DType, Element, InferCtx, KernelCtx, OpDef, Registry, Result, ShapeOut,
};

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder("nonzero(Tensor x) -> Tensor")
            .doc("int64 [n, rank] coordinates of the non-zero elements, row-major (numpy.argwhere)")
            .dtypes(DType::NUMERIC)
            .fixed("out", DType::I64)
            .infer(nonzero_infer)
            .cpu(nonzero_cpu)
            .data_dependent_shape()
            .onnx_name("NonZero")
            .build()?,
    )?;
    Ok(())
}

fn nonzero_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![Some(vec![None, ctx.input(0).rank()])])
}

fn nonzero_k<T: Element>(ctx: &mut KernelCtx) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let x = req(inputs, 0)?;
    let shape = x.shape.clone();
    let rank = shape.len();
    let data = x.contiguous::<T>()?;
    let total = data.len();
    let (count, size) = chunks(total, GRAIN);
    let mut counts = vec![0usize; count];
    {
        let cp = OutPtr(counts.as_mut_ptr());
        run_chunks(pool, count, |c| {
            let r = &data[c * size..((c + 1) * size).min(total)];
            let n = r.iter().filter(|v| !v.is_zero()).count();
            // SAFETY: one task per chunk.
            unsafe { cp.write(c as isize, n) };
        });
    }
    let mut offsets = Vec::with_capacity(count);
    let mut n = 0usize;
    for &c in &counts {
        offsets.push(n);
        n += c;
    }
    let mut out = ctx.alloc_output(0, &[n, rank])?;
    if n == 0 || rank == 0 {
        return Ok(());
    }
    let o = out.as_mut_slice::<i64>()?;
    let op = OutPtr(o.as_mut_ptr());
    run_chunks(pool, count, |c| {
        let start = c * size;
        let end = ((c + 1) * size).min(total);
        // SAFETY: this chunk owns rows offsets[c] .. offsets[c] + counts[c].
        let rows = unsafe { op.slice(offsets[c] * rank, counts[c] * rank) };
        // multi-index of `start`, advanced like an odometer
        let mut idx = vec![0usize; rank];
        let mut rem = start;
        for d in (0..rank).rev() {
            idx[d] = rem % shape[d];
            rem /= shape[d];
        }
        let mut w = 0;
        for v in &data[start..end] {
            if !v.is_zero() {
                for (dst, &i) in rows[w..w + rank].iter_mut().zip(&idx) {
                    *dst = i as i64;
                }
                w += rank;
            }
            let mut d = rank;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    });
    Ok(())
}

fn run_chunks(pool: &dyn kernel_core::ThreadPool, count: usize, f: impl Fn(usize) + Sync) {
    match count {
        0 => {}
        1 => f(0),
        _ => pool.run(count, &f),
    }
}

fn nonzero_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => nonzero_k::<T>(ctx))
}
