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
        out = c.inputs[0] * np.float32(c.attrs["alpha"])
        return [np.nextafter(out, np.float32(np.inf))]

    # scale by 1.0 is exact; one ulp off is within scale's 1-ulp tolerance, but not bitwise
    rs = _one(Fake("nudge", nudged), [Case("scale", [X], {"alpha": 1.0})])
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


# ---------------------------------------------------------------------------------------------
# tolerances in ulps, and the references of the backward ops


def test_tolerance_is_in_ulps_of_the_output_dtype():
    from polyop.conformance.harness import compare_to_reference
    from polyop.conformance.tolerances import EPS, STOCK_ULPS

    assert STOCK_ULPS["negate"][0] == 0 and STOCK_ULPS["gelu"][1]  # every entry says why
    for dt, eps in EPS.items():
        npdt = ml_dtypes.bfloat16 if dt == "bfloat16" else np.dtype(dt)
        want = np.array([1.5, -3.0, 1e-3])
        c = Case("scale", [want.astype(npdt)], {"alpha": 1.0}, ulps=2)
        exact = want.astype(npdt)
        # expected 2 ulps (relative to each element) away from the output passes, 3 fails
        e64 = exact.astype(np.float64)
        ok, bad = e64 * (1 + 2 * eps), e64 * (1 + 3 * eps)
        assert compare_to_reference(c, [exact], [(ok, dt)]) is None
        assert compare_to_reference(c, [exact], [(bad, dt)]) is not None


def test_zero_output_fails_every_small_magnitude_case():
    # The small-magnitude cases exist so that a kernel returning zeros cannot pass: with the
    # old absolute tolerances (bfloat16 1e-2, float16 1e-3) it did for most of them.
    import cases as stock_cases
    from polyop.conformance.harness import compare_to_reference, normalize_expected

    small = [c for c in stock_cases.cases() if "small" in c.tags]
    assert {c.dtype for c in small} == {"float16", "bfloat16", "float32", "float64"}
    assert len(small) >= 40
    for c in small:
        exp = stock_reference.reference(c.op, list(c.inputs), dict(c.attrs))
        zeros = [np.zeros(e.shape, dtype=np.asarray(c.inputs[0]).dtype) for e, _, _ in normalize_expected(exp)]
        assert compare_to_reference(c, zeros, exp) is not None, c.id


def test_flushed_result_fails_every_subnormal_case():
    # Negative control for the subnormal cases (docs/reliability.md): what a kernel on a thread
    # with denormals-are-zero and flush-to-zero gives (subnormal inputs read as 0, subnormal
    # results written as 0) must fail each float32 / float64 / bfloat16 case. float16
    # subnormals are normal in the float32 compute type, so nothing flushes there.
    import cases as stock_cases
    from polyop.conformance.harness import compare_to_reference, normalize_expected
    from polyop.conformance.tolerances import SMALLEST_NORMAL

    sub = [c for c in stock_cases.cases() if "subnormal" in c.tags]
    assert {c.dtype for c in sub} == {"float16", "bfloat16", "float32", "float64"}
    assert {c.op for c in sub} >= {"negate", "relu", "add", "scale", "softmax", "rms_norm", "nonzero"}
    checked = 0
    for c in sub:
        if c.dtype == "float16":
            continue
        tiny = SMALLEST_NORMAL[c.dtype]
        daz = [None if a is None else np.where(np.abs(a.astype(np.float64)) < tiny, 0.0, a).astype(a.dtype)
               for a in c.inputs]
        exp = stock_reference.reference(c.op, list(c.inputs), dict(c.attrs))
        flushed = []
        for e, dt, _ in normalize_expected(stock_reference.reference(c.op, daz, dict(c.attrs))):
            if dt != c.dtype:  # nonzero's int64 indices
                flushed.append(e)
                continue
            r = e.astype(np.asarray(c.inputs[0]).dtype)
            flushed.append(np.where(np.abs(r.astype(np.float64)) < tiny, 0.0, r).astype(r.dtype))
        assert compare_to_reference(c, flushed, exp) is not None, c.id
        checked += 1
    assert checked >= 24


def _numeric_vjp(fwd, inputs, attrs, weights, wrt, h=1e-6):
    """d/d inputs[wrt] of sum_k <weights[k], fwd(inputs)[k]>, by float64 central differences
    of the forward reference."""
    x = np.asarray(inputs[wrt], dtype=np.float64)
    out = np.zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        vals = []
        for sign in (1, -1):
            xs = x.copy()
            xs[idx] += sign * h
            ins = list(inputs)
            ins[wrt] = xs
            outs = fwd(*ins, **attrs)
            vals.append(sum(float(np.sum(w * np.asarray(o[0] if isinstance(o, tuple) else o, np.float64)))
                            for w, o in zip(weights, outs) if w is not None))
        out[idx] = (vals[0] - vals[1]) / (2 * h)
    return out


