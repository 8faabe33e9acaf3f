"""TensorFlow adapter: libpolyop_tensorflow.so through tf.load_op_library, and polyop.tensorflow.

References are TF's own built-in ops or NumPy formulas, never polyop itself.
"""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import polyop
import polyop.tensorflow as ptf

LIB = polyop.library_path("tensorflow")
RAW = tf.load_op_library(LIB)
OPS = ptf.load()
RNG = np.random.default_rng(0)


def rand(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def sig(*specs):
    return [tf.TensorSpec(s, d) for s, d in specs]



def test_load_returns_the_common_library_object():
    """polyop.<framework>.load() returns the same kind of object in every framework."""
    import os

    from polyop._library import Loaded

    assert isinstance(OPS, Loaded) and ptf.load() is OPS
    assert (OPS.framework, OPS.name) == ("tensorflow", "Polyop")
    assert OPS.path == os.path.realpath(LIB)
    assert OPS.info["framework"] == "tensorflow"
    assert list(OPS.op_names) == [o["name"] for o in polyop.ops() if not o["flags"]["inplace"]]
    assert set(OPS.op_names) == set(OPS.library.exported)
    assert hasattr(OPS.handle, "polyop_topk")  # the module tf.load_op_library returned
    assert OPS.op("topk") is OPS.topk and ptf.topk is OPS.topk
    x = tf.constant([1.0, -2.0])
    assert OPS.call("negate", x).numpy().tolist() == [-1.0, 2.0]

def static_shapes(fn, *specs):
    out = tf.function(fn, input_signature=sig(*specs)).get_concrete_function().structured_outputs
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [tuple(o.shape.as_list()) if o.shape.rank is not None else None for o in outs]


# --------------------------------------------------------------------------- the issue check


ISSUE_CHECK = (
    "import tensorflow as tf; m = tf.load_op_library('target/release/libpolyop_tensorflow.so'); "
    "v, i = m.polyop_topk(tf.constant([[1.,3.,3.,2.]]), k=2); "
    "print(v.numpy().tolist(), i.numpy().tolist(), i.dtype.name)"
)


def test_issue_check_topk_raw_library_fresh_process():
    # Only the framework: no polyop Python package, no LD_LIBRARY_PATH.
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(polyop.__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    out = subprocess.run([sys.executable, "-c", ISSUE_CHECK], cwd=root, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[[3.0, 3.0]] [[1, 2]] int64"


def test_topk_raw_library_in_process():
    values, indices = RAW.polyop_topk(tf.constant([[1.0, 3.0, 3.0, 2.0]]), k=2)
    np.testing.assert_array_equal(values.numpy(), [[3.0, 3.0]])
    np.testing.assert_array_equal(indices.numpy(), [[1, 2]])
    assert indices.dtype == tf.int64


def test_load_after_raw_load_under_another_path():
    # TF returns an empty module when the same .so is loaded again under a different path
    # string; polyop.tensorflow.load() still finds the ops.
    import os

    rel = os.path.relpath(LIB)
    assert ptf.load(rel).negate(tf.constant([1.0, 2.0])).numpy().tolist() == [-1.0, -2.0]


def test_every_registry_op_is_a_tf_op():
    for info in polyop.ops():
        fn = getattr(RAW, "polyop_" + info["name"].rstrip("_"), None)
        if info["flags"]["inplace"]:
            continue
        assert fn is not None, f"no TF wrapper for {info['name']}"
        assert callable(getattr(OPS, info["name"]))
    # in-place ops are skipped, the out-of-place op is there
    assert not hasattr(RAW, "polyop_relu__")


def test_op_def_matches_schema():
    from tensorflow.python.framework import op_def_registry

    d = op_def_registry.get("PolyopTopk")
    assert [a.name for a in d.input_arg] == ["x"]
    assert [a.name for a in d.output_arg] == ["values", "indices"]
    attrs = {a.name: a for a in d.attr}
    assert attrs["k"].type == "int" and not attrs["k"].HasField("default_value")
    assert attrs["axis"].default_value.i == -1
    assert attrs["largest"].default_value.b is True
    assert set(attrs["T"].allowed_values.list.type) == {
        tf.float16.as_datatype_enum,
        tf.bfloat16.as_datatype_enum,
        tf.float32.as_datatype_enum,
        tf.float64.as_datatype_enum,
        tf.int32.as_datatype_enum,
        tf.int64.as_datatype_enum,
    }
    r = op_def_registry.get("PolyopRmsNorm")
    assert [a.name for a in r.input_arg] == ["x", "weight"]
    assert r.input_arg[1].number_attr == "N_weight"
    ra = {a.name: a for a in r.attr}
    assert math.isclose(ra["eps"].default_value.f, 1e-6, rel_tol=1e-6)
    g = {a.name: a for a in op_def_registry.get("PolyopGelu").attr}
    assert g["approximate"].default_value.s == b"none"


# --------------------------------------------------------------------------- forward vs TF built-ins

NUMERIC = [np.float32, np.float64, np.int32, np.int64]


@pytest.mark.parametrize("dtype", NUMERIC + [np.float16, ml_dtypes.bfloat16])
def test_negate_add_relu_vs_builtins(dtype):
    x = tf.constant((rand((3, 4)) * 10).astype(dtype))
    y = tf.constant((rand((4,)) * 10).astype(dtype))
    np.testing.assert_array_equal(RAW.polyop_negate(x).numpy(), tf.negative(x).numpy())
    np.testing.assert_array_equal(RAW.polyop_add(x, y).numpy(), tf.add(x, y).numpy())
    np.testing.assert_array_equal(RAW.polyop_relu(x).numpy(), tf.nn.relu(x).numpy())
    np.testing.assert_array_equal(
        RAW.polyop_add_relu(x, y).numpy(), tf.nn.relu(tf.add(x, y)).numpy()
    )


def test_relu_keeps_nan_and_scale():
    x = tf.constant([np.nan, -1.0, 2.0], tf.float32)
    r = RAW.polyop_relu(x).numpy()
    assert np.isnan(r[0]) and r[1] == 0 and r[2] == 2
    x = tf.constant(rand((5,), np.float64))
    np.testing.assert_allclose(RAW.polyop_scale(x, alpha=1.7).numpy(), x.numpy() * 1.7, rtol=1e-15)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_vs_tf(approximate, dtype):
    x = tf.constant(rand((4, 5), dtype) * 3)
    ref = tf.nn.gelu(x, approximate=(approximate == "tanh")).numpy()
    got = RAW.polyop_gelu(x, approximate=approximate).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
    # the default is "none"
    if approximate == "none":
        np.testing.assert_allclose(RAW.polyop_gelu(x).numpy(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_vs_tf(axis):
    x = tf.constant(rand((3, 4, 5)) * 5)
    np.testing.assert_allclose(
        RAW.polyop_softmax(x, axis=axis).numpy(), tf.nn.softmax(x, axis=axis).numpy(), rtol=1e-5, atol=1e-7
    )


def test_rms_norm_with_and_without_weight():
    x = rand((3, 8), np.float64)
    w = rand((8,), np.float64)
    ref = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(RAW.polyop_rms_norm(x, weight=[]).numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(RAW.polyop_rms_norm(x, weight=[w]).numpy(), ref * w, rtol=1e-12)
    np.testing.assert_allclose(OPS.rms_norm(x).numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(OPS.rms_norm(x, w, eps=0.5).numpy(),
                               x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 0.5) * w, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_topk_vs_tf(dtype):
    x = tf.constant((rand((4, 7)) * 100).astype(dtype))
    v, i = RAW.polyop_topk(x, k=3)
    rv, ri = tf.math.top_k(x, k=3)
    np.testing.assert_array_equal(v.numpy(), rv.numpy())
    np.testing.assert_array_equal(i.numpy(), ri.numpy().astype(np.int64))
    # TF's top_k puts the lower index first among equal values, as polyop does, so the
    # indices must agree too (the int cases have ties)
    v, i = OPS.topk(x, k=2, largest=False)
    rv, ri = tf.math.top_k(-x, k=2)
    np.testing.assert_array_equal(v.numpy(), -rv.numpy())
    np.testing.assert_array_equal(i.numpy(), ri.numpy().astype(np.int64))
    v, i = OPS.topk(x, k=2, axis=0)
    rv, ri = tf.math.top_k(tf.transpose(x), k=2)
    np.testing.assert_array_equal(v.numpy(), tf.transpose(rv).numpy())
    np.testing.assert_array_equal(i.numpy(), tf.transpose(ri).numpy().astype(np.int64))


@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1), (1, 2)])
def test_conv2d_vs_tf(stride, padding):
    x = rand((2, 3, 7, 6), np.float64)
    w = rand((4, 3, 3, 2), np.float64)
    b = rand((4,), np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ref = tf.nn.conv2d(
        tf.transpose(xp, [0, 2, 3, 1]), tf.transpose(w, [2, 3, 1, 0]), strides=stride, padding="VALID"
    )
    ref = tf.transpose(ref, [0, 3, 1, 2]).numpy()
    # TF's raw wrappers take list(int) attrs as lists; polyop.tensorflow takes an int too
    got = RAW.polyop_conv2d(x, w, bias=[], stride=[stride, stride], padding=[padding]).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    got = OPS.conv2d(x, w, b, stride=stride, padding=padding).numpy()
    np.testing.assert_allclose(got, ref + b[None, :, None, None], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 2), (0, 3)])
def test_nonzero_vs_tf_where(shape):
    x = (RNG.integers(0, 3, size=shape) * (RNG.random(shape) > 0.4)).astype(np.int32)
    got = RAW.polyop_nonzero(x).numpy()
    np.testing.assert_array_equal(got, tf.where(x != 0).numpy())
    assert got.dtype == np.int64 and got.shape == (int(np.count_nonzero(x)), len(shape))


def test_empty_and_rank0():
    e = tf.zeros([0, 3])
    assert RAW.polyop_add(e, tf.ones([3])).shape == (0, 3)
    s = tf.constant(2.5)
    assert float(RAW.polyop_negate(s)) == -2.5


# --------------------------------------------------------------------------- tf.function + shapes


def test_static_shapes_multi_input_and_output():
    f32 = tf.float32
    # add with broadcasting: two inputs with unknown dims (tensorflow/tensorflow#56906 once let
    # only input 0 through the C shape API)
    assert static_shapes(lambda x, y: RAW.polyop_add(x, y), ([None, 3], f32), ([1, None], f32)) == [(None, 3)]
    assert static_shapes(lambda x, y: RAW.polyop_add(x, y), ([4, 1, 3], f32), ([5, 1], f32)) == [(4, 5, 3)]
    assert static_shapes(lambda x, y: RAW.polyop_add(x, y), (None, f32), ([3], f32)) == [None]
    # two outputs of different dtypes (output index 1)
    assert static_shapes(
        lambda g, x, y: RAW.polyop_add_backward(g, x, y), ([None, 3], f32), ([None, 3], f32), ([3], f32)
    ) == [(None, 3), (3,)]
    # rms_norm with weight (second, list input)
    assert static_shapes(lambda x, w: RAW.polyop_rms_norm(x, [w]), ([None, 8], f32), ([8], f32)) == [(None, 8)]
    # topk: the raw library cannot read k in TF's C shape API -> that dim is unknown, rank known;
    # polyop.tensorflow fills in the exact shape from the attribute values
    raw = static_shapes(lambda x: RAW.polyop_topk(x, k=2), ([None, 4], f32))
    assert [len(s) for s in raw] == [2, 2]
    assert static_shapes(lambda x: OPS.topk(x, k=2), ([None, 4], f32)) == [(None, 2), (None, 2)]
    assert static_shapes(lambda x: OPS.topk(x, k=1, axis=0), ([3, None], f32)) == [(1, None), (1, None)]
    # attribute-independent shapes stay static in the raw library
    assert static_shapes(lambda x: RAW.polyop_softmax(x, axis=0), ([None, 5], f32)) == [(None, 5)]
    assert static_shapes(lambda x: RAW.polyop_gelu(x, approximate="tanh"), ([2, None], f32)) == [(2, None)]
    # conv2d: channels/batch static; spatial dims from stride/padding via the wrapper
    assert static_shapes(
        lambda x, w: OPS.conv2d(x, w, stride=2, padding=1), ([None, 3, 8, 8], f32), ([4, 3, 3, 3], f32)
    ) == [(None, 4, 4, 4)]
    # nonzero: data-dependent first dim, known rank
    assert static_shapes(lambda x: RAW.polyop_nonzero(x), ([None, None, 3], tf.int32)) == [(None, 3)]


def test_tf_function_runs_with_none_dims():
    f = tf.function(lambda x, y: (RAW.polyop_add(x, y), RAW.polyop_nonzero(x)),
                    input_signature=sig(([None, None], tf.float32), ([None], tf.float32)))
    x = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    s, nz = f(x, np.array([1.0, 1.0], np.float32))
    np.testing.assert_array_equal(s.numpy(), x + 1)
    np.testing.assert_array_equal(nz.numpy(), np.argwhere(x))
    g = tf.function(lambda x: OPS.topk(x, k=2), input_signature=sig(([None, None], tf.float32)))
    v, i = g(tf.constant([[1.0, 3.0, 3.0, 2.0]]))
    np.testing.assert_array_equal(v.numpy(), [[3, 3]])
    np.testing.assert_array_equal(i.numpy(), [[1, 2]])


def test_shape_function_error_at_graph_construction():
    with pytest.raises(ValueError, match=r"polyop\.add: .*broadcast"):
        static_shapes(lambda x, y: RAW.polyop_add(x, y), ([2, 3], tf.float32), ([4, 3], tf.float32))
    # rms_norm's weight check depends on `axis`, which TF's C shape function cannot read (the
    # raw op reports it when the kernel runs); the wrapper's exact inference raises here
    with pytest.raises(ValueError, match=r"polyop\.rms_norm: weight must have shape \[8\]"):
        static_shapes(lambda x, w: OPS.rms_norm(x, w), ([2, 8], tf.float32), ([7], tf.float32))
    # attribute errors: the wrapper's exact inference raises at graph construction too
    with pytest.raises(ValueError, match=r"polyop\.topk"):
        static_shapes(lambda x: OPS.topk(x, k=9), ([None, 4], tf.float32))


# --------------------------------------------------------------------------- gradients


def _check_grad(fn, *arrays, tol=1e-6):
    th, nu = tf.test.compute_gradient(fn, [tf.constant(a) for a in arrays])
    for t, n in zip(th, nu):
        np.testing.assert_allclose(t, n, rtol=tol, atol=tol)


def test_gradients_vs_numerical():
    x = rand((3, 4), np.float64)
    y = rand((4,), np.float64)
    _check_grad(lambda a: OPS.negate(a), x)
    _check_grad(lambda a, b: OPS.add(a, b), x, y)
    _check_grad(lambda a: OPS.scale(a, alpha=1.5), x)
    _check_grad(lambda a: OPS.relu(a), x + 0.05 * np.sign(x))
    _check_grad(lambda a, b: OPS.add_relu(a, b), x, y + 0.05)
    _check_grad(lambda a: OPS.gelu(a, approximate="tanh"), x, tol=1e-5)
    _check_grad(lambda a: OPS.gelu(a), x, tol=1e-5)
    _check_grad(lambda a: OPS.softmax(a, axis=0), x, tol=1e-5)
    _check_grad(lambda a, w: OPS.rms_norm(a, w), x, y, tol=1e-5)
    _check_grad(lambda a: OPS.rms_norm(a), x, tol=1e-5)
    _check_grad(lambda a: OPS.topk(a, k=2)[0], x)
    xc = rand((1, 2, 5, 5), np.float64)
    wc = rand((3, 2, 3, 3), np.float64)
    _check_grad(lambda a, w, b: OPS.conv2d(a, w, b, stride=2, padding=1), xc, wc, rand((3,), np.float64), tol=1e-5)


def test_gradient_tape_matches_tf_builtins():
    x = tf.constant(rand((3, 4), np.float64))
    y = tf.constant(rand((4,), np.float64))
    with tf.GradientTape(persistent=True) as t:
        t.watch([x, y])
        a = tf.reduce_sum(OPS.add(x, y) ** 2)
        b = tf.reduce_sum(tf.add(x, y) ** 2)
        c = tf.reduce_sum(OPS.softmax(x) * y)
        d = tf.reduce_sum(tf.nn.softmax(x) * y)
    for p, q in zip(t.gradient(a, [x, y]), t.gradient(b, [x, y])):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-12)
    np.testing.assert_allclose(t.gradient(c, x).numpy(), t.gradient(d, x).numpy(), rtol=1e-10, atol=1e-14)


def test_gradient_in_tf_function():
    @tf.function(input_signature=sig(([None, 4], tf.float64)))
    def f(x):
        with tf.GradientTape() as t:
            t.watch(x)
            v, _ = OPS.topk(x, k=2)
            s = tf.reduce_sum(v)
        return t.gradient(s, x)

    x = np.array([[1.0, 4.0, 2.0, 3.0]])
    np.testing.assert_array_equal(f(x).numpy(), [[0, 1, 0, 1]])


# --------------------------------------------------------------------------- bad input


BAD = [
    # (callable, expected exception types, message fragment)
    # TF's own type checks (the op definition's allowed list, one T for both inputs) run
    # before polyop's; their messages name the op type (PolyopGelu, PolyopAdd)
    (lambda: RAW.polyop_gelu(tf.constant([1, 2], tf.int32)), tf.errors.InvalidArgumentError,
     "Value for attr 'T' of int32 is not in the list of allowed values: half, bfloat16, float, double"),
    (lambda: RAW.polyop_add(tf.ones([2], tf.float32), tf.ones([2], tf.float64)), tf.errors.InvalidArgumentError,
     "cannot compute PolyopAdd as input #1(zero-based) was expected to be a float tensor but is a double tensor"),
    (lambda: RAW.polyop_add(tf.ones([2, 3]), tf.ones([4, 3])), tf.errors.InvalidArgumentError, "polyop.add: shapes [2, 3] and [4, 3] cannot be broadcast"),
    (lambda: RAW.polyop_softmax(tf.ones([2, 3]), axis=2), tf.errors.InvalidArgumentError, "polyop.softmax: axis 2 is out of range"),
    (lambda: RAW.polyop_topk(tf.ones([2, 3]), k=4), tf.errors.InvalidArgumentError,
     "polyop.topk: k=4 is out of range for axis 1 of size 3"),
    (lambda: RAW.polyop_topk(tf.ones([2, 3]), k=-1), tf.errors.InvalidArgumentError, "polyop.topk: k=-1 must be >= 0"),
    (lambda: RAW.polyop_topk(tf.ones([2, 3]), k=1, axis=-3), tf.errors.InvalidArgumentError, "polyop.topk: axis -3"),
    (lambda: RAW.polyop_gelu(tf.ones([2]), approximate="fast"), tf.errors.InvalidArgumentError, 'polyop.gelu: approximate must be "none" or "tanh", got "fast"'),
    (lambda: RAW.polyop_rms_norm(tf.ones([2, 8]), weight=[tf.ones([7])]), tf.errors.InvalidArgumentError,
     "polyop.rms_norm: weight must have shape [8] (x.shape[axis:] for axis=-1), got [7]"),
    (lambda: RAW.polyop_conv2d(tf.ones([1, 3, 5, 5]), tf.ones([2, 4, 3, 3]), bias=[]), tf.errors.InvalidArgumentError,
     "polyop.conv2d: input has 3 channels but weight expects 4"),
    (lambda: RAW.polyop_conv2d(tf.ones([1, 3, 5, 5]), tf.ones([2, 3, 3, 3]), bias=[], stride=[0, 0]),
     tf.errors.InvalidArgumentError, "polyop.conv2d: stride must be >= 1, got 0"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_and_next_call_works(case):
    fn, exc, fragment = BAD[case]
    with pytest.raises(exc) as e:
        fn()
    msg = str(e.value)
    assert fragment in msg, msg
    # every message names the op: polyop's own errors as "polyop.<op>:", TF's as the op type
    assert re.search(r"polyop\.[a-z_0-9]+: |\bPolyop[A-Z][A-Za-z0-9]*\b", msg), msg
    # the session keeps working
    np.testing.assert_array_equal(RAW.polyop_negate(tf.constant([1.0])).numpy(), [-1.0])


def test_dtype_rejection_is_tfs_own_check():
    # TF checks the type attr T against the op definition's allowed list before any polyop code
    # runs; the message names the op type (PolyopGelu) and the allowed dtypes.
    with pytest.raises(tf.errors.InvalidArgumentError, match="PolyopGelu") as e:
        RAW.polyop_gelu(tf.constant([1, 2], tf.int32))
    assert "int32" in str(e.value)


def test_wrapper_errors():
    with pytest.raises(TypeError, match="polyop.topk: unknown argument"):
        OPS.topk(tf.ones([3]), k=1, kk=2)
    with pytest.raises(TypeError, match="required"):
        OPS.add(tf.ones([3]))


def test_graph_shape_too_large_to_address_fails_graph_construction():
    """Static shapes whose broadcast output cannot be addressed are rejected by the shape
    function with an error naming the op, before anything is allocated (it used to be
    accepted, leaving the impossible allocation to the kernel)."""
    f = tf.function(
        lambda x, y: RAW.polyop_add(x, y),
        input_signature=[tf.TensorSpec([2**40, 1]), tf.TensorSpec([1, 2**40])],
    )
    with pytest.raises(ValueError, match=r"polyop\.add: output `out`: shape \[1099511627776, 1099511627776\] is too large"):
        f.get_concrete_function()
    # the process and the op keep working
    np.testing.assert_array_equal(RAW.polyop_add(tf.ones([2, 1]), tf.ones([1, 3])).numpy(), np.full((2, 3), 2.0, np.float32))


def test_gradient_through_an_op_without_a_backward_raises():
    g, w = tf.ones((2, 3)), tf.ones(3)
    x = tf.Variable(np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32))
    with tf.GradientTape() as tape:
        gx, _ = OPS.rms_norm_backward(g, x, w)
    with pytest.raises(LookupError, match=r"polyop\.rms_norm_backward: this op has no gradient"):
        tape.gradient(gx, x)
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(OPS.rms_norm(x, w))
    assert float(tf.reduce_max(tf.abs(tape.gradient(y, x)))) > 0


def test_conv2d_groups_dilation_pads_and_rms_norm_axis():
    x, w, b = rand((2, 4, 9, 8), np.float64), rand((6, 2, 3, 3), np.float64), rand((6,), np.float64)
    # pads [top, left, bottom, right] = [1, 1, 2, 2], stride (2, 1), dilation 2, 2 groups
    xp = np.pad(x, ((0, 0), (0, 0), (1, 2), (1, 2)))
    ref = np.concatenate([
        tf.transpose(tf.nn.conv2d(tf.transpose(xp[:, 2 * k:2 * k + 2], [0, 2, 3, 1]),
                                  tf.transpose(w[3 * k:3 * k + 3], [2, 3, 1, 0]), strides=1,
                                  dilations=2, padding="VALID"), [0, 3, 1, 2]).numpy()[:, :, ::2, :]
        for k in range(2)], axis=1) + b[None, :, None, None]
    got = OPS.conv2d(x, w, b, stride=[2, 1], padding=[1, 1, 2, 2], dilation=2, groups=2)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-12)
    got = RAW.polyop_conv2d(x, w, bias=[b], stride=[2, 1], padding=[1, 1, 2, 2], dilation=[2, 2], groups=2)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-12)
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape("`stride` must be int[2]")):
        RAW.polyop_conv2d(x, w, bias=[], stride=[1, 1, 1], groups=2)
    # graph mode with unknown dims: N and O stay static
    f = tf.function(lambda a: OPS.conv2d(a, w, None, stride=2, dilation=[1, 2], groups=2),
                    input_signature=[tf.TensorSpec([None, 4, None, None], tf.float64)])
    assert f.get_concrete_function().structured_outputs.shape.as_list()[:2] == [None, 6]
    # gradients through conv2d_backward
    theoretical, numerical = tf.test.compute_gradient(
        lambda a: OPS.conv2d(a, w, b, stride=[2, 1], padding=[0, 1, 1, 0], groups=2), [x[:1, :, :5, :4]])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-6)
    # rms_norm over the last two dims
    xr, wr = rand((2, 3, 4), np.float64), rand((3, 4), np.float64)
    ref = xr / np.sqrt(np.mean(xr * xr, axis=(1, 2), keepdims=True) + 1e-6) * wr
    np.testing.assert_allclose(OPS.rms_norm(xr, wr, axis=1).numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(RAW.polyop_rms_norm(xr, weight=[wr], axis=-2).numpy(), ref, rtol=1e-12)
    theoretical, numerical = tf.test.compute_gradient(lambda a, c: OPS.rms_norm(a, c, axis=1), [xr, wr])
    for t_, n_ in zip(theoretical, numerical):
        np.testing.assert_allclose(t_, n_, rtol=1e-6, atol=1e-6)
