//! softmax, rms_norm and topk (ops along an axis) against naive f64 references.

mod util;

use kernel_core::half::{bf16, f16};
use kernel_core::{DType, Dim, OwnedTensor, SerialPool, TensorSpec};
use proptest::prelude::*;
use util::*;

/// Apply `f` to every lane along `axis` of a row-major f64 array: returns the row-major
/// result with the lane length changed to whatever `f` returns.
fn per_lane(
    v: &[f64],
    shape: &[usize],
    axis: usize,
    f: impl Fn(&[f64]) -> Vec<f64>,
) -> (Vec<f64>, Vec<usize>) {
    if shape.is_empty() {
        let r = f(v);
        return (r.clone(), if r.len() == 1 { vec![] } else { vec![r.len()] });
    }
    let n = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out_shape = shape.to_vec();
    let mut m = None;
    let mut res: Vec<Vec<f64>> = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let lane: Vec<f64> = (0..n).map(|j| v[(o * n + j) * inner + i]).collect();
            let r = f(&lane);
            m = Some(r.len());
            res.push(r);
        }
    }
    let m = m.unwrap_or_else(|| f(&vec![0.0; n]).len());
    out_shape[axis] = m;
    let mut out = vec![0.0; outer * m * inner];
    for o in 0..outer {
        for i in 0..inner {
            for j in 0..m {
                out[(o * m + j) * inner + i] = res[o * inner + i][j];
            }
        }
    }
    (out, out_shape)
}

