//! Dense ulp sweeps of the vector math: hundreds of millions of inputs each, run optimised
//! (`cargo test --release -p polyop-kernel-sweeps`: the gelu sweep takes ~135 s there, ~500 s
//! in an unoptimised build). ci/test.sh runs them after the workspace's debug tests; a debug
//! `cargo test` lists them as ignored, with that command as the reason.

#[path = "../../tests/util/ulp.rs"]
mod ulp;

use polyop_kernels::vmath::{gelu_erf_mid, GELU_MID};
use ulp::{gelu_erf_ref, max_ulps};

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "300M inputs, run optimised: cargo test --release -p polyop-kernel-sweeps"
)]
fn gelu_erf_mid_range_dense() {
    // every f32 in [-4, 4] whose bits are a multiple of 7 (~300M inputs), the range the fast
    // path covers (the whole-range sweep in vmath's unit tests steps too coarsely for it alone)
    let (u, x) = max_ulps(-GELU_MID, GELU_MID, 7, gelu_erf_mid, gelu_erf_ref);
    eprintln!("gelu erf, |x| <= {GELU_MID}: max {u} ulp (at {x:e})");
    assert!(u <= 4.0, "gelu erf mid: {u} ulp at {x:e}");
}
