"""MindSpore adapter: libpolyop_mindspore.so's AOT Custom ops and the polyop.mindspore glue.

Runs in MindSpore's own environment (.venv-mindspore: MindSpore 2.10 needs numpy<2; ci/test.sh
runs this file with that interpreter). References: the independent NumPy reference of the
conformance suite (conformance/reference.py, float64, tolerances in ulps of each dtype) and,
bit for bit, polyop's NumPy core (polyop.run), the same kernel every framework runs.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import polyop  # noqa: F401
except ImportError:  # running from a checkout without the .pth of ci/setup.sh
    sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "conformance"))

import mindspore as ms  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mindspore import ops  # noqa: E402

import polyop  # noqa: E402
import polyop.mindspore as pms  # noqa: E402
from polyop.conformance.tolerances import assert_close  # noqa: E402
from reference import reference  # noqa: E402

RNG = np.random.default_rng(7)
FLOATS = ["float16", "bfloat16", "float32", "float64"]
NUMERIC = FLOATS + ["int32", "int64"]
MS_DTYPES = {"float16": ms.float16, "bfloat16": ms.bfloat16, "float32": ms.float32,
             "float64": ms.float64, "int32": ms.int32, "int64": ms.int64}


def np_dtype(name):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def rand(shape, dtype, lo=-3.0, hi=3.0):
    if dtype.startswith("int"):
        return RNG.integers(-5, 6, size=shape).astype(dtype)
    return RNG.uniform(lo, hi, size=shape).astype(np_dtype(dtype))


def to_ms(a):
    return ms.Tensor(a)  # bfloat16 as an ml_dtypes array: the bits are kept


def to_np(t):
    # MindSpore has its own bfloat16 NumPy type besides ml_dtypes'; viewed as the one NumPy
    # resolves the name to, which is what polyop.run returns (it asks NumPy by name)
    a = t.asnumpy()
    return a.view(np.dtype("bfloat16")) if a.dtype.name == "bfloat16" else a


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def check(op, arrays, attrs, got):
    """Outputs against the float64 reference (ulps of the dtype) and bitwise against the core."""
    got = [to_np(t) for t in as_tuple(got)]
    present = list(arrays)
    while present and present[-1] is None:
        present.pop()
    core = polyop.run(op, *present, **attrs)
    core = list(core) if isinstance(core, (list, tuple)) else [core]
    for g, c, r in zip(got, core, reference(op, list(arrays), attrs), strict=True):
        assert g.dtype == c.dtype and g.shape == c.shape, (op, g.dtype, g.shape, c.dtype, c.shape)
        np.testing.assert_array_equal(g.astype(np.float64).view(np.int64),
                                      c.astype(np.float64).view(np.int64), err_msg=op)
        if isinstance(r, tuple):  # a float result: (exact float64 values, dtype[, scale])
            vals, dtype, *scale = r
            assert_close(g, vals, op, dtype, scale[0] if scale else None)
        else:  # exact (integers, topk values)
            np.testing.assert_array_equal(g.astype(np.float64), np.asarray(r).astype(np.float64), err_msg=op)


# op, input shapes (None: absent optional), attrs, dtypes
FORWARD = [
    ("negate", [(3, 4)], {}, NUMERIC),
    ("add", [(2, 3, 4), (4,)], {}, NUMERIC),
    ("scale", [(5, 3)], {"alpha": 0.1}, FLOATS),
    ("relu", [(4, 5)], {}, NUMERIC),
    ("add_relu", [(3, 1), (1, 4)], {}, NUMERIC),
    ("gelu", [(4, 6)], {}, FLOATS),
    ("gelu", [(4, 6)], {"approximate": "tanh"}, FLOATS),
    ("softmax", [(3, 7)], {"axis": 0}, FLOATS),
    ("rms_norm", [(3, 8), None], {}, FLOATS),
    ("rms_norm", [(2, 3, 4), (3, 4)], {"eps": 1e-5, "axis": 1}, FLOATS),
    ("topk", [(4, 9)], {"k": 3}, NUMERIC),
    ("topk", [(5, 4)], {"k": 2, "axis": 0, "largest": False}, NUMERIC),
    ("conv2d", [(2, 4, 7, 6), (6, 2, 3, 3), (6,)],
     {"stride": 2, "padding": [1, 0], "dilation": 1, "groups": 2}, FLOATS),
    ("conv2d", [(1, 2, 5, 5), (3, 2, 2, 2), None], {"padding": [0, 1, 1, 0]}, FLOATS),
]


@pytest.mark.parametrize("op,shapes,attrs,dtypes", FORWARD,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(FORWARD)])
def test_pynative_every_dtype_matches_reference_and_core(op, shapes, attrs, dtypes):
    for dtype in dtypes:
        arrays = [None if s is None else rand(s, dtype) for s in shapes]
        got = getattr(pms, op)(*[None if a is None else to_ms(a) for a in arrays], **attrs)
        check(op, arrays, attrs, got)


def test_nonzero_pynative_every_dtype():
    for dtype in NUMERIC:
        a = rand((4, 5), dtype)
        a[RNG.random((4, 5)) < 0.5] = 0
        got = pms.nonzero(to_ms(a))
        assert got.dtype == ms.int64
        np.testing.assert_array_equal(got.asnumpy(), np.argwhere(a.astype(np.float64) != 0))
    assert pms.nonzero(ms.Tensor(np.zeros((2, 0), np.float32))).shape == (0, 2)


def test_empty_scalar_rank8_and_transposed_inputs():
    check("negate", [np.zeros((0, 3), np.float32)], {}, pms.negate(ms.Tensor(np.zeros((0, 3), np.float32))))
    x = np.float64(-2.5).reshape(())
    check("relu", [x], {}, pms.relu(ms.Tensor(x)))
    x = rand((2,) * 8, "float32")
    check("softmax", [x], {}, pms.softmax(ms.Tensor(x)))
    x = rand((3, 5), "float32")
    check("gelu", [np.ascontiguousarray(x.T)], {}, pms.gelu(ms.Tensor(x).T))


def test_jit_and_graph_mode_with_dynamic_dims_match_pynative():
    x, w = rand((3, 6), "float32"), rand((6,), "float32")

    @ms.jit
    def f(a, b):
        return pms.rms_norm(a, b, eps=1e-5), pms.topk(a, k=2, largest=False)

    eager = [pms.rms_norm(to_ms(x), to_ms(w), eps=1e-5), *pms.topk(to_ms(x), k=2, largest=False)]
    jitted = f(to_ms(x), to_ms(w))
    for a, b in zip([jitted[0], *jitted[1]], eager, strict=True):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())

    class Net(ms.nn.Cell):
        def construct(self, a, b):
            return pms.add_relu(a, b), pms.topk(a, k=2)

    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        net = Net()
        net.set_inputs(ms.Tensor(shape=[None, 6], dtype=ms.float32), ms.Tensor(shape=[6], dtype=ms.float32))
        for rows in (3, 1):  # one compiled graph, two sizes
            a, b = x[:rows], w
            out = net(to_ms(a), to_ms(b))
            check("add_relu", [a, b], {}, out[0])
            check("topk", [a], {"k": 2}, out[1])
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def numeric_grad(f, xs, i, eps=1e-6):
    """Central differences of the scalar f(*xs) with respect to xs[i] (float64)."""
    x = xs[i]
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        for sign in (1, -1):
            y = x.copy()
            y[idx] += sign * eps
            args = [ms.Tensor(y) if j == i else ms.Tensor(a) for j, a in enumerate(xs)]
            g[idx] += sign * float(f(*args).asnumpy()) / (2 * eps)
    return g


GRADS = [
    ("add", [(2, 3), (3,)], {}),
    ("scale", [(2, 3)], {"alpha": 0.7}),
    ("relu", [(2, 3)], {}),
    ("add_relu", [(2, 3), (2, 1)], {}),
    ("gelu", [(2, 3)], {"approximate": "tanh"}),
    ("softmax", [(2, 3)], {"axis": 0}),
    ("rms_norm", [(2, 3), (3,)], {}),
    ("rms_norm", [(2, 3)], {}),
    ("topk", [(2, 4)], {"k": 2}),
    ("conv2d", [(1, 2, 4, 4), (2, 2, 2, 2), (2,)], {"padding": 1, "stride": 2}),
]


@pytest.mark.parametrize("op,shapes,attrs", GRADS, ids=[f"{g[0]}-{i}" for i, g in enumerate(GRADS)])
def test_grad_matches_finite_differences(op, shapes, attrs):
    xs = [rand(s, "float64") for s in shapes]
    weights = rand(as_tuple(reference(op, list(xs), attrs)[0][0].shape), "float64")
    w = ms.Tensor(weights)

    def f(*ts):
        return (as_tuple(getattr(pms, op)(*ts, **attrs))[0] * w).sum()

    positions = tuple(range(len(xs)))
    got = as_tuple(ms.grad(f, grad_position=positions)(*[ms.Tensor(x) for x in xs]))
    for i, g in enumerate(got):
        np.testing.assert_allclose(g.asnumpy(), numeric_grad(f, xs, i), rtol=1e-5, atol=1e-7,
                                   err_msg=f"{op}: gradient of input {i}")
        assert np.any(g.asnumpy() != 0), f"{op}: gradient of input {i} is all zeros"


def test_grad_inside_jit_matches_pynative():
    x, w = rand((3, 4), "float64"), rand((4,), "float64")

    def loss(a, b):
        return pms.rms_norm(a, b).sum()

    eager = ms.grad(loss, grad_position=(0, 1))(ms.Tensor(x), ms.Tensor(w))
    jitted = ms.jit(ms.grad(loss, grad_position=(0, 1)))(ms.Tensor(x), ms.Tensor(w))
    for a, b in zip(jitted, eager, strict=True):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def first_line(e):
    return str(e).split("\n")[0]


@pytest.mark.parametrize("thunk,needle", [
    (lambda: pms.add(ms.Tensor(np.ones(3, np.float32)), ms.Tensor(np.ones(3, np.float64))),
     "polyop.add: dtype mismatch"),
    (lambda: pms.softmax(ms.Tensor(np.ones(3, np.int32))), "polyop.softmax: unsupported dtype int32"),
    (lambda: pms.relu(ms.Tensor(np.ones(3, np.int8))), "polyop.relu: unsupported dtype int8"),
    (lambda: pms.topk(ms.Tensor(np.ones((2, 3), np.float32)), k=4), "polyop.topk: k=4 is out of range"),
    (lambda: pms.gelu(ms.Tensor(np.ones(3, np.float32)), approximate="fast"), "polyop.gelu: approximate"),
    (lambda: pms.add(ms.Tensor(np.ones(3, np.float32)), ms.Tensor(np.ones(4, np.float32))), "polyop.add"),
    (lambda: pms.softmax(ms.Tensor(np.ones(3, np.float32)), axis=2), "polyop.softmax"),
    (lambda: pms.scale(ms.Tensor(np.ones(3, np.float32))), "polyop.scale"),
])
def test_bad_input_raises_at_inference_and_the_next_call_works(thunk, needle):
    with pytest.raises(RuntimeError) as e:
        thunk()
    assert needle in str(e.value), first_line(e.value)
    np.testing.assert_array_equal(pms.negate(ms.Tensor(np.ones(2, np.float32))).asnumpy(), [-1, -1])


def test_unknown_attribute_and_too_many_tensors_are_type_errors():
    x = ms.Tensor(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="polyop.scale: unknown attribute"):
        pms.scale(x, alpha=1.0, beta=2.0)
    with pytest.raises(TypeError, match="polyop.scale: takes at most 1 tensor"):
        pms.scale(x, 0.5)


def test_graph_errors_name_the_op():
    class Net(ms.nn.Cell):
        def construct(self, a):
            return pms.topk(a, k=3)

    x = rand((2, 5), "float32")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        # static shapes: refused while compiling; the same cell then compiles valid input
        net = Net()
        with pytest.raises(RuntimeError, match="polyop.topk: k=3 is out of range"):
            net(ms.Tensor(np.ones((2, 2), np.float32)))
        check("topk", [x], {"k": 3}, net(ms.Tensor(x)))
        # dynamic dims: inference runs with the graph, so the error comes from its step; that
        # compiled graph then refuses later steps (MindSpore's rule after a failed step,
        # docs/mindspore.md), a newly compiled one works
        net = Net()
        net.set_inputs(ms.Tensor(shape=[None, None], dtype=ms.float32))
        with pytest.raises(RuntimeError, match="polyop.topk: k=3 is out of range"):
            net(ms.Tensor(np.ones((2, 2), np.float32)))
        with pytest.raises(RuntimeError, match="previous step"):
            net(ms.Tensor(x))
        fresh = Net()
        fresh.set_inputs(ms.Tensor(shape=[None, None], dtype=ms.float32))
        check("topk", [x], {"k": 3}, fresh(ms.Tensor(x)))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_nonzero_refused_inside_a_graph():
    @ms.jit
    def f(a):
        return pms.nonzero(a)

    with pytest.raises(RuntimeError, match="polyop.nonzero: the output shape depends on the input values"):
        f(ms.Tensor(np.ones(3, np.float32)))


def test_raw_custom_op_and_generated_exports():
    path = polyop.library_path("mindspore")
    lib = ctypes.CDLL(path)
    for name in pms.op_names():
        for suffix in ("", "Init", "InferShape", "InferType"):
            assert hasattr(lib, f"polyop_{name}{suffix}"), f"polyop_{name}{suffix}"
    assert not any(hasattr(lib, f"polyop_{o['name']}") for o in polyop.ops() if o["flags"]["inplace"])
    reg = (ops.CustomRegOp("raw_scale").input(0, "x").output(0, "out")
           .dtype_format(ops.DataType.None_None, ops.DataType.None_None).target("CPU").get_op_info())
    scale = ops.Custom(f"{path}:polyop_scale", func_type="aot", reg_info=reg)
    scale.add_prim_attr("alpha", 0.5)  # a float attribute as MindSpore stores it (float32)
    x = rand((2, 3), "float32")
    check("scale", [x], {"alpha": 0.5}, scale(ms.Tensor(x)))


def test_float_attribute_reaches_the_kernel_exactly():
    x = rand((4,), "float64")
    check("scale", [x], {"alpha": 0.1}, pms.scale(ms.Tensor(x), alpha=0.1))  # 0.1 is no float32


def test_load_returns_the_common_library_object():
    lib = pms.load()
    assert lib.framework == "mindspore" and lib.path == polyop.library_path("mindspore")
    assert set(lib.op_names) == set(pms.op_names()) and "relu_" not in lib.op_names
    np.testing.assert_array_equal(lib.call("negate", ms.Tensor(np.ones(2, np.float32))).asnumpy(), [-1, -1])
