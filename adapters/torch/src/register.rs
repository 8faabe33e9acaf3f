//! Registration: every op of a registry defined in a torch library namespace (schema from the
//! registry) with one boxed kernel for the CPU and Meta dispatch keys, through the C++
//! trampoline slots (`cxx/trampoline.cpp`).

use crate::call;
use crate::error::library_identity;
use crate::sys as ffi;
use kernel_core::ffi::{Added, SlotTable};
use kernel_core::{ArgType, AttrValue, Registry};
use std::ffi::CString;

/// The ops registered so far, with their per-op call state (leaked: registered ops live as
/// long as the process); a trampoline slot is an index into this table.
pub(crate) static SLOTS: SlotTable<call::OpState> = SlotTable::new();

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

/// The schema as torch declares it: the registry's, except that an `int[]` whose default is a
/// single int becomes torch's `int[1]` (torch's own spelling of "a list, or one int", as in
/// `sum(Tensor self, int[1]? dim)`): torch's `int[]` takes lists only, and a default must be a
/// list. Lengths are checked when the attributes are bound, as for every framework.
fn torch_schema(schema: &kernel_core::Schema) -> String {
    let mut s = schema.clone();
    for a in &mut s.args {
        if a.ty == ArgType::IntList(None) && matches!(a.default, Some(AttrValue::Int(_))) {
            a.ty = ArgType::IntList(Some(1));
        }
    }
    s.to_string()
}

fn ok(rc: i32, what: impl FnOnce() -> String) -> Result<(), String> {
    if rc == ffi::SUCCESS {
        Ok(())
    } else {
        Err(format!("{}: {}", what(), ffi::last_error()))
    }
}

/// Check that the trampolines of this library reach its own Rust entry point. The bridge's
/// entry symbol has the same name in every library built with this adapter; a library loaded
/// with `RTLD_GLOBAL` before this one would otherwise take this library's calls (the stock
/// library and polyop-built libraries link with `-Wl,-Bsymbolic`, which prevents that).
fn check_own_entry_point() -> Result<(), String> {
    let mut token = 0u64;
    // SAFETY: `probe` writes one u64 through the pointer, a writable local.
    unsafe { ffi::bridge::probe(&mut token) };
    if token == library_identity() {
        return Ok(());
    }
    Err(
        "this library's torch kernels resolve to another polyop library's entry point \
         (one loaded earlier with RTLD_GLOBAL); link the library with `-Wl,-Bsymbolic` \
         (docs/authoring.md)"
            .into(),
    )
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
    let mut def_lib = std::ptr::null_mut();
    let init = match kind {
        Namespace::Def => ffi::aoti_torch_library_init_def,
        Namespace::Fragment => ffi::aoti_torch_library_init_fragment,
    };
    ok(
        // SAFETY: plain C calls with NUL-terminated strings alive across them and an
        // out-parameter.
        unsafe { init(ns_c.as_ptr(), file.as_ptr(), line!(), &mut def_lib) },
        || format!("opening torch library namespace `{ns}` ({kind:?})"),
    )?;
    let mut impl_libs = Vec::new();
    for key in ["CPU", "Meta"] {
        let (key_c, mut lib) = (cstr(key)?, std::ptr::null_mut());
        ok(
            // SAFETY: as above.
            unsafe {
                ffi::aoti_torch_library_init_impl(
                    ns_c.as_ptr(),
                    key_c.as_ptr(),
                    file.as_ptr(),
                    line!(),
                    &mut lib,
                )
            },
            || format!("opening `{ns}` {key} impl library"),
        )?;
        impl_libs.push((lib, key));
    }
    check_own_entry_point()?;
    let num_slots = ffi::bridge::num_slots();
    let mut done = Vec::new();
    for op in registry.ops() {
        let schema = cstr(&torch_schema(&op.schema))?;
        let mut tags = Vec::new();
        if op.flags.data_dependent_shape {
            // SAFETY: constant getter.
            tags.push(unsafe { ffi::torch_tag_dynamic_output_shape() });
        }
        ok(
            // SAFETY: valid library handle and strings; `tags` holds `tags.len()` tags.
            unsafe {
                ffi::torch_library_def_with_tags(
                    def_lib,
                    schema.as_ptr(),
                    tags.as_ptr(),
                    tags.len() as i32,
                )
            },
            || format!("defining `{ns}::{}`", op.schema),
        )?;
        let state = Box::leak(Box::new(call::OpState::new(op)));
        let slot = match SLOTS.add(state, num_slots as usize) {
            Added::New(slot) | Added::Already(slot) => slot as u32,
            Added::Full => {
                return Err(format!(
                    "too many ops: the trampoline table has {num_slots} slots (raise kSlots in \
                     cxx/trampoline.cpp)"
                ))
            }
        };
        for &(lib, key) in &impl_libs {
            // SAFETY: `lib` is a live impl library handle opened above (the bridge's opaque
            // type is the same C++ `TorchLibraryOpaque`); `slot` is this op's.
            unsafe { ffi::bridge::impl_slot(lib.cast(), op.name, slot) }
                .map_err(|e| format!("registering the {key} kernel of `{ns}::{}`: {e}", op.name))?;
        }
        done.push(op.name);
    }
    Ok(Registered {
        namespace: ns.to_string(),
        ops: done,
    })
}
