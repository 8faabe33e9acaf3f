//! The plugin execution provider: the same library, loaded with
//! `onnxruntime.register_execution_provider_library`, serves the standard ONNX ops that
//! registry ops declare they implement ([`kernel_core::onnx`]) as a kernel-based provider on
//! the CPU device. Nothing here knows a particular op: every (op, declared ONNX op, schema
//! version) becomes one kernel definition, and a node is claimed only when
//! [`OnnxOp::plan`] says it is exactly the op (dtypes, attributes, opset, declared shapes);
//! everything else stays with onnxruntime's CPU provider.
//!
//! Flow: `CreateEpFactories` → one `OrtEpFactory` that offers the CPU device →
//! `CreateEp` per session (with its kernel registry) → `GetCapability` claims nodes →
//! onnxruntime creates one kernel per claimed node through the registry (attributes bound
//! and the plan made again from the kernel info) → `Compute` runs kernel-core's one call path
//! on onnxruntime's own input and output buffers (no copies; a transposed output is the one
//! exception, written through a scratch buffer).

use crate::attrs::{kernel_info_attr, read_one, OpAttrs};
use crate::error::guard;
use crate::pool::OrtPool;
use crate::sys::ep::{
    KernelCreateFn, OrtAllocator, OrtApiEp, OrtDataTransferImpl, OrtEp, OrtEpApi, OrtEpFactory,
    OrtEpGraphSupportInfo, OrtKernelDef, OrtKernelImpl, OrtKernelRegistry, OrtMemoryDevice,
    OrtNodeComputeContext, OrtNodeComputeInfo, OrtNodeFusionOptions, OrtSyncStreamImpl, Status,
    EP_API_VERSION, FACTORY_API_VERSION,
};
use crate::sys::{runtime, Api};
use crate::tensor::{input_view, onnx_type_name, OrtOutputs, ONNX_DTYPES};
use kernel_core::ffi::string_from_c;
use kernel_core::onnx::flatten_2d_dims;
use kernel_core::op::OutputAllocator;
use kernel_core::{
    call, ArgType, AttrValue, CallSite, CallSites, DType, Dim, Epilogue, EpilogueFn, Error,
    OnnxNode, OnnxOp, OnnxPlan, OpDef, OwnedTensor, Phase, Registry, Result, TensorMut, TensorRef,
    TensorSpec,
};
use ort_sys::{
    OrtApiBase, OrtEpDevice, OrtErrorCode, OrtGraph, OrtHardwareDevice, OrtHardwareDeviceType,
    OrtKernelContext, OrtKernelInfo, OrtKeyValuePairs, OrtLogger, OrtMemoryInfo, OrtNode,
    OrtSessionOptions, OrtStatus, OrtTensorTypeAndShapeInfo, OrtValue, OrtValueInfo,
};
use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr;

/// The first onnxruntime with kernel-based plugin providers.
const MIN_RUNTIME_API: u32 = 24;

/// One kernel the provider registers: op `op` computes ONNX `map.op_type` at schema version
/// `version`. Leaked: onnxruntime holds pointers to it for the life of the process.
struct Claim {
    op: &'static OpDef,
    map: &'static OnnxOp,
    version: u32,
    op_type: CString,
    api: Api,
}

/// The provider's name for a registry: `PolyopExecutionProvider` for namespace `polyop`.
pub fn provider_name(registry: &Registry) -> String {
    format!(
        "{}ExecutionProvider",
        kernel_core::camel_case(registry.namespace())
    )
}

/// The factory (`#[repr(C)]`, base first: onnxruntime's `OrtEpFactory*` is a `*mut Factory`).
#[repr(C)]
struct Factory {
    base: OrtEpFactory,
    api: Api,
    ext: &'static OrtApiEp,
    ep_api: &'static OrtEpApi,
    name: CString,
    claims: &'static [Claim],
}

/// One provider instance (per session), with its kernel registry.
#[repr(C)]
struct Ep {
    base: OrtEp,
    factory: *const Factory,
    registry: *mut OrtKernelRegistry,
}

/// A kernel for one claimed node.
#[repr(C)]
struct Kernel {
    base: OrtKernelImpl,
    claim: &'static Claim,
    plan: OnnxPlan,
    site: CallSite,
    /// Per distinct run-time attribute values (`plan.runtime_ints`), when there are any.
    sites: CallSites,
}

fn verbose() -> bool {
    std::env::var_os("POLYOP_ORT_EP_VERBOSE").is_some()
}

/// Whether `GetCapability` fuses a claimed node with a following elementwise one (on unless
/// `POLYOP_ORT_EP_FUSE=0`, for comparisons).
fn fusion_enabled() -> bool {
    std::env::var("POLYOP_ORT_EP_FUSE").map_or(true, |v| v.trim() != "0")
}

/// Under `POLYOP_ORT_EP_VERBOSE`: which inputs of a kernel being made were prepacked.
fn report_prepacked(claim: &Claim, site: &CallSite) {
    if verbose() && !site.prepacked.is_empty() {
        let inputs: Vec<usize> = site.prepacked.iter().map(|(i, _)| *i).collect();
        eprintln!(
            "polyop EP: {} (version {}) prepacked input(s) {inputs:?}",
            claim.map.op_type, claim.version
        );
    }
}

/// Whether kernels get the op's prepacked forms of constant inputs (on unless
/// `POLYOP_ORT_EP_PREPACK=0`, for comparisons; read when a session makes its kernels).
fn prepack_enabled() -> bool {
    std::env::var("POLYOP_ORT_EP_PREPACK").map_or(true, |v| v.trim() != "0")
}

fn status(api: Api, e: &Error) -> Status {
    api.status(e)
}

/// Every (op, declared ONNX op, schema version) of `registry`, one per (op type, version): the
/// first op to declare a version serves it.
fn claim_table(registry: &'static Registry) -> Vec<(&'static OpDef, &'static OnnxOp, u32)> {
    let mut v: Vec<(&'static OpDef, &'static OnnxOp, u32)> = Vec::new();
    for op in registry.ops() {
        for map in &op.onnx {
            for &version in map.versions {
                if !v
                    .iter()
                    .any(|(_, m, ver)| m.op_type == map.op_type && *ver == version)
                {
                    v.push((op, map, version));
                }
            }
        }
    }
    v
}

