//! Conversions between the half types (f16, bf16) and f32, one element or a block at a time.
//!
//! Exact in the load direction (every f16/bf16 is an f32; a signalling NaN comes back quiet,
//! payload kept) and round-to-nearest-even in the store direction (overflow to infinity, NaN
//! stays NaN: quiet, sign and top payload bits kept). These are the `half` crate's results bit
//! for bit (and x86 F16C's), which the tests check exhaustively.
//!
//! Why not `half`'s slice conversions: they test for F16C on every call and convert in chunks
//! through non-inlined functions, and bf16 goes element by element through branches that do not
//! vectorise; its scalar `to_f32`/`from_f32` test for F16C per element. Here:
//! - f16 blocks use F16C (`vcvtph2ps` / `vcvtps2ph` with the rounding mode in the instruction,
//!   so MXCSR's rounding mode does not matter) when the CPU has it and [`crate::common::with_simd`]
//!   runs above its baseline; otherwise the portable code below, which LLVM vectorises.
//! - bf16 is integer shifts and a select, plain code that vectorises wherever it is inlined
//!   (inside `with_simd` it is compiled for AVX2).
//! - The scalar functions are branch-free integer code (plus one exact int-to-float conversion
//!   for f16 subnormals), cheap enough per element in strided paths and block tails.
//!
//! None of this depends on the calling thread's flush-to-zero / denormals-are-zero mode: the
//! portable code only does integer work and one multiplication of normal numbers by a power of
//! two with a normal result; F16C ignores MXCSR.DAZ for half inputs and FTZ for half results,
//! and an f32 subnormal stored as f16 rounds to a signed zero either way.

/// f16 bits to f32, exact (a signalling NaN is made quiet, as F16C and `half` do).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7FFF;
    // Normal: rebias the exponent (15 -> 127) and widen the mantissa.
    let norm = (em << 13) + 0x3800_0000;
    // Subnormal (and zero): mantissa * 2^-24; the conversion is exact and the product is a
    // normal f32 (or zero), so FTZ/DAZ cannot change it.
    let sub = ((em as i32) as f32 * f32::from_bits(0x3380_0000)).to_bits();
    // Infinity / NaN: all exponent bits set; a NaN gets the quiet bit.
    let quiet = if em > 0x7C00 { 0x0040_0000 } else { 0 };
    let inf_nan = (em << 13) | 0x7F80_0000 | quiet;
    let mag = if em >= 0x7C00 {
        inf_nan
    } else if em < 0x0400 {
        sub
    } else {
        norm
    };
    f32::from_bits(sign | mag)
}

/// f32 to f16 bits, round to nearest even; overflow gives infinity, a NaN a quiet NaN with the
/// top 9 payload bits kept.
#[inline(always)]
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = (x >> 16) & 0x8000;
    let a = x & 0x7FFF_FFFF;
    // Normal result (|f| >= 2^-14): rebias, then round away the low 13 bits to nearest even
    // (adding 0xFFF plus the kept lowest bit carries exactly when the rest is above half, or
    // exactly half with an odd kept part). A carry out of the mantissa bumps the exponent, up
    // to infinity; anything larger clamps to infinity.
    let b = a.wrapping_sub(0x3800_0000);
    let norm = ((b.wrapping_add(0xFFF + ((b >> 13) & 1))) >> 13).min(0x7C00);
    // Subnormal result (|f| < 2^-14): the significand with its implicit bit, shifted right by
    // 126 - exponent (14 or more) with the same rounding; shifts of 25 or more give 0 (an f32
    // subnormal, exponent 0, lands here too and rounds to 0 whatever its mantissa).
    let e = a >> 23;
    let m = (a & 0x007F_FFFF) | 0x0080_0000;
    let s = 126u32.saturating_sub(e).clamp(14, 31);
    let sub = (m + ((1u32 << (s - 1)) - 1) + ((m >> s) & 1)) >> s;
    let nan = 0x7E00 | ((a & 0x007F_FFFF) >> 13);
    let mag = if a > 0x7F80_0000 {
        nan
    } else if a < 0x3880_0000 {
        sub
    } else {
        norm
    };
    (sign | mag) as u16
}

/// bf16 bits to f32, exact (a signalling NaN is made quiet, as `half` does).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    let quiet = if h & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
    f32::from_bits(((h | quiet) as u32) << 16)
}

