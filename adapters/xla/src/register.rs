//! Registration with XLA: the FFI API version the handlers were built against, its check
//! against the runtime's table, and the answer to XLA's metadata query. (XLA finds handlers by
//! symbol: one per op, exported by `export!`.)

use crate::sys;
use kernel_core::{Error, Result};

/// The FFI API version these bindings were generated from (jaxlib 0.10.2's c_api.h).
pub const API_MAJOR: i32 = sys::XLA_FFI_API_MAJOR as i32;
pub const API_MINOR: i32 = sys::XLA_FFI_API_MINOR as i32;
/// The jaxlib whose `c_api.h` generated `sys.rs`.
pub const PINNED_JAXLIB: &str = "0.10.2";

/// Handler traits reported through the metadata extension. polyop kernels run on the host, so
/// they are not CUDA-graph (command buffer) compatible.
pub const TRAITS: sys::XLA_FFI_Handler_Traits = 0;

/// Check the runtime's API table against the version compiled in. Major must match (ABI);
/// the runtime's minor must be at least ours (we use fields added up to our minor).
///
/// # Safety
/// `api` is null or points to an API table.
pub unsafe fn check_api(api: *const sys::XLA_FFI_Api) -> Result<()> {
    if api.is_null() {
        return Err(Error::internal("call frame has no XLA_FFI_Api"));
    }
    // SAFETY: non-null, and by this function's contract an API table. `struct_size` and
    // `api_version` lead the struct in every version; they are read through the raw pointer,
    // so no reference to a whole (possibly older, shorter) table is made.
    let (size, major, minor) = unsafe {
        let v = &(*api).api_version;
        ((*api).struct_size, v.major_version, v.minor_version)
    };
    if major != API_MAJOR || minor < API_MINOR {
        return Err(Error::unsupported(format!(
            "XLA FFI API version mismatch: the runtime provides {major}.{minor}, libpolyop_xla was \
             built against {API_MAJOR}.{API_MINOR} (jaxlib {PINNED_JAXLIB}); rebuild polyop \
             against the installed jaxlib (crates/polyop-build/scripts/regen-bindings.sh adapters/xla/scripts/bindgen.conf)"
        )));
    }
    if size < sys::XLA_FFI_Api_STRUCT_SIZE as usize {
        return Err(Error::unsupported(format!(
            "XLA_FFI_Api is {} bytes, expected at least {} (jaxlib {PINNED_JAXLIB}); version skew",
            size,
            sys::XLA_FFI_Api_STRUCT_SIZE
        )));
    }
    Ok(())
}

/// Answer XLA's metadata query: the API version this handler was compiled against, and its
/// traits. Returns `true` when the frame was a metadata query.
pub(crate) unsafe fn populate_metadata(frame: &sys::XLA_FFI_CallFrame) -> Result<bool> {
    let ext = frame.extension_start;
    if ext.is_null() {
        return Ok(false);
    }
    // SAFETY: a non-null extension pointer of a live call frame (this function's contract)
    // points to an extension that starts with `XLA_FFI_Extension_Base`.
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
    // SAFETY: the base says this is a metadata extension of at least our struct size, and
    // `XLA_FFI_Metadata_Extension` starts with its base.
    let me = unsafe { &*(ext as *const sys::XLA_FFI_Metadata_Extension) };
    if me.metadata.is_null() {
        return Err(Error::internal("metadata query without a metadata struct"));
    }
    // The runtime's struct may be shorter than ours (an older runtime's ends before
    // `state_type_id`), so it is accessed field by field through the raw pointer, never as a
    // reference to a whole `XLA_FFI_Metadata`.
    let md = me.metadata;
    // SAFETY: non-null, the metadata struct XLA passed for us to fill, not otherwise accessed
    // during this call; `struct_size` leads it in every version.
    let size = unsafe { (*md).struct_size };
    if size < sys::XLA_FFI_Metadata_STRUCT_SIZE as usize {
        return Err(Error::internal(format!(
            "XLA_FFI_Metadata is {} bytes, expected at least {}; version skew",
            size,
            sys::XLA_FFI_Metadata_STRUCT_SIZE
        )));
    }
    // SAFETY: as above; `api_version` and `traits` lie within `XLA_FFI_Metadata_STRUCT_SIZE`
    // (checked), and `state_type_id` is written only when the runtime's struct has room. The
    // fields are plain data, so assigning through the pointer drops nothing.
    unsafe {
        (*md).api_version = sys::XLA_FFI_Api_Version {
            struct_size: sys::XLA_FFI_Api_Version_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            major_version: API_MAJOR,
            minor_version: API_MINOR,
        };
        (*md).traits = TRAITS;
        // The state type id (no state) lies past the struct size of older runtimes.
        if size >= std::mem::size_of::<sys::XLA_FFI_Metadata>() {
            (*md).state_type_id = sys::XLA_FFI_TypeId { type_id: 0 };
        }
    }
    Ok(true)
}
