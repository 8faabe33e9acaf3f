//! softmax and softmax_backward along one axis.
//!
//! Numerically stable: each lane has its maximum subtracted before `exp`, so huge finite values
//! (1e30) are fine. A lane that is all `-inf` (or contains `+inf` twice, or a NaN) gives NaN,
//! as in PyTorch. Sums run in the compute type (f32 for half types) in a fixed order (16
//! partial sums, see `common::ACC`), one lane per task, so results do not depend on the thread
//! count. Contiguous f32/f64 lanes are processed in place (no copies); the passes vectorise,
//! with f32 `exp` from `vmath`.

use crate::common::{
    c_slice, c_slice_mut, contiguous_lanes, expect_shape, in_ptr, lane_grain, load_strided,
    out_ptr, prefetch, store_strided, sum_zip, tree_sum, with_float, with_scratch, with_simd,
    InPtr, Lanes, Num, Real, Scalar, ACC, GRAIN,
};
use crate::elementwise::req;
use kernel_core::fmt_dims;
use kernel_core::{
    normalize_axis, parallel_for, AttrValue, BwdInput, InferCtx, KernelCtx, OnnxLayout, OnnxOp,
    OpDef, Registry, Result, ShapeOut, ShardingRule,
};

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder("softmax(Tensor x, int axis=-1) -> Tensor")
            .doc("exp(x - max) / sum(exp(x - max)) along axis (numerically stable)")
            .axis_attr("axis")
            .infer(softmax_infer)
            .cpu(softmax_cpu)
            // opset 13 on: along `axis` (default -1)
            .onnx(OnnxOp::new("Softmax", &[13]).attr("axis", "axis"))
            // before: the input viewed as 2-D at `axis` (default 1), softmax over each row
            .onnx(
                OnnxOp::new("Softmax", &[1, 11])
                    .set("axis", AttrValue::Int(-1))
                    .layout(OnnxLayout::Flatten2D {
                        attr: "axis",
                        default: 1,
                    }),
            )
            .backward(
                "softmax_backward",
                &[BwdInput::Grad(0), BwdInput::Output(0)],
                &[0],
            )
            .sharding(ShardingRule::whole_axes)
            .build()?,
    )?;
    r.register(
        OpDef::builder("softmax_backward(Tensor grad, Tensor y, int axis=-1) -> Tensor")
            .doc("y * (grad - sum(grad * y, axis)) where y = softmax(x)")
            .axis_attr("axis")
            .infer(softmax_backward_infer)
            .cpu(softmax_backward_cpu)
            .backward_only()
            .sharding(ShardingRule::whole_axes)
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
    ctx.require_shape(ctx.dims(1), ctx.dims(0), || {
        format!(
            "grad has shape {} but y has shape {}",
            fmt_dims(ctx.dims(0).unwrap_or_default()),
            fmt_dims(ctx.dims(1).unwrap_or_default())
        )
    })?;
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
    expect_shape("softmax output", &out.shape, &x.shape)?;
    let lout = contiguous_lanes(&out.shape, axis);
    let (p, o) = (in_ptr::<T>(x)?, out_ptr::<T>(out)?);
    let n = lin.n;
    if n == 0 || lin.count == 0 {
        return Ok(());
    }
    let direct = lin.stride == 1 && lout.stride == 1;
    // the lane after `lane` (a direct one), prefetched while `lane` is computed: the next row
    // of its task, or the first row of the next task, which the same thread mostly takes next
    // (each pool thread runs a run of consecutive tasks, rayon's halves or ONNX Runtime's
    // blocks); where another thread takes it, the hint was wasted, never wrong
    let next_row = |lane: usize| NextRow {
        p: if lane + 1 < lin.count {
            // (the whole `Sync` wrapper, not its raw-pointer field)
            let q: InPtr<T> = p;
            q.0.wrapping_offset(lin.base(lane + 1)) as *const u8
        } else {
            std::ptr::null()
        },
        elem: std::mem::size_of::<T>(),
    };
    // Rows of at least GRAIN elements: runs of consecutive rows, four tasks per thread, so that
    // every row is prefetched during the row before it (with one row a task and no prefetch
    // across tasks, 64 rows of 65536 spent a quarter of one thread's time waiting on memory in
    // the maximum's pass), and a thread that finishes early can take a task of one slowed
    // down (in MindSpore, whose Python thread spins beside polyop's pool while it waits, one
    // task per thread left the other thread idle: half-type rows ran at 0.68-0.93 of float32's
    // rate there, 1.2-1.5 elsewhere). Each row's result is its own, whatever the partition.
    let grain = if n >= GRAIN {
        lin.count.div_ceil(4 * pool.num_threads().max(1))
    } else {
        lane_grain(n)
    };
    parallel_for(pool, lin.count, grain, |range| {
        with_simd(
            #[inline(always)]
            || {
                // f32 rows in place need no buffer; a half-type row one, a strided row two
                // (from the thread's scratch: fresh buffers of a long row's size are fresh
                // pages, whose faults cost more than the row's arithmetic)
                let bufs = match (direct, T::as_c(&[]).is_some()) {
                    (true, true) => 0,
                    (true, false) => n,
                    (false, _) => 2 * n,
                };
                with_scratch(
                    bufs,
                    #[inline(always)]
                    |scratch: &mut [T::C]| {
                        let (buf, obuf) = scratch.split_at_mut(bufs.min(n));
                        for lane in range {
                            // SAFETY: x and the output have the same shape (checked above), so
                            // lane `lane < lin.count` has `n` elements in both, at offsets
                            // `base(lane) + j * stride` that each view's own shape and strides
                            // reach (the output is contiguous, `out_ptr` checked it).
                            // `parallel_for` gives each lane to one task, so the output
                            // elements written here are this task's alone.
                            unsafe {
                                let (src, dst) = if direct {
                                    (
                                        c_slice::<T>(p, lin.base(lane), n),
                                        c_slice_mut::<T>(o, lout.base(lane), n),
                                    )
                                } else {
                                    (None, None)
                                };
                                if let (Some(src), Some(dst)) = (src, dst) {
                                    softmax_row(src, dst, next_row(lane), T::NARROW);
                                } else if direct {
                                    // a contiguous half-type lane: converted as it is read
                                    softmax_row_converted::<T::C, T>(
                                        std::slice::from_raw_parts(p.0.offset(lin.base(lane)), n),
                                        std::slice::from_raw_parts_mut(
                                            o.0.offset(lout.base(lane)),
                                            n,
                                        ),
                                        buf,
                                        next_row(lane),
                                    );
                                } else {
                                    load_strided(p, lin.base(lane), lin.stride, buf);
                                    softmax_row(buf, obuf, NextRow::NONE, T::NARROW);
                                    store_strided(o, lout.base(lane), lout.stride, obuf);
                                }
                            }
                        }
                    },
                )
            },
        )
    });
    Ok(())
}

