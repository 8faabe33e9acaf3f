//! rms_norm and rms_norm_backward over the last axis.
//!
//! `y = x / sqrt(mean(x^2) + eps) * weight`, the mean taken in the compute type (f32 for half
//! types; forward: 16 partial sums in a fixed order, see `common::ACC`, vectorised, contiguous
//! f32/f64 rows read and written in place), one row per task. A rank-0 `x` is one row of length 1. The weight gradient sums
//! per-row contributions over fixed chunks of rows (chunk boundaries depend only on the
//! number of rows), then adds the chunk partials in chunk order, so it does not depend on the
//! thread count.

use crate::common::Num;
use crate::common::{
    c_slice, c_slice_mut, contiguous_lanes, expect_shape, in_ptr, lane_grain, load_strided,
    out_ptr, store_strided, sum_map, with_float, with_simd, Lanes, Real, Scalar,
};
use crate::elementwise::req;
use kernel_core::fmt_dims;
use kernel_core::{
    normalize_axis, parallel::chunks, BwdInput, Dim, Error, InferCtx, KernelCtx, OpDef, Registry,
    Result, ShapeOut, ShardCtx, ShardingRule, TensorRef,
};
use num_traits::Float as _;

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder("rms_norm(Tensor x, Tensor? weight=None, float eps=1e-6) -> Tensor")
            .doc("x / sqrt(mean(x^2 over the last axis) + eps) * weight")
            .infer(rms_norm_infer)
            .cpu(rms_norm_cpu)
            .backward(
                "rms_norm_backward",
                &[BwdInput::Grad(0), BwdInput::Input(0), BwdInput::Input(1)],
                &[0, 1],
            )
            .sharding(norm_sharding)
            .build()?,
    )?;
    r.register(
        OpDef::builder(
            "rms_norm_backward(Tensor grad, Tensor x, Tensor? weight=None, float eps=1e-6) -> (Tensor grad_x, Tensor grad_weight)",
        )
        .doc("gradients of rms_norm for x and weight (grad_weight is [x.shape[-1]] even without a weight)")
        .infer(rms_norm_backward_infer)
        .cpu(rms_norm_backward_cpu)
        .backward_only()
        .sharding(norm_backward_sharding)
        .build()?,
    )?;
    Ok(())
}

/// The normalised length (last dim of x; 1 for rank 0), `None` if x's rank is unknown.
/// Validates eps and the weight's shape (equal to that length, or a constraint when symbolic).
fn check(ctx: &InferCtx, x: usize, w: usize) -> Result<Option<Dim>> {
    let eps = ctx.attrs.float("eps")?;
    if eps.is_nan() || eps < 0.0 {
        return Err(Error::invalid(format!("eps must be >= 0, got {eps}")));
    }
    let n: Option<Dim> = ctx
        .dims(x)
        .map(|d| d.last().cloned().unwrap_or(Dim::Known(1)));
    if let Some(wd) = ctx.input_opt(w).and_then(|w| w.shape.as_deref()) {
        let msg = || {
            let want = match &n {
                Some(d @ (Dim::Known(_) | Dim::Sym(_))) => format!("[{d}]"),
                _ => "[n]".to_string(),
            };
            format!(
                "weight must have shape {want} (the last dim of x), got {}",
                fmt_dims(wd)
            )
        };
        match (wd, &n) {
            ([wn], Some(n)) => ctx.require_eq(wn, n, msg)?,
            ([_], None) => {}
            _ => return Err(Error::invalid(msg())),
        }
    }
    Ok(n)
}

fn rms_norm_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    check(ctx, 0, 1)?;
    Ok(vec![ctx.input(0).shape.clone()])
}

fn rms_norm_backward_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    let n = check(ctx, 1, 2)?;
    let (g, x) = (ctx.dims(0), ctx.dims(1));
    ctx.require_shape(x, g, || {
        format!(
            "grad has shape {} but x has shape {}",
            fmt_dims(g.unwrap_or_default()),
            fmt_dims(x.unwrap_or_default())
        )
    })?;
    Ok(vec![
        ctx.input(1).shape.clone(),
        Some(vec![n.unwrap_or(Dim::Unknown)]),
    ])
}

