//! Machinery shared by the kernel families: compute types, block loads/stores with half-type
//! slice conversion, a strided/broadcast N-ary elementwise driver, lanes along an axis, and
//! shape helpers that understand unknown dims.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kernel_core::{
    broadcast_strides, numel, parallel_for, Element, Error, Result, TensorMut, TensorRef,
    ThreadPool,
};
use std::ops::Range;

/// Elements per parallel chunk for cheap elementwise work.
pub const GRAIN: usize = 1 << 15;
/// Elements per block of the elementwise driver (fits L1 for a few inputs).
const BLOCK: usize = 256;

/// Arithmetic on compute types. Integer `add`/`sub`/`mul`/`neg` wrap on overflow.
pub trait Num: Copy + Default + Send + Sync + PartialOrd + std::fmt::Debug + 'static {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! num_float {
    ($t:ty) => {
        impl Num for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn neg(self) -> Self {
                -self
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                self != self
            }
        }
    };
}
macro_rules! num_int {
    ($t:ty) => {
        impl Num for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn neg(self) -> Self {
                self.wrapping_neg()
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                false
            }
        }
    };
}
num_float!(f32);
num_float!(f64);
num_int!(i16);
num_int!(i32);
num_int!(i64);

/// Float compute types (f32, f64): transcendental functions and constants.
///
/// The `_v` functions and the gelu helpers are the ones kernels call in hot loops: for f32
/// they are the branch-free, vectorisable versions of [`crate::vmath`]; for f64 they are
/// libm / std (accurate to an ulp, scalar).
pub trait Real: Num + num_traits::Float + Scalar<C = Self> {
    fn from_f64(v: f64) -> Self;
    /// `self` as f64 (exact).
    fn to_f64(self) -> f64;
    /// e^x.
    fn exp_v(self) -> Self;
    /// x Phi(x) (exact gelu).
    fn gelu_erf(self) -> Self;
    /// d/dx x Phi(x) = Phi(x) + x phi(x).
    fn gelu_erf_grad(self) -> Self;
    /// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (gelu's tanh form).
    fn gelu_tanh(self) -> Self;
    /// `e^(self - m)` for finite `self <= m` (softmax's fast path; see
    /// [`crate::vmath::exp_diff_f32`] for f32, `exp_minus` in softmax.rs for f64). `narrow`:
    /// the row's storage type is a 16-bit float ([`Scalar::NARROW`]), and f32 takes
    /// [`crate::vmath::exp_diff_narrow`] (f64 rows never are).
    fn exp_diff(self, m: Self, narrow: bool) -> Self;
    /// [`Real::gelu_erf`] to the precision a 16-bit float result keeps ([`Scalar::NARROW`]):
    /// f32 takes [`crate::vmath::gelu_erf_narrow`]; f64 (never narrow) its exact gelu.
    #[inline(always)]
    fn gelu_erf_narrow(self) -> Self {
        self.gelu_erf()
    }
    /// [`Real::gelu_tanh`] likewise ([`crate::vmath::gelu_tanh_narrow`] for f32).
    #[inline(always)]
    fn gelu_tanh_narrow(self) -> Self {
        self.gelu_tanh()
    }
    /// `dst[i] = src[i].gelu_erf()` (`narrow`: `gelu_erf_narrow()`), same bits, for the first
    /// `min(len)` elements; f32 skips the tail formula for chunks that have no tail element
    /// ([`crate::vmath::gelu_erf_slice`]).
    #[inline(always)]
    fn gelu_erf_slice(src: &[Self], dst: &mut [Self], narrow: bool) {
        for (o, &x) in dst.iter_mut().zip(src) {
            *o = if narrow {
                x.gelu_erf_narrow()
            } else {
                x.gelu_erf()
            };
        }
    }
    /// `d[j] = s[j].exp_diff(m, narrow)` (same bits) for a chunk of [`ACC`] elements; f32
    /// skips the underflow handling for chunks that need none
    /// ([`crate::vmath::exp_diff_chunk`]). Returns whether it took such a fast path, which a
    /// chunk holding a NaN never does.
    #[inline(always)]
    fn exp_diff_chunk(s: &[Self; ACC], m: Self, d: &mut [Self; ACC], narrow: bool) -> bool {
        for j in 0..ACC {
            d[j] = s[j].exp_diff(m, narrow);
        }
        false
    }
    /// `dst = softmax(src)` for a row of this type (not a 16-bit float row's) with the bits of
    /// softmax.rs's general path, in one explicit-SIMD routine where the type and the CPU have
    /// one (f32 at the AVX-512 level: [`crate::vmath::softmax_row_f32`], sums in blocks of
    /// `block`); false where not, or where the row leaves the fast path (then `dst` is
    /// unfinished and the caller runs the general path).
    #[inline(always)]
    fn softmax_row_simd(src: &[Self], dst: &mut [Self], block: usize) -> bool {
        let _ = (src, dst, block);
        false
    }
    /// `dst[i] = src[i].gelu_tanh()` (`narrow`: `gelu_tanh_narrow()`), same bits, as
    /// [`Real::gelu_erf_slice`].
    #[inline(always)]
    fn gelu_tanh_slice(src: &[Self], dst: &mut [Self], narrow: bool) {
        for (o, &x) in dst.iter_mut().zip(src) {
            *o = if narrow {
                x.gelu_tanh_narrow()
            } else {
                x.gelu_tanh()
            };
        }
    }
}
/// 1/sqrt(2 pi)
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

