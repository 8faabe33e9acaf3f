//! The framework-independent part of a polyop library: every `.so` built with an adapter's
//! `export!` macro (`polyop_torch::export!`, `polyop_tensorflow::export!`,
//! `polyop_onnxruntime::export!`, `polyop_xla::export!`) also exports, through
//! [`library_exports!`], four C functions that describe and drive its registry without any
//! framework:
//!
//! | symbol | signature | what |
//! |---|---|---|
//! | `polyop_library_info` | `const char* (void)` | JSON: `{"polyop_library": 1, "framework", "name_key", "<name_key>": name, "namespace" (the registry's, which errors name), "exported": [...], "ops": [op_info...]}`; static, never freed |
//! | `polyop_infer` | `char* (const char* request)` | JSON shape inference, see [`infer_json`]; free with `polyop_free_string` |
//! | `polyop_run` | `char* (const char* op, const char* attrs_json, const PolyopTensor* in, size_t n_in, const PolyopTensor* out, size_t n_out)` | run the CPU kernel on caller-owned buffers (destination passing); null or an error JSON |
//! | `polyop_free_string` | `void (char*)` | release a string returned by the two above |
//!
//! The op dicts have exactly the shape of `polyop.op_info(name)` in the Python core, so the
//! Python glue is driven the same way by the stock library and by an author's library.
//! Written once here, not in each adapter.

use kernel_core::call::{self, Preallocated};
use kernel_core::schema::ArgType;
use kernel_core::{
    catch_panic, default_pool, AttrValue, Attrs, BwdInput, CallSite, DType, Dim, Error, ErrorKind,
    Expr, Factor, Inferred, OpDef, Phase, Registry, TensorRef, TensorSpec, TypeRule,
};
use serde_json::{json, Map, Value};
use std::ffi::{c_char, CStr, CString};

/// Version of the JSON layout of `polyop_library_info`.
pub const INFO_VERSION: u32 = 1;

fn attr_json(v: &AttrValue) -> Value {
    match v {
        AttrValue::None => Value::Null,
        AttrValue::Int(i) => json!(i),
        AttrValue::Float(f) => {
            if f.is_finite() {
                json!(f)
            } else {
                // JSON has no inf/nan; Python's json module reads these names back.
                Value::String(format!("{f}"))
            }
        }
        AttrValue::Bool(b) => json!(b),
        AttrValue::Str(s) => json!(s),
        AttrValue::IntList(l) => json!(l),
        AttrValue::FloatList(l) => json!(l),
    }
}

fn rule_name(r: &TypeRule) -> &'static str {
    match r {
        TypeRule::T => "T",
        TypeRule::Fixed(d) => d.name(),
    }
}

