"""Resource tests of the TensorFlow surface (the raw `tf.load_op_library` module): 100,000
eager calls with bounded RSS growth, an error on every other call without a leak, 8 threads
with results bitwise equal to one thread. Helpers and the bound: tests/resource_check.py.
References: TensorFlow's / NumPy's own ops."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import polyop.tensorflow as ptf
import resource_check
from resource_check import (
    CALLS,
    LEAK_BOUND,
    WARMUP,
    assert_bound_detects_a_64_byte_leak,
    assert_threads_bitwise_equal,
    check_loop,
    check_softmax_add_topk,
    numpy_topk,
    report,
    rss_growth,
)

M = ptf.load().handle  # the module tf.load_op_library returned
RNG = np.random.default_rng(17)
X = tf.constant(RNG.standard_normal(16).astype(np.float32))
Y = tf.constant(RNG.standard_normal(16).astype(np.float32))
WANT = (X.numpy() + Y.numpy())


def test_the_bound_detects_a_64_byte_leak_per_failing_call():
    assert_bound_detects_a_64_byte_leak(CALLS // 2)


def test_100k_calls_bounded_rss():
    last = []

    def step(i):
        out = M.polyop_add(X, Y)
        if i % 1000 == 0:
            last[:] = [out]

    check_loop("tensorflow add", step)
    np.testing.assert_array_equal(last[0].numpy(), WANT)


def test_error_on_every_other_call_leaks_nothing_and_good_calls_stay_correct():
    bad_y = tf.ones(5)
    counts = {"axis": 0, "broadcast": 0, "good": 0}

    def step(i):
        if i % 2:
            if not np.array_equal(M.polyop_add(X, Y).numpy(), WANT):
                raise AssertionError(f"call {i}: wrong result")
            counts["good"] += 1
        elif i % 4:
            try:
                M.polyop_softmax(X, axis=5)
            except tf.errors.InvalidArgumentError as e:
                assert "polyop.softmax: axis 5 is out of range" in str(e), e
                counts["axis"] += 1
        else:
            try:
                M.polyop_add(X, bad_y)
            except tf.errors.InvalidArgumentError as e:
                assert "polyop.add: shapes [16] and [5] cannot be broadcast" in str(e), e
                counts["broadcast"] += 1

    # TensorFlow's eager error path itself keeps ~320 B per failing op (measured with the
    # built-in AddV2 failing the same way, below), so the bound here is relative: polyop's
    # growth may exceed the built-in's by LEAK_BOUND plus 64 B per failing call, which catches
    # a leak of more than ~85 B per failing call beyond TensorFlow's own. Measured: polyop's
    # failing calls keep ~25 B more than the built-in's (not explained yet; docs/reliability.md).
    halves = rss_growth(step, CALLS)
    line = report("tensorflow add + errors", halves)
    assert resource_check.LAST_BLOCKS[0] < resource_check.BLOCKS_BOUND, f"leak: {line}"
    total = CALLS + WARMUP
    assert counts == {"axis": total // 4, "broadcast": total // 4, "good": total // 2}, counts

    def builtin_step(i):
        if i % 2:
            tf.raw_ops.AddV2(x=X, y=Y)
        else:
            try:
                tf.raw_ops.AddV2(x=X, y=bad_y)
            except tf.errors.InvalidArgumentError as e:
                assert "Incompatible shapes" in str(e), e

    base = rss_growth(builtin_step, CALLS)
    report("tensorflow built-in AddV2 + errors (baseline)", base)
    failing_per_half = CALLS // 4
    assert min(halves) < max(base) + LEAK_BOUND + 64 * failing_per_half, (halves, base)


def _work(inputs, reps=25):
    out = []
    for _ in range(reps):
        for x, y in inputs:
            s = M.polyop_softmax(x, axis=-1)
            a = M.polyop_add(x, y)
            v, idx = M.polyop_topk(x, k=5, axis=-1, largest=True)
            out.append(tuple(t.numpy().tobytes() for t in (s, a, v, idx)))
    return out


def test_eight_threads_bitwise_equal_to_one_thread():
    rng = np.random.default_rng(5)
    inputs = [(tf.constant(rng.standard_normal((64, 257)).astype(np.float32)),
               tf.constant(rng.standard_normal((64, 257)).astype(np.float32))) for _ in range(4)]
    single = _work(inputs)
    check_softmax_add_topk(single, [
        (tf.nn.softmax(tf.cast(x, tf.float64), -1).numpy(), x.numpy() + y.numpy(), *numpy_topk(x.numpy(), 5))
        for x, y in inputs])
    assert_threads_bitwise_equal(single, lambda t: _work(inputs))
