//! libguide_xla.so: FFI targets `guide_<op>` for `jax.ffi`.
polyop_xla::export!(prefix = "guide_", registry = guide_ops::registry(); leaky_relu_scaled, leaky_relu_scaled_backward, minmax, pad_add);
