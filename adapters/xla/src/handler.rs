//! The one generic XLA FFI handler: decodes a call frame (buffers with dtype and dims, typed
//! attributes by name), looks the op up in a kernel-core [`Registry`], checks XLA's
//! pre-allocated outputs against kernel-core's shape inference, and runs the kernel on XLA's
//! intra-op thread pool. Every failure becomes an `XLA_FFI_Error`; no panic escapes.

use crate::ffi_sys as sys;
use crate::pool::XlaPool;
use kernel_core::call::{self, Preallocated};
use kernel_core::{
    default_pool, AttrValue, CallSites, DType, Error, ErrorKind, OpDef, Phase, Registry, Result,
    TensorRef, ThreadPool,
};
use std::ffi::CString;

/// The FFI API version these bindings were generated from (jaxlib 0.10.2's c_api.h).
pub const API_MAJOR: i32 = sys::XLA_FFI_API_MAJOR as i32;
pub const API_MINOR: i32 = sys::XLA_FFI_API_MINOR as i32;
/// The jaxlib whose `c_api.h` generated `ffi_sys.rs`.
pub const PINNED_JAXLIB: &str = "0.10.2";

/// Handler traits reported through the metadata extension. polyop kernels run on the host, so
/// they are not CUDA-graph (command buffer) compatible.
pub const TRAITS: sys::XLA_FFI_Handler_Traits = 0;

pub type FfiError = *mut sys::XLA_FFI_Error;

/// Destroy an error returned to us by an API call.
///
/// # Safety
/// `api` is a valid API table and `err` an error it created.
pub unsafe fn destroy_error(api: *const sys::XLA_FFI_Api, err: FfiError) {
    if api.is_null() || err.is_null() {
        return;
    }
    if let Some(destroy) = unsafe { (*api).XLA_FFI_Error_Destroy } {
        let mut args = sys::XLA_FFI_Error_Destroy_Args {
            struct_size: sys::XLA_FFI_Error_Destroy_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            error: err,
        };
        unsafe { destroy(&mut args) };
    }
}

fn error_code(kind: ErrorKind) -> sys::XLA_FFI_Error_Code {
    match kind {
        ErrorKind::InvalidArgument => sys::XLA_FFI_Error_Code_XLA_FFI_Error_Code_INVALID_ARGUMENT,
        ErrorKind::Unsupported => sys::XLA_FFI_Error_Code_XLA_FFI_Error_Code_UNIMPLEMENTED,
        ErrorKind::Internal => sys::XLA_FFI_Error_Code_XLA_FFI_Error_Code_INTERNAL,
    }
}

/// Turn a polyop error into an FFI error owned by XLA. Returns null only when the API table
/// cannot create errors at all (then nothing better can be done).
///
/// # Safety
/// `api` is null or a valid API table.
pub unsafe fn make_error(api: *const sys::XLA_FFI_Api, err: &Error) -> FfiError {
    if api.is_null() {
        return std::ptr::null_mut();
    }
    let Some(create) = (unsafe { (*api).XLA_FFI_Error_Create }) else {
        return std::ptr::null_mut();
    };
    let msg = CString::new(err.to_string().replace('\0', "\\0")).unwrap_or_default();
    let mut args = sys::XLA_FFI_Error_Create_Args {
        struct_size: sys::XLA_FFI_Error_Create_Args_STRUCT_SIZE as usize,
        extension_start: std::ptr::null_mut(),
        message: msg.as_ptr(),
        errc: error_code(err.kind),
    };
    // XLA copies the message into its own status object.
    unsafe { create(&mut args) }
}

fn xla_dtype_name(d: sys::XLA_FFI_DataType) -> String {
    let n = match d {
        sys::XLA_FFI_DataType_XLA_FFI_DataType_PRED => "bool",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_S8 => "int8",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_S16 => "int16",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_S32 => "int32",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_S64 => "int64",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_U8 => "uint8",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_U16 => "uint16",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_U32 => "uint32",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_U64 => "uint64",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_F16 => "float16",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_BF16 => "bfloat16",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_F32 => "float32",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_F64 => "float64",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_C64 => "complex64",
        sys::XLA_FFI_DataType_XLA_FFI_DataType_C128 => "complex128",
        other => return format!("XLA dtype #{other}"),
    };
    n.to_string()
}

/// XLA element type -> kernel-core dtype.
pub fn dtype_from_xla(d: sys::XLA_FFI_DataType) -> Option<DType> {
    Some(match d {
        sys::XLA_FFI_DataType_XLA_FFI_DataType_PRED => DType::Bool,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_S32 => DType::I32,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_S64 => DType::I64,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_F16 => DType::F16,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_BF16 => DType::BF16,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_F32 => DType::F32,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_F64 => DType::F64,
        _ => return None,
    })
}

