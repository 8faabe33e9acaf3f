"""The pipeline example (examples/pipeline/run.py) runs both routes: torch -> ONNX -> ONNX
Runtime from Python and from Rust bit-identical to torch eager, and Keras -> SavedModel served
in a fresh process with the Keras model's outputs. The example checks the bits itself and exits
non-zero on a mismatch; this test checks it ran every step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_pipeline_example_runs_both_routes():
    r = subprocess.run([sys.executable, str(REPO / "examples" / "pipeline" / "run.py")],
                       cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = r.stdout
    for line in ("torch route: torch eager, ORT Python and ORT Rust are bit-identical",
                 "keras route: the SavedModel reloaded with only tf.load_op_library serves",
                 "pipeline: both routes OK"):
        assert line in out, out
