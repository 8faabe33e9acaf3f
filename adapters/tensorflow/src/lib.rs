//! polyop adapter for TensorFlow: a generic translator from a kernel-core [`Registry`] to TF
//! custom ops through TF's **C API** (`tensorflow/c/ops.h`, `tensorflow/c/kernels.h`).
//!
//! `libpolyop_tensorflow.so` registers every op of `polyop_kernels::registry()` (except in-place
//! ones) from a load-time constructor, as op type `Polyop<CamelName>` with a CPU kernel and a
//! shape function, so `tf.load_op_library(path)` is all a user needs. Another crate can build
//! its own TF library from its own registry by calling [`register`] from its constructor
//! (with this crate's `stock` feature off).

use kernel_core::{catch_panic, OpDef, Registry};
use std::ffi::CString;
use std::os::raw::c_void;
use std::sync::RwLock;

pub mod ffi;
pub mod kernel;
pub mod opdef;
pub mod shape;

use ffi::*;

include!(concat!(env!("OUT_DIR"), "/trampolines.rs"));

/// Ops registered so far; a slot index is a position in this list.
static OPS: RwLock<Vec<&'static OpDef>> = RwLock::new(Vec::new());

fn op_at(slot: usize) -> Option<&'static OpDef> {
    OPS.read()
        .unwrap_or_else(|e| e.into_inner())
        .get(slot)
        .copied()
}

unsafe extern "C" fn shape_tramp<const I: usize>(
    ctx: *mut TF_ShapeInferenceContext,
    status: *mut TF_Status,
) {
    let Some(op) = op_at(I) else {
        unsafe {
            set_status(
                status,
                TF_INTERNAL,
                "polyop: shape function slot without an op",
            )
        };
        return;
    };
    let r = catch_panic(op.name, || unsafe { shape::shape_fn(op, ctx, status) });
    if let Err(e) = r {
        unsafe { set_status(status, kernel::status_code(e.kind), &e.to_string()) };
    }
}

unsafe extern "C" fn create_tramp<const I: usize>(
    ctx: *mut TF_OpKernelConstruction,
) -> *mut c_void {
    unsafe { kernel::create(I, ctx) }
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in op specs")
}

/// Register one op with TF: op definition + shape function + CPU kernel.
unsafe fn register_op(prefix: &str, op: &'static OpDef, slot: usize) -> Result<(), String> {
    let spec = opdef::tf_op_spec_with_prefix(prefix, op).map_err(|e| e.to_string())?;
    let name = cstr(&spec.op_type);
    let b = unsafe { TF_NewOpDefinitionBuilder(name.as_ptr()) };
    for a in &spec.attrs {
        unsafe { TF_OpDefinitionBuilderAddAttr(b, cstr(a).as_ptr()) };
    }
    for i in &spec.inputs {
        unsafe { TF_OpDefinitionBuilderAddInput(b, cstr(i).as_ptr()) };
    }
    for o in &spec.outputs {
        unsafe { TF_OpDefinitionBuilderAddOutput(b, cstr(o).as_ptr()) };
    }
    unsafe { TF_OpDefinitionBuilderSetShapeInferenceFunction(b, SHAPE_FNS[slot]) };
    let st = Status::new();
    // Takes ownership of (and deletes) the builder.
    unsafe { TF_RegisterOpDefinition(b, st.0) };
    if !st.ok() {
        return Err(format!("op definition {:?}: {}", spec, st.message()));
    }
    let cpu = cstr("CPU");
    let kb = unsafe {
        TF_NewKernelBuilder(
            name.as_ptr(),
            cpu.as_ptr(),
            CREATE_FNS[slot],
            kernel::compute_tramp,
            kernel::delete_tramp,
        )
    };
    let kname = cstr(&format!("{}Cpu", spec.op_type));
    let st = Status::new();
    // Takes ownership of the kernel builder.
    unsafe { TF_RegisterKernelBuilder(kname.as_ptr(), kb, st.0) };
    if !st.ok() {
        return Err(format!("kernel for {}: {}", spec.op_type, st.message()));
    }
    Ok(())
}

/// Register every op of `registry` with TensorFlow, skipping in-place ops (TF has no in-place
/// semantics; the out-of-place op is there). Errors are reported per op and do not stop the
/// others. Returns the op types registered.
pub fn register(registry: &'static Registry) -> Vec<String> {
    register_with_prefix(opdef::STOCK_PREFIX, registry)
}

/// [`register`] with op types `<prefix><CamelName>` (the stock library uses `Polyop`). TF's
/// generated Python wrappers are the op types in snake case (`MyAddOne` -> `my_add_one`).
pub fn register_with_prefix(prefix: &str, registry: &'static Registry) -> Vec<String> {
    let mut done = Vec::new();
    for op in registry.ops().filter(|o| !o.flags.inplace) {
        let slot = {
            let mut ops = OPS.write().unwrap_or_else(|e| e.into_inner());
            if ops.iter().any(|o| std::ptr::eq(*o, op)) {
                continue;
            }
            if ops.len() >= SLOTS {
                eprintln!(
                    "polyop-tensorflow: more than {SLOTS} ops; `{}` not registered",
                    op.name
                );
                continue;
            }
            ops.push(op);
            ops.len() - 1
        };
        // SAFETY: called with TF loaded (this library links libtensorflow_framework).
        match unsafe { register_op(prefix, op, slot) } {
            Ok(()) => done.push(opdef::tf_op_type_with_prefix(prefix, op)),
            Err(e) => eprintln!("polyop-tensorflow: failed to register `{}`: {e}", op.name),
        }
    }
    done
}

/// Build a TensorFlow library from a registry: in a `cdylib` crate,
///
/// ```ignore
/// polyop_tensorflow::export!(prefix = "My", registry = my_kernels::registry());
/// ```
///
/// registers every op of the registry (an expression of type `&'static Registry`; in-place
/// ops skipped) as op type `<prefix><CamelName>` from a load-time constructor, so
/// `tf.load_op_library(path)` is all TF needs, and exports the polyop library functions
/// (`polyop_library_info`, `polyop_infer`, `polyop_run`; see the `polyop-export` crate) that
/// `polyop.tensorflow.load(path)` and `python -m polyop check` read. Depend on this crate with
/// `default-features = false`.
#[macro_export]
macro_rules! export {
    (prefix = $prefix:expr, registry = $registry:expr $(,)?) => {
        const _: () = {
            extern "C" fn __polyop_tensorflow_init() {
                // Never unwind out of a library constructor.
                let _ =
                    ::std::panic::catch_unwind(|| $crate::register_with_prefix($prefix, $registry));
            }
            #[used]
            #[link_section = ".init_array"]
            static __POLYOP_TENSORFLOW_INIT: extern "C" fn() = __polyop_tensorflow_init;
        };
        $crate::__polyop_export::library_exports!(
            framework = "tensorflow",
            name_key = "prefix",
            name = $prefix,
            registry = $registry,
            exported = $crate::__polyop_export::out_of_place_ops($registry),
        );
    };
}

#[doc(hidden)]
pub use polyop_export as __polyop_export;

// The stock library, libpolyop_tensorflow.so: built through the same macro an author uses.
#[cfg(all(feature = "stock", not(test)))]
export!(prefix = "Polyop", registry = polyop_kernels::registry());
