"""Resource tests of the NumPy core (`polyop.run`): 100,000 calls with bounded RSS growth, an
error on every other call without a leak, 8 threads with results bitwise equal to one thread.
Helpers and the bound: tests/resource_check.py. References: NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import polyop
from resource_check import (
    CALLS,
    assert_bound_detects_a_64_byte_leak,
    assert_threads_bitwise_equal,
    check_loop,
    check_softmax_add_topk,
    numpy_softmax,
    numpy_topk,
)

RNG = np.random.default_rng(17)
X = RNG.standard_normal(16).astype(np.float32)
Y = RNG.standard_normal(16).astype(np.float32)
WANT = X + Y  # NumPy reference: float32 add is exact-rounded in both


def test_the_bound_detects_a_64_byte_leak_per_failing_call():
    assert_bound_detects_a_64_byte_leak(CALLS // 2)


def test_100k_calls_bounded_rss():
    last = []

    def step(i):
        out = polyop.run("add", X, Y)
        if i % 1000 == 0:
            last[:] = [out]

    check_loop("numpy-core add", step)
    np.testing.assert_array_equal(last[0], WANT)


def test_error_on_every_other_call_leaks_nothing_and_good_calls_stay_correct():
    bad_y = np.ones(5, np.float32)
    counts = {"axis": 0, "broadcast": 0, "good": 0}

    def step(i):
        if i % 2:
            out = polyop.run("add", X, Y)
            if not np.array_equal(out, WANT):
                raise AssertionError(f"call {i}: {out} != {WANT}")
            counts["good"] += 1
        elif i % 4:
            try:
                polyop.run("softmax", X, axis=5)
            except ValueError as e:
                assert "polyop.softmax: axis 5 is out of range" in str(e), e
                counts["axis"] += 1
        else:
            try:
                polyop.run("add", X, bad_y)
            except ValueError as e:
                assert "polyop.add: shapes [16] and [5] cannot be broadcast" in str(e), e
                counts["broadcast"] += 1

    check_loop("numpy-core add + errors", step)
    total = CALLS + 2000
    assert counts == {"axis": total // 4, "broadcast": total // 4, "good": total // 2}, counts


def _inputs():
    rng = np.random.default_rng(5)
    return [
        (rng.standard_normal((64, 257)).astype(np.float32), rng.standard_normal((64, 257)).astype(np.float32))
        for _ in range(4)
    ]


def _work(inputs, reps=25):
    out = []
    for _ in range(reps):
        for x, y in inputs:
            s = polyop.run("softmax", x, axis=-1)
            a = polyop.run("add", x, y)
            v, idx = polyop.run("topk", x, k=5)
            out.append((s.tobytes(), a.tobytes(), v.tobytes(), idx.tobytes()))
    return out


def test_eight_threads_bitwise_equal_to_one_thread():
    inputs = _inputs()
    single = _work(inputs)
    # the single-threaded results against NumPy first
    check_softmax_add_topk(single, [(numpy_softmax(x), x + y, *numpy_topk(x, 5)) for x, y in inputs])
    assert_threads_bitwise_equal(single, lambda t: _work(inputs))
