"""Timing utilities and the shared workload definitions for the polyop benchmarks.

Each framework module (fw_torch.py, ...) turns the workloads below into pairs of callables,
(polyop op, the framework's built-in op for the same work), and `measure` times both in the same
process, interleaved, so the ratio survives a noisy machine.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import time
from typing import Callable

import numpy as np

# Input sizes. "quick" keeps CI's smoke run to seconds; "full" is what docs/benchmarks.md reports.
SIZES = {
    "quick": dict(tiny=8, big=1 << 16, rows=64, row_len=1024, long=(4, 1 << 14), conv=(1, 16, 28, 28, 16), sweep=[1 << 10, 1 << 14, 1 << 16]),
    "full": dict(tiny=8, big=1 << 24, rows=16384, row_len=1024, long=(64, 1 << 16), conv=(1, 64, 56, 56, 64), sweep=[1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24]),
}

OPS = ["negate", "add", "scale", "relu", "add_relu", "gelu", "softmax", "rms_norm", "topk", "conv2d", "nonzero"]


# The memory-bound ops that also run in float16 and bfloat16 (throughput workloads only).
HALF_OPS = ["negate", "add", "scale", "relu", "add_relu", "gelu", "softmax", "rms_norm", "topk"]


def half_dtypes() -> dict:
    """{"f16": np.float16, "bf16": ml_dtypes.bfloat16}: NumPy has no bfloat16 of its own."""
    import ml_dtypes

    return {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def dtype_of(label: str) -> str:
    """"f16", "bf16" or "f32" for a workload label (see the half workloads below)."""
    tail = label.rsplit(" ", 1)[-1]
    return tail if tail in ("f16", "bf16") else "f32"


def half_ratios(results: list) -> list[tuple[str, str, str, str, float, float]]:
    """(framework, op, f32 label, dtype, polyop's elements/s in dtype / polyop's in f32, the
    built-in's same ratio) for every half-type throughput result with an f32 twin."""
    f32 = {(r.framework, r.op, r.label): r for r in results if r.kind == "throughput" and dtype_of(r.label) == "f32"}
    out = []
    for r in results:
        dt = dtype_of(r.label)
        if r.kind != "throughput" or dt == "f32":
            continue
        base = f32.get((r.framework, r.op, r.label[: -len(dt) - 1]))
        if base is not None:
            out.append((r.framework, r.op, base.label, dt, base.polyop_s / r.polyop_s, base.builtin_s / r.builtin_s))
    return out


@dataclasses.dataclass
class Workload:
    """One op on one input set. `work` is bytes moved (memory-bound ops) or FLOPs (conv2d)."""

    op: str
    kind: str  # "overhead" | "throughput" | "sweep"
    label: str
    inputs: list  # numpy arrays (None for absent optionals)
    attrs: dict
    work: float
    unit: str  # "GB/s" | "GFLOP/s" | "us"


@dataclasses.dataclass
class Result:
    framework: str
    op: str
    kind: str
    label: str
    polyop_s: float  # median seconds per call
    builtin_s: float
    baseline: str  # what the built-in is
    unit: str
    work: float
    extra: dict = dataclasses.field(default_factory=dict)  # e.g. torch custom_op timing

    @property
    def ratio(self) -> float:
        """Throughput ratio polyop / built-in (>1 means polyop is faster)."""
        return self.builtin_s / self.polyop_s

    def rate(self, seconds: float) -> float:
        if self.unit == "us":
            return seconds * 1e6
        return self.work / seconds / 1e9


def make_workloads(size: str, ops: list[str] | None = None, kinds: list[str] | None = None) -> list[Workload]:
    """The workloads of `size`; only those of `ops` and of `kinds` when given (all otherwise)."""
    w = _all_workloads(size)
    return [x for x in w if (ops is None or x.op in ops) and (kinds is None or x.kind in kinds)]


def _all_workloads(size: str) -> list[Workload]:
    s = SIZES[size]
    rng = np.random.default_rng(0)
    f32 = np.float32
    w: list[Workload] = []

    def ew(op, n, kind, label, nin=1, attrs=None):
        xs = [rng.standard_normal(n).astype(f32) for _ in range(nin)]
        return Workload(op, kind, label, xs, attrs or {}, 4.0 * n * (nin + 1), "GB/s" if kind != "overhead" else "us")

    for kind, n, label in [("overhead", s["tiny"], f"{s['tiny']} elems"), ("throughput", s["big"], f"{s['big']} elems")]:
        w.append(ew("negate", n, kind, label))
        w.append(ew("add", n, kind, label, nin=2))
        w.append(ew("scale", n, kind, label, attrs={"alpha": 1.5}))
        w.append(ew("relu", n, kind, label))
        w.append(ew("add_relu", n, kind, label, nin=2))
        w.append(ew("gelu", n, kind, label, attrs={"approximate": "none"}))
        if kind == "throughput":
            w.append(ew("gelu", n, kind, label + " tanh", attrs={"approximate": "tanh"}))
    # Row ops: tiny = one row of 8; big = rows x row_len.
    for kind, shape, label in [
        ("overhead", (1, s["tiny"]), f"1x{s['tiny']}"),
        ("throughput", (s["rows"], s["row_len"]), f"{s['rows']}x{s['row_len']}"),
    ]:
        x = rng.standard_normal(shape).astype(f32)
        n = x.size
        unit = "GB/s" if kind != "overhead" else "us"
        w.append(Workload("softmax", kind, label, [x], {"axis": -1}, 8.0 * n, unit))
        wt = rng.standard_normal(shape[-1]).astype(f32)
        w.append(Workload("rms_norm", kind, label, [x, wt], {"eps": 1e-6}, 8.0 * n, unit))
        k = min(8, shape[-1])
        w.append(Workload("topk", kind, label + f" k={k}", [x], {"k": k, "axis": -1, "largest": True}, 4.0 * n, unit))
        xz = np.where(rng.random(shape) < 0.5, 0, x).astype(f32)
        w.append(Workload("nonzero", kind, label, [xz], {}, 4.0 * n, unit))
    # Long rows: softmax over rows that no longer fit the L1/L2 caches.
    x = rng.standard_normal(s["long"]).astype(f32)
    w.append(Workload("softmax", "throughput", f"{s['long'][0]}x{s['long'][1]}", [x], {"axis": -1}, 8.0 * x.size, "GB/s"))
    # The same throughput inputs in float16 and bfloat16 (rounded from the f32 ones), labelled
    # "<f32 label> f16" / "... bf16": the half types' elements per second against float32's
    # on the same op (`half_ratios`). `work` counts 2 bytes per element.
    for x in [x for x in w if x.kind == "throughput" and x.op in HALF_OPS]:
        for tag, dt in half_dtypes().items():
            xs = [None if a is None else a.astype(dt) for a in x.inputs]
            w.append(Workload(x.op, x.kind, f"{x.label} {tag}", xs, x.attrs, x.work / 2, x.unit))
    # conv2d: overhead on a tiny 1x1x2x2 input, throughput on a ResNet-like 3x3 layer.
    xi = rng.standard_normal((1, 1, 4, 2)).astype(f32)
    wi = rng.standard_normal((1, 1, 1, 1)).astype(f32)
    w.append(Workload("conv2d", "overhead", "1x1x4x2 (8 elems)", [xi, wi, None], {"stride": 1, "padding": 0}, 0.0, "us"))
    nb, c, h, ww, o = s["conv"]
    xi = rng.standard_normal((nb, c, h, ww)).astype(f32)
    wi = (rng.standard_normal((o, c, 3, 3)) * 0.1).astype(f32)
    bi = rng.standard_normal(o).astype(f32)
    flops = 2.0 * nb * o * h * ww * c * 9
    w.append(Workload("conv2d", "throughput", f"{nb}x{c}x{h}x{ww} 3x3 -> {o}", [xi, wi, bi], {"stride": 1, "padding": 1}, flops, "GFLOP/s"))
    # Size sweep for the throughput-vs-size plot.
    for n in s["sweep"]:
        w.append(ew("add", n, "sweep", str(n), nin=2))
    return w


# `bench/run.py --smoke` (CI) shortens every measurement: it checks the harness, not speed.
SMOKE = os.environ.get("POLYOP_BENCH_SMOKE") == "1"


def measure(
    fns: dict[str, Callable[[], object]],
    min_time: float = 0.25,
    repeats: int = 7,
    sync: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each callable. Calls are batched so each sample lasts at
    least min_time/repeats, and the callables are interleaved sample by sample so drift in the
    machine's speed hits them equally. `sync`, for a framework that runs ops asynchronously
    (MindSpore's PyNative mode), waits for the queued work and is timed at the end of every
    batch: a batch's time is then that of its calls run to completion, back to back."""
    if SMOKE:
        min_time, repeats = 0.005, 3
    sync = sync or (lambda: None)
    for f in fns.values():  # warm-up (compilation, caches, thread pools)
        for _ in range(3):
            f()
        sync()
    number = {}
    for name, f in fns.items():
        n = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            sync()
            dt = time.perf_counter() - t0
            if dt >= min_time / repeats or n >= 1 << 20:
                break
            n *= 2
        number[name] = n
    samples: dict[str, list[float]] = {k: [] for k in fns}
    gc.disable()
    try:
        for _ in range(repeats):
            for name, f in fns.items():
                n = number[name]
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                sync()
                samples[name].append((time.perf_counter() - t0) / n)
    finally:
        gc.enable()
    return {k: statistics.median(v) for k, v in samples.items()}


def copy_bandwidth(nbytes: int = 1 << 26) -> float:
    """Measured memory-copy bandwidth in GB/s (read + write counted), the physical limit for the
    memory-bound ops."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    t = measure({"copy": lambda: np.copyto(dst, src)}, min_time=0.5)["copy"]
    return 2.0 * nbytes / t / 1e9
