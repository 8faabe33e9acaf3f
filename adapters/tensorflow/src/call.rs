//! TF CPU kernels: attributes read once at kernel construction, inputs as views of TF's
//! (contiguous, row-major) tensors, outputs allocated by TF (`TF_AllocateOutput`) to the shapes
//! kernel-core infers, then `op.compute` writes into them.

use crate::ffi::*;
use crate::opdef::count_attr;
use crate::shape::{dtype_from_tf, dtype_to_tf};
use kernel_core::op::OutputAllocator;
use kernel_core::{
    call, catch_panic, contiguous_strides, default_pool, numel, widen_f32_attr, ArgType,
    AttrSource, AttrValue, CallSite, DType, Error, ErrorKind, OpDef, Phase, Result, TensorMut,
    TensorRef,
};
use std::ffi::CString;
use std::os::raw::{c_char, c_void};

/// What a kernel instance keeps between calls.
pub struct KernelState {
    pub op: &'static OpDef,
    /// The bound attributes and the shapes inferred for recent input shapes.
    pub site: CallSite,
    /// Per tensor argument: present (optional lists have length 1) or absent.
    pub present: Vec<bool>,
}

pub fn status_code(kind: ErrorKind) -> TF_Code {
    match kind {
        ErrorKind::InvalidArgument => TF_INVALID_ARGUMENT,
        ErrorKind::Unsupported => TF_UNIMPLEMENTED,
        ErrorKind::Internal => TF_INTERNAL,
    }
}

/// A node's attributes at kernel construction.
struct NodeAttrs(*mut TF_OpKernelConstruction);

impl NodeAttrs {
    /// Run one `TF_OpKernelConstruction_GetAttr*` call with a fresh status.
    fn read<T>(
        &self,
        name: &str,
        what: &str,
        f: impl FnOnce(*const c_char, *mut TF_Status) -> T,
    ) -> Result<T> {
        let c = CString::new(name).map_err(|_| Error::internal("attr name"))?;
        let st = Status::new();
        let v = f(c.as_ptr(), st.0);
        if !st.ok() {
            return Err(Error::invalid(format!(
                "reading {what}attribute `{name}`: {}",
                st.message()
            )));
        }
        Ok(v)
    }
}

impl AttrSource for NodeAttrs {
    fn get(&mut self, name: &str, ty: &ArgType) -> Result<Option<AttrValue>> {
        let ctx = self.0;
        // SAFETY (every call below): `ctx` is the live construction context of this kernel,
        // names are NUL-terminated, and out-buffers have the sizes TF reported.
        let (list, total) = match ty {
            ArgType::Str | ArgType::IntList | ArgType::FloatList => {
                self.read(name, "the size of ", |n, st| {
                    let (mut list, mut total) = (0i32, 0i32);
                    unsafe {
                        TF_OpKernelConstruction_GetAttrSize(ctx, n, &mut list, &mut total, st)
                    };
                    (list.max(0) as usize, total.max(0) as usize)
                })?
            }
            _ => (0, 0),
        };
        self.read(name, "", |n, st| unsafe {
            Some(match ty {
                ArgType::Int => {
                    let mut v = 0i64;
                    TF_OpKernelConstruction_GetAttrInt64(ctx, n, &mut v, st);
                    AttrValue::Int(v)
                }
                ArgType::Float => {
                    let mut v = 0f32;
                    TF_OpKernelConstruction_GetAttrFloat(ctx, n, &mut v, st);
                    AttrValue::Float(widen_f32_attr(v))
                }
                ArgType::Bool => {
                    let mut v: TF_Bool = 0;
                    TF_OpKernelConstruction_GetAttrBool(ctx, n, &mut v, st);
                    AttrValue::Bool(v != 0)
                }
                ArgType::Str => {
                    let mut buf = vec![0u8; total + 1];
                    TF_OpKernelConstruction_GetAttrString(
                        ctx,
                        n,
                        buf.as_mut_ptr() as *mut c_char,
                        total,
                        st,
                    );
                    buf.truncate(total);
                    AttrValue::Str(String::from_utf8_lossy(&buf).into_owned())
                }
                ArgType::IntList => {
                    let mut buf = vec![0i64; list];
                    TF_OpKernelConstruction_GetAttrInt64List(
                        ctx,
                        n,
                        buf.as_mut_ptr(),
                        list as i32,
                        st,
                    );
                    AttrValue::IntList(buf)
                }
                ArgType::FloatList => {
                    let mut buf = vec![0f32; list];
                    TF_OpKernelConstruction_GetAttrFloatList(
                        ctx,
                        n,
                        buf.as_mut_ptr(),
                        list as i32,
                        st,
                    );
                    AttrValue::FloatList(buf.into_iter().map(widen_f32_attr).collect())
                }
                ArgType::Tensor | ArgType::OptionalTensor => return None,
            })
        })
    }
}

