"""The conformance harness: cases, backends, comparison, the runner and the matrix report.

A *case* is one call of one op (inputs, attributes) plus what is expected of it: outputs
matching an independent reference, or an error whose message contains a substring. A
*backend* runs a case in one framework and mode. The harness checks every backend's outputs
against the reference (per-dtype tolerances) and, bit for bit, against a *baseline* backend
(by default ``native``: the NumPy core, ``polyop.run``), because the same kernel must give the
same bits in every framework.

This module imports no framework; it is usable by an out-of-tree op author with their own
cases, reference and backends::

    from polyop.conformance import Case, run, write_matrix
    results = run(my_cases, my_reference, backends=["native", "torch"])
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

from .._library import namespace_of
from .tolerances import DEFAULT_ULPS, rtol_atol, tolerance as _op_tolerance

#: (rtol, atol) per output dtype for an op with no entry in ``tolerances.txt`` and no
#: tolerance of its own: ``DEFAULT_ULPS`` ulps (see ``polyop.conformance.tolerances``).
#: Integer and bool outputs must match exactly. A value is close when
#: ``|actual - expected| <= atol + rtol * scale`` in float64, ``expected`` the float64
#: reference (not rounded to the output dtype) and ``scale`` = ``|expected|`` unless the
#: reference gives one.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    dt: rtol_atol(dt, DEFAULT_ULPS) for dt in FLOAT_DTYPES
}

#: The pseudo-mode under which gradient checks are reported.
GRAD = "grad"
#: The symbolic-shapes mode: traced / compiled / exported once with symbolic dims, run at
#: several sizes (see :func:`symbolic_pattern`, :func:`grown`).
SYMBOLIC = "symbolic"
#: The sizes of the symbolic mode: every dim larger than 1 grown by these amounts.
SYMBOLIC_GROWTH = (0, 1, 3)
#: A case tag: the case's inputs are related by their values in a way growing them breaks
#: (indices into another input), so the symbolic mode reports it unsupported.
NOT_GROWABLE = "not-growable"


# --------------------------------------------------------------------------------------
# cases


def dtype_name(a: Any) -> str:
    return np.asarray(a).dtype.name


def _desc_array(a: Any) -> str:
    if a is None:
        return "None"
    a = np.asarray(a)
    s = f"{a.dtype.name}{list(a.shape)}"
    if a.size > 1 and not a.flags.c_contiguous:
        s += "(strided)"
    return s


@dataclass
class Case:
    """One call of one op and what is expected of it.

    ``inputs``: NumPy arrays (possibly non-contiguous views; bfloat16 as
    ``ml_dtypes.bfloat16``) or ``None`` for an absent optional input. ``grad``: run the
    framework's gradient check too (float64, away from kinks). ``expect_error``: the case is
    bad input; the error message must contain this substring (or one of a tuple of
    alternatives, for frameworks that check an argument before polyop sees it) and name the op.
    ``ulps``: the tolerance in units of each float dtype's rounding (see
    ``polyop.conformance.tolerances``); default: the op's entry in ``tolerances.txt``.
    ``tolerance``: explicit ``(rtol, atol)`` for every float output, or
    ``{dtype_name: (rtol, atol)}`` (overrides ``ulps``).
    ``tags``: free-form labels (``"strided"``, ``"empty"``, ...) for reports.
    """

    op: str
    inputs: list = field(default_factory=list)
    attrs: dict = field(default_factory=dict)
    id: str = ""
    grad: bool = False
    expect_error: str | tuple[str, ...] | None = None
    tolerance: tuple[float, float] | dict[str, tuple[float, float]] | None = None
    ulps: float | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.inputs = list(self.inputs)
        if not self.id:
            args = ",".join(_desc_array(a) for a in self.inputs)
            attrs = ",".join(f"{k}={v!r}" for k, v in self.attrs.items())
            self.id = f"{self.op}({args}{';' + attrs if attrs else ''})"

    @property
    def dtype(self) -> str | None:
        """The dtype of the first present input."""
        for a in self.inputs:
            if a is not None:
                return dtype_name(a)
        return None

    def describe(self) -> str:
        args = ", ".join(_desc_array(a) for a in self.inputs)
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items())
        return f"{self.op}({args}{', ' + attrs if attrs else ''})"

    def tol(self, dtype: str) -> tuple[float, float]:
        t = self.tolerance
        if isinstance(t, Mapping):
            if dtype in t:
                return tuple(t[dtype])  # type: ignore[return-value]
        elif t is not None:
            return tuple(t)  # type: ignore[return-value]
        if self.ulps is not None:
            return rtol_atol(dtype, self.ulps)
        return _op_tolerance(self.op, dtype)


# --------------------------------------------------------------------------------------
# backends


class Backend:
    """One framework (or the NumPy core) running cases.

    Subclasses set ``name`` and ``modes`` and implement ``run``; ``check_grad`` and ``error``
    have defaults. ``unsupported(case, mode)`` returns a reason string when this backend or
    mode cannot run the case (reported as "unsupported: <reason>", never silently skipped);
    the harness also asks it with ``mode == "grad"`` before a gradient check.
    """

    name: str = "backend"
    modes: tuple[str, ...] = ("eager",)
    #: Shown in reports, e.g. "torch 2.13.0".
    version: str = ""

    def unsupported(self, case: Case, mode: str) -> str | None:
        return None

    def run(self, case: Case, mode: str) -> list[np.ndarray]:
        """Forward outputs as NumPy arrays (one per op output). Must not modify inputs."""
        raise NotImplementedError

    def check_grad(self, case: Case) -> None:
        """Framework-native gradient check; raise AssertionError on failure."""
        raise NotImplementedError(f"backend {self.name} has no gradient check")

    #: Whether this backend runs the symbolic mode (:meth:`run_symbolic`).
    symbolic: bool = False

    def run_symbolic(self, case: Case, pattern: list, cases: Sequence[Case]) -> list[list[np.ndarray]]:
        """Trace / compile / export op ``case.op`` once for the input shapes ``pattern`` (per
        input ``None`` or a tuple of ints and symbol names; equal names are equal sizes),
        then run that one artifact on every case of ``cases`` (the same op and attributes at
        sizes that fit the pattern). Returns the outputs per case."""
        raise NotImplementedError(f"backend {self.name} has no symbolic mode")

    def error(self, case: Case, mode: str) -> BaseException:
        """Run a bad-input case and return the exception it raised (it must raise)."""
        try:
            self.run(case, mode)
        except Exception as e:  # noqa: BLE001 - returning it is the point
            return e
        raise AssertionError("no error was raised")


class BrokenBackend(Backend):
    """Stands in for a backend whose module failed to import: every case fails with why."""

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason
        self.modes = ("load",)


# --------------------------------------------------------------------------------------
# results


@dataclass
class Result:
    backend: str
    mode: str
    case_id: str
    op: str
    kind: str  # "forward" | "error" | "grad"
    status: str  # "pass" | "fail" | "unsupported"
    detail: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: Mapping) -> "Result":
        return Result(**{f.name: d[f.name] for f in dataclasses.fields(Result) if f.name in d})


# --------------------------------------------------------------------------------------
# comparison


def _as_list(out: Any) -> list:
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def _to_f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def normalize_expected(ref_out: Any) -> list[tuple[np.ndarray, str, np.ndarray | None]]:
    """Reference outputs as ``(values, dtype_name, scale)``: an item may be an array (its
    own dtype is expected), ``(values, dtype_name)`` with float64 values for a
    lower-precision output, or ``(values, dtype_name, scale)`` where ``scale`` (same shape)
    is the magnitude the error bound is relative to, e.g. the sum of ``|terms|`` of a
    computed sum (default ``|values|``)."""
    items = []
    for r in _as_list(ref_out):
        if isinstance(r, tuple) and len(r) in (2, 3) and isinstance(r[1], str):
            scale = np.asarray(r[2], dtype=np.float64) if len(r) == 3 else None
            items.append((np.asarray(r[0]), r[1], scale))
        else:
            r = np.asarray(r)
            items.append((r, r.dtype.name, None))
    return items


def compare_to_reference(case: Case, actual: Sequence[Any], expected: Any) -> str | None:
    """None if ``actual`` matches the reference, else what is wrong."""
    exp = normalize_expected(expected)
    if len(actual) != len(exp):
        return f"expected {len(exp)} output(s), got {len(actual)}"
    for i, (a, (e, edt, scale)) in enumerate(zip(actual, exp)):
        a = np.asarray(a)
        if a.dtype.name != edt:
            return f"output {i}: dtype {a.dtype.name}, expected {edt}"
        if tuple(a.shape) != tuple(e.shape):
            return f"output {i}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        if edt in FLOAT_DTYPES:
            af, ef = _to_f64(a), _to_f64(e)
            an, en = np.isnan(af), np.isnan(ef)
            if not np.array_equal(an, en):
                idx = np.argwhere(an != en)[0]
                return (
                    f"output {i}: NaN mismatch at {tuple(int(j) for j in idx)}: "
                    f"got {af[tuple(idx)]!r}, expected {ef[tuple(idx)]!r}"
                )
            rtol, atol = case.tol(edt)
            ok = ~en
            both_inf = np.isinf(ef) & ok
            if np.any(both_inf & (af != ef)):
                idx = np.argwhere(both_inf & (af != ef))[0]
                return f"output {i}: at {tuple(int(j) for j in idx)} got {af[tuple(idx)]!r}, expected {ef[tuple(idx)]!r}"
            fin = ok & ~both_inf
            with np.errstate(invalid="ignore", over="ignore"):
                err = np.abs(af - ef)
                bound = atol + rtol * (np.abs(ef) if scale is None else np.broadcast_to(scale, ef.shape))
            bad = fin & ~(err <= bound)
            if np.any(bad):
                idx = tuple(int(j) for j in np.argwhere(bad)[0])
                worst = float(np.max(np.where(fin, err, 0.0)))
                return (
                    f"output {i}: {int(bad.sum())} of {a.size} element(s) off "
                    f"(rtol={rtol:g}, atol={atol:g}); first at {idx}: got {af[idx]!r}, "
                    f"expected {ef[idx]!r}; max abs err {worst:.3g}"
                )
        else:
            if not np.array_equal(a, e.astype(a.dtype) if e.dtype != a.dtype else e):
                diff = np.argwhere(a != e)
                where = tuple(int(j) for j in diff[0]) if diff.size else "?"
                got = a[where] if diff.size else a
                want = e[where] if diff.size else e
                return f"output {i}: values differ at {where}: got {got!r}, expected {want!r}"
    return None


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).reshape(-1)


def compare_bitwise(actual: Sequence[Any], base: Sequence[Any], base_name: str) -> str | None:
    """None if ``actual`` equals ``base`` bit for bit (any NaN equals any NaN), else what
    differs."""
    if len(actual) != len(base):
        return f"{len(actual)} output(s) vs {len(base)} from {base_name}"
    for i, (a, b) in enumerate(zip(actual, base)):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            return (
                f"output {i}: {a.dtype.name}{list(a.shape)} vs {b.dtype.name}{list(b.shape)} "
                f"from {base_name}"
            )
        if a.size == 0 or np.array_equal(_bits(a), _bits(b)):
            continue
        if a.dtype.name in FLOAT_DTYPES:
            af, bf = _to_f64(a), _to_f64(b)
            same = (np.ascontiguousarray(a).view(np.uint8).reshape(a.size, -1) ==
                    np.ascontiguousarray(b).view(np.uint8).reshape(b.size, -1)).all(axis=1)
            same = same.reshape(a.shape) | (np.isnan(af) & np.isnan(bf))
            if same.all():
                continue
            idx = tuple(int(j) for j in np.argwhere(~same)[0])
            return (
                f"output {i}: not bitwise identical to {base_name}: {int((~same).sum())} "
                f"element(s) differ; first at {idx}: {af[idx]!r} vs {bf[idx]!r}"
            )
        return f"output {i}: not bitwise identical to {base_name}"
    return None


def _snapshot(inputs: Iterable[Any]) -> list:
    return [None if a is None else (np.array(a, copy=True)) for a in inputs]


def _inputs_unchanged(case: Case, snap: list) -> bool:
    for a, s in zip(case.inputs, snap):
        if a is None:
            continue
        if not np.array_equal(_bits(np.asarray(a)), _bits(s)):
            return False
    return True


def _op_named(op: str, msg: str, namespace: str = "polyop") -> bool:
    """Whether ``msg`` names ``op`` as its library's errors do: ``<namespace>.<op>`` (the
    registry's namespace, ``polyop`` for the stock ops), or a stock framework spelling."""
    camel = "".join(w[:1].upper() + w[1:] for w in op.strip("_").split("_"))
    return any(s in msg for s in (f"{namespace}.{op}", f"polyop::{op}", f"polyop_{op}", f"Polyop{camel}"))


