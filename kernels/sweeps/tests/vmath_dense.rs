//! The ulp sweeps of the vector math's float32 functions against float64 references, run
//! optimised (`cargo test --release -p polyop-kernel-sweeps`): millions of inputs each, and
//! the dense sweep of gelu's fast range, hundreds of millions (~135 s here, ~500 s in an
//! unoptimised build). Unoptimised, the lighter sweeps alone took 140 s of the kernels' unit
//! tests. ci/test.sh runs them after the workspace's debug tests; a debug `cargo test` lists
//! them as ignored, with that command as the reason.

#[path = "../../tests/util/ulp.rs"]
mod ulp;

use polyop_kernels::vmath::{
    exp_diff_f32, exp_f32, gelu_erf_f32, gelu_erf_mid, gelu_tanh_f32, norm_cdf_f32, tanh_f32,
    GELU_MID,
};
use ulp::{gelu_erf_ref, gelu_tanh_ref, max_ulps, sweep, ulps};

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "300M inputs, run optimised: cargo test --release -p polyop-kernel-sweeps"
)]
fn gelu_erf_mid_range_dense() {
    // every f32 in [-4, 4] whose bits are a multiple of 7 (~300M inputs), the range the fast
    // path covers (the whole-range sweep in vmath's unit tests steps too coarsely for it alone)
    let (u, x) = max_ulps(-GELU_MID, GELU_MID, 7, gelu_erf_mid, gelu_erf_ref);
    eprintln!("gelu erf, |x| <= {GELU_MID}: max {u} ulp (at {x:e})");
    assert!(u <= 4.0, "gelu erf mid: {u} ulp at {x:e}");
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "an ulp sweep, run optimised: cargo test --release -p polyop-kernel-sweeps"
)]
fn exp_within_2_ulp() {
    let (u, x) = max_ulps(-110.0, 89.0, 101, exp_f32, f64::exp);
    assert!(u <= 2.0, "exp: {u} ulp at {x}");
    assert_eq!(exp_f32(0.0), 1.0);
    assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp_f32(89.0), f32::INFINITY);
    assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_f32(-104.0), 0.0);
    assert!(exp_f32(f32::NAN).is_nan());
    assert!(exp_f32(-100.0) > 0.0, "gradual underflow");
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "an ulp sweep, run optimised: cargo test --release -p polyop-kernel-sweeps"
)]
fn exp_diff_within_1_5_ulp() {
    // e^(x - m) against f64 over dense x for a few maxima, the difference large and small,
    // subnormal results included
    for m in [0.0f32, 1.0, -3.5, 80.0, 1e4, -1e4, 3e38] {
        let mut worst = (0.0, 0.0);
        sweep(-1e38, 3e38, 1009, |x| {
            if x > m {
                return;
            }
            let got = exp_diff_f32(x, m);
            let want = (x as f64 - m as f64).exp();
            let u = ulps(got, want);
            if u > worst.0 {
                worst = (u, x);
            }
        });
        assert!(
            worst.0 <= 1.5,
            "e^(x - {m}): {} ulp at x = {}",
            worst.0,
            worst.1
        );
    }
    assert_eq!(exp_diff_f32(2.0, 2.0), 1.0);
    assert_eq!(exp_diff_f32(-3e38, 3e38), 0.0);
    // gradual underflow: e^-100 = 3.7e-44 is a subnormal, not 0
    let (g, w) = (exp_diff_f32(-100.0, 0.0), (-100f64).exp());
    assert!(g > 0.0 && ulps(g, w) <= 0.5, "e^-100 = {g:e}");
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "an ulp sweep, run optimised: cargo test --release -p polyop-kernel-sweeps"
)]
fn tanh_within_3_ulp() {
    let (u, x) = max_ulps(-20.0, 20.0, 101, tanh_f32, f64::tanh);
    assert!(u <= 3.0, "tanh: {u} ulp at {x}");
    assert_eq!(tanh_f32(f32::INFINITY), 1.0);
    assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
    assert_eq!(tanh_f32(1e30), 1.0);
    assert!(tanh_f32(f32::NAN).is_nan());
    assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
}

