"""ONNX Runtime, standard ops: libpolyop_onnxruntime.so as a plugin execution provider
(PolyopExecutionProvider) claiming the standard ONNX nodes polyop ops implement.

Every result is compared with an independent reference (NumPy in float64, or ONNX Runtime's
own CPU provider for whole models), in every dtype the claim covers, within a few units of
the dtype's rounding. Where each node ran is read from ONNX Runtime's own profile (every node
event names its provider): a claimed node must have run on PolyopExecutionProvider, a node
outside polyop's semantics on the CPU provider; the CPU-only session of the same model is the
negative control of that check."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import polyop.onnxruntime as pox

ROOT = Path(__file__).resolve().parents[1]

EP = "PolyopExecutionProvider"
CPU = "CPUExecutionProvider"
FLOAT = ["float16", "bfloat16", "float32", "float64"]
NUMERIC = FLOAT + ["int32", "int64"]
ONNX_TYPE = {
    "float16": TP.FLOAT16, "bfloat16": TP.BFLOAT16, "float32": TP.FLOAT, "float64": TP.DOUBLE,
    "int32": TP.INT32, "int64": TP.INT64, "uint8": TP.UINT8,
}
#: unit roundoff of each float dtype
EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
RNG = np.random.default_rng(21)


def npdtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def data(shape, dtype, low=-50, high=50):
    if dtype in EPS:
        return RNG.standard_normal(shape).astype(npdtype(dtype))
    return RNG.integers(low, high, size=shape).astype(dtype)


def make(nodes, inputs, outputs, opset, initializers=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return m.SerializeToString()


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, ONNX_TYPE[dtype], shape)


def run(model, feeds, tmp_path, provider=True):
    """Outputs and {node name: provider} from ONNX Runtime's profile."""
    kw = dict(enable_profiling=True, profile_file_prefix=str(tmp_path / ("ep" if provider else "cpu")))
    if provider:
        sess = ort.InferenceSession(model, pox.provider_session_options(**kw))
    else:
        so = ort.SessionOptions()
        for k, v in kw.items():
            setattr(so, k, v)
        sess = ort.InferenceSession(model, so, providers=[CPU])
    names = [o.name for o in sess.get_outputs()]
    outs = pox._run_ortvalues(sess, {k: pox._feed(v) for k, v in feeds.items()}, names)
    prof = sess.end_profiling()
    with open(prof) as f:
        events = json.load(f)
    os.remove(prof)
    where = {
        e["name"].removesuffix("_kernel_time"): e["args"]["provider"]
        for e in events
        if e.get("cat") == "Node" and "provider" in e.get("args", {})
    }
    if provider:
        # a Conv + Relu that polyop fused ran as one node the model does not name: its model
        # nodes are those ONNX Runtime's partitioning record gives polyop's provider and the
        # profile does not list (provided a fused node did run on it)
        assigned = pox.node_providers(sess)
        fused_ran = any(k not in assigned and v == EP for k, v in where.items() if k.startswith(EP))
        for k, v in assigned.items():
            if k not in where and v == EP and fused_ran:
                where[k] = EP
    return outs, where


def assert_close(got, ref, dtype, ulps, scale=None):
    """|got - ref| <= ulps units of the dtype's rounding of `scale` (default |ref|, at least 1
    ulp of 1); integers exactly."""
    got64 = np.asarray(got).astype(np.float64)
    assert got64.shape == np.shape(ref)
    if dtype not in EPS:
        np.testing.assert_array_equal(got64, ref)
        return
    s = np.abs(ref) if scale is None else scale
    tol = ulps * EPS[dtype] * np.maximum(s, 1.0 if scale is None else 0.0) + 1e-300
    bad = np.abs(got64 - ref) > tol
    assert not bad.any(), f"{bad.sum()} elements off, max err {np.abs(got64 - ref).max()}"


def one_node(op_type, dtypes_in, shapes, opset, attrs=None, inputs=None, n_out=1,
             initializers=(), out_dtypes=None):
    names = inputs or [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node(op_type, names, [f"y{i}" for i in range(n_out)], name="n0", **(attrs or {}))
    ins = [vi(n, d, s) for n, d, s in zip(names, dtypes_in, shapes) if n]
    outs = [helper.make_tensor_value_info(f"y{i}", ONNX_TYPE[(out_dtypes or [dtypes_in[0]] * n_out)[i]], None)
            for i in range(n_out)]
    return make([node], ins, outs, opset, initializers)


def allowed(op_type, opset, dtype):
    """Whether ONNX's schema of `op_type` at `opset` takes `dtype` for its first input (ONNX
    Runtime refuses the model otherwise, before any provider sees it)."""
    schema = onnx.defs.get_schema(op_type, opset)
    tc = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    return f"tensor({'double' if dtype == 'float64' else 'float' if dtype == 'float32' else dtype})" in tc[
        schema.inputs[0].type_str]


def erf(x):
    return np.vectorize(math.erf)(x)


# ---- the claim table --------------------------------------------------------------------------


def test_the_mappings_cover_every_attribute_of_onnx_s_schemas():
    """Each declared (op type, version) is a real ONNX schema version, and the mapping knows
    every attribute that schema has (an attribute it did not know would be ignored)."""
    seen = set()
    for op in pox.load().info["ops"]:
        for m in op["onnx_standard"]:
            for v in m["versions"]:
                schema = onnx.defs.get_schema(m["op_type"], v)
                assert schema.since_version == v, (m["op_type"], v)
                assert set(schema.attributes) == set(m["attrs"]), (m["op_type"], v)
                seen.add(m["op_type"])
    assert seen == {"Neg", "Add", "Sum", "Relu", "Gelu", "Softmax", "RMSNormalization", "TopK",
                    "Conv", "NonZero"}


def test_the_docs_table_lists_every_claim():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "onnxruntime.md").read_text()
    for op in pox.load().info["ops"]:
        for m in op["onnx_standard"]:
            row = f"| `{m['op_type']}` | {', '.join(map(str, m['versions']))} | `{op['name']}` |"
            assert row in doc, row


