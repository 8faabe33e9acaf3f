//! The generic boxed kernel: decode the StableIValue stack against the op's schema, validate
//! and infer shapes with kernel-core, allocate outputs through torch, compute, and push the
//! outputs. One function serves every op and both dispatch keys (CPU computes; Meta only
//! allocates outputs of the inferred shapes, for FakeTensor / torch.compile / opcheck).

use crate::ffi::{self, AtenTensorHandle, StableIValue};
use crate::pool::TorchPool;
use kernel_core::op::OutputAllocator;
use kernel_core::schema::ArgType;
use kernel_core::{AttrValue, CallSites, DType, Error, OpDef, Phase, Result, TensorMut, TensorRef};
use std::sync::OnceLock;

/// An owning tensor handle, deleted on drop.
pub(crate) struct Tensor(AtenTensorHandle);

impl Drop for Tensor {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: we own the handle.
            unsafe { ffi::aoti_torch_delete_tensor_object(self.0) };
        }
    }
}

impl Tensor {
    fn into_raw(self) -> AtenTensorHandle {
        let h = self.0;
        std::mem::forget(self);
        h
    }
    /// A new owning handle to the same tensor.
    fn share(&self) -> Result<Tensor> {
        let mut h = std::ptr::null_mut();
        // SAFETY: self.0 is a valid handle.
        check(
            unsafe { ffi::aoti_torch_new_tensor_handle(self.0, &mut h) },
            "new_tensor_handle",
        )?;
        Ok(Tensor(h))
    }
}

fn check(rc: i32, what: &str) -> Result<()> {
    if rc == ffi::SUCCESS {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "torch call `{what}` failed: {}",
            ffi::last_error()
        )))
    }
}

/// Shim constants (dtype and device codes are runtime values, not part of the ABI).
struct Codes {
    cpu: i32,
    meta: i32,
    cuda: i32,
    dtypes: [(i32, DType); 7],
    others: [(i32, &'static str); 5],
}

fn codes() -> &'static Codes {
    static C: OnceLock<Codes> = OnceLock::new();
    // SAFETY: constant getters without arguments.
    C.get_or_init(|| unsafe {
        Codes {
            cpu: ffi::aoti_torch_device_type_cpu(),
            meta: ffi::aoti_torch_device_type_meta(),
            cuda: ffi::aoti_torch_device_type_cuda(),
            dtypes: [
                (ffi::aoti_torch_dtype_float16(), DType::F16),
                (ffi::aoti_torch_dtype_bfloat16(), DType::BF16),
                (ffi::aoti_torch_dtype_float32(), DType::F32),
                (ffi::aoti_torch_dtype_float64(), DType::F64),
                (ffi::aoti_torch_dtype_int32(), DType::I32),
                (ffi::aoti_torch_dtype_int64(), DType::I64),
                (ffi::aoti_torch_dtype_bool(), DType::Bool),
            ],
            others: [
                (ffi::aoti_torch_dtype_uint8(), "uint8"),
                (ffi::aoti_torch_dtype_int8(), "int8"),
                (ffi::aoti_torch_dtype_int16(), "int16"),
                (ffi::aoti_torch_dtype_complex64(), "complex64"),
                (ffi::aoti_torch_dtype_complex128(), "complex128"),
            ],
        }
    })
}

fn dtype_from_code(code: i32) -> std::result::Result<DType, String> {
    let c = codes();
    if let Some((_, d)) = c.dtypes.iter().find(|(k, _)| *k == code) {
        return Ok(*d);
    }
    Err(c
        .others
        .iter()
        .find(|(k, _)| *k == code)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| format!("<torch dtype code {code}>")))
}

fn code_from_dtype(d: DType) -> i32 {
    codes()
        .dtypes
        .iter()
        .find(|(_, k)| *k == d)
        .map(|(c, _)| *c)
        .expect("every DType has a torch code")
}

/// One input tensor: its device and a view of it.
struct Info<'a> {
    device_type: i32,
    device_index: i32,
    view: TensorRef<'a>,
}

