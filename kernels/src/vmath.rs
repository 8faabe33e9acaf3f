//! Branch-free f32 `exp`, `tanh`, normal CDF and gelu that the compiler vectorises over slices.
//!
//! libm's `expf`/`tanhf`/`erff` are scalar calls with branches, so loops over them stay scalar.
//! These are straight-line code (range reduction, a polynomial, selects instead of branches),
//! so a loop that calls them becomes SIMD code. They use only `+ - * /`, `mul_add` (IEEE
//! fusedMultiplyAdd: one rounding, the same bits from a `vfmadd` instruction and from libm's
//! software `fmaf`), comparisons and bit operations, so the baseline (SSE2) and AVX2+FMA builds
//! of a loop give bitwise identical results (see [`crate::common::with_simd`]). Accuracy
//! (checked against f64 over dense sweeps in the tests below): `exp_f32` within 2 ulp,
//! `tanh_f32` within 3 ulp, `norm_cdf_f32` within 6 ulp (relative 4e-7; the lower tail
//! included), `gelu_erf_f32` and `gelu_tanh_f32` within 4 ulp over the whole f32 range,
//! subnormal results included; NaN in gives NaN out, infinities give the limits.

// Coefficients are written as published or fitted; each rounds to the nearest f32.
#![allow(clippy::excessive_precision, clippy::approx_constant)]

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n * LN2_HI` is exact for |n| < 2^15.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds an f32 of magnitude < 2^22 to an integer (to nearest even),
/// held in the low mantissa bits.
const MAGIC: f32 = 12_582_912.0;

/// `exp(x + lo) = p * s1 * s2` where `lo` is a small correction to `x` (0 for plain exp):
/// Cephes' expf polynomial after reduction by the nearest multiple of ln 2; the power of two
/// comes in two normal halves `s1`, `s2` so that gradual underflow and overflow round once,
/// and a caller can multiply its own factor into `p` before scaling (one rounding in the
/// subnormal range instead of two).
#[inline(always)]
fn exp_split(x: f32, lo: f32) -> (f32, f32, f32) {
    // (NaN passes through clamp)
    let (p, ni) = exp_core(x.clamp(-110.0, 89.0), lo);
    // n in [-159, 129]: both halves are normal powers of two
    let h = ni >> 1;
    let s1 = f32::from_bits((h.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((ni.wrapping_sub(h).wrapping_add(127) as u32) << 23);
    (p, s1, s2)
}

/// Cephes' expf polynomial: `e^r = 1 + r + r^2 P(r)` for |r| <= ln 2 / 2, `r2 = r * r`. In
/// Estrin's scheme (3 dependent FMAs, Horner's 5): a loop of these functions is bound by the
/// length of its dependency chains (the out-of-order window holds only a few).
#[inline(always)]
fn cephes_exp_poly(r: f32, r2: f32) -> f32 {
    let e01 = 1.666_666_5e-1f32.mul_add(r, 5.000_000_1e-1);
    let e23 = 8.333_452e-3f32.mul_add(r, 4.166_579_6e-2);
    let e45 = 1.987_569_1e-4f32.mul_add(r, 1.398_199_9e-3);
    e45.mul_add(r2, e23).mul_add(r2, e01)
}

/// `exp(x + lo) = p * 2^n` for x in [-110, 89]: (p, n) (see [`exp_split`]).
#[inline(always)]
fn exp_core(x: f32, lo: f32) -> (f32, i32) {
    let k = x * LOG2E + MAGIC;
    let n = k - MAGIC;
    let ni = (k.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x)) + lo;
    let r2 = r * r;
    let p = cephes_exp_poly(r, r2).mul_add(r2, r) + 1.0;
    (p, ni)
}

/// `exp(x + lo)` where `lo` is a small correction to `x` (see [`exp_split`]).
#[inline(always)]
pub(crate) fn exp_parts(x: f32, lo: f32) -> f32 {
    let (p, s1, s2) = exp_split(x, lo);
    p * s1 * s2
}

/// e^x.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    exp_parts(x, 0.0)
}

/// [`exp_diff_core`]'s polynomial: `e^r = 1 + r + r^2 (C0 + C1 r + C2 r^2 + C3 r^3 + C4 r^4)`.
const EXP_C: [f32; 5] = [
    0.5,
    1.666_657_8e-1,
    4.166_685_4e-2,
    8.363_11e-3,
    1.390_120_4e-3,
];

/// `e^(d + err) = p * 2^n` for `d` in [-105, 0], `err` a small correction (the rounding of
/// `d`, see [`exp_diff_f32`]): `(p, n)`. Reduction by the nearest multiple of ln 2 with the
/// correction folded into the low part (`d - n LN2_HI` is exact, so the reduced argument
/// rounds once), and a degree-6 polynomial (relative error 1e-8) evaluated in Estrin's
/// scheme: the critical path is 9 dependent operations instead of Horner's 13, which is what
/// bounds a loop of these (the out-of-order window holds only a few chains).
#[inline(always)]
fn exp_diff_core(d: f32, err: f32) -> (f32, i32) {
    let k = d.mul_add(LOG2E, MAGIC);
    let n = k - MAGIC;
    let r = n.mul_add(-LN2_HI, d) + n.mul_add(-LN2_LO, err);
    let r2 = r * r;
    let a = EXP_C[1].mul_add(r, EXP_C[0]);
    let b = EXP_C[3].mul_add(r, EXP_C[2]);
    let q = EXP_C[4].mul_add(r2, b).mul_add(r2, a);
    let p = q.mul_add(r2, r) + 1.0;
    (p, (k.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32))
}

/// `x - m = d + err` exactly (Knuth's two-sum).
#[inline(always)]
fn two_diff(x: f32, m: f32) -> (f32, f32) {
    let d = x - m;
    let bb = d - x;
    (d, (x - (d - bb)) + (-m - bb))
}

/// `e^(x - m)` for softmax: `x` and `m` finite, `x <= m` (m is the row's maximum). `x - m` is
/// taken exactly (Knuth's two-sum `d + err`; `err` enters the reduced argument), then
/// [`exp_diff_core`], and the power of two in two normal halves, so subnormal results
/// (gradual underflow) round once; below e^-104 the result is 0. Within 1.5 ulp (tests
/// below), subnormal results included.
#[inline(always)]
pub fn exp_diff_f32(x: f32, m: f32) -> f32 {
    let (d, err) = two_diff(x, m);
    // (d is -inf only when x - m overflows; the select below gives 0 there)
    let (p, ni) = exp_diff_core(d.max(-105.0), err);
    // n in [-152, 0]: both halves are normal powers of two
    let h = ni >> 1;
    let s1 = f32::from_bits((h.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((ni.wrapping_sub(h).wrapping_add(127) as u32) << 23);
    let y = p * s1 * s2;
    if d > -104.0 {
        y
    } else {
        0.0
    }
}

/// [`exp_diff_f32`] for `x - m >= -86` (the result is then normal): the same formula without
/// the clamp, the final select and the two-half power of two (`p * 2^n` with one normal
/// `2^n` is exact where the two halves were), so the same bits for those arguments.
#[inline(always)]
fn exp_diff_fast(x: f32, m: f32) -> f32 {
    let (d, err) = two_diff(x, m);
    let (p, ni) = exp_diff_core(d, err);
    // n in [-125, 0]
    p * f32::from_bits((ni.wrapping_add(127) as u32) << 23)
}

/// [`exp_narrow_fast`]'s polynomial: `e^r = 1 + r + r^2 (C0 + C1 r + C2 r^2)` for `|r| <= ln 2 / 2`,
/// relative error 5.4e-6 (2^-17.5; a weighted least-squares fit made near-minimax by Lawson's
/// iteration, evaluated in f32).
const EXP_N: [f32; 3] = [0.500_051_26, 0.167_536, 0.041_277_37];

/// `e^(x - m)` for a row whose elements are 16-bit floats (`x` and `m` converted from one, `x -
/// m >= -86`), to the precision their results keep, which float32's [`exp_diff_fast`] exceeds
/// many times over: `x - m` taken as rounded (no two-sum), one-constant `ln 2` reduction, a
/// degree-4 polynomial, 12 operations where [`exp_diff_fast`] takes 19. Relative error below
/// 5.5e-6 plus `|x - m| 2^-24` (the rounding of `x - m`), so below 2^-17 wherever a float16
/// softmax result is not 0 (`x - m > -17.4`; test `narrow_exp_within_2_pow_minus_17`): at
/// most a 64th of a float16 ulp (2^-10 of its binade; bfloat16's is 2^-7), so a result stays
/// within 0.52 ulp of the exact value. Long half-type rows are compute-bound in cache, and with
/// float32's formula they ran at float32's rate (issue 18, item 5).
#[inline(always)]
fn exp_narrow_fast(x: f32, m: f32) -> f32 {
    let d = x - m;
    let k = d.mul_add(LOG2E, MAGIC);
    let n = k - MAGIC;
    let r = n.mul_add(-std::f32::consts::LN_2, d);
    let r2 = r * r;
    let q = EXP_N[2].mul_add(r2, EXP_N[1].mul_add(r, EXP_N[0]));
    let p = q.mul_add(r2, r) + 1.0;
    // n in [-125, 0]: 2^n is a normal power of two
    let ni = (k.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    p * f32::from_bits((ni.wrapping_add(127) as u32) << 23)
}

/// `e^(x - m)` for softmax over a 16-bit float row (`x`, `m` finite or `x` -inf, `x <= m`):
/// [`exp_narrow_fast`] where `x - m >= -86` (a normal result), else [`exp_diff_f32`] (gradual
/// underflow rounded once, 0 below e^-104).
#[inline(always)]
pub fn exp_diff_narrow(x: f32, m: f32) -> f32 {
    if x - m >= EXP_FAST_MIN {
        exp_narrow_fast(x, m)
    } else {
        exp_diff_f32(x, m)
    }
}

/// The start of an explicit-SIMD loop's dispatcher over element type `$s` ([`VecElem`]):
/// returns `$avx512` at the AVX-512 level and `$avx2` at the AVX2 level (where the CPU has
/// F16C too, [`VecElem::at_avx2`]); at the baseline level it falls through to the caller's
/// rest.
macro_rules! by_level {
    ($s:ty, $avx512:expr, $avx2:expr) => {
        #[cfg(target_arch = "x86_64")]
        match crate::common::simd_level() {
            // SAFETY: the CPU has AVX-512F, AVX2 and FMA (`simd_level` never reports a level
            // it lacks), which the AVX-512 loops are compiled for.
            crate::common::SimdLevel::Avx512 => return unsafe { $avx512 },
            crate::common::SimdLevel::Avx2Fma if <$s>::at_avx2() => {
                // SAFETY: the CPU has AVX2 and FMA, as above, and F16C (`at_avx2`): the AVX2
                // loops' features.
                return unsafe { $avx2 };
            }
            _ => {}
        }
    };
}

/// Elements that the explicit-SIMD chunk loops ([`max_chunks`], [`exp_diff_chunks`]) read as
/// f32 lanes: f32 itself, and the 16-bit floats converted as they are loaded (f16 through
/// `vcvtph2ps`, bf16 as the top half of an f32), so a half-type softmax row needs no
/// conversion pass of its own. Each conversion is exact, so the loops give the bits they give
/// on the converted row (the quieting of a signalling NaN aside, which no loop here sees: a
/// NaN never wins a maximum and stops the exponentials' fast path).
pub trait VecElem: Copy {
    /// Whether the loops can run at the AVX2 level: they are compiled with F16C as well (which
    /// f16 needs there), so the CPU must have it.
    #[inline(always)]
    fn at_avx2() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
    /// Eight elements at `p` as f32 lanes.
    ///
    /// # Safety
    /// `p .. p + 8` is readable; the caller runs with AVX2 (and F16C where [`VecElem::at_avx2`]
    /// asks for it).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Sixteen elements at `p` as f32 lanes.
    ///
    /// # Safety
    /// `p .. p + 16` is readable; the caller runs with AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// Eight f32 lanes stored at `p`, rounded to this type as [`crate::common::Scalar::from_c`]
    /// rounds (nearest even; a NaN stays a NaN).
    ///
    /// # Safety
    /// As [`VecElem::load8`], `p .. p + 8` writable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store8(p: *mut Self, v: std::arch::x86_64::__m256);
    /// Sixteen f32 lanes stored at `p`, as [`VecElem::store8`].
    ///
    /// # Safety
    /// As [`VecElem::load16`], `p .. p + 16` writable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store16(p: *mut Self, v: std::arch::x86_64::__m512);
    /// [`VecElem::store8`] of lanes that hold no NaN (the same bits): bfloat16 skips its NaN
    /// step.
    ///
    /// # Safety
    /// As [`VecElem::store8`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8_no_nan(p: *mut Self, v: std::arch::x86_64::__m256) {
        // SAFETY: the caller's
        unsafe { Self::store8(p, v) }
    }
    /// [`VecElem::store16`] of lanes that hold no NaN (the same bits), as
    /// [`VecElem::store8_no_nan`].
    ///
    /// # Safety
    /// As [`VecElem::store16`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store16_no_nan(p: *mut Self, v: std::arch::x86_64::__m512) {
        // SAFETY: the caller's
        unsafe { Self::store16(p, v) }
    }
}