/// `e^(x - m)` with `x - m` taken exactly: `x - m = d + err` (Knuth's two-sum, exact in
/// the compute type), and `e^(d + err) = e^d (1 + err)` to within `err^2`. Without the
/// correction the rounding of `d` (half an ulp of `|d|`) becomes a relative error of `|d|/2`
/// ulps in every output, so a row spread over a wide range was off by more than exp's own few
/// ulps (a float32 row of spread 9.2 was 4.07 ulps off; found by the property tests). Where
/// `d` is not finite (an infinite or NaN input) the correction is dropped, so those rows give
/// what `e^(x - m)` gives.
#[inline(always)]
pub(crate) fn exp_minus<C: Real>(x: C, m: C) -> C {
    let d = x - m;
    let neg_m = C::ZERO - m;
    let bb = d - x;
    let err = (x - (d - bb)) + (neg_m - bb);
    let e = d.exp_v();
    let err = if err.is_finite() { err } else { C::ZERO };
    e + e * err
}

/// The maximum of `acc` (running maxima, element `i` of `a` goes into `acc[i % ACC]`) and `a`
/// converted by `to_c`.
#[inline(always)]
fn max_into<S: Copy, C: Real>(acc: &mut [C; ACC], a: &[S], to_c: impl Fn(S) -> C) -> C {
    let c = a.chunks_exact(ACC);
    let r = c.remainder();
    for x in c {
        for j in 0..ACC {
            let v = to_c(x[j]);
            acc[j] = if v > acc[j] { v } else { acc[j] };
        }
    }
    for j in 0..r.len() {
        let v = to_c(r[j]);
        acc[j] = if v > acc[j] { v } else { acc[j] };
    }
    // the lanes' maximum as a tree (halves, then quarters, ...): a chain of 4 maxima where a
    // left-to-right fold was 16, each waiting for the last. No lane is NaN (a NaN never wins a
    // `>`), and a maximum is exact in any order, so the value is the fold's (a zero's sign aside).
    let mut w = ACC / 2;
    while w > 0 {
        for j in 0..w {
            acc[j] = if acc[j + w] > acc[j] {
                acc[j + w]
            } else {
                acc[j]
            };
        }
        w /= 2;
    }
    acc[0]
}