fn softmax_ref(l: &[f64]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = l.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

fn rms_ref(l: &[f64], w: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let ms = l.iter().map(|v| v * v).sum::<f64>() / l.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    l.iter()
        .enumerate()
        .map(|(j, v)| v * r * w.map_or(1.0, |w| w[j]))
        .collect()
}

/// Full stable sort of (value, index) with NaN largest, then take k.
fn topk_ref(l: &[f64], k: usize, largest: bool) -> (Vec<f64>, Vec<f64>) {
    let mut idx: Vec<usize> = (0..l.len()).collect();
    let key = |v: f64| if v.is_nan() { f64::INFINITY } else { v };
    let rank = |v: f64| if v.is_nan() { 1 } else { 0 };
    idx.sort_by(|&a, &b| {
        let (va, vb) = (l[a], l[b]);
        let ord = (rank(va), key(va))
            .partial_cmp(&(rank(vb), key(vb)))
            .unwrap();
        if largest {
            ord.reverse()
        } else {
            ord
        }
    });
    let take = &idx[..k];
    (
        take.iter().map(|&i| l[i]).collect(),
        take.iter().map(|&i| i as f64).collect(),
    )
}

// ------------------------------------------------------------------------------ softmax

#[test]
fn softmax_hand_and_reference() {
    let x = f64t(&[1.0, 2.0, 3.0], &[3]);
    let got = vals(&run_ok("softmax", &[&x], &[])[0]);
    assert_close(
        &got,
        &[
            0.090_030_573_170_380_46,
            0.244_728_471_054_797_64,
            0.665_240_955_774_821_9,
        ],
        DType::F64,
        "softmax",
    );
    let mut rng = XRng::new(2);
    let shape = [3usize, 4, 5];
    let v = rng.vec(60, -4.0, 4.0);
    for dt in FLOAT {
        let t = tensor(&v, &shape, dt);
        let st = Strided::new(&t);
        let vr = rounded(&v, dt);
        for axis in [-3i64, -2, -1, 0, 1, 2] {
            let ax = axis.rem_euclid(3) as usize;
            let (want, wshape) = per_lane(&vr, &shape, ax, softmax_ref);
            let attrs = [("axis", int(axis))];
            let got = run_ok("softmax", &[&t], &attrs);
            assert_eq!(got[0].shape, wshape);
            assert_eq!(got[0].dtype, dt);
            assert_close(
                &vals(&got[0]),
                &want,
                dt,
                &format!("softmax {dt} axis {axis}"),
            );
            let gs = run_views("softmax", &[Some(st.view())], &attrs, &SerialPool).unwrap();
            assert_bitwise(&got, &gs, "softmax strided");
        }
    }
}

#[test]
fn softmax_extreme_values() {
    let x = tensor(&[1e30, 0.0, -1e30, 1e30], &[4], DType::F32);
    assert_eq!(
        vals(&run_ok("softmax", &[&x], &[])[0]),
        vec![0.5, 0.0, 0.0, 0.5]
    );
    let x = f64t(&[1e300, -1e300, 1e300], &[3]);
    assert_eq!(vals(&run_ok("softmax", &[&x], &[])[0]), vec![0.5, 0.0, 0.5]);
    let x = tensor(&[60000.0, 0.0], &[2], DType::F16);
    assert_eq!(vals(&run_ok("softmax", &[&x], &[])[0]), vec![1.0, 0.0]);
    let x = tensor(&[1e38, 3e38], &[2], DType::BF16);
    assert_eq!(vals(&run_ok("softmax", &[&x], &[])[0]), vec![0.0, 1.0]);
    // -inf entries get 0; an all -inf lane is NaN (as in torch)
    let x = f64t(
        &[f64::NEG_INFINITY, 0.0, f64::NEG_INFINITY, f64::NEG_INFINITY],
        &[2, 2],
    );
    let r = vals(&run_ok("softmax", &[&x], &[])[0]);
    assert_eq!(&r[..2], &[0.0, 1.0]);
    assert!(r[2].is_nan() && r[3].is_nan());
}

#[test]
fn softmax_nan_and_infinities_anywhere_in_a_row() {
    // a NaN in a chunk that would take the fast exp, in a slow one, or in the remainder makes
    // the whole row NaN; -inf elements give 0 and leave the rest exact; +inf rows are NaN
    // where they hold more than one +inf (inf - inf) and one-hot otherwise
    let mut rng = XRng::new(77);
    for dt in [DType::F32, DType::F64] {
        for n in [1024usize, 1000, 37] {
            for pos in [3usize, n / 2, n - 1] {
                let base = rng.vec(n, -5.0, 5.0);
                let mut v = base.clone();
                v[pos] = f64::NAN;
                let r = vals(&run_ok("softmax", &[&tensor(&v, &[n], dt)], &[])[0]);
                assert!(r.iter().all(|x| x.is_nan()), "NaN at {pos} of {n} ({dt})");
                let mut v = base.clone();
                v[pos] = f64::NEG_INFINITY;
                // (a subnormal probability in float32; the plain f64 reference is exact
                // enough only for float32 results)
                v[0] = -100.0;
                let r = vals(&run_ok("softmax", &[&tensor(&v, &[n], dt)], &[])[0]);
                assert_eq!(r[pos], 0.0);
                if dt == DType::F32 {
                    let want = softmax_ref(&rounded(&v, dt));
                    assert_close(&r, &want, dt, &format!("softmax -inf at {pos} of {n}"));
                }
                let mut v = base.clone();
                v[pos] = f64::INFINITY;
                let r = vals(&run_ok("softmax", &[&tensor(&v, &[n], dt)], &[])[0]);
                assert!(
                    r[pos].is_nan() || r[pos] == 1.0,
                    "+inf at {pos}: {}",
                    r[pos]
                );
            }
        }
    }
}

#[test]
fn softmax_half_rows_converted_block_by_block_match_the_whole_row_path() {
    // a long contiguous f16/bf16 row (16K elements and more) is converted 1024 elements at a
    // time into an L1 block; a strided one (or a shorter one) is converted whole into a buffer
    // first. Same operations, so the same bits, whatever the row holds: several blocks and a
    // remainder, a NaN in a later block (the fast pass gives up after writing earlier blocks),
    // -inf and +inf elements, a row all -inf
    let mut rng = XRng::new(19);
    for dt in [DType::F16, DType::BF16] {
        for n in [16 * 1024 + 37, 16 * 1024, 1000] {
            let mut rows = Vec::new();
            for case in 0..6 {
                let mut v = rng.vec(n, -12.0, 12.0);
                match case {
                    1 => v[n - 5] = f64::NAN,
                    2 => v[n / 2] = f64::NEG_INFINITY,
                    3 => v[n - 1] = f64::INFINITY,
                    4 => v.fill(f64::NEG_INFINITY),
                    5 => v[7] = 300.0,
                    _ => {}
                }
                rows.push(v);
            }
            let flat: Vec<f64> = rows.concat();
            let t = tensor(&flat, &[rows.len(), n], dt);
            let got = run_ok("softmax", &[&t], &[]);
            let st = Strided::new(&t);
            let gs = run_views("softmax", &[Some(st.view())], &[], &SerialPool).unwrap();
            assert_bitwise(
                &got,
                &gs,
                &format!("softmax {dt} rows of {n}: blocks against whole"),
            );
            let r = vals(&got[0]);
            for (case, v) in rows.iter().enumerate() {
                let out = &r[case * n..(case + 1) * n];
                match case {
                    1 | 4 => assert!(out.iter().all(|x| x.is_nan()), "case {case} ({dt}, {n})"),
                    // (inf - inf: NaN, as in PyTorch; the test above allows one-hot too)
                    3 => assert!(out[n - 1].is_nan(), "+inf ({dt}, {n}): {}", out[n - 1]),
                    _ => {
                        let want = softmax_ref(&rounded(v, dt));
                        assert_close(out, &want, dt, &format!("softmax {dt} case {case} of {n}"));
                    }
                }
            }
        }
    }
}

#[test]
fn softmax_long_rows_in_runs_per_thread_match_the_reference_and_one_thread() {
    // rows of at least GRAIN (32768) elements go to the threads in runs of consecutive rows,
    // each row prefetched during the one before it: every row, at every thread count, is the
    // serial pool's bits and near the f64 reference (rows of different ranges, so a row
    // computed from its neighbour's data would show)
    let mut rng = XRng::new(23);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let (rows, n) = (7, 32 * 1024 + 13);
        let data: Vec<Vec<f64>> = (0..rows)
            .map(|r| rng.vec(n, -1.0 - r as f64, 2.0 * r as f64))
            .collect();
        let t = tensor(&data.concat(), &[rows, n], dt);
        let serial = run_ok("softmax", &[&t], &[]);
        let r = vals(&serial[0]);
        for (i, v) in data.iter().enumerate() {
            let want = softmax_ref(&rounded(v, dt));
            assert_close(
                &r[i * n..(i + 1) * n],
                &want,
                dt,
                &format!("softmax {dt} row {i}"),
            );
        }
        for threads in [2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let par = pool.install(|| {
                run_views("softmax", &[Some(t.view())], &[], &kernel_core::RayonPool).unwrap()
            });
            assert_bitwise(&serial, &par, &format!("softmax {dt}, {threads} threads"));
        }
    }
}

