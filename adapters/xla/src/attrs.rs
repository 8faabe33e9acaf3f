//! Attribute source: the call frame's typed attributes (scalars, strings, arrays) decoded by
//! name and bound to the schema, and the raw byte key that lets a repeated call reuse them.

use crate::sys;
use crate::tensor::{dtype_from_xla, xla_dtype_name};
use kernel_core::{AttrValue, Error, OpDef, Result};

pub(crate) unsafe fn span_str<'a>(s: *const sys::XLA_FFI_ByteSpan) -> Result<&'a str> {
    if s.is_null() {
        return Err(Error::internal("null attribute name"));
    }
    let s = unsafe { &*s };
    if s.len == 0 {
        return Ok("");
    }
    let bytes = unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) };
    std::str::from_utf8(bytes).map_err(|_| Error::invalid("attribute string is not UTF-8"))
}

pub(crate) unsafe fn read_int(dtype: sys::XLA_FFI_DataType, p: *const u8) -> Option<i64> {
    unsafe {
        Some(match dtype {
            sys::XLA_FFI_DataType_XLA_FFI_DataType_S8 => *(p as *const i8) as i64,
            sys::XLA_FFI_DataType_XLA_FFI_DataType_S16 => (p as *const i16).read_unaligned() as i64,
            sys::XLA_FFI_DataType_XLA_FFI_DataType_S32 => (p as *const i32).read_unaligned() as i64,
            sys::XLA_FFI_DataType_XLA_FFI_DataType_S64 => (p as *const i64).read_unaligned(),
            sys::XLA_FFI_DataType_XLA_FFI_DataType_U8 => *p as i64,
            sys::XLA_FFI_DataType_XLA_FFI_DataType_U16 => (p as *const u16).read_unaligned() as i64,
            sys::XLA_FFI_DataType_XLA_FFI_DataType_U32 => (p as *const u32).read_unaligned() as i64,
            sys::XLA_FFI_DataType_XLA_FFI_DataType_U64 => {
                i64::try_from((p as *const u64).read_unaligned()).ok()?
            }
            _ => return None,
        })
    }
}

pub(crate) unsafe fn read_float(dtype: sys::XLA_FFI_DataType, p: *const u8) -> Option<f64> {
    unsafe {
        Some(match dtype {
            sys::XLA_FFI_DataType_XLA_FFI_DataType_F32 => {
                kernel_core::widen_f32_attr((p as *const f32).read_unaligned())
            }
            sys::XLA_FFI_DataType_XLA_FFI_DataType_F64 => (p as *const f64).read_unaligned(),
            sys::XLA_FFI_DataType_XLA_FFI_DataType_F16 => {
                kernel_core::half::f16::from_bits((p as *const u16).read_unaligned()).to_f64()
            }
            sys::XLA_FFI_DataType_XLA_FFI_DataType_BF16 => {
                kernel_core::half::bf16::from_bits((p as *const u16).read_unaligned()).to_f64()
            }
            _ => return None,
        })
    }
}

/// Decode one attribute into kernel-core's [`AttrValue`] (SPEC §1: ints as int32/int64,
/// floats as float32/float64, bools as PRED scalars, strings; int and float arrays too).
pub(crate) unsafe fn decode_attr(
    name: &str,
    ty: sys::XLA_FFI_AttrType,
    p: *mut std::ffi::c_void,
) -> Result<AttrValue> {
    if p.is_null() {
        return Err(Error::internal(format!("attribute `{name}`: null value")));
    }
    match ty {
        sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR => {
            let s = unsafe { &*(p as *const sys::XLA_FFI_Scalar) };
            let v = s.value as *const u8;
            if s.dtype == sys::XLA_FFI_DataType_XLA_FFI_DataType_PRED {
                return Ok(AttrValue::Bool(unsafe { *v } != 0));
            }
            if let Some(i) = unsafe { read_int(s.dtype, v) } {
                return Ok(AttrValue::Int(i));
            }
            if let Some(f) = unsafe { read_float(s.dtype, v) } {
                return Ok(AttrValue::Float(f));
            }
            Err(Error::invalid(format!(
                "attribute `{name}` has unsupported scalar type {}",
                xla_dtype_name(s.dtype)
            )))
        }
        sys::XLA_FFI_AttrType_XLA_FFI_AttrType_STRING => {
            let s = unsafe { span_str(p as *const sys::XLA_FFI_ByteSpan)? };
            Ok(AttrValue::Str(s.to_string()))
        }
        sys::XLA_FFI_AttrType_XLA_FFI_AttrType_ARRAY => {
            let a = unsafe { &*(p as *const sys::XLA_FFI_Array) };
            let base = a.data as *const u8;
            let size = match dtype_from_xla(a.dtype) {
                Some(d) => d.size(),
                None => match a.dtype {
                    sys::XLA_FFI_DataType_XLA_FFI_DataType_S8
                    | sys::XLA_FFI_DataType_XLA_FFI_DataType_U8 => 1,
                    sys::XLA_FFI_DataType_XLA_FFI_DataType_S16
                    | sys::XLA_FFI_DataType_XLA_FFI_DataType_U16 => 2,
                    sys::XLA_FFI_DataType_XLA_FFI_DataType_U32 => 4,
                    sys::XLA_FFI_DataType_XLA_FFI_DataType_U64 => 8,
                    _ => 0,
                },
            };
            if read_float_ok(a.dtype) {
                let v: Vec<f64> = (0..a.size)
                    .map(|i| unsafe { read_float(a.dtype, base.add(i * size)).unwrap_or(0.0) })
                    .collect();
                return Ok(AttrValue::FloatList(v));
            }
            if size > 0 && a.dtype != sys::XLA_FFI_DataType_XLA_FFI_DataType_PRED {
                let v: Option<Vec<i64>> = (0..a.size)
                    .map(|i| unsafe { read_int(a.dtype, base.add(i * size)) })
                    .collect();
                return v.map(AttrValue::IntList).ok_or_else(|| {
                    Error::invalid(format!("attribute `{name}`: int array out of range"))
                });
            }
            Err(Error::invalid(format!(
                "attribute `{name}` is an array of unsupported type {}",
                xla_dtype_name(a.dtype)
            )))
        }
        sys::XLA_FFI_AttrType_XLA_FFI_AttrType_DICTIONARY => Err(Error::invalid(format!(
            "attribute `{name}` is a dictionary; polyop attributes are scalars, strings or arrays"
        ))),
        other => Err(Error::invalid(format!(
            "attribute `{name}` has unknown FFI attribute type {other}"
        ))),
    }
}

