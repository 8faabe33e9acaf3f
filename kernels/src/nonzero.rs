//! nonzero: int64 `[n, rank]` coordinates of the non-zero elements in row-major order (like
//! `numpy.argwhere`). A data-dependent output shape: the kernel counts, allocates through
//! `KernelCtx::alloc_output`, then fills. NaN counts as non-zero, `-0.0` as zero. A rank-0
//! input gives `[n, 0]` with n in {0, 1}.
//!
//! Counting and filling run over fixed chunks (boundaries depend only on the element count);
//! each chunk writes its rows at the offset given by the counts of the chunks before it.

use crate::common::{expect_shape, with_numeric, GRAIN};
use crate::elementwise::req;
use kernel_core::{
    parallel::chunks, DType, Dim, Element, InferCtx, KernelCtx, OnnxLayout, OnnxNode, OnnxOp,
    OpDef, Registry, Result, ShapeOut,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
            // ONNX's output is [rank, n], the transpose of polyop's [n, rank]
            .onnx(
                OnnxOp::new("NonZero", &[9, 13])
                    .layout(OnnxLayout::TransposeOutput(0))
                    .check(onnx_nonzero_check),
            )
            .build()?,
    )?;
    Ok(())
}

/// ONNX's `NonZero` of a scalar is that of a one-element vector (`[1, n]`), polyop's has no
/// coordinates (`[n, 0]`): only inputs of known rank >= 1 are claimed.
fn onnx_nonzero_check(
    node: &dyn OnnxNode,
    _given: &mut Vec<(&'static str, kernel_core::AttrValue)>,
) -> std::result::Result<(), String> {
    match node.input(0) {
        Some(Ok(spec)) if spec.rank().is_some_and(|r| r >= 1) => Ok(()),
        _ => Err("the input's rank is 0 or unknown".into()),
    }
}

fn nonzero_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    // The count is data-dependent: unknown here; frameworks give it an unbacked symbol.
    let rank = ctx.input(0).rank().map_or(Dim::Unknown, Dim::Known);
    Ok(vec![Some(vec![Dim::Unknown, rank])])
}

fn nonzero_k<T: Element>(ctx: &mut KernelCtx) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let x = req(inputs, 0)?;
    let shape = x.shape.clone();
    let rank = shape.len();
    let data = x.contiguous::<T>()?;
    let total = data.len();
    let (count, size) = chunks(total, GRAIN);
    // one slot per chunk (safe: one relaxed store per chunk of GRAIN elements)
    let slots: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
    kernel_core::run_tasks(pool, count, |c| {
        let r = &data[c * size..((c + 1) * size).min(total)];
        let n = r.iter().filter(|v| !v.is_zero()).count();
        slots[c].store(n, Ordering::Relaxed);
    });
    let counts: Vec<usize> = slots.into_iter().map(AtomicUsize::into_inner).collect();
    let n: usize = counts.iter().sum();
    let mut out = ctx.alloc_output(0, &[n, rank])?;
    expect_shape("nonzero output", &out.shape, &[n, rank])?;
    if n == 0 || rank == 0 {
        return Ok(());
    }
    // chunk c's rows (counts[c] of them, after those of the chunks before it), split off
    // safely; each is locked once, by the task of its chunk
    let mut rest = out.as_mut_slice::<i64>()?;
    let mut parts = Vec::with_capacity(count);
    for &c in &counts {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(c * rank);
        parts.push(Mutex::new(head));
        rest = tail;
    }
    kernel_core::run_tasks(pool, count, |c| {
        let start = c * size;
        let end = ((c + 1) * size).min(total);
        let mut rows = parts[c].lock().unwrap_or_else(|e| e.into_inner());
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

fn nonzero_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => nonzero_k::<T>(ctx))
}
