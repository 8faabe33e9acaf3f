"""TensorFlow deployment routes for models with polyop ops: a SavedModel and a Keras 3 model
(polyop layers, fitted, then ``model.export`` and ``.keras``) reload in a fresh process and
give the source's eager outputs bit for bit; ``jit_compile=True`` is refused with an error that
names polyop and the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import polyop
import polyop.tensorflow as ptf

REPO = Path(__file__).resolve().parents[1]
TF_LIB = polyop.library_path("tensorflow")
OPS = ptf.load()
D = 16


def fresh(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


class Block(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.linspace(0.5, 1.5, D).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, D], tf.float32)])
    def __call__(self, x):
        h = OPS.rms_norm(x, self.w, eps=1e-5)
        v, i = OPS.topk(OPS.gelu(OPS.softmax(h), approximate="tanh"), k=3)
        return {"values": v, "indices": i, "sum": OPS.add_relu(h, x)}


def test_saved_model_serves_in_a_process_that_only_loads_the_op_library(tmp_path):
    m = Block()
    tf.saved_model.save(m, str(tmp_path / "sm"))
    sizes = (1, 4, 9)
    for b in sizes:
        x = np.random.default_rng(b).standard_normal((b, D)).astype(np.float32)
        np.save(tmp_path / f"x{b}.npy", x)
        for k, v in m(tf.constant(x)).items():  # the source's outputs (graph = eager here)
            np.save(tmp_path / f"{k}{b}.npy", v.numpy())
    out = fresh(f"""
        import sys
        import numpy as np, tensorflow as tf
        tf.load_op_library({TF_LIB!r})
        m = tf.saved_model.load({str(tmp_path / 'sm')!r})
        for b in {sizes!r}:
            got = m(tf.constant(np.load({str(tmp_path)!r} + f"/x{{b}}.npy")))
            for k, v in got.items():
                want = np.load({str(tmp_path)!r} + f"/{{k}}{{b}}.npy")
                assert v.shape == want.shape and np.array_equal(v.numpy(), want), (b, k)
        assert "polyop" not in sys.modules
        print("ok")
    """)
    assert out == "ok"
    # and the source graph agrees with eager calls of the same ops
    x = tf.constant(np.random.default_rng(4).standard_normal((4, D)).astype(np.float32))
    h = OPS.rms_norm(x, m.w, eps=1e-5)
    np.testing.assert_array_equal(m(x)["sum"].numpy(), np.maximum(h.numpy() + x.numpy(), 0))


def test_keras_model_with_polyop_layers_fits_exports_and_reloads(tmp_path):
    import keras

    import polyop.keras as pk

    keras.utils.set_random_seed(0)
    x = keras.Input((D,))
    h = pk.RMSNorm(eps=1e-5)(x)
    h = keras.layers.Dense(8)(h)
    y = pk.Op("gelu", approximate="tanh")(h)
    model = keras.Model(x, y)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    X = np.random.default_rng(0).standard_normal((64, D)).astype(np.float32)
    Y = np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)
    loss = model.fit(X, Y, epochs=4, batch_size=16, verbose=0, shuffle=False).history["loss"]
    assert loss[-1] < loss[0] * 0.95, loss  # gradients flow through polyop's backward ops
    # the layer computes what its reference computes: rms_norm * weight, then tanh-gelu
    w = model.layers[1].weight.numpy()
    ref = X / np.sqrt(np.mean(X.astype(np.float64) ** 2, -1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(model.layers[1](X).numpy(), ref, rtol=1e-5, atol=1e-6)

    model.export(str(tmp_path / "served"), verbose=False)
    model.save(str(tmp_path / "model.keras"))
    np.save(tmp_path / "x.npy", X[:7])
    np.save(tmp_path / "y.npy", np.asarray(model(X[:7])))
    out = fresh(f"""
        import sys
        import numpy as np, tensorflow as tf
        tf.load_op_library({TF_LIB!r})
        served = tf.saved_model.load({str(tmp_path / 'served')!r})
        y = served.serve(tf.constant(np.load({str(tmp_path / 'x.npy')!r})))
        assert np.array_equal(y.numpy(), np.load({str(tmp_path / 'y.npy')!r}))
        assert "polyop" not in sys.modules
        print("ok")
    """)
    assert out == "ok"
    out = fresh(f"""
        import numpy as np, keras
        import polyop.keras  # the layer classes .keras files name
        m = keras.saving.load_model({str(tmp_path / 'model.keras')!r})
        y = np.asarray(m(np.load({str(tmp_path / 'x.npy')!r})))
        assert np.array_equal(y, np.load({str(tmp_path / 'y.npy')!r}))
        print("ok")
    """)
    assert out == "ok"


def test_jit_compile_is_refused_with_the_reason():
    @tf.function(jit_compile=True)
    def f(x):
        return OPS.relu(x)

    with pytest.raises(tf.errors.UnimplementedError, match=r"polyop\.relu: .*jit_compile=True.*XLA"):
        f(tf.ones([2, 3]))
    # an outer jit_compile function reaches the op through an inner plain one
    inner = tf.function(lambda x: OPS.gelu(x))
    with pytest.raises(tf.errors.UnimplementedError, match=r"polyop\.gelu"):
        tf.function(lambda x: inner(x), jit_compile=True)(tf.ones([2]))
    # the same op without XLA still works, in the same process
    np.testing.assert_array_equal(
        tf.function(lambda x: OPS.relu(x))(tf.constant([-1.0, 2.0])).numpy(), [0.0, 2.0])
