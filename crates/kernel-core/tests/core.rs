//! kernel-core behaviour: views, broadcasting, strided iteration, partitioning, the op
//! lifecycle (validation, inference, allocation, panics) with small ops defined here.

use kernel_core::*;
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn contiguous_strides_and_numel() {
    assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
    assert_eq!(contiguous_strides(&[]), Vec::<isize>::new());
    assert_eq!(numel(&[]), 1);
    assert_eq!(numel(&[3, 0, 2]), 0);
    assert!(tensor::is_contiguous(&[2, 3], &[3, 1]));
    assert!(!tensor::is_contiguous(&[2, 3], &[1, 2]));
    assert!(
        tensor::is_contiguous(&[1, 3], &[99, 1]),
        "size-1 dims may carry any stride"
    );
    assert!(
        tensor::is_contiguous(&[0, 3], &[7, 5]),
        "empty tensors are contiguous"
    );
}

#[test]
fn checked_numel_and_byte_size_refuse_overflow() {
    use kernel_core::tensor::{checked_byte_size, checked_numel, MAX_TENSOR_BYTES};
    assert_eq!(checked_numel(&[]), Some(1));
    assert_eq!(checked_numel(&[3, 4]), Some(12));
    assert_eq!(checked_numel(&[1 << 62, 1 << 62]), None);
    // a zero dim makes any shape empty, however large the others
    assert_eq!(checked_numel(&[1 << 62, 0, 1 << 62]), Some(0));
    assert_eq!(checked_byte_size(&[3, 4], 4).unwrap(), (12, 48));
    assert_eq!(checked_byte_size(&[usize::MAX, 0], 8).unwrap(), (0, 0));
    // the largest element count whose bytes still fit, and one more element
    let n = MAX_TENSOR_BYTES / 8;
    assert_eq!(checked_byte_size(&[n], 8).unwrap(), (n, n * 8));
    let e = checked_byte_size(&[n + 1], 8).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.message
            .contains(&format!("{} elements of 8 bytes", n + 1)),
        "{e}"
    );
    let e = checked_byte_size(&[1 << 62, 1 << 62], 4).unwrap_err();
    assert!(e.message.contains("element count overflows"), "{e}");
    // bytes overflow usize although the element count does not: 2^62 * 4 = 2^64
    let e = checked_byte_size(&[1 << 62], 4).unwrap_err();
    assert!(e.message.contains("too large"), "{e}");
}

#[test]
fn normalize_axis_accepts_python_style_and_rejects_out_of_range() {
    assert_eq!(normalize_axis(-1, 3).unwrap(), 2);
    assert_eq!(normalize_axis(0, 3).unwrap(), 0);
    assert_eq!(normalize_axis(-3, 3).unwrap(), 0);
    assert_eq!(normalize_axis(0, 0).unwrap(), 0);
    assert_eq!(normalize_axis(-1, 0).unwrap(), 0);
    let e = normalize_axis(3, 3).unwrap_err();
    assert!(
        e.message
            .contains("axis 3 is out of range for a tensor of rank 3"),
        "{e}"
    );
    assert!(normalize_axis(-4, 3).is_err());
}

#[test]
fn broadcasting_follows_numpy() {
    assert_eq!(
        broadcast_shapes(&[2, 1, 4], &[3, 1]).unwrap(),
        vec![2, 3, 4]
    );
    assert_eq!(broadcast_shapes(&[], &[5]).unwrap(), vec![5]);
    assert_eq!(broadcast_shapes(&[0, 1], &[1, 3]).unwrap(), vec![0, 3]);
    let e = broadcast_shapes(&[2, 3], &[4]).unwrap_err();
    assert!(e.message.contains("cannot be broadcast"), "{e}");
    assert_eq!(
        broadcast_strides(&[3, 1], &[1, 1], &[2, 3, 4]),
        vec![0, 1, 0]
    );
}

