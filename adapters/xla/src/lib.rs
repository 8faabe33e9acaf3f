//! polyop adapter for XLA: every op of a kernel-core [`Registry`] as an XLA typed-FFI
//! custom-call target.
//!
//! - [`call::handle`] is the one generic handler (call frame -> views -> kernel), written
//!   against `xla/ffi/api/c_api.h` (bindings in [`sys`], generated once with bindgen from
//!   the pinned jaxlib and committed; see `scripts/bindgen.conf` (`crates/polyop-build/scripts/regen-bindings.sh`)).
//! - XLA calls a handler with no word of which target it serves, while the adapter knows no
//!   op: [`export!`] takes a target prefix and a registry and instantiates a table of
//!   handlers, one per registry position, each delegating to the generic handler with its
//!   position, behind one lookup symbol `<prefix>xla_handler(name)`. The `libpolyop_xla.so`
//!   built from this crate (feature `stock`) exports the stock ops with prefix `polyop_`
//!   through the same macro; a test checks that every registry op (except in-place ones) has
//!   its handler.
//!
//! From Python: `polyop.jax.load()` registers every target (by hand: see [`export!`]).

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

pub use call::OpState;
pub use kernel_core::Registry;
pub use register::{API_MAJOR, API_MINOR, PINNED_JAXLIB};

/// The most ops one library can export to XLA (the size of [`export!`]'s handler table; the
/// table's type checks that its `seq!` range has this length).
pub const MAX_OPS: usize = 128;

/// An XLA typed-FFI handler, as XLA calls it.
pub type Handler = unsafe extern "C" fn(*mut sys::XLA_FFI_CallFrame) -> *mut sys::XLA_FFI_Error;

/// Whether the op at position `index` of its registry has an XLA handler: in-place ops are
/// torch-only, and the handler table has [`MAX_OPS`] slots.
fn is_exported(index: usize, op: &kernel_core::OpDef) -> bool {
    index < MAX_OPS && !op.flags.inplace
}

/// The position of op `name` in `registry` if it is exported to XLA (see [`is_exported`]).
pub fn exported_index(registry: &Registry, name: &str) -> Option<usize> {
    registry
        .ops()
        .enumerate()
        .find(|(_, o)| o.name == name)
        .filter(|&(i, o)| is_exported(i, o))
        .map(|(i, _)| i)
}

/// The names of the ops of `registry` that [`export!`] exports to XLA, in registry order.
pub fn exported_names(registry: &Registry) -> Vec<&'static str> {
    registry
        .ops()
        .enumerate()
        .filter(|&(i, o)| is_exported(i, o))
        .map(|(_, o)| o.name)
        .collect()
}

#[doc(hidden)]
pub use seq_macro::seq as __seq;

/// Build an XLA / JAX library from a registry: in a `cdylib` crate,
///
/// ```ignore
/// polyop_xla::export!(prefix = "my_", registry = my_kernels::registry());
/// ```
///
/// exports an XLA typed-FFI handler for every op of the registry (in-place ops apart, which
/// are torch-only), each delegating to the generic [`call::handle`] with its op. XLA calls a
/// handler with no word of which target it serves, so each op needs its own function: the
/// macro instantiates a table of [`MAX_OPS`] handlers, one per registry position, and the
/// library exports one lookup, `<prefix>xla_handler(name) -> handler` (null for an op it
/// does not export), so no op name is ever listed by hand. Also exports the polyop library
/// functions (`polyop_library_info`, `polyop_infer`, `polyop_run`; see the `polyop-export`
/// crate) for `polyop.jax.load(path)` and the checker, and module `xla_handlers` (its
/// `handler(name)`) for Rust tests. `$prefix` (a string literal) begins every target name:
/// op `my_op` is target `<prefix>my_op`. Depend on this crate with `default-features = false`.
///
/// From Python, `polyop.jax.load(path)` registers every target; by hand:
/// `lookup = ctypes.cdll.LoadLibrary(path).my_xla_handler; lookup.restype = ctypes.c_void_p;
/// jax.ffi.register_ffi_target("my_my_op", jax.ffi.pycapsule(lookup(b"my_op")), platform="cpu")`.
#[macro_export]
macro_rules! export {
    (prefix = $prefix:literal, registry = $registry:expr $(,)?) => {
        /// This library's XLA FFI handlers: one per registry op, found by name.
        pub mod xla_handlers {
            static STATES: [$crate::OpState; $crate::MAX_OPS] =
                [const { $crate::OpState::new() }; $crate::MAX_OPS];

            /// # Safety
            /// Called by XLA with null or a valid call frame.
            unsafe extern "C" fn slot<const I: usize>(
                frame: *mut $crate::sys::XLA_FFI_CallFrame,
            ) -> *mut $crate::sys::XLA_FFI_Error {
                let registry: &'static $crate::Registry = $registry;
                // SAFETY: XLA calls a handler with null or a call frame it built for this
                // call, valid until the handler returns: `call::handle`'s contract.
                unsafe { $crate::call::handle(registry, I, &STATES[I], frame) }
            }

            static TABLE: [$crate::Handler; $crate::MAX_OPS] =
        $crate::__seq!(I in 0..128 { [#(slot::<I>,)*] });

            /// The handler of op `name`, or `None` if this library does not export it to XLA.
            pub fn handler(name: &str) -> Option<$crate::Handler> {
                $crate::exported_index($registry, name).map(|i| TABLE[i])
            }

            /// `<prefix>xla_handler`: the handler of the op named by the NUL-terminated
            /// `name`, or null.
            ///
            /// # Safety
            /// `name` is null or a valid NUL-terminated string.
            #[export_name = concat!($prefix, "xla_handler")]
            pub unsafe extern "C" fn lookup(
                name: *const ::std::ffi::c_char,
            ) -> Option<$crate::Handler> {
                if name.is_null() {
                    return None;
                }
                // SAFETY: a non-null NUL-terminated string (this function's contract).
                let name = unsafe { ::std::ffi::CStr::from_ptr(name) };
                name.to_str().ok().and_then(handler)
            }
        }

        $crate::__polyop_export::library_exports!(
            framework = "xla",
            name_key = "prefix",
            name = $prefix,
            registry = $registry,
            exported = $crate::exported_names($registry),
        );
    };
}

#[doc(hidden)]
pub use polyop_export as __polyop_export;

// The stock kernel library (SPEC §3), built through the same macro an author uses (in-place
// ops are torch-only; `nonzero` is exported so the raw target refuses cleanly).
#[cfg(feature = "stock")]
export!(prefix = "polyop_", registry = polyop_kernels::registry());
