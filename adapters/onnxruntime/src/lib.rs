//! polyop adapter for ONNX Runtime: a generic translator from a kernel-core [`Registry`] to
//! ONNX Runtime custom ops in the `ai.polyop` domain (version 1).
//!
//! `cargo build --release -p polyop-onnxruntime` yields `target/release/libpolyop_onnxruntime.so`,
//! which exports `RegisterCustomOps` for the stock registry (`polyop_kernels::registry()`):
//!
//! ```python
//! so = onnxruntime.SessionOptions()
//! so.register_custom_ops_library("target/release/libpolyop_onnxruntime.so")
//! ```
//!
//! No link-time dependency on onnxruntime: the C API table arrives with `RegisterCustomOps`
//! (`OrtApiBase::GetApi(API_VERSION)`). Types come from `ort-sys` with linking disabled.
//! An out-of-tree op crate can export its own entry point with [`register_custom_ops`].

mod attrs;
mod call;
mod error;
mod pool;
pub mod provider;
mod register;
mod shape;
mod sys;
mod tensor;

use kernel_core::{Error, Registry};
use ort_sys::{OrtApiBase, OrtErrorCode, OrtSessionOptions, OrtStatus};
use register::PolyOp;
use std::ffi::CString;
use std::sync::{Mutex, OnceLock};
use sys::{Api, API_VERSION};

/// The ONNX domain every polyop op is registered in.
pub const DOMAIN: &str = "ai.polyop";

/// The custom ops for one (registry, API table) pair, built once and kept for the life of the
/// process (ONNX Runtime keeps raw pointers to them in every session).
/// Leaked slices keyed by (registry address, API table address): see [`per_registry`].
pub(crate) type PerRegistry<T> = OnceLock<Mutex<Vec<((usize, usize), &'static [T])>>>;

/// What is built once per (registry, ONNX Runtime API table) and kept for the process: the
/// custom ops and the provider's claims hold raw pointers ONNX Runtime keeps, so they are
/// leaked, and looked up again by that key (a library serves one registry, so this stays tiny).
pub(crate) fn per_registry<T: Send + Sync + 'static>(
    cache: &'static PerRegistry<T>,
    registry: &'static Registry,
    api: Api,
    build: impl FnOnce() -> Vec<T>,
) -> &'static [T] {
    let key = (
        registry as *const Registry as usize,
        api.0 as *const ort_sys::OrtApi as usize,
    );
    let mut cache = cache
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, items)) = cache.iter().find(|(k, _)| *k == key) {
        return items;
    }
    let items: &'static [T] = Box::leak(build().into_boxed_slice());
    cache.push((key, items));
    items
}

