//! Calls polyop ops on `tch::Tensor`s through the torch dispatcher ([`polyop_tch`]) and trains a
//! small model with them.
//!
//! ```text
//! polyop-rust-tch <libpolyop_torch.so> <spec.json>
//! ```
//!
//! `spec.json`:
//! - `"calls"`: `[{"op": name, "inputs": [tensor | null, ...], "attrs": {...},
//!   "grads": [tensor | null, ...]?, "autograd_grads": [tensor | null, ...]?,
//!   "backward_twice": bool?}]`, a tensor being `{"file": path, "shape": [...],
//!   "dtype": "float32" | "float64" | "int32" | "int64", "transpose": [d0, d1]?,
//!   "requires_grad": bool?}` (raw little-endian C-order data; `transpose` makes the input a
//!   strided view). Each call gives `{"outputs": [...]}` (with `grads`,
//!   `{"input_grads": [... | null]}` from [`polyop_tch::Library::backward`]; with
//!   `autograd_grads`, `{"autograd": {"input_grads": [...]}}` from torch's autograd, see
//!   `autograd_grads`) or `{"error": message}`; later calls go on.
//! - `"train"` (optional): `{"x", "t", "w1", "b1", "gamma", "w2": tensor, "lr": float,
//!   "steps": int, "eps": float, "autograd": bool?}`: the model `p = softmax(rms_norm(gelu(x
//!   W1 + b1, "tanh"), gamma, eps) W2)` with loss `sum((p - t)^2) / batch`, trained by plain
//!   gradient descent, gradients by torch's autograd (`autograd`: `loss.backward()`) or by the
//!   chain rule over [`polyop_tch::Library::backward`]. Gives the loss per step, the gradients
//!   at the initial parameters and the final parameters.
//!
//! Prints one JSON line: `{"calls": [...], "train": {...}}`; a tensor is
//! `{"dtype", "shape", "data"}` (floats as f64, ints as i64).

use anyhow::{bail, Context, Result};
use polyop_tch::{Attr, Library};
use serde_json::{json, Map, Value};
use tch::{Kind, Tensor};

fn kind_of(dtype: &str) -> Result<(Kind, usize)> {
    Ok(match dtype {
        "float32" => (Kind::Float, 4),
        "float64" => (Kind::Double, 8),
        "int32" => (Kind::Int, 4),
        "int64" => (Kind::Int64, 8),
        _ => bail!("unsupported dtype {dtype}"),
    })
}

fn read_tensor(v: &Value) -> Result<Tensor> {
    let file = v["file"].as_str().context("tensor: file")?;
    let shape: Vec<i64> = serde_json::from_value(v["shape"].clone()).context("tensor: shape")?;
    let (kind, size) = kind_of(v["dtype"].as_str().unwrap_or("float32"))?;
    let bytes = std::fs::read(file).with_context(|| format!("reading {file}"))?;
    let n: i64 = shape.iter().product();
    if bytes.len() != n as usize * size {
        bail!("{file}: {} bytes for shape {shape:?}", bytes.len());
    }
    let t = Tensor::from_data_size(&bytes, &shape, kind);
    let t = match v.get("transpose") {
        Some(d) => {
            let d: [i64; 2] = serde_json::from_value(d.clone())?;
            // a strided view of the same data: the caller wrote the transposed layout
            t.reshape(transposed(&shape, d)).transpose(d[0], d[1])
        }
        None => t,
    };
    // a leaf that asks for its gradient (`.grad()` after `backward()`)
    Ok(if v["requires_grad"] == true {
        t.set_requires_grad(true)
    } else {
        t
    })
}

/// `shape` with dims d0 and d1 swapped: the layout whose transpose has `shape`.
fn transposed(shape: &[i64], d: [i64; 2]) -> Vec<i64> {
    let mut s = shape.to_vec();
    s.swap(d[0] as usize, d[1] as usize);
    s
}

