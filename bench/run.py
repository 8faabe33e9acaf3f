"""polyop benchmarks: every stock op in every framework, against that framework's built-in op
for the same work, in the same process. Writes docs/benchmarks.md and PNG plots.

    .venv/bin/python bench/run.py              # full run (~15 min on 2 cores), writes docs/
    .venv/bin/python bench/run.py --quick      # small sizes, a few minutes; writes nothing by default
    .venv/bin/python bench/run.py --smoke      # CI's check that the harness still works

Each framework runs in its own subprocess (they never share a process) and reports JSON.
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

from common import OPS, Result, copy_bandwidth, make_workloads  # noqa: E402

KINDS = {"overhead", "throughput", "sweep"}
FRAMEWORKS = ["torch", "tensorflow", "onnxruntime", "jax", "mindspore"]
MODULE = {"torch": "fw_torch", "tensorflow": "fw_tensorflow", "onnxruntime": "fw_onnxruntime", "jax": "fw_jax", "mindspore": "fw_mindspore"}
# The column next to the built-in on the overhead rows: the framework's own custom-op path.
CUSTOM = {"torch": ("torch.library.custom_op", "custom_op"), "mindspore": ('ops.Custom "pyfunc"', "Custom")}


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


def child(framework: str, size: str, out: str, ops: list[str] | None, kinds: list[str] | None) -> None:
    import importlib

    mod = importlib.import_module(MODULE[framework])
    results = mod.run(make_workloads(size, ops, kinds))
    payload = {"results": [dataclasses.asdict(r) for r in results], "versions": mod.versions()}
    if framework == "torch":
        payload["copy_gbps_threads"] = mod.copy_bandwidth_threads()
    Path(out).write_text(json.dumps(payload))


def collect(
    frameworks: list[str], size: str, ops: list[str] | None, kinds: list[str] | None
) -> tuple[list[Result], dict, dict]:
    results, versions, extra, failures = [], {}, {}, {}
    for fw in frameworks:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        print(f"== {fw}", flush=True)
        cmd = [interpreter(fw), __file__, "--child", fw, "--size", size, "--json", out]
        if ops:
            cmd += ["--ops", ",".join(ops)]
        if kinds:
            cmd += ["--kinds", ",".join(kinds)]
        try:
            proc = subprocess.run(cmd)
        except OSError as e:  # e.g. $POLYOP_MINDSPORE_PYTHON names no interpreter
            failures[fw] = f"cannot start {cmd[0]}: {e.strerror}"
            continue
        if proc.returncode != 0:
            failures[fw] = f"exit code {proc.returncode}"
            continue
        data = json.loads(Path(out).read_text())
        results += [Result(**r) for r in data["results"]]
        versions.update(data["versions"])
        if "copy_gbps_threads" in data:
            extra["copy_gbps_threads"] = data["copy_gbps_threads"]
        os.unlink(out)
    extra["failures"] = failures
    return results, versions, extra


def fmt_rate(r: Result, seconds: float) -> str:
    if r.unit == "us":
        return f"{seconds * 1e6:.1f} us"
    return f"{r.rate(seconds):.2f} {r.unit}"


def write_markdown(results, versions, extra, copy_gbps, size, path: Path, plots: list[str]) -> None:
    lines = [
        "# Benchmarks",
        "",
        "polyop's ops against each framework's own built-in op for the same work, timed in the same",
        "process, interleaved sample by sample (median of 7 samples, each long enough to be stable).",
        "**ratio = polyop throughput / built-in throughput** (for call overhead: built-in time /",
        "polyop time), so > 1.00 means polyop is faster. Ratios survive a noisy machine; absolute",
        "numbers do not.",
        "",
        f"- Re-run: `.venv/bin/python bench/run.py` (size `{size}`; `--quick` for a smoke run).",
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}; Python {platform.python_version()}.",
        f"- Versions: {', '.join(f'{k} {v}' for k, v in versions.items())}.",
        f"- Memory-copy bandwidth (read+write): {copy_gbps:.1f} GB/s single-threaded NumPy copy"
        + (f", {extra['copy_gbps_threads']:.1f} GB/s torch `copy_` on its intra-op threads" if "copy_gbps_threads" in extra else "")
        + ": the physical limit for the memory-bound ops.",
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
    analysis = HERE / "analysis.md"  # hand-written reading of the numbers, kept across re-runs
    if analysis.exists():
        lines += [analysis.read_text()]
    path.write_text("\n".join(lines) + "\n")


def plot(results, outdir: Path) -> list[str]:
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
    return names


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
    ap.add_argument("--child")
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
        child(args.child, args.size, args.json, ops, kinds)
        return 0
    if args.smoke:
        os.environ["POLYOP_BENCH_SMOKE"] = "1"  # inherited by the per-framework subprocesses
    size = "quick" if (args.quick or args.smoke) else "full"
    if args.merge:
        # Frameworks measured in separate invocations, rendered as one report.
        results, versions, extra, copy_gbps = [], {}, {"failures": {}}, 0.0
        for f in args.merge:
            d = json.loads(Path(f).read_text())
            results += [Result(**r) for r in d["results"]]
            versions.update(d["versions"])
            extra.update({k: v for k, v in d["extra"].items() if k != "failures"})
            extra["failures"].update(d["extra"].get("failures", {}))
            copy_gbps = max(copy_gbps, d["copy_gbps"])
            size = d["size"]
    else:
        results, versions, extra = collect(args.frameworks.split(","), size, ops, kinds)
        copy_gbps = copy_bandwidth()
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(
            json.dumps(
                {
                    "results": [dataclasses.asdict(r) for r in results],
                    "versions": versions,
                    "extra": extra,
                    "copy_gbps": copy_gbps,
                    "size": size,
                }
            )
        )
    out = args.out or (None if (args.quick or args.smoke or ops or kinds) else str(ROOT / "docs" / "benchmarks.md"))
    for r in results:
        print(f"{r.framework:12s} {r.op:9s} {r.kind:10s} {r.label:24s} ratio {r.ratio:5.2f}")
    if out:
        outp = Path(out)
        img = outp.parent / "img"
        img.mkdir(parents=True, exist_ok=True)
        plots = plot(results, img)
        write_markdown(results, versions, extra, copy_gbps, size, outp, plots)
        print(f"wrote {outp}")
    if extra["failures"]:
        print("FAILED frameworks:", extra["failures"])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