/// The claims of `registry` under `api`, built once per process (onnxruntime keeps pointers to
/// them in every kernel registry).
fn claims_of(registry: &'static Registry, api: Api) -> &'static [Claim] {
    static CACHE: crate::PerRegistry<Claim> = std::sync::OnceLock::new();
    crate::per_registry(&CACHE, registry, api, || {
        claim_table(registry)
            .into_iter()
            .map(|(op, map, version)| Claim {
                op,
                map,
                version,
                op_type: CString::new(map.op_type).unwrap_or_default(),
                api,
            })
            .collect()
    })
}

/// The provider's `CreateEpFactories`: one factory for `registry`'s standard ops.
///
/// # Safety
/// The arguments are the ones onnxruntime passes to `CreateEpFactories`.
pub unsafe fn create_ep_factories(
    registry: &'static Registry,
    api_base: *const OrtApiBase,
    factories: *mut *mut c_void,
    max_factories: usize,
    num_factories: *mut usize,
) -> *mut OrtStatus {
    if api_base.is_null() || factories.is_null() || num_factories.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: onnxruntime's own `OrtApiBase`, a static struct of the loaded library.
    let base = unsafe { &*api_base };
    // SAFETY: as above.
    let (version, runtime_api) = unsafe { runtime(base) }.clone();
    // SAFETY: `GetApi` accepts any version and answers null for one it lacks.
    let oldest = unsafe { (base.GetApi)(1) };
    if runtime_api < MIN_RUNTIME_API {
        if oldest.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: a non-null table from `GetApi` is static data of the loaded library.
        let api = Api(unsafe { &*oldest });
        return api.status_msg(
            OrtErrorCode::ORT_FAIL,
            &format!(
                "polyop: the execution provider needs ONNX Runtime 1.{MIN_RUNTIME_API} or newer \
                 (kernel-based plugin providers); this is onnxruntime {version}"
            ),
        );
    }
    // SAFETY: as above; the runtime serves API `MIN_RUNTIME_API` (checked).
    let table = unsafe { (base.GetApi)(MIN_RUNTIME_API) };
    if table.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: a table of version >= 23 has every entry `OrtApiEp` declares (the C API only
    // appends), and it is static data of the loaded library, never written.
    let ext: &'static OrtApiEp = unsafe { &*(table as *const OrtApiEp) };
    let api = Api(&ext.base);
    // SAFETY: `base` is onnxruntime's `OrtApiBase` (above).
    unsafe { crate::sys::init_shape_ref(base) };
    // SAFETY: `GetEpApi` returns onnxruntime's static EP API table.
    let ep_api = unsafe { (ext.GetEpApi)() };
    if ep_api.is_null() {
        return api.status_msg(OrtErrorCode::ORT_FAIL, "polyop: onnxruntime has no EP API");
    }
    if max_factories == 0 {
        // SAFETY: onnxruntime's out-parameter.
        unsafe { *num_factories = 0 };
        return ptr::null_mut();
    }
    let r = std::panic::catch_unwind(|| {
        let factory = Box::new(Factory {
            base: OrtEpFactory {
                ort_version_supported: FACTORY_API_VERSION,
                GetName: factory_name,
                GetVendor: factory_vendor,
                GetSupportedDevices: get_supported_devices,
                CreateEp: create_ep,
                ReleaseEp: release_ep,
                GetVendorId: vendor_id,
                GetVersion: factory_version,
                ValidateCompiledModelCompatibilityInfo: validate_compiled,
                CreateAllocator: create_allocator,
                ReleaseAllocator: release_allocator,
                CreateDataTransfer: create_data_transfer,
                IsStreamAware: is_stream_aware,
                CreateSyncStreamForDevice: create_sync_stream,
            },
            api,
            ext,
            // SAFETY: non-null (checked), static data of the loaded library.
            ep_api: unsafe { &*ep_api },
            name: CString::new(provider_name(registry)).unwrap_or_default(),
            claims: claims_of(registry, api),
        });
        Box::into_raw(factory)
    });
    match r {
        Ok(f) => {
            // SAFETY: onnxruntime's array has room for `max_factories` >= 1 entries.
            unsafe {
                *factories = f as *mut c_void;
                *num_factories = 1;
            }
            ptr::null_mut()
        }
        Err(_) => api.status_msg(
            OrtErrorCode::ORT_FAIL,
            "polyop: creating the EP factory failed",
        ),
    }
}

/// The provider's `ReleaseEpFactory`.
///
/// # Safety
/// `factory` is one [`create_ep_factories`] made, released once.
pub unsafe fn release_ep_factory(factory: *mut c_void) -> *mut OrtStatus {
    if !factory.is_null() {
        // SAFETY: made by `Box::into_raw` in `create_ep_factories`, released once.
        drop(unsafe { Box::from_raw(factory as *mut Factory) });
    }
    ptr::null_mut()
}

// ---- the factory ------------------------------------------------------------------------

/// # Safety
/// `f` is a factory pointer onnxruntime got from `create_ep_factories`.
unsafe fn fac<'a>(f: *const OrtEpFactory) -> &'a Factory {
    // SAFETY: `Factory` is `#[repr(C)]` with its `OrtEpFactory` first, and it lives until
    // `ReleaseEpFactory` (after every use by onnxruntime).
    unsafe { &*(f as *const Factory) }
}

// SAFETY (every `fac(..)` below): onnxruntime calls the factory's functions only with the
// factory pointer `CreateEpFactories` gave it.
unsafe extern "system" fn factory_name(f: *const OrtEpFactory) -> *const c_char {
    // SAFETY: see above.
    unsafe { fac(f) }.name.as_ptr()
}
unsafe extern "system" fn factory_vendor(_f: *const OrtEpFactory) -> *const c_char {
    c"polyop".as_ptr()
}
unsafe extern "system" fn vendor_id(_f: *const OrtEpFactory) -> u32 {
    0
}
unsafe extern "system" fn factory_version(_f: *const OrtEpFactory) -> *const c_char {
    static V: std::sync::OnceLock<CString> = std::sync::OnceLock::new();
    V.get_or_init(|| CString::new(env!("CARGO_PKG_VERSION")).unwrap_or_default())
        .as_ptr()
}

unsafe extern "system" fn get_supported_devices(
    f: *mut OrtEpFactory,
    devices: *const *const OrtHardwareDevice,
    num_devices: usize,
    ep_devices: *mut *mut OrtEpDevice,
    max_ep_devices: usize,
    num_ep_devices: *mut usize,
) -> Status {
    // SAFETY: see above.
    let fa = unsafe { fac(f) };
    // SAFETY: onnxruntime's out-parameter.
    unsafe { *num_ep_devices = 0 };
    // SAFETY: onnxruntime passes `num_devices` device pointers.
    let devs = unsafe { kernel_core::ffi::slice_from_c(devices, num_devices) };
    for &d in devs {
        // SAFETY: a live hardware device of onnxruntime's list.
        let ty = unsafe { (fa.ext.HardwareDevice_Type)(d) };
        if ty != OrtHardwareDeviceType::OrtHardwareDeviceType_CPU || max_ep_devices == 0 {
            continue;
        }
        let mut ep_dev: *mut OrtEpDevice = ptr::null_mut();
        // SAFETY: `f` is this factory, `d` a live device; no metadata or options;
        // onnxruntime takes ownership of the new device once it is in `ep_devices`.
        let st = unsafe { (fa.ep_api.CreateEpDevice)(f, d, ptr::null(), ptr::null(), &mut ep_dev) };
        if !st.is_null() {
            return st;
        }
        // SAFETY: `ep_devices` has room for `max_ep_devices` >= 1 entries.
        unsafe {
            *ep_devices = ep_dev;
            *num_ep_devices = 1;
        }
        break;
    }
    ptr::null_mut()
}

unsafe extern "system" fn create_ep(
    f: *mut OrtEpFactory,
    _devices: *const *const OrtHardwareDevice,
    _metadata: *const *const OrtKeyValuePairs,
    _num_devices: usize,
    _options: *const OrtSessionOptions,
    _logger: *const OrtLogger,
    ep_out: *mut *mut OrtEp,
) -> Status {
    // SAFETY: see above.
    let fa = unsafe { fac(f) };
    // SAFETY: onnxruntime's out-parameter.
    unsafe { *ep_out = ptr::null_mut() };
    let r = std::panic::catch_unwind(|| -> Result<*mut Ep> {
        // SAFETY: `fa.ep_api` is onnxruntime's EP API; every claim is leaked ('static).
        let registry = unsafe { build_kernel_registry(fa) }?;
        Ok(Box::into_raw(Box::new(Ep {
            base: OrtEp {
                ort_version_supported: EP_API_VERSION,
                GetName: ep_name,
                GetCapability: get_capability,
                Compile: Some(compile),
                ReleaseNodeComputeInfos: Some(release_compute_infos),
                optional: [None; 8],
                GetKernelRegistry: get_kernel_registry,
                IsConcurrentRunSupported: None,
            },
            factory: fa,
            registry,
        })))
    });
    match r {
        Ok(Ok(ep)) => {
            // SAFETY: as above.
            unsafe { *ep_out = ep as *mut OrtEp };
            ptr::null_mut()
        }
        Ok(Err(e)) => status(fa.api, &e),
        Err(p) => status(fa.api, &Error::from_panic("CreateEp", p)),
    }
}

unsafe extern "system" fn release_ep(f: *mut OrtEpFactory, ep: *mut OrtEp) {
    if ep.is_null() {
        return;
    }
    // SAFETY: see above.
    let fa = unsafe { fac(f) };
    // SAFETY: `ep` was made by `create_ep` (`Box<Ep>`, `OrtEp` first) and is released once;
    // its kernel registry was made by `build_kernel_registry` and is released with it.
    unsafe {
        let ep = Box::from_raw(ep as *mut Ep);
        if !ep.registry.is_null() {
            (fa.ep_api.ReleaseKernelRegistry)(ep.registry);
        }
    }
}

/// Write `v` to an out-parameter onnxruntime may leave null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn set_out<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: non-null, so valid for a write (this function's contract).
        unsafe { out.write(v) };
    }
}

