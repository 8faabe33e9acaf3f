//! conv2d f32 vectorized along output channels: each tile is a panel of output channels (16:
//! two AVX2 vectors; 32 or 64: two or four AVX-512 vectors, [`panel_width`]) at 6 output
//! positions (input values broadcast from a zero-padded copy of the rows they read), 12 (or
//! 24) accumulators, in hand-scheduled assembly (the same loop in intrinsics had LLVM share broadcasts across taps
//! and spill accumulators). The
//! six positions are any six: each has its own slab pointer, so a tile runs on across the end
//! of an output row and every lane computes an output (the position-vectorized tiles fill
//! only 13 of 16 lanes on rows of 13, 27 of 32 on rows of 27). Partial sums live in a
//! channel-minor scratch `[position][panel width]` for a task's block and panel; they are written to
//! the NCHW output once, after the last channel pass. Each output is the same chain of fused
//! multiply-adds as in every other f32 path (bias, then kernel rows `(c, ki, kj)` in order), so
//! the bits do not change.

use super::{simd_level, split_work, Geom, OutPtr, SimdLevel, SLAB_FLOATS};
use crate::common::{
    copy_short, has_avx2_fma, has_avx512, prefetch_l2, prefetch_write, with_scratch,
};
use crate::elementwise::split_leading_relu;
use kernel_core::{parallel_for, Epilogue};

/// Output channels per panel on AVX2 (two AVX2 vectors).
const CV: usize = 16;
/// Output channels per panel on AVX-512 (two AVX-512 vectors).
const CV512: usize = 32;
/// Output channels per panel on AVX-512 for layers with at least this many per group (four
/// AVX-512 vectors: 24 accumulators, each broadcast input value used four times).
const CV512X4: usize = 64;
/// Output positions per tile.
const CP: usize = 6;

/// Kernel rows (`cg * kh * kw`) below which a layer stays on the im2col tiles: with few taps
/// per output, this path's fixed work per position (its scratch row, the transpose into the
/// output) outweighs the multiply-adds, while an im2col copy of few rows is cheap. One thread,
/// prepacked weights, AVX-512 (AVX2): a 3 -> 64 3x3 stride-2 stem (27 rows) 0.86-0.92 ms here
/// against 0.48-0.58 (0.89 against 0.65) on the tiles; 8 -> 64 3x3 (72) 1.26 against 0.99;
/// 11 -> 64 3x3 (99) 0.34 against 0.39 and 3 -> 64 7x7 (147) 1.87 against 2.1-2.2 here.
const MIN_ROWS: usize = 96;

/// Whether [`cv_f32`] computes a layer whose kernel has `kernel_taps` (`kh * kw`) taps over
/// `cg` input channels a group, not depthwise: a kernel larger than 1x1 with at least
/// [`MIN_ROWS`] kernel rows, on a CPU with AVX2 and FMA. (1x1 layers stay on the im2col tiles:
/// read from channel planes, this path's pass of 256 channels touched 256 lines of input beside
/// its weights and lost; from a position-major copy it matched the tiles on large layers and
/// lost on small ones; docs/benchmarks.md.) `POLYOP_CONV_CV=0` turns the path off, to measure it
/// against the tiles; the bits are the same either way.
pub(super) fn cv_applies(kernel_taps: usize, cg: usize) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    kernel_taps > 1
        && cg * kernel_taps >= MIN_ROWS
        && matches!(simd_level(), SimdLevel::Avx2Fma | SimdLevel::Avx512)
        && !*OFF.get_or_init(|| std::env::var("POLYOP_CONV_CV").is_ok_and(|v| v == "0"))
}

/// Output channels per panel for a layer of `og` output channels per group, at the level the
/// CPU runs now ([`simd_level`]): two vectors of its widest registers, or on AVX-512 four
/// where the panels stay mostly full (`og` a multiple of 64, or leaving more than 32 in the
/// last: DenseNet's 32-channel layers would waste half of every tile). The packed weights and
/// the tile follow it, so a weight packed once (`super::PackedWeight`) records the width it was
/// packed for.
pub(super) fn panel_width(og: usize) -> usize {
    if simd_level() != SimdLevel::Avx512 {
        CV
    } else if og >= CV512X4 && (og.is_multiple_of(CV512X4) || og % CV512X4 > CV512) {
        CV512X4
    } else {
        CV512
    }
}

/// Panics unless panels of `cw` channels are a width this CPU has a tile for ([`CV`], or on
/// AVX-512 CPUs [`CV512`] and [`CV512X4`]): the packing and the kernel take the width from the
/// caller (`super::F32Path`), so it is checked where it is used.
fn assert_runnable(cw: usize) {
    assert!(
        cw == CV || ((cw == CV512 || cw == CV512X4) && has_avx512()),
        "a panel width this CPU cannot run"
    );
}

/// Weight taps per channel pass for panels of `cw` channels: a pass's panel weights (`cw`
/// floats a tap) stay at 16 KiB, in L1 beside the input values the tiles read.
fn pass_taps(cw: usize) -> usize {
    PASS_TAPS * CV / cw
}

/// `out[k] = column k of the 8 x 8 matrix whose rows are `rows`.
///
/// # Safety
/// The CPU supports AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transpose8(rows: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let [r0, r1, r2, r3, r4, r5, r6, r7] = rows;
    let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
    let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
    let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
    let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// The weights of output channels `oc0..oc0 + ocn` (`ocn <= cw`, the panel width: 16, 32 or 64),