/// `dst = softmax(src)`: max, then `exp(x - max)` stored and summed (fixed order, see
/// [`crate::common::ACC`]), then a division by the sum. Vectorised passes. With a finite
/// maximum the row takes `Real::exp_diff` (for f32 the fast [`crate::vmath::exp_diff_f32`],
/// which gives 0 for -inf elements); a row with a NaN (found on the way) or an infinite
/// maximum the general [`exp_minus`], which gives those rows' NaNs.
#[inline(always)]
fn softmax_row<C: Real>(src: &[C], dst: &mut [C], next: NextRow, narrow: bool) {
    if !narrow && src.len() <= SIMD_ROW_MAX && C::softmax_row_simd(src, dst, SUM_BLOCK) {
        return;
    }
    let (sum, fast) = exp_row(src, dst, next, narrow);
    div_by_sum(dst, sum, fast, narrow);
}

/// The first two passes of [`softmax_row`] over `src` (read as the compute type, converted as
/// they go): the maximum, then the exponentials into `dst` and their sum. Returns the sum, and
/// whether the row took the fast path (a finite maximum, no NaN). `narrow`: a 16-bit float
/// row (converted to `C` or not), whose exponentials take the short formula
/// ([`Scalar::NARROW`]).
#[inline(always)]
fn exp_row<C: Real, S: Scalar<C = C>>(
    src: &[S],
    dst: &mut [C],
    next: NextRow,
    narrow: bool,
) -> (C, bool) {
    let mut acc = [C::neg_infinity(); ACC];
    let done = S::max_chunks(src, &mut acc) * ACC;
    let m = max_into(&mut acc, &src[done..], S::to_c);
    let mut wide = [0.0f64; ACC];
    let fast = m.is_finite() && exp_sum::<C, S, true>(src, dst, m, &mut wide, next, 0, narrow);
    if !fast {
        // a NaN anywhere makes the sum NaN, hence every output NaN
        wide = [0.0; ACC];
        exp_sum::<C, S, false>(src, dst, m, &mut wide, NextRow::NONE, 0, narrow);
    }
    (C::from_f64(tree_sum(wide)), fast)
}

/// Elements per block of [`softmax_row_converted`]'s last pass: small enough (4 KiB of f32)
/// to stay in L1 between the division and the conversion.
const CONVERT_BLOCK: usize = 1024;

