//! negate, add, scale, relu, relu_, add_relu, gelu and their backward ops against
//! independent references.

mod util;

use kernel_core::{
    DType, Dim, KernelCtx, OwnedTensor, SerialPool, TensorMut, TensorRef, TensorSpec,
};
use proptest::prelude::*;
use util::*;

/// erf by composite Simpson integration of 2/sqrt(pi) exp(-t^2) (independent of libm's erf).
fn erf_ref(x: f64) -> f64 {
    let n = 4000;
    let h = x / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x);
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
}

/// erfc(z) for z >= 0.5 by its continued fraction, erfc(z) = e^(-z^2) / sqrt(pi) /
/// (z + (1/2) / (z + 1 / (z + (3/2) / (z + ...)))), evaluated backwards: relative accuracy
/// where 1 - erf(z) would cancel.
fn erfc_ref(z: f64) -> f64 {
    assert!(z >= 0.5);
    let mut t = z;
    for k in (1..=20_000).rev() {
        t = z + (k as f64 / 2.0) / t;
    }
    (-z * z).exp() / std::f64::consts::PI.sqrt() / t
}

/// gelu from its definitions without cancellation in the negative tail (the kernel must be
/// accurate there, to ulps): x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 for x < 0, and
/// 0.5 x (1 + tanh u) = x / (1 + e^(-2u)).
fn gelu_ref(x: f64, tanh: bool) -> f64 {
    if tanh {
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        x / (1.0 + (-2.0 * u).exp())
    } else if x / 2f64.sqrt() < -0.5 {
        0.5 * x * erfc_ref(-x / 2f64.sqrt())
    } else {
        0.5 * x * (1.0 + erf_ref(x / 2f64.sqrt()))
    }
}

