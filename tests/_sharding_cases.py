"""Inputs for every stock op in the sharding tests (tests/test_distributed_*.py): NumPy only,
so every framework's test uses the same ones. The first input's dim 0 is the batch (8 rows,
divisible by 2 and 4 devices)."""

from __future__ import annotations

import numpy as np


def cases(seed: int = 0) -> dict[str, tuple[list, dict]]:
    rng = np.random.default_rng(seed)

    def arr(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    x, row, g = arr(8, 16), arr(16), arr(8, 16)
    img, ker, bias = arr(8, 3, 6, 6), arr(4, 3, 3, 3) * 0.3, arr(4)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    y = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    idx = np.argsort(-x, axis=1, kind="stable")[:, :3].astype(np.int64)
    return {
        "negate": ([x], {}),
        "add": ([x, row], {}),
        "add_backward": ([g, x, row], {}),
        "scale": ([x], {"alpha": 1.5}),
        "relu": ([x], {}),
        "relu_backward": ([g, x], {}),
        "add_relu": ([x, row], {}),
        "add_relu_backward": ([g, x, row], {}),
        "gelu": ([x], {"approximate": "tanh"}),
        "gelu_backward": ([g, x], {}),
        "softmax": ([x], {"axis": -1}),
        "softmax_backward": ([g, y], {"axis": 1}),
        "rms_norm": ([x, row + 2], {}),
        "rms_norm_backward": ([g, x, row + 2], {}),
        "topk": ([x], {"k": 3}),
        "topk_backward": ([arr(8, 3), x, idx], {}),
        "conv2d": ([img, ker, bias], {"padding": 1}),
        "conv2d_backward": ([arr(8, 4, 6, 6), img, ker, bias], {"padding": 1}),
    }
