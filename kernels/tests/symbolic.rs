//! Shape inference with symbolic dims for the stock ops: outputs are expressions over the
//! input symbols (never specialized to constants), requirements between symbols come back as
//! constraints, and known contradictions are still errors.

use kernel_core::{AttrValue, DType, Dim, Inferred, Relation, TensorSpec};

fn s(n: &str) -> Dim {
    Dim::sym(n)
}
fn k(n: usize) -> Dim {
    Dim::Known(n)
}
fn spec(dims: Vec<Dim>) -> Option<TensorSpec> {
    Some(TensorSpec::with_dims(DType::F32, dims))
}
fn infer(op: &str, inputs: &[Option<TensorSpec>], attrs: &[(&str, AttrValue)]) -> Inferred {
    let op = polyop_kernels::registry().lookup(op).unwrap();
    let a = op.bind_attrs(attrs.iter().cloned()).unwrap();
    op.infer_symbolic(inputs, &a).unwrap()
}

#[test]
fn elementwise_and_row_ops_keep_the_input_symbols() {
    let x = spec(vec![s("b"), s("t"), k(64)]);
    for op in ["negate", "relu", "gelu", "softmax"] {
        let r = infer(op, std::slice::from_ref(&x), &[]);
        assert_eq!(
            r.outputs[0].shape,
            Some(vec![s("b"), s("t"), k(64)]),
            "{op}"
        );
        assert!(r.constraints.is_empty(), "{op}: {:?}", r.constraints);
    }
    let r = infer(
        "scale",
        std::slice::from_ref(&x),
        &[("alpha", AttrValue::Float(2.0))],
    );
    assert_eq!(r.outputs[0].shape, Some(vec![s("b"), s("t"), k(64)]));
}

#[test]
fn rms_norm_weight_against_a_symbolic_last_dim_is_a_constraint() {
    // weight [64] against x [b, t, 64]: decided, nothing to check later
    let r = infer(
        "rms_norm",
        &[spec(vec![s("b"), k(64)]), spec(vec![k(64)])],
        &[],
    );
    assert!(r.constraints.is_empty());
    // weight [64] against x [b, d]: d == 64 is required, not assumed
    let r = infer(
        "rms_norm",
        &[spec(vec![s("b"), s("d")]), spec(vec![k(64)])],
        &[],
    );
    assert_eq!(r.outputs[0].shape, Some(vec![s("b"), s("d")]));
    assert_eq!(r.constraints.len(), 1);
    let c = &r.constraints[0];
    assert_eq!(
        (c.relation, &c.lhs, &c.rhs),
        (Relation::Eq, &k(64), &s("d"))
    );
    assert!(
        c.message.contains("weight must have shape [d]"),
        "{}",
        c.message
    );
    // a known contradiction is an error, as before
    let op = polyop_kernels::registry().lookup("rms_norm").unwrap();
    let a = op.bind_attrs([]).unwrap();
    let e = op
        .infer_symbolic(&[spec(vec![s("b"), k(8)]), spec(vec![k(7)])], &a)
        .unwrap_err();
    assert!(e.to_string().contains("weight must have shape [8]"), "{e}");
}

#[test]
fn topk_k_within_a_symbolic_axis_is_a_constraint() {
    let r = infer(
        "topk",
        &[spec(vec![s("b"), s("n")])],
        &[("k", AttrValue::Int(3))],
    );
    assert_eq!(r.outputs[0].shape, Some(vec![s("b"), k(3)]));
    assert_eq!(r.outputs[1].shape, Some(vec![s("b"), k(3)]));
    assert_eq!(r.outputs[1].dtype, DType::I64);
    let c = &r.constraints[0];
    assert_eq!((c.relation, &c.lhs, &c.rhs), (Relation::Le, &k(3), &s("n")));
}

#[test]
fn conv2d_output_sizes_are_expressions_of_the_input_sizes() {
    let x = spec(vec![s("n"), k(3), s("h"), s("w")]);
    let w = spec(vec![k(8), k(3), k(3), k(3)]);
    // padding 1, stride 1: the same size
    let r = infer(
        "conv2d",
        &[x.clone(), w.clone(), None],
        &[("padding", AttrValue::Int(1))],
    );
    assert_eq!(r.outputs[0].shape, Some(vec![s("n"), k(8), s("h"), s("w")]));
    // stride 2, no padding: (h - 3) // 2 + 1, and h + 0 >= 3 required
    let r = infer("conv2d", &[x, w, None], &[("stride", AttrValue::Int(2))]);
    let out = r.outputs[0].shape.clone().unwrap();
    assert_eq!(out[2].to_string(), "(h - 3) // 2 + 1");
    assert_eq!(out[3].to_string(), "(w - 3) // 2 + 1");
    assert_eq!(r.constraints.len(), 2, "{:?}", r.constraints);
    assert!(r.constraints.iter().all(|c| c.relation == Relation::Le));
    // symbolic channels: input channels must equal the weight's
    let r = infer(
        "conv2d",
        &[
            spec(vec![s("n"), s("c"), k(5), k(5)]),
            spec(vec![k(4), k(2), k(1), k(1)]),
            None,
        ],
        &[],
    );
    assert_eq!(r.outputs[0].shape, Some(vec![s("n"), k(4), k(5), k(5)]));
    assert_eq!(
        (&r.constraints[0].lhs, &r.constraints[0].rhs),
        (&s("c"), &k(2))
    );
}

#[test]
fn add_broadcasts_symbols() {
    let r = infer(
        "add",
        &[spec(vec![s("b"), k(1), s("d")]), spec(vec![s("t"), s("d")])],
        &[],
    );
    assert_eq!(r.outputs[0].shape, Some(vec![s("b"), s("t"), s("d")]));
    let r = infer("add", &[spec(vec![s("n")]), spec(vec![s("m")])], &[]);
    assert_eq!(
        r.outputs[0].shape.clone().unwrap()[0].to_string(),
        "broadcast(n, m)"
    );
}

#[test]
fn backward_ops_relate_grad_and_forward_shapes() {
    // softmax_backward(grad, y): grad [b, t] against y [b, s] requires t == s
    let r = infer(
        "softmax_backward",
        &[spec(vec![s("b"), s("t")]), spec(vec![s("b"), s("s")])],
        &[],
    );
    assert_eq!(r.outputs[0].shape, Some(vec![s("b"), s("s")]));
    assert_eq!(r.constraints.len(), 1);
    assert_eq!(r.constraints[0].relation, Relation::Eq);
    // nonzero's count is data-dependent: unknown, for the framework to name
    let r = infer("nonzero", &[spec(vec![s("b"), k(3)])], &[]);
    assert_eq!(r.outputs[0].shape, Some(vec![Dim::Unknown, k(2)]));
}
