"""Framework versions other than the pinned ones (issue 19): the libraries built once against
the pinned frameworks (ci/requirements.lock) pass each framework's test file under the newest
release too. The newest releases are pinned in ``ci/compat.lock`` (raise them there, rerun,
record the result in docs/compat.md).

Each version is installed with pip into its own directory (tests/_compat.py, which CI starts
early, in the background) and put first on ``PYTHONPATH`` for a child pytest of the framework's
test file, which runs the same ``target/release`` library the pinned tests use."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _compat import COLUMNS, ORT_BEFORE_OPTIONAL_FIX, TORCH_TOO_OLD
from _compat import install as _install
from _compat import pins as _pins

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("pkg", sorted(COLUMNS))
def test_newest_release_passes_the_framework_tests(pkg):
    version = _pins()[pkg]
    d = _install(pkg, version)
    env = {**os.environ, "PYTHONPATH": str(d)}
    env.pop("POLYOP_LIB_DIR", None)
    got = subprocess.run([sys.executable, "-c", f"import {pkg}; print({pkg}.__version__)"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.strip().split("+")[0] == version, got.stdout  # the newest, not the pinned
    test_file, _ = COLUMNS[pkg]
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
                       capture_output=True, text=True, timeout=1500, env=env, cwd=ROOT)
    tail = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    assert p.returncode == 0 and " passed" in tail and "failed" not in tail, (
        f"{test_file} under {pkg} {version}:\n" + p.stdout[-6000:] + p.stderr[-3000:]
    )


def test_onnxruntime_1_23_survives_an_absent_optional_input():
    d = _install("onnxruntime", ORT_BEFORE_OPTIONAL_FIX)
    code = textwrap.dedent("""
        import numpy as np, onnxruntime as ort, polyop
        from onnx import helper, TensorProto as TP
        assert ort.__version__ == VERSION, ort.__version__
        so = ort.SessionOptions()
        so.register_custom_ops_library(polyop.library_path("onnxruntime"))
        def run(node, inputs):
            g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TP.DOUBLE, a.shape) for n, a in inputs],
                                  [helper.make_empty_tensor_value_info("y")])  # left to shape inference
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ai.polyop", 1)],
                                  ir_version=9)
            s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
            return s.run(None, dict(inputs))[0]
        x = np.linspace(-2, 3, 18).reshape(3, 6)
        y = run(helper.make_node("RmsNorm", ["x", ""], ["y"], domain="ai.polyop"), [("x", x)])
        ref = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6)
        assert np.allclose(y, ref, rtol=8 * 2.0 ** -52, atol=0), (y, ref)
        xi = np.linspace(-1, 1, 50).reshape(1, 2, 5, 5)
        w = np.linspace(0.5, -0.5, 36).reshape(2, 2, 3, 3)
        y = run(helper.make_node("Conv2d", ["x", "w", ""], ["y"], domain="ai.polyop"), [("x", xi), ("w", w)])
        ref = np.zeros((1, 2, 3, 3))
        for o in range(2):
            for i in range(3):
                for j in range(3):
                    ref[0, o, i, j] = (xi[0, :, i:i + 3, j:j + 3] * w[o]).sum()
        assert np.allclose(y, ref, rtol=0, atol=64 * 2.0 ** -52), (y, ref)
        print("ok")
    """).replace("VERSION", repr(ORT_BEFORE_OPTIONAL_FIX))
    env = {**os.environ, "PYTHONPATH": str(d)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    # before the fix: "Fatal Python error: Segmentation fault" inside onnxruntime
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout[-2000:] + p.stderr[-3000:]
    assert "requested API version" not in p.stderr, p.stderr  # no probe of a newer API table


def test_torch_abi_floor_matches_the_build():
    # polyop.torch names the floor in its refusal; the build script sets it
    import re

    build = (ROOT / "adapters" / "torch" / "build.rs").read_text()
    m = re.search(r'"TORCH_TARGET_VERSION",\s*"0x([0-9a-f]{2})([0-9a-f]{2})', build)
    assert m, "TORCH_TARGET_VERSION not found in adapters/torch/build.rs"
    from polyop import torch as _pt  # noqa: F401  (the pinned torch is importable here)

    assert _pt.TORCH_ABI_FLOOR == (int(m.group(1), 16), int(m.group(2), 16))


def test_torch_older_than_the_abi_floor_is_refused_naming_both_versions():
    d = _install("torch", TORCH_TOO_OLD)
    code = textwrap.dedent("""
        import torch, polyop.torch as pt
        try:
            pt.load()
            print("LOADED")
        except RuntimeError as e:
            print("REFUSED", e)
        assert torch.equal(torch.add(torch.tensor([1.0]), 1), torch.tensor([2.0]))  # torch still fine
    """)
    env = {**os.environ, "PYTHONPATH": str(d)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith("REFUSED polyop: ") and "needs torch 2.13 or newer" in line, line
    assert f"this is torch {TORCH_TOO_OLD}" in line, line