// (The loads are `#[inline(always)]` without a `target_feature` of their own: inlined into the
// `target_feature` loops, their intrinsics compile at those loops' level.)
impl VecElem for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut f32, v: std::arch::x86_64::__m256) {
        // SAFETY: the caller's
        unsafe { std::arch::x86_64::_mm256_storeu_ps(p, v) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store16(p: *mut f32, v: std::arch::x86_64::__m512) {
        // SAFETY: the caller's
        unsafe { std::arch::x86_64::_mm512_storeu_ps(p, v) }
    }
}

impl VecElem for half::f16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's (16 readable bytes; F16C)
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's (32 readable bytes; the 512-bit form is AVX-512F)
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut Self, v: std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        // SAFETY: the caller's (16 writable bytes; F16C). Nearest even, set in the
        // instruction, as `f32_to_f16`.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(p as *mut __m128i, h)
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store16(p: *mut Self, v: std::arch::x86_64::__m512) {
        use std::arch::x86_64::*;
        // SAFETY: the caller's (32 writable bytes; AVX-512F), rounding as in `store8`
        unsafe {
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_storeu_si256(p as *mut __m256i, h)
        }
    }
}

impl VecElem for half::bf16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's (16 readable bytes; AVX2)
        unsafe {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's (32 readable bytes; AVX-512F)
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut Self, v: std::arch::x86_64::__m256) {
        // SAFETY: the caller's
        unsafe { bf16_store8::<true>(p, v) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store16(p: *mut Self, v: std::arch::x86_64::__m512) {
        // SAFETY: the caller's
        unsafe { bf16_store16::<true>(p, v) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8_no_nan(p: *mut Self, v: std::arch::x86_64::__m256) {
        // SAFETY: the caller's
        unsafe { bf16_store8::<false>(p, v) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store16_no_nan(p: *mut Self, v: std::arch::x86_64::__m512) {
        // SAFETY: the caller's
        unsafe { bf16_store16::<false>(p, v) }
    }
}

/// bf16's [`VecElem::store8`]; without `NAN` the lanes hold no NaN, and its step is left out
/// (a finite or infinite lane rounds the same either way).
///
/// # Safety
/// As [`VecElem::store8`] (16 writable bytes; AVX2).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn bf16_store8<const NAN: bool>(p: *mut half::bf16, v: std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's
    unsafe {
        // `f32_to_bf16` lane by lane: the bits rounded to nearest even (`x + 0x7FFF + (bit
        // 16 of x)`, which -inf's bits cannot overflow), or a NaN's top bits made quiet
        let x = _mm256_castps_si256(v);
        let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let mut h = _mm256_srli_epi32::<16>(_mm256_add_epi32(
            x,
            _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)),
        ));
        if NAN {
            let nan = _mm256_or_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(0x0040));
            let is_nan = _mm256_cmpgt_epi32(
                _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF)),
                _mm256_set1_epi32(0x7F80_0000),
            );
            h = _mm256_blendv_epi8(h, nan, is_nan);
        }
        // lanes hold 0 ..= 0xFFFF, which the unsigned-saturating pack keeps; it packs within
        // 128-bit halves, so the permute brings elements 0..4 and 4..8 together
        let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(h, h));
        _mm_storeu_si128(p as *mut __m128i, _mm256_castsi256_si128(packed))
    }
}

/// [`bf16_store8`], 16 lanes (the comparison gives a mask).
///
/// # Safety
/// As [`VecElem::store16`] (32 writable bytes; AVX-512F).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn bf16_store16<const NAN: bool>(p: *mut half::bf16, v: std::arch::x86_64::__m512) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's
    unsafe {
        let x = _mm512_castps_si512(v);
        let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
        let mut h = _mm512_srli_epi32::<16>(_mm512_add_epi32(
            x,
            _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)),
        ));
        if NAN {
            let nan = _mm512_or_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(0x0040));
            let is_nan = _mm512_cmpgt_epi32_mask(
                _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF)),
                _mm512_set1_epi32(0x7F80_0000),
            );
            h = _mm512_mask_blend_epi32(is_nan, h, nan);
        }
        _mm256_storeu_si256(p as *mut __m256i, _mm512_cvtepi32_epi16(h))
    }
}

/// Softmax's last pass over the leading whole chunks of [`CHUNK`] elements: `d[i] = s[i] /
/// sum` as `q = s[i] * rcp`, then `q + (s[i] - q * sum) * rcp` in two fused multiply-adds
/// (softmax.rs's `div_markstein`, the same bits), stored as `S` (rounded as
/// [`crate::common::Scalar::from_c`] rounds). Returns how many chunks it did: all of them, or
/// 0 where it has no explicit-SIMD version (the baseline level). With the conversion in the
/// same loop a half-type row needs no pass of its own to store its result.
///
/// `narrow` (a softmax row of a 16-bit float type, whose quotients are never NaN): `d[i] = s[i]
/// * rcp`, the product alone (softmax.rs's `div_by_sum` with `narrow`: within 1.5 float32 ulps
/// of the quotient, far inside the half type's rounding), stored without the NaN step
/// ([`VecElem::store16_no_nan`]).
#[inline(always)]
pub fn div_store_chunks<S: VecElem>(
    s: &[f32],
    sum: f32,
    rcp: f32,
    d: &mut [S],
    narrow: bool,
) -> usize {
    if narrow {
        by_level!(
            S,
            div_store_avx512::<S, true>(s, sum, rcp, d),
            div_store_avx2::<S, true>(s, sum, rcp, d)
        );
    } else {
        by_level!(
            S,
            div_store_avx512::<S, false>(s, sum, rcp, d),
            div_store_avx2::<S, false>(s, sum, rcp, d)
        );
    }
    let _ = (s, sum, rcp, d);
    0
}

/// [`div_store_chunks`] in AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn div_store_avx512<S: VecElem, const NARROW: bool>(
    s: &[f32],
    sum: f32,
    rcp: f32,
    d: &mut [S],
) -> usize {
    use std::arch::x86_64::*;
    let chunks = s.len().min(d.len()) / CHUNK;
    let (sp, dp) = (s.as_ptr(), d.as_mut_ptr());
    let (vsum, vrcp) = (_mm512_set1_ps(sum), _mm512_set1_ps(rcp));
    for c in 0..chunks {
        // SAFETY: chunk `c < chunks` is elements `c * CHUNK .. (c + 1) * CHUNK`, inside `s`
        // and `d`
        unsafe {
            let v = _mm512_loadu_ps(sp.add(c * CHUNK));
            let q = _mm512_mul_ps(v, vrcp);
            if NARROW {
                S::store16_no_nan(dp.add(c * CHUNK), q);
            } else {
                let rem = _mm512_fnmadd_ps(q, vsum, v);
                S::store16(dp.add(c * CHUNK), _mm512_fmadd_ps(rem, vrcp, q));
            }
        }
    }
    chunks
}

/// [`div_store_chunks`] in AVX2 (each chunk two vectors of 8).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn div_store_avx2<S: VecElem, const NARROW: bool>(
    s: &[f32],
    sum: f32,
    rcp: f32,
    d: &mut [S],
) -> usize {
    use std::arch::x86_64::*;
    let vectors = s.len().min(d.len()) / CHUNK * 2;
    let (sp, dp) = (s.as_ptr(), d.as_mut_ptr());
    let (vsum, vrcp) = (_mm256_set1_ps(sum), _mm256_set1_ps(rcp));
    for c in 0..vectors {
        // SAFETY: vector `c < vectors` is elements `c * 8 .. (c + 1) * 8`, inside `s` and `d`
        unsafe {
            let v = _mm256_loadu_ps(sp.add(c * 8));
            let q = _mm256_mul_ps(v, vrcp);
            if NARROW {
                S::store8_no_nan(dp.add(c * 8), q);
            } else {
                let rem = _mm256_fnmadd_ps(q, vsum, v);
                S::store8(dp.add(c * 8), _mm256_fmadd_ps(rem, vrcp, q));
            }
        }
    }
    vectors / 2
}

/// rms_norm's sum of squares over the leading whole chunks of [`CHUNK`] elements of `s`
/// (converted as they are read, [`VecElem`]): `acc[i % CHUNK] += s[i] * s[i]`, chunk after
/// chunk, the product rounded before the sum (the same bits as `common::sum_map`'s loop).
/// Returns how many chunks it did: all of them, or 0 where it has no explicit-SIMD version
/// (the baseline level).
#[inline(always)]
pub fn sum_sq_chunks<S: VecElem>(s: &[S], acc: &mut [f32; CHUNK]) -> usize {
    by_level!(S, sum_sq_avx512(s, acc), sum_sq_avx2(s, acc));
    let _ = (s, acc);
    0
}

/// [`sum_sq_chunks`] in AVX-512 (one vector is one chunk's 16 partials).
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn sum_sq_avx512<S: VecElem>(s: &[S], acc: &mut [f32; CHUNK]) -> usize {
    use std::arch::x86_64::*;
    let chunks = s.len() / CHUNK;
    // SAFETY: `acc` has CHUNK = 16 elements
    let mut a = unsafe { _mm512_loadu_ps(acc.as_ptr()) };
    for c in 0..chunks {
        // SAFETY: chunk `c < chunks` is inside `s`
        let v = unsafe { S::load16(s.as_ptr().add(c * CHUNK)) };
        a = _mm512_add_ps(a, _mm512_mul_ps(v, v));
    }
    // SAFETY: as the load
    unsafe { _mm512_storeu_ps(acc.as_mut_ptr(), a) };
    chunks
}