#[test]
fn softmax_rank0_empty_and_errors() {
    let x = f64t(&[5.0], &[]);
    let r = run_ok("softmax", &[&x], &[]);
    assert_eq!(r[0].shape, Vec::<usize>::new());
    assert_eq!(vals(&r[0]), vec![1.0]);
    for shape in [[0usize, 3], [3, 0]] {
        let e = f64t(&[], &shape);
        assert_eq!(run_ok("softmax", &[&e], &[])[0].shape, shape.to_vec());
        assert_eq!(
            run_ok("softmax", &[&e], &[("axis", int(0))])[0].shape,
            shape.to_vec()
        );
    }
    let x = f64t(&[1.0; 6], &[2, 3]);
    assert_err_contains(
        "softmax",
        &[Some(&x)],
        &[("axis", int(2))],
        "axis 2 is out of range for a tensor of rank 2 (expected -2 to 1)",
    );
    assert_err_contains(
        "softmax",
        &[Some(&x)],
        &[("axis", int(-3))],
        "axis -3 is out of range",
    );
    let i = tensor(&[1.0], &[1], DType::I64);
    assert_err_contains("softmax", &[Some(&i)], &[], "unsupported dtype int64");
    assert_err_contains(
        "softmax_backward",
        &[Some(&f64t(&[1.0; 3], &[3])), Some(&x)],
        &[],
        "grad has shape [3] but y has shape [2, 3]",
    );
    // unknown dims
    let op = polyop_kernels::registry().lookup("softmax").unwrap();
    let a = op.bind_attrs([("axis", int(1))]).unwrap();
    let s = op
        .infer(
            &[Some(TensorSpec::with_dims(DType::F32, vec![None, Some(3)]))],
            &a,
        )
        .unwrap();
    assert_eq!(
        s[0].shape,
        Some(vec![None, Some(3)].into_iter().map(Dim::from).collect())
    );
    let s = op
        .infer(&[Some(TensorSpec::unknown_rank(DType::F32))], &a)
        .unwrap();
    assert_eq!(s[0].shape, None);
}

#[test]
fn softmax_gradients_and_threads() {
    let mut rng = XRng::new(4);
    let x = f64t(&rng.vec(12, -2.0, 2.0), &[3, 4]);
    grad_check("softmax", &[Some(&x)], &[], 1);
    grad_check("softmax", &[Some(&x)], &[("axis", int(0))], 2);
    let big = tensor(&rng.vec(1000 * 129, -5.0, 5.0), &[1000, 129], DType::F32);
    assert_thread_independent("softmax", &[Some(&big)], &[]);
    assert_thread_independent("softmax", &[Some(&big)], &[("axis", int(0))]);
    let g = tensor(&rng.vec(1000 * 129, -5.0, 5.0), &[1000, 129], DType::F32);
    assert_thread_independent("softmax_backward", &[Some(&g), Some(&big)], &[]);
}

// ------------------------------------------------------------------------------ rms_norm

