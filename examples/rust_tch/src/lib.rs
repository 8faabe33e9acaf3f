//! `polyop_tch`: call the ops of any polyop torch library (`libpolyop_torch.so`, or an
//! author's, built with `polyop_torch::export!`) on `tch::Tensor`s, through the torch
//! dispatcher: the library's own CPU/Meta kernels, shape checks and error messages apply.
//!
//! ```no_run
//! # fn main() -> Result<(), polyop_tch::Error> {
//! use polyop_tch::{Attr, Library};
//! use tch::Tensor;
//! let ops = Library::load("target/release/libpolyop_torch.so")?;
//! let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0]).reshape([1, 3]);
//! let y = ops.call1("gelu", &[Some(&x)], &[("approximate", Attr::from("tanh"))])?;
//! let vi = ops.call("topk", &[Some(&x)], &[("k", Attr::Int(2))])?; // [values, indices]
//! # Ok(()) }
//! ```
//!
//! Nothing here names an op: the schema (argument order, attribute types, defaults) and the
//! backward wiring come from the library's `polyop_library_info` JSON.
//!
//! **Autograd**: torch's own. [`Library::load`] registers, for every op that does not mutate
//! its input, a kernel at the op's Autograd dispatch key (`src/autograd.cpp`, compiled against
//! the libtorch C++ API tch links). Called on tensors that require grad (with grad mode on), an
//! op records a graph node, so `loss.backward()` / `Tensor::run_backward` reach polyop ops
//! like tch's built-in ones; the node calls the backward op the op's metadata names, with the
//! grads, saved inputs/outputs and forward attributes it lists, as `polyop.torch`'s
//! `register_autograd` glue does in Python. Backward through an op that declares no backward
//! op is an error naming it. In-place ops (`relu_`) record nothing and refuse inputs that
//! require grad. [`Library::backward`] computes the same gradients for one op directly.
//!
//! That glue is C++ against torch's unstable C++ API, so it is tied to the torch version tch
//! pins (2.13), unlike the polyop library itself, which uses only torch's stable ABI.
//!
//! Arguments go on the dispatcher's boxed stack as torch's stable ABI encodes them
//! (`torch/csrc/stable/stableivalue_conversions.h`): a tensor as a new owning
//! `AtenTensorHandle`, an absent optional tensor as 0 and a present one as a heap
//! `StableIValue*` holding the handle, an int as its i64 bits, a float as its f64 bits, a bool
//! as 0/1, a str as an owning `StringHandle`, a list as an owning `StableListHandle`. The
//! dispatcher takes ownership of every argument (it converts each into an `IValue` and
//! releases the handle) and leaves owning tensor handles for the results, which become
//! `tch::Tensor`s (a `tch` tensor is an `at::Tensor*`, which is what an `AtenTensorHandle` is).

use serde_json::Value;
use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};
use std::fmt;
use tch::Tensor;

mod ffi {
    //! The few declarations of torch's stable C shim used here (`torch/csrc/inductor/
    //! aoti_torch/c/shim.h`, `torch/csrc/stable/c/shim.h`, torch 2.13), resolved from
    //! `libtorch_cpu.so`, which torch-sys links.
    #![allow(non_camel_case_types)]
    use std::ffi::c_char;

    pub type AOTITorchError = i32;
    pub type StableIValue = u64;
    pub type AtenTensorHandle = *mut std::ffi::c_void;
    pub type StringHandle = *mut std::ffi::c_void;
    pub type StableListHandle = *mut std::ffi::c_void;
    pub const SUCCESS: AOTITorchError = 0;

    extern "C" {
        pub fn aoti_torch_new_tensor_handle(
            orig: AtenTensorHandle,
            new: *mut AtenTensorHandle,
        ) -> AOTITorchError;
        pub fn aoti_torch_delete_tensor_object(t: AtenTensorHandle) -> AOTITorchError;
        pub fn torch_new_stable_ivalue(ret: *mut *mut StableIValue) -> AOTITorchError;
        pub fn torch_delete_stable_ivalue(v: *mut StableIValue) -> AOTITorchError;
        pub fn torch_new_string_handle(
            data: *const c_char,
            len: usize,
            ret: *mut StringHandle,
        ) -> AOTITorchError;
        pub fn torch_delete_string(h: StringHandle) -> AOTITorchError;
        pub fn torch_new_list_reserve_size(n: usize, ret: *mut StableListHandle) -> AOTITorchError;
        pub fn torch_list_push_back(l: StableListHandle, v: StableIValue) -> AOTITorchError;
        pub fn torch_delete_list(l: StableListHandle) -> AOTITorchError;
        pub fn torch_call_dispatcher(
            op: *const c_char,
            overload: *const c_char,
            stack: *mut StableIValue,
            extension_build_version: u64,
        ) -> AOTITorchError;
        pub fn torch_exception_get_what_without_backtrace() -> *const c_char;
    }

