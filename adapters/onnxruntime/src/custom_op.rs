//! One `OrtCustomOp` per (op, dtype) plus a dtype-generic fallback per op, all generated from
//! kernel-core [`OpDef`]s. Nothing here knows a particular op.
//!
//! Typing: ONNX Runtime merges every `OrtCustomOp` registered under one name into one schema
//! whose input `i` accepts the union of the types the ops declare for `i`, and picks output
//! types by matching the node's input types against each op's declared types in registration
//! order. So for each op we register
//!
//! 1. one op per dtype `d` of the type variable `T` (inputs/outputs typed `T` declared as `d`,
//!    fixed-dtype ones as their dtype) — these give ONNX Runtime exact type inference, and
//! 2. last, one fallback op with `T` declared `UNDEFINED` (any type) — so a model with an
//!    unsupported dtype or mismatched dtypes still reaches polyop's own validation and fails
//!    with "polyop.<op>: unsupported dtype ..." instead of ONNX Runtime's generic
//!    "could not find an implementation".
//!
//! (An op made only of `UNDEFINED` inputs cannot be registered for ops with two `T` inputs such
//! as `add`: ONNX Runtime requires exactly one dynamically typed input when an output is
//! dynamically typed.) All variants share one kernel implementation that reads the real dtypes
//! at compute time.

use crate::api::{dtype_from_onnx, onnx_from_dtype, unsupported_type, Api, API_VERSION};
use crate::pool::OrtPool;
use kernel_core::op::InferCache;
use kernel_core::{
    contiguous_strides, ArgType, Attrs, DType, Error, KernelCtx, OpDef, OutputAllocator,
    OwnedTensor, Result, TensorMut, TensorRef, TensorSpec, TypeRule,
};
use ort_sys::{
    ONNXTensorElementDataType as ET, OrtApi, OrtCustomOp,
    OrtCustomOpInputOutputCharacteristic as Ch, OrtKernelContext, OrtKernelInfo, OrtMemType,
    OrtShapeInferContext, OrtStatusPtr,
};
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// An `OrtCustomOp` with the polyop op it stands for. `#[repr(C)]` with `base` first, so the
/// `*const OrtCustomOp` ONNX Runtime hands back can be cast to `*const PolyOp`.
#[repr(C)]
pub struct PolyOp {
    base: OrtCustomOp,
    pub op: &'static OpDef,
    api: Api,
    name: CString,
    input_types: Vec<ET>,
    output_types: Vec<ET>,
    input_optional: Vec<bool>,
}

// SAFETY: immutable after construction; raw pointers inside are function pointers and a
// process-lifetime API table.
unsafe impl Send for PolyOp {}
unsafe impl Sync for PolyOp {}

impl PolyOp {
    pub fn as_ort(&self) -> *const OrtCustomOp {
        &self.base
    }
    /// `t`: the dtype declared for `T` (`None` = the any-type fallback).
    fn new(api: Api, op: &'static OpDef, t: Option<DType>) -> PolyOp {
        let decl = |r: &TypeRule| match (r, t) {
            (TypeRule::Fixed(d), _) => onnx_from_dtype(*d),
            (TypeRule::T, Some(d)) => onnx_from_dtype(d),
            (TypeRule::T, None) => ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED,
        };
        // SAFETY: every field of OrtCustomOp is a u32 or an Option<fn>; all-zero is valid
        // (and keeps any field added by a newer ort-sys feature set null).
        let mut base: OrtCustomOp = unsafe { std::mem::zeroed() };
        base.version = API_VERSION;
        base.GetName = Some(get_name);
        base.GetExecutionProviderType = Some(get_ep);
        base.GetInputType = Some(get_input_type);
        base.GetInputTypeCount = Some(get_input_count);
        base.GetOutputType = Some(get_output_type);
        base.GetOutputTypeCount = Some(get_output_count);
        base.KernelDestroy = Some(kernel_destroy);
        base.GetInputCharacteristic = Some(get_input_ch);
        base.GetOutputCharacteristic = Some(get_output_ch);
        base.GetInputMemoryType = Some(get_input_mem);
        base.GetVariadicInputMinArity = Some(variadic_min);
        base.GetVariadicInputHomogeneity = Some(variadic_homog);
        base.GetVariadicOutputMinArity = Some(variadic_min);
        base.GetVariadicOutputHomogeneity = Some(variadic_homog);
        base.CreateKernelV2 = Some(create_kernel_v2);
        base.KernelComputeV2 = Some(kernel_compute_v2);
        base.InferOutputShapeFn = Some(infer_output_shape);
        PolyOp {
            base,
            op,
            api,
            name: CString::new(op.onnx_op_type()).unwrap_or_default(),
            input_types: op.input_types.iter().map(decl).collect(),
            output_types: op.output_types.iter().map(decl).collect(),
            input_optional: op
                .schema
                .tensor_args()
                .map(|a| a.ty == ArgType::OptionalTensor)
                .collect(),
        }
    }
}

