//! Every instruction-set level the kernels can run at gives the same bits, and each is within
//! tolerance of an independent f64 reference: gelu (both forms) and softmax, forced to the
//! baseline build, to AVX2+FMA and to AVX-512 (each where the CPU has it; a level the CPU lacks
//! is reported as skipped on stderr, not passed); and every other stock op, bit for bit
//! against the baseline.

mod util;

use kernel_core::DType;
use polyop_kernels::{cpu_simd_level, force_simd_level, simd_level, SimdLevel};
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

/// The forced level is process-wide: the tests here take turns.
static LEVEL_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The levels this CPU can run, lowest first; the others are reported as skipped.
fn levels() -> Vec<SimdLevel> {
    force_simd_level(None);
    let best = cpu_simd_level();
    let all = [SimdLevel::Baseline, SimdLevel::Avx2Fma, SimdLevel::Avx512];
    for l in all.iter().filter(|&&l| l > best) {
        eprintln!(
            "SKIPPED: SIMD level {l:?} not tested: this CPU lacks it (best level here: {best:?}); \
             its code is compiled and dispatched at run time but not executed in this run"
        );
    }
    all.into_iter().filter(|&l| l <= best).collect()
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
    let _turn = LEVEL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
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

/// float32 softmax rows of every length up to 70 and around each multiple of the 16-lane
/// chunk and of the 256-element sum block, with the rows that leave the fast formula (-inf,
/// NaN, a spread past e^-86, an infinite maximum) in a whole chunk and in the tail: each level
/// bit for bit against the baseline build (at AVX-512 most of these rows take the fused row
/// routine, `vmath::softmax_row_f32`; the rest its fallback) and within tolerance of the f64
/// reference.
#[test]
fn softmax_rows_of_every_length_same_bits_at_every_level() {
    let mut rng = XRng::new(1919);
    let mut lengths: Vec<usize> = (1..=70).collect();
    lengths.extend([127, 128, 129, 255, 256, 257, 511, 512, 513, 1000, 4097]);
    let mut rows: Vec<Vec<f64>> = lengths.iter().map(|&n| rng.vec(n, -8.0, 8.0)).collect();
    for n in [5, 16, 37, 300] {
        for (at, v) in [
            (n - 1, f64::NEG_INFINITY),
            (0, f64::NEG_INFINITY),
            (n - 1, f64::NAN),
            (n / 2, f64::NAN),
            (n - 1, -100.0),
            (0, -87.0),
            (n / 2, f64::INFINITY),
            (n - 1, 1e30),
        ] {
            let mut r = rng.vec(n, -4.0, 4.0);
            r[at] = v;
            rows.push(r);
        }
    }
    rows.push(vec![3.0; 33]);
    // attention rows under a causal mask: the masked elements -inf or float32's lowest, from
    // one element kept to all but one masked
    for masked in [f64::NEG_INFINITY, f32::MIN as f64] {
        for keep in [1, 2, 15, 16, 17, 64, 127] {
            let mut r = rng.vec(128, -6.0, 6.0);
            r[keep..].iter_mut().for_each(|v| *v = masked);
            rows.push(r);
        }
    }
    let _turn = LEVEL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut first: Option<Vec<Vec<kernel_core::OwnedTensor>>> = None;
    for level in levels() {
        force_simd_level(Some(level));
        let mut outs = Vec::new();
        for r in &rows {
            // two rows of the same values, the second one reversed
            let mut v = r.clone();
            v.extend(r.iter().rev());
            let x = tensor(&v, &[2, r.len()], DType::F32);
            let got = run_ok("softmax", &[&x], &[]);
            let want = softmax_ref(&rounded(&v, DType::F32), r.len());
            let (g, w) = (vals(&got[0]), want);
            // (NaN rows: NaN everywhere, as the reference)
            assert_close(
                &g,
                &w,
                DType::F32,
                &format!("softmax {level:?}, rows of {}", r.len()),
            );
            outs.push(got);
        }
        match &first {
            None => first = Some(outs),
            Some(f) => {
                for (a, b) in f.iter().zip(&outs) {
                    assert_bitwise(
                        a,
                        b,
                        &format!("softmax rows at {level:?} against the baseline"),
                    );
                }
            }
        }
    }
    force_simd_level(None);
}

/// Every stock op (forward and backward) on float32 and a few other dtypes, forced to each
/// level, bit for bit against the baseline build (including the reductions: softmax and
/// rms_norm sums, the backward ops' broadcast reductions, conv2d).
#[test]
fn every_op_same_bits_at_every_level() {
    let mut rng = XRng::new(1818);
    let a = rng.vec(3 * 257, -6.0, 6.0);
    let b = rng.vec(3 * 257, -6.0, 6.0);
    let g = rng.vec(3 * 257, -2.0, 2.0);
    let w = rng.vec(257, 0.5, 1.5);
    let img = rng.vec(2 * 3 * 9 * 11, -1.0, 1.0);
    let ker = rng.vec(4 * 3 * 3 * 3, -1.0, 1.0);
    let cb = rng.vec(4, -1.0, 1.0);
    let cg = rng.vec(2 * 4 * 9 * 11, -1.0, 1.0);
    // a depthwise conv2d (its own path; at stride 2 on AVX2 CPUs, split in registers)
    let dimg = rng.vec(2 * 3 * 9 * 21, -1.0, 1.0);
    let dker = rng.vec(3 * 3 * 3, -1.0, 1.0);
    // a 3x3 stride-1 conv2d with rows of 30 (on AVX2 CPUs its own path: no im2col)
    let simg = rng.vec(8 * 6 * 30, -1.0, 1.0);
    let sker = rng.vec(7 * 8 * 3 * 3, -1.0, 1.0);
    let sb = rng.vec(7, -1.0, 1.0);
    let _turn = LEVEL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut first: Option<Vec<Vec<kernel_core::OwnedTensor>>> = None;
    for level in levels() {
        force_simd_level(Some(level));
        assert_eq!(simd_level(), level);
        let mut outs = Vec::new();
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let sh = [3, 257];
            let (x, y, gr) = (
                tensor(&a, &sh, dt),
                tensor(&b, &sh, dt),
                tensor(&g, &sh, dt),
            );
            let wt = tensor(&w, &[257], dt);
            let yb = tensor(&b[..257], &[257], dt);
            outs.push(run_ok("negate", &[&x], &[]));
            outs.push(run_ok("add", &[&x, &y], &[]));
            outs.push(run_ok("add", &[&x, &yb], &[]));
            outs.push(run_ok("scale", &[&x], &[("alpha", float(-1.7))]));
            outs.push(run_ok("relu", &[&x], &[]));
            outs.push(run_ok("add_relu", &[&x, &yb], &[]));
            outs.push(run_ok("relu_backward", &[&gr, &x], &[]));
            outs.push(run_ok("add_backward", &[&gr, &x, &yb], &[]));
            outs.push(run_ok("add_relu_backward", &[&gr, &x, &yb], &[]));
            for mode in ["none", "tanh"] {
                outs.push(run_ok("gelu", &[&x], &[("approximate", string(mode))]));
                outs.push(run_ok(
                    "gelu_backward",
                    &[&gr, &x],
                    &[("approximate", string(mode))],
                ));
            }
            let sm = run_ok("softmax", &[&x], &[]);
            outs.push(run_ok("softmax_backward", &[&gr, &sm[0]], &[]));
            outs.push(sm);
            outs.push(run_ok("softmax", &[&x], &[("axis", int(0))]));
            outs.push(run_ok("rms_norm", &[&x, &wt], &[]));
            outs.push(run_ok("rms_norm_backward", &[&gr, &x, &wt], &[]));
            let tk = run_ok("topk", &[&x], &[("k", int(5))]);
            outs.push(run_ok("topk_backward", &[&tk[0], &x, &tk[1]], &[]));
            outs.push(tk);
            outs.push(run_ok("nonzero", &[&tensor(&a, &sh, dt)], &[]));
            let (im, kr, bi) = (
                tensor(&img, &[2, 3, 9, 11], dt),
                tensor(&ker, &[4, 3, 3, 3], dt),
                tensor(&cb, &[4], dt),
            );
            let conv_attrs = [("padding", int(1)), ("stride", int(1))];
            outs.push(run_ok("conv2d", &[&im, &kr, &bi], &conv_attrs));
            for stride in [1, 2] {
                outs.push(run_ok(
                    "conv2d",
                    &[
                        &tensor(&dimg, &[2, 3, 9, 21], dt),
                        &tensor(&dker, &[3, 1, 3, 3], dt),
                        &tensor(&cb[..3], &[3], dt),
                    ],
                    &[
                        ("padding", int(1)),
                        ("stride", int(stride)),
                        ("groups", int(3)),
                    ],
                ));
            }
            outs.push(run_ok(
                "conv2d",
                &[
                    &tensor(&simg, &[1, 8, 6, 30], dt),
                    &tensor(&sker, &[7, 8, 3, 3], dt),
                    &tensor(&sb, &[7], dt),
                ],
                &conv_attrs,
            ));
            let cgr = tensor(&cg, &[2, 4, 9, 11], dt);
            outs.push(run_ok(
                "conv2d_backward",
                &[&cgr, &im, &kr, &bi],
                &conv_attrs,
            ));
        }
        for dt in [DType::I32, DType::I64] {
            let ia = rng_ints(&a);
            let x = tensor(&ia, &[3, 257], dt);
            outs.push(run_ok("negate", &[&x], &[]));
            outs.push(run_ok("add", &[&x, &x], &[]));
            outs.push(run_ok("relu", &[&x], &[]));
            outs.push(run_ok("topk", &[&x], &[("k", int(3))]));
            outs.push(run_ok("nonzero", &[&x], &[]));
        }
        match &first {
            None => first = Some(outs),
            Some(f) => {
                assert_eq!(f.len(), outs.len());
                for (a, b) in f.iter().zip(&outs) {
                    assert_bitwise(a, b, &format!("{level:?} against the baseline build"));
                }
            }
        }
    }
    force_simd_level(None);
}

