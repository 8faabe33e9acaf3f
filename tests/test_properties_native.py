"""Property tests (Hypothesis) of the NumPy core, ``polyop.run``: generated shapes, layouts,
dtypes and attributes against the NumPy reference; bad input raises ``ValueError`` /
``TypeError`` naming the op. Strategies: tests/_property_strategies.py."""

from __future__ import annotations

import numpy as np

import _property_strategies as ps
import polyop


def run(case):
    out = polyop.run(case.op, *case.inputs, **case.attrs)
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


test_valid, test_invalid, test_regression, property_case_count, COUNTER = ps.make_tests("native", run, (ValueError, TypeError))


def test_negative_controls():
    """The checks fail for plausible bugs: a kernel returning zeros (on small results), one
    off by one float32 ulp more than allowed, a bad input accepted, an error of the wrong type,
    an error that does not name the op, and a broken next call."""
    import pytest

    small = ps.Case("scale", [np.array([3e-4, -7e-4], np.float32)], {"alpha": 0.5})
    with pytest.raises(AssertionError, match="vs reference"):
        ps.check_valid(lambda c: [np.zeros_like(run(c)[0])], small)
    with pytest.raises(AssertionError, match="vs reference"):
        ps.check_valid(lambda c: [np.nextafter(np.nextafter(run(c)[0], np.float32(1)), np.float32(1))], small)
    ps.check_valid(run, small)  # and the real one passes

    bad = ps.Case("topk", [np.ones((2, 3), np.float32)], {"k": 4}, expect_error=ps.PROBLEM["k"])
    with pytest.raises(AssertionError, match="was accepted"):
        ps.check_invalid(lambda c: run(ps.AFTER), (ValueError,), bad, "k", ps.AFTER)
    with pytest.raises(AssertionError, match="not one of"):
        ps.check_invalid(run, (RuntimeError,), bad, "k", ps.AFTER)

    def anonymous(c):
        try:
            return run(c)
        except ValueError as e:
            raise ValueError(str(e).replace("polyop.topk", "op")) from None

    with pytest.raises(AssertionError, match="does not name the op"):
        ps.check_invalid(anonymous, (ValueError,), bad, "k", ps.AFTER)

    calls = []

    def broken_after_error(c):
        calls.append(c)
        if len(calls) > 1:
            return [np.zeros((2, 2), np.float32), np.zeros((2, 2), np.int64)]
        return run(c)

    with pytest.raises(AssertionError, match="vs reference"):
        ps.check_invalid(broken_after_error, (ValueError,), bad, "k", ps.AFTER)
    ps.check_invalid(run, (ValueError,), bad, "k", ps.AFTER)  # and the real one passes