/// Every custom op for `op` (see the module docs): per-dtype variants, then the fallback.
pub fn variants(api: Api, op: &'static OpDef) -> Vec<PolyOp> {
    let has_t = op.input_types.contains(&TypeRule::T);
    if !has_t {
        return vec![PolyOp::new(api, op, Some(DType::F32))];
    }
    let mut v: Vec<PolyOp> = op
        .dtypes
        .iter()
        .map(|&d| PolyOp::new(api, op, Some(d)))
        .collect();
    v.push(PolyOp::new(api, op, None));
    v
}

unsafe fn this<'a>(op: *const OrtCustomOp) -> &'a PolyOp {
    // SAFETY: ONNX Runtime only calls these with the pointers we registered (PolyOp.base).
    unsafe { &*(op as *const PolyOp) }
}

unsafe extern "system" fn get_name(op: *const OrtCustomOp) -> *const c_char {
    unsafe { this(op) }.name.as_ptr()
}
unsafe extern "system" fn get_ep(_op: *const OrtCustomOp) -> *const c_char {
    std::ptr::null() // CPU execution provider
}
unsafe extern "system" fn get_input_type(op: *const OrtCustomOp, i: usize) -> ET {
    let p = unsafe { this(op) };
    p.input_types
        .get(i)
        .copied()
        .unwrap_or(ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
}
unsafe extern "system" fn get_input_count(op: *const OrtCustomOp) -> usize {
    unsafe { this(op) }.input_types.len()
}
unsafe extern "system" fn get_output_type(op: *const OrtCustomOp, i: usize) -> ET {
    let p = unsafe { this(op) };
    p.output_types
        .get(i)
        .copied()
        .unwrap_or(ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
}
unsafe extern "system" fn get_output_count(op: *const OrtCustomOp) -> usize {
    unsafe { this(op) }.output_types.len()
}
unsafe extern "system" fn get_input_ch(op: *const OrtCustomOp, i: usize) -> Ch {
    if unsafe { this(op) }.input_optional.get(i) == Some(&true) {
        Ch::INPUT_OUTPUT_OPTIONAL
    } else {
        Ch::INPUT_OUTPUT_REQUIRED
    }
}
unsafe extern "system" fn get_output_ch(_op: *const OrtCustomOp, _i: usize) -> Ch {
    Ch::INPUT_OUTPUT_REQUIRED
}
unsafe extern "system" fn get_input_mem(_op: *const OrtCustomOp, _i: usize) -> OrtMemType {
    OrtMemType::OrtMemTypeDefault
}
unsafe extern "system" fn variadic_min(_op: *const OrtCustomOp) -> c_int {
    1
}
unsafe extern "system" fn variadic_homog(_op: *const OrtCustomOp) -> c_int {
    1
}

/// Run `f` at the FFI boundary: polyop errors and panics become an `OrtStatus*`.
fn guard(api: Api, op: &OpDef, f: impl FnOnce() -> Result<()>) -> OrtStatusPtr {
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| e.in_op(op.name)),
        Err(p) => Err(Error::from_panic(op.name, p)),
    };
    match r {
        Ok(()) => OrtStatusPtr(std::ptr::null_mut()),
        Err(e) => OrtStatusPtr(api.status(&e)),
    }
}

// ---- kernel -------------------------------------------------------------------------------

/// Per-node state: the op and its attributes, read and validated once at kernel creation,
/// and the shapes inferred for recent input shapes (so a repeated call skips inference).
struct Kernel {
    api: Api,
    op: &'static OpDef,
    attrs: Attrs,
    cache: InferCache,
}

