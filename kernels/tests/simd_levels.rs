//! Every instruction-set level the kernels can run at gives the same bits, and each is within
//! tolerance of an independent f64 reference: gelu (both forms) and softmax, forced to the
//! baseline build and to AVX2+FMA (where the CPU has it).

mod util;

use kernel_core::DType;
use polyop_kernels::{force_simd_level, simd_level, SimdLevel};
use util::*;

/// gelu in f64 from libm's erfc / exp, without cancellation in the negative tail.
fn gelu_ref(x: f64, tanh: bool) -> f64 {
    if tanh {
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        let e = (-2.0 * u.abs()).exp();
        x * if u >= 0.0 {
            1.0 / (1.0 + e)
        } else {
            e / (1.0 + e)
        }
    } else {
        0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }
}

fn softmax_ref(v: &[f64], n: usize) -> Vec<f64> {
    v.chunks(n)
        .flat_map(|l| {
            let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = l.iter().map(|x| (x - m).exp()).sum();
            l.iter().map(move |x| (x - m).exp() / s)
        })
        .collect()
}

fn levels() -> Vec<SimdLevel> {
    force_simd_level(None);
    let mut v = vec![SimdLevel::Baseline];
    if simd_level() == SimdLevel::Avx2Fma {
        v.push(SimdLevel::Avx2Fma);
    }
    v
}

#[test]
fn every_level_same_bits_and_within_tolerance() {
    let mut rng = XRng::new(18);
    // gelu: a wide spread including the tails, zeros and odd lengths (remainder loops)
    let mut g = rng.vec(4099, -16.0, 16.0);
    g.extend([0.0, -0.0, -14.0, -10.5, 1e-30, -1e-30, 7.0]);
    // softmax: rows of 1024 and a long row of 65536, a row spread over 90 (underflowing
    // terms) and an odd length
    let rows = rng.vec(8 * 1024, -8.0, 8.0);
    let long = rng.vec(65536, -20.0, 20.0);
    let odd = rng.vec(3 * 37, -90.0, 0.0);
    let mut first: Option<Vec<Vec<kernel_core::OwnedTensor>>> = None;
    for level in levels() {
        force_simd_level(Some(level));
        assert_eq!(simd_level(), level);
        let mut outs = Vec::new();
        for dt in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let x = tensor(&g, &[g.len()], dt);
            let xr = rounded(&g, dt);
            for mode in ["none", "tanh"] {
                let got = run_ok("gelu", &[&x], &[("approximate", string(mode))]);
                let want: Vec<f64> = xr.iter().map(|&v| gelu_ref(v, mode == "tanh")).collect();
                assert_close(&vals(&got[0]), &want, dt, &format!("gelu {mode} {level:?}"));
                outs.push(got);
            }
            for (v, n) in [(&rows, 1024), (&long, 65536), (&odd, 37)] {
                let x = tensor(v, &[v.len() / n, n], dt);
                let got = run_ok("softmax", &[&x], &[]);
                // (for float64 the f64 reference's own plain sum is no better than the kernel's
                // on long rows: checked on the short ones only)
                if dt != DType::F64 || n < 1024 {
                    let want = softmax_ref(&rounded(v, dt), n);
                    assert_close(&vals(&got[0]), &want, dt, &format!("softmax {level:?}"));
                }
                outs.push(got);
            }
        }
        match &first {
            None => first = Some(outs),
            Some(f) => {
                for (a, b) in f.iter().zip(&outs) {
                    assert_bitwise(a, b, &format!("{level:?} against the baseline build"));
                }
            }
        }
    }
    force_simd_level(None);
}
