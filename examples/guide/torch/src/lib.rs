//! libguide_torch.so: `torch.ops.load_library(path)`, then `torch.ops.guide_ops.minmax(x, axis=0)`.
polyop_torch::export!(namespace = "guide_ops", registry = guide_ops::registry());
