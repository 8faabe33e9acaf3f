//! polyop's PyTorch adapter: a generic translator from a kernel-core [`Registry`] to PyTorch
//! dispatcher registrations, on the libtorch **stable ABI** (the C shim behind
//! `STABLE_TORCH_LIBRARY`: `aoti_torch_library_init_*`, `aoti_torch_library_def`,
//! `torch_library_impl`, `aoti_torch_*` tensor functions, `torch_parallel_for`).
//!
//! For every op of the registry it:
//! - defines the op with exactly `op.schema.to_string()` in the namespace (ops with a
//!   data-dependent output shape are tagged `dynamic_output_shape`);
//! - registers one generic boxed kernel (through a C++ trampoline slot, see
//!   `cxx/trampoline.cpp`) for the `CPU` and `Meta` dispatch keys. On CPU it validates with
//!   `op.infer_concrete`, allocates outputs with `aoti_torch_empty_strided` and runs the
//!   kernel on torch's intra-op pool ([`TorchPool`]); on Meta it only allocates outputs of the
//!   inferred shapes, which is what FakeTensor, `torch.compile` and `torch.library.opcheck`
//!   need.
//!
//! Nothing here knows a particular op. The `cdylib` (`libpolyop_torch.so`) registers
//! `polyop_kernels::registry()` under namespace `polyop` from a load-time constructor (feature
//! `stock`, on by default); another crate can build its own library for its own registry with
//! [`export_registry!`].

mod call;
pub mod ffi;
mod pool;

pub use pool::TorchPool;

use kernel_core::{catch_panic, Error, Registry};
use std::ffi::{c_char, CString};
use std::sync::RwLock;

/// The ops registered so far, with their per-op call state (leaked: registered ops live as
/// long as the process); a trampoline slot is an index into this table.
static SLOTS: RwLock<Vec<&'static call::OpState>> = RwLock::new(Vec::new());

/// How the namespace is opened: `Def` claims it (`STABLE_TORCH_LIBRARY`), `Fragment` adds to
/// a namespace that may be defined elsewhere (`STABLE_TORCH_LIBRARY_FRAGMENT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    Def,
    Fragment,
}

/// What [`register_registry`] did.
#[derive(Debug, Clone)]
pub struct Registered {
    pub namespace: String,
    pub ops: Vec<&'static str>,
}

fn cstr(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("`{s}` contains a NUL byte"))
}

fn ok(rc: i32, what: impl FnOnce() -> String) -> Result<(), String> {
    if rc == ffi::SUCCESS {
        Ok(())
    } else {
        Err(format!("{}: {}", what(), ffi::last_error()))
    }
}

/// Register every op of `registry` as `<ns>::<op.name>` with CPU and Meta kernels.
///
/// Torch keeps the library objects alive for the life of the process (they are leaked on
/// purpose: dropping them would unregister the ops).
pub fn register_registry(
    ns: &str,
    registry: &'static Registry,
    kind: Namespace,
) -> Result<Registered, String> {
    let ns_c = cstr(ns)?;
    let file = cstr(file!())?;
    let (mut def_lib, mut cpu_lib, mut meta_lib) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let cpu = cstr("CPU")?;
    let meta = cstr("Meta")?;
    // SAFETY: plain C calls with valid NUL-terminated strings and out-parameters.
    unsafe {
        match kind {
            Namespace::Def => ok(
                ffi::aoti_torch_library_init_def(
                    ns_c.as_ptr(),
                    file.as_ptr(),
                    line!(),
                    &mut def_lib,
                ),
                || format!("defining torch library namespace `{ns}`"),
            )?,
            Namespace::Fragment => ok(
                ffi::aoti_torch_library_init_fragment(
                    ns_c.as_ptr(),
                    file.as_ptr(),
                    line!(),
                    &mut def_lib,
                ),
                || format!("opening torch library fragment `{ns}`"),
            )?,
        }
        ok(
            ffi::aoti_torch_library_init_impl(
                ns_c.as_ptr(),
                cpu.as_ptr(),
                file.as_ptr(),
                line!(),
                &mut cpu_lib,
            ),
            || format!("opening `{ns}` CPU impl library"),
        )?;
        ok(
            ffi::aoti_torch_library_init_impl(
                ns_c.as_ptr(),
                meta.as_ptr(),
                file.as_ptr(),
                line!(),
                &mut meta_lib,
            ),
            || format!("opening `{ns}` Meta impl library"),
        )?;
    }
    // SAFETY: stores two function pointers in this library's C++ layer.
    unsafe { ffi::polyop_torch_set_entry(polyop_torch_boxed_call, polyop_torch_free_error) };
    // SAFETY: constant getters.
    let (num_slots, version) = unsafe {
        (
            ffi::polyop_torch_num_slots(),
            ffi::polyop_torch_build_version(),
        )
    };
    let mut done = Vec::new();
    for op in registry.ops() {
        let schema = cstr(&op.schema.to_string())?;
        let name = cstr(op.name)?;
        let mut tags = Vec::new();
        if op.flags.data_dependent_shape {
            // SAFETY: constant getter.
            tags.push(unsafe { ffi::torch_tag_dynamic_output_shape() });
        }
        // SAFETY: valid library handle and strings.
        unsafe {
            ok(
                if tags.is_empty() {
                    ffi::aoti_torch_library_def(def_lib, schema.as_ptr())
                } else {
                    ffi::torch_library_def_with_tags(
                        def_lib,
                        schema.as_ptr(),
                        tags.as_ptr(),
                        tags.len() as i32,
                    )
                },
                || format!("defining `{ns}::{}`", op.schema),
            )?;
        }
        let slot = {
            let mut slots = SLOTS.write().unwrap_or_else(|e| e.into_inner());
            if slots.len() as u32 >= num_slots {
                return Err(format!(
                    "too many ops: the trampoline table has {num_slots} slots (raise kSlots in \
                     cxx/trampoline.cpp)"
                ));
            }
            slots.push(Box::leak(Box::new(call::OpState::new(op))));
            (slots.len() - 1) as u32
        };
        // SAFETY: slot < num_slots.
        let f = unsafe { ffi::polyop_torch_slot(slot) }
            .ok_or_else(|| format!("no trampoline for slot {slot}"))?;
        for (lib, key) in [(cpu_lib, "CPU"), (meta_lib, "Meta")] {
            // SAFETY: valid library handle, name and boxed function.
            ok(
                unsafe { ffi::torch_library_impl(lib, name.as_ptr(), f, version) },
                || format!("registering the {key} kernel of `{ns}::{}`", op.name),
            )?;
        }
        done.push(op.name);
    }
    Ok(Registered {
        namespace: ns.to_string(),
        ops: done,
    })
}