/// [`sum_sq_chunks`] in AVX2 (two vectors a chunk).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum_sq_avx2<S: VecElem>(s: &[S], acc: &mut [f32; CHUNK]) -> usize {
    use std::arch::x86_64::*;
    let chunks = s.len() / CHUNK;
    let ap = acc.as_mut_ptr();
    // SAFETY: `acc` has CHUNK = 16 elements
    let (mut lo, mut hi) = unsafe { (_mm256_loadu_ps(ap), _mm256_loadu_ps(ap.add(8))) };
    for c in 0..chunks {
        // SAFETY: chunk `c < chunks` is inside `s`
        let (v0, v1) = unsafe {
            let p = s.as_ptr().add(c * CHUNK);
            (S::load8(p), S::load8(p.add(8)))
        };
        lo = _mm256_add_ps(lo, _mm256_mul_ps(v0, v0));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(v1, v1));
    }
    // SAFETY: as the loads
    unsafe {
        _mm256_storeu_ps(ap, lo);
        _mm256_storeu_ps(ap.add(8), hi);
    }
    chunks
}

/// rms_norm's last pass over the leading whole chunks of [`CHUNK`] elements: `d[i] = s[i] * r
/// * w[i]` (two roundings, in that order), `s` converted as it is read and `d` stored as its
/// type ([`VecElem`]). Returns how many chunks it did: all of them, or 0 at the baseline level.
#[inline(always)]
pub fn scale_store_chunks<S: VecElem>(s: &[S], r: f32, w: &[f32], d: &mut [S]) -> usize {
    by_level!(
        S,
        scale_store_avx512(s, r, w, d),
        scale_store_avx2(s, r, w, d)
    );
    let _ = (s, r, w, d);
    0
}

/// [`scale_store_chunks`] in AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn scale_store_avx512<S: VecElem>(s: &[S], r: f32, w: &[f32], d: &mut [S]) -> usize {
    use std::arch::x86_64::*;
    let chunks = s.len().min(w.len()).min(d.len()) / CHUNK;
    let vr = _mm512_set1_ps(r);
    for c in 0..chunks {
        let at = c * CHUNK;
        // SAFETY: chunk `c < chunks` is inside `s`, `w` and `d`
        unsafe {
            let v = _mm512_mul_ps(S::load16(s.as_ptr().add(at)), vr);
            let y = _mm512_mul_ps(v, _mm512_loadu_ps(w.as_ptr().add(at)));
            S::store16(d.as_mut_ptr().add(at), y);
        }
    }
    chunks
}

/// [`scale_store_chunks`] in AVX2 (two vectors a chunk).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_store_avx2<S: VecElem>(s: &[S], r: f32, w: &[f32], d: &mut [S]) -> usize {
    use std::arch::x86_64::*;
    let vectors = s.len().min(w.len()).min(d.len()) / CHUNK * 2;
    let vr = _mm256_set1_ps(r);
    for c in 0..vectors {
        let at = c * 8;
        // SAFETY: vector `c < vectors` is elements `at .. at + 8`, inside `s`, `w` and `d`
        unsafe {
            let v = _mm256_mul_ps(S::load8(s.as_ptr().add(at)), vr);
            let y = _mm256_mul_ps(v, _mm256_loadu_ps(w.as_ptr().add(at)));
            S::store8(d.as_mut_ptr().add(at), y);
        }
    }
    vectors / 2
}

/// Lower bound of `x - m` for [`exp_diff_fast`].
const EXP_FAST_MIN: f32 = -86.0;

/// For the leading whole chunks of [`CHUNK`] elements of `s` that take [`exp_diff_chunk`]'s
/// fast path (every `s[i] - m >= EXP_FAST_MIN`): `d[i] = exp_diff_fast(s[i], m)` and
/// `acc[i % CHUNK] += d[i]`, chunk after chunk (the same bits and the same order as the loop
/// over [`exp_diff_chunk`] in softmax); stops before the first chunk that does not, and
/// returns how many chunks it did. `s` may be a 16-bit float type, converted as it is read
/// ([`VecElem`]). Explicit AVX2 on CPUs that have it (the compiler's own
/// vectorisation of that loop ran at 0.6 of this speed: it kept the sixteen partial sums in
/// 2-lane pieces and reloaded constants); elsewhere it does nothing (returns 0) and the
/// caller's loop does it all.
///
/// `narrow`: the row's elements are 16-bit floats, and the chunks take [`exp_narrow_fast`]
/// ([`exp_diff_chunk`]'s `narrow`) instead.
#[inline(always)]
pub fn exp_diff_chunks<S: VecElem>(
    s: &[S],
    m: f32,
    d: &mut [f32],
    acc: &mut [f32; CHUNK],
    narrow: bool,
) -> usize {
    if narrow {
        by_level!(
            S,
            exp_diff_chunks_avx512::<S, true>(s, m, d, acc),
            exp_diff_chunks_avx2::<S, true>(s, m, d, acc)
        );
    } else {
        by_level!(
            S,
            exp_diff_chunks_avx512::<S, false>(s, m, d, acc),
            exp_diff_chunks_avx2::<S, false>(s, m, d, acc)
        );
    }
    let _ = (s, m, d, acc);
    0
}

/// For the leading whole chunks of [`CHUNK`] elements of `s`: `acc[j] = max(acc[j], s[i])`
/// over the elements `i` with `i % CHUNK == j`, where `max(a, v)` is `if v > a { v } else { a }`
/// (a NaN is skipped); returns how many chunks it did (all of them), or 0 where it has no
/// explicit-SIMD version (the baseline level; at AVX-512 the caller's loop, one chain of `max`
/// per chunk, took a fifth of a softmax row's time). `s` may be a 16-bit float type, converted
/// as it is read ([`VecElem`]). Four chains of vectors here, one chunk in four each,
/// then merged lane by lane: each lane's maximum is over the same elements, and a maximum is
/// exact, so the value is the caller's loop's (a zero's sign aside).
#[inline(always)]
pub fn max_chunks<S: VecElem>(s: &[S], acc: &mut [f32; CHUNK]) -> usize {
    by_level!(S, max_chunks_avx512(s, acc), max_chunks_avx2(s, acc));
    let _ = (s, acc);
    0
}

/// [`max_chunks`] in AVX-512 (`_mm512_max_ps(v, a)` is `if v > a { v } else { a }` lane by
/// lane, NaN and zeros included).
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn max_chunks_avx512<S: VecElem>(s: &[S], acc: &mut [f32; CHUNK]) -> usize {
    use std::arch::x86_64::*;
    // SAFETY: `acc` has CHUNK = 16 elements; this function's features, which the helper is
    // inlined into
    unsafe {
        let m = max_chains16(s, _mm512_loadu_ps(acc.as_ptr()));
        _mm512_storeu_ps(acc.as_mut_ptr(), m);
    }
    s.len() / CHUNK
}

/// `max(init, s[i])` lane by lane over the whole chunks of `s` (lane `j` takes the elements
/// with `i % CHUNK == j`; `_mm512_max_ps(v, a)` is `if v > a { v } else { a }`, so a NaN never
/// wins), in four chains of chunks merged at the end: a maximum is exact in any order. Shared
/// by [`max_chunks_avx512`] and [`softmax_row_avx512`].
///
/// # Safety
/// The CPU must support AVX-512F; inlined into a function compiled for it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn max_chains16<S: VecElem>(
    s: &[S],
    init: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let chunks = s.len() / CHUNK;
    let sp = s.as_ptr();
    // SAFETY: the caller runs with AVX-512F (these intrinsics' feature); the loads as below
    unsafe {
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let (mut m0, mut m1, mut m2, mut m3) = (init, ninf, ninf, ninf);
        let mut c = 0;
        while c + 4 <= chunks {
            // chunks `c .. c + 4`, `c + 4 <= chunks`, are elements `c * CHUNK ..
            // (c + 4) * CHUNK`, inside `s`
            let p = sp.add(c * CHUNK);
            m0 = _mm512_max_ps(S::load16(p), m0);
            m1 = _mm512_max_ps(S::load16(p.add(CHUNK)), m1);
            m2 = _mm512_max_ps(S::load16(p.add(2 * CHUNK)), m2);
            m3 = _mm512_max_ps(S::load16(p.add(3 * CHUNK)), m3);
            c += 4;
        }
        while c < chunks {
            // chunk `c < chunks` is elements `c * CHUNK .. (c + 1) * CHUNK`, inside `s`
            m0 = _mm512_max_ps(S::load16(sp.add(c * CHUNK)), m0);
            c += 1;
        }
        _mm512_max_ps(_mm512_max_ps(m1, m0), _mm512_max_ps(m3, m2))
    }
}

/// [`max_chunks`] in AVX2 (each chunk two vectors of 8; `_mm256_max_ps(v, a)` is
/// `if v > a { v } else { a }` lane by lane), in two chains of chunks.
///
/// # Safety
/// The CPU must support AVX2 and F16C ([`VecElem::at_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn max_chunks_avx2<S: VecElem>(s: &[S], acc: &mut [f32; CHUNK]) -> usize {
    use std::arch::x86_64::*;
    let chunks = s.len() / CHUNK;
    let (sp, ap) = (s.as_ptr(), acc.as_mut_ptr());
    // SAFETY: `acc` has CHUNK = 16 elements
    let (mut lo0, mut hi0) = unsafe { (_mm256_loadu_ps(ap), _mm256_loadu_ps(ap.add(8))) };
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let (mut lo1, mut hi1) = (ninf, ninf);
    let mut c = 0;
    while c + 2 <= chunks {
        // SAFETY: chunks `c .. c + 2`, `c + 2 <= chunks`, are inside `s`
        let (x0, x1, x2, x3) = unsafe {
            let p = sp.add(c * CHUNK);
            (
                S::load8(p),
                S::load8(p.add(8)),
                S::load8(p.add(CHUNK)),
                S::load8(p.add(CHUNK + 8)),
            )
        };
        lo0 = _mm256_max_ps(x0, lo0);
        hi0 = _mm256_max_ps(x1, hi0);
        lo1 = _mm256_max_ps(x2, lo1);
        hi1 = _mm256_max_ps(x3, hi1);
        c += 2;
    }
    if c < chunks {
        // SAFETY: chunk `c < chunks` is inside `s`
        let (x0, x1) = unsafe { (S::load8(sp.add(c * CHUNK)), S::load8(sp.add(c * CHUNK + 8))) };
        lo0 = _mm256_max_ps(x0, lo0);
        hi0 = _mm256_max_ps(x1, hi0);
        c += 1;
    }
    // SAFETY: as the first loads
    unsafe {
        _mm256_storeu_ps(ap, _mm256_max_ps(lo1, lo0));
        _mm256_storeu_ps(ap.add(8), _mm256_max_ps(hi1, hi0));
    }
    c
}

/// `exp_diff_core(d, err)` on sixteen lanes: `(p, n, k)`, `n` the power of two as a float and
/// `k` holding it as an integer in its low bits (the operations of the scalar formula in its
/// order; `a.mul_add(b, c)` is `fmadd(a, b, c)`, one rounding either way).
///
/// # Safety
/// The CPU must support AVX-512F; inlined into a function compiled for it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp_diff_core16(
    d: std::arch::x86_64::__m512,
    err: std::arch::x86_64::__m512,
) -> [std::arch::x86_64::__m512; 3] {
    use std::arch::x86_64::*;
    // SAFETY: the caller runs with AVX-512F (these intrinsics' feature); no memory is touched
    unsafe {
        let magic = _mm512_set1_ps(MAGIC);
        let k = _mm512_fmadd_ps(d, _mm512_set1_ps(LOG2E), magic);
        let n = _mm512_sub_ps(k, magic);
        let r = _mm512_add_ps(
            _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), d),
            _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), err),
        );
        let r2 = _mm512_mul_ps(r, r);
        let a = _mm512_fmadd_ps(_mm512_set1_ps(EXP_C[1]), r, _mm512_set1_ps(EXP_C[0]));
        let b = _mm512_fmadd_ps(_mm512_set1_ps(EXP_C[3]), r, _mm512_set1_ps(EXP_C[2]));
        let q = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(EXP_C[4]), r2, b), r2, a);
        let p = _mm512_add_ps(_mm512_fmadd_ps(q, r2, r), _mm512_set1_ps(1.0));
        [p, n, k]
    }
}

