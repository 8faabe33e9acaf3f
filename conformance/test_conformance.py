"""pytest entry for the conformance suite: one test per discovered backend, each backend run
in its own subprocess (frameworks never share a process). A backend whose module fails to
import fails here with the reason; it is never skipped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polyop.conformance import available_backends, counts, run_isolated

HERE = Path(__file__).resolve().parent
CASES = f"{HERE / 'cases.py'}:cases"
REFERENCE = f"{HERE / 'reference.py'}:reference"

#: Every backend must actually pass at least this many (case, mode) runs: a backend that
#: marks everything unsupported does not count as conformant.
MIN_PASSED = 200

#: The backends SPEC.md requires, run whether or not their module is found (a missing one
#: fails in test_backend with the worker's import error), plus any other discovered backend.
EXPECTED_BACKENDS = ("native", "torch", "tensorflow", "onnxruntime", "xla")
BACKENDS = list(EXPECTED_BACKENDS) + sorted(set(available_backends()) - set(EXPECTED_BACKENDS))


def _stock_cases():
    sys.path.insert(0, str(HERE))
    import cases

    return cases.cases()


def test_every_op_and_backward_op_has_cases_in_every_dtype():
    # Every registered op, backward ops included, is checked against the independent
    # reference in every dtype it supports (not only float64 through gradient checks).
    import polyop

    stock = _stock_cases()
    covered = {(c.op, c.dtype) for c in stock if not c.expect_error}
    missing = []
    assert any(o["flags"]["backward_only"] for o in polyop.ops())
    for info in polyop.ops():  # forward and backward ops
        for dt in info["dtypes"]:
            if (info["name"], dt) not in covered:
                missing.append(f"{info['name']}/{dt}")
    assert not missing, f"ops without a conformance case: {missing}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend(backend):
    # XLA's worker takes about 18 minutes of a core (its symbolic mode exports and runs every
    # case at three sizes); beside another job on a 2-core machine it ran past 30 minutes
    (run,) = run_isolated([backend], CASES, REFERENCE, timeout=3300)
    c = counts(run.results)
    fails = [r for r in run.results if r.status == "fail"]
    report = "\n".join(f"  {r.mode} {r.case_id}: {r.detail[:400]}" for r in fails[:40])
    assert not fails, f"{backend}: {len(fails)} failure(s) ({c}):\n{report}"
    assert c["pass"] >= MIN_PASSED, f"{backend} passed only {c['pass']} runs ({c})"
    # every case was run in every mode (none silently dropped by the worker)
    ids = {cs.id for cs in _stock_cases()}
    for mode in run.modes:
        seen = {r.case_id for r in run.results if r.mode == mode}
        assert seen == ids, f"{backend} {mode}: {len(ids - seen)} case(s) never reported: {sorted(ids - seen)[:10]}"
    # the symbolic mode (every framework backend) reported every case that is not an error case
    if backend != "native":
        want = {cs.id for cs in _stock_cases() if not cs.expect_error}
        seen = {r.case_id for r in run.results if r.mode == "symbolic"}
        assert seen == want, f"{backend} symbolic: {len(want - seen)} case(s) never reported"
        assert sum(r.status == "pass" for r in run.results if r.mode == "symbolic") >= MIN_PASSED
