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
    InPtr, Lanes, Num, Real, Scalar, ACC,
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
    // the lane after `lane` (a direct one), which its task takes next if it is before `end`
    // (the end of the task's range)
    let next_row = |lane: usize, end: usize| NextRow {
        p: if lane + 1 < end.min(lin.count) {
            // (the whole `Sync` wrapper, not its raw-pointer field)
            let q: InPtr<T> = p;
            q.0.wrapping_offset(lin.base(lane + 1)) as *const u8
        } else {
            std::ptr::null()
        },
        elem: std::mem::size_of::<T>(),
    };
    parallel_for(pool, lin.count, lane_grain(n), |range| {
        let end = range.end;
        with_simd(
            #[inline(always)]
            || {
                let mut buf = Vec::new();
                let mut obuf = Vec::new();
                for lane in range {
                    // SAFETY: x and the output have the same shape (checked above), so lane
                    // `lane < lin.count` has `n` elements in both, at offsets `base(lane) + j *
                    // stride` that each view's own shape and strides reach (the output is
                    // contiguous, `out_ptr` checked it). `parallel_for` gives each lane to one
                    // task, so the output elements written here are this task's alone.
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
                            softmax_row(src, dst, next_row(lane, end));
                        } else if direct && n >= CONVERT_MIN_ROW {
                            // a long half-type lane: converted block by block
                            with_scratch(
                                n,
                                #[inline(always)]
                                |buf| {
                                    softmax_row_converted::<T::C, T>(
                                        std::slice::from_raw_parts(p.0.offset(lin.base(lane)), n),
                                        std::slice::from_raw_parts_mut(
                                            o.0.offset(lout.base(lane)),
                                            n,
                                        ),
                                        buf,
                                        next_row(lane, end),
                                    )
                                },
                            );
                        } else {
                            buf.resize(n, T::C::ZERO);
                            obuf.resize(n, T::C::ZERO);
                            load_strided(p, lin.base(lane), lin.stride, &mut buf);
                            // (a contiguous half-type lane: its next one is prefetched too)
                            let next = if direct {
                                next_row(lane, end)
                            } else {
                                NextRow::NONE
                            };
                            softmax_row(&buf, &mut obuf, next);
                            store_strided(o, lout.base(lane), lout.stride, &obuf);
                        }
                    }
                }
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

/// The row's maximum (NaN skipped; -inf for a row of NaN and -inf).
#[inline(always)]
fn row_max<C: Real>(a: &[C]) -> C {
    let mut acc = [C::neg_infinity(); ACC];
    let done = C::max_chunks(a, &mut acc) * ACC;
    max_into(&mut acc, &a[done..], |v| v)
}

/// [`row_max`] of `a` converted by `to_c` (a conversion that vectorises in the loop).
#[inline(always)]
fn row_max_of<S: Copy, C: Real>(a: &[S], to_c: impl Fn(S) -> C) -> C {
    max_into(&mut [C::neg_infinity(); ACC], a, to_c)
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
fn softmax_row<C: Real>(src: &[C], dst: &mut [C], next: NextRow) {
    let m = row_max(src);
    let mut wide = [0.0f64; ACC];
    let fast = m.is_finite() && exp_sum::<C, true>(src, dst, m, &mut wide, next, 0);
    if !fast {
        // a NaN anywhere makes the sum NaN, hence every output NaN
        wide = [0.0; ACC];
        exp_sum::<C, false>(src, dst, m, &mut wide, NextRow::NONE, 0);
    }
    div_by_sum(dst, C::from_f64(tree_sum(wide)), fast);
}

/// Elements per block of [`softmax_row_converted`]: a whole number of [`SUM_BLOCK`]s, so the
/// sum has the whole row's order, and small enough (4 KiB of f32) to stay in L1.
const CONVERT_BLOCK: usize = 4 * SUM_BLOCK;

/// Shortest half-type row that [`softmax_row_converted`] takes: shorter ones are converted
/// whole into two buffers, which then stay in L1 or L2 (rows of 1024 in f16: 1.22 Gelem/s
/// that way, 1.05 block by block, which converts the input twice).
const CONVERT_MIN_ROW: usize = 16 * CONVERT_BLOCK;

/// [`softmax_row`] of a half-type row `src` into `dst`, through one compute-type buffer `buf`
/// of the row's length that holds the exponentials: each block of [`CONVERT_BLOCK`] elements
/// is converted into an L1 block for the max and again for the exponentials, and converted
/// back as it is divided. Same operations in the same order as converting the whole row and
/// calling [`softmax_row`] (so the same bits), with one buffer and three passes in place of
/// two buffers and five passes: a 64K-element row's working set then fits in L2.
#[inline(always)]
fn softmax_row_converted<C: Real, T: Scalar<C = C>>(
    src: &[T],
    dst: &mut [T],
    buf: &mut [C],
    next: NextRow,
) {
    let mut block = [C::ZERO; CONVERT_BLOCK];
    let m = if T::CONVERT_IN_LOOP {
        row_max_of(src, T::to_c)
    } else {
        let mut m = C::neg_infinity();
        for s in src.chunks(CONVERT_BLOCK) {
            let b = &mut block[..s.len()];
            T::load(s, b);
            let v = row_max(b);
            m = if v > m { v } else { m };
        }
        m
    };
    let fast_wide = if m.is_finite() {
        exp_converted(true, src, buf, &mut block, m, next)
    } else {
        None
    };
    let fast = fast_wide.is_some();
    // (the general pass never gives up)
    let wide = fast_wide.or_else(|| exp_converted(false, src, buf, &mut block, m, NextRow::NONE));
    let sum = C::from_f64(tree_sum(wide.unwrap_or([0.0; ACC])));
    for (b, d) in buf
        .chunks_mut(CONVERT_BLOCK)
        .zip(dst.chunks_mut(CONVERT_BLOCK))
    {
        div_by_sum(b, sum, fast);
        T::store(b, d);
    }
}

/// `e^(x - m)`: [`Real::exp_diff`] (`FINITE`: m finite, x finite or -inf) or [`exp_minus`].
/// (Plain functions, not closures: everything in the hot loop must inline into `with_simd`'s
/// AVX2+FMA body, or `mul_add` becomes a libm call.)
#[inline(always)]
fn exp_of<C: Real, const FINITE: bool>(x: C, m: C) -> C {
    if FINITE {
        x.exp_diff(m)
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
fn exp_sum<C: Real, const FINITE: bool>(
    src: &[C],
    dst: &mut [C],
    m: C,
    wide: &mut [f64; ACC],
    next: NextRow,
    at: usize,
) -> bool {
    for (i, (sb, db)) in src
        .chunks(SUM_BLOCK)
        .zip(dst.chunks_mut(SUM_BLOCK))
        .enumerate()
    {
        next.fetch(at + i * SUM_BLOCK, SUM_BLOCK);
        let mut acc = [C::ZERO; ACC];
        let done = if FINITE {
            C::exp_diff_chunks(sb, m, db, &mut acc)
        } else {
            0
        };
        let (cs, cd) = (sb.chunks_exact(ACC), db.chunks_exact_mut(ACC));
        let rs = cs.remainder();
        let mut cd = cd;
        for (s, d) in cs.zip(&mut cd).skip(done) {
            let (s, d): (&[C; ACC], &mut [C; ACC]) = (s.try_into().unwrap(), d.try_into().unwrap());
            if FINITE {
                if !C::exp_diff_chunk(s, m, d) && has_nan(s) {
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
        if FINITE && has_nan(rs) {
            return false;
        }
        for j in 0..rs.len() {
            let e = exp_of::<C, FINITE>(rs[j], m);
            rd[j] = e;
            acc[j] = acc[j] + e;
        }
        for j in 0..ACC {
            wide[j] += acc[j].to_f64();
        }
    }
    true
}

/// [`exp_sum`] of a half-type row `src` into `buf`, converted block by block through `block`;
/// the f64 partials, or None where `finite` and the row holds a NaN. (A function, not a
/// closure, so it is inlined: outside `with_simd`'s body it would be baseline code.)
#[inline(always)]
fn exp_converted<C: Real, T: Scalar<C = C>>(
    finite: bool,
    src: &[T],
    buf: &mut [C],
    block: &mut [C; CONVERT_BLOCK],
    m: C,
    next: NextRow,
) -> Option<[f64; ACC]> {
    let mut wide = [0.0f64; ACC];
    for (i, (s, d)) in src
        .chunks(CONVERT_BLOCK)
        .zip(buf.chunks_mut(CONVERT_BLOCK))
        .enumerate()
    {
        let b = &mut block[..s.len()];
        T::load(s, b);
        let at = i * CONVERT_BLOCK;
        if finite {
            if !exp_sum::<C, true>(b, d, m, &mut wide, next, at) {
                return None;
            }
        } else {
            exp_sum::<C, false>(b, d, m, &mut wide, next, at);
        }
    }
    Some(wide)
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
#[inline(always)]
fn div_by_sum<C: Real>(dst: &mut [C], sum: C, fast: bool) {
    if fast {
        let rcp = C::ONE / sum;
        for v in dst.iter_mut() {
            *v = div_markstein(*v, sum, rcp);
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

    #[test]
    fn rows_converted_block_by_block_give_the_whole_row_bits() {
        // With f32 as the "half" type the conversions are copies, so any difference in the
        // order of the sum (blocks that are not whole SUM_BLOCKs) shows in the f32 bits, which
        // rounding to a half type would mostly hide.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 24.0 - 12.0
        };
        for n in [3 * CONVERT_BLOCK + 37, CONVERT_BLOCK, 1000, 5] {
            // (many rows: a sum taken in another order still rounds to the same float32 in
            // most rows)
            for case in (0..3).cycle().take(60) {
                let mut src: Vec<f32> = (0..n).map(|_| next()).collect();
                match case {
                    1 => src[n - 2] = f32::NAN,
                    2 => src[n / 2] = f32::NEG_INFINITY,
                    _ => {}
                }
                let mut whole = vec![0f32; n];
                softmax_row(&src, &mut whole, NextRow::NONE);
                let (mut blocks, mut buf) = (vec![0f32; n], vec![f32::NAN; n]);
                softmax_row_converted::<f32, f32>(&src, &mut blocks, &mut buf, NextRow::NONE);
                let differ = whole
                    .iter()
                    .zip(&blocks)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(
                    differ, None,
                    "row of {n}, case {case}: first differing element"
                );
                if case == 0 {
                    let sum: f64 = whole.iter().map(|&v| v as f64).sum();
                    assert!((sum - 1.0).abs() < 1e-5, "row of {n} sums to {sum}");
                }
            }
        }
    }
}
