"""The authoring guide's ops (examples/guide: `leaky_relu_scaled` with float attributes and a
backward that receives them, `minmax` with an int axis, two outputs and no gradient, `pad_add`
with an `int[]` attribute and an optional input) built as an out-of-tree crate into all four
framework libraries and used as docs/authoring.md shows, in every framework, each in its own
process: values against NumPy formulas, gradients against the hand-derived ones, and the same
"no gradient" error everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "guide"
# Built into the swiglu example's target directory: the same adapters and dependencies, so
# they compile once for both examples.
TARGET = ROOT / "examples" / "swiglu" / "target"
FRAMEWORKS = ("torch", "tensorflow", "onnxruntime", "xla")

COMMON = """
    import numpy as np
    x = np.array([[-2.0, 0.5, 3.0], [1.0, -4.0, 0.25]])
    def leaky(x, slope, scale): return scale * np.where(x > 0, x, slope * x)
    def dleaky(x, slope, scale): return scale * np.where(x > 0, 1.0, slope)
    bias = np.array([10.0, 20.0, 30.0])
    def padded(x, before, after):
        return np.concatenate([np.zeros((x.shape[0], before)), x, np.zeros((x.shape[0], after))], axis=1)
    def expect_error(call, types, text):
        # errors name the library's namespace (guide_ops), not polyop's
        try:
            call()
        except types as e:
            assert text in str(e), e
            return
        raise AssertionError(f"no error containing {text!r}")
    AXIS5 = "guide_ops.minmax: axis 5 is out of range for a tensor of rank 2"
