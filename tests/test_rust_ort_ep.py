"""A Rust program runs a standard ONNX model with polyop's execution provider through the
``ort`` crate (``examples/rust_ort_ep``): ``Environment::register_ep_library`` with
``libpolyop_onnxruntime.so``, the ``PolyopExecutionProvider`` device given to the session
builder. The output is compared with a NumPy reference computed here (float64), and ONNX
Runtime's profile, written by the Rust program, shows which provider ran each node."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import polyop
from _examples import cargo_build

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "rust_ort_ep"
DYLIB = next((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so.*"))
LIB = polyop.library_path("onnxruntime")


@pytest.fixture(scope="module")
def program() -> Path:
    return cargo_build(EX, "polyop-rust-ort-ep")


def test_a_rust_program_runs_a_model_on_the_provider(program, tmp_path):
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="neg"),
             helper.make_node("Abs", ["a"], ["b"], name="abs"),
             helper.make_node("Softmax", ["b"], ["y"], name="softmax", axis=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["N"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N"])])
    model = tmp_path / "m.onnx"
    model.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                        ir_version=10).SerializeToString())
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    for n in (1, 7):
        p = subprocess.run([str(program), str(DYLIB), LIB, str(model), str(n), str(tmp_path / f"p{n}")],
                           capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        lines = p.stdout.strip().splitlines()
        assert lines[0] == "devices: 1"
        prof = lines[1].removeprefix("profile: ")
        got = np.array([float(v) for v in lines[2:]])
        x = np.arange(n) * 0.25
        e = np.exp(x - x.max())
        np.testing.assert_allclose(got, e / e.sum(), rtol=8 * 2.0**-24, atol=0)
        with open(prof) as f:
            where = {ev["name"].removesuffix("_kernel_time"): ev["args"]["provider"]
                     for ev in json.load(f) if ev.get("cat") == "Node" and "provider" in ev.get("args", {})}
        assert where == {"neg": "PolyopExecutionProvider", "abs": "CPUExecutionProvider",
                         "softmax": "PolyopExecutionProvider"}