/// Naive NumPy-style broadcast binary op in f64.
fn broadcast_ref(
    a: &[f64],
    ashape: &[usize],
    b: &[f64],
    bshape: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> (Vec<f64>, Vec<usize>) {
    let rank = ashape.len().max(bshape.len());
    let pad = |s: &[usize]| {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (ap, bp) = (pad(ashape), pad(bshape));
    let out: Vec<usize> = ap
        .iter()
        .zip(&bp)
        .map(|(&x, &y)| if x == 1 { y } else { x })
        .collect();
    let n: usize = out.iter().product();
    let mut res = Vec::with_capacity(n);
    for flat in 0..n {
        let idx = unravel(flat, &out);
        let ai: Vec<usize> = idx
            .iter()
            .zip(&ap)
            .map(|(&i, &d)| if d == 1 { 0 } else { i })
            .collect();
        let bi: Vec<usize> = idx
            .iter()
            .zip(&bp)
            .map(|(&i, &d)| if d == 1 { 0 } else { i })
            .collect();
        res.push(f(a[ravel(&ai, &ap)], b[ravel(&bi, &bp)]));
    }
    (res, out)
}

#[test]
fn registry_has_elementwise_ops_with_exact_schemas() {
    let reg = polyop_kernels::registry();
    for (name, schema) in [
        ("negate", "negate(Tensor x) -> Tensor"),
        ("add", "add(Tensor x, Tensor y) -> Tensor"),
        ("scale", "scale(Tensor x, float alpha) -> Tensor"),
        ("relu", "relu(Tensor x) -> Tensor"),
        ("relu_", "relu_(Tensor(a!) x) -> Tensor(a!)"),
        ("add_relu", "add_relu(Tensor x, Tensor y) -> Tensor"),
        ("gelu", "gelu(Tensor x, str approximate=\"none\") -> Tensor"),
        (
            "add_backward",
            "add_backward(Tensor grad, Tensor x, Tensor y) -> (Tensor grad_x, Tensor grad_y)",
        ),
        (
            "relu_backward",
            "relu_backward(Tensor grad, Tensor x) -> Tensor",
        ),
        (
            "add_relu_backward",
            "add_relu_backward(Tensor grad, Tensor x, Tensor y) -> (Tensor grad_x, Tensor grad_y)",
        ),
        (
            "gelu_backward",
            "gelu_backward(Tensor grad, Tensor x, str approximate=\"none\") -> Tensor",
        ),
    ] {
        let op = reg.lookup(name).unwrap();
        assert_eq!(
            op.schema,
            kernel_core::Schema::parse(schema).unwrap(),
            "{name}"
        );
    }
    assert!(reg.lookup("relu_").unwrap().flags.inplace);
    assert!(reg.lookup("relu_").unwrap().backward.is_none());
    for b in [
        "add_backward",
        "relu_backward",
        "add_relu_backward",
        "gelu_backward",
    ] {
        assert!(reg.lookup(b).unwrap().flags.backward_only, "{b}");
    }
    let add = reg.lookup("add").unwrap().backward.unwrap();
    assert_eq!(add.op, "add_backward");
    assert_eq!(reg.lookup("scale").unwrap().backward.unwrap().op, "scale");
    assert_eq!(reg.lookup("negate").unwrap().backward.unwrap().op, "negate");
}

#[test]
fn hand_worked_values_every_dtype() {
    for dt in NUMERIC {
        let x = tensor(&[1.0, -2.0, 3.0, 0.0], &[2, 2], dt);
        let y = tensor(&[10.0, -20.0], &[2], dt);
        assert_eq!(
            vals(&run_ok("negate", &[&x], &[])[0]),
            vec![-1.0, 2.0, -3.0, 0.0],
            "{dt}"
        );
        assert_eq!(
            vals(&run_ok("relu", &[&x], &[])[0]),
            vec![1.0, 0.0, 3.0, 0.0],
            "{dt}"
        );
        assert_eq!(
            vals(&run_ok("relu_", &[&x], &[])[0]),
            vec![1.0, 0.0, 3.0, 0.0],
            "{dt}"
        );
        let s = run_ok("add", &[&x, &y], &[]);
        assert_eq!(s[0].dtype, dt);
        assert_eq!(s[0].shape, vec![2, 2]);
        assert_eq!(vals(&s[0]), vec![11.0, -22.0, 13.0, -20.0], "{dt}");
        assert_eq!(
            vals(&run_ok("add_relu", &[&x, &y], &[])[0]),
            vec![11.0, 0.0, 13.0, 0.0],
            "{dt}"
        );
    }
    for dt in FLOAT {
        let x = tensor(&[1.0, -2.0, 0.5], &[3], dt);
        assert_eq!(
            vals(&run_ok("scale", &[&x], &[("alpha", float(-2.0))])[0]),
            vec![-2.0, 4.0, -1.0]
        );
        // int alpha is coerced to float
        assert_eq!(
            vals(&run_ok("scale", &[&x], &[("alpha", int(3))])[0]),
            vec![3.0, -6.0, 1.5]
        );
        let g = vals(&run_ok("gelu", &[&x], &[])[0]);
        assert_close(
            &g,
            &[
                0.841_344_746_068_542_9,
                -0.045_500_263_896_358_42,
                0.345_731_230_637_006_56,
            ],
            dt,
            "gelu",
        );
        let g = vals(&run_ok("gelu", &[&x], &[("approximate", string("tanh"))])[0]);
        assert_close(
            &g,
            &[
                0.841_191_990_608_276_8,
                -0.045_402_305_912_224_94,
                0.345_714_009_825_143_94,
            ],
            dt,
            "gelu tanh",
        );
    }
}

#[test]
fn integer_overflow_wraps() {
    let x = tensor(&[i32::MIN as f64, i32::MAX as f64], &[2], DType::I32);
    let n = run_ok("negate", &[&x], &[]);
    assert_eq!(n[0].as_slice::<i32>().unwrap(), &[i32::MIN, -i32::MAX]);
    let one = tensor(&[1.0], &[1], DType::I32);
    let s = run_ok("add", &[&x, &one], &[]);
    assert_eq!(s[0].as_slice::<i32>().unwrap(), &[i32::MIN + 1, i32::MIN]);
    let x = OwnedTensor::from_vec(vec![i64::MAX, i64::MIN], &[2]).unwrap();
    let one = OwnedTensor::from_vec(vec![1i64], &[]).unwrap();
    let s = run_ok("add", &[&x, &one], &[]);
    assert_eq!(s[0].as_slice::<i64>().unwrap(), &[i64::MIN, i64::MIN + 1]);
    let n = run_ok("negate", &[&x], &[]);
    assert_eq!(n[0].as_slice::<i64>().unwrap(), &[i64::MIN + 1, i64::MIN]);
    let r = run_ok("add_relu", &[&x, &one], &[]);
    // MAX + 1 wraps to MIN, then relu: both negative
    assert_eq!(r[0].as_slice::<i64>().unwrap(), &[0, 0]);
}

#[test]
fn nan_and_inf_handling() {
    let x = f64t(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0], &[4]);
    let r = vals(&run_ok("relu", &[&x], &[])[0]);
    assert!(r[0].is_nan());
    assert_eq!(&r[1..], &[f64::INFINITY, 0.0, 0.0]);
    let z = f64t(&[0.0; 4], &[4]);
    let r = vals(&run_ok("add_relu", &[&x, &z], &[])[0]);
    assert!(r[0].is_nan());
    // relu_backward: NaN x passes no gradient (documented)
    let g = f64t(&[1.0, 1.0, 1.0, 1.0], &[4]);
    let r = vals(&run_ok("relu_backward", &[&g, &x], &[])[0]);
    assert_eq!(r, vec![0.0, 1.0, 0.0, 0.0]);
    let gl = vals(
        &run_ok(
            "gelu",
            &[&f64t(
                &[f64::INFINITY, f64::NEG_INFINITY, 40.0, -40.0],
                &[4],
            )],
            &[],
        )[0],
    );
    assert_eq!(gl[0], f64::INFINITY);
    // -inf * (1 + erf(-inf)) = -inf * 0: NaN, as the formula gives
    assert!(gl[1].is_nan() || gl[1] == 0.0);
    assert_eq!(gl[2], 40.0);
    assert_eq!(gl[3].abs(), 0.0);
}

#[test]
fn empty_rank0_and_high_rank() {
    for dt in NUMERIC {
        // rank 0
        let a = tensor(&[3.0], &[], dt);
        let b = tensor(&[-5.0], &[], dt);
        let s = run_ok("add", &[&a, &b], &[]);
        assert_eq!(s[0].shape, Vec::<usize>::new());
        assert_eq!(vals(&s[0]), vec![-2.0]);
        assert_eq!(vals(&run_ok("relu", &[&b], &[])[0]), vec![0.0]);
        // empty
        let e = tensor(&[], &[0, 3], dt);
        let r = tensor(&[1.0, 2.0, 3.0], &[3], dt);
        let s = run_ok("add", &[&e, &r], &[]);
        assert_eq!(s[0].shape, vec![0, 3]);
        let s = run_ok("negate", &[&e], &[]);
        assert_eq!(s[0].shape, vec![0, 3]);
        let s = run_ok(
            "add",
            &[&tensor(&[], &[2, 0], dt), &tensor(&[], &[1, 0], dt)],
            &[],
        );
        assert_eq!(s[0].shape, vec![2, 0]);
    }
    // rank 9 broadcasting
    let sa = [2, 1, 2, 1, 2, 1, 2, 1, 2];
    let sb = [1, 2, 1, 2, 1, 2, 1, 2, 1];
    let mut rng = XRng::new(9);
    let av = rng.vec(32, -1.0, 1.0);
    let bv = rng.vec(16, -1.0, 1.0);
    let got = run_ok("add", &[&f64t(&av, &sa), &f64t(&bv, &sb)], &[]);
    let (want, shape) = broadcast_ref(&av, &sa, &bv, &sb, |x, y| x + y);
    assert_eq!(got[0].shape, shape);
    assert_eq!(vals(&got[0]), want);
}

#[test]
fn every_dtype_against_reference_with_strided_inputs() {
    let mut rng = XRng::new(1);
    for dt in NUMERIC {
        let (sa, sb) = ([3usize, 1, 5, 4], [2usize, 1, 4]);
        let (av, bv) = if dt.is_float() {
            (rng.vec(60, -3.0, 3.0), rng.vec(8, -3.0, 3.0))
        } else {
            (rng.ints(60, -50, 50), rng.ints(8, -50, 50))
        };
        let (a, b) = (tensor(&av, &sa, dt), tensor(&bv, &sb, dt));
        let (ar, br) = (rounded(&av, dt), rounded(&bv, dt));
        let (sta, stb) = (Strided::new(&a), Strided::new(&b));
        assert!(!sta.view().is_contiguous());
        for (op, f) in [
            ("add", (|x: f64, y: f64| x + y) as fn(f64, f64) -> f64),
            ("add_relu", |x, y| (x + y).max(0.0)),
        ] {
            let (want, shape) = broadcast_ref(&ar, &sa, &br, &sb, f);
            let got = run_ok(op, &[&a, &b], &[]);
            assert_eq!(got[0].shape, shape);
            assert_close(&vals(&got[0]), &want, dt, op);
            // strided inputs: bitwise the same as contiguous
            let got_s =
                run_views(op, &[Some(sta.view()), Some(stb.view())], &[], &SerialPool).unwrap();
            assert_bitwise(&got, &got_s, op);
        }
        for (op, f) in [
            ("negate", (|x: f64| -x) as fn(f64) -> f64),
            ("relu", |x: f64| x.max(0.0)),
        ] {
            let want: Vec<f64> = ar.iter().map(|&x| f(x)).collect();
            let got = run_ok(op, &[&a], &[]);
            assert_close(&vals(&got[0]), &want, dt, op);
            let got_s = run_views(op, &[Some(sta.view())], &[], &SerialPool).unwrap();
            assert_bitwise(&got, &got_s, op);
        }
        if dt.is_float() {
            let attrs = [("alpha", float(0.75))];
            let want: Vec<f64> = ar.iter().map(|&x| x * 0.75).collect();
            let got = run_ok("scale", &[&a], &attrs);
            assert_close(&vals(&got[0]), &want, dt, "scale");
            let got_s = run_views("scale", &[Some(sta.view())], &attrs, &SerialPool).unwrap();
            assert_bitwise(&got, &got_s, "scale");
            for mode in ["none", "tanh"] {
                let attrs = [("approximate", string(mode))];
                let want: Vec<f64> = ar.iter().map(|&x| gelu_ref(x, mode == "tanh")).collect();
                let got = run_ok("gelu", &[&a], &attrs);
                assert_close(&vals(&got[0]), &want, dt, "gelu");
                let got_s = run_views("gelu", &[Some(sta.view())], &attrs, &SerialPool).unwrap();
                assert_bitwise(&got, &got_s, "gelu strided");
            }
        }
    }
}

#[test]
fn half_types_round_once() {
    // 1 + 2^-11 is not representable in f16, 1 + 2^-10 is; compute in f32 and round once
    let x = tensor(&[1.0], &[1], DType::F16);
    let y = tensor(&[2f64.powi(-11) * 1.5], &[1], DType::F16);
    let got = vals(&run_ok("add", &[&x, &y], &[])[0]);
    let exact = 1.0 + 2f64.powi(-11) * 1.5;
    assert_eq!(got[0], kernel_core::half::f16::from_f64(exact).to_f64());
}

#[test]
fn thread_count_independence() {
    let mut rng = XRng::new(5);
    let n = 300_001;
    let a = f64t(&rng.vec(n, -2.0, 2.0), &[n]);
    let a32 = tensor(&rng.vec(n, -2.0, 2.0), &[n], DType::F32);
    let h = tensor(&rng.vec(n, -2.0, 2.0), &[n], DType::BF16);
    let row = f64t(&rng.vec(7, -1.0, 1.0), &[7]);
    let big = f64t(&rng.vec(7 * 50_000, -1.0, 1.0), &[50_000, 7]);
    assert_thread_independent("add", &[Some(&a), Some(&a)], &[]);
    assert_thread_independent("add", &[Some(&big), Some(&row)], &[]);
    assert_thread_independent("gelu", &[Some(&a32)], &[]);
    assert_thread_independent("gelu", &[Some(&h)], &[("approximate", string("tanh"))]);
    assert_thread_independent("relu", &[Some(&h)], &[]);
    assert_thread_independent("add_backward", &[Some(&big), Some(&big), Some(&row)], &[]);
    let col = f64t(&rng.vec(50_000, -1.0, 1.0), &[50_000, 1]);
    assert_thread_independent(
        "add_relu_backward",
        &[Some(&big), Some(&col), Some(&row)],
        &[],
    );
}

#[test]
fn relu_inplace_aliasing_output() {
    // torch passes the same buffer as input and output.
    let op = polyop_kernels::registry().lookup("relu_").unwrap();
    let attrs = op.bind_attrs([]).unwrap();
    let mut rng = XRng::new(3);
    let v = rng.vec(100_000, -1.0, 1.0);
    let mut buf = v.clone();
    let shape = [100_000usize];
    let p = buf.as_mut_ptr();
    // SAFETY: `buf` holds 100_000 initialised f64s at `p`, outlives both views (they are
    // dropped with `inputs`/`outs` before `buf` is read below) and is used through nothing
    // else meanwhile; the input aliases the output with the same layout, the one aliasing
    // `from_raw` allows (an in-place call).
    let input = unsafe { TensorRef::from_raw(DType::F64, shape.to_vec(), vec![1], p as *const u8) };
    // SAFETY: as above: a dense [100_000] f64 buffer, exclusive but for the in-place input.
    let out = unsafe { TensorMut::from_raw_contiguous(DType::F64, &shape, p as *mut u8) };
    let inputs = [Some(input)];
    let mut outs = [out];
    let pool = kernel_core::RayonPool;
    {
        let mut ctx = KernelCtx::new(op, &inputs, &mut outs, &attrs, &pool);
        op.compute(&mut ctx).unwrap();
    }
    let want: Vec<f64> = v.iter().map(|&x| x.max(0.0)).collect();
    assert_eq!(buf, want);
}

#[test]
fn shape_inference_with_unknown_dims() {
    let reg = polyop_kernels::registry();
    let add = reg.lookup("add").unwrap();
    let attrs = add.bind_attrs([]).unwrap();
    let spec = |d: Vec<Option<usize>>| Some(TensorSpec::with_dims(DType::F32, d));
    let infer = |a, b| add.infer(&[a, b], &attrs).map(|v| v[0].shape.clone());
    assert_eq!(
        infer(spec(vec![None, Some(3)]), spec(vec![Some(1)])).unwrap(),
        Some(vec![None, Some(3)].into_iter().map(Dim::from).collect())
    );
    assert_eq!(
        infer(spec(vec![None]), spec(vec![None])).unwrap(),
        Some(vec![None].into_iter().map(Dim::from).collect())
    );
    assert_eq!(
        infer(spec(vec![Some(2)]), spec(vec![None])).unwrap(),
        Some(vec![Some(2)].into_iter().map(Dim::from).collect())
    );
    assert_eq!(
        infer(spec(vec![Some(1)]), spec(vec![None, None])).unwrap(),
        Some(vec![None, None].into_iter().map(Dim::from).collect())
    );
    assert_eq!(
        infer(
            Some(TensorSpec::unknown_rank(DType::F32)),
            spec(vec![Some(2)])
        )
        .unwrap(),
        None
    );
    let e = infer(spec(vec![Some(2), None]), spec(vec![Some(3), Some(4)])).unwrap_err();
    assert!(
        e.to_string()
            .contains("cannot be broadcast together (dim 2 vs 3)"),
        "{e}"
    );
    let gelu = reg.lookup("gelu").unwrap();
    let a = gelu.bind_attrs([("approximate", string("fast"))]).unwrap();
    let e = gelu.infer(&[spec(vec![None])], &a).unwrap_err();
    assert!(
        e.to_string()
            .contains(r#"approximate must be "none" or "tanh", got "fast""#),
        "{e}"
    );
    let ab = reg.lookup("add_backward").unwrap();
    let out = ab
        .infer(
            &[
                spec(vec![None, Some(3)]),
                spec(vec![Some(3)]),
                spec(vec![None, Some(1)]),
            ],
            &ab.bind_attrs([]).unwrap(),
        )
        .unwrap();
    assert_eq!(
        out[0].shape,
        Some(vec![Some(3)].into_iter().map(Dim::from).collect())
    );
    assert_eq!(
        out[1].shape,
        Some(vec![None, Some(1)].into_iter().map(Dim::from).collect())
    );
}

#[test]
fn error_paths() {
    let x32 = tensor(&[1.0, 2.0], &[2], DType::F32);
    let x64 = tensor(&[1.0, 2.0], &[2], DType::F64);
    let x3 = tensor(&[1.0, 2.0, 3.0], &[3], DType::F32);
    let i = tensor(&[1.0, 2.0], &[2], DType::I32);
    let b = tensor(&[1.0, 0.0], &[2], DType::Bool);
    assert_err_contains(
        "add",
        &[Some(&x32), Some(&x64)],
        &[],
        "dtype mismatch: input `y` is float64 but earlier inputs are float32",
    );
    assert_err_contains(
        "add",
        &[Some(&x32), Some(&x3)],
        &[],
        "shapes [2] and [3] cannot be broadcast together",
    );
    assert_err_contains(
        "add_relu",
        &[Some(&x32), Some(&x3)],
        &[],
        "cannot be broadcast",
    );
    assert_err_contains(
        "scale",
        &[Some(&i)],
        &[("alpha", float(1.0))],
        "unsupported dtype int32",
    );
    assert_err_contains(
        "scale",
        &[Some(&x32)],
        &[],
        "missing required attribute `alpha`",
    );
    assert_err_contains("negate", &[Some(&b)], &[], "unsupported dtype bool");
    assert_err_contains("gelu", &[Some(&i)], &[], "unsupported dtype int32");
    assert_err_contains(
        "gelu",
        &[Some(&x32)],
        &[("approximate", string("fast"))],
        r#"approximate must be "none" or "tanh", got "fast""#,
    );
    assert_err_contains(
        "gelu_backward",
        &[Some(&x32), Some(&x32)],
        &[("approximate", string("Tanh"))],
        "approximate must be",
    );
    assert_err_contains(
        "relu_backward",
        &[Some(&x32), Some(&x3)],
        &[],
        "grad has shape [2] but x has shape [3]",
    );
    assert_err_contains(
        "add_backward",
        &[Some(&x3), Some(&x32), Some(&x32)],
        &[],
        "grad has shape [3] but x and y broadcast to [2]",
    );
    assert_err_contains("negate", &[], &[], "expected 1 tensor input(s)");
    // the next call still works
    assert_eq!(vals(&run_ok("add", &[&x32, &x32], &[])[0]), vec![2.0, 4.0]);
}

#[test]
fn gradients_numeric_f64() {
    let mut rng = XRng::new(11);
    let x = f64t(&rng.vec(12, -2.0, 2.0), &[3, 4]);
    let y = f64t(&rng.vec(4, -2.0, 2.0), &[4]);
    let col = f64t(&rng.vec(3, -2.0, 2.0), &[3, 1]);
    let s = f64t(&rng.vec(1, -2.0, 2.0), &[]);
    grad_check("negate", &[Some(&x)], &[], 1);
    grad_check("scale", &[Some(&x)], &[("alpha", float(-1.7))], 2);
    grad_check("add", &[Some(&x), Some(&y)], &[], 3);
    grad_check("add", &[Some(&col), Some(&y)], &[], 4);
    grad_check("add", &[Some(&s), Some(&x)], &[], 5);
    // keep x + y (and x) away from the kinks
    let away = |v: Vec<f64>| {
        v.into_iter()
            .map(|a| if a.abs() < 0.1 { a + 0.3 } else { a })
            .collect::<Vec<_>>()
    };
    let xr = f64t(&away(rng.vec(12, -2.0, 2.0)), &[3, 4]);
    grad_check("relu", &[Some(&xr)], &[], 6);
    let zero = f64t(&[0.0; 4], &[4]);
    grad_check("add_relu", &[Some(&xr), Some(&zero)], &[], 7);
    let c2 = f64t(&[0.5, -0.25, 1.0], &[3, 1]);
    let r2 = f64t(&[0.05, -3.0, 3.0, 0.01], &[1, 4]);
    let sum = broadcast_ref(&vals(&c2), &[3, 1], &vals(&r2), &[1, 4], |a, b| a + b).0;
    assert!(sum.iter().all(|v| v.abs() > 0.01));
    grad_check("add_relu", &[Some(&c2), Some(&r2)], &[], 8);
    for mode in ["none", "tanh"] {
        grad_check("gelu", &[Some(&x)], &[("approximate", string(mode))], 9);
    }
}

#[test]
fn grads_of_empty_broadcasts_are_zero_filled() {
    // grad_x of shape [1, 3] from an empty [0, 3] grad: sum over nothing = 0, even if the
    // output buffer held garbage.
    let g = f64t(&[], &[0, 3]);
    let x = f64t(&[1.0, 2.0, 3.0], &[1, 3]);
    let y = f64t(&[], &[0, 3]);
    let op = polyop_kernels::registry().lookup("add_backward").unwrap();
    let attrs = op.bind_attrs([]).unwrap();
    let mut gx = f64t(&[7.0, 7.0, 7.0], &[1, 3]);
    let mut gy = f64t(&[], &[0, 3]);
    {
        let inputs = [Some(g.view()), Some(x.view()), Some(y.view())];
        let mut outs = [gx.view_mut(), gy.view_mut()];
        let mut ctx = KernelCtx::new(op, &inputs, &mut outs, &attrs, &SerialPool);
        op.compute(&mut ctx).unwrap();
    }
    assert_eq!(vals(&gx), vec![0.0, 0.0, 0.0]);
}

fn shape_strategy() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    // an output shape, then for each operand each dim is either kept or 1, and leading dims
    // may be dropped
    prop::collection::vec(0usize..4, 0..5).prop_flat_map(|out| {
        let r = out.len();
        (
            Just(out.clone()),
            prop::collection::vec(any::<bool>(), r),
            prop::collection::vec(any::<bool>(), r),
            0..=r,
            0..=r,
        )
            .prop_map(move |(out, ma, mb, da, db)| {
                let a: Vec<usize> = out
                    .iter()
                    .zip(&ma)
                    .map(|(&d, &m)| if m { d } else { 1 })
                    .collect();
                let b: Vec<usize> = out
                    .iter()
                    .zip(&mb)
                    .map(|(&d, &m)| if m { d } else { 1 })
                    .collect();
                (a[da.min(r)..].to_vec(), b[db.min(r)..].to_vec())
            })
    })
}

proptest! {
    // Fixed seed: CI runs the same cases every time (docs/testing.md, "Property tests").
    #![proptest_config(ProptestConfig {
        cases: 200,
        rng_seed: proptest::test_runner::RngSeed::Fixed(3614),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]
    #[test]
    fn prop_add_broadcast_matches_naive((sa, sb) in shape_strategy(), seed in any::<u64>(), strided in any::<bool>()) {
        let mut rng = XRng::new(seed);
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let av = rng.vec(na, -10.0, 10.0);
        let bv = rng.vec(nb, -10.0, 10.0);
        let (a, b) = (f64t(&av, &sa), f64t(&bv, &sb));
        let (sta, stb) = (Strided::new(&a), Strided::new(&b));
        let got = if strided {
            run_views("add", &[Some(sta.view()), Some(stb.view())], &[], &SerialPool).unwrap()
        } else {
            run_ok("add", &[&a, &b], &[])
        };
        let (want, shape) = broadcast_ref(&av, &sa, &bv, &sb, |x, y| x + y);
        prop_assert_eq!(&got[0].shape, &shape);
        prop_assert_eq!(vals(&got[0]), want);
        // add_backward reduces exactly like a naive sum
        let g = f64t(&rng.vec(shape.iter().product(), -1.0, 1.0), &shape);
        let grads = run_ok("add_backward", &[&g, &a, &b], &[]);
        for (k, (s, gr)) in [(&sa, &grads[0]), (&sb, &grads[1])].into_iter().enumerate() {
            prop_assert_eq!(&gr.shape, s);
            let mut want = vec![0.0; s.iter().product()];
            let pad = shape.len() - s.len();
            for (flat, gv) in vals(&g).into_iter().enumerate() {
                let idx = unravel(flat, &shape);
                let ti: Vec<usize> = idx[pad..].iter().zip(s.iter()).map(|(&i, &d)| if d == 1 { 0 } else { i }).collect();
                want[ravel(&ti, s)] += gv;
            }
            let got = vals(gr);
            for (x, y) in got.iter().zip(&want) {
                prop_assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "grad {}: {} vs {}", k, x, y);
            }
        }
    }
}