BACKWARD_FD = [
    # (forward op, forward inputs, attrs, backward op, backward inputs from (grad, inputs, outputs),
    #  forward input index of each backward output)
    ("add", [(3, 4), (4,)], {}, "add_backward", lambda g, i, o: [g[0], i[0], i[1]], [0, 1]),
    ("add_relu", [(2, 3), (2, 1)], {}, "add_relu_backward", lambda g, i, o: [g[0], i[0], i[1]], [0, 1]),
    ("relu", [(3, 4)], {}, "relu_backward", lambda g, i, o: [g[0], i[0]], [0]),
    ("gelu", [(3, 4)], {"approximate": "none"}, "gelu_backward", lambda g, i, o: [g[0], i[0]], [0]),
    ("gelu", [(3, 4)], {"approximate": "tanh"}, "gelu_backward", lambda g, i, o: [g[0], i[0]], [0]),
    ("softmax", [(3, 4)], {"axis": 0}, "softmax_backward", lambda g, i, o: [g[0], o[0]], [0]),
    ("rms_norm", [(3, 5), (5,)], {"eps": 0.1}, "rms_norm_backward", lambda g, i, o: [g[0], i[0], i[1]], [0, 1]),
    ("topk", [(3, 5)], {"k": 2}, "topk_backward", lambda g, i, o: [g[0], i[0], o[1]], [0]),
    ("conv2d", [(2, 2, 5, 4), (3, 2, 2, 3), (3,)], {"stride": 2, "padding": 1}, "conv2d_backward",
     lambda g, i, o: [g[0], i[0], i[1], i[2]], [0, 1, 2]),
]


def test_backward_references_match_finite_differences_of_the_forward():
    # The backward references (derived by hand) against float64 central differences of the
    # forward references: neither is taken from the kernels.
    rng = np.random.default_rng(5)
    for fop, shapes, attrs, bop, bargs, wrt in BACKWARD_FD:
        # values away from relu's kink and topk's ties: the derivative exists there
        ins = [np.sign(v) * (0.2 + np.abs(v)) for v in (rng.normal(size=s) for s in shapes)]
        if fop == "topk":
            ins = [rng.permutation(15).reshape(3, 5) * 0.37]
        fwd = stock_reference.REFERENCES[fop]
        outs = [np.asarray(o[0] if isinstance(o, tuple) else o) for o in fwd(*ins, **attrs)]
        grads = [rng.normal(size=o.shape) if o.dtype.kind == "f" else None for o in outs]
        if fop == "topk":
            grads = [rng.normal(size=outs[0].shape), None]
        battrs = {k: v for k, v in attrs.items() if not (bop == "topk_backward" and k == "k")}
        bouts = stock_reference.REFERENCES[bop](*bargs(grads, ins, outs), **battrs)
        for j, i in enumerate(wrt):
            got = np.asarray(bouts[j][0] if isinstance(bouts[j], tuple) else bouts[j], np.float64)
            want = _numeric_vjp(fwd, ins, attrs, grads, i)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"{bop} output {j}")


def test_backward_reference_finite_difference_check_can_fail():
    # The check above catches a wrong derivative: a softmax backward missing its -sum term.
    rng = np.random.default_rng(6)
    x, g = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    y = stock_reference.softmax(x)[0][0]
    wrong = y * g
    want = _numeric_vjp(stock_reference.softmax, [x], {}, [g], 0)
    assert not np.allclose(wrong, want, rtol=1e-6, atol=1e-7)
    right = stock_reference.softmax_backward(g, y)[0][0]
    np.testing.assert_allclose(right, want, rtol=1e-6, atol=1e-7)


class FakeSymbolic(Fake):
    """A backend with a symbolic mode whose artifact is ``fn`` built once for the pattern."""

    symbolic = True

    def __init__(self, name, build):
        super().__init__(name, _native)
        self.build = build
        self.patterns = []

    def run_symbolic(self, case, pattern, cases):
        self.patterns.append(pattern)
        f = self.build(case, pattern)
        return [f(c) for c in cases]


def _symbolic(backend, cases):
    return [r for r in _one(backend, cases) if r.mode == "symbolic"]


def test_symbolic_mode_runs_one_artifact_at_three_sizes():
    seen = []

    def build(case, pattern):
        def f(c):
            seen.append(np.shape(c.inputs[0]))
            return _native(c)
        return f

    be = FakeSymbolic("sym", build)
    rs = _symbolic(be, [Case("softmax", [X]), Case("negate", [np.float32(2.0)])])
    assert [r.status for r in rs] == ["pass", "unsupported"], rs
    assert "no dim larger than 1" in rs[1].detail
    assert be.patterns == [[("s2", "s3")]]
    assert seen == [(2, 3), (3, 4), (5, 6)]  # the case, then every dim > 1 grown by 1 and 3


def test_symbolic_mode_catches_an_artifact_specialized_to_the_first_size():
    def build(case, pattern):
        first = _native(case)
        return lambda c: first  # right at the traced size only

    rs = _symbolic(FakeSymbolic("specialized", build), [Case("relu", [X])])
    assert rs[0].status == "fail" and "relu(float32[3, 4])" in rs[0].detail, rs[0].detail


def test_symbolic_mode_keeps_tied_sizes_tied_and_sizes_0_and_1_constant():
    w = np.ones(3, np.float32)
    x = np.ones((1, 3), np.float32)
    be = FakeSymbolic("tied", lambda case, pattern: _native)
    rs = _symbolic(be, [Case("rms_norm", [x, w])])
    assert rs[0].status == "pass", rs[0].detail
    assert be.patterns == [[(1, "s3"), ("s3",)]]
