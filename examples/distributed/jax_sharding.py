"""polyop ops in a sharded JAX program: 4 host CPU devices, a batch split along mesh axis
"x". Run: python examples/distributed/jax_sharding.py"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"  # before importing jax

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import polyop.jax as pj

mesh = jax.make_mesh((4,), ("x",))
x = jax.device_put(np.random.default_rng(0).standard_normal((64, 128), np.float32), NamedSharding(mesh, P("x")))
w = jnp.ones(128, jnp.float32)


def layer(x, w):
    return pj.softmax(pj.rms_norm(pj.gelu(x), w), axis=-1)


y = jax.jit(layer)(x, w)
hlo = jax.jit(layer).lower(x, w).compile().as_text()
print("output sharding:", y.sharding.spec)  # PartitionSpec('x',): still split by rows
print("all-gathers:", len(re.findall(r"all-gather(-start)?\(", hlo)))  # 0
g = jax.jit(jax.grad(lambda x, w: jnp.sum(layer(x, w) ** 2), argnums=1))(x, w)
print("weight gradient (psum over the shards):", g.shape, g.sharding.spec)