/// input channels `c0..c0 + ncc` of their group, as one panel `[c][ki * kw + kj][cw]` in `dst`
/// (channels past `ocn` zero): the layout the tiles read. `kk`: the kernel's taps (`kh * kw`);
/// `ckk`: a weight row's length (`C/g * kk`).
///
/// # Safety
/// The CPU supports AVX2; `oc0 + ocn <= o`, `c0 + ncc <= cg`, `dst` holds `kk * ncc * cw`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pack_panel(
    (kk, ckk, cw): (usize, usize, usize),
    wc: &[f32],
    oc0: usize,
    ocn: usize,
    c0: usize,
    ncc: usize,
    dst: &mut [f32],
) {
    use std::arch::x86_64::*;
    let len = ncc * kk;
    let dst = &mut dst[..len * cw];
    let src = |i: usize| &wc[(oc0 + i) * ckk + c0 * kk..][..len];
    let whole = len / 8 * 8;
    for eighth in 0..cw / 8 {
        let i0 = eighth * 8;
        for l0 in (0..whole).step_by(8) {
            let rows = std::array::from_fn(|r| {
                if i0 + r < ocn {
                    // SAFETY: 8 floats from l0 + 8 <= len of the row's `len`.
                    unsafe { _mm256_loadu_ps(src(i0 + r)[l0..].as_ptr()) }
                } else {
                    _mm256_setzero_ps()
                }
            });
            for (k, v) in transpose8(rows).into_iter().enumerate() {
                // SAFETY: dst[(l0 + k) * cw + i0..][..8], inside (l0 + k < len).
                unsafe { _mm256_storeu_ps(dst[(l0 + k) * cw + i0..][..8].as_mut_ptr(), v) };
            }
        }
    }
    for l in whole..len {
        for i in 0..cw {
            dst[l * cw + i] = if i < ocn { src(i)[l] } else { 0.0 };
        }
    }
}

/// A layer's whole weight (`wc`, `[O, cg, kh, kw]` in `groups` groups of `og` output channels,
/// `kk = kh * kw`) as [`cv_f32`] reads it with panels of `cw` channels, into `dst`:
/// `[group][panel of cw][cg * kk][cw]`,
/// each panel the one [`pack_panel`] makes for all its input channels (a pass over channels
/// `c0..` starts at tap `c0 * kk` of it). Packed once for a caller that knows the weight
/// constant (`super::PackedWeight`).
pub(super) fn pack_weight(
    cw: usize,
    wc: &[f32],
    groups: usize,
    og: usize,
    cg: usize,
    kk: usize,
    dst: &mut [f32],
) {
    assert_runnable(cw);
    let (ckk, panels) = (cg * kk, og.div_ceil(cw));
    assert_eq!(wc.len(), groups * og * ckk, "conv2d weight length");
    assert_eq!(
        dst.len(),
        groups * panels * ckk * cw,
        "packed weight length"
    );
    assert!(has_avx2_fma(), "packing for this path needs AVX2");
    for (q, panel) in dst.chunks_exact_mut(ckk * cw).enumerate() {
        let (grp, pi) = (q / panels, q % panels);
        // SAFETY: AVX2 (checked above); output channels grp * og + pi * cw.. (+ at most cw,
        // within the group's og) < o, input channels 0..cg, and `panel` holds kk * cg * cw.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            pack_panel(
                (kk, ckk, cw),
                wc,
                grp * og + pi * cw,
                cw.min(og - pi * cw),
                0,
                cg,
                panel,
            )
        };
    }
}

/// Positions `0..npos` of the channel-minor `scratch` (`[position][cw]`), channels `i < ocn
/// <= cw`, to `out + i * ld` (row `i`: `npos` floats); with `relu`, relu applied on the way
/// (`max(0, v)`, 0 first: the relu epilogue's bits, NaN and -0 kept).
///
/// # Safety
/// The CPU supports AVX2; `scratch` holds `npos` rounded up to 8 rows; rows `i < ocn` of
/// `out` are valid for `npos` writes that no other thread touches.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn unpack_out(
    scratch: &[f32],
    cw: usize,
    npos: usize,
    ocn: usize,
    out: *mut f32,
    ld: usize,
    relu: bool,
) {
    use std::arch::x86_64::*;
    let zero = _mm256_setzero_ps();
    for q0 in (0..npos).step_by(8) {
        let n = 8.min(npos - q0);
        // lanes j < n of a row's last, partial 8 (a masked store: a copy through memory was a
        // `memcpy` call per channel, a twentieth of a 55-wide layer's time)
        let keep = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        for half in 0..ocn.div_ceil(8) {
            let i0 = half * 8;
            let rows = std::array::from_fn(|r| {
                // SAFETY: row q0 + r < npos rounded up to 8, 8 floats from i0 + 8 <= cw.
                unsafe { _mm256_loadu_ps(scratch[(q0 + r) * cw + i0..][..8].as_ptr()) }
            });
            let mut cols = transpose8(rows);
            if relu {
                cols = cols.map(|v| _mm256_max_ps(zero, v));
            }
            for (k, v) in cols.iter().enumerate().take(ocn - i0) {
                // SAFETY: row i0 + k < ocn of out, positions q0..q0 + n <= npos (caller).
                unsafe {
                    let dst = out.add((i0 + k) * ld + q0);
                    if n == 8 {
                        _mm256_storeu_ps(dst, *v);
                    } else {
                        // (masked-off lanes are neither written nor faulted on)
                        _mm256_maskstore_ps(dst, keep, *v);
                    }
                }
            }
        }
    }
}

