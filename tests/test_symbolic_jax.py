"""Symbolic shapes in JAX: ``jax.export`` of polyop ops with symbolic dims (``"b, s, 32"``),
serialized, deserialized in a fresh process that loads only JAX and ``libpolyop_xla.so``
(targets registered with ``jax.ffi`` by hand), and called at several sizes. References: the
same decoder block with JAX's built-in ops, ``jax.lax`` convolution, and the source's eager
outputs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyop
import polyop.jax as pj
from polyop.conformance.tolerances import rtol_atol

REPO = Path(__file__).resolve().parents[1]
LIB = Path(polyop.library_path("xla"))
D = 32


def params():
    rng = np.random.default_rng(0)
    return {
        "norm_w": (rng.random(D) + 0.5).astype(np.float32),
        "qkv": (rng.standard_normal((D, 3 * D)) / D**0.5).astype(np.float32),
        "out": (rng.standard_normal((D, D)) / D**0.5).astype(np.float32),
        "up": (rng.standard_normal((D, 4 * D)) / D**0.5).astype(np.float32),
        "down": (rng.standard_normal((4 * D, D)) / (4 * D) ** 0.5).astype(np.float32),
    }


def block(p, x, builtin: bool):
    def norm(x):
        if builtin:
            return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * p["norm_w"]
        return pj.rms_norm(x, p["norm_w"], eps=1e-6)

    h = norm(x)
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    s = q @ jnp.swapaxes(k, -1, -2) * D**-0.5
    a = jax.nn.softmax(s, axis=-1) if builtin else pj.softmax(s, axis=-1)
    x = x + (a @ v) @ p["out"]
    h = norm(x) @ p["up"]
    h = jax.nn.gelu(h, approximate=False) if builtin else pj.gelu(h)
    return x + h @ p["down"]


def inputs(b, s):
    return np.random.default_rng(b * 100 + s).standard_normal((b, s, D)).astype(np.float32)


def assert_close(got, want):
    rtol, _ = rtol_atol("float32", ulps=64)  # a block of float32 ops, differently ordered sums
    want = np.asarray(want)
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=rtol * np.abs(want).max())
    assert np.abs(want).max() > 0.1


def test_block_exports_with_symbolic_batch_and_sequence(tmp_path):
    p = params()
    f = lambda x: block(p, x, builtin=False)  # noqa: E731
    spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"b, s, {D}"), jnp.float32)
    exp = pj.export(f)(spec)
    assert str(exp.out_avals[0].shape) == f"(b, s, {D})"
    sizes = [(1, 3), (2, 8), (3, 21)]
    for b, s in sizes:
        x = inputs(b, s)
        eager = jax.jit(f)(x)
        assert_close(eager, jax.jit(lambda x: block(p, x, builtin=True))(x))
        np.save(tmp_path / f"x{b}_{s}.npy", x)
        np.save(tmp_path / f"y{b}_{s}.npy", np.asarray(eager))
        assert_close(exp.call(x), eager)
    blob = tmp_path / "block.jaxexport"
    blob.write_bytes(exp.serialize())
    targets = sorted({c.custom_call_target for c in exp.disabled_safety_checks
                      if hasattr(c, "custom_call_target")} | {f"polyop_{n}" for n in ("rms_norm", "softmax", "gelu")})
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    code = f"""
        import ctypes, sys
        import jax, numpy as np
        lib = ctypes.cdll.LoadLibrary({str(LIB)!r})
        handler = lib.polyop_xla_handler
        handler.restype, handler.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
        for t in {targets!r}:
            fn = handler(t.removeprefix("polyop_").encode())
            jax.ffi.register_ffi_target(t, jax.ffi.pycapsule(fn), platform="cpu")
        exp = jax.export.deserialize(bytearray(open({str(blob)!r}, "rb").read()))
        for b, s in {sizes!r}:
            x = np.load({str(tmp_path)!r} + f"/x{{b}}_{{s}}.npy")
            want = np.load({str(tmp_path)!r} + f"/y{{b}}_{{s}}.npy")
            y = np.asarray(exp.call(x))
            assert y.shape == want.shape, (y.shape, want.shape)
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        assert "polyop" not in sys.modules
        print("ok", len({sizes!r}))
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"ok {len(sizes)}"


