//! polyop adapter for TensorFlow: a generic translator from a kernel-core [`Registry`] to TF
//! custom ops through TF's **C API** (`tensorflow/c/ops.h`, `tensorflow/c/kernels.h`).
//!
//! `libpolyop_tensorflow.so` registers every op of `polyop_kernels::registry()` (except in-place
//! ones) from a load-time constructor, as op type `Polyop<CamelName>` with a CPU kernel and a
//! shape function, so `tf.load_op_library(path)` is all a user needs. Another crate can build
//! its own TF library from its own registry with [`export!`] (which calls
//! [`register_with_prefix`] from its constructor), with this crate's `stock` feature off.

mod attrs;
mod call;
mod error;
mod pool;
mod register;
mod shape;
mod sys;
mod tensor;

pub use register::register_with_prefix;

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
        $crate::__polyop_export::on_load!(
            ::std::format!("registering TensorFlow ops with prefix `{}`", $prefix),
            {
                // Per-op failures are recorded by register_with_prefix itself.
                $crate::register_with_prefix($prefix, $registry);
                Ok(())
            }
        );
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
