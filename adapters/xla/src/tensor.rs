//! Framework tensors in and out: XLA dtypes, and views of the call frame's operand and
//! result buffers.

use crate::sys;
use kernel_core::ffi::slice_from_c;
use kernel_core::{DTypeCodes, Error, OpDef, Result, TensorRef};

/// The XLA element types polyop has no dtype for, named in messages.
const OTHER_DTYPES: [(sys::XLA_FFI_DataType, &str); 8] = [
    (sys::XLA_FFI_DataType_XLA_FFI_DataType_S8, "int8"),
    (sys::XLA_FFI_DataType_XLA_FFI_DataType_S16, "int16"),
    (sys::XLA_FFI_DataType_XLA_FFI_DataType_U8, "uint8"),
    (sys::XLA_FFI_DataType_XLA_FFI_DataType_U16, "uint16"),
    (sys::XLA_FFI_DataType_XLA_FFI_DataType_U32, "uint32"),
    (sys::XLA_FFI_DataType_XLA_FFI_DataType_U64, "uint64"),
    (sys::XLA_FFI_DataType_XLA_FFI_DataType_C64, "complex64"),
    (sys::XLA_FFI_DataType_XLA_FFI_DataType_C128, "complex128"),
];

pub(crate) fn xla_dtype_name(d: sys::XLA_FFI_DataType) -> String {
    let name = XLA_DTYPES.name(d, &OTHER_DTYPES);
    name.map_or_else(|| format!("XLA dtype #{d}"), String::from)
}

/// XLA element types of the polyop dtypes.
pub const XLA_DTYPES: DTypeCodes<sys::XLA_FFI_DataType> = DTypeCodes([
    sys::XLA_FFI_DataType_XLA_FFI_DataType_F16,
    sys::XLA_FFI_DataType_XLA_FFI_DataType_BF16,
    sys::XLA_FFI_DataType_XLA_FFI_DataType_F32,
    sys::XLA_FFI_DataType_XLA_FFI_DataType_F64,
    sys::XLA_FFI_DataType_XLA_FFI_DataType_S32,
    sys::XLA_FFI_DataType_XLA_FFI_DataType_S64,
    sys::XLA_FFI_DataType_XLA_FFI_DataType_PRED,
]);

/// A decoded buffer: dtype (as XLA reported it), dims, data.
pub(crate) struct RawBuffer {
    pub xla_dtype: sys::XLA_FFI_DataType,
    pub dims: Vec<usize>,
    pub data: *mut u8,
}

/// # Safety
/// `p` is null or points to an `XLA_FFI_Buffer` of a live call frame, whose `dims` has `rank`
/// entries.
pub(crate) unsafe fn decode_buffer(
    p: *mut std::ffi::c_void,
    what: impl Fn() -> String,
) -> Result<RawBuffer> {
    if p.is_null() {
        return Err(Error::internal(format!("{}: null buffer", what())));
    }
    let p = p as *const sys::XLA_FFI_Buffer;
    // SAFETY: non-null, so a buffer descriptor (this function's contract); `struct_size`
    // leads it in every version and is read through the raw pointer, before any reference to
    // a whole descriptor exists.
    let size = unsafe { (*p).struct_size };
    if size < sys::XLA_FFI_Buffer_STRUCT_SIZE as usize {
        return Err(Error::internal(format!(
            "{}: XLA_FFI_Buffer size {} < {} (FFI version skew)",
            what(),
            size,
            sys::XLA_FFI_Buffer_STRUCT_SIZE
        )));
    }
    // SAFETY: as above, and the descriptor is at least as large as our `XLA_FFI_Buffer`.
    let b = unsafe { &*p };
    if b.rank < 0 {
        return Err(Error::internal(format!("{}: negative rank", what())));
    }
    // SAFETY: `dims` has `rank` entries (this function's contract).
    let d = unsafe { slice_from_c(b.dims, b.rank as usize) };
    if d.iter().any(|&x| x < 0) {
        return Err(Error::invalid(format!(
            "{}: dynamic or negative dims {d:?} are not supported (static shapes only)",
            what()
        )));
    }
    Ok(RawBuffer {
        xla_dtype: b.dtype,
        dims: d.iter().map(|&x| x as usize).collect(),
        data: b.data as *mut u8,
    })
}

/// # Safety
/// `args` is the operand list of a live call frame; the views live no longer than its buffers.
pub(crate) unsafe fn decode_inputs<'a>(
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
        // SAFETY: i < args.size, the length of `types` and `args` (this function's contract).
        let ty = unsafe { *args.types.add(i) };
        if ty != sys::XLA_FFI_ArgType_XLA_FFI_ArgType_BUFFER {
            return Err(Error::invalid(format!(
                "operand `{}` is not a buffer",
                arg.name
            )));
        }
        // SAFETY: as above; the entry of a BUFFER-typed operand is null or a buffer descriptor.
        let b = unsafe { decode_buffer(*args.args.add(i), || format!("operand `{}`", arg.name))? };
        let dtype = XLA_DTYPES
            .dtype(b.xla_dtype)
            .ok_or_else(|| op.unsupported_dtype(&arg.name, &xla_dtype_name(b.xla_dtype)))?;
        // SAFETY: XLA passes dense row-major (default layout) buffers valid for the call.
        out.push(Some(unsafe {
            TensorRef::from_raw_contiguous(dtype, b.dims, b.data)
        }));
    }
    Ok(out)
}
