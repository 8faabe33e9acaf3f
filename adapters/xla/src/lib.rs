//! polyop adapter for XLA: every op of a kernel-core [`Registry`] as an XLA typed-FFI
//! custom-call target.
//!
//! - [`handler::handle`] is the one generic handler (call frame -> views -> kernel), written
//!   against `xla/ffi/api/c_api.h` (bindings in [`ffi_sys`], generated once with bindgen from
//!   the pinned jaxlib and committed; see `scripts/regen-bindings.sh`).
//! - XLA needs one C symbol per target, while the adapter knows no op: [`export_xla_handlers!`]
//!   takes a list of op names and emits, for each, an `extern "C"` function exported as
//!   `polyop_<name>` that delegates to the generic handler with the op's name. The
//!   `libpolyop_xla.so` built from this crate exports the stock ops (`polyop_kernels`); a test
//!   checks that every registry op (except in-place ones) has its symbol.
//!
//! From Python: `jax.ffi.register_ffi_target("polyop_topk",
//! jax.ffi.pycapsule(ctypes.cdll.LoadLibrary(path).polyop_topk), platform="cpu")`.

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all
)]
pub mod ffi_sys;
pub mod handler;
pub mod pool;

pub use handler::{handle, API_MAJOR, API_MINOR, PINNED_JAXLIB};
pub use kernel_core::Registry;

/// Emit one exported FFI handler per op name: `polyop_<name>`, delegating to
/// [`handler::handle`] on `$registry` (an expression yielding `&'static Registry`).
/// Also emits `EXPORTED_OPS`, the list of names, for tests.
///
/// ```ignore
/// polyop_xla::export_xla_handlers!(my_ops::registry(); my_op, my_op_backward);
/// ```
#[macro_export]
macro_rules! export_xla_handlers {
    ($registry:expr; $($name:ident),+ $(,)?) => {
        /// The op names that have an exported `polyop_<name>` handler in this library.
        pub const EXPORTED_OPS: &[&str] = &[$(stringify!($name)),+];

        /// The exported handlers, one per op (symbol `polyop_<name>`).
        pub mod xla_handlers {
            $(
                #[doc = concat!("XLA FFI handler for `", stringify!($name), "` (symbol `polyop_", stringify!($name), "`).")]
                ///
                /// # Safety
                /// Called by XLA with a valid call frame.
                #[export_name = concat!("polyop_", stringify!($name))]
                pub unsafe extern "C" fn $name(
                    frame: *mut $crate::ffi_sys::XLA_FFI_CallFrame,
                ) -> *mut $crate::ffi_sys::XLA_FFI_Error {
                    let registry: &'static $crate::Registry = $registry;
                    unsafe { $crate::handler::handle(registry, stringify!($name), frame) }
                }
            )+
        }
    };
}

// The stock kernel library (SPEC §3), forward and backward ops. In-place ops (`relu_`) are
// torch-only and not listed; `nonzero` is exported so the raw target refuses cleanly.
export_xla_handlers!(polyop_kernels::registry();
    negate,
    add, add_backward,
    scale,
    relu, relu_backward,
    add_relu, add_relu_backward,
    gelu, gelu_backward,
    softmax, softmax_backward,
    rms_norm, rms_norm_backward,
    topk, topk_backward,
    conv2d, conv2d_backward,
    nonzero,
);