unsafe extern "system" fn validate_compiled(
    _f: *mut OrtEpFactory,
    _devices: *const *const OrtHardwareDevice,
    _n: usize,
    _info: *const c_char,
    out: *mut c_int,
) -> Status {
    // OrtCompiledModelCompatibility_EP_NOT_APPLICABLE: the provider compiles nothing.
    // SAFETY: onnxruntime's out-parameter (null or writable).
    unsafe { set_out(out, 0) };
    ptr::null_mut()
}
unsafe extern "system" fn create_allocator(
    _f: *mut OrtEpFactory,
    _info: *const OrtMemoryInfo,
    _options: *const OrtKeyValuePairs,
    out: *mut *mut OrtAllocator,
) -> Status {
    // The provider runs on onnxruntime's default CPU allocator.
    // SAFETY: onnxruntime's out-parameter (null or writable).
    unsafe { set_out(out, ptr::null_mut()) };
    ptr::null_mut()
}
unsafe extern "system" fn release_allocator(_f: *mut OrtEpFactory, _a: *mut OrtAllocator) {}
unsafe extern "system" fn create_data_transfer(
    _f: *mut OrtEpFactory,
    out: *mut *mut OrtDataTransferImpl,
) -> Status {
    // CPU memory only: nothing to transfer.
    // SAFETY: onnxruntime's out-parameter (null or writable).
    unsafe { set_out(out, ptr::null_mut()) };
    ptr::null_mut()
}
unsafe extern "system" fn is_stream_aware(_f: *const OrtEpFactory) -> bool {
    false
}
unsafe extern "system" fn create_sync_stream(
    _f: *mut OrtEpFactory,
    _device: *const OrtMemoryDevice,
    _options: *const OrtKeyValuePairs,
    out: *mut *mut OrtSyncStreamImpl,
) -> Status {
    // SAFETY: onnxruntime's out-parameter (null or writable).
    unsafe { set_out(out, ptr::null_mut()) };
    ptr::null_mut()
}

/// One kernel definition per claim: op type, default domain, exactly its schema version, the
/// provider's name; created by [`create_kernel`] with the claim as state.
///
/// # Safety
/// `fa` is a live factory.
unsafe fn build_kernel_registry(fa: &Factory) -> Result<*mut OrtKernelRegistry> {
    let (api, e) = (fa.api, fa.ep_api);
    let mut reg: *mut OrtKernelRegistry = ptr::null_mut();
    // SAFETY: `reg` is written by `CreateKernelRegistry` and used only after it succeeded; each
    // builder and definition is created, used and released here exactly once; strings are
    // NUL-terminated and alive across the calls (onnxruntime copies them); each claim is
    // leaked, so the state pointer outlives every kernel onnxruntime creates from it.
    unsafe {
        api.check(ptrs((e.CreateKernelRegistry)(&mut reg)))?;
        for c in fa.claims {
            let mut b = ptr::null_mut();
            if let Err(err) = api.check(ptrs((e.CreateKernelDefBuilder)(&mut b))) {
                (e.ReleaseKernelRegistry)(reg);
                return Err(err);
            }
            let v = c.version as c_int;
            let mut def: *mut OrtKernelDef = ptr::null_mut();
            let r = (|| {
                api.check(ptrs((e.KernelDefBuilder_SetOperatorType)(
                    b,
                    c.op_type.as_ptr(),
                )))?;
                api.check(ptrs((e.KernelDefBuilder_SetDomain)(b, c"".as_ptr())))?;
                api.check(ptrs((e.KernelDefBuilder_SetSinceVersion)(b, v, v)))?;
                api.check(ptrs((e.KernelDefBuilder_SetExecutionProvider)(
                    b,
                    fa.name.as_ptr(),
                )))?;
                api.check(ptrs((e.KernelDefBuilder_Build)(b, &mut def)))?;
                let create: KernelCreateFn = create_kernel;
                api.check(ptrs((e.KernelRegistry_AddKernel)(
                    reg,
                    def,
                    create,
                    c as *const Claim as *mut c_void,
                )))
            })();
            if !def.is_null() {
                (e.ReleaseKernelDef)(def);
            }
            (e.ReleaseKernelDefBuilder)(b);
            if let Err(err) = r {
                (e.ReleaseKernelRegistry)(reg);
                return Err(err);
            }
        }
    }
    Ok(reg)
}

fn ptrs(st: Status) -> ort_sys::OrtStatusPtr {
    ort_sys::OrtStatusPtr(st)
}

// ---- the provider -----------------------------------------------------------------------

/// # Safety
/// `ep` is a provider pointer onnxruntime got from `create_ep`.
unsafe fn ep_of<'a>(ep: *const OrtEp) -> (&'a Ep, &'a Factory) {
    // SAFETY: `Ep` is `#[repr(C)]` with its `OrtEp` first; it lives until `ReleaseEp`, and its
    // factory until `ReleaseEpFactory` (after every provider is released).
    unsafe {
        let e = &*(ep as *const Ep);
        (e, &*e.factory)
    }
}

unsafe extern "system" fn ep_name(ep: *const OrtEp) -> *const c_char {
    // SAFETY: onnxruntime calls this with a provider from `create_ep`.
    unsafe { ep_of(ep) }.1.name.as_ptr()
}

unsafe extern "system" fn get_kernel_registry(
    ep: *mut OrtEp,
    out: *mut *const OrtKernelRegistry,
) -> Status {
    // SAFETY: onnxruntime calls this with a provider from `create_ep` and its out-parameter.
    unsafe { *out = ep_of(ep).0.registry };
    ptr::null_mut()
}

unsafe extern "system" fn get_capability(
    ep: *mut OrtEp,
    graph: *const OrtGraph,
    info: *mut OrtEpGraphSupportInfo,
) -> Status {
    // SAFETY: onnxruntime calls this with a provider from `create_ep`.
    let (_, fa) = unsafe { ep_of(ep) };
    let r = std::panic::catch_unwind(|| -> Result<()> {
        // SAFETY: `graph` and `info` are live for this call.
        unsafe { claim_nodes(fa, graph, info) }
    });
    match r {
        Ok(Ok(())) => ptr::null_mut(),
        Ok(Err(e)) => status(fa.api, &e),
        Err(p) => status(fa.api, &Error::from_panic("GetCapability", p)),
    }
}

/// A node `claim_nodes` claims: its kernel and the op's plan for it.
struct Claimed {
    node: *const OrtNode,
    claim: &'static Claim,
    plan: OnnxPlan,
}

/// The nodes of a graph.
///
/// # Safety
/// `graph` is live; the nodes (owned by it) are used only while it is.
unsafe fn graph_nodes(fa: &Factory, graph: *const OrtGraph) -> Result<Vec<*const OrtNode>> {
    let (api, x) = (fa.api, fa.ext);
    // SAFETY: `graph` is live; the array has room for the count the graph reported.
    unsafe {
        let n = api.out(0usize, |n| ptrs((x.Graph_GetNumNodes)(graph, n)))?;
        let mut nodes = vec![ptr::null::<OrtNode>(); n];
        api.check(ptrs((x.Graph_GetNodes)(graph, nodes.as_mut_ptr(), n)))?;
        Ok(nodes)
    }
}