/// f32 to bf16 bits, round to nearest even; overflow gives infinity, a NaN a quiet NaN with the
/// top payload bits kept.
#[inline(always)]
pub fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    let nan = (x >> 16) | 0x0040;
    // Round the low 16 bits away to nearest even; the largest non-NaN pattern (-inf,
    // 0xFF80_0000) cannot overflow the addition.
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    (if x & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

/// Whether f16 blocks go through F16C: the CPU has it (std caches the check) and
/// [`crate::common::with_simd`] is not held at its baseline level (tests force that level to
/// run the portable code).
#[inline(always)]
fn use_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("f16c")
            && crate::common::simd_level() != crate::common::SimdLevel::Baseline
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether f16 blocks go through the 512-bit forms of the same conversions (16 elements an
/// instruction, where F16C's take 8): [`crate::common::with_simd`] runs at its AVX-512 level
/// (so the CPU has AVX-512F) and the CPU has F16C.
#[inline(always)]
fn use_f16c_512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::common::simd_level() == crate::common::SimdLevel::Avx512
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dst[i] = f16_to_f32(src[i])` over the common length.
#[inline(always)]
pub fn f16_load(src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if use_f16c_512() {
        // SAFETY: `use_f16c_512` checked at run time that the CPU has AVX-512F and F16C.
        unsafe { x86::f16_load512(src, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if use_f16c() {
        // SAFETY: `use_f16c` checked at run time that the CPU has F16C (and AVX, which
        // `is_x86_feature_detected!("f16c")` implies: F16C instructions are VEX-encoded).
        unsafe { x86::f16_load(src, dst) };
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(s);
    }
}

/// `dst[i] = f32_to_f16(src[i])` over the common length.
#[inline(always)]
pub fn f16_store(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if use_f16c_512() {
        // SAFETY: as in `f16_load`.
        unsafe { x86::f16_store512(src, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if use_f16c() {
        // SAFETY: as in `f16_load`.
        unsafe { x86::f16_store(src, dst) };
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(s);
    }
}

/// `dst[i] = bf16_to_f32(src[i])` over the common length.
#[inline(always)]
pub fn bf16_load(src: &[u16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(s);
    }
}

/// `dst[i] = f32_to_bf16(src[i])` over the common length.
#[inline(always)]
pub fn bf16_store(src: &[f32], dst: &mut [u16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_bf16(s);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    // The conversions themselves (`vcvtph2ps`, and `vcvtps2ph` rounding to nearest even) are
    // `VecElem`'s, which the softmax and rms_norm loops use too; these are the block loops.
    use crate::vmath::VecElem;
    use half::f16;

    /// [`f16_load`] with the AVX-512 form of `vcvtph2ps` (16 elements an instruction, the same
    /// conversion), the rest through it.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx,f16c")]
    pub unsafe fn f16_load512(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        // (f16 is a transparent u16)
        let (s, d) = (src.as_ptr() as *const f16, dst.as_mut_ptr());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n`, so elements `i..i + 16` are in both slices; unaligned
            // loads and stores; the CPU has AVX-512F (caller).
            unsafe { f32::store16(d.add(i), f16::load16(s.add(i))) };
            i += 16;
        }
        // SAFETY: F16C (caller); the slices' rest
        unsafe { f16_load(&src[i..n], &mut dst[i..n]) }
    }

    /// [`f16_store`] with the AVX-512 form of `vcvtps2ph` (round to nearest even, set in the
    /// instruction), the rest through it.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx,f16c")]
    pub unsafe fn f16_store512(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr() as *mut f16);
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: as in `f16_load512`.
            unsafe { f16::store16(d.add(i), f32::load16(s.add(i))) };
            i += 16;
        }
        // SAFETY: F16C (caller); the slices' rest
        unsafe { f16_store(&src[i..n], &mut dst[i..n]) }
    }

    /// F16C block load, 8 elements a step, the tail through the scalar code.
    ///
    /// # Safety
    /// The CPU must support F16C (and so AVX).
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn f16_load(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let (s, d) = (src.as_ptr() as *const f16, dst.as_mut_ptr());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n`, so elements `i..i + 8` are in both slices; the loads and
            // stores are unaligned ones; the CPU has F16C (caller).
            unsafe { f32::store8(d.add(i), f16::load8(s.add(i))) };
            i += 8;
        }
        for j in i..n {
            dst[j] = super::f16_to_f32(src[j]);
        }
    }

    /// F16C block store (round to nearest even, set in the instruction), 8 elements a step,
    /// the tail through the scalar code.
    ///
    /// # Safety
    /// The CPU must support F16C (and so AVX).
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn f16_store(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr() as *mut f16);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: as in `f16_load`.
            unsafe { f16::store8(d.add(i), f32::load8(s.add(i))) };
            i += 8;
        }
        for j in i..n {
            dst[j] = super::f32_to_f16(src[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::{at_each_level, with_simd};
    use half::{bf16, f16};

    /// Every f32 pattern that matters for rounding to a 16-bit format whose values are the
    /// f32 patterns `h << shift` (bf16) or near them: each value of the narrow format and its
    /// neighbours, the midpoints between consecutive values and their neighbours, plus a dense
    /// stride through all 2^32 patterns and the special values.
    fn store_cases() -> Vec<f32> {
        let mut v: Vec<u32> = Vec::new();
        for h in 0..=u16::MAX {
            // Around every f16 value and midpoint, as f32 bits.
            let f = f16::from_bits(h).to_f32().to_bits();
            let g = f16::from_bits(h.wrapping_add(1)).to_f32().to_bits();
            let mid = ((f as u64 + g as u64) / 2) as u32;
            for d in [-2i64, -1, 0, 1, 2] {
                v.push((f as i64 + d) as u32);
                v.push((mid as i64 + d) as u32);
            }
            // Around every bf16 value and midpoint.
            let b = (h as u32) << 16;
            for low in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000] {
                v.push(b | low);
            }
        }
        let mut x = 0u32;
        loop {
            v.push(x);
            match x.checked_add(4093) {
                Some(y) => x = y,
                None => break,
            }
        }
        for f in [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            f32::EPSILON,
            65504.0,
            65519.99,
            65520.0,
            65536.0,
            5.96e-8,
            2.98e-8,
            2.9802322e-8,
        ] {
            v.push(f.to_bits());
        }
        v.extend([
            0x7F80_0001,
            0xFF80_0001,
            0x7FBF_FFFF,
            0x7FC0_0000,
            0x0000_0001,
            0x807F_FFFF,
        ]);
        v.into_iter().map(f32::from_bits).collect()
    }

    #[test]
    fn scalar_load_matches_half_exhaustively() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32().to_bits();
            assert_eq!(f16_to_f32(h).to_bits(), want, "f16 {h:#06x}");
            // `half`'s software path too (the line above may be F16C).
            assert_eq!(f16::from_bits(h).to_f32_const().to_bits(), want);
            let want = bf16::from_bits(h).to_f32().to_bits();
            assert_eq!(bf16_to_f32(h).to_bits(), want, "bf16 {h:#06x}");
        }
    }

    #[test]
    fn scalar_store_matches_half() {
        for f in store_cases() {
            let want = f16::from_f32(f).to_bits();
            assert_eq!(f32_to_f16(f), want, "f16 from {:#010x}", f.to_bits());
            assert_eq!(f16::from_f32_const(f).to_bits(), want);
            let want = bf16::from_f32(f).to_bits();
            assert_eq!(f32_to_bf16(f), want, "bf16 from {:#010x}", f.to_bits());
        }
    }

    /// The block functions, inside `with_simd` (where the kernels call them) and outside, at
    /// every level, on every length up to a few vectors and at every start offset (unaligned
    /// loads, tails).
    #[test]
    fn blocks_match_half_at_every_level() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let cases = store_cases();
        at_each_level(|level| {
            for inside in [false, true] {
                let run = |f: &mut dyn FnMut()| {
                    if inside {
                        with_simd(f)
                    } else {
                        f()
                    }
                };
                let mut out = vec![0f32; all.len()];
                run(&mut || f16_load(&all, &mut out));
                for (&h, o) in all.iter().zip(&out) {
                    let want = f16::from_bits(h).to_f32().to_bits();
                    assert_eq!(o.to_bits(), want, "{level} f16 load {h:#06x}");
                }
                run(&mut || bf16_load(&all, &mut out));
                for (&h, o) in all.iter().zip(&out) {
                    let want = bf16::from_bits(h).to_f32().to_bits();
                    assert_eq!(o.to_bits(), want, "{level} bf16 load {h:#06x}");
                }
                let mut hs = vec![0u16; cases.len()];
                run(&mut || f16_store(&cases, &mut hs));
                for (&f, &h) in cases.iter().zip(&hs) {
                    let want = f16::from_f32(f).to_bits();
                    assert_eq!(h, want, "{level} f16 store {:#010x}", f.to_bits());
                }
                run(&mut || bf16_store(&cases, &mut hs));
                for (&f, &h) in cases.iter().zip(&hs) {
                    let want = bf16::from_f32(f).to_bits();
                    assert_eq!(h, want, "{level} bf16 store {:#010x}", f.to_bits());
                }
                // Short and unaligned slices: lengths 0..=40 from offsets 0..=9.
                let src: Vec<u16> = (0..64u16)
                    .map(|i| i.wrapping_mul(0x1357) ^ 0x3C00)
                    .collect();
                let fsrc: Vec<f32> = src.iter().map(|&h| f16_to_f32(h) * 1.0001).collect();
                for off in 0..10 {
                    for len in 0..=40 {
                        let mut o = vec![-1f32; len];
                        let mut h = vec![0u16; len];
                        run(&mut || f16_load(&src[off..off + len], &mut o));
                        for j in 0..len {
                            assert_eq!(
                                o[j].to_bits(),
                                f16::from_bits(src[off + j]).to_f32().to_bits()
                            );
                        }
                        run(&mut || f16_store(&fsrc[off..off + len], &mut h));
                        for j in 0..len {
                            assert_eq!(h[j], f16::from_f32(fsrc[off + j]).to_bits());
                        }
                        run(&mut || bf16_store(&fsrc[off..off + len], &mut h));
                        for j in 0..len {
                            assert_eq!(h[j], bf16::from_f32(fsrc[off + j]).to_bits());
                        }
                    }
                }
            }
        });
    }
}
