//! The adapter from Rust: the `ort` crate (feature `load-dynamic`, so nothing is downloaded or
//! linked) loads the onnxruntime shared library named by `ORT_DYLIB_PATH` (default: the one in
//! the repository's Python venv, onnxruntime 1.31.1), registers `libpolyop_onnxruntime.so`
//! with `SessionBuilder::with_operator_library` and runs the `ai.polyop` models committed in
//! `tests/models/` (regenerate with `tests/make_models.py`).

use anyhow::{anyhow, Context, Result};
use ort::session::Session;
use ort::value::Tensor;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// This crate's directory, read when the test runs (cargo test sets it), not baked in at
/// compile time: CI shares one target directory between checkouts at different paths, and
/// cargo counts a test binary built in another checkout as fresh (it failed pointing into a
/// clone that had been deleted).
fn manifest_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo test"))
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

/// Held while a session is initialised. ONNX Runtime adds a custom op's domain to ONNX's
/// process-wide domain/version map during session initialisation with a check-then-insert that
/// is not atomic: two sessions registering `ai.polyop` at the same instant (cargo runs these
/// tests on parallel threads) can fail with "the domain is already exist". Creating sessions
/// one at a time is the workaround (docs/onnxruntime.md); running them stays concurrent.
fn session_init_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn session(model: &str, threads: usize) -> Result<Session> {
    let lib = adapter_lib();
    anyhow::ensure!(lib.is_file(), "adapter library missing: {}", lib.display());
    let bytes = std::fs::read(manifest_dir().join("tests/models").join(model))?;
    let _init = session_init_lock();
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

// ---- any registry, and panics inside onnxruntime's thread pool -----------------------------

mod custom_registry {
    use super::*;
    use kernel_core::{
        parallel_for, DType, InferCtx, KernelCtx, OpDef, Registry, Result as KResult, ShapeOut,
        SharedMut,
    };
    use ort::AsPointer;

    fn boom_infer(ctx: &InferCtx) -> KResult<Vec<ShapeOut>> {
        Ok(vec![ctx.input(0).shape.clone()])
    }

    /// `2 * x`, element chunks on the host pool; panics (inside a pool task) on a negative.
    fn boom_cpu(ctx: &mut KernelCtx) -> KResult<()> {
        let pool = ctx.pool;
        let x = ctx.inputs[0].as_ref().expect("x").contiguous::<f32>()?;
        let out = ctx.outputs[0].as_mut_slice::<f32>()?;
        let n = out.len();
        let shared = SharedMut::new(out);
        parallel_for(pool, n, 1, |r| {
            for i in r.clone() {
                if x[i] < 0.0 {
                    panic!("negative input at {i}");
                }
            }
            // SAFETY: parallel_for hands out disjoint ranges of 0..n.
            let o = unsafe { shared.slice(r.start, r.len()) };
            for (j, i) in r.enumerate() {
                o[j] = 2.0 * x[i];
            }
        });
        Ok(())
    }

    fn registry() -> &'static Registry {
        static R: OnceLock<Registry> = OnceLock::new();
        R.get_or_init(|| {
            let mut r = Registry::new();
            r.register(
                OpDef::builder("boom(Tensor x) -> Tensor")
                    .dtypes(&[DType::F32])
                    .infer(boom_infer)
                    .cpu(boom_cpu)
                    .build()
                    .expect("valid op"),
            )
            .expect("registered");
            r
        })
    }

    unsafe extern "system" fn get_api(_version: u32) -> *const ort::sys::OrtApi {
        ort::api::ort() as *const ort::sys::OrtApi
    }
    unsafe extern "system" fn version_string() -> *const std::ffi::c_char {
        c"test".as_ptr()
    }
    /// An `OrtApiBase` over the table `ort` loaded (ort does not expose the library's own).
    static API_BASE: ort::sys::OrtApiBase = ort::sys::OrtApiBase {
        GetApi: get_api,
        GetVersionString: version_string,
    };

    #[test]
    fn a_test_registry_registered_directly_and_a_panic_in_a_pool_task() -> Result<()> {
        let _ = env();
        let bytes = std::fs::read(manifest_dir().join("tests/models/boom.onnx"))?;
        let init = session_init_lock();
        let mut builder = Session::builder(env())
            .map_err(|e| anyhow!("{e}"))?
            .with_intra_threads(2)
            .map_err(|e| anyhow!("{e}"))?;
        // The adapter's generic entry point, with a registry that is not the stock one.
        // SAFETY: what `RegisterCustomOps` would get: `builder.ptr_mut()` is the live session
        // options of the onnxruntime `ort` loaded, and `API_BASE` hands out that runtime's own
        // table. `get_api` answers every version with it, as onnxruntime's `GetApi` does for
        // every version up to its own; this needs a runtime of API >= 24 (onnxruntime 1.24;
        // the venv's is 1.31.1), since `init_shape_ref` reads a version-24 entry.
        let st = unsafe {
            polyop_onnxruntime::register_custom_ops(registry(), builder.ptr_mut(), &API_BASE)
        };
        assert!(st.is_null(), "registration failed");
        let mut s = builder
            .commit_from_memory(&bytes)
            .map_err(|e| anyhow!("{e}"))?;
        drop(init);
        let good: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let mut bad = good.clone();
        bad[777] = -1.0;
        let err = s
            .run(ort::inputs!["x" => Tensor::from_array(([1000usize], bad))?])
            .err()
            .ok_or_else(|| anyhow!("a panicking kernel must fail"))?;
        let msg = err.to_string();
        assert!(msg.contains("polyop.boom"), "{msg}");
        assert!(msg.contains("panic caught"), "{msg}");
        assert!(msg.contains("negative input at 777"), "{msg}");
        // The session and the pool keep working.
        let out = s.run(ort::inputs!["x" => Tensor::from_array(([1000usize], good.clone()))?])?;
        let (_, y) = out["y"].try_extract_tensor::<f32>()?;
        assert!(y.iter().zip(&good).all(|(a, b)| *a == 2.0 * b));
        Ok(())
    }
}