/// The registered kernel that serves `node` (its domain, op type and opset version) and the
/// op's plan for it; `None` when there is none or the op refuses the node (said on stderr
/// under `POLYOP_ORT_EP_VERBOSE`).
///
/// # Safety
/// `node` is live for this call.
unsafe fn claim_of(
    fa: &Factory,
    node: *const OrtNode,
) -> Result<Option<(&'static Claim, OnnxPlan)>> {
    let (api, x) = (fa.api, fa.ext);
    // SAFETY: a live node; the strings it returns are owned by the node.
    let (domain, op_type, version) = unsafe {
        let d = api.out(ptr::null(), |p| ptrs((x.Node_GetDomain)(node, p)))?;
        let t = api.out(ptr::null(), |p| ptrs((x.Node_GetOperatorType)(node, p)))?;
        let v = api.out(0i32, |p| ptrs((x.Node_GetSinceVersion)(node, p)))?;
        (
            string_from_c(d).unwrap_or_default(),
            string_from_c(t).unwrap_or_default(),
            v,
        )
    };
    if !(domain.is_empty() || domain == "ai.onnx") {
        return Ok(None);
    }
    let claims: &'static [Claim] = fa.claims;
    let Some(claim) = claims
        .iter()
        .find(|c| c.map.op_type == op_type && c.version as i32 == version)
    else {
        if verbose() && claims.iter().any(|c| c.map.op_type == op_type) {
            eprintln!(
                "polyop EP: {op_type} (version {version}) not claimed: no kernel for this version"
            );
        }
        return Ok(None);
    };
    // SAFETY: `node` is live for this call.
    let view = unsafe { GraphNode::new(fa, node, version as u32) }?;
    match claim.map.plan(claim.op, &view) {
        Ok(plan) => Ok(Some((claim, plan))),
        Err(why) => {
            if verbose() {
                eprintln!("polyop EP: {op_type} {version} not claimed: {why}");
            }
            Ok(None)
        }
    }
}

/// Claim every node that a registered kernel implements exactly: each alone (onnxruntime then
/// creates its kernel through the registry), except a node whose op applies epilogues followed
/// by an elementwise node that is one ([`epilogue_pairs`]): those two are fused into one node
/// that [`compile`] runs as one call.
///
/// # Safety
/// `graph` and `info` are live for the `GetCapability` call in progress.
unsafe fn claim_nodes(
    fa: &Factory,
    graph: *const OrtGraph,
    info: *mut OrtEpGraphSupportInfo,
) -> Result<()> {
    let api = fa.api;
    let mut claimed = Vec::new();
    // SAFETY: `graph` is live for this call.
    for node in unsafe { graph_nodes(fa, graph) }? {
        // SAFETY: a live node of `graph`.
        let Some((claim, plan)) = (unsafe { claim_of(fa, node) })? else {
            continue;
        };
        let mut def: *const OrtKernelDef = ptr::null();
        // SAFETY: `info` and `node` are live; `def` is a writable local (owned by onnxruntime,
        // not released).
        unsafe {
            api.check(ptrs((fa.ep_api.EpGraphSupportInfo_LookUpKernel)(
                info, node, &mut def,
            )))?;
        }
        if def.is_null() {
            if verbose() {
                eprintln!(
                    "polyop EP: {} {}: no registered kernel matched",
                    claim.map.op_type, claim.version
                );
            }
            continue;
        }
        claimed.push(Claimed { node, claim, plan });
    }
    let chains = if fusion_enabled() {
        // SAFETY: the claimed nodes are live nodes of `graph`.
        unsafe { epilogue_chains(fa, &claimed) }?
    } else {
        Vec::new()
    };
    let mut fused = vec![false; claimed.len()];
    for chain in &chains {
        let nodes: Vec<*const OrtNode> = chain.iter().map(|&i| claimed[i].node).collect();
        chain.iter().for_each(|&i| fused[i] = true);
        let options = OrtNodeFusionOptions {
            ort_version_supported: EP_API_VERSION,
            drop_constant_initializers: false,
        };
        // SAFETY: `info` and the nodes are live; onnxruntime copies the array.
        unsafe {
            api.check(ptrs((fa.ep_api.EpGraphSupportInfo_AddNodesToFuse)(
                info,
                nodes.as_ptr(),
                nodes.len(),
                &options,
            )))?
        };
        if verbose() {
            let types: Vec<&str> = chain
                .iter()
                .map(|&i| claimed[i].claim.map.op_type)
                .collect();
            eprintln!("polyop EP: {} fused into one node", types.join(" + "));
        }
    }
    for (c, _) in claimed.iter().zip(&fused).filter(|(_, f)| !**f) {
        // SAFETY: as above.
        unsafe {
            api.check(ptrs((fa.ep_api.EpGraphSupportInfo_AddSingleNode)(
                info, c.node,
            )))?
        };
        if verbose() {
            eprintln!(
                "polyop EP: {} {} claimed ({})",
                c.claim.map.op_type, c.claim.version, c.claim.op.name
            );
        }
    }
    Ok(())
}

/// The value infos of a node's outputs (null for an absent optional one).
///
/// # Safety
/// `node` is live; the value infos are used only while it is.
unsafe fn node_outputs(fa: &Factory, node: *const OrtNode) -> Result<Vec<*const OrtValueInfo>> {
    let (api, x) = (fa.api, fa.ext);
    // SAFETY: `node` is live; the array has room for the count it reported.
    unsafe {
        let n = api.out(0usize, |n| ptrs((x.Node_GetNumOutputs)(node, n)))?;
        let mut v = vec![ptr::null::<OrtValueInfo>(); n];
        api.check(ptrs((x.Node_GetOutputs)(node, v.as_mut_ptr(), n)))?;
        Ok(v)
    }
}

/// The names of a node's outputs (`None` for an absent optional one).
///
/// # Safety
/// `node` is live.
unsafe fn node_output_names(fa: &Factory, node: *const OrtNode) -> Result<Vec<Option<String>>> {
    // SAFETY: `node` is live (this function's contract).
    let outs = unsafe { node_outputs(fa, node) }?;
    // SAFETY: as above: live value infos of the node.
    outs.iter()
        .map(|&vi| unsafe { value_name(fa, vi) })
        .collect()
}

/// A value's name (`None` for an absent one).
///
/// # Safety
/// `vi` is null or a live value info.
unsafe fn value_name(fa: &Factory, vi: *const OrtValueInfo) -> Result<Option<String>> {
    if vi.is_null() {
        return Ok(None);
    }
    // SAFETY: a live value info; the name is owned by it.
    let name = unsafe {
        fa.api
            .out(ptr::null(), |p| ptrs((fa.ext.GetValueInfoName)(vi, p)))?
    };
    // SAFETY: a NUL-terminated string owned by the value info.
    Ok(unsafe { string_from_c(name) }.filter(|n| !n.is_empty()))
}

/// Input `i` of a compute call as float32 values (an error for another type).
///
/// # Safety
/// `ctx` is the kernel context of the running compute call; the slice lives no longer.
unsafe fn f32_input<'a>(api: Api, ctx: *mut OrtKernelContext, i: usize) -> Result<&'a [f32]> {
    // SAFETY: `ctx` is live (this function's contract).
    let v = unsafe { api.input(ctx, i) }?;
    if v.is_null() {
        return Err(Error::invalid(format!("input {i} is missing")));
    }
    // SAFETY: a live tensor value of this call.
    let (et, shape) = unsafe { api.value_type_shape(v) }?;
    if ONNX_DTYPES.dtype(et) != Some(DType::F32) {
        return Err(Error::invalid(format!("input {i} is not float32")));
    }
    let n: usize = shape.iter().product();
    // SAFETY: as above.
    let data = unsafe { api.tensor_data(v) }?;
    // SAFETY: onnxruntime's dense buffer of `n` float32 values, alive for the compute call.
    Ok(unsafe { std::slice::from_raw_parts(data as *const f32, n) })
}

