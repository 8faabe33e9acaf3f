//! rms_norm and rms_norm_backward over every dim from `axis` on (torch `normalized_shape`,
//! ONNX `RMSNormalization` `axis`).
//!
//! `y = x / sqrt(mean(x^2) + eps) * weight`, the mean taken in the compute type (f32 for half
//! types; forward: 16 partial sums in a fixed order, see `common::ACC`, vectorised, contiguous
//! f32/f64 rows read and written in place), one row per task. A row is `x.shape[axis:]`
//! flattened: the normalised dims are folded into one (a restrided view when their strides
//! merge, a contiguous copy otherwise), so every axis runs the last-axis code. A rank-0 `x`
//! is one row of length 1 (weight `[1]`), as for `axis=-1` before axes existed. The weight gradient sums
//! per-row contributions over fixed chunks of rows (chunk boundaries depend only on the
//! number of rows), then adds the chunk partials in chunk order, so it does not depend on the
//! thread count.

use crate::common::Num;
use crate::common::{
    c_slice, c_slice_mut, contiguous_lanes, expect_shape, in_ptr, lane_grain, load_strided,
    out_ptr, store_strided, sum_map, tree_sum, with_float, with_simd, Lanes, Real, Scalar, ACC,
};
use crate::elementwise::req;
use kernel_core::fmt_dims;
use kernel_core::{
    normalize_axis, parallel::chunks, widen_f32_attr, AttrValue, BwdInput, Dim, Error, InferCtx,
    KernelCtx, OnnxOp, OpDef, OwnedTensor, Registry, Result, ShapeOut, ShardCtx, ShardingRule,
    TensorRef,
};
use num_traits::Float as _;

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder(
            "rms_norm(Tensor x, Tensor? weight=None, float eps=1e-6, int axis=-1) -> Tensor",
        )
        .doc("x / sqrt(mean(x^2 over every dim from axis on) + eps) * weight; weight has shape x.shape[axis:]")
        .axis_attr("axis")
        .infer(rms_norm_infer)
        .cpu(rms_norm_cpu)
        // scale must have exactly x.shape[axis:] (ONNX also allows a broadcastable one: not
        // claimed); stash_type 1 (float32 statistics) is what polyop computes for half types
        // and float32, and ONNX's reference computes double in double
        .onnx(
            OnnxOp::new("RMSNormalization", &[23])
                .attr_default("axis", "axis", AttrValue::Int(-1))
                .attr_default("epsilon", "eps", AttrValue::Float(widen_f32_attr(1e-5)))
                .require("stash_type", AttrValue::Int(1)),
        )
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
            "rms_norm_backward(Tensor grad, Tensor x, Tensor? weight=None, float eps=1e-6, int axis=-1) -> (Tensor grad_x, Tensor grad_weight)",
        )
        .doc("gradients of rms_norm for x and weight (grad_weight has shape x.shape[axis:] even without a weight)")
        .axis_attr("axis")
        .infer(rms_norm_backward_infer)
        .cpu(rms_norm_backward_cpu)
        .backward_only()
        .sharding(norm_backward_sharding)
        .build()?,
    )?;
    Ok(())
}

/// The normalised shape `x.shape[axis:]` (`[1]` for a rank-0 x), `None` if x's rank is
/// unknown. Validates eps, axis and the weight's shape (equal to the normalised shape, or
/// constraints when symbolic).
fn check(ctx: &InferCtx, x: usize, w: usize) -> Result<Option<Vec<Dim>>> {
    let eps = ctx.attrs.float("eps")?;
    if eps.is_nan() || eps < 0.0 {
        return Err(Error::invalid(format!("eps must be >= 0, got {eps}")));
    }
    let axis = ctx.attrs.int("axis")?;
    let norm: Option<Vec<Dim>> = match ctx.dims(x) {
        None => None,
        Some([]) => {
            normalize_axis(axis, 0)?;
            Some(vec![Dim::Known(1)])
        }
        Some(d) => Some(d[normalize_axis(axis, d.len())?..].to_vec()),
    };
    if let Some(wd) = ctx.input_opt(w).and_then(|w| w.shape.as_deref()) {
        let msg = || {
            let want = match &norm {
                Some(n) => fmt_dims(n),
                None => "x.shape[axis:]".to_string(),
            };
            format!(
                "weight must have shape {want} (x.shape[axis:] for axis={axis}), got {}",
                fmt_dims(wd)
            )
        };
        match &norm {
            Some(n) if n.len() == wd.len() => {
                for (a, b) in wd.iter().zip(n) {
                    ctx.require_eq(a, b, msg)?;
                }
            }
            Some(_) => return Err(Error::invalid(msg())),
            // x's rank unknown: a negative axis still fixes the weight's rank
            None if axis < 0 && wd.len() as i64 != -axis => return Err(Error::invalid(msg())),
            None => {}
        }
    }
    Ok(norm)
}

