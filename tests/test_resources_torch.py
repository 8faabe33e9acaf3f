"""Resource tests of the torch surface (torch.ops.polyop): 100,000 calls with bounded RSS
growth, an error on every other call without a leak, 8 threads with results bitwise equal to
one thread. Helpers and the bound: tests/resource_check.py. References: torch's own ops."""

from __future__ import annotations

import numpy as np
import torch

import polyop.torch
from resource_check import (
    CALLS,
    WARMUP,
    assert_bound_detects_a_64_byte_leak,
    assert_threads_bitwise_equal,
    check_loop,
    check_softmax_add_topk,
    numpy_topk,
)

P = polyop.torch.load().handle  # torch.ops.polyop
G = torch.Generator().manual_seed(17)
X = torch.randn(16, generator=G)
Y = torch.randn(16, generator=G)
WANT = X + Y


def test_the_bound_detects_a_64_byte_leak_per_failing_call():
    assert_bound_detects_a_64_byte_leak(CALLS // 2)


def test_100k_calls_bounded_rss():
    last = []

    def step(i):
        out = P.add(X, Y)
        if i % 1000 == 0:
            last[:] = [out]

    check_loop("torch add", step)
    assert torch.equal(last[0], WANT)


def test_error_on_every_other_call_leaks_nothing_and_good_calls_stay_correct():
    bad_y = torch.ones(5)
    counts = {"axis": 0, "broadcast": 0, "good": 0}

    def step(i):
        if i % 2:
            if not torch.equal(P.add(X, Y), WANT):
                raise AssertionError(f"call {i}: wrong result")
            counts["good"] += 1
        elif i % 4:
            try:
                P.softmax(X, 5)
            except RuntimeError as e:
                assert "polyop.softmax: axis 5 is out of range" in str(e), e
                counts["axis"] += 1
        else:
            try:
                P.add(X, bad_y)
            except RuntimeError as e:
                assert "polyop.add: shapes [16] and [5] cannot be broadcast" in str(e), e
                counts["broadcast"] += 1

    check_loop("torch add + errors", step)
    total = CALLS + WARMUP
    assert counts == {"axis": total // 4, "broadcast": total // 4, "good": total // 2}, counts


def _work(inputs, reps=25):
    out = []
    for _ in range(reps):
        for x, y in inputs:
            s = P.softmax(x, -1)
            a = P.add(x, y)
            v, idx = P.topk(x, 5, -1, True)
            out.append(tuple(t.numpy().tobytes() for t in (s, a, v, idx)))
    return out


def test_eight_threads_bitwise_equal_to_one_thread():
    g = torch.Generator().manual_seed(5)
    inputs = [(torch.randn(64, 257, generator=g), torch.randn(64, 257, generator=g)) for _ in range(4)]
    single = _work(inputs)
    check_softmax_add_topk(single, [
        (torch.softmax(x.double(), -1).numpy(), (x + y).numpy(), *numpy_topk(x.numpy(), 5))
        for x, y in inputs])
    assert_threads_bitwise_equal(single, lambda t: _work(inputs))