/// `two_diff(x, m)`'s rounding error on sixteen lanes, given `dd = x - m` and `neg_m = -m`.
///
/// # Safety
/// As [`exp_diff_core16`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn two_diff_err16(
    x: std::arch::x86_64::__m512,
    dd: std::arch::x86_64::__m512,
    neg_m: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: as `exp_diff_core16`
    unsafe {
        let bb = _mm512_sub_ps(dd, x);
        _mm512_add_ps(
            _mm512_sub_ps(x, _mm512_sub_ps(dd, bb)),
            _mm512_sub_ps(neg_m, bb),
        )
    }
}

/// `exp_diff_fast(x, m)` (or, `NARROW`, `exp_narrow_fast(x, m)`) on sixteen lanes, given
/// `dd = x - m` and `neg_m = -m`, for lanes with `dd >= EXP_FAST_MIN` (normal results).
/// Shared by [`exp_diff_chunks_avx512`] and [`softmax_row_avx512`].
///
/// # Safety
/// As [`exp_diff_core16`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp_diff_fast16<const NARROW: bool>(
    x: std::arch::x86_64::__m512,
    dd: std::arch::x86_64::__m512,
    neg_m: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: as `exp_diff_core16`
    unsafe {
        let (p, n) = if NARROW {
            // `exp_narrow_fast(x, m)`'s formula, as in `exp_diff_chunks_avx2`
            let magic = _mm512_set1_ps(MAGIC);
            let k = _mm512_fmadd_ps(dd, _mm512_set1_ps(LOG2E), magic);
            let n = _mm512_sub_ps(k, magic);
            let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-std::f32::consts::LN_2), dd);
            let r2 = _mm512_mul_ps(r, r);
            let a = _mm512_fmadd_ps(_mm512_set1_ps(EXP_N[1]), r, _mm512_set1_ps(EXP_N[0]));
            let q = _mm512_fmadd_ps(_mm512_set1_ps(EXP_N[2]), r2, a);
            (
                _mm512_add_ps(_mm512_fmadd_ps(q, r2, r), _mm512_set1_ps(1.0)),
                n,
            )
        } else {
            // `exp_diff_fast(x, m)`'s
            let [p, n, _] = exp_diff_core16(dd, two_diff_err16(x, dd, neg_m));
            (p, n)
        };
        // p * 2^n in one instruction: exact, as the product with 2^n is, for these normal results
        // (n in [-125, 0])
        _mm512_scalef_ps(p, n)
    }
}

/// `exp_diff_f32(x, m)` on sixteen lanes (`x` not NaN, `m` finite), given `dd = x - m` and
/// `neg_m = -m`: the clamp at -105, the power of two in two normal halves (gradual underflow
/// rounded once), 0 below e^-104. For the chunks of a softmax row with an element below
/// `m + EXP_FAST_MIN` (an attention mask's -inf). (Written out: the scalar formula over an
/// array, left to the compiler, took libm calls for its FMAs in a closure and ran at a sixth
/// of the speed.)
///
/// # Safety
/// As [`exp_diff_core16`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp_diff_general16(
    x: std::arch::x86_64::__m512,
    dd: std::arch::x86_64::__m512,
    neg_m: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: as `exp_diff_core16`
    unsafe {
        let err = two_diff_err16(x, dd, neg_m);
        let [p, _, k] = exp_diff_core16(_mm512_max_ps(dd, _mm512_set1_ps(-105.0)), err);
        // n in [-152, 0]: 2^n as two normal halves, 2^h and 2^(n - h)
        let ni = _mm512_sub_epi32(
            _mm512_castps_si512(k),
            _mm512_set1_epi32(MAGIC.to_bits() as i32),
        );
        let h = _mm512_srai_epi32::<1>(ni);
        let bias = _mm512_set1_epi32(127);
        let s1 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(h, bias)));
        let s2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_sub_epi32(ni, h),
            bias,
        )));
        let y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
        _mm512_maskz_mov_ps(
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(dd, _mm512_set1_ps(-104.0)),
            y,
        )
    }
}

/// `exp_diff_f32(x, m)`'s bits on the lanes of `mask` (`m` finite): [`exp_diff_fast16`] where
/// every such lane is at least `m + EXP_FAST_MIN`, else [`exp_diff_general16`] (an underflowing
/// element: a -inf, an attention mask's -3.4e38; the general path's `exp_diff_chunk` and its
/// scalar tail give the same bits); None if such a lane is NaN.
///
/// # Safety
/// As [`exp_diff_core16`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp_diff_lanes16(
    mask: std::arch::x86_64::__mmask16,
    x: std::arch::x86_64::__m512,
    m: f32,
) -> Option<std::arch::x86_64::__m512> {
    use std::arch::x86_64::*;
    // SAFETY: as `exp_diff_core16`
    unsafe {
        let (dd, neg_m) = (_mm512_sub_ps(x, _mm512_set1_ps(m)), _mm512_set1_ps(-m));
        if _mm512_mask_cmp_ps_mask::<_CMP_GE_OQ>(mask, dd, _mm512_set1_ps(EXP_FAST_MIN)) == mask {
            Some(exp_diff_fast16::<false>(x, dd, neg_m))
        } else if _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(mask, x, x) != 0 {
            None
        } else {
            Some(exp_diff_general16(x, dd, neg_m))
        }
    }
}

/// One whole softmax row of f32 (`d = softmax(s)`, `s` and `d` of one length) in one
/// explicit-SIMD routine where the CPU has AVX-512, for the bits of softmax.rs's general path
/// (`softmax_row`: the maximum, the exponentials stored and summed in blocks of `block`
/// elements through f32 and f64 partials, the f64 tree, the corrected division), which it
/// transcribes lane for lane (a chunk with an element below `max + EXP_FAST_MIN`, such as an
/// attention mask's -inf, takes [`exp_diff_f32`] as there); returns false, `d` unfinished, where
/// that path leaves its fast formula (a NaN, an infinite maximum) or the CPU lacks AVX-512,
/// and the caller runs the general path. Rows of
/// 128 (attention's) took 2.2 times ONNX Runtime's time through the general path: its passes
/// handed the partials and the maximum on through the stack, and each pass had its own
/// entry and tail code.
#[inline(always)]
pub fn softmax_row_f32(s: &[f32], d: &mut [f32], block: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::common::simd_level() == crate::common::SimdLevel::Avx512 {
        // SAFETY: the CPU has AVX-512F (`simd_level` never reports a level it lacks)
        return unsafe { softmax_row_avx512(s, d, block) };
    }
    let _ = (s, d, block);
    false
}

/// [`softmax_row_f32`] in AVX-512: whole chunks of [`CHUNK`] as vectors, the row's last
/// `n % CHUNK` elements as one masked vector (its lanes are those of the general path's
/// scalar tail: the same formula, [`exp_diff_f32`] giving [`exp_diff_fast`]'s bits where both
/// apply, into partials `0 .. n % CHUNK`).
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn softmax_row_avx512(s: &[f32], d: &mut [f32], block: usize) -> bool {
    use std::arch::x86_64::*;
    let n = s.len();
    if d.len() != n || n == 0 || block == 0 || !block.is_multiple_of(CHUNK) {
        return false;
    }
    let (sp, dp) = (s.as_ptr(), d.as_mut_ptr());
    let full = n / CHUNK * CHUNK;
    let tail: __mmask16 = ((1u32 << (n % CHUNK)) - 1) as __mmask16;
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    // the maximum (`max_chains16`), the tail's missing lanes -inf
    // SAFETY: this function's features, which the helper is inlined into
    let mut mv = unsafe { max_chains16(s, ninf) };
    if tail != 0 {
        // SAFETY: the mask's lanes are elements `full .. n`, inside `s` (masked-off lanes are
        // not read, faults included)
        mv = _mm512_max_ps(
            unsafe { _mm512_mask_loadu_ps(ninf, tail, sp.add(full)) },
            mv,
        );
    }
    let m = _mm512_reduce_max_ps(mv);
    if !m.is_finite() {
        return false;
    }
    // the exponentials, stored and summed: per block, f32 partial `j` takes the elements `i`
    // with `i % CHUNK == j`, then goes into f64 partial `j` (`wlo`: 0 .. 8, `whi`: 8 .. 16)
    let (mut wlo, mut whi) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    let mut at = 0;
    while at < n {
        let end = (at + block).min(n);
        let mut acc = _mm512_setzero_ps();
        let mut i = at;
        while i + CHUNK <= end {
            // SAFETY: elements `i .. i + CHUNK`, `i + CHUNK <= n`, are inside `s` and `d`
            let x = unsafe { _mm512_loadu_ps(sp.add(i)) };
            // SAFETY: this function's features, which the helper is inlined into
            let Some(y) = (unsafe { exp_diff_lanes16(0xffff, x, m) }) else {
                return false;
            };
            // SAFETY: as the load
            unsafe { _mm512_storeu_ps(dp.add(i), y) };
            acc = _mm512_add_ps(acc, y);
            i += CHUNK;
        }
        if i < end {
            // the row's tail (a block is a whole number of chunks, so only the last block's)
            // SAFETY: the mask's lanes are elements `full .. n`, inside `s` and `d`
            unsafe {
                let x = _mm512_maskz_loadu_ps(tail, sp.add(i));
                let Some(y) = exp_diff_lanes16(tail, x, m) else {
                    return false;
                };
                _mm512_mask_storeu_ps(dp.add(i), tail, y);
                acc = _mm512_mask_add_ps(acc, tail, acc, y);
            }
        }
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
        wlo = _mm512_add_pd(wlo, _mm512_cvtps_pd(_mm512_castps512_ps256(acc)));
        whi = _mm512_add_pd(whi, _mm512_cvtps_pd(hi));
        at = end;
    }
    // `tree_sum`'s order: partial j + partial j + 8, then j + 4, j + 2, j + 1
    let s8 = _mm512_add_pd(wlo, whi);
    let s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd::<1>(s8));
    let s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd::<1>(s4));
    let sum = (_mm_cvtsd_f64(s2) + _mm_cvtsd_f64(_mm_unpackhi_pd(s2, s2))) as f32;
    // `v / sum` as `div_markstein`: q = v (1 / sum), corrected by one FMA of the remainder
    let rcp = 1.0 / sum;
    let (vs, vr, zero) = (
        _mm512_set1_ps(sum),
        _mm512_set1_ps(rcp),
        _mm512_setzero_ps(),
    );
    let quotient = |v: __m512| {
        let q = _mm512_mul_ps(v, vr);
        let rem = _mm512_fmadd_ps(_mm512_sub_ps(zero, q), vs, v);
        _mm512_fmadd_ps(rem, vr, q)
    };
    let mut i = 0;
    while i < full {
        // SAFETY: elements `i .. i + CHUNK`, `i + CHUNK <= n`, are inside `d`
        unsafe { _mm512_storeu_ps(dp.add(i), quotient(_mm512_loadu_ps(dp.add(i)))) };
        i += CHUNK;
    }
    if tail != 0 {
        // SAFETY: the mask's lanes are elements `full .. n`, inside `d`
        unsafe {
            let v = _mm512_maskz_loadu_ps(tail, dp.add(full));
            _mm512_mask_storeu_ps(dp.add(full), tail, quotient(v));
        }
    }
    true
}

