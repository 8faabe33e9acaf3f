"""polyop ops as MindSpore functions, backed by the AOT Custom ops of ``libpolyop_mindspore.so``.

    import polyop.mindspore as pms
    y = pms.rms_norm(x, eps=1e-6)
    values, indices = pms.topk(x, k=2)

Every op of ``polyop.ops()`` (except torch-only in-place ops) becomes a function here,
``pms.<name>(*tensors, **attrs)`` (attributes may also follow the tensors positionally, in
(attributes by name), generated from its metadata; nothing in this file knows a particular op:

- **primitives**: one ``mindspore.ops.Custom(f"{lib}:polyop_<name>", func_type="aot")`` per op,
  attribute set and number of tensors given, cached; its ``CustomRegOp`` declares the inputs
  and outputs (any dtype) for CPU. The library's ``polyop_<name>InferShape`` /
  ``InferType`` (kernel-core's shape inference) give output shapes and dtypes, so PyNative
  mode, ``mindspore.jit`` and ``GRAPH_MODE`` cells with dynamic dims (``Cell.set_inputs``
  with ``None`` dims) work, and bad input raises at inference (a ``RuntimeError`` whose
  message carries polyop's ``polyop.<name>: ...``), before any kernel runs.
- **attributes**: primitive attributes by the schema's names; floats as the ``repr`` of the
  Python float (MindSpore would store a float attribute as float32), the number of tensors
  given as ``polyop_num_inputs`` (trailing optional tensors may be left out).
- **gradients**: each primitive's ``bprop`` calls the op's backward op (itself an exported
  op) as ``polyop.op_info(name)["backward"]`` wires it: incoming gradients, forward inputs
  and outputs, the forward call's attributes. Inputs without a gradient get zeros.
- ``nonzero`` (a data-dependent output shape) runs in PyNative mode through polyop's core
  (the same kernel, on the tensor's host data); inside a graph (``mindspore.jit``,
  ``GRAPH_MODE``) the library's shape inference refuses it with a clear error.

Importing this module without MindSpore installed raises one ``ImportError`` naming the pip
package (:func:`polyop._library.require_framework`).
"""

from __future__ import annotations

import threading

from ._library import require_framework

require_framework("mindspore")

import mindspore as ms  # noqa: E402
from mindspore import ops  # noqa: E402
from mindspore.ops import CustomRegOp, DataType  # noqa: E402
from mindspore.ops._primitive_cache import _get_cache_prim  # noqa: E402
from mindspore.ops.primitive import constexpr  # noqa: E402

import polyop  # noqa: E402

from ._library import Loaded, backward_args, grads_by_input  # noqa: E402

__all__ = ["load", "call", "op_names", "NUM_INPUTS"]

#: The primitive attribute with the number of tensors given (see the library's shape.rs).
NUM_INPUTS = "polyop_num_inputs"

_LOCK = threading.Lock()
_LIB: Loaded | None = None
_INFOS: dict[str, dict] = {o["name"]: o for o in polyop.ops()}


def op_names() -> list[str]:
    """Ops available under MindSpore (every registered op except in-place ones)."""
    return [n for n, o in _INFOS.items() if not o["flags"]["inplace"]]


def load(path: str | None = None) -> Loaded:
    """The stock library for MindSpore as a :class:`polyop._library.Loaded` (one attribute per
    op: the functions of this module; ``handle``: op name -> ``"<path>:polyop_<name>"``, the
    ``func`` of its Custom primitives). MindSpore opens the library itself, per primitive."""
    global _LIB
    with _LOCK:
        if _LIB is None:
            lib = path or polyop.library_path("mindspore")
            funcs = {n: f"{lib}:polyop_{n}" for n in op_names()}
            _LIB = Loaded("mindspore", lib, "polyop_", funcs, {n: globals()[n] for n in op_names()},
                          call=call)
        return _LIB


def _attr_value(v):
    if isinstance(v, float):
        return repr(v)  # exact: MindSpore keeps float attributes as float32
    if isinstance(v, (list, tuple)):
        return tuple(v)
    return v


class _Op(ops.Custom):
    """The Custom primitive of op ``name`` called with ``n`` tensors and the attributes
    ``attrs`` (pairs). Built in Python, also while a graph compiles (``_get_cache_prim``),
    which is where unknown attributes are refused."""

    def __init__(self, name: str, n: int, attrs: tuple = ()):
        info = _INFOS[name]
        attrs = dict(attrs)
        if n > info["num_inputs"]:
            names = ", ".join(a["name"] for a in info["inputs"])
            raise TypeError(f"polyop.{name}: takes at most {info['num_inputs']} tensor(s) ({names}), "
                            f"got {n}; attributes go by name (the schema: {info['schema']})")
        unknown = sorted(set(attrs) - {a["name"] for a in info["attrs"]})
        if unknown:
            raise TypeError(f"polyop.{name}: unknown attribute(s) {', '.join(unknown)} "
                            f"(the schema: {info['schema']})")
        # (MindSpore registers kernel info once per registration name: one per input count)
        reg = CustomRegOp(f"polyop_{name}" + ("" if n == info["num_inputs"] else f"_{n}_inputs"))
        for i, a in enumerate(info["inputs"][:n]):
            reg = reg.input(i, a["name"])
        for i, o in enumerate(info["outputs"]):
            reg = reg.output(i, o["name"])
        reg = reg.dtype_format(*[DataType.None_None] * (n + info["num_outputs"])).target("CPU")
        super().__init__(f"{load().path}:polyop_{name}", func_type="aot",
                         reg_info=reg.get_op_info(),
                         bprop=_bprop(name, attrs, n) if info.get("backward") else None)
        for k, v in attrs.items():
            self.add_prim_attr(k, _attr_value(v))
        self.add_prim_attr(NUM_INPUTS, n)


