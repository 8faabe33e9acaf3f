//! `polyop._core`: the Python core of polyop, over the stock registry
//! (`polyop_kernels::registry()`).
//!
//! - `ops()`, `op_info(name)`: op metadata as plain dicts (what the framework glue in
//!   `python/polyop/*.py` builds on: schemas, dtype rules, attributes, backward wiring).
//! - `infer(name, input_specs, **attrs)`: shape inference with unknown dims / unknown rank.
//! - `run(name, *arrays, **attrs)`: run a kernel on NumPy arrays. Inputs are read in place
//!   (strided views are passed as strided views, never copied here); outputs are new NumPy
//!   arrays the kernel writes into directly. The GIL is released while the kernel runs.
//!
//! No `numpy` crate: it cannot express `bfloat16` (`ml_dtypes`), so arrays are read through
//! their `__array_interface__` data pointer plus `shape` / `strides` / `dtype.name`.
//!
//! Errors: `TypeError` for wrong argument kinds (not an array, unsupported or mismatched
//! dtype, wrong number of tensors, missing / unknown / wrong-typed attributes); `ValueError`
//! for bad values (shapes, axis, k, attribute values, unknown op); `NotImplementedError` for
//! `Unsupported`; `RuntimeError` for internal errors (including caught panics). Every message
//! is kernel-core's Display string, `polyop.<op>: ...`.

use kernel_core::call;
use kernel_core::op::OutputAllocator;
use kernel_core::schema::ArgType;
use kernel_core::{
    catch_panic, default_pool, AttrValue, Attrs, CallSite, DType, Dim, Error, ErrorKind, OpDef,
    Phase, Registry, TensorMut, TensorRef, TensorSpec,
};
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;

fn registry() -> &'static Registry {
    polyop_kernels::registry()
}

/// A kernel-core error as the matching Python exception.
fn py_err(e: &Error) -> PyErr {
    let msg = e.to_string();
    match e.kind {
        ErrorKind::InvalidArgument => PyValueError::new_err(msg),
        ErrorKind::Unsupported => PyNotImplementedError::new_err(msg),
        ErrorKind::Internal => PyRuntimeError::new_err(msg),
    }
}

/// A kernel-core error about argument kinds (dtypes, arity, attribute binding) as TypeError.
fn py_type_err(e: &Error) -> PyErr {
    match e.kind {
        ErrorKind::Internal => py_err(e),
        _ => PyTypeError::new_err(e.to_string()),
    }
}

fn lookup(name: &str) -> PyResult<&'static OpDef> {
    registry().lookup(name).map_err(|e| py_err(&e))
}

// ---------------------------------------------------------------------------------------
// metadata

/// An op's metadata dict: polyop-export's `op_json` (the same serializer every library's
/// `polyop_library_info` uses), as the Python objects `json.loads` would give.
fn op_dict<'py>(py: Python<'py>, op: &OpDef) -> PyResult<Bound<'py, PyAny>> {
    json_to_py(py, &polyop_export::op_json(op))
}

