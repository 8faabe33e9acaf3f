"""ONNX: the ``ai.polyop`` OpSchemas registered with ``onnx.defs`` (by ``import polyop.onnx``,
which ``polyop.onnxruntime`` imports) let ``onnx.checker`` validate polyop nodes and ``onnx.shape_inference``
type their outputs, symbolic ``dim_param``s flowing through; ONNX Runtime sessions with free
dims run at several sizes. Expected shapes are written out by hand; values are checked
against NumPy."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import polyop
import polyop.onnxruntime as pox

D = 16


def dims_of(vi):
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]


def decoder_like_model():
    """RmsNorm -> Softmax -> Gelu -> (standard) Relu -> TopK, and a Conv2d branch, every
    dim of the inputs symbolic except the feature / channel dims; outputs left untyped."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [D], (np.arange(D) / D + 0.5).tolist())
    cw = helper.make_tensor("cw", TensorProto.FLOAT, [4, 3, 3, 3],
                            np.random.default_rng(0).standard_normal(4 * 27).tolist())
    nodes = [
        pox.make_node("rms_norm", ["x", "w"], ["n"], eps=1e-6),
        pox.make_node("softmax", ["n"], ["s"], axis=-1),
        pox.make_node("gelu", ["s"], ["g"]),
        helper.make_node("Relu", ["g"], ["r"]),
        pox.make_node("topk", ["r"], ["v", "i"], k=3),
        pox.make_node("conv2d", ["img", "cw"], ["c"], stride=2, padding=1),
        pox.make_node("add", ["x", "col"], ["a"]),
    ]
    graph = helper.make_graph(
        nodes, "symbolic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D]),
         helper.make_tensor_value_info("img", TensorProto.FLOAT, ["B", 3, "H", "W"]),
         helper.make_tensor_value_info("col", TensorProto.FLOAT, ["N", 1])],
        # outputs declared with unknown dims only: inference must fill them in
        [helper.make_tensor_value_info(n, t, [None] * r)
         for n, t, r in (("v", TensorProto.FLOAT, 2), ("i", TensorProto.INT64, 2),
                         ("c", TensorProto.FLOAT, 4), ("a", TensorProto.FLOAT, 2))],
        initializer=[w, cw],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", pox.ONNX_OPSET),
                                                   helper.make_opsetid(pox.DOMAIN, 1)],
                             ir_version=pox.IR_VERSION)


def test_every_op_has_a_registered_schema():
    for info in polyop.ops():
        if not info["flags"]["inplace"]:
            s = onnx.defs.get_schema(info["onnx_name"], 1, pox.DOMAIN)
            assert [i.name for i in s.inputs] == [i["name"] for i in info["inputs"]]
            assert set(s.attributes) == {a["name"] for a in info["attrs"]}


def test_shape_inference_types_every_polyop_output_with_symbolic_dims():
    m = decoder_like_model()
    onnx.checker.check_model(m, full_check=True, check_custom_domain=True)
    inferred = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    vi = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    want = {
        "n": (TensorProto.FLOAT, ["N", D]),
        "s": (TensorProto.FLOAT, ["N", D]),
        "g": (TensorProto.FLOAT, ["N", D]),
        "r": (TensorProto.FLOAT, ["N", D]),  # a standard op downstream sees the typed shape
        "v": (TensorProto.FLOAT, ["N", 3]),
        "i": (TensorProto.INT64, ["N", 3]),
        "c": (TensorProto.FLOAT, ["B", 4, "(H - 1) // 2 + 1", "(W - 1) // 2 + 1"]),
        "a": (TensorProto.FLOAT, ["N", D]),
    }
    for name, (elem, dims) in want.items():
        assert vi[name].type.tensor_type.elem_type == elem, name
        assert dims_of(vi[name]) == dims, (name, dims_of(vi[name]))


def test_checker_and_inference_refuse_bad_polyop_nodes():
    m = decoder_like_model()
    bad = onnx.ModelProto()
    bad.CopyFrom(m)
    bad.graph.node[1].attribute.append(helper.make_attribute("axes", 1))  # a typo of `axis`
    with pytest.raises(onnx.checker.ValidationError, match="axes"):
        onnx.checker.check_model(bad, full_check=True)
    bad.CopyFrom(m)
    bad.graph.node[4].attribute[0].i = D + 1  # k larger than the axis
    with pytest.raises(Exception, match=r"polyop.topk: k=17 is out of range"):
        onnx.shape_inference.infer_shapes(bad, strict_mode=True)
    # a contradiction between known dims: weight [16] against x [N, 8]
    bad.CopyFrom(m)
    bad.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 8
    with pytest.raises(Exception, match=r"polyop.rms_norm: weight must have shape \[8\]"):
        onnx.shape_inference.infer_shapes(bad, strict_mode=True)


def gelu(x):
    from math import erf

    return np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))))(x.astype(np.float64))


def test_session_with_free_dims_runs_at_several_sizes():
    m = decoder_like_model()
    sess = ort.InferenceSession(m.SerializeToString(), pox.session_options(),
                                providers=["CPUExecutionProvider"])
    w = np.arange(D) / D + 0.5
    for n in (1, 5, 12):
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, D)).astype(np.float32)
        img = rng.standard_normal((2, 3, 7 + n, 5)).astype(np.float32)
        col = rng.standard_normal((n, 1)).astype(np.float32)
        v, i, c, a = sess.run(None, {"x": x, "img": img, "col": col})
        x64 = x.astype(np.float64)
        norm = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-6) * w
        e = np.exp(norm - norm.max(-1, keepdims=True))
        r = np.maximum(gelu(e / e.sum(-1, keepdims=True)), 0)
        want_i = np.argsort(-r, axis=-1, kind="stable")[:, :3]
        np.testing.assert_allclose(v, np.take_along_axis(r, want_i, -1), rtol=1e-5, atol=1e-7)
        assert v.shape == (n, 3) and i.dtype == np.int64
        assert c.shape == (2, 4, (7 + n - 1) // 2 + 1, 3)
        np.testing.assert_array_equal(a, x + col)
