"""Conformance backend for XLA / JAX (``polyop.jax`` over ``libpolyop_xla.so``).

Modes:

- ``jit``: the op under ``jax.jit``.
- ``vmap``: every present input stacked twice along a new leading axis, the op under
  ``jax.jit(jax.vmap(...))``; both slices must be bitwise identical, slice 0 is returned.
- ``eval_shape``: ``jax.eval_shape`` over abstract inputs (kernel-core's shape inference via
  ``polyop.infer``) must give exactly the shapes and dtypes of the jitted outputs (the ``jit``
  mode's, when it just ran the same case), which the harness then checks against the NumPy
  reference; the jitted outputs are returned.

Gradients: ``jax.test_util.check_grads(order=1, modes=["rev"])`` in float64 over the float
inputs (``jax_enable_x64`` is switched on when this module is imported). ``nonzero`` (a
data-dependent output shape) is unsupported under XLA: static shapes only.
Symbolic mode: ``polyop.jax.export`` once with ``jax.export.symbolic_shape`` dims, the
exported function called at every size.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import polyop  # noqa: E402
import polyop.jax as pj  # noqa: E402
from polyop.conformance.harness import Backend, Case  # noqa: E402


def _present(case: Case):
    return [x for x in case.inputs if x is not None]


def _on_device(xs) -> list:
    """NumPy inputs as JAX arrays by a plain transfer: ``jnp.asarray`` stages a computation
    for each new shape and dtype (5 ms a call, a sixth of this backend's time)."""
    return [jax.device_put(np.asarray(x)) for x in xs]


def _fn(case: Case, call=None):
    """f(*present_inputs) -> tuple of outputs."""
    present = [x is not None for x in case.inputs]
    call = call or pj.call

    def f(*xs):
        it = iter(xs)
        full = [next(it) if p else None for p in present]
        out = call(case.op, *full, **case.attrs)
        return out if isinstance(out, tuple) else (out,)

    return f


class XlaBackend(Backend):
    name = "xla"
    modes = ("jit", "vmap", "eval_shape")
    version = f"jax {jax.__version__}"

    def __init__(self, library: str | None = None) -> None:
        self.library = library
        self.meta = polyop
        self.call = pj.call
        if library is not None:
            ns = pj.load(library)
            self.meta, self.call = ns.library, ns.call

    def unsupported(self, case: Case, mode: str) -> str | None:
        info = self.meta.op_info(case.op)
        if info["flags"]["data_dependent_shape"]:
            return "data-dependent output shape; XLA needs static shapes (refused at trace time)"
        if info["flags"]["inplace"]:
            return "in-place ops exist only on the torch surface"
        if mode == "grad" and not info.get("backward"):
            return "op has no gradient"
        return None

    symbolic = True

    def run_symbolic(self, case: Case, pattern: list, cases) -> list:
        names = sorted({d for p in pattern if p is not None for d in p if isinstance(d, str)})
        syms = dict(zip(names, jax.export.symbolic_shape(", ".join(names))))
        specs = [jax.ShapeDtypeStruct(tuple(syms[d] if isinstance(d, str) else d for d in p),
                                      np.asarray(x).dtype)
                 for p, x in zip(pattern, case.inputs) if p is not None]
        exp = pj.export(_fn(case, self.call))(*specs)
        return [[np.asarray(o) for o in exp.call(*_on_device(_present(c)))] for c in cases]

    #: (case, its jitted outputs) of the last case run in the ``jit`` mode: the ``eval_shape``
    #: mode of the same case compares with them instead of compiling the op a second time.
    _last_jit: tuple = (None, None)

    def _jit(self, case: Case):
        if self._last_jit[0] is case:
            return self._last_jit[1]
        outs = [np.asarray(o) for o in jax.jit(_fn(case, self.call))(*_on_device(_present(case)))]
        self._last_jit = (case, outs)
        return outs

    def run(self, case: Case, mode: str) -> list[np.ndarray]:
        f = _fn(case, self.call)
        if mode == "jit":
            return self._jit(case)
        if mode == "vmap":
            stacked = _on_device(np.stack([x, x]) for x in _present(case))
            outs = jax.jit(jax.vmap(f))(*stacked)
            res = []
            for i, o in enumerate(outs):
                o = np.asarray(o)
                a, b = o[0], o[1]
                if a.shape != b.shape or not np.array_equal(
                    np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
                ):
                    raise AssertionError(f"vmap: output {i}: the two identical slices differ")
                res.append(a)
            return res
        if mode == "eval_shape":
            shapes = jax.eval_shape(f, *[jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)
                                         for x in _present(case)])
            outs = self._jit(case)
            got = [(tuple(s.shape), np.dtype(s.dtype).name) for s in shapes]
            want = [(tuple(o.shape), o.dtype.name) for o in outs]
            if got != want:
                raise AssertionError(f"eval_shape gave {got}, the computation produced {want}")
            return outs
        raise ValueError(f"unknown mode {mode!r}")

    def check_grad(self, case: Case) -> None:
        present = _present(case)
        diff = [np.issubdtype(np.asarray(x).dtype, np.floating) for x in present]
        f = _fn(case, self.call)
        consts = _on_device(present)

        def g(*dx):
            it = iter(dx)
            args = [next(it) if d else c for c, d in zip(consts, diff)]
            outs = f(*args)
            return tuple(o for o in outs if jnp.issubdtype(o.dtype, jnp.inexact))

        args = tuple(_on_device(np.asarray(x, np.float64) for x, d in zip(present, diff) if d))
        check_grads(g, args, order=1, modes=["rev"])

    def error(self, case: Case, mode: str) -> BaseException:
        try:
            self.run(case, mode)
        except Exception as e:  # noqa: BLE001
            return e
        raise AssertionError("no error was raised")


BACKEND = XlaBackend()
