//! Reading a node's attributes, by the op schema's argument names, into kernel-core
//! [`AttrValue`]s: at kernel creation (`OrtKernelInfo`) and during shape inference
//! (`OrtShapeInferContext` + `ReadOpAttr`). Binding (defaults, coercions, type errors) is
//! kernel-core's `OpDef::bind_attrs`; ONNX has no bool, so a bool arrives as INT 0/1 and
//! `bind_attrs` coerces it.

use crate::api::Api;
use kernel_core::widen_f32_attr;
use kernel_core::{ArgType, AttrValue, Attrs, OpDef, Result};
use ort_sys::{OrtKernelInfo, OrtOpAttrType as A, OrtShapeInferContext};
use std::ffi::CString;

fn cname(name: &str) -> CString {
    CString::new(name).unwrap_or_default()
}

/// Attributes given on the node at kernel creation, bound to the op's schema.
///
/// # Safety
/// `info` must be the kernel info ONNX Runtime passed to `CreateKernelV2`.
pub unsafe fn from_kernel_info(api: Api, op: &OpDef, info: *const OrtKernelInfo) -> Result<Attrs> {
    let mut given: Vec<(&str, AttrValue)> = Vec::new();
    for arg in op.schema.attr_args() {
        let n = cname(&arg.name);
        let int = || unsafe { api.info_int(info, &n) }.map(AttrValue::Int);
        let float =
            || unsafe { api.info_float(info, &n) }.map(|f| AttrValue::Float(widen_f32_attr(f)));
        let string = || unsafe { api.info_string(info, &n) }.map(AttrValue::Str);
        // Try the declared type first, then the others so a wrong-typed attribute reaches
        // bind_attrs (and its "must be int, got float" error) instead of being ignored.
        let v = match arg.ty {
            ArgType::Float => float().or_else(int).or_else(string),
            ArgType::Str => string().or_else(int).or_else(float),
            ArgType::IntList => unsafe { api.info_ints(info, &n) }.map(AttrValue::IntList),
            ArgType::FloatList => unsafe { api.info_floats(info, &n) }
                .map(|v| AttrValue::FloatList(v.into_iter().map(widen_f32_attr).collect())),
            _ => int().or_else(float).or_else(string),
        };
        if let Some(v) = v {
            given.push((arg.name.as_str(), v));
        }
    }
    op.bind_attrs(given)
}

/// Attributes as seen by shape inference, bound to the op's schema.
///
/// # Safety
/// `ctx` must be the context ONNX Runtime passed to `InferOutputShapeFn`.
pub unsafe fn from_shape_ctx(
    api: Api,
    op: &OpDef,
    ctx: *const OrtShapeInferContext,
) -> Result<Attrs> {
    let mut given: Vec<(&str, AttrValue)> = Vec::new();
    for arg in op.schema.attr_args() {
        let n = cname(&arg.name);
        let a = unsafe { api.sic_attr(ctx, &n) };
        if a.is_null() {
            continue;
        }
        let int = || {
            unsafe { api.read_attr_scalar(a, A::ORT_OP_ATTR_INT) }
                .map(|b| AttrValue::Int(i64::from_ne_bytes(b)))
        };
        let float = || {
            unsafe { api.read_attr_scalar(a, A::ORT_OP_ATTR_FLOAT) }.map(|b| {
                AttrValue::Float(widen_f32_attr(f32::from_ne_bytes([b[0], b[1], b[2], b[3]])))
            })
        };
        // ReadOpAttr(STRING) succeeds on any attribute (an int attribute reads as ""), so
        // strings are tried last.
        let string = || {
            unsafe { api.read_attr_bytes(a, A::ORT_OP_ATTR_STRING) }.map(|mut b| {
                if let Some(p) = b.iter().position(|&c| c == 0) {
                    b.truncate(p);
                }
                AttrValue::Str(String::from_utf8_lossy(&b).into_owned())
            })
        };
        let v = match arg.ty {
            ArgType::Float => float().or_else(int).or_else(string),
            ArgType::IntList => unsafe { api.read_attr_bytes(a, A::ORT_OP_ATTR_INTS) }.map(|b| {
                AttrValue::IntList(
                    b.chunks_exact(8)
                        .map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                )
            }),
            ArgType::FloatList => {
                unsafe { api.read_attr_bytes(a, A::ORT_OP_ATTR_FLOATS) }.map(|b| {
                    AttrValue::FloatList(
                        b.chunks_exact(4)
                            .map(|c| {
                                widen_f32_attr(f32::from_ne_bytes(c.try_into().expect("4 bytes")))
                            })
                            .collect(),
                    )
                })
            }
            _ => int().or_else(float).or_else(string),
        };
        if let Some(v) = v {
            given.push((arg.name.as_str(), v));
        }
    }
    op.bind_attrs(given)
}
