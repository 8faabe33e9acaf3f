"""Independent NumPy reference for the stock ops, written from SPEC.md section 3 (not from the
Rust kernels).

Float ops are computed in float64 from the (exactly representable) inputs and returned as
``(float64_values, output_dtype_name)``, so the harness compares the kernel's rounded result
against the exact value with that dtype's tolerance. Integer results are exact arrays.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erfc

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
    # Written without cancellation, so the float64 reference is accurate where gelu is tiny
    # (x << 0): 1 + erf(x / sqrt 2) = erfc(-x / sqrt 2) and 1 + tanh(u) = 2 / (1 + e^(-2u)).
    if approximate == "none":
        out = 0.5 * v * erfc(-v / math.sqrt(2.0))
    elif approximate == "tanh":
        u = math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)
        with np.errstate(over="ignore"):
            out = v / (1.0 + np.exp(-2.0 * u))
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
    # x - max and exp in extended precision (x86-64's 80-bit long double): in float64 the
    # rounding of x - max (half an ulp of |x - max|) becomes |x - max|/2 ulps of error after
    # exp, so a float64 reference of a row spread over 100 would be ~50 ulps off itself.
    ld = v.astype(np.longdouble)
    m = np.max(ld, axis=axis, keepdims=True)
    e = np.exp(ld - m)
    return [_float_result((e / np.sum(e, axis=axis, keepdims=True)).astype(np.float64), x)]


def _norm_axes(v, axis):
    """The dims rms_norm reduces: every dim from ``axis`` on (a rank-0 x is one element)."""
    a = range(v.ndim)[int(axis)]  # Python indexing: negative from the end, IndexError if out of range
    return tuple(range(a, v.ndim))


def rms_norm(x, weight=None, eps=1e-6, axis=-1):
    v = _f64(x)
    v2 = v.reshape(1) if v.ndim == 0 else v
    if v2.size == 0:
        return [_float_result(v.copy(), x)]
    ms = np.mean(v2 * v2, axis=_norm_axes(v2, axis), keepdims=True)
    out = v2 / np.sqrt(ms + float(eps))
    if weight is not None:
        out = out * _f64(weight)  # weight has shape x.shape[axis:]: broadcasts over the leading dims
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


def _ints(v) -> list[int]:
    return [int(v)] if np.ndim(v) == 0 else [int(a) for a in v]


def _conv_geometry(x, w, stride, padding, dilation, groups):
    """SPEC conv2d's attributes as plain numbers: strides (sh, sw), dilations (dh, dw), pads
    (top, left, bottom, right), groups, and the output size (oh, ow)."""
    st, dl, p = _ints(stride), _ints(dilation), _ints(padding)
    sh, sw = st * 2 if len(st) == 1 else st
    dh, dw = dl * 2 if len(dl) == 1 else dl
    # one int: every side; two: [height, width] (torch); four: [top, left, bottom, right] (ONNX pads)
    t, l, b, r = p * 4 if len(p) == 1 else [p[0], p[1], p[0], p[1]] if len(p) == 2 else p
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    assert c == cg * groups and o % groups == 0
    oh = (h + t + b - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + l + r - (dw * (kw - 1) + 1)) // sw + 1
    return (sh, sw), (dh, dw), (t, l, b, r), int(groups), (oh, ow)


def _taps(kh, kw, sh, sw, dh, dw, oh, ow):
    """(i, j, window): kernel tap (i, j) and the padded-input window it multiplies, every
    output position's input sample for that tap."""
    for i in range(kh):
        for j in range(kw):
            yield i, j, (slice(None), slice(None), slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
                         slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    # out[n, g*og + o, y, x] = b + sum_{c < C/groups, i, j}
    #     x_pad[n, g*(C/groups) + c, sh y + dh i, sw x + dw j] w[g*og + o, c, i, j]
    x = _f64(input)
    w = _f64(weight)
    (sh, sw), (dh, dw), (t, l, b, r), groups, (oh, ow) = _conv_geometry(x, w, stride, padding, dilation, groups)
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    og = o // groups
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
    out = np.zeros((n, o, oh, ow))
    mag = np.zeros((n, o, oh, ow))  # sum of |terms|: the scale of a dot product's error
    for gi in range(groups):
        xs, oc = xp[:, gi * cg:(gi + 1) * cg], slice(gi * og, (gi + 1) * og)
        for i, j, win in _taps(kh, kw, sh, sw, dh, dw, oh, ow):
            patch = xs[win]
            out[:, oc] += np.einsum("nchw,oc->nohw", patch, w[oc, :, i, j])
            mag[:, oc] += np.einsum("nchw,oc->nohw", np.abs(patch), np.abs(w[oc, :, i, j]))
    if bias is not None:
        out += _f64(bias)[None, :, None, None]
        mag += np.abs(_f64(bias))[None, :, None, None]
    return [(out, _name(input), mag)]


def nonzero(x):
    x = np.asarray(x)
    nz = _f64(x) != 0 if _is_float(x) else x != 0  # NaN is non-zero
    return [np.argwhere(nz).astype(np.int64)]


# ---------------------------------------------------------------------------------------
# backward ops: vector-Jacobian products derived by hand from the forward definitions above
# (calculus, in float64), each checked against float64 central differences of the forward
# reference in conformance/test_harness.py. Outputs that sum terms of either sign also give
# the sum of |terms| as the scale of their error bound (see polyop.conformance.tolerances).


def _float_scaled(values, like, scale):
    return (np.asarray(values, dtype=np.float64), _name(like), np.asarray(scale, dtype=np.float64))


def _unbroadcast(g, shape):
    """Sum ``g`` (of the broadcast output shape) down to ``shape``: d(out)/d(in) of NumPy
    broadcasting is 1 for every output element an input element was copied to."""
    shape = tuple(shape)
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape) if axes else g.reshape(shape)


