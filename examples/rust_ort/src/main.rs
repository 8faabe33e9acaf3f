//! Runs ONNX models with `ai.polyop` nodes from Rust, the polyop ops registered in-process:
//! `polyop_onnxruntime::register_custom_ops` on the session builder's options (the adapter is a
//! linked crate; no custom-op library path).
//!
//! ```text
//! polyop-rust-ort <libonnxruntime.so> <spec.json>
//! ```
//!
//! `spec.json`: `{"model": path, "runs": [{"x": {"file": path, "shape": [2, 8]}, ...}, ...]}`,
//! every input float32, little-endian, C order. All runs use one session (so a model with
//! dynamic dims serves several shapes). Prints `{"runs": [{"<output>": {"shape": [...],
//! "data": [...]}}]}` (float outputs as f64, int64 outputs as i64).

use anyhow::{anyhow, bail, Context, Result};
use ort::session::Session;
use ort::value::{Tensor, ValueType};
use ort::AsPointer;
use serde_json::{json, Map, Value};

fn read_f32(path: &str, shape: &[usize]) -> Result<Tensor<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    let data: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let n: usize = shape.iter().product();
    if data.len() != n || bytes.len() != 4 * n {
        bail!("{path}: {} bytes for shape {shape:?}", bytes.len());
    }
    Ok(Tensor::from_array((shape.to_vec(), data))?)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, dylib, spec] = &args[..] else {
        bail!("usage: polyop-rust-ort <libonnxruntime.so> <spec.json>");
    };
    let spec: Value = serde_json::from_slice(&std::fs::read(spec)?)?;
    let env = ort::init_from(dylib)
        .map_err(|e| anyhow!("loading ONNX Runtime from {dylib}: {e}"))?
        .with_name("polyop-rust-ort")
        .build()
        .map_err(|e| anyhow!("{e}"))?;

    // The `OrtApiBase` of the onnxruntime ort loaded: ort does not expose it, and opening the
    // same (already loaded) file returns the same library, so its `OrtGetApiBase` is that one.
    // SAFETY: the file is onnxruntime, already loaded by ort (no new initialisers run); the
    // handle stays open for the life of the process (ort keeps the library loaded anyway).
    let lib: &'static libloading::Library =
        Box::leak(Box::new(unsafe { libloading::Library::new(dylib) }?));
    // SAFETY: `OrtGetApiBase`'s signature from onnxruntime_c_api.h.
    let get_base: libloading::Symbol<unsafe extern "C" fn() -> *const ort::sys::OrtApiBase> =
        unsafe { lib.get(b"OrtGetApiBase") }?;
    // SAFETY: a C function without arguments returning a pointer to static data.
    let api_base = unsafe { get_base() };

    let mut builder = Session::builder(&env).map_err(|e| anyhow!("{e}"))?;
    // SAFETY: `ptr_mut` is the live `OrtSessionOptions` of this builder and `api_base` the
    // `OrtApiBase` of the runtime that made it: what `RegisterCustomOps` would receive.
    let status = unsafe {
        polyop_onnxruntime::register_custom_ops(
            polyop_kernels::registry(),
            builder.ptr_mut(),
            api_base,
        )
    };
    // SAFETY: a status from that runtime (null or owned by us); this takes and releases it.
    unsafe { ort::Error::result_from_status(ort::sys::OrtStatusPtr(status)) }
        .map_err(|e| anyhow!("registering the polyop ops: {e}"))?;

    let model = spec["model"].as_str().context("spec: model")?;
    let mut session = builder
        .commit_from_file(model)
        .map_err(|e| anyhow!("{model}: {e}"))?;
    let outputs: Vec<(String, ValueType)> = session
        .outputs()
        .iter()
        .map(|o| (o.name().to_string(), o.dtype().clone()))
        .collect();

    let mut runs = Vec::new();
    for run in spec["runs"].as_array().context("spec: runs")? {
        let mut inputs = Vec::new();
        for (name, t) in run.as_object().context("spec: a run is an object")? {
            let shape: Vec<usize> = serde_json::from_value(t["shape"].clone())?;
            let file = t["file"].as_str().context("spec: file")?;
            inputs.push((name.clone(), read_f32(file, &shape)?));
        }
        let result = session.run(inputs)?;
        let mut out = Map::new();
        for (name, ty) in &outputs {
            let v = &result[name.as_str()];
            let (shape, data): (Vec<i64>, Value) = match ty.tensor_type() {
                Some(ort::value::TensorElementType::Int64) => {
                    let (s, d) = v.try_extract_tensor::<i64>()?;
                    (s.to_vec(), json!(d))
                }
                _ => {
                    let (s, d) = v.try_extract_tensor::<f32>()?;
                    (
                        s.to_vec(),
                        json!(d.iter().map(|&x| x as f64).collect::<Vec<_>>()),
                    )
                }
            };
            out.insert(name.clone(), json!({"shape": shape, "data": data}));
        }
        runs.push(Value::Object(out));
    }
    println!("{}", json!({ "runs": runs }));
    Ok(())
}
