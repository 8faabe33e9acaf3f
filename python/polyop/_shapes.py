"""Symbolic shapes, the framework-neutral half: kernel-core's shape model on the Python side.

A framework's symbolic sizes (torch ``SymInt``, JAX shape-polymorphic dims) go to
``infer_symbolic`` as symbol names; the output dims come back in the wire form (an int, None
for unknown, a symbol name, or ``[op, a, b]``) and are evaluated here with the framework's
own arithmetic, so a torch output dim is a ``SymInt`` expression of the input ``SymInt``s and
a JAX one a dim expression: nothing is specialized to a constant. The requirements between
symbolic dims (``constraints``) are handed to the framework's checker. See docs/shapes.md.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterable

_BINARY = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "floordiv": operator.floordiv,
}


def symbolic_specs(specs: Iterable[Any], is_symbolic: Callable[[Any], bool]):
    """``(shape, dtype)`` specs whose dims may be framework symbols, as ``infer`` takes them
    (each symbolic dim named by ``str(dim)``), and the environment from names back to dims."""
    env: dict[str, Any] = {}
    out = []
    for s in specs:
        if s is None:
            out.append(None)
            continue
        shape, dtype = s
        if shape is None:
            out.append((None, dtype))
            continue
        dims = []
        for d in shape:
            if d is None or not is_symbolic(d):
                dims.append(None if d is None else int(d))
            else:
                name = str(d)
                env[name] = d
                dims.append(name)
        out.append((tuple(dims), dtype))
    return out, env


class Evaluator:
    """Evaluates wire-form dims with a framework's arithmetic: ``env`` maps symbol names to
    the framework's dims; ``max_`` and ``broadcast`` are the framework's own (torch
    ``sym_max``, JAX ``max_dim``); ``unknown()`` gives a size for a dim inference left
    unknown (an unbacked symbol for data-dependent outputs) or raises."""

    def __init__(self, env, max_, broadcast, unknown):
        self.env, self.max, self.broadcast, self.unknown = env, max_, broadcast, unknown

    def dim(self, w):
        if w is None:
            return self.unknown()
        if isinstance(w, bool):
            raise TypeError(f"polyop: bad dim {w!r}")
        if isinstance(w, int):
            return w
        if isinstance(w, str):
            return self.env[w]
        op, a, b = w
        a, b = self.dim(a), self.dim(b)
        if op == "max":
            return self.max(a, b)
        if op == "broadcast":
            return self.broadcast(a, b)
        return _BINARY[op](a, b)

    def shape(self, wire_shape):
        return None if wire_shape is None else tuple(self.dim(d) for d in wire_shape)


def check_constraints(constraints, ev: Evaluator, check: Callable[[Any, str], None]) -> None:
    """Hand each requirement (``[relation, lhs, rhs, message]``) to the framework's ``check``
    as a (possibly symbolic) boolean and the op's message."""
    for rel, lhs, rhs, msg in constraints:
        if lhs is None or rhs is None:
            continue
        a, b = ev.dim(lhs), ev.dim(rhs)
        check(a == b if rel == "eq" else a <= b, msg)


def _paren(t):
    return t if isinstance(t, int) or t.isidentifier() or t.startswith(("max(", "(")) else f"({t})"


def onnx_dim(w):
    """A wire-form dim as ONNX writes a dim: an int (``dim_value``), a string (``dim_param``:
    a symbol, or the expression's text such as ``(H - 1) // 2 + 1``) or None (unknown).
    Broadcasting that ONNX cannot name is unknown, as in ONNX's own shape inference."""
    if w is None or isinstance(w, (int, str)):
        return w
    op, a, b = w
    a, b = onnx_dim(a), onnx_dim(b)
    if op == "broadcast":
        for x, y in ((a, b), (b, a)):
            if x == 1:
                return y
            if isinstance(x, int):
                return x  # the other side is 1 or equal, or the model is invalid
        return a if a == b else None
    if a is None or b is None:
        return None
    if op == "max":
        return f"max({a}, {b})"
    sym = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//"}[op]
    if op == "add" and isinstance(b, int) and b < 0:
        return f"{a} - {-b}"
    if op in ("add", "sub"):
        return f"{a} {sym} {_paren(b) if op == 'sub' else b}"
    return f"{_paren(a)}{sym if op == 'mul' else ' // '}{_paren(b)}"
