//! TF CPU kernels: attributes read once at kernel construction, inputs as views of TF's
//! (contiguous, row-major) tensors, outputs allocated by TF (`TF_AllocateOutput`) to the shapes
//! kernel-core infers, then `op.compute` writes into them.

use crate::ffi::*;
use crate::opdef::count_attr;
use crate::shape::{dtype_from_tf, dtype_to_tf};
use kernel_core::op::InferCache;
use kernel_core::{
    catch_panic, contiguous_strides, default_pool, numel, widen_f32_attr, ArgType, AttrValue,
    Attrs, DType, Error, ErrorKind, KernelCtx, OpDef, OutputAllocator, Result, TensorMut,
    TensorRef,
};
use std::ffi::CString;
use std::os::raw::{c_char, c_void};

/// What a kernel instance keeps between calls.
pub struct KernelState {
    pub op: &'static OpDef,
    pub attrs: Attrs,
    /// Per tensor argument: present (optional lists have length 1) or absent.
    pub present: Vec<bool>,
    /// Output shapes inferred for recent input shapes (a repeated call skips inference).
    pub cache: InferCache,
}

pub fn status_code(kind: ErrorKind) -> TF_Code {
    match kind {
        ErrorKind::InvalidArgument => TF_INVALID_ARGUMENT,
        ErrorKind::Unsupported => TF_UNIMPLEMENTED,
        ErrorKind::Internal => TF_INTERNAL,
    }
}

unsafe fn attr_error(what: &str, name: &str, st: &Status) -> Error {
    Error::invalid(format!(
        "reading {what} attribute `{name}`: {}",
        st.message()
    ))
}

/// Read the op's attributes from the node and bind them.
pub unsafe fn read_attrs(
    op: &'static OpDef,
    ctx: *mut TF_OpKernelConstruction,
) -> Result<KernelState> {
    let mut given: Vec<(&str, AttrValue)> = Vec::new();
    for a in op.schema.attr_args() {
        let name = CString::new(a.name.as_str()).map_err(|_| Error::internal("attr name"))?;
        let st = Status::new();
        let v = match a.ty {
            ArgType::Int => {
                let mut v = 0i64;
                unsafe { TF_OpKernelConstruction_GetAttrInt64(ctx, name.as_ptr(), &mut v, st.0) };
                AttrValue::Int(v)
            }
            ArgType::Float => {
                let mut v = 0f32;
                unsafe { TF_OpKernelConstruction_GetAttrFloat(ctx, name.as_ptr(), &mut v, st.0) };
                AttrValue::Float(widen_f32_attr(v))
            }
            ArgType::Bool => {
                let mut v: TF_Bool = 0;
                unsafe { TF_OpKernelConstruction_GetAttrBool(ctx, name.as_ptr(), &mut v, st.0) };
                AttrValue::Bool(v != 0)
            }
            ArgType::Str | ArgType::IntList | ArgType::FloatList => {
                let (mut list, mut total) = (0i32, 0i32);
                unsafe {
                    TF_OpKernelConstruction_GetAttrSize(
                        ctx,
                        name.as_ptr(),
                        &mut list,
                        &mut total,
                        st.0,
                    )
                };
                if !st.ok() {
                    return Err(unsafe { attr_error("the size of", &a.name, &st) });
                }
                match a.ty {
                    ArgType::Str => {
                        let mut buf = vec![0u8; total.max(0) as usize + 1];
                        unsafe {
                            TF_OpKernelConstruction_GetAttrString(
                                ctx,
                                name.as_ptr(),
                                buf.as_mut_ptr() as *mut c_char,
                                total.max(0) as usize,
                                st.0,
                            )
                        };
                        buf.truncate(total.max(0) as usize);
                        AttrValue::Str(String::from_utf8_lossy(&buf).into_owned())
                    }
                    ArgType::IntList => {
                        let mut buf = vec![0i64; list.max(0) as usize];
                        unsafe {
                            TF_OpKernelConstruction_GetAttrInt64List(
                                ctx,
                                name.as_ptr(),
                                buf.as_mut_ptr(),
                                list,
                                st.0,
                            )
                        };
                        AttrValue::IntList(buf)
                    }
                    _ => {
                        let mut buf = vec![0f32; list.max(0) as usize];
                        unsafe {
                            TF_OpKernelConstruction_GetAttrFloatList(
                                ctx,
                                name.as_ptr(),
                                buf.as_mut_ptr(),
                                list,
                                st.0,
                            )
                        };
                        AttrValue::FloatList(buf.into_iter().map(widen_f32_attr).collect())
                    }
                }
            }
            ArgType::Tensor | ArgType::OptionalTensor => unreachable!(),
        };
        if !st.ok() {
            return Err(unsafe { attr_error("", &a.name, &st) });
        }
        given.push((a.name.as_str(), v));
    }
    let attrs = op.bind_attrs(given)?;
    let mut present = Vec::new();
    for a in op.schema.tensor_args() {
        if a.ty == ArgType::OptionalTensor {
            let name = CString::new(count_attr(&a.name)).map_err(|_| Error::internal("name"))?;
            let st = Status::new();
            let mut n = 0i64;
            unsafe { TF_OpKernelConstruction_GetAttrInt64(ctx, name.as_ptr(), &mut n, st.0) };
            if !st.ok() {
                return Err(unsafe { attr_error("", &count_attr(&a.name), &st) });
            }
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
        attrs,
        present,
        cache: InferCache::new(),
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

unsafe fn allocate(
    ctx: *mut TF_OpKernelContext,
    keep: &mut Tensors,
    index: usize,
    dtype: DType,
    shape: &[usize],
) -> Result<TensorMut<'static>> {
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
    let t = unsafe {
        TF_AllocateOutput(
            ctx,
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
    keep.0.push(t);
    let ptr = unsafe { TF_TensorData(t) } as *mut u8;
    // SAFETY: TF allocated a dense buffer of this shape and dtype for output `index`.
    Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, ptr) })
}

struct TfAllocator<'k> {
    ctx: *mut TF_OpKernelContext,
    keep: &'k mut Tensors,
    done: Vec<bool>,
}

