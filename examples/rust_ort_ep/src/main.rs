//! Runs a standard ONNX model from Rust with polyop's execution provider: the `ort` crate
//! registers `libpolyop_onnxruntime.so` as a plugin execution-provider library and gives the
//! session the `PolyopExecutionProvider` device; ONNX Runtime's CPU provider runs the rest.
//!
//! ```text
//! polyop-rust-ort-ep <libonnxruntime.so> <libpolyop_onnxruntime.so> <model.onnx> <n> <profile prefix>
//! ```
//!
//! The model has one float32 input of shape `[n]` and one float32 output; the program feeds
//! `0, 1, ..., n-1` scaled by 0.25 and prints the number of the provider's devices, ONNX
//! Runtime's profile file (each node event names the provider that ran it), then the output
//! values, one per line.

use anyhow::{anyhow, bail, Result};
use ort::session::Session;
use ort::value::Tensor;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, dylib, polyop, model, n, profile] = &args[..] else {
        bail!(
            "usage: polyop-rust-ort-ep <libonnxruntime.so> <libpolyop_onnxruntime.so> \
             <model.onnx> <n> <profile prefix>"
        );
    };
    let n: usize = n.parse()?;
    let env = ort::init_from(dylib)
        .map_err(|e| anyhow!("loading ONNX Runtime from {dylib}: {e}"))?
        .with_name("polyop-rust-ort-ep")
        .build()
        .map_err(|e| anyhow!("{e}"))?;
    env.register_ep_library("polyop", polyop)
        .map_err(|e| anyhow!("registering {polyop}: {e}"))?;
    let devices: Vec<_> = env
        .devices()
        .filter(|d| d.ep().is_ok_and(|name| name == "PolyopExecutionProvider"))
        .collect();
    if devices.is_empty() {
        bail!("{polyop} offers no PolyopExecutionProvider device");
    }
    println!("devices: {}", devices.len());
    let mut session = Session::builder(&env)
        .map_err(|e| anyhow!("{e}"))?
        .with_devices(devices, None)
        .map_err(|e| anyhow!("{e}"))?
        .with_profiling(profile)
        .map_err(|e| anyhow!("{e}"))?
        .commit_from_file(model)
        .map_err(|e| anyhow!("{model}: {e}"))?;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let out = session.run(ort::inputs![Tensor::from_array((vec![n], x))?])?;
    let (_, data) = out[0].try_extract_tensor::<f32>()?;
    let values: Vec<f32> = data.to_vec();
    drop(out);
    println!("profile: {}", session.end_profiling()?);
    for v in values {
        println!("{v}");
    }
    Ok(())
}
