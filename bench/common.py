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
from typing import Callable, Iterator

import numpy as np

# Input sizes. "quick" keeps CI's smoke run to seconds; "full" is what docs/benchmarks.md reports.
SIZES = {
    "quick": dict(tiny=8, big=1 << 16, rows=64, row_len=1024, long=(4, 1 << 14), conv=(1, 16, 28, 28, 16), conv_batch=1, sweep=[1 << 10, 1 << 14, 1 << 16]),
    "full": dict(tiny=8, big=1 << 24, rows=16384, row_len=1024, long=(64, 1 << 16), conv=(1, 64, 56, 56, 64), conv_batch=8, sweep=[1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24]),
}

OPS = ["negate", "add", "scale", "relu", "add_relu", "gelu", "softmax", "rms_norm", "topk", "conv2d", "nonzero"]


# Nominal FLOPs per element of the op's (first) input, for the roofline's arithmetic intensity:
# every arithmetic operation, comparison and elementary function (exp, erf, tanh, rsqrt) of the
# op's mathematical definition counts one, whatever a kernel spends on it (a polynomial exp is
# ~15 instructions). conv2d counts 2 per multiply-add (see `work_of`).
FLOPS_PER_ELEM = {
    "negate": 1,  # -x
    "add": 1,  # x + y
    "scale": 1,  # alpha * x
    "relu": 1,  # max(x, 0)
    "add_relu": 2,  # max(x + y, 0)
    "gelu": 5,  # exact: 0.5 * x * (1 + erf(x / sqrt 2)); tanh form: 9, see work_of
    "softmax": 5,  # max, x - max, exp, sum, * 1/sum
    "rms_norm": 4,  # x * x, sum, * rsqrt(mean + eps), * w
    "topk": 1,  # one comparison per element
    "nonzero": 1,  # one comparison per element
}


