//! topk and topk_backward.
//!
//! Per lane along `axis`: for k <= 64, one pass keeping a sorted buffer of the best k (a
//! vectorised test skips blocks of 16, or 32 half-type keys, with no candidate); otherwise a partial selection (`select_nth_unstable_by`, O(n)) of the k best
//! elements, then a sort of those k, under a total order: by value (descending when
//! `largest`, ascending otherwise) with NaN counted larger than every number (so NaNs come
//! first when largest, last otherwise), `-0.0 == +0.0`, and ties broken by the lower index.
//! The total order makes the result unique, hence independent of the thread count. A rank-0
//! input is one lane of length 1: k = 1 gives rank-0 outputs, k = 0 gives outputs of shape [0].

use crate::common::{
    c_slice, contiguous_lanes, expect_shape, half_key, in_ptr, lane_grain, load_strided, out_ptr,
    simd_level, store_strided, with_numeric, with_simd, Lanes, Num, OutPtr, Scalar, SimdLevel,
};
use crate::elementwise::req;
use kernel_core::{
    fmt_dims, normalize_axis, parallel_for, AttrValue, BwdInput, DType, Dim, Error, InferCtx,
    KernelCtx, OnnxInput, OnnxOp, OpDef, Registry, Result, ShapeOut, ShardingRule,
};
use std::cmp::Ordering;

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder(
            "topk(Tensor x, int k, int axis=-1, bool largest=True) -> (Tensor values, Tensor indices)",
        )
        .doc("the k largest (or smallest) elements along axis, sorted; ties: lower index first; NaN is largest")
        .dtypes(DType::NUMERIC)
        .fixed("indices", DType::I64)
        .axis_attr("axis")
        .infer(topk_infer)
        .cpu(topk_cpu)
        // ONNX's TopK is polyop's topk with sorted output (ties: lower index first)
        .onnx(OnnxOp::new("TopK", &[1]).attr("k", "k").attr("axis", "axis"))
        .onnx(
            OnnxOp::new("TopK", &[10])
                .inputs([OnnxInput::Tensor(0), OnnxInput::IntAttr("k")])
                .attr("axis", "axis"),
        )
        .onnx(
            OnnxOp::new("TopK", &[11, 24])
                .inputs([OnnxInput::Tensor(0), OnnxInput::IntAttr("k")])
                .attr("axis", "axis")
                .attr_default("largest", "largest", AttrValue::Int(1))
                .require("sorted", AttrValue::Int(1)),
        )
        .backward(
            "topk_backward",
            &[BwdInput::Grad(0), BwdInput::Input(0), BwdInput::Output(1)],
            &[0],
        )
        .onnx_name("TopK")
        .sharding(ShardingRule::whole_axes)
        .build()?,
    )?;
    r.register(
        OpDef::builder(
            "topk_backward(Tensor grad_values, Tensor x, Tensor indices, int axis=-1) -> Tensor",
        )
        .doc("grad_values scattered (summed) at indices along axis into zeros shaped like x")
        .dtypes(DType::NUMERIC)
        .fixed("indices", DType::I64)
        .axis_attr("axis")
        .infer(topk_backward_infer)
        .cpu(topk_backward_cpu)
        .backward_only()
        .sharding(ShardingRule::whole_axes)
        .build()?,
    )?;
    Ok(())
}

fn topk_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    let k = ctx.attrs.int("k")?;
    let axis = ctx.attrs.int("axis")?;
    if k < 0 {
        return Err(Error::invalid(format!("k={k} must be >= 0")));
    }
    let Some(dims) = ctx.dims(0) else {
        return Ok(vec![None, None]);
    };
    let ax = normalize_axis(axis, dims.len())?;
    let size = if dims.is_empty() {
        Dim::Known(1)
    } else {
        dims[ax].clone()
    };
    let kd = Dim::Known(k as usize);
    ctx.require_le(&kd, &size, || {
        format!("k={k} is out of range for axis {ax} of size {size} (expected 0 <= k <= {size})")
    })?;
    let out = if dims.is_empty() {
        if k == 1 {
            vec![]
        } else {
            vec![Dim::Known(0)]
        }
    } else {
        let mut d = dims.to_vec();
        d[ax] = kd;
        d
    };
    Ok(vec![Some(out.clone()), Some(out)])
}

