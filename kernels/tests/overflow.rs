//! Shape inference refuses shapes whose element count or byte size overflows, for every op
//! of the registry (issue 23: `infer("add", [(2**62, 2**62), ...])` used to return a shape).

use kernel_core::{AttrValue, DType, Dim, ErrorKind, TensorSpec, TypeRule};

fn dtype_of(op: &kernel_core::OpDef, rule: &TypeRule) -> DType {
    match rule {
        TypeRule::Fixed(d) => *d,
        TypeRule::T => op.dtypes[0],
    }
}

#[test]
fn every_op_refuses_an_input_whose_size_overflows() {
    let reg = polyop_kernels::registry();
    let mut checked = 0;
    for op in reg.ops() {
        // Every input [2^62, 2^62]: 2^124 elements, far beyond any address space.
        let inputs: Vec<Option<TensorSpec>> = op
            .input_types
            .iter()
            .map(|r| Some(TensorSpec::new(dtype_of(op, r), &[1 << 62, 1 << 62])))
            .collect();
        let given: Vec<(&str, AttrValue)> = op
            .schema
            .attr_args()
            .filter(|a| a.default.is_none())
            .map(|a| (a.name.as_str(), AttrValue::Int(1)))
            .collect();
        let attrs = op.bind_attrs(given).unwrap();
        let e = op.infer(&inputs, &attrs).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{}: {msg}", op.name);
        assert!(
            msg.starts_with(&format!("polyop.{}: input `", op.name)) && msg.contains("too large"),
            "{}: {msg}",
            op.name
        );
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} ops in the registry");
}

#[test]
fn outputs_whose_size_overflows_are_refused() {
    let reg = polyop_kernels::registry();
    let add = reg.lookup("add").unwrap();
    let attrs = add.bind_attrs([]).unwrap();
    let f32s = |s: &[usize]| Some(TensorSpec::new(DType::F32, s));
    // Inputs of 2^33 bytes each are fine; the broadcast output has 2^62 f32 = 2^64 bytes.
    let e = add
        .infer(&[f32s(&[1 << 31, 1]), f32s(&[1, 1 << 31])], &attrs)
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("polyop.add: output `out`: shape [2147483648, 2147483648] is too large"),
        "{msg}"
    );
    // 2^80 elements: the element count itself overflows.
    let e = add
        .infer(&[f32s(&[1 << 40, 1]), f32s(&[1, 1 << 40])], &attrs)
        .unwrap_err();
    assert!(e.to_string().contains("element count overflows"), "{e}");
    // The largest f32 output that fits is accepted, and an unknown dim defers the check.
    let n = (isize::MAX as usize) / 4;
    let ok = add.infer(&[f32s(&[n]), f32s(&[1])], &attrs).unwrap();
    assert_eq!(
        ok[0].shape,
        Some(vec![Some(n)].into_iter().map(Dim::from).collect())
    );
    // (it may be 0 at run time, making the tensor empty).
    let unknown = Some(TensorSpec::with_dims(DType::F32, vec![None, Some(1 << 60)]));
    let ok = add.infer(&[unknown, f32s(&[1 << 60])], &attrs).unwrap();
    assert_eq!(
        ok[0].shape,
        Some(
            vec![None, Some(1 << 60)]
                .into_iter()
                .map(Dim::from)
                .collect()
        )
    );
}

#[test]
fn conv2d_padding_cannot_wrap_a_huge_input_dim() {
    let reg = polyop_kernels::registry();
    let conv = reg.lookup("conv2d").unwrap();
    let attrs = conv.bind_attrs([("padding", AttrValue::Int(2))]).unwrap();
    // unknown batch: the input spec itself is not checked, the shape function must not wrap
    let x = TensorSpec::with_dims(
        DType::F32,
        vec![None, Some(1), Some(usize::MAX - 1), Some(4)],
    );
    let w = TensorSpec::new(DType::F32, &[1, 1, 3, 3]);
    let e = conv.infer(&[Some(x), Some(w), None], &attrs).unwrap_err();
    assert!(
        e.to_string().starts_with("polyop.conv2d: input size")
            && e.to_string().contains("overflows"),
        "{e}"
    );
}