def work_of(op: str, inputs: list, attrs: dict) -> tuple[float, float]:
    """(bytes, FLOPs) of one call: bytes = the least memory traffic (every input read once, every
    output written once, at the inputs' dtype); FLOPs as in FLOPS_PER_ELEM. Used where a workload
    does not state them. topk's and nonzero's outputs are left out (k values per row; the
    indices depend on the data)."""
    x = inputs[0]
    ins = sum(a.nbytes for a in inputs if a is not None)
    if op == "conv2d":
        nb, _, h, w = x.shape
        o, cg, kh, kw = inputs[1].shape  # cg: input channels per group

        def pair(v):
            return tuple(v) * (2 // len(v)) if isinstance(v, (list, tuple)) else (v, v)

        (sh, sw), (ph, pw), (dh, dw) = (pair(attrs.get(k, d)) for k, d in [("stride", 1), ("padding", 0), ("dilation", 1)])
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        return float(ins + nb * o * oh * ow * x.itemsize), 2.0 * nb * o * oh * ow * cg * kh * kw
    out = 0 if op in ("topk", "nonzero") else x.nbytes  # the rest: one output shaped as x
    per = 9 if op == "gelu" and attrs.get("approximate") == "tanh" else FLOPS_PER_ELEM.get(op, 1)
    return float(ins + out), float(per * x.size)


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


#: Result.extra key of a half-type throughput result's float32 twin, timed by polyop in the
#: same `measure` (see `measure_workloads`).
PAIRED_F32 = "polyop_f32_s"


def f32_label(r) -> str | None:
    """The label of a half-type throughput workload's (or result's) float32 twin: its own
    without the dtype suffix (`"64x65536 f16"` -> `"64x65536"`); None for anything else."""
    dt = dtype_of(r.label)
    if r.kind != "throughput" or dt == "f32":
        return None
    return r.label[: -len(dt) - 1]


def half_ratios(results: list) -> list[tuple[str, str, str, str, float, float]]:
    """(framework, op, f32 label, dtype, polyop's elements/s in dtype / polyop's in f32, the
    built-in's same ratio) for every half-type throughput result with an f32 twin. polyop's
    ratio uses the float32 time taken in the same `measure` where the result has one
    (`PAIRED_F32`: the two interleaved sample by sample, so drift in the machine's speed between
    workloads does not land on the ratio), else the twin's own result."""
    f32 = {(r.framework, r.op, r.label): r for r in results if r.kind == "throughput" and dtype_of(r.label) == "f32"}
    out = []
    for r in results:
        label = f32_label(r)
        base = None if label is None else f32.get((r.framework, r.op, label))
        if base is not None:
            dt = dtype_of(r.label)
            p32 = r.extra.get(PAIRED_F32, base.polyop_s)
            out.append((r.framework, r.op, base.label, dt, p32 / r.polyop_s, base.builtin_s / r.builtin_s))
    return out


def measure_workloads(
    workloads: list,
    calls: Callable[[object], dict | None],
    **kw,
) -> Iterator[tuple[object, dict[str, float], dict]]:
    """`measure(calls(w), **kw)` for each workload `w` (`calls` returns the callables by name,
    "polyop" and "builtin" at least, or None to skip `w`): yields (w, times, extra). A half-type
    throughput workload whose float32 twin (same op, label without the dtype) is in the list also
    times the twin's "polyop" callable in the same `measure`, as extra[PAIRED_F32], so its
    elements-per-second ratio to float32 (`half_ratios`) compares two times taken together."""
    f32 = {(w.op, w.label): w for w in workloads if w.kind == "throughput" and dtype_of(w.label) == "f32"}
    for w in workloads:
        fns = calls(w)
        if fns is None:
            continue
        label = f32_label(w)
        twin = None if label is None else f32.get((w.op, label))
        twin_fns = calls(twin) if twin is not None else None
        if twin_fns is not None:
            fns["polyop_f32"] = twin_fns["polyop"]
        t = measure(fns, **kw)
        extra = {PAIRED_F32: t.pop("polyop_f32")} if "polyop_f32" in t else {}
        yield w, t, extra


@dataclasses.dataclass
class Workload:
    """One op on one input set. `work` is what its rate is quoted in: bytes moved (memory-bound
    ops) or FLOPs (conv2d). `bytes` and `flops` are both, for the roofline (percent of the
    measured copy bandwidth or peak, arithmetic intensity); `work_of` fills the ones not given
    (`bytes` is `work` for a GB/s workload, `flops` is `work` for a GFLOP/s one)."""

    op: str
    kind: str  # "overhead" | "throughput" | "sweep"
    label: str
    inputs: list  # numpy arrays (None for absent optionals)
    attrs: dict
    work: float
    unit: str  # "GB/s" | "GFLOP/s" | "us"
    bytes: float | None = None
    flops: float | None = None

    def __post_init__(self):
        b, f = work_of(self.op, self.inputs, self.attrs)
        if self.bytes is None:
            self.bytes = self.work if self.unit == "GB/s" else b
        if self.flops is None:
            self.flops = self.work if self.unit == "GFLOP/s" else f


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
    bytes: float = 0.0  # the workload's (Workload.bytes, .flops), for the roofline
    flops: float = 0.0
    threads: int | None = None  # the thread count set for the run (None: the framework's default)

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
    # ResNet-50 stage-1 layers (issue 18): the 3x3 and the two 1x1 convolutions of a
    # bottleneck block, batch 8 (1 for --quick).
    nb = s["conv_batch"]
    for c, o, k in [(64, 64, 3), (256, 64, 1), (64, 256, 1)]:
        xi = rng.standard_normal((nb, c, 56, 56)).astype(f32)
        wi = (rng.standard_normal((o, c, k, k)) * 0.1).astype(f32)
        bi = rng.standard_normal(o).astype(f32)
        flops = 2.0 * nb * o * 56 * 56 * c * k * k
        w.append(Workload("conv2d", "throughput", f"{nb}x{c}x56x56 {k}x{k} -> {o}", [xi, wi, bi], {"stride": 1, "padding": k // 2}, flops, "GFLOP/s"))
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
    pause: float = 0.0,
) -> dict[str, float]:
    """Median seconds per call of each callable. Calls are batched so each sample lasts at
    least min_time/repeats, and the callables are interleaved sample by sample so drift in the
    machine's speed hits them equally. `sync`, for a framework that runs ops asynchronously
    (MindSpore's PyNative mode), waits for the queued work and is timed at the end of every
    batch: a batch's time is then that of its calls run to completion, back to back. `pause`:
    seconds to wait, untimed, before each batch, for callables that leave threads spinning
    after they return (ONNX Runtime sessions: each has its own intra-op pool, whose threads
    spin for a while after a run and would share the cores with the next batch's)."""
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
                if pause:
                    time.sleep(pause)
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                sync()
                samples[name].append((time.perf_counter() - t0) / n)
    finally:
        gc.enable()
    return {k: statistics.median(v) for k, v in samples.items()}


# The matmul of the peak-FLOP/s measurement: n x n float32, best of `repeats` calls.
MATMUL = {"n": 256, "repeats": 3} if SMOKE else {"n": 2048, "repeats": 10}


def matmul_peak(torch, n: int, repeats: int) -> float:
    """Best GFLOP/s of an n x n float32 matmul through torch's BLAS (`torch.mm`) on torch's
    current thread count: the best of `repeats` single calls (the machine's peak is the best it
    reached, not the typical), each counted as 2 n^3 FLOPs."""
    import time

    a, b = torch.rand(n, n), torch.rand(n, n)
    c = torch.empty(n, n)
    for _ in range(2):
        torch.mm(a, b, out=c)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9


def machine_limits(threads: list[int]) -> dict:
    """The machine's measured limits, the roofs of docs/benchmarks.md: `copy_gbps`, NumPy's
    single-threaded copy; with torch, for each thread count in `threads` (torch.set_num_threads),
    `copy_gbps_by_threads` (torch `copy_` of 64 MiB, read + write counted, median of 7) and
    `peak_gflops_by_threads` (`matmul_peak`); and `copy_gbps_threads`, torch `copy_` on torch's
    default thread count, as before."""
    out: dict = {"copy_gbps": copy_bandwidth()}
    try:
        import torch
    except ImportError:  # the roofs of the report then say "not measured"
        return out
    default = torch.get_num_threads()
    out["copy_gbps_threads"] = torch_copy_bandwidth(torch)
    out["default_threads"] = default
    out["blas"] = "MKL" if torch.backends.mkl.is_available() else "torch's BLAS"
    out["matmul"] = MATMUL
    copy, peak = {}, {}
    for n in threads:
        torch.set_num_threads(n)
        copy[n] = torch_copy_bandwidth(torch)
        peak[n] = matmul_peak(torch, **MATMUL)
    torch.set_num_threads(default)
    out["copy_gbps_by_threads"], out["peak_gflops_by_threads"] = copy, peak
    return out


def torch_copy_bandwidth(torch, nbytes: int = 1 << 26) -> float:
    """torch `copy_` bandwidth in GB/s on torch's current thread count (read + write counted)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    t = measure({"copy": lambda: dst.copy_(src)}, min_time=0.5)["copy"]
    return 2.0 * nbytes / t / 1e9


def copy_bandwidth(nbytes: int = 1 << 26) -> float:
    """Measured memory-copy bandwidth in GB/s (read + write counted), the physical limit for the
    memory-bound ops."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    t = measure({"copy": lambda: np.copyto(dst, src)}, min_time=0.5)["copy"]
    return 2.0 * nbytes / t / 1e9