/// [`exp_diff_chunks`] in AVX-512: each chunk is one vector of [`exp_diff_fast`]'s
/// operations, in its order (as [`exp_diff_chunks_avx2`], one 16-lane vector where that has
/// two of 8). Left to the compiler, the AVX-512 build of the caller ran at 0.7 of the AVX2
/// one.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn exp_diff_chunks_avx512<S: VecElem, const NARROW: bool>(
    s: &[S],
    m: f32,
    d: &mut [f32],
    acc: &mut [f32; CHUNK],
) -> usize {
    use std::arch::x86_64::*;
    let chunks = s.len().min(d.len()) / CHUNK;
    let (sp, dp) = (s.as_ptr(), d.as_mut_ptr());
    let (vm, vneg_m) = (_mm512_set1_ps(m), _mm512_set1_ps(-m));
    let vmin = _mm512_set1_ps(EXP_FAST_MIN);
    // SAFETY: `acc` has CHUNK = 16 elements
    let mut sum = unsafe { _mm512_loadu_ps(acc.as_ptr()) };
    let mut c = 0;
    while c < chunks {
        let at = c * CHUNK;
        // SAFETY: chunk `c < chunks` is elements `at .. at + CHUNK`, inside `s` and `d`
        let x = unsafe { S::load16(sp.add(at)) };
        let dd = _mm512_sub_ps(x, vm);
        if _mm512_cmp_ps_mask::<_CMP_GE_OQ>(dd, vmin) != 0xffff {
            break;
        }
        // SAFETY: this function's features (AVX-512F), which the helper is inlined into
        let y = unsafe { exp_diff_fast16::<NARROW>(x, dd, vneg_m) };
        // SAFETY: as the load
        unsafe { _mm512_storeu_ps(dp.add(at), y) };
        sum = _mm512_add_ps(sum, y);
        c += 1;
    }
    // SAFETY: as the first load
    unsafe { _mm512_storeu_ps(acc.as_mut_ptr(), sum) };
    c
}

/// [`exp_diff_chunks`] in AVX2 + FMA: each chunk is two vectors of [`exp_diff_fast`]'s
/// operations, in its order (`a.mul_add(b, c)` is `fmadd(a, b, c)`, one rounding either way).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_diff_chunks_avx2<S: VecElem, const NARROW: bool>(
    s: &[S],
    m: f32,
    d: &mut [f32],
    acc: &mut [f32; CHUNK],
) -> usize {
    use std::arch::x86_64::*;
    let chunks = s.len().min(d.len()) / CHUNK;
    let (sp, dp, ap) = (s.as_ptr(), d.as_mut_ptr(), acc.as_mut_ptr());
    let (vm, vneg_m) = (_mm256_set1_ps(m), _mm256_set1_ps(-m));
    let (vmin, magic) = (_mm256_set1_ps(EXP_FAST_MIN), _mm256_set1_ps(MAGIC));
    // one lane's `exp_narrow_fast(x, m)` (NARROW) or `exp_diff_fast(x, m)` given `dd = x - m`
    let lane = |x: __m256, dd: __m256| {
        let k = _mm256_fmadd_ps(dd, _mm256_set1_ps(LOG2E), magic);
        let n = _mm256_sub_ps(k, magic);
        let p = if NARROW {
            let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-std::f32::consts::LN_2), dd);
            let r2 = _mm256_mul_ps(r, r);
            let a = _mm256_fmadd_ps(_mm256_set1_ps(EXP_N[1]), r, _mm256_set1_ps(EXP_N[0]));
            let q = _mm256_fmadd_ps(_mm256_set1_ps(EXP_N[2]), r2, a);
            _mm256_add_ps(_mm256_fmadd_ps(q, r2, r), _mm256_set1_ps(1.0))
        } else {
            let bb = _mm256_sub_ps(dd, x);
            let err = _mm256_add_ps(
                _mm256_sub_ps(x, _mm256_sub_ps(dd, bb)),
                _mm256_sub_ps(vneg_m, bb),
            );
            let r = _mm256_add_ps(
                _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), dd),
                _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), err),
            );
            let r2 = _mm256_mul_ps(r, r);
            let a = _mm256_fmadd_ps(_mm256_set1_ps(EXP_C[1]), r, _mm256_set1_ps(EXP_C[0]));
            let b = _mm256_fmadd_ps(_mm256_set1_ps(EXP_C[3]), r, _mm256_set1_ps(EXP_C[2]));
            let q = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(EXP_C[4]), r2, b), r2, a);
            _mm256_add_ps(_mm256_fmadd_ps(q, r2, r), _mm256_set1_ps(1.0))
        };
        // (bits of k) - (bits of MAGIC) = n; + 127, shifted into the exponent: 2^n
        let e = _mm256_sub_epi32(
            _mm256_castps_si256(k),
            _mm256_set1_epi32(MAGIC.to_bits() as i32 - 127),
        );
        _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)))
    };
    // SAFETY: `acc` has CHUNK = 16 elements
    let (mut lo, mut hi) = unsafe { (_mm256_loadu_ps(ap), _mm256_loadu_ps(ap.add(8))) };
    let mut c = 0;
    while c < chunks {
        let at = c * CHUNK;
        // SAFETY: chunk `c < chunks` is elements `at .. at + CHUNK`, inside `s` and `d`
        let (x0, x1) = unsafe { (S::load8(sp.add(at)), S::load8(sp.add(at + 8))) };
        let (d0, d1) = (_mm256_sub_ps(x0, vm), _mm256_sub_ps(x1, vm));
        let ok0 = _mm256_cmp_ps::<_CMP_GE_OQ>(d0, vmin);
        let ok = _mm256_and_ps(ok0, _mm256_cmp_ps::<_CMP_GE_OQ>(d1, vmin));
        if _mm256_movemask_ps(ok) != 0xff {
            break;
        }
        let (e0, e1) = (lane(x0, d0), lane(x1, d1));
        // SAFETY: as the loads
        unsafe {
            _mm256_storeu_ps(dp.add(at), e0);
            _mm256_storeu_ps(dp.add(at + 8), e1);
        }
        lo = _mm256_add_ps(lo, e0);
        hi = _mm256_add_ps(hi, e1);
        c += 1;
    }
    // SAFETY: as the first loads
    unsafe {
        _mm256_storeu_ps(ap, lo);
        _mm256_storeu_ps(ap.add(8), hi);
    }
    c
}

/// `d[j] = exp_diff_f32(s[j], m)`, bitwise; a chunk whose differences are all at least
/// [`EXP_FAST_MIN`] (no subnormal or zero result, no NaN) takes [`exp_diff_fast`]; returns
/// whether it did.
/// With `narrow` (a 16-bit float row), [`exp_diff_narrow`] in place of [`exp_diff_f32`]
/// ([`exp_narrow_fast`] for the fast chunks).
#[inline(always)]
pub fn exp_diff_chunk(s: &[f32; CHUNK], m: f32, d: &mut [f32; CHUNK], narrow: bool) -> bool {
    let mut ok = true;
    for &x in s {
        ok &= x - m >= EXP_FAST_MIN;
    }
    match (ok, narrow) {
        (true, false) => (0..CHUNK).for_each(|j| d[j] = exp_diff_fast(s[j], m)),
        (true, true) => (0..CHUNK).for_each(|j| d[j] = exp_narrow_fast(s[j], m)),
        (false, false) => (0..CHUNK).for_each(|j| d[j] = exp_diff_f32(s[j], m)),
        (false, true) => (0..CHUNK).for_each(|j| d[j] = exp_diff_narrow(s[j], m)),
    }
    ok
}

/// tanh(x): an odd polynomial (Cephes' tanhf) for |x| < 0.625, else 1 - 2 / (e^{2|x|} + 1)
/// with the sign of x.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let z = x * x;
    let small =
        ((((-5.704_988_7e-3 * z + 2.063_908_9e-2) * z - 5.373_971_6e-2) * z + 1.333_144_2e-1) * z
            - 3.333_328_2e-1)
            * z
            * x
            + x;
    let a = x.abs();
    let large = 1.0 - 2.0 / (exp_f32(2.0 * a) + 1.0);
    // tanh is odd: the sign of x (also for -0.0, which the polynomial would make +0.0)
    if a < 0.625 { small } else { large }.copysign(x)
}

/// Phi(x) = (1 + erf(x / sqrt 2)) / 2, the standard normal CDF, with relative accuracy in
/// the lower tail (it is computed from erfc there, not as 1 - something).
///
/// With z = |x| / sqrt 2: for z < 0.5, erf(z) = z P(z^2); otherwise
/// erfc(z) = exp(-z^2) R(1 / (1 + z/2)), where exp(-z^2) is evaluated from an exact square
/// of z's high half plus a correction so it keeps full relative accuracy. P (degree 5) and R
/// (degree 9) are near-minimax fits of erf(z)/z on [0, 1] and of erfcx on [0.5, 10.5] (relative
/// error 4e-8 and 2e-9).
#[inline(always)]
pub fn norm_cdf_f32(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    // beyond 10.5, erfc(z) underflows to 0 (keeps inf - inf out of the correction below)
    let z = if z > 10.5 { 10.5 } else { z };
    let z2 = z * z;
    let erf_small = z
        * (((((-5.631_531e-4 * z2 + 4.917_582e-3) * z2 - 2.671_134_3e-2) * z2 + 1.128_018_1e-1)
            * z2
            - 3.761_232_5e-1)
            * z2
            + 1.128_379_1);
    // exp(-z^2) = exp(-x^2 / 2) from x itself (z = |x|/sqrt 2 is rounded): with xh = x's high
    // 12 bits, xh^2 / 2 is exact and (x - xh)(x + xh) / 2 is the small rest.
    let xa = if z >= 10.5 { 14.849_242 } else { x.abs() };
    let xh = f32::from_bits(xa.to_bits() & 0xffff_f000);
    let e = exp_parts(-(xh * xh) * 0.5, -((xa - xh) * (xa + xh)) * 0.5);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = (((((((((-0.07368310540914536) * t + 0.34816932678222656) * t
        - 0.6053903102874756)
        * t
        + 0.40067943930625916)
        * t
        - 0.10452406108379364)
        * t
        + 0.23397411406040192)
        * t
        + 0.23519505560398102)
        * t
        + 0.2835836112499237)
        * t
        + 0.2819855213165283)
        * t
        + 3.4982263059646357e-06;
    let erfc_large = e * r;
    let pos = x > 0.0;
    if z < 0.5 {
        if pos {
            0.5 + 0.5 * erf_small
        } else {
            0.5 - 0.5 * erf_small
        }
    } else if pos {
        1.0 - 0.5 * erfc_large
    } else {
        0.5 * erfc_large
    }
}

/// 1 / (2 sqrt 2) rounded to f32: the erfc fit of [`gelu_erf_f32`] is in
/// `t = 1 / (1 + ERFC_C |x|)` with exactly this constant, so no rounding of `|x| / sqrt 2`
/// enters the fit's argument.
const ERFC_C: f32 = 0.353_553_38;

/// erfc(|x| / sqrt 2) = R(t) * pe * s1 * s2 (R in f64) for |x| in [1/sqrt 2, 14.6] (see [`gelu_erf_f32`]).
#[inline(always)]
fn erfc_parts(xc: f32) -> (f64, f32, f32, f32) {
    let a = xc.abs();
    // t = 1 / (1 + ERFC_C a) to about half an ulp: d + dl = 1 + ERFC_C a exactly (1 - d is
    // exact for d in [1.25, 6.2]), then one Newton step on the rounded quotient
    let d = a.mul_add(ERFC_C, 1.0);
    let dl = a.mul_add(ERFC_C, 1.0 - d);
    let t0 = 1.0 / d;
    let t = t0.mul_add((-d).mul_add(t0, 1.0) - dl * t0, t0);
    // in f64: R's Horner rounding would otherwise add 2 ulp (coefficients fitted in f64)
    let r = (-0.073_884_795_532_044_23f64)
        .mul_add(t as f64, 0.349_021_236_685_508)
        .mul_add(t as f64, -0.606_945_360_480_709_7)
        .mul_add(t as f64, 0.402_286_222_189_749_2)
        .mul_add(t as f64, -0.105_557_680_198_004_31)
        .mul_add(t as f64, 0.234_402_597_455_771_4)
        .mul_add(t as f64, 0.235_080_778_525_337_04)
        .mul_add(t as f64, 0.283_602_484_448_857_2)
        .mul_add(t as f64, 0.281_983_764_986_707_8)
        .mul_add(t as f64, 3.567_746_612_311_022_3e-6);
    let q = xc * xc;
    let ql = xc.mul_add(xc, -q);
    let (pe, s1, s2) = exp_split(-0.5 * q, -0.5 * ql);
    (r, pe, s1, s2)
}