impl Real for f32 {
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn exp_v(self) -> Self {
        crate::vmath::exp_f32(self)
    }
    #[inline(always)]
    fn gelu_erf(self) -> Self {
        crate::vmath::gelu_erf_f32(self)
    }
    #[inline(always)]
    fn gelu_tanh(self) -> Self {
        crate::vmath::gelu_tanh_f32(self)
    }
    #[inline(always)]
    fn softmax_row_simd(src: &[Self], dst: &mut [Self], block: usize) -> bool {
        crate::vmath::softmax_row_f32(src, dst, block)
    }
    #[inline(always)]
    fn exp_diff(self, m: Self, narrow: bool) -> Self {
        if narrow {
            crate::vmath::exp_diff_narrow(self, m)
        } else {
            crate::vmath::exp_diff_f32(self, m)
        }
    }
    #[inline(always)]
    fn gelu_erf_narrow(self) -> Self {
        crate::vmath::gelu_erf_narrow(self)
    }
    #[inline(always)]
    fn gelu_tanh_narrow(self) -> Self {
        crate::vmath::gelu_tanh_narrow(self)
    }
    #[inline(always)]
    fn gelu_erf_slice(src: &[Self], dst: &mut [Self], narrow: bool) {
        if narrow {
            crate::vmath::gelu_erf_narrow_slice(src, dst)
        } else {
            crate::vmath::gelu_erf_slice(src, dst)
        }
    }
    #[inline(always)]
    fn exp_diff_chunk(s: &[Self; ACC], m: Self, d: &mut [Self; ACC], narrow: bool) -> bool {
        crate::vmath::exp_diff_chunk(s, m, d, narrow)
    }
    #[inline(always)]
    fn gelu_tanh_slice(src: &[Self], dst: &mut [Self], narrow: bool) {
        if narrow {
            crate::vmath::gelu_tanh_narrow_slice(src, dst)
        } else {
            crate::vmath::gelu_tanh_slice(src, dst)
        }
    }
    #[inline(always)]
    fn gelu_erf_grad(self) -> Self {
        let pdf = FRAC_1_SQRT_2PI as f32 * crate::vmath::exp_f32(-0.5 * self * self);
        crate::vmath::norm_cdf_f32(self) + self * pdf
    }
}
impl Real for f64 {
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn exp_v(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn gelu_erf(self) -> Self {
        // Phi(x) = erfc(-x / sqrt 2) / 2: relative accuracy in the lower tail, where
        // 1 + erf(x / sqrt 2) cancels (issue 23)
        0.5 * self * libm::erfc(-self * std::f64::consts::FRAC_1_SQRT_2)
    }
    #[inline(always)]
    fn exp_diff(self, m: Self, _narrow: bool) -> Self {
        crate::softmax::exp_minus(self, m)
    }
    #[inline(always)]
    fn gelu_tanh(self) -> Self {
        // x / (1 + e^(-2u)) from e = e^(-2|u|), so neither sign of u cancels (issue 23)
        let u = 0.797_884_560_802_865_4 * (self + 0.044715 * self * self * self);
        let e = (-(u + u).abs()).exp();
        let d = 1.0 + e;
        self * if u >= 0.0 { 1.0 / d } else { e / d }
    }
    #[inline(always)]
    fn gelu_erf_grad(self) -> Self {
        let cdf = 0.5 * libm::erfc(-self * std::f64::consts::FRAC_1_SQRT_2);
        let pdf = FRAC_1_SQRT_2PI * (-0.5 * self * self).exp();
        cdf + self * pdf
    }
}

/// A storage element with a compute type `C` (f32 for f16/bf16, itself otherwise), and block
/// conversions between the two.
pub trait Scalar: Element {
    type C: Num;
    fn to_c(self) -> Self::C;
    fn from_c(v: Self::C) -> Self;
    /// `dst[i] = src[i].to_c()` (equal lengths).
    fn load(src: &[Self], dst: &mut [Self::C]);
    /// `dst[i] = from_c(src[i])` (equal lengths).
    fn store(src: &[Self::C], dst: &mut [Self]);
    /// The slice itself when the compute type is the storage type (f32, f64, i32, i64).
    fn as_c(s: &[Self]) -> Option<&[Self::C]>;
    /// Mutable form of [`Scalar::as_c`].
    fn as_c_mut(s: &mut [Self]) -> Option<&mut [Self::C]>;
    /// Whether the flat elementwise path should convert with `to_c` inside its map loop rather
    /// than [`Scalar::load`] blocks first (true where `to_c` is a few integer instructions that
    /// vectorise in the loop, bf16; f16's block load is F16C, a call, better done per block).
    const CONVERT_IN_LOOP: bool = false;
    /// Whether the kernels compute this type's results to the precision it keeps rather than
    /// float32's: true for the 16-bit floats, whose results keep 11 or 8 bits, where float32's
    /// formulas compute 24 (their compute-bound loops went at float32's rate). Softmax takes
    /// the short exponential ([`crate::vmath::exp_diff_narrow`]), gelu the short forms
    /// ([`crate::vmath::gelu_erf_narrow`], [`crate::vmath::gelu_tanh_narrow`]). Every path of
    /// an op on this type (contiguous or strided, any level) takes them, so the result does not
    /// depend on the layout.
    const NARROW: bool = false;
    /// `Real::exp_diff_chunk`'s fast path over the leading chunks of [`ACC`] elements of `s`
    /// that take it, converted to the compute type as they are read: `d[i] = e^(s[i] - m)`,
    /// each added into `acc[i % ACC]` in order; returns how many chunks it did (the caller's
    /// chunk loop does the rest). 0 here; f32 and the 16-bit floats have explicit-SIMD loops
    /// ([`crate::vmath::exp_diff_chunks`]). `narrow` as for [`Real::exp_diff`].
    #[inline(always)]
    fn exp_diff_chunks(
        s: &[Self],
        m: Self::C,
        d: &mut [Self::C],
        acc: &mut [Self::C; ACC],
        narrow: bool,
    ) -> usize {
        let _ = (s, m, d, acc, narrow);
        0
    }
    /// The leading whole chunks of [`ACC`] elements of `s`, converted, maxed into
    /// `acc[i % ACC]` (`if v > a { v } else { a }`); returns how many chunks it did. 0 here;
    /// f32 and the 16-bit floats have explicit-SIMD loops ([`crate::vmath::max_chunks`]).
    #[inline(always)]
    fn max_chunks(s: &[Self], acc: &mut [Self::C; ACC]) -> usize {
        let _ = (s, acc);
        0
    }
    /// Softmax's division by `sum` (given `rcp = 1 / sum`, two fused multiply-adds of
    /// correction, as softmax.rs's `div_markstein`) over the leading whole chunks of [`ACC`]
    /// elements of `s`, each result stored converted into `d`; returns how many chunks it did.
    /// 0 here; the 16-bit floats have explicit-SIMD loops ([`crate::vmath::div_store_chunks`]).
    /// `narrow` ([`Scalar::NARROW`] rows): the product `s[i] * rcp` alone.
    #[inline(always)]
    fn div_store_chunks(
        s: &[Self::C],
        sum: Self::C,
        rcp: Self::C,
        d: &mut [Self],
        narrow: bool,
    ) -> usize {
        let _ = (s, sum, rcp, d, narrow);
        0
    }
    /// rms_norm's sum of squares over the leading whole chunks of [`ACC`] elements of `s`,
    /// converted: `acc[i % ACC] += v * v`; returns how many chunks it did. 0 here; the 16-bit
    /// floats have explicit-SIMD loops ([`crate::vmath::sum_sq_chunks`]).
    #[inline(always)]
    fn sum_sq_chunks(s: &[Self], acc: &mut [Self::C; ACC]) -> usize {
        let _ = (s, acc);
        0
    }
    /// rms_norm's `d[i] = s[i] * r * w[i]` over the leading whole chunks of [`ACC`]
    /// elements, converted both ways; returns how many chunks it did. 0 here; the 16-bit
    /// floats have explicit-SIMD loops ([`crate::vmath::scale_store_chunks`]).
    #[inline(always)]
    fn scale_store_chunks(s: &[Self], r: Self::C, w: &[Self::C], d: &mut [Self]) -> usize {
        let _ = (s, r, w, d);
        0
    }
    /// The 16-bit floats' storage bits (f16, bf16), for kernels that order them by
    /// [`half_key`] without converting; `None` for other types.
    #[inline(always)]
    fn as_half_bits(_: &[Self]) -> Option<&[u16]> {
        None
    }
    /// Mutable form of [`Scalar::as_half_bits`].
    #[inline(always)]
    fn as_half_bits_mut(_: &mut [Self]) -> Option<&mut [u16]> {
        None
    }
    /// With [`Scalar::as_half_bits`]: the bits of +infinity (every larger magnitude is a NaN).
    const HALF_INF: u16 = 0;
}

/// The quiet bit of a 16-bit float whose +infinity has bits `inf` (the top mantissa bit:
/// f16 0x0200, bf16 0x0040): a NaN that goes through f32 comes back with it set.
#[inline(always)]
pub const fn half_quiet_bit(inf: u16) -> u16 {
    ((0x7FFF & !inf) + 1) >> 1
}

/// An `i16` whose order is the float order of the 16-bit float with bits `h` (+infinity's
/// bits `inf`): the magnitude, negated for a negative sign, so -0 and +0 are equal (as they
/// compare); every NaN maps to `i16::MAX`, above +infinity (the order of topk and sort: NaN
/// largest, NaNs equal to each other). Branch-free, so a loop of it vectorises 16 lanes wide.
#[inline(always)]
pub fn half_key(h: u16, inf: u16) -> i16 {
    let a = (h & 0x7FFF) as i16;
    let signed = if h & 0x8000 != 0 { a.wrapping_neg() } else { a };
    if a > inf as i16 {
        i16::MAX
    } else {
        signed
    }
}

macro_rules! scalar_ident {
    ($t:ty $(, $extra:item)*) => {
        impl Scalar for $t {
            type C = $t;
            $($extra)*
            #[inline(always)]
            fn to_c(self) -> $t {
                self
            }
            #[inline(always)]
            fn from_c(v: $t) -> Self {
                v
            }
            #[inline(always)]
            fn load(src: &[Self], dst: &mut [$t]) {
                dst.copy_from_slice(src)
            }
            #[inline(always)]
            fn store(src: &[$t], dst: &mut [Self]) {
                dst.copy_from_slice(src)
            }
            #[inline(always)]
            fn as_c(s: &[Self]) -> Option<&[$t]> {
                Some(s)
            }
            #[inline(always)]
            fn as_c_mut(s: &mut [Self]) -> Option<&mut [$t]> {
                Some(s)
            }
        }
    };
}
scalar_ident!(
    f32,
    #[inline(always)]
    fn exp_diff_chunks(
        s: &[f32],
        m: f32,
        d: &mut [f32],
        acc: &mut [f32; ACC],
        narrow: bool,
    ) -> usize {
        crate::vmath::exp_diff_chunks(s, m, d, acc, narrow)
    },
    #[inline(always)]
    fn max_chunks(s: &[f32], acc: &mut [f32; ACC]) -> usize {
        crate::vmath::max_chunks(s, acc)
    }
);
scalar_ident!(f64);
scalar_ident!(i32);
scalar_ident!(i64);

/// f16/bf16: compute in f32, converting through [`crate::halfconv`] (F16C for f16 blocks where
/// the CPU has it, vectorised integer code otherwise; see that module).
macro_rules! scalar_half {
    ($t:ty, $to:ident, $from:ident, $load:ident, $store:ident, $in_loop:expr) => {
        impl Scalar for $t {
            type C = f32;
            const CONVERT_IN_LOOP: bool = $in_loop;
            #[inline(always)]
            fn to_c(self) -> f32 {
                crate::halfconv::$to(self.to_bits())
            }
            #[inline(always)]
            fn from_c(v: f32) -> Self {
                <$t>::from_bits(crate::halfconv::$from(v))
            }
            #[inline(always)]
            fn load(src: &[Self], dst: &mut [f32]) {
                crate::halfconv::$load(src.reinterpret_cast(), dst)
            }
            #[inline(always)]
            fn store(src: &[f32], dst: &mut [Self]) {
                crate::halfconv::$store(src, dst.reinterpret_cast_mut())
            }
            #[inline(always)]
            fn as_c(_: &[Self]) -> Option<&[f32]> {
                None
            }
            #[inline(always)]
            fn as_half_bits(s: &[Self]) -> Option<&[u16]> {
                Some(s.reinterpret_cast())
            }
            #[inline(always)]
            fn as_half_bits_mut(s: &mut [Self]) -> Option<&mut [u16]> {
                Some(s.reinterpret_cast_mut())
            }
            const HALF_INF: u16 = <$t>::INFINITY.to_bits();
            const NARROW: bool = true;
            #[inline(always)]
            fn exp_diff_chunks(
                s: &[Self],
                m: f32,
                d: &mut [f32],
                acc: &mut [f32; ACC],
                narrow: bool,
            ) -> usize {
                crate::vmath::exp_diff_chunks(s, m, d, acc, narrow)
            }
            #[inline(always)]
            fn max_chunks(s: &[Self], acc: &mut [f32; ACC]) -> usize {
                crate::vmath::max_chunks(s, acc)
            }
            #[inline(always)]
            fn div_store_chunks(
                s: &[f32],
                sum: f32,
                rcp: f32,
                d: &mut [Self],
                narrow: bool,
            ) -> usize {
                crate::vmath::div_store_chunks(s, sum, rcp, d, narrow)
            }
            #[inline(always)]
            fn sum_sq_chunks(s: &[Self], acc: &mut [f32; ACC]) -> usize {
                crate::vmath::sum_sq_chunks(s, acc)
            }
            #[inline(always)]
            fn scale_store_chunks(s: &[Self], r: f32, w: &[f32], d: &mut [Self]) -> usize {
                crate::vmath::scale_store_chunks(s, r, w, d)
            }

            #[inline(always)]
            fn as_c_mut(_: &mut [Self]) -> Option<&mut [f32]> {
                None
            }
        }
    };
}
scalar_half!(f16, f16_to_f32, f32_to_f16, f16_load, f16_store, false);
scalar_half!(bf16, bf16_to_f32, f32_to_bf16, bf16_load, bf16_store, true);

/// Run `$body` with `$T` bound to the storage type of a float dtype; other dtypes are an
/// internal error (the op's dtype rules already rejected them).
macro_rules! with_float {
    ($dtype:expr, $T:ident => $body:expr) => {
        kernel_core::dispatch_float!($dtype, $T => $body,
            _ => Err(kernel_core::Error::internal(format!("unexpected dtype {}", $dtype))))
    };
}
/// Like [`with_float!`] over the numeric dtypes.
macro_rules! with_numeric {
    ($dtype:expr, $T:ident => $body:expr) => {
        kernel_core::dispatch_numeric!($dtype, $T => $body,
            _ => Err(kernel_core::Error::internal(format!("unexpected dtype {}", $dtype))))
    };
}
pub(crate) use with_float;
pub(crate) use with_numeric;

/// A raw output pointer shared by the tasks of one `parallel_for`; each task writes a disjoint
/// set of elements.
#[derive(Clone, Copy)]
pub struct OutPtr<T>(pub *mut T);
// SAFETY: an `OutPtr` is only an address; every access through it is an `unsafe` call whose
// contract requires the caller's task to own the elements it touches, so handing the address
// to other threads creates no data race by itself. `T: Send` is required because elements are
// written from other threads than the one that owns the buffer.
unsafe impl<T: Send> Send for OutPtr<T> {}
// SAFETY: as for `Send`: `&OutPtr` only gives out the address; the unsafe accessors' contracts
// (disjoint ranges per task) are what rule out races.
unsafe impl<T: Send> Sync for OutPtr<T> {}

impl<T> OutPtr<T> {
    /// The raw pointer (a method, so closures capture the whole `Sync` wrapper).
    #[inline(always)]
    pub fn ptr(&self) -> *mut T {
        self.0
    }
    /// # Safety
    /// `start..start + len` must be in bounds of the buffer the pointer came from (valid,
    /// aligned, initialised elements), and no other reference to or access of those elements
    /// may exist while the returned slice is alive.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        if len == 0 {
            return &mut [];
        }
        // SAFETY: the caller guarantees `start..start + len` lies in the buffer (so `add` stays
        // in the allocation and the elements are valid and aligned) and is accessed by nobody
        // else while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
    /// # Safety
    /// Offset `off` must be in bounds of the buffer the pointer came from, and no other task
    /// may read or write that element concurrently.
    #[inline(always)]
    pub unsafe fn write(&self, off: isize, v: T) {
        // SAFETY: the caller guarantees `off` is an in-bounds element owned by this task.
        unsafe { self.0.offset(off).write(v) }
    }
}

