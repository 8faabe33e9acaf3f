//! Raw bindings of the plugin execution-provider C API (`onnxruntime_ep_c_api.h`), declared by
//! hand: `ort-sys` has the `OrtApi` table but declares `OrtEpApi` opaque, and the onnxruntime
//! wheel ships no C headers to run `bindgen` on. Written from the public header of onnxruntime
//! 1.24 (the first release with kernel-based plugin providers; the C API only grows, so its
//! layouts serve 1.31). Each vtable is the header's ordered list of slots up to the last one
//! used here: slots the adapter calls or fills in have their C signatures, the others are
//! opaque placeholders (`Slot`) that are never called. Tables the adapter fills in
//! (`OrtEpFactory`, `OrtEp`, `OrtKernelImpl`) declare the version they were written for in
//! `ort_version_supported`, so onnxruntime reads no slot past them.
//!
//! The `OrtApi` entries of C API 22-23 (graph and device queries) come after the 276 entries of
//! `ort-sys`'s API-17 struct; [`OrtApiEp`] extends that struct to them, with placeholders
//! between, and the offsets are checked against the header's order (counted from `ort-sys`
//! built with feature `api-24`).

#![allow(non_snake_case, non_camel_case_types, dead_code)]

use ort_sys::{
    ONNXTensorElementDataType, OrtApi, OrtEpDevice, OrtGraph, OrtHardwareDevice,
    OrtHardwareDeviceType, OrtKernelContext, OrtKernelInfo, OrtKeyValuePairs, OrtLogger,
    OrtMemoryInfo, OrtNode, OrtOpAttr, OrtSessionOptions, OrtStatus, OrtTypeInfo, OrtValue,
    OrtValueInfo,
};
use std::ffi::{c_char, c_int, c_void};

/// The C API version the provider's tables are written for (onnxruntime 1.24).
pub const EP_API_VERSION: u32 = 24;
/// `OrtEpFactory` is declared up to its API-23 slots (none of 1.24's factory additions is
/// used), so it says 23 and onnxruntime leaves the rest alone.
pub const FACTORY_API_VERSION: u32 = 23;

/// A slot of a C table this adapter neither calls nor fills in.
pub type Slot = Option<unsafe extern "system" fn()>;
pub type Status = *mut OrtStatus;

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(
    OrtEpGraphSupportInfo,
    OrtKernelRegistry,
    OrtKernelDefBuilder,
    OrtKernelDef,
    OrtMemoryDevice,
    OrtSyncStreamImpl,
    OrtDataTransferImpl,
    OrtAllocator,
    OrtRunOptions,
    OrtNodeComputeContext
);