    // src/autograd.cpp
    extern "C" {
        #[allow(clippy::too_many_arguments)]
        pub fn polyop_tch_register_autograd(
            ns: *const c_char,
            label: *const c_char,
            name: *const c_char,
            bwd_name: *const c_char,
            bwd_kinds: *const i32,
            bwd_index: *const u64,
            n_bwd_inputs: usize,
            bwd_outputs: *const u64,
            n_bwd_outputs: usize,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
    }
}

/// The stable-ABI version these calls are written against (torch 2.13, `TORCH_VERSION_2_13_0`
/// of `torch/csrc/stable/version.h`; polyop's libraries target the same).
const EXTENSION_BUILD_VERSION: u64 = (2 << 56) | (13 << 48);

/// An error: polyop's (or torch's) message for a bad call, or a load failure.
#[derive(Debug, Clone)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// An attribute value. An `Int` is accepted for a `float` attribute, a single `Int` for an
/// `int[]` one (repeated to the schema's fixed length, e.g. `int[2]`).
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
}

impl From<i64> for Attr {
    fn from(v: i64) -> Self {
        Attr::Int(v)
    }
}
impl From<f64> for Attr {
    fn from(v: f64) -> Self {
        Attr::Float(v)
    }
}
impl From<bool> for Attr {
    fn from(v: bool) -> Self {
        Attr::Bool(v)
    }
}
impl From<&str> for Attr {
    fn from(v: &str) -> Self {
        Attr::Str(v.to_string())
    }
}
impl From<Vec<i64>> for Attr {
    fn from(v: Vec<i64>) -> Self {
        Attr::Ints(v)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum AttrType {
    Int,
    Float,
    Bool,
    Str,
    /// `int[]` / `int[N]` (Some(N))
    Ints(Option<usize>),
    Floats(Option<usize>),
}

#[derive(Debug, Clone)]
enum ArgKind {
    Tensor,
    OptionalTensor,
    Attr { ty: AttrType, default: Option<Attr> },
}

#[derive(Debug, Clone)]
struct Arg {
    name: String,
    kind: ArgKind,
}

/// One op of a library: its schema as the dispatcher's boxed stack wants it.
#[derive(Debug)]
struct Op {
    qualified: CString,
    args: Vec<Arg>,
    num_outputs: usize,
    info: Value,
    /// Has an Autograd-key kernel (every op but the in-place ones).
    autograd: bool,
}

/// A loaded polyop torch library: its ops registered in this process's torch dispatcher.
pub struct Library {
    namespace: String,
    label: String,
    ops: BTreeMap<String, Op>,
    info: Value,
}

/// A borrowed `tch::Tensor` as an owning handle (a new `at::Tensor` sharing the storage).
fn new_handle(t: &Tensor) -> Result<ffi::AtenTensorHandle> {
    let mut h: ffi::AtenTensorHandle = std::ptr::null_mut();
    // SAFETY: `as_ptr` is the live `at::Tensor*` of `t`; the shim only reads it (it copies the
    // tensor into a new `at::Tensor`, whose handle we own).
    let rc =
        unsafe { ffi::aoti_torch_new_tensor_handle(t.as_ptr() as ffi::AtenTensorHandle, &mut h) };
    if rc != ffi::SUCCESS || h.is_null() {
        return Err(Error(format!(
            "aoti_torch_new_tensor_handle: {}",
            last_error()
        )));
    }
    Ok(h)
}

/// The message of the exception behind the last failed shim call on this thread.
fn last_error() -> String {
    // SAFETY: returns a borrowed NUL-terminated string (valid until the next exception on this
    // thread) or null; it is copied at once.
    unsafe {
        let p = ffi::torch_exception_get_what_without_backtrace();
        if p.is_null() {
            "unknown torch error".to_string()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// What an encoded stack entry owns, released by [`Stack`]'s drop if the stack never reaches
/// the dispatcher.
enum Owned {
    Tensor(ffi::AtenTensorHandle),
    Optional(*mut ffi::StableIValue),
    Str(ffi::StringHandle),
    List(ffi::StableListHandle),
    Plain,
}

/// The boxed stack being built; owns its entries until handed to the dispatcher.
struct Stack {
    values: Vec<ffi::StableIValue>,
    owned: Vec<Owned>,
}

impl Stack {
    fn push(&mut self, v: ffi::StableIValue, o: Owned) {
        self.values.push(v);
        self.owned.push(o);
    }

    fn tensor(&mut self, t: &Tensor) -> Result<()> {
        let h = new_handle(t)?;
        self.push(h as usize as u64, Owned::Tensor(h));
        Ok(())
    }

    fn optional_tensor(&mut self, t: Option<&Tensor>) -> Result<()> {
        let Some(t) = t else {
            self.push(0, Owned::Plain); // from(std::nullopt): a null pointer
            return Ok(());
        };
        let h = new_handle(t)?;
        let mut p: *mut ffi::StableIValue = std::ptr::null_mut();
        // SAFETY: allocates one StableIValue owned by us (or by the dispatcher once passed).
        if unsafe { ffi::torch_new_stable_ivalue(&mut p) } != ffi::SUCCESS || p.is_null() {
            // SAFETY: `h` is the owning handle made above, not yet given away.
            unsafe { ffi::aoti_torch_delete_tensor_object(h) };
            return Err(Error(format!("torch_new_stable_ivalue: {}", last_error())));
        }
        // SAFETY: `p` points to the StableIValue just allocated.
        unsafe { *p = h as usize as u64 };
        self.push(p as usize as u64, Owned::Optional(p));
        Ok(())
    }

    fn attr(&mut self, a: &Attr) -> Result<()> {
        match a {
            Attr::Int(v) => self.push(*v as u64, Owned::Plain),
            Attr::Float(v) => self.push(v.to_bits(), Owned::Plain),
            Attr::Bool(v) => self.push(*v as u64, Owned::Plain),
            Attr::Str(s) => {
                let mut h: ffi::StringHandle = std::ptr::null_mut();
                // SAFETY: `s` is valid for `s.len()` bytes; the shim copies them into a new
                // string whose owning handle is written to `h`.
                let rc = unsafe {
                    ffi::torch_new_string_handle(s.as_ptr() as *const c_char, s.len(), &mut h)
                };
                if rc != ffi::SUCCESS || h.is_null() {
                    return Err(Error(format!("torch_new_string_handle: {}", last_error())));
                }
                self.push(h as usize as u64, Owned::Str(h));
            }
            Attr::Ints(_) | Attr::Floats(_) => {
                let items: Vec<u64> = match a {
                    Attr::Ints(v) => v.iter().map(|&x| x as u64).collect(),
                    Attr::Floats(v) => v.iter().map(|x| x.to_bits()).collect(),
                    _ => unreachable!(),
                };
                let mut l: ffi::StableListHandle = std::ptr::null_mut();
                // SAFETY: allocates a list whose owning handle is written to `l`.
                if unsafe { ffi::torch_new_list_reserve_size(items.len(), &mut l) } != ffi::SUCCESS
                    || l.is_null()
                {
                    return Err(Error(format!(
                        "torch_new_list_reserve_size: {}",
                        last_error()
                    )));
                }
                self.push(l as usize as u64, Owned::List(l));
                for e in items {
                    // SAFETY: `l` is the live list made above (owned by this stack).
                    if unsafe { ffi::torch_list_push_back(l, e) } != ffi::SUCCESS {
                        return Err(Error(format!("torch_list_push_back: {}", last_error())));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for o in self.owned.drain(..) {
            // SAFETY: each handle was made by this stack, is still owned by it (the dispatcher
            // call empties `owned` before it takes the entries) and is released once.
            unsafe {
                match o {
                    Owned::Tensor(h) => {
                        ffi::aoti_torch_delete_tensor_object(h);
                    }
                    Owned::Optional(p) => {
                        ffi::aoti_torch_delete_tensor_object(*p as usize as ffi::AtenTensorHandle);
                        ffi::torch_delete_stable_ivalue(p);
                    }
                    Owned::Str(h) => {
                        ffi::torch_delete_string(h);
                    }
                    Owned::List(l) => {
                        ffi::torch_delete_list(l);
                    }
                    Owned::Plain => {}
                }
            }
        }
    }
}

fn parse_attr_type(ty: &str) -> Option<AttrType> {
    let fixed = |s: &str| -> Option<Option<usize>> {
        let inner = s.strip_suffix(']')?;
        Some(inner.parse().ok())
    };
    Some(match ty {
        "int" => AttrType::Int,
        "float" => AttrType::Float,
        "bool" => AttrType::Bool,
        "str" => AttrType::Str,
        _ => {
            if let Some(r) = ty.strip_prefix("int[") {
                AttrType::Ints(fixed(r)?)
            } else if let Some(r) = ty.strip_prefix("float[") {
                AttrType::Floats(fixed(r)?)
            } else {
                return None;
            }
        }
    })
}

/// Split at top-level commas (outside brackets, parentheses and quotes).
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut quote, mut start, mut out) = (0i32, None, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[') => depth += 1,
            (None, ')' | ']') => depth -= 1,
            (None, ',') if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push(s[start..].trim());
    }
    out
}

impl Attr {
    fn from_json(v: &Value, ty: AttrType) -> Option<Attr> {
        Some(match (ty, v) {
            (AttrType::Int, _) => Attr::Int(v.as_i64()?),
            (AttrType::Float, _) => Attr::Float(v.as_f64()?),
            (AttrType::Bool, _) => Attr::Bool(v.as_bool()?),
            (AttrType::Str, _) => Attr::Str(v.as_str()?.to_string()),
            (AttrType::Ints(_), Value::Array(a)) => {
                Attr::Ints(a.iter().map(Value::as_i64).collect::<Option<_>>()?)
            }
            (AttrType::Ints(_), _) => Attr::Int(v.as_i64()?),
            (AttrType::Floats(_), Value::Array(a)) => {
                Attr::Floats(a.iter().map(Value::as_f64).collect::<Option<_>>()?)
            }
            (AttrType::Floats(_), _) => Attr::Float(v.as_f64()?),
        })
    }

    fn kind(&self) -> &'static str {
        match self {
            Attr::Int(_) => "an int",
            Attr::Float(_) => "a float",
            Attr::Bool(_) => "a bool",
            Attr::Str(_) => "a str",
            Attr::Ints(_) => "an int list",
            Attr::Floats(_) => "a float list",
        }
    }

    /// The value as the schema types it, or None when it cannot be.
    fn coerce(&self, ty: AttrType) -> Option<Attr> {
        let rep = |n: Option<usize>| n.unwrap_or(1);
        Some(match (ty, self) {
            (AttrType::Int, Attr::Int(_))
            | (AttrType::Float, Attr::Float(_))
            | (AttrType::Bool, Attr::Bool(_))
            | (AttrType::Str, Attr::Str(_))
            | (AttrType::Ints(_), Attr::Ints(_))
            | (AttrType::Floats(_), Attr::Floats(_)) => self.clone(),
            (AttrType::Float, Attr::Int(v)) => Attr::Float(*v as f64),
            (AttrType::Ints(n), Attr::Int(v)) => Attr::Ints(vec![*v; rep(n)]),
            (AttrType::Floats(n), Attr::Float(v)) => Attr::Floats(vec![*v; rep(n)]),
            (AttrType::Floats(n), Attr::Int(v)) => Attr::Floats(vec![*v as f64; rep(n)]),
            (AttrType::Floats(_), Attr::Ints(v)) => {
                Attr::Floats(v.iter().map(|&x| x as f64).collect())
            }
            _ => return None,
        })
    }
}

fn type_name(ty: AttrType) -> &'static str {
    match ty {
        AttrType::Int => "int",
        AttrType::Float => "float",
        AttrType::Bool => "bool",
        AttrType::Str => "str",
        AttrType::Ints(_) => "int[]",
        AttrType::Floats(_) => "float[]",
    }
}

impl Op {
    fn from_info(ns: &str, info: &Value) -> Result<(String, Op)> {
        let bad = |what: &str| Error(format!("polyop_library_info: {what} in {info}"));
        let name = info["name"]
            .as_str()
            .ok_or_else(|| bad("no op name"))?
            .to_string();
        let schema = info["schema"].as_str().ok_or_else(|| bad("no schema"))?;
        let open = schema.find('(').ok_or_else(|| bad("schema"))?;
        let close = schema.rfind("->").and_then(|a| schema[..a].rfind(')'));
        let close = close.ok_or_else(|| bad("schema"))?;
        let attrs = info["attrs"].as_array().ok_or_else(|| bad("attrs"))?;
        let mut args = Vec::new();
        for a in split_top(&schema[open + 1..close]) {
            let decl = a.split('=').next().unwrap_or(a).trim();
            let (ty, arg_name) = decl.rsplit_once(' ').ok_or_else(|| bad("argument"))?;
            let (ty, arg_name) = (ty.trim(), arg_name.trim().to_string());
            let kind = if ty.starts_with("Tensor?") {
                ArgKind::OptionalTensor
            } else if ty.starts_with("Tensor") {
                ArgKind::Tensor
            } else {
                let d = attrs
                    .iter()
                    .find(|d| d["name"] == arg_name.as_str())
                    .ok_or_else(|| bad("an attribute missing from attrs"))?;
                let ty = parse_attr_type(ty).ok_or_else(|| bad("an attribute type"))?;
                let default = if d["required"].as_bool() == Some(true) {
                    None
                } else {
                    Some(Attr::from_json(&d["default"], ty).ok_or_else(|| bad("a default"))?)
                };
                ArgKind::Attr { ty, default }
            };
            args.push(Arg {
                name: arg_name,
                kind,
            });
        }
        let num_outputs = info["num_outputs"]
            .as_u64()
            .ok_or_else(|| bad("num_outputs"))? as usize;
        let qualified = CString::new(format!("{ns}::{name}")).map_err(|_| bad("op name"))?;
        Ok((
            name,
            Op {
                qualified,
                args,
                num_outputs,
                autograd: info["flags"]["inplace"] != true,
                info: info.clone(),
            },
        ))
    }
}

impl Library {
    /// Load a polyop torch library into this process (its ops register with the dispatcher
    /// as `torch.ops.load_library` would) and read its metadata. The library stays loaded for
    /// the life of the process (the dispatcher holds its kernels). Needs the libtorch that
    /// `tch` links already loaded, which it is in any program using `tch`.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Library> {
        let path = path.as_ref();
        // SAFETY: loading runs the library's static initialisers, which register its ops with
        // torch's dispatcher (the library is built for this torch's stable ABI).
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| Error(format!("polyop: cannot load {}: {e}", path.display())))?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        // SAFETY: `polyop_library_info`'s signature (crates/polyop-export): a static
        // NUL-terminated JSON string, never freed.
        let info = unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn() -> *const c_char> =
                lib.get(b"polyop_library_info").map_err(|e| {
                    Error(format!(
                        "polyop: {} is not a polyop library: {e}",
                        path.display()
                    ))
                })?;
            let p = f();
            if p.is_null() {
                return Err(Error(format!(
                    "polyop: {}: no library info",
                    path.display()
                )));
            }
            CStr::from_ptr(p).to_string_lossy().into_owned()
        };
        let info: Value =
            serde_json::from_str(&info).map_err(|e| Error(format!("polyop_library_info: {e}")))?;
        if info["framework"] != "torch" {
            return Err(Error(format!(
                "polyop: {} is a {} library, not a torch one",
                path.display(),
                info["framework"]
            )));
        }
        if let Some(errs) = info["load_errors"].as_array().filter(|e| !e.is_empty()) {
            return Err(Error(format!(
                "polyop: {}: ops failed to register: {}",
                path.display(),
                Value::Array(errs.clone())
            )));
        }
        let key = info["name_key"].as_str().unwrap_or("namespace");
        let namespace = info[key].as_str().unwrap_or("polyop").to_string();
        let label = info["namespace"].as_str().unwrap_or(&namespace).to_string();
        let mut ops = BTreeMap::new();
        for o in info["ops"].as_array().into_iter().flatten() {
            let (name, op) = Op::from_info(&namespace, o)?;
            ops.insert(name, op);
        }
        let lib = Library {
            namespace,
            label,
            ops,
            info,
        };
        for (name, op) in &lib.ops {
            if op.autograd {
                lib.register_autograd(name, op)?;
            }
        }
        Ok(lib)
    }

    /// Register op `name`'s Autograd-key kernel (`src/autograd.cpp`) with its backward wiring
    /// from the metadata (none: backward through it fails naming the op).
    fn register_autograd(&self, name: &str, op: &Op) -> Result<()> {
        let err = |m: String| Error(format!("{}.{name}: autograd registration: {m}", self.label));
        let cstr = |s: &str| CString::new(s).map_err(|_| err(format!("bad name {s:?}")));
        let bwd = &op.info["backward"];
        let bad = || err(format!("bad backward metadata {bwd}"));
        let (mut kinds, mut index, mut outputs) = (Vec::new(), Vec::new(), Vec::new());
        let bwd_name = if bwd.is_null() {
            None
        } else {
            for e in bwd["inputs"].as_array().ok_or_else(bad)? {
                kinds.push(match e[0].as_str() {
                    Some("grad") => 0,
                    Some("input") => 1,
                    Some("output") => 2,
                    _ => return Err(bad()),
                });
                index.push(e[1].as_u64().ok_or_else(bad)?);
            }
            for o in bwd["outputs"].as_array().ok_or_else(bad)? {
                outputs.push(o.as_u64().ok_or_else(bad)?);
            }
            Some(cstr(bwd["op"].as_str().ok_or_else(bad)?)?)
        };
        let (ns, label, cname) = (cstr(&self.namespace)?, cstr(&self.label)?, cstr(name)?);
        let mut msg = vec![0 as c_char; 1024];
        // SAFETY: every pointer is valid for the call (NUL-terminated strings, arrays of the
        // lengths passed, a writable message buffer of `msg.len()` bytes); the C++ side copies
        // what it keeps and catches every exception.
        let rc = unsafe {
            ffi::polyop_tch_register_autograd(
                ns.as_ptr(),
                label.as_ptr(),
                cname.as_ptr(),
                bwd_name.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                kinds.as_ptr(),
                index.as_ptr(),
                kinds.len(),
                outputs.as_ptr(),
                outputs.len(),
                msg.as_mut_ptr(),
                msg.len(),
            )
        };
        if rc != 0 {
            // SAFETY: on failure the C++ side wrote a NUL-terminated message into `msg`.
            let m = unsafe { CStr::from_ptr(msg.as_ptr()) };
            return Err(err(m.to_string_lossy().into_owned()));
        }
        Ok(())
    }

    /// The torch namespace of the ops (`polyop` for the stock library).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Every op name (backward ops included).
    pub fn op_names(&self) -> impl Iterator<Item = &str> {
        self.ops.keys().map(String::as_str)
    }

    /// The library's `polyop_library_info` JSON.
    pub fn info(&self) -> &Value {
        &self.info
    }

    /// One op's metadata (schema, inputs, attrs, dtypes, flags, backward), as `polyop.op_info`.
    pub fn op_info(&self, name: &str) -> Option<&Value> {
        self.ops.get(name).map(|o| &o.info)
    }

    fn op(&self, name: &str) -> Result<&Op> {
        self.ops
            .get(name)
            .ok_or_else(|| Error(format!("{}.{name}: no such op in this library", self.label)))
    }

    /// The op's attributes resolved against its schema: every attribute, in schema order,
    /// typed as the schema says (given values coerced, the rest from defaults).
    fn resolve_attrs(&self, name: &str, op: &Op, attrs: &[(&str, Attr)]) -> Result<Vec<Attr>> {
        let err = |m: String| Error(format!("{}.{name}: {m}", self.label));
        for (n, _) in attrs {
            let known = op
                .args
                .iter()
                .any(|a| a.name == *n && matches!(a.kind, ArgKind::Attr { .. }));
            if !known {
                return Err(err(format!("unknown attribute '{n}'")));
            }
        }
        let mut out = Vec::new();
        for a in &op.args {
            let ArgKind::Attr { ty, default } = &a.kind else {
                continue;
            };
            let given: Vec<&Attr> = attrs
                .iter()
                .filter(|(n, _)| *n == a.name)
                .map(|(_, v)| v)
                .collect();
            let v = match (given.as_slice(), default) {
                ([v], _) => v.coerce(*ty).ok_or_else(|| {
                    err(format!(
                        "attribute '{}' must be {}, got {}",
                        a.name,
                        type_name(*ty),
                        v.kind()
                    ))
                })?,
                ([], Some(d)) => d.coerce(*ty).ok_or_else(|| {
                    err(format!(
                        "the default of attribute '{}' is not a {}",
                        a.name,
                        type_name(*ty)
                    ))
                })?,
                ([], None) => return Err(err(format!("missing required attribute '{}'", a.name))),
                _ => return Err(err(format!("attribute '{}' given more than once", a.name))),
            };
            out.push(v);
        }
        Ok(out)
    }

    /// Call op `name` through the dispatcher (`torch.ops.<namespace>.<name>`): `inputs` are
    /// the tensor arguments in schema order (`None`: an absent optional tensor; trailing
    /// optional ones may be left out), `attrs` the attributes by name (the rest take the
    /// schema's defaults). Returns every output (`topk`: values, then int64 indices).
    ///
    /// A bad call (wrong dtype, bad shape, bad attribute) is an `Err` with polyop's message
    /// (`polyop.topk: k=9 is out of range ...`); the process and later calls are unaffected.
    pub fn call(
        &self,
        name: &str,
        inputs: &[Option<&Tensor>],
        attrs: &[(&str, Attr)],
    ) -> Result<Vec<Tensor>> {
        let op = self.op(name)?;
        let err = |m: String| Error(format!("{}.{name}: {m}", self.label));
        let attr_values = self.resolve_attrs(name, op, attrs)?;
        let n_tensors = op
            .args
            .iter()
            .filter(|a| !matches!(a.kind, ArgKind::Attr { .. }))
            .count();
        if inputs.len() > n_tensors {
            return Err(err(format!(
                "takes {n_tensors} tensor inputs, got {}",
                inputs.len()
            )));
        }
        // In-place ops get no autograd kernel (torch refuses autograd for ops that mutate, as
        // `polyop.torch` does): an input that asks for a gradient is refused, not dropped.
        if !op.autograd {
            if let Some(i) = inputs
                .iter()
                .position(|t| t.is_some_and(Tensor::requires_grad))
            {
                return Err(err(format!(
                    "input {i} requires grad, but this in-place op records no autograd graph; \
                     pass a detached tensor"
                )));
            }
        }
        let mut stack = Stack {
            values: Vec::with_capacity(op.args.len().max(op.num_outputs)),
            owned: Vec::new(),
        };
        let (mut ti, mut ai) = (0, 0);
        for a in &op.args {
            match a.kind {
                ArgKind::Tensor => {
                    let t = inputs.get(ti).copied().flatten();
                    ti += 1;
                    stack
                        .tensor(t.ok_or_else(|| err(format!("input '{}' is required", a.name)))?)?;
                }
                ArgKind::OptionalTensor => {
                    stack.optional_tensor(inputs.get(ti).copied().flatten())?;
                    ti += 1;
                }
                ArgKind::Attr { .. } => {
                    stack.attr(&attr_values[ai])?;
                    ai += 1;
                }
            }
        }
        stack.values.resize(op.args.len().max(op.num_outputs), 0);
        // From here the dispatcher owns the arguments: it converts each entry into an IValue
        // (releasing its handle) before running the op.
        stack.owned.clear();
        // SAFETY: `qualified` names a registered op whose schema has exactly these arguments,
        // encoded as the stable ABI says; the stack has room for max(args, returns) entries.
        let rc = unsafe {
            ffi::torch_call_dispatcher(
                op.qualified.as_ptr(),
                c"".as_ptr(),
                stack.values.as_mut_ptr(),
                EXTENSION_BUILD_VERSION,
            )
        };
        if rc != ffi::SUCCESS {
            return Err(Error(last_error()));
        }
        Ok(stack.values[..op.num_outputs]
            .iter()
            // SAFETY: on success the first `num_returns` entries are new owning `at::Tensor*`
            // handles (every polyop op returns tensors), which `tch::Tensor` takes over and
            // frees once (`at_free` deletes the `at::Tensor`, as `aoti_torch_delete_tensor_object`).
            .map(|&v| unsafe { Tensor::from_ptr(v as usize as *mut torch_sys::C_tensor) })
            .collect())
    }

    /// [`Library::call`] for a single-output op.
    pub fn call1(
        &self,
        name: &str,
        inputs: &[Option<&Tensor>],
        attrs: &[(&str, Attr)],
    ) -> Result<Tensor> {
        let mut out = self.call(name, inputs, attrs)?;
        if out.len() != 1 {
            return Err(Error(format!(
                "{}.{name}: returns {} tensors, not one",
                self.label,
                out.len()
            )));
        }
        Ok(out.remove(0))
    }

    /// The gradients of op `name`'s tensor inputs, given the forward call (`inputs`, `attrs`,
    /// and its `outputs`) and the gradients of its outputs (`None`: zero). Calls the backward
    /// op the op's metadata names, with the grads / inputs / outputs it lists, and the
    /// forward attributes it takes: the same computation `polyop.torch`'s autograd
    /// registration does. `None` for an input the op does not differentiate (topk's
    /// indices) or an absent optional input.
    pub fn backward(
        &self,
        name: &str,
        inputs: &[Option<&Tensor>],
        attrs: &[(&str, Attr)],
        outputs: &[Tensor],
        grads: &[Option<&Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let op = self.op(name)?;
        let err = |m: String| Error(format!("{}.{name}: {m}", self.label));
        let bwd = &op.info["backward"];
        if bwd.is_null() {
            return Err(err(
                "this op has no gradient (it declares no backward op)".into()
            ));
        }
        let bad = || err(format!("bad backward metadata {bwd}"));
        let bwd_name = bwd["op"].as_str().ok_or_else(bad)?;
        let bwd_op = self.op(bwd_name)?;
        let n_inputs = op
            .args
            .iter()
            .filter(|a| !matches!(a.kind, ArgKind::Attr { .. }))
            .count();
        let input = |i: usize| inputs.get(i).copied().flatten();
        if outputs.len() != op.num_outputs {
            return Err(err(format!(
                "backward needs the op's {} outputs, got {}",
                op.num_outputs,
                outputs.len()
            )));
        }
        let entries: Vec<(&str, usize)> = bwd["inputs"]
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|e| Some((e[0].as_str()?, e[1].as_u64()? as usize)))
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        // zeros for the output gradients the backward op takes but the caller left out
        let zeros: Vec<Option<Tensor>> = (0..outputs.len())
            .map(|i| {
                let wanted = entries.contains(&("grad", i));
                (wanted && grads.get(i).copied().flatten().is_none())
                    .then(|| outputs[i].zeros_like())
            })
            .collect();
        let mut args: Vec<Option<&Tensor>> = Vec::new();
        for &(kind, i) in &entries {
            args.push(match kind {
                "grad" => grads
                    .get(i)
                    .copied()
                    .flatten()
                    .or(zeros.get(i).and_then(Option::as_ref)),
                "input" => input(i),
                "output" => Some(
                    outputs
                        .get(i)
                        .ok_or_else(|| err(format!("output {i} not given")))?,
                ),
                _ => return Err(bad()),
            });
        }
        // The backward op's attributes are the forward op's of the same name.
        let fwd_attrs = self.resolve_attrs(name, op, attrs)?;
        let fwd_names = op
            .args
            .iter()
            .filter(|a| matches!(a.kind, ArgKind::Attr { .. }))
            .map(|a| a.name.as_str());
        let named: Vec<(&str, Attr)> = fwd_names.zip(fwd_attrs).collect();
        let bwd_attrs: Vec<(&str, Attr)> = bwd_op
            .args
            .iter()
            .filter(|a| matches!(a.kind, ArgKind::Attr { .. }))
            .filter_map(|a| named.iter().find(|(n, _)| *n == a.name).cloned())
            .collect();
        let res = self.call(bwd_name, &args, &bwd_attrs)?;
        let mut out: Vec<Option<Tensor>> = (0..n_inputs).map(|_| None).collect();
        for (fwd_input, g) in bwd["outputs"].as_array().ok_or_else(bad)?.iter().zip(res) {
            let i = fwd_input.as_u64().ok_or_else(bad)? as usize;
            // Drop the gradients of absent optional inputs (the kernel may still produce one).
            if i < n_inputs && input(i).is_some() {
                out[i] = Some(g);
            }
        }
        Ok(out)
    }
}