/// A raw input pointer (read-only), shareable across tasks.
#[derive(Clone, Copy)]
pub struct InPtr<T>(pub *const T);
// SAFETY: an `InPtr` only reads, and only through `unsafe` calls whose contracts require the
// elements to be valid and not written concurrently; reading the same `T: Sync` data from
// several threads is what `&[T]` allows too.
unsafe impl<T: Sync> Send for InPtr<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Sync> Sync for InPtr<T> {}

impl<T: Copy> InPtr<T> {
    /// # Safety
    /// Offset `off` must be an in-bounds, initialised element of the buffer the pointer came
    /// from (for a tensor view: an offset its shape and strides reach), not written
    /// concurrently.
    #[inline(always)]
    pub unsafe fn get(&self, off: isize) -> T {
        // SAFETY: the caller guarantees `off` is a valid element not being written.
        unsafe { *self.0.offset(off) }
    }
}

/// Typed read pointer of an input view (checks the dtype).
pub fn in_ptr<T: Element>(t: &TensorRef) -> Result<InPtr<T>> {
    if t.dtype != T::DTYPE {
        return Err(Error::internal(format!(
            "kernel read a {} tensor as {}",
            t.dtype,
            T::DTYPE
        )));
    }
    Ok(InPtr(t.ptr() as *const T))
}

/// Typed write pointer of a (contiguous) output (checks the dtype and the contiguity).
///
/// The pointer is taken without forming a `&mut [T]` over the whole output: in-place ops get
/// an output that aliases an input, and such a reference, even a short-lived one, would
/// assert exclusive access that the raw reads of the input then break.
pub fn out_ptr<T: Element>(t: &mut TensorMut) -> Result<OutPtr<T>> {
    if t.dtype != T::DTYPE {
        return Err(Error::internal(format!(
            "kernel wrote a {} tensor as {}",
            t.dtype,
            T::DTYPE
        )));
    }
    if !t.is_contiguous() {
        return Err(Error::internal("kernel outputs must be contiguous"));
    }
    Ok(OutPtr(t.ptr() as *mut T))
}

