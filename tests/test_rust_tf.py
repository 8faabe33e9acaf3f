"""A Rust program builds TensorFlow graphs with polyop ops through the ``tensorflow`` crate
(issue 16, point 2): ``examples/rust_tf`` loads ``libpolyop_tensorflow.so`` with
``tensorflow::Library::load``, builds graphs with ``Graph::new_operation("Polyop...")`` and runs
them in a ``Session``. ``examples/rust_tf/build.sh`` links it against this environment's
TensorFlow wheel (a pkg-config file it writes; nothing downloaded). Every fetched output is
compared with a NumPy reference computed here (float64, independent of polyop), each op from
the float32 values the program fetched for its inputs, in the ulps of
python/polyop/conformance/tolerances.txt; topk's indices exactly."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "rust_tf"
TARGET = EX / "target"
LIB = ROOT / "target" / "release" / "libpolyop_tensorflow.so"
F32_ULP = 2.0**-23
TINY = 2.0**-126


@pytest.fixture(scope="module")
def program() -> Path:
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET))
    p = subprocess.run(["bash", str(EX / "build.sh"), sys.executable], capture_output=True, text=True,
                       timeout=1800, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    assert LIB.is_file(), f"{LIB} is not built (cargo build --release)"
    return TARGET / "release" / "polyop-rust-tf"


def _run(program: Path, tmp: Path, graphs: list[dict]) -> list[dict]:
    """Runs the graphs (numpy arrays as feeds) in one process; per graph, its runs as
    {fetch: array}, or {"error": message}."""
    spec = {"graphs": []}
    for g, graph in enumerate(graphs):
        runs = []
        for k, run in enumerate(graph["runs"]):
            r = {}
            for name, a in run.items():
                f = tmp / f"{g}_{k}_{name}.bin"
                f.write_bytes(np.ascontiguousarray(a, "<f4").tobytes())
                r[name] = {"file": str(f), "shape": list(a.shape)}
            runs.append(r)
        spec["graphs"].append(dict(graph, runs=runs))
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    p = subprocess.run([str(program), str(LIB), str(tmp / "spec.json")], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])["graphs"]
    assert len(out) == len(graphs)
    return [g if "error" in g else
            [{k: np.asarray(v["data"]).reshape(v["shape"]) for k, v in r.items()} for r in g["runs"]]
            for g in out]


def _close(got, ref, ulps, scale=None):
    """|got - ref| <= ulps * eps * scale + ulps * tiny, scale |ref| unless given."""
    assert got.shape == ref.shape, (got.shape, ref.shape)
    scale = np.abs(ref) if scale is None else scale
    bound = ulps * F32_ULP * scale + ulps * TINY
    err = np.abs(got - ref)
    assert np.all(err <= bound), f"worst {np.max(err / bound):.2f} x the bound of {ulps} ulps"


def _softmax(v, axis):
    e = np.exp(v - v.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _gelu_tanh(v):
    u = math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)
    return v / (1 + np.exp(-2 * u))  # 0.5 v (1 + tanh u), without cancellation


CHAIN = {
    # x: [batch, 8] with the batch dim unknown in the graph: one session serves two batch sizes
    "placeholders": {"x": [-1, 8], "y": [1, 8], "w": [8]},
    "nodes": [
        {"name": "r", "op": "PolyopAddRelu", "inputs": ["x", "y"]},
        {"name": "g", "op": "PolyopGelu", "inputs": ["r"], "attrs": {"approximate": "tanh"}},
        {"name": "n", "op": "PolyopRmsNorm", "inputs": ["g", ["w"]], "attrs": {"eps": 1e-5, "N_weight": 1}},
        {"name": "s", "op": "PolyopSoftmax", "inputs": ["n"], "attrs": {"axis": -1}},
        {"name": "s0", "op": "PolyopSoftmax", "inputs": ["n"], "attrs": {"axis": 0}},
        {"name": "t", "op": "PolyopTopk", "inputs": ["s"], "attrs": {"k": 3}},
    ],
    "fetch": ["r", "g", "n", "s", "s0", "t:0", "t:1"],
}

CONV = {
    "placeholders": {"x": [2, 3, 7, 7], "k": [4, 3, 3, 3], "b": [4]},
    "nodes": [{"name": "c", "op": "PolyopConv2d", "inputs": ["x", "k", ["b"]],
               "attrs": {"stride": [2, 2], "padding": [1], "N_bias": 1}}],
    "fetch": ["c"],
}


def test_a_graph_of_polyop_ops_at_two_batch_sizes(program, tmp_path):
    rng = np.random.default_rng(11)
    y = rng.standard_normal((1, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    feeds = [{"x": rng.standard_normal((b, 8)).astype(np.float32), "y": y, "w": w} for b in (1, 5)]
    (runs,) = _run(program, tmp_path, [dict(CHAIN, runs=feeds)])
    assert len(runs) == 2
    for feed, got in zip(feeds, runs):
        b = feed["x"].shape[0]
        r = np.maximum(feed["x"].astype(np.float64) + y, 0)
        _close(got["r"], r, 1)
        _close(got["g"], _gelu_tanh(got["r"]), 24)
        g = got["g"]
        _close(got["n"], g / np.sqrt((g * g).mean(-1, keepdims=True) + 1e-5) * w, 4)
        _close(got["s"], _softmax(got["n"], -1), 4)
        _close(got["s0"], _softmax(got["n"], 0), 4)  # the axis attribute is read
        if b > 1:
            assert not np.allclose(got["s0"], got["s"])
        # topk: a selection, exact; ties (relu's zeros) go to the lower index
        order = np.argsort(-got["s"], axis=-1, kind="stable")[:, :3]
        np.testing.assert_array_equal(got["t:1"], order)
        np.testing.assert_array_equal(got["t:0"], np.take_along_axis(got["s"], order, -1))
        assert got["t:1"].dtype.kind == "i" and got["t:0"].shape == (b, 3)
        # and the whole chain against float64 from the inputs (errors compound: a looser bound)
        s = _softmax((lambda v: v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-5) * w)(_gelu_tanh(r)), -1)
        _close(got["s"], s, 256)


def test_conv2d_with_stride_padding_and_bias(program, tmp_path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    k = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    ((got,),) = _run(program, tmp_path, [dict(CONV, runs=[{"x": x, "k": k, "b": b}])])
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((2, 4, 4, 4))
    mag = np.zeros((2, 4, 4, 4))
    for i in range(4):
        for j in range(4):
            patch = xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3]  # [n, c, 3, 3]
            terms = patch[:, None] * k.astype(np.float64)[None]  # [n, o, c, 3, 3]
            ref[:, :, i, j] = terms.sum((2, 3, 4)) + b
            mag[:, :, i, j] = np.abs(terms).sum((2, 3, 4)) + np.abs(b)
    _close(got["c"], ref, 8, scale=mag)


def test_errors_name_the_op_and_the_next_graph_runs(program, tmp_path):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    graphs = [
        # an attribute out of range: the kernel fails when the session runs
        {"placeholders": {"x": [2, 4]}, "nodes": [{"name": "t", "op": "PolyopTopk", "inputs": ["x"],
                                                    "attrs": {"k": 9}}],
         "fetch": ["t:0"], "runs": [{"x": x}]},
        # shapes that cannot broadcast: the shape function fails while the graph is built
        {"placeholders": {"x": [2, 4], "y": [3, 4]},
         "nodes": [{"name": "bad_add", "op": "PolyopAdd", "inputs": ["x", "y"]}], "fetch": ["bad_add"], "runs": []},
        # the same process goes on
        {"placeholders": {"x": [2, 4]}, "nodes": [{"name": "a", "op": "PolyopAdd", "inputs": ["x", "x"]}],
         "fetch": ["a"], "runs": [{"x": x}]},
    ]
    topk, add, ok = _run(program, tmp_path, graphs)
    assert "polyop.topk: k=9 is out of range for axis 1 of size 4" in topk["error"], topk
    assert "{{node t}}" in topk["error"] and topk["error"].startswith("InvalidArgument"), topk
    assert "polyop.add: shapes [2, 4] and [3, 4] cannot be broadcast together" in add["error"], add
    assert "bad_add" in add["error"], add
    np.testing.assert_array_equal(ok[0]["a"], 2 * x)
