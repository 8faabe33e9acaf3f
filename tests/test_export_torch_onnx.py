"""PyTorch to ONNX: a model of polyop ops exports with ``torch.onnx.export`` (dynamo, with
``polyop.torch.onnx_translation_table()``; and the TorchScript exporter, with
``polyop.torch.register_onnx_symbolics()``) to ``ai.polyop`` nodes, a dynamic batch dim stays
a ``dim_param``, and the model runs in ONNX Runtime in a fresh process that loads only
onnxruntime and ``libpolyop_onnxruntime.so``, bit-identical to torch eager."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import polyop
import polyop.torch

REPO = Path(__file__).resolve().parents[1]
ORT_LIB = polyop.library_path("onnxruntime")
P = polyop.torch.load().handle
D = 16


class PolyopModel(torch.nn.Module):
    """Only polyop ops, so ONNX Runtime must give torch eager's bits."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.rand(D, generator=gen) + 0.5)
        self.cw = torch.nn.Parameter(torch.randn(4, 2, 3, 3, generator=gen))

    def forward(self, x, img):
        h = P.rms_norm(x, self.w, eps=1e-5)
        h = P.gelu(P.softmax(h, axis=-1), approximate="tanh")
        v, i = P.topk(P.add_relu(h, x), k=3, largest=True)
        c = P.conv2d(img, self.cw, None, stride=2, padding=1)
        return v, i, P.scale(c, alpha=0.5)


def inputs(b: int):
    gen = torch.Generator().manual_seed(b)
    return torch.randn(b, D, generator=gen), torch.randn(b, 2, 9, 7, generator=gen)


def run_in_fresh_ort(tmp_path, model_path, sizes) -> None:
    code = f"""
        import sys
        import numpy as np, onnxruntime as ort
        so = ort.SessionOptions()
        so.register_custom_ops_library({ORT_LIB!r})
        sess = ort.InferenceSession({str(model_path)!r}, so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        for b in {sizes!r}:
            feed = {{n: np.load({str(tmp_path)!r} + f"/in{{k}}_{{b}}.npy") for k, n in enumerate(names)}}
            outs = sess.run(None, feed)
            for k, o in enumerate(outs):
                want = np.load({str(tmp_path)!r} + f"/out{{k}}_{{b}}.npy")
                assert o.shape == want.shape and o.dtype == want.dtype, (b, k, o.shape, want.shape)
                assert np.array_equal(o, want), (b, k, np.abs(o - want).max())
        assert "polyop" not in sys.modules and "torch" not in sys.modules
        print("ok", len({sizes!r}))
    """
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"ok {len(sizes)}"


def save_eager(tmp_path, model, sizes):
    for b in sizes:
        ins = inputs(b)
        for k, t in enumerate(ins):
            np.save(tmp_path / f"in{k}_{b}.npy", t.numpy())
        with torch.no_grad():
            for k, o in enumerate(model(*ins)):
                np.save(tmp_path / f"out{k}_{b}.npy", o.numpy())


def polyop_nodes(path):
    m = onnx.load(str(path))
    assert any(o.domain == "ai.polyop" and o.version == 1 for o in m.opset_import), m.opset_import
    return [(n.op_type, n.domain) for n in m.graph.node], m


def test_dynamo_export_with_the_translation_table(tmp_path):
    model = PolyopModel()
    batch = torch.export.Dim("batch", min=1, max=64)
    prog = torch.onnx.export(model, inputs(3), dynamo=True,
                             custom_translation_table=polyop.torch.onnx_translation_table(),
                             dynamic_shapes=({0: batch}, {0: batch}))
    path = tmp_path / "model.onnx"
    prog.save(str(path))
    nodes, m = polyop_nodes(path)
    assert {"RmsNorm", "Softmax", "Gelu", "AddRelu", "TopK", "Conv2d", "Scale"} <= {t for t, _ in nodes}
    assert all(d == "ai.polyop" for t, d in nodes if t in ("RmsNorm", "TopK", "Conv2d")), nodes
    attrs = {a.name: onnx.helper.get_attribute_value(a) for n in m.graph.node if n.op_type == "TopK"
             for a in n.attribute}
    assert attrs == {"k": 3, "axis": -1, "largest": 1}, attrs  # a bool is an INT (SPEC §1)
    # the batch dim stays symbolic, inputs and outputs alike
    assert [d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim][0] == "batch"
    assert m.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    sizes = (1, 3, 10)
    save_eager(tmp_path, model, sizes)
    run_in_fresh_ort(tmp_path, path, sizes)


def test_torchscript_export_with_registered_symbolics(tmp_path):
    model = PolyopModel()
    registered = polyop.torch.register_onnx_symbolics()
    assert "polyop::rms_norm" in registered and "polyop::relu_" not in registered
    path = tmp_path / "model_ts.onnx"
    with pytest.warns(Warning):  # torch deprecates the TorchScript exporter; it still works
        torch.onnx.export(model, inputs(3), str(path), dynamo=False, opset_version=20,
                          input_names=["x", "img"], output_names=["v", "i", "c"],
                          dynamic_axes={"x": {0: "batch"}, "img": {0: "batch"}},
                          custom_opsets={"ai.polyop": 1})
    nodes, m = polyop_nodes(path)
    assert ("Conv2d", "ai.polyop") in nodes and ("TopK", "ai.polyop") in nodes, nodes
    sizes = (2, 5)
    save_eager(tmp_path, model, sizes)
    run_in_fresh_ort(tmp_path, path, sizes)


def test_onnx_schemas_coexist_with_onnx_reference():
    # polyop's ai.polyop schemas share names with standard ops (Gelu, Softmax, TopK);
    # onnx.reference, which onnxscript imports, must still load in a process that has them.
    r = subprocess.run([sys.executable, "-c", "import polyop.onnx, onnx.reference, onnxscript; print('ok')"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
