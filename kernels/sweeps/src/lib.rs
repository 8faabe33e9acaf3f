//! No code: see tests/vmath_dense.rs (run with `cargo test --release -p polyop-kernel-sweeps`).