fn write_tensor(t: &Tensor) -> Result<Value> {
    let shape = t.size();
    let flat = t.detach().contiguous().view([-1]);
    let data = match t.kind() {
        Kind::Int | Kind::Int64 => json!(Vec::<i64>::try_from(&flat.to_kind(Kind::Int64))?),
        _ => json!(Vec::<f64>::try_from(&flat.to_kind(Kind::Double))?),
    };
    let dtype = match t.kind() {
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::Int => "int32",
        Kind::Int64 => "int64",
        k => bail!("unexpected output kind {k:?}"),
    };
    Ok(json!({"dtype": dtype, "shape": shape, "data": data}))
}

fn attr_of(v: &Value) -> Result<Attr> {
    Ok(match v {
        Value::Bool(b) => Attr::Bool(*b),
        Value::String(s) => Attr::Str(s.clone()),
        Value::Number(n) if n.is_i64() => Attr::Int(n.as_i64().unwrap_or_default()),
        Value::Number(n) => Attr::Float(n.as_f64().unwrap_or_default()),
        Value::Array(a) if a.iter().all(Value::is_i64) => {
            Attr::Ints(a.iter().filter_map(Value::as_i64).collect())
        }
        Value::Array(a) => Attr::Floats(a.iter().filter_map(Value::as_f64).collect()),
        _ => bail!("unsupported attribute value {v}"),
    })
}

fn opt_tensors(v: &Value) -> Result<Vec<Option<Tensor>>> {
    v.as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|t| {
            if t.is_null() {
                Ok(None)
            } else {
                read_tensor(t).map(Some)
            }
        })
        .collect()
}

fn one_call(ops: &Library, c: &Value) -> Result<Value> {
    let name = c["op"].as_str().context("call: op")?;
    let inputs = opt_tensors(&c["inputs"])?;
    let mut attrs = Vec::new();
    for (k, v) in c["attrs"].as_object().into_iter().flatten() {
        attrs.push((k.as_str(), attr_of(v)?));
    }
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(Option::as_ref).collect();
    let outputs = match ops.call(name, &refs, &attrs) {
        Ok(o) => o,
        Err(e) => return Ok(json!({"error": e.to_string()})),
    };
    let mut r = Map::new();
    r.insert(
        "outputs".into(),
        Value::Array(outputs.iter().map(write_tensor).collect::<Result<_>>()?),
    );
    if c.get("autograd_grads").is_some() {
        r.insert("autograd".into(), autograd_grads(c, &inputs, &outputs)?);
    }
    if c.get("grads").is_some() {
        let grads = opt_tensors(&c["grads"])?;
        let grefs: Vec<Option<&Tensor>> = grads.iter().map(Option::as_ref).collect();
        match ops.backward(name, &refs, &attrs, &outputs, &grefs) {
            Ok(g) => {
                let g: Vec<Value> = g
                    .iter()
                    .map(|t| t.as_ref().map_or(Ok(Value::Null), write_tensor))
                    .collect::<Result<_>>()?;
                r.insert("input_grads".into(), Value::Array(g));
            }
            Err(e) => {
                r.insert("grad_error".into(), json!(e.to_string()));
            }
        }
    }
    Ok(Value::Object(r))
}

