//! Fake XLA FFI call frames for the adapter's Rust tests: an API table whose only function
//! creates errors, buffer descriptors, attributes as raw bytes, and one `call` that builds a
//! complete frame around them.
#![allow(dead_code)] // each test binary uses part of it

use polyop_xla::sys;
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

pub type Handler = unsafe extern "C" fn(*mut sys::XLA_FFI_CallFrame) -> *mut sys::XLA_FFI_Error;

/// Fake errors: a boxed (code, message).
struct FakeError(u32, String);

unsafe extern "C" fn fake_error_create(
    args: *mut sys::XLA_FFI_Error_Create_Args,
) -> *mut sys::XLA_FFI_Error {
    // SAFETY: the adapter calls `XLA_FFI_Error_Create` with a valid argument struct.
    let a = unsafe { &*args };
    // SAFETY: its `message` is a NUL-terminated string alive across the call.
    let msg = unsafe { CStr::from_ptr(a.message) }
        .to_string_lossy()
        .into_owned();
    Box::into_raw(Box::new(FakeError(a.errc, msg))) as *mut sys::XLA_FFI_Error
}

pub fn fake_api(major: i32, minor: i32) -> sys::XLA_FFI_Api {
    // SAFETY: every field is an integer, a raw pointer or an Option<fn>; zero is valid.
    let mut api: sys::XLA_FFI_Api = unsafe { std::mem::zeroed() };
    api.struct_size = sys::XLA_FFI_Api_STRUCT_SIZE as usize;
    api.api_version = sys::XLA_FFI_Api_Version {
        struct_size: sys::XLA_FFI_Api_Version_STRUCT_SIZE as usize,
        extension_start: null_mut(),
        major_version: major,
        minor_version: minor,
    };
    api.XLA_FFI_Error_Create = Some(fake_error_create);
    api
}

pub fn take_error(e: *mut sys::XLA_FFI_Error) -> Option<(u32, String)> {
    if e.is_null() {
        None
    } else {
        // SAFETY: every error here comes from `fake_error_create`, a leaked
        // `Box<FakeError>`, and each is taken once.
        let b = unsafe { Box::from_raw(e as *mut FakeError) };
        Some((b.0, b.1))
    }
}

/// A buffer descriptor with its dims, over the caller's memory or owned zeros.
pub struct Buf {
    buf: sys::XLA_FFI_Buffer,
    dims: Vec<i64>,
    _owned: Vec<u64>,
}

/// A descriptor of `dims` over `data` (the caller keeps it alive for the call).
pub fn buffer(dtype: sys::XLA_FFI_DataType, dims: &[i64], data: *mut c_void) -> Box<Buf> {
    let mut b = Box::new(Buf {
        // SAFETY: every field of `XLA_FFI_Buffer` is an integer or a raw pointer; zero is valid.
        buf: unsafe { std::mem::zeroed() },
        dims: dims.to_vec(),
        _owned: Vec::new(),
    });
    b.buf.struct_size = sys::XLA_FFI_Buffer_STRUCT_SIZE as usize;
    b.buf.dtype = dtype;
    b.buf.data = data;
    b.buf.rank = dims.len() as i64;
    b.buf.dims = b.dims.as_mut_ptr();
    b
}

/// A buffer of owned zeros (8 bytes per element: enough for every element type used here).
pub fn zeros(dtype: sys::XLA_FFI_DataType, dims: &[i64]) -> Box<Buf> {
    let n: i64 = dims.iter().product();
    let mut owned = vec![0u64; n.max(1) as usize];
    let mut b = buffer(dtype, dims, owned.as_mut_ptr() as *mut c_void);
    // The heap block does not move when the Vec does.
    b._owned = owned;
    b
}

/// One attribute as a frame holds it: kind (`XLA_FFI_AttrType`), element type, and the bytes
/// of the value (one scalar, the array elements, or the string).
#[derive(Debug, Clone)]
pub struct RawAttr {
    pub name: Vec<u8>,
    pub kind: sys::XLA_FFI_AttrType,
    pub dtype: sys::XLA_FFI_DataType,
    pub elems: usize,
    pub bytes: Vec<u8>,
}

impl RawAttr {
    /// An int64 scalar attribute.
    pub fn i64(name: &str, v: i64) -> Self {
        RawAttr {
            name: name.as_bytes().to_vec(),
            kind: sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR,
            dtype: sys::XLA_FFI_DataType_XLA_FFI_DataType_S64,
            elems: 1,
            bytes: v.to_ne_bytes().to_vec(),
        }
    }
    /// A string attribute.
    pub fn str(name: &str, v: &str) -> Self {
        RawAttr {
            name: name.as_bytes().to_vec(),
            kind: sys::XLA_FFI_AttrType_XLA_FFI_AttrType_STRING,
            dtype: 0,
            elems: v.len(),
            bytes: v.as_bytes().to_vec(),
        }
    }
}