/// Read the op's attributes from the node and bind them.
pub unsafe fn read_attrs(
    op: &'static OpDef,
    ctx: *mut TF_OpKernelConstruction,
) -> Result<KernelState> {
    let mut src = NodeAttrs(ctx);
    let attrs = op.decode_attrs(&mut src)?;
    let mut present = Vec::new();
    for a in op.schema.tensor_args() {
        if a.ty == ArgType::OptionalTensor {
            let n = match src.get(&count_attr(&a.name), &ArgType::Int)? {
                Some(AttrValue::Int(n)) => n,
                _ => 0,
            };
            if n > 1 {
                return Err(Error::invalid(format!(
                    "optional input `{}` takes a list of 0 or 1 tensors, got {n}",
                    a.name
                ))
                .in_op(op.name));
            }
            present.push(n == 1);
        } else {
            present.push(true);
        }
    }
    Ok(KernelState {
        op,
        site: CallSite::new(attrs),
        present,
    })
}

/// Owned `TF_Tensor*` handles, deleted on drop (the tensors stay alive in the context).
struct Tensors(Vec<*mut TF_Tensor>);
impl Drop for Tensors {
    fn drop(&mut self) {
        for &t in &self.0 {
            // SAFETY: returned by TF_GetInput / TF_AllocateOutput, owned by us.
            unsafe { TF_DeleteTensor(t) }
        }
    }
}

unsafe fn input_view<'a>(t: *mut TF_Tensor) -> Result<TensorRef<'a>> {
    let tf_dtype = unsafe { TF_TensorType(t) };
    let dtype = dtype_from_tf(tf_dtype)
        .ok_or_else(|| Error::invalid(format!("unsupported TF dtype code {tf_dtype}")))?;
    let rank = unsafe { TF_NumDims(t) };
    let shape: Vec<usize> = (0..rank)
        .map(|d| unsafe { TF_Dim(t, d) } as usize)
        .collect();
    let ptr = unsafe { TF_TensorData(t) } as *const u8;
    let strides = contiguous_strides(&shape);
    // SAFETY: TF tensors are dense row-major buffers of `shape`, alive for the compute call.
    Ok(unsafe { TensorRef::from_raw(dtype, shape, strides, ptr) })
}

/// Outputs allocated by TF (`TF_AllocateOutput`); the handles are released on drop, the
/// tensors stay in the context.
struct TfOutputs {
    ctx: *mut TF_OpKernelContext,
    keep: Tensors,
}

impl<'a> OutputAllocator<'a> for TfOutputs {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        // Dims on the stack for the usual ranks (this runs on every call).
        let mut small = [0i64; 8];
        let heap: Vec<i64>;
        let dims: &[i64] = if shape.len() <= small.len() {
            for (d, &s) in small.iter_mut().zip(shape) {
                *d = s as i64;
            }
            &small[..shape.len()]
        } else {
            heap = shape.iter().map(|&d| d as i64).collect();
            &heap
        };
        let st = Status::new();
        // SAFETY: the kernel context is live for the compute call that made `self`; the byte
        // size was overflow-checked by kernel-core's call path.
        let t = unsafe {
            TF_AllocateOutput(
                self.ctx,
                index as i32,
                dtype_to_tf(dtype),
                dims.as_ptr(),
                dims.len() as i32,
                numel(shape) * dtype.size(),
                st.0,
            )
        };
        if !st.ok() || t.is_null() {
            return Err(Error::internal(format!(
                "TF_AllocateOutput({index}, {shape:?}) failed: {}",
                st.message()
            )));
        }
        self.keep.0.push(t);
        // SAFETY: TF allocated a dense buffer of this shape and dtype for output `index`.
        Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, TF_TensorData(t) as *mut u8) })
    }
}

