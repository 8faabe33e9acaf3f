//! Attribute source: the call frame's typed attributes (scalars, strings, arrays), read once
//! as borrowed bytes. The same walk gives the call-site key (so a repeated call reuses its
//! bound attributes) and, on a miss, the values bound to the schema (SPEC §1: ints as
//! int8..int64/uint8..uint64, floats as float16..float64, bools as PRED scalars, strings,
//! int and float arrays).

// The bindgen constant names (`XLA_FFI_DataType_XLA_FFI_DataType_F32`) are used unqualified.
#![allow(non_upper_case_globals)]

use crate::sys;
use crate::tensor::xla_dtype_name;
use kernel_core::ffi::FromNeBytes;
use kernel_core::half::{bf16, f16};
use kernel_core::{widen_f32_attr, AttrValue, Attrs, Error, OpDef, Result};
use sys::XLA_FFI_AttrType as AttrType;
use sys::XLA_FFI_DataType as DataType;

/// One attribute as the frame holds it.
struct Raw<'a> {
    name: &'a [u8],
    ty: AttrType,
    /// Element type of a scalar or array (0 for a string).
    dtype: DataType,
    /// The value's bytes: one element, the array's elements, or the string.
    bytes: &'a [u8],
}

/// Byte size of an XLA element type attributes may use.
fn elem_size(d: DataType) -> Option<usize> {
    use sys::*;
    Some(match d {
        XLA_FFI_DataType_XLA_FFI_DataType_PRED
        | XLA_FFI_DataType_XLA_FFI_DataType_S8
        | XLA_FFI_DataType_XLA_FFI_DataType_U8 => 1,
        XLA_FFI_DataType_XLA_FFI_DataType_S16
        | XLA_FFI_DataType_XLA_FFI_DataType_U16
        | XLA_FFI_DataType_XLA_FFI_DataType_F16
        | XLA_FFI_DataType_XLA_FFI_DataType_BF16 => 2,
        XLA_FFI_DataType_XLA_FFI_DataType_S32
        | XLA_FFI_DataType_XLA_FFI_DataType_U32
        | XLA_FFI_DataType_XLA_FFI_DataType_F32 => 4,
        XLA_FFI_DataType_XLA_FFI_DataType_S64
        | XLA_FFI_DataType_XLA_FFI_DataType_U64
        | XLA_FFI_DataType_XLA_FFI_DataType_F64 => 8,
        _ => return None,
    })
}

/// `len` bytes at `p` (empty when `len` is 0, whatever `p` is).
///
/// # Safety
/// Unless `len` is 0, `p` points to `len` readable bytes that live for `'a`.
unsafe fn bytes<'a>(p: *const std::ffi::c_void, len: usize) -> Result<&'a [u8]> {
    match (len, p.is_null()) {
        (0, _) => Ok(&[]),
        (_, true) => Err(Error::internal("null attribute data")),
        // SAFETY: this function's contract.
        _ => Ok(unsafe { std::slice::from_raw_parts(p as *const u8, len) }),
    }
}

/// The frame's attributes, in order, as borrowed bytes.
///
/// # Safety
/// `attrs` is the attribute list of a live call frame.
unsafe fn raw_attrs(attrs: &sys::XLA_FFI_Attrs) -> impl Iterator<Item = Result<Raw<'_>>> {
    (0..attrs.size.max(0) as usize).map(move |i| {
        // SAFETY: i < attrs.size, the length of the three arrays of the live frame (this
        // function's contract). The same holds for every block in this closure, and each entry
        // points to a value of the type its `types` entry names, alive for the call.
        let (name, ty, p) = unsafe { (*attrs.names.add(i), *attrs.types.add(i), *attrs.attrs.add(i)) };
        if name.is_null() || p.is_null() {
            return Err(Error::internal("null attribute name or value"));
        }
        // SAFETY: see the closure.
        let name = unsafe { bytes((*name).ptr as *const _, (*name).len) }?;
        let label = || String::from_utf8_lossy(name).into_owned();
        let (dtype, bytes) = match ty {
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR => {
                // SAFETY: see the closure.
                let s = unsafe { &*(p as *const sys::XLA_FFI_Scalar) };
                let n = elem_size(s.dtype).ok_or_else(|| {
                    let t = xla_dtype_name(s.dtype);
                    Error::invalid(format!("attribute `{}` has unsupported scalar type {t}", label()))
                })?;
                // SAFETY: a scalar holds one element of its dtype.
                (s.dtype, unsafe { bytes(s.value, n) }?)
            }
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_STRING => {
                // SAFETY: see the closure.
                let b = unsafe { &*(p as *const sys::XLA_FFI_ByteSpan) };
                // SAFETY: a byte span of `len` bytes.
                (0, unsafe { bytes(b.ptr as *const _, b.len) }?)
            }
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_ARRAY => {
                // SAFETY: see the closure.
                let a = unsafe { &*(p as *const sys::XLA_FFI_Array) };
                let n = elem_size(a.dtype).ok_or_else(|| {
                    let t = xla_dtype_name(a.dtype);
                    Error::invalid(format!("attribute `{}` is an array of unsupported type {t}", label()))
                })?;
                // SAFETY: an array of `size` elements of its dtype.
                (a.dtype, unsafe { bytes(a.data, a.size * n) }?)
            }
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_DICTIONARY => {
                return Err(Error::invalid(format!(
                    "attribute `{}` is a dictionary; polyop attributes are scalars, strings or arrays",
                    label()
                )))
            }
            other => {
                return Err(Error::invalid(format!(
                    "attribute `{}` has unknown FFI attribute type {other}",
                    label()
                )))
            }
        };
        Ok(Raw { name, ty, dtype, bytes })
    })
}