def _sum_grads(g, mask, x, y):
    """d/dx, d/dy of sum(g * f(x + y)) where f'(x + y) = mask (1 for add)."""
    x, y = np.asarray(x), np.asarray(y)
    if not _is_float(x):
        gi = np.asarray(g).astype(np.int64) * mask
        return [_unbroadcast(gi, x.shape).astype(x.dtype), _unbroadcast(gi, y.shape).astype(y.dtype)]
    gm = _f64(g) * mask
    return [
        _float_scaled(_unbroadcast(gm, x.shape), x, _unbroadcast(np.abs(gm), x.shape)),
        _float_scaled(_unbroadcast(gm, y.shape), y, _unbroadcast(np.abs(gm), y.shape)),
    ]


def add_backward(grad, x, y):
    return _sum_grads(grad, 1, x, y)


def add_relu_backward(grad, x, y):
    # relu'(s) = 1 for s > 0, else 0 (the subgradient at 0 is 0, as for relu_backward)
    s = _f64(x) + _f64(y) if _is_float(x) else np.add(np.asarray(x, np.int64), np.asarray(y, np.int64))
    return _sum_grads(grad, (s > 0).astype(np.int64), x, y)


def relu_backward(grad, x):
    # d relu(x)/dx = 1 where x > 0, else 0 (0 at the kink, and NaN passes no gradient)
    if _is_float(x):
        return [_float_result(np.where(_f64(x) > 0, _f64(grad), 0.0), x)]
    return [np.where(np.asarray(x) > 0, grad, np.zeros((), dtype=np.asarray(grad).dtype))]


def gelu_backward(grad, x, approximate="none"):
    v, g = _f64(x), _f64(grad)
    if approximate == "none":
        # d/dx x Phi(x) = Phi(x) + x phi(x), Phi the normal CDF, phi its density
        cdf = 0.5 * erfc(-v / math.sqrt(2.0))
        pdf = np.exp(-0.5 * v * v) / math.sqrt(2.0 * math.pi)
        a, b = cdf, v * pdf
    elif approximate == "tanh":
        # d/dx 0.5 x (1 + tanh(u)), u = k (x + c x^3): 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'.
        # With s = (1 + tanh u) / 2 = 1 / (1 + e^(-2u)): 1 - tanh^2 u = 4 s (1 - s), and
        # s (1 - s) = e / (1 + e)^2 with e = e^(-2|u|) (no cancellation for either sign of u).
        k, c = math.sqrt(2.0 / math.pi), 0.044715
        u = k * (v + c * v**3)
        e = np.exp(-2.0 * np.abs(u))
        s = np.where(u >= 0, 1.0, e) / (1.0 + e)
        a, b = s, 2.0 * v * (e / (1.0 + e) ** 2) * k * (1.0 + 3.0 * c * v * v)
    else:
        raise ValueError(f"bad approximate {approximate!r}")
    return [_float_scaled(g * (a + b), x, np.abs(g) * (np.abs(a) + np.abs(b)))]


def softmax_backward(grad, y, axis=-1):
    # y = softmax(x): dy_i/dx_j = y_i (delta_ij - y_j), so dx = y * (g - sum(g * y))
    g, yv = _f64(grad), _f64(y)
    if yv.ndim == 0:
        return [_float_result(np.zeros_like(yv), y)]
    if yv.size == 0:
        return [_float_result(yv.copy(), y)]
    s = np.sum(g * yv, axis=axis, keepdims=True)
    sa = np.sum(np.abs(g * yv), axis=axis, keepdims=True)
    return [_float_scaled(yv * (g - s), y, np.abs(yv) * (np.abs(g) + sa))]


