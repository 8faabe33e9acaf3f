"""The torch adapter binds attributes once per distinct attribute set and caches shape
inference per input shapes (adapters/torch/src/call.rs `OpState`). Calls that alternate
attribute values, shapes and dtypes on one op must each get their own result; checked against
torch's built-ins."""

from __future__ import annotations

import pytest
import torch

import polyop

torch.ops.load_library(polyop.library_path("torch"))
P = torch.ops.polyop


def test_alternating_attributes_and_shapes():
    x = torch.randn(3, 5)
    for _ in range(3):
        for alpha in (2.0, 3.0, 0.0, -0.0, 2.0):
            got = P.scale(x, alpha=alpha)
            want = torch.mul(x, alpha)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            # -0.0 and 0.0 are different attribute values: the sign of zero shows.
            assert torch.equal(torch.signbit(got), torch.signbit(want))
        for k, axis, largest in ((1, -1, True), (2, 0, True), (2, 1, False), (3, -1, True)):
            v, i = P.topk(x, k=k, axis=axis, largest=largest)
            wv, wi = torch.topk(x, k, axis, largest)
            torch.testing.assert_close(v, wv, rtol=0, atol=0)
            assert torch.equal(i, wi)
        for shape in ((4,), (2, 3), (1, 8), (4,)):
            y = torch.randn(shape)
            torch.testing.assert_close(P.softmax(y, axis=-1), torch.softmax(y, -1))
        for dtype in (torch.float32, torch.float64, torch.float32):
            y = x.to(dtype)
            got = P.gelu(y, approximate="tanh")
            assert got.dtype == dtype
            torch.testing.assert_close(got, torch.nn.functional.gelu(y, approximate="tanh"))
            torch.testing.assert_close(P.gelu(y, approximate="none"), torch.nn.functional.gelu(y))


def test_errors_are_not_cached_and_the_next_call_works():
    x = torch.randn(2, 4)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="polyop.topk"):
            P.topk(x, k=9, axis=-1, largest=True)
        v, _ = P.topk(x, k=4, axis=-1, largest=True)
        torch.testing.assert_close(v, torch.topk(x, 4, -1, True).values)
        with pytest.raises(RuntimeError, match="polyop.gelu"):
            P.gelu(x, approximate="nope")
        torch.testing.assert_close(P.gelu(x, approximate="none"), torch.nn.functional.gelu(x))


def test_inplace_and_optional_inputs_through_the_cache():
    for _ in range(2):
        x = torch.randn(6)
        want = torch.relu(x)
        r = P.relu_(x)
        assert r.data_ptr() == x.data_ptr()
        torch.testing.assert_close(x, want, rtol=0, atol=0)
        x = torch.randn(2, 8)
        w = torch.randn(8)
        for weight in (None, w, None):
            got = P.rms_norm(x, weight, eps=1e-6)
            want = torch.nn.functional.rms_norm(x, (8,), weight, 1e-6)
            torch.testing.assert_close(got, want)
