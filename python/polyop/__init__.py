"""polyop: kernels written once in Rust, run as native ops in PyTorch, TensorFlow,
ONNX Runtime and JAX.

The core (this module) works on NumPy arrays and needs no framework:

- ``polyop.ops()`` / ``polyop.op_info(name)``: op metadata (schema, inputs, outputs,
  attributes, dtypes, flags, backward wiring, CamelCase/ONNX names) as dicts.
- ``polyop.infer(name, input_specs, **attrs)``: shape inference; a spec is
  ``(shape, dtype_name)`` with ``None`` for unknown dims (``(None, dtype)``: unknown rank),
  or ``None`` for an absent optional input. Returns ``[(shape | None, dtype_name), ...]``.
  A dim may also be a string naming a symbolic size (``"b"``); output dims over symbols come
  back as a name or an ``[op, a, b]`` expression (docs/shapes.md).
- ``polyop.infer_symbolic(name, input_specs, **attrs)``: the same, plus the requirements
  between symbolic dims: ``{"outputs": [...], "constraints": [[relation, lhs, rhs, message]]}``.
- ``polyop.run(name, *arrays, **attrs)``: run the CPU kernel on NumPy arrays (``None`` for an
  absent optional input). Returns one array for a single-output op, a tuple for a
  multi-output op (``topk``). Strided views are read in place; the GIL is released while the
  kernel runs. In-place ops (``relu_``) run out of place here.
- ``polyop.library_path(framework)``: the built ``libpolyop_<fw>.so`` for the framework.
- ``polyop.load(path)``: any built polyop library (an author's too) with the same ``ops``,
  ``op_info``, ``infer``, ``run`` from its own exports, and ``framework_ops()``.

Errors: ``TypeError`` for wrong argument kinds (non-array, unsupported/mismatched dtype,
wrong number of inputs, missing/unknown/wrong-typed attributes), ``ValueError`` for bad
values (shapes, axis, k, attribute values, unknown op), ``RuntimeError`` for internal errors.
Messages read ``polyop.<op>: <problem>``.

Framework glue is imported explicitly: ``import polyop.torch``, ``polyop.tensorflow``,
``polyop.onnxruntime``, ``polyop.jax``; this module never imports a framework.
"""

from __future__ import annotations

from ._core import __version__, infer, infer_symbolic, op_info, ops, run
from ._paths import library_path


def load(path: str):
    """Open a built polyop library (an author's, or a stock one) by path, without importing a
    framework. The result (a ``polyop._library.Library``) offers what this module offers for
    the stock ops, from the library's own exports: ``ops()``, ``op_info(name)``,
    ``infer(name, specs, **attrs)``, ``infer_symbolic(...)``, ``run(name, *arrays, **attrs)``
    (its CPU kernels on NumPy arrays); ``framework`` and ``name`` (its namespace / prefix /
    domain) say what it is, and ``framework_ops()`` loads it into its framework
    (``polyop.<framework>.load(path)``). A file that is not a usable polyop library raises
    ``polyop._library.LibraryError``."""
    from ._library import open_library

    return open_library(path)


def load_crate(path, verbose: bool = False) -> dict:
    """Build an op crate (or workspace) with cargo, cached by a hash of its sources like
    ``torch.utils.cpp_extension.load``, and open its libraries: ``{framework: library}``, each
    as :func:`load` returns it. ``verbose=True`` shows cargo's output. See
    ``docs/packaging.md``."""
    from ._build import load_crate as _load_crate

    return _load_crate(path, verbose)


__all__ = ["ops", "op_info", "infer", "infer_symbolic", "run", "load", "load_crate", "library_path",
           "__version__"]
