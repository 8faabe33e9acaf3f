//! Hand-written declarations for the part of the TensorFlow C API polyop uses
//! (`tensorflow/c/{ops,kernels,tf_tensor,tf_status,tf_datatype}.h` from the wheel's `include/`).
//! Every type is opaque, so a small `extern "C"` block is simpler and more reviewable than
//! bindgen output; the signatures below are copied from the TF 2.21 headers.

#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _p: [u8; 0],
        }
    )*};
}
opaque!(
    TF_Status,
    TF_Tensor,
    TF_OpDefinitionBuilder,
    TF_ShapeInferenceContext,
    TF_ShapeHandle,
    TF_DimensionHandle,
    TF_KernelBuilder,
    TF_OpKernelConstruction,
    TF_OpKernelContext
);

/// `TF_DataType` (tf_datatype.h).
pub type TF_DataType = c_int;
pub const TF_FLOAT: TF_DataType = 1;
pub const TF_DOUBLE: TF_DataType = 2;
pub const TF_INT32: TF_DataType = 3;
pub const TF_BOOL: TF_DataType = 10;
pub const TF_INT64: TF_DataType = 9;
pub const TF_BFLOAT16: TF_DataType = 14;
pub const TF_HALF: TF_DataType = 19;

/// `TF_Code` (tf_status.h).
pub type TF_Code = c_int;
pub const TF_OK: TF_Code = 0;
pub const TF_INVALID_ARGUMENT: TF_Code = 3;
pub const TF_UNIMPLEMENTED: TF_Code = 12;
pub const TF_INTERNAL: TF_Code = 13;

pub type TF_Bool = u8;

pub type ShapeFn = unsafe extern "C" fn(*mut TF_ShapeInferenceContext, *mut TF_Status);
pub type CreateFn = unsafe extern "C" fn(*mut TF_OpKernelConstruction) -> *mut c_void;
pub type ComputeFn = unsafe extern "C" fn(*mut c_void, *mut TF_OpKernelContext);
pub type DeleteFn = unsafe extern "C" fn(*mut c_void);