/// Phi in f64 from an independent erfc: continued fraction in the tail, series near 0.
fn phi_ref(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let erfc = if z < 2.0 {
        // erf Maclaurin series
        let (mut term, mut sum, z2) = (z, z, z * z);
        for n in 1..200 {
            term *= -z2 / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        1.0 - 2.0 / std::f64::consts::PI.sqrt() * sum
    } else {
        // Lentz continued fraction for erfc
        let mut f = 0.0;
        for k in (1..300).rev() {
            f = (k as f64 / 2.0) / (z + f);
        }
        (-z * z).exp() / std::f64::consts::PI.sqrt() / (z + f)
    };
    if x > 0.0 {
        1.0 - 0.5 * erfc
    } else {
        0.5 * erfc
    }
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "an ulp sweep, run optimised: cargo test --release -p polyop-kernel-sweeps"
)]
fn norm_cdf_within_6_ulp() {
    let (u, x) = max_ulps(-14.0, 8.0, 2003, norm_cdf_f32, phi_ref);
    assert!(u <= 6.0, "Phi: {u} ulp at {x}");
    assert_eq!(norm_cdf_f32(f32::INFINITY), 1.0);
    assert_eq!(norm_cdf_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(norm_cdf_f32(0.0), 0.5);
    assert!(norm_cdf_f32(f32::NAN).is_nan());
}

/// Max ulp error of `f` against `r` over every f32 whose bit pattern is a multiple of
/// `step` (both signs, zeros, subnormals, infinities; NaN patterns must give NaN).
fn whole_range(step: u32, f: impl Fn(f32) -> f32, r: impl Fn(f64) -> f64) -> (f64, f32) {
    let mut worst = (0.0, 0.0);
    for bits in (0..=u32::MAX).step_by(step as usize) {
        let x = f32::from_bits(bits);
        let got = f(x);
        if x.is_nan() {
            assert!(got.is_nan(), "NaN in, {got} out");
            continue;
        }
        let want = r(x as f64);
        if x.is_infinite() {
            continue; // limits are checked by hand
        }
        let u = ulps(got, want);
        if u > worst.0 {
            worst = (u, x);
        }
    }
    worst
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "an ulp sweep, run optimised: cargo test --release -p polyop-kernel-sweeps"
)]
fn gelu_erf_within_4_ulp_over_the_f32_range() {
    // 2^32 / 509 = 8.4M inputs spread over every binade, plus a dense sweep of the range
    // where gelu is neither x nor 0
    let (u, x) = whole_range(509, gelu_erf_f32, gelu_erf_ref);
    assert!(u <= 4.0, "gelu erf: {u} ulp at {x:e}");
    let (u, x) = max_ulps(-15.0, 15.0, 101, gelu_erf_f32, gelu_erf_ref);
    assert!(u <= 4.0, "gelu erf: {u} ulp at {x:e}");
    eprintln!("gelu erf: max {u} ulp (at {x:e})");
    assert_eq!(gelu_erf_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(gelu_erf_f32(f32::MAX), f32::MAX);
    assert_eq!(gelu_erf_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(gelu_erf_f32(0.0).to_bits(), 0);
    assert_eq!(gelu_erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
    assert!(gelu_erf_f32(f32::NAN).is_nan());
    // the negative tail is tiny, not zero, down to the subnormals: -13 is normal
    // (-7.9e-38), -14 subnormal (-1.1e-43, about 80 times the smallest subnormal)
    for x in [-10.0f32, -13.0, -13.5, -14.0, -14.2] {
        let (g, w) = (gelu_erf_f32(x), gelu_erf_ref(x as f64));
        assert!(g < 0.0 && (w as f32) < 0.0, "gelu({x}) = {g}, want {w:e}");
        assert!(ulps(g, w) <= 4.0, "gelu({x}) = {g:e}, want {w:e}");
    }
    assert_eq!(gelu_erf_f32(-15.0), 0.0, "below the smallest subnormal");
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "an ulp sweep, run optimised: cargo test --release -p polyop-kernel-sweeps"
)]
fn gelu_tanh_within_4_ulp_over_the_f32_range() {
    let (u, x) = whole_range(509, gelu_tanh_f32, gelu_tanh_ref);
    assert!(u <= 4.0, "gelu tanh: {u} ulp at {x:e}");
    let (u, x) = max_ulps(-12.0, 12.0, 101, gelu_tanh_f32, gelu_tanh_ref);
    assert!(u <= 4.0, "gelu tanh: {u} ulp at {x:e}");
    eprintln!("gelu tanh: max {u} ulp (at {x:e})");
    assert_eq!(gelu_tanh_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(gelu_tanh_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(gelu_tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
    assert!(gelu_tanh_f32(f32::NAN).is_nan());
    // tiny, not zero: -9 gives -1.3e-28, -10.5 a subnormal
    for x in [-9.0f32, -10.0, -10.5] {
        let (g, w) = (gelu_tanh_f32(x), gelu_tanh_ref(x as f64));
        assert!(
            g < 0.0 && (w as f32) < 0.0,
            "gelu tanh({x}) = {g}, want {w:e}"
        );
        assert!(ulps(g, w) <= 4.0, "gelu tanh({x}) = {g:e}, want {w:e}");
    }
}
