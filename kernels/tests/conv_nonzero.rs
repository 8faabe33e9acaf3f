//! conv2d (+ backward) and nonzero against naive references.

mod util;

use kernel_core::{DType, Dim, SerialPool, TensorSpec};
use util::*;

/// Naive direct convolution in f64.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    b: Option<&[f64]>,
    s: usize,
    p: usize,
) -> (Vec<f64>, Vec<usize>) {
    let [n, c, h, wd] = xs;
    let [o, _, kh, kw] = ws;
    let oh = (h + 2 * p - kh) / s + 1;
    let ow = (wd + 2 * p - kw) / s + 1;
    let mut out = vec![0.0; n * o * oh * ow];
    for ni in 0..n {
        for oi in 0..o {
            for y in 0..oh {
                for xq in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[oi]);
                    for ci in 0..c {
                        for i in 0..kh {
                            for j in 0..kw {
                                let ih = (y * s + i) as isize - p as isize;
                                let iw = (xq * s + j) as isize - p as isize;
                                if ih < 0 || iw < 0 || ih as usize >= h || iw as usize >= wd {
                                    continue;
                                }
                                acc += x[((ni * c + ci) * h + ih as usize) * wd + iw as usize]
                                    * w[((oi * c + ci) * kh + i) * kw + j];
                            }
                        }
                    }
                    out[((ni * o + oi) * oh + y) * ow + xq] = acc;
                }
            }
        }
    }
    (out, vec![n, o, oh, ow])
}

#[test]
fn conv2d_hand_worked() {
    let x = f64t(&(1..=9).map(f64::from).collect::<Vec<_>>(), &[1, 1, 3, 3]);
    let w = f64t(&[1.0; 4], &[1, 1, 2, 2]);
    let r = run_ok("conv2d", &[&x, &w], &[]);
    assert_eq!(r[0].shape, vec![1, 1, 2, 2]);
    assert_eq!(vals(&r[0]), vec![12.0, 16.0, 24.0, 28.0]);
    let b = f64t(&[1.0], &[1]);
    let r = run_ok("conv2d", &[&x, &w, &b], &[]);
    assert_eq!(vals(&r[0]), vec![13.0, 17.0, 25.0, 29.0]);
    // padding 1, stride 2: windows at (-1,-1), (-1,1), (1,-1), (1,1)
    let r = run_ok(
        "conv2d",
        &[&x, &w],
        &[("stride", int(2)), ("padding", int(1))],
    );
    assert_eq!(r[0].shape, vec![1, 1, 2, 2]);
    assert_eq!(vals(&r[0]), vec![1.0, 5.0, 11.0, 28.0]);
}

#[test]
fn conv2d_reference_every_dtype_strided() {
    let mut rng = XRng::new(3);
    let xs = [2usize, 3, 5, 6];
    let ws = [4usize, 3, 3, 2];
    let xv = rng.vec(180, -1.0, 1.0);
    let wv = rng.vec(72, -1.0, 1.0);
    let bv = rng.vec(4, -1.0, 1.0);
    for dt in FLOAT {
        let (x, w, b) = (
            tensor(&xv, &xs, dt),
            tensor(&wv, &ws, dt),
            tensor(&bv, &[4], dt),
        );
        let (xr, wr, br) = (rounded(&xv, dt), rounded(&wv, dt), rounded(&bv, dt));
        let (sx, sw) = (Strided::new(&x), Strided::new(&w));
        for s in [1usize, 2, 3] {
            for p in [0usize, 1, 2] {
                for with_bias in [false, true] {
                    let attrs = [("stride", int(s as i64)), ("padding", int(p as i64))];
                    let (want, shape) =
                        conv_ref(&xr, xs, &wr, ws, with_bias.then_some(br.as_slice()), s, p);
                    let bopt = with_bias.then_some(&b);
                    let got = run("conv2d", &[Some(&x), Some(&w), bopt], &attrs).unwrap();
                    assert_eq!(got[0].shape, shape);
                    // the error bound of a dot product is relative to the sum of |terms|
                    let abs = |v: &[f64]| v.iter().map(|a| a.abs()).collect::<Vec<f64>>();
                    let babs = abs(&br);
                    let (scale, _) = conv_ref(
                        &abs(&xr),
                        xs,
                        &abs(&wr),
                        ws,
                        with_bias.then_some(babs.as_slice()),
                        s,
                        p,
                    );
                    assert_close_scaled(
                        &vals(&got[0]),
                        &want,
                        Some(&scale),
                        dt,
                        &format!("conv2d {dt} s{s} p{p}"),
                    );
                    let gs = run_views(
                        "conv2d",
                        &[Some(sx.view()), Some(sw.view()), bopt.map(|b| b.view())],
                        &attrs,
                        &SerialPool,
                    )
                    .unwrap();
                    assert_bitwise(&got, &gs, "conv2d strided");
                }
            }
        }
    }
}