/// Write the frame's attributes as a call-site key; false when one cannot be read (binding
/// then reports what is wrong with it).
///
/// # Safety
/// `attrs` is the attribute list of a live call frame.
pub(crate) unsafe fn attrs_key(attrs: &sys::XLA_FFI_Attrs, key: &mut Vec<u8>) -> bool {
    // SAFETY: this function's contract.
    for raw in unsafe { raw_attrs(attrs) } {
        let Ok(r) = raw else { return false };
        for part in [r.name, r.bytes] {
            key.extend_from_slice(&part.len().to_ne_bytes());
            key.extend_from_slice(part);
        }
        key.extend_from_slice(&(r.ty as u64).to_ne_bytes());
        key.extend_from_slice(&(r.dtype as u64).to_ne_bytes());
    }
    true
}

fn int(d: DataType, b: &[u8]) -> Option<i64> {
    use sys::*;
    Some(match d {
        XLA_FFI_DataType_XLA_FFI_DataType_S8 => i8::from_ne(b)?.into(),
        XLA_FFI_DataType_XLA_FFI_DataType_S16 => i16::from_ne(b)?.into(),
        XLA_FFI_DataType_XLA_FFI_DataType_S32 => i32::from_ne(b)?.into(),
        XLA_FFI_DataType_XLA_FFI_DataType_S64 => i64::from_ne(b)?,
        XLA_FFI_DataType_XLA_FFI_DataType_U8 => u8::from_ne(b)?.into(),
        XLA_FFI_DataType_XLA_FFI_DataType_U16 => u16::from_ne(b)?.into(),
        XLA_FFI_DataType_XLA_FFI_DataType_U32 => u32::from_ne(b)?.into(),
        XLA_FFI_DataType_XLA_FFI_DataType_U64 => i64::try_from(u64::from_ne(b)?).ok()?,
        _ => return None,
    })
}

fn float(d: DataType, b: &[u8]) -> Option<f64> {
    use sys::*;
    Some(match d {
        XLA_FFI_DataType_XLA_FFI_DataType_F32 => widen_f32_attr(f32::from_ne(b)?),
        XLA_FFI_DataType_XLA_FFI_DataType_F64 => f64::from_ne(b)?,
        XLA_FFI_DataType_XLA_FFI_DataType_F16 => f16::from_ne(b)?.to_f64(),
        XLA_FFI_DataType_XLA_FFI_DataType_BF16 => bf16::from_ne(b)?.to_f64(),
        _ => return None,
    })
}

fn value(r: &Raw, name: &str) -> Result<AttrValue> {
    let pred = r.dtype == sys::XLA_FFI_DataType_XLA_FFI_DataType_PRED;
    let unsupported = |what: &str| {
        Error::invalid(format!(
            "attribute `{name}` {what} {}",
            xla_dtype_name(r.dtype)
        ))
    };
    match r.ty {
        sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR if pred => {
            Ok(AttrValue::Bool(r.bytes[0] != 0))
        }
        sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR => int(r.dtype, r.bytes)
            .map(AttrValue::Int)
            .or_else(|| float(r.dtype, r.bytes).map(AttrValue::Float))
            .ok_or_else(|| unsupported("has unsupported scalar type")),
        sys::XLA_FFI_AttrType_XLA_FFI_AttrType_STRING => std::str::from_utf8(r.bytes)
            .map(|s| AttrValue::Str(s.to_string()))
            .map_err(|_| Error::invalid("attribute string is not UTF-8")),
        _ if pred => Err(unsupported("is an array of unsupported type")),
        _ => {
            let n = elem_size(r.dtype).unwrap_or(1);
            let elems = r.bytes.chunks_exact(n);
            if let Some(v) = elems
                .clone()
                .map(|b| float(r.dtype, b))
                .collect::<Option<Vec<_>>>()
            {
                return Ok(AttrValue::FloatList(v));
            }
            elems
                .map(|b| int(r.dtype, b))
                .collect::<Option<Vec<_>>>()
                .map(AttrValue::IntList)
                .ok_or_else(|| {
                    Error::invalid(format!("attribute `{name}`: int array out of range"))
                })
        }
    }
}

/// The frame's attributes bound to the op's schema.
///
/// # Safety
/// `attrs` is the attribute list of a live call frame.
pub(crate) unsafe fn decode_attrs(op: &OpDef, attrs: &sys::XLA_FFI_Attrs) -> Result<Attrs> {
    let mut given: Vec<(String, AttrValue)> = Vec::new();
    // SAFETY: this function's contract.
    for raw in unsafe { raw_attrs(attrs) } {
        let r = raw?;
        let name = std::str::from_utf8(r.name)
            .map_err(|_| Error::invalid("attribute name is not UTF-8"))?
            .to_string();
        let v = value(&r, &name)?;
        given.push((name, v));
    }
    op.bind_attrs(given.iter().map(|(n, v)| (n.as_str(), v.clone())))
}
