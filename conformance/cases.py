"""The stock conformance cases: every op of SPEC.md section 3 x its dtypes x the edge cases
(empty, rank 0, rank 8, strided views, broadcasting, ties, NaN, huge values, both gelu forms,
optional inputs, ...) plus a list of bad inputs with the substring their error must contain.

``cases()`` is deterministic (fixed seeds), so every backend process builds the same list.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from polyop.conformance import NOT_GROWABLE, Case
from polyop.conformance.tolerances import EPS, op_ulps

FLOAT = ["float16", "bfloat16", "float32", "float64"]
INT = ["int32", "int64"]
NUMERIC = FLOAT + INT

RANK8 = (2, 1, 2, 1, 1, 2, 1, 2)


def np_dtype(name: str):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


class Gen:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def arr(self, shape, dtype: str, lo=-3.0, hi=3.0, away: float = 0.0) -> np.ndarray:
        """Random values in [lo, hi] (ints: integers), optionally at least ``away`` from 0."""
        shape = tuple(shape)
        if dtype in INT:
            return self.rng.integers(int(lo) - 2, int(hi) + 3, size=shape).astype(dtype)
        if dtype == "bool":
            return self.rng.integers(0, 2, size=shape).astype(bool)
        v = self.rng.uniform(lo, hi, size=shape)
        if away:
            sign = np.where(self.rng.uniform(size=shape) < 0.5, -1.0, 1.0)
            v = sign * self.rng.uniform(away, max(abs(lo), abs(hi)), size=shape)
        return np.asarray(v).astype(np_dtype(dtype))

    def transposed(self, shape, dtype: str, **kw) -> np.ndarray:
        """A non-contiguous view of ``shape`` (its last two axes transposed)."""
        shape = tuple(shape)
        base = self.arr(shape[:-2] + (shape[-1], shape[-2]), dtype, **kw)
        v = np.swapaxes(base, -1, -2)
        assert v.shape == shape and not v.flags.c_contiguous
        return v

    def sliced(self, shape, dtype: str, **kw) -> np.ndarray:
        """A non-contiguous view of ``shape``: every other element of the last axis, from a
        reversed first axis (negative stride)."""
        shape = tuple(shape)
        base = self.arr(shape[:-1] + (2 * shape[-1],), dtype, **kw)
        v = base[..., ::2]
        if len(shape) > 1:
            v = v[::-1]
        assert v.shape == shape and not v.flags.c_contiguous
        return v


def _cid(op, dtype, desc):
    return f"{op}/{dtype}/{desc}"


def elementwise_unary(g: Gen, op: str, dtypes, attrs=None, grad=False, lo=-3.0, hi=3.0, away=0.0):
    attrs = attrs or {}
    suffix = "".join(f",{k}={v}" for k, v in attrs.items())
    out = []
    for dt in dtypes:
        kw = dict(lo=lo, hi=hi, away=away)
        out += [
            Case(op, [g.arr((3, 5), dt, **kw)], dict(attrs), _cid(op, dt, "basic" + suffix),
                 grad=grad and dt == "float64"),
            Case(op, [g.transposed((4, 3), dt, **kw)], dict(attrs), _cid(op, dt, "transposed" + suffix),
                 tags=("strided",)),
            Case(op, [g.sliced((3, 4), dt, **kw)], dict(attrs), _cid(op, dt, "sliced" + suffix),
                 tags=("strided",)),
            Case(op, [g.arr((0, 3), dt, **kw)], dict(attrs), _cid(op, dt, "empty" + suffix), tags=("empty",)),
            Case(op, [g.arr((), dt, **kw)], dict(attrs), _cid(op, dt, "rank0" + suffix), tags=("rank0",)),
            Case(op, [g.arr(RANK8, dt, **kw)], dict(attrs), _cid(op, dt, "rank8" + suffix), tags=("rank8",)),
        ]
    return out


def with_specials(dt: str, a: np.ndarray, specials=(np.nan, np.inf, -np.inf, 0.0, -0.0)) -> np.ndarray:
    """A copy of float array ``a`` with ``specials`` (NaN, +-inf, +-0) in its first elements."""
    if dt not in FLOAT:
        return a
    b = np.array(a, copy=True).reshape(-1)
    specials = list(specials)
    b[: len(specials)] = np.asarray(specials).astype(b.dtype)
    return b.reshape(a.shape)


def binary(g: Gen, op: str, grad: bool):
    out = []
    for dt in NUMERIC:
        away = 0.25 if op == "add_relu" else 0.0
        x, y = g.arr((3, 4), dt), g.arr((3, 4), dt)
        if op == "add_relu" and dt == "float64":
            # keep x + y away from the kink at 0 for the gradient check
            s = x + y
            y = np.where(np.abs(s) < away, y + 2 * away, y)
        out += [
            Case(op, [x, y], {}, _cid(op, dt, "basic"), grad=grad and dt == "float64"),
            Case(op, [g.arr((2, 3, 4), dt), g.arr((4,), dt)], {}, _cid(op, dt, "broadcast-row"),
                 tags=("broadcast",)),
            Case(op, [g.arr((3, 1), dt), g.arr((1, 4), dt)], {}, _cid(op, dt, "broadcast-outer"),
                 tags=("broadcast",), grad=grad and dt == "float64"),
            Case(op, [g.transposed((4, 3), dt), g.sliced((4, 3), dt)], {}, _cid(op, dt, "strided"),
                 tags=("strided",)),
        ]
        if dt in ("float32", "bfloat16", "int64"):
            out += [
                Case(op, [g.arr((0, 4), dt), g.arr((1, 4), dt)], {}, _cid(op, dt, "empty-broadcast"),
                     tags=("empty", "broadcast")),
                Case(op, [g.arr((), dt), g.arr((), dt)], {}, _cid(op, dt, "rank0"), tags=("rank0",)),
                Case(op, [g.arr((), dt), g.arr((2, 3), dt)], {}, _cid(op, dt, "scalar-broadcast"),
                     tags=("rank0", "broadcast")),
                Case(op, [g.arr(RANK8, dt), g.arr(RANK8[4:], dt)], {}, _cid(op, dt, "rank8-broadcast"),
                     tags=("rank8", "broadcast")),
            ]
        if dt in FLOAT:
            out.append(Case(op, [with_specials(dt, g.arr((2, 5), dt)), g.arr((2, 5), dt)], {},
                            _cid(op, dt, "nan-inf")))
    return out


def cases() -> list[Case]:
    g = Gen(20240611)
    # the cases added with conv2d's groups/dilation and rms_norm's axis draw from their own
    # generator, so the data of the cases before them stays what it was
    gn = Gen(2121)
    out: list[Case] = []

    # --- elementwise ------------------------------------------------------------------
    out += elementwise_unary(g, "negate", NUMERIC, grad=True)
    out += elementwise_unary(g, "relu", NUMERIC, grad=True, away=0.1)
    for dt in FLOAT:
        out.append(Case("relu", [with_specials(dt, g.arr((2, 4), dt))], {}, _cid("relu", dt, "nan-inf-zero")))
    for dt in NUMERIC:
        out.append(Case("relu_", [g.arr((3, 4), dt)], {}, _cid("relu_", dt, "basic")))
    out.append(Case("relu_", [g.transposed((3, 4), "float32")], {}, _cid("relu_", "float32", "transposed"),
                    tags=("strided",)))
    out += binary(g, "add", grad=True)
    out += binary(g, "add_relu", grad=True)
    out += elementwise_unary(g, "scale", FLOAT, attrs={"alpha": 0.75}, grad=True)
    for dt in ("float32", "float64"):
        out.append(Case("scale", [g.arr((2, 3), dt)], {"alpha": 3}, _cid("scale", dt, "int-alpha")))
        out.append(Case("scale", [g.arr((2, 3), dt)], {"alpha": -2.5}, _cid("scale", dt, "negative-alpha")))
    for approx in ("none", "tanh"):
        out += elementwise_unary(g, "gelu", FLOAT, attrs={"approximate": approx}, grad=True, lo=-5, hi=5)
        for dt in FLOAT:
            # gelu(-inf) is 0 in the limit but NaN in the naive formula; the SPEC leaves it open
            out.append(Case("gelu", [with_specials(dt, g.arr((2, 4), dt), (np.nan, np.inf, 0.0, -0.0))],
                            {"approximate": approx},
                            _cid("gelu", dt, f"nan-inf,approximate={approx}")))
    out.append(Case("gelu", [g.arr((2, 3), "float32")], {}, _cid("gelu", "float32", "default-approximate")))

    # --- softmax ----------------------------------------------------------------------
    for dt in FLOAT:
        huge = {"float16": 6.0e4, "bfloat16": 1.0e30, "float32": 1.0e30, "float64": 1.0e300}[dt]
        hx = np.array([[huge, huge * 0.5, -huge, 0.0], [1.0, 2.0, 3.0, 4.0], [huge, huge, huge, huge]])
        out += [
            Case("softmax", [g.arr((3, 5), dt)], {}, _cid("softmax", dt, "basic"), grad=dt == "float64"),
            Case("softmax", [g.arr((4, 3), dt)], {"axis": 0}, _cid("softmax", dt, "axis0"), grad=dt == "float64"),
            Case("softmax", [g.arr((2, 3, 4), dt)], {"axis": -2}, _cid("softmax", dt, "axis-2")),
            Case("softmax", [hx.astype(np_dtype(dt))], {}, _cid("softmax", dt, "huge-values")),
            Case("softmax", [g.transposed((3, 4), dt)], {"axis": -1}, _cid("softmax", dt, "transposed"),
                 tags=("strided",)),
            Case("softmax", [g.sliced((3, 4), dt)], {"axis": 0}, _cid("softmax", dt, "sliced-axis0"),
                 tags=("strided",)),
            Case("softmax", [g.arr((0, 3), dt)], {}, _cid("softmax", dt, "empty"), tags=("empty",)),
        ]
        if dt in ("float32", "float64"):
            out += [
                Case("softmax", [g.arr((), dt)], {}, _cid("softmax", dt, "rank0"), tags=("rank0",)),
                Case("softmax", [g.arr(RANK8, dt)], {"axis": 3}, _cid("softmax", dt, "rank8-axis3"),
                     tags=("rank8",)),
                Case("softmax", [np.array([[-np.inf, 0.0, 1.0]]).astype(np_dtype(dt))], {},
                     _cid("softmax", dt, "neg-inf")),
            ]

    # --- rms_norm ---------------------------------------------------------------------
    for dt in FLOAT:
        out += [
            Case("rms_norm", [g.arr((3, 8), dt), g.arr((8,), dt)], {}, _cid("rms_norm", dt, "weight"),
                 grad=dt == "float64"),
            Case("rms_norm", [g.arr((3, 8), dt), None], {}, _cid("rms_norm", dt, "no-weight"),
                 grad=dt == "float64"),
            Case("rms_norm", [g.arr((2, 3, 5), dt), g.arr((5,), dt)], {"eps": 0.1}, _cid("rms_norm", dt, "eps")),
            Case("rms_norm", [g.transposed((4, 6), dt), g.sliced((6,), dt)], {}, _cid("rms_norm", dt, "strided"),
                 tags=("strided",)),
            Case("rms_norm", [g.arr((0, 4), dt), g.arr((4,), dt)], {}, _cid("rms_norm", dt, "empty"),
                 tags=("empty",)),
            # axis: every dim from axis on is normalised; weight has shape x.shape[axis:]
            Case("rms_norm", [gn.arr((3, 2, 5), dt), gn.arr((2, 5), dt)], {"axis": -2},
                 _cid("rms_norm", dt, "axis-2"), grad=dt == "float64"),
            Case("rms_norm", [gn.arr((2, 3, 4), dt), gn.arr((3, 4), dt)], {"axis": 1, "eps": 0.01},
                 _cid("rms_norm", dt, "axis1-rank3"), grad=dt == "float64"),
            Case("rms_norm", [gn.arr((2, 3, 4), dt), None], {"axis": 1}, _cid("rms_norm", dt, "axis1-no-weight"),
                 grad=dt == "float64"),
            Case("rms_norm", [gn.arr((3, 4), dt), gn.arr((3, 4), dt)], {"axis": 0}, _cid("rms_norm", dt, "axis0-all")),
            # normalised dims whose strides do not merge (a transposed view), and a strided weight
            Case("rms_norm", [gn.transposed((2, 4, 3), dt), gn.sliced((4, 3), dt)], {"axis": -2},
                 _cid("rms_norm", dt, "axis-2-strided"), tags=("strided",)),
        ]
        if dt in ("float32", "float64"):
            out += [
                Case("rms_norm", [g.arr(RANK8, dt), g.arr((2,), dt)], {}, _cid("rms_norm", dt, "rank8"),
                     tags=("rank8",)),
                Case("rms_norm", [np.zeros((2, 4), dtype=dt), None], {}, _cid("rms_norm", dt, "zeros")),
            ]

    # --- topk -------------------------------------------------------------------------
    for dt in NUMERIC:
        x = g.arr((3, 6), dt, lo=-50, hi=50)
        ties = np.array([[1, 3, 3, 2, 3, 1], [0, 0, 0, 0, 0, 0]]).astype(np_dtype(dt))
        out += [
            Case("topk", [x], {"k": 3}, _cid("topk", dt, "basic")),
            Case("topk", [x], {"k": 2, "largest": False}, _cid("topk", dt, "smallest")),
            Case("topk", [ties], {"k": 4}, _cid("topk", dt, "ties")),
            Case("topk", [ties], {"k": 4, "largest": False}, _cid("topk", dt, "ties-smallest")),
            Case("topk", [g.arr((5, 3), dt, lo=-50, hi=50)], {"k": 2, "axis": 0}, _cid("topk", dt, "axis0")),
            Case("topk", [g.transposed((4, 5), dt, lo=-50, hi=50)], {"k": 3}, _cid("topk", dt, "transposed"),
                 tags=("strided",)),
            Case("topk", [g.arr((2, 4), dt)], {"k": 0}, _cid("topk", dt, "k0")),
            Case("topk", [g.arr((2, 4), dt, lo=-50, hi=50)], {"k": 4}, _cid("topk", dt, "k-all")),
            Case("topk", [g.arr((0, 4), dt)], {"k": 2}, _cid("topk", dt, "empty"), tags=("empty",)),
        ]
        if dt in FLOAT:
            nan = np.array([[1.0, np.nan, 3.0, -np.inf, np.nan, np.inf, -0.0, 0.0]]).astype(np_dtype(dt))
            out += [
                Case("topk", [nan], {"k": 5}, _cid("topk", dt, "nan-largest")),
                Case("topk", [nan], {"k": 8, "largest": False}, _cid("topk", dt, "nan-smallest")),
            ]
        if dt in ("float32", "int64"):
            out.append(Case("topk", [g.arr(RANK8, dt, lo=-50, hi=50)], {"k": 1, "axis": 5},
                            _cid("topk", dt, "rank8-axis5"), tags=("rank8",)))
    # gradient (values only): distinct values so the selection is stable under perturbation
    gx = np.random.default_rng(7).permutation(np.arange(18, dtype=np.float64)).reshape(3, 6) * 0.37
    out.append(Case("topk", [gx], {"k": 3}, _cid("topk", "float64", "grad-distinct"), grad=True))

    # --- conv2d -----------------------------------------------------------------------
    for dt in FLOAT:
        x, w, b = g.arr((2, 3, 6, 5), dt, lo=-1, hi=1), g.arr((4, 3, 3, 3), dt, lo=-1, hi=1), g.arr((4,), dt)
        grad = dt == "float64"
        out += [
            Case("conv2d", [x, w, None], {}, _cid("conv2d", dt, "basic"), grad=grad),
            Case("conv2d", [x, w, b], {}, _cid("conv2d", dt, "bias"), grad=grad),
            Case("conv2d", [x, w, b], {"stride": 2}, _cid("conv2d", dt, "stride2")),
            Case("conv2d", [x, w, b], {"padding": 1}, _cid("conv2d", dt, "padding1"), grad=grad),
            Case("conv2d", [x, w, None], {"stride": 2, "padding": 2}, _cid("conv2d", dt, "stride2-padding2")),
            Case("conv2d", [np.swapaxes(g.arr((1, 3, 5, 6), dt), -1, -2), g.transposed((4, 3, 2, 2), dt), None],
                 {}, _cid("conv2d", dt, "strided"), tags=("strided",)),
        ]
        # groups, dilation, per-axis stride, 2- and 4-element (asymmetric) padding
        xg, wg, bg = gn.arr((2, 4, 6, 5), dt, lo=-1, hi=1), gn.arr((6, 2, 3, 3), dt, lo=-1, hi=1), gn.arr((6,), dt)
        xd, wd = gn.arr((2, 3, 7, 6), dt, lo=-1, hi=1), gn.arr((6, 1, 3, 3), dt, lo=-1, hi=1)
        out += [
            Case("conv2d", [xg, wg, bg], {"groups": 2}, _cid("conv2d", dt, "groups2"), grad=grad),
            Case("conv2d", [xd, wd[:3], bg[:3]], {"groups": 3, "padding": 1}, _cid("conv2d", dt, "depthwise"),
                 grad=grad),
            Case("conv2d", [xd, wd, None], {"groups": 3, "stride": 2}, _cid("conv2d", dt, "depthwise-multiplier2")),
            Case("conv2d", [x, w, b], {"dilation": 2, "padding": 2}, _cid("conv2d", dt, "dilation2"), grad=grad),
            Case("conv2d", [x, w, b], {"stride": [2, 1], "padding": [1, 0]}, _cid("conv2d", dt, "stride21-padding2"),
                 grad=grad),
            Case("conv2d", [x, w, None], {"stride": [1, 2], "padding": [1, 0, 2, 1], "dilation": [2, 1]},
                 _cid("conv2d", dt, "pads4-asymmetric-dilation21"), grad=grad),
            Case("conv2d", [xg, wg, bg], {"stride": 2, "padding": [0, 1, 1, 2], "dilation": [1, 2], "groups": 2},
                 _cid("conv2d", dt, "groups2-all-attrs"), grad=grad),
            Case("conv2d", [np.swapaxes(gn.arr((1, 4, 5, 6), dt), -1, -2), gn.transposed((4, 2, 2, 2), dt), None],
                 {"groups": 2, "dilation": [1, 2]}, _cid("conv2d", dt, "groups2-strided"), tags=("strided",)),
        ]
        if dt in ("float32", "float64"):
            out += [
                Case("conv2d", [g.arr((0, 3, 5, 5), dt), w, b], {}, _cid("conv2d", dt, "empty-batch"),
                     tags=("empty",)),
                Case("conv2d", [g.arr((1, 2, 4, 4), dt), g.arr((3, 2, 1, 1), dt), None], {},
                     _cid("conv2d", dt, "1x1")),
                Case("conv2d", [g.arr((1, 1, 3, 3), dt), g.arr((1, 1, 3, 3), dt), g.arr((1,), dt)], {},
                     _cid("conv2d", dt, "full-window")),
            ]

    # --- nonzero ----------------------------------------------------------------------
    for dt in NUMERIC:
        x = g.arr((4, 5), dt, lo=-2, hi=2)
        x = np.where(g.rng.uniform(size=x.shape) < 0.5, np.zeros((), dtype=x.dtype), x)
        out += [
            Case("nonzero", [x], {}, _cid("nonzero", dt, "basic")),
            Case("nonzero", [np.zeros((3, 4), dtype=np_dtype(dt))], {}, _cid("nonzero", dt, "all-zero"),
                 tags=("empty-result",)),
            Case("nonzero", [g.arr((0, 3), dt)], {}, _cid("nonzero", dt, "empty"), tags=("empty",)),
            Case("nonzero", [np.swapaxes(x, 0, 1)], {}, _cid("nonzero", dt, "transposed"), tags=("strided",)),
        ]
        if dt in ("float32", "int64"):
            out += [
                Case("nonzero", [np.asarray(g.arr((), dt, lo=1, hi=2))], {}, _cid("nonzero", dt, "rank0"),
                     tags=("rank0",)),
                Case("nonzero", [np.zeros((), dtype=dt)], {}, _cid("nonzero", dt, "rank0-zero"), tags=("rank0",)),
                Case("nonzero", [g.arr(RANK8, dt, lo=-1, hi=1)], {}, _cid("nonzero", dt, "rank8"), tags=("rank8",)),
            ]
        if dt in FLOAT:
            out.append(Case("nonzero", [np.array([0.0, -0.0, np.nan, 1.0, np.inf]).astype(np_dtype(dt))], {},
                            _cid("nonzero", dt, "nan-negzero")))

    out += backward_cases(Gen(23))
    out += small_magnitude_cases(Gen(2323))
    out += subnormal_cases()
    out += bad_inputs(g)
    ids = [c.id for c in out]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids: {sorted(dup)}"
    return out


def bad_inputs(g: Gen) -> list[Case]:
    """Bad input: each must raise the framework's ordinary error naming the op and the
    problem (the substring), and the process must survive."""
    f32 = lambda *s: g.arr(s, "float32")  # noqa: E731
    i32 = g.arr((2, 3), "int32")

    def bad(op, inputs, attrs, expect, desc):
        return Case(op, inputs, attrs, f"{op}/error/{desc}", expect_error=expect, tags=("error",))

    return [
        bad("gelu", [i32], {}, "unsupported dtype int32", "int-dtype"),
        bad("softmax", [g.arr((2, 3), "int64")], {}, "unsupported dtype int64", "int-dtype"),
        bad("scale", [i32], {"alpha": 2.0}, "unsupported dtype int32", "int-dtype"),
        bad("nonzero", [np.array([True, False])], {}, "unsupported dtype bool", "bool-dtype"),
        bad("add", [f32(2, 3), g.arr((2, 3), "float64")], {}, "dtype mismatch", "dtype-mismatch"),
        bad("add_relu", [f32(2, 3), i32], {}, "dtype mismatch", "dtype-mismatch"),
        bad("add", [f32(2, 3), f32(4, 3)], {}, "cannot be broadcast", "bad-broadcast"),
        bad("add_relu", [f32(2, 3), f32(2)], {}, "cannot be broadcast", "bad-broadcast"),
        bad("softmax", [f32(2, 3)], {"axis": 2}, "out of range", "axis-out-of-range"),
        bad("softmax", [f32(2, 3)], {"axis": -3}, "out of range", "negative-axis-out-of-range"),
        bad("topk", [f32(2, 3)], {"k": 4}, "out of range", "k-too-large"),
        bad("topk", [f32(2, 3)], {"k": -1}, "must be >= 0", "k-negative"),
        bad("topk", [f32(2, 3)], {"k": 1, "axis": 2}, "out of range", "axis-out-of-range"),
        # torch's dispatcher checks its schema before polyop sees the call
        bad("topk", [f32(2, 3)], {}, ("missing required attribute `k`", "missing value for argument 'k'"),
            "missing-k"),
        bad("gelu", [f32(2, 3)], {"approximate": "exact"}, "approximate must be", "bad-approximate"),
        bad("rms_norm", [f32(2, 4), f32(3)], {}, "weight must have shape", "weight-shape"),
        bad("rms_norm", [f32(2, 4), g.arr((4,), "float64")], {}, "dtype mismatch", "weight-dtype"),
        bad("rms_norm", [f32(2, 4), None], {"eps": -1.0}, "eps must be >= 0", "negative-eps"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 4, 3, 3), None], {}, "channels", "channel-mismatch"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 3, 3, 3), f32(3)], {}, "bias", "bias-shape"),
        bad("conv2d", [f32(1, 3, 2, 2), f32(2, 3, 3, 3), None], {}, "larger than", "kernel-larger-than-input"),
        bad("conv2d", [f32(3, 5, 5), f32(2, 3, 3, 3), None], {}, "input must be 4-D", "input-rank"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 3, 3, 3), None], {"padding": -1}, "padding must be >= 0",
            "negative-padding"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 3, 3, 3), None], {"stride": 0}, "stride", "stride-zero"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 1, 3, 3), None], {"groups": 2},
            "groups=2 does not divide the input's 3 channels", "groups-not-dividing-channels"),
        bad("conv2d", [f32(1, 4, 5, 5), f32(3, 2, 3, 3), None], {"groups": 2},
            "groups=2 does not divide the 3 output channels", "groups-not-dividing-outputs"),
        bad("conv2d", [f32(1, 4, 5, 5), f32(2, 4, 3, 3), None], {"groups": 2},
            "weight expects 4 per group x groups=2", "groups-weight-shape"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 3, 3, 3), None], {"groups": 0}, "groups must be >= 1", "groups-zero"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 3, 3, 3), None], {"padding": [1, 1, 1]},
            "padding must have 1, 2 or 4 values", "padding-3-values"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 3, 3, 3), None], {"dilation": [1, 0]}, "dilation must be >= 1",
            "dilation-zero"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 3, 3, 3), None], {"stride": [1, 1, 1]},
            "`stride` must be int[2]", "stride-3-values"),
        bad("conv2d", [f32(1, 3, 5, 5), f32(2, 3, 3, 3), None], {"dilation": 3}, "larger than",
            "dilated-kernel-larger-than-input"),
        bad("rms_norm", [f32(2, 4), None], {"axis": 2}, "out of range", "axis-out-of-range"),
        bad("rms_norm", [f32(2, 4), None], {"axis": -3}, "out of range", "negative-axis-out-of-range"),
        bad("rms_norm", [f32(2, 3, 4), f32(4)], {"axis": -2}, "(x.shape[axis:] for axis=-2), got [",
            "weight-shape-axis"),
    ]


def backward_cases(g: Gen) -> list[Case]:
    """The backward ops called directly, in every dtype they support, against the hand-derived
    float64 vector-Jacobian products of reference.py (the gradient checks above run only in
    float64; these pin every dtype and every framework to an independent reference)."""
    import reference as ref  # conformance/reference.py: the forward reference

    gn = Gen(2424)  # for the cases added with groups/dilation/axis (see cases())
    out: list[Case] = []
    for dt in NUMERIC:
        fl = dt in FLOAT
        for op in ("add_backward", "add_relu_backward"):
            out += [
                Case(op, [g.arr((3, 4), dt), g.arr((3, 4), dt), g.arr((3, 4), dt)], {}, _cid(op, dt, "same-shape")),
                Case(op, [g.arr((2, 3, 4), dt), g.arr((2, 3, 4), dt), g.arr((4,), dt)], {},
                     _cid(op, dt, "broadcast-row"), tags=("broadcast",)),
                Case(op, [g.arr((3, 4), dt), g.arr((3, 1), dt), g.arr((1, 4), dt)], {},
                     _cid(op, dt, "broadcast-outer"), tags=("broadcast",)),
                Case(op, [g.transposed((4, 3), dt), g.sliced((4, 3), dt), g.arr((), dt)], {},
                     _cid(op, dt, "strided-scalar"), tags=("strided", "broadcast")),
            ]
        x = g.arr((3, 5), dt)
        if fl:
            x = with_specials(dt, x, (np.nan, np.inf, -np.inf, 0.0, -0.0))
        out.append(Case("relu_backward", [g.arr((3, 5), dt), x], {}, _cid("relu_backward", dt, "basic")))
        out.append(Case("relu_backward", [g.transposed((4, 3), dt), g.sliced((4, 3), dt)], {},
                        _cid("relu_backward", dt, "strided"), tags=("strided",)))
        # topk's backward: indices from the forward reference (distinct values per lane)
        for axis, shape, k in ((-1, (3, 6), 3), (0, (5, 3), 2)):
            vals = g.rng.permutation(np.arange(int(np.prod(shape)))).reshape(shape) - 7
            xv = vals.astype(np_dtype(dt))
            _, idx = ref.topk(xv, k, axis=axis)
            gshape = idx.shape
            # not growable: repeating `idx` along a dim would give duplicate indices, which
            # no topk returns (the symbolic mode grows inputs by repeating their elements)
            out.append(Case("topk_backward", [g.arr(gshape, dt), xv, idx], {"axis": axis},
                            _cid("topk_backward", dt, f"axis{axis}"), tags=(NOT_GROWABLE,)))
    for dt in FLOAT:
        for approx in ("none", "tanh"):
            out += [
                Case("gelu_backward", [g.arr((3, 5), dt), g.arr((3, 5), dt, lo=-5, hi=5)],
                     {"approximate": approx}, _cid("gelu_backward", dt, f"basic,approximate={approx}")),
                Case("gelu_backward", [g.transposed((4, 3), dt), g.sliced((4, 3), dt)],
                     {"approximate": approx}, _cid("gelu_backward", dt, f"strided,approximate={approx}"),
                     tags=("strided",)),
            ]
        for axis, shape in ((-1, (3, 5)), (0, (4, 3))):
            y = np.asarray(ref.softmax(g.arr(shape, dt), axis=axis)[0][0]).astype(np_dtype(dt))
            out.append(Case("softmax_backward", [g.arr(shape, dt), y], {"axis": axis},
                            _cid("softmax_backward", dt, f"axis{axis}")))
        out += [
            Case("rms_norm_backward", [g.arr((3, 8), dt), g.arr((3, 8), dt), g.arr((8,), dt)], {},
                 _cid("rms_norm_backward", dt, "weight")),
            Case("rms_norm_backward", [g.arr((3, 8), dt), g.arr((3, 8), dt), None], {},
                 _cid("rms_norm_backward", dt, "no-weight")),
            Case("rms_norm_backward", [g.arr((2, 3, 5), dt), g.arr((2, 3, 5), dt), g.arr((5,), dt)], {"eps": 0.1},
                 _cid("rms_norm_backward", dt, "eps")),
            Case("rms_norm_backward", [g.sliced((4, 6), dt), g.transposed((4, 6), dt), g.sliced((6,), dt)], {},
                 _cid("rms_norm_backward", dt, "strided"), tags=("strided",)),
            Case("rms_norm_backward", [gn.arr((3, 2, 5), dt), gn.arr((3, 2, 5), dt), gn.arr((2, 5), dt)], {"axis": -2},
                 _cid("rms_norm_backward", dt, "axis-2")),
            Case("rms_norm_backward", [gn.arr((2, 3, 4), dt), gn.arr((2, 3, 4), dt), None], {"axis": 1},
                 _cid("rms_norm_backward", dt, "axis1-no-weight")),
            Case("rms_norm_backward", [gn.arr((2, 4, 3), dt), gn.transposed((2, 4, 3), dt), gn.sliced((4, 3), dt)],
                 {"axis": 1}, _cid("rms_norm_backward", dt, "axis1-strided"), tags=("strided",)),
        ]
        x, w, b = g.arr((2, 3, 6, 5), dt, lo=-1, hi=1), g.arr((4, 3, 3, 3), dt, lo=-1, hi=1), g.arr((4,), dt)
        for stride, padding, bias in ((1, 0, None), (1, 1, b), (2, 0, b), (2, 2, None)):
            oh, ow = (6 + 2 * padding - 3) // stride + 1, (5 + 2 * padding - 3) // stride + 1
            out.append(Case("conv2d_backward", [g.arr((2, 4, oh, ow), dt), x, w, bias],
                            {"stride": stride, "padding": padding},
                            _cid("conv2d_backward", dt, f"s{stride}p{padding}{'-bias' if bias is not None else ''}")))
        # groups (grouped, depthwise), dilation, per-axis stride, asymmetric pads
        xg, wg, wd = gn.arr((2, 4, 6, 5), dt, lo=-1, hi=1), gn.arr((6, 2, 3, 3), dt, lo=-1, hi=1), \
            gn.arr((8, 1, 3, 3), dt, lo=-1, hi=1)
        for desc, xx, ww, attrs in (
            ("groups2", xg, wg, {"groups": 2}),
            ("depthwise-padding1", xg, wd, {"groups": 4, "padding": 1}),
            ("dilation2-padding2", x, w, {"dilation": 2, "padding": 2}),
            ("stride21-padding2", x, w, {"stride": [2, 1], "padding": [1, 0]}),
            ("pads4-dilation21", x, w, {"stride": [1, 2], "padding": [1, 0, 2, 1], "dilation": [2, 1]}),
            ("groups2-all-attrs", xg, wg, {"stride": 2, "padding": [0, 1, 1, 2], "dilation": [1, 2], "groups": 2}),
        ):
            yo = ref.conv2d(xx, ww, None, **attrs)[0][0]
            out.append(Case("conv2d_backward", [gn.arr(yo.shape, dt), xx, ww, gn.arr((ww.shape[0],), dt)], attrs,
                            _cid("conv2d_backward", dt, desc)))
    return out


def small_magnitude_cases(g: Gen) -> list[Case]:
    """Results around 1e-4..1e-3 in every float dtype: far above each dtype's tolerance
    floor, so an all-zero output fails (conformance/test_harness.py checks that it does)."""
    out: list[Case] = []
    for dt in FLOAT:
        def c(op, inputs, attrs, desc):
            return Case(op, inputs, attrs, _cid(op, dt, f"small,{desc}"), tags=("small",))

        ones = lambda *s: g.arr(s, dt, lo=0.5, hi=1.0)  # noqa: E731
        out += [
            c("add", [g.arr((3, 4), dt, lo=2e-4, hi=4e-4), g.arr((3, 4), dt, lo=2e-4, hi=4e-4)], {}, "tiny-sum"),
            c("scale", [ones(3, 4)], {"alpha": 1e-3}, "alpha=1e-3"),
            c("softmax", [np.array([[0.0, -7.0, -7.5, -8.0], [-8.0, 0.0, -7.25, -7.75]]).astype(np_dtype(dt))], {},
              "dominant-logit"),
            c("rms_norm", [g.arr((2, 6), dt), g.arr((6,), dt, lo=5e-4, hi=1e-3)], {}, "small-weight"),
            c("conv2d", [ones(1, 1, 4, 4), g.arr((1, 1, 2, 2), dt, lo=2e-4, hi=3e-4), None], {}, "small-weight"),
            c("gelu_backward", [ones(2, 5), g.arr((2, 5), dt, lo=-3.6, hi=-3.2)], {}, "negative-tail"),
            c("softmax_backward", [g.arr((2, 4), dt),
                                   np.array([[0.99, 9e-4, 5e-4, 3e-4]] * 2).astype(np_dtype(dt))], {}, "small-probs"),
            c("rms_norm_backward", [g.arr((2, 6), dt, lo=1e-3, hi=2e-3), ones(2, 6), ones(6)], {}, "small-grad"),
        ]
        for approx in ("none", "tanh"):
            out.append(c("gelu", [g.arr((3, 4), dt, lo=-3.6, hi=-3.2)], {"approximate": approx},
                         f"negative-tail,approximate={approx}"))
    return out


#: Exponent of the smallest positive subnormal (``TINY``) per float dtype, and the number of
#: subnormal steps below the smallest normal number (smallest normal = ``STEPS * TINY``).
TINY_EXP = {"float16": -24, "bfloat16": -133, "float32": -149, "float64": -1074}
STEPS = {"float16": 2**10, "bfloat16": 2**7, "float32": 2**23, "float64": 2**52}


def _subnormals(dt: str, ks) -> np.ndarray:
    """``k * TINY`` for each integer ``k`` (|k| < STEPS: subnormal, exactly representable)."""
    return np.ldexp(np.asarray(ks, dtype=np.float64), TINY_EXP[dt]).astype(np_dtype(dt))


def subnormal_cases() -> list[Case]:
    """Subnormal inputs and results, in every float dtype (SPEC.md section 2: bitwise
    identical in every framework whatever the calling thread's flush-to-zero /
    denormals-are-zero mode; kernel-core computes with both off, docs/reliability.md).

    A thread with DAZ reads a subnormal input as zero and one with FTZ writes a subnormal
    result as zero; the ulps bound's floor (a few smallest *normal* numbers) would accept
    that zero, so these cases bound the error in units of the smallest *subnormal* instead
    (``ulps=0`` where the result is exact: a flushed value then fails outright). float32,
    float64 and bfloat16 subnormals are subnormal in the compute type and catch a flush;
    float16 subnormals are normal float32 numbers (no flush possible) and are here for the
    same bits in every dtype."""
    out: list[Case] = []
    for dt in FLOAT:
        m = STEPS[dt]
        ks = [1, -1, 2, -3, 6, -10, m // 2, -(m // 2), m - 1, -(m - 1), m // 4 + 2, -(m // 4 - 2)]
        x = _subnormals(dt, ks).reshape(3, 4)
        y = _subnormals(dt, ks[::-1]).reshape(3, 4)
        even = _subnormals(dt, [2 * (k // 2) or 2 for k in ks]).reshape(3, 4)
        # normal + subnormal with a subnormal sum: smallest normal minus k * TINY
        near = _subnormals(dt, [m, m, -m, m, -m, m]).reshape(2, 3)
        back = _subnormals(dt, [-1, -(m // 2), 3, -(m - 1), m // 3, -7]).reshape(2, 3)
        # in units of the smallest subnormal: rtol from the op's ulps, the floor one subnormal
        # ulp per allowed ulp (not the smallest normal: a flushed result must fail)
        tiny = 2.0 ** TINY_EXP[dt]

        def sub_tol(op: str) -> tuple[float, float]:
            u = op_ulps(op)
            return (u * EPS[dt], u * tiny)

        def c(op, inputs, attrs, desc, **kw):
            return Case(op, inputs, attrs, _cid(op, dt, f"subnormal,{desc}"), tags=("subnormal",), **kw)

        # softmax rows whose small probabilities are subnormal in dt (exp of a very negative
        # logit), next to normal ones
        logits = {
            "float16": [[0.0, -10.0, -12.0, -15.0, -16.5, 1.0], [-3.0, 0.0, -14.0, -11.0, -16.0, -13.0]],
            "bfloat16": [[0.0, -88.0, -90.0, -96.0, -100.0, -103.0], [-2.0, 0.0, -92.0, -98.0, -101.0, -89.0]],
            "float32": [[0.0, -88.0, -90.0, -96.0, -100.0, -103.0], [-2.0, 0.0, -92.0, -98.0, -101.0, -89.0]],
            "float64": [[0.0, -709.0, -712.0, -720.0, -735.0, -744.0], [-2.0, 0.0, -715.0, -730.0, -740.0, -711.0]],
        }[dt]
        out += [
            c("negate", [x], {}, "exact", ulps=0),
            c("relu", [x], {}, "exact", ulps=0),
            c("add", [x, y], {}, "exact", ulps=0),
            c("add", [near, back], {}, "normal-plus-subnormal", ulps=0),
            # x * 2^-1 and x * 2^24: exact (even multiples of TINY; a power of two)
            c("scale", [even], {"alpha": -0.5}, "alpha=-0.5", ulps=0),
            c("scale", [x], {"alpha": float(2**24)}, "alpha=2^24", ulps=0),
            c("softmax", [np.array(logits).astype(np_dtype(dt))], {}, "subnormal-probs",
              tolerance=sub_tol("softmax")),
            # mean(x^2) is far below eps, so the result is x / sqrt(eps) = x * 1e6: normal for
            # the larger inputs (DAZ would give 0), subnormal for the smallest (FTZ would give 0)
            c("rms_norm", [x, None], {"eps": 1e-12}, "eps=1e-12", tolerance=sub_tol("rms_norm")),
            # a subnormal is not zero (DAZ would compare it equal to 0)
            c("nonzero", [np.where(np.arange(12).reshape(3, 4) % 3 == 1, np.zeros((), x.dtype), x)], {},
              "not-zero"),
        ]
    return out