/// Err unless `t` has shape `want`. Kernels call this on entry for every tensor whose extent
/// their raw-pointer loops rely on: the shape function promises these shapes to callers that
/// go through [`kernel_core::OpDef::compute`] after inference, but a kernel can also be called
/// with any `KernelCtx` from safe code, and a wrong shape must then be an error, not an
/// out-of-bounds access.
pub fn expect_shape(what: &str, shape: &[usize], want: &[usize]) -> Result<()> {
    if shape != want {
        return Err(Error::internal(format!(
            "{what} has shape {shape:?}, the kernel expects {want:?}"
        )));
    }
    Ok(())
}

/// Load `dst.len()` elements starting at `p + off`, `stride` apart, into compute type.
///
/// # Safety
/// Every offset `off + j * stride` for `j < dst.len()` must be a valid element of the buffer
/// (see [`InPtr::get`]), not written concurrently.
#[inline(always)]
pub unsafe fn load_strided<T: Scalar>(p: InPtr<T>, off: isize, stride: isize, dst: &mut [T::C]) {
    let n = dst.len();
    if n == 0 {
        return;
    }
    // SAFETY: the offsets read are exactly `off + j * stride`, `j < n`, which the caller
    // guarantees valid; with `stride == 1` they are the `n` consecutive elements of the slice.
    unsafe {
        if stride == 1 {
            T::load(std::slice::from_raw_parts(p.0.offset(off), n), dst);
        } else if stride == 0 {
            let v = p.get(off).to_c();
            dst.fill(v);
        } else {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = p.get(off + j as isize * stride).to_c();
            }
        }
    }
}

/// Store `src` to `p + off`, `stride` apart.
///
/// # Safety
/// Every offset `off + j * stride` for `j < src.len()` must be an in-bounds element of the
/// buffer owned by the calling task (see [`OutPtr::write`]); `stride` must not be 0 unless
/// `src.len() == 1`.
#[inline(always)]
pub unsafe fn store_strided<T: Scalar>(p: OutPtr<T>, off: isize, stride: isize, src: &[T::C]) {
    let n = src.len();
    if n == 0 {
        return;
    }
    // SAFETY: the offsets written are exactly `off + j * stride`, `j < n`, which the caller
    // guarantees in bounds and owned by this task; with `stride == 1` they are the `n`
    // consecutive elements of the slice.
    unsafe {
        if stride == 1 {
            T::store(src, std::slice::from_raw_parts_mut(p.0.offset(off), n));
        } else {
            for (j, &v) in src.iter().enumerate() {
                p.write(off + j as isize * stride, T::from_c(v));
            }
        }
    }
}

/// Dims of a set of strided operands after dropping size-1 dims and merging dims that are
/// contiguous with each other in every operand. Never empty (a scalar becomes `[1]`).
fn coalesce<const N: usize>(
    shape: &[usize],
    strides: &[[isize; N]],
) -> (Vec<usize>, Vec<[isize; N]>) {
    let mut dims: Vec<usize> = Vec::new();
    let mut sts: Vec<[isize; N]> = Vec::new();
    for (&d, s) in shape.iter().zip(strides) {
        if d == 1 {
            continue;
        }
        if let (Some(&pd), Some(ps)) = (dims.last(), sts.last()) {
            if (0..N).all(|k| ps[k] == s[k] * d as isize) {
                *dims.last_mut().expect("nonempty") = pd * d;
                *sts.last_mut().expect("nonempty") = *s;
                continue;
            }
        }
        dims.push(d);
        sts.push(*s);
    }
    if dims.is_empty() {
        dims.push(1);
        sts.push([0; N]);
    }
    (dims, sts)
}

/// Walk the flat row-major index range `range` of a (coalesced) iteration space, one
/// contiguous-in-output segment at a time: `f(offsets_per_operand, flat_start, len, inner_strides)`.
/// Always inlined: a caller inside [`with_simd`] gets `f` compiled at the level's target
/// features (a `walk` of its own was compiled at the baseline, so a broadcast add's vectorised
/// runs were SSE: a `[1, 256, 56, 56] + [256, 1, 1]` add at half ONNX Runtime's speed).
#[inline(always)]
fn walk<const N: usize>(
    dims: &[usize],
    strides: &[[isize; N]],
    range: Range<usize>,
    mut f: impl FnMut([isize; N], usize, usize),
) {
    let rank = dims.len();
    let inner = dims[rank - 1];
    let s_in = strides[rank - 1];
    let mut i = range.start;
    let row = i / inner;
    let mut col = i % inner;
    // unravel the row over the outer dims
    let mut idx = vec![0usize; rank - 1];
    let mut base = [0isize; N];
    {
        let mut r = row;
        for d in (0..rank - 1).rev() {
            idx[d] = r % dims[d];
            r /= dims[d];
            for k in 0..N {
                base[k] += idx[d] as isize * strides[d][k];
            }
        }
    }
    while i < range.end {
        let len = (inner - col).min(range.end - i);
        let offs: [isize; N] = std::array::from_fn(|k| base[k] + col as isize * s_in[k]);
        f(offs, i, len);
        i += len;
        col = 0;
        if i >= range.end {
            break;
        }
        // advance the odometer over the outer dims
        let mut d = rank - 1;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            for k in 0..N {
                base[k] += strides[d][k];
            }
            if idx[d] < dims[d] {
                break;
            }
            for k in 0..N {
                base[k] -= strides[d][k] * dims[d] as isize;
            }
            idx[d] = 0;
        }
    }
}

/// The instruction-set level the kernels' hot loops are compiled for, chosen at run time.
///
/// Every level gives bitwise identical results (see [`with_simd`]); only the speed differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// The target's baseline (SSE2 on x86-64); `mul_add` is a libm call here (slow, same bits).
    Baseline,
    /// AVX2 with FMA (x86-64 CPUs from 2013 on).
    Avx2Fma,
    /// AVX-512 (F and VL) with AVX2 and FMA: 512-bit vectors (Intel from Skylake-SP, AMD from
    /// Zen 4).
    Avx512,
}

/// 0: no override; 1 + level: force that level (tests).
static FORCED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Force the level [`with_simd`] uses (`None`: the best the CPU has), for tests that check
/// every level gives the same bits. Process-wide; a level above what the CPU has runs at the
/// best level the CPU has (never an instruction it lacks). Results never depend on the level,
/// so other code running meanwhile only changes speed.
#[doc(hidden)]
pub fn force_simd_level(level: Option<SimdLevel>) {
    let v = match level {
        None => 0,
        Some(SimdLevel::Baseline) => 1,
        Some(SimdLevel::Avx2Fma) => 2,
        Some(SimdLevel::Avx512) => 3,
    };
    FORCED.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// A xorshift generator of values uniform in `[lo, hi)` (24 random bits each), for unit tests
/// that want many varied rows without a dependency.
#[cfg(test)]
pub(crate) fn test_values(seed: u64, lo: f32, hi: f32) -> impl FnMut() -> f32 {
    let mut s = seed;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 * (hi - lo) + lo
    }
}

/// Runs `f` with [`with_simd`] forced to each level the CPU has, baseline first, passing the
/// level's name; the best level again afterwards. `force_simd_level` is process-wide, so the
/// unit tests that force it take turns.
#[cfg(test)]
pub(crate) fn at_each_level(mut f: impl FnMut(&str)) {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for l in [SimdLevel::Baseline, SimdLevel::Avx2Fma, SimdLevel::Avx512] {
        if l <= cpu_simd_level() {
            force_simd_level(Some(l));
            f(&format!("{l:?}"));
        }
    }
    force_simd_level(None);
}