/// [`softmax_row`] of a half-type row `src` into `dst`, through one compute-type buffer `buf`
/// of the row's length that holds the exponentials. The maximum and the exponentials read
/// `src` converting as they go (explicit-SIMD loops where the CPU has them, see
/// [`crate::vmath::VecElem`]), and each block of [`CONVERT_BLOCK`] is divided and converted back
/// while it is in L1: the same operations in the same order as converting the whole row and
/// calling [`softmax_row`] with `narrow` (so the same bits), in three passes, where converting
/// first and last took five (rows of 1024 in f16 ran at 0.65 of f32's elements per second that
/// way).
#[inline(always)]
fn softmax_row_converted<C: Real, T: Scalar<C = C>>(
    src: &[T],
    dst: &mut [T],
    buf: &mut [C],
    next: NextRow,
) {
    let (sum, fast) = exp_row(src, buf, next, T::NARROW);
    // (the division and the conversion in one loop where the CPU allows; the rest in blocks)
    let done = if fast {
        T::div_store_chunks(buf, sum, C::ONE / sum, dst, T::NARROW) * ACC
    } else {
        0
    };
    for (b, d) in buf[done..]
        .chunks_mut(CONVERT_BLOCK)
        .zip(dst[done..].chunks_mut(CONVERT_BLOCK))
    {
        div_by_sum(b, sum, fast, T::NARROW);
        T::store(b, d);
    }
}

/// `e^(x - m)`: [`Real::exp_diff`] (`FINITE`: m finite, x finite or -inf) or [`exp_minus`].
/// (Plain functions, not closures: everything in the hot loop must inline into `with_simd`'s
/// AVX2+FMA body, or `mul_add` becomes a libm call.)
#[inline(always)]
fn exp_of<C: Real, const FINITE: bool>(x: C, m: C, narrow: bool) -> C {
    if FINITE {
        x.exp_diff(m, narrow)
    } else {
        exp_minus(x, m)
    }
}

/// Whether `s` holds a NaN.
#[inline(always)]
fn has_nan<C: Real>(s: &[C]) -> bool {
    s.iter().fold(false, |b, &x| b | Num::is_nan(x))
}

/// The row a task takes after this one, loaded into the cache a block at a time while
/// [`exp_sum`] computes this one: a hint with no effect on results. The next row's first pass
/// (its maximum) then reads it from the cache, not from memory (a row of 65536 floats took a
/// third longer from memory; the hardware prefetchers stop at each 4 KiB page). `p` null: none.
#[derive(Clone, Copy)]
pub(crate) struct NextRow {
    p: *const u8,
    /// bytes per element
    elem: usize,
}

impl NextRow {
    const NONE: NextRow = NextRow {
        p: std::ptr::null(),
        elem: 0,
    };

    /// Prefetch elements `from .. from + n` of the next row.
    #[inline(always)]
    fn fetch(self, from: usize, n: usize) {
        if !self.p.is_null() {
            prefetch(self.p.wrapping_add(from * self.elem), n * self.elem);
        }
    }
}

/// The longest row [`softmax_row`] hands to [`Real::softmax_row_simd`]: rows shorter than
/// [`GRAIN`]. Longer rows keep the general path, which prefetches the next row while it
/// computes this one (their tasks are runs of rows for that, see `softmax_k`); from memory (64
/// rows of 65536) the fused routine, which does not, was no faster, while in cache it ran rows
/// of 128, 1024 and 65536 at 1.3-1.6 times the general path's rate (`op_loop softmax_short`,
/// `softmax_long`, `softmax_wide`, one thread, AVX-512).
const SIMD_ROW_MAX: usize = GRAIN - 1;

/// Elements per block of [`exp_sum`]'s sum: each of the [`ACC`] f32 partials adds 16
/// terms, then goes into an f64 partial.
const SUM_BLOCK: usize = 16 * ACC;

