"""The Python core (`polyop._core` through `polyop`): metadata, shape inference, running
kernels on NumPy arrays, and errors. References are NumPy / SciPy, never polyop itself."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest
from scipy.special import erf, erfc

import polyop
from polyop.conformance.tolerances import rtol_atol

STOCK = ["negate", "add", "scale", "relu", "relu_", "add_relu", "gelu", "softmax", "rms_norm", "topk",
         "conv2d", "nonzero"]


# ---------------------------------------------------------------------------------------
# metadata


def test_ops_lists_every_stock_op_with_metadata():
    infos = {o["name"]: o for o in polyop.ops()}
    for name in STOCK:
        assert name in infos, name
    topk = infos["topk"]
    assert topk["schema"] == "topk(Tensor x, int k, int axis=-1, bool largest=True) -> (Tensor values, Tensor indices)"
    assert [i["name"] for i in topk["inputs"]] == ["x"]
    assert topk["outputs"] == [{"name": "values", "dtype": "T"}, {"name": "indices", "dtype": "int64"}]
    # "role": "axis" marks an attribute that selects an axis of the first tensor input (the
    # glue finds axes by it, never by an attribute's name).
    assert topk["attrs"] == [
        {"name": "k", "type": "int", "default": None, "required": True, "role": None},
        {"name": "axis", "type": "int", "default": -1, "required": False, "role": "axis"},
        {"name": "largest", "type": "bool", "default": True, "required": False, "role": None},
    ]
    assert set(topk["dtypes"]) == {"float16", "bfloat16", "float32", "float64", "int32", "int64"}
    assert topk["onnx_name"] == "TopK" and topk["camel_name"] == "Topk"
    assert topk["flags"] == {"inplace": False, "data_dependent_shape": False, "backward_only": False}


def test_op_info_flags_and_backward():
    rn = polyop.op_info("rms_norm")
    assert [(i["name"], i["optional"]) for i in rn["inputs"]] == [("x", False), ("weight", True)]
    assert rn["attrs"][0]["name"] == "eps" and rn["attrs"][0]["type"] == "float"
    assert math.isclose(rn["attrs"][0]["default"], 1e-6)
    bw = rn["backward"]
    assert bw["op"] == "rms_norm_backward"
    assert all(kind in ("grad", "input", "output") for kind, _ in bw["inputs"])
    assert bw["outputs"] == [0, 1]
    back = polyop.op_info(bw["op"])
    assert back["flags"]["backward_only"]
    assert back["num_inputs"] == len(bw["inputs"]) and back["num_outputs"] == len(bw["outputs"])
    assert polyop.op_info("relu_")["flags"]["inplace"]
    assert polyop.op_info("relu_")["inputs"][0]["mutable"]
    assert polyop.op_info("nonzero")["flags"]["data_dependent_shape"]
    assert polyop.op_info("nonzero")["outputs"][0]["dtype"] == "int64"
    assert polyop.op_info("gelu")["attrs"][0]["default"] == "none"
    assert polyop.op_info("scale")["dtypes"] == ["float16", "bfloat16", "float32", "float64"]


def test_unknown_op_lists_known_ops():
    with pytest.raises(ValueError, match="unknown op `nope`.*topk"):
        polyop.op_info("nope")
    with pytest.raises(ValueError, match="unknown op"):
        polyop.run("nope", np.zeros(2))
    with pytest.raises(ValueError, match="unknown op"):
        polyop.infer("nope", [])


# ---------------------------------------------------------------------------------------
# shape inference


def test_infer_concrete_and_unknown_dims():
    assert polyop.infer("add", [((2, 1, 4), "float32"), ((3, 1), "float32")]) == [((2, 3, 4), "float32")]
    assert polyop.infer("add", [((None, 4), "float32"), ((4,), "float32")]) == [((None, 4), "float32")]
    assert polyop.infer("topk", [((None, 7), "float16")], k=3) == [((None, 3), "float16"), ((None, 3), "int64")]
    assert polyop.infer("topk", [((5, None), "int32")], k=2, axis=0) == [((2, None), "int32"), ((2, None), "int64")]
    out = polyop.infer("conv2d", [((1, 3, 8, 8), "float32"), ((4, 3, 3, 3), "float32"), None], padding=1)
    assert out == [((1, 4, 8, 8), "float32")]
    (shape, dt), = polyop.infer("nonzero", [((3, 4), "float64")])
    assert dt == "int64" and len(shape) == 2 and shape[1] == 2 and shape[0] is None


def test_infer_symbolic_dims_through_the_core_and_a_library_json():
    from polyop._library import STOCK, open_library

    conv = [(("n", 3, "h", "w"), "float32"), ((4, 3, 3, 3), "float32")]
    want_h = ["add", ["floordiv", ["add", "h", -3], 2], 1]  # (h + 2*0 - 3) // 2 + 1
    lib = open_library(polyop.library_path("xla"))  # the same registry through polyop_infer JSON
    for meta in (STOCK, lib):
        r = meta.infer_symbolic("conv2d", conv, stride=2)
        (shape, dt), = r["outputs"]
        assert dt == "float32" and shape[0] == "n" and shape[1] == 4, r
        assert [list(d) if isinstance(d, (list, tuple)) else d for d in shape[2:3]] == [want_h], r
        assert [c[:3] for c in r["constraints"]] == [["le", 3, "h"], ["le", 3, "w"]], r
        assert "kernel size 3x3 is larger than the padded input" in r["constraints"][0][3]
        # padding 1: the size is the input's own symbol again
        r = meta.infer_symbolic("conv2d", conv, padding=1)
        assert list(r["outputs"][0][0]) == ["n", 4, "h", "w"], r
        # a requirement between two symbols; a contradiction between known sizes is an error
        r = meta.infer_symbolic("rms_norm", [(("b", "d"), "float32"), (("e",), "float32")])
        assert [c[:3] for c in r["constraints"]] == [["eq", "e", "d"]], r
        with pytest.raises(ValueError, match="weight must have shape"):
            meta.infer_symbolic("rms_norm", [(("b", 4), "float32"), ((5,), "float32")])
    # polyop.infer gives the same output dims (without the constraints)
    assert polyop.infer("topk", [(("b", "n"), "float32")], k=3) == [(("b", 3), "float32"), (("b", 3), "int64")]


def test_infer_unknown_rank_and_optional_inputs():
    assert polyop.infer("negate", [(None, "int64")]) == [(None, "int64")]
    # trailing optional input may be left out or given as None
    assert polyop.infer("rms_norm", [((2, 5), "bfloat16")]) == [((2, 5), "bfloat16")]
    assert polyop.infer("rms_norm", [((2, 5), "bfloat16"), None]) == [((2, 5), "bfloat16")]
    # numpy dtypes are accepted as well as names
    assert polyop.infer("relu", [((3,), np.float32)]) == [((3,), "float32")]


def test_infer_errors():
    with pytest.raises(ValueError, match=r"polyop\.topk: k=9 is out of range"):
        polyop.infer("topk", [((2, 4), "float32")], k=9)
    with pytest.raises(ValueError, match="cannot be broadcast"):
        polyop.infer("add", [((2, 3), "float32"), ((4,), "float32")])
    with pytest.raises(TypeError, match="unsupported dtype int32"):
        polyop.infer("gelu", [((2,), "int32")])
    with pytest.raises(TypeError, match="missing required attribute `k`"):
        polyop.infer("topk", [((2,), "float32")])
    with pytest.raises(TypeError):
        polyop.infer("negate", [(2, 3)])


# ---------------------------------------------------------------------------------------
# running kernels


def test_issue_topk_example():
    values, indices = polyop.run("topk", np.array([[1.0, 3.0, 3.0, 2.0]], dtype=np.float32), k=2)
    assert values.dtype == np.float32 and indices.dtype == np.int64
    np.testing.assert_array_equal(values, [[3.0, 3.0]])
    np.testing.assert_array_equal(indices, [[1, 2]])


def test_single_output_is_an_array_multi_output_a_tuple():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = polyop.run("negate", x)
    assert isinstance(out, np.ndarray)
    out = polyop.run("topk", x, k=1)
    assert isinstance(out, tuple) and len(out) == 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int32", "int64"])
def test_add_broadcast_all_dtypes(dtype):
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(0)
    x = rng.integers(-8, 8, size=(2, 3, 4)).astype(dt)
    y = rng.integers(-8, 8, size=(3, 1)).astype(dt)
    out = polyop.run("add", x, y)
    assert out.dtype == np.dtype(dt) and out.shape == (2, 3, 4)
    # small integers: exact in every dtype
    np.testing.assert_array_equal(out.astype(np.float64), x.astype(np.float64) + y.astype(np.float64))


def test_strided_views_are_read_in_place():
    base = np.arange(48, dtype=np.float64).reshape(6, 8)
    for view in (base.T, base[::2, 1::3], base[::-1], base[:, ::-2]):
        assert not view.flags.c_contiguous
        np.testing.assert_array_equal(polyop.run("negate", view), -view)
        np.testing.assert_allclose(polyop.run("softmax", view, axis=0),
                                   np.exp(view - view.max(0)) / np.exp(view - view.max(0)).sum(0))
    # input untouched
    np.testing.assert_array_equal(base, np.arange(48, dtype=np.float64).reshape(6, 8))


def test_bfloat16_and_float16_round_once():
    x = np.linspace(-4, 4, 33)
    for dt in (ml_dtypes.bfloat16, np.float16):
        xs = x.astype(dt)
        out = polyop.run("gelu", xs)
        assert out.dtype == np.dtype(dt)
        v = xs.astype(np.float64)
        want = 0.5 * v * erfc(-v / math.sqrt(2))
        # computed in float32 and rounded once: within 0.5 ulp of the exact value plus
        # float32's error (a tiny fraction of a half-precision ulp), so within 1 ulp; the
        # floor is 1 x the dtype's smallest normal, so a zero for gelu(-4) = -1.3e-4 fails
        rtol, atol = rtol_atol(np.dtype(dt).name, 1.0)
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=rtol, atol=atol)


def test_gelu_tanh_scale_relu_rms_norm_against_numpy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 7))
    t = polyop.run("gelu", x, approximate="tanh")
    np.testing.assert_allclose(t, 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))), rtol=1e-12)
    np.testing.assert_allclose(polyop.run("scale", x, alpha=2), 2 * x, rtol=0)
    r = polyop.run("relu", np.array([-1.0, np.nan, 2.0, 0.0]))
    np.testing.assert_array_equal(r, [0.0, np.nan, 2.0, 0.0])
    w = rng.normal(size=7)
    want = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(polyop.run("rms_norm", x, w), want, rtol=1e-12)
    np.testing.assert_allclose(polyop.run("rms_norm", x, None, eps=0.5),
                               x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 0.5), rtol=1e-12)
    # trailing optional input left out
    np.testing.assert_allclose(polyop.run("rms_norm", x), x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6),
                               rtol=1e-12)


def test_conv2d_against_numpy():
    rng = np.random.default_rng(2)
    x, w, b = rng.normal(size=(2, 3, 7, 6)), rng.normal(size=(5, 3, 3, 2)), rng.normal(size=5)
    out = polyop.run("conv2d", x, w, b, stride=2, padding=1)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 2), axis=(2, 3))[:, :, ::2, ::2]
    want = np.einsum("nchwij,ocij->nohw", win, w) + b[None, :, None, None]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_conv2d_reads_strided_views(dt):
    # a transposed input and a weight read backwards (neither contiguous) give the convolution
    # of the values they show: each output within one rounding per term of the float64 sum
    # (float16: computed in float32, rounded once)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 9, 8)).astype(dt).transpose(0, 1, 3, 2)
    w = rng.normal(size=(4, 3, 3, 3)).astype(dt)[:, :, ::-1, :]
    assert not x.flags.c_contiguous and not w.flags.c_contiguous
    out = polyop.run("conv2d", x, w, None, padding=1)
    assert out.dtype == np.dtype(dt)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    want = np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64))
    mag = np.einsum("nchwij,ocij->nohw", np.abs(win), np.abs(w.astype(np.float64)))
    err = np.abs(out.astype(np.float64) - want)
    tol = 28 * 2.0**-24 * mag + (np.abs(want) * 2.0**-11 if dt == np.float16 else 0)
    assert (err <= tol).all(), float((err - tol).max())


def test_nonzero_and_data_dependent_shapes():
    x = np.array([[0, 3, 0], [4, 0, -1]], dtype=np.int32)
    np.testing.assert_array_equal(polyop.run("nonzero", x), np.argwhere(x))
    e = polyop.run("nonzero", np.zeros((2, 3), dtype=np.float32))
    assert e.shape == (0, 2) and e.dtype == np.int64
    np.testing.assert_array_equal(polyop.run("nonzero", x.T), np.argwhere(x.T))


def test_topk_ties_nan_and_smallest():
    x = np.array([[2.0, np.nan, 5.0, 5.0, -1.0]], dtype=np.float32)
    v, i = polyop.run("topk", x, k=3)
    np.testing.assert_array_equal(i, [[1, 2, 3]])
    assert np.isnan(v[0, 0]) and list(v[0, 1:]) == [5.0, 5.0]
    v, i = polyop.run("topk", x, k=2, largest=False)
    np.testing.assert_array_equal(i, [[4, 0]])
    v, i = polyop.run("topk", np.arange(12, dtype=np.int64).reshape(3, 4), k=2, axis=0)
    np.testing.assert_array_equal(v, [[8, 9, 10, 11], [4, 5, 6, 7]])


def test_empty_rank0_rank8():
    assert polyop.run("negate", np.zeros((0, 3), np.float32)).shape == (0, 3)
    r0 = polyop.run("relu", np.array(-2.5))
    assert r0.shape == () and r0 == 0.0
    x = np.arange(2**8, dtype=np.float64).reshape((2,) * 8) - 100
    np.testing.assert_array_equal(polyop.run("relu", x), np.maximum(x, 0))
    # numpy scalars are accepted as rank-0 inputs
    assert polyop.run("negate", np.float32(2.0)) == -2.0


def test_inplace_op_runs_out_of_place():
    x = np.array([-1.0, 2.0], dtype=np.float32)
    out = polyop.run("relu_", x)
    np.testing.assert_array_equal(out, [0.0, 2.0])
    np.testing.assert_array_equal(x, [-1.0, 2.0])


def test_attribute_conversion():
    x = np.array([[1.0, 4.0, 2.0]], dtype=np.float32)
    # numpy scalar attributes, bool vs int, int for float
    v, _ = polyop.run("topk", x, k=np.int64(2), largest=np.bool_(False))
    np.testing.assert_array_equal(v, [[1.0, 2.0]])
    np.testing.assert_array_equal(polyop.run("scale", x, alpha=np.float32(0.5)), x * 0.5)
    with pytest.raises(TypeError, match=r"polyop\.topk: attribute `k` must be int, got float"):
        polyop.run("topk", x, k=1.5)
    with pytest.raises(TypeError, match="`largest` must be bool"):
        polyop.run("topk", x, k=1, largest="yes")
    with pytest.raises(TypeError, match="unsupported Python type"):
        polyop.run("topk", x, k=object())


# ---------------------------------------------------------------------------------------
# errors: type, message, recovery


@pytest.mark.parametrize(
    "call, exc, msg",
    [
        (lambda: polyop.run("gelu", np.zeros(3, np.int32)), TypeError, r"polyop\.gelu: unsupported dtype int32"),
        (lambda: polyop.run("add", np.zeros(3, np.float32), np.zeros(3)), TypeError, r"polyop\.add: dtype mismatch"),
        (lambda: polyop.run("negate", np.zeros(3, np.uint8)), TypeError, "dtype uint8"),
        (lambda: polyop.run("negate", np.zeros(3, np.complex64)), TypeError, "dtype complex64"),
        (lambda: polyop.run("negate", [1.0, 2.0]), TypeError, "must be a numpy.ndarray"),
        (lambda: polyop.run("add", np.zeros(3)), TypeError, r"expected 2 tensor input"),
        (lambda: polyop.run("negate", np.zeros(3), np.zeros(3)), TypeError, "expected 1 tensor input"),
        (lambda: polyop.run("add", np.zeros((2, 3)), np.zeros((4,))), ValueError, "cannot be broadcast"),
        (lambda: polyop.run("softmax", np.zeros((2, 3)), axis=2), ValueError, "out of range"),
        (lambda: polyop.run("topk", np.zeros((2, 3)), k=4), ValueError, r"polyop\.topk: k=4 is out of range"),
        (lambda: polyop.run("gelu", np.zeros(3), approximate="erf"), ValueError, "approximate must be"),
        (lambda: polyop.run("rms_norm", np.zeros((2, 4)), np.zeros(3)), ValueError, "weight must have shape"),
        (lambda: polyop.run("conv2d", np.zeros((1, 3, 5, 5)), np.zeros((2, 4, 3, 3))), ValueError, "channels"),
        (lambda: polyop.run("topk", np.zeros(3)), TypeError, "missing required attribute `k`"),
        (lambda: polyop.run("negate", np.zeros(3), alpha=1.0), TypeError, "unknown attribute `alpha`"),
        (lambda: polyop.run("add", None, np.zeros(3)), TypeError, "input `x` is required"),
    ],
)
def test_errors_and_recovery(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()
    # the process survives and the next call works
    np.testing.assert_array_equal(polyop.run("negate", np.array([1, -2], np.int64)), [-1, 2])


# Each: (description, call, exception type, regex its message must match). The regexes name
# the op; the list runs in a child process so a crash shows as a signal exit.
NASTY = [
    ("topk k=-1", 'polyop.run("topk", np.zeros((2, 3)), k=-1)', "ValueError", r"^polyop\.topk: k=-1 must be >= 0"),
    ("topk k=2**62", 'polyop.run("topk", np.zeros((2, 3)), k=2**62)', "ValueError",
     r"^polyop\.topk: k=4611686018427387904 is out of range for axis 1 of size 3"),
    ("softmax axis=-2**62", 'polyop.run("softmax", np.zeros((2, 3)), axis=-2**62)', "ValueError",
     r"^polyop\.softmax: axis -4611686018427387904 is out of range"),
    ("conv2d stride=0", 'polyop.run("conv2d", np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 3, 3)), stride=0)',
     "ValueError", r"^polyop\.conv2d: stride must be >= 1, got 0"),
    ("conv2d padding=-5", 'polyop.run("conv2d", np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 3, 3)), padding=-5)',
     "ValueError", r"^polyop\.conv2d: padding must be >= 0, got -5"),
    ("topk k=2**70", 'polyop.run("topk", np.zeros(3), k=2**70)', "ValueError",
     r"^polyop\.topk: attribute `k` = 1180591620717411303424 does not fit in a 64-bit integer"),
    # issue 23: these two returned a shape
    ("infer add 2**62 x 2**62", 'polyop.infer("add", [((2**62, 2**62), "float32"), ((2**62, 2**62), "float32")])',
     "ValueError", r"^polyop\.add: input `x`: shape \[4611686018427387904, 4611686018427387904\] is too large"),
    ("infer add 2**62 x 2**62 + [1]", 'polyop.infer("add", [((2**62, 2**62), "float32"), ((1,), "float32")])',
     "ValueError", r"^polyop\.add: input `x`: shape .* element count overflows"),
    ("infer add, output 2**64 bytes", 'polyop.infer("add", [((2**31, 1), "float32"), ((1, 2**31), "float32")])',
     "ValueError", r"^polyop\.add: output `out`: shape \[2147483648, 2147483648\] is too large"),
    # broadcast views (stride 0) of one element: the inputs exist, the output cannot
    ("run add, output 2**80 elements",
     'polyop.run("add", np.broadcast_to(np.float32(1), (2**40, 1)), np.broadcast_to(np.float32(1), (1, 2**40)))',
     "ValueError", r"^polyop\.add: output `out`: shape \[1099511627776, 1099511627776\] is too large: its element count overflows"),
    ("infer gelu_backward, input 2**64 bytes",
     'polyop.infer("gelu_backward", [((2**61,), "float64"), ((2**61,), "float64")])',
     "ValueError", r"^polyop\.gelu_backward: input `grad`: shape \[2305843009213693952\] is too large"),
]


def test_errors_never_crash_the_process():
    # Every nasty input must raise its own error type with a message naming the op and the
    # problem (not merely "some error"), the child must exit normally, and a call after each
    # error must still work.
    code = "import re, numpy as np, polyop\nresults = []\n"
    for desc, call, exc, rx in NASTY:
        code += f"""