/// Call `handler` with operands, results and attributes.
pub fn call(
    handler: Handler,
    api: &sys::XLA_FFI_Api,
    args: &mut [Box<Buf>],
    rets: &mut [Box<Buf>],
    attrs: &[RawAttr],
) -> Option<(u32, String)> {
    let mut arg_types = vec![sys::XLA_FFI_ArgType_XLA_FFI_ArgType_BUFFER; args.len()];
    let mut arg_ptrs: Vec<*mut c_void> = args
        .iter_mut()
        .map(|b| &mut b.buf as *mut _ as *mut c_void)
        .collect();
    let mut ret_types = vec![sys::XLA_FFI_RetType_XLA_FFI_RetType_BUFFER; rets.len()];
    let mut ret_ptrs: Vec<*mut c_void> = rets
        .iter_mut()
        .map(|b| &mut b.buf as *mut _ as *mut c_void)
        .collect();
    // Value storage: 8-byte aligned, at least 16 bytes, so a scalar of any declared type reads
    // inside it.
    let mut storage: Vec<Vec<u64>> = attrs
        .iter()
        .map(|a| {
            let mut v = vec![0u64; a.bytes.len().div_ceil(8).max(2)];
            // SAFETY: `v` has at least `a.bytes.len()` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    a.bytes.as_ptr(),
                    v.as_mut_ptr() as *mut u8,
                    a.bytes.len(),
                )
            };
            v
        })
        .collect();
    let mut names: Vec<sys::XLA_FFI_ByteSpan> = attrs
        .iter()
        .map(|a| sys::XLA_FFI_ByteSpan {
            ptr: a.name.as_ptr() as *const _,
            len: a.name.len(),
        })
        .collect();
    let mut name_ptrs: Vec<*mut sys::XLA_FFI_ByteSpan> =
        names.iter_mut().map(|n| n as *mut _).collect();
    let mut scalars: Vec<sys::XLA_FFI_Scalar> = Vec::new();
    let mut spans: Vec<sys::XLA_FFI_ByteSpan> = Vec::new();
    let mut arrays: Vec<sys::XLA_FFI_Array> = Vec::new();
    for (a, s) in attrs.iter().zip(storage.iter_mut()) {
        let p = s.as_mut_ptr() as *mut c_void;
        scalars.push(sys::XLA_FFI_Scalar {
            dtype: a.dtype,
            value: p,
        });
        spans.push(sys::XLA_FFI_ByteSpan {
            ptr: p as *const _,
            len: a.bytes.len(),
        });
        arrays.push(sys::XLA_FFI_Array {
            dtype: a.dtype,
            size: a.elems,
            data: p,
        });
    }
    let mut attr_types: Vec<sys::XLA_FFI_AttrType> = attrs.iter().map(|a| a.kind).collect();
    let mut attr_ptrs: Vec<*mut c_void> = Vec::new();
    for (i, a) in attrs.iter().enumerate() {
        attr_ptrs.push(match a.kind {
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR => {
                &mut scalars[i] as *mut _ as *mut c_void
            }
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_ARRAY => &mut arrays[i] as *mut _ as *mut c_void,
            // strings, and the kinds the adapter must refuse without reading (a dictionary,
            // an unknown kind): a byte span, so even a wrong read stays in bounds
            _ => &mut spans[i] as *mut _ as *mut c_void,
        });
    }
    let mut frame = sys::XLA_FFI_CallFrame {
        struct_size: sys::XLA_FFI_CallFrame_STRUCT_SIZE as usize,
        extension_start: null_mut(),
        api,
        ctx: null_mut(),
        stage: sys::XLA_FFI_ExecutionStage_XLA_FFI_ExecutionStage_EXECUTE,
        args: sys::XLA_FFI_Args {
            struct_size: sys::XLA_FFI_Args_STRUCT_SIZE as usize,
            extension_start: null_mut(),
            size: args.len() as i64,
            types: arg_types.as_mut_ptr(),
            args: arg_ptrs.as_mut_ptr(),
        },
        rets: sys::XLA_FFI_Rets {
            struct_size: sys::XLA_FFI_Rets_STRUCT_SIZE as usize,
            extension_start: null_mut(),
            size: rets.len() as i64,
            types: ret_types.as_mut_ptr(),
            rets: ret_ptrs.as_mut_ptr(),
        },
        attrs: sys::XLA_FFI_Attrs {
            struct_size: sys::XLA_FFI_Attrs_STRUCT_SIZE as usize,
            extension_start: null_mut(),
            size: attrs.len() as i64,
            types: attr_types.as_mut_ptr(),
            names: name_ptrs.as_mut_ptr(),
            attrs: attr_ptrs.as_mut_ptr(),
        },
        future: null_mut(),
    };
    // SAFETY: `frame` is complete: every array holds `size` entries, each entry points to a
    // value of the declared kind whose data (scalar storage of >= 16 bytes, `elems` elements
    // of at most 8 bytes for arrays, `len` bytes for spans) is alive for the call.
    take_error(unsafe { handler(&mut frame) })
}
