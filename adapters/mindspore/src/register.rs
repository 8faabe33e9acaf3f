//! Registration with MindSpore: there is no registration call. `ops.Custom(f"{lib}:{name}",
//! func_type="aot")` finds an op's kernel, `Init`, `InferShape` and `InferType` functions by
//! symbol name with `dlsym`, so every op needs its own four exported symbols. build.rs writes
//! them from the registry at build time (`POLYOP_MS_OP1` / `POLYOP_MS_OPN` in `cxx/aot.h`, one
//! line per op, `polyop_<name>`), each passing its op's registry position (its slot) to the
//! generic entry points; no op is named by hand.

use kernel_core::{Error, OpDef, Registry, Result};

/// The registry the exports were generated from.
pub fn registry() -> &'static Registry {
    polyop_kernels::registry()
}

/// The op at registry position `slot` (what an export passes).
pub(crate) fn op_at(slot: usize) -> Result<&'static OpDef> {
    registry()
        .ops()
        .nth(slot)
        .ok_or_else(|| Error::internal(format!("no op at registry position {slot}")))
}

/// Whether `op` is exported (build.rs applies the same rule): in-place ops are torch-only.
pub fn is_exported(op: &OpDef) -> bool {
    !op.flags.inplace
}

/// The names of the exported ops, in registry order.
pub fn exported_names() -> Vec<&'static str> {
    registry()
        .ops()
        .filter(|o| is_exported(o))
        .map(|o| o.name)
        .collect()
}