/// A JSON value as the Python object `json.loads` would give, built directly (no text round
/// trip through CPython's parser, which is slower and, on CPython 3.11, makes valgrind report
/// its small-int cache as uninitialised under our frames).
fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_py_any(py)?.into_bound(py),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_py_any(py)?.into_bound(py),
            (None, Some(u)) => u.into_py_any(py)?.into_bound(py),
            _ => n
                .as_f64()
                .unwrap_or(f64::NAN)
                .into_py_any(py)?
                .into_bound(py),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let l = PyList::empty(py);
            for x in items {
                l.append(json_to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// Every registered op (forward and backward) as a metadata dict, in registration order.
#[pyfunction]
fn ops(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    json_to_py(
        py,
        &serde_json::Value::Array(registry().ops().map(polyop_export::op_json).collect()),
    )
}

/// One op's metadata dict; ValueError (listing the known ops) for an unknown name.
#[pyfunction]
fn op_info<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    op_dict(py, lookup(name)?)
}

// ---------------------------------------------------------------------------------------
// attributes

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn attr_from_py(op: &OpDef, name: &str, v: &Bound<'_, PyAny>, depth: u8) -> PyResult<AttrValue> {
    let bad = || {
        PyTypeError::new_err(format!(
            "polyop.{}: attribute `{name}` has unsupported Python type {}",
            op.name,
            type_name(v)
        ))
    };
    if v.is_none() {
        return Ok(AttrValue::None);
    }
    // bool before int: Python's bool is an int subclass.
    if v.is_instance_of::<PyBool>() {
        return Ok(AttrValue::Bool(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        return v.extract::<i64>().map(AttrValue::Int).map_err(|_| {
            PyValueError::new_err(format!(
                "polyop.{}: attribute `{name}` = {v} does not fit in a 64-bit integer",
                op.name
            ))
        });
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(AttrValue::Float(v.extract()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(AttrValue::Str(v.extract()?));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items: Vec<Bound<'_, PyAny>> = v.try_iter()?.collect::<PyResult<_>>()?;
        let mut vals = Vec::with_capacity(items.len());
        for it in &items {
            vals.push(attr_from_py(op, name, it, depth + 1)?);
        }
        if vals.iter().all(|x| matches!(x, AttrValue::Int(_))) {
            return Ok(AttrValue::IntList(
                vals.iter()
                    .map(|x| match x {
                        AttrValue::Int(i) => *i,
                        _ => unreachable!(),
                    })
                    .collect(),
            ));
        }
        if vals
            .iter()
            .all(|x| matches!(x, AttrValue::Int(_) | AttrValue::Float(_)))
        {
            return Ok(AttrValue::FloatList(
                vals.iter()
                    .map(|x| match x {
                        AttrValue::Int(i) => *i as f64,
                        AttrValue::Float(f) => *f,
                        _ => unreachable!(),
                    })
                    .collect(),
            ));
        }
        return Err(bad());
    }
    // NumPy scalars and 0-d arrays: np.int64(2), np.float32(0.5), np.bool_(True).
    if depth < 2 && v.hasattr("dtype")? && v.hasattr("item")? {
        let ndim: usize = v.getattr("ndim").and_then(|n| n.extract()).unwrap_or(0);
        if ndim == 0 {
            let item = v.call_method0("item")?;
            return attr_from_py(op, name, &item, depth + 1);
        }
    }
    Err(bad())
}

fn bind_attrs(op: &OpDef, attrs: Option<&Bound<'_, PyDict>>) -> PyResult<Attrs> {
    let mut given: Vec<(String, AttrValue)> = Vec::new();
    if let Some(d) = attrs {
        for (k, v) in d.iter() {
            let k: String = k.extract()?;
            let val = attr_from_py(op, &k, &v, 0)?;
            given.push((k, val));
        }
    }
    op.bind_attrs(given.iter().map(|(k, v)| (k.as_str(), v.clone())))
        .map_err(|e| py_type_err(&e))
}

// ---------------------------------------------------------------------------------------
// arrays

fn dtype_by_name(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| d.name() == name)
}

/// A NumPy array read in place: the object is kept alive by `obj` while views point into it.
struct InArray<'py> {
    _obj: Bound<'py, PyAny>,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
    ptr: usize,
}

fn numpy(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    py.import("numpy")
}

fn read_array<'py>(
    py: Python<'py>,
    op: &OpDef,
    arg: &str,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Option<InArray<'py>>> {
    if obj.is_none() {
        return Ok(None);
    }
    let np = numpy(py)?;
    let mut a = obj.clone();
    if !a.is_instance(&np.getattr("ndarray")?)? {
        if a.is_instance(&np.getattr("generic")?)? {
            a = np.call_method1("asarray", (a,))?;
        } else {
            return Err(PyTypeError::new_err(format!(
                "polyop.{}: input `{arg}` must be a numpy.ndarray (or None for an absent \
                 optional input), got {}",
                op.name,
                type_name(obj)
            )));
        }
    }
    let mut dt = a.getattr("dtype")?;
    if !dt.getattr("isnative")?.extract::<bool>()? {
        a = a.call_method1("astype", (dt.call_method1("newbyteorder", ("=",))?,))?;
        dt = a.getattr("dtype")?;
    }
    let dname: String = dt.getattr("name")?.extract()?;
    let dtype = dtype_by_name(&dname).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "polyop.{}: input `{arg}` has dtype {dname}, which polyop does not support \
             (supported: {})",
            op.name,
            op.dtypes
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let item = dtype.size() as isize;
    let mut shape: Vec<usize> = a.getattr("shape")?.extract()?;
    let mut bstrides: Vec<isize> = a.getattr("strides")?.extract()?;
    let aligned: bool = a.getattr("flags")?.getattr("aligned")?.extract()?;
    if !aligned || bstrides.iter().any(|s| s % item != 0) {
        // Only odd layouts (unaligned buffers, byte strides that are not whole elements)
        // are copied; ordinary views are passed as strided views.
        a = np.call_method1("ascontiguousarray", (a,))?;
        shape = a.getattr("shape")?.extract()?;
        bstrides = a.getattr("strides")?.extract()?;
    }
    let iface = a.getattr("__array_interface__")?;
    let data = iface.get_item("data")?;
    let ptr: usize = data.get_item(0)?.extract()?;
    Ok(Some(InArray {
        _obj: a,
        dtype,
        shape,
        strides: bstrides.iter().map(|s| s / item).collect(),
        ptr,
    }))
}

fn np_dtype<'py>(py: Python<'py>, d: DType) -> PyResult<Bound<'py, PyAny>> {
    if d == DType::BF16 {
        // ml_dtypes' own type, not the name: another package (MindSpore) may register a
        // `bfloat16` of its own with NumPy, whose arrays compare unequal to ml_dtypes'.
        let bf16 = py
            .import("ml_dtypes")
            .and_then(|m| m.getattr("bfloat16"))
            .map_err(|_| {
                PyTypeError::new_err("polyop: bfloat16 arrays need the `ml_dtypes` package")
            })?;
        return numpy(py)?.call_method1("dtype", (bf16,));
    }
    numpy(py)?.call_method1("dtype", (d.name(),))
}