fn topk_backward_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    let axis = ctx.attrs.int("axis")?;
    let (g, x, i) = (ctx.dims(0), ctx.dims(1), ctx.dims(2));
    ctx.require_shape(g, i, || {
        format!(
            "grad_values has shape {} but indices has shape {}",
            fmt_dims(g.unwrap_or_default()),
            fmt_dims(i.unwrap_or_default())
        )
    })?;
    if let (Some(x), Some(g)) = (x, g) {
        let ax = normalize_axis(axis, x.len())?;
        let msg = || {
            format!(
                "grad_values has shape {} which is not a topk result of x with shape {} along axis {ax}",
                fmt_dims(g),
                fmt_dims(x)
            )
        };
        if x.is_empty() {
            if !(g.is_empty() || g == [Dim::Known(0)]) {
                return Err(Error::invalid(msg()));
            }
        } else if g.len() != x.len() {
            return Err(Error::invalid(msg()));
        } else {
            for (d, (a, b)) in g.iter().zip(x).enumerate() {
                if d == ax {
                    ctx.require_le(a, b, msg)?;
                } else {
                    ctx.require_eq(a, b, msg)?;
                }
            }
        }
    } else if let Some(x) = x {
        normalize_axis(axis, x.len())?;
    }
    Ok(vec![ctx.input(1).shape.clone()])
}

/// NaN-largest order on compute values (NaN == NaN; -0 == +0).
#[inline(always)]
fn cmp_nan_max<C: Num>(a: C, b: C) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Select and sort the first k of `items` under `cmp` (a total order).
fn top_k_sorted<E>(items: &mut [E], k: usize, cmp: impl Fn(&E, &E) -> Ordering + Copy) {
    if k == 0 {
        return;
    }
    if k < items.len() {
        items.select_nth_unstable_by(k - 1, cmp);
    }
    items[..k].sort_unstable_by(cmp);
}