# ---- claimed nodes: polyop's answer in every dtype ------------------------------------------------


@pytest.mark.parametrize("dtype", NUMERIC)
def test_neg_add_sum_relu(dtype, tmp_path):
    x, y = data([2, 3, 4], dtype), data([3, 1], dtype)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    cases = [
        ("Neg", 13, [x], -x64),
        ("Add", 14, [x, y], x64 + y64),
        ("Relu", 14, [x], np.maximum(x64, 0)),
    ]
    if dtype in EPS:  # ONNX's Sum is defined for float types only
        cases.append(("Sum", 13, [x, y], x64 + y64))
    for op, opset, args, ref in cases:
        if not allowed(op, opset, dtype):
            continue
        m = one_node(op, [dtype] * len(args), [a.shape for a in args], opset)
        (got,), where = run(m, {f"x{i}": a for i, a in enumerate(args)}, tmp_path)
        assert where == {"n0": EP}, (op, where)
        assert_close(got, ref, dtype, 1)


@pytest.mark.parametrize("dtype", FLOAT)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(dtype, approximate, tmp_path):
    x = data([4, 33], dtype)
    x64 = x.astype(np.float64)
    if approximate == "none":
        ref = 0.5 * x64 * (1 + erf(x64 / math.sqrt(2)))
    else:
        ref = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    m = one_node("Gelu", [dtype], [x.shape], 20, {"approximate": approximate})
    (got,), where = run(m, {"x0": x}, tmp_path)
    assert where == {"n0": EP}
    assert_close(got, ref, dtype, 4, scale=np.abs(x64) + 1e-3)


