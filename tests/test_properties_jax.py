"""Property tests (Hypothesis) of the JAX / XLA surface (``polyop.jax.call``, eager, over
``libpolyop_xla.so``'s FFI handlers): generated shapes, dtypes and attributes against the NumPy
reference and bit for bit against the NumPy core; bad input raises JAX's runtime error or the
trace-time ``ValueError`` / ``TypeError`` naming the op. Strategies:
tests/_property_strategies.py."""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pytest  # noqa: E402

import _property_strategies as ps  # noqa: E402
import polyop  # noqa: E402
import polyop.jax as pj  # noqa: E402


def run(case):
    # polyop.jax.call wants every operand, an absent optional one as None (polyop.run and
    # the other surfaces also take it left out)
    n = polyop.op_info(case.op)["num_inputs"]
    inputs = list(case.inputs) + [None] * max(0, n - len(case.inputs))
    args = [None if a is None else jnp.asarray(a) for a in inputs]
    out = pj.call(case.op, *args, **case.attrs)
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


test_valid, test_invalid, test_regression, property_case_count, COUNTER = ps.make_tests(
    "jax", run, (jax.errors.JaxRuntimeError, ValueError, TypeError)
)


# Found by the scale property test: JAX caches a primitive's executable by its parameters
# with ==, and 0.0 == -0.0, so alpha=-0.0 after alpha=0.0 returned +0.0 until polyop.jax
# passed float attributes as bit-compared values (_FfiFloat in polyop/jax.py).
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_negative_zero_attribute(dtype):
    x = np.array([0.25, 2.0], ps.NP_DTYPES[dtype])
    ps.check_valid(run, ps.Case("scale", [x], {"alpha": 0.0}))
    ps.check_valid(run, ps.Case("scale", [x], {"alpha": -0.0}))
    # and under jax.jit, one traced function per alpha in the same process
    for alpha in (0.0, -0.0, 0.0):
        got = np.asarray(jax.jit(lambda v, a=alpha: pj.scale(v, alpha=a))(jnp.asarray(x)))
        np.testing.assert_array_equal(np.signbit(got), np.signbit(x * np.asarray(alpha, x.dtype)))