#[test]
fn strided_views_read_like_their_contiguous_copy() {
    // A 3x4 row-major buffer read transposed (4x3).
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    // SAFETY: the 4x3 view with strides [1, 4] reaches offsets i + 4j <= 3 + 8 = 11, all
    // inside the 12 f32s of `data`, which outlives `t` and is never written.
    let t = unsafe {
        TensorRef::from_raw(
            DType::F32,
            vec![4, 3],
            vec![1, 4],
            data.as_ptr() as *const u8,
        )
    };
    assert!(!t.is_contiguous());
    assert!(t.as_slice::<f32>().unwrap().is_none());
    let c = t.contiguous::<f32>().unwrap();
    let expect: Vec<f32> = (0..4)
        .flat_map(|j| (0..3).map(move |i| (i * 4 + j) as f32))
        .collect();
    assert_eq!(&*c, &expect[..]);
    assert_eq!(t.get::<f32>(&[1, 2]).unwrap(), 9.0);
    assert!(t.get::<f32>(&[4, 0]).is_err());
    assert!(
        t.contiguous::<f64>().is_err(),
        "dtype mismatch is an error, not a reinterpretation"
    );
    // Negative strides: a reversed view.
    // SAFETY: `add(11)` is the last element of `data`; stride -1 over 12 elements reaches
    // offsets 0 down to -11, i.e. data[11] .. data[0], valid and never written while `r` lives.
    let r = unsafe {
        TensorRef::from_raw(
            DType::F32,
            vec![12],
            vec![-1],
            data.as_ptr().add(11) as *const u8,
        )
    };
    let c = r.contiguous::<f32>().unwrap();
    assert_eq!(c.first(), Some(&11.0));
    assert_eq!(c.last(), Some(&0.0));
}

#[test]
fn for_each_row_covers_rank0_and_empty() {
    let mut seen = vec![];
    for_each_row(&[], &[], |b, n, s| seen.push((b, n, s)));
    assert_eq!(seen, vec![(0, 1, 1)]);
    seen.clear();
    for_each_row(&[2, 0], &[0, 1], |b, n, s| seen.push((b, n, s)));
    assert!(seen.is_empty());
}

proptest! {
    #[test]
    fn for_each_row_visits_every_offset_in_row_major_order(shape in prop::collection::vec(1usize..4, 0..5)) {
        let strides = contiguous_strides(&shape);
        let mut offsets = vec![];
        for_each_row(&shape, &strides, |b, n, s| offsets.extend((0..n as isize).map(|i| b + i * s)));
        let expect: Vec<isize> = (0..numel(&shape) as isize).collect();
        prop_assert_eq!(offsets, expect);
    }

    #[test]
    fn partition_is_fixed_and_complete(n in 0usize..100_000, grain in 1usize..5000) {
        let (count, size) = parallel::chunks(n, grain);
        prop_assert!(count <= parallel::MAX_CHUNKS);
        if n > 0 {
            prop_assert!(size >= grain && (count - 1) * size < n && count * size >= n);
        }
        let covered = AtomicUsize::new(0);
        parallel_for(&RayonPool, n, grain, |r| { covered.fetch_add(r.len(), Ordering::Relaxed); });
        prop_assert_eq!(covered.load(Ordering::Relaxed), n);
    }
}

#[test]
fn panic_slot_reraises_the_first_task_panic() {
    let slot = PanicSlot::new();
    slot.catch(|| {});
    slot.catch(|| panic!("first"));
    slot.catch(|| panic!("second"));
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| slot.resume())).unwrap_err();
    assert_eq!(err.downcast_ref::<&str>(), Some(&"first"));
}

// --- the op lifecycle, with ops defined here ---

fn twice_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![ctx.input(0).shape.clone()])
}
fn twice_cpu(ctx: &mut KernelCtx) -> Result<()> {
    let x = ctx.input(0).contiguous::<f32>()?.into_owned();
    if ctx.attrs.bool("explode")? {
        panic!("boom");
    }
    for (o, v) in ctx.outputs[0].as_mut_slice::<f32>()?.iter_mut().zip(x) {
        *o = 2.0 * v;
    }
    Ok(())
}
fn positives_infer(_ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![Some(vec![None].into_iter().map(Dim::from).collect())])
}
fn positives_cpu(ctx: &mut KernelCtx) -> Result<()> {
    let x = ctx.input(0).contiguous::<i64>()?.into_owned();
    let kept: Vec<i64> = x.into_iter().filter(|&v| v > 0).collect();
    let mut out = ctx.alloc_output(0, &[kept.len()])?;
    out.as_mut_slice::<i64>()?.copy_from_slice(&kept);
    Ok(())
}

