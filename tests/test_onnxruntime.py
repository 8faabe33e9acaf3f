"""ONNX Runtime surface: libpolyop_onnxruntime.so registered with
SessionOptions.register_custom_ops_library, ai.polyop models built with onnx.helper.

References are NumPy or ONNX Runtime's own built-in ops, never the code under test. Where a
result is also compared bit for bit with the NumPy core (polyop.run), it is checked against
the independent reference of conformance/reference.py as well (in every dtype, backward ops
included), within the tolerances of polyop/conformance/tolerances.txt."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnxruntime.capi.onnxruntime_pybind11_state import (  # noqa: I001
    Fail,
    InvalidArgument,
    InvalidGraph,
    RuntimeException,
)

import polyop
import polyop.onnxruntime as pox
from polyop.conformance import Case, compare_to_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
import reference as conformance_reference  # noqa: E402  (conformance/reference.py)

LIB = polyop.library_path("onnxruntime")
OPSETS = [helper.make_opsetid("", 20), helper.make_opsetid("ai.polyop", 1)]
RNG = np.random.default_rng(1234)


def model(nodes, inputs, outputs, initializers=()):
    g = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=OPSETS, ir_version=10).SerializeToString()


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)



def test_load_returns_the_common_library_object():
    """polyop.<framework>.load() returns the same kind of object in every framework."""
    import os

    from polyop._library import Loaded

    lib = pox.load()
    assert isinstance(lib, Loaded) and pox.load() is lib
    assert (lib.framework, lib.name) == ("onnxruntime", pox.DOMAIN)
    assert lib.path == os.path.realpath(LIB)
    assert lib.info["framework"] == "onnxruntime"
    assert list(lib.op_names) == [o["name"] for o in polyop.ops() if not o["flags"]["inplace"]]
    assert set(lib.op_names) == set(lib.library.exported)
    so = lib.handle(intra_op_num_threads=1)  # a SessionOptions factory with the library registered
    assert isinstance(so, ort.SessionOptions) and so.intra_op_num_threads == 1
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_array_equal(lib.negate(x), -x)
    v, i = lib.call("topk", x, k=2)
    np.testing.assert_array_equal(v, -np.sort(-x, axis=-1)[:, :2])
    assert pox.load(LIB).name == pox.DOMAIN  # the stock library by path

def out(name):
    return helper.make_empty_tensor_value_info(name)


def raw_options(threads=0):
    """SessionOptions with nothing but the library registered (no polyop Python import
    involved in the session itself)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(LIB)
    return so


def one_node(op_type, inputs, outputs, domain="ai.polyop", **attrs):
    """A one-node model; ``inputs`` = [(name, array_or_None)], outputs untyped."""
    node = helper.make_node(op_type, [n if a is not None else "" for n, a in inputs], outputs, domain=domain, **attrs)
    ins = [vi(n, pox.tensor_type(a.dtype), list(a.shape)) for n, a in inputs if a is not None]
    return model([node], ins, [out(o) for o in outputs])


def run_model(m, feeds, threads=0):
    return ort.InferenceSession(m, raw_options(threads), providers=["CPUExecutionProvider"]).run(None, feeds)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ------------------------------------------------------------------------------------------
# the issue check and the raw library


def test_issue_check_topk_through_inference_session():
    node = helper.make_node("TopK", ["x"], ["values", "indices"], domain="ai.polyop", k=2)
    m = model(
        [node],
        [vi("x", TP.FLOAT, [1, 4])],
        [vi("values", TP.FLOAT, None), vi("indices", TP.INT64, None)],
    )
    so = ort.SessionOptions()
    so.register_custom_ops_library(LIB)
    sess = ort.InferenceSession(m, so)
    values, indices = sess.run(None, {"x": np.array([[1, 3, 3, 2]], np.float32)})
    assert values.tolist() == [[3.0, 3.0]]
    assert indices.tolist() == [[1, 2]]
    assert indices.dtype == np.int64