/// `dst = e^(src - m)` (see [`exp_of`]), its sum added into `wide`; false (and `dst` and
/// `wide` unfinished) if `FINITE` and `src` holds a NaN, which only chunks off the fast path
/// of [`Real::exp_diff_chunk`] can. The sum has a fixed order (see [`crate::common::ACC`]):
/// within each block of [`SUM_BLOCK`] elements, element `i` goes into compute-type partial
/// `i % ACC`; each block's partials are added into the f64 partials `wide`, which the caller
/// adds in a fixed tree. So no partial adds more than 16 terms in the compute type and a long
/// float32 row's sum stays within a few ulps (with 16 float32 partials over the whole row, a
/// 65536-element row was 14 ulps off), at the speed of the float32 loop. Calls on
/// consecutive pieces of a row, each a whole number of [`SUM_BLOCK`]s but the last, give the
/// whole row's partials.
#[inline(always)]
fn exp_sum<C: Real, S: Scalar<C = C>, const FINITE: bool>(
    src: &[S],
    dst: &mut [C],
    m: C,
    wide: &mut [f64; ACC],
    next: NextRow,
    at: usize,
    narrow: bool,
) -> bool {
    for (i, (sb, db)) in src
        .chunks(SUM_BLOCK)
        .zip(dst.chunks_mut(SUM_BLOCK))
        .enumerate()
    {
        next.fetch(at + i * SUM_BLOCK, SUM_BLOCK);
        let mut acc = [C::ZERO; ACC];
        let done = if FINITE {
            S::exp_diff_chunks(sb, m, db, &mut acc, narrow)
        } else {
            0
        };
        let (cs, cd) = (sb.chunks_exact(ACC), db.chunks_exact_mut(ACC));
        let rs = cs.remainder();
        let mut cd = cd;
        for (s, d) in cs.zip(&mut cd).skip(done) {
            let s: [C; ACC] = std::array::from_fn(|j| s[j].to_c());
            let d: &mut [C; ACC] = d.try_into().unwrap();
            if FINITE {
                if !C::exp_diff_chunk(&s, m, d, narrow) && has_nan(&s) {
                    return false;
                }
            } else {
                for j in 0..ACC {
                    d[j] = exp_minus(s[j], m);
                }
            }
            for j in 0..ACC {
                acc[j] = acc[j] + d[j];
            }
        }
        let rd = cd.into_remainder();
        if FINITE && rs.iter().fold(false, |b, &v| b | Num::is_nan(v.to_c())) {
            return false;
        }
        for j in 0..rs.len() {
            let e = exp_of::<C, FINITE>(rs[j].to_c(), m, narrow);
            rd[j] = e;
            acc[j] = acc[j] + e;
        }
        for j in 0..ACC {
            wide[j] += acc[j].to_f64();
        }
    }
    true
}

/// `v / sum` given `rcp = 1 / sum` (see [`div_by_sum`]).
#[inline(always)]
fn div_markstein<C: Real>(v: C, sum: C, rcp: C) -> C {
    let q = v * rcp;
    let rem = (C::ZERO - q).mul_add(sum, v);
    rem.mul_add(rcp, q)
}

