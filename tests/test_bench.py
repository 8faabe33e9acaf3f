"""The benchmark harness still works end to end (CI runs it in smoke mode: tiny sizes and
short timings, so no number here means anything and nothing asserts a time)."""

import math
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = {"negate", "add", "scale", "relu", "add_relu", "gelu", "softmax", "rms_norm", "topk", "conv2d", "nonzero"}


def test_bench_smoke_covers_every_op_and_framework(tmp_path):
    out = tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    for fw in ["torch", "tensorflow", "onnxruntime", "jax"]:
        section = text.split(f"## {fw}\n", 1)[1].split("\n## ", 1)[0]
        rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| op ")]
        ops = {r.split("|")[1].strip() for r in rows}
        # XLA needs static shapes, so nonzero is refused there by design.
        expected = OPS - {"nonzero"} if fw == "jax" else OPS
        assert ops == expected, (fw, sorted(expected - ops))
        for r in rows:
            ratio = float(r.split("|")[7])
            assert math.isfinite(ratio) and ratio > 0, r
        if fw == "torch":
            assert all(re.search(r"\d+\.\d+ us \| \d+\.\d+ \|$", r) for r in rows if "| overhead |" in r), section
    for png in ["bench_ratios.png", "bench_sweep.png"]:
        data = (tmp_path / "img" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
