"""XLA / JAX adapter: libpolyop_xla.so FFI targets and the polyop.jax glue.

References are JAX's own built-ins (jax.numpy / jax.nn / jax.lax) or NumPy, never polyop.
Four host CPU devices are forced before JAX is imported, for the shard_map test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()

ROOT = Path(__file__).resolve().parents[1]
try:
    import polyop  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "python"))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import polyop  # noqa: E402
import polyop.jax as pj  # noqa: E402

RNG = np.random.default_rng(1234)
STOCK = ["negate", "add", "scale", "relu", "add_relu", "gelu", "softmax", "rms_norm", "topk",
         "conv2d", "nonzero"]


def rand(*shape, dtype=np.float64):
    return jnp.asarray(RNG.standard_normal(shape).astype(dtype))


def rms_ref(x, w=None, eps=1e-6):
    y = x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def conv_ref(x, w, b=None, stride=1, padding=0):
    y = jax.lax.conv_general_dilated(
        x, w, (stride, stride), [(padding, padding)] * 2,
        dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=jax.lax.Precision.HIGHEST)
    return y if b is None else y + b[None, :, None, None]


def close(a, b, dtype=np.float64):
    tol = {np.float64: 1e-12, np.float32: 1e-5, ml_dtypes.bfloat16: 2e-2, np.float16: 2e-3}.get(dtype, 0)
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------- the issue checks


def test_topk_under_jit_issue_check():
    values, indices = jax.jit(lambda x: pj.topk(x, k=2))(jnp.array([[1.0, 3.0, 3.0, 2.0]]))
    assert values.tolist() == [[3.0, 3.0]]
    assert indices.tolist() == [[1, 2]]
    assert indices.dtype == jnp.int64


def test_direct_ffi_call_with_pycapsule():
    # A fresh process: only jax, ctypes and the .so (no polyop.jax registration).
    code = textwrap.dedent(f"""
        import ctypes, jax, jax.numpy as jnp, numpy as np
        lib = ctypes.cdll.LoadLibrary({polyop.library_path("xla")!r})
        handler = lib.polyop_xla_handler  # the library's one lookup: op name -> FFI handler
        handler.restype, handler.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
        jax.ffi.register_ffi_target("polyop_topk", jax.ffi.pycapsule(handler(b"topk")), platform="cpu")
        x = jnp.array([[1., 3., 3., 2.]], dtype=jnp.float32)
        out = (jax.ShapeDtypeStruct((1, 2), jnp.float32), jax.ShapeDtypeStruct((1, 2), jnp.int32))
        # int64 indices need x64; declare what the op produces
        jax.config.update("jax_enable_x64", True)
        out = (jax.ShapeDtypeStruct((1, 2), jnp.float32), jax.ShapeDtypeStruct((1, 2), jnp.int64))
        f = jax.jit(lambda x: jax.ffi.ffi_call("polyop_topk", out, vmap_method="sequential")(x, k=np.int64(2)))
        v, i = f(x)
        print("RESULT", v.tolist(), i.tolist())
        # k as int32 and largest as a bool attribute work too
        v, i = jax.ffi.ffi_call("polyop_topk", out)(x, k=np.int32(2), largest=np.bool_(False))
        print("SMALLEST", v.tolist(), i.tolist())
        # bad attribute -> runtime error naming the op; then the next call works
        try:
            jax.ffi.ffi_call("polyop_topk", out)(x, k=np.int64(7))
            print("NOERROR")
        except Exception as e:
            print("ERROR", type(e).__name__, str(e).replace(chr(10), " "))
        print("AGAIN", f(x)[1].tolist())
        jax.ffi.register_ffi_target("polyop_nonzero", jax.ffi.pycapsule(handler(b"nonzero")), platform="cpu")
        try:
            jax.ffi.ffi_call("polyop_nonzero", jax.ShapeDtypeStruct((4, 2), jnp.int64))(x)
            print("NOERROR")
        except Exception as e:
            print("NZERROR", type(e).__name__, str(e).replace(chr(10), " "))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "XLA_FLAGS": ""})
    assert p.returncode == 0, p.stderr
    lines = {ln.split(" ", 1)[0]: ln for ln in p.stdout.splitlines()}
    assert lines["RESULT"] == "RESULT [[3.0, 3.0]] [[1, 2]]"
    assert lines["SMALLEST"] == "SMALLEST [[1.0, 2.0]] [[0, 3]]"
    err = lines["ERROR"]
    assert "polyop.topk" in err and "k" in err and "INVALID_ARGUMENT" in err, err
    assert lines["AGAIN"] == "AGAIN [[1, 2]]"
    nz = lines["NZERROR"]
    assert "polyop.nonzero" in nz and "static shapes" in nz, nz