/// kernel-core dtype -> XLA element type.
pub fn dtype_to_xla(d: DType) -> sys::XLA_FFI_DataType {
    match d {
        DType::Bool => sys::XLA_FFI_DataType_XLA_FFI_DataType_PRED,
        DType::I32 => sys::XLA_FFI_DataType_XLA_FFI_DataType_S32,
        DType::I64 => sys::XLA_FFI_DataType_XLA_FFI_DataType_S64,
        DType::F16 => sys::XLA_FFI_DataType_XLA_FFI_DataType_F16,
        DType::BF16 => sys::XLA_FFI_DataType_XLA_FFI_DataType_BF16,
        DType::F32 => sys::XLA_FFI_DataType_XLA_FFI_DataType_F32,
        DType::F64 => sys::XLA_FFI_DataType_XLA_FFI_DataType_F64,
    }
}

/// A decoded buffer: dtype (as XLA reported it), dims, data.
struct RawBuffer {
    xla_dtype: sys::XLA_FFI_DataType,
    dims: Vec<usize>,
    data: *mut u8,
}

unsafe fn decode_buffer(p: *mut std::ffi::c_void, what: impl Fn() -> String) -> Result<RawBuffer> {
    if p.is_null() {
        return Err(Error::internal(format!("{}: null buffer", what())));
    }
    let b = unsafe { &*(p as *const sys::XLA_FFI_Buffer) };
    if b.struct_size < sys::XLA_FFI_Buffer_STRUCT_SIZE as usize {
        return Err(Error::internal(format!(
            "{}: XLA_FFI_Buffer size {} < {} (FFI version skew)",
            what(),
            b.struct_size,
            sys::XLA_FFI_Buffer_STRUCT_SIZE
        )));
    }
    if b.rank < 0 {
        return Err(Error::internal(format!("{}: negative rank", what())));
    }
    let dims: Vec<usize> = if b.rank == 0 {
        Vec::new()
    } else {
        let d = unsafe { std::slice::from_raw_parts(b.dims, b.rank as usize) };
        if d.iter().any(|&x| x < 0) {
            return Err(Error::invalid(format!(
                "{}: dynamic or negative dims {d:?} are not supported (static shapes only)",
                what()
            )));
        }
        d.iter().map(|&x| x as usize).collect()
    };
    Ok(RawBuffer {
        xla_dtype: b.dtype,
        dims,
        data: b.data as *mut u8,
    })
}