def rms_norm_backward(grad, x, weight=None, eps=1e-6, axis=-1):
    # y_j = w_j x_j / r, r = sqrt(mean_k x_k^2 + eps) over the n elements of x.shape[axis:];
    # dr/dx_k = x_k / (n r), so dL/dx_k = w_k g_k / r - x_k / (n r^3) sum_j w_j g_j x_j and
    # dL/dw_j = sum over rows of g_j x_j / r (computed whether or not weight was given).
    v, g = _f64(x), _f64(grad)
    v2, g2 = (v.reshape(1), g.reshape(1)) if v.ndim == 0 else (v, g)
    wshape = v2.shape[_norm_axes(v2, axis)[0]:]
    n = int(np.prod(wshape))
    rows = v2.reshape(-1, n) if n else v2.reshape(0, 0)
    grows = g2.reshape(rows.shape)
    w = np.ones(n) if weight is None else _f64(weight).reshape(n)
    if v2.size == 0:
        return [_float_result(v.copy(), x), _float_result(np.zeros(wshape), x)]
    r = np.sqrt(np.mean(rows * rows, axis=-1, keepdims=True) + float(eps))
    wg = w * grows
    dot = np.sum(wg * rows, axis=-1, keepdims=True)
    dot_abs = np.sum(np.abs(wg * rows), axis=-1, keepdims=True)
    gx = wg / r - rows * dot / (n * r**3)
    gx_scale = np.abs(wg) / r + np.abs(rows) * dot_abs / (n * r**3)
    gw_terms = grows * rows / r
    return [
        _float_scaled(gx.reshape(v.shape), x, gx_scale.reshape(v.shape)),
        _float_scaled(gw_terms.sum(axis=0).reshape(wshape), x, np.abs(gw_terms).sum(axis=0).reshape(wshape)),
    ]


def topk_backward(grad_values, x, indices, axis=-1):
    # values = take_along_axis(x, indices): each selected element gets its grad, others 0
    x = np.asarray(x)
    g = np.asarray(grad_values)
    out = np.zeros(x.shape, dtype=np.float64 if _is_float(x) else np.int64)
    if x.ndim == 0:
        if g.size:
            out = out + (_f64(g) if _is_float(x) else g.astype(np.int64)).reshape(())
    else:
        gm = _f64(g) if _is_float(x) else g.astype(np.int64)
        np.put_along_axis(out, np.asarray(indices), gm, axis=axis)  # distinct indices per lane
    return [_float_result(out, x)] if _is_float(x) else [out.astype(x.dtype)]


def conv2d_backward(grad, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    # out[n,o,y,x] = b[o] + sum_{c,i,j} x_pad[n, g(o) C/groups + c, sh y + dh i, sw x + dw j] w[o,c,i,j]
    # (g(o) = o's group), so dL/dx_pad[n, g(o) C/groups + c, sh y + dh i, sw x + dw j] +=
    # g[n,o,y,x] w[o,c,i,j] (then the padding cropped), dL/dw[o,c,i,j] = sum_{n,y,x} g[n,o,y,x]
    # x_pad[...same...], dL/db[o] = sum g[n,o,:,:]
    g, x, w = _f64(grad), _f64(input), _f64(weight)
    (sh, sw), (dh, dw), (t, l, b, r), groups, (oh, ow) = _conv_geometry(x, w, stride, padding, dilation, groups)
    h, wd = x.shape[2], x.shape[3]
    o, cg, kh, kw = w.shape
    og = o // groups
    assert g.shape[2:] == (oh, ow)
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
    gxp, gxp_abs = np.zeros_like(xp), np.zeros_like(xp)
    gw, gw_abs = np.zeros_like(w), np.zeros_like(w)
    for gi in range(groups):
        ic, oc = slice(gi * cg, (gi + 1) * cg), slice(gi * og, (gi + 1) * og)
        go = g[:, oc]
        for i, j, win in _taps(kh, kw, sh, sw, dh, dw, oh, ow):
            xwin = xp[:, ic][win]
            gxp[:, ic][win] += np.einsum("nohw,oc->nchw", go, w[oc, :, i, j])
            gxp_abs[:, ic][win] += np.einsum("nohw,oc->nchw", np.abs(go), np.abs(w[oc, :, i, j]))
            gw[oc, :, i, j] = np.einsum("nohw,nchw->oc", go, xwin)
            gw_abs[oc, :, i, j] = np.einsum("nohw,nchw->oc", np.abs(go), np.abs(xwin))
    crop = (slice(None), slice(None), slice(t, t + h), slice(l, l + wd))
    return [
        _float_scaled(gxp[crop], input, gxp_abs[crop]),
        _float_scaled(gw, input, gw_abs),
        _float_scaled(g.sum(axis=(0, 2, 3)), input, np.abs(g).sum(axis=(0, 2, 3))),
    ]


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
    "add_backward": add_backward,
    "add_relu_backward": add_relu_backward,
    "relu_backward": relu_backward,
    "gelu_backward": gelu_backward,
    "softmax_backward": softmax_backward,
    "rms_norm_backward": rms_norm_backward,
    "topk_backward": topk_backward,
    "conv2d_backward": conv2d_backward,
}


def reference(op: str, inputs: list, attrs: dict):
    """Expected outputs of ``op`` (the harness's reference signature)."""
    if op not in REFERENCES:
        raise KeyError(f"no reference for op {op!r}")
    return REFERENCES[op](*inputs, **attrs)