def softmax_ref(x64, axes):
    e = np.exp(x64 - x64.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


@pytest.mark.parametrize("dtype", FLOAT)
def test_softmax_every_opset(dtype, tmp_path):
    x = data([2, 3, 5], dtype)
    x64 = x.astype(np.float64)
    cases = [
        (13, {"axis": 1}, softmax_ref(x64, (1,))),
        (13, {}, softmax_ref(x64, (2,))),
        # before opset 13: the input viewed as 2-D at axis (default 1): softmax over every dim
        # from axis on
        (11, {}, softmax_ref(x64, (1, 2))),
        (11, {"axis": 2}, softmax_ref(x64, (2,))),
        (1, {"axis": 0}, softmax_ref(x64, (0, 1, 2))),
    ]
    for opset, attrs, ref in cases:
        if not allowed("Softmax", opset, dtype):
            continue
        m = one_node("Softmax", [dtype], [["N", 3, 5]], opset, attrs)
        (got,), where = run(m, {"x0": x}, tmp_path)
        assert where == {"n0": EP}, (opset, attrs)
        assert_close(got, ref, dtype, 4)


@pytest.mark.parametrize("dtype", FLOAT)
def test_rms_normalization(dtype, tmp_path):
    x = data([2, 3, 4], dtype)
    x64 = x.astype(np.float64)
    for axis in [-1, 1]:
        w = data(x.shape[axis:], dtype)
        axes = tuple(range(axis % 3, 3))
        rms = np.sqrt((x64**2).mean(axis=axes, keepdims=True) + 1e-5)
        ref = x64 / rms * w.astype(np.float64)
        m = one_node("RMSNormalization", [dtype, dtype], [x.shape, w.shape], 23, {"axis": axis})
        (got,), where = run(m, {"x0": x, "x1": w}, tmp_path)
        assert where == {"n0": EP}
        assert_close(got, ref, dtype, 6, scale=np.abs(x64 / rms * w.astype(np.float64)) + 1e-3)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_topk(dtype, tmp_path):
    x = data([3, 7], dtype, -4, 4)  # ties among the integers: the lower index first
    x64 = x.astype(np.float64)
    for opset, largest in [(11, 1), (11, 0), (24, 1), (10, 1)]:
        if not allowed("TopK", opset, dtype):
            continue
        attrs = {"axis": 1} | ({"largest": largest} if opset >= 11 else {})
        k = numpy_helper.from_array(np.array([3], np.int64), "k")
        m = one_node("TopK", [dtype], [x.shape], opset, attrs, inputs=["x0", "k"], n_out=2,
                     initializers=[k], out_dtypes=[dtype, "int64"])
        (vals, idx), where = run(m, {"x0": x}, tmp_path)
        assert where == {"n0": EP}
        order = np.argsort(-x64 if largest else x64, axis=1, kind="stable")[:, :3]
        np.testing.assert_array_equal(idx, order)
        np.testing.assert_array_equal(vals.astype(np.float64), np.take_along_axis(x64, order, 1))
    # K a graph input: read at run time, a different k per run
    if allowed("TopK", 11, dtype):
        m = one_node("TopK", [dtype, "int64"], [["R", 7], [1]], 11, {"largest": 1},
                     inputs=["x0", "x1"], n_out=2, out_dtypes=[dtype, "int64"])
        sess = ort.InferenceSession(m, pox.provider_session_options())
        for kk in [1, 7, 0, 3]:
            vals, idx = pox._run_ortvalues(
                sess, {"x0": pox._feed(x), "x1": np.array([kk], np.int64)}, ["y0", "y1"])
            np.testing.assert_array_equal(idx, np.argsort(-x64, axis=1, kind="stable")[:, :kk])
        with pytest.raises(Exception, match=r"polyop\.topk"):
            pox._run_ortvalues(sess, {"x0": pox._feed(x), "x1": np.array([8], np.int64)}, ["y0", "y1"])
    # opset 1: k an attribute
    if not allowed("TopK", 1, dtype):
        return
    m = one_node("TopK", [dtype], [x.shape], 1, {"k": 2}, n_out=2, out_dtypes=[dtype, "int64"])
    (vals, idx), where = run(m, {"x0": x}, tmp_path)
    assert where == {"n0": EP}
    np.testing.assert_array_equal(idx, np.argsort(-x64, axis=1, kind="stable")[:, :2])


def conv_ref(x, w, b, stride, pads, dilation, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (xp.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (xp.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg,
                           i * dilation[0]: i * dilation[0] + stride[0] * (oh - 1) + 1: stride[0],
                           j * dilation[1]: j * dilation[1] + stride[1] * (ow - 1) + 1: stride[1]]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    return out + (0 if b is None else b[None, :, None, None])


@pytest.mark.parametrize("dtype", FLOAT)
def test_conv(dtype, tmp_path):
    x = data([2, 4, 7, 6], dtype)
    cases = [
        # (attrs, weight shape, bias, the pads polyop must use)
        ({"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]}, [6, 2, 3, 2], True, [1, 0, 2, 1]),
        ({"group": 4, "kernel_shape": [3, 3]}, [4, 1, 3, 3], False, [0, 0, 0, 0]),  # depthwise
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [3, 4, 3, 2], True, None),
        ({"auto_pad": "SAME_LOWER"}, [3, 4, 2, 2], False, None),
        ({"auto_pad": "VALID"}, [3, 4, 3, 3], True, [0, 0, 0, 0]),
    ]
    for attrs, wshape, bias, pads in cases:
        w = data(wshape, dtype)
        b = data([wshape[0]], dtype) if bias else None
        stride, dilation = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
        if pads is None:  # SAME: output size ceil(in / stride)
            pads = []
            tot = []
            for a in range(2):
                n_in, k = x.shape[2 + a], wshape[2 + a]
                t = max(0, (-(-n_in // stride[a]) - 1) * stride[a] + (k - 1) * dilation[a] + 1 - n_in)
                tot.append(t)
            lower = attrs["auto_pad"] == "SAME_LOWER"
            begin = [(t + 1) // 2 if lower else t // 2 for t in tot]
            pads = begin + [t - bb for t, bb in zip(tot, begin)]
        args = [x, w] + ([b] if bias else [])
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        b64 = None if b is None else b.astype(np.float64)
        ref = conv_ref(x64, w64, b64, stride, pads, dilation, attrs.get("group", 1))
        scale = conv_ref(np.abs(x64), np.abs(w64), None if b is None else np.abs(b64), stride, pads,
                         dilation, attrs.get("group", 1))
        m = one_node("Conv", [dtype] * len(args), [a.shape for a in args], 11 if dtype != "bfloat16" else 22, attrs)
        (got,), where = run(m, {f"x{i}": a for i, a in enumerate(args)}, tmp_path)
        assert where == {"n0": EP}, attrs
        # float32 accumulation of up to 36 products, then one rounding to the dtype
        ulps = 2 if dtype in ("float16", "bfloat16") else 40
        assert_close(got, ref, dtype, ulps, scale=scale)


def test_conv_relu_runs_as_one_fused_node(tmp_path, monkeypatch):
    """A float32 Conv whose only reader is a Relu runs with it as one node on polyop's provider
    (the relu applied to each block of the convolution as it is finished), with the bits of the
    two run apart; a Conv whose output the graph also returns, and a float16 Conv + Relu, run
    as separate polyop nodes. Outputs against a NumPy reference."""
    pads = [1, 1, 1, 1]
    x = data([2, 8, 9, 9], "float32")
    w1, b1, w2, b2 = data([16, 8, 3, 3], "float32"), data([16], "float32"), data([5, 8, 1, 1], "float32"), None
    xh, wh = x.astype(np.float16), w1.astype(np.float16)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=pads),
        helper.make_node("Relu", ["c1"], ["y1"], name="relu1"),
        helper.make_node("Conv", ["x", "w2"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["y2"], name="relu2"),
        helper.make_node("Conv", ["xh", "wh"], ["c3"], name="conv3", pads=pads),
        helper.make_node("Relu", ["c3"], ["y3"], name="relu3"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in [(w1, "w1"), (b1, "b1"), (w2, "w2"), (wh, "wh")]]
    outs = [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ["y1", "c2", "y2"]]
    outs.append(helper.make_tensor_value_info("y3", TP.FLOAT16, None))
    m = make(nodes, [vi("x", "float32", x.shape), vi("xh", "float16", x.shape)], outs, 17, inits)
    feeds = {"x": x, "xh": xh}
    (y1, c2, y2, y3), where = run(m, feeds, tmp_path)
    assert all(where.get(n) == EP for n in ["conv1", "relu1", "conv2", "relu2", "conv3", "relu3"]), where
    fused = [k for k in where if k.startswith(EP)]
    assert len(fused) == 1, where  # conv1 + relu1; the others ran under their own names
    assert "conv1" not in fused and {"conv2", "relu2", "conv3", "relu3"} <= set(where)
    x64 = x.astype(np.float64)
    ref1 = conv_ref(x64, w1.astype(np.float64), b1.astype(np.float64), [1, 1], pads, [1, 1], 1)
    scale1 = conv_ref(np.abs(x64), np.abs(w1.astype(np.float64)), np.abs(b1.astype(np.float64)),
                      [1, 1], pads, [1, 1], 1)
    assert (ref1 < 0).mean() > 0.2, "the test needs negative convolution outputs"
    assert_close(y1, np.maximum(ref1, 0), "float32", 40, scale=scale1)
    ref2 = conv_ref(x64, w2.astype(np.float64), b2, [1, 1], [0] * 4, [1, 1], 1)
    scale2 = conv_ref(np.abs(x64), np.abs(w2.astype(np.float64)), None, [1, 1], [0] * 4, [1, 1], 1)
    assert_close(c2, ref2, "float32", 40, scale=scale2)
    assert_close(y2, np.maximum(ref2, 0), "float32", 40, scale=scale2)
    ref3 = conv_ref(xh.astype(np.float64), wh.astype(np.float64), None, [1, 1], pads, [1, 1], 1)
    assert_close(y3, np.maximum(ref3, 0), "float16", 2,
                 scale=conv_ref(np.abs(xh.astype(np.float64)), np.abs(wh.astype(np.float64)), None,
                                [1, 1], pads, [1, 1], 1))
    # unfused (POLYOP_ORT_EP_FUSE=0): the same bits, from two nodes
    monkeypatch.setenv("POLYOP_ORT_EP_FUSE", "0")
    (u1, _, _, _), where = run(m, feeds, tmp_path)
    assert not [k for k in where if k.startswith(EP)] and where.get("relu1") == EP, where
    np.testing.assert_array_equal(u1.view(np.uint32), y1.view(np.uint32))


def test_constant_conv_weights_are_prepacked_with_the_bits_of_weights_fed_at_run_time(
        tmp_path, monkeypatch, capfd):
    """A Conv whose weight is a constant initializer gets it packed once, when the session is
    made (POLYOP_ORT_EP_VERBOSE names each), for the fused chains and single nodes alike, in
    float32 and float16; a weight fed at run time, and a depthwise layer's (read in place),
    are not, nor any with POLYOP_ORT_EP_PREPACK=0. Every output has the bits of the same model
    with all weights fed at run time, and matches a NumPy reference."""
    x, xh = data([1, 12, 9, 9], "float32"), data([1, 12, 9, 9], "float16")
    w = {"w1": data([20, 12, 3, 3], "float32"), "w2": data([34, 12, 1, 1], "float32"),
         "w3": data([8, 12, 3, 3], "float32"), "w4": data([12, 1, 3, 3], "float32"),
         "w5": data([10, 12, 1, 1], "float16")}
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=pads),
        helper.make_node("Relu", ["c1"], ["y1"], name="relu1"),
        helper.make_node("Conv", ["x", "w2"], ["y2"], name="conv2"),
        helper.make_node("Conv", ["x", "w3"], ["y3"], name="conv3", pads=pads),
        helper.make_node("Conv", ["x", "w4"], ["y4"], name="conv4", pads=pads, group=12),
        helper.make_node("Conv", ["xh", "w5"], ["y5"], name="conv5"),
    ]
    outs = [helper.make_tensor_value_info(f"y{i}", TP.FLOAT16 if i == 5 else TP.FLOAT, None)
            for i in range(1, 6)]
    ins = [vi("x", "float32", x.shape), vi("xh", "float16", xh.shape)]
    # w3 is fed at run time in both models; every weight is in the second
    consts = make(nodes, ins + [vi("w3", "float32", w["w3"].shape)], outs, 17,
                  [numpy_helper.from_array(v, k) for k, v in w.items() if k != "w3"])
    fed = make(nodes, ins + [vi(k, "float16" if k == "w5" else "float32", v.shape) for k, v in w.items()],
               outs, 17)
    monkeypatch.setenv("POLYOP_ORT_EP_VERBOSE", "1")
    capfd.readouterr()
    got, where = run(consts, {"x": x, "xh": xh, "w3": w["w3"]}, tmp_path)
    log = capfd.readouterr().err
    assert all(where.get(n.name) == EP for n in nodes), where
    assert len([k for k in where if k.startswith(EP)]) == 1, where  # conv1 + relu1
    # conv1 (fused), conv2 and conv5; not conv3 (fed) nor conv4 (depthwise)
    assert log.count("Conv (version 11) prepacked input(s) [1]") == 3, log
    want, _ = run(fed, {"x": x, "xh": xh, **w}, tmp_path)
    assert "prepacked" not in capfd.readouterr().err
    # POLYOP_ORT_EP_PREPACK=0 (for comparisons): nothing packed, the same bits
    monkeypatch.setenv("POLYOP_ORT_EP_PREPACK", "0")
    off, _ = run(consts, {"x": x, "xh": xh, "w3": w["w3"]}, tmp_path)
    assert "prepacked" not in capfd.readouterr().err
    for g, u, v in zip(got, want, off):
        bits = lambda a: a.view(np.uint16 if a.dtype == np.float16 else np.uint32)  # noqa: E731
        np.testing.assert_array_equal(bits(g), bits(u))
        np.testing.assert_array_equal(bits(g), bits(v))
    x64, xh64 = x.astype(np.float64), xh.astype(np.float64)
    for out, (xin, k, p, grp, relu, dtype) in zip(got, [
            (x64, "w1", pads, 1, True, "float32"), (x64, "w2", [0] * 4, 1, False, "float32"),
            (x64, "w3", pads, 1, False, "float32"), (x64, "w4", pads, 12, False, "float32"),
            (xh64, "w5", [0] * 4, 1, False, "float16")]):
        w64 = w[k].astype(np.float64)
        ref = conv_ref(xin, w64, None, [1, 1], p, [1, 1], grp)
        scale = conv_ref(np.abs(xin), np.abs(w64), None, [1, 1], p, [1, 1], grp)
        assert_close(out, np.maximum(ref, 0) if relu else ref, dtype, 2 if dtype == "float16" else 40,
                     scale=scale)


def test_conv_relu_with_a_dynamic_batch_is_fused_and_exact(tmp_path):
    """A Conv + Relu whose batch dim is symbolic is fused too, and gives the bits of the two
    nodes run apart at every batch size."""
    w = data([4, 3, 3, 3], "float32")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    m = make(nodes, [vi("x", "float32", ["N", 3, 7, 7])], [helper.make_tensor_value_info("y", TP.FLOAT, None)],
             13, [numpy_helper.from_array(w, "w")])
    for n in [1, 3]:
        x = data([n, 3, 7, 7], "float32")
        (y,), where = run(m, {"x": x}, tmp_path)
        assert len([k for k in where if k.startswith(EP)]) == 1 and where.get("relu") == EP, where
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("POLYOP_ORT_EP_FUSE", "0")
            (u,), where = run(m, {"x": x}, tmp_path)
        assert not [k for k in where if k.startswith(EP)], where
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        ref = conv_ref(x64, w64, None, [1, 1], [1] * 4, [1, 1], 1)
        assert (ref < 0).mean() > 0.2, "the test needs negative convolution outputs"
        scale = conv_ref(np.abs(x64), np.abs(w64), None, [1, 1], [1] * 4, [1, 1], 1)
        assert_close(y, np.maximum(ref, 0), "float32", 40, scale=scale)
        np.testing.assert_array_equal(u.view(np.uint32), y.view(np.uint32))


def test_residual_block_runs_conv_add_relu_as_one_node(tmp_path):
    """ResNet's residual pattern, Conv -> Sum(conv, shortcut) -> Relu, with a shortcut that is
    a Conv too (the Sum then has two producers: one chain takes it) and an Add with the
    convolution as its second operand: each Conv + Add/Sum + Relu runs as one node on polyop,
    with the bits of the nodes run apart, and against a NumPy reference."""
    x = data([1, 6, 8, 8], "float32")
    w1, w2, w3 = data([6, 6, 3, 3], "float32"), data([6, 6, 1, 1], "float32"), data([6, 6, 1, 1], "float32")
    inits = [numpy_helper.from_array(a, n) for a, n in [(w1, "w1"), (w2, "w2"), (w3, "w3")]]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w2"], ["s"], name="conv_s"),
        helper.make_node("Sum", ["a", "s"], ["t"], name="sum"),
        helper.make_node("Relu", ["t"], ["u"], name="relu"),
        helper.make_node("Conv", ["u", "w3"], ["b"], name="conv_b"),
        helper.make_node("Add", ["u", "b"], ["v"], name="add"),
        helper.make_node("Relu", ["v"], ["y"], name="relu2"),
    ]
    m = make(nodes, [vi("x", "float32", x.shape)], [helper.make_tensor_value_info("y", TP.FLOAT, None)], 13, inits)
    (y,), where = run(m, {"x": x}, tmp_path)
    assert all(where.get(n.name) == EP for n in nodes), where
    assert len([k for k in where if k.startswith(EP)]) == 2, where  # conv_s stays alone
    x64 = x.astype(np.float64)
    conv = lambda a, w, p: conv_ref(a, w.astype(np.float64), None, [1, 1], [p] * 4, [1, 1], 1)
    u = np.maximum(conv(x64, w1, 1) + conv(x64, w2, 0), 0)
    want = np.maximum(u + conv(u, w3, 0), 0)
    assert (want == 0).mean() > 0.2 and (want > 0).mean() > 0.2
    assert_close(y, want, "float32", 200, scale=np.abs(want) + np.abs(u) + 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POLYOP_ORT_EP_FUSE", "0")
        (u_y,), where = run(m, {"x": x}, tmp_path)
    assert not [k for k in where if k.startswith(EP)] and where.get("sum") == EP, where
    np.testing.assert_array_equal(u_y.view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize("dtype", NUMERIC)
def test_nonzero(dtype, tmp_path):
    x = data([3, 4, 5], dtype, -1, 2)
    x[0, 0, 0] = 0
    m = one_node("NonZero", [dtype], [["A", 4, 5]], 13, out_dtypes=["int64"])
    (got,), where = run(m, {"x0": x}, tmp_path)
    assert where == {"n0": EP}
    np.testing.assert_array_equal(got, np.array(np.nonzero(x.astype(np.float64))))
    assert got.shape[0] == 3 and got.shape[1] == np.count_nonzero(x.astype(np.float64))


# ---- what is not exactly polyop's op stays on the CPU provider ---------------------------------


def test_outside_the_semantics_stays_on_cpu(tmp_path):
    x = data([2, 5], "float32")
    x64 = x.astype(np.float64)
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    cases = [
        # unsorted TopK: polyop's output order is sorted
        (one_node("TopK", ["float32"], [x.shape], 11, {"sorted": 0}, inputs=["x0", "k"], n_out=2,
                  initializers=[k], out_dtypes=["float32", "int64"]), {"x0": x}, None),
        # K of two elements (ONNX requires one)
        (one_node("TopK", ["float32", "int64"], [x.shape, [2]], 11, inputs=["x0", "x1"], n_out=2,
                  out_dtypes=["float32", "int64"]),
         {"x0": x, "x1": np.array([2, 2], np.int64)}, "error"),
        # three-input Sum
        (one_node("Sum", ["float32"] * 3, [x.shape] * 3, 13), {"x0": x, "x1": x, "x2": x}, 3 * x64),
        # a dtype polyop has no kernel for
        (one_node("Add", ["uint8", "uint8"], [x.shape] * 2, 14),
         {"x0": np.full(x.shape, 200, np.uint8), "x1": np.full(x.shape, 100, np.uint8)},
         np.full(x.shape, 44.0)),
        # a 1-D convolution
        (one_node("Conv", ["float32"] * 2, [[1, 2, 9], [3, 2, 3]], 11),
         {"x0": data([1, 2, 9], "float32"), "x1": data([3, 2, 3], "float32")}, None),
        # SAME padding over a dynamic spatial dim
        (one_node("Conv", ["float32"] * 2, [[1, 2, "H", 5], [3, 2, 3, 3]], 11, {"auto_pad": "SAME_UPPER"}),
         {"x0": data([1, 2, 6, 5], "float32"), "x1": data([3, 2, 3, 3], "float32")}, None),
        # NonZero of a scalar: ONNX's is that of a one-element vector, [1, n]
        (one_node("NonZero", ["float32"], [[]], 13, out_dtypes=["int64"]),
         {"x0": np.array(2.0, np.float32)}, np.zeros((1, 1))),
        # a scale that only broadcasts to the normalized shape
        (one_node("RMSNormalization", ["float32"] * 2, [x.shape, [1]], 23),
         {"x0": x, "x1": np.array([2.0], np.float32)}, None),
    ]
    for m, feeds, ref in cases:
        if isinstance(ref, str):  # ONNX Runtime's own error, not polyop's
            with pytest.raises(Exception) as e:
                run(m, feeds, tmp_path)
            assert "polyop" not in str(e.value)
            continue
        got, where = run(m, feeds, tmp_path)
        assert where == {"n0": CPU}, (onnx.load_from_string(m).graph.node[0], where)
        cpu, _ = run(m, feeds, tmp_path, provider=False)
        for g, c in zip(got, cpu):
            np.testing.assert_array_equal(g, c)
        if ref is not None:
            np.testing.assert_allclose(got[0], ref, rtol=1e-6)


def test_cpu_only_session_is_the_negative_control(tmp_path):
    """The placement check can fail: the same model without the provider runs on CPU."""
    m = one_node("Neg", ["float32"], [[3]], 13)
    x = data([3], "float32")
    (a,), where_ep = run(m, {"x0": x}, tmp_path)
    (b,), where_cpu = run(m, {"x0": x}, tmp_path, provider=False)
    assert where_ep == {"n0": EP} and where_cpu == {"n0": CPU}
    np.testing.assert_array_equal(a, b)


def test_dynamic_dims_no_copies_mixed_graph(tmp_path):
    """A dynamic dim at several sizes; polyop's and the CPU provider's nodes in one graph with
    no copy node between them (the profile lists only the model's nodes)."""
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="neg"),
        helper.make_node("Abs", ["a"], ["b"], name="abs"),
        helper.make_node("Add", ["b", "x"], ["c"], name="add"),
        helper.make_node("Softmax", ["c"], ["y"], name="softmax", axis=-1),
    ]
    m = make(nodes, [vi("x", "float32", ["N", 6])], [vi("y", "float32", ["N", 6])], 13)
    sess_so = pox.provider_session_options(enable_profiling=True, profile_file_prefix=str(tmp_path / "d"))
    sess = ort.InferenceSession(m, sess_so)
    for n in [1, 5, 17, 0]:
        x = data([n, 6], "float32")
        (y,) = sess.run(None, {"x": x})
        x64 = x.astype(np.float64)
        ref = softmax_ref(np.abs(-x64) + x64, (1,)) if n else np.zeros((0, 6))
        assert_close(y, ref, "float32", 4)
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    where = {e["name"].removesuffix("_kernel_time"): e["args"]["provider"]
             for e in events if e.get("cat") == "Node" and "provider" in e.get("args", {})}
    assert where == {"neg": EP, "abs": CPU, "add": EP, "softmax": EP}


def test_bad_input_is_an_error_naming_the_op_and_the_session_lives_on(tmp_path):
    # k = 4 is claimable for an axis of unknown size; an input with 2 elements on it is a bad
    # input (a named dim would make `4 <= M` a requirement the claim cannot prove: not claimed)
    k = numpy_helper.from_array(np.array([4], np.int64), "k")
    m = one_node("TopK", ["float32"], [[2, None]], 11, inputs=["x0", "k"], n_out=2,
                 initializers=[k], out_dtypes=["float32", "int64"])
    sess = ort.InferenceSession(m, pox.provider_session_options())
    with pytest.raises(Exception, match=r"polyop\.topk") as e:
        sess.run(None, {"x0": data([2, 2], "float32")})
    assert "k" in str(e.value)
    vals, idx = sess.run(None, {"x0": np.arange(10, dtype=np.float32).reshape(2, 5)})
    np.testing.assert_array_equal(idx, [[4, 3, 2, 1], [4, 3, 2, 1]])
    # broadcasting that fails at run time
    m = one_node("Add", ["float32", "float32"], [[None], [None]], 14)
    sess = ort.InferenceSession(m, pox.provider_session_options())
    with pytest.raises(Exception, match=r"polyop\.add"):
        sess.run(None, {"x0": data([3], "float32"), "x1": data([4], "float32")})
    (y,) = sess.run(None, {"x0": np.ones(3, np.float32), "x1": np.ones(1, np.float32)})
    np.testing.assert_array_equal(y, [2, 2, 2])


def test_a_saved_model_runs_with_the_provider_in_a_fresh_process(tmp_path):
    x = data([2, 3, 4], "float32")
    m = one_node("Softmax", ["float32"], [x.shape], 11, {"axis": 1})
    (tmp_path / "m.onnx").write_bytes(m)
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import numpy as np, onnxruntime as ort, polyop.onnxruntime as pox
        so = pox.provider_session_options()
        s = ort.InferenceSession({str(tmp_path / "m.onnx")!r}, so)
        np.save({str(tmp_path / "y.npy")!r}, s.run(None, {{"x0": np.load({str(tmp_path / "x.npy")!r})}})[0])
        print("devices", [d.ep_name for d in pox.provider_devices()])
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert EP in r.stdout
    y = np.load(tmp_path / "y.npy")
    assert_close(y, softmax_ref(x.astype(np.float64), (1, 2)), "float32", 4)


def test_helper_registers_once_and_names_the_provider():
    d1, d2 = pox.provider_devices(), pox.provider_devices()
    assert [d.ep_name for d in d1] == [EP] == [d.ep_name for d in d2]
    assert d1[0].device.type == ort.OrtHardwareDeviceType.CPU
    assert pox.provider_name() == EP


# ---- models nobody here wrote: ONNX's own node tests, ONNX's light models ----------------------


def onnx_node_tests():
    """ONNX's backend node tests of every claimed op type (generated by the `onnx` wheel's
    own case modules, with ONNX's expected outputs), as (name, model, data sets, rtol, atol)."""
    import importlib

    import onnx.backend.test.case.node as cases

    for m in ["neg", "add", "sum", "relu", "gelu", "softmax", "rmsnormalization", "topk", "conv",
              "nonzero"]:
        importlib.import_module(f"onnx.backend.test.case.node.{m}")
    return [c for c in cases._NodeTestCases if any(n.op_type in CLAIMABLE for n in c.model.graph.node)]


#: node tests whose claimable nodes polyop does not implement, and why
NOT_CLAIMED = {
    "test_add_int8": "int8", "test_add_int16": "int16", "test_add_uint8": "uint8",
    "test_add_uint16": "uint16", "test_add_uint32": "uint32", "test_add_uint64": "uint64",
    "test_top_k_uint64": "uint64 (and ONNX Runtime's CPU provider has no TopK-24 uint64 either)",
    "test_sum_example": "three inputs", "test_sum_one_input": "one input",
    "test_nonzero_example": "bool",
}


def test_onnx_backend_node_tests(tmp_path):
    tests = onnx_node_tests()
    claimed = 0
    for c in tests:
        model = c.model
        model.ir_version = min(model.ir_version, 10)
        for i, n in enumerate(model.graph.node):
            n.name = n.name or f"node{i}"
        if c.name == "test_top_k_uint64":
            with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
                run(model.SerializeToString(), {}, tmp_path)
            continue
        for inputs, expected in c.data_sets:
            feeds = {i.name: v for i, v in zip(model.graph.input, inputs)}
            got, where = run(model.SerializeToString(), feeds, tmp_path)
            for g, e in zip(got, expected):
                if e.dtype == np.dtype(ml_dtypes.bfloat16):
                    g, e = g.astype(np.float64), e.astype(np.float64)
                np.testing.assert_allclose(g, e, rtol=c.rtol, atol=c.atol, err_msg=c.name)
        mine = {n.name for n in model.graph.node if n.op_type in CLAIMABLE}
        on_ep = {n for n in mine if where.get(n) == EP}
        if c.name in NOT_CLAIMED:
            assert not on_ep, c.name
        elif c.name.endswith("_expanded"):
            # (a function body: ONNX Runtime itself keeps small shape computations such as an
            # int64 Add of ranks on the CPU provider, whoever claimed them)
            assert on_ep, (c.name, where)
        else:
            assert on_ep == mine, (c.name, where)
            claimed += 1
    assert len(tests) >= 80 and claimed >= 45, (len(tests), claimed)


# ---- ONNX's light models --------------------------------------------

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
#: the standard op types polyop's provider implements, from the library's own metadata
CLAIMABLE = {s["op_type"] for o in pox.load().info["ops"] for s in o["onnx_standard"]}


def _bench_models():
    """bench/ep_models.py: the light models' preparation and the transformer block, shared
    with the benchmark that times them (one definition of what is measured and tested)."""
    spec = importlib.util.spec_from_file_location("ep_models", ROOT / "bench" / "ep_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ep_models = _bench_models()
randomized = ep_models.randomized


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "resnet50"])
def test_light_model_matches_the_cpu_provider(name, tmp_path):
    model = randomized(onnx.load(LIGHT / f"light_{name}.onnx"))
    data_in = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}][0]
    shape = [d.dim_value for d in data_in.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    m = model.SerializeToString()
    (got,), where = run(m, {data_in.name: x}, tmp_path)
    (ref,), _ = run(m, {data_in.name: x}, tmp_path, provider=False)
    assert np.abs(ref).max() > 1e-3 and np.std(ref) > 0
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    # every node of a claimable type ran on polyop's provider (names from the model; ONNX
    # Runtime's own layout nodes are not the model's)
    by_name = {n.name or n.output[0]: n.op_type for n in model.graph.node}
    claimable = {k for k, t in by_name.items() if t in CLAIMABLE}
    assert claimable, "the model has claimable nodes"
    ran = {k: v for k, v in where.items() if k in by_name}
    missing = {k: ran.get(k) for k in claimable if ran.get(k) != EP}
    assert not missing, missing


def test_transformer_block_matches_the_cpu_provider(tmp_path):
    # the benchmark's standard-op transformer block (bench/ep_models.py): RMSNormalization,
    # Softmax, Gelu and Add on polyop, MatMul/Reshape/Transpose on the CPU provider
    model, feeds = ep_models.transformer_block(seq=32)
    m = model.SerializeToString()
    (got,), where = run(m, feeds, tmp_path)
    (ref,), _ = run(m, feeds, tmp_path, provider=False)
    assert np.std(ref) > 0.1
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    ran = {n.name: where.get(n.name) for n in model.graph.node if n.name in where}
    for name in ["norm1", "norm2", "softmax", "gelu", "residual1", "residual2"]:
        assert ran.get(name) == EP, (name, ran)
    assert ran.get("q") == CPU, ran


def test_no_nchwc_layout_conversions_around_polyop_convolutions(tmp_path):
    """provider_session_options() leaves out the CPU provider's NCHWc layout (ORT_ENABLE_ALL's
    one addition to ORT_ENABLE_EXTENDED): with polyop running the convolutions it would only
    wrap the MaxPool between them in ReorderInput/ReorderOutput nodes. The same model at
    ORT_ENABLE_ALL, asked for explicitly, is the control: it does get them."""
    rng = np.random.default_rng(5)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 32, 3, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["a"], ["b"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["b", "w2"], ["y"], name="c2", pads=[1, 1, 1, 1]),
    ]
    m = make(nodes, [vi("x", "float32", [1, 16, 24, 24])], [vi("y", "float32", [1, 32, 12, 12])],
             13, initializers=[w1, w2])
    x = data([1, 16, 24, 24], "float32")
    (ref,) = ort.InferenceSession(m, providers=[CPU]).run(None, {"x": x})
    op_types = {}
    for level in [None, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]:
        kw = {} if level is None else {"graph_optimization_level": level}
        so = pox.provider_session_options(enable_profiling=True,
                                          profile_file_prefix=str(tmp_path / f"p{level}"), **kw)
        sess = ort.InferenceSession(m, so)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
        with open(sess.end_profiling()) as f:
            events = json.load(f)
        op_types[level] = {e["args"]["op_name"] for e in events
                           if e.get("cat") == "Node" and "op_name" in e.get("args", {})}
    assert not {"ReorderInput", "ReorderOutput"} & op_types[None], op_types[None]
    assert {"ReorderInput", "ReorderOutput"} <= op_types[ort.GraphOptimizationLevel.ORT_ENABLE_ALL], op_types
