"""polyop benchmarks: every stock op in every framework, against that framework's built-in op
for the same work, in the same process. Writes docs/benchmarks.md and PNG plots.

    .venv/bin/python bench/run.py              # full run (~15 min on 2 cores), writes docs/
    .venv/bin/python bench/run.py --quick      # small sizes, a few minutes; writes nothing by default
    .venv/bin/python bench/run.py --smoke      # CI's check that the harness still works

Each framework runs in its own subprocess (they never share a process) and reports JSON: once
at the framework's default thread count (the per-framework tables, the roofline), then, for
the thread-scaling table, once per count in SCALING_THREADS on the float32 throughput
workloads, the count set through the framework's own setting (`set_threads` in each
fw_<name>.py) and, for polyop's own rayon pool (TensorFlow, MindSpore), RAYON_NUM_THREADS.
The machine's roofs (copy bandwidth, matmul peak) are measured in one more subprocess first.
MindSpore's runs in `.venv-mindspore/bin/python` (or `$POLYOP_MINDSPORE_PYTHON`): it needs
numpy<2, see docs/mindspore.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from common import OPS, Result, half_ratios, make_workloads  # noqa: E402

KINDS = {"overhead", "throughput", "sweep", "models"}  # models: bench/ep_models.py (ONNX Runtime only)
FRAMEWORKS = ["torch", "tensorflow", "onnxruntime", "jax", "mindspore"]
MODULE = {"torch": "fw_torch", "tensorflow": "fw_tensorflow", "onnxruntime": "fw_onnxruntime", "jax": "fw_jax", "mindspore": "fw_mindspore"}
# The column next to the built-in on the overhead rows: the framework's own custom-op path.
CUSTOM = {"torch": ("torch.library.custom_op", "custom_op"), "mindspore": ('ops.Custom "pyfunc"', "Custom")}
# Thread counts of the scaling table (and of the measured roofs).
SCALING_THREADS = [1, 2]
# How each framework's thread count is set for a scaling run, and which pool polyop's kernels
# run on there (see adapters/<fw>/src/pool.rs); the report quotes this.
THREAD_CONTROL = {
    "torch": ("`torch.set_num_threads(n)`", "torch's intra-op pool (`torch_parallel_for`): follows `torch.set_num_threads`"),
    "tensorflow": (
        "`tf.config.threading.set_intra_op_parallelism_threads(n)` and `set_inter_op_parallelism_threads(n)` at start-up",
        "kernel-core's rayon pool (TF's C API exposes no pool): `RAYON_NUM_THREADS=n`",
    ),
    "onnxruntime": ("`SessionOptions.intra_op_num_threads = n`", "the session's intra-op pool (`KernelContext_ParallelFor`): follows `intra_op_num_threads`"),
    "jax": (
        "`NPROC=n` in the environment (XLA:CPU sizes its intra-op pool, the `tf_XLAEigen` threads, from it; there is no XLA flag for it)",
        "XLA's intra-op pool (`XLA_FFI_ThreadPool_Schedule`): follows `NPROC`",
    ),
    "mindspore": ("`mindspore.device_context.cpu.op_tuning.threads_num(n)`", "kernel-core's rayon pool (the AOT ABI offers no pool): `RAYON_NUM_THREADS=n`"),
}


def thread_env(framework: str, n: int) -> dict:
    """Environment of a scaling child at n threads: polyop's rayon pool (used where the
    framework lends none) and XLA's intra-op pool are sized at start-up from the environment."""
    env = {"RAYON_NUM_THREADS": str(n)}
    if framework == "jax":
        env["NPROC"] = str(n)
    return env


def interpreter(framework: str) -> str:
    """The Python a framework's child runs in: the conformance harness's rule
    ($POLYOP_<FW>_PYTHON, else the checkout's .venv-<fw> when there is one, else this one).
    A missing .venv-mindspore leaves this Python, whose failure to import MindSpore is
    reported as that framework's failure."""
    try:
        from polyop.conformance.isolated import interpreter as pick
    except ImportError:  # polyop not importable here: the children will say why
        return sys.executable
    return pick(framework)


def scaling_workloads(size: str, ops: list[str] | None) -> list:
    """The workloads of the thread-scaling table: the float32 throughput ones."""
    import numpy as np

    return [w for w in make_workloads(size, ops, ["throughput"]) if w.inputs[0].dtype == np.float32]


