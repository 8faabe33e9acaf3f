//! The C exports through `library_exports!` on a registry that is not the stock one.

use kernel_core::{DType, InferCtx, KernelCtx, OpDef, Registry, Result, ShapeOut};
use polyop_export::PolyopTensor;
use serde_json::Value;
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

fn same(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![ctx.input(0).shape.clone()])
}

fn twice(ctx: &mut KernelCtx) -> Result<()> {
    let x = ctx.input(0).contiguous::<f32>()?;
    let out = ctx.outputs[0].as_mut_slice::<f32>()?;
    for (o, v) in out.iter_mut().zip(x.iter()) {
        *o = 2.0 * v;
    }
    Ok(())
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| {
        let mut r = Registry::new();
        r.register(
            OpDef::builder("twice(Tensor x, float unused=0.5) -> Tensor")
                .dtypes(&[DType::F32])
                .infer(same)
                .cpu(twice)
                .build()
                .unwrap(),
        )
        .unwrap();
        r
    })
}

polyop_export::library_exports!(
    framework = "test",
    name_key = "prefix",
    name = "t_",
    registry = registry(),
    exported = vec!["twice"],
);

fn call_infer(req: &str) -> Value {
    let c = CString::new(req).unwrap();
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let p = unsafe { polyop_infer(c.as_ptr()) };
    // SAFETY: `polyop_infer` returns a NUL-terminated string (never null), released below.
    let s = unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string();
    // SAFETY: `p` came from `polyop_infer` and is released once, after its last use above.
    unsafe { polyop_free_string(p) };
    serde_json::from_str(&s).unwrap()
}

#[test]
fn info_describes_the_registry() {
    // SAFETY: `polyop_library_info` returns a NUL-terminated string in a static `OnceLock`,
    // alive for the whole program.
    let s = unsafe { CStr::from_ptr(polyop_library_info()) }
        .to_str()
        .unwrap();
    let v: Value = serde_json::from_str(s).unwrap();
    assert_eq!(v["framework"], "test");
    assert_eq!(v["name_key"], "prefix");
    assert_eq!(v["prefix"], "t_");
    assert_eq!(v["exported"], serde_json::json!(["twice"]));
    let op = &v["ops"][0];
    assert_eq!(op["name"], "twice");
    assert_eq!(op["schema"], "twice(Tensor x, float unused=0.5) -> Tensor");
    assert_eq!(op["dtypes"], serde_json::json!(["float32"]));
    assert_eq!(op["attrs"][0]["default"], 0.5);
    assert_eq!(op["backward"], Value::Null);
}

