"""polyop's conformance harness: one set of cases, run in every framework, checked against
one independent reference and, bit for bit, against the NumPy core.

For an op author (stock or out-of-tree)::

    from polyop.conformance import Case, run, write_matrix

    cases = [Case("my_op", [x], {"alpha": 2.0}), Case("my_op", [bad], expect_error="dtype")]
    def reference(op, inputs, attrs): ...          # or {"my_op": fn(*inputs, **attrs)}
    results = run(cases, reference, backends=["torch", "onnxruntime"])
    print(write_matrix(results))

``backends`` are names of modules in ``polyop/conformance/backends/`` (see
``available_backends()``) or :class:`Backend` instances. For process isolation (one framework
per process) use :func:`run_isolated`, which is what ``conformance/run.py`` does.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from .harness import (
    DEFAULT_TOLERANCES,
    FLOAT_DTYPES,
    GRAD,
    NOT_GROWABLE,
    SYMBOLIC,
    Backend,
    BrokenBackend,
    Case,
    Result,
    compare_bitwise,
    compare_to_reference,
    counts,
    run_cases,
    summary_line,
    write_matrix,
)
from .isolated import run_isolated

__all__ = [
    "Case",
    "Backend",
    "BrokenBackend",
    "Result",
    "DEFAULT_TOLERANCES",
    "FLOAT_DTYPES",
    "GRAD",
    "SYMBOLIC",
    "NOT_GROWABLE",
    "available_backends",
    "load_backend",
    "run",
    "run_cases",
    "run_isolated",
    "compare_to_reference",
    "compare_bitwise",
    "counts",
    "summary_line",
    "write_matrix",
]


def available_backends() -> list[str]:
    """Backend names discovered in ``polyop/conformance/backends/``."""
    from .backends import available

    return available()


def load_backend(name: str, library: str | None = None) -> Backend:
    """Load one backend by name (a failing import gives a :class:`BrokenBackend`);
    ``library``: an op author's library for that framework instead of the stock one."""
    from .backends import load

    return load(name, library)


def run(
    cases: Sequence[Case],
    reference: Callable | Mapping[str, Callable],
    backends: Sequence[str | Backend] | None = None,
    baseline: str | Backend | None = "auto",
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run ``cases`` in-process on ``backends`` (default: every discovered backend).

    ``baseline``: the backend whose outputs every other must match bit for bit. ``"auto"``:
    ``native`` when it is among ``backends``, else the first backend; ``None``: no bitwise
    check.
    """
    names = backends if backends is not None else available_backends()
    bs = [load_backend(b) if isinstance(b, str) else b for b in names]
    base: Backend | None
    if baseline == "auto":
        base = next((b for b in bs if b.name == "native"), bs[0] if bs else None)
    elif isinstance(baseline, str):
        base = next((b for b in bs if b.name == baseline), None) or load_backend(baseline)
    else:
        base = baseline
    if isinstance(base, BrokenBackend):
        base = None
    return run_cases(cases, reference, bs, baseline=base, progress=progress)
