//! The `cxx` bridge to the C++ layer (`cxx/aot.h`, `cxx/aot.cpp`): MindSpore calls the
//! per-op exports there, which call the Rust entry points below; an `Err` they return is
//! thrown as `rust::Error` (a `std::exception` carrying polyop's message), which MindSpore
//! reports with its `what()`. The other way, Rust reads attributes through MindSpore's
//! `AotExtra`, whose exceptions come back as `Err`.

#[cxx::bridge(namespace = "polyopms")]
pub mod bridge {
    extern "Rust" {
        unsafe fn launch(
            slot: usize,
            nparam: i32,
            params: usize,
            ndims: *const i32,
            shapes: usize,
            dtypes: usize,
            extra: *mut AotExtra,
        ) -> Result<()>;
        unsafe fn infer_shape(
            slot: usize,
            ndims: *const i32,
            shapes: usize,
            extra: *mut AotExtra,
        ) -> Result<Vec<i64>>;
        unsafe fn infer_type(slot: usize, types: &[i32], extra: *mut AotExtra) -> Result<Vec<i32>>;
    }
    unsafe extern "C++" {
        include!("polyop-mindspore/cxx/aot.h");
        #[namespace = "mindspore"]
        type AotExtra;
        unsafe fn has_attr(e: *mut AotExtra, name: &str) -> bool;
        unsafe fn attr_bool(e: *mut AotExtra, name: &str) -> Result<bool>;
        unsafe fn attr_int(e: *mut AotExtra, name: &str) -> Result<i64>;
        unsafe fn attr_float(e: *mut AotExtra, name: &str) -> Result<f64>;
        unsafe fn attr_str(e: *mut AotExtra, name: &str) -> Result<String>;
        unsafe fn attr_ints(e: *mut AotExtra, name: &str) -> Result<Vec<i64>>;
        unsafe fn attr_floats(e: *mut AotExtra, name: &str) -> Result<Vec<f64>>;
    }
}

pub use bridge::*;

use crate::call::launch;
use crate::shape::{infer_shape, infer_type};