def test_every_op_has_its_own_handler():
    import ctypes

    lib = ctypes.cdll.LoadLibrary(polyop.library_path("xla"))
    lookup = lib.polyop_xla_handler
    lookup.restype, lookup.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    handlers = {o["name"]: lookup(o["name"].encode()) for o in polyop.ops()}
    for o in polyop.ops():
        if o["flags"]["inplace"]:
            assert handlers[o["name"]] is None, o["name"]  # torch-only
        else:
            assert handlers[o["name"]], o["name"]
    live = [h for h in handlers.values() if h]
    assert len(set(live)) == len(live)  # XLA tells a handler nothing of its target
    assert lookup(b"no_such_op") is None and lookup(b"") is None
    assert set(pj.op_names()) == {n for n, h in handlers.items() if h}
    for o in polyop.ops():
        if o["flags"]["inplace"]:
            assert not hasattr(pj, o["name"])


def test_load_returns_the_common_library_object():
    """polyop.<framework>.load() returns the same kind of object in every framework."""
    from polyop._library import Loaded

    lib = pj.load()
    assert isinstance(lib, Loaded) and pj.load() is lib
    assert (lib.framework, lib.name) == ("xla", "polyop_")
    assert lib.path == os.path.realpath(polyop.library_path("xla"))
    assert lib.info["framework"] == "xla"
    assert list(lib.op_names) == pj.op_names()
    assert set(lib.op_names) == set(lib.library.exported)
    assert lib.handle == {n: f"polyop_{n}" for n in pj.op_names()}  # the registered FFI targets
    assert lib.topk is pj.topk and lib.op("negate") is pj.negate
    x = rand(2, 3)
    close(lib.call("negate", x), -x)
    with pytest.raises(NotImplementedError, match="in-place"):
        lib.call("relu_", x)


def test_axis_attributes_come_from_the_schema_role():
    """Which attributes name an axis is the schema's declared role, never the attribute's name."""
    for o in polyop.ops():
        for a in o["attrs"]:
            assert "role" in a, (o["name"], a)
    roles = {o["name"]: pj._axis_attrs(o) for o in polyop.ops()}
    assert roles["softmax"] == ("axis",) and roles["topk"] == ("axis",)  # not topk's k
    assert roles["softmax_backward"] == ("axis",)
    assert roles["conv2d"] == () and roles["scale"] == () and roles["negate"] == ()
    # an axis under another name is normalised; an int named "axis" without the role is not
    info = {"attrs": [{"name": "along", "type": "int", "role": "axis"},
                      {"name": "axis", "type": "int", "role": None},
                      {"name": "dims", "type": "int[]", "role": "axis"}]}
    assert pj._normalize_axes(info, (2, 3, 4), {"along": 1, "axis": 1, "dims": (0, -1, 1)}) == {
        "along": -2, "axis": 1, "dims": (-3, -1, -2)}
    # metadata without roles (a library built before they existed): nothing is normalised, and
    # vmap takes the sequential strategy whenever an integer attribute could name an axis
    old = {"attrs": [{"name": "axis", "type": "int"}]}
    assert pj._axis_attrs(old) is None
    assert pj._normalize_axes(old, (2, 3), {"axis": 0}) == {"axis": 0}
    assert pj._axis_attrs({"attrs": [{"name": "eps", "type": "float"}]}) == ()


def test_stock_ops_present():
    have = {o["name"] for o in polyop.ops()}
    assert set(STOCK) <= have, sorted(set(STOCK) - have)


# ---------------------------------------------------------------------------- forward vs built-ins