/// Whether the CPU has AVX2 and FMA (checked once; std caches the answer).
#[inline(always)]
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX-512F and AVX-512VL besides AVX2 and FMA (std caches the answer; it
/// also checks that the OS saves the 512-bit state).
#[inline(always)]
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2_fma()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The best level this CPU has.
#[inline(always)]
pub fn cpu_simd_level() -> SimdLevel {
    if has_avx512() {
        SimdLevel::Avx512
    } else if has_avx2_fma() {
        SimdLevel::Avx2Fma
    } else {
        SimdLevel::Baseline
    }
}

/// The level [`with_simd`] runs at now: the best the CPU has, unless a test forced a lower one.
#[inline(always)]
pub fn simd_level() -> SimdLevel {
    let best = cpu_simd_level();
    match FORCED.load(std::sync::atomic::Ordering::Relaxed) {
        1 => SimdLevel::Baseline,
        2 => best.min(SimdLevel::Avx2Fma),
        _ => best,
    }
}

/// Run `body` compiled for the best instruction-set level the CPU has ([`simd_level`]):
/// AVX-512 (F, VL) with AVX2 and FMA, AVX2 with FMA, or as is (SSE2 baseline on x86-64). Each
/// version is the same code and gives bitwise identical results: Rust never contracts
/// `a * b + c` into an FMA, and where the kernels call `mul_add` themselves it is IEEE
/// fusedMultiplyAdd, correctly rounded in all (a `vfmadd` instruction there, libm's `fmaf` in
/// the baseline build); the vector width changes how many lanes one instruction handles, never
/// the order of a reduction (the kernels fix that order in the source, see [`ACC`]). The
/// kernels inside must be `#[inline(always)]`, and so must the closure (`with_simd(#[inline(always)]
/// || ...)`), so they are compiled (and vectorised) for the wider registers: a hot loop left
/// outside is compiled for the baseline, where `mul_add` is a libm call (softmax ran 40x
/// slower when LLVM stopped inlining its closure). The AVX-512 version uses 512-bit vectors
/// (rustc 1.95 / LLVM: `zmm` registers for these loops; an older toolchain kept 256-bit ones).
#[inline(always)]
pub fn with_simd<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        /// # Safety
        /// The CPU must support AVX2 and FMA.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        /// # Safety
        /// The CPU must support AVX-512F, AVX-512VL, AVX2 and FMA.
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
        unsafe fn avx512<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        match simd_level() {
            // SAFETY: calling a `#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]`
            // function is sound exactly when the CPU supports those features, which
            // `simd_level` checked at run time (it never reports a level the CPU lacks).
            SimdLevel::Avx512 => return unsafe { avx512(body) },
            // SAFETY: as above, for AVX2 and FMA.
            SimdLevel::Avx2Fma => return unsafe { avx2(body) },
            SimdLevel::Baseline => {}
        }
    }
    body()
}

/// Ask the CPU to start loading the first (at most 8 KiB) of the `n` elements at `p` into the
/// cache: a hint with no effect on results, for the row a kernel reads next (hardware
/// prefetchers stop at page boundaries, and a row of 1024 floats is one page).
#[inline(always)]
pub fn prefetch<T>(p: *const T, n: usize) {
    #[cfg(target_arch = "x86_64")]
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T0 }, T>(p, n);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, n);
}

/// [`prefetch`] into the core's L2 only (not L1): for data a kernel reads a while later, which
/// would only push the lines in use out of L1 (conv2d's next weights).
#[inline(always)]
pub fn prefetch_l2<T>(p: *const T, n: usize) {
    #[cfg(target_arch = "x86_64")]
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T1 }, T>(p, n);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, n);
}

/// The start of each cache line of the first (at most 8 KiB) of the `n` elements at `p`, as
/// addresses only (computed with `wrapping_add`: never dereferenced here), for the prefetches.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines<T>(p: *const T, n: usize) -> impl Iterator<Item = *const i8> {
    let bytes = (n * std::mem::size_of::<T>()).min(8192);
    let p = p as *const i8;
    (0..bytes).step_by(64).map(move |off| p.wrapping_add(off))
}

/// [`prefetch`] with an `_mm_prefetch` hint.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_hint<const HINT: i32, T>(p: *const T, n: usize) {
    for line in prefetch_lines(p, n) {
        // SAFETY: a prefetch never faults and changes no architectural state, whatever the
        // address; SSE is part of the x86-64 baseline.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(line) };
    }
}

/// Whether the CPU has `prefetchw` (CPUID 0x8000_0001, ECX bit 8: PRFCHW), read once.
#[cfg(target_arch = "x86_64")]
fn has_prefetchw() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::arch::x86_64::__cpuid(0x8000_0001).ecx >> 8 & 1 == 1)
}

