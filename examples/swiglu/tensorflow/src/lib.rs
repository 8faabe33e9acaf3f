//! libswiglu_tensorflow.so: `tf.load_op_library(path).example_swiglu(x=x, gate=g)` (op type `ExampleSwiglu`).
polyop_tensorflow::export!(prefix = "Example", registry = swiglu_ops::registry());