FWD = [
    ("negate", lambda x: pj.negate(x), lambda x: -x, [(3, 5)]),
    ("add", lambda x, y: pj.add(x, y), lambda x, y: x + y, [(2, 3, 4), (3, 1)]),
    ("scale", lambda x: pj.scale(x, 2.5), lambda x: x * 2.5, [(4, 4)]),
    ("relu", lambda x: pj.relu(x), jax.nn.relu, [(7,)]),
    ("add_relu", lambda x, y: pj.add_relu(x, y), lambda x, y: jax.nn.relu(x + y), [(3, 4), (4,)]),
    ("gelu", lambda x: pj.gelu(x), lambda x: jax.nn.gelu(x, approximate=False), [(3, 4)]),
    ("gelu_tanh", lambda x: pj.gelu(x, approximate="tanh"), lambda x: jax.nn.gelu(x, approximate=True), [(3, 4)]),
    ("softmax", lambda x: pj.softmax(x), lambda x: jax.nn.softmax(x, axis=-1), [(3, 6)]),
    ("softmax0", lambda x: pj.softmax(x, axis=0), lambda x: jax.nn.softmax(x, axis=0), [(3, 6)]),
    ("rms_norm", lambda x: pj.rms_norm(x), rms_ref, [(4, 8)]),
    ("rms_norm_w", lambda x, w: pj.rms_norm(x, w, eps=1e-5), lambda x, w: rms_ref(x, w, 1e-5), [(2, 3, 8), (8,)]),
    ("conv2d", lambda x, w: pj.conv2d(x, w), conv_ref, [(2, 3, 6, 6), (4, 3, 3, 3)]),
    ("conv2d_b", lambda x, w, b: pj.conv2d(x, w, b, stride=2, padding=1),
     lambda x, w, b: conv_ref(x, w, b, 2, 1), [(1, 2, 7, 5), (3, 2, 3, 3), (3,)]),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name,fn,ref,shapes", FWD, ids=[c[0] for c in FWD])
def test_forward_matches_jax_builtins(name, fn, ref, shapes, dtype):
    args = [rand(*s, dtype=dtype) for s in shapes]
    got = jax.jit(fn)(*args)
    want = ref(*[a.astype(jnp.float64) for a in args])
    assert got.dtype == args[0].dtype and got.shape == want.shape
    close(got, want, dtype)
    close(fn(*args), got, dtype)  # eager == jit


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_ops(dtype):
    x = jnp.asarray(RNG.integers(-50, 50, (3, 4)).astype(dtype))
    y = jnp.asarray(RNG.integers(-50, 50, (4,)).astype(dtype))
    np.testing.assert_array_equal(jax.jit(pj.negate)(x), -x)
    np.testing.assert_array_equal(jax.jit(pj.add)(x, y), x + y)
    np.testing.assert_array_equal(jax.jit(pj.relu)(x), jnp.maximum(x, 0))
    np.testing.assert_array_equal(jax.jit(pj.add_relu)(x, y), jnp.maximum(x + y, 0))
    v, i = pj.topk(x, 2)
    lv, li = jax.lax.top_k(x, 2)
    np.testing.assert_array_equal(v, lv)
    # lax.top_k puts the lower index first among equal values, as polyop does (ties are likely
    # among 12 integers from [-50, 50))
    np.testing.assert_array_equal(i, li.astype(np.int64))
    assert i.dtype == np.int64
    assert pj.add(x, y).dtype == dtype


def test_topk_vs_lax_and_attrs():
    x = jnp.asarray(RNG.permutation(60).reshape(3, 4, 5).astype(np.float32))
    v, i = jax.jit(lambda x: pj.topk(x, 3))(x)
    lv, li = jax.lax.top_k(x, 3)
    np.testing.assert_array_equal(v, lv)
    np.testing.assert_array_equal(i, li)
    # axis=1, smallest first
    v, i = pj.topk(x, k=2, axis=1, largest=False)
    order = jnp.argsort(x, axis=1)[:, :2, :]
    np.testing.assert_array_equal(i, order)
    np.testing.assert_array_equal(v, jnp.take_along_axis(x, order, axis=1))
    # ties: lower index first; NaN counts as largest
    v, i = pj.topk(jnp.array([1.0, jnp.nan, 3.0, 3.0]), 3)
    assert np.isnan(v[0]) and i.tolist() == [1, 2, 3]


def test_empty_and_scalar_and_rank8():
    e = jnp.zeros((0, 3), jnp.float32)
    assert pj.negate(e).shape == (0, 3)
    assert pj.softmax(e).shape == (0, 3)
    s = jnp.float64(2.0)
    assert float(pj.negate(s)) == -2.0
    x = rand(1, 2, 1, 2, 1, 2, 1, 3)
    close(pj.gelu(x), jax.nn.gelu(x, approximate=False))


def test_large_input_runs_on_the_pool_and_is_deterministic():
    x = rand(512, 1024)
    a = jax.jit(lambda x: pj.softmax(x))(x)
    b = jax.jit(lambda x: pj.softmax(x))(x)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    close(a, jax.nn.softmax(x, axis=-1))
    y = jnp.ones(1 << 21, jnp.float32)
    assert float(jax.jit(pj.negate)(y).sum()) == -(1 << 21)


# ---------------------------------------------------------------------------- vmap


VMAP = [
    # (name, fn over per-example args, reference, per-example shapes, in_axes, expected strategy)
    ("negate", pj.negate, lambda x: -x, [(3, 4)], (0,), "direct"),
    ("add_same_rank", pj.add, lambda x, y: x + y, [(3, 4), (3, 4)], (0, 0), "direct"),
    ("add_unbatched_y", pj.add, lambda x, y: x + y, [(3, 4), (4,)], (0, None), "direct"),
    ("add_lower_rank_batched", pj.add, lambda x, y: x + y, [(4,), (3, 4)], (0, None), "sequential"),
    ("add_both_bcast", pj.add, lambda x, y: x + y, [(3, 4), (4,)], (0, 0), "sequential"),
    ("scale", lambda x: pj.scale(x, -1.5), lambda x: -1.5 * x, [(2, 5)], (1,), "direct"),
    ("relu", pj.relu, jax.nn.relu, [(6,)], (0,), "direct"),
    ("add_relu", pj.add_relu, lambda x, y: jax.nn.relu(x + y), [(2, 3), (2, 3)], (0, 1), "direct"),
    ("gelu", lambda x: pj.gelu(x, "tanh"), lambda x: jax.nn.gelu(x, approximate=True), [(5,)], (0,), "direct"),
    ("softmax_last", pj.softmax, lambda x: jax.nn.softmax(x, -1), [(3, 4)], (0,), "direct"),
    ("softmax_axis0", lambda x: pj.softmax(x, axis=0), lambda x: jax.nn.softmax(x, 0), [(3, 4)], (0,), "direct"),
    ("softmax_axis0_batch_last", lambda x: pj.softmax(x, axis=0), lambda x: jax.nn.softmax(x, 0), [(3, 4)], (2,), "direct"),
    ("softmax_scalar", lambda x: pj.softmax(x), lambda x: jnp.ones_like(x), [()], (0,), "sequential"),
    ("rms_norm", pj.rms_norm, rms_ref, [(3, 8)], (0,), "direct"),
    ("rms_norm_w_unbatched", pj.rms_norm, rms_ref, [(3, 8), (8,)], (0, None), "direct"),
    ("rms_norm_w_batched", pj.rms_norm, rms_ref, [(3, 8), (8,)], (0, 0), "sequential"),
    ("topk", lambda x: pj.topk(x, 2), lambda x: jax.lax.top_k(x, 2), [(3, 5)], (0,), "direct"),
    ("topk_axis0", lambda x: pj.topk(x, 2, axis=0),
     lambda x: tuple(jnp.moveaxis(a, -1, 0) for a in jax.lax.top_k(jnp.moveaxis(x, 0, -1), 2)),
     [(4, 3)], (1,), "direct"),
    ("conv2d", pj.conv2d, conv_ref, [(1, 2, 5, 5), (3, 2, 3, 3)], (0, None), "sequential"),
    ("conv2d_w_batched", pj.conv2d, conv_ref, [(1, 2, 5, 5), (3, 2, 3, 3)], (None, 0), "sequential"),
]


@pytest.mark.parametrize("name,fn,ref,shapes,in_axes,strategy", VMAP, ids=[c[0] for c in VMAP])
def test_vmap_each_op(name, fn, ref, shapes, in_axes, strategy):
    B = 3
    args = []
    for s, ax in zip(shapes, in_axes):
        if ax is None:
            args.append(rand(*s))
        else:
            full = list(s)
            full.insert(ax, B)
            args.append(rand(*full))
    got = jax.jit(jax.vmap(fn, in_axes=in_axes))(*args)
    # reference: the built-in applied slice by slice
    outs = []
    for b in range(B):
        sl = [a if ax is None else jnp.take(a, b, axis=ax) for a, ax in zip(args, in_axes)]
        outs.append(ref(*sl))
    got_t = got if isinstance(got, tuple) else (got,)
    ref_t = [tuple(o) if isinstance(o, (tuple, list)) else (o,) for o in outs]
    for k in range(len(got_t)):
        close(got_t[k], jnp.stack([r[k] for r in ref_t]))
    # the chosen strategy is the expected one
    specs = [(s, "float64") for s in shapes]
    attrs = {}
    if "axis0" in name:
        attrs["axis"] = -len(shapes[0])  # polyop.jax normalises axis=0 to a negative axis
    if name.startswith("topk"):
        attrs["k"] = 2
    if name == "scale":
        attrs["alpha"] = -1.5
    op = {"add_relu": "add_relu", "rms_norm": "rms_norm"}.get(name, name.split("_")[0])
    if name.startswith("add_") and not name.startswith("add_relu"):
        op = "add"
    if name.startswith("rms_norm"):
        op = "rms_norm"
    if name.startswith("conv2d"):
        op = "conv2d"
    if name.startswith("softmax"):
        op = "softmax"
    assert pj.vmap_strategy(op, specs, [ax is not None for ax in in_axes], **attrs) == strategy


def test_nested_vmap_and_vmap_of_grad():
    x = rand(2, 3, 4)
    got = jax.vmap(jax.vmap(pj.softmax))(x)
    close(got, jax.nn.softmax(x, -1))
    g = jax.vmap(jax.grad(lambda r: (pj.gelu(r) ** 2).sum()))(x)
    want = jax.vmap(jax.grad(lambda r: (jax.nn.gelu(r, approximate=False) ** 2).sum()))(x)
    close(g, want)


# ---------------------------------------------------------------------------- grad


GRADS = [
    ("negate", lambda x: pj.negate(x), [(3, 4)]),
    ("add", lambda x, y: pj.add(x, y), [(3, 4), (4,)]),
    ("scale", lambda x: pj.scale(x, 0.7), [(5,)]),
    ("relu", lambda x: pj.relu(x), [(3, 4)]),
    ("add_relu", lambda x, y: pj.add_relu(x, y), [(2, 3), (2, 1)]),
    ("gelu", lambda x: pj.gelu(x), [(6,)]),
    ("gelu_tanh", lambda x: pj.gelu(x, approximate="tanh"), [(6,)]),
    ("softmax", lambda x: pj.softmax(x, axis=0), [(3, 4)]),
    ("rms_norm", lambda x: pj.rms_norm(x), [(3, 5)]),
    ("rms_norm_w", lambda x, w: pj.rms_norm(x, w), [(3, 5), (5,)]),
    ("topk", lambda x: pj.topk(x, 2)[0], [(3, 5)]),
    ("conv2d", lambda x, w, b: pj.conv2d(x, w, b, stride=2, padding=1), [(1, 2, 5, 5), (3, 2, 3, 3), (3,)]),
]


@pytest.mark.parametrize("name,fn,shapes", GRADS, ids=[g[0] for g in GRADS])
def test_check_grads(name, fn, shapes):
    args = []
    for s in shapes:
        a = rand(*s)
        if name in ("relu", "add_relu"):
            a = a + jnp.sign(a) * 0.1  # stay away from the kink
        args.append(a)
    check_grads(fn, tuple(args), order=1, modes=["rev"])
    check_grads(jax.jit(fn), tuple(args), order=1, modes=["rev"])


def test_grad_matches_builtin_and_drops_absent_weight():
    x = rand(4, 6)
    g = jax.grad(lambda x: (pj.rms_norm(x) * jnp.arange(6.0)).sum())(x)
    want = jax.grad(lambda x: (rms_ref(x) * jnp.arange(6.0)).sum())(x)
    close(g, want)
    w = rand(6)
    gx, gw = jax.grad(lambda x, w: (pj.rms_norm(x, w) ** 2).sum(), argnums=(0, 1))(x, w)
    wx, ww = jax.grad(lambda x, w: (rms_ref(x, w) ** 2).sum(), argnums=(0, 1))(x, w)
    close(gx, wx)
    close(gw, ww)
    # integer inputs: no cotangent, the float path still differentiates
    xi = jnp.arange(4, dtype=jnp.int64)
    assert pj.negate(xi).tolist() == [0, -1, -2, -3]


# ---------------------------------------------------------------------------- eval_shape


def test_eval_shape_uses_shape_inference():
    x = jax.ShapeDtypeStruct((2, 3, 7, 7), jnp.float32)
    w = jax.ShapeDtypeStruct((4, 3, 3, 3), jnp.float32)
    out = jax.eval_shape(lambda x, w: pj.conv2d(x, w, stride=2, padding=1), x, w)
    assert out.shape == (2, 4, 4, 4) and out.dtype == jnp.float32
    v, i = jax.eval_shape(lambda x: pj.topk(x, 3, axis=0), jax.ShapeDtypeStruct((5, 2), jnp.bfloat16))
    assert (v.shape, v.dtype, i.shape, i.dtype) == ((3, 2), jnp.bfloat16, (3, 2), jnp.int64)
    out = jax.eval_shape(pj.add, jax.ShapeDtypeStruct((3, 1), jnp.float64), jax.ShapeDtypeStruct((4,), jnp.float64))
    assert out.shape == (3, 4)


# ---------------------------------------------------------------------------- bad input

f32 = lambda *s: jnp.ones(s, jnp.float32)  # noqa: E731

BAD = [
    ("wrong dtype", lambda: pj.gelu(jnp.ones(3, jnp.int32)), "unsupported dtype int32"),
    ("bool dtype", lambda: pj.negate(jnp.ones(3, bool)), "unsupported dtype bool"),
    ("dtype mismatch", lambda: pj.add(f32(3), jnp.ones(3, jnp.float64)), "dtype mismatch"),
    ("bad broadcast", lambda: pj.add(f32(3, 4), f32(5)), "cannot be broadcast"),
    ("axis out of range", lambda: pj.softmax(f32(3, 4), axis=2), "axis 2 is out of range"),
    ("k out of range", lambda: pj.topk(f32(3, 4), k=5), "k"),
    ("negative k", lambda: pj.topk(f32(3, 4), k=-1), "k"),
    ("bad approximate", lambda: pj.gelu(f32(3), approximate="fast"), "approximate"),
    ("wrong weight shape", lambda: pj.rms_norm(f32(3, 4), f32(5)), "weight"),
    ("conv channel mismatch", lambda: pj.conv2d(f32(1, 3, 5, 5), f32(2, 4, 3, 3)), "channel"),
    ("missing attr", lambda: pj.topk(f32(3)), "k"),
    ("wrong attr type", lambda: pj.scale(f32(3), "two"), "alpha"),
]


@pytest.mark.parametrize("what,thunk,needle", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_bad_input(what, thunk, needle, mode):
    with pytest.raises((TypeError, ValueError, jax.errors.JaxRuntimeError)) as ei:
        if mode == "jit":
            jax.jit(thunk)()
        else:
            thunk()
    msg = str(ei.value)
    assert "polyop" in msg, msg
    assert needle in msg, msg
    # the next call works
    assert pj.negate(f32(2)).tolist() == [-1.0, -1.0]


def test_runtime_errors_from_the_handler():
    """Shapes declared wrongly at the raw ffi_call level are caught by the handler itself."""
    pj.load()
    x = f32(2, 3)
    with pytest.raises(jax.errors.JaxRuntimeError) as ei:
        jax.ffi.ffi_call("polyop_negate", jax.ShapeDtypeStruct((3,), jnp.float32))(x)
    assert "polyop.negate" in str(ei.value) and "declared" in str(ei.value)
    with pytest.raises(jax.errors.JaxRuntimeError) as ei:
        jax.ffi.ffi_call("polyop_add", jax.ShapeDtypeStruct((2, 3), jnp.float32))(x, jnp.ones((2, 3), jnp.float64))
    assert "polyop.add" in str(ei.value) and "dtype mismatch" in str(ei.value)
    with pytest.raises(jax.errors.JaxRuntimeError) as ei:
        jax.ffi.ffi_call("polyop_scale", jax.ShapeDtypeStruct((2, 3), jnp.float32))(x)
    assert "polyop.scale" in str(ei.value) and "alpha" in str(ei.value)
    # absent trailing optional operand
    out = jax.ffi.ffi_call("polyop_rms_norm", jax.ShapeDtypeStruct((2, 3), jnp.float32))(x, eps=np.float32(1e-6))
    close(out, rms_ref(x), np.float32)
    assert pj.negate(x).shape == (2, 3)


def test_float32_attribute_reaches_the_kernel_as_the_decimal_written():
    """A float attribute passed as float32 (SPEC §1 allows it) is widened like ONNX Runtime and
    TensorFlow widen theirs: eps=np.float32(1e-6) means 1e-6, so the result is bitwise that of
    polyop.run(..., eps=1e-6). With x ~ 1e-3 the eps term is large enough that the plain f32->f64
    cast (9.99999997e-7) changes float64 bits."""
    pj.load()
    x = np.random.default_rng(7).standard_normal((4, 16)) * 1e-3
    want = polyop.run("rms_norm", x, None, eps=1e-6)
    for eps in (np.float32(1e-6), np.float64(1e-6)):
        got = jax.ffi.ffi_call("polyop_rms_norm", jax.ShapeDtypeStruct(x.shape, jnp.float64))(jnp.asarray(x), eps=eps)
        assert np.array_equal(np.asarray(got), want), eps


def test_nonzero_refused_at_trace_time():
    for run in (lambda: pj.nonzero(f32(3)), lambda: jax.jit(pj.nonzero)(f32(3)),
                lambda: jax.eval_shape(pj.nonzero, f32(3))):
        with pytest.raises(NotImplementedError, match=r"polyop\.nonzero: .*static shapes"):
            run()


# ---------------------------------------------------------------------------- distribution


def test_shard_map_rms_norm_over_batch():
    from jax.sharding import Mesh, PartitionSpec as P

    devs = jax.devices("cpu")
    assert len(devs) >= 4, "XLA_FLAGS did not create 4 host devices"
    mesh = Mesh(np.array(devs[:4]), ("b",))
    x = rand(8, 16)
    w = rand(16)
    f = jax.jit(jax.shard_map(lambda x, w: pj.rms_norm(x, w), mesh=mesh,
                              in_specs=(P("b"), P()), out_specs=P("b")))
    got = f(x, w)
    assert len(got.sharding.device_set) == 4
    np.testing.assert_array_equal(np.asarray(got), np.asarray(pj.rms_norm(x, w)))
    close(got, rms_ref(x, w))
    # gradients through shard_map too
    g = jax.grad(lambda x: f(x, w).sum())(x)
    close(g, jax.grad(lambda x: rms_ref(x, w).sum())(x))


# ---------------------------------------------------------------------------- zero-element calls

# Invalid calls on inputs with a zero dimension: (what, call(x0) where x0 has a zero dim,
# call(x) on the same call with non-empty inputs, error type, message fragment).
ZERO_BAD = [
    ("k out of range", lambda e: pj.topk(e, k=4), (0, 3), ValueError,
     "polyop.topk: k=4 is out of range for axis 1 of size 3"),
    ("bad broadcast", lambda e: pj.add(e, jnp.zeros((e.shape[0], 4), e.dtype)), (0, 3), ValueError,
     "polyop.add: shapes"),
    ("bad approximate", lambda e: pj.gelu(e, approximate="fast"), (0,), ValueError,
     'polyop.gelu: approximate must be "none" or "tanh", got "fast"'),
    ("axis out of range", lambda e: pj.softmax(e, axis=2), (0, 3), ValueError,
     "polyop.softmax: axis 2 is out of range for a tensor of rank 2"),
    ("wrong weight shape", lambda e: pj.rms_norm(e, jnp.ones(4, e.dtype)), (0, 3), ValueError,
     "polyop.rms_norm: weight must have shape [3]"),
    ("channel mismatch", lambda e: pj.conv2d(e, jnp.ones((2, 4, 1, 1), e.dtype)), (0, 3, 2, 2),
     ValueError, "polyop.conv2d: input has 3 channels but weight expects 4"),
    ("wrong attr type", lambda e: pj.scale(e, alpha="two"), (0, 2), TypeError,
     "polyop.scale: attribute `alpha` must be float, got str"),
]


@pytest.mark.parametrize("what,fn,shape,etype,needle", ZERO_BAD, ids=[c[0] for c in ZERO_BAD])
@pytest.mark.parametrize("mode", ["eager", "jit", "eval_shape", "vmap"])
def test_invalid_zero_element_calls_fail_at_trace_time_like_non_empty_ones(
    what, fn, shape, etype, needle, mode, monkeypatch
):
    """XLA never runs an FFI handler whose results all have zero elements, so a raw ffi_call
    cannot reject an invalid call with empty results (test_raw_ffi_call_with_zero_element_
    results_skips_the_handler); polyop.jax validates with shape inference first and raises the
    same error as for non-empty inputs, before jax.ffi.ffi_call is ever called."""
    pj.load()
    calls = []
    real = jax.ffi.ffi_call
    monkeypatch.setattr(jax.ffi, "ffi_call", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    run = {"eager": fn, "jit": jax.jit(fn), "eval_shape": lambda x: jax.eval_shape(fn, x),
           "vmap": lambda x: jax.vmap(fn)(x[None])}[mode]
    non_empty = tuple(2 if d == 0 else d for d in shape)
    for s in (shape, non_empty):
        with pytest.raises(etype) as ei:
            run(jnp.zeros(s, jnp.float32))
        assert needle in str(ei.value), (s, str(ei.value))
    assert calls == [], f"ffi_call reached for an invalid call: {calls}"
    # a valid zero-element call still works and returns the empty result
    assert pj.negate(jnp.zeros(shape, jnp.float32)).shape == shape


def test_raw_ffi_call_with_zero_element_results_skips_the_handler():
    """The limitation polyop.jax works around (docs/xla.md): XLA elides a custom call whose
    results are all empty, so the handler's own check never runs and an invalid raw call
    returns empty arrays; the same call with non-empty results is rejected by the handler."""
    pj.load()
    def raw(rows):
        out = (jax.ShapeDtypeStruct((rows, 4), jnp.float32), jax.ShapeDtypeStruct((rows, 4), jnp.int64))
        return jax.ffi.ffi_call("polyop_topk", out)(jnp.zeros((rows, 3), jnp.float32), k=np.int64(4))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"polyop\.topk: k=4 is out of range"):
        jax.block_until_ready(raw(2))
    v, i = jax.block_until_ready(raw(0))
    assert (v.shape, i.shape) == ((0, 4), (0, 4))


def test_a_traced_attribute_says_how_to_make_it_static():
    x = jnp.ones(3, jnp.float32)
    with pytest.raises(TypeError, match=r"polyop\.scale: attribute `alpha` is a traced value.*static_argnames"):
        jax.jit(lambda x, a: pj.scale(x, alpha=a))(x, 2.0)
    # and the advice works
    f = jax.jit(lambda x, a: pj.scale(x, alpha=a), static_argnames="a")
    np.testing.assert_array_equal(f(x, a=2.5), np.full(3, 2.5, np.float32))


def test_grad_through_an_op_without_a_backward_raises():
    g, w = jnp.ones((2, 3)), jnp.ones(3)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3)))
    with pytest.raises(NotImplementedError, match=r"polyop\.rms_norm_backward: this op has no gradient"):
        jax.grad(lambda x: pj.rms_norm_backward(g, x, w)[0].sum())(x)
    assert float(jnp.abs(jax.grad(lambda x: pj.rms_norm(x, w).sum())(x)).max()) > 0