/// `out[k]` = column k of the 16 x 16 matrix whose rows are `rows` (64 shuffles: pairs of
/// rows interleaved, then 4 x 4 blocks within each 128-bit lane, then the lanes twice).
///
/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose16(rows: [std::arch::x86_64::__m512; 16]) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // a[2i], a[2i + 1]: rows 2i and 2i + 1 interleaved, per 128-bit lane (elements 0, 1 / 2, 3)
    let a: [__m512; 16] = std::array::from_fn(|j| {
        let (x, y) = (rows[j & !1], rows[j | 1]);
        if j % 2 == 0 {
            _mm512_unpacklo_ps(x, y)
        } else {
            _mm512_unpackhi_ps(x, y)
        }
    });
    // b[4i + k]: in each 128-bit lane L, rows 4i..4i + 4 of column 4L + k
    let b: [__m512; 16] = std::array::from_fn(|j| {
        let (i, k) = (j / 4, j % 4);
        let (x, y) = (a[4 * i + k / 2], a[4 * i + 2 + k / 2]);
        if k % 2 == 0 {
            _mm512_shuffle_ps::<0x44>(x, y)
        } else {
            _mm512_shuffle_ps::<0xEE>(x, y)
        }
    });
    // c[k] / c[4 + k]: lanes (0, 2) / (1, 3) of b[k] and b[4 + k]; d likewise of b[8 + k] and
    // b[12 + k]
    let c: [__m512; 8] = std::array::from_fn(|j| {
        let k = j % 4;
        if j < 4 {
            _mm512_shuffle_f32x4::<0x88>(b[k], b[4 + k])
        } else {
            _mm512_shuffle_f32x4::<0xDD>(b[k], b[4 + k])
        }
    });
    let d: [__m512; 8] = std::array::from_fn(|j| {
        let k = j % 4;
        if j < 4 {
            _mm512_shuffle_f32x4::<0x88>(b[8 + k], b[12 + k])
        } else {
            _mm512_shuffle_f32x4::<0xDD>(b[8 + k], b[12 + k])
        }
    });
    // column 4L + k: lane L of b[k], b[4 + k], b[8 + k], b[12 + k]
    std::array::from_fn(|col| {
        let (l, k) = (col / 4, col % 4);
        let (x, y) = (c[4 * (l % 2) + k], d[4 * (l % 2) + k]);
        if l < 2 {
            _mm512_shuffle_f32x4::<0x88>(x, y)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(x, y)
        }
    })
}

/// [`unpack_out`] in AVX-512, 16 positions x 16 channels a transpose, each channel's 16
/// positions one (masked) store: one thread, a 3 -> 64 7x7 stride-2 stem spent a sixth of
/// its time in the AVX2 unpacking (8 x 8 blocks, a store of half a line each).
///
/// # Safety
/// The CPU supports AVX-512F; `scratch` holds `npos` rounded up to 16 rows; `cw` is a multiple
/// of 16; rows `i < ocn <= cw` of `out` are valid for `npos` writes that no other thread
/// touches.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn unpack_out512(
    scratch: &[f32],
    cw: usize,
    npos: usize,
    ocn: usize,
    out: *mut f32,
    ld: usize,
    relu: bool,
) {
    use std::arch::x86_64::*;
    let zero = _mm512_setzero_ps();
    for i0 in (0..ocn).step_by(16) {
        for q0 in (0..npos).step_by(16) {
            // lanes j < n of a row's last, partial 16 (masked-off lanes are neither written
            // nor faulted on)
            let keep: __mmask16 = (((1u32 << 16.min(npos - q0)) - 1) & 0xFFFF) as __mmask16;
            let rows = std::array::from_fn(|r| {
                // SAFETY: row q0 + r < npos rounded up to 16, 16 floats from i0 + 16 <= cw.
                unsafe { _mm512_loadu_ps(scratch[(q0 + r) * cw + i0..][..16].as_ptr()) }
            });
            let cols = transpose16(rows);
            for (k, &v) in cols.iter().enumerate().take(ocn - i0) {
                let v = if relu { _mm512_max_ps(zero, v) } else { v };
                // SAFETY: row i0 + k < ocn of out, positions q0..q0 + 16 masked to npos
                // (caller).
                unsafe { _mm512_mask_storeu_ps(out.add((i0 + k) * ld + q0), keep, v) };
            }
        }
    }
}

/// Rows `0..nrows` of the channel-minor scratch (`[position][cw]`, `cw` a multiple of 16) set
/// to the panel's biases `bias` (`ocn <= cw` of them, the rest 0), in AVX-512 stores (the
/// copy per position, compiled outside any SIMD level, was 16-byte moves: most of a 7x7
/// stem's time outside the tiles and the unpacking).
///
/// # Safety
/// The CPU supports AVX-512F; `scratch` holds `nrows * cw` floats, `bias` `ocn`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fill_bias512(scratch: &mut [f32], cw: usize, nrows: usize, bias: &[f32], ocn: usize) {
    use std::arch::x86_64::*;
    let mut v = [_mm512_setzero_ps(); CV512X4 / 16];
    for (i, v) in v.iter_mut().enumerate().take(cw / 16) {
        let n = ocn.saturating_sub(16 * i).min(16);
        let m = (((1u32 << n) - 1) & 0xFFFF) as __mmask16;
        // SAFETY: lanes below n read bias[16 i..16 i + n] (< ocn); the rest are masked off.
        *v = unsafe { _mm512_maskz_loadu_ps(m, bias.as_ptr().wrapping_add(16 * i)) };
    }
    for row in scratch[..nrows * cw].chunks_exact_mut(cw) {
        for (i, &v) in v.iter().enumerate().take(cw / 16) {
            // SAFETY: 16 floats at 16 i of a row of cw.
            unsafe { _mm512_storeu_ps(row[16 * i..][..16].as_mut_ptr(), v) };
        }
    }
}