impl<'a> OutputAllocator<'a> for TfAllocator<'_> {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        if self.done.get(index).copied().unwrap_or(true) {
            return Err(Error::internal(format!(
                "output {index} allocated twice or out of range"
            )));
        }
        self.done[index] = true;
        // SAFETY: the context outlives the compute call.
        unsafe { allocate(self.ctx, self.keep, index, dtype, shape) }
    }
}

/// One compute call.
pub unsafe fn compute(st: &KernelState, ctx: *mut TF_OpKernelContext) -> Result<()> {
    let op = st.op;
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
        unsafe { TF_GetInput(ctx, i as i32, &mut t, s.0) };
        if !s.ok() || t.is_null() {
            return Err(Error::internal(format!(
                "TF_GetInput({i}): {}",
                s.message()
            )));
        }
        ins.0.push(t);
    }
    let mut views: Vec<Option<TensorRef>> = Vec::with_capacity(st.present.len());
    let mut flat = 0;
    for &p in &st.present {
        if p {
            views.push(Some(unsafe { input_view(ins.0[flat])? }));
            flat += 1;
        } else {
            views.push(None);
        }
    }
    let specs = op.infer_concrete_cached(&st.cache, &views, &st.attrs)?;
    let pool = default_pool();
    let mut outs = Tensors(Vec::new());
    if op.flags.data_dependent_shape {
        let mut alloc = TfAllocator {
            ctx,
            keep: &mut outs,
            done: vec![false; specs.len()],
        };
        let mut none: [TensorMut; 0] = [];
        {
            let mut kctx =
                KernelCtx::new(op, &views, &mut none, &st.attrs, pool).with_allocator(&mut alloc);
            op.compute(&mut kctx)?;
        }
        if let Some(i) = alloc.done.iter().position(|d| !d) {
            return Err(Error::internal(format!(
                "kernel did not allocate output {i}"
            )));
        }
        return Ok(());
    }
    let mut out_views = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let shape = s
            .shape
            .as_deref()
            .ok_or_else(|| Error::internal("shape inference left a dim unknown"))?;
        out_views.push(unsafe { allocate(ctx, &mut outs, i, s.dtype, shape)? });
    }
    let mut kctx = KernelCtx::new(op, &views, &mut out_views, &st.attrs, pool);
    op.compute(&mut kctx)
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
