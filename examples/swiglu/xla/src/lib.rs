//! libswiglu_xla.so: FFI targets `example_swiglu`, `example_swiglu_backward` for `jax.ffi`.
polyop_xla::export!(prefix = "example_", registry = swiglu_ops::registry());
