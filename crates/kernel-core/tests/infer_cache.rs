//! `OpDef::infer_concrete_cached`: same results and errors as `infer_concrete`, the shape
//! function skipped only for input specs + attributes seen before.

use kernel_core::op::{InferCache, OutSpec, INFER_CACHE_ENTRIES};
use kernel_core::*;
use std::cell::Cell;

thread_local! {
    // Per test thread: the tests run concurrently.
    static CALLS: Cell<usize> = const { Cell::new(0) };
}

/// out = x broadcast against optional y, plus a trailing dim of size `extra`.
fn counting_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    CALLS.with(|c| c.set(c.get() + 1));
    let extra = ctx.attrs.int("extra")?;
    if extra < 0 {
        return Err(Error::invalid("extra must be >= 0"));
    }
    let mut s = ctx.input(0).shape.clone().unwrap();
    if let Some(y) = ctx.input_opt(1) {
        s.extend(y.shape.clone().unwrap());
    }
    s.push(kernel_core::Dim::Known(extra as usize));
    Ok(vec![Some(s)])
}

fn nop(_ctx: &mut KernelCtx) -> Result<()> {
    Ok(())
}

fn op() -> OpDef {
    OpDef::builder("counted(Tensor x, Tensor? y=None, int extra=1) -> Tensor")
        .dtypes(&[DType::F32, DType::F64])
        .infer(counting_infer)
        .cpu(nop)
        .build()
        .unwrap()
}

fn calls() -> usize {
    CALLS.with(Cell::get)
}

#[test]
fn cache_hits_skip_the_shape_function_and_misses_match_infer_concrete() {
    let op = op();
    let cache = InferCache::new();
    let a = [0f32; 6];
    let b = [0f64; 6];
    let x23 = || TensorRef::from_slice(&a, &[2, 3]).unwrap();
    let x32 = || TensorRef::from_slice(&a, &[3, 2]).unwrap();
    let x6 = || TensorRef::from_slice(&a, &[6]).unwrap();
    let d23 = || TensorRef::from_slice(&b, &[2, 3]).unwrap();
    let one = op.bind_attrs([("extra", AttrValue::Int(1))]).unwrap();
    let two = op.bind_attrs([("extra", AttrValue::Int(2))]).unwrap();

    let check = |inputs: &[Option<TensorRef>], attrs: &Attrs, expect_infer: bool| {
        let before = calls();
        let got = op.infer_concrete_cached(&cache, inputs, attrs).unwrap();
        let ran = calls() - before;
        let want: Vec<OutSpec> = op
            .infer_concrete(inputs, attrs)
            .unwrap()
            .into_iter()
            .map(|s| OutSpec {
                dtype: s.dtype,
                shape: s.concrete(),
            })
            .collect();
        assert_eq!(&*got, &want[..]);
        assert_eq!(ran, usize::from(expect_infer), "inputs {inputs:?}");
    };
    check(&[Some(x23()), None], &one, true);
    check(&[Some(x23()), None], &one, false);
    // Any difference in shape, rank, dtype, presence or attributes is a miss.
    check(&[Some(x32()), None], &one, true);
    check(&[Some(x6()), None], &one, true);
    check(&[Some(d23()), None], &one, true);
    check(&[Some(x23()), Some(x6())], &one, true);
    check(&[Some(x23()), Some(x6())], &one, false);
    check(&[Some(x23()), None], &two, true);
    check(&[Some(x23()), None], &one, false);
    // Same elements, rank split differently ([2,3]+[6] vs [2]+[3,6]): still distinct keys.
    let x2 = TensorRef::from_slice(&a[..2], &[2]).unwrap();
    let y36 = TensorRef::from_slice(&a, &[1, 6]).unwrap();
    check(&[Some(x2), Some(y36)], &one, true);
}

#[test]
fn errors_are_not_cached_and_stay_the_same() {
    let op = op();
    let cache = InferCache::new();
    let a = [0f32; 4];
    let i = [0i32; 4];
    let bad_attr = op.bind_attrs([("extra", AttrValue::Int(-1))]).unwrap();
    let x = || TensorRef::from_slice(&a, &[4]).unwrap();
    for _ in 0..2 {
        let before = calls();
        let e = op
            .infer_concrete_cached(&cache, &[Some(x()), None], &bad_attr)
            .unwrap_err();
        assert!(
            e.to_string().contains("polyop.counted: extra must be >= 0"),
            "{e}"
        );
        assert_eq!(calls() - before, 1);
    }
    let ok = op.bind_attrs([]).unwrap();
    let xi = TensorRef::from_slice(&i, &[4]).unwrap();
    let e = op
        .infer_concrete_cached(&cache, &[Some(xi), None], &ok)
        .unwrap_err();
    assert!(e.to_string().contains("unsupported dtype int32"), "{e}");
    let e = op
        .infer_concrete_cached(&cache, &[None, None], &ok)
        .unwrap_err();
    assert!(e.to_string().contains("input `x` is required"), "{e}");
}

#[test]
fn cache_keeps_the_most_recent_entries() {
    let op = op();
    let cache = InferCache::new();
    let a = vec![0f32; 64];
    let attrs = op.bind_attrs([]).unwrap();
    let x = |n: usize| TensorRef::from_slice(&a[..n], &[n]).unwrap();
    for n in 1..=INFER_CACHE_ENTRIES + 1 {
        op.infer_concrete_cached(&cache, &[Some(x(n)), None], &attrs)
            .unwrap();
    }
    let before = calls();
    op.infer_concrete_cached(&cache, &[Some(x(INFER_CACHE_ENTRIES + 1)), None], &attrs)
        .unwrap();
    assert_eq!(calls(), before, "newest entry kept");
    op.infer_concrete_cached(&cache, &[Some(x(1)), None], &attrs)
        .unwrap();
    assert_eq!(calls(), before + 1, "oldest entry evicted");
}