/// torch's autograd through one polyop op: `loss = sum_k sum(outputs[k] * dys[k])` with tch's
/// own `mul`/`sum` (float64), `loss.backward()`, and each input's `.grad()` (null where the
/// input does not require grad). With `"backward_twice"` (`loss = sum_k sum(outputs[k])`), a
/// second `backward()` without retained graph, whose error (raised by polyop's graph node) is
/// returned as `second_error`.
fn autograd_grads(c: &Value, inputs: &[Option<Tensor>], outputs: &[Tensor]) -> Result<Value> {
    let dys = opt_tensors(&c["autograd_grads"])?;
    let twice = c["backward_twice"] == true;
    let terms = outputs.iter().zip(&dys).filter_map(|(o, dy)| match dy {
        // `sum` saves no tensor: the second backward() reaches polyop's node first
        Some(_) if twice => Some(o.sum(Kind::Double)),
        Some(dy) => Some((o * dy).sum(Kind::Double)),
        None => None,
    });
    let loss = terms.fold(
        Tensor::zeros([], (Kind::Double, tch::Device::Cpu)),
        |l, t| l + t,
    );
    if let Err(e) = loss.f_backward() {
        return Ok(json!({"error": e.to_string()}));
    }
    let grads: Vec<Value> = inputs
        .iter()
        .map(|t| match t {
            Some(t) if t.requires_grad() && t.grad().defined() => write_tensor(&t.grad()),
            _ => Ok(Value::Null),
        })
        .collect::<Result<_>>()?;
    let mut r = json!({ "input_grads": grads });
    if twice {
        r["second_error"] = match loss.f_backward() {
            Ok(()) => Value::Null,
            Err(e) => json!(e.to_string()),
        };
    }
    Ok(r)
}

/// The model's parameters.
struct Params {
    w1: Tensor,
    b1: Tensor,
    gamma: Tensor,
    w2: Tensor,
}

/// Loss and gradients (dW1, db1, dgamma, dW2) of the model at `p`: polyop ops forward, their
/// backward ops (through `Library::backward`) and torch's matmul (whose gradient is written
/// here) for the chain rule.
fn loss_and_grads(
    ops: &Library,
    x: &Tensor,
    t: &Tensor,
    p: &Params,
    eps: f64,
) -> Result<(f64, [Tensor; 4])> {
    let batch = x.size()[0] as f64;
    let tanh = || ("approximate", Attr::from("tanh"));
    let h = x.matmul(&p.w1);
    let a = ops.call("add", &[Some(&h), Some(&p.b1)], &[])?;
    let g = ops.call("gelu", &[Some(&a[0])], &[tanh()])?;
    let n = ops.call(
        "rms_norm",
        &[Some(&g[0]), Some(&p.gamma)],
        &[("eps", Attr::Float(eps))],
    )?;
    let z = n[0].matmul(&p.w2);
    let y = ops.call("softmax", &[Some(&z)], &[("axis", Attr::Int(-1))])?;
    let diff = &y[0] - t;
    let loss = f64::try_from((&diff * &diff).sum(Kind::Double))? / batch;

    let dy = &diff * (2.0 / batch);
    let dz = ops.backward(
        "softmax",
        &[Some(&z)],
        &[("axis", Attr::Int(-1))],
        &y,
        &[Some(&dy)],
    )?;
    let dz = dz[0].as_ref().context("softmax: no gradient")?;
    let dw2 = n[0].tr().matmul(dz);
    let dn = dz.matmul(&p.w2.tr());
    let dgn = ops.backward(
        "rms_norm",
        &[Some(&g[0]), Some(&p.gamma)],
        &[("eps", Attr::Float(eps))],
        &n,
        &[Some(&dn)],
    )?;
    let [Some(dg), Some(dgamma)] = &dgn[..] else {
        bail!("rms_norm: missing gradients");
    };
    let da = ops.backward("gelu", &[Some(&a[0])], &[tanh()], &g, &[Some(dg)])?;
    let da = da[0].as_ref().context("gelu: no gradient")?;
    let dhb = ops.backward("add", &[Some(&h), Some(&p.b1)], &[], &a, &[Some(da)])?;
    let [Some(dh), Some(db1)] = &dhb[..] else {
        bail!("add: missing gradients");
    };
    let dw1 = x.tr().matmul(dh);
    Ok((
        loss,
        [dw1, db1.shallow_clone(), dgamma.shallow_clone(), dw2],
    ))
}

