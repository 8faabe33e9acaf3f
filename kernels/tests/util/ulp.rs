//! Ulp distances and sweeps over f32 bit patterns, for checking the vector math
//! (`polyop_kernels::vmath`) against float64 references. Shared by vmath's unit tests
//! (`#[path]`) and the optimised dense sweeps in `kernels/sweeps/tests/vmath_dense.rs`.
#![allow(dead_code)]

/// Distance in f32 ulps (of the reference rounded to f32) between `got` and `want`.
pub fn ulps(got: f32, want: f64) -> f64 {
    if got as f64 == want {
        return 0.0;
    }
    let w = want as f32;
    let ulp = if w == 0.0 || w.is_subnormal() {
        f32::from_bits(1) as f64
    } else {
        let b = w.abs().to_bits();
        (f32::from_bits(b + 1) - f32::from_bits(b)) as f64
    };
    (got as f64 - want).abs() / ulp
}

/// Every f32 in [lo, hi] whose bits are a multiple of `step`.
pub fn sweep(lo: f32, hi: f32, step: u32, mut f: impl FnMut(f32)) {
    for bits in (0..=u32::MAX).step_by(step as usize) {
        let x = f32::from_bits(bits);
        if x >= lo && x <= hi {
            f(x);
        }
    }
}

/// The largest ulp distance of `f` from `r` over `sweep(lo, hi, step)`, and where.
pub fn max_ulps(
    lo: f32,
    hi: f32,
    step: u32,
    f: impl Fn(f32) -> f32,
    r: impl Fn(f64) -> f64,
) -> (f64, f32) {
    let mut worst = (0.0, 0.0);
    sweep(lo, hi, step, |x| {
        let u = ulps(f(x), r(x as f64));
        if u > worst.0 {
            worst = (u, x);
        }
    });
    worst
}

/// gelu in f64, from libm's erfc (independent of vmath): x Phi(x) with
/// Phi(x) = erfc(-x / sqrt 2) / 2, relative accuracy in the negative tail.
pub fn gelu_erf_ref(x: f64) -> f64 {
    0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

/// gelu's tanh form in f64: x / (1 + e^(-2u)), evaluated without cancellation.
pub fn gelu_tanh_ref(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    if u >= 0.0 {
        x / (1.0 + (-2.0 * u).exp())
    } else {
        let e = (2.0 * u).exp();
        x * e / (1.0 + e)
    }
}