#[test]
fn conv2d_large_blocks_and_threads() {
    let mut rng = XRng::new(4);
    let xs = [2usize, 3, 40, 41];
    let ws = [5usize, 3, 3, 3];
    let xv = rng.vec(xs.iter().product(), -1.0, 1.0);
    let wv = rng.vec(ws.iter().product(), -1.0, 1.0);
    let bv = rng.vec(5, -1.0, 1.0);
    let (x, w, b) = (f64t(&xv, &xs), f64t(&wv, &ws), f64t(&bv, &[5]));
    let got = run_ok("conv2d", &[&x, &w, &b], &[("padding", int(1))]);
    let (want, shape) = conv_ref(&xv, xs, &wv, ws, Some(&bv), 1, 1);
    assert_eq!(got[0].shape, shape);
    let abs = |v: &[f64]| v.iter().map(|a| a.abs()).collect::<Vec<f64>>();
    let (scale, _) = conv_ref(&abs(&xv), xs, &abs(&wv), ws, Some(&abs(&bv)), 1, 1);
    assert_close_scaled(
        &vals(&got[0]),
        &want,
        Some(&scale),
        DType::F64,
        "conv2d large",
    );
    let x32 = tensor(&xv, &xs, DType::F32);
    let w32 = tensor(&wv, &ws, DType::F32);
    let b32 = tensor(&bv, &[5], DType::F32);
    assert_thread_independent(
        "conv2d",
        &[Some(&x32), Some(&w32), Some(&b32)],
        &[("padding", int(1))],
    );
    let g = tensor(
        &rng.vec(2 * 5 * 40 * 41, -1.0, 1.0),
        &[2, 5, 40, 41],
        DType::F32,
    );
    assert_thread_independent(
        "conv2d_backward",
        &[Some(&g), Some(&x32), Some(&w32), Some(&b32)],
        &[("padding", int(1))],
    );
    let gh = tensor(
        &rng.vec(2 * 5 * 20 * 21, -1.0, 1.0),
        &[2, 5, 20, 21],
        DType::BF16,
    );
    let xh = tensor(&xv, &xs, DType::BF16);
    let wh = tensor(&wv, &ws, DType::BF16);
    assert_thread_independent(
        "conv2d_backward",
        &[Some(&gh), Some(&xh), Some(&wh), None],
        &[("stride", int(2)), ("padding", int(1))],
    );
}

#[test]
fn conv2d_empty_and_degenerate() {
    let w = f64t(&[1.0; 2 * 3 * 2 * 2], &[2, 3, 2, 2]);
    let x = f64t(&[], &[0, 3, 4, 4]);
    assert_eq!(run_ok("conv2d", &[&x, &w], &[])[0].shape, vec![0, 2, 3, 3]);
    // zero input channels: output is the bias
    let x0 = f64t(&[], &[1, 0, 3, 3]);
    let w0 = f64t(&[], &[2, 0, 2, 2]);
    let b = f64t(&[0.5, -1.0], &[2]);
    let r = run_ok("conv2d", &[&x0, &w0, &b], &[]);
    assert_eq!(r[0].shape, vec![1, 2, 2, 2]);
    assert_eq!(
        vals(&r[0]),
        vec![0.5, 0.5, 0.5, 0.5, -1.0, -1.0, -1.0, -1.0]
    );
    // zero output channels
    let wo = f64t(&[], &[0, 3, 2, 2]);
    let x1 = f64t(&[1.0; 3 * 16], &[1, 3, 4, 4]);
    assert_eq!(
        run_ok("conv2d", &[&x1, &wo], &[])[0].shape,
        vec![1, 0, 3, 3]
    );
    // backward with zero images: grad_weight and grad_bias are zero
    let g = f64t(&[], &[0, 2, 3, 3]);
    let r = run(
        "conv2d_backward",
        &[Some(&g), Some(&x), Some(&w), None],
        &[],
    )
    .unwrap();
    assert_eq!(r[0].shape, vec![0, 3, 4, 4]);
    assert_eq!(vals(&r[1]), vec![0.0; 24]);
    assert_eq!(vals(&r[2]), vec![0.0; 2]);
}

