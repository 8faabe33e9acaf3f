//! Registration: one `OrtCustomOp` per (op, dtype) plus a dtype-generic fallback per op, all generated from
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

use crate::call::{create_kernel_v2, kernel_compute_v2, kernel_destroy};
use crate::shape::infer_output_shape;
use crate::sys::{Api, API_VERSION};
use crate::tensor::ONNX_DTYPES;
use kernel_core::{ArgType, DType, OpDef, TypeRule};
use ort_sys::{
    ONNXTensorElementDataType as ET, OrtCustomOp, OrtCustomOpInputOutputCharacteristic as Ch,
    OrtMemType,
};

use std::ffi::{c_char, c_int, CString};

/// The first C API version (onnxruntime 1.24) whose shape-inference context survives an
/// absent optional input.
const SAFE_OPTIONAL_INFER_API: u32 = 24;

/// An `OrtCustomOp` with the polyop op it stands for. `#[repr(C)]` with `base` first, so the
/// `*const OrtCustomOp` ONNX Runtime hands back can be cast to `*const PolyOp`.
#[repr(C)]
pub(crate) struct PolyOp {
    base: OrtCustomOp,
    pub op: &'static OpDef,
    pub api: Api,
    name: CString,
    input_types: Vec<ET>,
    output_types: Vec<ET>,
    input_optional: Vec<bool>,
}

// SAFETY: a `PolyOp` holds no raw pointers: `base` is a `u32` and `Option<fn>`s, `op` a
// `&'static OpDef`, `api` a `Send` table reference, the rest owned `CString`/`Vec`s. It is
// never mutated after `new` (onnxruntime only reads it through `*const OrtCustomOp`), so moving
// it to another thread is sound.
unsafe impl Send for PolyOp {}
// SAFETY: as for `Send`: immutable after construction, so shared references from onnxruntime's
// threads (which call the `OrtCustomOp` callbacks concurrently) only read it.
unsafe impl Sync for PolyOp {}

impl PolyOp {
    pub fn as_ort(&self) -> *const OrtCustomOp {
        &self.base
    }
    /// `t`: the dtype declared for `T` (`None` = the any-type fallback).
    fn new(api: Api, op: &'static OpDef, t: Option<DType>) -> PolyOp {
        let decl = |r: &TypeRule| match (r, t) {
            (TypeRule::Fixed(d), _) => ONNX_DTYPES.code(*d),
            (TypeRule::T, Some(d)) => ONNX_DTYPES.code(d),
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
        // onnxruntime before 1.24 crashes inside its own shape-inference context for a node
        // whose optional input is absent (an empty input name; found by running the ORT tests
        // under 1.22 and 1.23): there, ops with optional inputs get no shape function (their
        // output shapes are known at run time only) rather than a crash.
        let has_optional = op
            .schema
            .args
            .iter()
            .any(|a| a.ty == ArgType::OptionalTensor);
        if !(has_optional && crate::sys::runtime_api() < SAFE_OPTIONAL_INFER_API) {
            base.InferOutputShapeFn = Some(infer_output_shape);
        }
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
pub(crate) fn variants(api: Api, op: &'static OpDef) -> Vec<PolyOp> {
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

/// # Safety
/// `op` is a pointer onnxruntime got from [`PolyOp::as_ort`].
pub(crate) unsafe fn this<'a>(op: *const OrtCustomOp) -> &'a PolyOp {
    // SAFETY: by this function's contract `op` is `&p.base` for some `PolyOp` `p`; `PolyOp` is
    // `#[repr(C)]` with `base` first, so the pointer is also a valid `*const PolyOp`. Every
    // `PolyOp` handed to onnxruntime is leaked (`custom_ops`), so any lifetime is fine.
    unsafe { &*(op as *const PolyOp) }
}

// SAFETY (every `this(op)` below): onnxruntime calls the `OrtCustomOp` callbacks only with the
// pointer it was registered with, `PolyOp::as_ort` of a leaked `PolyOp`.
unsafe extern "system" fn get_name(op: *const OrtCustomOp) -> *const c_char {
    // SAFETY: see above. The name lives as long as the (leaked) `PolyOp`.
    unsafe { this(op) }.name.as_ptr()
}
unsafe extern "system" fn get_ep(_op: *const OrtCustomOp) -> *const c_char {
    std::ptr::null() // CPU execution provider
}
unsafe extern "system" fn get_input_type(op: *const OrtCustomOp, i: usize) -> ET {
    // SAFETY: see above.
    let p = unsafe { this(op) };
    p.input_types
        .get(i)
        .copied()
        .unwrap_or(ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
}
unsafe extern "system" fn get_input_count(op: *const OrtCustomOp) -> usize {
    // SAFETY: see above.
    unsafe { this(op) }.input_types.len()
}
unsafe extern "system" fn get_output_type(op: *const OrtCustomOp, i: usize) -> ET {
    // SAFETY: see above.
    let p = unsafe { this(op) };
    p.output_types
        .get(i)
        .copied()
        .unwrap_or(ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
}
unsafe extern "system" fn get_output_count(op: *const OrtCustomOp) -> usize {
    // SAFETY: see above.
    unsafe { this(op) }.output_types.len()
}
unsafe extern "system" fn get_input_ch(op: *const OrtCustomOp, i: usize) -> Ch {
    // SAFETY: see above.
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
