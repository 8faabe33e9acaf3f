//! polyop kernel-core: everything an op needs that is not a framework.
//!
//! - [`DType`], [`Element`], [`FloatElem`]: element types.
//! - [`TensorRef`], [`TensorMut`], [`OwnedTensor`]: strided views and helpers.
//! - [`Schema`]: PyTorch-style schema strings; [`Attrs`]: bound attribute values.
//! - [`OpDef`], [`Registry`]: ops as data; [`TensorSpec`], [`Dim`]: shapes with unknown and
//!   symbolic dims ([`dim`], the shape model).
//! - [`ThreadPool`], [`parallel_for`]: the host's threads, fixed partitioning.
//! - [`KernelFpEnv`]: the fixed floating-point environment kernels compute in (no FTZ / DAZ).
//! - [`ShardingRule`]: which dims of an op's tensors may stay split across devices.
//! - [`Error`]: errors as values; [`catch_panic`] for FFI boundaries; [`ffi`]: what adapters
//!   do the same way at a C boundary.

pub mod attrs;
pub mod call;
pub mod dim;
pub mod dtype;
pub mod error;
pub mod exec;
pub mod ffi;
pub mod fpenv;
pub mod hugepages;
pub mod onnx;
pub mod op;
pub mod parallel;
pub mod schema;
pub mod sharding;
pub mod tensor;
pub mod unknown_attrs;

pub use attrs::{widen_f32_attr, AttrValue, Attrs};
pub use call::{run_with_epilogue, AttrSource, CallSite, CallSites, Phase};
pub use dim::{broadcast_dims, fmt_dims, BinOp, Constraint, Dim, Expr, Relation};
pub use dtype::{DType, DTypeCodes, Element, FloatElem};
pub use error::{catch_panic, Error, ErrorKind, OpRef, Result};
pub use fpenv::KernelFpEnv;
pub use onnx::{OnnxAttr, OnnxInput, OnnxLayout, OnnxNode, OnnxOp, OnnxPlan};
pub use op::{
    camel_case, Backward, BwdInput, Epilogue, EpilogueFn, InferCtx, Inferred, KernelCtx, OpBuilder,
    OpDef, OpFlags, OutputAllocator, PrepackFn, Prepacked, Registry, ShapeOut, TensorSpec,
    TypeRule,
};
pub use parallel::{
    available_threads, default_pool, parallel_for, run_c_job, run_tasks, CJob, PanicSlot,
    RayonPool, SerialPool, ThreadPool,
};
pub use schema::{Arg, ArgType, Schema};
pub use sharding::{Factor, ShardCtx, ShardFn, ShardingRule};
pub use tensor::{
    broadcast_shapes, broadcast_strides, contiguous_strides, for_each_row, normalize_axis, numel,
    with_i64_contiguous, with_i64_dims, OwnedTensor, SharedMut, TensorMut, TensorRef,
};

// Re-exported so `dispatch_float!` works in crates that do not depend on `half` themselves.
pub use half;

/// A call's few tensors or attributes, kept inline (no heap allocation) up to four: the
/// per-call vectors of the call path (inputs, outputs, decoded attributes) use it, since a
/// small op's call costs about as much as a few allocations.
pub type Few<T> = smallvec::SmallVec<[T; 4]>;