pub(crate) fn read_float_ok(d: sys::XLA_FFI_DataType) -> bool {
    matches!(
        d,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_F16
            | sys::XLA_FFI_DataType_XLA_FFI_DataType_BF16
            | sys::XLA_FFI_DataType_XLA_FFI_DataType_F32
            | sys::XLA_FFI_DataType_XLA_FFI_DataType_F64
    )
}

/// Byte size of an XLA element type usable in an attribute key (`None`: not keyable).
pub(crate) fn xla_elem_size(d: sys::XLA_FFI_DataType) -> Option<usize> {
    Some(match d {
        sys::XLA_FFI_DataType_XLA_FFI_DataType_PRED
        | sys::XLA_FFI_DataType_XLA_FFI_DataType_S8
        | sys::XLA_FFI_DataType_XLA_FFI_DataType_U8 => 1,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_S16
        | sys::XLA_FFI_DataType_XLA_FFI_DataType_U16
        | sys::XLA_FFI_DataType_XLA_FFI_DataType_F16
        | sys::XLA_FFI_DataType_XLA_FFI_DataType_BF16 => 2,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_S32
        | sys::XLA_FFI_DataType_XLA_FFI_DataType_U32
        | sys::XLA_FFI_DataType_XLA_FFI_DataType_F32 => 4,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_S64
        | sys::XLA_FFI_DataType_XLA_FFI_DataType_U64
        | sys::XLA_FFI_DataType_XLA_FFI_DataType_F64 => 8,
        _ => return None,
    })
}

/// Feed an unambiguous byte encoding of the frame's attributes (count; per attribute: name,
/// type, dtype, value bytes, lengths prefixed) to `sink`, chunk by chunk, without allocating.
/// Stops early when `sink` returns false. Returns false when `sink` did, or when an attribute
/// cannot be encoded (null pointers, dictionaries, unknown dtypes).
pub(crate) unsafe fn attrs_key(
    attrs: &sys::XLA_FFI_Attrs,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> bool {
    let n = attrs.size.max(0) as usize;
    if !sink(&n.to_ne_bytes()) {
        return false;
    }
    for i in 0..n {
        let name = unsafe { *attrs.names.add(i) };
        let ty = unsafe { *attrs.types.add(i) };
        let p = unsafe { *attrs.attrs.add(i) };
        if name.is_null() || p.is_null() {
            return false;
        }
        let name = unsafe { &*name };
        let name_bytes: &[u8] = if name.len == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(name.ptr as *const u8, name.len) }
        };
        let (dtype, value): (sys::XLA_FFI_DataType, &[u8]) = match ty {
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR => {
                let s = unsafe { &*(p as *const sys::XLA_FFI_Scalar) };
                let Some(size) = xla_elem_size(s.dtype) else {
                    return false;
                };
                if s.value.is_null() {
                    return false;
                }
                (s.dtype, unsafe {
                    std::slice::from_raw_parts(s.value as *const u8, size)
                })
            }
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_STRING => {
                let b = unsafe { &*(p as *const sys::XLA_FFI_ByteSpan) };
                let v: &[u8] = if b.len == 0 {
                    &[]
                } else {
                    unsafe { std::slice::from_raw_parts(b.ptr as *const u8, b.len) }
                };
                (0, v)
            }
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_ARRAY => {
                let a = unsafe { &*(p as *const sys::XLA_FFI_Array) };
                let Some(size) = xla_elem_size(a.dtype) else {
                    return false;
                };
                let v: &[u8] = if a.size == 0 {
                    &[]
                } else if a.data.is_null() {
                    return false;
                } else {
                    unsafe { std::slice::from_raw_parts(a.data as *const u8, a.size * size) }
                };
                (a.dtype, v)
            }
            _ => return false,
        };
        let ok = sink(&name_bytes.len().to_ne_bytes())
            && sink(name_bytes)
            && sink(&(ty as u64).to_ne_bytes())
            && sink(&(dtype as u64).to_ne_bytes())
            && sink(&value.len().to_ne_bytes())
            && sink(value);
        if !ok {
            return false;
        }
    }
    true
}

pub(crate) unsafe fn decode_attrs(
    op: &OpDef,
    attrs: &sys::XLA_FFI_Attrs,
) -> Result<kernel_core::Attrs> {
    let n = attrs.size.max(0) as usize;
    let mut given: Vec<(String, AttrValue)> = Vec::with_capacity(n);
    for i in 0..n {
        let name = unsafe { span_str(*attrs.names.add(i))? }.to_string();
        let ty = unsafe { *attrs.types.add(i) };
        let v = unsafe { decode_attr(&name, ty, *attrs.attrs.add(i))? };
        given.push((name, v));
    }
    op.bind_attrs(given.iter().map(|(n, v)| (n.as_str(), v.clone())))
}