/// Loss and gradients as [`loss_and_grads`], by torch's autograd: the same forward on
/// parameters that require grad, `loss.backward()` through tch's ops and polyop's, and the
/// parameters' `.grad()`.
fn loss_and_grads_autograd(
    ops: &Library,
    x: &Tensor,
    t: &Tensor,
    p: &Params,
    eps: f64,
) -> Result<(f64, [Tensor; 4])> {
    let batch = x.size()[0] as f64;
    let leaf = |t: &Tensor| t.detach().set_requires_grad(true);
    let (w1, b1, gamma, w2) = (leaf(&p.w1), leaf(&p.b1), leaf(&p.gamma), leaf(&p.w2));
    let tanh = || ("approximate", Attr::from("tanh"));
    let a = ops.call1("add", &[Some(&x.matmul(&w1)), Some(&b1)], &[])?;
    let g = ops.call1("gelu", &[Some(&a)], &[tanh()])?;
    let n = ops.call1(
        "rms_norm",
        &[Some(&g), Some(&gamma)],
        &[("eps", Attr::Float(eps))],
    )?;
    let y = ops.call1(
        "softmax",
        &[Some(&n.matmul(&w2))],
        &[("axis", Attr::Int(-1))],
    )?;
    let diff = &y - t;
    let loss = (&diff * &diff).sum(Kind::Float) / batch;
    loss.f_backward()?;
    let value = f64::try_from((&diff * &diff).detach().sum(Kind::Double))? / batch;
    Ok((value, [w1.grad(), b1.grad(), gamma.grad(), w2.grad()]))
}

fn train(ops: &Library, s: &Value) -> Result<Value> {
    let step = if s["autograd"] == true {
        loss_and_grads_autograd
    } else {
        loss_and_grads
    };
    let x = read_tensor(&s["x"])?;
    let t = read_tensor(&s["t"])?;
    let mut p = Params {
        w1: read_tensor(&s["w1"])?,
        b1: read_tensor(&s["b1"])?,
        gamma: read_tensor(&s["gamma"])?,
        w2: read_tensor(&s["w2"])?,
    };
    let lr = s["lr"].as_f64().context("train: lr")?;
    let eps = s["eps"].as_f64().context("train: eps")?;
    let steps = s["steps"].as_u64().context("train: steps")?;
    let mut losses = Vec::new();
    let mut first_grads = None;
    for _ in 0..steps {
        let (loss, g) = step(ops, &x, &t, &p, eps)?;
        losses.push(loss);
        if first_grads.is_none() {
            first_grads = Some(g.iter().map(write_tensor).collect::<Result<Vec<_>>>()?);
        }
        // plain gradient descent, in float32 like the parameters
        let _no_grad = tch::no_grad_guard();
        p = Params {
            w1: &p.w1 - &g[0] * lr,
            b1: &p.b1 - &g[1] * lr,
            gamma: &p.gamma - &g[2] * lr,
            w2: &p.w2 - &g[3] * lr,
        };
    }
    let (final_loss, _) = step(ops, &x, &t, &p, eps)?;
    losses.push(final_loss);
    Ok(json!({
        "losses": losses,
        "grads0": first_grads,
        "final": [write_tensor(&p.w1)?, write_tensor(&p.b1)?, write_tensor(&p.gamma)?, write_tensor(&p.w2)?],
    }))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, lib, spec] = &args[..] else {
        bail!("usage: polyop-rust-tch <libpolyop_torch.so> <spec.json>");
    };
    let spec: Value = serde_json::from_slice(&std::fs::read(spec)?)?;
    let ops = Library::load(lib)?;
    let mut calls = Vec::new();
    for c in spec["calls"].as_array().into_iter().flatten() {
        calls.push(one_call(&ops, c)?);
    }
    let mut out = json!({"namespace": ops.namespace(), "calls": calls});
    if let Some(s) = spec.get("train") {
        out["train"] = train(&ops, s)?;
    }
    println!("{out}");
    Ok(())
}
