#!/usr/bin/env python
"""Conformance of the out-of-tree `swiglu` op in every framework, with polyop's own harness.

    cargo build --release --manifest-path examples/swiglu/Cargo.toml
    python examples/swiglu/conformance.py [--backends native,torch,...] [--out matrix.md]

The cases and the NumPy reference below are the author's; the harness (`polyop.conformance`)
runs each backend in its own process on the example's four libraries
(`examples/swiglu/target/release/libswiglu_<fw>.so`): outputs must match the reference within
per-dtype tolerances and be bitwise identical to the `native` backend (the same kernels run on
NumPy arrays through the library's `polyop_run` export); error cases must raise the framework's
own error naming the op; `grad` columns are each framework's gradient check in float64.
Exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from polyop.conformance import Case, counts, run_isolated, write_matrix

HERE = Path(__file__).resolve().parent
LIB_DIR = Path(os.environ.get("SWIGLU_LIB_DIR", HERE / "target" / "release"))

#: backend -> the example's library for it (`native` runs the XLA one: it needs no framework).
LIBRARIES = {
    "native": LIB_DIR / "libswiglu_xla.so",
    "torch": LIB_DIR / "libswiglu_torch.so",
    "tensorflow": LIB_DIR / "libswiglu_tensorflow.so",
    "onnxruntime": LIB_DIR / "libswiglu_onnxruntime.so",
    "xla": LIB_DIR / "libswiglu_xla.so",
}

FLOAT = ["float16", "bfloat16", "float32", "float64"]


def _dt(name: str):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


#: Tolerance of swiglu and its backward, in ulps of the output dtype (see
#: polyop.conformance.tolerances): the kernel computes x * g * sigmoid(g) (and the backward's
#: products) in the compute type, with e^-g within 1 ulp and about 5 roundings; the
#: reference is exact (float64). Half types compute in float32 and round once.
SWIGLU_ULPS = 4.0


def cases() -> list[Case]:
    """Deterministic (fixed seed): every backend process builds the same list."""
    rng = np.random.default_rng(8)

    def arr(shape, dtype, lo=-4.0, hi=4.0):
        return rng.uniform(lo, hi, size=shape).astype(_dt(dtype))

    out = []
    for dt in FLOAT:
        for shape in [(), (0,), (7,), (3, 5), (2, 1, 2, 1, 1, 2, 1, 2)]:
            out.append(Case("swiglu", [arr(shape, dt), arr(shape, dt)], grad=dt == "float64" and shape != (0,)))
        # strided views: a transpose and a negative-stride slice
        x = np.swapaxes(arr((4, 3), dt), 0, 1)
        g = arr((3, 8), dt)[::-1, ::2]
        out.append(Case("swiglu", [x, g], tags=("strided",), grad=dt == "float64"))
        # the backward op is an ordinary op too
        out.append(Case("swiglu_backward", [arr((3, 4), dt), arr((3, 4), dt), arr((3, 4), dt)]))
    # a size that spans several parallel chunks
    out.append(Case("swiglu", [arr((70000,), "float32"), arr((70000,), "float32")], tags=("large",)))
    # extreme gates: sigmoid saturates; no NaN from exp overflow
    g = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=np.float32)
    out.append(Case("swiglu", [np.ones(5, np.float32), g], tags=("extreme",)))
    # bad input: polyop's own message, the same in every framework (each must also name the op)
    out.append(Case("swiglu", [arr((2, 3), "float32"), arr((2, 4), "float32")], id="swiglu(shape mismatch)",
                    expect_error="shape mismatch at dim 1: `gate` has 4, `x` has 3"))
    out.append(Case("swiglu", [arr((2, 3), "float32"), arr((2, 3), "float64")], id="swiglu(dtype mismatch)",
                    expect_error="dtype mismatch: input `gate` is float64 but earlier inputs are float32"))
    out.append(Case("swiglu", [np.ones((2, 3), np.int32), np.ones((2, 3), np.int32)], id="swiglu(int32)",
                    expect_error="unsupported dtype int32 for input `x`"))
    for c in out:
        c.ulps = SWIGLU_ULPS
    return out


def _swiglu64(x, g):
    """The forward from its definition, x * silu(g), silu(g) = g / (1 + e^-g); works on
    complex numbers too."""
    with np.errstate(over="ignore"):
        return x * (g / (1.0 + np.exp(-g)))


def _d(f, at, h=1e-30):
    """df/d(at) by the complex step, Im f(at + ih) / h: the derivative of the forward above
    to float64 accuracy (no subtraction, so no cancellation), derived from the forward
    alone, never from the kernel's backward formula."""
    return np.imag(f(at + 1j * h)) / h


def reference(op: str, inputs: list, attrs: dict):
    """Independent float64 NumPy reference: the forward written from the math, its gradient
    derived from that forward by the complex step (never from the kernel's code). Float
    results are returned as (float64 values, dtype) so the harness measures the kernel's
    error against the exact value, in ulps of the output dtype."""
    xs = [np.asarray(a, dtype=np.float64) for a in inputs]
    dtype = np.asarray(inputs[0]).dtype.name
    if op == "swiglu":
        x, g = xs
        return [(_swiglu64(x, g), dtype)]
    if op == "swiglu_backward":
        dy, x, g = xs
        return [(dy * _d(lambda t: _swiglu64(t, g), x), dtype), (dy * _d(lambda t: _swiglu64(x, t), g), dtype)]
    raise KeyError(op)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="native,torch,tensorflow,onnxruntime,xla")
    ap.add_argument("--out", default="", help="also write the markdown matrix here")
    args = ap.parse_args(argv)
    names = args.backends.split(",")
    missing = [str(LIBRARIES[n]) for n in names if not LIBRARIES[n].is_file()]
    if missing:
        print("missing libraries (build with `cargo build --release --manifest-path "
              f"examples/swiglu/Cargo.toml`): {', '.join(missing)}", file=sys.stderr)
        return 2

    def done(run) -> None:
        c = counts(run.results)
        print(f"{run.backend:<12} {c['pass']:>4} passed {c['fail']:>3} failed {c['unsupported']:>3} "
              f"unsupported ({run.seconds:.1f}s) {run.version}", flush=True)
        for r in run.results:
            if r.status == "fail":
                print(f"    FAIL {r.mode} {r.case_id}: {r.detail[:300]}", flush=True)

    this = str(Path(__file__).resolve())
    runs = run_isolated(names, f"{this}:cases", f"{this}:reference", baseline="native",
                        libraries={n: str(LIBRARIES[n]) for n in names}, on_done=done)
    results = [r for run in runs for r in run.results]
    if args.out:
        write_matrix(results, args.out, title="swiglu conformance",
                     versions={run.backend: run.version for run in runs},
                     num_cases=max((run.num_cases for run in runs), default=0))
    c = counts(results)
    print(f"swiglu conformance: {c['pass']} passed, {c['fail']} failed, {c['unsupported']} unsupported")
    return 1 if c["fail"] or not c["pass"] else 0


if __name__ == "__main__":
    sys.exit(main())
