//! libguide_tensorflow.so: `tf.load_op_library(path).guide_minmax(x=x, axis=0)` (op type `GuideMinmax`).
polyop_tensorflow::export!(prefix = "Guide", registry = guide_ops::registry());