/// One op's metadata, the same dict as `polyop.op_info(name)`.
pub fn op_json(op: &OpDef) -> Value {
    let inputs: Vec<Value> = op
        .schema
        .tensor_args()
        .zip(&op.input_types)
        .map(|(arg, rule)| {
            json!({
                "name": arg.name,
                "optional": arg.ty == ArgType::OptionalTensor,
                "dtype": rule_name(rule),
                "mutable": arg.alias.as_ref().is_some_and(|a| a.write),
            })
        })
        .collect();
    let outputs: Vec<Value> = op
        .output_types
        .iter()
        .enumerate()
        .map(|(i, rule)| json!({"name": op.schema.output_name(i), "dtype": rule_name(rule)}))
        .collect();
    let attrs: Vec<Value> = op
        .schema
        .attr_args()
        .map(|a| {
            let mut v = json!({
                "name": a.name,
                "type": a.ty.schema_name(),
                "default": a.default.as_ref().map(attr_json).unwrap_or(Value::Null),
                "required": a.default.is_none(),
                "role": if op.axis_attrs.contains(&a.name.as_str()) {
                    json!("axis")
                } else {
                    Value::Null
                },
            });
            // the fixed length of an `int[N]` (whose "type" is the kind, `int[]`)
            if let Some(n) = a.ty.fixed_len() {
                v["len"] = json!(n);
            }
            v
        })
        .collect();
    let backward = match &op.backward {
        None => Value::Null,
        Some(b) => json!({
            "op": b.op,
            "inputs": b.inputs.iter().map(|i| match i {
                BwdInput::Grad(j) => json!(["grad", j]),
                BwdInput::Input(j) => json!(["input", j]),
                BwdInput::Output(j) => json!(["output", j]),
            }).collect::<Vec<_>>(),
            "outputs": b.outputs,
        }),
    };
    json!({
        "name": op.name,
        "schema": op.schema.to_string(),
        "doc": op.doc,
        "inputs": inputs,
        "outputs": outputs,
        "attrs": attrs,
        "dtypes": op.dtypes.iter().map(|d| d.name()).collect::<Vec<_>>(),
        "flags": {
            "inplace": op.flags.inplace,
            "data_dependent_shape": op.flags.data_dependent_shape,
            "backward_only": op.flags.backward_only,
        },
        "backward": backward,
        "camel_name": op.camel_name,
        "onnx_name": op.onnx_op_type(),
        // the standard ONNX ops it implements (an execution provider's claims)
        "onnx_standard": op.onnx.iter().map(|m| json!({
            "op_type": m.op_type,
            "versions": m.versions,
            "attrs": m.attr_names(),
            "dtypes": m.dtypes.unwrap_or(op.dtypes).iter().map(|d| d.name()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "num_inputs": op.num_inputs(),
        "num_outputs": op.num_outputs(),
    })
}

/// The library description: which framework, under which name (`name_key` is `namespace`
/// for torch, `prefix` for TensorFlow and XLA, `domain` for ONNX Runtime), which ops the
/// framework surface exposes (`exported`, e.g. in-place ops are torch-only) and every op's
/// metadata.
pub fn library_info(
    registry: &Registry,
    framework: &str,
    name_key: &str,
    name: &str,
    exported: &[&str],
) -> String {
    let mut m = Map::new();
    m.insert("polyop_library".into(), json!(INFO_VERSION));
    m.insert("framework".into(), json!(framework));
    m.insert("name_key".into(), json!(name_key));
    m.insert(name_key.into(), json!(name));
    // the namespace errors name the ops with (`Registry::named`)
    m.insert("namespace".into(), json!(registry.namespace()));
    m.insert("polyop_version".into(), json!(env!("CARGO_PKG_VERSION")));
    m.insert("exported".into(), json!(exported));
    let mut errors = LOAD_ERRORS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    errors.extend(export_mismatches(registry, framework, exported));
    m.insert("load_errors".into(), json!(errors));
    m.insert(
        "ops".into(),
        Value::Array(registry.ops().map(op_json).collect()),
    );
    Value::Object(m).to_string()
}

/// Where a library's exported op names and its registry disagree: a name that is no op or an
/// op left out (the XLA `export!` exports at most `polyop_xla::MAX_OPS` ops). Reported as load
/// errors, so loading the library through polyop fails with the reason instead of an op going
/// missing. In-place ops are exported only to torch.
fn export_mismatches(registry: &Registry, framework: &str, exported: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for name in exported {
        if registry.lookup(name).is_err() {
            let known: Vec<&str> = registry.ops().map(|o| o.name).collect();
            out.push(format!(
                "polyop: this {framework} library exports `{name}`, which is not an op of its \
                 registry (its ops: {}); fix the name in the export! macro",
                known.join(", ")
            ));
        }
    }
    for op in registry.ops() {
        let surface = framework == "torch" || !op.flags.inplace;
        if surface && !exported.contains(&op.name) {
            out.push(format!(
                "polyop: op `{}` is in the registry but this {framework} library does not \
                 export it (more ops than its export! can serve?)",
                op.name
            ));
        }
    }
    out
}

/// Errors met while this library registered its ops with the framework from its load-time
/// constructor, which cannot raise: kept here and reported as `"load_errors"` in
/// `polyop_library_info`, so the Python glue turns them into a load error instead of letting
/// the ops silently go missing.
static LOAD_ERRORS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Record a registration failure (also printed on stderr, for raw loads without the glue).
pub fn record_load_error(msg: String) {
    eprintln!("{msg}");
    LOAD_ERRORS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(msg);
}

/// Run `$body` (an expression of type `Result<(), String>`) when the library is loaded, from
/// an ELF constructor (`.init_array`): how adapters register ops with frameworks that only
/// `dlopen` a library (torch, TensorFlow). A constructor cannot raise, so an error or a panic
/// is kept with [`record_load_error`] as "polyop: `$what` failed: ...".
#[macro_export]
macro_rules! on_load {
    ($what:expr, $body:expr) => {
        const _: () = {
            extern "C" fn __polyop_on_load() {
                // Never unwind out of a library constructor.
                let r = ::std::panic::catch_unwind(
                    || -> ::std::result::Result<(), ::std::string::String> { $body },
                );
                let err = match r {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => e,
                    Err(_) => "a panic".to_string(),
                };
                $crate::record_load_error(::std::format!("polyop: {} failed: {err}", $what));
            }
            #[used]
            #[link_section = ".init_array"]
            static __POLYOP_ON_LOAD: extern "C" fn() = __polyop_on_load;
        };
    };
}

/// Names of the ops a framework without in-place semantics exposes.
pub fn out_of_place_ops(registry: &Registry) -> Vec<&str> {
    registry
        .ops()
        .filter(|o| !o.flags.inplace)
        .map(|o| o.name)
        .collect()
}

fn attr_from_json(op: &OpDef, name: &str, v: &Value) -> Result<AttrValue, Error> {
    let bad = || {
        Error::invalid(format!(
            "attribute `{name}` has an unsupported JSON value {v}"
        ))
        .in_op(op)
    };
    Ok(match v {
        Value::Null => AttrValue::None,
        Value::Bool(b) => AttrValue::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AttrValue::Int(i),
            None => AttrValue::Float(n.as_f64().ok_or_else(bad)?),
        },
        Value::String(s) => AttrValue::Str(s.clone()),
        Value::Array(items) => {
            if items.iter().all(|x| x.as_i64().is_some()) {
                AttrValue::IntList(items.iter().map(|x| x.as_i64().unwrap_or(0)).collect())
            } else if items.iter().all(|x| x.as_f64().is_some()) {
                AttrValue::FloatList(items.iter().map(|x| x.as_f64().unwrap_or(0.0)).collect())
            } else {
                return Err(bad());
            }
        }
        Value::Object(_) => return Err(bad()),
    })
}

/// Attributes from a JSON object, bound to the op's schema. `{"$float": "inf"}`-style values
/// are not needed: non-finite floats travel as the strings "inf", "-inf", "nan" only where
/// the schema declares a float.
pub fn bind_json_attrs(op: &OpDef, attrs: Option<&Value>) -> Result<Attrs, Error> {
    let mut given: Vec<(String, AttrValue)> = Vec::new();
    if let Some(Value::Object(m)) = attrs {
        for (k, v) in m {
            let declared_float = op
                .schema
                .attr_args()
                .any(|a| a.name == *k && a.ty == ArgType::Float);
            let val = match v {
                Value::String(s) if declared_float => match s.as_str() {
                    "inf" => AttrValue::Float(f64::INFINITY),
                    "-inf" => AttrValue::Float(f64::NEG_INFINITY),
                    "nan" => AttrValue::Float(f64::NAN),
                    _ => attr_from_json(op, k, v)?,
                },
                _ => attr_from_json(op, k, v)?,
            };
            given.push((k.clone(), val));
        }
    } else if let Some(v) = attrs {
        if !v.is_null() {
            return Err(Error::invalid("attributes must be a JSON object").in_op(op));
        }
    }
    op.bind_attrs(given.iter().map(|(k, v)| (k.as_str(), v.clone())))
}

/// A dim in the wire form every library and the Python glue share: an int (known), null
/// (unknown), a string (a symbol) or `[op, a, b]` with `op` a [`BinOp`] name.
pub fn dim_json(d: &Dim) -> Value {
    fn expr(e: &Expr) -> Value {
        match e {
            Expr::Sym(s) => json!(s),
            Expr::Const(c) => json!(c),
            Expr::Bin(op, a, b) => json!([op.name(), expr(a), expr(b)]),
        }
    }
    match d {
        Dim::Known(n) => json!(n),
        Dim::Unknown => Value::Null,
        Dim::Sym(e) => expr(e),
    }
}

/// `{"outputs": [[shape | null, dtype], ...], "constraints": [[relation, lhs, rhs, message]]}`
/// with dims in the [`dim_json`] form.
pub fn inferred_json(r: &Inferred) -> Value {
    let shape = |s: &TensorSpec| match &s.shape {
        None => Value::Null,
        Some(d) => Value::Array(d.iter().map(dim_json).collect()),
    };
    json!({
        "outputs": r.outputs.iter().map(|s| json!([shape(s), s.dtype.name()])).collect::<Vec<_>>(),
        "constraints": r.constraints.iter().map(|c| json!([
            c.relation.name(), dim_json(&c.lhs), dim_json(&c.rhs), c.message
        ])).collect::<Vec<_>>(),
    })
}

/// An op's [`ShardingRule`] for one call as JSON: `{"factors": ["split" | "whole", ...],
/// "inputs": [[factor, ...] | null, ...], "outputs": [...]}` (docs/distributed.md); `null`
/// when the rule cannot be computed (callers then keep every dim whole).
pub fn sharding_json(
    op: &OpDef,
    inputs: &[Option<TensorSpec>],
    r: &Inferred,
    attrs: &Attrs,
) -> Value {
    let Ok(rule) = op.sharding_rule(inputs, &r.outputs, attrs) else {
        return Value::Null;
    };
    let kind = |f: &Factor| match f {
        Factor::Split => "split",
        Factor::Whole => "whole",
    };
    json!({
        "factors": rule.factors.iter().map(kind).collect::<Vec<_>>(),
        "inputs": rule.inputs,
        "outputs": rule.outputs,
    })
}

fn spec_from_json(op: &OpDef, v: &Value) -> Result<Option<TensorSpec>, Error> {
    let bad = || {
        Error::invalid(format!(
            "an input spec must be null or [shape | null, dtype] (dims: int, null or a symbol name), got {v}"
        ))
        .in_op(op)
    };
    let arr = match v {
        Value::Null => return Ok(None),
        Value::Array(a) if a.len() == 2 => a,
        _ => return Err(bad()),
    };
    let dname = arr[1].as_str().ok_or_else(bad)?;
    let dtype = DType::from_name(dname).ok_or_else(|| {
        Error::invalid(format!("dtype {dname} is not supported by polyop")).in_op(op)
    })?;
    match &arr[0] {
        Value::Null => Ok(Some(TensorSpec::unknown_rank(dtype))),
        Value::Array(dims) => {
            let mut out = Vec::with_capacity(dims.len());
            for d in dims {
                match d {
                    Value::Null => out.push(Dim::Unknown),
                    Value::Number(n) => match n.as_i64() {
                        Some(x) if x >= 0 => out.push(Dim::Known(x as usize)),
                        Some(_) => out.push(Dim::Unknown),
                        None => return Err(bad()),
                    },
                    Value::String(name) if !name.is_empty() => out.push(Dim::sym(name.as_str())),
                    _ => return Err(bad()),
                }
            }
            Ok(Some(TensorSpec::with_dims(dtype, out)))
        }
        _ => Err(bad()),
    }
}

/// Error JSON: `{"error": message, "kind": "type" | "value" | "unsupported" | "internal"}`.
/// `type` is an argument-kind error (arity, dtypes, attribute binding: Python's TypeError),
/// `value` a bad value (shapes, attribute values: ValueError), like the Python core.
fn error_json(e: &Error, type_error: bool) -> Value {
    let kind = match e.kind {
        ErrorKind::Internal => "internal",
        ErrorKind::Unsupported => "unsupported",
        ErrorKind::InvalidArgument if type_error => "type",
        ErrorKind::InvalidArgument => "value",
    };
    json!({"error": e.to_string(), "kind": kind})
}

/// Shape inference from JSON: request `{"op": name, "inputs": [spec, ...], "attrs": {...}}`
/// with a spec `null` (absent optional input) or `[shape | null, dtype]` (`null` dims are
/// unknown; trailing optional inputs may be left out); answer `{"outputs": [[shape | null,
/// dtype], ...]}` or an error object (see `error_json`).
pub fn infer_json(registry: &Registry, request: &str) -> String {
    let r = catch_panic("polyop_infer", || Ok(infer_value(registry, request)));
    match r {
        Ok(v) => v,
        Err(e) => error_json(&e, false),
    }
    .to_string()
}

fn infer_value(registry: &Registry, request: &str) -> Value {
    let req: Value = match serde_json::from_str(request) {
        Ok(v) => v,
        Err(e) => return error_json(&Error::invalid(format!("bad request JSON: {e}")), true),
    };
    let Some(name) = req.get("op").and_then(Value::as_str) else {
        return error_json(&Error::invalid("request has no \"op\""), true);
    };
    let op = match registry.lookup(name) {
        Ok(op) => op,
        Err(e) => return error_json(&e, false),
    };
    let empty = Vec::new();
    let items = req
        .get("inputs")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let mut specs = Vec::with_capacity(items.len());
    for it in items {
        match spec_from_json(op, it) {
            Ok(s) => specs.push(s),
            Err(e) => return error_json(&e, true),
        }
    }
    while specs.len() < op.num_inputs()
        && op.schema.tensor_args().nth(specs.len()).map(|a| &a.ty) == Some(&ArgType::OptionalTensor)
    {
        specs.push(None);
    }
    let dtypes: Vec<Option<DType>> = specs.iter().map(|s| s.as_ref().map(|s| s.dtype)).collect();
    if let Err(e) = op.check_inputs(&dtypes) {
        return error_json(&e, true);
    }
    let attrs = match bind_json_attrs(op, req.get("attrs")) {
        Ok(a) => a,
        Err(e) => return error_json(&e, true),
    };
    match op.infer_symbolic(&specs, &attrs) {
        Ok(r) => {
            let mut v = inferred_json(&r);
            v["sharding"] = sharding_json(op, &specs, &r, &attrs);
            v
        }
        Err(e) => error_json(&e, false),
    }
}

/// A tensor as `polyop_run` takes it: dtype name, rank, shape, strides in elements (may be
/// null for contiguous) and data. An absent optional input has `data == NULL` and `ndim < 0`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolyopTensor {
    pub dtype: *const c_char,
    pub ndim: i64,
    pub shape: *const i64,
    pub strides: *const i64,
    pub data: *mut u8,
}

/// Run op `name` on caller-owned buffers: inputs as strided views, outputs contiguous and
/// already allocated to the shapes `polyop_infer` gives (destination passing). Ops with a
/// data-dependent output shape are refused (no allocator on this path). Returns an error JSON
/// on failure.
///
/// # Safety
/// In every descriptor, `dtype` must be null or a NUL-terminated string, `shape` must point to
/// `ndim` readable `i64`s and `strides` be null or point to `ndim` readable `i64`s (when
/// `ndim > 0`), and `data` must be valid memory of its dtype, shape and strides for the whole
/// call (inputs readable and not written meanwhile, holding valid values of the dtype: `bool`
/// bytes 0 or 1; outputs dense, writable and used by nothing else). Output buffers must not
/// alias inputs. (A null `dtype`, a negative `ndim` other than the absent-input marker, and a
/// negative dim are refused with an error.)
pub unsafe fn run_raw(
    registry: &Registry,
    name: &str,
    attrs_json: &str,
    inputs: &[PolyopTensor],
    outputs: &[PolyopTensor],
) -> Result<(), String> {
    let fail = |e: &Error, t: bool| Err(error_json(e, t).to_string());
    let op = match registry.lookup(name) {
        Ok(op) => op,
        Err(e) => return fail(&e, false),
    };
    if op.flags.data_dependent_shape {
        return fail(
            &Error::unsupported(
                "the output shape depends on the data; polyop_run needs pre-allocated outputs",
            )
            .in_op(op),
            false,
        );
    }
    let attrs_v: Value = match serde_json::from_str(if attrs_json.is_empty() {
        "{}"
    } else {
        attrs_json
    }) {
        Ok(v) => v,
        Err(e) => {
            return fail(
                &Error::invalid(format!("bad attributes JSON: {e}")).in_op(op),
                true,
            )
        }
    };
    let attrs = match bind_json_attrs(op, Some(&attrs_v)) {
        Ok(a) => a,
        Err(e) => return fail(&e, true),
    };
    let desc = |t: &PolyopTensor| -> Result<(DType, Vec<usize>, Vec<isize>), Error> {
        if t.dtype.is_null() || t.ndim < 0 {
            return Err(Error::invalid(format!(
                "bad tensor descriptor (dtype null: {}, ndim {})",
                t.dtype.is_null(),
                t.ndim
            ))
            .in_op(op));
        }
        // SAFETY: `t.dtype` is not null (checked above), so by this function's contract it is
        // a NUL-terminated string, alive for the call.
        let dname = unsafe { CStr::from_ptr(t.dtype) }.to_string_lossy();
        let dtype = DType::from_name(&dname).ok_or_else(|| {
            Error::invalid(format!("dtype {dname} is not supported by polyop")).in_op(op)
        })?;
        let n = t.ndim as usize;
        let dims: Vec<i64> = (0..n)
            // SAFETY: `i < ndim` (non-negative, checked above), and the contract makes
            // `shape` point to `ndim` readable i64s.
            .map(|i| unsafe { *t.shape.add(i) })
            .collect();
        if let Some(d) = dims.iter().find(|&&d| d < 0) {
            return Err(Error::invalid(format!("negative dim {d} in shape {dims:?}")).in_op(op));
        }
        let shape: Vec<usize> = dims.into_iter().map(|d| d as usize).collect();
        let strides: Vec<isize> = if t.strides.is_null() {
            kernel_core::contiguous_strides(&shape)
        } else {
            (0..n)
                // SAFETY: `strides` is not null, so by the contract it points to `ndim`
                // readable i64s, and `i < ndim`.
                .map(|i| unsafe { *t.strides.add(i) } as isize)
                .collect()
        };
        Ok((dtype, shape, strides))
    };
    let mut refs: Vec<Option<TensorRef>> = Vec::with_capacity(inputs.len());
    for t in inputs {
        if t.data.is_null() && t.ndim < 0 {
            refs.push(None);
            continue;
        }
        match desc(t) {
            // SAFETY: the contract makes `t.data` valid, unwritten memory of this dtype, shape
            // and strides (which `desc` read from the same descriptor; equal lengths, `ndim`)
            // for the whole call, which outlives `refs`.
            Ok((d, s, st)) => refs.push(Some(unsafe { TensorRef::from_raw(d, s, st, t.data) })),
            Err(e) => return fail(&e, true),
        }
    }
    while refs.len() < op.num_inputs() {
        refs.push(None);
    }
    let dtypes: Vec<Option<DType>> = refs.iter().map(|r| r.as_ref().map(|r| r.dtype)).collect();
    if let Err(e) = op.check_inputs(&dtypes) {
        return fail(&e, true);
    }
    let mut buffers = Vec::with_capacity(outputs.len());
    for t in outputs {
        match desc(t) {
            Ok((d, s, _)) => buffers.push((d, s, t.data)),
            Err(e) => return fail(&e, true),
        }
    }
    // SAFETY: this function's contract makes each output's `data` dense, writable memory of
    // its dtype and shape (read by `desc` from the same descriptor), used by nothing else for
    // the whole call, which outlives `alloc`.
    let mut alloc = match unsafe { Preallocated::new(op, buffers) } {
        Ok(a) => a,
        Err(e) => return fail(&e.in_op(op), true),
    };
    let site = CallSite::once(attrs);
    call::run(op, &refs, &site, &mut alloc, default_pool(), Phase::Compute)
        .or_else(|e| fail(&e, false))
}

/// A Rust string as a C string owned by the caller (released with [`free_string`]).
pub fn into_c_string(s: String) -> *mut c_char {
    CString::new(s.replace('\0', " "))
        .unwrap_or_default()
        .into_raw()
}

/// Release a string from [`into_c_string`].
///
/// # Safety
/// `p` must come from [`into_c_string`] (or be null) and be released once.
pub unsafe fn free_string(p: *mut c_char) {
    if !p.is_null() {
        // SAFETY: `p` is not null, so by the contract it came from `CString::into_raw` in
        // `into_c_string` and has not been released yet.
        drop(unsafe { CString::from_raw(p) });
    }
}

/// Read a C string argument (null = empty).
///
/// # Safety
/// `p` must be null or a valid NUL-terminated string that stays alive and unmodified for `'a`.
pub unsafe fn arg_str<'a>(p: *const c_char) -> std::borrow::Cow<'a, str> {
    if p.is_null() {
        "".into()
    } else {
        // SAFETY: `p` is not null, so by the contract it is a valid NUL-terminated string
        // (alive for `'a`, the caller's choice).
        unsafe { CStr::from_ptr(p) }.to_string_lossy()
    }
}

/// Emit the four C functions of a polyop library (see the crate docs) for `$registry` (an
/// expression of type `&'static Registry`). Called by every adapter's `export!` macro; an
/// author never calls it directly. `$exported` is an expression giving the op names the
/// framework surface exposes (`Vec<&str>`).
#[macro_export]
macro_rules! library_exports {
    (framework = $fw:expr, name_key = $key:expr, name = $name:expr, registry = $registry:expr, exported = $exported:expr $(,)?) => {
        /// JSON description of this library (framework, names, op metadata). Static.
        #[no_mangle]
        pub extern "C" fn polyop_library_info() -> *const ::std::ffi::c_char {
            static INFO: ::std::sync::OnceLock<::std::ffi::CString> = ::std::sync::OnceLock::new();
            INFO.get_or_init(|| {
                let s = ::std::panic::catch_unwind(|| {
                    let registry: &'static $crate::__Registry = $registry;
                    let exported: ::std::vec::Vec<&str> = $exported;
                    $crate::library_info(registry, $fw, $key, $name, &exported)
                })
                .unwrap_or_else(|_| "{\"error\": \"polyop_library_info panicked\"}".to_string());
                ::std::ffi::CString::new(s).unwrap_or_default()
            })
            .as_ptr()
        }

        /// JSON shape inference; the result must be released with `polyop_free_string`.
        ///
        /// # Safety
        /// `request` must be a valid NUL-terminated string.
        #[no_mangle]
        pub unsafe extern "C" fn polyop_infer(
            request: *const ::std::ffi::c_char,
        ) -> *mut ::std::ffi::c_char {
            // SAFETY: this function's contract: `request` is a valid NUL-terminated string
            // for the whole call, which outlives `req`.
            let req = unsafe { $crate::arg_str(request) };
            let out = ::std::panic::catch_unwind(|| $crate::infer_json($registry, &req))
                .unwrap_or_else(|_| {
                    "{\"error\": \"polyop_infer panicked\", \"kind\": \"internal\"}".to_string()
                });
            $crate::into_c_string(out)
        }

        /// Run an op on caller-owned buffers; null on success, else an error JSON to release
        /// with `polyop_free_string`.
        ///
        /// # Safety
        /// `op` and `attrs_json` must be null or valid NUL-terminated strings; `inputs` must
        /// point to `n_inputs` descriptors and `outputs` to `n_outputs` (either may be null
        /// when its count is 0), each meeting the contract of `polyop_export::run_raw`.
        #[no_mangle]
        pub unsafe extern "C" fn polyop_run(
            op: *const ::std::ffi::c_char,
            attrs_json: *const ::std::ffi::c_char,
            inputs: *const $crate::PolyopTensor,
            n_inputs: usize,
            outputs: *const $crate::PolyopTensor,
            n_outputs: usize,
        ) -> *mut ::std::ffi::c_char {
            // SAFETY: this function's contract: null or a NUL-terminated string alive for the
            // call, which outlives `op`.
            let op = unsafe { $crate::arg_str(op) };
            // SAFETY: as for `op`.
            let attrs = unsafe { $crate::arg_str(attrs_json) };
            let ins: &[$crate::PolyopTensor] = if n_inputs == 0 {
                &[]
            } else {
                // SAFETY: the contract: `inputs` points to `n_inputs > 0` initialised
                // descriptors (`PolyopTensor` is plain old data), alive for the call.
                unsafe { ::std::slice::from_raw_parts(inputs, n_inputs) }
            };
            let outs: &[$crate::PolyopTensor] = if n_outputs == 0 {
                &[]
            } else {
                // SAFETY: as for `ins`.
                unsafe { ::std::slice::from_raw_parts(outputs, n_outputs) }
            };
            // SAFETY: the descriptors meet `run_raw`'s contract (this function's contract).
            let r = ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| unsafe {
                $crate::run_raw($registry, &op, &attrs, ins, outs)
            }));
            match r {
                Ok(Ok(())) => ::std::ptr::null_mut(),
                Ok(Err(e)) => $crate::into_c_string(e),
                Err(_) => $crate::into_c_string(
                    "{\"error\": \"polyop_run panicked\", \"kind\": \"internal\"}".to_string(),
                ),
            }
        }

        /// Release a string returned by `polyop_infer` / `polyop_run`.
        ///
        /// # Safety
        /// `s` must come from one of them and be released once.
        #[no_mangle]
        pub unsafe extern "C" fn polyop_free_string(s: *mut ::std::ffi::c_char) {
            // SAFETY: this function's contract: `s` came from `into_c_string` (through
            // `polyop_infer` / `polyop_run`), or is null, and is released once.
            unsafe { $crate::free_string(s) }
        }
    };
}

#[doc(hidden)]
pub use kernel_core::Registry as __Registry;

/// Names of every op of the registry (torch exposes all, in-place ones included).
pub fn all_ops(registry: &Registry) -> Vec<&str> {
    registry.ops().map(|o| o.name).collect()
}
