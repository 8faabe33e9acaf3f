//! Registration: every op of a registry defined in a torch library namespace (schema from the
//! registry) with one boxed kernel for the CPU and Meta dispatch keys, through the C++
//! trampoline slots (`cxx/trampoline.cpp`).

use crate::call;
use crate::error::{polyop_torch_boxed_call, polyop_torch_free_error};
use crate::sys as ffi;
use kernel_core::Registry;
use std::ffi::CString;
use std::sync::RwLock;

/// The ops registered so far, with their per-op call state (leaked: registered ops live as
/// long as the process); a trampoline slot is an index into this table.
pub(crate) static SLOTS: RwLock<Vec<&'static call::OpState>> = RwLock::new(Vec::new());

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
            ok(
                // SAFETY: `lib` is a live library handle created above, `name` a NUL-terminated
                // string alive across the call, `f` the trampoline of this op's slot.
                unsafe { ffi::torch_library_impl(lib, name.as_ptr(), Some(f), version) },
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