extern "C" {
    // tf_status.h
    pub fn TF_NewStatus() -> *mut TF_Status;
    pub fn TF_DeleteStatus(s: *mut TF_Status);
    pub fn TF_SetStatus(s: *mut TF_Status, code: TF_Code, msg: *const c_char);
    pub fn TF_GetCode(s: *const TF_Status) -> TF_Code;
    pub fn TF_Message(s: *const TF_Status) -> *const c_char;

    // tf_tensor.h
    pub fn TF_TensorType(t: *const TF_Tensor) -> TF_DataType;
    pub fn TF_NumDims(t: *const TF_Tensor) -> c_int;
    pub fn TF_Dim(t: *const TF_Tensor, dim_index: c_int) -> i64;
    pub fn TF_TensorData(t: *const TF_Tensor) -> *mut c_void;
    pub fn TF_DeleteTensor(t: *mut TF_Tensor);

    // ops.h
    pub fn TF_NewOpDefinitionBuilder(op_name: *const c_char) -> *mut TF_OpDefinitionBuilder;
    pub fn TF_RegisterOpDefinition(b: *mut TF_OpDefinitionBuilder, status: *mut TF_Status);
    pub fn TF_OpDefinitionBuilderAddAttr(b: *mut TF_OpDefinitionBuilder, spec: *const c_char);
    pub fn TF_OpDefinitionBuilderAddInput(b: *mut TF_OpDefinitionBuilder, spec: *const c_char);
    pub fn TF_OpDefinitionBuilderAddOutput(b: *mut TF_OpDefinitionBuilder, spec: *const c_char);
    pub fn TF_OpDefinitionBuilderSetShapeInferenceFunction(
        b: *mut TF_OpDefinitionBuilder,
        f: ShapeFn,
    );
    pub fn TF_ShapeInferenceContextNumInputs(ctx: *mut TF_ShapeInferenceContext) -> i64;
    pub fn TF_NewShapeHandle() -> *mut TF_ShapeHandle;
    pub fn TF_ShapeInferenceContextGetInput(
        ctx: *mut TF_ShapeInferenceContext,
        i: c_int,
        handle: *mut TF_ShapeHandle,
        status: *mut TF_Status,
    );
    pub fn TF_ShapeInferenceContextSetOutput(
        ctx: *mut TF_ShapeInferenceContext,
        i: c_int,
        handle: *mut TF_ShapeHandle,
        status: *mut TF_Status,
    );
    pub fn TF_ShapeInferenceContextScalar(
        ctx: *mut TF_ShapeInferenceContext,
    ) -> *mut TF_ShapeHandle;
    pub fn TF_ShapeInferenceContextVectorFromSize(
        ctx: *mut TF_ShapeInferenceContext,
        size: usize,
    ) -> *mut TF_ShapeHandle;
    pub fn TF_NewDimensionHandle() -> *mut TF_DimensionHandle;
    pub fn TF_ShapeInferenceContext_GetAttrType(
        ctx: *mut TF_ShapeInferenceContext,
        attr_name: *const c_char,
        val: *mut TF_DataType,
        status: *mut TF_Status,
    );
    pub fn TF_ShapeInferenceContextRank(
        ctx: *mut TF_ShapeInferenceContext,
        handle: *mut TF_ShapeHandle,
    ) -> i64;
    pub fn TF_ShapeInferenceContextRankKnown(
        ctx: *mut TF_ShapeInferenceContext,
        handle: *mut TF_ShapeHandle,
    ) -> c_int;
    pub fn TF_ShapeInferenceContextDim(
        ctx: *mut TF_ShapeInferenceContext,
        shape: *mut TF_ShapeHandle,
        i: i64,
        result: *mut TF_DimensionHandle,
    );
    pub fn TF_ShapeInferenceContextSetUnknownShape(
        ctx: *mut TF_ShapeInferenceContext,
        status: *mut TF_Status,
    );
    pub fn TF_DimensionHandleValueKnown(d: *mut TF_DimensionHandle) -> c_int;
    pub fn TF_DimensionHandleValue(d: *mut TF_DimensionHandle) -> i64;
    pub fn TF_ShapeInferenceContextConcatenateShapes(
        ctx: *mut TF_ShapeInferenceContext,
        first: *mut TF_ShapeHandle,
        second: *mut TF_ShapeHandle,
        result: *mut TF_ShapeHandle,
        status: *mut TF_Status,
    );
    pub fn TF_DeleteShapeHandle(h: *mut TF_ShapeHandle);
    pub fn TF_DeleteDimensionHandle(h: *mut TF_DimensionHandle);

    // kernels.h
    pub fn TF_NewKernelBuilder(
        op_name: *const c_char,
        device_name: *const c_char,
        create: CreateFn,
        compute: ComputeFn,
        delete: DeleteFn,
    ) -> *mut TF_KernelBuilder;
    pub fn TF_RegisterKernelBuilder(
        kernel_name: *const c_char,
        b: *mut TF_KernelBuilder,
        status: *mut TF_Status,
    );
    pub fn TF_NumInputs(ctx: *mut TF_OpKernelContext) -> c_int;
    pub fn TF_GetInput(
        ctx: *mut TF_OpKernelContext,
        i: c_int,
        tensor: *mut *mut TF_Tensor,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_Failure(ctx: *mut TF_OpKernelConstruction, s: *mut TF_Status);
    pub fn TF_OpKernelContext_Failure(ctx: *mut TF_OpKernelContext, s: *mut TF_Status);
    pub fn TF_OpKernelConstruction_GetAttrSize(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        list_size: *mut i32,
        total_size: *mut i32,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrInt64(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        val: *mut i64,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrFloat(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        val: *mut f32,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrBool(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        val: *mut TF_Bool,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrString(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        val: *mut c_char,
        max_length: usize,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrInt64List(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        vals: *mut i64,
        max_vals: c_int,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrFloatList(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        vals: *mut f32,
        max_vals: c_int,
        status: *mut TF_Status,
    );
    pub fn TF_AllocateOutput(
        ctx: *mut TF_OpKernelContext,
        index: c_int,
        dtype: TF_DataType,
        dims: *const i64,
        num_dims: c_int,
        len: usize,
        status: *mut TF_Status,
    ) -> *mut TF_Tensor;
}

/// An owned `TF_Status`.
pub struct Status(pub *mut TF_Status);

impl Status {
    pub fn new() -> Self {
        // SAFETY: plain allocation.
        Status(unsafe { TF_NewStatus() })
    }
    pub fn ok(&self) -> bool {
        // SAFETY: self.0 is a live status.
        unsafe { TF_GetCode(self.0) == TF_OK }
    }
    pub fn message(&self) -> String {
        // SAFETY: self.0 is live.
        unsafe { message_of(self.0) }
    }
}

impl Default for Status {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        // SAFETY: allocated by TF_NewStatus.
        unsafe { TF_DeleteStatus(self.0) }
    }
}

/// The message of a live status.
/// # Safety
/// `s` must be a live status.
pub unsafe fn message_of(s: *const TF_Status) -> String {
    // SAFETY: TF_Message returns a NUL-terminated string owned by the status.
    unsafe {
        let p = TF_Message(s);
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// Set `status` to `code` with `msg` (interior NULs replaced).
/// # Safety
/// `status` must be a live status.
pub unsafe fn set_status(status: *mut TF_Status, code: TF_Code, msg: &str) {
    let c = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: status is live; TF copies the message.
    unsafe { TF_SetStatus(status, code, c.as_ptr()) }
}
