//! Framework tensors in and out: MindSpore's dtypes (the kernel's dtype names, the infer
//! functions' `TypeId`s) and views of the kernel's parameters.

use kernel_core::{DType, DTypeCodes, Error, OpDef, Result, TensorRef};

/// MindSpore `TypeId`s of the polyop dtypes (`mindapi/base/type_id.h` of the 2.10 wheel:
/// kNumberTypeFloat16, BFloat16, Float32, Float64, Int32, Int64, Bool).
pub const MS_TYPES: DTypeCodes<i32> = DTypeCodes([42, 45, 43, 44, 34, 35, 30]);

/// The other number types, named in messages.
const OTHER_TYPES: [(i32, &str); 8] = [
    (32, "int8"),
    (33, "int16"),
    (37, "uint8"),
    (38, "uint16"),
    (39, "uint32"),
    (40, "uint64"),
    (48, "complex64"),
    (49, "complex128"),
];

pub(crate) fn type_name(t: i32) -> String {
    let name = MS_TYPES.name(t, &OTHER_TYPES);
    name.map_or_else(|| format!("MindSpore TypeId {t}"), String::from)
}

/// The dtype of a kernel parameter, from the name MindSpore passes (`float32`, `bool`, ...).
pub(crate) fn dtype_of(op: &OpDef, what: &str, name: &str) -> Result<DType> {
    DType::from_name(name).ok_or_else(|| op.unsupported_dtype(what, name))
}

/// The dims of parameter `i`; a negative (dynamic) dim is an error.
///
/// # Safety
/// `ndims` and `shapes` have more than `i` entries, and `shapes[i]` has `ndims[i]`.
pub(crate) unsafe fn dims(ndims: *const i32, shapes: *const *const i64, i: usize) -> Vec<i64> {
    // SAFETY: this function's contract.
    let (n, s) = unsafe { (*ndims.add(i), *shapes.add(i)) };
    // SAFETY: as above.
    unsafe { kernel_core::ffi::slice_from_c(s, n.max(0) as usize) }.to_vec()
}

/// A view of a kernel parameter: MindSpore hands dense row-major buffers.
///
/// # Safety
/// `data` holds a dense tensor of `dims` and `dtype`, alive for `'a`.
pub(crate) unsafe fn view<'a>(
    dtype: DType,
    dims: &[i64],
    data: *const u8,
) -> Result<TensorRef<'a>> {
    let shape = concrete(dims)?;
    // SAFETY: this function's contract.
    Ok(unsafe { TensorRef::from_raw_contiguous(dtype, shape, data) })
}

pub(crate) fn concrete(dims: &[i64]) -> Result<Vec<usize>> {
    dims.iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| Error::internal(format!("dynamic dims {dims:?} at launch")))
        })
        .collect()
}
