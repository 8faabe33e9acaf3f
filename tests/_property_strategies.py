"""Hypothesis strategies and checks shared by the property-test files
(tests/test_properties_<framework>.py, one pytest process per framework).

What is generated (see docs/reliability.md, "Property tests"):

- shapes: rank 0 to 8, dims up to a size budget, sometimes one zero dim (empty tensors);
  broadcasting pairs for the binary ops (leading dims dropped, dims set to 1 on either side);
- layouts: contiguous, transposed (a permuted base array viewed back), strided (every other
  element along one axis), reversed (a negative stride), broadcast (stride 0);
- dtypes: every dtype the op takes, from ``polyop.op_info(op)["dtypes"]``;
- values: random (seeded NumPy from a drawn seed), around 1, small (1e-4..1e-3, which a kernel
  returning zeros fails), with ties, and for the ops whose result is defined for them,
  specials (+-0, +-inf, NaN);
- attributes: valid ones (every attribute of the op, or left to its default) and, separately,
  invalid ones (out-of-range axis / k, bad strings, negative eps, unknown names, ...), plus
  invalid inputs (unsupported dtype, mismatched dtypes, shapes that do not broadcast, a wrong
  weight shape, ...).

A valid case is compared with the independent NumPy reference (conformance/reference.py) in
the tolerance of tolerances.txt (``polyop.conformance.compare_to_reference``) and, bit for bit,
with the NumPy core (``polyop.run``); an invalid case must raise the framework's ordinary
error type with a message naming the op, and the next call must still work.

The example budget is fixed (``BUDGET``), derandomized, with no example database, so every
run generates the same cases.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import polyop
from polyop.conformance import Case, compare_bitwise, compare_to_reference
from polyop.conformance.harness import _op_named
from polyop.conformance.tolerances import op_ulps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
import reference as conformance_reference  # noqa: E402  (conformance/reference.py)

#: The ops under test: the elementwise ops, softmax, rms_norm, topk and conv2d (small sizes).
OPS = ("negate", "add", "scale", "relu", "add_relu", "gelu", "softmax", "rms_norm", "topk", "conv2d")

#: Examples per (op, valid/invalid) test: 10 ops x 2 tests x BUDGET cases per framework.
#: Chosen so the five files (one process each, as ci/test.sh runs them) take about four
#: minutes together on a 2-core machine.
BUDGET = 150

PROFILE = settings(
    max_examples=BUDGET,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# ops whose reference result is defined for +-inf and NaN inputs
SPECIALS_OK = {"negate", "add", "relu", "add_relu", "scale", "topk"}

NP_DTYPES = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}
#: dtypes no op takes (the "unsupported dtype" inputs)
UNSUPPORTED = ("uint8", "int8", "int16", "bool", "complex64")


def dtypes_of(op: str) -> list[str]:
    return list(polyop.op_info(op)["dtypes"])


# --------------------------------------------------------------------------------------
# shapes, values, layouts

MAX_DIM = {0: 1, 1: 12, 2: 6, 3: 4, 4: 3, 5: 3, 6: 2, 7: 2, 8: 2}


@st.composite
def shapes(draw, min_rank: int = 0, max_rank: int = 8, min_dim: int = 1) -> tuple[int, ...]:
    r = draw(st.integers(min_rank, max_rank))
    dims = [draw(st.integers(min_dim, max(min_dim, MAX_DIM[r]))) for _ in range(r)]
    if r and draw(st.integers(0, 9)) == 0:  # about one in ten: an empty tensor
        dims[draw(st.integers(0, r - 1))] = 0
    return tuple(dims)


@st.composite
def broadcast_pair(draw) -> tuple[tuple[int, ...], tuple[int, ...]]:
    out = draw(shapes())

    def side() -> tuple[int, ...]:
        drop = draw(st.integers(0, len(out)))
        return tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in out[drop:])

    return side(), side()


def _values(rng: np.random.Generator, shape, dtype: str, kind: str, specials: bool) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    if dtype in ("int32", "int64"):
        hi = 3 if kind == "ties" else 100
        v = rng.integers(-hi, hi + 1, size=n)
    else:
        if kind == "small":
            v = rng.uniform(1e-4, 1e-3, size=n) * rng.choice([-1.0, 1.0], size=n)
        elif kind == "ties":
            v = rng.integers(-3, 4, size=n) * 0.5
        else:
            v = rng.normal(0.0, 2.0, size=n)
        if specials and n:
            m = rng.integers(0, 4) if n > 1 else 1
            at = rng.choice(n, size=min(int(m), n), replace=False)
            v[at] = rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan], size=at.size)
    return np.asarray(v).astype(NP_DTYPES[dtype]).reshape(shape)


@st.composite
def arrays(draw, shape, dtype: str, specials: bool = False, layouts: bool = True) -> np.ndarray:
    """An array of ``shape``/``dtype`` in one of several memory layouts (same values)."""
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(["normal", "normal", "small", "ties"]))
    sp = specials and draw(st.booleans())
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    r = len(shape)
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided", "reversed", "broadcast"])) if layouts else "contiguous"
    if layout == "transposed" and r >= 2:
        perm = draw(st.permutations(range(r)))
        base = _values(rng, tuple(shape[p] for p in perm), dtype, kind, sp)
        return np.transpose(base, np.argsort(perm))
    if layout == "strided" and r >= 1:
        ax = draw(st.integers(0, r - 1))
        big = list(shape)
        big[ax] = 2 * shape[ax]
        base = _values(rng, tuple(big), dtype, kind, sp)
        return base[(slice(None),) * ax + (slice(None, None, 2),)]
    if layout == "reversed" and r >= 1:
        ax = draw(st.integers(0, r - 1))
        base = _values(rng, shape, dtype, kind, sp)
        return base[(slice(None),) * ax + (slice(None, None, -1),)]
    if layout == "broadcast" and r >= 1 and shape[0] > 1:
        base = _values(rng, (1,) + shape[1:], dtype, kind, sp)
        return np.broadcast_to(base, shape)
    return _values(rng, shape, dtype, kind, sp)


def f32(x: float) -> float:
    """Float attributes are drawn as the shortest decimal of a float32 (TF and ONNX float
    attributes are float32, and their adapters recover the double from that decimal, so such
    values reach every framework unchanged)."""
    return float(str(np.float32(x)))


# --------------------------------------------------------------------------------------
# valid cases


@st.composite
def valid_case(draw, op: str) -> Case:
    dtype = draw(st.sampled_from(dtypes_of(op)))
    sp = op in SPECIALS_OK
    attrs: dict = {}
    if op in ("add", "add_relu"):
        xs, ys = draw(broadcast_pair())
        if draw(st.booleans()):
            xs, ys = ys, xs
        inputs = [draw(arrays(xs, dtype, sp)), draw(arrays(ys, dtype, sp))]
    elif op == "conv2d":
        n = draw(st.integers(0, 2))
        c = draw(st.integers(1, 3))
        o = draw(st.integers(1, 3))
        h, w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
        pad = draw(st.integers(0, 2)) if draw(st.booleans()) else None
        p = pad or 0
        kh = draw(st.integers(1, min(3, h + 2 * p)))
        kw = draw(st.integers(1, min(3, w + 2 * p)))
        stride = draw(st.integers(1, 3))
        bias = draw(arrays((o,), dtype)) if draw(st.booleans()) else None
        inputs = [draw(arrays((n, c, h, w), dtype)), draw(arrays((o, c, kh, kw), dtype)), bias]
        if draw(st.booleans()):
            attrs["stride"] = stride
        if pad is not None:
            attrs["padding"] = pad
    else:
        shape = draw(shapes())
        x = draw(arrays(shape, dtype, sp))
        inputs = [x]
        r = len(shape)
        if op == "scale":
            attrs["alpha"] = f32(draw(st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 1e-3, -2.75])))
        elif op == "gelu":
            a = draw(st.sampled_from([None, "none", "tanh"]))
            if a is not None:
                attrs["approximate"] = a
        elif op == "softmax":
            if draw(st.booleans()):
                attrs["axis"] = draw(st.integers(-max(r, 1), max(r, 1) - 1))
        elif op == "rms_norm":
            if draw(st.booleans()):
                inputs.append(draw(arrays(shape[-1:] if r else (1,), dtype)))
            if draw(st.booleans()):
                attrs["eps"] = f32(draw(st.sampled_from([1e-5, 1e-3, 0.5])))
        elif op == "topk":
            axis = draw(st.integers(-max(r, 1), max(r, 1) - 1))
            n = shape[axis] if r else 1
            attrs["k"] = draw(st.integers(0, n))
            if draw(st.booleans()):
                attrs["axis"] = axis
            elif r and axis % r != r - 1:
                attrs["k"] = draw(st.integers(0, shape[-1]))
            if draw(st.booleans()):
                attrs["largest"] = draw(st.booleans())
    return Case(op, inputs, attrs)


def reference(case: Case):
    """The NumPy reference's outputs for ``case`` (conformance/reference.py). Its topk takes
    rank >= 1 only: a scalar is a one-element vector (SPEC: rank 0 works), reshaped back."""
    inputs, attrs = list(case.inputs), dict(case.attrs)
    if case.op == "topk" and np.asarray(inputs[0]).ndim == 0:
        attrs["axis"] = 0
        vals, idx = conformance_reference.reference("topk", [np.asarray(inputs[0]).reshape(1)], attrs)
        if attrs["k"] == 0:
            # polyop's convention (its shape inference): k=0 of a scalar is the empty [0]
            return [vals, idx]
        return [vals.reshape(()), idx.reshape(())]
    return conformance_reference.reference(case.op, inputs, attrs)


def check_valid(run, case: Case) -> None:
    """``run(case) -> list of arrays``: the framework's outputs. Compared with the
    reference (ulp tolerances) and bit for bit with the NumPy core."""
    snap = [None if a is None else np.array(a, copy=True) for a in case.inputs]
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, 0 * inf: NaN is expected
        expected = reference(case)
    outs = [np.asarray(o) for o in run(case)]
    bad = compare_to_reference(case, outs, expected)
    assert bad is None, f"{case.describe()}: vs reference: {bad}"
    native = polyop.run(case.op, *case.inputs, **case.attrs)
    native = list(native) if isinstance(native, tuple) else [native]
    bad = compare_bitwise(outs, [np.asarray(o) for o in native], "native")
    assert bad is None, f"{case.describe()}: {bad}"
    for a, s in zip(case.inputs, snap):
        if a is not None:
            assert np.array_equal(np.asarray(a), s, equal_nan=a.dtype.kind == "f" or a.dtype == NP_DTYPES["bfloat16"]), (
                f"{case.describe()}: an input was modified"
            )


# --------------------------------------------------------------------------------------
# invalid cases

#: the problem words a message may use for each kind of bad input (a message must contain
#: one of them and name the op)
PROBLEM = {
    "dtype": ("dtype", "type", "Type"),
    "mismatch": ("dtype", "type", "mismatch"),
    "broadcast": ("broadcast", "shape", "Incompatible", "incompatible"),
    "axis": ("axis",),
    "k": ("k=", "k ", "`k`", "out of range"),
    "approximate": ("approximate",),
    "eps": ("eps",),
    "weight": ("weight", "shape"),
    "attr": ("attribute", "argument", "attr"),
    "conv": ("conv2d", "channel", "kernel", "shape", "stride", "padding"),
}


@st.composite
def invalid_case(draw, op: str) -> tuple[Case, str]:
    """A bad call of ``op`` and the kind of problem (a key of ``PROBLEM``)."""
    ok = dtypes_of(op)
    kinds = ["dtype", "attr"]
    if op in ("add", "add_relu"):
        kinds += ["mismatch", "broadcast"]
    if op in ("softmax", "topk"):
        kinds += ["axis"]
    if op == "topk":
        kinds += ["k"]
    if op == "gelu":
        kinds += ["approximate"]
    if op == "rms_norm":
        kinds += ["eps", "weight", "mismatch"]
    if op == "conv2d":
        kinds += ["conv", "mismatch"]
    kind = draw(st.sampled_from(kinds))
    dtype = draw(st.sampled_from(ok))
    shape = draw(shapes(max_rank=4))
    r = len(shape)
    attrs: dict = {}
    n_inputs = polyop.op_info(op)["num_inputs"]

    def valid_inputs(dt: str) -> list:
        if op == "conv2d":
            return [np.ones((1, 2, 4, 4), NP_DTYPES[dt]), np.ones((3, 2, 2, 2), NP_DTYPES[dt]), None]
        xs = [draw(arrays(shape, dt, layouts=False))]
        if op in ("add", "add_relu"):
            xs.append(draw(arrays(shape, dt, layouts=False)))
        return xs

    def required() -> dict:
        return {"alpha": 2.0} if op == "scale" else {"k": 0} if op == "topk" else {}

    if kind == "dtype":
        bad = draw(st.sampled_from([d for d in UNSUPPORTED] + [d for d in NP_DTYPES if d not in ok]))
        if op == "conv2d":
            inputs = [np.ones((1, 2, 4, 4), bad), np.ones((3, 2, 2, 2), bad), None]
        else:
            inputs = [np.ones(shape, bad) for _ in range(min(n_inputs, 2) if op in ("add", "add_relu") else 1)]
        attrs = required()
    elif kind == "mismatch":
        other = draw(st.sampled_from([d for d in ok if d != dtype]))
        inputs = valid_inputs(dtype)
        if op == "rms_norm":
            inputs.append(np.ones(shape[-1:] if r else (1,), NP_DTYPES[other]))
        elif op == "conv2d":
            inputs[1] = inputs[1].astype(NP_DTYPES[other])
        else:
            inputs[1] = inputs[1].astype(NP_DTYPES[other])
    elif kind == "broadcast":
        xs = shape if r else (2,)
        ax = draw(st.integers(0, len(xs) - 1))
        ys = list(xs)
        ys[ax] = xs[ax] + draw(st.integers(1, 3)) if xs[ax] != 1 else 2
        if xs[ax] in (0, 1):
            xs = tuple(3 if i == ax else d for i, d in enumerate(xs))
            ys[ax] = 2
        inputs = [np.ones(xs, NP_DTYPES[dtype]), np.ones(tuple(ys), NP_DTYPES[dtype])]
    elif kind == "axis":
        inputs = valid_inputs(dtype)
        lim = max(r, 1)
        attrs = required()
        attrs["axis"] = draw(st.one_of(st.integers(lim, lim + 5), st.integers(-lim - 5, -lim - 1)))
    elif kind == "k":
        inputs = valid_inputs(dtype)
        n = shape[-1] if r else 1
        attrs = {"k": draw(st.one_of(st.integers(n + 1, n + 5), st.integers(-5, -1)))}
    elif kind == "approximate":
        inputs = valid_inputs(dtype)
        s = draw(
            st.one_of(
                st.sampled_from(["", "None", "TANH", "erf", "none\x00", "tanh\x00x", "non", "tanh "]),
                st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
            ).filter(lambda s: s not in ("none", "tanh"))
        )
        attrs = {"approximate": s}
    elif kind == "eps":
        inputs = valid_inputs(dtype)
        attrs = {"eps": draw(st.sampled_from([-1e-6, -1.0, -0.5, float("nan")]))}
    elif kind == "weight":
        inputs = valid_inputs(dtype)
        last = shape[-1] if r else 1
        wshape = draw(st.sampled_from([(last + 1,), (last + 2,), (1, last)] + ([(0,)] if last else [])))
        inputs.append(np.ones(wshape, NP_DTYPES[dtype]))
    elif kind == "conv":
        d = NP_DTYPES[dtype]
        sub = draw(st.sampled_from(["channels", "stride", "padding", "kernel", "rank", "bias"]))
        x, w, b = np.ones((1, 2, 4, 4), d), np.ones((3, 2, 2, 2), d), None
        if sub == "channels":
            w = np.ones((3, draw(st.sampled_from([1, 3, 4])), 2, 2), d)
        elif sub == "stride":
            attrs["stride"] = draw(st.integers(-3, 0))
        elif sub == "padding":
            attrs["padding"] = draw(st.integers(-3, -1))
        elif sub == "kernel":
            w = np.ones((3, 2, draw(st.integers(5, 7)), 2), d)
        elif sub == "rank":
            x = np.ones((2, 4, 4)[: draw(st.integers(1, 3))], d)
        elif sub == "bias":
            b = np.ones((draw(st.sampled_from([1, 2, 4])),), d)
        inputs = [x, w, b]
    elif kind == "attr":
        inputs = valid_inputs(dtype)
        info = polyop.op_info(op)
        known = {a["name"] for a in info["attrs"]} | {i["name"] for i in info["inputs"]}
        name = draw(
            st.one_of(
                st.sampled_from(["axes", "Axis", "kk", "largest_", "epsilon", "approx", "strides", "pads", "alpha_"]),
                st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True),
            ).filter(lambda s: s not in known)
        )
        attrs = required()
        attrs[name] = draw(st.sampled_from([1, 0, 2.5, True]))
    else:  # pragma: no cover
        raise AssertionError(kind)
    return Case(op, inputs, attrs, expect_error=PROBLEM[kind]), kind


def check_invalid(run, error_types: tuple, case: Case, kind: str, after: Case,
                  names=None) -> BaseException:
    """``run(case)`` must raise one of ``error_types`` whose message names the op and the
    problem; then ``after`` (a valid call) must still give the reference's answer.
    ``names(op) -> list of str``: further ways a message of this framework may name the op."""
    try:
        run(case)
    except error_types as e:
        msg = str(e)
        named = _op_named(case.op, msg) or any(n in msg for n in (names(case.op) if names else ()))
        assert named, f"{case.describe()}: the message does not name the op: {type(e).__name__}: {msg}"
        assert any(p in msg for p in PROBLEM[kind]), (
            f"{case.describe()}: the message does not say the problem ({kind}: one of {PROBLEM[kind]}): "
            f"{type(e).__name__}: {msg}"
        )
        err = e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(
            f"{case.describe()}: raised {type(e).__module__}.{type(e).__name__}, not one of "
            f"{[t.__name__ for t in error_types]}: {e}"
        ) from e
    else:
        raise AssertionError(f"{case.describe()}: bad input ({kind}) was accepted")
    check_valid(run, after)
    return err


AFTER = Case("topk", [np.array([[3.0, 1.0, 2.0], [-1.0, 5.0, 5.0]], np.float32)], {"k": 2})

#: Failing examples the property tests found, kept as fixed cases run in every framework.
REGRESSIONS = [
    # softmax float32 with a spread of 9.2: was 4.07 ulps off the float64 reference, beyond
    # tolerances.txt's 4 (the rounding of x - max amplified by exp), the same bits in every
    # framework; the kernel now takes x - max exactly (exp_minus in kernels/src/softmax.rs),
    # and a row spread over +-60 checks that in float64 too.
    Case("softmax", [np.array([4.081838, -5.11133, 0.8361977], np.float32)]),
    Case("softmax", [np.array([60.0, -59.37, 3.3e-3, 17.123456789, -41.75], np.float32)]),
    Case("softmax", [np.array([60.0, -59.37, 3.3e-3, 17.123456789, -41.75], np.float64)]),
]


class Counter:
    """Counts the generated cases of one file; prints one summary line at the end of the
    session (registered as a plugin by the file's ``counter`` fixture)."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self.valid = 0
        self.invalid = 0
        self.by_op: dict[str, int] = {}

    def add(self, op: str, valid: bool) -> None:
        if valid:
            self.valid += 1
        else:
            self.invalid += 1
        self.by_op[op] = self.by_op.get(op, 0) + 1

    def line(self) -> str:
        ops = ", ".join(f"{k} {v}" for k, v in sorted(self.by_op.items()))
        return (
            f"property tests ({self.framework}): {self.valid + self.invalid} generated cases run "
            f"({self.valid} valid, {self.invalid} invalid; {ops})"
        )

    def pytest_terminal_summary(self, terminalreporter) -> None:  # a pytest hook
        terminalreporter.write_line(self.line())


def make_tests(framework: str, run, error_types: tuple, ops=OPS, kind_errors=None, names=None,
               known_bug=None):
    """The property tests of one framework: ``test_valid`` and ``test_invalid`` for every op
    in ``ops`` and the fixture that prints the case count. ``run(case) -> list of arrays``;
    ``error_types``: the framework's error types for bad input; ``kind_errors``: further
    types accepted for one kind of bad input (``{"attr": (TypeError,)}``: an unknown keyword
    argument is refused by the Python wrapper before the framework sees it); ``names``: see
    ``check_invalid``. ``known_bug(case) -> str | None``: a case that hits a bug kept as a
    strict-xfail regression test in the framework's file; such draws are rejected
    (``hypothesis.reject``) so the rest of the op is still tested."""
    import pytest
    from hypothesis import given, reject

    counter = Counter(framework)

    @pytest.fixture(scope="module", autouse=True)
    def property_case_count(request, record_testsuite_property):
        request.config.pluginmanager.register(counter, f"polyop-property-count-{framework}")
        yield
        record_testsuite_property(f"property_cases_{framework}", counter.valid + counter.invalid)

    @pytest.mark.parametrize("op", ops)
    @PROFILE
    @given(data=st.data())
    def test_valid(op, data):
        case = data.draw(valid_case(op), label="case")
        if known_bug is not None and known_bug(case):
            reject()
        counter.add(op, True)
        check_valid(run, case)

    @pytest.mark.parametrize("op", ops)
    @PROFILE
    @given(data=st.data())
    def test_invalid(op, data):
        case, kind = data.draw(invalid_case(op), label="bad case")
        if known_bug is not None and known_bug(case):
            reject()
        counter.add(op, False)
        types = tuple(error_types) + tuple((kind_errors or {}).get(kind, ()))
        check_invalid(run, types, case, kind, AFTER, names)

    @pytest.mark.parametrize("case", REGRESSIONS, ids=lambda c: c.id)
    def test_regression(case):
        check_valid(run, case)

    return test_valid, test_invalid, test_regression, property_case_count, counter