/// Ask the CPU to bring the first (at most 8 KiB) of the `n` elements at `p` into L1 in the
/// exclusive state (`prefetchw`), for lines a kernel is about to write: the store then finds
/// its line owned instead of waiting on a read-for-ownership. A hint with no effect on
/// results; nothing on CPUs without the instruction.
#[inline(always)]
pub fn prefetch_write<T>(p: *mut T, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if has_prefetchw() {
        for line in prefetch_lines(p as *const T, n) {
            // SAFETY: `prefetchw` (present: checked above) never faults and changes no
            // architectural state, whatever the address; it touches no stack or flags.
            unsafe {
                std::arch::asm!(
                    "prefetchw [{0}]",
                    in(reg) line,
                    options(nostack, preserves_flags, readonly)
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, n);
}

/// How far ahead of its position a streaming loop prefetches its inputs and its output, in
/// bytes. In ONNX Runtime, gelu over 16M floats ran 1.7x faster with it (one thread and two;
/// 2, 4 and 8 KiB ahead alike) and softmax's long rows a third faster: the hardware
/// prefetchers alone left the loops waiting on memory, output lines included (prefetching
/// those saves the store's read-for-ownership wait).
const STREAM_AHEAD: usize = 4096;

/// Prefetch the `n` elements a streaming loop over indices `.. end` of `p` reaches
/// [`STREAM_AHEAD`] bytes after index `i` (none past `end`): a hint with no effect on results.
#[inline(always)]
pub fn prefetch_ahead<T>(p: *const T, i: usize, n: usize, end: usize) {
    let ahead = i + STREAM_AHEAD / std::mem::size_of::<T>().max(1);
    if ahead < end {
        prefetch(p.wrapping_add(ahead), n.min(end - ahead));
    }
}

/// Elements per block of the flat elementwise path.
const FLAT_BLOCK: usize = 64;

/// [`prefetch_ahead`] of [`flat_map`]'s block at `i`: each input that is not broadcast, and
/// the output.
#[inline(always)]
fn prefetch_block<T: Scalar, const N: usize>(
    ins: &[InPtr<T>; N],
    bcast: &[bool; N],
    out: OutPtr<T>,
    i: usize,
    end: usize,
) {
    for k in 0..N {
        if !bcast[k] {
            prefetch_ahead(ins[k].0, i, FLAT_BLOCK, end);
        }
    }
    prefetch_ahead(out.0 as *const T, i, FLAT_BLOCK, end);
}

/// The flat elementwise path over `range`: each input is contiguous (`bcast[k] == false`) or a
/// single broadcast value. Whole blocks are loaded into fixed-size arrays in the compute type,
/// mapped, and stored, so the map loop vectorises and an output that aliases an input (in
/// place) is read before it is written.
///
/// # Safety
/// Each non-broadcast input must be valid for reads at every index in `range`, a broadcast
/// input at index 0; `out` must be valid for writes at every index in `range`, and no other
/// task may access those output elements concurrently. An input may alias `out` only with the
/// same layout (element `i` of both is the same address).
#[inline(always)]
unsafe fn flat_map<T: Scalar, const N: usize>(
    ins: [InPtr<T>; N],
    bcast: [bool; N],
    out: OutPtr<T>,
    range: Range<usize>,
    f: &impl Fn([T::C; N]) -> T::C,
) {
    let scal: [T::C; N] = std::array::from_fn(|k| {
        if bcast[k] {
            // SAFETY: the caller guarantees a broadcast input is readable at index 0.
            unsafe { ins[k].get(0) }.to_c()
        } else {
            T::C::default()
        }
    });
    let mut i = range.start;
    if T::CONVERT_IN_LOOP && !bcast.iter().any(|&b| b) {
        // No broadcast input, and a type whose `to_c` is cheap inline code (bf16): read and
        // convert in the map loop itself, which vectorises with it, into a local block stored
        // after the whole block was read (in-place safe). bf16 `add`: 315k -> 250k
        // instructions for 64K elements (callgrind).
        while i + FLAT_BLOCK <= range.end {
            prefetch_block(&ins, &bcast, out, i, range.end);
            let mut o = [T::C::default(); FLAT_BLOCK];
            for (j, o) in o.iter_mut().enumerate() {
                *o = f(std::array::from_fn(|k| {
                    // SAFETY: `i + FLAT_BLOCK <= range.end`, so `i + j` is in `range`,
                    // readable per the caller (no input is broadcast here); `out` is written
                    // only after this block was read.
                    unsafe { ins[k].get((i + j) as isize) }.to_c()
                }));
            }
            // SAFETY: indices `i..i + FLAT_BLOCK` are in `range`, which this task owns in
            // `out` (caller); every input element of the block was read above.
            T::store(&o, unsafe { out.slice(i, FLAT_BLOCK) });
            i += FLAT_BLOCK;
        }
    }
    while i + FLAT_BLOCK <= range.end {
        prefetch_block(&ins, &bcast, out, i, range.end);
        let mut a = [[T::C::default(); FLAT_BLOCK]; N];
        for k in 0..N {
            if bcast[k] {
                a[k] = [scal[k]; FLAT_BLOCK];
            } else {
                // SAFETY: `i + FLAT_BLOCK <= range.end`, so indices `i..i + FLAT_BLOCK` are in
                // `range`, readable per the caller; the slice is dropped before `out` is
                // written below, so an aliasing in-place output is not written while it lives.
                T::load(
                    unsafe { std::slice::from_raw_parts(ins[k].0.add(i), FLAT_BLOCK) },
                    &mut a[k],
                );
            }
        }
        let mut o = [T::C::default(); FLAT_BLOCK];
        for (j, o) in o.iter_mut().enumerate() {
            *o = f(std::array::from_fn(|k| a[k][j]));
        }
        // SAFETY: indices `i..i + FLAT_BLOCK` are in `range`, which this task owns in `out`
        // (caller); the input slices over the same block were dropped after loading above.
        T::store(&o, unsafe { out.slice(i, FLAT_BLOCK) });
        i += FLAT_BLOCK;
    }
    while i < range.end {
        let v: [T::C; N] = std::array::from_fn(|k| {
            if bcast[k] {
                scal[k]
            } else {
                // SAFETY: `i < range.end`, so `i` is in `range`, readable per the caller.
                unsafe { ins[k].get(i as isize) }.to_c()
            }
        });
        // SAFETY: `i` is in `range`, owned by this task in `out` (caller); element `i` of an
        // aliasing input was read into `v` above.
        unsafe { out.write(i as isize, T::from_c(f(v))) };
        i += 1;
    }
}

/// [`zip_map`] over one flat run of `n` contiguous output elements: input `k` is read at the
/// same flat index (`bcast[k]` false: it has the output's `n` elements in the output's
/// contiguous order) or is a single element broadcast everywhere (`bcast[k]` true).
fn flat_run<T: Scalar, const N: usize>(
    pool: &dyn ThreadPool,
    ptrs: [InPtr<T>; N],
    bcast: [bool; N],
    op: OutPtr<T>,
    n: usize,
    f: &(impl Fn([T::C; N]) -> T::C + Sync),
) -> Result<()> {
    parallel_for(pool, n, GRAIN, |range| {
        // SAFETY: the output is contiguous (`out_ptr` checked it) with `n` elements, and
        // `parallel_for` hands each task a disjoint `range` within `0..n`. Each input
        // broadcasts to the output shape (checked by the caller) and either reaches offsets
        // `0..n` contiguously in the output's order (so every index of `range` is one of its
        // elements) or is broadcast from its only element at offset 0. An in-place input
        // aliases the output with the same layout, as `flat_map` requires.
        with_simd(
            #[inline(always)]
            || unsafe { flat_map::<T, N>(ptrs, bcast, op, range, f) },
        )
    });
    Ok(())
}

/// `out[i] = f([in_0[i], .., in_{N-1}[i]])` over `out_shape`, with each input broadcast to
/// `out_shape` (NumPy rules; the caller checked compatibility) and read through its strides.
/// The output is contiguous and may alias an input that has the output's exact layout (in-place
/// ops): every block is read before it is written. Parallel over fixed chunks.
pub fn zip_map<T: Scalar, const N: usize>(
    pool: &dyn ThreadPool,
    inputs: [&TensorRef; N],
    out: &mut TensorMut,
    f: impl Fn([T::C; N]) -> T::C + Sync,
) -> Result<()> {
    let n = numel(&out.shape);
    let op = out_ptr::<T>(out)?;
    let out_shape = &out.shape[..];
    let mut ptrs = [InPtr(std::ptr::null()); N];
    for (p, t) in ptrs.iter_mut().zip(inputs) {
        *p = in_ptr::<T>(t)?;
        let off = out_shape.len().checked_sub(t.rank());
        let fits = off.is_some_and(|off| {
            t.shape
                .iter()
                .zip(&out_shape[off..])
                .all(|(&d, &o)| d == o || d == 1)
        });
        if !fits {
            return Err(Error::internal(format!(
                "input shape {:?} does not broadcast to output shape {:?}",
                t.shape, out_shape
            )));
        }
    }
    if n == 0 {
        return Ok(());
    }
    // The usual case, recognised without allocating (this runs on every call of a small op):
    // every input is contiguous with the output's element count, or a single element.
    let flat: Option<[bool; N]> = inputs
        .iter()
        .all(|t| t.numel() == 1 || (t.numel() == n && t.is_contiguous()))
        .then(|| std::array::from_fn(|k| inputs[k].numel() == 1 && n != 1));
    if let Some(bcast) = flat {
        return flat_run(pool, ptrs, bcast, op, n, &f);
    }
    let bs: Vec<Vec<isize>> = inputs
        .iter()
        .map(|t| broadcast_strides(&t.shape, &t.strides, out_shape))
        .collect();
    let per_dim: Vec<[isize; N]> = (0..out_shape.len())
        .map(|d| std::array::from_fn(|k| bs[k][d]))
        .collect();
    let (dims, strides) = coalesce(out_shape, &per_dim);
    let s_in = strides[strides.len() - 1];
    // Runs along the innermost dim where every input is contiguous or one broadcast value (a
    // per-channel bias over NCHW: runs of H * W; one run when the dims coalesce into one):
    // each run goes through the flat path, which vectorises (the element-by-element loop below
    // ran a [1, 128, 56, 56] + [128, 1, 1] add at half ONNX Runtime's speed).
    if s_in.iter().all(|&s| s == 0 || s == 1) {
        let bcast: [bool; N] = std::array::from_fn(|k| s_in[k] == 0);
        parallel_for(pool, n, GRAIN, |range| {
            // (the whole `Sync` wrappers, not their raw-pointer fields)
            let (ptrs, op): ([InPtr<T>; N], OutPtr<T>) = (ptrs, op);
            with_simd(
                #[inline(always)]
                || {
                    // (inlined, as `walk` is, so the runs compile at the level's features)
                    walk(
                        &dims,
                        &strides,
                        range,
                        #[inline(always)]
                        |offs, start, len| {
                            let run: [InPtr<T>; N] =
                                std::array::from_fn(|k| InPtr(ptrs[k].0.wrapping_offset(offs[k])));
                            // SAFETY: `walk` yields input k's offsets for the flat output positions
                            // `start .. start + len` (`offs[k]` for the first, then stride 1, or
                            // 0 where broadcast), elements its own shape and strides reach (it
                            // broadcasts to the output, checked above): `run[k]` is readable at
                            // `0..len`, or at 0 where broadcast. The output positions are inside
                            // this task's `range` of the contiguous `n`-element output
                            // (`parallel_for` ranges are disjoint). An input aliasing the output
                            // in place has its layout, so its run starts at `start` too.
                            unsafe {
                                flat_map::<T, N>(
                                    run,
                                    bcast,
                                    OutPtr(op.0.wrapping_add(start)),
                                    0..len,
                                    &f,
                                )
                            }
                        },
                    )
                },
            )
        });
        return Ok(());
    }
    parallel_for(pool, n, GRAIN, |range| {
        let mut bufs = [[T::C::default(); BLOCK]; N];
        let mut obuf = [T::C::default(); BLOCK];
        walk(&dims, &strides, range, |offs, start, len| {
            let mut b = 0;
            while b < len {
                let bl = BLOCK.min(len - b);
                for k in 0..N {
                    // SAFETY: `walk` yields, for the flat output positions `start + b ..
                    // start + b + bl`, offsets computed from input k's broadcast strides over
                    // the output shape (it broadcasts to it, checked above), i.e. offsets of
                    // elements its own shape and strides reach; broadcast dims add 0.
                    unsafe {
                        load_strided(
                            ptrs[k],
                            offs[k] + b as isize * s_in[k],
                            s_in[k],
                            &mut bufs[k][..bl],
                        )
                    };
                }
                for (j, o) in obuf[..bl].iter_mut().enumerate() {
                    *o = f(std::array::from_fn(|k| bufs[k][j]));
                }
                // SAFETY: `walk` stays within this task's `range` of the contiguous
                // `n`-element output, and `parallel_for` ranges are disjoint; the inputs of
                // this block were copied into `bufs` first, so an in-place alias is not read
                // after it is written.
                T::store(&obuf[..bl], unsafe { op.slice(start + b, bl) });
                b += bl;
            }
        });
    });
    Ok(())
}

/// The lanes of a tensor along `axis`: every 1-D line through the tensor in that direction, in
/// row-major order of the other dims. A rank-0 tensor has one lane of length 1.
pub struct Lanes {
    pub count: usize,
    pub n: usize,
    pub stride: isize,
    outer_shape: Vec<usize>,
    outer_strides: Vec<isize>,
}

impl Lanes {
    pub fn new(shape: &[usize], strides: &[isize], axis: usize) -> Lanes {
        if shape.is_empty() {
            return Lanes {
                count: 1,
                n: 1,
                stride: 1,
                outer_shape: vec![],
                outer_strides: vec![],
            };
        }
        let mut outer_shape = shape.to_vec();
        let mut outer_strides = strides.to_vec();
        let n = outer_shape.remove(axis);
        let stride = outer_strides.remove(axis);
        Lanes {
            count: numel(&outer_shape),
            n,
            stride,
            outer_shape,
            outer_strides,
        }
    }
    /// Element offset of the first element of lane `lane`.
    pub fn base(&self, lane: usize) -> isize {
        let mut r = lane;
        let mut off = 0isize;
        for d in (0..self.outer_shape.len()).rev() {
            let i = r % self.outer_shape[d];
            r /= self.outer_shape[d];
            off += i as isize * self.outer_strides[d];
        }
        off
    }
}

/// Lanes of a contiguous tensor of `shape` along `axis` (for outputs).
pub fn contiguous_lanes(shape: &[usize], axis: usize) -> Lanes {
    Lanes::new(shape, &kernel_core::contiguous_strides(shape), axis)
}

thread_local! {
    /// [`with_scratch`]'s buffer, kept between calls on this thread.
    static SCRATCH: std::cell::Cell<Vec<u64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Largest scratch buffer [`with_scratch`] keeps for the next call (bytes); larger ones are
/// freed after the call, so a thread never holds more than this between calls.
const SCRATCH_KEEP: usize = 4 << 20;

/// Runs `f` on a scratch slice of `n` values (contents unspecified: whatever the previous call
/// left), taken from a buffer this thread keeps between calls. A fresh buffer of a few hundred
/// KiB per call is fresh `mmap` memory whose page faults cost more than a half-type softmax
/// row's arithmetic (a 64K-element f16 row: 0.22 against 1.1 Gelem/s). A nested call (`f`
/// calling `with_scratch`) gets its own buffer. Inlined, so `f` compiles inside the caller's
/// [`with_simd`] body.
#[inline(always)]
pub fn with_scratch<C: Real, R>(n: usize, f: impl FnOnce(&mut [C]) -> R) -> R {
    const { assert!(std::mem::align_of::<C>() <= std::mem::align_of::<u64>()) };
    // (7 words more, to start the slice on a cache line: see [`LineAligned`])
    let words = (n * std::mem::size_of::<C>()).div_ceil(8) + 7;
    let mut v = SCRATCH.with(|s| s.take());
    if v.len() < words {
        v.resize(words, 0);
    }
    let off = v.as_ptr().align_offset(64).min(7);
    // SAFETY: `v` holds at least `n * size_of::<C>()` initialised bytes from word `off` <= 7
    // on, aligned for `C` (checked above), and every bit pattern is a valid `C` (f32 or f64,
    // the only `Real`s); `v` is owned here and not touched while the slice lives.
    let r = f(unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().add(off).cast::<C>(), n) });
    if v.len() * 8 <= SCRATCH_KEEP {
        SCRATCH.with(|s| s.set(v));
    }
    r
}

/// `len` floats, zeroed, from a 64-byte boundary: a cache line, so that no 512-bit load or
/// store of a vector at a multiple of 16 floats splits across two lines (an allocation is only
/// 16-byte aligned, and then every such load of a packed weight panel straddled two lines).
pub struct LineAligned {
    buf: Vec<f32>,
    off: usize,
    len: usize,
}

impl LineAligned {
    pub fn zeroed(len: usize) -> Self {
        let buf = vec![0f32; len + 15];
        let off = buf.as_ptr().align_offset(64).min(15);
        LineAligned { buf, off, len }
    }
    pub fn as_slice(&self) -> &[f32] {
        &self.buf[self.off..self.off + self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

/// Grain (in lanes) so a task gets about [`GRAIN`] elements.
pub fn lane_grain(n: usize) -> usize {
    (GRAIN / n.max(1)).max(1)
}

/// Partial sums of the fixed-order reductions below: element `i` of a row goes into partial
/// `i % ACC`, and the partials are added pairwise in a fixed tree. The order depends only on
/// the row length, never on threads or on the SIMD width the code was compiled for, and the
/// independent partials let the loop vectorise.
pub const ACC: usize = 16;

/// `dst.copy_from_slice(src)` for the short runs of small planes (a 7x7 or 14x14 layer's rows),
/// without a call to `memcpy`: its call and size dispatch cost more than copying 7 to 28 values
/// (a tenth of a 14x14 depthwise layer's time). 8 values at a time, then 4, 2 and 1.
#[inline(always)]
pub fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "copy_short: lengths differ");
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (a, b) in (&mut d).zip(&mut s) {
        let b: &[T; 8] = b.try_into().unwrap();
        a.copy_from_slice(b);
    }
    let (d, s) = (d.into_remainder(), s.remainder());
    let mut i = 0;
    if d.len() - i >= 4 {
        let b: &[T; 4] = s[i..i + 4].try_into().unwrap();
        d[i..i + 4].copy_from_slice(b);
        i += 4;
    }
    if d.len() - i >= 2 {
        let b: &[T; 2] = s[i..i + 2].try_into().unwrap();
        d[i..i + 2].copy_from_slice(b);
        i += 2;
    }
    if d.len() > i {
        d[i] = s[i];
    }
}

/// Add the [`ACC`] partials in a fixed tree order (16 -> 8 -> 4 -> 2 -> 1).
#[inline(always)]
pub fn tree_sum<C: Num>(mut acc: [C; ACC]) -> C {
    let mut w = ACC;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] = acc[j].add(acc[j + w]);
        }
    }
    acc[0]
}