def child(framework: str, size: str, out: str, ops: list[str] | None, kinds: list[str] | None, threads: int | None) -> None:
    import importlib

    mod = importlib.import_module(MODULE[framework])
    setting = mod.set_threads(threads) if threads else None
    workloads = scaling_workloads(size, ops) if threads else make_workloads(size, ops, kinds)
    results = mod.run(workloads)
    by_key = {(w.op, w.kind, w.label): w for w in workloads}
    for r in results:  # the roofline's bytes and FLOPs, and the thread count set
        w = by_key[(r.op, r.kind, r.label)]
        r.bytes, r.flops, r.threads = w.bytes, w.flops, threads
    payload = {"results": [dataclasses.asdict(r) for r in results], "versions": mod.versions(), "thread_setting": setting}
    Path(out).write_text(json.dumps(payload))


def machine_child(out: str) -> None:
    from common import machine_limits

    Path(out).write_text(json.dumps(machine_limits(SCALING_THREADS)))


def measure_machine() -> dict:
    """The roofs (common.machine_limits), measured in a subprocess of this interpreter (torch's
    thread count is set there, once per count, and no framework is loaded next to it)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    print("== machine (copy bandwidth, matmul peak)", flush=True)
    proc = subprocess.run([sys.executable, __file__, "--machine", "--json", out])
    if proc.returncode != 0:
        raise SystemExit(f"measuring the machine's copy bandwidth and peak failed (exit code {proc.returncode})")
    data = json.loads(Path(out).read_text())
    os.unlink(out)
    for k in ("copy_gbps_by_threads", "peak_gflops_by_threads"):  # JSON keys are strings
        if k in data:
            data[k] = {int(n): v for n, v in data[k].items()}
    return data


def collect(
    frameworks: list[str], size: str, ops: list[str] | None, kinds: list[str] | None, threads: int | None = None
) -> tuple[list[Result], dict, dict]:
    results, versions, extra, failures, settings = [], {}, {}, {}, {}
    for fw in frameworks:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        print(f"== {fw}" + (f" ({threads} thread{'s' if threads > 1 else ''})" if threads else ""), flush=True)
        cmd = [interpreter(fw), __file__, "--child", fw, "--size", size, "--json", out]
        if ops:
            cmd += ["--ops", ",".join(ops)]
        if kinds:
            cmd += ["--kinds", ",".join(kinds)]
        env = None
        if threads:
            cmd += ["--threads", str(threads)]
            env = {**os.environ, **thread_env(fw, threads)}
        try:
            proc = subprocess.run(cmd, env=env)
        except OSError as e:  # e.g. $POLYOP_MINDSPORE_PYTHON names no interpreter
            failures[fw] = f"cannot start {cmd[0]}: {e.strerror}"
            continue
        if proc.returncode != 0:
            failures[fw] = f"exit code {proc.returncode}"
            continue
        data = json.loads(Path(out).read_text())
        results += [Result(**r) for r in data["results"]]
        versions.update(data["versions"])
        if data.get("thread_setting"):
            settings[fw] = data["thread_setting"]
        os.unlink(out)
    extra["failures"] = failures
    extra["thread_settings"] = settings
    return results, versions, extra


def fmt_rate(r: Result, seconds: float) -> str:
    if r.unit == "us":
        return f"{seconds * 1e6:.1f} us"
    return f"{r.rate(seconds):.2f} {r.unit}"


def roofs(machine: dict) -> tuple[float, str, float | None, str]:
    """The roofs the percentages use: (copy bandwidth GB/s, how measured, peak GFLOP/s or None,
    how measured): the highest of the measurements of each (the machine's best, all cores)."""
    copies = [(machine.get("copy_gbps", 0.0), "NumPy copy, 1 thread")]
    copies += [(v, f"torch `copy_`, {n} thread{'s' if n > 1 else ''}") for n, v in machine.get("copy_gbps_by_threads", {}).items()]
    if "copy_gbps_threads" in machine and not machine.get("copy_gbps_by_threads"):
        copies.append((machine["copy_gbps_threads"], "torch `copy_` on its intra-op threads"))
    bw, bw_how = max(copies)
    peaks = [(v, f"torch.mm, {n} thread{'s' if n > 1 else ''}") for n, v in machine.get("peak_gflops_by_threads", {}).items()]
    peak, peak_how = max(peaks) if peaks else (None, "not measured (it needs torch in the harness's Python; results saved before the roofline lack it)")
    return bw, bw_how, peak, peak_how


def percent_of_roof(r: Result, seconds: float, machine: dict) -> float | None:
    """r's achieved rate as a percentage of its roof: GB/s of the copy bandwidth, GFLOP/s of
    the matmul peak."""
    bw, _, peak, _ = roofs(machine)
    roof = bw if r.unit == "GB/s" else peak if r.unit == "GFLOP/s" else None
    return 100.0 * r.rate(seconds) / roof if roof else None


def by_threads(machine: dict, key: str) -> str:
    d = machine.get(key, {})
    return ", ".join(f"{d[n]:.1f} at {n} thread{'s' if n > 1 else ''}" for n in sorted(d))


def header_roofs(machine: dict) -> list[str]:
    bw, bw_how, peak, peak_how = roofs(machine)
    lines = [
        "- Memory-copy bandwidth (read+write counted; 64 MiB float32, median of 7): "
        f"{machine.get('copy_gbps', 0.0):.1f} GB/s single-threaded NumPy copy"
        + (f"; torch `copy_` {by_threads(machine, 'copy_gbps_by_threads')} GB/s" if machine.get("copy_gbps_by_threads") else "")
        + (f"; torch `copy_` on its intra-op threads {machine['copy_gbps_threads']:.1f} GB/s"
           if "copy_gbps_threads" in machine and not machine.get("copy_gbps_by_threads") else "")
        + f". **Reference: {bw:.1f} GB/s** ({bw_how}, the highest): the physical limit of the memory-bound ops.",
    ]
    if machine.get("peak_gflops_by_threads"):
        mm = machine.get("matmul", {"n": 2048, "repeats": 10})
        lines.append(
            f"- Peak float32 FLOP/s: a {mm['n']}x{mm['n']} float32 matmul through torch's BLAS (`torch.mm`, {machine.get('blas', 'BLAS')}),"
            f" best of {mm['repeats']} calls, 2n^3 FLOPs: {by_threads(machine, 'peak_gflops_by_threads')} GFLOP/s."
            f" **Reference: {peak:.1f} GFLOP/s** ({peak_how}, the highest): the limit of conv2d."
            f" Ridge point {peak / bw:.1f} FLOP/byte: a workload of lower arithmetic intensity is bound by memory."
        )
    else:
        lines.append(f"- Peak FLOP/s: {peak_how}.")
    return lines


def write_markdown(results, scaling, versions, extra, machine, size, path: Path, plots: list[str]) -> None:
    lines = [
        "# Benchmarks",
        "",
        "polyop's ops against each framework's own built-in op for the same work, timed in the same",
        "process, interleaved sample by sample (median of 7 samples, each long enough to be stable).",
        "**ratio = polyop throughput / built-in throughput** (for call overhead: built-in time /",
        "polyop time), so > 1.00 means polyop is faster. Ratios survive a noisy machine; absolute",
        "numbers do not.",
        "",
        f"- Re-run: `.venv/bin/python bench/run.py` (size `{size}`; `--quick` for a smoke run): every table and plot here.",
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}; Python {platform.python_version()}.",
        f"- Versions: {', '.join(f'{k} {v}' for k, v in versions.items())}.",
        *header_roofs(machine),
        "- The per-framework tables and the roofline run at each framework's default thread count;"
        " the thread-scaling table sets it (see there).",
        "",
    ]
    for p in plots:
        lines += [f"![{p}]({p})", ""]
    if extra.get("failures"):
        lines += ["**Frameworks that failed to run:** " + ", ".join(f"{k} ({v})" for k, v in extra["failures"].items()), ""]
    for fw in FRAMEWORKS:
        rows = [r for r in results if r.framework == fw and r.kind != "sweep"]
        if not rows:
            continue
        lines += [f"## {fw}", ""]
        head = "| op | kind | input | polyop | built-in | baseline | ratio |"
        sep = "|---|---|---|---|---|---|---|"
        if fw in CUSTOM:
            what, short = CUSTOM[fw]
            head += f" {what} | polyop / {short} time |"
            sep += "---|---|"
        lines += [head, sep]
        for r in rows:
            row = f"| {r.op} | {r.kind} | {r.label} | {fmt_rate(r, r.polyop_s)} | {fmt_rate(r, r.builtin_s)} | {r.baseline} | {r.ratio:.2f} |"
            if fw in CUSTOM:
                c = r.extra.get("custom_op_s")
                row += f" {c * 1e6:.1f} us | {r.polyop_s / c:.2f} |" if c else " | |"
            lines.append(row)
        lines.append("")
    lines += roofline_section(results, machine)
    lines += scaling_section(scaling, machine, extra)
    lines += half_section(results)
    if extra.get("ep_models"):
        import ep_models  # (imports onnxruntime: only when there is its section to write)

        lines += [ep_models.markdown(extra["ep_models"])]
    analysis = HERE / "analysis.md"  # hand-written reading of the numbers, kept across re-runs
    if analysis.exists():
        lines += [analysis.read_text()]
    path.write_text("\n".join(lines) + "\n")


