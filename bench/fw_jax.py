"""JAX: polyop.jax.<op> under jax.jit against jitted jax.numpy / jax.nn / jax.lax built-ins."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import polyop.jax as pj
from common import Result, Workload, measure_workloads


def _rms(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _conv(x, w, b, stride, padding):
    y = jax.lax.conv_general_dilated(x, w, (stride, stride), [(padding, padding)] * 2, dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y if b is None else y + b[None, :, None, None]


BUILTIN = {
    "negate": ("jnp.negative", lambda x: jnp.negative(x)),
    "add": ("jnp.add", lambda x, y: jnp.add(x, y)),
    "scale": ("x * alpha", lambda x, alpha: x * alpha),
    "relu": ("jax.nn.relu", lambda x: jax.nn.relu(x)),
    "add_relu": ("jax.nn.relu(x + y)", lambda x, y: jax.nn.relu(x + y)),
    "gelu": ("jax.nn.gelu", lambda x, approximate: jax.nn.gelu(x, approximate=approximate == "tanh")),
    "softmax": ("jax.nn.softmax", lambda x, axis: jax.nn.softmax(x, axis=axis)),
    "rms_norm": ("composite (rsqrt, mean)", _rms),
    "topk": ("jax.lax.top_k", lambda x, k, axis, largest: jax.lax.top_k(x, k)),
    "conv2d": ("jax.lax.conv_general_dilated", _conv),
}


def calls(w: Workload) -> dict | None:
    """polyop's and the built-in's call on `w`'s inputs (None: not timed here)."""
    if w.op == "nonzero":
        return None  # data-dependent shape: refused under jit by design (see docs/xla.md)
    xs = [None if a is None else jnp.asarray(a) for a in w.inputs]
    builtin = BUILTIN[w.op][1]
    attrs = dict(w.attrs)
    pfn = jax.jit(lambda *a: getattr(pj, w.op)(*a, **attrs))
    bfn = jax.jit(lambda *a: builtin(*a, *attrs.values()))
    return {
        "polyop": lambda: jax.block_until_ready(pfn(*xs)),
        "builtin": lambda: jax.block_until_ready(bfn(*xs)),
    }


def run(workloads: list[Workload]) -> list[Result]:
    results = []
    for w, t, extra in measure_workloads(workloads, calls):
        name = BUILTIN[w.op][0]
        results.append(Result("jax", w.op, w.kind, w.label, t["polyop"], t["builtin"], name, w.unit, w.work, extra))
    return results


def set_threads(n: int) -> str:
    """XLA:CPU sizes its intra-op pool (threads named tf_XLAEigen) from the NPROC environment
    variable when it is set (else from the CPUs the process may run on) when the CPU client
    starts; bench/run.py sets NPROC in this process's environment. polyop's XLA kernels run on
    that pool (adapters/xla/src/pool.rs: `XLA_FFI_ThreadPool_Schedule`). Nothing to do here but
    check: start the client and count the pool's threads."""
    import os

    jax.block_until_ready(jnp.zeros(1) + 1)
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return f"NPROC={os.environ.get('NPROC')} in the environment ({names.count('tf_XLAEigen')} tf_XLAEigen threads)"


def versions() -> dict:
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
