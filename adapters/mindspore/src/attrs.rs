//! Attribute source: the Custom primitive's attributes, by the schema's argument names,
//! through MindSpore's `AotExtra` getters. Each type is tried first as the schema declares it,
//! then as the others, so a wrong-typed attribute reaches binding (and its "must be int, got
//! float" error). A float attribute may be a string holding a Python float's `repr`, which
//! `polyop.mindspore` passes, because MindSpore stores float attributes as float32.

use crate::sys::{self, AotExtra};
use kernel_core::{widen_f32_attr, ArgType, AttrSource, AttrValue, Attrs, Error, OpDef, Result};

/// The attributes of one call (`extra` is MindSpore's, live for the call, or null).
pub(crate) struct Extra(pub *mut AotExtra);

type Getter<T> = unsafe fn(*mut AotExtra, &str) -> std::result::Result<T, cxx::Exception>;

impl Extra {
    /// Attribute `name` read by `get`; `None` when MindSpore holds another type (it throws).
    fn read<T>(&self, get: Getter<T>, name: &str) -> Option<T> {
        // SAFETY: `self.0` is MindSpore's AotExtra, live for this call, and `name` a live
        // string; a thrown exception comes back as Err.
        unsafe { get(self.0, name) }.ok()
    }
}

impl AttrSource for Extra {
    fn get(&mut self, name: &str, ty: &ArgType) -> Result<Option<AttrValue>> {
        // SAFETY: `self.0` is null (then false) or MindSpore's AotExtra, live for this call.
        if !unsafe { sys::has_attr(self.0, name) } {
            return Ok(None);
        }
        let int = || self.read(sys::attr_int, name).map(AttrValue::Int);
        let boolean = || self.read(sys::attr_bool, name).map(AttrValue::Bool);
        let string = || self.read(sys::attr_str, name).map(AttrValue::Str);
        let widen = |f: f64| widen_f32_attr(f as f32);
        let float = || {
            self.read(sys::attr_float, name)
                .map(|f| AttrValue::Float(widen(f)))
        };
        let ints = || self.read(sys::attr_ints, name).map(AttrValue::IntList);
        let floats = || {
            let v = self.read(sys::attr_floats, name)?;
            Some(AttrValue::FloatList(v.into_iter().map(widen).collect()))
        };
        let exact = |s: Option<AttrValue>| match s {
            Some(AttrValue::Str(s)) => s.parse().ok().map(AttrValue::Float),
            _ => None,
        };
        let v = match ty {
            ArgType::Float => exact(string()).or_else(float).or_else(int),
            ArgType::Bool => boolean().or_else(int),
            ArgType::Str => string().or_else(int),
            ArgType::IntList(_) => ints().or_else(int),
            ArgType::FloatList => floats(),
            _ => int().or_else(float).or_else(string),
        };
        v.map(Some).ok_or_else(|| {
            Error::invalid(format!(
                "attribute `{name}` is not {} (as MindSpore holds it)",
                ty.schema_type()
            ))
        })
    }
}

/// The call's attributes bound to `op`'s schema.
pub(crate) fn decode(op: &OpDef, extra: *mut AotExtra) -> Result<Attrs> {
    op.decode_attrs(&mut Extra(extra))
}
