"""TensorFlow: the raw library's polyop_<op> wrappers against TF built-ins, both eager."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import polyop
from common import Result, Workload, measure_workloads


def _rms(x, w, eps):
    return x * tf.math.rsqrt(tf.reduce_mean(x * x, axis=-1, keepdims=True) + eps) * w


def _conv_nhwc(x, w, b, stride, padding):
    # TF's CPU conv2d runs NHWC/HWIO only; the inputs are pre-transposed outside the timing.
    y = tf.nn.conv2d(x, w, strides=stride, padding=[[0, 0], [padding, padding], [padding, padding], [0, 0]])
    return y if b is None else tf.nn.bias_add(y, b)


BUILTIN = {
    "negate": ("tf.negative", lambda x: tf.negative(x)),
    "add": ("tf.add", lambda x, y: tf.add(x, y)),
    "scale": ("tf.multiply", lambda x, alpha: tf.multiply(x, alpha)),
    "relu": ("tf.nn.relu", lambda x: tf.nn.relu(x)),
    "add_relu": ("tf.nn.relu(tf.add)", lambda x, y: tf.nn.relu(tf.add(x, y))),
    "gelu": ("tf.nn.gelu", lambda x, approximate: tf.nn.gelu(x, approximate=approximate == "tanh")),
    "softmax": ("tf.nn.softmax", lambda x, axis: tf.nn.softmax(x, axis=axis)),
    "rms_norm": ("composite (rsqrt, reduce_mean)", _rms),
    "topk": ("tf.math.top_k", lambda x, k, axis, largest: tf.math.top_k(x, k)),
    "conv2d": ("tf.nn.conv2d NHWC + bias_add", _conv_nhwc),
    "nonzero": ("tf.where", lambda x: tf.where(x)),
}


def run(workloads: list[Workload]) -> list[Result]:
    m = tf.load_op_library(polyop.library_path("tensorflow"))

    def calls(w: Workload) -> dict:
        ts = [None if a is None else tf.constant(a) for a in w.inputs]
        builtin = BUILTIN[w.op][1]
        pfn = getattr(m, f"polyop_{w.op}")
        attrs = dict(w.attrs)
        # The raw op's int[] attributes are TF list(int)s: a single int is repeated, as the
        # polyop.tensorflow wrappers do.
        lists = {a["name"]: a.get("len") or 1 for a in polyop.op_info(w.op)["attrs"] if a["type"] == "int[]"}
        pattrs = {k: [v] * lists[k] if k in lists and isinstance(v, int) else v for k, v in attrs.items()}
        pargs = list(ts)
        if w.op in ("rms_norm", "conv2d"):
            # Optional tensors are list inputs of 0 or 1 tensors on the TF surface.
            opt = pargs.pop()
            pargs.append([] if opt is None else [opt])
        bargs = list(ts)
        if w.op == "conv2d":
            bargs[0] = tf.transpose(ts[0], [0, 2, 3, 1])
            bargs[1] = tf.transpose(ts[1], [2, 3, 1, 0])
        return {
            "polyop": lambda: pfn(*pargs, **pattrs),
            "builtin": lambda: builtin(*bargs, *attrs.values()),
        }

    results = []
    for w, t, extra in measure_workloads(workloads, calls):
        name = BUILTIN[w.op][0]
        results.append(Result("tensorflow", w.op, w.kind, w.label, t["polyop"], t["builtin"], name, w.unit, w.work, extra))
    return results


def set_threads(n: int) -> str:
    """Thread count n for TF's intra- and inter-op pools, set before the first op runs. polyop's
    TF kernels run on kernel-core's rayon pool (TF's C API exposes no pool), sized by
    RAYON_NUM_THREADS, which bench/run.py sets in this process's environment."""
    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)
    got = (tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads())
    return f"tf.config.threading.set_intra/inter_op_parallelism_threads({n}) (get: {got[0]}/{got[1]})"


def versions() -> dict:
    return {"tensorflow": tf.__version__}


if __name__ == "__main__":
    print(np.__version__, versions())
