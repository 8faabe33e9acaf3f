//! The adapter from Rust: the `ort` crate (feature `load-dynamic`, so nothing is downloaded or
//! linked) loads the onnxruntime shared library named by `ORT_DYLIB_PATH` (default: the one in
//! the repository's Python venv, onnxruntime 1.31.1), registers `libpolyop_onnxruntime.so`
//! with `SessionBuilder::with_operator_library` and runs the `ai.polyop` models committed in
//! `tests/models/` (regenerate with `tests/make_models.py`).

use anyhow::{anyhow, Context, Result};
use ort::session::Session;
use ort::value::Tensor;
use std::path::PathBuf;
use std::sync::OnceLock;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// onnxruntime's shared library: `$ORT_DYLIB_PATH`, else the repository venv's wheel.
fn ort_dylib() -> PathBuf {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return PathBuf::from(p);
    }
    manifest_dir()
        .join("../../.venv/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1")
}

/// The adapter library cargo built for this test run: `target/<profile>/deps/` (where
/// `cargo test` leaves the crate's cdylib, next to the test executable).
fn adapter_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .expect("target/<profile>/deps/<test>")
        .join("libpolyop_onnxruntime.so")
}

fn env() -> &'static ort::environment::Environment {
    static ENV: OnceLock<ort::environment::Environment> = OnceLock::new();
    ENV.get_or_init(|| {
        let dylib = ort_dylib();
        assert!(
            dylib.is_file(),
            "onnxruntime shared library not found at {} — set ORT_DYLIB_PATH (ci/setup.sh \
             installs the onnxruntime wheel into .venv)",
            dylib.display()
        );
        ort::init_from(&dylib)
            .expect("load onnxruntime dynamically")
            .with_name("polyop-test")
            .build()
            .expect("onnxruntime environment")
    })
}

fn session(model: &str, threads: usize) -> Result<Session> {
    let lib = adapter_lib();
    anyhow::ensure!(lib.is_file(), "adapter library missing: {}", lib.display());
    let bytes = std::fs::read(manifest_dir().join("tests/models").join(model))?;
    Session::builder(env())
        .map_err(|e| anyhow!("{e}"))?
        .with_intra_threads(threads)
        .map_err(|e| anyhow!("{e}"))?
        .with_operator_library(&lib)
        .map_err(|e| anyhow!("{e}"))?
        .commit_from_memory(&bytes)
        .map_err(|e| anyhow!("{e}"))
        .context(model.to_string())
}

#[test]
fn topk_issue_check() -> Result<()> {
    let mut s = session("topk.onnx", 1)?;
    let x = Tensor::from_array(([1usize, 4], vec![1f32, 3., 3., 2.]))?;
    let out = s.run(ort::inputs!["x" => x])?;
    let (vshape, values) = out["values"].try_extract_tensor::<f32>()?;
    let (ishape, indices) = out["indices"].try_extract_tensor::<i64>()?;
    assert_eq!(&vshape[..], &[1, 2]);
    assert_eq!(&ishape[..], &[1, 2]);
    assert_eq!(values, &[3.0, 3.0]);
    assert_eq!(indices, &[1, 2]);
    Ok(())
}

#[test]
fn builtin_relu_into_rms_norm_without_weight() -> Result<()> {
    let x: Vec<f64> = vec![1.0, -2.0, 3.0, 4.0, 0.5, 0.25, -1.0, 2.0];
    for threads in [1, 2] {
        let mut s = session("relu_rms_norm.onnx", threads)?;
        let out = s.run(ort::inputs!["x" => Tensor::from_array(([2usize, 4], x.clone()))?])?;
        let (shape, y) = out["y"].try_extract_tensor::<f64>()?;
        assert_eq!(&shape[..], &[2, 4]);
        // Independent reference: relu, then x / sqrt(mean(x^2) + eps) per row.
        for row in 0..2 {
            let r: Vec<f64> = x[row * 4..row * 4 + 4].iter().map(|v| v.max(0.0)).collect();
            let ms = r.iter().map(|v| v * v).sum::<f64>() / 4.0;
            for j in 0..4 {
                let want = r[j] / (ms + 1e-6).sqrt();
                let got = y[row * 4 + j];
                assert!(
                    (got - want).abs() <= 1e-12 * want.abs().max(1.0),
                    "{got} vs {want}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn bad_broadcast_is_an_error_and_the_session_keeps_working() -> Result<()> {
    let mut s = session("add_dynamic.onnx", 1)?;
    let err = s
        .run(ort::inputs![
            "x" => Tensor::from_array(([2usize], vec![1f32, 2.]))?,
            "y" => Tensor::from_array(([3usize], vec![1f32, 2., 3.]))?,
        ])
        .err()
        .ok_or_else(|| anyhow!("a bad broadcast must fail"))?;
    let msg = err.to_string();
    assert!(msg.contains("polyop.add"), "{msg}");
    assert!(msg.contains("cannot be broadcast"), "{msg}");
    // Same session, good inputs.
    let out = s.run(ort::inputs![
        "x" => Tensor::from_array(([2usize], vec![1f32, 2.]))?,
        "y" => Tensor::from_array(([2usize], vec![10f32, 20.]))?,
    ])?;
    let (_, z) = out["z"].try_extract_tensor::<f32>()?;
    assert_eq!(z, &[11.0, 22.0]);
    Ok(())
}
