//! Hand-written declarations of the libtorch stable C ABI (`torch/csrc/inductor/aoti_torch/c/
//! shim.h` and `torch/csrc/stable/c/shim.h`) that the adapter uses. Small and opaque-pointer
//! only; `cxx/trampoline.cpp` static_asserts each signature against the installed headers, so a
//! mismatch fails the build. Symbols resolve from `libtorch_cpu.so`.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

pub type StableIValue = u64;
pub type AOTITorchError = i32;
pub type AtenTensorHandle = *mut c_void;
pub type TorchLibraryHandle = *mut c_void;
pub type StringHandle = *mut c_void;
pub type StableListHandle = *mut c_void;
pub type BoxedFn = unsafe extern "C" fn(*mut StableIValue, u64, u64);
pub type ParallelFunc = unsafe extern "C" fn(i64, i64, *mut c_void);

pub const SUCCESS: AOTITorchError = 0;

extern "C" {
    // registration
    pub fn aoti_torch_library_init_def(
        ns: *const c_char,
        file: *const c_char,
        line: u32,
        ret: *mut TorchLibraryHandle,
    ) -> AOTITorchError;
    pub fn aoti_torch_library_init_impl(
        ns: *const c_char,
        k: *const c_char,
        file: *const c_char,
        line: u32,
        ret: *mut TorchLibraryHandle,
    ) -> AOTITorchError;
    pub fn aoti_torch_library_init_fragment(
        ns: *const c_char,
        file: *const c_char,
        line: u32,
        ret: *mut TorchLibraryHandle,
    ) -> AOTITorchError;
    pub fn aoti_torch_library_def(lib: TorchLibraryHandle, schema: *const c_char)
        -> AOTITorchError;
    pub fn torch_library_def_with_tags(
        lib: TorchLibraryHandle,
        schema: *const c_char,
        tags: *const i32,
        num_tags: i32,
    ) -> AOTITorchError;
    pub fn torch_library_impl(
        lib: TorchLibraryHandle,
        name: *const c_char,
        f: BoxedFn,
        extension_build_version: u64,
    ) -> AOTITorchError;
    pub fn torch_tag_dynamic_output_shape() -> i32;

    // constants
    pub fn aoti_torch_device_type_cpu() -> i32;
    pub fn aoti_torch_device_type_meta() -> i32;
    pub fn aoti_torch_device_type_cuda() -> i32;
    pub fn aoti_torch_dtype_float16() -> i32;
    pub fn aoti_torch_dtype_bfloat16() -> i32;
    pub fn aoti_torch_dtype_float32() -> i32;
    pub fn aoti_torch_dtype_float64() -> i32;
    pub fn aoti_torch_dtype_int32() -> i32;
    pub fn aoti_torch_dtype_int64() -> i32;
    pub fn aoti_torch_dtype_bool() -> i32;
    pub fn aoti_torch_dtype_uint8() -> i32;
    pub fn aoti_torch_dtype_int8() -> i32;
    pub fn aoti_torch_dtype_int16() -> i32;
    pub fn aoti_torch_dtype_complex64() -> i32;
    pub fn aoti_torch_dtype_complex128() -> i32;

    // tensors
    pub fn aoti_torch_get_dim(t: AtenTensorHandle, ret: *mut i64) -> AOTITorchError;
    pub fn aoti_torch_get_sizes(t: AtenTensorHandle, ret: *mut *mut i64) -> AOTITorchError;
    pub fn aoti_torch_get_strides(t: AtenTensorHandle, ret: *mut *mut i64) -> AOTITorchError;
    pub fn aoti_torch_get_dtype(t: AtenTensorHandle, ret: *mut i32) -> AOTITorchError;
    pub fn aoti_torch_get_device_type(t: AtenTensorHandle, ret: *mut i32) -> AOTITorchError;
    pub fn aoti_torch_get_device_index(t: AtenTensorHandle, ret: *mut i32) -> AOTITorchError;
    pub fn aoti_torch_get_data_ptr(t: AtenTensorHandle, ret: *mut *mut c_void) -> AOTITorchError;
    pub fn aoti_torch_new_tensor_handle(
        orig: AtenTensorHandle,
        ret: *mut AtenTensorHandle,
    ) -> AOTITorchError;
    pub fn aoti_torch_delete_tensor_object(t: AtenTensorHandle) -> AOTITorchError;
    pub fn aoti_torch_copy_(
        dst: AtenTensorHandle,
        src: AtenTensorHandle,
        non_blocking: i32,
    ) -> AOTITorchError;
    pub fn aoti_torch_empty_strided(
        ndim: i64,
        sizes: *const i64,
        strides: *const i64,
        dtype: i32,
        device_type: i32,
        device_index: i32,
        ret: *mut AtenTensorHandle,
    ) -> AOTITorchError;

    // boxed values
    pub fn torch_string_length(h: StringHandle, len: *mut usize) -> AOTITorchError;
    pub fn torch_string_c_str(h: StringHandle, data: *mut *const c_char) -> AOTITorchError;
    pub fn torch_delete_string(h: StringHandle) -> AOTITorchError;
    pub fn torch_list_size(h: StableListHandle, size: *mut usize) -> AOTITorchError;
    pub fn torch_list_get_item(
        h: StableListHandle,
        index: usize,
        out: *mut StableIValue,
    ) -> AOTITorchError;
    pub fn torch_delete_list(h: StableListHandle) -> AOTITorchError;
    pub fn torch_delete_stable_ivalue(v: *mut StableIValue) -> AOTITorchError;

    // threads, errors
    pub fn torch_parallel_for(
        begin: i64,
        end: i64,
        grain_size: i64,
        f: ParallelFunc,
        ctx: *mut c_void,
    ) -> AOTITorchError;
    pub fn torch_get_num_threads(out: *mut u32) -> AOTITorchError;
    pub fn torch_exception_get_what_without_backtrace() -> *const c_char;
}

// The C++ trampoline layer (cxx/trampoline.cpp).
extern "C" {
    pub fn polyop_torch_set_entry(
        call: unsafe extern "C" fn(u32, *mut StableIValue, u64, u64) -> *mut c_char,
        free_error: unsafe extern "C" fn(*mut c_char),
    );
    pub fn polyop_torch_num_slots() -> u32;
    pub fn polyop_torch_slot(i: u32) -> Option<BoxedFn>;
    pub fn polyop_torch_build_version() -> u64;
}

/// The message of the exception behind the last failed shim call on this thread.
pub fn last_error() -> String {
    // SAFETY: returns a borrowed, NUL-terminated string or null.
    unsafe {
        let p = torch_exception_get_what_without_backtrace();
        if p.is_null() {
            "unknown torch error".to_string()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}