/// `OrtApi` through C API 23: `ort-sys`'s API-17 struct (276 entries), then the entries of
/// versions 18-23 this adapter uses, at their positions.
#[repr(C)]
pub struct OrtApiEp {
    pub base: OrtApi,
    _s276: [Slot; 13],
    /// 289 (API 22)
    pub GetValueInfoName:
        unsafe extern "system" fn(*const OrtValueInfo, *mut *const c_char) -> Status,
    pub GetValueInfoTypeInfo:
        unsafe extern "system" fn(*const OrtValueInfo, *mut *const OrtTypeInfo) -> Status,
    _s291: [Slot; 16],
    /// 307 (API 22)
    pub HardwareDevice_Type:
        unsafe extern "system" fn(*const OrtHardwareDevice) -> OrtHardwareDeviceType,
    _s308: [Slot; 9],
    /// 317 (API 22)
    pub GetEpApi: unsafe extern "system" fn() -> *const OrtEpApi,
    _s318: [Slot; 6],
    /// 324 (API 23)
    pub ValueInfo_GetValueNumConsumers:
        unsafe extern "system" fn(*const OrtValueInfo, *mut usize) -> Status,
    pub ValueInfo_GetValueConsumers: unsafe extern "system" fn(
        *const OrtValueInfo,
        *mut *const OrtNode,
        *mut i64,
        usize,
    ) -> Status,
    pub ValueInfo_GetInitializerValue:
        unsafe extern "system" fn(*const OrtValueInfo, *mut *const OrtValue) -> Status,
    _s327: [Slot; 3],
    /// 330 (API 23)
    pub ValueInfo_IsGraphOutput:
        unsafe extern "system" fn(*const OrtValueInfo, *mut bool) -> Status,
    pub ValueInfo_IsConstantInitializer:
        unsafe extern "system" fn(*const OrtValueInfo, *mut bool) -> Status,
    _s332: [Slot; 12],
    /// 344 (API 23)
    pub Graph_GetNumNodes: unsafe extern "system" fn(*const OrtGraph, *mut usize) -> Status,
    pub Graph_GetNodes:
        unsafe extern "system" fn(*const OrtGraph, *mut *const OrtNode, usize) -> Status,
    _s346: [Slot; 3],
    /// 349 (API 23)
    pub Node_GetName: unsafe extern "system" fn(*const OrtNode, *mut *const c_char) -> Status,
    pub Node_GetOperatorType:
        unsafe extern "system" fn(*const OrtNode, *mut *const c_char) -> Status,
    pub Node_GetDomain: unsafe extern "system" fn(*const OrtNode, *mut *const c_char) -> Status,
    pub Node_GetSinceVersion: unsafe extern "system" fn(*const OrtNode, *mut i32) -> Status,
    pub Node_GetNumInputs: unsafe extern "system" fn(*const OrtNode, *mut usize) -> Status,
    pub Node_GetInputs:
        unsafe extern "system" fn(*const OrtNode, *mut *const OrtValueInfo, usize) -> Status,
    pub Node_GetNumOutputs: unsafe extern "system" fn(*const OrtNode, *mut usize) -> Status,
    pub Node_GetOutputs:
        unsafe extern "system" fn(*const OrtNode, *mut *const OrtValueInfo, usize) -> Status,
    _s357: [Slot; 4],
    /// 361 (API 23)
    pub Node_GetAttributeByName:
        unsafe extern "system" fn(*const OrtNode, *const c_char, *mut *const OrtOpAttr) -> Status,
}

const W: usize = std::mem::size_of::<usize>();
const _: () = assert!(std::mem::offset_of!(OrtApiEp, GetValueInfoName) == 289 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, GetValueInfoTypeInfo) == 290 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, ValueInfo_GetValueNumConsumers) == 324 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, ValueInfo_IsGraphOutput) == 330 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, Node_GetName) == 349 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, Node_GetOutputs) == 356 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, HardwareDevice_Type) == 307 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, GetEpApi) == 317 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, ValueInfo_GetInitializerValue) == 326 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, ValueInfo_IsConstantInitializer) == 331 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, Graph_GetNumNodes) == 344 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, Node_GetOperatorType) == 350 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, Node_GetInputs) == 354 * W);
const _: () = assert!(std::mem::offset_of!(OrtApiEp, Node_GetAttributeByName) == 361 * W);

/// `OrtKernelCreateFunc`.
pub type KernelCreateFn = unsafe extern "system" fn(
    state: *mut c_void,
    info: *const OrtKernelInfo,
    kernel_out: *mut *mut OrtKernelImpl,
) -> Status;