fn test_registry() -> Registry {
    let mut r = Registry::new();
    r.register(
        OpDef::builder("twice(Tensor x, bool explode=False) -> Tensor")
            .dtypes(&[DType::F32])
            .infer(twice_infer)
            .cpu(twice_cpu)
            .build()
            .unwrap(),
    )
    .unwrap();
    r.register(
        OpDef::builder("positives(Tensor x) -> Tensor")
            .dtypes(&[DType::I64, DType::I32])
            .fixed("out", DType::I64)
            .infer(positives_infer)
            .cpu(positives_cpu)
            .data_dependent_shape()
            .build()
            .unwrap(),
    )
    .unwrap();
    r
}

#[test]
fn run_op_validates_infers_allocates_and_computes() {
    let reg = test_registry();
    let op = reg.lookup("twice").unwrap();
    assert_eq!(op.camel_name, "Twice");
    let data = [1.0f32, -2.0, 3.5];
    let x = TensorRef::from_slice(&data, &[3]).unwrap();
    let attrs = op.bind_attrs([]).unwrap();
    let out = exec::run_op(op, &[Some(x)], &attrs, default_pool()).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0, -4.0, 7.0]);
}

#[test]
fn dtype_and_arity_errors_name_the_op() {
    let reg = test_registry();
    let op = reg.lookup("twice").unwrap();
    let attrs = op.bind_attrs([]).unwrap();
    let ints = [1i64, 2];
    let x = TensorRef::from_slice(&ints, &[2]).unwrap();
    let e = exec::run_op(op, &[Some(x)], &attrs, default_pool()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.to_string()
            .starts_with("polyop.twice: unsupported dtype int64"),
        "{e}"
    );
    let e = exec::run_op(op, &[], &attrs, default_pool()).unwrap_err();
    assert!(
        e.to_string()
            .contains("expected 1 tensor input(s) (x), got 0"),
        "{e}"
    );
    let e = op
        .bind_attrs([("explode", AttrValue::Str("yes".into()))])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("polyop.twice: attribute `explode` must be bool"),
        "{e}"
    );
}

#[test]
fn panics_become_internal_errors_and_the_next_call_works() {
    let reg = test_registry();
    let op = reg.lookup("twice").unwrap();
    let data = [1.0f32];
    let boom = op.bind_attrs([("explode", AttrValue::Bool(true))]).unwrap();
    let x = TensorRef::from_slice(&data, &[1]).unwrap();
    let e = exec::run_op(op, &[Some(x.clone())], &boom, default_pool()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Internal);
    assert!(
        e.to_string().contains("panic caught") && e.to_string().contains("boom"),
        "{e}"
    );
    let ok = op.bind_attrs([]).unwrap();
    let out = exec::run_op(op, &[Some(x)], &ok, default_pool()).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0]);
}

#[test]
fn data_dependent_ops_allocate_through_the_context() {
    let reg = test_registry();
    let op = reg.lookup("positives").unwrap();
    let data = [3i32, -1, 0, 7];
    let x = TensorRef::from_slice(&data, &[4]).unwrap();
    let specs = op
        .infer_concrete(&[Some(x.clone())], &Attrs::default())
        .unwrap();
    assert_eq!(specs[0], TensorSpec::with_dims(DType::I64, vec![None]));
    // i32 input but the output is fixed int64; the kernel reads i64 only, so expect an error
    // from the dtype check in the view rather than a reinterpretation.
    let e = exec::run_op(op, &[Some(x)], &Attrs::default(), default_pool()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Internal);
    let data = [3i64, -1, 0, 7];
    let x = TensorRef::from_slice(&data, &[4]).unwrap();
    let out = exec::run_op(op, &[Some(x)], &Attrs::default(), default_pool()).unwrap();
    assert_eq!(out[0].shape, vec![2]);
    assert_eq!(out[0].to_vec::<i64>().unwrap(), vec![3, 7]);
}

