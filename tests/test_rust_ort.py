"""A Rust program serves polyop ops through the ``ort`` crate with the ops registered
in-process (issue 16, point 3): ``examples/rust_ort`` links the ONNX Runtime adapter as a
crate and calls ``register_custom_ops`` on its session builder (no custom-op library path).
It runs a model mixing built-in and polyop nodes, and a model with a dynamic batch dim at
three batch sizes in one session; outputs are compared with NumPy references computed here
(float64, independent of polyop)."""

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

from _examples import cargo_build

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "rust_ort"
DYLIB = next((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so.*"))
F32_ULP = 2.0**-23


@pytest.fixture(scope="module")
def program() -> Path:
    return cargo_build(EX, "polyop-rust-ort")


def _model(nodes, inputs, outputs, path: Path, initializers=()) -> str:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ai.polyop", 1)],
                          ir_version=10)
    path.write_bytes(m.SerializeToString())
    return str(path)


def _serve(program: Path, tmp: Path, model: str, runs: list[dict[str, np.ndarray]]) -> list[dict]:
    spec = {"model": model, "runs": []}
    for k, run in enumerate(runs):
        r = {}
        for name, a in run.items():
            f = tmp / f"{k}_{name}.bin"
            f.write_bytes(np.ascontiguousarray(a, "<f4").tobytes())
            r[name] = {"file": str(f), "shape": list(a.shape)}
        spec["runs"].append(r)
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    p = subprocess.run([str(program), str(DYLIB), str(tmp / "spec.json")], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])["runs"]
    return [{k: np.asarray(v["data"]).reshape(v["shape"]) for k, v in r.items()} for r in out]


def _softmax(v):
    e = np.exp(v - v.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_mixed_model_in_process(program, tmp_path):
    rng = np.random.default_rng(7)
    W = rng.standard_normal((8, 16)).astype(np.float32)
    gamma = rng.standard_normal(16).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),                                   # built-in
        helper.make_node("Relu", ["h"], ["r"], domain="ai.polyop"),
        helper.make_node("RmsNorm", ["r", "gamma"], ["n"], domain="ai.polyop", eps=1e-5),
        helper.make_node("Softmax", ["n"], ["s"], domain="ai.polyop", axis=-1),
        helper.make_node("TopK", ["s"], ["tv", "ti"], domain="ai.polyop", k=3),
    ]
    inits = [helper.make_tensor("W", TP.FLOAT, W.shape, W.ravel()), helper.make_tensor("gamma", TP.FLOAT, [16], gamma)]
    m = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [4, 8])],
               [helper.make_tensor_value_info(n, TP.FLOAT if n != "ti" else TP.INT64, None) for n in ("s", "tv", "ti")],
               tmp_path / "mixed.onnx", inits)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    (got,) = _serve(program, tmp_path, m, [{"x": x}])
    # the reference in float64 from the float32 inputs
    h = x.astype(np.float64) @ W.astype(np.float64)
    r = np.maximum(h, 0)
    n = r / np.sqrt((r**2).mean(-1, keepdims=True) + 1e-5) * gamma
    s = _softmax(n)
    # float32 arithmetic through MatMul, rms_norm and softmax: a few roundings of |s|
    np.testing.assert_allclose(got["s"], s, rtol=64 * F32_ULP, atol=0)
    order = np.argsort(-s, axis=-1, kind="stable")[:, :3]
    np.testing.assert_array_equal(got["ti"], order)
    np.testing.assert_allclose(got["tv"], np.take_along_axis(s, order, -1), rtol=64 * F32_ULP, atol=0)
    assert got["ti"].dtype.kind == "i" and got["tv"].shape == (4, 3)


def test_dynamic_batch_in_one_session(program, tmp_path):
    nodes = [helper.make_node("Add", ["x", "y"], ["a"], domain="ai.polyop"),
             helper.make_node("Gelu", ["a"], ["out"], domain="ai.polyop", approximate="tanh")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["b", 5]),
                       helper.make_tensor_value_info("y", TP.FLOAT, [1, 5])],
               [helper.make_tensor_value_info("out", TP.FLOAT, ["b", 5])], tmp_path / "dyn.onnx")
    rng = np.random.default_rng(3)
    y = rng.standard_normal((1, 5)).astype(np.float32)
    runs = [{"x": rng.standard_normal((b, 5)).astype(np.float32), "y": y} for b in (1, 3, 17)]
    got = _serve(program, tmp_path, m, runs)
    for run, out in zip(runs, got):
        a = run["x"].astype(np.float64) + y  # float32 addition is exact-rounded: one rounding
        ref = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
        assert out["out"].shape == a.shape
        # gelu's float32 tolerance in ulps (tolerances.txt) on top of the addition's rounding
        bound = 8 * F32_ULP * np.abs(ref) + 8 * F32_ULP * np.abs(a) + 2.0**-126
        assert np.all(np.abs(out["out"] - ref) <= bound), np.max(np.abs(out["out"] - ref) / bound)


def test_a_bad_model_is_an_error_not_a_crash(program, tmp_path):
    # topk with k larger than the axis: session creation fails with polyop's message
    m = _model([helper.make_node("TopK", ["x"], ["v", "i"], domain="ai.polyop", k=9)],
               [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
               [helper.make_tensor_value_info("v", TP.FLOAT, None), helper.make_tensor_value_info("i", TP.INT64, None)],
               tmp_path / "bad.onnx")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": m, "runs": []}))
    p = subprocess.run([str(program), str(DYLIB), str(spec)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, (p.returncode, p.stderr)  # anyhow's error exit, not a signal
    assert "polyop.topk: k=9 is out of range for axis 1 of size 4" in p.stderr, p.stderr
