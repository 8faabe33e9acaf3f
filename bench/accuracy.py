"""Accuracy of ONNX Runtime's built-in Softmax and Gelu (tanh form) next to polyop's ops run
in ONNX Runtime, in float32 ulps against float64 references (issue 18: the two ratios there
that stay below 1.0 are against these built-ins).

    .venv/bin/python bench/accuracy.py

Softmax: rows of 1024 drawn uniformly from [-spread, 0]; the reference is exp(x - max) / sum
in float64. Gelu (tanh form): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), taken in
float64 as x / (1 + exp(-2u)), which has no cancellation for negative x (the direct formula
loses every digit there, in float64 too). An error is |got - ref| / (2^-23 max(|ref|,
2^-126)): ulps of the reference's magnitude, the measure of python/polyop/conformance/
tolerances.txt. Prints a markdown table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fw_onnxruntime as fw  # noqa: E402
from common import Workload  # noqa: E402

import polyop  # noqa: E402


def ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.abs(got.astype(np.float64) - ref) / (2.0**-23 * np.maximum(np.abs(ref), 2.0**-126))


def run(op: str, x: np.ndarray, attrs: dict, builtin: bool) -> np.ndarray:
    w = Workload(op, "accuracy", "", [x], attrs, 1.0, "")
    if builtin:
        model, _ = fw.builtin_model(w)
        s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        return s.run(None, {"i0": x})[0]
    so = ort.SessionOptions()
    so.register_custom_ops_library(polyop.library_path("onnxruntime"))
    s = ort.InferenceSession(fw.polyop_model(w), so, providers=["CPUExecutionProvider"])
    return s.run(None, fw.polyop_feeds(w))[0]


def main() -> int:
    rng = np.random.default_rng(5)
    rows = []
    for spread in [1, 10, 30]:
        x = rng.uniform(-spread, 0, (64, 1024)).astype(np.float32)
        xd = x.astype(np.float64)
        e = np.exp(xd - xd.max(1, keepdims=True))
        ref = e / e.sum(1, keepdims=True)
        errs = [ulps(run("softmax", x, {"axis": -1}, b), ref) for b in (False, True)]
        rows.append((f"Softmax, rows of 1024 in [-{spread}, 0]", *errs))
    x = np.concatenate([rng.uniform(-10, 10, 1 << 20), rng.uniform(-3, 3, 1 << 18)]).astype(np.float32)
    xd = x.astype(np.float64)
    ref = xd / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (xd + 0.044715 * xd**3)))
    got = [run("gelu", x, {"approximate": "tanh"}, b) for b in (False, True)]
    for lo, hi in [(0, 10), (-3, 0), (-10, -3)]:
        sel = (x >= lo) & (x < hi)
        rows.append((f"Gelu tanh, x in [{lo}, {hi})", *(ulps(g[sel], ref[sel]) for g in got)))
    print("| case | polyop max | polyop median | built-in max | built-in median |")
    print("|---|---|---|---|---|")
    for name, p, b in rows:
        print(f"| {name} | {p.max():.3g} | {np.median(p):.2g} | {b.max():.3g} | {np.median(b):.2g} |")
    print()
    for v in (-10.0, -6.0, -5.0, -4.0):
        xs = np.array([v], np.float32)
        exact = v / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))
        print(f"Gelu tanh at {v:g}: float64 {exact:.7g}, polyop {run('gelu', xs, {'approximate': 'tanh'}, False)[0]:.7g}, "
              f"built-in {run('gelu', xs, {'approximate': 'tanh'}, True)[0]:.7g}  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
