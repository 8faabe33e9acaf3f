//! `OpDef::infer_unknown_attrs` (TF's shape functions): dims no attribute value can change stay
//! known, the others become unknown; inputs invalid whatever the attributes are errors.

use kernel_core::{DType, Dim, TensorSpec};

fn spec(dims: &[Option<usize>]) -> Option<TensorSpec> {
    Some(TensorSpec::with_dims(DType::F32, dims.to_vec()))
}

#[test]
fn attribute_dependent_dims_become_unknown() {
    let reg = polyop_kernels::registry();
    // topk: `k` and `axis` unknown, so every output dim may change...
    let out = reg
        .lookup("topk")
        .unwrap()
        .infer_unknown_attrs(&[spec(&[Some(4), Some(8)])])
        .unwrap();
    assert_eq!(out[0].shape.as_ref().map(Vec::len), Some(2));
    assert_eq!(out[1].dtype, DType::I64);
    // ...while softmax keeps the input's shape whatever its axis.
    let out = reg
        .lookup("softmax")
        .unwrap()
        .infer_unknown_attrs(&[spec(&[Some(4), None])])
        .unwrap();
    assert_eq!(
        out[0].shape,
        Some(vec![Some(4), None].into_iter().map(Dim::from).collect())
    );
    // negate has no attributes: exact.
    let out = reg
        .lookup("negate")
        .unwrap()
        .infer_unknown_attrs(&[spec(&[Some(3)])])
        .unwrap();
    assert_eq!(out[0], TensorSpec::new(DType::F32, &[3]));
}

#[test]
fn inputs_invalid_for_every_attribute_are_errors() {
    let reg = polyop_kernels::registry();
    let add = reg.lookup("add").unwrap();
    let e = add
        .infer_unknown_attrs(&[spec(&[Some(3)]), spec(&[Some(4)])])
        .unwrap_err();
    assert!(e.to_string().starts_with("polyop.add: "), "{e}");
    let e = add
        .infer_unknown_attrs(&[spec(&[Some(3)]), Some(TensorSpec::new(DType::I64, &[3]))])
        .unwrap_err();
    assert!(e.to_string().contains("dtype mismatch"), "{e}");
}