/// `OrtEpApi` up to `EpGraphSupportInfo_LookUpKernel` (API 24).
#[repr(C)]
pub struct OrtEpApi {
    pub CreateEpDevice: unsafe extern "system" fn(
        *mut OrtEpFactory,
        *const OrtHardwareDevice,
        *const OrtKeyValuePairs,
        *const OrtKeyValuePairs,
        *mut *mut OrtEpDevice,
    ) -> Status,
    pub ReleaseEpDevice: Slot,
    pub EpGraphSupportInfo_AddNodesToFuse: unsafe extern "system" fn(
        *mut OrtEpGraphSupportInfo,
        *const *const OrtNode,
        usize,
        *const OrtNodeFusionOptions,
    ) -> Status,
    pub EpGraphSupportInfo_AddSingleNode:
        unsafe extern "system" fn(*mut OrtEpGraphSupportInfo, *const OrtNode) -> Status,
    /// NodeComputeContext_NodeName .. ReleaseHardwareDevice
    _s4: [Slot; 14],
    /// 18 (API 24)
    pub CreateKernelRegistry: unsafe extern "system" fn(*mut *mut OrtKernelRegistry) -> Status,
    pub ReleaseKernelRegistry: unsafe extern "system" fn(*mut OrtKernelRegistry),
    pub KernelRegistry_AddKernel: unsafe extern "system" fn(
        *mut OrtKernelRegistry,
        *const OrtKernelDef,
        KernelCreateFn,
        *mut c_void,
    ) -> Status,
    pub CreateKernelDefBuilder: unsafe extern "system" fn(*mut *mut OrtKernelDefBuilder) -> Status,
    pub ReleaseKernelDefBuilder: unsafe extern "system" fn(*mut OrtKernelDefBuilder),
    pub KernelDefBuilder_SetOperatorType:
        unsafe extern "system" fn(*mut OrtKernelDefBuilder, *const c_char) -> Status,
    pub KernelDefBuilder_SetDomain:
        unsafe extern "system" fn(*mut OrtKernelDefBuilder, *const c_char) -> Status,
    pub KernelDefBuilder_SetSinceVersion:
        unsafe extern "system" fn(*mut OrtKernelDefBuilder, c_int, c_int) -> Status,
    pub KernelDefBuilder_SetExecutionProvider:
        unsafe extern "system" fn(*mut OrtKernelDefBuilder, *const c_char) -> Status,
    /// SetInputMemType .. AddInputOutputMutableAliases
    _s27: [Slot; 5],
    /// 32
    pub KernelDefBuilder_Build:
        unsafe extern "system" fn(*mut OrtKernelDefBuilder, *mut *mut OrtKernelDef) -> Status,
    pub ReleaseKernelDef: unsafe extern "system" fn(*mut OrtKernelDef),
    pub KernelDef_GetOperatorType: unsafe extern "system" fn(*const OrtKernelDef) -> *const c_char,
    /// GetDomain .. GetTensorDataType
    _s35: [Slot; 6],
    /// 41
    pub EpGraphSupportInfo_LookUpKernel: unsafe extern "system" fn(
        *mut OrtEpGraphSupportInfo,
        *const OrtNode,
        *mut *const OrtKernelDef,
    ) -> Status,
}

const _: () = assert!(std::mem::offset_of!(OrtEpApi, CreateKernelRegistry) == 18 * W);
const _: () = assert!(std::mem::offset_of!(OrtEpApi, KernelDefBuilder_Build) == 32 * W);
const _: () = assert!(std::mem::offset_of!(OrtEpApi, EpGraphSupportInfo_LookUpKernel) == 41 * W);

/// `OrtEpFactory` through API 23 (filled in by the adapter).
#[repr(C)]
pub struct OrtEpFactory {
    pub ort_version_supported: u32,
    pub GetName: unsafe extern "system" fn(*const OrtEpFactory) -> *const c_char,
    pub GetVendor: unsafe extern "system" fn(*const OrtEpFactory) -> *const c_char,
    pub GetSupportedDevices: unsafe extern "system" fn(
        *mut OrtEpFactory,
        *const *const OrtHardwareDevice,
        usize,
        *mut *mut OrtEpDevice,
        usize,
        *mut usize,
    ) -> Status,
    pub CreateEp: unsafe extern "system" fn(
        *mut OrtEpFactory,
        *const *const OrtHardwareDevice,
        *const *const OrtKeyValuePairs,
        usize,
        *const OrtSessionOptions,
        *const OrtLogger,
        *mut *mut OrtEp,
    ) -> Status,
    pub ReleaseEp: unsafe extern "system" fn(*mut OrtEpFactory, *mut OrtEp),
    pub GetVendorId: unsafe extern "system" fn(*const OrtEpFactory) -> u32,
    pub GetVersion: unsafe extern "system" fn(*const OrtEpFactory) -> *const c_char,
    pub ValidateCompiledModelCompatibilityInfo: unsafe extern "system" fn(
        *mut OrtEpFactory,
        *const *const OrtHardwareDevice,
        usize,
        *const c_char,
        *mut c_int,
    ) -> Status,
    pub CreateAllocator: unsafe extern "system" fn(
        *mut OrtEpFactory,
        *const OrtMemoryInfo,
        *const OrtKeyValuePairs,
        *mut *mut OrtAllocator,
    ) -> Status,
    pub ReleaseAllocator: unsafe extern "system" fn(*mut OrtEpFactory, *mut OrtAllocator),
    pub CreateDataTransfer:
        unsafe extern "system" fn(*mut OrtEpFactory, *mut *mut OrtDataTransferImpl) -> Status,
    pub IsStreamAware: unsafe extern "system" fn(*const OrtEpFactory) -> bool,
    pub CreateSyncStreamForDevice: unsafe extern "system" fn(
        *mut OrtEpFactory,
        *const OrtMemoryDevice,
        *const OrtKeyValuePairs,
        *mut *mut OrtSyncStreamImpl,
    ) -> Status,
}