#[test]
fn conv2d_errors_and_shape_inference() {
    let x = f64t(&[0.0; 48], &[1, 3, 4, 4]);
    let w4 = f64t(&[0.0; 2 * 4 * 9], &[2, 4, 3, 3]);
    let w = f64t(&[0.0; 2 * 3 * 9], &[2, 3, 3, 3]);
    assert_err_contains(
        "conv2d",
        &[Some(&x), Some(&w4), None],
        &[],
        "input has 3 channels but weight expects 4",
    );
    assert_err_contains(
        "conv2d",
        &[Some(&f64t(&[0.0; 12], &[3, 4])), Some(&w), None],
        &[],
        "input must be 4-D (N, C, H, W), got shape [3, 4]",
    );
    assert_err_contains(
        "conv2d",
        &[Some(&x), Some(&f64t(&[0.0; 6], &[2, 3])), None],
        &[],
        "weight must be 4-D (O, C/groups, KH, KW), got shape [2, 3]",
    );
    assert_err_contains(
        "conv2d",
        &[Some(&x), Some(&w), Some(&f64t(&[0.0; 3], &[3]))],
        &[],
        "bias must have shape [2] (the output channels of weight), got [3]",
    );
    assert_err_contains(
        "conv2d",
        &[Some(&x), Some(&w), None],
        &[("stride", int(0))],
        "stride must be >= 1, got 0",
    );
    assert_err_contains(
        "conv2d",
        &[Some(&x), Some(&w), None],
        &[("padding", int(-1))],
        "padding must be >= 0, got -1",
    );
    assert_err_contains(
        "conv2d",
        &[Some(&x), Some(&w), None],
        &[("padding", int(i64::MAX))],
        "too large",
    );
    let w5 = f64t(&[0.0; 2 * 3 * 25], &[2, 3, 5, 5]);
    assert_err_contains(
        "conv2d",
        &[Some(&x), Some(&w5), None],
        &[],
        "kernel size 5x5 is larger than the padded input 4x4",
    );
    let xi = tensor(&[0.0; 48], &[1, 3, 4, 4], DType::I32);
    let wi = tensor(&[0.0; 54], &[2, 3, 3, 3], DType::I32);
    assert_err_contains(
        "conv2d",
        &[Some(&xi), Some(&wi), None],
        &[],
        "unsupported dtype int32",
    );
    let w32 = tensor(&[0.0; 54], &[2, 3, 3, 3], DType::F32);
    assert_err_contains(
        "conv2d",
        &[Some(&x), Some(&w32), None],
        &[],
        "dtype mismatch",
    );
    let g = f64t(&[0.0; 18], &[1, 2, 3, 3]);
    assert_err_contains(
        "conv2d_backward",
        &[Some(&g), Some(&x), Some(&w), None],
        &[],
        "grad has shape [1, 2, 3, 3] but the conv2d output has shape [1, 2, 2, 2]",
    );
    // still works afterwards
    assert_eq!(
        run("conv2d", &[Some(&x), Some(&w), None], &[]).unwrap()[0].shape,
        vec![1, 2, 2, 2]
    );

    let op = polyop_kernels::registry().lookup("conv2d").unwrap();
    let a = op
        .bind_attrs([("stride", int(2)), ("padding", int(1))])
        .unwrap();
    let spec = |d: Vec<Option<usize>>| Some(TensorSpec::with_dims(DType::F32, d));
    let s = op
        .infer(
            &[
                spec(vec![None, Some(3), Some(9), None]),
                spec(vec![Some(8), Some(3), Some(3), Some(3)]),
                None,
            ],
            &a,
        )
        .unwrap();
    assert_eq!(
        s[0].shape,
        Some(
            vec![None, Some(8), Some(5), None]
                .into_iter()
                .map(Dim::from)
                .collect()
        )
    );
    let s = op
        .infer(
            &[
                Some(TensorSpec::unknown_rank(DType::F32)),
                spec(vec![Some(8), None, Some(3), Some(3)]),
                None,
            ],
            &a,
        )
        .unwrap();
    assert_eq!(
        s[0].shape,
        Some(
            vec![None, Some(8), None, None]
                .into_iter()
                .map(Dim::from)
                .collect()
        )
    );
    let e = op
        .infer(
            &[
                spec(vec![None, Some(3), None, None]),
                spec(vec![None, Some(4), None, None]),
                None,
            ],
            &a,
        )
        .unwrap_err();
    assert!(e
        .to_string()
        .contains("input has 3 channels but weight expects 4"));
    let ob = polyop_kernels::registry()
        .lookup("conv2d_backward")
        .unwrap();
    let s = ob
        .infer(
            &[
                spec(vec![None; 4]),
                spec(vec![None, Some(3), None, None]),
                spec(vec![Some(8), Some(3), Some(3), Some(3)]),
                None,
            ],
            &a,
        )
        .unwrap();
    assert_eq!(
        s[2].shape,
        Some(vec![Some(8)].into_iter().map(Dim::from).collect())
    );
}

