//! Attribute sources: a node's attributes by the schema's argument names, at kernel creation
//! (`OrtKernelInfo`) and in shape inference (`OrtShapeInferContext` + `ReadOpAttr`), decoded
//! by kernel-core's `OpDef::decode_attrs`. ONNX has no bool, so a bool arrives as INT 0/1 and
//! binding coerces it. Both sources try the declared type first, then the others, so a
//! wrong-typed attribute reaches binding (and its "must be int, got float" error) instead of
//! being ignored.

use crate::sys::{string_from_buf, Api};
use kernel_core::ffi::{ne_values, FromNeBytes};
use kernel_core::{widen_f32_attr, ArgType, AttrSource, AttrValue, Attrs, OpDef, Result};
use ort_sys::{OrtKernelInfo, OrtOpAttr, OrtOpAttrType as A, OrtShapeInferContext};
use std::ffi::{c_char, CString};

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
            // a single INT for a list (binding repeats it); tried first, as ONNX Runtime
            // reads an INT attribute as an empty array
            ArgType::IntList(_) => int().or_else(|| r.ints(&n).map(AttrValue::IntList)),
            ArgType::FloatList => r
                .floats(&n)
                .map(|v| AttrValue::FloatList(v.into_iter().map(widen_f32_attr).collect())),
            _ => int().or_else(float).or_else(string),
        })
    }
}

struct KernelInfo(Api, *const OrtKernelInfo);

// SAFETY (every block): the kernel info is live for the CreateKernelV2 call that built this;
// names are NUL-terminated; out-parameters are writable locals, and `read_array` passes buffers
// of the size it gives.
impl Reader for KernelInfo {
    fn int(&self, n: &CString) -> Option<i64> {
        let f = self.0 .0.KernelInfoGetAttribute_int64;
        // SAFETY: see the impl.
        self.0.out(0, |p| unsafe { f(self.1, n.as_ptr(), p) }).ok()
    }
    fn float(&self, n: &CString) -> Option<f32> {
        let f = self.0 .0.KernelInfoGetAttribute_float;
        // SAFETY: see the impl.
        self.0
            .out(0.0, |p| unsafe { f(self.1, n.as_ptr(), p) })
            .ok()
    }
    fn string(&self, n: &CString) -> Option<String> {
        let f = self.0 .0.KernelInfoGetAttribute_string;
        // SAFETY: see the impl.
        let buf = self
            .0
            .read_array(|p: *mut c_char, k| unsafe { f(self.1, n.as_ptr(), p, k) })?;
        // The size KernelInfoGetAttribute_string reports includes the C terminator.
        let mut bytes: Vec<u8> = buf.into_iter().map(|c| c as u8).collect();
        if bytes.last() == Some(&0) {
            bytes.pop();
        }
        Some(string_from_buf(bytes))
    }
    fn ints(&self, n: &CString) -> Option<Vec<i64>> {
        let f = self.0 .0.KernelInfoGetAttributeArray_int64;
        // SAFETY: see the impl.
        self.0
            .read_array(|p, k| unsafe { f(self.1, n.as_ptr(), p, k) })
    }
    fn floats(&self, n: &CString) -> Option<Vec<f32>> {
        let f = self.0 .0.KernelInfoGetAttributeArray_float;
        // SAFETY: see the impl.
        self.0
            .read_array(|p, k| unsafe { f(self.1, n.as_ptr(), p, k) })
    }
}

/// The attributes of a node as `OrtOpAttr`s (`get` looks one up by name): in shape inference
/// (`ShapeInferContext_GetAttribute`) and in an execution provider's graph
/// (`Node_GetAttributeByName`), read with `ReadOpAttr`.
pub(crate) struct OpAttrs<G>(pub Api, pub G);

impl<G: Fn(&CString) -> Option<*const OrtOpAttr>> OpAttrs<G> {
    fn bytes(&self, n: &CString, ty: A) -> Option<Vec<u8>> {
        // SAFETY: `get` returns live, non-null attributes of the node being read (the
        // contract of whoever built this reader).
        (self.1)(n).and_then(|a| unsafe { self.0.read_attr_bytes(a, ty) })
    }
}

impl<G: Fn(&CString) -> Option<*const OrtOpAttr>> Reader for OpAttrs<G> {
    fn int(&self, n: &CString) -> Option<i64> {
        // SAFETY: as in `bytes`.
        let b = (self.1)(n).and_then(|a| unsafe { self.0.read_attr_scalar(a, A::ORT_OP_ATTR_INT) });
        b.map(i64::from_ne_bytes)
    }
    fn float(&self, n: &CString) -> Option<f32> {
        // SAFETY: as in `bytes`.
        let b =
            (self.1)(n).and_then(|a| unsafe { self.0.read_attr_scalar(a, A::ORT_OP_ATTR_FLOAT) });
        b.and_then(|b| f32::from_ne(&b[..4]))
    }
    fn string(&self, n: &CString) -> Option<String> {
        // ReadOpAttr(STRING) succeeds on any attribute (an int attribute reads as ""), which
        // is why strings are tried last for non-string attributes.
        Some(string_from_buf(self.bytes(n, A::ORT_OP_ATTR_STRING)?))
    }
    fn ints(&self, n: &CString) -> Option<Vec<i64>> {
        Some(ne_values(&self.bytes(n, A::ORT_OP_ATTR_INTS)?))
    }
    fn floats(&self, n: &CString) -> Option<Vec<f32>> {
        Some(ne_values(&self.bytes(n, A::ORT_OP_ATTR_FLOATS)?))
    }
}

/// One attribute `name` read as `ty` (other types tried too, as for binding); `None` when absent.
pub(crate) fn read_one<G: Fn(&CString) -> Option<*const OrtOpAttr>>(
    r: OpAttrs<G>,
    name: &str,
    ty: &ArgType,
) -> Option<AttrValue> {
    Source(r).get(name, ty).ok().flatten()
}

/// One attribute of the node whose kernel is being created; `None` when absent.
///
/// # Safety
/// `info` must be the kernel info of a kernel-creation call in progress.
pub(crate) unsafe fn kernel_info_attr(
    api: Api,
    info: *const OrtKernelInfo,
    name: &str,
    ty: &ArgType,
) -> Option<AttrValue> {
    Source(KernelInfo(api, info)).get(name, ty).ok().flatten()
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
    // SAFETY: the context is live for the InferOutputShapeFn call (this function's contract).
    let get = |n: &CString| unsafe { api.sic_attr(ctx, n) };
    op.decode_attrs(&mut Source(OpAttrs(api, get)))
}
