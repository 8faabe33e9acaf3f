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

use kernel_core::exec::run_op;
use kernel_core::schema::ArgType;
use kernel_core::{
    catch_panic, default_pool, AttrValue, Attrs, BwdInput, DType, Error, ErrorKind, KernelCtx,
    OpDef, Registry, TensorMut, TensorRef, TensorSpec, TypeRule,
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

fn attr_to_py(py: Python<'_>, v: &AttrValue) -> PyResult<PyObject> {
    match v {
        AttrValue::None => Ok(py.None()),
        AttrValue::Int(i) => i.into_py_any(py),
        AttrValue::Float(f) => f.into_py_any(py),
        AttrValue::Bool(b) => b.into_py_any(py),
        AttrValue::Str(s) => s.into_py_any(py),
        AttrValue::IntList(l) => l.clone().into_py_any(py),
        AttrValue::FloatList(l) => l.clone().into_py_any(py),
    }
}

fn rule_name(r: &TypeRule) -> &'static str {
    match r {
        TypeRule::T => "T",
        TypeRule::Fixed(d) => d.name(),
    }
}

fn op_dict<'py>(py: Python<'py>, op: &OpDef) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", op.name)?;
    d.set_item("schema", op.schema.to_string())?;
    d.set_item("doc", op.doc)?;

    let inputs = PyList::empty(py);
    for (arg, rule) in op.schema.tensor_args().zip(&op.input_types) {
        let i = PyDict::new(py);
        i.set_item("name", &arg.name)?;
        i.set_item("optional", arg.ty == ArgType::OptionalTensor)?;
        i.set_item("dtype", rule_name(rule))?;
        i.set_item("mutable", arg.alias.as_ref().is_some_and(|a| a.write))?;
        inputs.append(i)?;
    }
    d.set_item("inputs", inputs)?;

    let outputs = PyList::empty(py);
    for (i, rule) in op.output_types.iter().enumerate() {
        let o = PyDict::new(py);
        o.set_item("name", op.schema.output_name(i))?;
        o.set_item("dtype", rule_name(rule))?;
        outputs.append(o)?;
    }
    d.set_item("outputs", outputs)?;

    let attrs = PyList::empty(py);
    for arg in op.schema.attr_args() {
        let a = PyDict::new(py);
        a.set_item("name", &arg.name)?;
        a.set_item("type", arg.ty.schema_name())?;
        a.set_item(
            "default",
            match &arg.default {
                Some(v) => attr_to_py(py, v)?,
                None => py.None(),
            },
        )?;
        a.set_item("required", arg.default.is_none())?;
        attrs.append(a)?;
    }
    d.set_item("attrs", attrs)?;

    d.set_item(
        "dtypes",
        op.dtypes.iter().map(|d| d.name()).collect::<Vec<_>>(),
    )?;

    let flags = PyDict::new(py);
    flags.set_item("inplace", op.flags.inplace)?;
    flags.set_item("data_dependent_shape", op.flags.data_dependent_shape)?;
    flags.set_item("backward_only", op.flags.backward_only)?;
    d.set_item("flags", flags)?;

    match &op.backward {
        None => d.set_item("backward", py.None())?,
        Some(b) => {
            let bd = PyDict::new(py);
            bd.set_item("op", b.op)?;
            let ins = PyList::empty(py);
            for i in b.inputs {
                let (kind, idx) = match i {
                    BwdInput::Grad(j) => ("grad", *j),
                    BwdInput::Input(j) => ("input", *j),
                    BwdInput::Output(j) => ("output", *j),
                };
                ins.append(PyTuple::new(
                    py,
                    [kind.into_py_any(py)?, idx.into_py_any(py)?],
                )?)?;
            }
            bd.set_item("inputs", ins)?;
            bd.set_item("outputs", b.outputs.to_vec())?;
            d.set_item("backward", bd)?;
        }
    }
    d.set_item("camel_name", &op.camel_name)?;
    d.set_item("onnx_name", op.onnx_op_type())?;
    d.set_item("num_inputs", op.num_inputs())?;
    d.set_item("num_outputs", op.num_outputs())?;
    Ok(d)
}