/// One tap of a two-vector tile in registers `$r` (`"ymm"` or `"zmm"`): the tap's offset
/// from `tab + $t`, the two weight vectors at `w + $w0` and `w + $w1` (names of the tile's
/// offset operands), then each position's value broadcast and multiplied into its two
/// accumulators (`$r`0..11).
macro_rules! two_vector_tap {
    ($r:literal, $t:literal, $w0:literal, $w1:literal) => {
        concat!(
            "mov {off}, [{tab} + ",
            $t,
            "]\n",
            "vmovups ",
            $r,
            "12, [{w} + ",
            $w0,
            "]\n",
            "vmovups ",
            $r,
            "13, [{w} + ",
            $w1,
            "]\n",
            "vbroadcastss ",
            $r,
            "14, dword ptr [{p0} + {off}]\n",
            "vfmadd231ps ",
            $r,
            "0, ",
            $r,
            "12, ",
            $r,
            "14\n",
            "vfmadd231ps ",
            $r,
            "1, ",
            $r,
            "13, ",
            $r,
            "14\n",
            "vbroadcastss ",
            $r,
            "15, dword ptr [{p1} + {off}]\n",
            "vfmadd231ps ",
            $r,
            "2, ",
            $r,
            "12, ",
            $r,
            "15\n",
            "vfmadd231ps ",
            $r,
            "3, ",
            $r,
            "13, ",
            $r,
            "15\n",
            "vbroadcastss ",
            $r,
            "14, dword ptr [{p2} + {off}]\n",
            "vfmadd231ps ",
            $r,
            "4, ",
            $r,
            "12, ",
            $r,
            "14\n",
            "vfmadd231ps ",
            $r,
            "5, ",
            $r,
            "13, ",
            $r,
            "14\n",
            "vbroadcastss ",
            $r,
            "15, dword ptr [{p3} + {off}]\n",
            "vfmadd231ps ",
            $r,
            "6, ",
            $r,
            "12, ",
            $r,
            "15\n",
            "vfmadd231ps ",
            $r,
            "7, ",
            $r,
            "13, ",
            $r,
            "15\n",
            "vbroadcastss ",
            $r,
            "14, dword ptr [{p4} + {off}]\n",
            "vfmadd231ps ",
            $r,
            "8, ",
            $r,
            "12, ",
            $r,
            "14\n",
            "vfmadd231ps ",
            $r,
            "9, ",
            $r,
            "13, ",
            $r,
            "14\n",
            "vbroadcastss ",
            $r,
            "15, dword ptr [{p5} + {off}]\n",
            "vfmadd231ps ",
            $r,
            "10, ",
            $r,
            "12, ",
            $r,
            "15\n",
            "vfmadd231ps ",
            $r,
            "11, ",
            $r,
            "13, ",
            $r,
            "15\n",
        )
    };
}

/// A tile of two vectors of `$v` bytes a row, in registers `$r`: `acc` holds [`CP`] rows of
/// two vectors of partial sums (one row per position), each continued over `taps` kernel rows:
/// tap `s` reads the two weight vectors at `w + 2 * $v * s` bytes and, for position `j`, the
/// input value at `p[j] + tab[s]` bytes. One schedule for both levels: [`tile`] (AVX2, [`CV`]
/// channels) and [`tile512`] (AVX-512, [`CV512`] channels), so each lane is the same chain of
/// fused multiply-adds.
macro_rules! two_vector_tile {
    ($(#[$doc:meta])* $name:ident, $feature:literal, $r:literal, $v:literal, [$($reg:tt),*]) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name(
            taps: usize,
            w: *const f32,
            tab: *const isize,
            p: &[*const f32; CP],
            acc: *mut f32,
        ) {
            // SAFETY: every access is inside the caller's ranges (this function's contract);
            // the registers written (`$reg`: `$r`0..15) are declared clobbered; no stack use.
            unsafe {
                std::arch::asm!(
                    concat!("vmovups ", $r, "0, [{acc}]"),
                    concat!("vmovups ", $r, "1, [{acc} + {a1}]"),
                    concat!("vmovups ", $r, "2, [{acc} + {a2}]"),
                    concat!("vmovups ", $r, "3, [{acc} + {a3}]"),
                    concat!("vmovups ", $r, "4, [{acc} + {a4}]"),
                    concat!("vmovups ", $r, "5, [{acc} + {a5}]"),
                    concat!("vmovups ", $r, "6, [{acc} + {a6}]"),
                    concat!("vmovups ", $r, "7, [{acc} + {a7}]"),
                    concat!("vmovups ", $r, "8, [{acc} + {a8}]"),
                    concat!("vmovups ", $r, "9, [{acc} + {a9}]"),
                    concat!("vmovups ", $r, "10, [{acc} + {a10}]"),
                    concat!("vmovups ", $r, "11, [{acc} + {a11}]"),
                    // three taps at a time, then one at a time
                    "test {n3}, {n3}",
                    "jz 3f",
                    "2:",
                    two_vector_tap!($r, "0", "0", "{a1}"),
                    two_vector_tap!($r, "8", "{a2}", "{a3}"),
                    two_vector_tap!($r, "16", "{a4}", "{a5}"),
                    "add {w}, {a6}",
                    "add {tab}, 24",
                    "dec {n3}",
                    "jnz 2b",
                    "3:",
                    "test {n1}, {n1}",
                    "jz 5f",
                    "4:",
                    two_vector_tap!($r, "0", "0", "{a1}"),
                    "add {w}, {a2}",
                    "add {tab}, 8",
                    "dec {n1}",
                    "jnz 4b",
                    "5:",
                    concat!("vmovups [{acc}], ", $r, "0"),
                    concat!("vmovups [{acc} + {a1}], ", $r, "1"),
                    concat!("vmovups [{acc} + {a2}], ", $r, "2"),
                    concat!("vmovups [{acc} + {a3}], ", $r, "3"),
                    concat!("vmovups [{acc} + {a4}], ", $r, "4"),
                    concat!("vmovups [{acc} + {a5}], ", $r, "5"),
                    concat!("vmovups [{acc} + {a6}], ", $r, "6"),
                    concat!("vmovups [{acc} + {a7}], ", $r, "7"),
                    concat!("vmovups [{acc} + {a8}], ", $r, "8"),
                    concat!("vmovups [{acc} + {a9}], ", $r, "9"),
                    concat!("vmovups [{acc} + {a10}], ", $r, "10"),
                    concat!("vmovups [{acc} + {a11}], ", $r, "11"),
                    acc = in(reg) acc,
                    w = inout(reg) w => _,
                    tab = inout(reg) tab => _,
                    n3 = inout(reg) taps / 3 => _,
                    n1 = inout(reg) taps % 3 => _,
                    off = out(reg) _,
                    p0 = in(reg) p[0],
                    p1 = in(reg) p[1],
                    p2 = in(reg) p[2],
                    p3 = in(reg) p[3],
                    p4 = in(reg) p[4],
                    p5 = in(reg) p[5],
                    // (byte offsets: vector i of a row, or tap i's first weight vector / 2)
                    a1 = const $v,
                    a2 = const 2 * $v,
                    a3 = const 3 * $v,
                    a4 = const 4 * $v,
                    a5 = const 5 * $v,
                    a6 = const 6 * $v,
                    a7 = const 7 * $v,
                    a8 = const 8 * $v,
                    a9 = const 9 * $v,
                    a10 = const 10 * $v,
                    a11 = const 11 * $v,
                    $(out($reg) _,)*
                    options(nostack),
                );
            }
        }
    };
}