#[test]
fn rms_norm_hand_and_reference() {
    let x = f64t(&[3.0, 4.0], &[2]);
    let w = f64t(&[1.0, 2.0], &[2]);
    let r = 1.0 / 12.5f64.sqrt();
    let got = run("rms_norm", &[Some(&x), Some(&w)], &[("eps", float(0.0))]).unwrap();
    assert_close(&vals(&got[0]), &[3.0 * r, 8.0 * r], DType::F64, "rms_norm");
    let got = run("rms_norm", &[Some(&x), None], &[]).unwrap();
    let r = 1.0 / (12.5f64 + 1e-6).sqrt();
    assert_close(
        &vals(&got[0]),
        &[3.0 * r, 4.0 * r],
        DType::F64,
        "rms_norm default eps",
    );

    let mut rng = XRng::new(8);
    let shape = [2usize, 3, 16];
    let v = rng.vec(96, -3.0, 3.0);
    let wv = rng.vec(16, 0.5, 1.5);
    for dt in FLOAT {
        let (t, wt) = (tensor(&v, &shape, dt), tensor(&wv, &[16], dt));
        let (vr, wr) = (rounded(&v, dt), rounded(&wv, dt));
        let st = Strided::new(&t);
        // a strided weight: every other element of a [32] buffer
        let wbuf = tensor(
            &wv.iter().flat_map(|&a| [a, 99.0]).collect::<Vec<_>>(),
            &[32],
            dt,
        );
        let wview = wbuf.view().restrided(vec![16], vec![2]);
        for (wopt, wref) in [(Some(&wt), Some(wr.as_slice())), (None, None)] {
            let attrs = [("eps", float(1e-3))];
            let (want, _) = per_lane(&vr, &shape, 2, |l| rms_ref(l, wref, 1e-3));
            let got = run("rms_norm", &[Some(&t), wopt], &attrs).unwrap();
            assert_eq!(got[0].shape, shape.to_vec());
            assert_close(&vals(&got[0]), &want, dt, &format!("rms_norm {dt}"));
            let wv2 = wopt.map(|_| wview.clone());
            let gs = run_views("rms_norm", &[Some(st.view()), wv2], &attrs, &SerialPool).unwrap();
            assert_bitwise(&got, &gs, "rms_norm strided");
        }
    }
}

#[test]
fn rms_norm_rank0_empty_errors() {
    let x = f64t(&[-2.0], &[]);
    let got = run("rms_norm", &[Some(&x), None], &[("eps", float(0.0))]).unwrap();
    assert_eq!(got[0].shape, Vec::<usize>::new());
    assert_eq!(vals(&got[0]), vec![-1.0]);
    let e = f64t(&[], &[0, 4]);
    assert_eq!(
        run("rms_norm", &[Some(&e), Some(&f64t(&[1.0; 4], &[4]))], &[]).unwrap()[0].shape,
        vec![0, 4]
    );
    let e = f64t(&[], &[3, 0]);
    assert_eq!(
        run("rms_norm", &[Some(&e), None], &[]).unwrap()[0].shape,
        vec![3, 0]
    );
    let b = run("rms_norm_backward", &[Some(&e), Some(&e), None], &[]).unwrap();
    assert_eq!(b[1].shape, vec![0]);

    let x = f64t(&[1.0; 16], &[2, 8]);
    let w7 = f64t(&[1.0; 7], &[7]);
    assert_err_contains(
        "rms_norm",
        &[Some(&x), Some(&w7)],
        &[],
        "weight must have shape [8] (x.shape[axis:] for axis=-1), got [7]",
    );
    let w2d = f64t(&[1.0; 8], &[1, 8]);
    assert_err_contains(
        "rms_norm",
        &[Some(&x), Some(&w2d)],
        &[],
        "weight must have shape [8] (x.shape[axis:] for axis=-1), got [1, 8]",
    );
    let w32 = tensor(&[1.0; 8], &[8], DType::F32);
    assert_err_contains(
        "rms_norm",
        &[Some(&x), Some(&w32)],
        &[],
        "dtype mismatch: input `weight` is float32 but earlier inputs are float64",
    );
    assert_err_contains(
        "rms_norm",
        &[Some(&x), None],
        &[("eps", float(-1.0))],
        "eps must be >= 0, got -1",
    );
    assert_err_contains(
        "rms_norm",
        &[Some(&tensor(&[1.0], &[1], DType::I32)), None],
        &[],
        "unsupported dtype int32",
    );
    assert_err_contains(
        "rms_norm_backward",
        &[Some(&w7), Some(&x), None],
        &[],
        "grad has shape [7] but x has shape [2, 8]",
    );
    // unknown dims
    let op = polyop_kernels::registry()
        .lookup("rms_norm_backward")
        .unwrap();
    let a = op.bind_attrs([]).unwrap();
    let s = op
        .infer(
            &[
                Some(TensorSpec::with_dims(DType::F32, vec![None, Some(8)])),
                Some(TensorSpec::with_dims(DType::F32, vec![None, Some(8)])),
                None,
            ],
            &a,
        )
        .unwrap();
    assert_eq!(
        s[0].shape,
        Some(vec![None, Some(8)].into_iter().map(Dim::from).collect())
    );
    assert_eq!(
        s[1].shape,
        Some(vec![Some(8)].into_iter().map(Dim::from).collect())
    );
    let s = op
        .infer(
            &[
                Some(TensorSpec::unknown_rank(DType::F32)),
                Some(TensorSpec::unknown_rank(DType::F32)),
                Some(TensorSpec::with_dims(DType::F32, vec![None])),
            ],
            &a,
        )
        .unwrap();
    assert_eq!(
        s[1].shape,
        Some(vec![None].into_iter().map(Dim::from).collect())
    );
}

