#!/usr/bin/env python
"""polyop demo: the same Rust kernels, run through NumPy (the polyop core), PyTorch,
TensorFlow, ONNX Runtime and JAX, give the same answers, bit for bit.

    python examples/demo.py            # or: bash ci/demo.sh (sets everything up first)

Each framework runs in its own process (as a user's program would); the parent collects the
outputs and compares them with the NumPy core's. Forward ops and gradients (through each
framework's own autograd, which calls the registered backward kernels) are both shown.
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

FRAMEWORKS = ("torch", "tensorflow", "onnxruntime", "jax")


# --------------------------------------------------------------------------------------
# the workload: (label, op, inputs, attrs); identical in every process (fixed seed)


def workload():
    rng = np.random.default_rng(2024)
    x = rng.normal(size=(4, 8)).astype(np.float32)
    w = rng.normal(size=(8,)).astype(np.float32)
    img = rng.normal(size=(1, 3, 8, 8)).astype(np.float32)
    ker = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    bias = rng.normal(size=(4,)).astype(np.float32)
    scores = np.array([[0.5, 2.0, 2.0, -1.0, np.nan, 7.0]], dtype=np.float32)
    sparse = np.where(rng.uniform(size=(3, 4)) < 0.5, 0, rng.integers(1, 9, size=(3, 4))).astype(np.int64)
    return [
        ("rms_norm  f32[4,8] + weight", "rms_norm", [x, w], {"eps": 1e-5}),
        ("gelu tanh bf16[4,8]", "gelu", [x.astype(ml_dtypes.bfloat16)], {"approximate": "tanh"}),
        ("gelu erf  f16[4,8] (transposed view)", "gelu", [x.astype(np.float16).T], {}),
        ("softmax   f64[4,8] axis=0", "softmax", [x.astype(np.float64)], {"axis": 0}),
        ("add_relu  i32[4,8] + i32[8] (broadcast)", "add_relu",
         [(x * 10).astype(np.int32), (w * 10).astype(np.int32)], {}),
        ("topk k=3  ties + NaN", "topk", [scores], {"k": 3}),
        ("conv2d    stride 2, padding 1, bias", "conv2d", [img, ker, bias], {"stride": 2, "padding": 1}),
        ("nonzero   i64[3,4] (data-dependent shape)", "nonzero", [sparse], {}),
    ]


def grad_workload():
    """(label, op, inputs, attrs, upstream gradient seed): d/d inputs of sum(out * g)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3, 5))
    w = rng.normal(size=(5,))
    return [
        ("grad rms_norm (x, weight) f64", "rms_norm", [x, w], {"eps": 1e-6}),
        ("grad softmax  (x) f64", "softmax", [x], {"axis": -1}),
        ("grad gelu     (x) f64", "gelu", [x], {"approximate": "none"}),
    ]


def upstream(shape):
    return np.cos(np.arange(int(np.prod(shape)), dtype=np.float64)).reshape(shape)


# --------------------------------------------------------------------------------------
# one function per surface; each returns {label: [numpy arrays]} or {label: "error text"}


def _as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_native():
    import polyop

    res = {}
    for label, op, ins, attrs in workload():
        res[label] = [np.asarray(o) for o in _as_list(polyop.run(op, *ins, **attrs))]
    # Gradients without a framework: call the backward op the metadata names, exactly as
    # every framework's glue does.
    for label, op, ins, attrs in grad_workload():
        y = _as_list(polyop.run(op, *ins, **attrs))
        bw = polyop.op_info(op)["backward"]
        args = []
        for kind, i in bw["inputs"]:
            args.append({"grad": [upstream(y[0].shape)], "input": ins, "output": y}[kind][i])
        battrs = {a["name"]: attrs.get(a["name"], a["default"]) for a in polyop.op_info(bw["op"])["attrs"]}
        grads = _as_list(polyop.run(bw["op"], *args, **battrs))
        by_input = dict(zip(bw["outputs"], grads))
        res[label] = [by_input[i] for i in range(len(ins))]
    return res


