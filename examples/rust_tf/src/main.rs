//! Builds TensorFlow graphs with polyop ops from Rust (the `tensorflow` crate), after loading
//! `libpolyop_tensorflow.so` with `tensorflow::Library::load`, and runs them in a `Session`.
//!
//! ```text
//! polyop-rust-tf <libpolyop_tensorflow.so> <spec.json>
//! ```
//!
//! `spec.json`: `{"graphs": [graph, ...]}`, each graph built and run on its own (a new `Graph`
//! and `Session`) in this one process:
//!
//! ```json
//! {"placeholders": {"x": [-1, 8], "w": [8]},          // float32; -1: an unknown dim
//!  "nodes": [{"name": "n", "op": "PolyopRmsNorm",
//!             "inputs": ["x", ["w"]],                   // "op" or "op:i"; a list: a list input
//!             "attrs": {"eps": 1e-5, "N_weight": 1}}], // int, float (has a '.'), bool, string
//!  "fetch": ["n", "t:1"],
//!  "runs": [{"x": {"file": "x.bin", "shape": [4, 8]}, "w": {...}}]}
//! ```
//!
//! Every node gets `T = float`. Inputs are raw little-endian float32 in C order. Prints one
//! JSON line `{"graphs": [...]}`: per graph `{"runs": [{"<fetch>": {"shape": [...], "data":
//! [...]}}, ...]}` (float outputs as f64, int64 as i64), or `{"error": "<TF's message>"}` when
//! building or running it failed; the next graph is still built and run.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use tensorflow::{
    DataType, Graph, Library, Operation, Output, Session, SessionOptions, SessionRunArgs, Shape,
    Tensor,
};

fn read_f32(t: &Value) -> Result<Tensor<f32>> {
    let path = t["file"].as_str().context("spec: file")?;
    let shape: Vec<u64> = serde_json::from_value(t["shape"].clone()).context("spec: shape")?;
    let bytes = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    let n: u64 = shape.iter().product();
    if bytes.len() as u64 != 4 * n {
        bail!("{path}: {} bytes for shape {shape:?}", bytes.len());
    }
    let data: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(Tensor::new(&shape).with_values(&data)?)
}

/// `"op"` or `"op:i"`: output `i` (default 0) of the operation named `op`.
fn output(ops: &HashMap<String, Operation>, name: &str) -> Result<Output> {
    let (op, index) = match name.rsplit_once(':') {
        Some((op, i)) => (
            op,
            i.parse()
                .with_context(|| format!("output index in {name}"))?,
        ),
        None => (name, 0),
    };
    let operation = ops.get(op).with_context(|| format!("no operation {op}"))?;
    Ok(operation.output(index))
}

/// Builds one graph from its spec: float32 placeholders, then the nodes in order.
fn build(spec: &Value) -> Result<(Graph, HashMap<String, Operation>)> {
    let mut graph = Graph::new();
    let mut ops = HashMap::new();
    if let Some(placeholders) = spec["placeholders"].as_object() {
        for (name, dims) in placeholders {
            let dims: Vec<i64> = serde_json::from_value(dims.clone())?;
            let shape = Shape::from(Some(dims.iter().map(|&d| (d >= 0).then_some(d)).collect()));
            let mut p = graph.new_operation("Placeholder", name)?;
            p.set_attr_type("dtype", DataType::Float)?;
            p.set_attr_shape("shape", &shape)?;
            ops.insert(name.clone(), p.finish()?);
        }
    }
    for node in spec["nodes"].as_array().context("spec: nodes")? {
        let name = node["name"].as_str().context("spec: node name")?;
        let op_type = node["op"].as_str().context("spec: node op")?;
        let mut d = graph.new_operation(op_type, name)?;
        for input in node["inputs"].as_array().context("spec: node inputs")? {
            match input {
                Value::String(s) => d.add_input(output(&ops, s)?),
                Value::Array(list) => d.add_input_list(
                    &list
                        .iter()
                        .map(|s| output(&ops, s.as_str().context("spec: list input")?))
                        .collect::<Result<Vec<_>>>()?,
                ),
                _ => bail!("spec: {name}: an input is a name or a list of names"),
            }
        }
        d.set_attr_type("T", DataType::Float)?;
        for (attr, v) in node["attrs"].as_object().into_iter().flatten() {
            match v {
                Value::Bool(b) => d.set_attr_bool(attr, *b)?,
                Value::String(s) => d.set_attr_string(attr, s)?,
                Value::Number(x) => match (x.as_i64(), x.as_f64()) {
                    (Some(i), _) => d.set_attr_int(attr, i)?,
                    (None, Some(f)) => d.set_attr_float(attr, f as f32)?,
                    _ => bail!("spec: {name}.{attr}: {x} is out of range"),
                },
                // int[] attributes are TF list(int)s (a single int is not one)
                Value::Array(items) => {
                    let ints = items
                        .iter()
                        .map(Value::as_i64)
                        .collect::<Option<Vec<i64>>>();
                    let ints =
                        ints.with_context(|| format!("spec: {name}.{attr}: a list of ints"))?;
                    d.set_attr_int_list(attr, &ints)?
                }
                _ => bail!("spec: {name}.{attr}: unsupported attribute value {v}"),
            }
        }
        // TF_FinishOperation runs the op's shape function: polyop's errors surface here.
        ops.insert(name.to_string(), d.finish()?);
    }
    Ok((graph, ops))
}