fn topk_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let x = req(inputs, 0)?;
    let k = ctx.attrs.int("k")? as usize;
    let largest = ctx.attrs.bool("largest")?;
    let axis = normalize_axis(ctx.attrs.int("axis")?, x.rank())?;
    let lin = Lanes::new(&x.shape, &x.strides, axis);
    let (vo, io) = ctx.outputs.split_at_mut(1);
    // the shapes the writes below rely on (as topk_infer gives them)
    let want = if x.rank() == 0 {
        if k == 1 {
            vec![]
        } else {
            vec![0]
        }
    } else {
        let mut d = x.shape.clone();
        d[axis] = k;
        d
    };
    expect_shape("topk values", &vo[0].shape, &want)?;
    expect_shape("topk indices", &io[0].shape, &want)?;
    let lout = contiguous_lanes(&vo[0].shape, axis.min(vo[0].rank().saturating_sub(1)));
    let (p, ov) = (in_ptr::<T>(x)?, out_ptr::<T>(&mut vo[0])?);
    let oi: OutPtr<i64> = out_ptr::<i64>(&mut io[0])?;
    let n = lin.n;
    if k == 0 || lin.count == 0 {
        return Ok(());
    }
    if k > n {
        return Err(Error::internal(format!("k={k} > {n} after shape check")));
    }
    let direct = lin.stride == 1;
    parallel_for(pool, lin.count, lane_grain(n), |range| {
        // `#[inline(always)]`: the row loop (and the half-type conversions in it) must be
        // compiled inside `with_simd`, see there.
        with_simd(
            #[inline(always)]
            || {
                let mut vals = Vec::new();
                let mut items: Vec<(T::C, usize)> = Vec::new();
                let (mut bv, mut bi) = (Vec::with_capacity(k + 1), Vec::with_capacity(k + 1));
                let mut vout = vec![T::C::ZERO; k];
                let mut kv = Vec::with_capacity(k + 1);
                for lane in range {
                    // SAFETY: as for `c_slice` below.
                    let bits = (direct && k <= SMALL_K)
                        .then(|| unsafe {
                            std::slice::from_raw_parts(p.0.offset(lin.base(lane)), n)
                        })
                        .and_then(T::as_half_bits);
                    if let Some(bits) = bits {
                        // a half-type row: scanned as order keys, 16 to a vector, made from
                        // the bits as the scan reads them (no conversion, no pass writing
                        // the keys first); the values written are the input elements at the
                        // indices found, through f32 as the other path gives them (a
                        // signalling NaN comes out quiet)
                        scan_half_row(bits, T::HALF_INF, k, largest, &mut kv, &mut bi);
                        let base = lout.base(lane);
                        for (j, &i) in bi.iter().enumerate() {
                            // SAFETY: as for the scan's writes below; `i < n` is an element of
                            // this lane of x, which is only read.
                            unsafe {
                                oi.write(base + j as isize * lout.stride, i as i64);
                                let v = p.get(lin.base(lane) + i as isize);
                                ov.write(base + j as isize * lout.stride, T::from_c(v.to_c()));
                            }
                        }
                        continue;
                    }
                    let src = if direct {
                        // SAFETY: lane `lane < lin.count` of x has `n` elements at stride 1 from
                        // `lin.base(lane)`, offsets x's shape and strides reach; x is only read.
                        unsafe { c_slice::<T>(p, lin.base(lane), n) }
                    } else {
                        None
                    };
                    let src = match src {
                        Some(s) => s,
                        None => {
                            vals.resize(n, T::C::ZERO);
                            // SAFETY: the `n` elements of lane `lane` of x, as above, at its
                            // stride.
                            unsafe { load_strided(p, lin.base(lane), lin.stride, &mut vals) };
                            &vals[..]
                        }
                    };
                    let base = lout.base(lane);
                    if k <= SMALL_K {
                        top_k_scan(src, k, largest, &mut bv, &mut bi);
                        // The writes below: both outputs have x's shape with k along
                        // `axis` (checked above), so output lane `lane` has k elements at
                        // `base + j * lout.stride`; the scan returns `k <= n` entries (checked
                        // above), and `parallel_for` gives the lane to this task alone.
                        for (j, &i) in bi.iter().enumerate() {
                            // SAFETY: see above; `j < k`.
                            unsafe { oi.write(base + j as isize * lout.stride, i as i64) };
                        }
                        // SAFETY: see above; `bv.len() == k`.
                        unsafe { store_strided(ov, base, lout.stride, &bv) };
                        continue;
                    }
                    items.clear();
                    items.extend(src.iter().copied().zip(0..n));
                    if largest {
                        top_k_sorted(&mut items, k, |a, b| {
                            cmp_nan_max(b.0, a.0).then(a.1.cmp(&b.1))
                        });
                    } else {
                        top_k_sorted(&mut items, k, |a, b| {
                            cmp_nan_max(a.0, b.0).then(a.1.cmp(&b.1))
                        });
                    }
                    for (j, &(v, i)) in items[..k].iter().enumerate() {
                        vout[j] = v;
                        // SAFETY: `j < k`, an element of output lane `lane`, which is this
                        // task's (as in the scan branch).
                        unsafe { oi.write(base + j as isize * lout.stride, i as i64) };
                    }
                    // SAFETY: `vout.len() == k`, the elements of this task's output lane.
                    unsafe { store_strided(ov, base, lout.stride, &vout) };
                }
            },
        )
    });
    Ok(())
}

/// Largest k handled by the single-pass scan ([`top_k_scan`]); above it, selection + sort.
const SMALL_K: usize = 64;

/// Elements per candidate test of [`top_k_scan`] on a row of the compute type (and on a
/// half-type row without AVX-512BW).
const BLK: usize = 16;

/// A row the scan reads ([`top_k_scan`]): its keys one at a time, and whole blocks of
/// [`Self::BLK`] (at most 32) tested at once.
trait ScanRow {
    /// The keys' type, in the output order ([`before`]).
    type K: Num;
    /// Elements per candidate test.
    const BLK: usize;
    fn len(&self) -> usize;
    /// Key `i`.
    fn key(&self, i: usize) -> Self::K;
    /// Bit `j` set where key `i + j` may come before `w` (a superset of [`before`]'s
    /// answer), for a whole block (`i + BLK <= len`).
    fn candidates(&self, i: usize, w: Self::K, largest: bool) -> u32;
}

