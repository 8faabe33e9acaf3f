//! polyop adapter for onnxruntime: not yet implemented.