/// Sum of `f(a[i], b[i])` over equal-length slices, in the fixed order described at [`ACC`].
#[inline(always)]
pub fn sum_zip<C: Num>(a: &[C], b: &[C], f: impl Fn(C, C) -> C) -> C {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [C::ZERO; ACC];
    let (ca, cb) = (a.chunks_exact(ACC), b.chunks_exact(ACC));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..ACC {
            acc[j] = acc[j].add(f(x[j], y[j]));
        }
    }
    for j in 0..ra.len() {
        acc[j] = acc[j].add(f(ra[j], rb[j]));
    }
    tree_sum(acc)
}

/// Sum of `f(a[i])`, in the fixed order described at [`ACC`].
#[inline(always)]
pub fn sum_map<C: Num>(a: &[C], f: impl Fn(C) -> C) -> C {
    sum_zip(a, a, |x, _| f(x))
}

/// Contiguous slice of `n` elements at `p + off` as the compute type, when the storage type
/// is the compute type.
///
/// # Safety
/// `p + off .. p + off + n` in bounds and not written for the caller-chosen lifetime `'a`.
#[inline(always)]
pub unsafe fn c_slice<'a, T: Scalar>(p: InPtr<T>, off: isize, n: usize) -> Option<&'a [T::C]> {
    if n == 0 {
        return T::as_c(&[]);
    }
    // SAFETY: the caller guarantees the `n` elements from `p + off` are valid and not written
    // while the slice lives.
    T::as_c(unsafe { std::slice::from_raw_parts(p.0.offset(off), n) })
}