def _wiring(name: str, n: int):
    """The backward op's arguments as (kind, index) with kind 0/1/2 = grad/input/output (an
    absent optional input: kind 1, index -1), and per forward input the backward result
    that is its gradient (-1: none)."""
    bwd = _INFOS[name]["backward"]
    kinds = {"grad": 0, "input": 1, "output": 2}
    args = tuple((kinds[k], -1 if k == "input" and i >= n else i)
                 for k, i in backward_args(name, bwd, lambda i: ("grad", i),
                                           lambda i: ("input", i), lambda i: ("output", i)))
    by_input = grads_by_input(bwd, list(range(len(bwd["outputs"]))), len(_INFOS[name]["inputs"]))
    return args, tuple(-1 if j is None else j for j in by_input[:n])


def _bprop(name: str, attrs: dict, n: int):
    bwd = _INFOS[name]["backward"]["op"]
    bwd_attrs = tuple((a["name"], attrs[a["name"]]) for a in _INFOS[bwd]["attrs"]
                      if a["name"] in attrs)
    multi = _INFOS[name]["num_outputs"] > 1
    bwd_multi = _INFOS[bwd]["num_outputs"] > 1
    wiring, grad_of = _wiring(name, n)

    # Written in the Python MindSpore graphs compile (GRAPH_MODE, mindspore.jit): the loops
    # run over constants.
    def grads(xs, out, dout):
        outs = out if multi else (out,)
        douts = dout if multi else (dout,)
        targs = ()
        for kind, i in wiring:
            if kind == 0:
                targs = targs + (douts[i],)
            elif kind == 2:
                targs = targs + (outs[i],)
            elif i < 0:
                targs = targs + (None,)
            else:
                targs = targs + (xs[i],)
        res = _apply(bwd, targs, bwd_attrs)
        res = res if bwd_multi else (res,)
        result = ()
        for j in range(n):
            if grad_of[j] < 0:
                result = result + (ops.zeros_like(xs[j]),)
            else:
                result = result + (res[grad_of[j]],)
        return result

    return _with_arity(n, grads)


def _with_arity(n: int, grads):
    """``grads(inputs, out, dout)`` as a bprop of ``n`` inputs: graph mode wants one named
    parameter per input."""
    if n == 1:
        def bprop(x0, out, dout):
            return grads((x0,), out, dout)
    elif n == 2:
        def bprop(x0, x1, out, dout):
            return grads((x0, x1), out, dout)
    elif n == 3:
        def bprop(x0, x1, x2, out, dout):
            return grads((x0, x1, x2), out, dout)
    elif n == 4:
        def bprop(x0, x1, x2, x3, out, dout):
            return grads((x0, x1, x2, x3), out, dout)
    else:
        raise NotImplementedError(f"polyop.mindspore: gradients of ops with {n} tensor inputs")
    return bprop


@constexpr(check=False)
def _in_graph(fn):
    # As MindSpore's own _primitive_cache: a function passed to a constexpr arrives as None
    # while a graph compiles.
    return fn is None


def _marker():
    return 0


@constexpr
def _data_dependent(name):
    return _INFOS[name]["flags"]["data_dependent_shape"]


def _eager(name: str, tensors, attrs):
    """A data-dependent op in PyNative mode: polyop's core on the tensors' host data."""
    outs = polyop.run(name, *(t.asnumpy() for t in tensors), **dict(attrs))
    outs = tuple(ms.Tensor(o) for o in (outs if isinstance(outs, (list, tuple)) else [outs]))
    return outs if len(outs) > 1 else outs[0]


def _apply(name, tensors, attrs):
    """Op ``name`` on ``tensors`` (trailing ``None``s: absent optional inputs) with the
    attribute pairs ``attrs``. Graph-compilable: everything but the tensors is constant."""
    n = len(tensors)
    while n > 0 and tensors[n - 1] is None:
        n = n - 1
    if _data_dependent(name) and not _in_graph(_marker):
        return _eager(name, tensors[:n], attrs)
    return _get_cache_prim(_Op)(name, n, attrs)(*tensors[:n])


def call(name: str, *tensors, **attrs):
    """Run op ``name`` on MindSpore tensors (``pms.call("topk", x, k=2)``)."""
    if name not in _INFOS or _INFOS[name]["flags"]["inplace"]:
        raise ValueError(f"polyop.mindspore: no op {name!r} (ops: {', '.join(op_names())})")
    return _apply(name, tensors, tuple(attrs.items()))


def _make_op(name: str):
    def op(*tensors, **attrs):
        return _apply(name, tensors, tuple(attrs.items()))

    info = _INFOS[name]
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{info['schema']}\n\n{info.get('doc') or ''}\n\nTensors positionally, attributes by name."
    return op


for _name in op_names():
    globals()[_name] = _make_op(_name)
__all__ += op_names()