def test_conv2d_and_topk_output_dims_are_symbolic_expressions():
    w = np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32)
    f = lambda x: pj.conv2d(x, w, stride=2, padding=1)  # noqa: E731
    spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape("n, 3, h, w"), jnp.float32)
    exp = pj.export(f)(spec)
    n, o, ho, wo = exp.out_avals[0].shape
    assert o == 4 and all(jax.export.is_symbolic_dim(d) for d in (n, ho, wo)), exp.out_avals
    for hw in [(9, 11), (16, 5)]:
        x = np.random.default_rng(hw[0]).standard_normal((2, 3, *hw)).astype(np.float32)
        want = jax.lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)])
        np.testing.assert_allclose(exp.call(x), want, rtol=1e-5, atol=1e-5)
    exp = pj.export(lambda x: pj.topk(x, k=3))(
        jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, n"), jnp.float32))
    assert str(exp.out_avals[0].shape) == "(b, 3)"
    x = np.random.default_rng(2).standard_normal((5, 10)).astype(np.float32)
    v, i = exp.call(x)
    want_v, want_i = jax.lax.top_k(x, 3)
    np.testing.assert_array_equal(v, want_v)
    np.testing.assert_array_equal(i, want_i)


def test_export_without_the_helper_is_refused_by_jax():
    # what polyop.jax.export saves users from writing: JAX's own refusal of unknown targets
    spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b"), jnp.float32)
    with pytest.raises(ValueError, match="custom calls whose targets have no compatibility"):
        jax.export.export(jax.jit(pj.relu))(spec)


def test_a_requirement_between_symbols_is_checked_when_called():
    # rms_norm's weight must equal x's last dim; with both symbolic and different, the
    # kernel's own check refuses the call at run time with the op's message.
    spec_x = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, d"), jnp.float32)
    exp = pj.export(lambda x: pj.rms_norm(x, jnp.ones((x.shape[-1],), jnp.float32)))(spec_x)
    x = np.random.default_rng(3).standard_normal((2, 6)).astype(np.float32)
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(exp.call(x), want, rtol=1e-5)
    b, d, e = jax.export.symbolic_shape("b, d, e")
    exp = pj.export(lambda x, w: pj.rms_norm(x, w))(
        jax.ShapeDtypeStruct((b, d), jnp.float32), jax.ShapeDtypeStruct((e,), jnp.float32))
    with pytest.raises(Exception, match="rms_norm: weight must have shape"):
        exp.call(x, np.ones(5, np.float32))


def test_static_export_round_trip_in_a_fresh_process(tmp_path):
    # jax.export with static shapes (the common case), every output of a multi-output op
    w = np.random.default_rng(5).standard_normal((4, 2, 3, 3)).astype(np.float32)

    def f(x, img):
        v, i = pj.topk(pj.softmax(x, axis=0), k=2, axis=0)
        return v, i, pj.conv2d(img, w, stride=1, padding=1)

    x = np.random.default_rng(6).standard_normal((5, 3)).astype(np.float32)
    img = np.random.default_rng(7).standard_normal((1, 2, 6, 6)).astype(np.float32)
    exp = pj.export(f)(x, img)
    (tmp_path / "f.jaxexport").write_bytes(exp.serialize())
    for k, o in enumerate(jax.jit(f)(x, img)):
        np.save(tmp_path / f"o{k}.npy", np.asarray(o))
    code = f"""
        import sys
        import numpy as np, jax
        import polyop.jax
        polyop.jax.load()  # registers the FFI targets the export calls
        exp = jax.export.deserialize(bytearray(open({str(tmp_path / 'f.jaxexport')!r}, "rb").read()))
        outs = exp.call(np.load({str(tmp_path / 'x.npy')!r}), np.load({str(tmp_path / 'img.npy')!r}))
        for k, o in enumerate(outs):
            assert np.array_equal(np.asarray(o), np.load({str(tmp_path)!r} + f"/o{{k}}.npy")), k
        print("ok")
    """
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "img.npy", img)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    # and the exported values are what JAX's own ops give
    want_v, want_i = jax.lax.top_k(jax.nn.softmax(x, axis=0).T, 2)
    np.testing.assert_allclose(np.load(tmp_path / "o0.npy"), np.asarray(want_v).T, rtol=1e-6)
    np.testing.assert_array_equal(np.load(tmp_path / "o1.npy"), np.asarray(want_i).T)