unsafe fn span_str<'a>(s: *const sys::XLA_FFI_ByteSpan) -> Result<&'a str> {
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

unsafe fn read_int(dtype: sys::XLA_FFI_DataType, p: *const u8) -> Option<i64> {
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

unsafe fn read_float(dtype: sys::XLA_FFI_DataType, p: *const u8) -> Option<f64> {
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
unsafe fn decode_attr(
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

fn read_float_ok(d: sys::XLA_FFI_DataType) -> bool {
    matches!(
        d,
        sys::XLA_FFI_DataType_XLA_FFI_DataType_F16
            | sys::XLA_FFI_DataType_XLA_FFI_DataType_BF16
            | sys::XLA_FFI_DataType_XLA_FFI_DataType_F32
            | sys::XLA_FFI_DataType_XLA_FFI_DataType_F64
    )
}

/// Check the runtime's API table against the version compiled in. Major must match (ABI);
/// the runtime's minor must be at least ours (we use fields added up to our minor).
///
/// # Safety
/// `api` is null or points to an API table.
pub unsafe fn check_api(api: *const sys::XLA_FFI_Api) -> Result<()> {
    if api.is_null() {
        return Err(Error::internal("call frame has no XLA_FFI_Api"));
    }
    let a = unsafe { &*api };
    let (major, minor) = (a.api_version.major_version, a.api_version.minor_version);
    if major != API_MAJOR || minor < API_MINOR {
        return Err(Error::unsupported(format!(
            "XLA FFI API version mismatch: the runtime provides {major}.{minor}, libpolyop_xla was \
             built against {API_MAJOR}.{API_MINOR} (jaxlib {PINNED_JAXLIB}); rebuild polyop \
             against the installed jaxlib (adapters/xla/scripts/regen-bindings.sh)"
        )));
    }
    if a.struct_size < sys::XLA_FFI_Api_STRUCT_SIZE as usize {
        return Err(Error::unsupported(format!(
            "XLA_FFI_Api is {} bytes, expected at least {} (jaxlib {PINNED_JAXLIB}); version skew",
            a.struct_size,
            sys::XLA_FFI_Api_STRUCT_SIZE
        )));
    }
    Ok(())
}

/// Answer XLA's metadata query: the API version this handler was compiled against, and its
/// traits. Returns `true` when the frame was a metadata query.
unsafe fn populate_metadata(frame: &sys::XLA_FFI_CallFrame) -> Result<bool> {
    let ext = frame.extension_start;
    if ext.is_null() {
        return Ok(false);
    }
    let base = unsafe { &*ext };
    if base.type_ != sys::XLA_FFI_Extension_Type_XLA_FFI_Extension_Metadata {
        return Ok(false);
    }
    if base.struct_size < sys::XLA_FFI_Metadata_Extension_STRUCT_SIZE as usize {
        return Err(Error::internal(format!(
            "XLA_FFI_Metadata_Extension is {} bytes, expected at least {}; version skew",
            base.struct_size,
            sys::XLA_FFI_Metadata_Extension_STRUCT_SIZE
        )));
    }
    let me = unsafe { &*(ext as *const sys::XLA_FFI_Metadata_Extension) };
    if me.metadata.is_null() {
        return Err(Error::internal("metadata query without a metadata struct"));
    }
    let md = unsafe { &mut *me.metadata };
    if md.struct_size < sys::XLA_FFI_Metadata_STRUCT_SIZE as usize {
        return Err(Error::internal(format!(
            "XLA_FFI_Metadata is {} bytes, expected at least {}; version skew",
            md.struct_size,
            sys::XLA_FFI_Metadata_STRUCT_SIZE
        )));
    }
    md.api_version = sys::XLA_FFI_Api_Version {
        struct_size: sys::XLA_FFI_Api_Version_STRUCT_SIZE as usize,
        extension_start: std::ptr::null_mut(),
        major_version: API_MAJOR,
        minor_version: API_MINOR,
    };
    md.traits = TRAITS;
    // The state type id (no state) lies past the struct size of older runtimes: write it only
    // when the runtime's struct has room.
    if md.struct_size >= std::mem::size_of::<sys::XLA_FFI_Metadata>() {
        md.state_type_id = sys::XLA_FFI_TypeId { type_id: 0 };
    }
    Ok(true)
}

/// Per exported symbol: the op (looked up once) and its call sites (attributes bound once per
/// distinct attribute set, keyed by their raw call-frame bytes, each with an inference cache).
/// What makes a repeated call (the jitted-program case) skip the registry lookup, attribute
/// decoding and binding, and shape inference. [`export!`](crate::export) gives every handler one.
pub struct OpState {
    op: std::sync::OnceLock<&'static OpDef>,
    sites: CallSites,
}

impl OpState {
    pub const fn new() -> Self {
        OpState {
            op: std::sync::OnceLock::new(),
            sites: CallSites::new(),
        }
    }

    fn op(&self, registry: &'static Registry, name: &str) -> Result<&'static OpDef> {
        if let Some(op) = self.op.get() {
            return Ok(op);
        }
        let op = registry.lookup(name)?;
        Ok(*self.op.get_or_init(|| op))
    }
}

impl Default for OpState {
    fn default() -> Self {
        Self::new()
    }
}

/// Byte size of an XLA element type usable in an attribute key (`None`: not keyable).
fn xla_elem_size(d: sys::XLA_FFI_DataType) -> Option<usize> {
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
unsafe fn attrs_key(attrs: &sys::XLA_FFI_Attrs, sink: &mut dyn FnMut(&[u8]) -> bool) -> bool {
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

/// The generic handler: run `op_name` from `registry` on the call frame. Looks the op up
/// and binds attributes on every call; exported handlers use [`handle_with`] and keep an
/// [`OpState`] instead.
///
/// # Safety
/// `frame` is null or a call frame handed to an FFI handler by XLA (or a test that builds
/// one with the same guarantees).
pub unsafe fn handle(
    registry: &'static Registry,
    op_name: &str,
    frame: *mut sys::XLA_FFI_CallFrame,
) -> FfiError {
    let state = OpState::new();
    unsafe { handle_with(registry, op_name, &state, frame) }
}

/// [`handle`] with per-symbol state (see [`OpState`]).
///
/// # Safety
/// As for [`handle`].
pub unsafe fn handle_with(
    registry: &'static Registry,
    op_name: &str,
    state: &OpState,
    frame: *mut sys::XLA_FFI_CallFrame,
) -> FfiError {
    if frame.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a non-null frame from XLA (this function's contract).
    let api = unsafe { (*frame).api };
    call::boundary(
        op_name,
        std::ptr::null_mut(),
        // SAFETY: as above.
        || unsafe { handle_inner(registry, op_name, state, frame) },
        // SAFETY: `api` is the frame's API table (checked before use by make_error).
        |e| unsafe { make_error(api, &e) },
    )
}

unsafe fn handle_inner(
    registry: &'static Registry,
    op_name: &str,
    state: &OpState,
    frame: *mut sys::XLA_FFI_CallFrame,
) -> Result<()> {
    let f = unsafe { &*frame };
    if f.struct_size < sys::XLA_FFI_CallFrame_STRUCT_SIZE as usize {
        return Err(Error::unsupported(format!(
            "XLA_FFI_CallFrame is {} bytes, expected at least {} (built against jaxlib {PINNED_JAXLIB}); FFI version skew",
            f.struct_size,
            sys::XLA_FFI_CallFrame_STRUCT_SIZE
        )));
    }
    // Metadata query first: XLA uses our answer to check compatibility itself.
    if unsafe { populate_metadata(f)? } {
        return Ok(());
    }
    unsafe { check_api(f.api)? };
    if f.stage != sys::XLA_FFI_ExecutionStage_XLA_FFI_ExecutionStage_EXECUTE {
        // Only an execute handler is registered; other stages have nothing to do.
        return Ok(());
    }
    let op = state.op(registry, op_name)?;
    if op.flags.inplace {
        return Err(Error::unsupported(
            "in-place ops exist only on the torch surface; use the out-of-place op with XLA",
        ));
    }
    if op.flags.data_dependent_shape {
        return Err(Error::unsupported(
            "the output shape depends on the input data, which XLA cannot express \
             (static shapes only); not available under XLA/JAX",
        ));
    }
    let inputs = unsafe { decode_inputs(op, &f.args)? };
    let site = state.sites.get_or_bind(
        // SAFETY: the frame's attributes are valid for the call.
        |key| unsafe {
            attrs_key(&f.attrs, &mut |chunk| {
                key.extend_from_slice(chunk);
                true
            })
        },
        // SAFETY: as above.
        || unsafe { decode_attrs(op, &f.attrs) },
    )?;
    // Outputs: XLA pre-allocated them; they must be exactly what kernel-core infers.
    let rets = &f.rets;
    let mut buffers = Vec::with_capacity(rets.size.max(0) as usize);
    for i in 0..rets.size.max(0) as usize {
        // SAFETY: i < rets.size, arrays of that length.
        if unsafe { *rets.types.add(i) } != sys::XLA_FFI_RetType_XLA_FFI_RetType_BUFFER {
            return Err(Error::invalid(format!("result {i} is not a buffer")));
        }
        let name = || format!("result `{}`", op.schema.output_name(i));
        // SAFETY: as above.
        let b = unsafe { decode_buffer(*rets.rets.add(i), name)? };
        let dtype = dtype_from_xla(b.xla_dtype).ok_or_else(|| {
            Error::invalid(format!(
                "{} has unsupported dtype {}",
                name(),
                xla_dtype_name(b.xla_dtype)
            ))
        })?;
        buffers.push((dtype, b.dims, b.data));
    }
    // SAFETY: XLA allocated each result buffer, dense row-major, for the call's duration.
    let mut outputs = unsafe { Preallocated::new(op, buffers)? };
    // SAFETY: api and ctx come from the live frame.
    let xla_pool = unsafe { XlaPool::from_call(f.api, f.ctx) };
    let pool: &dyn ThreadPool = match &xla_pool {
        Some(p) => p,
        None => default_pool(),
    };
    call::run(op, &inputs, &site, &mut outputs, pool, Phase::Compute)
}

unsafe fn decode_inputs<'a>(
    op: &OpDef,
    args: &sys::XLA_FFI_Args,
) -> Result<Vec<Option<TensorRef<'a>>>> {
    let num = op.num_inputs();
    let n = args.size.max(0) as usize;
    if n > num {
        return Err(Error::invalid(format!(
            "expected at most {num} tensor operand(s) ({}), got {n}",
            op.schema
                .tensor_args()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut out = Vec::with_capacity(num);
    for (i, arg) in op.schema.tensor_args().enumerate() {
        if i >= n {
            // Absent trailing operand: fine for `Tensor?`, an error for a required one
            // (check_inputs reports it by name).
            out.push(None);
            continue;
        }
        let ty = unsafe { *args.types.add(i) };
        if ty != sys::XLA_FFI_ArgType_XLA_FFI_ArgType_BUFFER {
            return Err(Error::invalid(format!(
                "operand `{}` is not a buffer",
                arg.name
            )));
        }
        let b = unsafe { decode_buffer(*args.args.add(i), || format!("operand `{}`", arg.name))? };
        let dtype = dtype_from_xla(b.xla_dtype).ok_or_else(|| {
            Error::invalid(format!(
                "unsupported dtype {} for input `{}`",
                xla_dtype_name(b.xla_dtype),
                arg.name
            ))
        })?;
        let strides = kernel_core::contiguous_strides(&b.dims);
        // SAFETY: XLA passes dense row-major (default layout) buffers valid for the call.
        out.push(Some(unsafe {
            TensorRef::from_raw(dtype, b.dims, strides, b.data)
        }));
    }
    Ok(out)
}

unsafe fn decode_attrs(op: &OpDef, attrs: &sys::XLA_FFI_Attrs) -> Result<kernel_core::Attrs> {
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