/// The names of a node's inputs (`None` for an absent optional one).
///
/// # Safety
/// `node` is live.
unsafe fn node_input_names(fa: &Factory, node: *const OrtNode) -> Result<Vec<Option<String>>> {
    // SAFETY: `node` is live (this function's contract).
    let view = unsafe { GraphNode::new(fa, node, 0) }?;
    // SAFETY: as above: live value infos of the node (or null).
    view.inputs
        .iter()
        .map(|&vi| unsafe { value_name(fa, vi) })
        .collect()
}

/// The chains of claimed nodes to fuse, each a producer and the nodes after it that it runs
/// as its epilogue ([`Epilogue`]). The producer's op applies epilogues
/// ([`kernel_core::OpFlags::applies_epilogue`]); each next node is the only reader of the
/// previous one's one output (float32, not a graph output), its op has an epilogue form
/// ([`OpDef::epilogue`]), and it has no other input (unary) or one other float32 input of
/// the same static shape (binary: a residual `Add`). Every node's plan computes it as it is
/// (no run-time attributes, no reshaped or transposed tensors).
///
/// # Safety
/// The claimed nodes are live.
unsafe fn epilogue_chains(fa: &Factory, claimed: &[Claimed]) -> Result<Vec<Vec<usize>>> {
    let (api, x) = (fa.api, fa.ext);
    let plain = |c: &Claimed| {
        c.plan.runtime_ints.is_empty()
            && c.plan.flatten_axis.is_none()
            && c.plan.transpose_output.is_none()
    };
    // a float32 value: its dims when they are all static
    let f32_dims = |vi: *const OrtValueInfo| -> Option<Option<Vec<usize>>> {
        // SAFETY: `vi` is a live value info (callers').
        match unsafe { value_info_spec(api, x, vi) } {
            Ok(s) if s.dtype == DType::F32 => {
                Some(s.shape.and_then(|d| d.iter().map(Dim::known).collect()))
            }
            _ => None,
        }
    };
    let mut chains = Vec::new();
    // (a node joins one chain only: the Add of a residual block whose shortcut is a
    // convolution too reads two producers)
    let mut used = vec![false; claimed.len()];
    for (pi, p) in claimed.iter().enumerate() {
        if !p.claim.op.flags.applies_epilogue || !plain(p) || used[pi] {
            continue;
        }
        let mut chain = vec![pi];
        loop {
            let cur = &claimed[chain[chain.len() - 1]];
            // SAFETY: a live node.
            let outs = unsafe { node_outputs(fa, cur.node) }?;
            let [out] = outs[..] else { break };
            let Some(dims) = (!out.is_null()).then(|| f32_dims(out)).flatten() else {
                break;
            };
            // SAFETY: `out` is a live value info; the consumer arrays have room for the one
            // consumer counted.
            let (consumer, index) = unsafe {
                let graph_output = api.out(false, |b| ptrs((x.ValueInfo_IsGraphOutput)(out, b)))?;
                let n = api.out(0usize, |n| ptrs((x.ValueInfo_GetValueNumConsumers)(out, n)))?;
                if graph_output || n != 1 {
                    break;
                }
                let mut node = ptr::null::<OrtNode>();
                let mut index = -1i64;
                api.check(ptrs((x.ValueInfo_GetValueConsumers)(
                    out, &mut node, &mut index, 1,
                )))?;
                (node, index)
            };
            let Some(ci) = claimed.iter().position(|c| c.node == consumer) else {
                break;
            };
            let c = &claimed[ci];
            // SAFETY: a live node.
            let inputs = unsafe { GraphNode::new(fa, c.node, 0) }?.inputs;
            let fits = match (c.claim.op.epilogue, &inputs[..], index) {
                (Some(EpilogueFn::Unary(_)), [_], 0) => true,
                (Some(EpilogueFn::Binary(_)), [a, b], 0 | 1) => {
                    let other = if index == 0 { *b } else { *a };
                    // (same static shape: no broadcasting)
                    !other.is_null()
                        && other != out
                        && dims.is_some()
                        && f32_dims(other) == Some(dims.clone())
                }
                _ => false,
            };
            if !fits || !plain(c) || used[ci] || chain.contains(&ci) {
                break;
            }
            chain.push(ci);
        }
        if chain.len() > 1 {
            chain.iter().for_each(|&i| used[i] = true);
            chains.push(chain);
        }
    }
    Ok(chains)
}

/// A tensor's element type and declared dims as the plan sees them.
///
/// # Safety
/// `info` is a live tensor type-and-shape info.
unsafe fn spec_of(
    api: Api,
    info: *const OrtTensorTypeAndShapeInfo,
) -> std::result::Result<TensorSpec, String> {
    // SAFETY: this function's contract.
    let (et, dims) = unsafe { api.info_spec_dims(info) }.map_err(|e| e.message)?;
    let dtype = ONNX_DTYPES.dtype(et).ok_or_else(|| onnx_type_name(et))?;
    Ok(TensorSpec::with_dims(dtype, dims))
}

/// Call `f` with a view of constant value `v` (a dense tensor of a dtype polyop has).
///
/// # Safety
/// `v` is a live tensor value for the duration of this call.
unsafe fn with_const_view(api: Api, v: *const OrtValue, f: &mut dyn FnMut(&TensorRef)) {
    // SAFETY: this function's contract.
    let Ok((et, shape)) = (unsafe { api.value_type_shape(v) }) else {
        return;
    };
    // SAFETY: as above.
    let (Some(dtype), Ok(data)) = (ONNX_DTYPES.dtype(et), unsafe { api.tensor_data(v) }) else {
        return;
    };
    // SAFETY: a dense buffer of the shape's elements of `dtype`, alive as long as `v`.
    f(&unsafe { TensorRef::from_raw_contiguous(dtype, shape, data) });
}

/// The values of an int64 or int32 tensor value.
///
/// # Safety
/// `v` is a live tensor value.
unsafe fn int_values(api: Api, v: *const OrtValue) -> Option<Vec<i64>> {
    // SAFETY: this function's contract.
    let (et, shape) = unsafe { api.value_type_shape(v) }.ok()?;
    let n: usize = shape.iter().product();
    // SAFETY: as above.
    let data = unsafe { api.tensor_data(v) }.ok()?;
    let dtype = ONNX_DTYPES.dtype(et)?;
    // SAFETY: a dense buffer of `n` elements of `dtype`, alive as long as `v`.
    let t = unsafe { TensorRef::from_raw_contiguous(dtype, vec![n], data) };
    match dtype {
        DType::I64 => t.contiguous::<i64>().ok().map(|c| c.into_owned()),
        DType::I32 => t
            .contiguous::<i32>()
            .ok()
            .map(|c| c.iter().map(|&x| x as i64).collect()),
        _ => None,
    }
}

/// A graph value's element type and declared dims.
///
/// # Safety
/// `vi` is a live value info.
unsafe fn value_info_spec(
    api: Api,
    x: &OrtApiEp,
    vi: *const OrtValueInfo,
) -> std::result::Result<TensorSpec, String> {
    let mut ti: *const ort_sys::OrtTypeInfo = ptr::null();
    let mut tinfo: *const OrtTensorTypeAndShapeInfo = ptr::null();
    // SAFETY: `vi` is live (this function's contract); the type info belongs to it (not
    // released); `tinfo` points into `ti`.
    let ok = unsafe {
        api.check(ptrs((x.GetValueInfoTypeInfo)(vi, &mut ti)))
            .is_ok()
            && !ti.is_null()
            && api
                .check((api.0.CastTypeInfoToTensorInfo)(ti, &mut tinfo))
                .is_ok()
            && !tinfo.is_null()
    };
    if !ok {
        return Err("a non-tensor type".into());
    }
    // SAFETY: a live tensor info (above).
    unsafe { spec_of(api, tinfo) }
}

/// A node of the graph `GetCapability` is asked about.
struct GraphNode {
    api: Api,
    ext: &'static OrtApiEp,
    node: *const OrtNode,
    version: u32,
    inputs: Vec<*const OrtValueInfo>,
}