/// `dst /= sum`. After the fast pass (`fast`: a finite maximum, no NaN) the sum is in [1, n]: `v / sum` as `v * (1 /
/// sum)` plus one FMA correction (Markstein: with the reciprocal correctly rounded, the
/// corrected quotient is the correctly rounded `v / sum` for normal results; within a
/// subnormal ulp below), cheaper than a division; otherwise a plain division (NaN rows).
/// A `narrow` row (a 16-bit float type, [`Scalar::NARROW`]) on the fast path takes the
/// product `v * (1 / sum)` alone: within 1.5 ulps of the compute type, which its rounding to
/// the half type does not see.
#[inline(always)]
fn div_by_sum<C: Real>(dst: &mut [C], sum: C, fast: bool, narrow: bool) {
    if fast {
        let rcp = C::ONE / sum;
        if narrow {
            dst.iter_mut().for_each(|v| *v = *v * rcp);
        } else {
            dst.iter_mut()
                .for_each(|v| *v = div_markstein(*v, sum, rcp));
        }
    } else {
        for v in dst.iter_mut() {
            *v = *v / sum;
        }
    }
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
    expect_shape("softmax_backward grad", &g.shape, &y.shape)?;
    expect_shape("softmax_backward output", &out.shape, &y.shape)?;
    let lout = contiguous_lanes(&out.shape, axis);
    let (pg, py, o) = (in_ptr::<T>(g)?, in_ptr::<T>(y)?, out_ptr::<T>(out)?);
    let n = ly.n;
    if n == 0 || ly.count == 0 {
        return Ok(());
    }
    let direct = lg.stride == 1 && ly.stride == 1 && lout.stride == 1;
    parallel_for(pool, ly.count, lane_grain(n), |range| {
        with_simd(|| {
            let (mut gb, mut yb, mut ob) = (Vec::new(), Vec::new(), Vec::new());
            for lane in range {
                // SAFETY: g, y and the output have the same shape (checked above), so each
                // lane's `n` elements are in bounds of all three, as in softmax; one task
                // per output lane.
                unsafe {
                    let parts = if direct {
                        (
                            c_slice::<T>(pg, lg.base(lane), n),
                            c_slice::<T>(py, ly.base(lane), n),
                            c_slice_mut::<T>(o, lout.base(lane), n),
                        )
                    } else {
                        (None, None, None)
                    };
                    if let (Some(g), Some(y), Some(d)) = parts {
                        softmax_grad_row(g, y, d);
                    } else {
                        gb.resize(n, T::C::ZERO);
                        yb.resize(n, T::C::ZERO);
                        ob.resize(n, T::C::ZERO);
                        load_strided(pg, lg.base(lane), lg.stride, &mut gb);
                        load_strided(py, ly.base(lane), ly.stride, &mut yb);
                        softmax_grad_row(&gb, &yb, &mut ob);
                        store_strided(o, lout.base(lane), lout.stride, &ob);
                    }
                }
            }
        })
    });
    Ok(())
}

/// `dst = y * (g - sum(g * y))`, the sum in the fixed order of [`crate::common::ACC`].
#[inline(always)]
fn softmax_grad_row<C: Real>(g: &[C], y: &[C], dst: &mut [C]) {
    let dot = sum_zip(g, y, |a, b| a * b);
    for ((d, &gv), &yv) in dst.iter_mut().zip(g).zip(y) {
        *d = yv * (gv - dot);
    }
}

fn softmax_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => softmax_backward_k::<T>(ctx))
}

#[cfg(test)]
mod tests {
    use super::{softmax_row, softmax_row_converted, NextRow, CONVERT_BLOCK};
    use crate::common::{at_each_level, test_values, with_simd, Scalar};
    use half::{bf16, f16};