/// rms_norm's factors: the dims of `x` (input `xi`) before `axis` are split (rows are
/// independent), the normalised dims from `axis` on are whole; the weight and `grad_weight`
/// have those whole dims. Tensors shaped like `x` share its factors.
fn norm_rule(ctx: &ShardCtx, xi: usize) -> Result<ShardingRule> {
    let Some(rank) = ctx.input_rank(xi) else {
        return Ok(ShardingRule::replicated(ctx));
    };
    // (an op without an `axis` attribute normalises over the last dim)
    let axis = normalize_axis(ctx.attrs.int("axis").unwrap_or(-1), rank)?.min(rank);
    let mut r = ShardingRule::aligned(ctx, rank, &(axis..rank).collect::<Vec<_>>());
    let tail: Vec<usize> = r.inputs[xi]
        .as_ref()
        .map_or(Vec::new(), |x| x[axis..].to_vec());
    let tail_rank = Some(tail.len());
    for m in r.inputs.iter_mut().chain(r.outputs.iter_mut()) {
        if m.as_ref().map(Vec::len) == tail_rank && tail_rank != Some(rank) {
            *m = Some(tail.clone());
        }
    }
    Ok(r)
}

fn norm_sharding(ctx: &ShardCtx) -> Result<ShardingRule> {
    norm_rule(ctx, 0)
}

fn norm_backward_sharding(ctx: &ShardCtx) -> Result<ShardingRule> {
    norm_rule(ctx, 1)
}

/// The weight (or ones) in the compute type.
fn weight_c<T: Scalar>(w: Option<&TensorRef>, n: usize) -> Result<Vec<T::C>>
where
    T::C: Real,
{
    let mut wb = vec![T::C::ONE; n];
    if let Some(w) = w {
        expect_shape("weight", &w.shape, &[n])?;
        // SAFETY: w has shape [n] (checked just above), so offsets `j * strides[0]`, `j < n`,
        // are its elements; it is only read.
        unsafe { load_strided(in_ptr::<T>(w)?, 0, w.strides[0], &mut wb) };
    }
    Ok(wb)
}

fn x_lanes(x: &TensorRef) -> Lanes {
    Lanes::new(&x.shape, &x.strides, x.rank().saturating_sub(1))
}

fn rms_norm_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let x = req(inputs, 0)?;
    let eps = T::C::from_f64(ctx.attrs.float("eps")?);
    let lx = x_lanes(x);
    let n = lx.n;
    let wb = weight_c::<T>(inputs.get(1).and_then(Option::as_ref), n)?;
    let out = &mut ctx.outputs[0];
    expect_shape("rms_norm output", &out.shape, &x.shape)?;
    let lout = contiguous_lanes(&out.shape, out.rank().saturating_sub(1));
    let (p, o) = (in_ptr::<T>(x)?, out_ptr::<T>(out)?);
    if n == 0 || lx.count == 0 {
        return Ok(());
    }
    let inv_n = T::C::ONE / T::C::from_f64(n as f64);
    let direct = lx.stride == 1 && lout.stride == 1;
    kernel_core::parallel_for(pool, lx.count, lane_grain(n), |range| {
        with_simd(|| {
            let (mut buf, mut obuf) = (Vec::new(), Vec::new());
            for lane in range {
                // SAFETY: x and the output have the same shape (checked above), so row
                // `lane < lx.count` has `n` elements in both, at offsets each view's shape and
                // strides reach (the output is contiguous, `out_ptr` checked it);
                // `parallel_for` gives each row to one task, so its output is this task's.
                unsafe {
                    let (src, dst) = if direct {
                        (
                            c_slice::<T>(p, lx.base(lane), n),
                            c_slice_mut::<T>(o, lout.base(lane), n),
                        )
                    } else {
                        (None, None)
                    };
                    if let (Some(src), Some(dst)) = (src, dst) {
                        rms_row(src, &wb, inv_n, eps, dst);
                    } else {
                        buf.resize(n, T::C::ZERO);
                        obuf.resize(n, T::C::ZERO);
                        load_strided(p, lx.base(lane), lx.stride, &mut buf);
                        rms_row(&buf, &wb, inv_n, eps, &mut obuf);
                        store_strided(o, lout.base(lane), lout.stride, &obuf);
                    }
                }
            }
        })
    });
    Ok(())
}