fn rms_norm_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    check(ctx, 0, 1)?;
    Ok(vec![ctx.input(0).shape.clone()])
}

fn rms_norm_backward_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    let norm = check(ctx, 1, 2)?;
    let (g, x) = (ctx.dims(0), ctx.dims(1));
    ctx.require_shape(x, g, || {
        format!(
            "grad has shape {} but x has shape {}",
            fmt_dims(g.unwrap_or_default()),
            fmt_dims(x.unwrap_or_default())
        )
    })?;
    // x's rank unknown: a negative axis still gives grad_weight's rank
    let axis = ctx.attrs.int("axis")?;
    let gw = norm.or_else(|| (axis < 0).then(|| vec![Dim::Unknown; axis.unsigned_abs() as usize]));
    Ok(vec![ctx.input(1).shape.clone(), gw])
}

/// The stride that walks dims `shape` (row-major) as one flat dim, if there is one (every dim
/// of size > 1 steps over all the dims after it).
fn merged_stride(shape: &[usize], strides: &[isize]) -> Option<isize> {
    if shape.contains(&0) {
        return Some(1);
    }
    let inner = shape
        .iter()
        .zip(strides)
        .rev()
        .find(|(&d, _)| d != 1)
        .map_or(1, |(_, &s)| s);
    let mut expected = inner;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return None;
        }
        expected = expected.checked_mul(d as isize)?;
    }
    Some(inner)
}

/// `t` with its dims from `axis` on folded into one last dim: a view of the same elements when
/// their strides merge, else a view of `copy` (filled with a contiguous copy of `t`).
fn fold<'a>(t: &TensorRef<'a>, axis: usize, copy: &'a mut Option<OwnedTensor>) -> TensorRef<'a> {
    if t.rank() <= 1 || axis + 1 == t.rank() {
        return t.clone();
    }
    let mut shape = t.shape[..axis].to_vec();
    shape.push(t.shape[axis..].iter().product());
    if let Some(s) = merged_stride(&t.shape[axis..], &t.strides[axis..]) {
        let mut strides = t.strides[..axis].to_vec();
        strides.push(s);
        // every offset the folded view reaches is one `t` reaches: flat index j of the folded
        // dims is the row-major index whose offset is j * s (merged_stride)
        return t.restrided(shape, strides);
    }
    let c = copy.insert(OwnedTensor::copy_of(t));
    let strides = kernel_core::contiguous_strides(&shape);
    c.view().restrided(shape, strides)
}

/// The normalised axis of a tensor of `x`'s rank (0 for rank 0).
fn norm_axis(ctx: &KernelCtx, x: &TensorRef) -> Result<usize> {
    normalize_axis(ctx.attrs.int("axis")?, x.rank()).map(|a| a.min(x.rank().saturating_sub(1)))
}