def test_conv2d_list_attributes_groups_and_rms_norm_axis():
    rng = np.random.default_rng(3)
    x, w, b = (jnp.asarray(rng.standard_normal(s)) for s in ((2, 4, 9, 8), (6, 2, 3, 3), (6,)))
    ref = jax.lax.conv_general_dilated(
        x, w, (2, 1), [(1, 2), (1, 2)], rhs_dilation=(2, 2), feature_group_count=2,
        dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=jax.lax.Precision.HIGHEST) + b[None, :, None, None]
    f = jax.jit(lambda a, c, d: pj.conv2d(a, c, d, stride=(2, 1), padding=(1, 1, 2, 2), dilation=2, groups=2))
    close(f(x, w, b), ref)
    assert jax.eval_shape(f, x, w, b).shape == ref.shape
    check_grads(lambda a, c, d: pj.conv2d(a, c, d, stride=[1, 2], padding=[0, 1], groups=2),
                (x[:1, :, :5, :5], w, b), order=1, modes=["rev"])
    # a single int for int[2] and int[]
    close(pj.conv2d(x, w, None, stride=2, padding=1, groups=2),
          jax.lax.conv_general_dilated(x, w, (2, 2), [(1, 1)] * 2, feature_group_count=2,
                                       dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                       precision=jax.lax.Precision.HIGHEST))
    with pytest.raises(Exception, match=re.escape("polyop.conv2d: groups=3 does not divide")):
        pj.conv2d(x, w, None, groups=3)
    xr, wr = jnp.asarray(rng.standard_normal((2, 3, 4))), jnp.asarray(rng.standard_normal((3, 4)))
    ref = xr / jnp.sqrt(jnp.mean(xr * xr, axis=(1, 2), keepdims=True) + 1e-6) * wr
    close(jax.jit(lambda a, c: pj.rms_norm(a, c, axis=1))(xr, wr), ref)
    close(jax.vmap(lambda a: pj.rms_norm(a, wr, axis=-2))(xr[None])[0], ref)
    check_grads(lambda a, c: pj.rms_norm(a, c, axis=-2), (xr, wr), order=1, modes=["rev"])