fn custom_ops(registry: &'static Registry, api: Api) -> &'static [PolyOp] {
    static CACHE: PerRegistry<PolyOp> = OnceLock::new();
    per_registry(&CACHE, registry, api, || {
        registry
            .ops()
            .filter(|op| !op.flags.inplace)
            .flat_map(|op| register::variants(api, op))
            .collect()
    })
}

/// Register every op of `registry` on `options` in the `ai.polyop` domain. What a library's
/// `RegisterCustomOps` export calls.
///
/// # Safety
/// `options` and `api_base` must be the pointers ONNX Runtime passes to `RegisterCustomOps`.
pub unsafe fn register_custom_ops(
    registry: &'static Registry,
    options: *mut OrtSessionOptions,
    api_base: *const OrtApiBase,
) -> *mut OrtStatus {
    // SAFETY: the same contract as this function's, passed on unchanged.
    unsafe { register_custom_ops_in_domain(DOMAIN, registry, options, api_base) }
}

/// Every custom-op domain registered, kept for the process's life (see
/// [`register_custom_ops_in_domain`]).
static REGISTERED_DOMAINS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// [`register_custom_ops`] in an author's domain (version 1), e.g. `ai.example`.
///
/// # Safety
/// `options` and `api_base` must be the pointers ONNX Runtime passes to `RegisterCustomOps`.
pub unsafe fn register_custom_ops_in_domain(
    domain_name: &str,
    registry: &'static Registry,
    options: *mut OrtSessionOptions,
    api_base: *const OrtApiBase,
) -> *mut OrtStatus {
    if api_base.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: non-null, and by this function's contract the `OrtApiBase` onnxruntime passed to
    // `RegisterCustomOps`: a static struct inside the loaded library.
    let base = unsafe { &*api_base };
    // SAFETY: as above.
    let (runtime_version, _) = unsafe { sys::runtime(base) };
    // SAFETY: `GetApi` accepts any version and answers null for one it does not have.
    let api_ptr = unsafe { (base.GetApi)(API_VERSION) };
    if api_ptr.is_null() {
        // An onnxruntime older than the API we need: report it with the oldest table.
        // SAFETY: as above.
        let old = unsafe { (base.GetApi)(1) };
        if old.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: a non-null table from `GetApi` is static data of the loaded library; it is
        // never freed or written while the process has onnxruntime loaded.
        let api = Api(unsafe { &*old });
        return api.status_msg(
            OrtErrorCode::ORT_FAIL,
            &format!(
                "polyop: this library needs ONNX Runtime 1.{API_VERSION} (C API version \
                 {API_VERSION}) or newer; this is onnxruntime {runtime_version}"
            ),
        );
    }
    // SAFETY: as for `old` above; a version-`API_VERSION` table has every entry `Api` calls.
    let api = Api(unsafe { &*api_ptr });
    // SAFETY: `base` is the `OrtApiBase` onnxruntime passed to `RegisterCustomOps` (above).
    unsafe { sys::init_shape_ref(base) };
    let r = std::panic::catch_unwind(|| -> kernel_core::Result<()> {
        let ops = custom_ops(registry, api);
        let domain_name = CString::new(domain_name)
            .map_err(|_| Error::invalid("the ONNX domain name contains a NUL byte"))?;
        let mut domain = std::ptr::null_mut();
        // SAFETY: `domain_name` is a NUL-terminated string alive across the call (onnxruntime
        // copies it); `domain` is the out-pointer `CreateCustomOpDomain` fills and is only used
        // after it succeeded (`check` returns early otherwise); every `op.as_ort()` points into
        // a leaked, never-freed `PolyOp` (`custom_ops`), so it outlives all sessions as
        // onnxruntime requires; `options` is live by this function's contract.
        unsafe {
            api.check((api.0.CreateCustomOpDomain)(
                domain_name.as_ptr(),
                &mut domain,
            ))?;
            for op in ops {
                api.check((api.0.CustomOpDomain_Add)(domain, op.as_ort()))?;
            }
            // The domain must outlive every session created from `options`; ONNX Runtime does
            // not take ownership, so it is deliberately never released (one small object per
            // registration). Its address is kept for the process's life, so that it stays
            // reachable once the options that listed it are gone (a leak checker counted it
            // lost or not depending on what the heap happened to hold).
            api.check((api.0.AddCustomOpDomain)(options, domain))?;
            REGISTERED_DOMAINS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(domain as usize);
        }
        Ok(())
    });
    match r {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => api.status(&Error {
            message: format!("registering the {domain_name} domain failed: {}", e.message),
            ..e
        }),
        Err(p) => api.status(&Error::from_panic("RegisterCustomOps", p)),
    }
}

/// Build an ONNX Runtime custom-op library from a registry: in a `cdylib` crate,
///
/// ```ignore
/// polyop_onnxruntime::export!(domain = "ai.example", registry = my_kernels::registry());
/// ```
///
/// exports `RegisterCustomOps` (what `SessionOptions.register_custom_ops_library(path)` looks
/// up), registering every op of the registry (an expression of type `&'static Registry`;
/// in-place ops skipped) in `domain`, version 1, as op type `onnx_name` (`CamelName`), plus the
/// polyop library functions (`polyop_library_info`, `polyop_infer`, `polyop_run`; see the
/// `polyop-export` crate). Depend on this crate with `default-features = false`.
#[macro_export]
macro_rules! export {
    (domain = $domain:expr, registry = $registry:expr $(,)?) => {
        /// The entry point `SessionOptions.register_custom_ops_library` looks up.
        ///
        /// # Safety
        /// Called by ONNX Runtime with its session options and API base.
        #[no_mangle]
        pub unsafe extern "C" fn RegisterCustomOps(
            options: *mut $crate::__OrtSessionOptions,
            api_base: *const $crate::__OrtApiBase,
        ) -> *mut $crate::__OrtStatus {
            // SAFETY: onnxruntime calls `RegisterCustomOps` with its own session options and
            // API base, which is the contract of `register_custom_ops_in_domain`.
            unsafe { $crate::register_custom_ops_in_domain($domain, $registry, options, api_base) }
        }
        /// The plugin execution provider's entry point
        /// (`onnxruntime.register_execution_provider_library`): one factory for the standard
        /// ONNX ops the registry's ops implement.
        ///
        /// # Safety
        /// Called by ONNX Runtime with its API base and output array.
        #[no_mangle]
        pub unsafe extern "C" fn CreateEpFactories(
            _registered_name: *const ::std::ffi::c_char,
            api_base: *const $crate::__OrtApiBase,
            _default_logger: *const ::std::ffi::c_void,
            factories: *mut *mut ::std::ffi::c_void,
            max_factories: usize,
            num_factories: *mut usize,
        ) -> *mut $crate::__OrtStatus {
            // SAFETY: onnxruntime's arguments, passed on unchanged.
            unsafe {
                $crate::provider::create_ep_factories(
                    $registry,
                    api_base,
                    factories,
                    max_factories,
                    num_factories,
                )
            }
        }
        /// Releases a factory `CreateEpFactories` made.
        ///
        /// # Safety
        /// Called by ONNX Runtime with a factory from `CreateEpFactories`, once.
        #[no_mangle]
        pub unsafe extern "C" fn ReleaseEpFactory(
            factory: *mut ::std::ffi::c_void,
        ) -> *mut $crate::__OrtStatus {
            // SAFETY: as documented above.
            unsafe { $crate::provider::release_ep_factory(factory) }
        }
        $crate::__polyop_export::library_exports!(
            framework = "onnxruntime",
            name_key = "domain",
            name = $domain,
            registry = $registry,
            exported = $crate::__polyop_export::out_of_place_ops($registry),
        );
    };
}

#[doc(hidden)]
pub use ort_sys::{
    OrtApiBase as __OrtApiBase, OrtSessionOptions as __OrtSessionOptions, OrtStatus as __OrtStatus,
};
#[doc(hidden)]
pub use polyop_export as __polyop_export;

// The stock library, libpolyop_onnxruntime.so (domain `ai.polyop`): built through the same
// macro an author uses.
#[cfg(feature = "stock")]
export!(domain = DOMAIN, registry = polyop_kernels::registry());