def run_torch():
    import torch

    import polyop.torch

    ops = polyop.torch.load()  # torch.ops.load_library(libpolyop_torch.so) + autograd

    def to_t(a):
        if a is None:
            return None
        a = np.ascontiguousarray(a) if a.dtype == ml_dtypes.bfloat16 else a
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(np.array(a))  # torch.from_numpy needs positive strides

    def to_np(t):
        t = t.detach()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()

    res = {}
    for label, op, ins, attrs in workload():
        res[label] = [to_np(o) for o in _as_list(getattr(ops, op)(*map(to_t, ins), **attrs))]
    for label, op, ins, attrs in grad_workload():
        ts = [to_t(a).requires_grad_() for a in ins]
        y = getattr(ops, op)(*ts, **attrs)
        (y * torch.from_numpy(upstream(tuple(y.shape)))).sum().backward()
        res[label] = [to_np(t.grad) for t in ts]
    return res


def run_tensorflow():
    import tensorflow as tf

    import polyop.tensorflow

    ops = polyop.tensorflow.load()  # tf.load_op_library(libpolyop_tensorflow.so) + gradients
    res = {}
    for label, op, ins, attrs in workload():
        outs = getattr(ops, op)(*[None if a is None else tf.constant(a) for a in ins], **attrs)
        res[label] = [o.numpy() for o in _as_list(outs)]
    for label, op, ins, attrs in grad_workload():
        vs = [tf.Variable(a) for a in ins]
        with tf.GradientTape() as tape:
            y = getattr(ops, op)(*vs, **attrs)
            loss = tf.reduce_sum(y * upstream(tuple(y.shape)))
        res[label] = [g.numpy() for g in tape.gradient(loss, vs)]
    return res


def run_onnxruntime():
    import polyop.onnxruntime as pox  # ai.polyop models + SessionOptions with the library

    res = {}
    for label, op, ins, attrs in workload():
        res[label] = [np.asarray(o) for o in _as_list(pox.run(op, *ins, **attrs))]
    for label, *_ in grad_workload():
        res[label] = "n/a (ONNX Runtime is inference-only)"
    return res


def run_jax():
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import polyop.jax as pj  # XLA FFI targets from libpolyop_xla.so

    res = {}
    for label, op, ins, attrs in workload():
        if polyop_info(op)["flags"]["data_dependent_shape"]:
            res[label] = "n/a (data-dependent shape; XLA needs static shapes)"
            continue
        f = jax.jit(lambda *xs, op=op, attrs=attrs: getattr(pj, op)(*xs, **attrs))
        res[label] = [np.asarray(o) for o in _as_list(f(*[jnp.asarray(a) for a in ins]))]
    for label, op, ins, attrs in grad_workload():
        def loss(*xs, op=op, attrs=attrs):
            y = getattr(pj, op)(*xs, **attrs)
            return jnp.sum(y * upstream(tuple(y.shape)))

        grads = jax.grad(loss, argnums=tuple(range(len(ins))))(*[jnp.asarray(a) for a in ins])
        res[label] = [np.asarray(g) for g in grads]
    return res


def polyop_info(op):
    import polyop

    return polyop.op_info(op)


RUNNERS = {"native": run_native, "torch": run_torch, "tensorflow": run_tensorflow,
           "onnxruntime": run_onnxruntime, "jax": run_jax}


# --------------------------------------------------------------------------------------
# driver


def worker(name: str, out_path: str) -> int:
    """Run one surface and pickle {label: outputs | error text} (plus a status)."""
    t0 = time.perf_counter()
    try:
        res = RUNNERS[name]()
        status = "ok"
    except FileNotFoundError as e:  # the framework library is not built
        res, status = {}, f"not built yet: {e}"
    except ImportError as e:
        res, status = {}, f"not available: {type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001
        res, status = {}, f"failed: {type(e).__name__}: {e}"
    with open(out_path, "wb") as f:
        pickle.dump({"status": status, "results": res, "seconds": time.perf_counter() - t0}, f)
    return 0