/// `dst = x / sqrt(mean(x^2) + eps) * w`, the sum of squares in the fixed order of
/// [`crate::common::ACC`]. Vectorised.
#[inline(always)]
fn rms_row<C: Real>(x: &[C], w: &[C], inv_n: C, eps: C, dst: &mut [C]) {
    let ss = sum_map(x, |v| v * v);
    let r = C::ONE / (ss * inv_n + eps).sqrt();
    for ((d, &v), &w) in dst.iter_mut().zip(x).zip(w) {
        *d = v * r * w;
    }
}

fn rms_norm_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => rms_norm_k::<T>(ctx))
}

fn rms_norm_backward_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let (g, x) = (req(inputs, 0)?, req(inputs, 1)?);
    let eps = T::C::from_f64(ctx.attrs.float("eps")?);
    let (lg, lx) = (x_lanes(g), x_lanes(x));
    let n = lx.n;
    let wb = weight_c::<T>(inputs.get(2).and_then(Option::as_ref), n)?;
    let (gx_out, gw_out) = ctx.outputs.split_at_mut(1);
    expect_shape("rms_norm_backward grad", &g.shape, &x.shape)?;
    expect_shape("rms_norm_backward grad_input", &gx_out[0].shape, &x.shape)?;
    let lout = contiguous_lanes(&gx_out[0].shape, gx_out[0].rank().saturating_sub(1));
    let (pg, px) = (in_ptr::<T>(g)?, in_ptr::<T>(x)?);
    let o = out_ptr::<T>(&mut gx_out[0])?;
    let gw = gw_out[0].as_mut_slice::<T>()?;
    if n == 0 {
        return Ok(());
    }
    let rows = lx.count;
    let inv_n = T::C::ONE / T::C::from_f64(n as f64);
    let grain = lane_grain(n);
    let (count, size) = chunks(rows, grain);
    // one partial grad_weight per chunk of rows
    let partials: Vec<std::sync::Mutex<Vec<T::C>>> = (0..count)
        .map(|_| std::sync::Mutex::new(Vec::new()))
        .collect();
    let task = |c: usize| {
        let mut gb = vec![T::C::ZERO; n];
        let mut xb = vec![T::C::ZERO; n];
        let mut acc = vec![T::C::ZERO; n];
        for lane in c * size..((c + 1) * size).min(rows) {
            // SAFETY: g has x's shape (checked above), so row `lane < lx.count` has `n`
            // elements in both; they are only read.
            unsafe {
                load_strided(pg, lg.base(lane), lg.stride, &mut gb);
                load_strided(px, lx.base(lane), lx.stride, &mut xb);
            }
            let ss = xb.iter().fold(T::C::ZERO, |a, &v| a + v * v);
            let r = T::C::ONE / (ss * inv_n + eps).sqrt();
            let s = gb
                .iter()
                .zip(&xb)
                .zip(&wb)
                .fold(T::C::ZERO, |a, ((&g, &x), &w)| a + g * w * x);
            let k = r * r * r * s * inv_n;
            for j in 0..n {
                acc[j] = acc[j] + gb[j] * xb[j] * r;
                gb[j] = r * gb[j] * wb[j] - k * xb[j];
            }
            // SAFETY: grad_input has x's shape (checked above), so row `lane` has `n ==
            // gb.len()` elements; the rows of chunk `c` are given to this task alone.
            unsafe { store_strided(o, lout.base(lane), lout.stride, &gb) };
        }
        *partials[c].lock().unwrap_or_else(|e| e.into_inner()) = acc;
    };
    kernel_core::run_tasks(pool, count, task);
    let mut total = vec![T::C::ZERO; n];
    for p in partials {
        let p = p.into_inner().unwrap_or_else(|e| e.into_inner());
        for (t, v) in total.iter_mut().zip(p) {
            *t = *t + v;
        }
    }
    T::store(&total, gw);
    Ok(())
}

fn rms_norm_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => rms_norm_backward_k::<T>(ctx))
}
