"""The benchmark harness still works end to end (CI runs it in smoke mode: tiny sizes and
short timings, so no number here means anything and nothing asserts a time)."""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OPS = {"negate", "add", "scale", "relu", "add_relu", "gelu", "softmax", "rms_norm", "topk", "conv2d", "nonzero"}


def test_bench_smoke_covers_every_op_and_framework(tmp_path):
    out = tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--out", str(out), "--save", str(tmp_path / "raw.json")],
        capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    # Every half-type throughput result carries its float32 twin's polyop time from the same
    # `measure` (the half-type ratios divide by it: paired, not minutes apart).
    raw = json.loads((tmp_path / "raw.json").read_text())["results"]
    half = [r for r in raw if r["kind"] == "throughput" and r["label"].endswith((" f16", " bf16"))]
    assert {r["framework"] for r in half} == {"torch", "tensorflow", "jax", "mindspore"}, half
    for r in half:
        assert r["extra"].get("polyop_f32_s", 0) > 0, r
    # whole models with and without the ONNX Runtime execution provider (bench/ep_models.py)
    models = text.split("## ONNX Runtime execution provider: whole models\n", 1)[1].split("\n## ", 1)[0]
    row = next(r for r in models.splitlines() if r.startswith("| squeezenet |"))
    claimed, claimable = (int(v) for v in row.split("|")[2].split("/"))
    assert claimed == claimable > 0, row
    assert math.isfinite(float(row.split("|")[5])) and float(row.split("|")[5]) > 0, row
    # (and against the CPU provider in polyop's NCHW layout, its blocked-layout pass off)
    assert math.isfinite(float(row.split("|")[7])) and float(row.split("|")[7]) > 0, row
    assert any(r.startswith("| transformer block") for r in models.splitlines()), models
    measured = {}  # framework -> {(op, input label)} of its throughput rows
    for fw in ["torch", "tensorflow", "onnxruntime", "jax", "mindspore"]:
        section = text.split(f"## {fw}\n", 1)[1].split("\n## ", 1)[0]
        rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| op ")]
        measured[fw] = {(r.split("|")[1].strip(), r.split("|")[3].strip()) for r in rows if "| throughput |" in r}
        ops = {r.split("|")[1].strip() for r in rows}
        # XLA needs static shapes, so nonzero is refused there by design.
        expected = OPS - {"nonzero"} if fw == "jax" else OPS
        assert ops == expected, (fw, sorted(expected - ops))
        for r in rows:
            ratio = float(r.split("|")[7])
            assert math.isfinite(ratio) and ratio > 0, r
        # The framework's own custom-op path, on the overhead rows: every op for torch's
        # custom_op, the elementwise ones for MindSpore's "pyfunc" Custom op.
        custom = {"torch": OPS, "mindspore": {"negate", "add", "scale", "relu", "add_relu"}}.get(fw, set())
        for r in rows:
            if "| overhead |" in r and r.split("|")[1].strip() in custom:
                assert re.search(r"\d+\.\d+ us \| \d+\.\d+ \|$", r), (fw, r)
    # The roofs: measured copy bandwidth and peak FLOP/s, each with its reference.
    assert re.search(r"Memory-copy bandwidth .* \*\*Reference: \d+\.\d GB/s\*\*", text), text[:3000]
    assert re.search(r"Peak float32 FLOP/s: .*torch\.mm.* \*\*Reference: \d+\.\d GFLOP/s\*\*", text), text[:3000]
    # The roofline: every throughput workload, polyop % / built-in % of its roof per framework.
    section = text.split("## Roofline\n", 1)[1].split("\n## ", 1)[0]
    head = next(r for r in section.splitlines() if r.startswith("| op |"))
    fws = [c.strip() for c in head.split("|")[7:-1]]
    assert fws == ["torch", "tensorflow", "onnxruntime", "jax", "mindspore"], head
    rows = [r.split("|")[1:-1] for r in section.splitlines() if r.startswith("| ") and not r.startswith("| op ")]
    assert {r[0].strip() for r in rows} == OPS, rows
    for r in rows:
        assert float(r[2]) > 0 and float(r[3]) > 0 and float(r[4]) > 0, r  # MB, MFLOP, FLOP/byte
        assert r[5].strip().startswith("peak " if r[0].strip() == "conv2d" else "copy "), r
        for fw, cell in zip(fws, r[6:]):
            # a figure exactly where the framework measured the workload (XLA refuses nonzero;
            # ONNX Runtime's CPU provider lacks most half-type kernels), blank elsewhere
            if (r[0].strip(), r[1].strip()) in measured[fw]:
                assert re.fullmatch(r" \d+% / \d+% ", cell), (fw, r)
            else:
                assert cell.strip() == "", (fw, r)
    assert any(label.endswith(" f16") for _, label in measured["torch"]), measured["torch"]  # half rows ran
    # Thread scaling: every framework's float32 throughput workloads at 1 and 2 threads.
    section = text.split("## Thread scaling (1 to 2 threads)\n", 1)[1].split("\n## ", 1)[0]
    rows = [r.split("|")[1:-1] for r in section.splitlines() if r.startswith("| ") and not r.startswith("| framework ")]
    settings = {r[0].strip(): r for r in rows if len(r) == 4}
    assert set(settings) == {"torch", "tensorflow", "onnxruntime", "jax", "mindspore"}, section
    for fw, r in settings.items():  # each child reported the count it set, at 1 and at 2
        assert "1: " in r[3] and "2: " in r[3], r
    scaled = [r for r in rows if len(r) == 9]
    for fw in ["torch", "tensorflow", "onnxruntime", "jax", "mindspore"]:
        ops = {r[1].strip() for r in scaled if r[0].strip() == fw}
        assert ops == (OPS - {"nonzero"} if fw == "jax" else OPS), (fw, ops)
    for r in scaled:
        for cell in r[3:5] + r[6:8]:
            assert re.fullmatch(r" \d+\.\d\d (GB|GFLOP)/s ", cell), r
        for cell in (r[5], r[8]):
            assert re.fullmatch(r" \d+\.\d\dx ", cell), r
    for png in ["bench_ratios.png", "bench_sweep.png", "bench_roofline.png"]:
        data = (tmp_path / "img" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png


def test_half_ratios_divide_by_the_float32_time_taken_in_the_same_measure():
    sys.path.insert(0, str(ROOT / "bench"))
    from common import PAIRED_F32, Result, half_ratios

    def result(label, polyop_s, builtin_s, extra=None):
        return Result("torch", "gelu", "throughput", label, polyop_s, builtin_s, "b", "GB/s", 1.0, extra or {})

    rows = half_ratios([
        result("1024", 2.0, 4.0),  # float32's own workload, timed earlier (a slower moment)
        result("1024 f16", 1.0, 1.0, {PAIRED_F32: 1.5}),  # with the twin timed beside it
        result("1024 bf16", 1.0, 2.0),  # no paired time: the twin's own result
    ])
    assert rows == [
        ("torch", "gelu", "1024", "f16", 1.5, 4.0),
        ("torch", "gelu", "1024", "bf16", 2.0, 2.0),
    ], rows


@pytest.mark.parametrize("python", ["missing", "without-mindspore"])
def test_bench_reports_a_framework_that_cannot_run(tmp_path, python):
    """MindSpore runs in its own interpreter (.venv-mindspore or $POLYOP_MINDSPORE_PYTHON):
    one that is missing, or lacks MindSpore, is a reported failure of that column."""
    if python == "missing":
        exe = str(tmp_path / "no-such-python")
    else:
        if importlib.util.find_spec("mindspore") is not None:
            pytest.skip("this interpreter has MindSpore")
        exe = sys.executable
    out = tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--frameworks", "mindspore",
         "--kinds", "overhead", "--ops", "negate", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "POLYOP_MINDSPORE_PYTHON": exe},
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED frameworks: {'mindspore'" in proc.stdout, proc.stdout
    assert "**Frameworks that failed to run:** mindspore (" in out.read_text()


def test_accuracy_script_reports_polyop_within_its_bounds():
    """bench/accuracy.py (the accuracy table next to issue 18's ONNX Runtime ratios): it runs,
    and polyop's rows stay within 4 ulps (softmax's tolerance, the issue's bound for gelu)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "accuracy.py")],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [r.split("|")[1:-1] for r in proc.stdout.splitlines() if r.startswith("| Softmax") or r.startswith("| Gelu")]
    assert len(rows) == 6, proc.stdout
    for case, p_max, p_med, b_max, b_med in rows:
        assert 0 < float(p_max) <= 4.0, (case, p_max)
        assert float(b_max) > 0 and float(b_med) >= 0, case


def test_ep_layers_script_times_mlas_and_the_provider_packed_and_unpacked():
    # bench/ep_layers.py (ResNet-50's layers as Conv chains in ONNX Runtime: MLAS, polyop's
    # provider with and without its weight packing) in smoke mode: a row per layer, each with
    # three times, two finite ratios and every provider's output matching MLAS's to float32
    # rounding (a wrong or zero output fails here)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ep_layers.py"), "--smoke"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [r.split("|")[1:-1] for r in proc.stdout.splitlines() if r.startswith("| ") and not r.startswith("| layer ")]
    assert [r[0].strip() for r in rows] == ["8x7x7 <-> 20 1x1", "6x9x9 <-> 16 3x3"], proc.stdout
    for r in rows:
        ratios, diff = (float(r[3]), float(r[5])), float(r[6])
        assert all(math.isfinite(x) and x > 0 for x in ratios), r
        assert diff <= 1e-5, r


def test_conv_layers_script_runs_every_framework_and_thread_count():
    # bench/conv_layers.py (conv2d against oneDNN in torch and TensorFlow) in smoke mode: a row
    # per framework, thread count and layer, each with a time, a ratio and polyop's output
    # matching the built-in's to float32 rounding (a wrong or zero output fails here)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "conv_layers.py"), "--smoke"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [r.split("|")[1:-1] for r in proc.stdout.splitlines() if r.startswith("| ") and not r.startswith("| framework ")]
    assert {(r[0].strip(), r[1].strip()) for r in rows} == {
        (fw, t) for fw in ("torch", "tensorflow") for t in ("1", "2")
    }, proc.stdout
    assert len(rows) == 4 * 3, proc.stdout
    for r in rows:
        ratio, diff = float(r[5]), float(r[6])
        assert math.isfinite(ratio) and ratio > 0, r
        assert diff <= 1e-5, r


def test_ep_nodes_script_lists_each_sessions_nodes_and_where_they_ran():
    # bench/ep_nodes.py on the standard-op transformer block: a row per node that ran, the CPU
    # provider's session on the left (nothing marked polyop), the provider's session on the
    # right with exactly the op types polyop claims (RMSNormalization, Softmax, Gelu, Add)
    # marked as run by polyop, every time positive
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ep_nodes.py"), "transformer", "--runs", "2"],
        capture_output=True, text=True, timeout=600, cwd=ROOT / "bench",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in proc.stdout.splitlines()
            if r.startswith("| ") and not r.startswith("| CPU provider")]
    assert len(rows) >= 20, proc.stdout
    left, right = [r[0] for r in rows if r[0]], [r[3] for r in rows if r[3]]
    assert not [op for op in left if "(polyop)" in op], proc.stdout
    marked = {op.removesuffix(" (polyop)") for op in right if op.endswith(" (polyop)")}
    assert marked == {"RMSNormalization", "Softmax", "Gelu", "Add"}, proc.stdout
    assert "MatMul" in right and "Gemm" in right, proc.stdout
    assert all(float(r[2]) > 0 for r in rows if r[2]) and all(float(r[5]) > 0 for r in rows if r[5]), proc.stdout