def half_section(results) -> list[str]:
    """polyop's elements/s in float16 and bfloat16 against its own float32 on the same op (issue
    18: at least 1.00), with the built-in's same ratio beside it."""
    rows = half_ratios(results)
    if not rows:
        return []
    lines = ["## float16 and bfloat16 against float32", "",
             "Elements per second in the half type / elements per second in float32, the same op and",
             "shape, from the throughput rows above (`... f16` / `... bf16`): 1.00 means the half type",
             "moves as many elements per second as float32. polyop's float32 time here is its float32",
             "call timed in the same measurement as the half-type call, sample by sample (drift in the",
             "machine's speed between workloads does not land on the ratio); the built-in's is from its",
             "own float32 row.", "",
             "| framework | op | input | dtype | polyop half / f32 | built-in half / f32 |", "|---|---|---|---|---|---|"]
    for fw, op, label, dt, ours, theirs in rows:
        lines.append(f"| {fw} | {op} | {label} | {dt} | {ours:.2f} | {theirs:.2f} |")
    return lines + [""]


def _ordered(results, key):
    """The distinct keys of results, in first-seen order."""
    seen = {}
    for r in results:
        seen.setdefault(key(r), r)
    return list(seen.values())


def roofline_section(results, machine: dict) -> list[str]:
    rows = [r for r in results if r.kind == "throughput" and r.unit in ("GB/s", "GFLOP/s")]
    if not rows:
        return []
    bw, _, peak, _ = roofs(machine)
    fws = [fw for fw in FRAMEWORKS if any(r.framework == fw for r in rows)]
    lines = [
        "## Roofline",
        "",
        "Each throughput workload's achieved rate as a percentage of the machine's measured roof"
        f" (header): a memory-bound op's bytes per second of the copy bandwidth ({bw:.1f} GB/s),"
        + (f" conv2d's FLOP/s of the matmul peak ({peak:.1f} GFLOP/s)." if peak else " conv2d's FLOP/s of the peak (not measured).")
        + " Bytes: the least traffic of one call (every input read once, every output written once;"
        " `Workload.bytes`); FLOPs: nominal, one per arithmetic operation, comparison or elementary"
        " function of the op's definition (`FLOPS_PER_ELEM` in bench/common.py), 2 per"
        " multiply-add for conv2d; intensity = FLOPs / bytes. Cells: **polyop % / built-in %**, at"
        " each framework's default thread count (the rates of the tables above). The copy runs"
        " into a buffer allocated once; an op whose framework allocates a fresh output every call"
        " (torch, JAX) also pays first-touch page faults, which no kernel avoids.",
        "",
        "| op | input | MB | MFLOP | FLOP/byte | roof | " + " | ".join(fws) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(fws),
    ]
    for w in _ordered(rows, lambda r: (r.op, r.label)):
        ai = w.flops / w.bytes if w.bytes else float("nan")
        roof = f"copy {bw:.1f} GB/s" if w.unit == "GB/s" else (f"peak {peak:.1f} GFLOP/s" if peak else "peak: n/a")
        cells = []
        for fw in fws:
            m = [r for r in rows if r.framework == fw and r.op == w.op and r.label == w.label]
            if not m:
                cells.append("")
                continue
            pp, pb = percent_of_roof(m[0], m[0].polyop_s, machine), percent_of_roof(m[0], m[0].builtin_s, machine)
            cells.append(f"{pp:.0f}% / {pb:.0f}%" if pp is not None else "n/a")
        lines.append(f"| {w.op} | {w.label} | {w.bytes / 1e6:.1f} | {w.flops / 1e6:.1f} | {ai:.3g} | {roof} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def scaling_section(scaling, machine: dict, extra: dict) -> list[str]:
    if not scaling:
        return []
    counts = sorted({r.threads for r in scaling})
    lo, hi = counts[0], counts[-1]
    t = lambda n: f"{n} thread{'s' if n > 1 else ''}"  # noqa: E731
    settings = extra.get("thread_settings_by_count", {})
    lines = [
        f"## Thread scaling ({lo} to {hi} threads)",
        "",
        f"The float32 throughput workloads again, each framework in a fresh process per thread count"
        f" ({', '.join(map(str, counts))}), the count set at start-up; same timing as above. speed-up ="
        f" rate at {t(hi)} / rate at {t(lo)}. What sets the count, and the pool polyop's kernels run on"
        " (adapters/<framework>/src/pool.rs):",
        "",
        "| framework | built-in's threads | polyop's threads | set, as reported |",
        "|---|---|---|---|",
    ]
    for fw in FRAMEWORKS:
        if not any(r.framework == fw for r in scaling):
            continue
        builtin, ours = THREAD_CONTROL[fw]
        got = "; ".join(f"{n}: {settings[str(n)][fw]}" for n in counts if fw in settings.get(str(n), {}))
        lines.append(f"| {fw} | {builtin} | {ours} | {got} |")
    lines.append("")
    roof = []
    for key, what, unit in [("copy_gbps_by_threads", "torch `copy_` bandwidth", "GB/s"), ("peak_gflops_by_threads", "matmul peak", "GFLOP/s")]:
        d = machine.get(key, {})
        if lo in d and hi in d:
            roof.append(f"{what} {d[lo]:.1f} -> {d[hi]:.1f} {unit} ({d[hi] / d[lo]:.2f}x)")
    if roof:
        lines += [f"The roofs themselves, {t(lo)} -> {t(hi)}: " + "; ".join(roof) + ".", ""]
    head = "| framework | op | input | " + " | ".join(f"polyop {t(n)}" for n in counts) + " | polyop speed-up | "
    head += " | ".join(f"built-in {t(n)}" for n in counts) + " | built-in speed-up |"
    lines += [head, "|---|---|---|" + "---|" * (2 * len(counts) + 2)]
    for fw in FRAMEWORKS:
        for w in _ordered([r for r in scaling if r.framework == fw], lambda r: (r.op, r.label)):
            at = {r.threads: r for r in scaling if r.framework == fw and r.op == w.op and r.label == w.label}
            cells = [w.framework, w.op, w.label]
            for side in ("polyop_s", "builtin_s"):
                cells += [fmt_rate(at[n], getattr(at[n], side)) if n in at else "" for n in counts]
                cells.append(f"{getattr(at[lo], side) / getattr(at[hi], side):.2f}x" if lo in at and hi in at else "")
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def plot(results, outdir: Path, machine: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=False)
    for ax, kind in zip(axes, ["overhead", "throughput"]):
        ops = sorted({r.op for r in results if r.kind == kind}, key=lambda o: o)
        width = 0.8 / len(FRAMEWORKS)
        for i, fw in enumerate(FRAMEWORKS):
            vals = []
            for op in ops:
                m = [r.ratio for r in results if r.framework == fw and r.op == op and r.kind == kind]
                vals.append(m[0] if m else 0)
            ax.bar([j + i * width for j in range(len(ops))], vals, width, label=fw)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ops))])
        ax.set_xticklabels(ops, rotation=45, ha="right")
        ax.set_title(f"{kind}: polyop / built-in (higher is better)")
        ax.set_yscale("log")  # ratios: 0.5x and 2x sit symmetrically around parity
        ax.set_ylabel("ratio (log scale)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(outdir / "bench_ratios.png", dpi=90)
    names.append("img/bench_ratios.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 5))
    for fw in FRAMEWORKS:
        rows = sorted((r for r in results if r.framework == fw and r.kind == "sweep"), key=lambda r: int(r.label))
        if rows:
            ax.plot([int(r.label) for r in rows], [r.rate(r.polyop_s) for r in rows], "o-", label=f"polyop in {fw}")
            ax.plot([int(r.label) for r in rows], [r.rate(r.builtin_s) for r in rows], "x--", label=f"{fw} built-in")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements")
    ax.set_ylabel("GB/s")
    ax.set_title("add (float32): throughput against input size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(outdir / "bench_sweep.png", dpi=90)
    names.append("img/bench_sweep.png")
    plt.close(fig)

    names.append(plot_roofline(plt, results, outdir, machine))
    return names


def plot_roofline(plt, results, outdir: Path, machine: dict) -> str:
    """Achieved GFLOP/s against arithmetic intensity (log-log) for every throughput workload,
    polyop (filled) and built-in (hollow), one colour per framework, under the measured roof
    min(peak, intensity x copy bandwidth)."""
    import math

    bw, bw_how, peak, peak_how = roofs(machine)
    rows = [r for r in results if r.kind == "throughput" and r.bytes and r.flops]
    fig, ax = plt.subplots(figsize=(10, 6))
    ais = [r.flops / r.bytes for r in rows] or [0.1, 100.0]
    lo, hi = min(ais) / 2, max(max(ais) * 2, (peak or 0) / bw * 4)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ys = [min(peak, x * bw) if peak else x * bw for x in xs]
    ax.plot(xs, ys, "k-", lw=1.5, label=f"roof: copy {bw:.1f} GB/s" + (f", peak {peak:.0f} GFLOP/s" if peak else ""))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, fw in enumerate(FRAMEWORKS):
        mine = [r for r in rows if r.framework == fw]
        if not mine:
            continue
        c = colors[i % len(colors)]
        # a small sideways offset per framework keeps the points of one workload apart
        off = 2 ** ((i - (len(FRAMEWORKS) - 1) / 2) * 0.06)
        x = [r.flops / r.bytes * off for r in mine]
        ax.scatter(x, [r.flops / r.polyop_s / 1e9 for r in mine], color=c, marker="o", s=30, label=f"polyop in {fw}", zorder=3)
        ax.scatter(x, [r.flops / r.builtin_s / 1e9 for r in mine], facecolors="none", edgecolors=c, marker="s", s=30,
                   label=f"{fw} built-in", zorder=3)
    # which workloads sit at which intensity
    at: dict = {}
    for r in _ordered(rows, lambda r: (r.op, r.label)):
        at.setdefault(round(r.flops / r.bytes, 4), []).append(r.op + (" tanh" if "tanh" in r.label else ""))
    top = max([r.flops / min(r.polyop_s, r.builtin_s) / 1e9 for r in rows] + [peak or 0, 1.0])
    for ai, ops in at.items():
        ax.axvline(ai, color="0.85", lw=0.6, zorder=0)
        names = [o + (f" x{ops.count(o)}" if ops.count(o) > 1 else "") for o in dict.fromkeys(ops)]
        ax.text(ai, top * 1.6, ", ".join(names), rotation=90, fontsize=7, ha="center", va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(top=top * 12)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (nominal FLOPs / least bytes moved)")
    ax.set_ylabel("achieved GFLOP/s (nominal)")
    ax.set_title("Roofline: throughput workloads, each framework at its default threads" + ("" if peak else " (peak not measured)"))
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(outdir / "bench_roofline.png", dpi=90)
    plt.close(fig)
    return "img/bench_roofline.png"


def run_ep_models(size: str, smoke: bool, failures: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "ep_models.json"
        flag = ["--smoke"] if smoke else ["--quick"] if size == "quick" else []
        proc = subprocess.run([sys.executable, str(HERE / "ep_models.py"), *flag, "--json", str(out)],
                              stdout=subprocess.DEVNULL)
        if proc.returncode != 0 or not out.exists():
            failures["onnxruntime models"] = f"bench/ep_models.py exit {proc.returncode}"
            return []
        return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (about 5 minutes for all frameworks)")
    ap.add_argument("--smoke", action="store_true", help="small sizes and very short timings: checks the harness (CI)")
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--ops", help="comma-separated ops to run (default: all); a partial run writes no docs unless --out is given")
    ap.add_argument("--kinds", help="comma-separated workload kinds (overhead, throughput, sweep; default: all); like --ops")
    ap.add_argument("--out", help="markdown output (default docs/benchmarks.md for a full run, none for --quick)")
    ap.add_argument("--save", help="also save the raw results as JSON here")
    ap.add_argument("--merge", nargs="+", help="render docs from saved JSON files (no measuring)")
    ap.add_argument("--no-scaling", action="store_true", help="skip the thread-scaling runs")
    ap.add_argument("--child")
    ap.add_argument("--machine", action="store_true")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--size")
    ap.add_argument("--json")
    args = ap.parse_args()
    ops = args.ops.split(",") if args.ops else None
    if ops:
        unknown = sorted(set(ops) - set(OPS))
        if unknown:
            ap.error(f"unknown ops {unknown}; known: {', '.join(OPS)}")
    kinds = args.kinds.split(",") if args.kinds else None
    if kinds and set(kinds) - KINDS:
        ap.error(f"unknown kinds {sorted(set(kinds) - KINDS)}; known: {', '.join(sorted(KINDS))}")
    if args.child:
        child(args.child, args.size, args.json, ops, kinds, args.threads)
        return 0
    if args.machine:
        machine_child(args.json)
        return 0
    if args.smoke:
        os.environ["POLYOP_BENCH_SMOKE"] = "1"  # inherited by the per-framework subprocesses
    size = "quick" if (args.quick or args.smoke) else "full"
    if args.merge:
        # Frameworks measured in separate invocations, rendered as one report.
        results, scaling, versions, extra, machine = [], [], {}, {"failures": {}}, {}
        for f in args.merge:
            d = json.loads(Path(f).read_text())
            results += [Result(**r) for r in d["results"]]
            scaling += [Result(**r) for r in d.get("scaling", [])]
            versions.update(d["versions"])
            for k, v in d["extra"].items():
                if k == "failures":
                    extra["failures"].update(v)
                elif k == "thread_settings_by_count":
                    for n, per_fw in v.items():
                        extra.setdefault(k, {}).setdefault(n, {}).update(per_fw)
                else:
                    extra[k] = v
            m = d.get("machine") or {"copy_gbps": d.get("copy_gbps", 0.0)}  # files from before the roofline
            if "machine" not in d and "copy_gbps_threads" in d["extra"]:
                m["copy_gbps_threads"] = d["extra"]["copy_gbps_threads"]
            for k in ("copy_gbps_by_threads", "peak_gflops_by_threads"):
                if k in m:
                    m[k] = {int(n): v for n, v in m[k].items()}
            if m.get("copy_gbps", 0.0) >= machine.get("copy_gbps", 0.0):
                machine = {**machine, **m}
            size = d["size"]
        if any(not r.bytes for r in results + scaling):  # saved before Workload.bytes/.flops
            known = {(w.op, w.kind, w.label): w for w in make_workloads(size)}
            for r in results + scaling:
                w = known.get((r.op, r.kind, r.label))
                if w and not r.bytes:
                    r.bytes, r.flops = w.bytes, w.flops
    else:
        frameworks = args.frameworks.split(",")
        machine = measure_machine()
        results, versions, extra = collect(frameworks, size, ops, kinds)
        scaling = []
        if not args.no_scaling and (kinds is None or "throughput" in kinds):
            # The thread-scaling table: the float32 throughput workloads at each count.
            extra["thread_settings_by_count"] = {}
            for n in SCALING_THREADS:
                res, _, ext = collect(frameworks, size, ops, ["throughput"], threads=n)
                scaling += res
                extra["thread_settings_by_count"][str(n)] = ext["thread_settings"]
                for fw, why in ext["failures"].items():
                    extra["failures"][f"{fw} at {n} thread{'s' if n > 1 else ''}"] = why
        extra.pop("thread_settings", None)
        if "onnxruntime" in frameworks and not ops and (kinds is None or "models" in kinds):
            # whole models with and without polyop's execution provider, in their own process
            extra["ep_models"] = run_ep_models(size, args.smoke, extra["failures"])
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(
            json.dumps(
                {
                    "results": [dataclasses.asdict(r) for r in results],
                    "scaling": [dataclasses.asdict(r) for r in scaling],
                    "versions": versions,
                    "extra": extra,
                    "machine": machine,
                    "size": size,
                }
            )
        )
    out = args.out or (None if (args.quick or args.smoke or ops or kinds) else str(ROOT / "docs" / "benchmarks.md"))
    for r in results:
        print(f"{r.framework:12s} {r.op:9s} {r.kind:10s} {r.label:24s} ratio {r.ratio:5.2f}")
    for r in scaling:
        print(f"{r.framework:12s} {r.op:9s} {r.threads} thread(s) {r.label:24s} polyop {fmt_rate(r, r.polyop_s)}, built-in {fmt_rate(r, r.builtin_s)}")
    if out:
        outp = Path(out)
        img = outp.parent / "img"
        img.mkdir(parents=True, exist_ok=True)
        plots = plot(results, img, machine)
        write_markdown(results, scaling, versions, extra, machine, size, outp, plots)
        print(f"wrote {outp}")
    if extra["failures"]:
        print("FAILED frameworks:", extra["failures"])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