impl GraphNode {
    /// # Safety
    /// `node` is live while the result is used.
    unsafe fn new(fa: &Factory, node: *const OrtNode, version: u32) -> Result<GraphNode> {
        let (api, x) = (fa.api, fa.ext);
        // SAFETY: `node` is live; the array has room for the count it reported.
        let inputs = unsafe {
            let n = api.out(0usize, |n| ptrs((x.Node_GetNumInputs)(node, n)))?;
            let mut v = vec![ptr::null::<OrtValueInfo>(); n];
            api.check(ptrs((x.Node_GetInputs)(node, v.as_mut_ptr(), n)))?;
            v
        };
        Ok(GraphNode {
            api,
            ext: x,
            node,
            version,
            inputs,
        })
    }
}

impl OnnxNode for GraphNode {
    fn since_version(&self) -> u32 {
        self.version
    }
    fn num_inputs(&self) -> usize {
        self.inputs.len()
    }
    fn input(&self, i: usize) -> Option<std::result::Result<TensorSpec, String>> {
        let vi = *self.inputs.get(i)?;
        if vi.is_null() {
            return None;
        }
        // SAFETY: a live value info of the node.
        Some(unsafe { value_info_spec(self.api, self.ext, vi) })
    }
    fn attr(&self, name: &str, ty: &ArgType) -> Option<AttrValue> {
        let (api, x, node) = (self.api, self.ext, self.node);
        let get = |n: &CString| -> Option<*const ort_sys::OrtOpAttr> {
            let mut a = ptr::null();
            // SAFETY: `node` is live; `n` is NUL-terminated; `a` a writable local. An absent
            // attribute is an error status or a null attribute.
            let st = unsafe { (x.Node_GetAttributeByName)(node, n.as_ptr(), &mut a) };
            api.check(ptrs(st)).ok().filter(|_| !a.is_null()).map(|_| a)
        };
        read_one(OpAttrs(api, get), name, ty)
    }
    fn const_ints(&self, i: usize) -> Option<Vec<i64>> {
        // SAFETY: the initializer value belongs to the graph, live during this call.
        self.const_value(i)
            .and_then(|v| unsafe { int_values(self.api, v) })
    }
    fn const_tensor(&self, i: usize, f: &mut dyn FnMut(&TensorRef)) {
        if let Some(v) = self.const_value(i) {
            // SAFETY: as above.
            unsafe { with_const_view(self.api, v, f) };
        }
    }
}

impl GraphNode {
    /// Input `i`'s value when it is a constant initializer (owned by the graph).
    fn const_value(&self, i: usize) -> Option<*const OrtValue> {
        let vi = *self.inputs.get(i)?;
        if vi.is_null() {
            return None;
        }
        let mut is_const = false;
        let mut v: *const OrtValue = ptr::null();
        // SAFETY: `vi` is a live value info; the initializer value belongs to the graph and
        // is read only during this call.
        unsafe {
            self.api
                .check(ptrs((self.ext.ValueInfo_IsConstantInitializer)(
                    vi,
                    &mut is_const,
                )))
                .ok()?;
            if !is_const {
                return None;
            }
            self.api
                .check(ptrs((self.ext.ValueInfo_GetInitializerValue)(vi, &mut v)))
                .ok()?;
            (!v.is_null()).then_some(v)
        }
    }
}

/// The node of a kernel being created, seen through its `OrtKernelInfo`.
struct InfoNode {
    api: Api,
    info: *const OrtKernelInfo,
    version: u32,
    n_in: usize,
}

impl OnnxNode for InfoNode {
    fn since_version(&self) -> u32 {
        self.version
    }
    fn num_inputs(&self) -> usize {
        self.n_in
    }
    fn input(&self, i: usize) -> Option<std::result::Result<TensorSpec, String>> {
        // SAFETY: the kernel info is live during kernel creation; `i` < its input count.
        let (et, dims) = unsafe { self.api.info_input_spec(self.info, i) }?;
        Some(match ONNX_DTYPES.dtype(et) {
            Some(d) => Ok(TensorSpec::with_dims(d, dims)),
            None => Err(onnx_type_name(et)),
        })
    }
    fn attr(&self, name: &str, ty: &ArgType) -> Option<AttrValue> {
        // SAFETY: as above.
        unsafe { kernel_info_attr(self.api, self.info, name, ty) }
    }
    fn const_ints(&self, i: usize) -> Option<Vec<i64>> {
        // SAFETY: the constant value belongs to the session.
        self.const_value(i)
            .and_then(|v| unsafe { int_values(self.api, v) })
    }
    fn const_tensor(&self, i: usize, f: &mut dyn FnMut(&TensorRef)) {
        if let Some(v) = self.const_value(i) {
            // SAFETY: as above.
            unsafe { with_const_view(self.api, v, f) };
        }
    }
}

impl InfoNode {
    /// Input `i`'s value when it is a constant initializer (owned by the session).
    fn const_value(&self, i: usize) -> Option<*const OrtValue> {
        let mut is_const: c_int = 0;
        let mut v: *const OrtValue = ptr::null();
        // SAFETY: as above; the constant value belongs to the session.
        unsafe {
            self.api
                .check((self.api.0.KernelInfoGetConstantInput_tensor)(
                    self.info,
                    i,
                    &mut is_const,
                    &mut v,
                ))
                .ok()?;
            (is_const != 0 && !v.is_null()).then_some(v)
        }
    }
}

// ---- kernels ----------------------------------------------------------------------------

unsafe extern "system" fn create_kernel(
    state: *mut c_void,
    info: *const OrtKernelInfo,
    out: *mut *mut OrtKernelImpl,
) -> Status {
    // SAFETY: the state registered with this function is a leaked `Claim`.
    let claim: &'static Claim = unsafe { &*(state as *const Claim) };
    // SAFETY: onnxruntime's out-parameter.
    unsafe { *out = ptr::null_mut() };
    let api = claim.api;
    let mut made: *mut OrtKernelImpl = ptr::null_mut();
    let st = guard(api, claim.op, || {
        // SAFETY: `info` is live for this call.
        let n_in = unsafe { api.info_input_count(info) }?;
        let node = InfoNode {
            api,
            info,
            version: claim.version,
            n_in,
        };
        let plan = claim.map.plan(claim.op, &node).map_err(|why| {
            Error::invalid(format!(
                "{} node (version {}) cannot run here: {why}",
                claim.map.op_type, claim.version
            ))
        })?;
        let mut site = CallSite::new(plan.attrs.clone());
        // the op's own forms of constant inputs (a convolution's weights), made once
        if prepack_enabled() {
            site.prepacked = plan.prepack(claim.op, &node);
        }
        report_prepacked(claim, &site);
        let k = Box::new(Kernel {
            base: OrtKernelImpl {
                ort_version_supported: EP_API_VERSION,
                flags: 0,
                Compute: kernel_compute,
                Release: kernel_release,
                PrePackWeight: None,
                SetSharedPrePackedWeight: None,
            },
            claim,
            plan,
            site,
            sites: CallSites::new(),
        });
        made = Box::into_raw(k) as *mut OrtKernelImpl;
        Ok(())
    });
    // SAFETY: as above; onnxruntime releases the kernel through `kernel_release`.
    unsafe { *out = made };
    st.0
}

unsafe extern "system" fn kernel_release(k: *mut OrtKernelImpl) {
    if !k.is_null() {
        // SAFETY: made by `Box::into_raw` in `create_kernel`, released once.
        drop(unsafe { Box::from_raw(k as *mut Kernel) });
    }
}

/// Outputs in onnxruntime's memory, reshaped for a flattened layout or transposed after the
/// kernel ran.
struct EpOutputs {
    inner: OrtOutputs,
    /// The node's output shape when tensors are viewed 2-D (input 0's shape).
    flat_shape: Option<Vec<usize>>,
    transpose: Option<usize>,
    pending: Option<(usize, OwnedTensor)>,
}

