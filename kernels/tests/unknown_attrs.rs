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

#[test]
fn a_dim_set_by_a_list_attribute_is_not_taken_for_static() {
    // pad(x, pads): the last dim grows by the sum of the list. Probing only the default
    // ([0, 0]) would call it static, and TF would then trust a wrong shape.
    use kernel_core::{Dim, InferCtx, OpDef, Result, ShapeOut};
    fn infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
        let extra: i64 = ctx.attrs.int_list("pads")?.iter().sum();
        let mut d = ctx.dims(0).unwrap().to_vec();
        let last = d.len() - 1;
        d[last] = d[last].add(&Dim::Known(extra.max(0) as usize))?;
        Ok(vec![Some(d)])
    }
    let op = OpDef::builder("pad(Tensor x, int[] pads=[0, 0]) -> Tensor")
        .dtypes(DType::FLOAT)
        .infer(infer)
        .cpu(|_| Ok(()))
        .build()
        .unwrap();
    let out = op
        .infer_unknown_attrs(&[spec(&[Some(4), Some(8)])])
        .unwrap();
    assert_eq!(out[0].shape, Some(vec![Dim::Known(4), Dim::Unknown]));
}