/// A row of the compute type, scanned in place (the half types' rows are read through
/// [`HalfRow`]).
impl<C: Num> ScanRow for [C] {
    type K = C;
    const BLK: usize = BLK;
    #[inline(always)]
    fn len(&self) -> usize {
        <[C]>::len(self)
    }
    #[inline(always)]
    fn key(&self, i: usize) -> C {
        self[i]
    }
    /// A fixed-size test without short-circuits, so it vectorises.
    #[inline(always)]
    fn candidates(&self, i: usize, w: C, largest: bool) -> u32 {
        let blk: &[C; BLK] = self[i..i + BLK].try_into().expect("a whole block");
        let mut m = 0u32;
        match (largest, w.is_nan()) {
            (true, true) => {}
            (true, false) => {
                for (j, &v) in blk.iter().enumerate() {
                    m |= ((v.is_nan() | (v > w)) as u32) << j;
                }
            }
            (false, true) => {
                for (j, &v) in blk.iter().enumerate() {
                    m |= (!v.is_nan() as u32) << j;
                }
            }
            (false, false) => {
                for (j, &v) in blk.iter().enumerate() {
                    m |= ((v < w) as u32) << j;
                }
            }
        }
        m
    }
}

/// A float16 or bfloat16 row read as its order keys ([`half_key`]; +infinity's bits `inf`),
/// each made from the bits as the scan reads it. (Writing the row's keys first, then scanning
/// them, took a pass that left the half types' rows slower than float32's.) `WIDE`: blocks of
/// 32 keys in one AVX-512BW vector, for [`scan_half_row`]'s AVX-512BW build only; otherwise
/// blocks of 16 in SSE2.
struct HalfRow<'a, const WIDE: bool> {
    bits: &'a [u16],
    inf: u16,
}

impl<const WIDE: bool> ScanRow for HalfRow<'_, WIDE> {
    type K = i16;
    /// (32 keys a test, in one vector: one thread, rows of 1024, k = 8, `op_loop topk`:
    /// float16 1.53 -> 1.66 Gelem/s, bfloat16 1.70 -> 1.84, float32 1.47-1.53; with
    /// [`shift_in`] inlined into this build as well, 2.13 and 2.47.)
    const BLK: usize = if WIDE { 32 } else { BLK };
    #[inline(always)]
    fn len(&self) -> usize {
        self.bits.len()
    }
    #[inline(always)]
    fn key(&self, i: usize) -> i16 {
        half_key(self.bits[i], self.inf)
    }
    /// Keys have no NaN (it is the largest key): one compare. On x86-64, [`half_key`]'s steps
    /// (magnitude, its sign applied as `(m ^ s) - s`, NaN to `i16::MAX`) and the compare in
    /// vectors: 32 lanes in AVX-512BW (`WIDE`, the compare's mask register is the block's
    /// mask), or 8 lanes in SSE2 (part of the baseline), two 8-lane masks packed into one
    /// byte mask (the generic loop's 16 shifted bits cost a reduction tree of shuffles, more
    /// than the rest of a block).
    #[inline(always)]
    fn candidates(&self, i: usize, w: i16, largest: bool) -> u32 {
        let blk = &self.bits[i..i + Self::BLK];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::*;
            if WIDE {
                // SAFETY: a `HalfRow<true>` is scanned only inside `scan_half_row`'s AVX-512BW
                // build, on a CPU that has it (checked there); the unaligned load reads the 32
                // elements of `blk` (a slice of BLK = 32, checked by the indexing above).
                return unsafe {
                    let h = _mm512_loadu_si512(blk.as_ptr() as *const _);
                    let m = _mm512_and_si512(h, _mm512_set1_epi16(0x7FFF));
                    let s = _mm512_srai_epi16::<15>(h);
                    let signed = _mm512_sub_epi16(_mm512_xor_si512(m, s), s);
                    let nan = _mm512_cmpgt_epi16_mask(m, _mm512_set1_epi16(self.inf as i16));
                    let vw = _mm512_set1_epi16(w);
                    // a NaN's key is i16::MAX: before every `w` but NaN when largest (a
                    // superset where `w` is NaN too: `before` decides), never otherwise
                    if largest {
                        _mm512_cmpgt_epi16_mask(signed, vw) | nan
                    } else {
                        _mm512_cmpgt_epi16_mask(vw, signed) & !nan
                    }
                };
            }
            // SAFETY: SSE2 is part of x86-64's baseline; the two unaligned loads read the 16
            // elements of `blk` (a slice of BLK = 16, checked by the indexing above).
            unsafe {
                let p = blk.as_ptr() as *const __m128i;
                let (inf, max) = (_mm_set1_epi16(self.inf as i16), _mm_set1_epi16(i16::MAX));
                let mag_mask = _mm_set1_epi16(0x7FFF);
                let key = |h: __m128i| {
                    let m = _mm_and_si128(h, mag_mask);
                    let s = _mm_srai_epi16::<15>(h);
                    let signed = _mm_sub_epi16(_mm_xor_si128(m, s), s);
                    let nan = _mm_cmpgt_epi16(m, inf);
                    _mm_or_si128(_mm_andnot_si128(nan, signed), _mm_and_si128(nan, max))
                };
                let (a, b) = (key(_mm_loadu_si128(p)), key(_mm_loadu_si128(p.add(1))));
                let vw = _mm_set1_epi16(w);
                let (ca, cb) = if largest {
                    (_mm_cmpgt_epi16(a, vw), _mm_cmpgt_epi16(b, vw))
                } else {
                    (_mm_cmpgt_epi16(vw, a), _mm_cmpgt_epi16(vw, b))
                };
                _mm_movemask_epi8(_mm_packs_epi16(ca, cb)) as u32
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let mut m = 0u32;
            for (j, &h) in blk.iter().enumerate() {
                let v = half_key(h, self.inf);
                m |= (if largest { v > w } else { v < w } as u32) << j;
            }
            m
        }
    }
}