/// The boxed entry point every trampoline calls (through a function pointer handed to the C++
/// layer, not an exported symbol, so several polyop libraries can live in one process). Never unwinds: returns null on success or an
/// error message (released by [`polyop_torch_free_error`]) that the C++ side throws as
/// `std::runtime_error`, which torch surfaces as Python's `RuntimeError`.
///
/// # Safety
/// Called by torch's boxed-kernel machinery with a stack of `max(num_args, num_outputs)`
/// StableIValues.
pub unsafe extern "C" fn polyop_torch_boxed_call(
    slot: u32,
    stack: *mut ffi::StableIValue,
    num_args: u64,
    num_outputs: u64,
) -> *mut c_char {
    let op = {
        let slots = SLOTS.read().unwrap_or_else(|e| e.into_inner());
        slots.get(slot as usize).copied()
    };
    let result = match op {
        Some(st) => catch_panic(st.op.name, || call::call(st, stack, num_args, num_outputs)),
        None => Err(Error::internal(format!("no op registered in slot {slot}"))),
    };
    match result {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => {
            let msg = e.to_string().replace('\0', " ");
            CString::new(msg).unwrap_or_default().into_raw()
        }
    }
}

/// Release an error message returned by [`polyop_torch_boxed_call`].
///
/// # Safety
/// `msg` must come from `polyop_torch_boxed_call` and be released once.
pub unsafe extern "C" fn polyop_torch_free_error(msg: *mut c_char) {
    if !msg.is_null() {
        // SAFETY: allocated by CString::into_raw above.
        drop(unsafe { CString::from_raw(msg) });
    }
}

/// Register `$registry` (an expression of type `&'static Registry`) under namespace `$ns` when
/// the shared library is loaded (`torch.ops.load_library`). Failures are reported on stderr
/// (a load-time constructor cannot raise), and the ops are then missing.
#[macro_export]
macro_rules! export_registry {
    ($ns:expr, $registry:expr) => {
        const _: () = {
            extern "C" fn __polyop_torch_init() {
                let r = ::std::panic::catch_unwind(|| {
                    $crate::register_registry($ns, $registry, $crate::Namespace::Def)
                });
                match r {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => ::std::eprintln!("polyop: registering torch ops failed: {e}"),
                    Err(_) => ::std::eprintln!("polyop: registering torch ops panicked"),
                }
            }
            #[used]
            #[link_section = ".init_array"]
            static __POLYOP_TORCH_INIT: extern "C" fn() = __polyop_torch_init;
        };
    };
}

/// Build a PyTorch library from a registry: in a `cdylib` crate,
///
/// ```ignore
/// polyop_torch::export!(namespace = "my_ops", registry = my_kernels::registry());
/// ```
///
/// registers every op of the registry (an expression of type `&'static Registry`) as
/// `torch.ops.<namespace>.<name>` when the library is loaded with `torch.ops.load_library`,
/// and exports the polyop library functions (`polyop_library_info`, `polyop_infer`,
/// `polyop_run`, `polyop_free_string`; see the `polyop-export` crate) that the Python glue
/// (`polyop.torch.load(path)`) and `python -m polyop check` read. Depend on this crate with
/// `default-features = false` (the `stock` feature registers the stock ops too).
#[macro_export]
macro_rules! export {
    (namespace = $ns:expr, registry = $registry:expr $(,)?) => {
        $crate::export_registry!($ns, $registry);
        $crate::__polyop_export::library_exports!(
            framework = "torch",
            name_key = "namespace",
            name = $ns,
            registry = $registry,
            exported = $crate::__polyop_export::all_ops($registry),
        );
    };
}

#[doc(hidden)]
pub use polyop_export as __polyop_export;

// The stock library, libpolyop_torch.so: built through the same macro an author uses.
#[cfg(all(feature = "stock", not(test)))]
export!(namespace = "polyop", registry = polyop_kernels::registry());
