"""Property tests (Hypothesis) of the PyTorch surface, eager (``torch.ops.polyop.*`` loaded by
``polyop.torch.load()``): generated shapes (strided, transposed, broadcast and reversed views
kept as torch views), dtypes and attributes against the NumPy reference and bit for bit against
the NumPy core; bad input raises ``RuntimeError`` naming the op. Strategies:
tests/_property_strategies.py."""

from __future__ import annotations

import _property_strategies as ps
from polyop.conformance import load_backend

BACKEND = load_backend("torch")


def run(case):
    return BACKEND.run(case, "eager")


test_valid, test_invalid, test_regression, property_case_count, COUNTER = ps.make_tests("torch", run, (RuntimeError,))
