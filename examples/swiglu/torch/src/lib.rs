//! libswiglu_torch.so: `torch.ops.load_library(path)`, then `torch.ops.swiglu_ops.swiglu(x, g)`.
polyop_torch::export!(namespace = "swiglu_ops", registry = swiglu_ops::registry());
