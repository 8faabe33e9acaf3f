//! The stock kernel library: SPEC.md section 3, one module per op family.

use kernel_core::{Registry, Result};
use std::sync::OnceLock;

pub(crate) mod common;
pub mod conv;
pub mod elementwise;
pub mod halfconv;
pub mod nonzero;
pub mod norm;
pub mod softmax;
pub mod topk;
pub mod vmath;

pub use common::{cpu_simd_level, force_simd_level, simd_level, SimdLevel};

/// Every stock op (forward and backward), validated.
pub fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| build().expect("stock registry is valid"))
}

fn build() -> Result<Registry> {
    let mut r = Registry::new();
    elementwise::register(&mut r)?;
    softmax::register(&mut r)?;
    norm::register(&mut r)?;
    topk::register(&mut r)?;
    conv::register(&mut r)?;
    nonzero::register(&mut r)?;
    r.validate()?;
    Ok(r)
}
