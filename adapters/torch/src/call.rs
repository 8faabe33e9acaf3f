//! The generic boxed kernel: decode the StableIValue stack against the op's schema, validate
//! and infer shapes with kernel-core, allocate outputs through torch, compute, and push the
//! outputs. One function serves every op and both dispatch keys (CPU computes; Meta only
//! allocates outputs of the inferred shapes, for FakeTensor / torch.compile / opcheck).

use crate::ffi::{self, AtenTensorHandle, StableIValue};
use crate::pool::TorchPool;
use kernel_core::op::{InferCache, OutSpec};
use kernel_core::schema::ArgType;
use kernel_core::{
    AttrValue, Attrs, DType, Error, KernelCtx, OpDef, OutputAllocator, Result, TensorMut, TensorRef,
};
use std::sync::{Arc, Mutex, OnceLock};

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

/// Data-dependent outputs (nonzero): allocated by torch once the kernel knows their shape.
struct TorchAllocator {
    device: (i32, i32),
    outputs: Vec<Option<Tensor>>,
}

impl<'a> OutputAllocator<'a> for TorchAllocator {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        let slot = self
            .outputs
            .get_mut(index)
            .ok_or_else(|| Error::internal(format!("no output {index}")))?;
        let t = empty(dtype, shape, self.device)?;
        let p = data_ptr(&t)?;
        *slot = Some(t);
        // SAFETY: a fresh contiguous torch tensor owned by `self` until pushed on the stack.
        Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, p) })
    }
}

/// Per registered op: which outputs alias an input (`Tensor(a!)` returns), and the attribute
/// sets seen recently, each bound once and with its own shape-inference cache, so that a
/// repeated call skips binding and inference.
pub(crate) struct OpState {
    pub op: &'static OpDef,
    alias_of: Vec<Option<usize>>,
    sites: Mutex<Vec<Arc<AttrSite>>>,
}

/// Attribute sets remembered per op (oldest dropped first).
const ATTR_SITES: usize = 16;

