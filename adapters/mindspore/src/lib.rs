//! polyop adapter for MindSpore: every op of the stock registry as an AOT Custom op,
//! `mindspore.ops.Custom(f"{path}:polyop_<name>", func_type="aot")` on CPU, with C++ shape and
//! type inference (graph mode with dynamic dims) and errors raised at inference.
//!
//! - build.rs generates the four exports of each op (kernel, `Init`, `InferShape`,
//!   `InferType`) from the registry ([`register`]); they cross into Rust through the `cxx`
//!   bridge ([`sys`]), built with the wheel's `_GLIBCXX_USE_CXX11_ABI=0`.
//! - the kernel runs on kernel-core's call path ([`call`]) on kernel-core's default pool:
//!   the AOT ABI offers no MindSpore thread pool.
//! - `polyop.mindspore` (Python) builds the Custom primitives, attributes and gradients.

mod attrs;
mod call;
mod error;
pub mod register;
mod shape;
mod sys;
mod tensor;

polyop_export::library_exports!(
    framework = "mindspore",
    name_key = "prefix",
    name = "polyop_",
    registry = register::registry(),
    exported = register::exported_names(),
);
