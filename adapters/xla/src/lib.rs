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

/// The most ops one library can export to XLA (the size of [`export!`]'s handler table).
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

/// [`handle_with`] for the op at `index` of `registry` (the handler table's entry point).
///
/// # Safety
/// As for [`handle`].
#[doc(hidden)]
pub unsafe fn handle_index(
    registry: &'static Registry,
    index: usize,
    state: &OpState,
    frame: *mut sys::XLA_FFI_CallFrame,
) -> *mut sys::XLA_FFI_Error {
    let name = registry.ops().nth(index).map_or("", |o| o.name);
    // SAFETY: the caller's guarantees, passed on (an unknown index fails as an unknown op).
    unsafe { handle_with(registry, name, state, frame) }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __handler_table {
    ($h:ident) => {
        [
            $h::<0>, $h::<1>, $h::<2>, $h::<3>, $h::<4>, $h::<5>, $h::<6>, $h::<7>, $h::<8>,
            $h::<9>, $h::<10>, $h::<11>, $h::<12>, $h::<13>, $h::<14>, $h::<15>, $h::<16>,
            $h::<17>, $h::<18>, $h::<19>, $h::<20>, $h::<21>, $h::<22>, $h::<23>, $h::<24>,
            $h::<25>, $h::<26>, $h::<27>, $h::<28>, $h::<29>, $h::<30>, $h::<31>, $h::<32>,
            $h::<33>, $h::<34>, $h::<35>, $h::<36>, $h::<37>, $h::<38>, $h::<39>, $h::<40>,
            $h::<41>, $h::<42>, $h::<43>, $h::<44>, $h::<45>, $h::<46>, $h::<47>, $h::<48>,
            $h::<49>, $h::<50>, $h::<51>, $h::<52>, $h::<53>, $h::<54>, $h::<55>, $h::<56>,
            $h::<57>, $h::<58>, $h::<59>, $h::<60>, $h::<61>, $h::<62>, $h::<63>, $h::<64>,
            $h::<65>, $h::<66>, $h::<67>, $h::<68>, $h::<69>, $h::<70>, $h::<71>, $h::<72>,
            $h::<73>, $h::<74>, $h::<75>, $h::<76>, $h::<77>, $h::<78>, $h::<79>, $h::<80>,
            $h::<81>, $h::<82>, $h::<83>, $h::<84>, $h::<85>, $h::<86>, $h::<87>, $h::<88>,
            $h::<89>, $h::<90>, $h::<91>, $h::<92>, $h::<93>, $h::<94>, $h::<95>, $h::<96>,
            $h::<97>, $h::<98>, $h::<99>, $h::<100>, $h::<101>, $h::<102>, $h::<103>, $h::<104>,
            $h::<105>, $h::<106>, $h::<107>, $h::<108>, $h::<109>, $h::<110>, $h::<111>, $h::<112>,
            $h::<113>, $h::<114>, $h::<115>, $h::<116>, $h::<117>, $h::<118>, $h::<119>, $h::<120>,
            $h::<121>, $h::<122>, $h::<123>, $h::<124>, $h::<125>, $h::<126>, $h::<127>,
        ]
    };
}

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
                // call, valid until the handler returns: `handle_index`'s contract.
                unsafe { $crate::handle_index(registry, I, &STATES[I], frame) }
            }

            static TABLE: [$crate::Handler; $crate::MAX_OPS] = $crate::__handler_table!(slot);

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

/// The stock form of [`export!`]: targets named `polyop_<name>`.
///
/// ```ignore
/// polyop_xla::export_xla_handlers!(my_ops::registry());
/// ```
#[macro_export]
macro_rules! export_xla_handlers {
    ($registry:expr $(,)?) => {
        $crate::export!(prefix = "polyop_", registry = $registry);
    };
}

#[doc(hidden)]
pub use polyop_export as __polyop_export;

// The stock kernel library (SPEC §3), built through the same macro an author uses (in-place
// ops are torch-only; `nonzero` is exported so the raw target refuses cleanly).
#[cfg(feature = "stock")]
export!(prefix = "polyop_", registry = polyop_kernels::registry());
