"""pytest entry for the conformance suite: one test per discovered backend, each backend run
in its own subprocess (frameworks never share a process). A backend whose module fails to
import fails here with the reason; it is never skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyop.conformance import available_backends, counts, run_isolated

HERE = Path(__file__).resolve().parent
CASES = f"{HERE / 'cases.py'}:cases"
REFERENCE = f"{HERE / 'reference.py'}:reference"

#: Every backend must actually pass at least this many (case, mode) runs: a backend that
#: marks everything unsupported does not count as conformant.
MIN_PASSED = 200

EXPECTED_BACKENDS = ("native", "torch", "tensorflow", "onnxruntime", "xla")


def test_all_backends_present():
    missing = [b for b in EXPECTED_BACKENDS if b not in available_backends()]
    assert not missing, f"conformance backends missing: {missing}"


@pytest.mark.parametrize("backend", available_backends())
def test_backend(backend):
    (run,) = run_isolated([backend], CASES, REFERENCE, timeout=1800)
    c = counts(run.results)
    fails = [r for r in run.results if r.status == "fail"]
    report = "\n".join(f"  {r.mode} {r.case_id}: {r.detail[:400]}" for r in fails[:40])
    assert not fails, f"{backend}: {len(fails)} failure(s) ({c}):\n{report}"
    assert c["pass"] >= MIN_PASSED, f"{backend} passed only {c['pass']} runs ({c})"