/// rms_norm's factors: the dims of `x` (input `xi`) before `axis` are split (rows are
/// independent), the normalised dims from `axis` on are whole; the weight and `grad_weight`
/// have those whole dims. Tensors shaped like `x` share its factors.
fn norm_rule(ctx: &ShardCtx, xi: usize) -> Result<ShardingRule> {
    let Some(rank) = ctx.input_rank(xi) else {
        return Ok(ShardingRule::replicated(ctx));
    };
    let axis = normalize_axis(ctx.attrs.int("axis")?, rank)?.min(rank);
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

/// The weight (or ones) in the compute type, flattened: `n` values from a weight of shape
/// `want` (x.shape[axis:]).
fn weight_c<T: Scalar>(w: Option<&TensorRef>, want: &[usize], n: usize) -> Result<Vec<T::C>>
where
    T::C: Real,
{
    let mut wb = vec![T::C::ONE; n];
    if let Some(w) = w {
        expect_shape("weight", &w.shape, want)?;
        let mut copy = None;
        let w = fold(w, 0, &mut copy);
        let stride = w.strides.first().copied().unwrap_or(1);
        // SAFETY: w has shape `want` (checked just above), folded to [n] (or rank 0 with
        // n == 1), so offsets `j * stride`, `j < n`, are its elements; it is only read.
        unsafe { load_strided(in_ptr::<T>(&w)?, 0, stride, &mut wb) };
    }
    Ok(wb)
}

/// The weight's expected shape: x.shape[axis:] (`[1]` for a rank-0 x).
fn norm_shape(x: &TensorRef, axis: usize) -> Vec<usize> {
    if x.rank() == 0 {
        vec![1]
    } else {
        x.shape[axis..].to_vec()
    }
}

fn x_lanes(x: &TensorRef) -> Lanes {
    Lanes::new(&x.shape, &x.strides, x.rank().saturating_sub(1))
}

fn rms_norm_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let x0 = req(inputs, 0)?;
    let eps = T::C::from_f64(ctx.attrs.float("eps")?);
    let axis = norm_axis(ctx, x0)?;
    let mut copy = None;
    let x = &fold(x0, axis, &mut copy);
    let lx = x_lanes(x);
    let n = lx.n;
    let wb = weight_c::<T>(
        inputs.get(1).and_then(Option::as_ref),
        &norm_shape(x0, axis),
        n,
    )?;
    let out = &mut ctx.outputs[0];
    expect_shape("rms_norm output", &out.shape, &x0.shape)?;
    // the output is contiguous: its folded lanes are those of x's folded shape
    let lout = contiguous_lanes(&x.shape, x.rank().saturating_sub(1));
    let (p, o) = (in_ptr::<T>(x)?, out_ptr::<T>(out)?);
    if n == 0 || lx.count == 0 {
        return Ok(());
    }
    let inv_n = T::C::ONE / T::C::from_f64(n as f64);
    let direct = lx.stride == 1 && lout.stride == 1;
    kernel_core::parallel_for(pool, lx.count, lane_grain(n), |range| {
        // `#[inline(always)]`: the row loop (and the half-type conversions in it) must be
        // compiled inside `with_simd`, see there.
        with_simd(
            #[inline(always)]
            || {
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
                        } else if direct {
                            // a contiguous half-type row: converted as it is read and written
                            rms_row_converted(
                                std::slice::from_raw_parts(p.0.offset(lx.base(lane)), n),
                                &wb,
                                inv_n,
                                eps,
                                std::slice::from_raw_parts_mut(o.0.offset(lout.base(lane)), n),
                            );
                        } else {
                            buf.resize(n, T::C::ZERO);
                            obuf.resize(n, T::C::ZERO);
                            load_strided(p, lx.base(lane), lx.stride, &mut buf);
                            rms_row(&buf, &wb, inv_n, eps, &mut obuf);
                            store_strided(o, lout.base(lane), lout.stride, &obuf);
                        }
                    }
                }
            },
        )
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