#[test]
fn infer_with_unknown_dims_and_errors() {
    let v = call_infer(r#"{"op": "twice", "inputs": [[[2, null], "float32"]]}"#);
    assert_eq!(v["outputs"], serde_json::json!([[[2, null], "float32"]]));
    let v = call_infer(r#"{"op": "twice", "inputs": [[null, "float32"]]}"#);
    assert_eq!(v["outputs"], serde_json::json!([[null, "float32"]]));
    let v = call_infer(r#"{"op": "twice", "inputs": [[[2], "float64"]]}"#);
    assert_eq!(v["kind"], "type");
    assert!(v["error"]
        .as_str()
        .unwrap()
        .starts_with("polyop.twice: unsupported dtype float64"));
    let v = call_infer(r#"{"op": "twice", "inputs": [[[2], "float32"]], "attrs": {"nope": 1}}"#);
    assert_eq!(v["kind"], "type");
    let v = call_infer(r#"{"op": "nothing"}"#);
    assert!(v["error"].as_str().unwrap().contains("unknown op"));
    let v = call_infer("not json");
    assert!(v["error"].as_str().unwrap().contains("bad request JSON"));
}

#[test]
fn run_on_raw_buffers() {
    let x = [1.0f32, -2.0, 3.5, 0.0, 5.0, 6.0];
    // a strided view: every other element of x, shape [3]
    let mut out = [0f32; 3];
    let f32n = CString::new("float32").unwrap();
    let shape = [3i64];
    let strides = [2i64];
    let ins = [PolyopTensor {
        dtype: f32n.as_ptr(),
        ndim: 1,
        shape: shape.as_ptr(),
        strides: strides.as_ptr(),
        data: x.as_ptr() as *mut u8,
    }];
    let outs = [PolyopTensor {
        dtype: f32n.as_ptr(),
        ndim: 1,
        shape: shape.as_ptr(),
        strides: std::ptr::null(),
        data: out.as_mut_ptr() as *mut u8,
    }];
    let op = CString::new("twice").unwrap();
    let attrs = CString::new("{}").unwrap();
    // SAFETY: both strings are NUL-terminated; the input reads x[0], x[2], x[4] (shape 3,
    // stride 2, inside the 6 f32s of `x`), the output is the 3 dense f32s of `out`; all of
    // them and the shape/stride arrays outlive the call, and `out` does not alias `x`.
    let e = unsafe {
        polyop_run(
            op.as_ptr(),
            attrs.as_ptr(),
            ins.as_ptr(),
            1,
            outs.as_ptr(),
            1,
        )
    };
    assert!(e.is_null());
    assert_eq!(out, [2.0, 7.0, 10.0]);
    // wrong output shape: refused, nothing written
    let mut small = [9f32; 2];
    let shape2 = [2i64];
    let outs2 = [PolyopTensor {
        shape: shape2.as_ptr(),
        data: small.as_mut_ptr() as *mut u8,
        ..outs[0]
    }];
    // SAFETY: as above, with the output the 2 dense f32s of `small` (its declared shape).
    let e = unsafe {
        polyop_run(
            op.as_ptr(),
            attrs.as_ptr(),
            ins.as_ptr(),
            1,
            outs2.as_ptr(),
            1,
        )
    };
    assert!(!e.is_null());
    // SAFETY: a non-null result is an error JSON string, released below.
    let msg = unsafe { CStr::from_ptr(e) }.to_str().unwrap().to_string();
    // SAFETY: `e` came from `polyop_run` and is released once, after its last use.
    unsafe { polyop_free_string(e) };
    assert!(
        msg.contains("result `out` was declared as float32[2] but the op produces float32[3]"),
        "{msg}"
    );
    assert_eq!(small, [9.0, 9.0]);
}

/// Run `twice` with one input descriptor; the error message, if any.
fn run_with_input(input: PolyopTensor, out: &mut [f32]) -> Option<String> {
    let f32n = CString::new("float32").unwrap();
    let shape = [out.len() as i64];
    let outs = [PolyopTensor {
        dtype: f32n.as_ptr(),
        ndim: 1,
        shape: shape.as_ptr(),
        strides: std::ptr::null(),
        data: out.as_mut_ptr() as *mut u8,
    }];
    let op = CString::new("twice").unwrap();
    // SAFETY: the strings are NUL-terminated, the output is `out` (dense, its declared
    // shape), and the callers pass input descriptors that are valid or that `run_raw` refuses
    // before reading through them (null dtype, negative ndim or dim); all outlive the call.
    let e = unsafe { polyop_run(op.as_ptr(), std::ptr::null(), &input, 1, outs.as_ptr(), 1) };
    if e.is_null() {
        return None;
    }
    // SAFETY: a non-null result is an error JSON string, released below.
    let msg = unsafe { CStr::from_ptr(e) }.to_str().unwrap().to_string();
    // SAFETY: `e` came from `polyop_run` and is released once.
    unsafe { polyop_free_string(e) };
    Some(msg)
}

#[test]
fn malformed_descriptors_are_refused_before_any_read() {
    let x = [1.0f32, 2.0];
    let f32n = CString::new("float32").unwrap();
    let two = [2i64];
    let good = PolyopTensor {
        dtype: f32n.as_ptr(),
        ndim: 1,
        shape: two.as_ptr(),
        strides: std::ptr::null(),
        data: x.as_ptr() as *mut u8,
    };
    let mut out = [0f32; 2];
    assert_eq!(run_with_input(good, &mut out), None);
    assert_eq!(out, [2.0, 4.0]);
    // a negative ndim with data (not the absent-input marker): `shape` is dangling here, and
    // used to be read for `ndim as usize` (huge) entries
    let bad_ndim = PolyopTensor {
        ndim: -3,
        shape: std::ptr::NonNull::<i64>::dangling().as_ptr(),
        ..good
    };
    let msg = run_with_input(bad_ndim, &mut out).expect("refused");
    assert!(msg.contains("bad tensor descriptor"), "{msg}");
    let null_dtype = PolyopTensor {
        dtype: std::ptr::null(),
        ..good
    };
    let msg = run_with_input(null_dtype, &mut out).expect("refused");
    assert!(msg.contains("bad tensor descriptor"), "{msg}");
    let neg = [-2i64];
    let neg_dim = PolyopTensor {
        shape: neg.as_ptr(),
        ..good
    };
    let msg = run_with_input(neg_dim, &mut out).expect("refused");
    assert!(msg.contains("negative dim"), "{msg}");
    assert_eq!(out, [2.0, 4.0], "nothing written by refused calls");
}

#[test]
fn an_export_list_that_disagrees_with_the_registry_is_a_load_error() {
    let errors = |exported: &[&str]| -> Vec<String> {
        let info: Value = serde_json::from_str(&polyop_export::library_info(
            registry(),
            "xla",
            "prefix",
            "t_",
            exported,
        ))
        .unwrap();
        info["load_errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_string())
            .collect()
    };
    assert!(errors(&["twice"]).is_empty());
    let typo = errors(&["twicee"]);
    assert_eq!(typo.len(), 2, "{typo:?}"); // the unknown name, and the op it left out
    assert!(
        typo[0].contains("exports `twicee`, which is not an op")
            && typo[0].contains("its ops: twice"),
        "{typo:?}"
    );
    assert!(
        typo[1].contains("op `twice` is in the registry but this xla library does not export it"),
        "{typo:?}"
    );
}