#[test]
fn half_negate_and_relu_on_bits_match_the_f32_path_for_every_bit_pattern() {
    // contiguous f16/bf16 inputs are negated and relu'd on their bits; a strided view goes
    // through f32. Every one of the 65536 patterns (NaNs of both signs, signalling ones, -0,
    // subnormals, infinities) must give the same bits both ways, and the right value.
    use kernel_core::half::{bf16, f16};
    let bits: Vec<u16> = (0..=u16::MAX).collect();
    for dt in [DType::F16, DType::BF16] {
        let t = if dt == DType::F16 {
            OwnedTensor::from_vec(
                bits.iter().map(|&b| f16::from_bits(b)).collect(),
                &[256, 256],
            )
        } else {
            OwnedTensor::from_vec(
                bits.iter().map(|&b| bf16::from_bits(b)).collect(),
                &[256, 256],
            )
        }
        .unwrap();
        let st = Strided::new(&t);
        let x = vals(&t);
        for op in ["negate", "relu"] {
            let got = run_ok(op, &[&t], &[]);
            let via_f32 = run_views(op, &[Some(st.view())], &[], &SerialPool).unwrap();
            assert_bitwise(&got, &via_f32, &format!("{op} {dt}: bits against f32"));
            for (&v, &r) in x.iter().zip(&vals(&got[0])) {
                let want = if op == "negate" {
                    -v
                } else if v < 0.0 {
                    0.0
                } else {
                    v
                };
                assert!(
                    (r == want && r.is_sign_negative() == want.is_sign_negative())
                        || (r.is_nan() && v.is_nan()),
                    "{op} {dt}: {v} gave {r}"
                );
            }
        }
    }
}
