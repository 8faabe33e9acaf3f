//! Serve an ONNX model with `ai.polyop` nodes from Rust: load ONNX Runtime from
//! `<libonnxruntime>`, register `<libpolyop_onnxruntime>` as the session's operator library,
//! run the model on float32 inputs read from raw files, and write every float32 output.
//!
//! ```text
//! polyop-pipeline-serve <libonnxruntime.so> <libpolyop_onnxruntime.so> <model.onnx> <out_dir>
//!     <name>=<file.f32>:<d0>x<d1>x... [more inputs]
//! ```
//!
//! Inputs and outputs are little-endian float32 without a header; each output is written to
//! `<out_dir>/<output name>.f32` and its shape printed as `<name> <d0>x<d1>...`.

use anyhow::{anyhow, bail, Context, Result};
use ort::session::Session;
use ort::value::Tensor;
use std::path::Path;

fn read_f32(path: &Path) -> Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    if bytes.len() % 4 != 0 {
        bail!(
            "{}: {} bytes is not a whole number of float32s",
            path.display(),
            bytes.len()
        );
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// `name=file:2x3x4` as (name, data, shape).
fn parse_input(arg: &str) -> Result<(String, Vec<f32>, Vec<usize>)> {
    let (name, rest) = arg
        .split_once('=')
        .ok_or_else(|| anyhow!("bad input {arg}"))?;
    let (file, dims) = rest
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("bad input {arg}"))?;
    let shape = dims
        .split('x')
        .map(|d| {
            d.parse::<usize>()
                .with_context(|| format!("bad dim in {arg}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let data = read_f32(Path::new(file))?;
    if data.len() != shape.iter().product::<usize>() {
        bail!("{file}: {} values for shape {shape:?}", data.len());
    }
    Ok((name.to_string(), data, shape))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        bail!("usage: {} <libonnxruntime> <libpolyop_onnxruntime> <model.onnx> <out_dir> <name>=<file>:<dims>...", args[0]);
    }
    let env = ort::init_from(&args[1])
        .map_err(|e| anyhow!("loading ONNX Runtime: {e}"))?
        .with_name("polyop-pipeline")
        .build()
        .map_err(|e| anyhow!("{e}"))?;
    let mut session = Session::builder(&env)
        .map_err(|e| anyhow!("{e}"))?
        .with_operator_library(&args[2])
        .map_err(|e| anyhow!("registering {}: {e}", args[2]))?
        .commit_from_file(&args[3])
        .map_err(|e| anyhow!("loading {}: {e}", args[3]))?;
    let mut inputs = Vec::new();
    for a in &args[5..] {
        let (name, data, shape) = parse_input(a)?;
        inputs.push((name, Tensor::from_array((shape, data))?));
    }
    let outputs = session.run(inputs)?;
    let out_dir = Path::new(&args[4]);
    for (name, value) in outputs.iter() {
        let (shape, data) = value
            .try_extract_tensor::<f32>()
            .map_err(|e| anyhow!("output {name}: {e}"))?;
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(out_dir.join(format!("{name}.f32")), bytes)?;
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        println!("{name} {}", dims.join("x"));
    }
    Ok(())
}
