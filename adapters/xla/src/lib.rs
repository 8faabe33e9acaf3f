//! polyop adapter for XLA: every op of a kernel-core [`Registry`] as an XLA typed-FFI
//! custom-call target.
//!
//! - [`call::handle`] is the one generic handler (call frame -> views -> kernel), written
//!   against `xla/ffi/api/c_api.h` (bindings in [`sys`], generated once with bindgen from
//!   the pinned jaxlib and committed; see `scripts/bindgen.conf` (`crates/polyop-build/scripts/regen-bindings.sh`)).
//! - XLA needs one C symbol per target, while the adapter knows no op: [`export!`] takes a
//!   target prefix, a registry and a list of op names and emits, for each, an `extern "C"`
//!   function exported as `<prefix><name>` that delegates to the generic handler with the
//!   op's name. The `libpolyop_xla.so` built from this crate (feature `stock`) exports the
//!   stock ops with prefix `polyop_` through the same macro; a test checks that every registry
//!   op (except in-place ones) has its symbol.
//!
//! From Python: `jax.ffi.register_ffi_target("polyop_topk",
//! jax.ffi.pycapsule(ctypes.cdll.LoadLibrary(path).polyop_topk), platform="cpu")`.

mod attrs;
pub mod call;
mod error;
mod pool;
mod register;
/// The raw bindings (bindgen, committed). Public only for tests that build call frames.
#[doc(hidden)]
#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub mod sys;
mod tensor;

pub use call::{handle, handle_with, OpState};
pub use kernel_core::Registry;
pub use register::{API_MAJOR, API_MINOR, PINNED_JAXLIB};

/// Build an XLA / JAX library from a registry: in a `cdylib` crate,
///
/// ```ignore
/// polyop_xla::export!(prefix = "my_", registry = my_kernels::registry(); my_op, my_op_backward);
/// ```
///
/// exports one XLA typed-FFI handler per listed op, as symbol `<prefix><name>` (XLA needs one
/// C symbol per target and a macro cannot see a runtime registry, so the op names are listed;
/// `python -m polyop check` reports registry ops without a symbol), each delegating to the
/// generic [`call::handle`] on the registry (an expression of type `&'static Registry`).
/// Also exports the polyop library functions (`polyop_library_info`, `polyop_infer`,
/// `polyop_run`; see the `polyop-export` crate) for `polyop.jax.load(path)` and the checker,
/// plus `EXPORTED_OPS` (the names) and module `xla_handlers` for Rust tests. `$prefix` must be
/// a string literal. Depend on this crate with `default-features = false`.
///
/// From Python: `jax.ffi.register_ffi_target("my_my_op",
/// jax.ffi.pycapsule(ctypes.cdll.LoadLibrary(path).my_my_op), platform="cpu")`.
#[macro_export]
macro_rules! export {
    (prefix = $prefix:literal, registry = $registry:expr; $($name:ident),+ $(,)?) => {
        /// The op names that have an exported handler in this library.
        pub const EXPORTED_OPS: &[&str] = &[$(stringify!($name)),+];

        /// The exported handlers, one per op (symbol `<prefix><name>`).
        pub mod xla_handlers {
            $(
                #[doc = concat!("XLA FFI handler for `", stringify!($name), "` (symbol `", $prefix, stringify!($name), "`).")]
                ///
                /// # Safety
                /// Called by XLA with a valid call frame.
                #[export_name = concat!($prefix, stringify!($name))]
                pub unsafe extern "C" fn $name(
                    frame: *mut $crate::sys::XLA_FFI_CallFrame,
                ) -> *mut $crate::sys::XLA_FFI_Error {
                    static STATE: $crate::call::OpState = $crate::call::OpState::new();
                    let registry: &'static $crate::Registry = $registry;
                    // SAFETY: XLA calls a handler with null or a call frame it built for this
                    // call, valid until the handler returns: `handle_with`'s contract.
                    unsafe {
                        $crate::call::handle_with(registry, stringify!($name), &STATE, frame)
                    }
                }
            )+
        }

        $crate::__polyop_export::library_exports!(
            framework = "xla",
            name_key = "prefix",
            name = $prefix,
            registry = $registry,
            exported = ::std::vec![$(stringify!($name)),+],
        );
    };
}

/// The stock form of [`export!`]: handlers named `polyop_<name>`.
///
/// ```ignore
/// polyop_xla::export_xla_handlers!(my_ops::registry(); my_op, my_op_backward);
/// ```
#[macro_export]
macro_rules! export_xla_handlers {
    ($registry:expr; $($name:ident),+ $(,)?) => {
        $crate::export!(prefix = "polyop_", registry = $registry; $($name),+);
    };
}

#[doc(hidden)]
pub use polyop_export as __polyop_export;

// The stock kernel library (SPEC §3), built through the same macro an author uses, with the
// op names from the kernel library (in-place ops are torch-only; `nonzero` is exported so the
// raw target refuses cleanly).
#[cfg(feature = "stock")]
polyop_kernels::with_out_of_place_op_names!(export { prefix = "polyop_", registry = polyop_kernels::registry(); });