/// [`top_k_scan`] of a float16 or bfloat16 row's bits (+infinity's bits `inf`): in blocks of
/// 32 in AVX-512BW where [`simd_level`] is AVX-512 and the CPU has BW (every AVX-512 CPU from
/// Skylake-SP and Zen 4 on), otherwise in blocks of 16. Same keys and order, so the same
/// indices either way.
fn scan_half_row(
    bits: &[u16],
    inf: u16,
    k: usize,
    largest: bool,
    kv: &mut Vec<i16>,
    idx: &mut Vec<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        /// # Safety
        /// The CPU supports AVX-512F, VL and BW, AVX2 and FMA.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        unsafe fn wide(
            row: &HalfRow<'_, true>,
            k: usize,
            largest: bool,
            kv: &mut Vec<i16>,
            idx: &mut Vec<usize>,
        ) {
            top_k_scan(row, k, largest, kv, idx)
        }
        if simd_level() == SimdLevel::Avx512 && std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the level is AVX-512 (F, VL, AVX2, FMA: `simd_level` never reports a
            // level the CPU lacks) and BW was detected just now.
            return unsafe { wide(&HalfRow { bits, inf }, k, largest, kv, idx) };
        }
    }
    top_k_scan(&HalfRow::<false> { bits, inf }, k, largest, kv, idx)
}

/// Whether `v` comes strictly before `w` in the output order (NaN largest; equal values are
/// never "before": the scan visits indices in increasing order, so ties keep the lower
/// index).
#[inline(always)]
fn before<C: Num>(v: C, w: C, largest: bool) -> bool {
    if largest {
        !w.is_nan() && (v.is_nan() || v > w)
    } else {
        !v.is_nan() && (w.is_nan() || v < w)
    }
}

/// Insertion of `v` (index `i`) into a sorted buffer of the best so far, from its end: the
/// entries `v` comes before move one place towards the end, the last dropping out, in place
/// (without `Vec::insert`'s memmove calls: a tenth of the time on rows of 1024, k = 8);
/// `before` is monotone along the sorted buffer, so `v` lands before the first entry it comes
/// before. A function, not a closure, so that it inlines into the scan's AVX-512BW build too
/// (a call per insertion there: a quarter of a half-type row's time).
#[inline(always)]
fn shift_in<K: Num>(vals: &mut [K], idx: &mut [usize], v: K, i: usize, largest: bool) {
    let mut p = vals.len() - 1;
    while p > 0 && before(v, vals[p - 1], largest) {
        vals[p] = vals[p - 1];
        idx[p] = idx[p - 1];
        p -= 1;
    }
    vals[p] = v;
    idx[p] = i;
}