impl<'a> OutputAllocator<'a> for EpOutputs {
    fn allocate(&mut self, i: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        if self.transpose == Some(i) {
            if shape.len() != 2 {
                return Err(Error::internal("a transposed output must be 2-D"));
            }
            let mut t = OwnedTensor::zeros(dtype, shape);
            let ptr = t.view_mut().ptr();
            self.pending = Some((i, t));
            // SAFETY: a fresh buffer of `dtype` elements of `shape`, owned by `self.pending`
            // (the heap buffer does not move) for the rest of the call.
            return Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, ptr) });
        }
        match &self.flat_shape {
            Some(full) => {
                let t = self.inner.allocate(i, dtype, full)?;
                let ptr = t.ptr();
                // SAFETY: onnxruntime's dense buffer of the same element count (the 2-D view
                // of `full`).
                Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, ptr) })
            }
            None => self.inner.allocate(i, dtype, shape),
        }
    }
}

impl EpOutputs {
    /// Write a pending transposed output into onnxruntime's memory.
    fn finish(&mut self) -> Result<()> {
        let Some((i, t)) = self.pending.take() else {
            return Ok(());
        };
        let v = t.view();
        let (r, c) = (v.shape[0], v.shape[1]);
        let out = self.inner.allocate(i, v.dtype, &[c, r])?;
        let es = v.dtype.size();
        let src = t.as_bytes();
        let dst = out.ptr();
        for a in 0..r {
            for b in 0..c {
                // SAFETY: `dst` is onnxruntime's dense [c, r] buffer of `es`-byte elements;
                // (b, a) is in range; the source is the [r, c] scratch buffer.
                unsafe {
                    ptr::copy_nonoverlapping(
                        src.as_ptr().add((a * c + b) * es),
                        dst.add((b * r + a) * es),
                        es,
                    )
                };
            }
        }
        Ok(())
    }
}

unsafe extern "system" fn kernel_compute(
    k: *mut OrtKernelImpl,
    ctx: *mut OrtKernelContext,
) -> Status {
    // SAFETY: made by `create_kernel` and alive until `kernel_release`.
    let k = unsafe { &*(k as *const Kernel) };
    let (api, op) = (k.claim.api, k.claim.op);
    guard(api, op, || {
        // SAFETY: `ctx` is the live context of this compute call; views do not outlive it.
        let (ins, full) = unsafe { ep_inputs(api, op, &k.plan, ctx) }?;
        let mut outs = EpOutputs {
            inner: OrtOutputs {
                api,
                ctx,
                // SAFETY: as above.
                n_out: unsafe { api.output_count(ctx) }?,
                scratch: Vec::new(),
            },
            flat_shape: k.plan.flatten_axis.map(|_| full),
            transpose: k.plan.transpose_output,
            pending: None,
        };
        let pool = OrtPool { api, ctx };
        if k.plan.runtime_ints.is_empty() {
            call::run(op, &ins, &k.site, &mut outs, &pool, Phase::Compute)?;
        } else {
            // SAFETY: as above.
            let vals = unsafe { runtime_ints(api, &k.plan, ctx) }?;
            let site = k.sites.get_or_bind(
                |key| {
                    vals.iter()
                        .for_each(|v| key.extend_from_slice(&v.to_ne_bytes()));
                    true
                },
                || k.plan.attrs_with(op, &vals),
            )?;
            call::run(op, &ins, &site, &mut outs, &pool, Phase::Compute)?;
        }
        outs.finish()
    })
    .0
}

// ---- fused nodes -----------------------------------------------------------------------

/// A compiled chain from [`epilogue_chains`]: the producer's op, its plan with inputs numbered
/// as the fused node's, and the ops after it as epilogue steps, run as one call
/// ([`call::run_with_epilogue`]).
#[repr(C)]
struct FusedNode {
    base: OrtNodeComputeInfo,
    claim: &'static Claim,
    plan: OnnxPlan,
    site: CallSite,
    steps: Vec<Step>,
}

/// One epilogue step of a [`FusedNode`]: a binary op's other operand is the fused node's input
/// `.1`; `.2`: the chain's value is the op's first operand.
enum Step {
    Unary(fn(&mut [f32])),
    Binary(fn(&mut [f32], &[f32], bool), usize, bool),
}

unsafe extern "system" fn compile(
    ep: *mut OrtEp,
    graphs: *const *const OrtGraph,
    fused_nodes: *const *const OrtNode,
    count: usize,
    infos: *mut *mut OrtNodeComputeInfo,
    _ep_context_nodes: *mut *mut OrtNode,
) -> Status {
    // SAFETY: onnxruntime calls this with a provider from `create_ep` and `count` graphs, fused
    // nodes and compute-info slots (EPContext nodes are not made: left as they are).
    let (_, fa) = unsafe { ep_of(ep) };
    let r = std::panic::catch_unwind(|| -> Result<()> {
        for i in 0..count {
            // SAFETY: as above.
            unsafe { *infos.add(i) = ptr::null_mut() };
        }
        for i in 0..count {
            // SAFETY: as above; the graph and node are live for this call.
            let made = unsafe { compile_one(fa, *graphs.add(i), *fused_nodes.add(i)) }?;
            // SAFETY: as above; onnxruntime releases it through `release_compute_infos`.
            unsafe { *infos.add(i) = Box::into_raw(made) as *mut OrtNodeComputeInfo };
        }
        Ok(())
    });
    match r {
        Ok(Ok(())) => ptr::null_mut(),
        Ok(Err(e)) => status(fa.api, &e),
        Err(p) => status(fa.api, &Error::from_panic("Compile", p)),
    }
}

/// The compute info of one fused chain: `graph` holds the nodes `GetCapability` fused; `fused`
/// is the node that replaces them, whose inputs are the producer's and the binary steps' other
/// operands.
///
/// # Safety
/// `graph` and `fused` are live for this call.
unsafe fn compile_one(
    fa: &Factory,
    graph: *const OrtGraph,
    fused: *const OrtNode,
) -> Result<Box<FusedNode>> {
    let bad = |why: &str| Error::internal(format!("a fused node polyop cannot run: {why}"));
    // SAFETY: `graph`, its nodes and `fused` are live for this call.
    let (nodes, outer) = unsafe { (graph_nodes(fa, graph)?, node_input_names(fa, fused)?) };
    let mut members = Vec::new();
    for &node in &nodes {
        // SAFETY: as above.
        let (claim, plan) =
            unsafe { claim_of(fa, node) }?.ok_or_else(|| bad("a node polyop does not claim"))?;
        // SAFETY: as above.
        let (ins, outs) = unsafe { (node_input_names(fa, node)?, node_output_names(fa, node)?) };
        members.push((claim, Some(plan), ins, outs));
    }
    let pi = members
        .iter()
        .position(|m| m.0.op.flags.applies_epilogue)
        .ok_or_else(|| bad("no producer"))?;
    let outer_index = |name: &str| {
        outer
            .iter()
            .position(|o| o.as_deref() == Some(name))
            .ok_or_else(|| bad(&format!("`{name}` is not an input of the fused node")))
    };
    // the producer's input j is the fused node's input of the same name
    let (claim, mut plan) = (
        members[pi].0,
        members[pi].1.take().ok_or_else(|| bad("plan"))?,
    );
    // the producer's own forms of its constant inputs, while its plan still numbers them as
    // the node's
    let prepacked = if prepack_enabled() {
        // SAFETY: the producer node is live for this call.
        plan.prepack(claim.op, &unsafe {
            GraphNode::new(fa, nodes[pi], claim.version)
        }?)
    } else {
        Vec::new()
    };
    for j in plan.inputs.iter_mut() {
        *j = match j.and_then(|j| members[pi].2.get(j).cloned().flatten()) {
            None => None,
            Some(name) => Some(outer_index(&name)?),
        };
    }
    // then each node reading the previous one's output, in order
    let mut steps = Vec::new();
    let mut value = members[pi]
        .3
        .first()
        .cloned()
        .flatten()
        .ok_or_else(|| bad("no output"))?;
    for _ in 1..members.len() {
        let (m, index) = members
            .iter()
            .find_map(|m| {
                let i =
                    m.2.iter()
                        .position(|n| n.as_deref() == Some(value.as_str()))?;
                Some((m, i))
            })
            .ok_or_else(|| bad("a broken chain"))?;
        steps.push(match (m.0.op.epilogue, index) {
            (Some(EpilogueFn::Unary(f)), 0) => Step::Unary(f),
            (Some(EpilogueFn::Binary(f)), 0 | 1) => {
                let other = m.2[1 - index].as_deref().ok_or_else(|| bad("no operand"))?;
                Step::Binary(f, outer_index(other)?, index == 0)
            }
            _ => return Err(bad("a node that is not an epilogue")),
        });
        value =
            m.3.first()
                .cloned()
                .flatten()
                .ok_or_else(|| bad("no output"))?;
    }
    let mut site = CallSite::new(plan.attrs.clone());
    site.prepacked = prepacked;
    report_prepacked(claim, &site);
    Ok(Box::new(FusedNode {
        base: OrtNodeComputeInfo {
            ort_version_supported: EP_API_VERSION,
            CreateState: fused_create_state,
            Compute: fused_compute,
            ReleaseState: fused_release_state,
        },
        claim,
        plan,
        site,
        steps,
    }))
}