try:
    r = {call}
    results.append(({desc!r}, "returned", repr(r)[:200]))
except Exception as e:
    results.append(({desc!r}, type(e).__name__, str(e)))
assert (polyop.run("negate", np.array([1.0, -2.0])) == [-1.0, 2.0]).all()
"""
    code += "print(repr(results))\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    import ast
    got = ast.literal_eval(p.stdout.strip().splitlines()[-1])
    assert len(got) == len(NASTY)
    wrong = []
    for (desc, _, exc, rx), (_, kind, msg) in zip(NASTY, got):
        if kind != exc or not re.search(rx, msg):
            wrong.append(f"{desc}: {kind}: {msg!r} (expected {exc} matching {rx!r})")
    assert not wrong, "\n".join(wrong)


def _ran_during(call) -> bool:
    """Whether this thread ran Python code while ``call()`` ran in another thread, with the
    interpreter's forced GIL switching turned off: the waiting thread can then only run when
    the other thread releases the GIL itself. No clock is read."""
    result = {}

    def work():
        result["out"] = call()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        t = threading.Thread(target=work)
        # start() waits (GIL released) until the thread has started; the new thread keeps
        # the GIL straight into `call`, so this line runs again only when `call` releases
        # it, or once the thread has finished.
        t.start()
        during = "out" not in result
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert "out" in result
    return during


def test_gil_is_released_during_compute():
    x = np.random.default_rng(3).normal(size=(2048, 2048))
    out = []
    assert _ran_during(lambda: out.append(polyop.run("gelu", x)) or True)
    np.testing.assert_allclose(out[0], 0.5 * x * (1 + erf(x / math.sqrt(2))), rtol=1e-12, atol=1e-15)


def test_gil_check_fails_for_a_call_that_holds_the_gil():
    # The check above can fail: a C builtin that never releases the GIL is not overlapped.
    assert not _ran_during(lambda: sum(range(3_000_000)))


def test_library_path(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown framework"):
        polyop.library_path("mxnet")
    monkeypatch.setenv("POLYOP_LIB_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="cargo build --release"):
        polyop.library_path("torch")
    (tmp_path / "libpolyop_xla.so").write_bytes(b"")
    assert polyop.library_path("xla") == str((tmp_path / "libpolyop_xla.so").resolve())
    assert polyop.library_path("jax") == polyop.library_path("xla")


def test_no_framework_imported():
    code = "import sys, polyop; polyop.ops(); print([m for m in ('torch','tensorflow','jax','onnxruntime') if m in sys.modules])"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


FRAMEWORK_GLUE = [("torch", "torch", "PyTorch", "pip install torch"),
                  ("tensorflow", "tensorflow", "TensorFlow", "pip install tensorflow-cpu"),
                  ("onnxruntime", "onnxruntime", "ONNX Runtime", "pip install onnxruntime onnx"),
                  ("onnxruntime", "onnx", "ONNX Runtime", "pip install onnxruntime onnx"),
                  ("jax", "jax", "JAX", "pip install jax")]


@pytest.mark.parametrize("glue,missing,display,pip", FRAMEWORK_GLUE,
                         ids=[f"{g}-without-{m}" for g, m, *_ in FRAMEWORK_GLUE])
def test_framework_module_without_its_framework(glue, missing, display, pip):
    """Every polyop.<framework> module runs the one availability check: without its framework
    it raises one ImportError naming the framework and the pip package."""
    code = (f"import sys; sys.modules[{missing!r}] = None\n"  # makes `import {missing}` fail
            f"import polyop\n"
            f"from polyop._library import framework_available\n"
            f"assert not framework_available({glue!r})\n"
            f"try:\n    import polyop.{glue}\nexcept ImportError as e:\n    print('IMPORTERROR', e.name, e)\n"
            f"else:\n    print('IMPORTED')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out = p.stdout.strip()
    assert out.startswith(f"IMPORTERROR {missing} polyop.{glue} needs {display}"), out
    assert f"`{pip}`" in out and f"cannot import `{missing}`" in out, out


def test_framework_availability_helper():
    from polyop._library import FRAMEWORKS, framework_available, require_framework

    assert set(FRAMEWORKS) == {"torch", "tensorflow", "onnxruntime", "xla", "mindspore"}
    assert framework_available("jax") == framework_available("xla")
    with pytest.raises(ValueError, match="unknown framework"):
        framework_available("mxnet")
    with pytest.raises(ValueError, match="unknown framework"):
        require_framework("mxnet")


def test_cli_lists_ops():
    p = subprocess.run([sys.executable, "-m", "polyop", "ops"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "topk(Tensor x, int k, int axis=-1, bool largest=True)" in p.stdout
    assert not any(line.startswith("rms_norm_backward") for line in p.stdout.splitlines())
    p = subprocess.run([sys.executable, "-m", "polyop", "ops", "--all"], capture_output=True, text=True, timeout=60)
    assert any(line.startswith("rms_norm_backward ") for line in p.stdout.splitlines())