"""


def _run(cmd, timeout=1800, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw)


@pytest.fixture(scope="module")
def libs() -> dict[str, str]:
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET),
               POLYOP_PYTHON=os.environ.get("POLYOP_PYTHON", sys.executable))
    p = _run(["cargo", "build", "--release", "--manifest-path", str(EX / "Cargo.toml")], env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    out = {fw: str(TARGET / "release" / f"libguide_{fw}.so") for fw in FRAMEWORKS}
    for path in out.values():
        assert Path(path).is_file(), path
    return out


def _py(code: str) -> None:
    r = _run([sys.executable, "-c", textwrap.dedent(COMMON) + textwrap.dedent(code)], timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


def test_the_ops_own_rust_tests():
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET))
    p = _run(["cargo", "test", "-q", "--manifest-path", str(EX / "Cargo.toml"), "-p", "guide-ops"], env=env)
    assert p.returncode == 0 and "3 passed" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]


def test_torch(libs):
    _py(f"""
        import torch, polyop.torch
        ops = polyop.torch.load({libs['torch']!r})                 # torch.ops.guide_ops
        t = torch.tensor(x, requires_grad=True)
        y = ops.leaky_relu_scaled(t, slope=0.1, scale=2.0)
        assert np.array_equal(y.detach().numpy(), leaky(x, 0.1, 2.0))
        y.sum().backward()                                          # leaky_relu_scaled_backward
        assert np.array_equal(t.grad.numpy(), dleaky(x, 0.1, 2.0))
        lo, hi = ops.minmax(t, axis=0)
        assert np.array_equal(lo.detach().numpy(), x.min(0)) and np.array_equal(hi.detach().numpy(), x.max(0))
        try:
            hi.sum().backward()
            raise AssertionError("minmax has no gradient")
        except RuntimeError as e:
            assert "guide_ops.minmax: this op has no gradient" in str(e), e
        expect_error(lambda: ops.minmax(t, axis=5), RuntimeError, AXIS5)
        p = ops.pad_add(torch.tensor(x), torch.tensor(bias), pads=[1, 2])
        assert np.array_equal(p.numpy(), padded(x + bias, 1, 2))
        assert np.array_equal(ops.pad_add(torch.tensor(x), None, pads=[0, 1]).numpy(), padded(x, 0, 1))
        print("ok")
    """)


def test_tensorflow(libs):
    _py(f"""
        import tensorflow as tf, polyop.tensorflow as ptf
        ops = ptf.load({libs['tensorflow']!r})                      # op types GuideLeakyReluScaled, ...
        t = tf.Variable(x)
        with tf.GradientTape() as tape:
            y = ops.leaky_relu_scaled(t, slope=0.1, scale=2.0)
        assert np.array_equal(y.numpy(), leaky(x, 0.1, 2.0))
        assert np.array_equal(tape.gradient(y, t).numpy(), dleaky(x, 0.1, 2.0))
        with tf.GradientTape() as tape:
            lo, hi = ops.minmax(t, axis=0)
        assert np.array_equal(lo.numpy(), x.min(0)) and np.array_equal(hi.numpy(), x.max(0))
        try:
            tape.gradient(hi, t)
            raise AssertionError("minmax has no gradient")
        except LookupError as e:
            assert "guide_ops.minmax: this op has no gradient" in str(e), e
        expect_error(lambda: ops.minmax(t, axis=5), (tf.errors.InvalidArgumentError, ValueError), AXIS5)
        f = tf.function(lambda a, b: ops.pad_add(a, b, pads=[1, 2]),
                        input_signature=[tf.TensorSpec([None, 3], tf.float64), tf.TensorSpec([3], tf.float64)])
        assert f.get_concrete_function().structured_outputs.shape.as_list() == [None, 6]
        assert np.array_equal(f(x, bias).numpy(), padded(x + bias, 1, 2))
        assert np.array_equal(ops.pad_add(x, None, pads=[0, 1]).numpy(), padded(x, 0, 1))
        print("ok")
    """)


def test_onnxruntime(libs):
    _py(f"""
        import polyop.onnxruntime as pox
        lib = pox.load({libs['onnxruntime']!r})                     # domain ai.guide
        assert pox.op_type("leaky_relu_scaled", library=lib.path) == "LeakyReluScaled"
        assert np.array_equal(lib.leaky_relu_scaled(x, slope=0.1, scale=2.0), leaky(x, 0.1, 2.0))
        lo, hi = lib.minmax(x, axis=0)
        assert np.array_equal(lo, x.min(0)) and np.array_equal(hi, x.max(0))
        assert np.array_equal(lib.pad_add(x, bias, pads=[1, 2]), padded(x + bias, 1, 2))
        assert np.array_equal(lib.pad_add(x, None, pads=[0, 1]), padded(x, 0, 1))
        expect_error(lambda: lib.minmax(x, axis=5), Exception, AXIS5)
        expect_error(lambda: lib.minmax(x, axes=0), TypeError, "guide_ops.minmax: unknown attribute `axes`")
        print("ok")
    """)


def test_jax(libs):
    _py(f"""
        import jax
        jax.config.update("jax_enable_x64", True)
        import polyop.jax as pj
        ops = pj.load({libs['xla']!r})                              # targets guide_<op>
        y = jax.jit(lambda a: ops.leaky_relu_scaled(a, slope=0.1, scale=2.0))(x)
        assert np.array_equal(np.asarray(y), leaky(x, 0.1, 2.0))
        g = jax.grad(lambda a: ops.leaky_relu_scaled(a, slope=0.1, scale=2.0).sum())(x)
        assert np.array_equal(np.asarray(g), dleaky(x, 0.1, 2.0))
        lo, hi = jax.jit(lambda a: ops.minmax(a, axis=0))(x)
        assert np.array_equal(np.asarray(lo), x.min(0)) and np.array_equal(np.asarray(hi), x.max(0))
        try:
            jax.grad(lambda a: ops.minmax(a, axis=0)[1].sum())(x)
            raise AssertionError("minmax has no gradient")
        except NotImplementedError as e:
            assert "guide_ops.minmax: this op has no gradient" in str(e), e
        expect_error(lambda: ops.minmax(x, axis=5), (ValueError, jax.errors.JaxRuntimeError), AXIS5)
        assert np.array_equal(np.asarray(ops.pad_add(x, bias, pads=[1, 2])), padded(x + bias, 1, 2))
        assert np.array_equal(np.asarray(ops.pad_add(x, None, pads=[0, 1])), padded(x, 0, 1))
        print("ok")
    """)
