"""Property tests (Hypothesis) of the TensorFlow surface, eager (``polyop.tensorflow``): generated
shapes, dtypes and attributes against the NumPy reference and bit for bit against the NumPy
core; bad input raises ``tf.errors.InvalidArgumentError`` naming the op (an unknown keyword
argument: ``TypeError``). Strategies:
tests/_property_strategies.py. (TF tensors are dense: strided NumPy views arrive as copies.)"""

from __future__ import annotations

import tensorflow as tf

import _property_strategies as ps
from polyop.conformance import load_backend

BACKEND = load_backend("tensorflow")


def run(case):
    return BACKEND.run(case, "eager")


# An unknown keyword argument is refused by polyop.tensorflow's Python wrapper (TypeError,
# as Python refuses any unexpected keyword) before TF sees it.
test_valid, test_invalid, test_regression, property_case_count, COUNTER = ps.make_tests(
    "tensorflow", run, (tf.errors.InvalidArgumentError,), kind_errors={"attr": (TypeError,)}
)