/// A new C-contiguous NumPy array and its data pointer.
fn new_array<'py>(
    py: Python<'py>,
    d: DType,
    shape: &[usize],
) -> PyResult<(Bound<'py, PyAny>, usize)> {
    let np = numpy(py)?;
    let arr = np.call_method1("empty", (shape.to_vec(), np_dtype(py, d)?))?;
    let ptr: usize = arr
        .getattr("__array_interface__")?
        .get_item("data")?
        .get_item(0)?
        .extract()?;
    Ok((arr, ptr))
}

/// Outputs as new C-contiguous NumPy arrays the kernel writes into. Allocation takes the GIL
/// (the kernel runs without it; data-dependent kernels allocate from inside).
#[derive(Default)]
struct NumpyOutputs {
    arrays: Vec<Py<PyAny>>,
}

impl<'a> OutputAllocator<'a> for NumpyOutputs {
    fn allocate(
        &mut self,
        index: usize,
        dtype: DType,
        shape: &[usize],
    ) -> Result<TensorMut<'a>, Error> {
        if index != self.arrays.len() {
            return Err(Error::internal(format!(
                "output {index} allocated out of order"
            )));
        }
        Python::with_gil(|py| {
            let (arr, ptr) = new_array(py, dtype, shape)
                .map_err(|e| Error::internal(format!("allocating a NumPy output: {e}")))?;
            self.arrays.push(arr.unbind());
            // SAFETY: a fresh C-contiguous, aligned array of this dtype and shape (from
            // `np.empty`: uninitialised, which `from_raw` allows for outputs), kept alive in
            // `self.arrays` past the kernel call, and seen by no Python code until it returns,
            // so written only by the kernel of this call.
            Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, ptr as *mut u8) })
        })
    }
}

