"""polyop ops under JAX sharding on 4 host CPU devices (docs/distributed.md).

Every op's sharding rule (kernel-core) reaches XLA's partitioner through
``custom_partitioning``: ``jit`` over inputs split along a dim the op computes independently
along compiles with no all-gather and keeps the outputs split; an input split along a dim the
op needs whole is gathered first, and the result is the single-device one. Counts come from
the compiled HLO. Runs in one process (host devices), so nothing can wait on a peer.
"""

from __future__ import annotations

import os
import re

# Must precede the first import of jax in this process (CI runs each test file on its own).
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import polyop  # noqa: E402
import polyop.jax as pj  # noqa: E402
from polyop.conformance.tolerances import rtol_atol  # noqa: E402
from _sharding_cases import cases  # noqa: E402

jax.config.update("jax_enable_x64", True)  # topk's int64 indices stay int64 on the devices
RNG = np.random.default_rng(0)


def arr(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def mesh():
    assert len(jax.devices()) == 4, "XLA_FLAGS was set too late: jax was imported before this module"
    return jax.make_mesh((4,), ("x",))


def put(mesh, a, *spec):
    return jax.device_put(a, NamedSharding(mesh, P(*spec)))


def collectives(f, *args) -> dict[str, int]:
    hlo = jax.jit(f).lower(*args).compile().as_text()
    return {k: len(re.findall(rf"\b{k}(-start)?\(", hlo)) for k in ("all-gather", "all-reduce", "all-to-all", "collective-permute")}


def as_tuple(y):
    return y if isinstance(y, (tuple, list)) else (y,)


def _x():
    return arr(8, 16)


CASES = cases()


def test_every_jax_op_has_a_case():
    jax_ops = {o["name"] for o in polyop.ops() if not o["flags"]["inplace"] and not o["flags"]["data_dependent_shape"]}
    assert set(CASES) == jax_ops


def assert_same(got, want, summed=False):
    got, want = np.asarray(got), np.asarray(want)
    if not summed:
        # the same rows through the same kernel: bit for bit
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
        return
    # a sum of per-shard partial sums (psum): another order of the same float32 additions
    rtol, _ = rtol_atol("float32", ulps=16)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


@pytest.mark.parametrize("name", sorted(CASES))
def test_batch_sharded_op_runs_without_gathering(mesh, name):
    inputs, attrs = CASES[name]
    sharded = [put(mesh, inputs[0], "x")] + [put(mesh, a) for a in inputs[1:]]
    f = lambda *xs: pj.call(name, *xs, **attrs)  # noqa: E731
    counts = collectives(f, *sharded)
    assert counts["all-gather"] == 0 and counts["all-to-all"] == 0, counts
    got = as_tuple(jax.jit(f)(*sharded))
    want = as_tuple(pj.call(name, *inputs, **attrs))
    rule = polyop.infer_symbolic(name, [(a.shape, "float32" if a.dtype == np.float32 else "int64") for a in inputs], **attrs)["sharding"]
    batch = rule["inputs"][0][0]
    assert rule["factors"][batch] == "split"
    for out, g, w in zip(rule["outputs"], got, want):
        if batch in out:
            # kept split along the batch
            assert g.sharding.spec[out.index(batch)] == "x", g.sharding
            assert_same(g, w)
        else:
            # summed over the batch (a weight gradient): one all-reduce, replicated result
            assert counts["all-reduce"] >= 1
            assert_same(g, w, summed=True)


@pytest.mark.parametrize(
    "name, inputs, attrs",
    [
        ("rms_norm", lambda: [arr(8, 3, 4), arr(3, 4)], {"axis": 1}),
        ("conv2d", lambda: [arr(8, 4, 6, 6), arr(6, 2, 3, 3), None], {"groups": 2, "padding": [1, 0, 0, 1], "dilation": 2}),
        ("conv2d", lambda: [arr(8, 4, 6, 6), arr(4, 1, 3, 3), arr(4)], {"groups": 4, "stride": [2, 1]}),
    ],
)
def test_batch_split_with_axis_and_groups(mesh, name, inputs, attrs):
    """The rule follows the attributes: rms_norm normalises every dim from `axis` on (whole),
    grouped and depthwise conv2d keep the batch split."""
    xs = inputs()
    sharded = [put(mesh, xs[0], "x")] + [None if a is None else put(mesh, a) for a in xs[1:]]
    f = lambda *a: pj.call(name, *a, **attrs)  # noqa: E731
    assert collectives(f, *sharded)["all-gather"] == 0
    got = jax.jit(f)(*sharded)
    assert got.sharding.spec[0] == "x"
    assert_same(got, pj.call(name, *xs, **attrs))


def test_without_the_rule_xla_gathers_and_replicates(mesh):
    """The same FFI call without custom_partitioning: what every op did before its rule."""
    x = put(mesh, _x(), "x")
    raw = lambda a: pj._raw_call("softmax", {"axis": -1}, (True,), (a,))[0]  # noqa: E731
    assert collectives(raw, x)["all-gather"] >= 1
    assert jax.jit(raw)(x).sharding.spec in (P(), P(None), P(None, None))
    assert collectives(lambda a: pj.softmax(a), x)["all-gather"] == 0


@pytest.mark.parametrize(
    "name, inputs, attrs, spec",
    [
        ("softmax", lambda: [_x()], {"axis": 0}, ("x", None)),
        ("softmax", lambda: [_x()], {"axis": -1}, (None, "x")),
        ("topk", lambda: [_x()], {"k": 5}, (None, "x")),
        ("rms_norm", lambda: [_x(), arr(16)], {}, (None, "x")),
        ("conv2d", lambda: [arr(2, 3, 8, 8), arr(4, 3, 3, 3), arr(4)], {"padding": 1}, (None, None, "x", None)),
        ("conv2d", lambda: [arr(2, 4, 8, 8), arr(4, 4, 3, 3), None], {"padding": 1}, (None, "x", None, None)),
    ],
)
def test_split_along_a_whole_dim_is_gathered_and_correct(mesh, name, inputs, attrs, spec):
    xs = inputs()
    sharded = [put(mesh, xs[0], *spec)] + [None if a is None else put(mesh, a) for a in xs[1:]]
    f = lambda *a: pj.call(name, *a, **attrs)  # noqa: E731
    assert collectives(f, *sharded)["all-gather"] >= 1  # data had to move
    for g, w in zip(as_tuple(jax.jit(f)(*sharded)), as_tuple(pj.call(name, *xs, **attrs))):
        assert_same(g, w)


def _loss(x, w, b):
    h = pj.gelu(pj.add(x @ w, b))
    return jnp.sum(pj.softmax(pj.rms_norm(h, jnp.ones(h.shape[-1], h.dtype))) ** 2)


def test_grad_of_a_batch_sharded_model(mesh):
    x, w, b = arr(8, 16), arr(16, 32) * 0.2, arr(32)
    args = (put(mesh, x, "x"), put(mesh, w), put(mesh, b))
    grad = jax.grad(_loss, argnums=(0, 1, 2))
    counts = collectives(grad, *args)
    assert counts["all-gather"] == 0, counts
    got = jax.jit(grad)(*args)
    want = jax.grad(_loss, argnums=(0, 1, 2))(x, w, b)
    assert got[0].sharding.spec[0] == "x"
    assert_same(got[0], want[0], summed=True)  # x @ w's gradient: XLA's own dot per shard
    assert_same(got[1], want[1], summed=True)
    assert_same(got[2], want[2], summed=True)


def test_vmap_inside_jit_keeps_the_batch_split(mesh):
    x = _x()
    f = jax.vmap(lambda r: pj.softmax(pj.gelu(r)))
    xs = put(mesh, x, "x")
    assert collectives(f, xs)["all-gather"] == 0
    got = jax.jit(f)(xs)
    assert got.sharding.spec[0] == "x"
    assert_same(got, pj.softmax(pj.gelu(x)))


def test_shard_map(mesh):
    x = _x()
    f = jax.shard_map(lambda a: pj.rms_norm(pj.softmax(a), None), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    assert_same(jax.jit(f)(put(mesh, x, "x")), pj.rms_norm(pj.softmax(x), None))


def test_two_axis_mesh():
    mesh = jax.make_mesh((2, 2), ("a", "b"))
    x = _x()
    xs = jax.device_put(x, NamedSharding(mesh, P("a", "b")))
    f = lambda a: pj.gelu(pj.negate(a))  # noqa: E731
    assert collectives(f, xs)["all-gather"] == 0
    got = jax.jit(f)(xs)
    assert got.sharding.spec == P("a", "b")
    assert_same(got, pj.gelu(pj.negate(x)))
    # softmax along the split last dim: gathered along b only, rows stay split along a
    s = lambda a: pj.softmax(a, axis=-1)  # noqa: E731
    got = jax.jit(s)(xs)
    assert got.sharding.spec[0] == "a"
    assert_same(got, pj.softmax(x, axis=-1))


def test_docs_example_runs():
    """examples/distributed/jax_sharding.py, as docs/distributed.md shows it."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root / "python"))
    env.pop("XLA_FLAGS", None)
    p = subprocess.run([sys.executable, str(root / "examples/distributed/jax_sharding.py")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "output sharding: PartitionSpec('x',)" in p.stdout or "output sharding: P('x',)" in p.stdout, p.stdout
    assert "all-gathers: 0" in p.stdout, p.stdout