unsafe extern "system" fn release_compute_infos(
    _ep: *mut OrtEp,
    infos: *mut *mut OrtNodeComputeInfo,
    count: usize,
) {
    for i in 0..count {
        // SAFETY: onnxruntime hands back `count` compute infos made by `compile`
        // (`Box<FusedNode>`, `OrtNodeComputeInfo` first), each released once.
        unsafe {
            let p = *infos.add(i);
            if !p.is_null() {
                drop(Box::from_raw(p as *mut FusedNode));
            }
        }
    }
}

unsafe extern "system" fn fused_create_state(
    _info: *mut OrtNodeComputeInfo,
    _ctx: *mut OrtNodeComputeContext,
    state: *mut *mut c_void,
) -> Status {
    // (no per-state data: the compute info holds everything)
    // SAFETY: onnxruntime's out-parameter.
    unsafe { *state = ptr::null_mut() };
    ptr::null_mut()
}

unsafe extern "system" fn fused_release_state(_info: *mut OrtNodeComputeInfo, _state: *mut c_void) {
}

unsafe extern "system" fn fused_compute(
    info: *mut OrtNodeComputeInfo,
    _state: *mut c_void,
    ctx: *mut OrtKernelContext,
) -> Status {
    // SAFETY: made by `compile` and alive until `release_compute_infos`.
    let f = unsafe { &*(info as *const FusedNode) };
    let (api, op) = (f.claim.api, f.claim.op);
    guard(api, op, || {
        // SAFETY: `ctx` is the live context of this compute call; views do not outlive it.
        let (ins, _) = unsafe { ep_inputs(api, op, &f.plan, ctx) }?;
        let mut outs = OrtOutputs {
            api,
            ctx,
            // SAFETY: as above.
            n_out: unsafe { api.output_count(ctx) }?,
            scratch: Vec::new(),
        };
        let pool = OrtPool { api, ctx };
        let mut steps = Vec::with_capacity(f.steps.len());
        for s in &f.steps {
            steps.push(match *s {
                Step::Unary(g) => Epilogue::Unary(g),
                Step::Binary(g, i, out_first) => {
                    // SAFETY: `ctx` is live; the operand's data lives as long as the call.
                    Epilogue::Binary(g, unsafe { f32_input(api, ctx, i) }?, out_first)
                }
            });
        }
        call::run_with_epilogue(op, &ins, &f.site, &mut outs, &pool, Phase::Compute, &steps)
    })
    .0
}

/// The values of the plan's run-time int attributes, from the node's inputs.
///
/// # Safety
/// `ctx` is the kernel context of the running compute call.
unsafe fn runtime_ints(api: Api, plan: &OnnxPlan, ctx: *mut OrtKernelContext) -> Result<Vec<i64>> {
    // SAFETY: `ctx` is live (this function's contract).
    let n_in = unsafe { api.input_count(ctx) }?;
    plan.runtime_ints
        .iter()
        .map(|&(j, name)| {
            let missing = || Error::invalid(format!("no value for `{name}` (input {j})"));
            if j >= n_in {
                return Err(missing());
            }
            // SAFETY: j < the context's input count; the value is read during this call.
            let v = unsafe { api.input(ctx, j) }?;
            if v.is_null() {
                return Err(missing());
            }
            // SAFETY: as above.
            match unsafe { int_values(api, v) }.as_deref() {
                Some([x]) => Ok(*x),
                _ => Err(Error::invalid(format!(
                    "`{name}` (input {j}) must be a tensor of one integer"
                ))),
            }
        })
        .collect()
}

/// The op's inputs as views of the node's (2-D views when the plan flattens), and input 0's
/// full shape.
///
/// # Safety
/// `ctx` is the kernel context of the running compute call; the views live no longer.
unsafe fn ep_inputs<'a>(
    api: Api,
    op: &OpDef,
    plan: &OnnxPlan,
    ctx: *mut OrtKernelContext,
) -> Result<(Vec<Option<TensorRef<'a>>>, Vec<usize>)> {
    // SAFETY: `ctx` is live (this function's contract).
    let n_in = unsafe { api.input_count(ctx) }?;
    let mut out = Vec::with_capacity(plan.inputs.len());
    let mut full = Vec::new();
    for (i, j) in plan.inputs.iter().enumerate() {
        let v = match j {
            // SAFETY: j < the context's input count.
            Some(j) if *j < n_in => unsafe { api.input(ctx, *j) }?,
            _ => ptr::null(),
        };
        if v.is_null() {
            out.push(None);
            continue;
        }
        let shape = |shape: Vec<usize>| {
            if i == 0 {
                full = shape.clone();
            }
            match plan.flatten_axis {
                Some(a) if a < shape.len() => {
                    let dims: Vec<Dim> = shape.iter().map(|&d| Dim::Known(d)).collect();
                    flatten_2d_dims(&dims, a)
                        .iter()
                        .map(|d| d.known().ok_or_else(|| Error::invalid("tensor too large")))
                        .collect::<Result<Vec<usize>>>()
                }
                Some(a) => Err(Error::invalid(format!(
                    "axis {a} out of range for rank {}",
                    shape.len()
                ))),
                None => Ok(shape),
            }
        };
        // SAFETY: `v` is a live input value of this call; the 2-D view has the same element
        // count.
        out.push(Some(unsafe { input_view(api, op, i, v, shape) }?));
    }
    Ok((out, full))
}

#[cfg(all(test, feature = "stock"))]
mod tests {
    use super::*;

    #[test]
    fn the_stock_provider_is_named_and_claims_each_declared_version_once() {
        let reg = polyop_kernels::registry();
        assert_eq!(provider_name(reg), "PolyopExecutionProvider");
        let table = claim_table(reg);
        let mut keys: Vec<(&str, u32)> = table.iter().map(|(_, m, v)| (m.op_type, *v)).collect();
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n, "one kernel per (op type, version)");
        // every declared version of every op is in the table, served by the declaring op
        for op in reg.ops() {
            for m in &op.onnx {
                for v in m.versions {
                    assert!(table.iter().any(|(o, t, ver)| o.name == op.name
                        && t.op_type == m.op_type
                        && ver == v));
                }
            }
        }
        assert!(n >= 20, "{n} kernels");
    }

    #[test]
    fn an_author_registry_gets_its_own_provider_name() {
        let reg: &'static Registry = Box::leak(Box::new(Registry::named("my_ops")));
        assert_eq!(provider_name(reg), "MyOpsExecutionProvider");
        assert!(claim_table(reg).is_empty());
    }
}