/// Every registered op (forward and backward) as a metadata dict, in registration order.
#[pyfunction]
fn ops(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let l = PyList::empty(py);
    for op in registry().ops() {
        l.append(op_dict(py, op)?)?;
    }
    Ok(l)
}

/// One op's metadata dict; ValueError (listing the known ops) for an unknown name.
#[pyfunction]
fn op_info<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
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
        // Registers the `bfloat16` name with NumPy.
        py.import("ml_dtypes").map_err(|_| {
            PyTypeError::new_err("polyop: bfloat16 arrays need the `ml_dtypes` package")
        })?;
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

    // SAFETY: every view points into an array kept alive by `ins` for the rest of this call,
    // with the array's own shape, element strides and (checked) alignment.
    let refs: Vec<Option<TensorRef>> = ins
        .iter()
        .map(|a| {
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

    let results: Vec<Bound<'py, PyAny>> = if op.flags.data_dependent_shape {
        let owned = py
            .allow_threads(|| catch_panic(op.name, || run_op(op, &refs, &attrs, default_pool())))
            .map_err(|e| py_err(&e))?;
        let mut out = Vec::with_capacity(owned.len());
        for t in &owned {
            let (arr, ptr) = new_array(py, t.dtype, &t.shape)?;
            let bytes = t.as_bytes();
            if !bytes.is_empty() {
                // SAFETY: `arr` is a fresh C-contiguous array of the same dtype and shape.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, bytes.len())
                };
            }
            out.push(arr);
        }
        out
    } else {
        let specs =
            catch_panic(op.name, || op.infer_concrete(&refs, &attrs)).map_err(|e| py_err(&e))?;
        let mut arrs = Vec::with_capacity(specs.len());
        let mut views: Vec<TensorMut> = Vec::with_capacity(specs.len());
        for s in &specs {
            let shape = s.concrete().ok_or_else(|| {
                PyRuntimeError::new_err(format!(
                    "polyop.{}: internal error: shape function left an output dim unknown for \
                     concrete inputs",
                    op.name
                ))
            })?;
            let (arr, ptr) = new_array(py, s.dtype, &shape)?;
            // SAFETY: fresh, exclusively owned, C-contiguous NumPy buffer kept alive in `arrs`.
            views.push(unsafe { TensorMut::from_raw_contiguous(s.dtype, &shape, ptr as *mut u8) });
            arrs.push(arr);
        }
        py.allow_threads(|| {
            let mut ctx = KernelCtx::new(op, &refs, &mut views, &attrs, default_pool());
            op.compute(&mut ctx)
        })
        .map_err(|e| py_err(&e))?;
        arrs
    };
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
    let dims: Vec<Option<i64>> = items[0].extract().map_err(|_| bad())?;
    let mut out = Vec::with_capacity(dims.len());
    for d in dims {
        match d {
            None => out.push(None),
            Some(v) if v >= 0 => out.push(Some(v as usize)),
            // Negative dims (-1, as TF/ONNX spell "unknown") are unknown too.
            Some(_) => out.push(None),
        }
    }
    Ok(Some(TensorSpec::with_dims(dtype, out)))
}

/// Shape inference: `input_specs` holds one `(shape, dtype)` per tensor input (dims may be
/// None; shape None = unknown rank; the whole spec None = absent optional input). Returns a
/// list of `(shape tuple | None, dtype name)`, one per output.
#[pyfunction]
#[pyo3(signature = (name, input_specs, **attrs))]
fn infer<'py>(
    py: Python<'py>,
    name: &str,
    input_specs: &Bound<'py, PyAny>,
    attrs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyList>> {
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
    let out = catch_panic(op.name, || op.infer(&specs, &attrs)).map_err(|e| py_err(&e))?;
    let l = PyList::empty(py);
    for s in out {
        let shape = match &s.shape {
            None => py.None(),
            Some(dims) => PyTuple::new(py, dims.iter().map(|d| d.map(|v| v as u64)))?
                .into_any()
                .unbind(),
        };
        l.append(PyTuple::new(py, [shape, s.dtype.name().into_py_any(py)?])?)?;
    }
    Ok(l)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(ops, m)?)?;
    m.add_function(wrap_pyfunction!(op_info, m)?)?;
    m.add_function(wrap_pyfunction!(infer, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    Ok(())
}
