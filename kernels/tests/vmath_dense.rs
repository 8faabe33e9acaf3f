//! Dense ulp sweeps of the vector math: hundreds of millions of inputs each, too many for an
//! unoptimised build (the gelu sweep took ~500 s of a core at opt-level 0). They run in the
//! optimised test build, which reuses the release build of polyop-kernels (CI, ci/test.sh):
//!
//!     cargo test --release -p polyop-kernels --test vmath_dense
//!
//! A debug `cargo test` lists them as ignored, with that command as the reason.

#[path = "util/ulp.rs"]
mod ulp;

use polyop_kernels::vmath::{gelu_erf_mid, GELU_MID};
use ulp::{gelu_erf_ref, max_ulps};

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "300M inputs: cargo test --release -p polyop-kernels --test vmath_dense"
)]
fn gelu_erf_mid_range_dense() {
    // every f32 in [-4, 4] whose bits are a multiple of 7 (~300M inputs), the range the fast
    // path covers (the whole-range sweep in vmath's unit tests steps too coarsely for it alone)
    let (u, x) = max_ulps(-GELU_MID, GELU_MID, 7, gelu_erf_mid, gelu_erf_ref);
    eprintln!("gelu erf, |x| <= {GELU_MID}: max {u} ulp (at {x:e})");
    assert!(u <= 4.0, "gelu erf mid: {u} ulp at {x:e}");
}