/// Mutable form of [`c_slice`] for an output.
///
/// # Safety
/// `p + off .. p + off + n` in bounds, and accessed by nobody but the returned slice for the
/// caller-chosen lifetime `'a`.
#[inline(always)]
pub unsafe fn c_slice_mut<'a, T: Scalar>(
    p: OutPtr<T>,
    off: isize,
    n: usize,
) -> Option<&'a mut [T::C]> {
    if n == 0 {
        return T::as_c_mut(&mut []);
    }
    // SAFETY: the caller guarantees the `n` elements from `p + off` are in bounds and
    // exclusively this slice's while it lives.
    T::as_c_mut(unsafe { std::slice::from_raw_parts_mut(p.0.offset(off), n) })
}

/// `dst[i] = src[2 * i]`: every other value (a stride-2 layer's im2col rows and depthwise
/// fill; element by element this gather was most of such a layer's time). f32 on AVX2 CPUs: 8
/// values a time from two vectors by shuffles (the compiler left even fixed-size chunks of
/// this gather scalar). `src` must hold `2 * dst.len() - 1` values or more.
#[inline(always)]
pub fn every_other<T: Copy + 'static>(dst: &mut [T], src: &[T]) {
    let n = dst.len();
    assert!(
        n == 0 || src.len() > 2 * (n - 1),
        "every_other: src too short"
    );
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
        && simd_level() >= SimdLevel::Avx2Fma
    {
        // SAFETY: T is f32 (same TypeId), so both casts keep the element type, length and
        // lifetime; the CPU has AVX2 (`simd_level` never reports a level it lacks).
        done = unsafe {
            every_other_f32_avx2(
                &mut *(dst as *mut [T] as *mut [f32]),
                &*(src as *const [T] as *const [f32]),
            )
        };
    }
    // the rest (all of it below AVX2 or for other types) as pairs, the last one maybe single
    for (v, pair) in dst[done..].iter_mut().zip(src[2 * done..].chunks(2)) {
        *v = pair[0];
    }
}

/// The vector part of [`every_other`] for f32: `dst[i] = src[2 * i]` for `i` below the
/// returned count, 8 at a time while 16 source values are left.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn every_other_f32_avx2(dst: &mut [f32], src: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let mut i = 0;
    while i + 8 <= dst.len() && 2 * i + 16 <= src.len() {
        // SAFETY: src[2i..2i + 16] and dst[i..i + 8] are in bounds (the loop condition).
        unsafe {
            let a = _mm256_loadu_ps(src.as_ptr().add(2 * i));
            let b = _mm256_loadu_ps(src.as_ptr().add(2 * i + 8));
            // per 128-bit lane: a0 a2 b0 b2 | a4 a6 b4 b6, then the 64-bit pairs reordered
            let s = _mm256_shuffle_ps::<0b10_00_10_00>(a, b);
            let v = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(s)));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::{copy_short, every_other, half_key, with_scratch, Scalar, SCRATCH, SCRATCH_KEEP};
    use half::{bf16, f16};

    #[test]
    fn half_keys_order_every_f16_and_bf16_value_as_the_floats_compare() {
        fn check<T: Scalar<C = f32>>(from_bits: impl Fn(u16) -> T) {
            let mut all: Vec<(f32, i16)> = (0..=u16::MAX)
                .map(|h| (from_bits(h).to_c(), half_key(h, T::HALF_INF)))
                .collect();
            for &(v, key) in &all {
                assert_eq!(v.is_nan(), key == i16::MAX, "{v}: key {key}");
            }
            all.retain(|(v, _)| !v.is_nan());
            all.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
            for w in all.windows(2) {
                let ((a, ka), (b, kb)) = (w[0], w[1]);
                // equal floats (only -0 and +0 among different bits) get equal keys, larger
                // floats larger keys
                assert_eq!(a == b, ka == kb, "{a} ({ka}) and {b} ({kb})");
                assert!(ka <= kb, "{a} ({ka}) before {b} ({kb})");
            }
        }
        check(f16::from_bits);
        check(bf16::from_bits);
    }

    #[test]
    fn scratch_is_reused_line_aligned_nested_calls_get_their_own_and_large_ones_are_not_kept() {
        let kept = || {
            SCRATCH.with(|s| {
                let v = s.take();
                let (p, len) = (v.as_ptr() as usize, v.len());
                s.set(v);
                (p, len)
            })
        };
        let line = super::LineAligned::zeroed(100);
        assert_eq!(line.as_slice().as_ptr() as usize % 64, 0);
        assert_eq!(line.as_slice().len(), 100);
        with_scratch::<f32, _>(1000, |a| {
            assert_eq!(a.len(), 1000);
            assert_eq!(a.as_ptr() as usize % 64, 0, "from a cache line's start");
            a.fill(1.5);
            with_scratch::<f64, _>(300, |b| {
                assert_eq!(b.len(), 300);
                b.fill(-2.0);
            });
            // the nested call wrote its own buffer, not this one
            assert!(a.iter().all(|&v| v == 1.5));
        });
        let (p, len) = kept();
        assert!(len * 8 >= 1000 * 4, "a buffer is kept for the next call");
        let again = with_scratch::<f32, _>(500, |a| a.as_ptr() as usize);
        assert_eq!(again, p.next_multiple_of(64), "the next call reuses it");
        assert_eq!(again % 64, 0, "from a cache line's start");
        with_scratch::<f64, _>(SCRATCH_KEEP / 8 + 1, |a| a.fill(0.0));
        assert!(
            kept().1 * 8 <= SCRATCH_KEEP,
            "a buffer over the limit is freed"
        );
    }

    #[test]
    fn every_other_takes_the_even_values_at_every_length() {
        // u32 (the element-by-element loop) and f32 (shuffles on AVX2 CPUs)
        let src: Vec<u32> = (1..=90).collect();
        let srcf: Vec<f32> = src.iter().map(|&v| v as f32).collect();
        for n in 0usize..=40 {
            // the shortest source it may be given, and a longer one
            for len in [(2 * n).saturating_sub(1), 2 * n + 5] {
                let mut dst = vec![0u32; n];
                every_other(&mut dst, &src[..len]);
                let want: Vec<u32> = (0..n).map(|i| src[2 * i]).collect();
                assert_eq!(dst, want, "length {n}, source {len}");
                let mut dst = vec![0f32; n + 1];
                every_other(&mut dst[..n], &srcf[..len]);
                let want: Vec<f32> = (0..n).map(|i| srcf[2 * i]).chain([0.0]).collect();
                assert_eq!(dst, want, "f32: length {n}, source {len}");
            }
        }
    }

    #[test]
    fn copy_short_copies_every_length_and_nothing_else() {
        let src: Vec<u32> = (1..=41).collect();
        for n in 0..=40 {
            let mut dst = [0u32; 42];
            copy_short(&mut dst[1..1 + n], &src[..n]);
            assert_eq!(dst[1..1 + n], src[..n], "length {n}");
            assert!(
                dst[..1].iter().chain(&dst[1 + n..]).all(|&v| v == 0),
                "length {n}"
            );
        }
    }
}
