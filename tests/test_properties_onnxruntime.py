"""Property tests (Hypothesis) of the ONNX Runtime surface (``polyop.onnxruntime.run``: a
one-node ``ai.polyop`` model in an ``InferenceSession``): generated shapes, dtypes and
attributes against the NumPy reference and bit for bit against the NumPy core; bad input raises
onnxruntime's ``Fail`` / ``InvalidArgument`` naming the op. Strategies:
tests/_property_strategies.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, InvalidGraph, RuntimeException

import _property_strategies as ps
import polyop
import polyop.onnxruntime as pox


def run(case):
    out = pox.run(case.op, *case.inputs, **case.attrs)
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


def names(op):
    # ONNX's model checker refuses a dtype outside the registered type constraints before the
    # kernel is created; it names the node's op type: "... of operator (Softmax) ..."
    return [f"operator ({polyop.op_info(op)['onnx_name']})"]


# Errors: Fail / InvalidArgument from compute, RuntimeException from kernel creation (bad
# attributes, unsupported dtypes), InvalidGraph from ONNX's checker (a dtype outside the op's
# type constraints); an unknown keyword argument is refused by polyop.onnxruntime.run
# (TypeError) before a model is built.
test_valid, test_invalid, test_regression, property_case_count, COUNTER = ps.make_tests(
    "onnxruntime",
    run,
    (Fail, InvalidArgument, RuntimeException, InvalidGraph),
    kind_errors={"attr": (TypeError,)},
    names=names,
)


# Found by the gelu property test: a string attribute ending in NUL used to be accepted as the
# value without it ('none\x00' ran as 'none'); every NUL is now part of the value.
@pytest.mark.parametrize("value", ["none\x00", "tanh\x00", "none\x00\x00"])
def test_trailing_nul_in_string_attribute(value):
    case = ps.Case("gelu", [np.ones(2, np.float32)], {"approximate": value})
    ps.check_invalid(run, (RuntimeException, Fail, InvalidArgument), case, "approximate", ps.AFTER)
