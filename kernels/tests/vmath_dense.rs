//! Dense ulp sweeps of the vector math: hundreds of millions of inputs each (the gelu sweep
//! takes ~500 s of a core in the unoptimised test build, ~135 s optimised:
//! `cargo test --release -p polyop-kernels --test vmath_dense`). Running them optimised in CI
//! was tried and costs more: the release test build unifies the dev-dependencies' features
//! and recompiles gemm, kernel-core and the kernels (10 minutes on 2 cores).

#[path = "util/ulp.rs"]
mod ulp;

use polyop_kernels::vmath::{gelu_erf_mid, GELU_MID};
use ulp::{gelu_erf_ref, max_ulps};

#[test]
fn gelu_erf_mid_range_dense() {
    // every f32 in [-4, 4] whose bits are a multiple of 7 (~300M inputs), the range the fast
    // path covers (the whole-range sweep in vmath's unit tests steps too coarsely for it alone)
    let (u, x) = max_ulps(-GELU_MID, GELU_MID, 7, gelu_erf_mid, gelu_erf_ref);
    eprintln!("gelu erf, |x| <= {GELU_MID}: max {u} ulp (at {x:e})");
    assert!(u <= 4.0, "gelu erf mid: {u} ulp at {x:e}");
}