/// `OrtEp` through API 24 (filled in by the adapter; optional slots left null).
#[repr(C)]
pub struct OrtEp {
    pub ort_version_supported: u32,
    pub GetName: unsafe extern "system" fn(*const OrtEp) -> *const c_char,
    pub GetCapability: unsafe extern "system" fn(
        *mut OrtEp,
        *const OrtGraph,
        *mut OrtEpGraphSupportInfo,
    ) -> Status,
    /// Compiles the fused node groups `GetCapability` asked for (optional for kernel-based
    /// providers from 1.24).
    pub Compile: Option<
        unsafe extern "system" fn(
            *mut OrtEp,
            *const *const OrtGraph,
            *const *const OrtNode,
            usize,
            *mut *mut OrtNodeComputeInfo,
            *mut *mut OrtNode,
        ) -> Status,
    >,
    pub ReleaseNodeComputeInfos:
        Option<unsafe extern "system" fn(*mut OrtEp, *mut *mut OrtNodeComputeInfo, usize)>,
    /// GetPreferredDataLayout, ShouldConvertDataLayoutForOp, SetDynamicOptions, OnRunStart,
    /// OnRunEnd, CreateAllocator, CreateSyncStreamForDevice, GetCompiledModelCompatibilityInfo
    /// (all optional): null.
    pub optional: [Slot; 8],
    pub GetKernelRegistry:
        unsafe extern "system" fn(*mut OrtEp, *mut *const OrtKernelRegistry) -> Status,
    /// IsConcurrentRunSupported (optional): null.
    pub IsConcurrentRunSupported: Slot,
}

/// `OrtNodeFusionOptions` (API 23).
#[repr(C)]
pub struct OrtNodeFusionOptions {
    pub ort_version_supported: u32,
    pub drop_constant_initializers: bool,
}

/// `OrtNodeComputeInfo` (API 23): the compute functions of one compiled (fused) node.
#[repr(C)]
pub struct OrtNodeComputeInfo {
    pub ort_version_supported: u32,
    pub CreateState: unsafe extern "system" fn(
        *mut OrtNodeComputeInfo,
        *mut OrtNodeComputeContext,
        *mut *mut c_void,
    ) -> Status,
    pub Compute: unsafe extern "system" fn(
        *mut OrtNodeComputeInfo,
        *mut c_void,
        *mut OrtKernelContext,
    ) -> Status,
    pub ReleaseState: unsafe extern "system" fn(*mut OrtNodeComputeInfo, *mut c_void),
}

/// `OrtKernelImpl` (API 24). `flags` is onnxruntime's and must start at zero.
#[repr(C)]
pub struct OrtKernelImpl {
    pub ort_version_supported: u32,
    pub flags: u32,
    pub Compute: unsafe extern "system" fn(*mut OrtKernelImpl, *mut OrtKernelContext) -> Status,
    pub Release: unsafe extern "system" fn(*mut OrtKernelImpl),
    /// PrePackWeight, SetSharedPrePackedWeight (optional): null.
    pub PrePackWeight: Slot,
    pub SetSharedPrePackedWeight: Slot,
}

/// `CreateEpApiFactoriesFn`'s element type for `ONNXTensorElementDataType` users.
pub type ElemType = ONNXTensorElementDataType;
