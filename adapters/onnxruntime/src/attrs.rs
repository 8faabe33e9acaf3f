//! Attribute sources: a node's attributes by the schema's argument names, at kernel creation
//! (`OrtKernelInfo`) and in shape inference (`OrtShapeInferContext` + `ReadOpAttr`), decoded
//! by kernel-core's `OpDef::decode_attrs`. ONNX has no bool, so a bool arrives as INT 0/1 and
//! binding coerces it. Both sources try the declared type first, then the others, so a
//! wrong-typed attribute reaches binding (and its "must be int, got float" error) instead of
//! being ignored.

use crate::sys::{string_from_buf, Api};
use kernel_core::{widen_f32_attr, ArgType, AttrSource, AttrValue, Attrs, OpDef, Result};
use ort_sys::{OrtKernelInfo, OrtOpAttr, OrtOpAttrType as A, OrtShapeInferContext};
use std::ffi::CString;

/// One node's attribute reader: each method returns `None` when the attribute is absent or
/// of another type.
trait Reader {
    fn int(&self, n: &CString) -> Option<i64>;
    fn float(&self, n: &CString) -> Option<f32>;
    fn string(&self, n: &CString) -> Option<String>;
    fn ints(&self, n: &CString) -> Option<Vec<i64>>;
    fn floats(&self, n: &CString) -> Option<Vec<f32>>;
}

struct Source<R>(R);

impl<R: Reader> AttrSource for Source<R> {
    fn get(&mut self, name: &str, ty: &ArgType) -> Result<Option<AttrValue>> {
        let n = CString::new(name).unwrap_or_default();
        let r = &self.0;
        let int = || r.int(&n).map(AttrValue::Int);
        let float = || r.float(&n).map(|f| AttrValue::Float(widen_f32_attr(f)));
        let string = || r.string(&n).map(AttrValue::Str);
        Ok(match ty {
            ArgType::Float => float().or_else(int).or_else(string),
            ArgType::Str => string().or_else(int).or_else(float),
            ArgType::IntList => r.ints(&n).map(AttrValue::IntList),
            ArgType::FloatList => r
                .floats(&n)
                .map(|v| AttrValue::FloatList(v.into_iter().map(widen_f32_attr).collect())),
            _ => int().or_else(float).or_else(string),
        })
    }
}

struct KernelInfo(Api, *const OrtKernelInfo);

// SAFETY (every method): the kernel info is live for the CreateKernelV2 call that built this.
impl Reader for KernelInfo {
    fn int(&self, n: &CString) -> Option<i64> {
        // SAFETY: see the impl.
        unsafe { self.0.info_int(self.1, n) }
    }
    fn float(&self, n: &CString) -> Option<f32> {
        // SAFETY: see the impl.
        unsafe { self.0.info_float(self.1, n) }
    }
    fn string(&self, n: &CString) -> Option<String> {
        // SAFETY: see the impl.
        unsafe { self.0.info_string(self.1, n) }
    }
    fn ints(&self, n: &CString) -> Option<Vec<i64>> {
        // SAFETY: see the impl.
        unsafe { self.0.info_ints(self.1, n) }
    }
    fn floats(&self, n: &CString) -> Option<Vec<f32>> {
        // SAFETY: see the impl.
        unsafe { self.0.info_floats(self.1, n) }
    }
}

struct ShapeCtx(Api, *const OrtShapeInferContext);

impl ShapeCtx {
    fn attr(&self, n: &CString) -> Option<*const OrtOpAttr> {
        // SAFETY: the context is live for the InferOutputShapeFn call that built this.
        let a = unsafe { self.0.sic_attr(self.1, n) };
        (!a.is_null()).then_some(a)
    }
    fn bytes(&self, n: &CString, ty: A) -> Option<Vec<u8>> {
        // SAFETY: a non-null attribute of the live context.
        self.attr(n)
            .and_then(|a| unsafe { self.0.read_attr_bytes(a, ty) })
    }
}

impl Reader for ShapeCtx {
    fn int(&self, n: &CString) -> Option<i64> {
        // SAFETY: a non-null attribute of the live context.
        let b = self
            .attr(n)
            .and_then(|a| unsafe { self.0.read_attr_scalar(a, A::ORT_OP_ATTR_INT) });
        b.map(i64::from_ne_bytes)
    }
    fn float(&self, n: &CString) -> Option<f32> {
        // SAFETY: a non-null attribute of the live context.
        let b = self
            .attr(n)
            .and_then(|a| unsafe { self.0.read_attr_scalar(a, A::ORT_OP_ATTR_FLOAT) });
        b.map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn string(&self, n: &CString) -> Option<String> {
        // ReadOpAttr(STRING) succeeds on any attribute (an int attribute reads as ""), which
        // is why strings are tried last for non-string attributes.
        Some(string_from_buf(self.bytes(n, A::ORT_OP_ATTR_STRING)?))
    }
    fn ints(&self, n: &CString) -> Option<Vec<i64>> {
        let b = self.bytes(n, A::ORT_OP_ATTR_INTS)?;
        Some(
            b.chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        )
    }
    fn floats(&self, n: &CString) -> Option<Vec<f32>> {
        let b = self.bytes(n, A::ORT_OP_ATTR_FLOATS)?;
        Some(
            b.chunks_exact(4)
                .map(|c| f32::from_ne_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        )
    }
}

/// Attributes given on the node at kernel creation, bound to the op's schema.
///
/// # Safety
/// `info` must be the kernel info ONNX Runtime passed to `CreateKernelV2`.
pub unsafe fn from_kernel_info(api: Api, op: &OpDef, info: *const OrtKernelInfo) -> Result<Attrs> {
    op.decode_attrs(&mut Source(KernelInfo(api, info)))
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
    op.decode_attrs(&mut Source(ShapeCtx(api, ctx)))
}