/// [`rms_row`] of a half-type row, converted as it is read and written (explicit-SIMD loops
/// where the CPU has them, [`crate::vmath::VecElem`]; element by element elsewhere): the same
/// operations in the same order, so the same bits as converting the row, [`rms_row`] and
/// rounding back, in two passes where that took four.
#[inline(always)]
fn rms_row_converted<C: Real, T: Scalar<C = C>>(x: &[T], w: &[C], inv_n: C, eps: C, dst: &mut [T]) {
    let mut acc = [C::ZERO; ACC];
    let done = T::sum_sq_chunks(x, &mut acc) * ACC;
    for chunk in x[done..].chunks(ACC) {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            let v = v.to_c();
            *a = *a + v * v;
        }
    }
    let ss = tree_sum(acc);
    let r = C::ONE / (ss * inv_n + eps).sqrt();
    let done = T::scale_store_chunks(x, r, w, dst) * ACC;
    for ((d, &v), &w) in dst[done..].iter_mut().zip(&x[done..]).zip(&w[done..]) {
        *d = T::from_c(v.to_c() * r * w);
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
    let (g0, x0) = (req(inputs, 0)?, req(inputs, 1)?);
    let eps = T::C::from_f64(ctx.attrs.float("eps")?);
    let axis = norm_axis(ctx, x0)?;
    expect_shape("rms_norm_backward grad", &g0.shape, &x0.shape)?;
    let (mut gcopy, mut xcopy) = (None, None);
    let (g, x) = (&fold(g0, axis, &mut gcopy), &fold(x0, axis, &mut xcopy));
    let (lg, lx) = (x_lanes(g), x_lanes(x));
    let n = lx.n;
    let want = norm_shape(x0, axis);
    let wb = weight_c::<T>(inputs.get(2).and_then(Option::as_ref), &want, n)?;
    let (gx_out, gw_out) = ctx.outputs.split_at_mut(1);
    expect_shape("rms_norm_backward grad_input", &gx_out[0].shape, &x0.shape)?;
    expect_shape("rms_norm_backward grad_weight", &gw_out[0].shape, &want)?;
    let lout = contiguous_lanes(&x.shape, x.rank().saturating_sub(1));
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

#[cfg(test)]
mod tests {
    use super::{rms_row, rms_row_converted};
    use crate::common::{at_each_level, test_values, with_simd, Scalar, ACC};
    use half::{bf16, f16};

    /// Half-type rows against converting the whole row to f32, [`rms_row`] and rounding back:
    /// the same bits at every SIMD level, for rows of whole chunks and with a remainder, tiny
    /// (subnormal results) and large values, a NaN and an infinity.
    fn half_rows_match_converted_rows<T: Scalar<C = f32>>(name: &str) {
        let mut next = test_values(0x9e37_79b9_7f4a_7c15u64, -4.0, 4.0);
        at_each_level(|level| {
            for n in [1024, 3 * ACC + 5, 7, ACC] {
                let w: Vec<f32> = (0..n).map(|_| next()).collect();
                let tiny: Vec<f32> = w.iter().map(|v| v * 1e-6).collect();
                for case in 0..4 {
                    let mut src: Vec<T> = (0..n).map(|_| T::from_c(next())).collect();
                    match case {
                        1 => src[n / 2] = T::from_c(f32::NAN),
                        2 => src[n - 1] = T::from_c(f32::INFINITY),
                        // values near f16's largest (squares far past it), and a tiny
                        // weight: results in the half types' subnormal range
                        3 => src
                            .iter_mut()
                            .for_each(|v| *v = T::from_c(v.to_c() * 1.5e4)),
                        _ => {}
                    }
                    let row: Vec<f32> = src.iter().map(|v| v.to_c()).collect();
                    let mut want = vec![0f32; n];
                    let mut got = vec![T::from_c(0.0); n];
                    let w = if case == 3 { &tiny } else { &w };
                    with_simd(|| {
                        rms_row(&row, w, 1.0 / n as f32, 1e-6, &mut want);
                        rms_row_converted(&src, w, 1.0 / n as f32, 1e-6, &mut got);
                    });
                    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                        assert_eq!(
                            g.to_c().to_bits(),
                            T::from_c(*w).to_c().to_bits(),
                            "{name} {level}: row of {n}, case {case}, element {i}"
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn f16_rows_converted_as_read_give_the_converted_rows_bits() {
        half_rows_match_converted_rows::<f16>("f16");
    }

    #[test]
    fn bf16_rows_converted_as_read_give_the_converted_rows_bits() {
        half_rows_match_converted_rows::<bf16>("bf16");
    }
}
