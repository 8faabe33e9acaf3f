"""polyop ops under tf.distribute.MirroredStrategy over 2 logical CPU devices
(docs/distributed.md): a Keras model with polyop layers trains to the same weights as its
built-in twin, and polyop's kernels add one pool of threads (one per core) to the process,
not one per replica. In one process: nothing can wait on a peer."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

# Must precede TF's device initialisation (CI runs each test file in its own process).
_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

import polyop.keras as pk  # noqa: E402

keras.config.set_floatx("float64")


class TwinRMSNorm(keras.layers.Layer):
    """Built-in twin of pk.RMSNorm, from keras.ops."""

    def build(self, input_shape):
        self.weight = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="weight")

    def call(self, x):
        ms = keras.ops.mean(x * x, axis=-1, keepdims=True)
        return x / keras.ops.sqrt(ms + 1e-6) * self.weight


def make(polyop: bool):
    x = keras.Input((16,))
    h = keras.layers.Dense(32)(x)
    h = pk.Op("gelu")(h) if polyop else keras.layers.Activation(lambda v: keras.activations.gelu(v, approximate=False))(h)
    h = pk.RMSNorm()(h) if polyop else TwinRMSNorm()(h)
    h = keras.layers.Dense(4)(h)
    y = pk.Op("softmax", axis=-1)(h) if polyop else keras.layers.Softmax()(h)
    return keras.Model(x, y)


def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16))
    t = rng.dirichlet(np.ones(4), size=64)
    return x, t


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def polyop_threads() -> int:
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().startswith("polyop-")
        except OSError:  # a thread that ended meanwhile
            pass
    return n


def train(strategy, polyop: bool, init):
    x, t = data()
    with strategy.scope():
        m = make(polyop)
        m.set_weights(init)
        m.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    m.fit(x, t, batch_size=16, epochs=3, shuffle=False, verbose=0)
    return m.get_weights()


def test_mirrored_strategy_trains_like_the_builtin_twin():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        init = make(True).get_weights()
    want = train(strategy, False, init)
    got = train(strategy, True, init)
    # polyop's kernels run on one shared pool of one thread per core, whatever the replicas:
    # both replicas run an op big enough to be split into many tasks, and the process then has
    # exactly one pool's worth of polyop-N threads (counting every thread of the process
    # instead also counted whatever TensorFlow started meanwhile; this model's own ops are
    # too small to reach the pool)
    import polyop.tensorflow as ptf

    big = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(np.ones((2048, 1024))).batch(2048))
    strategy.run(tf.function(lambda b: ptf.load().softmax(b, axis=-1)), args=(next(iter(big)),))
    cores = len(os.sched_getaffinity(0))
    assert polyop_threads() == cores, (polyop_threads(), cores, threads())
    moved = max(np.abs(w - i).max() for w, i in zip(want, init))
    assert moved > 1e-2  # it trained: equal-but-untrained weights would also match
    for g, w in zip(got, want):
        # Within one float32 ulp of the largest weight, in float64: the twin's own gelu is no
        # better than that (TF's float64 erf is off by up to 5e-9, measured against math.erf;
        # polyop's by 9e-16), and training only carries the difference along.
        np.testing.assert_allclose(g, w, rtol=0, atol=2.0**-23 * np.abs(w).max())


def test_replicas_each_run_the_kernel_on_their_own_batch():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    import polyop.tensorflow as ptf

    ops = ptf.load()
    x = np.random.default_rng(1).standard_normal((8, 16))
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(x).batch(8))
    per_replica = strategy.run(tf.function(lambda b: ops.softmax(b, axis=-1)), args=(next(iter(dist)),))
    parts = strategy.experimental_local_results(per_replica)
    assert len(parts) == 2 and [p.shape[0] for p in parts] == [4, 4]
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(np.concatenate([p.numpy() for p in parts]), e / e.sum(-1, keepdims=True), rtol=1e-14)


def test_docs_example_runs():
    """examples/distributed/tf_mirrored.py, as docs/distributed.md shows it."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root / "python"))
    p = subprocess.run([sys.executable, str(root / "examples/distributed/tf_mirrored.py")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "replicas: 2 loss:" in p.stdout, p.stdout


if __name__ == "__main__":
    pytest.main([__file__, "-q", "-s"])