#[test]
fn conv2d_gradients() {
    let mut rng = XRng::new(7);
    let x = f64t(&rng.vec(2 * 2 * 5 * 4, -1.0, 1.0), &[2, 2, 5, 4]);
    let w = f64t(&rng.vec(3 * 2 * 3 * 2, -1.0, 1.0), &[3, 2, 3, 2]);
    let b = f64t(&rng.vec(3, -1.0, 1.0), &[3]);
    grad_check("conv2d", &[Some(&x), Some(&w), Some(&b)], &[], 1);
    grad_check(
        "conv2d",
        &[Some(&x), Some(&w), Some(&b)],
        &[("stride", int(2)), ("padding", int(1))],
        2,
    );
    grad_check(
        "conv2d",
        &[Some(&x), Some(&w), None],
        &[("stride", int(3)), ("padding", int(2))],
        3,
    );
}

// ------------------------------------------------------------------------------ nonzero

fn argwhere(v: &[f64], shape: &[usize]) -> Vec<f64> {
    let mut out = Vec::new();
    for (flat, &x) in v.iter().enumerate() {
        if x != 0.0 {
            out.extend(unravel(flat, shape).into_iter().map(|i| i as f64));
        }
    }
    out
}

#[test]
fn nonzero_hand_and_reference() {
    for dt in NUMERIC {
        let x = tensor(&[0.0, 1.0, 2.0, 0.0], &[2, 2], dt);
        let r = run_ok("nonzero", &[&x], &[]);
        assert_eq!(r[0].dtype, DType::I64);
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(r[0].as_slice::<i64>().unwrap(), &[0, 1, 1, 0]);
    }
    let x = f64t(&[f64::NAN, -0.0, 0.0, 3.0], &[4]);
    let r = run_ok("nonzero", &[&x], &[]);
    assert_eq!(r[0].shape, vec![2, 1]);
    assert_eq!(r[0].as_slice::<i64>().unwrap(), &[0, 3]);
    let h = tensor(&[-0.0, 1.0], &[2], DType::F16);
    assert_eq!(run_ok("nonzero", &[&h], &[])[0].shape, vec![1, 1]);
    // rank 0
    assert_eq!(
        run_ok("nonzero", &[&f64t(&[2.0], &[])], &[])[0].shape,
        vec![1, 0]
    );
    assert_eq!(
        run_ok("nonzero", &[&f64t(&[0.0], &[])], &[])[0].shape,
        vec![0, 0]
    );
    // empty
    assert_eq!(
        run_ok("nonzero", &[&f64t(&[], &[3, 0, 2])], &[])[0].shape,
        vec![0, 3]
    );
    // all zero
    assert_eq!(
        run_ok("nonzero", &[&f64t(&[0.0; 6], &[2, 3])], &[])[0].shape,
        vec![0, 2]
    );
    let mut rng = XRng::new(17);
    for dt in NUMERIC {
        let shape = [3usize, 4, 5];
        let v = rng.ints(60, -1, 1);
        let t = tensor(&v, &shape, dt);
        let got = run_ok("nonzero", &[&t], &[]);
        let want = argwhere(&v, &shape);
        assert_eq!(got[0].shape, vec![want.len() / 3, 3]);
        assert_eq!(vals(&got[0]), want);
        let st = Strided::new(&t);
        let gs = run_views("nonzero", &[Some(st.view())], &[], &SerialPool).unwrap();
        assert_bitwise(&got, &gs, "nonzero strided");
    }
}

