"""MindSpore: polyop.mindspore.<op> (AOT Custom ops) against MindSpore's built-ins, both in
PyNative mode, and on the overhead rows against a `func_type="pyfunc"` ops.Custom doing the
same work in NumPy: the floor of MindSpore's own Custom-op path.

Runs in .venv-mindspore (MindSpore 2.10 needs numpy<2; bench/run.py picks the interpreter).
PyNative mode queues ops on MindSpore's runtime threads and returns before they ran, so every
timed batch ends with a wait for the queue (`measure(..., sync=...)`). A Custom op (polyop's
AOT ones and the pyfunc one alike) waits for that queue on every call. With
POLYOP_BENCH_MS_BLOCKING=1 the run calls `mindspore.runtime.launch_blocking()` first: every op
then runs to completion inside its call (no queue, no thread hand-offs).
"""

from __future__ import annotations

import os

import mindspore as ms
import numpy as np
from mindspore import ops
from mindspore.common.api import _pynative_executor  # what mindspore's profiler waits with

import polyop.mindspore as pms
from common import Result, Workload, dtype_of, measure_workloads


BLOCKING = os.environ.get("POLYOP_BENCH_MS_BLOCKING") == "1"


def _rms(x, w, eps):
    # ops.rms_norm has no CPU kernel in 2.10 ("The kernel RmsNorm unregistered").
    return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + eps) * w


def _conv(x, w, b, stride, padding):
    return ops.conv2d(x, w, b, stride=stride, pad_mode="pad", padding=padding)


BUILTIN = {
    "negate": ("ops.neg", lambda x: ops.neg(x)),
    "add": ("ops.add", lambda x, y: ops.add(x, y)),
    "scale": ("ops.mul", lambda x, alpha: ops.mul(x, alpha)),
    "relu": ("ops.relu", lambda x: ops.relu(x)),
    "add_relu": ("ops.relu(ops.add)", lambda x, y: ops.relu(ops.add(x, y))),
    "gelu": ("ops.gelu", lambda x, approximate: ops.gelu(x, approximate=approximate)),
    "softmax": ("ops.softmax", lambda x, axis: ops.softmax(x, axis)),
    "rms_norm": ("composite (rsqrt, mean)", _rms),
    "topk": ("ops.topk", lambda x, k, axis, largest: ops.topk(x, k, dim=axis, largest=largest)),
    "conv2d": ("ops.conv2d", _conv),
    "nonzero": ("ops.nonzero", lambda x: ops.nonzero(x)),
}

# The same work as a Python (NumPy) Custom op, for the elementwise ops' overhead rows.
PYFUNC = {
    "negate": lambda x: np.negative(x),
    "add": lambda x, y: np.add(x, y),
    "scale": None,  # built per call's alpha below
    "relu": lambda x: np.maximum(x, 0),
    "add_relu": lambda x, y: np.maximum(x + y, 0),
}


def _custom(op: str, attrs: dict):
    f = PYFUNC[op]
    if op == "scale":
        alpha = np.float32(attrs["alpha"])
        f = lambda x: x * alpha  # noqa: E731
    first = lambda x, *rest: x  # noqa: E731  (same shape and dtype as the first input)
    return ops.Custom(f, out_shape=first, out_dtype=first, func_type="pyfunc")


def set_threads(n: int) -> str:
    """Thread count n for MindSpore's CPU kernels (`device_context.cpu.op_tuning.threads_num`,
    once, before the first op). polyop's MindSpore kernels run on kernel-core's rayon pool
    (the AOT ABI offers no pool), sized by RAYON_NUM_THREADS, which bench/run.py sets in this
    process's environment."""
    ms.device_context.cpu.op_tuning.threads_num(n)
    return f"mindspore.device_context.cpu.op_tuning.threads_num({n})"


def run(workloads: list[Workload]) -> list[Result]:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    if BLOCKING:
        ms.runtime.launch_blocking()
    sync = _pynative_executor.sync

    def calls(w: Workload) -> dict | None:
        ts = [None if a is None else ms.Tensor(a) for a in w.inputs]
        attrs = list(w.attrs.values())
        builtin = BUILTIN[w.op][1]
        pfn = getattr(pms, w.op)
        if dtype_of(w.label) != "f32":
            # MindSpore's CPU kernels lack float16/bfloat16 for some of these ops (Softmax:
            # "Unsupported data type"): compare only where the built-in runs.
            try:
                builtin(*ts, *attrs)
                sync()
            except (TypeError, RuntimeError, ValueError):
                return None
        fns = {
            "polyop": lambda: pfn(*ts, **w.attrs),
            "builtin": lambda: builtin(*ts, *attrs),
        }
        if w.kind == "overhead" and w.op in PYFUNC:
            custom = _custom(w.op, w.attrs)
            fns["custom_op"] = lambda: custom(*ts)
        return fns

    results = []
    for w, t, extra in measure_workloads(workloads, calls, sync=sync):
        name = BUILTIN[w.op][0]
        if "custom_op" in t:
            extra["custom_op_s"] = t["custom_op"]
        results.append(Result("mindspore", w.op, w.kind, w.label, t["polyop"], t["builtin"], name, w.unit, w.work, extra))
    return results


def versions() -> dict:
    return {"mindspore": ms.__version__ + (" (PyNative, launch_blocking)" if BLOCKING else " (PyNative)")}


if __name__ == "__main__":
    print(np.__version__, versions())