two_vector_tile!(
    /// The tile on AVX2: `acc` holds [`CP`] rows of [`CV`] partial sums (one row per
    /// position), each continued over `taps` kernel rows: tap `s` reads the [`CV`] weights at
    /// `w + CV * s` and, for position `j`, the input value at `p[j] + tab[s]` bytes.
    ///
    /// # Safety
    /// `acc` valid for reads and writes of `CP * CV` floats; `w` for reads of `CV * taps`
    /// floats; `tab` for reads of `taps` offsets; each `p[j] + tab[s]` (bytes) for a read of
    /// one float; the CPU supports AVX2 and FMA.
    tile,
    "avx2,fma",
    "ymm",
    32,
    [
        "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9", "ymm10",
        "ymm11", "ymm12", "ymm13", "ymm14", "ymm15"
    ]
);

two_vector_tile!(
    /// [`tile`] on a panel of [`CV512`] channels in AVX-512 registers: `acc` holds [`CP`] rows
    /// of [`CV512`] partial sums, tap `s` reads the [`CV512`] weights at `w + CV512 * s`.
    ///
    /// # Safety
    /// As [`tile`] with [`CV512`] for [`CV`]; the CPU supports AVX-512F.
    tile512,
    "avx512f",
    "zmm",
    64,
    [
        "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10",
        "zmm11", "zmm12", "zmm13", "zmm14", "zmm15"
    ]
);

/// [`tile`] on a panel of [`CV512X4`] channels in AVX-512 registers: `acc` holds [`CP`] rows
/// of [`CV512X4`] partial sums (position `j`'s four vectors in accumulators `4j..4j + 4`), tap
/// `s` reads the [`CV512X4`] weights at `w + CV512X4 * s`. Each lane is the same chain of fused
/// multiply-adds as in [`tile`].
///
/// # Safety
/// As [`tile`] with [`CV512X4`] for [`CV`]; the CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile512x4(
    taps: usize,
    w: *const f32,
    tab: *const isize,
    p: &[*const f32; CP],
    acc: *mut f32,
) {
    // One tap: its offset, the four weight vectors, then each position's value broadcast and
    // multiplied into its four accumulators.
    macro_rules! tap {
        ($t:literal, $w:literal) => {
            concat!(
                "mov {off}, [{tab} + ",
                $t,
                "]\n",
                "vmovups zmm24, [{w} + ",
                $w,
                "]\n",
                "vmovups zmm25, [{w} + ",
                $w,
                " + 64]\n",
                "vmovups zmm26, [{w} + ",
                $w,
                " + 128]\n",
                "vmovups zmm27, [{w} + ",
                $w,
                " + 192]\n",
                "vbroadcastss zmm28, dword ptr [{p0} + {off}]\n",
                "vfmadd231ps zmm0, zmm24, zmm28\n",
                "vfmadd231ps zmm1, zmm25, zmm28\n",
                "vfmadd231ps zmm2, zmm26, zmm28\n",
                "vfmadd231ps zmm3, zmm27, zmm28\n",
                "vbroadcastss zmm29, dword ptr [{p1} + {off}]\n",
                "vfmadd231ps zmm4, zmm24, zmm29\n",
                "vfmadd231ps zmm5, zmm25, zmm29\n",
                "vfmadd231ps zmm6, zmm26, zmm29\n",
                "vfmadd231ps zmm7, zmm27, zmm29\n",
                "vbroadcastss zmm28, dword ptr [{p2} + {off}]\n",
                "vfmadd231ps zmm8, zmm24, zmm28\n",
                "vfmadd231ps zmm9, zmm25, zmm28\n",
                "vfmadd231ps zmm10, zmm26, zmm28\n",
                "vfmadd231ps zmm11, zmm27, zmm28\n",
                "vbroadcastss zmm29, dword ptr [{p3} + {off}]\n",
                "vfmadd231ps zmm12, zmm24, zmm29\n",
                "vfmadd231ps zmm13, zmm25, zmm29\n",
                "vfmadd231ps zmm14, zmm26, zmm29\n",
                "vfmadd231ps zmm15, zmm27, zmm29\n",
                "vbroadcastss zmm28, dword ptr [{p4} + {off}]\n",
                "vfmadd231ps zmm16, zmm24, zmm28\n",
                "vfmadd231ps zmm17, zmm25, zmm28\n",
                "vfmadd231ps zmm18, zmm26, zmm28\n",
                "vfmadd231ps zmm19, zmm27, zmm28\n",
                "vbroadcastss zmm29, dword ptr [{p5} + {off}]\n",
                "vfmadd231ps zmm20, zmm24, zmm29\n",
                "vfmadd231ps zmm21, zmm25, zmm29\n",
                "vfmadd231ps zmm22, zmm26, zmm29\n",
                "vfmadd231ps zmm23, zmm27, zmm29\n",
            )
        };
    }
    // SAFETY: every access is inside the caller's ranges (this function's contract); the
    // registers written are declared clobbered; no stack use.
    unsafe {
        std::arch::asm!(
            "vmovups zmm0, [{acc} + 0]",
            "vmovups zmm1, [{acc} + 64]",
            "vmovups zmm2, [{acc} + 128]",
            "vmovups zmm3, [{acc} + 192]",
            "vmovups zmm4, [{acc} + 256]",
            "vmovups zmm5, [{acc} + 320]",
            "vmovups zmm6, [{acc} + 384]",
            "vmovups zmm7, [{acc} + 448]",
            "vmovups zmm8, [{acc} + 512]",
            "vmovups zmm9, [{acc} + 576]",
            "vmovups zmm10, [{acc} + 640]",
            "vmovups zmm11, [{acc} + 704]",
            "vmovups zmm12, [{acc} + 768]",
            "vmovups zmm13, [{acc} + 832]",
            "vmovups zmm14, [{acc} + 896]",
            "vmovups zmm15, [{acc} + 960]",
            "vmovups zmm16, [{acc} + 1024]",
            "vmovups zmm17, [{acc} + 1088]",
            "vmovups zmm18, [{acc} + 1152]",
            "vmovups zmm19, [{acc} + 1216]",
            "vmovups zmm20, [{acc} + 1280]",
            "vmovups zmm21, [{acc} + 1344]",
            "vmovups zmm22, [{acc} + 1408]",
            "vmovups zmm23, [{acc} + 1472]",
            "test {n2}, {n2}",
            "jz 3f",
            "2:",
            tap!("0", "0"),
            tap!("8", "256"),
            "add {w}, 512",
            "add {tab}, 16",
            "dec {n2}",
            "jnz 2b",
            "3:",
            "test {n1}, {n1}",
            "jz 5f",
            tap!("0", "0"),
            "5:",
            "vmovups [{acc} + 0], zmm0",
            "vmovups [{acc} + 64], zmm1",
            "vmovups [{acc} + 128], zmm2",
            "vmovups [{acc} + 192], zmm3",
            "vmovups [{acc} + 256], zmm4",
            "vmovups [{acc} + 320], zmm5",
            "vmovups [{acc} + 384], zmm6",
            "vmovups [{acc} + 448], zmm7",
            "vmovups [{acc} + 512], zmm8",
            "vmovups [{acc} + 576], zmm9",
            "vmovups [{acc} + 640], zmm10",
            "vmovups [{acc} + 704], zmm11",
            "vmovups [{acc} + 768], zmm12",
            "vmovups [{acc} + 832], zmm13",
            "vmovups [{acc} + 896], zmm14",
            "vmovups [{acc} + 960], zmm15",
            "vmovups [{acc} + 1024], zmm16",
            "vmovups [{acc} + 1088], zmm17",
            "vmovups [{acc} + 1152], zmm18",
            "vmovups [{acc} + 1216], zmm19",
            "vmovups [{acc} + 1280], zmm20",
            "vmovups [{acc} + 1344], zmm21",
            "vmovups [{acc} + 1408], zmm22",
            "vmovups [{acc} + 1472], zmm23",
            acc = in(reg) acc,
            w = inout(reg) w => _,
            tab = inout(reg) tab => _,
            n2 = inout(reg) taps / 2 => _,
            n1 = in(reg) taps % 2,
            off = out(reg) _,
            p0 = in(reg) p[0],
            p1 = in(reg) p[1],
            p2 = in(reg) p[2],
            p3 = in(reg) p[3],
            p4 = in(reg) p[4],
            p5 = in(reg) p[5],
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _,
            out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
            out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _, out("zmm16") _, out("zmm17") _,
            out("zmm18") _, out("zmm19") _, out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
            out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _, out("zmm28") _, out("zmm29") _,
            options(nostack),
        );
    }
}