def test_every_registry_op_is_registered_under_its_onnx_name():
    # A model naming an unregistered op fails at load with "is not a registered function/op";
    # a registered one gets past that (here: to polyop's own arity check).
    names = [o["onnx_name"] for o in polyop.ops() if not o["flags"]["inplace"]]
    assert {"Negate", "Add", "TopK", "RmsNorm", "RmsNormBackward", "Softmax", "Gelu"} <= set(names)
    x = np.ones(2, np.float32)
    for name in names:
        info = next(o for o in polyop.ops() if o["onnx_name"] == name)
        feeds = [(f"i{j}", x) for j in range(info["num_inputs"] + 1)]  # one too many inputs
        m = one_node(name, feeds, [f"o{j}" for j in range(info["num_outputs"])])
        with pytest.raises(Exception) as e:
            run_model(m, {n: a for n, a in feeds})
        assert "not a registered" not in str(e.value), name
    with pytest.raises(Fail, match="not a registered function/op"):
        run_model(one_node("NoSuchOp", [("x", x)], ["y"]), {"x": x})
    assert not any(o["onnx_name"].endswith("_") for o in polyop.ops() if not o["flags"]["inplace"])


# ------------------------------------------------------------------------------------------
# comparisons with ONNX Runtime's built-in ops


def builtin_vs_polyop(builtin, poly, inputs, outs=1, battrs=None, pattrs=None):
    names = [f"i{j}" for j in range(len(inputs))]
    ins = list(zip(names, inputs))
    onames = [f"o{j}" for j in range(outs)]
    feeds = dict(ins)
    b = run_model(one_node(builtin, ins, onames, domain="", **(battrs or {})), feeds)
    p = run_model(one_node(poly, ins, onames, **(pattrs or {})), feeds)
    return b, p


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.float16])
def test_negate_add_relu_match_builtins_bitwise(dtype):
    x = (RNG.standard_normal((3, 4, 5)) * 10).astype(dtype)
    y = (RNG.standard_normal((4, 1)) * 10).astype(dtype)
    b, p = builtin_vs_polyop("Neg", "Negate", [x])
    assert same_bits(b[0], p[0])
    b, p = builtin_vs_polyop("Add", "Add", [x, y])
    assert same_bits(b[0], p[0])
    if dtype in (np.float32, np.float64, np.int32):
        b, p = builtin_vs_polyop("Relu", "Relu", [x])
        assert same_bits(b[0], p[0])
    else:  # ONNX Runtime's CPU Relu has no int64/float16 kernel: NumPy is the reference
        (p,) = run_model(one_node("Relu", [("x", x)], ["y"]), {"x": x})
        assert same_bits(p, np.maximum(x, dtype(0)))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_builtin_opset20(approximate):
    x = RNG.standard_normal((64, 33)).astype(np.float32) * 3
    b, p = builtin_vs_polyop("Gelu", "Gelu", [x], battrs={"approximate": approximate}, pattrs={"approximate": approximate})
    np.testing.assert_allclose(p[0], b[0], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_matches_builtin(axis):
    x = RNG.standard_normal((7, 9, 11)).astype(np.float32) * 5
    b, p = builtin_vs_polyop("Softmax", "Softmax", [x], battrs={"axis": axis}, pattrs={"axis": axis})
    np.testing.assert_allclose(p[0], b[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_matches_builtin(largest):
    x = RNG.permutation(60).reshape(3, 20).astype(np.float32)  # distinct values
    k = np.array([5], np.int64)
    m_b = model(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)],
        [vi("x", TP.FLOAT, [3, 20]), vi("k", TP.INT64, [1])],
        [out("v"), out("i")],
    )
    bv, bi = run_model(m_b, {"x": x, "k": k})
    pv, pi = run_model(one_node("TopK", [("x", x)], ["v", "i"], k=5, axis=1, largest=largest), {"x": x})
    assert same_bits(pv, bv) and same_bits(pi, bi)


def test_topk_ties_lower_index_first_and_nan_largest():
    x = np.array([[2.0, np.nan, 5.0, 5.0, -1.0, 5.0]], np.float64)
    v, i = run_model(one_node("TopK", [("x", x)], ["v", "i"], k=3), {"x": x})
    assert np.isnan(v[0, 0]) and v[0, 1:].tolist() == [5.0, 5.0]
    assert i.tolist() == [[1, 2, 3]]


@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1)])
def test_conv2d_matches_builtin_conv(stride, padding):
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 2)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    bo, po = builtin_vs_polyop(
        "Conv",
        "Conv2d",
        [x, w, b],
        battrs={"strides": [stride, stride], "pads": [padding] * 4},
        pattrs={"stride": stride, "padding": padding},
    )
    assert po[0].shape == bo[0].shape
    np.testing.assert_allclose(po[0], bo[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("battrs,pattrs", [
    ({"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [2, 1], "group": 2},
     {"stride": [2, 1], "padding": [1, 0, 2, 1], "dilation": [2, 1], "groups": 2}),
    ({"pads": [1, 1, 1, 1], "group": 4}, {"padding": 1, "groups": 4}),  # depthwise, single INTs
    ({"pads": [2, 0, 2, 0], "dilations": [2, 2]}, {"padding": [2, 0], "dilation": 2}),
])
def test_conv2d_groups_dilation_pads_match_builtin_conv(battrs, pattrs):
    x = RNG.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = RNG.standard_normal((8, 4 // battrs.get("group", 1), 3, 3)).astype(np.float32)
    b = RNG.standard_normal(8).astype(np.float32)
    bo, po = builtin_vs_polyop("Conv", "Conv2d", [x, w, b], battrs=battrs, pattrs=pattrs)
    assert po[0].shape == bo[0].shape
    np.testing.assert_allclose(po[0], bo[0], rtol=1e-5, atol=1e-5)


def test_rms_norm_axis_matches_builtin_rmsnormalization():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    # ONNX's RMSNormalization (opset 23) normalises from `axis` on, like polyop's rms_norm
    names = [("x", x), ("w", w)]
    node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=1, epsilon=1e-5)
    g = helper.make_graph([node], "t", [vi(n, pox.tensor_type(a.dtype), list(a.shape)) for n, a in names],
                          [out("y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    b = run_model(m.SerializeToString(), dict(names))
    p = run_model(one_node("RmsNorm", names, ["y"], axis=1, eps=1e-5), dict(names))
    np.testing.assert_allclose(p[0], b[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_nonzero_matches_builtin(dtype):
    x = (RNG.random((4, 5, 3)) < 0.3).astype(dtype) * 7
    b, p = builtin_vs_polyop("NonZero", "NonZero", [x])
    assert p[0].dtype == np.int64
    assert np.array_equal(p[0], b[0].T)  # ONNX NonZero is [rank, n]; polyop is [n, rank]
    assert np.array_equal(p[0], np.argwhere(x))


def test_nonzero_empty_and_rank0():
    z = np.zeros((3, 0, 2), np.float32)
    (p,) = run_model(one_node("NonZero", [("x", z)], ["y"]), {"x": z})
    assert p.shape == (0, 3) and p.dtype == np.int64
    z = np.zeros((4, 2), np.float32)
    (p,) = run_model(one_node("NonZero", [("x", z)], ["y"]), {"x": z})
    assert p.shape == (0, 2)


# ------------------------------------------------------------------------------------------
# a model mixing built-in ONNX ops with polyop ops


def test_mixed_model_builtins_and_polyop():
    W = RNG.standard_normal((8, 16)).astype(np.float32)
    bias = RNG.standard_normal(16).astype(np.float32)
    gamma = RNG.standard_normal(16).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"]),
        helper.make_node("Add", ["mm", "bias"], ["h"]),  # built-in Add
        helper.make_node("Gelu", ["h"], ["g"], domain="ai.polyop", approximate="tanh"),
        helper.make_node("Relu", ["g"], ["r"]),  # built-in Relu
        helper.make_node("RmsNorm", ["r", "gamma"], ["n"], domain="ai.polyop", eps=1e-5),
        helper.make_node("Softmax", ["n"], ["s"], domain="ai.polyop", axis=-1),
        helper.make_node("TopK", ["s"], ["tv", "ti"], domain="ai.polyop", k=3),
    ]
    inits = [helper.make_tensor(n, TP.FLOAT, a.shape, a.ravel()) for n, a in [("W", W), ("bias", bias), ("gamma", gamma)]]
    m = model(nodes, [vi("x", TP.FLOAT, ["batch", 8])], [out(n) for n in ["h", "g", "r", "n", "s", "tv", "ti"]], inits)
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    sess = ort.InferenceSession(m, raw_options())
    h, g, r, n, s, tv, ti = sess.run(None, {"x": x})
    # Each polyop node, fed what ONNX Runtime gave it, matches the NumPy core bit for bit.
    assert same_bits(g, polyop.run("gelu", h, approximate="tanh"))
    assert same_bits(n, polyop.run("rms_norm", r, gamma, eps=1e-5))
    assert same_bits(s, polyop.run("softmax", n, axis=-1))
    v2, i2 = polyop.run("topk", s, k=3)
    assert same_bits(tv, v2) and same_bits(ti, i2)
    # And the whole chain matches an independent float64 NumPy reference.
    h64 = x.astype(np.float64) @ W + bias
    g64 = 0.5 * h64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (h64 + 0.044715 * h64**3)))
    r64 = np.maximum(g64, 0)
    n64 = r64 / np.sqrt((r64**2).mean(-1, keepdims=True) + 1e-5) * gamma
    e = np.exp(n64 - n64.max(-1, keepdims=True))
    s64 = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(s, s64, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(ti, np.argsort(-s64, axis=-1, kind="stable")[:, :3])
    # Shape inference flowed through the polyop nodes.
    shapes = {o.name: o.shape for o in sess.get_outputs()}
    assert shapes["tv"][1] == 3 and shapes["s"][1] == 16 and shapes["ti"][1] == 3


def test_shape_inference_types_and_shapes_reach_onnxruntime():
    x = np.zeros((2, 5), np.float64)
    sess = ort.InferenceSession(one_node("TopK", [("x", x)], ["v", "i"], k=3), raw_options())
    got = [(o.shape, o.type) for o in sess.get_outputs()]
    assert got == [([2, 3], "tensor(double)"), ([2, 3], "tensor(int64)")]
    m = model(
        [helper.make_node("NonZero", ["x"], ["y"], domain="ai.polyop")],
        [vi("x", TP.INT32, ["n", 3])],
        [out("y")],
    )
    (o,) = ort.InferenceSession(m, raw_options()).get_outputs()
    assert o.type == "tensor(int64)" and len(o.shape) == 2 and o.shape[1] == 2 and isinstance(o.shape[0], str)


def test_optional_input_as_empty_name_or_left_out():
    x = RNG.standard_normal((3, 6))
    ref = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)
    empty = model([helper.make_node("RmsNorm", ["x", ""], ["y"], domain="ai.polyop")], [vi("x", TP.DOUBLE, [3, 6])], [out("y")])
    omitted = model([helper.make_node("RmsNorm", ["x"], ["y"], domain="ai.polyop")], [vi("x", TP.DOUBLE, [3, 6])], [out("y")])
    for m in (empty, omitted):
        (y,) = run_model(m, {"x": x})
        np.testing.assert_allclose(y, ref, rtol=1e-13)
        assert same_bits(y, polyop.run("rms_norm", x, None))
    # conv2d without bias
    xi = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    (y,) = run_model(one_node("Conv2d", [("x", xi), ("w", w), ("b", None)], ["y"]), {"x": xi, "w": w})
    assert same_bits(y, polyop.run("conv2d", xi, w, None))


# ------------------------------------------------------------------------------------------
# threads, determinism, dtypes


def test_intra_op_threads_one_vs_two_identical():
    x = RNG.standard_normal((256, 1024)).astype(np.float32)
    w = RNG.standard_normal(1024).astype(np.float32)
    cases = [
        ("Softmax", [("x", x)], {}),
        ("Gelu", [("x", x)], {}),
        ("RmsNorm", [("x", x), ("w", w)], {}),
        ("Add", [("x", x), ("w", w)], {}),
        ("TopK", [("x", x)], {"k": 7}),
    ]
    for op, ins, attrs in cases:
        outs = ["a", "b"] if op == "TopK" else ["a"]
        m = one_node(op, ins, outs, **attrs)
        r1 = run_model(m, dict(ins), threads=1)
        r2 = run_model(m, dict(ins), threads=2)
        assert all(same_bits(a, b) for a, b in zip(r1, r2)), op
        want = polyop.run(op_name(op), *[a for _, a in ins], **attrs)
        want = list(want) if isinstance(want, tuple) else [want]
        assert all(same_bits(a, b) for a, b in zip(r1, want)), op
    xc = RNG.standard_normal((2, 8, 32, 32)).astype(np.float32)
    wc = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32)
    m = one_node("Conv2d", [("x", xc), ("w", wc)], ["y"], padding=1)
    r1 = run_model(m, {"x": xc, "w": wc}, threads=1)
    r2 = run_model(m, {"x": xc, "w": wc}, threads=2)
    assert same_bits(r1[0], r2[0])


def op_name(onnx_name):
    return next(o["name"] for o in polyop.ops() if o["onnx_name"] == onnx_name)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_pox_run_bitwise_equal_to_native_for_every_float_dtype(dtype):
    x = (RNG.standard_normal((4, 6)) * 2).astype(dtype)
    w = RNG.standard_normal(6).astype(dtype)
    for op, args, attrs in [
        ("gelu", [x], {"approximate": "tanh"}),
        ("gelu", [x], {}),
        ("softmax", [x], {"axis": 0}),
        ("rms_norm", [x, w], {"eps": 1e-6}),
        ("rms_norm", [x, None], {}),
        ("scale", [x], {"alpha": 0.1}),
        ("topk", [x], {"k": 2, "largest": False}),
        ("rms_norm_backward", [x, x, w], {}),
    ]:
        got = pox.run(op, *args, **attrs)
        want = polyop.run(op, *args, **attrs)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        assert all(same_bits(a, b) for a, b in zip(got, want)), (op, dtype)
        # and right, not merely the same: against the independent float64 reference
        exact = conformance_reference.reference(op, list(args), dict(attrs))
        bad = compare_to_reference(Case(op, list(args), dict(attrs)), list(got), exact)
        assert bad is None, (op, np.dtype(dtype).name, bad)


def test_pox_run_strided_input():
    x = RNG.standard_normal((6, 8)).astype(np.float32)[::2, ::-1].T
    assert not x.flags.c_contiguous
    assert same_bits(pox.run("relu", x), np.maximum(x, 0))
    assert same_bits(pox.run("add", x, x[:, :1]), x + x[:, :1])


def test_empty_tensors():
    x = np.zeros((0, 4), np.float32)
    assert pox.run("gelu", x).shape == (0, 4)
    v, i = pox.run("topk", np.zeros((3, 0), np.float32), k=0)
    assert v.shape == (3, 0) and i.shape == (3, 0)


# ------------------------------------------------------------------------------------------
# Python helpers


def test_make_node_attribute_types():
    n = pox.make_node("topk", ["x"], ["v", "i"], k=2, largest=False, axis=-1)
    attrs = {a.name: a for a in n.attribute}
    assert n.domain == "ai.polyop" and n.op_type == "TopK"
    assert attrs["largest"].type == onnx.AttributeProto.INT and attrs["largest"].i == 0
    assert attrs["k"].type == onnx.AttributeProto.INT and attrs["k"].i == 2
    n = pox.make_node("rms_norm", ["x", None], ["y"], eps=1)
    assert list(n.input) == ["x", ""]
    assert n.attribute[0].type == onnx.AttributeProto.FLOAT and n.attribute[0].f == 1.0
    n = pox.make_node("gelu", ["x"], ["y"], approximate="tanh")
    assert n.attribute[0].type == onnx.AttributeProto.STRING
    with pytest.raises(TypeError, match="unknown attribute `kk`"):
        pox.make_node("topk", ["x"], ["v", "i"], kk=2)
    with pytest.raises(TypeError, match="`k` must be int"):
        pox.make_node("topk", ["x"], ["v", "i"], k=1.5)


def test_session_options_and_make_model():
    so = pox.session_options(intra_op_num_threads=2)
    assert so.intra_op_num_threads == 2
    x = np.array([[1, 3, 3, 2]], np.float32)
    m = pox.make_model("topk", [x], k=2)
    onnx.checker.check_model(m)
    assert {(o.domain, o.version) for o in m.opset_import} >= {("ai.polyop", 1)}
    v, i = ort.InferenceSession(m.SerializeToString(), so).run(None, {"x": x})
    assert v.tolist() == [[3, 3]] and i.tolist() == [[1, 2]]
    m = pox.make_model("softmax", [((None, 5), "float64")])
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 0
    assert pox.op_type("rms_norm_backward") == "RmsNormBackward"
    with pytest.raises(TypeError):
        pox.session_options(no_such_option=1)


# ------------------------------------------------------------------------------------------
# bad input: onnxruntime's error type, "polyop.<op>" and the problem in the message, and the
# process keeps working

x32 = np.ones((2, 4), np.float32)

BAD = [
    # (id, op_type, inputs, attrs, problem)
    ("wrong dtype", "Gelu", [("x", np.ones(3, np.int32))], {}, "unsupported dtype int32"),
    # the supported list is the op's own (negate: numeric; no bool, which no op takes)
    (
        "unsupported onnx dtype",
        "Negate",
        [("x", np.ones(3, np.uint8))],
        {},
        "unsupported dtype uint8 for input `x` (supported: float16, bfloat16, float32, float64, int32, int64)",
    ),
    ("dtype mismatch", "Add", [("x", x32), ("y", x32.astype(np.float64))], {}, "dtype mismatch"),
    ("bad broadcast", "Add", [("x", np.ones(2, np.float32)), ("y", np.ones(3, np.float32))], {}, "cannot be broadcast"),
    ("axis out of range", "Softmax", [("x", x32)], {"axis": 2}, "axis 2 is out of range"),
    ("k out of range", "TopK", [("x", x32)], {"k": 5}, "k=5 is out of range for axis 1 of size 4"),
    ("negative k", "TopK", [("x", x32)], {"k": -1}, "k=-1 must be >= 0"),
    ("missing k", "TopK", [("x", x32)], {}, "missing required attribute `k`"),
    ("bad approximate", "Gelu", [("x", x32)], {"approximate": "fast"}, 'approximate must be "none" or "tanh", got "fast"'),
    # an embedded NUL is part of the value, not the end of it (it used to be cut off: "tanh")
    ("NUL in a string attribute", "Gelu", [("x", x32)], {"approximate": b"tanh\x00x"}, 'approximate must be "none" or "tanh", got "tanh\\0x"'),
    ("wrong attribute type", "Gelu", [("x", x32)], {"approximate": 1}, "`approximate` must be str"),
    ("bool out of range", "TopK", [("x", x32)], {"k": 1, "largest": 2}, "`largest` must be bool"),
    ("wrong weight shape", "RmsNorm", [("x", x32), ("w", np.ones(3, np.float32))], {}, "weight must have shape [4]"),
    (
        "conv channel mismatch",
        "Conv2d",
        [("x", np.ones((1, 3, 5, 5), np.float32)), ("w", np.ones((2, 2, 3, 3), np.float32))],
        {},
        "input has 3 channels but weight expects 2",
    ),
]


def _onnx_name_to_op(onnx_name):
    return op_name(onnx_name)


def _check_next_run_works():
    x = np.array([[1, 3, 3, 2]], np.float32)
    v, i = run_model(one_node("TopK", [("x", x)], ["v", "i"], k=2), {"x": x})
    assert v.tolist() == [[3, 3]] and i.tolist() == [[1, 2]]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_static_shapes_fail_session_creation(case):
    _, op_type, inputs, attrs, problem = case
    outs = ["a", "b"] if op_type == "TopK" else ["a"]
    m = one_node(op_type, inputs, outs, **attrs)
    with pytest.raises(RuntimeException) as e:  # kernel creation failures, as ORT reports them
        run_model(m, dict(inputs))
    msg = str(e.value)
    assert f"polyop.{_onnx_name_to_op(op_type)}:" in msg, msg
    assert problem.lower() in msg.lower(), msg
    _check_next_run_works()


def _if_model(then_node):
    """An If whose then-branch holds ``then_node`` (x: float[2, 4] from the outer scope)."""
    then_g = helper.make_graph([then_node], "then", [], [out("t")])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "else", [], [out("t")])
    cond = helper.make_tensor("c", TP.BOOL, [], [True])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    m = onnx.load_from_string(model([node], [vi("x", TP.FLOAT, [2, 4])], [out("y")]))
    m.graph.initializer.append(cond)
    return m


@pytest.mark.parametrize("where", ["top level", "If subgraph"])
@pytest.mark.parametrize(
    "op_type, attrs, problem",
    [
        ("Softmax", {"axes": 0}, "polyop.softmax: {node}unknown attribute `axes` (this op takes: axis)"),
        ("Negate", {"alpha": 1.0}, "polyop.negate: {node}unknown attribute `alpha` (this op takes: no attributes)"),
        ("Softmx", {}, "polyop: {node}no op 'Softmx' in domain ai.polyop"),
    ],
)
def test_unknown_attribute_or_op_type_fails_the_session(where, op_type, attrs, problem):
    # ONNX Runtime builds custom-op schemas with AllowUncheckedAttributes() and a kernel cannot
    # list its node's attributes: a raw session would run softmax with axis=-1. pox.session
    # (and pox.check_model, for sessions made from pox.session_options) refuse the model.
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    node = helper.make_node(op_type, ["x"], ["t" if where != "top level" else "y"], domain="ai.polyop",
                            name="n1", **attrs)
    m = onnx.load_from_string(one_node(op_type, [("x", x)], ["y"], **attrs)) if where == "top level" else _if_model(node)
    if where == "top level":
        m.graph.node[0].name = "n1"
    want = problem.format(node=f'node "n1" (ai.polyop::{op_type}): ')
    for call in (lambda: pox.session(m), lambda: pox.check_model(m), lambda: pox.check_model(m.SerializeToString())):
        with pytest.raises(InvalidGraph) as e:
            call()
        assert str(e.value) == want if op_type != "Softmx" else str(e.value).startswith(want), str(e.value)
    # the same model with the attribute spelled right runs, and matches NumPy's softmax
    if op_type == "Softmax":
        node.ClearField("attribute")
        node.attribute.append(helper.make_attribute("axis", 0))
        m = one_node(op_type, [("x", x)], ["y"], axis=0) if where == "top level" else _if_model(node)
        pox.check_model(m)
        (y,) = pox.session(m).run(None, {"x": x})
        e = np.exp(x - x.max(axis=0))
        np.testing.assert_allclose(y, e / e.sum(axis=0), rtol=4 * 2.0**-23)


DYNAMIC_BAD = [c for c in BAD if c[0] in {"bad broadcast", "axis out of range", "k out of range", "wrong weight shape", "conv channel mismatch"}]


@pytest.mark.parametrize("case", DYNAMIC_BAD, ids=[c[0] for c in DYNAMIC_BAD])
def test_bad_input_dynamic_shapes_fail_the_run_with_invalid_argument(case):
    _, op_type, inputs, attrs, problem = case
    outs = ["a", "b"] if op_type == "TopK" else ["a"]
    node = helper.make_node(op_type, [n for n, _ in inputs], outs, domain="ai.polyop", **attrs)
    ins = [vi(n, pox.tensor_type(a.dtype), None) for n, a in inputs]  # unknown rank
    m = model([node], ins, [out(o) for o in outs])
    sess = ort.InferenceSession(m, raw_options())  # shapes unknown: creation succeeds
    with pytest.raises(InvalidArgument) as e:
        sess.run(None, dict(inputs))
    msg = str(e.value)
    assert f"polyop.{_onnx_name_to_op(op_type)}:" in msg and problem.lower() in msg.lower(), msg
    # The same session keeps working with good inputs.
    good = {
        "bad broadcast": {"x": np.ones(3, np.float32), "y": np.ones(1, np.float32)},
        "axis out of range": {"x": np.ones((2, 2, 3), np.float32)},
        "k out of range": {"x": np.ones((2, 8), np.float32)},
        "wrong weight shape": {"x": x32, "w": np.ones(4, np.float32)},
        "conv channel mismatch": {"x": np.ones((1, 2, 5, 5), np.float32), "w": np.ones((2, 2, 3, 3), np.float32)},
    }[case[0]]
    res = sess.run(None, good)
    # the values, computed here with NumPy (all inputs are ones)
    want = {
        "bad broadcast": [np.full(3, 2.0, np.float32)],
        "axis out of range": [np.full((2, 2, 3), 1 / 3, np.float32)],
        "k out of range": [np.ones((2, 5), np.float32), np.tile(np.arange(5, dtype=np.int64), (2, 1))],
        "wrong weight shape": [np.full((2, 4), 1 / np.sqrt(1 + 1e-6), np.float32)],
        "conv channel mismatch": [np.full((1, 2, 3, 3), 18.0, np.float32)],
    }[case[0]]
    assert len(res) == len(want)
    for r, w in zip(res, want):
        assert r.dtype == w.dtype and r.shape == w.shape, (r.dtype, r.shape)
        np.testing.assert_allclose(r, w, rtol=2**-23, atol=0)
    _check_next_run_works()


def test_pox_run_surfaces_onnxruntime_errors():
    with pytest.raises(RuntimeException, match=r"polyop\.softmax: .*axis 3 is out of range"):
        pox.run("softmax", x32, axis=3)
    assert pox.run("softmax", x32, axis=1).shape == (2, 4)