    /// Rows of `T` against converting the whole row to f32, [`softmax_row`] with `narrow` and
    /// rounding back: the same bits at every SIMD level, and the baseline level's bits at the
    /// others, with the maximum and the exponentials reading the half type directly. Rows hold
    /// NaN, -inf and elements far enough below the maximum that their chunks leave the
    /// exponentials' fast path in mid-row (and the loop picks it up again after them).
    fn half_rows_match_converted_rows<T: Scalar<C = f32>>(name: &str) {
        let mut baseline: Vec<Vec<u32>> = Vec::new();
        let mut row_no = 0;
        at_each_level(|level| {
            let mut next = test_values(0x2545_f491_4f6c_dd1du64, -12.0, 12.0);
            row_no = 0;
            for n in [3 * CONVERT_BLOCK + 37, CONVERT_BLOCK, 1000, 40, 5] {
                for case in 0..12 {
                    let mut src: Vec<T> = (0..n).map(|_| T::from_c(next())).collect();
                    match case % 4 {
                        1 => src[n - 2] = T::from_c(f32::NAN),
                        2 => src[n / 2] = T::from_c(f32::NEG_INFINITY),
                        // a far-below element in the first chunk, and another near the end
                        3 => {
                            src[1] = T::from_c(-200.0);
                            src[n - 3] = T::from_c(-150.0);
                        }
                        _ => {}
                    }
                    let row: Vec<f32> = src.iter().map(|v| v.to_c()).collect();
                    let mut want = vec![0f32; n];
                    let mut got = vec![T::from_c(0.0); n];
                    with_simd(|| {
                        softmax_row(&row, &mut want, NextRow::NONE, true);
                        softmax_row_converted::<f32, T>(
                            &src,
                            &mut got,
                            &mut vec![f32::NAN; n],
                            NextRow::NONE,
                        );
                    });
                    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                        let w = T::from_c(*w).to_c();
                        assert_eq!(
                            g.to_c().to_bits(),
                            w.to_bits(),
                            "{name} {level}: row of {n}, case {case}, element {i}"
                        );
                    }
                    let bits: Vec<u32> = got.iter().map(|v| v.to_c().to_bits()).collect();
                    if row_no == baseline.len() {
                        baseline.push(bits);
                    } else {
                        assert!(
                            baseline[row_no] == bits,
                            "{name} {level}: row of {n}, case {case} differs from the baseline's"
                        );
                    }
                    row_no += 1;
                    if case % 4 == 0 {
                        let sum: f64 = got.iter().map(|v| v.to_c() as f64).sum();
                        // n roundings to the half type, each within half its ulp
                        assert!((sum - 1.0).abs() < 0.01, "{name}: row of {n} sums to {sum}");
                    }
                }
            }
        });
    }

    /// Every element of a half-type row's softmax within 0.52 of the half type's ulp of a
    /// float64 softmax of the same values (its own rounding is 0.5; the short exponential and
    /// the product by `1 / sum` add at most float16's 2^-17 / 2^-11 = 1/64), subnormal results
    /// included (their ulp is the smallest subnormal). Rows of wide and narrow spread. A slip in
    /// the short formula (a coefficient, the reduction) shows as whole ulps.
    fn half_rows_within_an_ulp_of_float64<T: Scalar<C = f32>>(name: &str, mant: i32, min_exp: i32) {
        let ulp = |v: f64| 2f64.powi(v.abs().log2().floor().max(min_exp as f64) as i32 - mant);
        let mut worst = 0f64;
        for (spread, n) in [
            (1.0, 1024),
            (8.0, 1024),
            (30.0, 4000),
            (100.0, 65536),
            (3.0, 7),
        ] {
            let mut next = test_values(0x9e37_79b9_7f4a_7c15u64 ^ n as u64, -spread, 0.0);
            let src: Vec<T> = (0..n).map(|_| T::from_c(next())).collect();
            let x: Vec<f64> = src.iter().map(|v| v.to_c() as f64).collect();
            let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let mut got = vec![T::from_c(0.0); n];
            with_simd(|| {
                softmax_row_converted::<f32, T>(&src, &mut got, &mut vec![0.0; n], NextRow::NONE)
            });
            for (g, e) in got.iter().zip(&e) {
                let want = e / sum;
                let err = (g.to_c() as f64 - want).abs() / ulp(want);
                worst = worst.max(err);
                assert!(
                    err <= 0.52,
                    "{name}: spread {spread}, row of {n}: {} against {want:e}: {err} ulp",
                    g.to_c()
                );
            }
        }
        assert!(
            worst > 0.3,
            "{name}: worst {worst} ulp: no element rounded?"
        );
    }

    #[test]
    fn f16_rows_within_an_ulp_of_float64() {
        half_rows_within_an_ulp_of_float64::<f16>("f16", 10, -14);
    }

    #[test]
    fn bf16_rows_within_an_ulp_of_float64() {
        half_rows_within_an_ulp_of_float64::<bf16>("bf16", 7, -126);
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