#[test]
fn registry_rejects_duplicates_and_dangling_backwards() {
    let mut reg = test_registry();
    let dup = OpDef::builder("twice(Tensor x) -> Tensor")
        .infer(twice_infer)
        .cpu(twice_cpu)
        .build()
        .unwrap();
    assert!(reg
        .register(dup)
        .unwrap_err()
        .to_string()
        .contains("already registered"));
    let bad = OpDef::builder("thrice(Tensor x) -> Tensor")
        .infer(twice_infer)
        .cpu(twice_cpu)
        .backward("thrice_backward", &[BwdInput::Grad(0)], &[0])
        .build()
        .unwrap();
    reg.register(bad).unwrap();
    let e = reg.validate().unwrap_err();
    assert!(
        e.to_string().contains("unknown op `thrice_backward`"),
        "{e}"
    );
    assert!(reg
        .lookup("nope")
        .unwrap_err()
        .to_string()
        .contains("known: twice, positives"));
}

#[test]
fn builder_checks_fixed_names_and_type_rules() {
    let e = OpDef::builder("f(Tensor x) -> Tensor")
        .fixed("y", DType::I64)
        .infer(twice_infer)
        .cpu(twice_cpu)
        .build();
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("fixed dtype for unknown tensor `y`"));
    let e = OpDef::builder("f(Tensor x) -> Tensor")
        .fixed("x", DType::I64)
        .infer(twice_infer)
        .cpu(twice_cpu)
        .build();
    assert!(e.unwrap_err().to_string().contains("no input binds T"));
    let op = OpDef::builder("rms_norm_backward(Tensor g, Tensor x) -> (Tensor a, Tensor b)")
        .infer(twice_infer)
        .cpu(twice_cpu)
        .build()
        .unwrap();
    assert_eq!(op.camel_name, "RmsNormBackward");
    assert_eq!(camel_case("relu_"), "Relu_");
}

#[test]
fn owned_tensors_are_aligned_for_every_dtype() {
    for d in DType::ALL {
        let t = OwnedTensor::zeros(d, &[3, 5]);
        assert_eq!(t.view().ptr() as usize % 8, 0);
        assert_eq!(t.as_bytes().len(), 15 * d.size());
        assert_eq!(DType::from_name(d.name()), Some(d));
        assert_eq!(DType::from_code(d as u8), Some(d));
    }
}

#[test]
fn errors_name_the_op_in_its_registry_namespace() {
    fn op() -> OpDef {
        OpDef::builder("twice(Tensor x, int axis=-1) -> Tensor")
            .dtypes(&[DType::F32])
            .infer(|ctx| {
                ctx.attrs.int("axis")?;
                Err(Error::invalid("always fails"))
            })
            .cpu(|_| Ok(()))
            .build()
            .unwrap()
    }
    let spec = [Some(TensorSpec::new(DType::F32, &[2]))];
    for (mut reg, want) in [
        (Registry::new(), "polyop.twice: always fails"),
        (Registry::named("my_ops"), "my_ops.twice: always fails"),
    ] {
        reg.register(op()).unwrap();
        let o = reg.lookup("twice").unwrap();
        assert_eq!(o.namespace, reg.namespace());
        let attrs = o.bind_attrs([]).unwrap();
        let e = o.infer(&spec, &attrs).unwrap_err();
        assert_eq!(e.to_string(), want);
        // an attribute binding error and a caught panic name the namespace too
        let bad = o
            .bind_attrs([("axes", AttrValue::Int(0))])
            .unwrap_err()
            .to_string();
        assert!(
            bad.starts_with(&want.replace("always fails", "unknown attribute `axes`")),
            "{bad}"
        );
        let p = catch_panic(o, || -> Result<()> { panic!("boom") })
            .unwrap_err()
            .to_string();
        assert!(
            p.starts_with(&want.replace("always fails", "internal error")),
            "{p}"
        );
    }
}
