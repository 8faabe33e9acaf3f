//! libswiglu_onnxruntime.so: `SessionOptions.register_custom_ops_library(path)`; nodes `Swiglu`, domain `ai.example`.
polyop_onnxruntime::export!(domain = "ai.example", registry = swiglu_ops::registry());