#[test]
fn rms_norm_gradients_and_threads() {
    let mut rng = XRng::new(12);
    let x = f64t(&rng.vec(15, -2.0, 2.0), &[3, 5]);
    let w = f64t(&rng.vec(5, 0.5, 1.5), &[5]);
    grad_check(
        "rms_norm",
        &[Some(&x), Some(&w)],
        &[("eps", float(1e-3))],
        1,
    );
    grad_check("rms_norm", &[Some(&x), None], &[], 2);
    // without weight, grad_weight is still sum over rows of grad * x_normalised
    let g = f64t(&rng.vec(15, -1.0, 1.0), &[3, 5]);
    let b = run(
        "rms_norm_backward",
        &[Some(&g), Some(&x), None],
        &[("eps", float(0.0))],
    )
    .unwrap();
    assert_eq!(b[1].shape, vec![5]);
    let xn = per_lane(&vals(&x), &[3, 5], 1, |l| rms_ref(l, None, 0.0)).0;
    let mut want = vec![0.0; 5];
    for (i, (gv, xv)) in vals(&g).iter().zip(&xn).enumerate() {
        want[i % 5] += gv * xv;
    }
    assert_close(
        &vals(&b[1]),
        &want,
        DType::F64,
        "rms_norm_backward grad_weight",
    );
    let big = tensor(&rng.vec(3000 * 64, -2.0, 2.0), &[3000, 64], DType::F32);
    let gb = tensor(&rng.vec(3000 * 64, -2.0, 2.0), &[3000, 64], DType::F32);
    let wb = tensor(&rng.vec(64, 0.5, 1.5), &[64], DType::F32);
    assert_thread_independent("rms_norm", &[Some(&big), Some(&wb)], &[]);
    assert_thread_independent(
        "rms_norm_backward",
        &[Some(&gb), Some(&big), Some(&wb)],
        &[],
    );
    let bh = tensor(&rng.vec(3000 * 64, -2.0, 2.0), &[3000, 64], DType::BF16);
    assert_thread_independent("rms_norm_backward", &[Some(&bh), Some(&bh), None], &[]);
}

// ------------------------------------------------------------------------------ topk

#[test]
fn topk_hand_worked() {
    for dt in NUMERIC {
        let x = tensor(&[1.0, 3.0, 2.0, 3.0], &[4], dt);
        let r = run_ok("topk", &[&x], &[("k", int(2))]);
        assert_eq!(vals(&r[0]), vec![3.0, 3.0], "{dt}");
        assert_eq!(r[1].dtype, DType::I64);
        assert_eq!(r[1].as_slice::<i64>().unwrap(), &[1, 3]);
        let r = run_ok("topk", &[&x], &[("k", int(3)), ("largest", boolean(false))]);
        assert_eq!(vals(&r[0]), vec![1.0, 2.0, 3.0]);
        assert_eq!(r[1].as_slice::<i64>().unwrap(), &[0, 2, 1]);
        // ONNX-style int 0/1 for the bool
        let r = run_ok("topk", &[&x], &[("k", int(1)), ("largest", int(0))]);
        assert_eq!(vals(&r[0]), vec![1.0]);
    }
    let nan = f64::NAN;
    for dt in FLOAT {
        let x = tensor(&[1.0, nan, 3.0, nan, -0.0, 0.0], &[6], dt);
        let r = run_ok("topk", &[&x], &[("k", int(4))]);
        let v = vals(&r[0]);
        assert!(v[0].is_nan() && v[1].is_nan());
        assert_eq!(&v[2..], &[3.0, 1.0]);
        assert_eq!(r[1].as_slice::<i64>().unwrap(), &[1, 3, 2, 0]);
        let r = run_ok("topk", &[&x], &[("k", int(6)), ("largest", boolean(false))]);
        assert_eq!(
            r[1].as_slice::<i64>().unwrap(),
            &[4, 5, 0, 2, 1, 3],
            "-0 == +0: tie by index"
        );
        let v = vals(&r[0]);
        assert!(v[0] == 0.0 && v[0].is_sign_negative() && v[1].is_sign_positive());
    }
    // 2-D along axis 0
    let x = f64t(&[1.0, 9.0, 5.0, 2.0, 7.0, 3.0], &[3, 2]);
    let r = run_ok("topk", &[&x], &[("k", int(2)), ("axis", int(0))]);
    assert_eq!(r[0].shape, vec![2, 2]);
    assert_eq!(vals(&r[0]), vec![7.0, 9.0, 5.0, 3.0]);
    assert_eq!(r[1].as_slice::<i64>().unwrap(), &[2, 0, 1, 2]);
}