/// Output positions per chunk of a block with prepacked weights ([`cv_f32`]): eight tiles,
/// whose partial sums (`CHUNK x` the panel width: 12 KiB at 64 channels) stay in L1 through
/// every channel pass; a multiple of 16, the AVX-512 unpacking's transpose.
const CHUNK: usize = CP * 8;

/// Channel passes up to which a block goes chunk by chunk ([`CHUNK`]): each chunk reads every
/// pass's weights again, from L2, which repays itself only while the passes are few (one
/// thread, warm caches: 64 -> 64 3x3 at 56x56, 10 passes, 1287 -> 1350 us chunked; 16 -> 64
/// 3x3 at 55x55, 3 passes, the same either way, and with the caches flushed before each call
/// 403 -> 390 with the output prefetch below).
const CHUNK_PASSES: usize = 3;

/// Output positions a block holds at least (where the layer has them).
const MIN_BLOCK: usize = 192;

/// Kernel rows (taps) per channel pass: a panel's weights for a pass, `CV` floats a tap, stay
/// near 16 KiB, in L1 beside the input values the tiles read.
const PASS_TAPS: usize = 256;

/// conv2d as described in the module docs. Each task (image, group, block of output rows)
/// reads its input from a copy of the rows it reads, zero-padded, `[channel][row][column]`
/// (im2col wrote each input value once per tap). A position's tap
/// (channel `c`, kernel row `ki`, column `kj`) is then at a fixed offset from the position's
/// own start: `c * cs + ki * dh * ws + kj * dw`, whatever the stride.
#[allow(clippy::too_many_arguments)]
pub(super) fn cv_f32(
    cw: usize,
    g: &Geom,
    xc: &[f32],
    wc: &[f32],
    prepacked: Option<&[f32]>,
    bc: &[f32],
    op: &OutPtr<f32>,
    pool: &dyn kernel_core::ThreadPool,
    epi: Option<&[Epilogue]>,
) {
    let (cg, og, pos) = (g.cg(), g.og(), g.positions());
    let kk = g.kh * g.kw;
    // a leading relu goes into the unpacking (a separate pass cost a tenth of a 16 -> 64 3x3
    // layer at 55x55)
    let (relu, epi) = split_leading_relu(epi);
    // the panel width, and with it the packed weights' layout and the tile (AVX2 or AVX-512)
    assert_runnable(cw);
    let panels = og.div_ceil(cw);
    // the slab's row width and the rows a block of `r` output rows reads
    let ws = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
    let rows_in = |r: usize| (r - 1) * g.sh + (g.kh - 1) * g.dh + 1;
    // blocks of output rows whose slab fits SLAB_FLOATS, but at least MIN_BLOCK positions:
    // each block packs every panel's weights again, which a few tiles do not repay (a 512 ->
    // 512 3x3 stride-2 layer at 7x7 had blocks of 2 or 3 rows)
    let fit = SLAB_FLOATS / (cg * ws);
    let rows = (fit.saturating_sub((g.kh - 1) * g.dh + 1) / g.sh + 1)
        .max(MIN_BLOCK.div_ceil(g.ow))
        .clamp(1, g.oh);
    let threads = pool.num_threads().max(1);
    let split = split_work(g, g.oh.div_ceil(rows), g.oh, panels, threads, true);
    let blocks = split.blocks;
    let block_rows = |b: usize| (b * g.oh / blocks, (b + 1) * g.oh / blocks);
    let max_rows = g.oh.div_ceil(blocks);
    // (rounded up to a cache line's 16 floats: the scratch and the weight buffer after it start
    // on one, so no vector load or store of theirs splits across two lines)
    let slab_len = (cg * rows_in(max_rows) * ws).next_multiple_of(16);
    let nc = cg.div_ceil(cg.div_ceil((pass_taps(cw) / kk).max(1)));
    // slab column q holds input column q - pl: columns lo..hi are inside the input
    let lo = g.pl.min(ws);
    let hi = (g.pl + g.w).min(ws);
    let scratch_len = (max_rows * g.ow).div_ceil(CP * 8) * CP * 8 * cw;
    // the scratch's bias rows and its unpacking in AVX-512 (`fill_bias512`, `unpack_out512`):
    // panels of 32 or 64 channels, at the level that chose them
    let wide = cw.is_multiple_of(16) && simd_level() == SimdLevel::Avx512;
    parallel_for(pool, split.tasks, 1, |range| {
        // (a fresh slab and scratch per call cost page faults and zeroing: a 128 -> 32 1x1
        // layer at 27x27 took 0.14 ms instead of 0.08; every value read is written first)
        with_scratch::<f32, _>(slab_len + scratch_len + nc * kk * cw, |buf| {
            let (slab, rest) = buf.split_at_mut(slab_len);
            let (scratch, wbuf) = rest.split_at_mut(scratch_len);
            let mut offs: Vec<usize> = Vec::new();
            let mut tab: Vec<isize> = Vec::new();
            for t in range {
                let Some((img, grp, bs, panel_range)) = split.task(t) else {
                    continue;
                };
                for b in bs {
                    let (oh0, oh1) = block_rows(b);
                    let planes = &xc[(img * g.c + grp * cg) * g.h * g.w..][..cg * g.h * g.w];
                    let npos = (oh1 - oh0) * g.ow;
                    offs.clear();
                    tab.clear();
                    let rin = rows_in(oh1 - oh0);
                    let cs = rin * ws;
                    for c in 0..cg {
                        let plane = &planes[c * g.h * g.w..][..g.h * g.w];
                        for r in 0..rin {
                            let dst = &mut slab[c * cs + r * ws..][..ws];
                            let ih = (oh0 * g.sh + r).checked_sub(g.pt).filter(|&i| i < g.h);
                            match ih {
                                Some(ih) if hi > lo => {
                                    dst[..lo].fill(0.0);
                                    dst[lo..hi].copy_from_slice(&plane[ih * g.w..][..hi - lo]);
                                    dst[hi..].fill(0.0);
                                }
                                _ => dst.fill(0.0),
                            }
                        }
                    }
                    offs.extend((0..npos).map(|q| q / g.ow * g.sh * ws + q % g.ow * g.sw));
                    tab.extend((0..nc * kk).map(|s| {
                        let (c, ki, kj) = (s / kk, s % kk / g.kw, s % g.kw);
                        ((c * cs + ki * g.dh * ws + kj * g.dw) * size_of::<f32>()) as isize
                    }));
                    for pi in panel_range.clone() {
                        let oc0 = grp * og + pi * cw;
                        let ocn = cw.min(og - pi * cw);
                        // With prepacked weights the block goes a chunk of CHUNK positions
                        // at a time through every channel pass, then into the output: the
                        // chunk's partial sums (CHUNK x cw floats) stay in L1 from the bias
                        // to the unpacking, where the block's whole scratch went through L2
                        // once per pass, its bias fill and its unpacking. (Weights packed now
                        // would be packed again per chunk: that path keeps one chunk, the
                        // block.) Each output's chain is the same: bias, then the passes in
                        // order.
                        // (the block's first output position of channel oc0)
                        let out0 = (img * g.o + oc0) * pos + oh0 * g.ow;
                        let chunk = if prepacked.is_some() && cg.div_ceil(nc) <= CHUNK_PASSES {
                            CHUNK
                        } else {
                            npos
                        };
                        for q0 in (0..npos).step_by(chunk) {
                            let qn = chunk.min(npos - q0);
                            // (`copy_short`: a `memcpy` call per position was a twentieth of
                            // a 16 -> 64 3x3 layer's time at 55x55)
                            let nrows = qn.div_ceil(CP) * CP;
                            if wide {
                                // SAFETY: AVX-512F (`wide`: the level); the scratch holds npos
                                // rounded up to CP * 8 rows >= nrows, and bc from oc0 holds
                                // ocn biases.
                                #[cfg(target_arch = "x86_64")]
                                unsafe {
                                    fill_bias512(scratch, cw, nrows, &bc[oc0..oc0 + ocn], ocn)
                                };
                            } else {
                                for q in 0..nrows {
                                    let row = &mut scratch[q * cw..][..cw];
                                    copy_short(&mut row[..ocn], &bc[oc0..oc0 + ocn]);
                                    row[ocn..].fill(0.0);
                                }
                            }
                            for c0 in (0..cg).step_by(nc) {
                                let ncc = nc.min(cg - c0);
                                // the pass's weights: prepacked (the panel's taps from c0 *
                                // kk on), or packed now into `wbuf`
                                let wp = match prepacked {
                                    Some(pw) => pw[((grp * panels + pi) * cg + c0) * kk * cw..]
                                        [..ncc * kk * cw]
                                        .as_ptr(),
                                    None => {
                                        // SAFETY: AVX2 (`cv_applies`); oc0 + ocn <= o, c0 +
                                        // ncc <= cg, wbuf holds kk * nc * cw.
                                        #[cfg(target_arch = "x86_64")]
                                        unsafe {
                                            pack_panel(
                                                (kk, g.ckk(), cw),
                                                wc,
                                                oc0,
                                                ocn,
                                                c0,
                                                ncc,
                                                wbuf,
                                            )
                                        };
                                        wbuf.as_ptr()
                                    }
                                };
                                // Prepacked, the next pass's weights (the next channels', or
                                // the next panel's first) follow this pass's: a share of them
                                // is prefetched with each tile of the first chunk, so that the
                                // next pass does not wait on memory for its first tile's
                                // weights (a model's weights do not stay in cache from one run
                                // to the next; later chunks find them in L2).
                                let next_w = prepacked
                                    .filter(|_| q0 == 0 && super::weight_prefetch())
                                    .map(|pw| {
                                        let at = ((grp * panels + pi) * cg + c0 + ncc) * kk * cw;
                                        let len = pw.len().saturating_sub(at).min(nc * kk * cw);
                                        (
                                            pw[at.min(pw.len())..].as_ptr(),
                                            len.div_ceil(qn.div_ceil(CP)),
                                        )
                                    });
                                // The output lines the next chunk unpacks into, fetched
                                // for writing during this chunk's first pass, a share of
                                // the rows with each tile: inside a model they are cold,
                                // and the unpacking's stores to 16 rows at a time waited on
                                // each line (one thread, the caches flushed before each
                                // call, `OP_LOOP_COLD`, without this prefetch -> with it: 16
                                // -> 64 3x3 at 55x55 437 -> 365 us, a 3 -> 64 7x7 stride-2
                                // stem 1810 -> 1495).
                                let next_out = (c0 == 0 && q0 + qn < npos).then(|| {
                                    let nq = chunk.min(npos - q0 - qn);
                                    (out0 + q0 + qn, nq, ocn.div_ceil(qn.div_ceil(CP)))
                                });
                                for t0 in (q0..q0 + qn).step_by(CP) {
                                    if let Some((w, share)) = next_w {
                                        prefetch_l2(w.wrapping_add((t0 - q0) / CP * share), share);
                                    }
                                    if let Some((at, nq, share)) = next_out {
                                        let r0 = (t0 - q0) / CP * share;
                                        for r in r0..(r0 + share).min(ocn) {
                                            // (a hint: never dereferenced, the address kept
                                            // in bounds by `wrapping_add`)
                                            prefetch_write(op.ptr().wrapping_add(at + r * pos), nq);
                                        }
                                    }
                                    let p: [*const f32; CP] = std::array::from_fn(|j| {
                                        slab[c0 * cs + offs[(t0 + j).min(npos - 1)]..].as_ptr()
                                    });
                                    // SAFETY: scratch rows t0 - q0..t0 - q0 + CP exist (its
                                    // length is npos rounded up to CP * 8 rows, and a chunk
                                    // is at most npos); the panel's weights for channels
                                    // c0..c0 + ncc are kk * ncc * cw floats at wp (in wbuf,
                                    // or a bounds-checked slice of the prepacked panel); tab
                                    // has nc * kk >= ncc * kk entries; position j's tap (c0 +
                                    // c, ki, kj) reads the slab at (c0 + c) * cs + (its row *
                                    // sh + ki * dh) * ws + its column * sw + kj * dw: a row <
                                    // rin and a column < ws, inside the block's cg * cs
                                    // values; the CPU has AVX2 and FMA, and AVX-512F where
                                    // `panel_width` chose CV512 or CV512X4 (checked above).
                                    #[cfg(target_arch = "x86_64")]
                                    unsafe {
                                        let acc = scratch[(t0 - q0) * cw..].as_mut_ptr();
                                        if cw == CV512X4 {
                                            tile512x4(kk * ncc, wp, tab.as_ptr(), &p, acc)
                                        } else if cw == CV512 {
                                            tile512(kk * ncc, wp, tab.as_ptr(), &p, acc)
                                        } else {
                                            tile(kk * ncc, wp, tab.as_ptr(), &p, acc)
                                        }
                                    };
                                }
                            }
                            let at0 = out0 + q0;
                            // SAFETY: AVX2; scratch holds qn rounded up to CP * 8 rows;
                            // channels oc0..oc0 + ocn <= o of image img, the chunk's positions
                            // of output rows oh0..oh1: inside the output, and only this task's
                            // (its panels, its rows).
                            #[cfg(target_arch = "x86_64")]
                            unsafe {
                                let out = op.ptr().add(at0);
                                if wide {
                                    // (AVX-512F: `wide`; the scratch's rows, qn rounded up to
                                    // CP * 8 = 48, are a multiple of 16)
                                    unpack_out512(scratch, cw, qn, ocn, out, pos, relu)
                                } else {
                                    unpack_out(scratch, cw, qn, ocn, out, pos, relu)
                                }
                            };
                            if let Some(steps) = epi {
                                for i in 0..ocn {
                                    let at = at0 + i * pos;
                                    // SAFETY: as for the unpacking.
                                    let out = unsafe {
                                        std::slice::from_raw_parts_mut(op.ptr().add(at), qn)
                                    };
                                    Epilogue::apply_all(steps, out, at);
                                }
                            }
                        }
                    }
                }
            }
        })
    });
}