def _short(e: BaseException, limit: int = 600) -> str:
    s = f"{type(e).__name__}: {e}".strip()
    return s if len(s) <= limit else s[:limit] + "..."


# --------------------------------------------------------------------------------------
# the runner

Reference = Callable[[str, list, dict], Any]


def _as_reference(reference: Reference | Mapping[str, Callable]) -> Reference:
    if isinstance(reference, Mapping):
        table = reference

        def ref(op: str, inputs: list, attrs: dict) -> Any:
            if op not in table:
                raise KeyError(f"no reference for op {op!r}")
            return table[op](*inputs, **attrs)

        return ref
    return reference


def run_cases(
    cases: Sequence[Case],
    reference: Reference | Mapping[str, Callable],
    backends: Sequence[Backend],
    baseline: Backend | None = None,
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run every case on every backend and mode; return one :class:`Result` per
    (backend, mode, case) plus one per gradient check.

    ``reference(op, inputs, attrs)`` (or a dict op -> ``fn(*inputs, **attrs)``) returns the
    expected outputs: arrays, or ``(float64_values, dtype_name)`` pairs for float outputs.
    ``baseline``: outputs of every other backend must equal its outputs bit for bit.
    """
    reference = _as_reference(reference)
    ref_cache: dict[str, tuple[Any, str | None]] = {}
    base_cache: dict[str, tuple[list | None, str | None]] = {}
    results: list[Result] = []

    def emit(r: Result) -> None:
        results.append(r)
        if progress:
            progress(r)

    def expected(case: Case) -> tuple[Any, str | None]:
        if case.id not in ref_cache:
            try:
                ref_cache[case.id] = (reference(case.op, list(case.inputs), dict(case.attrs)), None)
            except Exception as e:  # noqa: BLE001
                ref_cache[case.id] = (None, f"reference failed: {_short(e)}")
        return ref_cache[case.id]

    def base_out(case: Case) -> tuple[list | None, str | None]:
        assert baseline is not None
        if case.id not in base_cache:
            try:
                mode = baseline.modes[0]
                why = baseline.unsupported(case, mode)
                if why:
                    base_cache[case.id] = (None, None)
                else:
                    base_cache[case.id] = ([np.asarray(o) for o in _as_list(baseline.run(case, mode))], None)
            except Exception as e:  # noqa: BLE001
                base_cache[case.id] = (None, f"baseline {baseline.name} failed: {_short(e)}")
        return base_cache[case.id]

    for backend in backends:
        if isinstance(backend, BrokenBackend):
            for case in cases:
                emit(Result(backend.name, "load", case.id, case.op, "forward", "fail", backend.reason))
            continue
        for case in cases:
            for mode in backend.modes:
                use_base = baseline is not None and baseline.name != backend.name
                emit(_run_one(backend, mode, case, expected, base_out if use_base else None,
                              baseline.name if baseline is not None else ""))
            if case.grad and not case.expect_error:
                emit(_grad_one(backend, case))
            if backend.symbolic and not case.expect_error:
                emit(_symbolic_one(backend, case, reference,
                                   base_out if baseline is not None and baseline.name != backend.name else None,
                                   baseline.name if baseline is not None else ""))
    return results


def symbolic_pattern(case: Case) -> list | None:
    """The case's input shapes with every size larger than 1 made a symbol (``s<size>``:
    equal sizes share one, so sizes an op ties together stay tied); 0 and 1 stay constants,
    as frameworks specialize them. ``None`` when no dim is larger than 1."""
    pats, any_sym = [], False
    for a in case.inputs:
        if a is None:
            pats.append(None)
            continue
        p = tuple(f"s{d}" if d > 1 else int(d) for d in np.shape(a))
        any_sym |= any(isinstance(x, str) for x in p)
        pats.append(p)
    return pats if any_sym else None


def grown(case: Case, k: int) -> Case:
    """The case with every dim larger than 1 grown by ``k``, the new elements repeating the
    old ones along that dim (so values stay in the case's domain)."""
    if k == 0:
        return case
    ins = []
    for a in case.inputs:
        if a is None:
            ins.append(None)
            continue
        a = np.asarray(a)
        for ax, d in enumerate(a.shape):
            if d > 1:
                a = np.take(a, np.arange(d + k) % d, axis=ax)
        ins.append(a)
    return Case(case.op, ins, dict(case.attrs), id=f"{case.id}+{k}", tolerance=case.tolerance,
                ulps=case.ulps, tags=case.tags)


def _symbolic_one(backend: Backend, case: Case, reference, base_out, base_name) -> Result:
    r = Result(backend.name, SYMBOLIC, case.id, case.op, "forward", "fail")
    t0 = time.perf_counter()
    try:
        why, err = _unsupported(backend, case, SYMBOLIC)
        pattern = symbolic_pattern(case)
        if err:
            r.detail = err
            return r
        if NOT_GROWABLE in case.tags:
            why = why or "the case's inputs hold indices into each other that growing would break"
        if why or pattern is None:
            r.status, r.detail = "unsupported", why or "no dim larger than 1 to make symbolic"
            return r
        # Sizes whose grown inputs the op accepts (growing can break a relation between sizes
        # that are not equal, such as a conv2d gradient's size against its input's).
        meta = getattr(backend, "meta", None)
        cases, expected = [], []
        for k in SYMBOLIC_GROWTH:
            c = grown(case, k)
            if meta is not None and k:
                try:
                    meta.infer(c.op, [None if a is None else (np.shape(a), dtype_name(a))
                                      for a in c.inputs], **c.attrs)
                except (TypeError, ValueError):
                    continue
            try:
                expected.append(reference(c.op, list(c.inputs), dict(c.attrs)))
            except Exception as e:  # noqa: BLE001
                r.detail = f"reference failed at {c.describe()}: {_short(e)}"
                return r
            cases.append(c)
        if len(cases) < len(SYMBOLIC_GROWTH):
            r.status, r.detail = "unsupported", (
                "inputs grown along every dim > 1 are not valid for this op (sizes it relates "
                "by more than equality)")
            return r
        outs_per_case = backend.run_symbolic(case, pattern, cases)
        for c, outs, exp in zip(cases, outs_per_case, expected):
            outs = [np.asarray(o) for o in _as_list(outs)]
            # bitwise against the baseline at the case's own size (the baseline ran only it)
            bad = _check_outputs(c, outs, exp, base_out if c is case else None, base_name)
            if bad:
                r.detail = f"at {c.describe()}: {bad}"
                return r
        r.status = "pass"
        return r
    except Exception as e:  # noqa: BLE001
        r.detail = _raised(e)
        return r
    finally:
        r.seconds = time.perf_counter() - t0


def _unsupported(backend: Backend, case: Case, mode: str) -> tuple[str | None, str | None]:
    try:
        return backend.unsupported(case, mode), None
    except Exception as e:  # noqa: BLE001
        return None, f"unsupported() raised {_short(e)}"


def _raised(e: BaseException) -> str:
    """An unexpected exception as a result detail, with where it was raised."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return _short(e) + where


def _check_outputs(case: Case, outs: list, exp: Any, base_out, base_name: str) -> str | None:
    """What is wrong with ``outs`` against the reference ``exp`` and, when ``base_out`` is
    given, bitwise against the baseline backend's outputs for ``case``; None when right."""
    bad = compare_to_reference(case, outs, exp)
    if bad:
        return f"vs reference: {bad}"
    if base_out is not None:
        base, base_err = base_out(case)
        if base_err:
            return base_err
        if base is not None:
            return compare_bitwise(outs, base, base_name)
    return None


def _run_one(backend, mode, case, expected, base_out, base_name) -> Result:
    kind = "error" if case.expect_error else "forward"
    r = Result(backend.name, mode, case.id, case.op, kind, "fail")
    t0 = time.perf_counter()
    why, err = _unsupported(backend, case, mode)
    if err:
        r.detail = err
        return r
    if why:
        r.status, r.detail = "unsupported", why
        return r
    snap = _snapshot(case.inputs)
    try:
        if case.expect_error:
            try:
                exc = backend.error(case, mode)
            except AssertionError as e:
                r.detail = f"expected an error containing {case.expect_error!r}: {e}"
                return r
            if not isinstance(exc, BaseException):
                r.detail = f"error() returned {type(exc).__name__}, not an exception"
                return r
            msg = str(exc)
            alts = (case.expect_error,) if isinstance(case.expect_error, str) else tuple(case.expect_error)
            if not any(a in msg for a in alts):
                r.detail = f"error message lacks {case.expect_error!r}: {_short(exc)}"
            elif not _op_named(case.op, msg, namespace_of(getattr(backend, "meta", None))):
                r.detail = f"error message does not name the op: {_short(exc)}"
            else:
                r.status, r.detail = "pass", _short(exc, 200)
            return r
        exp, ref_err = expected(case)
        if ref_err:
            r.detail = ref_err
            return r
        outs = [np.asarray(o) for o in _as_list(backend.run(case, mode))]
        bad = _check_outputs(case, outs, exp, base_out, base_name)
        if bad:
            r.detail = bad
            return r
        if not _inputs_unchanged(case, snap):
            r.detail = "the backend modified an input array"
            return r
        r.status = "pass"
        return r
    except Exception as e:  # noqa: BLE001
        r.detail = _raised(e)
        return r
    finally:
        r.seconds = time.perf_counter() - t0


def _grad_one(backend: Backend, case: Case) -> Result:
    r = Result(backend.name, GRAD, case.id, case.op, "grad", "fail")
    t0 = time.perf_counter()
    why, err = _unsupported(backend, case, GRAD)
    if err:
        r.detail = err
    elif why:
        r.status, r.detail = "unsupported", why
    else:
        try:
            backend.check_grad(case)
            r.status = "pass"
        except Exception as e:  # noqa: BLE001
            r.detail = _short(e)
    r.seconds = time.perf_counter() - t0
    return r


# --------------------------------------------------------------------------------------
# summaries and the markdown matrix


def counts(results: Iterable[Result]) -> dict[str, int]:
    c = {"pass": 0, "fail": 0, "unsupported": 0}
    for r in results:
        c[r.status] = c.get(r.status, 0) + 1
    return c


def summary_line(results: Sequence[Result]) -> str:
    c = counts(results)
    return f"{c['pass']} passed, {c['fail']} failed, {c['unsupported']} unsupported"


def write_matrix(
    results: Sequence[Result],
    path: str | None = None,
    title: str = "Conformance matrix",
    preamble: str = "",
    versions: Mapping[str, str] | None = None,
    num_cases: int | None = None,
) -> str:
    """A markdown report: per-backend summary, an op x (backend, mode) matrix, the
    unsupported reasons and every failure. Written to ``path`` when given; returned."""
    versions = versions or {}
    backends: list[str] = []
    cols: list[tuple[str, str]] = []
    ops: list[str] = []
    for r in results:
        if r.backend not in backends:
            backends.append(r.backend)
        if (r.backend, r.mode) not in cols:
            cols.append((r.backend, r.mode))
        if r.op not in ops:
            ops.append(r.op)
    # grad and symbolic columns after a backend's forward modes
    cols.sort(key=lambda c: (backends.index(c[0]), (c[1] == SYMBOLIC) + 2 * (c[1] == GRAD)))
    cell: dict[tuple[str, str, str], list[Result]] = defaultdict(list)
    for r in results:
        cell[(r.op, r.backend, r.mode)].append(r)
    reason_key: dict[str, str] = {}
    for r in results:
        if r.status == "unsupported" and r.detail not in reason_key:
            reason_key[r.detail] = f"U{len(reason_key) + 1}"

    out: list[str] = [f"# {title}", ""]
    if preamble:
        out += [preamble.rstrip(), ""]
    c = counts(results)
    total = f"**{c['pass']} passed, {c['fail']} failed, {c['unsupported']} unsupported**"
    if num_cases is not None:
        total += f" over {num_cases} cases"
    out += [total, "", "## Backends", "", "| backend | version | modes | pass | fail | unsupported |", "|---|---|---|---:|---:|---:|"]
    for b in backends:
        rs = [r for r in results if r.backend == b]
        cb = counts(rs)
        modes = ", ".join(m for (bb, m) in cols if bb == b)
        out.append(f"| {b} | {versions.get(b, '')} | {modes} | {cb['pass']} | {cb['fail']} | {cb['unsupported']} |")
    out += ["", "## Matrix (op x backend/mode)", ""]
    out.append("Cells: passed/run (failures marked **FAIL**), then unsupported counts with their "
               "reasons' keys (Un, listed below); `-`: no case.")
    out.append("")
    out.append("| op | " + " | ".join(f"{b} {m}" for b, m in cols) + " |")
    out.append("|---|" + "---|" * len(cols))
    for op in ops:
        row = [f"`{op}`"]
        for b, m in cols:
            rs = cell.get((op, b, m), [])
            if not rs:
                row.append("-")
                continue
            cc = counts(rs)
            ran = cc["pass"] + cc["fail"]
            parts = []
            if ran:
                s = f"{cc['pass']}/{ran}"
                if cc["fail"]:
                    s = f"**FAIL {cc['fail']}** ({s})"
                parts.append(s)
            if cc["unsupported"]:
                keys = sorted({reason_key[r.detail] for r in rs if r.status == "unsupported"},
                              key=lambda k: int(k[1:]))
                parts.append(f"{cc['unsupported']} unsupported ({', '.join(keys)})" if ran
                             else f"unsupported ({', '.join(keys)})")
            row.append("<br>".join(parts))
        out.append("| " + " | ".join(row) + " |")

    uns: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for r in results:
        if r.status == "unsupported":
            uns[(r.backend, r.mode, r.op, r.detail)] += 1
    if uns:
        out += ["", "## Unsupported (with reasons)", "", "| key | reason | where (backend / mode / op: cases) |", "|---|---|---|"]
        by_reason: dict[str, list[str]] = defaultdict(list)
        for (b, m, op, why), n in sorted(uns.items(), key=lambda kv: (backends.index(kv[0][0]), kv[0][1], kv[0][2])):
            by_reason[why].append(f"{b} / {m} / `{op}`: {n}")
        for why, key in reason_key.items():
            out.append(f"| {key} | {why.replace('|', '/')} | {'; '.join(by_reason[why])} |")
    fails = [r for r in results if r.status == "fail"]
    out += ["", "## Failures", ""]
    if not fails:
        out.append("None.")
    for r in fails:
        detail = r.detail.replace("\n", " ")
        out.append(f"- **{r.backend} / {r.mode}** `{r.case_id}`: {detail}")
    text = "\n".join(out) + "\n"
    if path:
        with open(path, "w") as f:
            f.write(text)
    return text
