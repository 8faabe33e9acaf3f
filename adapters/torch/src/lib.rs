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

mod attrs;
mod call;
mod error;
mod pool;
mod register;
mod sys;
mod tensor;

pub use pool::TorchPool;

pub use register::{register_registry, Namespace, Registered};

/// Register `$registry` (an expression of type `&'static Registry`) under namespace `$ns` when
/// the shared library is loaded (`torch.ops.load_library`). A failure is kept and reported by
/// the Python glue as a load error (a load-time constructor cannot raise) and on stderr.
#[macro_export]
macro_rules! export_registry {
    ($ns:expr, $registry:expr) => {
        $crate::__polyop_export::on_load!(
            ::std::format!("registering torch ops in namespace `{}`", $ns),
            $crate::register_registry($ns, $registry, $crate::Namespace::Def).map(|_| ())
        );
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