/// One compute call.
pub unsafe fn compute(st: &KernelState, ctx: *mut TF_OpKernelContext) -> Result<()> {
    // SAFETY: `ctx` is the live context of this compute call.
    let n = unsafe { TF_NumInputs(ctx) } as usize;
    let expected = st.present.iter().filter(|p| **p).count();
    if n != expected {
        return Err(Error::internal(format!(
            "TF passed {n} input tensors, the node declares {expected}"
        )));
    }
    let mut ins = Tensors(Vec::with_capacity(n));
    let s = Status::new();
    for i in 0..n {
        let mut t: *mut TF_Tensor = std::ptr::null_mut();
        // SAFETY: i < the context's input count.
        unsafe { TF_GetInput(ctx, i as i32, &mut t, s.0) };
        if !s.ok() || t.is_null() {
            return Err(Error::internal(format!(
                "TF_GetInput({i}): {}",
                s.message()
            )));
        }
        ins.0.push(t);
    }
    let mut flat = ins.0.iter();
    let views = st
        .present
        .iter()
        // SAFETY: each handle is a live input tensor of this call.
        .map(|&p| {
            p.then(|| unsafe { input_view(*flat.next().expect("counted")) })
                .transpose()
        })
        .collect::<Result<Vec<_>>>()?;
    let mut outs = TfOutputs {
        ctx,
        keep: Tensors(Vec::new()),
    };
    call::run(
        st.op,
        &views,
        &st.site,
        &mut outs,
        default_pool(),
        Phase::Compute,
    )
}

pub unsafe extern "C" fn compute_tramp(state: *mut c_void, ctx: *mut TF_OpKernelContext) {
    if state.is_null() {
        return;
    }
    // SAFETY: created by create_tramp as a Box<KernelState>.
    let st = unsafe { &*(state as *const KernelState) };
    let r = catch_panic(st.op.name, || unsafe { compute(st, ctx) });
    if let Err(e) = r {
        let e = e.in_op(st.op.name);
        let s = Status::new();
        unsafe { set_status(s.0, status_code(e.kind), &e.to_string()) };
        unsafe { TF_OpKernelContext_Failure(ctx, s.0) };
    }
}

pub unsafe extern "C" fn delete_tramp(state: *mut c_void) {
    if !state.is_null() {
        // SAFETY: created by create_tramp as a Box<KernelState>.
        drop(unsafe { Box::from_raw(state as *mut KernelState) });
    }
}

/// Kernel construction for the op in slot `slot`.
pub unsafe fn create(slot: usize, ctx: *mut TF_OpKernelConstruction) -> *mut c_void {
    let Some(op) = crate::op_at(slot) else {
        let s = Status::new();
        unsafe { set_status(s.0, TF_INTERNAL, "polyop: kernel slot without an op") };
        unsafe { TF_OpKernelConstruction_Failure(ctx, s.0) };
        return std::ptr::null_mut();
    };
    match catch_panic(op.name, || unsafe { read_attrs(op, ctx) }) {
        Ok(st) => Box::into_raw(Box::new(st)) as *mut c_void,
        Err(e) => {
            let e = e.in_op(op.name);
            let s = Status::new();
            unsafe { set_status(s.0, status_code(e.kind), &e.to_string()) };
            unsafe { TF_OpKernelConstruction_Failure(ctx, s.0) };
            std::ptr::null_mut()
        }
    }
}