unsafe extern "system" fn create_kernel_v2(
    op: *const OrtCustomOp,
    api: *const OrtApi,
    info: *const OrtKernelInfo,
    kernel: *mut *mut c_void,
) -> OrtStatusPtr {
    let p = unsafe { this(op) };
    // Prefer the table ONNX Runtime hands us here (same version we asked for).
    let api = if api.is_null() {
        p.api
    } else {
        Api(unsafe { &*api })
    };
    unsafe { *kernel = std::ptr::null_mut() };
    guard(api, p.op, || {
        let attrs = unsafe { crate::attrs::from_kernel_info(api, p.op, info) }?;
        // Validate dtypes, attributes and the shapes known so far, so a bad node fails
        // session creation rather than the first run.
        let n = unsafe { api.info_input_count(info) }?;
        let mut specs: Vec<Option<TensorSpec>> = Vec::with_capacity(p.op.num_inputs());
        for i in 0..p.op.num_inputs().max(n) {
            let spec = if i < n {
                unsafe { api.info_input_spec(info, i) }
            } else {
                None
            };
            specs.push(match spec {
                None => None,
                Some((et, dims)) => {
                    let dtype = dtype_from_onnx(et)
                        .ok_or_else(|| unsupported_type(&input_label(p.op, i), et))?;
                    Some(shape_spec(dtype, dims))
                }
            });
        }
        p.op.infer(&specs, &attrs)?;
        let k = Box::new(Kernel {
            api,
            op: p.op,
            attrs,
            cache: InferCache::new(),
        });
        unsafe { *kernel = Box::into_raw(k) as *mut c_void };
        Ok(())
    })
}

/// A spec from ONNX dims. Rank 0 is treated as unknown rank: ONNX Runtime reports a missing
/// shape as rank 0, and guessing "scalar" would reject valid models.
fn shape_spec(dtype: DType, dims: Vec<Option<usize>>) -> TensorSpec {
    if dims.is_empty() {
        TensorSpec::unknown_rank(dtype)
    } else {
        TensorSpec::with_dims(dtype, dims)
    }
}

fn input_label(op: &OpDef, i: usize) -> String {
    match op.schema.tensor_args().nth(i) {
        Some(a) => format!("input `{}`", a.name),
        None => format!("input {i}"),
    }
}

unsafe extern "system" fn kernel_destroy(k: *mut c_void) {
    if !k.is_null() {
        // SAFETY: created by Box::into_raw in create_kernel_v2, destroyed once.
        drop(unsafe { Box::from_raw(k as *mut Kernel) });
    }
}

unsafe extern "system" fn kernel_compute_v2(
    k: *mut c_void,
    ctx: *mut OrtKernelContext,
) -> OrtStatusPtr {
    let k = unsafe { &*(k as *const Kernel) };
    guard(k.api, k.op, || unsafe { k.compute(ctx) })
}

/// Outputs of data-dependent ops, allocated by onnxruntime once the kernel knows the shape.
struct OrtAllocator<'s> {
    api: Api,
    ctx: *mut OrtKernelContext,
    n_out: usize,
    done: Vec<bool>,
    scratch: &'s mut Vec<OwnedTensor>,
}

impl<'a> OutputAllocator<'a> for OrtAllocator<'_> {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        let slot = self
            .done
            .get_mut(index)
            .ok_or_else(|| Error::internal(format!("no output {index}")))?;
        if *slot {
            return Err(Error::internal(format!("output {index} allocated twice")));
        }
        *slot = true;
        unsafe {
            output_view(
                self.api,
                self.ctx,
                self.n_out,
                index,
                dtype,
                shape,
                self.scratch,
            )
        }
    }
}

/// Output `i` as a contiguous view: onnxruntime's buffer when the node has that output, else
/// scratch memory (an output the node leaves out).
unsafe fn output_view<'a>(
    api: Api,
    ctx: *mut OrtKernelContext,
    n_out: usize,
    i: usize,
    dtype: DType,
    shape: &[usize],
    scratch: &mut Vec<OwnedTensor>,
) -> Result<TensorMut<'a>> {
    let v = if i < n_out {
        unsafe { api.output(ctx, i, shape) }?
    } else {
        std::ptr::null_mut()
    };
    if v.is_null() {
        let mut t = OwnedTensor::zeros(dtype, shape);
        let ptr = t.view_mut().ptr();
        scratch.push(t); // the heap buffer does not move with the OwnedTensor
        return Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, ptr) });
    }
    // Defensive (the kernel writes `dtype` elements of `shape` into this buffer): checked
    // without allocating on runtimes with the borrowed-shape API.
    if !unsafe { api.value_is(v, onnx_from_dtype(dtype), shape) }? {
        let (et, got) = unsafe { api.value_type_shape(v) }?;
        return Err(Error::internal(format!(
            "onnxruntime allocated output {i} as {} {got:?}, expected {dtype} {shape:?}",
            crate::api::onnx_type_name(et)
        )));
    }
    let ptr = unsafe { api.tensor_data(v) }?;
    Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, ptr) })
}

