//! libguide_onnxruntime.so: `SessionOptions.register_custom_ops_library(path)`; nodes `Minmax`, ..., domain `ai.guide`.
polyop_onnxruntime::export!(domain = "ai.guide", registry = guide_ops::registry());