fn info<'a>(op: &OpDef, name: &str, t: &'a Tensor) -> Result<Info<'a>> {
    let h = t.0;
    let (mut dim, mut sizes, mut strides) = (0i64, std::ptr::null_mut(), std::ptr::null_mut());
    let (mut dt, mut dev, mut idx) = (0i32, 0i32, 0i32);
    // SAFETY: valid handle, plain out-parameters; sizes/strides are borrowed arrays of `dim`.
    unsafe {
        check(ffi::aoti_torch_get_dtype(h, &mut dt), "get_dtype")?;
        check(
            ffi::aoti_torch_get_device_type(h, &mut dev),
            "get_device_type",
        )?;
        check(
            ffi::aoti_torch_get_device_index(h, &mut idx),
            "get_device_index",
        )?;
        check(ffi::aoti_torch_get_dim(h, &mut dim), "get_dim")?;
        check(ffi::aoti_torch_get_sizes(h, &mut sizes), "get_sizes")?;
        check(ffi::aoti_torch_get_strides(h, &mut strides), "get_strides")?;
    }
    let c = codes();
    if dev != c.cpu && dev != c.meta {
        let what = if dev == c.cuda {
            "cuda".to_string()
        } else {
            format!("device type {dev}")
        };
        return Err(Error::unsupported(format!(
            "input `{name}` is on {what}; polyop's torch kernels run on CPU tensors only"
        ))
        .in_op(op.name));
    }
    let dtype = dtype_from_code(dt).map_err(|n| {
        Error::invalid(format!(
            "unsupported dtype {n} for input `{name}` (supported: {})",
            op.dtypes
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .in_op(op.name)
    })?;
    let n = dim as usize;
    let (shape, strides) = if n == 0 {
        (vec![], vec![])
    } else {
        // SAFETY: torch returns arrays of length dim, valid while the tensor lives.
        unsafe {
            (
                std::slice::from_raw_parts(sizes, n)
                    .iter()
                    .map(|&s| s as usize)
                    .collect(),
                std::slice::from_raw_parts(strides, n)
                    .iter()
                    .map(|&s| s as isize)
                    .collect(),
            )
        }
    };
    let mut ptr = std::ptr::null_mut();
    if dev == c.cpu {
        // SAFETY: valid handle; data_ptr already includes the storage offset.
        check(
            unsafe { ffi::aoti_torch_get_data_ptr(h, &mut ptr) },
            "get_data_ptr",
        )?;
    }
    Ok(Info {
        device_type: dev,
        device_index: idx,
        // SAFETY: the handle `t` keeps the storage alive while the view is used; torch strides
        // are in elements; meta tensors carry no data and are never read.
        view: unsafe { TensorRef::from_raw(dtype, shape, strides, ptr as *const u8) },
    })
}

fn empty(dtype: DType, shape: &[usize], device: (i32, i32)) -> Result<Tensor> {
    // Sizes and contiguous strides on the stack for the usual ranks (this runs every call).
    const SMALL: usize = 8;
    let (mut sz, mut st) = ([0i64; SMALL], [0i64; SMALL]);
    let (heap_sz, heap_st): (Vec<i64>, Vec<i64>);
    let (sizes, strides): (&[i64], &[i64]) = if shape.len() <= SMALL {
        let mut acc = 1i64;
        for (i, &d) in shape.iter().enumerate().rev() {
            sz[i] = d as i64;
            st[i] = acc;
            acc *= (d as i64).max(1);
        }
        (&sz[..shape.len()], &st[..shape.len()])
    } else {
        heap_sz = shape.iter().map(|&s| s as i64).collect();
        heap_st = kernel_core::contiguous_strides(shape)
            .into_iter()
            .map(|s| s as i64)
            .collect();
        (&heap_sz, &heap_st)
    };
    let mut h = std::ptr::null_mut();
    // SAFETY: arrays of length ndim; out-parameter.
    check(
        unsafe {
            ffi::aoti_torch_empty_strided(
                sizes.len() as i64,
                sizes.as_ptr(),
                strides.as_ptr(),
                code_from_dtype(dtype),
                device.0,
                device.1,
                &mut h,
            )
        },
        "empty_strided",
    )?;
    Ok(Tensor(h))
}

fn data_ptr(t: &Tensor) -> Result<*mut u8> {
    let mut p = std::ptr::null_mut();
    // SAFETY: valid handle.
    check(
        unsafe { ffi::aoti_torch_get_data_ptr(t.0, &mut p) },
        "get_data_ptr",
    )?;
    Ok(p as *mut u8)
}

/// Take ownership of every argument on the stack (so each is released whatever happens next),
/// turning tensors into owning handles and attributes into [`AttrValue`]s.
fn decode(op: &'static OpDef, stack: *mut StableIValue) -> Result<DecodedArgs> {
    let mut tensors = Vec::new();
    let mut attrs = Vec::new();
    let mut first_err = None;
    for (i, arg) in op.schema.args.iter().enumerate() {
        // SAFETY: torch passes a stack of at least num_args entries (checked by the caller).
        let v = unsafe { *stack.add(i) };
        let r = decode_one(&arg.ty, v);
        match r {
            Ok(Decoded::Tensor(t)) => tensors.push(t),
            Ok(Decoded::Attr(a)) => attrs.push((arg.name.as_str(), a)),
            Err(e) => {
                if arg.ty.is_tensor() {
                    tensors.push(None);
                }
                first_err.get_or_insert(e.in_op(op.name));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok((tensors, attrs)),
    }
}

/// Tensor inputs (None = absent optional) and attributes by name.
type DecodedArgs = (Vec<Option<Tensor>>, Vec<(&'static str, AttrValue)>);

enum Decoded {
    Tensor(Option<Tensor>),
    Attr(AttrValue),
}

fn decode_one(ty: &ArgType, v: StableIValue) -> Result<Decoded> {
    Ok(match ty {
        ArgType::Tensor => Decoded::Tensor(Some(Tensor(v as usize as AtenTensorHandle))),
        ArgType::OptionalTensor => {
            if v == 0 {
                Decoded::Tensor(None)
            } else {
                let p = v as usize as *mut StableIValue;
                // SAFETY: a present optional is a heap StableIValue we now own.
                let inner = unsafe { *p };
                let t = Tensor(inner as usize as AtenTensorHandle);
                check(
                    unsafe { ffi::torch_delete_stable_ivalue(p) },
                    "delete_stable_ivalue",
                )?;
                Decoded::Tensor(Some(t))
            }
        }
        ArgType::Int => Decoded::Attr(AttrValue::Int(v as i64)),
        ArgType::Float => Decoded::Attr(AttrValue::Float(f64::from_bits(v))),
        ArgType::Bool => Decoded::Attr(AttrValue::Bool(v & 0xff != 0)),
        ArgType::Str => {
            let h = v as usize as ffi::StringHandle;
            let (mut len, mut data) = (0usize, std::ptr::null());
            // SAFETY: an owning string handle; read then release it.
            let s = unsafe {
                let ok = ffi::torch_string_length(h, &mut len) == ffi::SUCCESS
                    && ffi::torch_string_c_str(h, &mut data) == ffi::SUCCESS;
                let s = if ok && !data.is_null() {
                    Some(
                        String::from_utf8_lossy(std::slice::from_raw_parts(data as *const u8, len))
                            .into_owned(),
                    )
                } else {
                    None
                };
                ffi::torch_delete_string(h);
                s
            };
            Decoded::Attr(AttrValue::Str(s.ok_or_else(|| {
                Error::internal(format!("reading a str argument: {}", ffi::last_error()))
            })?))
        }
        ArgType::IntList | ArgType::FloatList => {
            let h = v as usize as ffi::StableListHandle;
            let mut n = 0usize;
            let mut items = Vec::new();
            // SAFETY: an owning list handle; read then release it.
            let ok = unsafe {
                let mut ok = ffi::torch_list_size(h, &mut n) == ffi::SUCCESS;
                for i in 0..n {
                    let mut e = 0u64;
                    ok &= ffi::torch_list_get_item(h, i, &mut e) == ffi::SUCCESS;
                    items.push(e);
                }
                ffi::torch_delete_list(h);
                ok
            };
            if !ok {
                return Err(Error::internal(format!(
                    "reading a list argument: {}",
                    ffi::last_error()
                )));
            }
            Decoded::Attr(if *ty == ArgType::IntList {
                AttrValue::IntList(items.into_iter().map(|e| e as i64).collect())
            } else {
                AttrValue::FloatList(items.into_iter().map(f64::from_bits).collect())
            })
        }
    })
}

/// Outputs allocated by torch (`empty_strided` on the inputs' device), kept as owning handles
/// until they are pushed on the stack.
struct TorchOutputs {
    device: (i32, i32),
    outputs: Vec<Tensor>,
}

impl<'a> OutputAllocator<'a> for TorchOutputs {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        if index != self.outputs.len() {
            return Err(Error::internal(format!(
                "output {index} allocated out of order"
            )));
        }
        let t = empty(dtype, shape, self.device)?;
        let p = data_ptr(&t)?;
        self.outputs.push(t);
        // SAFETY: a fresh contiguous torch tensor (null data on meta, never written), owned
        // by `self` until pushed on the stack.
        Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, p) })
    }
}

/// Per registered op: which outputs alias an input (`Tensor(a!)` returns), and its call sites
/// (attributes bound once per distinct attribute set, each with its inference cache).
pub(crate) struct OpState {
    pub op: &'static OpDef,
    alias_of: Vec<Option<usize>>,
    sites: CallSites,
}

impl OpState {
    pub(crate) fn new(op: &'static OpDef) -> Self {
        let alias_of = op
            .schema
            .returns
            .iter()
            .map(|r| {
                r.alias.as_ref().and_then(|al| {
                    op.schema
                        .tensor_args()
                        .position(|a| a.alias.as_ref().is_some_and(|b| b.set == al.set))
                })
            })
            .collect();
        OpState {
            op,
            alias_of,
            sites: CallSites::new(),
        }
    }
}

/// Run `op` on a boxed stack. On success the first `num_outputs` stack entries hold owning
/// output handles; on error nothing was written and every input has been released.
pub(crate) fn call(
    st: &OpState,
    stack: *mut StableIValue,
    num_args: u64,
    num_outputs: u64,
) -> Result<()> {
    let op = st.op;
    if num_args as usize != op.schema.args.len() || num_outputs as usize != op.num_outputs() {
        // Cannot happen for a schema we registered; refuse rather than guess the stack.
        return Err(Error::internal(format!(
            "stack has {num_args} args / {num_outputs} outputs, schema `{}` disagrees",
            op.schema
        )));
    }
    let (inputs, given) = decode(op, stack)?;
    let site = st.sites.get_or_bind(
        |key| {
            given.iter().for_each(|(_, v)| v.write_key(key));
            true
        },
        || op.bind_attrs(given.iter().map(|(n, v)| (*n, v.clone()))),
    )?;

    let mut infos: Vec<Option<Info>> = Vec::with_capacity(inputs.len());
    for (t, arg) in inputs.iter().zip(op.schema.tensor_args()) {
        infos.push(match t {
            Some(t) => Some(info(op, &arg.name, t)?),
            None => None,
        });
    }
    let mut device: Option<(i32, i32, &str)> = None;
    for (i, arg) in infos.iter().zip(op.schema.tensor_args()) {
        let Some(i) = i else { continue };
        match device {
            None => device = Some((i.device_type, i.device_index, &arg.name)),
            Some((t, _, first)) if t != i.device_type => {
                return Err(Error::invalid(format!(
                    "inputs `{first}` and `{}` are on different devices",
                    arg.name
                )));
            }
            _ => {}
        }
    }
    let Some((dev_type, dev_index, _)) = device else {
        return Err(Error::invalid("no tensor input"));
    };
    let is_meta = dev_type == codes().meta;
    let refs: Vec<Option<TensorRef<'_>>> = infos.into_iter().map(|i| i.map(|i| i.view)).collect();
    let mut outs = TorchOutputs {
        device: (dev_type, dev_index),
        outputs: Vec::with_capacity(op.num_outputs()),
    };
    let phase = if is_meta {
        Phase::ShapesOnly
    } else {
        Phase::Compute
    };
    kernel_core::call::run(op, &refs, &site, &mut outs, &TorchPool, phase).map_err(|e| {
        if is_meta && op.flags.data_dependent_shape {
            Error::unsupported(format!(
                "{} (torch.compile, FakeTensor): run it eagerly, or load the ops with \
                 `polyop.torch.load()`, which registers a fake kernel giving it an unbacked \
                 symbolic size",
                e.message
            ))
        } else {
            e
        }
    })?;
    drop(refs);
    // In-place results: the kernel wrote out of place; copy into the aliased input (only now,
    // so a failed kernel leaves the input untouched) and return that input (on meta, just
    // return the input).
    let mut outputs = Vec::with_capacity(outs.outputs.len());
    for (t, alias) in outs.outputs.into_iter().zip(&st.alias_of) {
        outputs.push(match alias {
            None => t,
            Some(i) => {
                let dst = inputs
                    .get(*i)
                    .and_then(Option::as_ref)
                    .ok_or_else(|| Error::internal(format!("aliased input {i} is absent")))?;
                if !is_meta {
                    // SAFETY: both handles are valid; same shape and dtype by inference.
                    check(unsafe { ffi::aoti_torch_copy_(dst.0, t.0, 0) }, "copy_")?;
                }
                dst.share()?
            }
        });
    }
    for (j, t) in outputs.into_iter().enumerate() {
        // SAFETY: the stack has max(num_args, num_outputs) entries; inputs were consumed.
        unsafe { *stack.add(j) = t.into_raw() as usize as StableIValue };
    }
    drop(inputs);
    Ok(())
}