def run_in_subprocess(name: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.pkl")
        p = subprocess.run([sys.executable, __file__, "--worker", name, out], capture_output=True, text=True)
        if p.returncode != 0 or not os.path.exists(out):
            tail = (p.stderr or "").strip().splitlines()[-3:]
            return {"status": f"crashed (exit {p.returncode}): {' | '.join(tail)}", "results": {}, "seconds": 0}
        with open(out, "rb") as f:
            return pickle.load(f)


def identical(a: list, b: list) -> tuple[bool, str]:
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} outputs"
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != y.dtype or x.shape != y.shape:
            return False, f"{x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
        xb = np.ascontiguousarray(x).view(np.uint8)
        yb = np.ascontiguousarray(y).view(np.uint8)
        if not np.array_equal(xb, yb):
            xf, yf = x.astype(np.float64), y.astype(np.float64)
            if np.array_equal(xf, yf, equal_nan=True) and x.dtype.kind in "fV":
                continue  # only NaN payloads differ
            with np.errstate(invalid="ignore"):
                d = np.nanmax(np.abs(xf - yf)) if xf.size else 0.0
            return False, f"max |diff| {d:.3g}"
    return True, ""


def preview(outs) -> str:
    a = np.asarray(outs[0])
    flat = a.astype(np.float64).reshape(-1)[:3] if a.dtype.kind in "fV" else a.reshape(-1)[:4]
    vals = ", ".join(f"{v:.4g}" if isinstance(v, float) and not math.isnan(v) else str(v) for v in flat.tolist())
    more = ", ..." if a.size > len(flat) else ""
    shape = "x".join(map(str, a.shape)) or "scalar"
    extra = f" +{len(outs) - 1} output" if len(outs) > 1 else ""
    return f"{a.dtype.name}[{shape}] [{vals}{more}]{extra}"


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3])
    only = sys.argv[1:] or list(FRAMEWORKS)

    print("polyop demo: one Rust kernel library, five surfaces.\n")
    runs = {"native": run_in_subprocess("native")}
    if runs["native"]["status"] != "ok":
        print(f"native (polyop core) {runs['native']['status']}")
        return 1
    for fw in only:
        print(f"  running {fw} ...", end="", flush=True)
        runs[fw] = run_in_subprocess(fw)
        print(f" {runs[fw]['status']} ({runs[fw]['seconds']:.1f}s)")
    print()

    labels = [w[0] for w in workload()] + [g[0] for g in grad_workload()]
    native = runs["native"]["results"]
    lw = max(len(label) for label in labels)
    pw = max(len("native result (NumPy core)"), *(len(preview(native[label])) for label in labels)) + 2
    cols = list(only)
    header = f"{'case':<{lw}}  {'native result (NumPy core)':<{pw}}" + "".join(f"{c:<14}" for c in cols)
    print(header)
    print("-" * len(header))
    mismatches = 0
    same = {c: 0 for c in cols}
    ran = {c: 0 for c in cols}
    for label in labels:
        row = f"{label:<{lw}}  {preview(native[label]):<{pw}}"
        for c in cols:
            r = runs[c]
            if r["status"] != "ok":
                cell = "not built yet" if r["status"].startswith("not built") else "unavailable"
            else:
                got = r["results"].get(label)
                if isinstance(got, str):
                    cell = "n/a"
                else:
                    ran[c] += 1
                    ok, why = identical(got, native[label])
                    if ok:
                        same[c] += 1
                        cell = "identical"
                    else:
                        mismatches += 1
                        cell = f"DIFFERENT ({why})"
            row += f"{cell:<14}"
        print(row)
    print()
    for c in cols:
        r = runs[c]
        if r["status"] != "ok":
            print(f"{c:<12} {r['status']}")
        else:
            verdict = "yes" if same[c] == ran[c] else "NO"
            print(f"{c:<12} identical to native: {verdict} ({same[c]}/{ran[c]} bit-for-bit)")
    notes = sorted({(c, v) for c in cols for v in runs[c]["results"].values() if isinstance(v, str)})
    for c, v in notes:
        print(f"{c:<12} {v}")
    if mismatches:
        print(f"\n{mismatches} result(s) differ from the NumPy core.")
        return 1
    missing = [c for c in cols if runs[c]["status"] != "ok"]
    if missing:
        # The demo's point is all four frameworks: one that did not run is a failure, not a skip.
        print(f"\nthese frameworks did not run: {', '.join(missing)} (run `bash ci/setup.sh`, then retry)")
        return 1
    print("\nidentical: yes -- every framework that ran returned the NumPy core's bits.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