/// The top k of `x` (k >= 1, k <= len), sorted, in one pass: a sorted buffer of the best k
/// so far; an element enters only if it comes before the buffer's last, which is checked 16
/// elements at a time with a vectorised test (after the first few hundred elements almost
/// no block has a candidate). Same result as selection under the total order.
#[inline(always)]
fn top_k_scan<R: ScanRow + ?Sized>(
    x: &R,
    k: usize,
    largest: bool,
    vals: &mut Vec<R::K>,
    idx: &mut Vec<usize>,
) {
    vals.clear();
    idx.clear();
    for i in 0..k {
        let v = x.key(i);
        vals.push(v);
        idx.push(i);
        shift_in(vals, idx, v, i, largest);
    }
    // the buffer's last, kept in a register between insertions
    let mut last = vals[k - 1];
    let mut i = k;
    while i < x.len() {
        let end = (i + R::BLK).min(x.len());
        // bit j: x[i + j] is a candidate against the current last (a superset of the
        // elements that will enter, since the last only gets better)
        let mask: u32 = if end - i == R::BLK {
            x.candidates(i, last, largest)
        } else {
            (1u32 << (end - i)) - 1
        };
        let mut m = mask;
        while m != 0 {
            let j = m.trailing_zeros() as usize;
            m &= m - 1;
            let v = x.key(i + j);
            if before(v, last, largest) {
                shift_in(vals, idx, v, i + j, largest);
                last = vals[k - 1];
            }
        }
        i = end;
    }
}

fn topk_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => topk_k::<T>(ctx))
}

fn topk_backward_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let (g, x, ind) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    let axis = normalize_axis(ctx.attrs.int("axis")?, x.rank())?;
    let gaxis = axis.min(g.rank().saturating_sub(1));
    let (lg, li) = (
        Lanes::new(&g.shape, &g.strides, gaxis),
        Lanes::new(&ind.shape, &ind.strides, gaxis),
    );
    let n = if x.rank() == 0 { 1 } else { x.shape[axis] };
    // the shapes the raw reads and writes below rely on (as topk_backward_infer checks them)
    expect_shape("topk_backward indices", &ind.shape, &g.shape)?;
    let g_ok = if x.rank() == 0 {
        g.shape.is_empty() || g.shape == [0]
    } else {
        g.rank() == x.rank()
            && (0..x.rank()).all(|d| {
                if d == axis {
                    g.shape[d] <= x.shape[d]
                } else {
                    g.shape[d] == x.shape[d]
                }
            })
    };
    if !g_ok {
        return Err(Error::internal(format!(
            "topk_backward grad has shape {:?}, not a topk result of x with shape {:?}",
            g.shape, x.shape
        )));
    }
    // validate every index before writing anything
    let idx = ind.contiguous::<i64>()?;
    if let Some(bad) = idx.iter().find(|&&i| i < 0 || i as usize >= n) {
        return Err(Error::invalid(format!(
            "index {bad} in indices is out of range for axis {axis} of size {n}"
        )));
    }
    let out = &mut ctx.outputs[0];
    expect_shape("topk_backward output", &out.shape, &x.shape)?;
    let lout = contiguous_lanes(&out.shape, axis);
    let (pg, pi, o) = (in_ptr::<T>(g)?, in_ptr::<i64>(ind)?, out_ptr::<T>(out)?);
    let k = lg.n;
    if n == 0 || lout.count == 0 {
        return Ok(());
    }
    parallel_for(pool, lout.count, lane_grain(n), |range| {
        let mut gb = vec![T::C::ZERO; k];
        let mut acc = vec![T::C::ZERO; n];
        for lane in range {
            acc.fill(T::C::ZERO);
            if k > 0 {
                // SAFETY: g matches x in every dim but `axis` (checked above), so it has
                // `lout.count` lanes along it and lane `lane` has `k` elements; g is only read.
                unsafe { load_strided(pg, lg.base(lane), lg.stride, &mut gb) };
                let ib = li.base(lane);
                for (j, &gv) in gb.iter().enumerate() {
                    // SAFETY: indices has g's shape (checked above), so `j < k` is an element
                    // of its lane `lane`.
                    let i = unsafe { pi.get(ib + j as isize * li.stride) } as usize;
                    acc[i] = acc[i].add(gv);
                }
            }
            // SAFETY: the output has x's shape (checked above): lane `lane < lout.count` has
            // `n == acc.len()` elements, and `parallel_for` gives it to this task alone.
            unsafe { store_strided(o, lout.base(lane), lout.stride, &acc) };
        }
    });
    Ok(())
}