#[test]
fn topk_edge_cases_and_errors() {
    let x = f64t(&[4.0], &[]);
    let r = run_ok("topk", &[&x], &[("k", int(1))]);
    assert_eq!(r[0].shape, Vec::<usize>::new());
    assert_eq!(vals(&r[0]), vec![4.0]);
    assert_eq!(r[1].as_slice::<i64>().unwrap(), &[0]);
    let r = run_ok("topk", &[&x], &[("k", int(0))]);
    assert_eq!(r[0].shape, vec![0]);
    let x = f64t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let r = run_ok("topk", &[&x], &[("k", int(0))]);
    assert_eq!(r[0].shape, vec![2, 0]);
    assert_eq!(r[1].shape, vec![2, 0]);
    let e = f64t(&[], &[0, 5]);
    assert_eq!(run_ok("topk", &[&e], &[("k", int(2))])[0].shape, vec![0, 2]);
    let e = f64t(&[], &[3, 0]);
    assert_eq!(run_ok("topk", &[&e], &[("k", int(0))])[1].shape, vec![3, 0]);
    let x4 = f64t(&[1.0; 8], &[2, 4]);
    assert_err_contains(
        "topk",
        &[Some(&x4)],
        &[("k", int(5))],
        "k=5 is out of range for axis 1 of size 4 (expected 0 <= k <= 4)",
    );
    assert_err_contains(
        "topk",
        &[Some(&x4)],
        &[("k", int(3)), ("axis", int(0))],
        "k=3 is out of range for axis 0 of size 2 (expected 0 <= k <= 2)",
    );
    assert_err_contains("topk", &[Some(&x4)], &[("k", int(-1))], "k=-1 must be >= 0");
    assert_err_contains(
        "topk",
        &[Some(&x4)],
        &[("k", int(1)), ("axis", int(2))],
        "axis 2 is out of range",
    );
    assert_err_contains(
        "topk",
        &[Some(&f64t(&[1.0], &[]))],
        &[("k", int(2))],
        "k=2 is out of range for axis 0 of size 1",
    );
    assert_err_contains("topk", &[Some(&x4)], &[], "missing required attribute `k`");
    assert_err_contains(
        "topk",
        &[Some(&tensor(&[1.0], &[1], DType::Bool))],
        &[("k", int(1))],
        "unsupported dtype bool",
    );
    // topk_backward with a bad index fails before writing
    let g = f64t(&[1.0, 1.0], &[1, 2]);
    let bad = OwnedTensor::from_vec(vec![0i64, 4], &[1, 2]).unwrap();
    let xx = f64t(&[0.0; 4], &[1, 4]);
    assert_err_contains(
        "topk_backward",
        &[Some(&g), Some(&xx), Some(&bad)],
        &[],
        "index 4 in indices is out of range for axis 1 of size 4",
    );
    let fi = f64t(&[0.0, 1.0], &[1, 2]);
    assert_err_contains(
        "topk_backward",
        &[Some(&g), Some(&xx), Some(&fi)],
        &[],
        "input `indices` must be int64, got float64",
    );
    let g3 = f64t(&[1.0; 3], &[3, 1]);
    let i3 = OwnedTensor::from_vec(vec![0i64; 3], &[3, 1]).unwrap();
    assert_err_contains(
        "topk_backward",
        &[Some(&g3), Some(&xx), Some(&i3)],
        &[],
        "is not a topk result of x",
    );
    // unknown dims
    let op = polyop_kernels::registry().lookup("topk").unwrap();
    let a = op.bind_attrs([("k", int(3))]).unwrap();
    let s = op
        .infer(
            &[Some(TensorSpec::with_dims(DType::F32, vec![Some(2), None]))],
            &a,
        )
        .unwrap();
    assert_eq!(
        s[0].shape,
        Some(vec![Some(2), Some(3)].into_iter().map(Dim::from).collect())
    );
    assert_eq!(s[1].dtype, DType::I64);
    let s = op
        .infer(&[Some(TensorSpec::unknown_rank(DType::F32))], &a)
        .unwrap();
    assert_eq!(s[0].shape, None);
    assert_eq!(op.onnx_op_type(), "TopK");
}