/// Bound of [`gelu_erf_mid`]'s range: |x| <= GELU_MID (99.99% of standard normal inputs).
pub const GELU_MID: f32 = 4.0;

/// `0.5 erfcx(a / sqrt 2) e^(a/2)` for a in [0, 4] as a polynomial in `a - 2` (degree 12,
/// relative error 2e-8 with these f32 coefficients, fitted with each coefficient rounded to f32
/// in turn). The factor e^(a/2) flattens erfcx (0.43..0.70 instead of 0.12..0.5), so the f32
/// Horner evaluation loses less than an ulp.
const GM_S: [f32; 13] = [
    0.456_948_6,
    0.057_933_99,
    0.029_782_379,
    -0.001_054_970_2,
    0.001_138_371_4,
    -2.065_128_5e-4,
    5.621_376e-5,
    -1.290_100_6e-5,
    3.054_576e-6,
    -5.391_748e-7,
    8.214_985e-8,
    -4.377_536_6e-8,
    1.145_693_8e-8,
];

/// gelu(x) for |x| <= [`GELU_MID`] (no meaning outside; NaN not handled), all in f32 with no
/// division: with a = |x|, h = 0.5 a erfc(a / sqrt 2) = a e^(-a^2/2 - a/2) S(a), and
/// gelu(x) = x - h for x >= 0, -h for x < 0 (neither cancels). The exponent -a^2/2 - a/2
/// is carried exactly (a^2 as a rounded square plus its FMA remainder, the sum as a two-sum),
/// `a S(a)` multiplies `1 + (e^r - 1)` in one FMA, and the power of two is exact (the result
/// is normal or, for tiny a, n = 0). Within 3.2 ulp (tests).
#[inline(always)]
pub fn gelu_erf_mid(x: f32) -> f32 {
    let a = x.abs();
    let q = a * a;
    let ql = a.mul_add(a, -q);
    // s + err = -a^2/2 - a/2 (exact two-sum of two exact halves), lo adds -ql/2
    let (x1, x2) = (-0.5 * q, -0.5 * a);
    let s = x1 + x2;
    let bb = s - x1;
    let err = (x1 - (s - bb)) + (x2 - bb);
    let lo = ql.mul_add(-0.5, err);
    let k = s.mul_add(LOG2E, MAGIC);
    let n = k - MAGIC;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, s)) + lo;
    let r2 = r * r;
    // e^r - 1
    let em1 = cephes_exp_poly(r, r2).mul_add(r2, r);
    // S(u) = E(u^2) + u O(u^2), each by Horner: two chains of 5 FMAs side by side instead of
    // one of 12 (3.2 ulp at most against 2.4 for plain Horner; a full Estrin evaluation of S
    // was 4.4 ulp, a split into low and high halves 3.2 ulp and slower)
    let u = a - 2.0;
    let u2 = u * u;
    let mut ev = GM_S[12];
    let mut od = GM_S[11];
    for i in (0..5).rev() {
        ev = ev.mul_add(u2, GM_S[2 * i + 2]);
        od = od.mul_add(u2, GM_S[2 * i + 1]);
    }
    let sp = od.mul_add(u, ev.mul_add(u2, GM_S[0]));
    let y = a * sp;
    // n in [-12, 0]: 2^n is a normal power of two
    let ni = (k.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let scale = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    let h = y.mul_add(em1, y) * scale;
    // -0.0 >= 0: -0.0 - 0.0 = -0.0 keeps the sign of a zero
    if x >= 0.0 {
        x - h
    } else {
        -h
    }
}

/// gelu(x) for |x| > [`GELU_MID`] (and NaN, infinities): see [`gelu_erf_f32`].
#[inline(always)]
fn gelu_erf_tail(x: f32) -> f32 {
    let xc = x.clamp(-14.6, 14.6);
    let (r, pe, s1, s2) = erfc_parts(xc);
    // 0.5 x erfc(|x| / sqrt 2)
    let e = ((0.5 * xc) as f64 * r * pe as f64) as f32 * s1 * s2;
    if x > 0.0 {
        x - e
    } else {
        e
    }
}

/// gelu(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), within 4 ulp over the whole f32 range.
///
/// For |x| <= [`GELU_MID`], [`gelu_erf_mid`] (f32 only, no division). Beyond, from
/// erfc(|x| / sqrt 2) = e^(-x^2/2) R(t), t = 1 / (1 + ERFC_C |x|), R a relative-minimax fit of
/// erfcx (degree 9, 1.6e-9, evaluated in f64): `x - 0.5 x erfc` for x > 0, and `0.5 x erfc`
/// for x < 0, never `1 + erf` (which cancels in the negative tail). `-x^2/2` goes into exp
/// exactly (x^2 as a rounded square plus its FMA remainder), and the power of two of
/// e^(-x^2/2) is applied last so a subnormal result rounds once. Beyond |x| = 14.6 the tail is
/// below the smallest subnormal: -0 for x < -14.6 (-inf included), x itself for x > 14.6.
///
/// Both are computed and one selected per element, so [`gelu_erf_slice`] may skip the tail
/// for chunks with no tail element and give the same bits.
#[inline(always)]
pub fn gelu_erf_f32(x: f32) -> f32 {
    by_range(x, GELU_MID, gelu_erf_mid, gelu_erf_tail)
}

/// `mid(x)` for |x| <= `bound`, `general(x)` beyond (and for NaN): both computed and one
/// selected, without a branch, so that it vectorises and a chunk whose elements are all within
/// `bound` may compute `mid` alone for the same bits ([`chunked_select`]).
#[inline(always)]
fn by_range(x: f32, bound: f32, mid: impl Fn(f32) -> f32, general: impl Fn(f32) -> f32) -> f32 {
    let (m, g) = (mid(x), general(x));
    if x.abs() <= bound {
        m
    } else {
        g
    }
}

/// Elements per chunk of the slice functions' fast-path test (one AVX-512 or two AVX2
/// vectors); a chunk takes the fast path only when every element allows it.
pub const CHUNK: usize = 16;

/// Whether every element of `c` satisfies `|x| <= bound` (false for NaN), without branches.
#[inline(always)]
fn all_within(c: &[f32; CHUNK], bound: f32) -> bool {
    let mut ok = true;
    for &x in c {
        ok &= x.abs() <= bound;
    }
    ok
}

/// `dst[i] = fast(src[i])` for chunks whose elements are all within `bound` (|x| <= bound),
/// `general(src[i])` elsewhere and for the tail. Bitwise the same as `general` everywhere
/// exactly when `fast` computes, for |x| <= bound, what `general` selects there: the chunk test
/// only skips work. `fast` and `general` must be `#[inline(always)]` functions or closures
/// (see `common::with_simd`).
#[inline(always)]
fn chunked_select(
    src: &[f32],
    dst: &mut [f32],
    bound: f32,
    fast: impl Fn(f32) -> f32,
    general: impl Fn(f32) -> f32,
) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    let mut cs = src.chunks_exact(CHUNK);
    let mut cd = dst.chunks_exact_mut(CHUNK);
    for (s, d) in (&mut cs).zip(&mut cd) {
        let s: &[f32; CHUNK] = s.try_into().unwrap();
        if all_within(s, bound) {
            for (o, &x) in d.iter_mut().zip(s) {
                *o = fast(x);
            }
        } else {
            for (o, &x) in d.iter_mut().zip(s) {
                *o = general(x);
            }
        }
    }
    for (o, &x) in cd.into_remainder().iter_mut().zip(cs.remainder()) {
        *o = general(x);
    }
}

/// `dst[i] = gelu_erf_f32(src[i])`, bitwise: chunks whose elements are all within
/// [`GELU_MID`] compute only [`gelu_erf_mid`], which is what [`gelu_erf_f32`] selects for them.
#[inline(always)]
pub fn gelu_erf_slice(src: &[f32], dst: &mut [f32]) {
    chunked_select(src, dst, GELU_MID, gelu_erf_mid, gelu_erf_f32)
}

/// The exponent's linear term in [`gelu_erf_narrow_mid`]: `h = a e^(-a^2/2 - GN_C a) S(a)`.
const GN_C: f32 = 0.9;

/// `0.5 erfcx(a / sqrt 2) e^(GN_C a)` for a in [0, 4] as a polynomial in `a - 2` (degree 8,
/// relative error 7e-7 in f32 Horner with these coefficients, each rounded to f32 in turn and
/// the rest refitted). A larger exponent factor than [`GM_S`]'s `e^(a/2)` flattens the
/// function further: degree 8 does here what takes 12 there to float32's precision.
const GN_S: [f32; 9] = [
    1.016_958_2,
    0.535_717_84,
    0.199_208_42,
    0.045_325_957,
    0.009_363_097,
    0.001_298_198_7,
    2.030_898_5e-4,
    1.598_563_5e-5,
    4.032_685e-6,
];

/// gelu(x) for |x| <= [`GELU_MID`] to the precision a 16-bit float result keeps: with a =
/// |x|, h = a e^s S(a), s = -a^2/2 - [`GN_C`] a rounded as is (|s| <= 11.6: 1.4e-6 relative in
/// e^s), e^s by the short exponential of float16 softmax (5.5e-6), S of degree 8 ([`GN_S`],
/// 7e-7); gelu(x) = x - h for x >= 0, -h for x < 0, as [`gelu_erf_mid`]. About 27 operations
/// where that takes 45, relative error below 2^-16 (test `narrow_gelu_within_2_pow_minus_16`):
/// a 32nd of a float16 ulp, so a result stays within 0.53 ulp of the exact value.
#[inline(always)]
fn gelu_erf_narrow_mid(x: f32) -> f32 {
    let a = x.abs();
    let s = a * a.mul_add(-0.5, -GN_C);
    let e = exp_narrow_fast(s, 0.0);
    let u = a - 2.0;
    let mut sp = GN_S[8];
    for &c in GN_S[..8].iter().rev() {
        sp = sp.mul_add(u, c);
    }
    let h = a * sp * e;
    // -0.0 >= 0: -0.0 - 0.0 = -0.0 keeps the sign of a zero
    if x >= 0.0 {
        x - h
    } else {
        -h
    }
}

/// gelu(x) (erf form) for a 16-bit float type's values, computed in f32 to the precision their
/// results keep: [`gelu_erf_narrow_mid`] for |x| <= [`GELU_MID`], [`gelu_erf_f32`] beyond (and
/// for NaN and infinities); both computed and one selected, as in [`gelu_erf_f32`].
#[inline(always)]
pub fn gelu_erf_narrow(x: f32) -> f32 {
    by_range(x, GELU_MID, gelu_erf_narrow_mid, gelu_erf_f32)
}