fn topk_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => topk_backward_k::<T>(ctx))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The indices of the top k of `x` by selection + sort under the total order (the
    /// reference the scan is checked against).
    fn selection(x: &[f32], k: usize, largest: bool) -> Vec<usize> {
        let mut items: Vec<(f32, usize)> = x.iter().copied().zip(0..x.len()).collect();
        top_k_sorted(&mut items, k, |a, b| {
            let by_value = if largest {
                cmp_nan_max(b.0, a.0)
            } else {
                cmp_nan_max(a.0, b.0)
            };
            by_value.then(a.1.cmp(&b.1))
        });
        items[..k].iter().map(|p| p.1).collect()
    }

    /// 24 random bits at a time (`common::test_values`' generator).
    fn random_bits(seed: u64) -> impl FnMut() -> u64 {
        let mut v = crate::common::test_values(seed, 0.0, (1u32 << 24) as f32);
        move || v() as u64
    }

    /// The single-pass scan agrees with selection + sort under the total order, on data with
    /// many ties, NaNs, signed zeros and infinities, for every k and both directions.
    #[test]
    fn scan_matches_selection() {
        let mut next = random_bits(0x2545_f491_4f6c_dd1d);
        let pool = [
            f32::NAN,
            -0.0,
            0.0,
            1.0,
            -1.0,
            2.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for n in [1usize, 2, 5, 16, 17, 40, 100] {
            for trial in 0..20 {
                let x: Vec<f32> = (0..n)
                    .map(|_| {
                        let r = next();
                        if trial % 2 == 0 {
                            pool[(r % pool.len() as u64) as usize]
                        } else {
                            (r % 1000) as f32 / 7.0 - 70.0
                        }
                    })
                    .collect();
                for k in 1..=n.min(SMALL_K) {
                    for largest in [true, false] {
                        let (mut v, mut i) = (Vec::new(), Vec::new());
                        top_k_scan(&x[..], k, largest, &mut v, &mut i);
                        let want = selection(&x, k, largest);
                        assert_eq!(i, want, "x={x:?} k={k} largest={largest}");
                        for (a, &j) in v.iter().zip(&want) {
                            assert_eq!(a.to_bits(), x[j].to_bits());
                        }
                    }
                }
            }
        }
    }

    /// Half-type rows scanned through their bits ([`HalfRow`]: the keys made as each block
    /// is read) give the indices of selection + sort over the values converted to f32, for
    /// float16 and bfloat16 rows of NaNs (both signs, quiet and signalling), signed zeros,
    /// infinities, subnormals and ties, every k and both directions.
    #[test]
    fn half_rows_scanned_through_their_bits_match_selection_on_their_values() {
        use kernel_core::half::{bf16, f16};
        fn check(from_bits: impl Fn(u16) -> f32, inf: u16, specials: &[u16]) {
            let mut next = random_bits(0x9e37_79b9_7f4a_7c15);
            for n in [1usize, 15, 16, 17, 31, 32, 33, 65, 100] {
                for trial in 0..16 {
                    let bits: Vec<u16> = (0..n)
                        .map(|_| {
                            let r = next();
                            match trial % 4 {
                                0 => specials[(r % specials.len() as u64) as usize],
                                // few distinct values: many ties, neighbouring keys
                                1 => (r % 5) as u16 | ((r >> 8) as u16 & 0x8000),
                                // all negative: the buffer's last and the candidates are
                                // negative keys a step apart
                                2 => (r % 5) as u16 | 0x8000,
                                _ => r as u16,
                            }
                        })
                        .collect();
                    let row = HalfRow::<false> { bits: &bits, inf };
                    let vals: Vec<f32> = bits.iter().map(|&h| from_bits(h)).collect();
                    for k in 1..=n.min(SMALL_K) {
                        for largest in [true, false] {
                            let want = selection(&vals, k, largest);
                            // blocks of 16 (SSE2), then as the kernel scans (blocks of 32
                            // where the CPU has AVX-512BW)
                            let (mut kv, mut got) = (Vec::new(), Vec::new());
                            top_k_scan(&row, k, largest, &mut kv, &mut got);
                            assert_eq!(got, want, "bits={bits:x?} k={k} largest={largest}");
                            scan_half_row(&bits, inf, k, largest, &mut kv, &mut got);
                            assert_eq!(got, want, "bits={bits:x?} k={k} largest={largest}");
                        }
                    }
                }
            }
        }
        // +-0, +-1, +-inf, quiet and signalling NaNs of both signs, the least subnormal, the
        // largest finite value
        check(
            |h| f16::from_bits(h).to_f32(),
            f16::INFINITY.to_bits(),
            &[
                0x0000, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x0001,
                0x8001, 0x7bff,
            ],
        );
        check(
            |h| bf16::from_bits(h).to_f32(),
            bf16::INFINITY.to_bits(),
            &[
                0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x0001,
                0x8001, 0x7f7f,
            ],
        );
    }
}
