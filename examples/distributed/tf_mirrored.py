"""A Keras model with polyop layers under tf.distribute.MirroredStrategy, 2 logical CPUs.
Run: python examples/distributed/tf_mirrored.py"""

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

import polyop.keras as pk  # noqa: E402

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    inp = keras.Input((16,))
    h = pk.RMSNorm()(pk.Op("gelu")(keras.layers.Dense(32)(inp)))
    model = keras.Model(inp, pk.Op("softmax", axis=-1)(keras.layers.Dense(4)(h)))
    model.compile(optimizer="sgd", loss="mse")
rng = np.random.default_rng(0)
x, t = rng.standard_normal((64, 16), np.float32), rng.dirichlet(np.ones(4), 64).astype(np.float32)
hist = model.fit(x, t, batch_size=16, epochs=2, verbose=0)
print("replicas:", strategy.num_replicas_in_sync, "loss:", hist.history["loss"])