#[test]
fn topk_half_rows_scanned_as_keys_match_the_float32_path() {
    // contiguous f16/bf16 rows are scanned as integer order keys; strided ones through f32.
    // Same values and indices, bit for bit, in both orders, with zeros of both signs, NaNs
    // (negative and signalling too), infinities, subnormals and ties; and the reference
    let mut rng = XRng::new(23);
    for dt in [DType::F16, DType::BF16] {
        let tiny = if dt == DType::F16 { 3e-6 } else { 1e-39 };
        for n in [40usize, 1000] {
            let mut v: Vec<f64> = rng.ints(n, -6, 6).iter().map(|x| x / 4.0).collect();
            for (j, special) in [0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, tiny, -tiny]
                .into_iter()
                .enumerate()
            {
                v[(j * 7 + 3) % n] = special;
            }
            // row 1 gets NaNs: a quiet, a negative and a signalling one
            let mut bits: Vec<u16> = tensor(&v, &[n], dt)
                .as_bytes()
                .chunks_exact(2)
                .map(|b| u16::from_ne_bytes([b[0], b[1]]))
                .collect();
            bits.extend_from_within(..);
            let nan = if dt == DType::F16 {
                [0x7E00, 0xFE00, 0x7C01]
            } else {
                [0x7FC0, 0xFFC0, 0x7F81]
            };
            for (j, b) in nan.into_iter().enumerate() {
                bits[n + 5 + j * (n / 4)] = b;
            }
            let t = if dt == DType::F16 {
                OwnedTensor::from_vec(bits.into_iter().map(f16::from_bits).collect(), &[2, n])
            } else {
                OwnedTensor::from_vec(bits.into_iter().map(bf16::from_bits).collect(), &[2, n])
            }
            .unwrap();
            let st = Strided::new(&t);
            for k in [1usize, 8, 33.min(n)] {
                for largest in [true, false] {
                    let attrs = [("k", int(k as i64)), ("largest", boolean(largest))];
                    let got = run_ok("topk", &[&t], &attrs);
                    let gs = run_views("topk", &[Some(st.view())], &attrs, &SerialPool).unwrap();
                    let what = format!("{dt} n {n} k {k} largest {largest}");
                    assert_bitwise(&got, &gs, &format!("topk keys against f32: {what}"));
                    let x = vals(&t);
                    let (wv, wshape) = per_lane(&x, &[2, n], 1, |l| topk_ref(l, k, largest).0);
                    let (wi, _) = per_lane(&x, &[2, n], 1, |l| topk_ref(l, k, largest).1);
                    assert_eq!(got[0].shape, wshape);
                    let gv = vals(&got[0]);
                    let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
                    assert!(
                        gv.iter().zip(&wv).all(|(&a, &b)| same(a, b)),
                        "{what}: {gv:?} {wv:?}"
                    );
                    assert_eq!(vals(&got[1]), wi, "{what}");
                }
            }
        }
    }
}

#[test]
fn topk_reference_every_dtype_strided() {
    let mut rng = XRng::new(21);
    let shape = [4usize, 7, 3];
    for dt in NUMERIC {
        // small ints: many ties
        let v = rng.ints(84, -3, 3);
        let t = tensor(&v, &shape, dt);
        let st = Strided::new(&t);
        for axis in [0i64, 1, -1] {
            let ax = axis.rem_euclid(3) as usize;
            for k in [0usize, 1, 2, shape[ax]] {
                for largest in [true, false] {
                    let attrs = [
                        ("k", int(k as i64)),
                        ("axis", int(axis)),
                        ("largest", boolean(largest)),
                    ];
                    let (wv, wshape) = per_lane(&v, &shape, ax, |l| topk_ref(l, k, largest).0);
                    let (wi, _) = per_lane(&v, &shape, ax, |l| topk_ref(l, k, largest).1);
                    let got = run_ok("topk", &[&t], &attrs);
                    assert_eq!(got[0].shape, wshape);
                    assert_eq!(
                        vals(&got[0]),
                        wv,
                        "{dt} axis {axis} k {k} largest {largest}"
                    );
                    assert_eq!(vals(&got[1]), wi);
                    let gs = run_views("topk", &[Some(st.view())], &attrs, &SerialPool).unwrap();
                    assert_bitwise(&got, &gs, "topk strided");
                }
            }
        }
    }
}