#[test]
fn nonzero_large_threads_and_metadata() {
    let mut rng = XRng::new(23);
    let shape = [70usize, 50, 30];
    let v: Vec<f64> = (0..shape.iter().product::<usize>())
        .map(|_| {
            if rng.uniform(0.0, 1.0) < 0.3 {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let t = tensor(&v, &shape, DType::I32);
    let got = run_ok("nonzero", &[&t], &[]);
    assert_eq!(vals(&got[0]), argwhere(&v, &shape));
    assert_thread_independent("nonzero", &[Some(&t)], &[]);
    let op = polyop_kernels::registry().lookup("nonzero").unwrap();
    assert!(op.flags.data_dependent_shape);
    assert!(op.backward.is_none());
    assert_eq!(op.onnx_op_type(), "NonZero");
    let a = op.bind_attrs([]).unwrap();
    let s = op
        .infer(
            &[Some(TensorSpec::with_dims(
                DType::F32,
                vec![None, Some(2), None],
            ))],
            &a,
        )
        .unwrap();
    assert_eq!(
        s[0].shape,
        Some(vec![None, Some(3)].into_iter().map(Dim::from).collect())
    );
    assert_eq!(s[0].dtype, DType::I64);
    let s = op
        .infer(&[Some(TensorSpec::unknown_rank(DType::F32))], &a)
        .unwrap();
    assert_eq!(
        s[0].shape,
        Some(vec![None, None].into_iter().map(Dim::from).collect())
    );
    assert_err_contains(
        "nonzero",
        &[Some(&tensor(&[1.0], &[1], DType::Bool))],
        &[],
        "unsupported dtype bool",
    );
}

#[test]
fn registry_is_complete() {
    let reg = polyop_kernels::registry();
    let names: Vec<&str> = reg.ops().map(|o| o.name).collect();
    for n in [
        "negate",
        "add",
        "scale",
        "relu",
        "relu_",
        "add_relu",
        "gelu",
        "softmax",
        "rms_norm",
        "topk",
        "conv2d",
        "nonzero",
        "add_backward",
        "relu_backward",
        "add_relu_backward",
        "gelu_backward",
        "softmax_backward",
        "rms_norm_backward",
        "topk_backward",
        "conv2d_backward",
    ] {
        assert!(names.contains(&n), "{n} missing");
    }
    for (name, schema) in [
        ("softmax", "softmax(Tensor x, int axis=-1) -> Tensor"),
        ("rms_norm", "rms_norm(Tensor x, Tensor? weight=None, float eps=1e-6, int axis=-1) -> Tensor"),
        ("topk", "topk(Tensor x, int k, int axis=-1, bool largest=True) -> (Tensor values, Tensor indices)"),
        ("conv2d", "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[] padding=0, int[2] dilation=1, int groups=1) -> Tensor"),
        ("nonzero", "nonzero(Tensor x) -> Tensor"),
        ("softmax_backward", "softmax_backward(Tensor grad, Tensor y, int axis=-1) -> Tensor"),
        ("rms_norm_backward", "rms_norm_backward(Tensor grad, Tensor x, Tensor? weight=None, float eps=1e-6, int axis=-1) -> (Tensor grad_x, Tensor grad_weight)"),
        ("topk_backward", "topk_backward(Tensor grad_values, Tensor x, Tensor indices, int axis=-1) -> Tensor"),
        ("conv2d_backward", "conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[] padding=0, int[2] dilation=1, int groups=1) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)"),
    ] {
        assert_eq!(reg.lookup(name).unwrap().schema, kernel_core::Schema::parse(schema).unwrap(), "{name}");
    }
    for op in reg.ops() {
        assert_eq!(
            op.flags.backward_only,
            op.name.ends_with("_backward"),
            "{}",
            op.name
        );
    }
}

/// The f32 path's tiling: more kernel rows than one pass takes (3x3 over 40 channels = 360,
/// two passes of 180), output channels that do not fill the last 6-row panel (13), position
/// blocks and 16-wide tiles with remainders (20x21 = 420 positions: blocks 176 + 176 + 68),
/// and a 1x1 convolution; against the f64 reference, bitwise the same for every thread count
/// and at every SIMD level (one fma chain per output in every case).
#[test]
fn conv2d_f32_tiles_passes_threads_and_simd_levels() {
    use polyop_kernels::{force_simd_level, SimdLevel};
    let mut rng = XRng::new(7);
    for (ws, p) in [([13usize, 40, 3, 3], 1usize), ([13, 40, 1, 1], 0)] {
        let xs = [2usize, 40, 20, 21];
        let xv = rng.vec(xs.iter().product(), -1.0, 1.0);
        let wv = rng.vec(ws.iter().product(), -1.0, 1.0);
        let bv = rng.vec(ws[0], -1.0, 1.0);
        for dt in [DType::F32, DType::BF16] {
            let (xr, wr, br) = (rounded(&xv, dt), rounded(&wv, dt), rounded(&bv, dt));
            let (x, w, b) = (
                tensor(&xr, &xs, dt),
                tensor(&wr, &ws, dt),
                tensor(&br, &[ws[0]], dt),
            );
            let attrs = [("padding", int(p as i64))];
            let got = run_ok("conv2d", &[&x, &w, &b], &attrs);
            let (want, shape) = conv_ref(&xr, xs, &wr, ws, Some(&br), 1, p);
            assert_eq!(got[0].shape, shape);
            let abs = |v: &[f64]| v.iter().map(|a| a.abs()).collect::<Vec<f64>>();
            let (scale, _) = conv_ref(&abs(&xr), xs, &abs(&wr), ws, Some(&abs(&br)), 1, p);
            assert_close_scaled(
                &vals(&got[0]),
                &want,
                Some(&scale),
                dt,
                &format!("conv2d {dt} {ws:?}"),
            );
            assert_thread_independent("conv2d", &[Some(&x), Some(&w), Some(&b)], &attrs);
            force_simd_level(Some(SimdLevel::Baseline));
            let base = run_ok("conv2d", &[&x, &w, &b], &attrs);
            force_simd_level(None);
            assert_bitwise(
                &got,
                &base,
                &format!("conv2d {dt} {ws:?} at the baseline level"),
            );
        }
    }
}

#[test]
fn conv2d_grouped_1x1_reads_each_group_s_channels() {
    // A 1x1, stride-1, unpadded convolution reads its input in place (no im2col copy): group
    // g's tiles must read channels g * C/groups.. of the right image. Reference: one
    // ungrouped convolution per group on its channel slice.
    let mut rng = XRng::new(11);
    let (xs, ws, groups) = ([2usize, 16, 5, 7], [12usize, 4, 1, 1], 4);
    let (cg, og, plane) = (xs[1] / groups, ws[0] / groups, xs[2] * xs[3]);
    let xr = rounded(&rng.vec(xs.iter().product(), -1.0, 1.0), DType::F32);
    let wr = rounded(&rng.vec(ws.iter().product(), -1.0, 1.0), DType::F32);
    let br = rounded(&rng.vec(ws[0], -1.0, 1.0), DType::F32);
    let grouped_ref = |xr: &[f64], wr: &[f64], br: &[f64]| {
        let mut want = vec![0.0; xs[0] * ws[0] * plane];
        for g in 0..groups {
            let xg: Vec<f64> = (0..xs[0])
                .flat_map(|n| {
                    xr[(n * xs[1] + g * cg) * plane..(n * xs[1] + (g + 1) * cg) * plane].to_vec()
                })
                .collect();
            let (wg, bg) = (
                &wr[g * og * cg..(g + 1) * og * cg],
                &br[g * og..(g + 1) * og],
            );
            let xsg = [xs[0], cg, xs[2], xs[3]];
            let (out, _) = conv_ref(&xg, xsg, wg, [og, cg, 1, 1], Some(bg), 1, 0);
            for n in 0..xs[0] {
                for o in 0..og {
                    let (dst, src) = ((n * ws[0] + g * og + o) * plane, (n * og + o) * plane);
                    want[dst..dst + plane].copy_from_slice(&out[src..src + plane]);
                }
            }
        }
        want
    };
    let want = grouped_ref(&xr, &wr, &br);
    let abs = |v: &[f64]| v.iter().map(|a| a.abs()).collect::<Vec<f64>>();
    let scale = grouped_ref(&abs(&xr), &abs(&wr), &abs(&br));
    let x = tensor(&xr, &xs, DType::F32);
    let (w, b) = (
        tensor(&wr, &ws, DType::F32),
        tensor(&br, &[ws[0]], DType::F32),
    );
    let attrs = [("groups", int(groups as i64))];
    let got = run_ok("conv2d", &[&x, &w, &b], &attrs);
    assert_eq!(got[0].shape, vec![xs[0], ws[0], xs[2], xs[3]]);
    let label = "conv2d grouped 1x1";
    assert_close_scaled(&vals(&got[0]), &want, Some(&scale), DType::F32, label);
    assert_thread_independent("conv2d", &[Some(&x), Some(&w), Some(&b)], &attrs);
}

/// conv2d with relu handed to it as an epilogue (what the ONNX Runtime provider runs for a
/// fused `Conv` + `Relu`) gives exactly the bits of conv2d then relu, and with add (of a
/// residual, as either operand) then relu the bits of conv2d, add, relu, on every f32 path:
/// the channel-vectorized path (3x3 at strides 1 and 2, grouped), 1x1 layers read in place,
/// im2col tiles (1x1 at stride 2), and depthwise (which leaves the epilogue to the call path),
/// serially and on 3 threads; and each relu result is relu of a float64 reference within
/// tolerance.
#[test]
fn conv2d_with_a_relu_epilogue_is_conv2d_then_relu_bit_for_bit() {
    use kernel_core::call::{run_with_epilogue, CallSite, Phase};
    use kernel_core::exec::OwnedAllocator;
    use kernel_core::{AttrValue, Epilogue, EpilogueFn, OwnedTensor, RayonPool, ThreadPool};
    let reg = polyop_kernels::registry();
    let Some(EpilogueFn::Unary(relu)) = reg.lookup("relu").unwrap().epilogue else {
        panic!("relu is a unary epilogue")
    };
    let Some(EpilogueFn::Binary(add)) = reg.lookup("add").unwrap().epilogue else {
        panic!("add is a binary epilogue")
    };
    let conv = reg.lookup("conv2d").unwrap();
    assert!(conv.flags.applies_epilogue);
    let fused = |ins: &[Option<&OwnedTensor>],
                 attrs: &kernel_core::Attrs,
                 steps: &[Epilogue],
                 pool: &dyn ThreadPool| {
        let views: Vec<_> = ins.iter().map(|t| t.map(|t| t.view())).collect();
        let mut alloc = OwnedAllocator::default();
        let site = CallSite::once(attrs.clone());
        run_with_epilogue(conv, &views, &site, &mut alloc, pool, Phase::Compute, steps).unwrap();
        alloc
            .outputs
            .into_iter()
            .map(|b| *b)
            .collect::<Vec<OwnedTensor>>()
    };
    let mut rng = XRng::new(41);
    let abs = |v: &[f64]| v.iter().map(|a| a.abs()).collect::<Vec<f64>>();
    // (c, h, o, k, stride, padding, groups)
    for (c, h, o, k, s, p, g) in [
        (16, 9, 20, 3, 1, 1, 1),
        (8, 7, 13, 1, 1, 0, 1),
        (6, 11, 10, 3, 2, 1, 1),
        (6, 11, 10, 1, 2, 0, 1),
        (8, 6, 12, 3, 1, 1, 2),
        (8, 8, 8, 3, 1, 1, 8),
        // more than one run of finished positions per block (`EPILOGUE_RUN`)
        (4, 20, 8, 3, 1, 1, 1),
        (4, 20, 8, 1, 1, 0, 1),
    ] {
        let what = format!("c{c} h{h} o{o} k{k} s{s} p{p} g{g}");
        let xv = rounded(&rng.vec(2 * c * h * h, -1.0, 1.0), DType::F32);
        let wv = rounded(&rng.vec(o * (c / g) * k * k, -1.0, 1.0), DType::F32);
        let bv = rounded(&rng.vec(o, -0.5, 0.5), DType::F32);
        let x = tensor(&xv, &[2, c, h, h], DType::F32);
        let w = tensor(&wv, &[o, c / g, k, k], DType::F32);
        let b = tensor(&bv, &[o], DType::F32);
        let attrs = [
            ("stride", AttrValue::IntList(vec![s as i64, s as i64])),
            ("padding", AttrValue::IntList(vec![p as i64, p as i64])),
            ("groups", AttrValue::Int(g as i64)),
        ];
        let plain = run_ok("conv2d", &[&x, &w, &b], &attrs);
        let unfused = run_ok("relu", &[&plain[0]], &[]);
        assert!(
            vals(&plain[0]).iter().filter(|v| **v < 0.0).count() > 10,
            "{what}: the test needs negative outputs"
        );
        let a = attrs_of("conv2d", &attrs).unwrap();
        let ins = [Some(&x), Some(&w), Some(&b)];
        let steps = [Epilogue::Unary(relu)];
        assert_bitwise(&unfused, &fused(&ins, &a, &steps, &SerialPool), &what);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let par = pool.install(|| fused(&ins, &a, &steps, &RayonPool));
        assert_bitwise(&unfused, &par, &format!("{what}, 3 threads"));
        // + a residual, on either side, then relu
        let rv = rounded(&rng.vec(vals(&plain[0]).len(), -1.0, 1.0), DType::F32);
        let r = tensor(&rv, &plain[0].shape, DType::F32);
        let r32: Vec<f32> = rv.iter().map(|&v| v as f32).collect();
        for out_first in [true, false] {
            let (p, q) = if out_first {
                (&plain[0], &r)
            } else {
                (&r, &plain[0])
            };
            let want = run_ok("relu", &[&run_ok("add", &[p, q], &[])[0]], &[]);
            let steps = [
                Epilogue::Binary(add, &r32, out_first),
                Epilogue::Unary(relu),
            ];
            let got = pool.install(|| fused(&ins, &a, &steps, &RayonPool));
            assert_bitwise(
                &want,
                &got,
                &format!("{what} + residual ({out_first}), relu"),
            );
            assert!(
                vals(&got[0]) != vals(&par[0]),
                "{what}: the residual changes the result"
            );
        }
        // against an independent reference: relu of the float64 convolution, group by group
        let (cg, og) = (c / g, o / g);
        let pos = plain[0].shape[2] * plain[0].shape[3];
        let reference = |xv: &[f64], wv: &[f64], bv: &[f64], act: fn(f64) -> f64| {
            let mut want = vec![0.0; 2 * o * pos];
            for gi in 0..g {
                let xs: Vec<f64> = (0..2)
                    .flat_map(|n| {
                        xv[(n * c + gi * cg) * h * h..(n * c + gi * cg + cg) * h * h].to_vec()
                    })
                    .collect();
                let wg = &wv[gi * og * cg * k * k..(gi + 1) * og * cg * k * k];
                let bg = &bv[gi * og..(gi + 1) * og];
                let (r, _) = conv_ref(&xs, [2, cg, h, h], wg, [og, cg, k, k], Some(bg), s, p);
                for n in 0..2 {
                    for oc in 0..og {
                        for q in 0..pos {
                            want[(n * o + gi * og + oc) * pos + q] =
                                act(r[(n * og + oc) * pos + q]);
                        }
                    }
                }
            }
            want
        };
        let want = reference(&xv, &wv, &bv, |v| v.max(0.0));
        let scale = reference(&abs(&xv), &abs(&wv), &abs(&bv), |v| v);
        let label = format!("conv2d relu epilogue {what}");
        assert_close_scaled(&vals(&par[0]), &want, Some(&scale), DType::F32, &label);
    }
}

/// An epilogue operand that shares memory with the output is refused before the kernel runs
/// (the kernel would read through a shared view of memory it writes), the output untouched.
#[test]
fn an_epilogue_operand_overlapping_the_output_is_refused() {
    use kernel_core::call::{run_with_epilogue, CallSite, Phase};
    use kernel_core::{Epilogue, EpilogueFn, OutputAllocator, TensorMut};
    struct IntoBuf(*mut f32, usize);
    impl<'a> OutputAllocator<'a> for IntoBuf {
        fn allocate(
            &mut self,
            _: usize,
            dtype: DType,
            shape: &[usize],
        ) -> kernel_core::Result<TensorMut<'a>> {
            assert_eq!(shape.iter().product::<usize>(), self.1);
            // SAFETY: a live buffer of `self.1` f32 values (the test's), used only in this call.
            Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, self.0 as *mut u8) })
        }
    }
    let reg = polyop_kernels::registry();
    let Some(EpilogueFn::Binary(add)) = reg.lookup("add").unwrap().epilogue else {
        panic!("add is a binary epilogue")
    };
    let conv = reg.lookup("conv2d").unwrap();
    let x = tensor(&[1.0; 16], &[1, 1, 4, 4], DType::F32);
    let w = tensor(&[1.0; 9], &[1, 1, 3, 3], DType::F32);
    let mut buf = vec![7f32; 4];
    let ptr = buf.as_mut_ptr();
    // SAFETY: a view of `buf` that is only read if the call went ahead (it must not).
    let other: &[f32] = unsafe { std::slice::from_raw_parts(ptr, 4) };
    let site = CallSite::once(attrs_of("conv2d", &[]).unwrap());
    let ins = [Some(x.view()), Some(w.view()), None];
    let err = run_with_epilogue(
        conv,
        &ins,
        &site,
        &mut IntoBuf(ptr, 4),
        &SerialPool,
        Phase::Compute,
        &[Epilogue::Binary(add, other, true)],
    )
    .unwrap_err();
    assert!(err.to_string().contains("overlaps the output"), "{err}");
    assert_eq!(buf, vec![7f32; 4]);
}