impl Kernel {
    unsafe fn compute(&self, ctx: *mut OrtKernelContext) -> Result<()> {
        let api = self.api;
        let op = self.op;
        let n_in = unsafe { api.input_count(ctx) }?;
        if n_in > op.num_inputs() {
            return Err(Error::invalid(format!(
                "expected at most {} input(s), got {n_in}",
                op.num_inputs()
            )));
        }
        let mut inputs: Vec<Option<TensorRef>> = Vec::with_capacity(op.num_inputs());
        for i in 0..op.num_inputs() {
            let v = if i < n_in {
                unsafe { api.input(ctx, i) }?
            } else {
                std::ptr::null()
            };
            if v.is_null() {
                inputs.push(None);
                continue;
            }
            let (et, shape) = unsafe { api.value_type_shape(v) }?;
            let dtype =
                dtype_from_onnx(et).ok_or_else(|| unsupported_type(&input_label(op, i), et))?;
            let ptr = unsafe { api.tensor_data(v) }?;
            let strides = contiguous_strides(&shape);
            // SAFETY: onnxruntime tensors are dense row-major buffers of `shape`.
            inputs.push(Some(unsafe {
                TensorRef::from_raw(dtype, shape, strides, ptr)
            }));
        }
        // Validates arity, dtypes, shapes and attribute values before any output is touched.
        let specs = op.infer_concrete_cached(&self.cache, &inputs, &self.attrs)?;
        let n_out = unsafe { api.output_count(ctx) }?;
        let pool = OrtPool { api, ctx };
        let mut scratch: Vec<OwnedTensor> = Vec::new();
        if op.flags.data_dependent_shape {
            let mut alloc = OrtAllocator {
                api,
                ctx,
                n_out,
                done: vec![false; specs.len()],
                scratch: &mut scratch,
            };
            {
                let mut none: [TensorMut; 0] = [];
                let mut kctx = KernelCtx::new(op, &inputs, &mut none, &self.attrs, &pool)
                    .with_allocator(&mut alloc);
                op.compute(&mut kctx)?;
            }
            if let Some(i) = alloc.done.iter().position(|d| !d) {
                return Err(Error::internal(format!(
                    "kernel did not allocate output {i}"
                )));
            }
            return Ok(());
        }
        let mut outputs: Vec<TensorMut> = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            let shape = s.shape.as_deref().ok_or_else(|| {
                Error::internal(format!(
                    "output {i} has no static shape for concrete inputs"
                ))
            })?;
            outputs.push(unsafe { output_view(api, ctx, n_out, i, s.dtype, shape, &mut scratch) }?);
        }
        let mut kctx = KernelCtx::new(op, &inputs, &mut outputs, &self.attrs, &pool);
        op.compute(&mut kctx)
    }
}

// ---- shape inference ----------------------------------------------------------------------

/// `InferOutputShapeFn`: kernel-core's `op.infer` on the node's input types/shapes (unknown
/// dims allowed) and attributes; sets output element types and shapes. Unknown output dims get
/// a symbolic name; outputs of unknown rank are left alone.
unsafe extern "system" fn infer_output_shape(
    op: *const OrtCustomOp,
    ctx: *mut OrtShapeInferContext,
) -> OrtStatusPtr {
    let p = unsafe { this(op) };
    let api = p.api;
    guard(api, p.op, || {
        let n = unsafe { api.sic_input_count(ctx) }?;
        let mut specs: Vec<Option<TensorSpec>> = Vec::with_capacity(p.op.num_inputs().max(n));
        for i in 0..p.op.num_inputs().max(n) {
            if i >= n {
                specs.push(None);
                continue;
            }
            let Ok((et, dims)) = (unsafe { api.sic_input(ctx, i) }) else {
                specs.push(None);
                continue;
            };
            if et == ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED {
                specs.push(None);
                continue;
            }
            let dtype =
                dtype_from_onnx(et).ok_or_else(|| unsupported_type(&input_label(p.op, i), et))?;
            specs.push(Some(shape_spec(dtype, dims)));
        }
        let attrs = unsafe { crate::attrs::from_shape_ctx(api, p.op, ctx) }?;
        let outs = p.op.infer(&specs, &attrs)?;
        for (i, o) in outs.iter().enumerate() {
            if let Some(dims) = &o.shape {
                let prefix = format!("polyop_{}_{}", p.op.name, p.op.schema.output_name(i));
                unsafe { api.sic_set_output(ctx, i, onnx_from_dtype(o.dtype), dims, &prefix) }?;
            }
        }
        Ok(())
    })
}
