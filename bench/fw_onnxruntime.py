"""ONNX Runtime: one-node ai.polyop models against one-node (or two-node) models of ONNX's
built-in ops, each run through InferenceSession.run."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

import polyop
import polyop.onnxruntime as pox
from common import SMOKE, Result, Workload, dtype_of, measure

OPSET = 23  # RMSNormalization arrived in opset 23
#: Seconds before each batch of runs (see `common.measure`); none in the CI smoke run.
PAUSE = 0.0 if SMOKE else 0.1

def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.polyop", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def _vi(name, a):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), None)


def polyop_model(w: Workload):
    """The one-node ai.polyop model, built by the package's own helper (what users call)."""
    return pox.make_model(w.op, w.inputs, **w.attrs).SerializeToString()


def polyop_feeds(w: Workload) -> dict:
    names = [a["name"] for a in polyop.op_info(w.op)["inputs"]]
    return {n: x for n, x in zip(names, w.inputs) if x is not None}


def builtin_model(w: Workload):
    a = w.attrs
    ins = [_vi(f"i{j}", x) for j, x in enumerate(w.inputs) if x is not None]
    outs = ["o0"]
    inits = []
    op = w.op
    if op == "negate":
        nodes, what = [helper.make_node("Neg", ["i0"], ["o0"])], "Neg"
    elif op == "add":
        nodes, what = [helper.make_node("Add", ["i0", "i1"], ["o0"])], "Add"
    elif op == "scale":
        inits = [numpy_helper.from_array(np.array(a["alpha"], dtype=np.float32), "alpha")]
        nodes, what = [helper.make_node("Mul", ["i0", "alpha"], ["o0"])], "Mul"
    elif op == "relu":
        nodes, what = [helper.make_node("Relu", ["i0"], ["o0"])], "Relu"
    elif op == "add_relu":
        nodes = [helper.make_node("Add", ["i0", "i1"], ["s"]), helper.make_node("Relu", ["s"], ["o0"])]
        what = "Add + Relu"
    elif op == "gelu":
        nodes, what = [helper.make_node("Gelu", ["i0"], ["o0"], approximate=a["approximate"])], "Gelu"
    elif op == "softmax":
        nodes, what = [helper.make_node("Softmax", ["i0"], ["o0"], axis=a["axis"])], "Softmax"
    elif op == "rms_norm":
        nodes = [helper.make_node("RMSNormalization", ["i0", "i1"], ["o0"], axis=-1, epsilon=a["eps"])]
        what = "RMSNormalization"
    elif op == "topk":
        inits = [numpy_helper.from_array(np.array([a["k"]], dtype=np.int64), "k")]
        nodes = [helper.make_node("TopK", ["i0", "k"], ["o0", "o1"], axis=a["axis"], largest=int(a["largest"]))]
        outs, what = ["o0", "o1"], "TopK"
    elif op == "conv2d":
        p = a["padding"]
        names = ["i0", "i1"] + (["i2"] if w.inputs[2] is not None else [])
        nodes = [helper.make_node("Conv", names, ["o0"], strides=[a["stride"]] * 2, pads=[p] * 4)]
        what = "Conv"
    elif op == "nonzero":
        nodes, what = [helper.make_node("NonZero", ["i0"], ["o0"])], "NonZero"
    else:
        raise KeyError(op)
    return _model(nodes, ins, [helper.make_empty_tensor_value_info(o) for o in outs], inits), what


THREADS = 0  # SessionOptions.intra_op_num_threads of both sessions; 0 is ORT's default


def set_threads(n: int) -> str:
    """Thread count n for both sessions' intra-op pools: polyop's kernels run on the session's
    pool (adapters/onnxruntime/src/pool.rs: `KernelContext_ParallelFor`)."""
    global THREADS
    THREADS = n
    return f"SessionOptions.intra_op_num_threads = {n}, both sessions"


def run(workloads: list[Workload]) -> list[Result]:
    so = ort.SessionOptions()
    so.register_custom_ops_library(polyop.library_path("onnxruntime"))
    plain = ort.SessionOptions()
    so.intra_op_num_threads = plain.intra_op_num_threads = THREADS
    results = []
    for w in workloads:
        if dtype_of(w.label) != "f32":
            # ONNX Runtime's CPU provider has float16/bfloat16 kernels for few of these ops (Add
            # in bfloat16: NOT_IMPLEMENTED), so there is no built-in to compare with.
            continue
        feeds = {f"i{j}": x for j, x in enumerate(w.inputs) if x is not None}
        pfeeds = polyop_feeds(w)
        ps = ort.InferenceSession(polyop_model(w), so, providers=["CPUExecutionProvider"])
        bm, what = builtin_model(w)
        bs = ort.InferenceSession(bm, plain, providers=["CPUExecutionProvider"])
        fns = {"polyop": lambda: ps.run(None, pfeeds), "builtin": lambda: bs.run(None, feeds)}
        # (a pause before each batch: the other session's pool threads spin after its runs;
        # without it, softmax over 64 rows of 65536 measured 1.5-1.9 ms where it takes 1.1 in
        # a process of its own)
        t = measure(fns, pause=PAUSE)
        results.append(Result("onnxruntime", w.op, w.kind, w.label, t["polyop"], t["builtin"], what, w.unit, w.work))
    return results


def versions() -> dict:
    return {"onnxruntime": ort.__version__, "onnx": onnx.__version__}