/// Run op `name` on NumPy arrays (None for an absent optional input). Returns one array for a
/// single-output op, else a tuple of arrays. In-place ops (`relu_`) run out of place here.
#[pyfunction]
#[pyo3(signature = (name, *arrays, **attrs))]
fn run<'py>(
    py: Python<'py>,
    name: &str,
    arrays: &Bound<'py, PyTuple>,
    attrs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let op = lookup(name)?;
    let args: Vec<&str> = op.schema.tensor_args().map(|a| a.name.as_str()).collect();
    // Trailing optional tensors may be left out.
    let required = op
        .schema
        .tensor_args()
        .filter(|a| a.ty == ArgType::Tensor)
        .count();
    if arrays.len() > args.len() || arrays.len() < required {
        return Err(PyTypeError::new_err(format!(
            "polyop.{}: expected {} tensor input(s) ({}), got {}",
            op.name,
            if required == args.len() {
                format!("{required}")
            } else {
                format!("{required} to {}", args.len())
            },
            args.join(", "),
            arrays.len()
        )));
    }
    let mut ins: Vec<Option<InArray>> = Vec::with_capacity(args.len());
    for (i, arg) in args.iter().enumerate() {
        match arrays.get_item(i) {
            Ok(obj) => ins.push(read_array(py, op, arg, &obj)?),
            Err(_) => ins.push(None),
        }
    }
    let dtypes: Vec<Option<DType>> = ins.iter().map(|a| a.as_ref().map(|a| a.dtype)).collect();
    op.check_inputs(&dtypes).map_err(|e| py_type_err(&e))?;
    let attrs = bind_attrs(op, attrs)?;

    let refs: Vec<Option<TensorRef>> = ins
        .iter()
        .map(|a| {
            // SAFETY: the view points into an array that `ins` keeps alive until after `refs`
            // is dropped, with the array's own shape and strides (in whole elements, else
            // `read_array` made a copy), checked alignment and a native-order dtype matching
            // `a.dtype`, so every offset it reaches is a readable element. Two parts of
            // `TensorRef::from_raw`'s contract are not enforced here (known gaps, issue 12
            // item 5): the kernel runs with the GIL released, so another Python thread could
            // write an input array meanwhile; and a NumPy bool array can hold bytes other than
            // 0 and 1 (through `.view(bool)`).
            a.as_ref().map(|a| unsafe {
                TensorRef::from_raw(
                    a.dtype,
                    a.shape.clone(),
                    a.strides.clone(),
                    a.ptr as *const u8,
                )
            })
        })
        .collect();

    let site = CallSite::once(attrs);
    let mut outs = NumpyOutputs::default();
    py.allow_threads(|| call::run(op, &refs, &site, &mut outs, default_pool(), Phase::Compute))
        .map_err(|e| py_err(&e))?;
    let results: Vec<Bound<'py, PyAny>> =
        outs.arrays.into_iter().map(|a| a.into_bound(py)).collect();
    drop(refs);
    drop(ins);
    if results.len() == 1 {
        Ok(results.into_iter().next().expect("one result"))
    } else {
        Ok(PyTuple::new(py, results)?.into_any())
    }
}

// ---------------------------------------------------------------------------------------
// shape inference

fn spec_from_py(
    py: Python<'_>,
    op: &OpDef,
    arg: &str,
    obj: &Bound<'_, PyAny>,
) -> PyResult<Option<TensorSpec>> {
    if obj.is_none() {
        return Ok(None);
    }
    let bad = || {
        PyTypeError::new_err(format!(
            "polyop.{}: spec for input `{arg}` must be None or (shape, dtype) with shape a \
             tuple of ints/None (or None for unknown rank), got {}",
            op.name,
            obj.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    };
    let items: Vec<Bound<'_, PyAny>> = match obj.try_iter() {
        Ok(it) => it.collect::<PyResult<_>>()?,
        Err(_) => return Err(bad()),
    };
    if items.len() != 2 {
        return Err(bad());
    }
    let dname: String = if items[1].is_instance_of::<PyString>() {
        items[1].extract()?
    } else {
        numpy(py)?
            .call_method1("dtype", (&items[1],))
            .and_then(|d| d.getattr("name"))
            .and_then(|n| n.extract())
            .map_err(|_| bad())?
    };
    let dtype = dtype_by_name(&dname).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "polyop.{}: input `{arg}` has dtype {dname}, which polyop does not support",
            op.name
        ))
    })?;
    if items[0].is_none() {
        return Ok(Some(TensorSpec::unknown_rank(dtype)));
    }
    let dims: Vec<Bound<'_, PyAny>> = match items[0].try_iter() {
        Ok(it) => it.collect::<PyResult<_>>()?,
        Err(_) => return Err(bad()),
    };
    let mut out = Vec::with_capacity(dims.len());
    for d in dims {
        out.push(if d.is_none() {
            Dim::Unknown
        } else if let Ok(name) = d.downcast::<PyString>() {
            // A symbolic size, named by the framework (`s0`, `b`).
            let name = name.to_str()?;
            if name.is_empty() {
                return Err(bad());
            }
            Dim::sym(name)
        } else {
            match d.extract::<i64>().map_err(|_| bad())? {
                v if v >= 0 => Dim::Known(v as usize),
                // Negative dims (-1, as TF/ONNX spell "unknown") are unknown too.
                _ => Dim::Unknown,
            }
        });
    }
    Ok(Some(TensorSpec::with_dims(dtype, out)))
}

