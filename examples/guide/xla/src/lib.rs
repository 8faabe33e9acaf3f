//! libguide_xla.so: FFI targets `guide_<op>` for `jax.ffi`.
polyop_xla::export!(prefix = "guide_", registry = guide_ops::registry());