#[test]
fn topk_gradients_and_threads() {
    let mut rng = XRng::new(5);
    let x = f64t(&rng.vec(20, -2.0, 2.0), &[4, 5]);
    grad_check("topk", &[Some(&x)], &[("k", int(3))], 1);
    grad_check(
        "topk",
        &[Some(&x)],
        &[("k", int(2)), ("axis", int(0)), ("largest", boolean(false))],
        2,
    );
    // scatter of repeated indices sums
    let g = f64t(&[1.0, 2.0, 4.0], &[3]);
    let i = OwnedTensor::from_vec(vec![2i64, 0, 2], &[3]).unwrap();
    let xx = f64t(&[0.0; 4], &[4]);
    assert_eq!(
        vals(&run_ok("topk_backward", &[&g, &xx, &i], &[])[0]),
        vec![2.0, 0.0, 5.0, 0.0]
    );
    let big = tensor(&rng.ints(500 * 1024, -1000, 1000), &[500, 1024], DType::F32);
    assert_thread_independent("topk", &[Some(&big)], &[("k", int(10))]);
    assert_thread_independent(
        "topk",
        &[Some(&big)],
        &[("k", int(7)), ("axis", int(0)), ("largest", boolean(false))],
    );
    let r = run_ok("topk", &[&big], &[("k", int(10))]);
    assert_thread_independent(
        "topk_backward",
        &[Some(&r[0]), Some(&big), Some(&r[1])],
        &[],
    );
}

proptest! {
    // Fixed seed: CI runs the same cases every time (docs/testing.md, "Property tests").
    #![proptest_config(ProptestConfig {
        cases: 150,
        rng_seed: proptest::test_runner::RngSeed::Fixed(8421),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]
    #[test]
    fn prop_topk_matches_full_sort(n in 0usize..40, rows in 1usize..4, kf in 0.0f64..=1.0, largest in any::<bool>(), seed in any::<u64>(), with_nan in any::<bool>()) {
        let mut rng = XRng::new(seed);
        let mut v = rng.ints(n * rows, -5, 5);
        if with_nan {
            for x in v.iter_mut() {
                if rng.uniform(0.0, 1.0) < 0.2 { *x = f64::NAN; }
            }
        }
        let k = ((n as f64) * kf).floor() as usize;
        let t = f64t(&v, &[rows, n]);
        let got = run_ok("topk", &[&t], &[("k", int(k as i64)), ("largest", boolean(largest))]);
        let (wv, _) = per_lane(&v, &[rows, n], 1, |l| topk_ref(l, k, largest).0);
        let (wi, _) = per_lane(&v, &[rows, n], 1, |l| topk_ref(l, k, largest).1);
        prop_assert_eq!(vals(&got[1]), wi);
        let gv = vals(&got[0]);
        for (a, b) in gv.iter().zip(&wv) {
            prop_assert!(a == b || (a.is_nan() && b.is_nan()));
        }
    }

    #[test]
    fn prop_softmax_rows_sum_to_one(rows in 1usize..5, n in 1usize..50, scale in 0.0f64..1e3, seed in any::<u64>()) {
        let mut rng = XRng::new(seed);
        let v = rng.vec(rows * n, -scale, scale);
        let t = tensor(&v, &[rows, n], DType::F32);
        let got = vals(&run_ok("softmax", &[&t], &[])[0]);
        let (want, _) = per_lane(&rounded(&v, DType::F32), &[rows, n], 1, softmax_ref);
        // exp(x - max) of a rounded argument: its error grows with |x - max| (condition
        // number), so the bound is relative to |want| (1 + |x - max|)
        let scale: Vec<f64> = (0..rows * n)
            .map(|i| {
                let r = i / n;
                let m = v[r * n..(r + 1) * n].iter().fold(f64::MIN, |a, &b| a.max(b as f32 as f64));
                want[i].abs() * (1.0 + (v[i] as f32 as f64 - m).abs())
            })
            .collect();
        assert_close_scaled(&got, &want, Some(&scale), DType::F32, "softmax");
        for r in 0..rows {
            let s: f64 = got[r * n..(r + 1) * n].iter().sum();
            prop_assert!((s - 1.0).abs() < 1e-5);
        }
    }
}