/// Shape inference shared by [`infer`] and [`infer_symbolic`].
fn infer_specs<'py>(
    py: Python<'py>,
    name: &str,
    input_specs: &Bound<'py, PyAny>,
    attrs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Inference> {
    let op = lookup(name)?;
    let args: Vec<&str> = op.schema.tensor_args().map(|a| a.name.as_str()).collect();
    let items: Vec<Bound<'_, PyAny>> = input_specs
        .try_iter()
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "polyop.{}: input_specs must be a sequence of specs",
                op.name
            ))
        })?
        .collect::<PyResult<_>>()?;
    let mut specs = Vec::with_capacity(args.len().max(items.len()));
    for (i, it) in items.iter().enumerate() {
        let arg = args.get(i).copied().unwrap_or("?");
        specs.push(spec_from_py(py, op, arg, it)?);
    }
    // Trailing optional inputs may be left out.
    while specs.len() < args.len()
        && op.schema.tensor_args().nth(specs.len()).map(|a| &a.ty) == Some(&ArgType::OptionalTensor)
    {
        specs.push(None);
    }
    let dtypes: Vec<Option<DType>> = specs.iter().map(|s| s.as_ref().map(|s| s.dtype)).collect();
    op.check_inputs(&dtypes).map_err(|e| py_type_err(&e))?;
    let attrs = bind_attrs(op, attrs)?;
    let inferred = catch_panic(op, || op.infer_symbolic(&specs, &attrs)).map_err(|e| py_err(&e))?;
    Ok(Inference {
        op,
        specs,
        attrs,
        inferred,
    })
}

/// One shape inference with what it was computed from (the sharding rule needs both).
struct Inference {
    op: &'static OpDef,
    specs: Vec<Option<kernel_core::TensorSpec>>,
    attrs: kernel_core::Attrs,
    inferred: kernel_core::Inferred,
}

/// Shape inference: `input_specs` holds one `(shape, dtype)` per tensor input (dims are ints,
/// None for unknown, or strings naming symbolic sizes; shape None = unknown rank; the whole
/// spec None = absent optional input). Returns a list of `(shape tuple | None, dtype name)`,
/// one per output; a symbolic output dim is a symbol name or an `[op, a, b]` expression
/// (docs/shapes.md).
#[pyfunction]
#[pyo3(signature = (name, input_specs, **attrs))]
fn infer<'py>(
    py: Python<'py>,
    name: &str,
    input_specs: &Bound<'py, PyAny>,
    attrs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyList>> {
    let r = infer_specs(py, name, input_specs, attrs)?.inferred;
    let l = PyList::empty(py);
    for s in r.outputs {
        let shape = match &s.shape {
            None => py.None(),
            Some(dims) => {
                let dims: Vec<Bound<'py, PyAny>> = dims
                    .iter()
                    .map(|d| json_to_py(py, &polyop_export::dim_json(d)))
                    .collect::<PyResult<_>>()?;
                PyTuple::new(py, dims)?.into_any().unbind()
            }
        };
        l.append(PyTuple::new(py, [shape, s.dtype.name().into_py_any(py)?])?)?;
    }
    Ok(l)
}

/// Shape inference with the requirements between symbolic dims:
/// `{"outputs": [[shape, dtype], ...], "constraints": [[relation, lhs, rhs, message], ...]}`
/// (relation `"eq"` or `"le"`; dims in the wire form of [`infer`]).
#[pyfunction]
#[pyo3(signature = (name, input_specs, **attrs))]
fn infer_symbolic<'py>(
    py: Python<'py>,
    name: &str,
    input_specs: &Bound<'py, PyAny>,
    attrs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let r = infer_specs(py, name, input_specs, attrs)?;
    let mut v = polyop_export::inferred_json(&r.inferred);
    v["sharding"] = polyop_export::sharding_json(r.op, &r.specs, &r.inferred, &r.attrs);
    json_to_py(py, &v)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(ops, m)?)?;
    m.add_function(wrap_pyfunction!(op_info, m)?)?;
    m.add_function(wrap_pyfunction!(infer, m)?)?;
    m.add_function(wrap_pyfunction!(infer_symbolic, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    Ok(())
}
