"""Independent NumPy reference for the stock ops, written from SPEC.md section 3 (not from the
Rust kernels).

Float ops are computed in float64 from the (exactly representable) inputs and returned as
``(float64_values, output_dtype_name)``, so the harness compares the kernel's rounded result
against the exact value with that dtype's tolerance. Integer results are exact arrays.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf

FLOAT = ("float16", "bfloat16", "float32", "float64")


def _name(a) -> str:
    return np.asarray(a).dtype.name


def _is_float(a) -> bool:
    return _name(a) in FLOAT


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _float_result(values, like) -> tuple[np.ndarray, str]:
    return (np.asarray(values, dtype=np.float64), _name(like))


def negate(x):
    if _is_float(x):
        return [_float_result(-_f64(x), x)]
    return [np.negative(x)]


def add(x, y):
    if _is_float(x):
        return [_float_result(_f64(x) + _f64(y), x)]
    return [np.add(x, y)]


def scale(x, alpha):
    return [_float_result(_f64(x) * float(alpha), x)]


def _relu64(v):
    # max(v, 0) with NaN kept
    return np.where(np.isnan(v) | (v > 0), v, 0.0)


def relu(x):
    if _is_float(x):
        return [_float_result(_relu64(_f64(x)), x)]
    return [np.maximum(x, np.zeros((), dtype=x.dtype))]


relu_ = relu


def add_relu(x, y):
    if _is_float(x):
        return [_float_result(_relu64(_f64(x) + _f64(y)), x)]
    s = np.add(x, y)
    return [np.maximum(s, np.zeros((), dtype=s.dtype))]


def gelu(x, approximate="none"):
    v = _f64(x)
    if approximate == "none":
        out = 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))
    elif approximate == "tanh":
        out = 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    else:
        raise ValueError(f"bad approximate {approximate!r}")
    return [_float_result(out, x)]


def softmax(x, axis=-1):
    v = _f64(x)
    if v.ndim == 0:
        # a scalar is a one-element softmax
        return [_float_result(np.exp(v - v) / 1.0, x)]
    if v.size == 0:
        return [_float_result(v.copy(), x)]
    m = np.max(v, axis=axis, keepdims=True)
    e = np.exp(v - m)
    return [_float_result(e / np.sum(e, axis=axis, keepdims=True), x)]


def rms_norm(x, weight=None, eps=1e-6):
    v = _f64(x)
    if v.ndim == 0:
        v2 = v.reshape(1)
    else:
        v2 = v
    if v2.size == 0:
        return [_float_result(v.copy(), x)]
    ms = np.mean(v2 * v2, axis=-1, keepdims=True)
    out = v2 / np.sqrt(ms + float(eps))
    if weight is not None:
        out = out * _f64(weight)
    return [_float_result(out.reshape(v.shape), x)]


def topk(x, k, axis=-1, largest=True):
    x = np.asarray(x)
    a = np.moveaxis(x, axis, -1)
    n = a.shape[-1]
    rows = a.reshape(int(np.prod(a.shape[:-1], dtype=np.int64)), n)
    is_float = _is_float(x)
    idx = np.zeros((rows.shape[0], k), dtype=np.int64)
    for r in range(rows.shape[0]):
        row = rows[r]
        if is_float:
            vals = [float(v) for v in row.astype(np.float64)]
        else:
            vals = [int(v) for v in row]

        def key(i):
            v = vals[i]
            nan = isinstance(v, float) and math.isnan(v)
            if largest:
                # NaN first (larger than every number), then descending; ties: lower index
                return (0 if nan else 1, 0 if nan else -v, i)
            return (1 if nan else 0, 0 if nan else v, i)

        order = sorted(range(n), key=key)[:k]
        idx[r, :] = order
    out_shape = a.shape[:-1] + (k,)
    idx = idx.reshape(out_shape)
    values = np.take_along_axis(a, idx, axis=-1) if n else np.zeros(out_shape, dtype=x.dtype)
    values = np.moveaxis(values, -1, axis)
    idx = np.moveaxis(idx, -1, axis)
    return [np.ascontiguousarray(values), np.ascontiguousarray(idx)]


def conv2d(input, weight, bias=None, stride=1, padding=0):
    x = _f64(input)
    w = _f64(weight)
    n, c, h, wd = x.shape
    o, c2, kh, kw = w.shape
    assert c == c2
    p = int(padding)
    s = int(stride)
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    oh = (h + 2 * p - kh) // s + 1
    ow = (wd + 2 * p - kw) // s + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i : i + s * (oh - 1) + 1 : s, j : j + s * (ow - 1) + 1 : s]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    if bias is not None:
        out += _f64(bias)[None, :, None, None]
    return [_float_result(out, input)]


def nonzero(x):
    x = np.asarray(x)
    nz = _f64(x) != 0 if _is_float(x) else x != 0  # NaN is non-zero
    return [np.argwhere(nz).astype(np.int64)]


REFERENCES = {
    "negate": negate,
    "add": add,
    "scale": scale,
    "relu": relu,
    "relu_": relu_,
    "add_relu": add_relu,
    "gelu": gelu,
    "softmax": softmax,
    "rms_norm": rms_norm,
    "topk": topk,
    "conv2d": conv2d,
    "nonzero": nonzero,
}


def reference(op: str, inputs: list, attrs: dict):
    """Expected outputs of ``op`` (the harness's reference signature)."""
    if op not in REFERENCES:
        raise KeyError(f"no reference for op {op!r}")
    return REFERENCES[op](*inputs, **attrs)