/// Builds the graph, runs every feed of it in one session, returns the fetched outputs.
fn run_graph(spec: &Value) -> Result<Value> {
    let (graph, ops) = build(spec)?;
    let mut session = Session::new(&SessionOptions::new(), &graph)?;
    let fetch: Vec<&str> = spec["fetch"]
        .as_array()
        .context("spec: fetch")?
        .iter()
        .map(|f| f.as_str().context("spec: fetch is names"))
        .collect::<Result<_>>()?;
    let mut runs = Vec::new();
    for run in spec["runs"].as_array().context("spec: runs")? {
        let feeds: Vec<(Operation, Tensor<f32>)> = run
            .as_object()
            .context("spec: a run is an object")?
            .iter()
            .map(|(name, t)| {
                let op = ops
                    .get(name)
                    .with_context(|| format!("no placeholder {name}"))?;
                Ok((op.clone(), read_f32(t)?))
            })
            .collect::<Result<_>>()?;
        let mut args = SessionRunArgs::new();
        for (op, t) in &feeds {
            args.add_feed(op, 0, t);
        }
        let outputs: Vec<Output> = fetch
            .iter()
            .map(|f| output(&ops, f))
            .collect::<Result<_>>()?;
        let tokens: Vec<_> = outputs
            .iter()
            .map(|o| args.request_fetch(&o.operation, o.index))
            .collect();
        session.run(&mut args)?;
        let mut out = Map::new();
        for ((name, o), token) in fetch.iter().zip(&outputs).zip(tokens) {
            let (shape, data) = match o.operation.output_type(o.index as usize) {
                DataType::Int64 => {
                    let t = args.fetch::<i64>(token)?;
                    (t.dims().to_vec(), json!(&t[..]))
                }
                _ => {
                    let t = args.fetch::<f32>(token)?;
                    let data: Vec<f64> = t.iter().map(|&x| x as f64).collect();
                    (t.dims().to_vec(), json!(data))
                }
            };
            out.insert(name.to_string(), json!({"shape": shape, "data": data}));
        }
        runs.push(Value::Object(out));
    }
    session.close()?;
    Ok(json!({ "runs": runs }))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, library, spec] = &args[..] else {
        bail!("usage: polyop-rust-tf <libpolyop_tensorflow.so> <spec.json>");
    };
    let spec: Value = serde_json::from_slice(&std::fs::read(spec)?)?;
    // Registers the library's ops and kernels with this process's TensorFlow.
    let _lib = Library::load(library).with_context(|| format!("loading {library}"))?;

    let mut graphs = Vec::new();
    for g in spec["graphs"].as_array().context("spec: graphs")? {
        graphs.push(run_graph(g).unwrap_or_else(|e| {
            eprintln!("error: {e:#}");
            json!({ "error": format!("{e:#}") })
        }));
    }
    println!("{}", json!({ "graphs": graphs }));
    Ok(())
}