/// `dst[i] = gelu_erf_narrow(src[i])`, bitwise: chunks whose elements are all within
/// [`GELU_MID`] compute only [`gelu_erf_narrow_mid`].
#[inline(always)]
pub fn gelu_erf_narrow_slice(src: &[f32], dst: &mut [f32]) {
    chunked_select(src, dst, GELU_MID, gelu_erf_narrow_mid, gelu_erf_narrow)
}

/// 2 sqrt(2/pi) and 2 sqrt(2/pi) 0.044715, each as an f32 pair hi + lo.
const GT_A: (f32, f32) = (1.595_769_2, -4.534_068e-8);
const GT_B: (f32, f32) = (7.135_481_4e-2, 2.398_832_5e-9);

/// gelu's tanh form, 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3), within 4 ulp over
/// the whole f32 range.
///
/// 0.5 (1 + tanh u) = 1 / (1 + e^(-w)), w = 2u: `x / (1 + e)` for x >= 0 and
/// `x e / (1 + e)` for x < 0 with e = e^(-|w|), so neither sign cancels. e^(-|w|) amplifies an
/// error in w by |w| (up to ~100 before the result underflows), so w = x (A + B x^2) is carried
/// as a pair of f32 (hi + lo, error-free products and sums with FMA); the power of two of e is
/// applied last in the negative tail so a subnormal result rounds once. |x| is clamped at 20,
/// where the result is x itself or -0. One division serves both signs.
#[inline(always)]
pub fn gelu_tanh_f32(x: f32) -> f32 {
    gelu_tanh_core::<false>(x)
}

/// Bound of the tanh form's fast path: for |x| <= 8, e^(-|w|) >= e^-50 and the result are
/// normal.
pub const GELU_TANH_MID: f32 = 8.0;

/// [`gelu_tanh_f32`] (`FAST` false), or for |x| <= [`GELU_TANH_MID`] the same formula with no
/// clamps and one normal power of two instead of two halves (`FAST` true): every product
/// with the power of two is exact there, so the bits are the same.
#[inline(always)]
fn gelu_tanh_core<const FAST: bool>(x: f32) -> f32 {
    let xc = if FAST { x } else { x.clamp(-20.0, 20.0) };
    let x2 = xc * xc;
    let x2l = xc.mul_add(xc, -x2);
    // B x^2 = bh + bl
    let bh = GT_B.0 * x2;
    let bl = GT_B.0.mul_add(x2, -bh) + GT_B.0.mul_add(x2l, GT_B.1 * x2);
    // A + B x^2 = qh + ql (two-sum)
    let qh = GT_A.0 + bh;
    let bb = qh - GT_A.0;
    let ql = ((GT_A.0 - (qh - bb)) + (bh - bb)) + (GT_A.1 + bl);
    // w = x (A + B x^2) = wh + wl
    let wh = xc * qh;
    let wl = xc.mul_add(qh, -wh) + xc * ql;
    let pos = wh >= 0.0;
    let (nh, nl) = if pos { (-wh, -wl) } else { (wh, wl) };
    let (pe, s1, s2) = if FAST {
        let (pe, ni) = exp_core(nh, nl);
        (pe, f32::from_bits((ni.wrapping_add(127) as u32) << 23), 1.0)
    } else {
        exp_split(nh, nl)
    };
    let d = 1.0 + pe * s1 * s2;
    let q = if pos { x } else { xc * pe } / d;
    if pos {
        q
    } else {
        q * s1 * s2
    }
}

/// `dst[i] = gelu_tanh_f32(src[i])`, bitwise: chunks whose elements are all within
/// [`GELU_TANH_MID`] take the fast form of [`gelu_tanh_core`].
#[inline(always)]
pub fn gelu_tanh_slice(src: &[f32], dst: &mut [f32]) {
    chunked_select(
        src,
        dst,
        GELU_TANH_MID,
        gelu_tanh_core::<true>,
        gelu_tanh_core::<false>,
    )
}

/// gelu's tanh form for |x| <= [`GELU_TANH_MID`] to the precision a 16-bit float result
/// keeps: [`gelu_tanh_f32`]'s formula (`x / (1 + e)` for w >= 0, `x e / (1 + e)` below, e =
/// e^(-|w|)) with w = x (A + B x^2) rounded as is (three roundings, amplified by |w| in e:
/// 8.8e-6 relative at |x| = 8, 3.4e-6 where a float16 result is not 0) and the short
/// exponential of float16 softmax (5.5e-6). About 16 operations and the division where the
/// float32 form takes 30; relative error below 2^-16 (test `narrow_gelu_within_2_pow_minus_16`).
#[inline(always)]
fn gelu_tanh_narrow_mid(x: f32) -> f32 {
    let w = x * GT_B.0.mul_add(x * x, GT_A.0);
    let e = exp_narrow_fast(-w.abs(), 0.0);
    let d = 1.0 + e;
    // -0.0: w = -0.0 >= 0, so -0.0 / 2 keeps the sign of a zero
    (if w >= 0.0 { x } else { x * e }) / d
}

/// gelu(x) (tanh form) for a 16-bit float type's values, as [`gelu_erf_narrow`]:
/// [`gelu_tanh_narrow_mid`] for |x| <= [`GELU_TANH_MID`], [`gelu_tanh_f32`] beyond.
#[inline(always)]
pub fn gelu_tanh_narrow(x: f32) -> f32 {
    by_range(x, GELU_TANH_MID, gelu_tanh_narrow_mid, gelu_tanh_f32)
}

/// `dst[i] = gelu_tanh_narrow(src[i])`, bitwise: chunks whose elements are all within
/// [`GELU_TANH_MID`] compute only [`gelu_tanh_narrow_mid`].
#[inline(always)]
pub fn gelu_tanh_narrow_slice(src: &[f32], dst: &mut [f32]) {
    chunked_select(
        src,
        dst,
        GELU_TANH_MID,
        gelu_tanh_narrow_mid,
        gelu_tanh_narrow,
    )
}

// the ulp helpers shared with the optimised sweeps in kernels/sweeps/tests/vmath_dense.rs
#[cfg(test)]
#[path = "../tests/util/ulp.rs"]
mod ulp;

#[cfg(test)]
mod tests {
    use super::ulp::*;
    use super::*;

    /// gelu's short forms for 16-bit float values ([`gelu_erf_narrow`], [`gelu_tanh_narrow`])
    /// against f64, at every finite float16 and bfloat16 value: relative error below 2^-16
    /// (a 32nd of a float16 ulp, 2^-10 of its binade) wherever the result is a normal float32
    /// far from underflow, and float32's bits beyond the short forms' ranges; the slices give
    /// the per-element bits. A wrong coefficient, a dropped term or a wrong sign is off by
    /// 2^-12 or more.
    #[test]
    fn narrow_gelu_within_2_pow_minus_16() {
        let values: Vec<f32> = (0..=u16::MAX)
            .flat_map(|b| {
                [
                    half::f16::from_bits(b).to_f32(),
                    half::bf16::from_bits(b).to_f32(),
                ]
            })
            .filter(|v| v.is_finite())
            .collect();
        type Forms = (
            fn(f32) -> f32,
            fn(&[f32], &mut [f32]),
            fn(f32) -> f32,
            fn(f64) -> f64,
            f32,
        );
        let forms: [(&str, Forms); 2] = [
            (
                "erf",
                (
                    gelu_erf_narrow,
                    gelu_erf_narrow_slice,
                    gelu_erf_f32,
                    gelu_erf_ref,
                    GELU_MID,
                ),
            ),
            (
                "tanh",
                (
                    gelu_tanh_narrow,
                    gelu_tanh_narrow_slice,
                    gelu_tanh_f32,
                    gelu_tanh_ref,
                    GELU_TANH_MID,
                ),
            ),
        ];
        for (name, (narrow, slice, wide, reference, bound)) in forms {
            let (mut worst, mut at) = (0f64, 0f32);
            for &x in &values {
                let got = narrow(x);
                if x.abs() > bound {
                    assert_eq!(got.to_bits(), wide(x).to_bits(), "gelu {name} ({x})");
                    continue;
                }
                let want = reference(x as f64);
                if want.abs() < f32::MIN_POSITIVE as f64 * 1024.0 {
                    // (results near float32's underflow, where its subnormals' absolute
                    // steps of 2^-149 take over; bfloat16 keeps 2^-133 there)
                    let err = (got as f64 - want).abs();
                    assert!(
                        err <= want.abs() * 2f64.powi(-16) + 2f64.powi(-147),
                        "gelu {name} ({x})"
                    );
                    continue;
                }
                let rel = (got as f64 / want - 1.0).abs();
                if rel > worst {
                    (worst, at) = (rel, x);
                }
            }
            assert!(worst < 2f64.powi(-16), "gelu {name}: {worst:e} at {at}");
            let mut d = vec![0f32; values.len()];
            slice(&values, &mut d);
            for (&x, &y) in values.iter().zip(&d) {
                assert_eq!(y.to_bits(), narrow(x).to_bits(), "gelu {name} slice ({x})");
            }
        }
    }

    #[test]
    fn narrow_exp_within_2_pow_minus_17() {
        // The short exponential of 16-bit float rows against f64 e^(x - m), x and m float16 or
        // bfloat16 values, wherever the result is normal: relative error below 5.5e-6 (the
        // polynomial) plus |x - m| 2^-24 (the rounding of x - m), so below 2^-17 where a
        // float16 softmax result can be nonzero (x - m > -17.4; float16's ulp is 2^-10 of its
        // binade, bfloat16's 2^-7); exp_diff_f32's bits below that. A wrong coefficient or a
        // dropped reduction term is off by 2^-12 or more.
        let (mut worst, mut at) = (0f64, (0f32, 0f32));
        let mut worst_f16 = 0f64;
        let halves = (0..=u16::MAX).flat_map(|b| {
            let h = half::f16::from_bits(b).to_f32();
            let bf = half::bf16::from_bits(b).to_f32();
            [h, bf]
        });
        let values: Vec<f32> = halves.filter(|v| v.is_finite()).collect();
        for m in [0.0f32, 1.0, -3.5, 17.25, 80.0, 1e4, -1e4, 65504.0, 3e38] {
            for &x in values.iter().filter(|&&x| x <= m) {
                let got = exp_diff_narrow(x, m);
                let d = x as f64 - m as f64;
                if d < EXP_FAST_MIN as f64 {
                    assert_eq!(got.to_bits(), exp_diff_f32(x, m).to_bits(), "e^({x} - {m})");
                    continue;
                }
                let rel = (got as f64 / d.exp() - 1.0).abs();
                if rel - d.abs() * 2f64.powi(-24) > worst {
                    (worst, at) = (rel - d.abs() * 2f64.powi(-24), (x, m));
                }
                if d > -17.4 {
                    worst_f16 = worst_f16.max(rel);
                }
            }
        }
        assert!(
            worst < 5.5e-6,
            "relative error {worst:e} + |x - m| 2^-24 at e^({} - {})",
            at.0,
            at.1
        );
        assert!(
            worst_f16 < 2f64.powi(-17),
            "{worst_f16:e} above x - m = -17.4"
        );
        assert_eq!(exp_diff_narrow(2.0, 2.0), 1.0);
        assert_eq!(exp_diff_narrow(f32::NEG_INFINITY, 2.0), 0.0);
    }

    // The ulp sweeps of the float32 functions (exp, e^(x - m), tanh, Phi, gelu's two forms
    // over the whole f32 range, and the dense one of gelu's fast range) are in
    // kernels/sweeps/tests/vmath_dense.rs, run optimised (here, unoptimised, they took 140 s).