/// Integers from floats (truncated), some of them zero.
fn rng_ints(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| x.trunc()).collect()
}

/// conv2d's f32 paths at every level: the 1x1 and im2col tiles (16 positions a tile on AVX2,
/// 32 on AVX-512, two panels a tile on small planes, with half tiles, masked tails and the
/// one-or-two-position tail of packed weights), the channel-vectorized path (panels of 16
/// output channels on AVX2, 32 or 64 on AVX-512, a part-empty last panel, several channel
/// passes), each unpacked, with its weight prepacked
/// at that level (as ONNX Runtime's provider does), and with a fused relu epilogue: the bits of
/// the baseline build's unpacked call, and within float32 rounding of a float64 convolution.
#[test]
fn conv2d_paths_same_bits_at_every_level_packed_or_not() {
    // (channels, height, width, outputs, kernel, stride, padding, groups)
    let cases: [[usize; 8]; 13] = [
        [40, 7, 7, 20, 1, 1, 0, 1],   // 49 positions: a tile of 32 and one of 17
        [24, 3, 11, 50, 1, 1, 0, 1],  // 33: a tail of one, 9 panels
        [16, 2, 17, 100, 1, 1, 0, 1], // 34: a tail of two, 17 panels (packed B)
        [300, 5, 5, 13, 1, 1, 0, 1],  // three channel passes
        [12, 9, 9, 7, 1, 2, 0, 1],    // 1x1 stride 2: im2col
        [12, 6, 9, 48, 3, 1, 1, 1],   // channel panels 32 + 16 on AVX-512
        [70, 10, 10, 40, 3, 1, 1, 1], // several channel passes
        [8, 11, 13, 10, 5, 2, 2, 2],  // grouped, strided
        [3, 20, 20, 16, 7, 2, 3, 1],  // a ResNet stem
        [20, 6, 7, 112, 3, 1, 1, 1],  // channel panels 64 + 48 on AVX-512, three passes
        [128, 5, 5, 128, 3, 1, 1, 2], // two groups of 64 output channels, nine passes
        [3, 15, 17, 20, 3, 2, 1, 1],  // 27 kernel rows: an im2col stem on the tiles
        [20, 11, 12, 40, 3, 1, 1, 1], // prepacked: 3 chunks of positions (the last part-full), 2 passes each
    ];
    let conv = polyop_kernels::registry().lookup("conv2d").unwrap();
    let relu = match polyop_kernels::registry().lookup("relu").unwrap().epilogue {
        Some(kernel_core::EpilogueFn::Unary(f)) => [kernel_core::Epilogue::Unary(f)],
        _ => panic!("relu has a unary epilogue form"),
    };
    let mut rng = XRng::new(2121);
    let _turn = LEVEL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for [c, h, w, o, k, s, p, g] in cases {
        let (oh, ow) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
        let cg = c / g;
        let x = rng.vec(c * h * w, -1.0, 1.0);
        let wt = rng.vec(o * cg * k * k, -1.0, 1.0);
        let b = rng.vec(o, -1.0, 1.0);
        let (xt, wtt, bt) = (
            tensor(&x, &[1, c, h, w], DType::F32),
            tensor(&wt, &[o, cg, k, k], DType::F32),
            tensor(&b, &[o], DType::F32),
        );
        let attrs = conv
            .bind_attrs([
                ("stride", int(s as i64)),
                ("padding", int(p as i64)),
                ("groups", int(g as i64)),
            ])
            .unwrap();
        let views = [Some(xt.view()), Some(wtt.view()), Some(bt.view())];
        // (prepacked: the weight's packed form made at the level in force; relu: fused)
        let call = |prepacked: bool, relu_fused: bool| -> Vec<u32> {
            let pp: Vec<(usize, kernel_core::Prepacked)> = if prepacked {
                vec![(1, (conv.prepack.unwrap())(1, &wtt.view(), &attrs).unwrap())]
            } else {
                Vec::new()
            };
            let mut out = kernel_core::OwnedTensor::zeros(DType::F32, &[1, o, oh, ow]);
            {
                let mut outs = [out.view_mut()];
                let mut ctx = kernel_core::KernelCtx::new(
                    conv,
                    &views,
                    &mut outs,
                    &attrs,
                    &kernel_core::SerialPool,
                )
                .with_prepacked(&pp)
                .with_epilogue(relu_fused.then_some(&relu[..]));
                conv.compute(&mut ctx).unwrap();
                if ctx.take_epilogue().is_some() {
                    kernel_core::Epilogue::apply_all(
                        &relu,
                        outs[0].as_mut_slice::<f32>().unwrap(),
                        0,
                    );
                }
            }
            out.as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        // the float64 convolution, and each output's bound: (taps + 1) roundings of the
        // magnitudes it sums
        let (og, kk) = (o / g, k * k);
        let mut want = vec![0f64; o * oh * ow];
        let mut bound = vec![0f64; o * oh * ow];
        for oc in 0..o {
            for (q, (wv, bv)) in want[oc * oh * ow..][..oh * ow]
                .iter_mut()
                .zip(&mut bound[oc * oh * ow..][..oh * ow])
                .enumerate()
            {
                let (r, col) = (q / ow, q % ow);
                let (mut acc, mut mag) = (b[oc], b[oc].abs());
                for ci in 0..cg {
                    let ch = oc / og * cg + ci;
                    for t in 0..kk {
                        let (ih, iw) = (
                            (r * s + t / k) as isize - p as isize,
                            (col * s + t % k) as isize - p as isize,
                        );
                        if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                            continue;
                        }
                        let v = x[(ch * h + ih as usize) * w + iw as usize]
                            * wt[(oc * cg + ci) * kk + t];
                        acc += v;
                        mag += v.abs();
                    }
                }
                *wv = acc;
                *bv = mag * (cg * kk + 1) as f64 * f32::EPSILON as f64 / 2.0;
            }
        }
        let mut first: Option<[Vec<u32>; 2]> = None;
        for level in levels() {
            force_simd_level(Some(level));
            let case =
                format!("{c}x{h}x{w} -> {o}, {k}x{k} stride {s} pad {p} groups {g}, {level:?}");
            let plain = call(false, false);
            for (i, (&got, (&wv, &bv))) in plain.iter().zip(want.iter().zip(&bound)).enumerate() {
                let got = f32::from_bits(got) as f64;
                assert!(
                    (got - wv).abs() <= bv,
                    "{case}: output {i} is {got}, want {wv} +- {bv}"
                );
            }
            let relu_bits: Vec<u32> = plain
                .iter()
                .map(|&v| f32::from_bits(v).max(0.0).to_bits())
                .collect();
            assert_eq!(call(true, false), plain, "{case}: prepacked");
            assert_eq!(call(false, true), relu_bits, "{case}: fused relu");
            assert_eq!(call(true, true), relu_bits, "{case}: prepacked, fused relu");
            match &first {
                None => first = Some([plain, relu_bits]),
                Some([f, _]) => assert_eq!(&plain, f, "{case}: against the baseline build"),
            }
        }
    }
    force_simd_level(None);
}