struct AttrSite {
    /// The attribute values as they came off the stack (schema order, every attribute).
    given: Vec<AttrValue>,
    attrs: Attrs,
    infer: InferCache,
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
            sites: Mutex::new(Vec::new()),
        }
    }

    /// The bound attributes for these stack values (bound on first sight).
    fn site(&self, given: Vec<(&'static str, AttrValue)>) -> Result<Arc<AttrSite>> {
        let lock = || self.sites.lock().unwrap_or_else(|e| e.into_inner());
        {
            let sites = lock();
            if let Some(site) = sites.iter().find(|s| {
                s.given.len() == given.len()
                    && s.given.iter().zip(&given).all(|(a, (_, b))| a.same_as(b))
            }) {
                return Ok(site.clone());
            }
        }
        let values: Vec<AttrValue> = given.iter().map(|(_, v)| v.clone()).collect();
        let attrs = self.op.bind_attrs(given)?;
        let site = Arc::new(AttrSite {
            given: values,
            attrs,
            infer: InferCache::new(),
        });
        let mut sites = lock();
        if sites.len() >= ATTR_SITES {
            sites.remove(0);
        }
        sites.push(site.clone());
        Ok(site)
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
        ))
        .in_op(op.name));
    }
    let (inputs, attr_values) = decode(op, stack)?;
    let site = st.site(attr_values)?;
    let attrs = &site.attrs;

    let mut infos: Vec<Option<Info>> = Vec::with_capacity(inputs.len());
    for (t, arg) in inputs.iter().zip(op.schema.tensor_args()) {
        infos.push(match t {
            Some(t) => Some(info(op, &arg.name, t)?),
            None => None,
        });
    }
    let mut device: Option<(i32, i32, usize)> = None;
    for (k, i) in infos.iter().enumerate() {
        let Some(i) = i else { continue };
        match device {
            None => device = Some((i.device_type, i.device_index, k)),
            Some((t, _, first)) if t != i.device_type => {
                let name = |j: usize| {
                    op.schema
                        .tensor_args()
                        .nth(j)
                        .map_or(String::new(), |a| a.name.clone())
                };
                return Err(Error::invalid(format!(
                    "inputs `{}` and `{}` are on different devices",
                    name(first),
                    name(k)
                ))
                .in_op(op.name));
            }
            _ => {}
        }
    }
    let Some((dev_type, dev_index, _)) = device else {
        return Err(Error::invalid("no tensor input").in_op(op.name));
    };
    let device = (dev_type, dev_index);
    let is_meta = dev_type == codes().meta;

    let refs: Vec<Option<TensorRef<'_>>> = infos.into_iter().map(|i| i.map(|i| i.view)).collect();

    // Validate everything (dtypes, shapes, attributes) before allocating or computing.
    let specs = op.infer_concrete_cached(&site.infer, &refs, attrs)?;
    let alias_of = &st.alias_of;

    let outputs: Vec<Tensor> = if is_meta {
        if op.flags.data_dependent_shape {
            return Err(Error::unsupported(
                "data-dependent output shape: the result's size depends on the input values, \
                 so it cannot be computed for meta/fake tensors (torch.compile, FakeTensor); \
                 run it eagerly, or load the ops with `polyop.torch.load()`, which registers a \
                 fake kernel giving it an unbacked symbolic size",
            )
            .in_op(op.name));
        }
        let mut outs = Vec::with_capacity(specs.len());
        for (spec, alias) in specs.iter().zip(alias_of) {
            outs.push(match alias {
                Some(i) => input_handle(&inputs, *i)?.share()?,
                None => empty(spec.dtype, concrete(op, spec)?, device)?,
            });
        }
        outs
    } else if op.flags.data_dependent_shape {
        let mut alloc = TorchAllocator {
            device,
            outputs: (0..specs.len()).map(|_| None).collect(),
        };
        {
            let mut none: [TensorMut; 0] = [];
            let pool = TorchPool;
            let mut ctx =
                KernelCtx::new(op, &refs, &mut none, attrs, &pool).with_allocator(&mut alloc);
            op.compute(&mut ctx)?;
        }
        alloc
            .outputs
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                o.ok_or_else(|| {
                    Error::internal(format!("kernel did not allocate output {i}")).in_op(op.name)
                })
            })
            .collect::<Result<_>>()?
    } else {
        let pool = TorchPool;
        let mut outs = Vec::with_capacity(specs.len());
        let mut views = Vec::with_capacity(specs.len());
        for spec in specs.iter() {
            let shape = concrete(op, spec)?;
            let t = empty(spec.dtype, shape, device)?;
            // SAFETY: a fresh contiguous tensor, exclusively ours during the kernel.
            views.push(unsafe { TensorMut::from_raw_contiguous(spec.dtype, shape, data_ptr(&t)?) });
            outs.push(t);
        }
        {
            let mut ctx = KernelCtx::new(op, &refs, &mut views, attrs, &pool);
            op.compute(&mut ctx)?;
        }
        drop(views);
        if alias_of.iter().all(Option::is_none) {
            outs
        } else {
            // In-place results: the kernel wrote out of place; copy into the aliased input
            // (only now, so a failed kernel leaves the input untouched) and return that input.
            let mut final_outs = Vec::with_capacity(outs.len());
            for (t, alias) in outs.into_iter().zip(alias_of) {
                final_outs.push(match alias {
                    Some(i) => {
                        let dst = input_handle(&inputs, *i)?;
                        // SAFETY: both handles are valid; same shape and dtype by inference.
                        check(unsafe { ffi::aoti_torch_copy_(dst.0, t.0, 0) }, "copy_")?;
                        dst.share()?
                    }
                    None => t,
                });
            }
            final_outs
        }
    };

    drop(refs);
    for (j, t) in outputs.into_iter().enumerate() {
        // SAFETY: the stack has max(num_args, num_outputs) entries; inputs were consumed.
        unsafe { *stack.add(j) = t.into_raw() as usize as StableIValue };
    }
    drop(inputs);
    Ok(())
}

fn input_handle(inputs: &[Option<Tensor>], i: usize) -> Result<&Tensor> {
    inputs
        .get(i)
        .and_then(Option::as_ref)
        .ok_or_else(|| Error::internal(format!("aliased input {i} is absent")))
}

fn concrete<'s>(op: &OpDef, spec: &'s OutSpec) -> Result<&'s [usize]> {
    spec.shape.as_deref().ok_or_else(|| {
        Error::internal("shape inference left a dimension unknown for concrete inputs")
            .in_op(op.name)
    })
}