    /// Inputs that mix the fast and the general paths within and across chunks: normal
    /// values, the bounds, tails, zeros, subnormals, infinities, NaN.
    fn mixed_inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..4096)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) % 20001) as f32 / 1000.0 - 10.0)
            .collect();
        let specials = [
            0.0,
            -0.0,
            GELU_MID,
            -GELU_MID,
            f32::from_bits(GELU_MID.to_bits() + 1),
            -f32::from_bits(GELU_MID.to_bits() + 1),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(1),
            -f32::from_bits(1),
            f32::MIN_POSITIVE,
            -14.2,
            30.0,
            -1e30,
        ];
        for (i, &x) in specials.iter().enumerate() {
            v[37 * i + 5] = x;
        }
        // whole chunks within the fast range too
        v.extend((0..256).map(|i| (i as f32 - 128.0) / 33.0));
        v
    }

    #[test]
    fn slice_and_chunk_fast_paths_give_the_elementwise_bits() {
        let xs = mixed_inputs();
        for len in [xs.len(), 1000, 17, 3] {
            let mut d = vec![0.0f32; len];
            crate::common::with_simd(
                #[inline(always)]
                || gelu_erf_slice(&xs[..len], &mut d),
            );
            for (o, &x) in d.iter().zip(&xs) {
                assert_eq!(o.to_bits(), gelu_erf_f32(x).to_bits(), "gelu erf({x})");
            }
            gelu_tanh_slice(&xs[..len], &mut d);
            for (o, &x) in d.iter().zip(&xs) {
                assert_eq!(o.to_bits(), gelu_tanh_f32(x).to_bits(), "gelu tanh({x})");
            }
        }
        // softmax's exp: finite x <= m, differences on both sides of the fast bound
        for m in [0.0f32, 3.5, 80.0, -1e4] {
            let xs: Vec<f32> = (0..4096)
                .map(|i| m - ((i as u32).wrapping_mul(2_654_435_761) % 120_001) as f32 / 1000.0)
                .collect();
            for c in xs.chunks_exact(CHUNK) {
                let c: &[f32; CHUNK] = c.try_into().unwrap();
                let mut d = [0.0f32; CHUNK];
                exp_diff_chunk(c, m, &mut d, false);
                for (o, &x) in d.iter().zip(c) {
                    assert_eq!(o.to_bits(), exp_diff_f32(x, m).to_bits(), "e^({x} - {m})");
                }
                exp_diff_chunk(c, m, &mut d, true);
                for (o, &x) in d.iter().zip(c) {
                    assert_eq!(
                        o.to_bits(),
                        exp_diff_narrow(x, m).to_bits(),
                        "e^({x} - {m})"
                    );
                }
            }
        }
    }

    #[test]
    fn explicit_simd_max_chunks_give_the_loops_maxima() {
        // `max_chunks` (AVX-512 and AVX2 where the CPU has them) against `if v > a { v } else
        // { a }` per lane: NaN skipped, -inf kept, every chunk count modulo its chains
        crate::common::at_each_level(|level| {
            for chunks in [0usize, 1, 2, 3, 4, 5, 9] {
                let mut xs: Vec<f32> = (0..chunks * CHUNK + 5)
                    .map(|i| {
                        ((i as u32).wrapping_mul(2_654_435_761) % 20_001) as f32 / 100.0 - 100.0
                    })
                    .collect();
                for (i, x) in xs.iter_mut().enumerate() {
                    match i % 23 {
                        3 => *x = f32::NAN,
                        7 => *x = f32::NEG_INFINITY,
                        _ => {}
                    }
                }
                let start = [-50.0f32; CHUNK];
                let mut acc = start;
                let done = max_chunks(&xs, &mut acc);
                let have_simd = crate::common::simd_level() != crate::common::SimdLevel::Baseline;
                assert_eq!(done, if have_simd { chunks } else { 0 }, "{level}");
                let mut want = start;
                for (i, &v) in xs[..done * CHUNK].iter().enumerate() {
                    let a = &mut want[i % CHUNK];
                    *a = if v > *a { v } else { *a };
                }
                assert_eq!(
                    acc.map(f32::to_bits),
                    want.map(f32::to_bits),
                    "{level}: {chunks} chunks"
                );
            }
        });
    }

    #[test]
    fn explicit_simd_exp_chunks_give_the_chunk_loops_bits_and_sums() {
        // `exp_diff_chunks` (AVX-512 or AVX2 here when the CPU has it) against the loop it replaces:
        // `exp_diff_chunk` per chunk, `acc[j] += d[j]` in order; it stops before the first
        // chunk off the fast path (a difference below EXP_FAST_MIN, or a NaN) and leaves the
        // rest of `d` alone.
        // (m with low bits set, so that many `x - m` round and the two-sum's correction counts)
        // Both formulas: float32's and the short one of 16-bit float rows (`narrow`).
        crate::common::at_each_level(|level| {
            for narrow in [false, true] {
                for (m, slow_at) in [
                    (0.0f32, None),
                    (3.4567, Some(5)),
                    (80.123, Some(0)),
                    (-9999.63, Some(9)),
                ] {
                    let mut xs: Vec<f32> = (0..16 * 12 + 7)
                        .map(|i| {
                            m - ((i as u32).wrapping_mul(2_654_435_761) % 85_001) as f32 / 1000.0
                        })
                        .collect();
                    if let Some(c) = slow_at {
                        xs[c * CHUNK + 3] = if c == 9 { f32::NAN } else { m - 86.5 };
                    }
                    let mut acc = [0.25f32; CHUNK];
                    let mut d = vec![-1.0f32; xs.len()];
                    let done = exp_diff_chunks(&xs, m, &mut d, &mut acc, narrow);
                    let have_simd =
                        crate::common::simd_level() >= crate::common::SimdLevel::Avx2Fma;
                    let whole = xs.len() / CHUNK;
                    let want_done = if have_simd {
                        slow_at.unwrap_or(whole)
                    } else {
                        0
                    };
                    assert_eq!(done, want_done, "{level}: m = {m}, narrow {narrow}");
                    let mut want = [0.25f32; CHUNK];
                    for (c, ch) in xs.chunks_exact(CHUNK).enumerate().take(done) {
                        let mut e = [0.0f32; CHUNK];
                        assert!(exp_diff_chunk(ch.try_into().unwrap(), m, &mut e, narrow));
                        for j in 0..CHUNK {
                            assert_eq!(
                                d[c * CHUNK + j].to_bits(),
                                e[j].to_bits(),
                                "{level}: e^({} - {m}), narrow {narrow}",
                                ch[j]
                            );
                            want[j] += e[j];
                        }
                    }
                    assert!(
                        d[done * CHUNK..].iter().all(|&v| v == -1.0),
                        "wrote past its chunks"
                    );
                    for j in 0..CHUNK {
                        assert_eq!(
                            acc[j].to_bits(),
                            want[j].to_bits(),
                            "partial sum {j}, m = {m}, narrow {narrow}"
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn same_bits_in_vector_loops() {
        // A loop (vectorised, AVX2 when available) gives the same bits as single calls.
        let xs: Vec<f32> = (0..4096).map(|i| (i as f32 - 2048.0) / 97.0).collect();
        let mut v = vec![0.0f32; xs.len()];
        crate::common::with_simd(|| {
            for (o, &x) in v.iter_mut().zip(&xs) {
                *o = exp_f32(x) + tanh_f32(x) + norm_cdf_f32(x) + gelu_erf_f32(x)
                    - gelu_tanh_f32(x)
                    + exp_diff_f32(x, 21.5);
            }
        });
        for (o, &x) in v.iter().zip(&xs) {
            let s = std::hint::black_box(exp_f32(std::hint::black_box(x)))
                + tanh_f32(std::hint::black_box(x))
                + norm_cdf_f32(std::hint::black_box(x))
                + gelu_erf_f32(std::hint::black_box(x))
                - gelu_tanh_f32(std::hint::black_box(x))
                + exp_diff_f32(std::hint::black_box(x), 21.5);
            assert_eq!(o.to_bits(), s.to_bits(), "x = {x}");
        }
    }

    #[test]
    fn divided_chunks_stored_as_half_types_round_as_from_c() {
        // `div_store_chunks` by 1 (q = v, no correction) stores every value as the scalar
        // conversion does: each f16 and bf16 value, the midpoints between them and their
        // neighbours (ties to even), overflow and subnormals. Finite values only: the division
        // runs on softmax's fast path, where every value is finite. (A NaN's sign through
        // `fnmadd` is not the same in every build: a debug build negates the product before
        // the add, so a NaN came out negative there and positive in a release build. The row
        // tests in norm.rs take NaNs through the stores.)
        let mut vs: Vec<f32> = Vec::new();
        for h in (0..=u16::MAX).step_by(7) {
            for f in [
                half::f16::from_bits(h).to_f32(),
                half::bf16::from_bits(h).to_f32(),
            ] {
                let b = f.to_bits();
                for d in [0u32, 1, 0x0FFF, 0x1000, 0x1001, 0x7FFF, 0x8000, 0x8001] {
                    vs.push(f32::from_bits(b.wrapping_add(d)));
                }
            }
        }
        vs.extend([65520.0, -65519.99, 1e-8, f32::MAX]);
        // (infinities would give NaN through the correction, inf - inf)
        vs.retain(|v| v.is_finite());
        vs.truncate(vs.len() / CHUNK * CHUNK);
        fn check<S: VecElem + crate::common::Scalar<C = f32>>(vs: &[f32], level: &str) {
            let mut out = vec![S::from_c(0.0); vs.len()];
            let done = div_store_chunks(vs, 1.0, 1.0, &mut out, false);
            let have_simd = crate::common::simd_level() != crate::common::SimdLevel::Baseline;
            assert_eq!(
                done,
                if have_simd { vs.len() / CHUNK } else { 0 },
                "{level}"
            );
            for (v, o) in vs.iter().zip(&out).take(done * CHUNK) {
                assert_eq!(
                    o.to_c().to_bits(),
                    S::from_c(*v).to_c().to_bits(),
                    "{level}: {:#010x}",
                    v.to_bits()
                );
            }
        }
        crate::common::at_each_level(|level| {
            check::<half::f16>(&vs, level);
            check::<half::bf16>(&vs, level);
        });
    }

    #[test]
    fn sums_of_squares_of_half_types_give_the_loops_partials() {
        // `sum_sq_chunks` on f16 and bf16 rows against `acc[i % CHUNK] += v * v` (the product
        // rounded, then the sum) over the converted values, bit for bit: the rows' rms_norm
        // outputs, rounded to a half type, would hide a last-bit difference in these partials.
        // (A half value's square is exact in f32, so a fused multiply-add would give the same
        // bits here: the order of the sums is what this checks.)
        fn check<S: VecElem + crate::common::Scalar<C = f32>>(level: &str) {
            for chunks in [0usize, 1, 5, 64] {
                let xs: Vec<S> = (0..chunks * CHUNK + 3)
                    .map(|i| {
                        let v = ((i as u32).wrapping_mul(2_654_435_761) % 20_001) as f32;
                        S::from_c(v / 97.0 - 103.0)
                    })
                    .collect();
                let mut acc = [0.3f32; CHUNK];
                let done = sum_sq_chunks(&xs, &mut acc);
                let have_simd = crate::common::simd_level() != crate::common::SimdLevel::Baseline;
                assert_eq!(done, if have_simd { chunks } else { 0 }, "{level}");
                let mut want = [0.3f32; CHUNK];
                for (i, v) in xs[..done * CHUNK].iter().enumerate() {
                    let v = v.to_c();
                    want[i % CHUNK] += v * v;
                }
                assert_eq!(
                    acc.map(f32::to_bits),
                    want.map(f32::to_bits),
                    "{level}: {chunks} chunks"
                );
            }
        }
        crate::common::at_each_level(|level| {
            check::<half::f16>(level);
            check::<half::bf16>(level);
        });
    }
}
