"""The harness must catch wrong backends: these fake backends are each wrong in one way."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference as stock_reference  # noqa: E402

from polyop.conformance import Backend, BrokenBackend, Case, counts, run, write_matrix  # noqa: E402
from polyop.conformance.backends import load  # noqa: E402

X = np.array([[1.0, -2.0, 3.5], [0.25, -0.5, 4.0]], dtype=np.float32)


class Fake(Backend):
    modes = ("eager",)

    def __init__(self, name, fn):
        self.name = name
        self.fn = fn

    def run(self, case, mode):
        return self.fn(case)


def _native(case):
    import polyop

    out = polyop.run(case.op, *case.inputs, **case.attrs)
    return list(out) if isinstance(out, tuple) else [out]


def _one(backend, cases, baseline="auto"):
    rs = run(cases, stock_reference.reference, backends=["native", backend], baseline=baseline)
    return [r for r in rs if r.backend == backend.name]


def test_correct_backend_passes():
    rs = _one(Fake("good", _native), [Case("negate", [X]), Case("topk", [X], {"k": 2})])
    assert counts(rs) == {"pass": 2, "fail": 0, "unsupported": 0}, rs


def test_off_by_more_than_tolerance_fails():
    rs = _one(Fake("off", lambda c: [-c.inputs[0] + np.float32(1e-3)]), [Case("negate", [X])])
    assert rs[0].status == "fail" and "vs reference" in rs[0].detail


def test_within_tolerance_but_not_bitwise_fails():
    def nudged(c):
        out = -c.inputs[0]
        return [np.nextafter(out, np.float32(np.inf))]

    rs = _one(Fake("nudge", nudged), [Case("negate", [X])])
    assert rs[0].status == "fail" and "bitwise" in rs[0].detail, rs[0]


def test_wrong_dtype_and_shape_fail():
    rs = _one(Fake("dt", lambda c: [(-c.inputs[0]).astype(np.float64)]), [Case("negate", [X])])
    assert rs[0].status == "fail" and "dtype" in rs[0].detail
    rs = _one(Fake("sh", lambda c: [(-c.inputs[0]).reshape(-1)]), [Case("negate", [X])])
    assert rs[0].status == "fail" and "shape" in rs[0].detail


def test_nan_mismatch_fails():
    x = np.array([np.nan, 1.0], dtype=np.float32)
    rs = _one(Fake("nan", lambda c: [np.array([0.0, -1.0], dtype=np.float32)]), [Case("negate", [x])],
              baseline=None)
    assert rs[0].status == "fail" and "NaN" in rs[0].detail


def test_bfloat16_tolerance_is_applied():
    x = X.astype(ml_dtypes.bfloat16)
    rs = _one(Fake("bf", _native), [Case("gelu", [x])])
    assert rs[0].status == "pass", rs[0]


def test_integer_outputs_are_exact():
    x = np.array([[3, 1, 2]], dtype=np.int64)

    def wrong_index(c):
        v, i = _native(c)
        return [v, i[:, ::-1].copy()]

    rs = _one(Fake("idx", wrong_index), [Case("topk", [x], {"k": 3})], baseline=None)
    assert rs[0].status == "fail" and "output 1" in rs[0].detail


def test_modifying_an_input_fails():
    def inplace(c):
        np.maximum(c.inputs[0], 0, out=c.inputs[0])  # right answer, but written into the input
        return [np.array(c.inputs[0])]

    rs = _one(Fake("mut", inplace), [Case("relu_", [np.array([1.0, -1.0], dtype=np.float32)])])
    assert rs[0].status == "fail" and "modified an input" in rs[0].detail, rs[0]


def test_error_cases():
    bad = Case("gelu", [np.zeros(2, dtype=np.int32)], expect_error="unsupported dtype int32")
    rs = _one(Fake("good", _native), [bad])
    assert rs[0].status == "pass", rs[0]
    rs = _one(Fake("silent", lambda c: [np.zeros(2, np.int32)]), [bad])
    assert rs[0].status == "fail" and "expected an error" in rs[0].detail

    def unnamed(c):
        raise ValueError("unsupported dtype int32")

    rs = _one(Fake("unnamed", unnamed), [bad])
    assert rs[0].status == "fail" and "name the op" in rs[0].detail


def test_unsupported_is_reported_with_reason():
    class NoTopk(Fake):
        def unsupported(self, case, mode):
            return "no topk here" if case.op == "topk" else None

    rs = _one(NoTopk("nt", _native), [Case("topk", [X], {"k": 1}), Case("negate", [X])])
    assert [r.status for r in rs] == ["unsupported", "pass"]
    assert rs[0].detail == "no topk here"
    md = write_matrix(rs)
    assert "no topk here" in md and "unsupported" in md


def test_exceptions_fail_not_crash():
    def boom(c):
        raise RuntimeError("kaput")

    rs = _one(Fake("boom", boom), [Case("negate", [X])])
    assert rs[0].status == "fail" and "kaput" in rs[0].detail


def test_broken_backend_is_a_failure():
    b = load("does_not_exist")
    assert isinstance(b, BrokenBackend) and "failed to import" in b.reason
    rs = run([Case("negate", [X])], stock_reference.reference, backends=[b])
    assert rs[0].status == "fail" and "failed to import" in rs[0].detail


def test_grad_cases_ask_the_backend():
    calls = []

    class G(Fake):
        def check_grad(self, case):
            calls.append(case.id)
            raise AssertionError("gradient mismatch")

    rs = _one(G("g", _native), [Case("negate", [X.astype(np.float64)], grad=True)])
    grad = [r for r in rs if r.mode == "grad"]
    assert calls and grad[0].status == "fail" and "gradient mismatch" in grad[0].detail


def test_stock_cases_are_deterministic_and_broad():
    import cases as stock_cases

    a, b = stock_cases.cases(), stock_cases.cases()
    assert [c.id for c in a] == [c.id for c in b]
    for ca, cb in zip(a, b):
        for x, y in zip(ca.inputs, cb.inputs):
            assert (x is None and y is None) or np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
    ops = {c.op for c in a}
    assert ops >= {"negate", "add", "scale", "relu", "relu_", "add_relu", "gelu", "softmax", "rms_norm",
                   "topk", "conv2d", "nonzero"}
    tags = {t for c in a for t in c.tags}
    assert tags >= {"strided", "empty", "rank0", "rank8", "broadcast", "error"}
    assert any(c.grad for c in a)
