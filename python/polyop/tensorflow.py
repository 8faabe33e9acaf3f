"""TensorFlow glue for polyop.

``libpolyop_tensorflow.so`` works on its own (``tf.load_op_library(path).polyop_topk(x, k=2)``).
This module adds what only Python can add:

- clean names: ``polyop.tensorflow.topk(x, k=2)``, ``polyop.tensorflow.rms_norm(x, weight=None)``
  (``None`` for an absent optional input instead of TF's ``weight=[]``; inputs by position or
  name; attributes by name with the schema's defaults);
- exact static shapes in graph mode: TF's C shape API cannot read int/float/bool/string
  attributes, so the library's shape functions leave attribute-dependent dims unknown; the
  wrappers call ``polyop.infer`` with the real attribute values and ``set_shape`` the outputs;
- gradients: ``tf.RegisterGradient("Polyop<Camel>")`` for every op with a backward, driven by
  ``polyop.op_info(name)["backward"]`` (the backward op is itself a registered TF op; no
  gradient formula lives here).

``load(path=None)`` returns the object every ``polyop.<framework>.load()`` returns
(:class:`polyop._library.Loaded`): one attribute per op (those functions), ``path``, ``name``
(the op-type prefix), ``op_names``, ``handle`` (the module ``tf.load_op_library`` returned),
``library``/``info`` and ``call(name, *tensors, **attrs)``. Module attributes forward to it:
``polyop.tensorflow.topk``. ``load(path)`` also takes an author's library (built with ``polyop_tensorflow::export!``, see
docs/authoring.md): names, static shapes and gradients then come from that library's own
metadata and shape inference (``polyop_library_info`` / ``polyop_infer``), and its op types
are ``<prefix><CamelName>``.

Importing this module without TensorFlow installed raises one ``ImportError`` naming the pip
package (:func:`polyop._library.require_framework`).
"""

from __future__ import annotations

import threading
import types
from typing import Any

from ._library import require_framework

require_framework("tensorflow")

import tensorflow as tf  # noqa: E402
import numpy as np  # noqa: E402

import polyop  # noqa: E402

from ._library import Loaded, backward_args, grads_by_input, op_label  # noqa: E402

__all__ = ["load", "op_type"]

_lock = threading.Lock()
_loaded: dict[str, Loaded] = {}
_grads_registered: set[str] = set()


def op_type(name: str) -> str:
    """The TF op type of polyop op ``name`` (``rms_norm`` -> ``PolyopRmsNorm``)."""
    return "Polyop" + polyop.op_info(name)["camel_name"]


#: The stock library's op-type prefix.
STOCK_PREFIX = "Polyop"


def _raw_fn(raw: Any, info: dict, prefix: str = STOCK_PREFIX) -> Any:
    # TF names the Python wrapper after the op type in snake case: PolyopRmsNorm ->
    # polyop_rms_norm. Look it up by the op type rather than re-deriving TF's rule.
    want = prefix + info["camel_name"]
    fn = getattr(raw, prefix.lower() + "_" + info["name"], None)
    if fn is not None:
        return fn
    for attr in dir(raw):
        if attr.replace("_", "").lower() == want.lower():
            return getattr(raw, attr)
    raise AttributeError(f"polyop: the TensorFlow library has no wrapper for op type {want}")


def _spec(t: Any) -> tuple | None:
    if t is None:
        return None
    shape = t.shape
    dims = None if shape.rank is None else tuple(shape.as_list())
    return (dims, t.dtype.name)


def _in_xla_compile() -> bool:
    """Whether the graph being traced will be compiled by XLA (``tf.function(jit_compile=True)``,
    here or in an outer function), where a custom op without an XLA lowering cannot run. TF
    offers no public test: this is the one ``tf.function`` itself uses, guarded so a TF that
    moves it only loses the early, clearer error (TF's own then says "No registered
    'Polyop...' OpKernel for XLA_CPU_JIT")."""
    try:
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except Exception:  # noqa: BLE001
        return False


def _make_fn(raw: Any, info: dict, prefix: str = STOCK_PREFIX, meta: Any = polyop):
    name = info["name"]
    label = op_label(meta, name)
    inputs = info["inputs"]
    attr_names = {a["name"] for a in info["attrs"]}
    # TF's list(int) attrs take lists only: a single int for an int[N] is repeated N times, for
    # an int[] it is a one-element list (what every other surface does with it)
    int_lists = {a["name"]: a.get("len") or 1 for a in info["attrs"] if a["type"] == "int[]"}
    raw_fn = _raw_fn(raw, info, prefix)
    n_out = len(info["outputs"])

    def fn(*args, **kwargs):
        if len(args) > len(inputs):
            raise TypeError(
                f"{label}: takes {len(inputs)} tensor input(s) "
                f"({', '.join(i['name'] for i in inputs)}), got {len(args)} positional arguments"
            )
        values: list[Any] = list(args) + [None] * (len(inputs) - len(args))
        for k, spec in enumerate(inputs):
            if spec["name"] in kwargs:
                if k < len(args):
                    raise TypeError(f"{label}: input `{spec['name']}` given twice")
                values[k] = kwargs.pop(spec["name"])
        op_name = kwargs.pop("name", None)
        unknown = set(kwargs) - attr_names
        if unknown:
            raise TypeError(
                f"{label}: unknown argument(s) {sorted(unknown)} (inputs: "
                f"{[i['name'] for i in inputs]}, attributes: {sorted(attr_names)})"
            )
        call: dict[str, Any] = {}
        tensors: list[Any] = []
        for spec, v in zip(inputs, values):
            if spec["optional"]:
                if v is None:
                    v = []
                elif not isinstance(v, (list, tuple)):
                    v = [v]
                v = [tf.convert_to_tensor(t) for t in v]
                tensors.append(v[0] if v else None)
            else:
                if v is None:
                    raise TypeError(f"{label}: input `{spec['name']}` is required")
                v = tf.convert_to_tensor(v)
                tensors.append(v)
            call[spec["name"]] = v
        # Arity, dtypes and attribute names/types are checked by kernel-core first (shapes
        # unknown, so only what TF's own generated wrapper would otherwise reject with its own
        # message: a dtype outside T's list, a T mismatch, a missing attribute).
        try:
            meta.infer(name, [None if t is None else (None, t.dtype.name) for t in tensors], **kwargs)
        except (TypeError, ValueError) as e:
            raise tf.errors.InvalidArgumentError(None, None, str(e)) from None
        if not tf.executing_eagerly() and _in_xla_compile():
            raise tf.errors.UnimplementedError(None, None, (
                f"{label}: cannot run inside tf.function(jit_compile=True): XLA compiles "
                "only ops that have an XLA lowering, and TensorFlow's C API (which polyop's "
                "TensorFlow library is built on) can register CPU kernels but no XLA lowering "
                "for a custom op. Call it from a tf.function without jit_compile, or use "
                "polyop.jax for XLA."))
        raw_attrs = {k: [v] * int_lists[k] if k in int_lists and isinstance(v, (int, np.integer))
                     and not isinstance(v, bool) else v for k, v in kwargs.items()}
        out = raw_fn(**call, **raw_attrs, name=op_name)
        if not tf.executing_eagerly():
            # Attribute-dependent dims are unknown after TF's shape function; fill them in.
            specs = meta.infer(name, [_spec(t) for t in tensors], **kwargs)
            outs = [out] if n_out == 1 else list(out)
            for t, (shape, _dtype) in zip(outs, specs):
                if shape is not None:
                    t.set_shape(shape)
        return out

    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = f"{info['schema']}\n\n{info.get('doc', '')}\n\nTF op type: {prefix}{info['camel_name']}."
    return fn


def _register_gradient(
    ns: Loaded, info: dict, prefix: str = STOCK_PREFIX, meta: Any = polyop
) -> None:
    name = info["name"]
    bwd = info["backward"]
    tf_type = prefix + info["camel_name"]
    if tf_type in _grads_registered:
        return
    bwd_info = meta.op_info(bwd["op"])
    bwd_attrs = [a["name"] for a in bwd_info["attrs"]]
    inputs = info["inputs"]

    def grad(op, *grads):
        # Map TF's flattened inputs back to the schema's (absent optional inputs are None).
        flat = list(op.inputs)
        fwd: list[Any] = []
        present: list[bool] = []
        for spec in inputs:
            if spec["optional"]:
                n = op.get_attr("N_" + spec["name"])
                fwd.append(flat.pop(0) if n else None)
                present.append(bool(n))
            else:
                fwd.append(flat.pop(0))
                present.append(True)
        args = backward_args(
            name,
            bwd,
            lambda i: tf.zeros_like(op.outputs[i]) if grads[i] is None else grads[i],
            fwd.__getitem__,
            op.outputs.__getitem__,
        )
        # op.get_attr returns TF's Python values; strings come back as bytes.
        attrs = {}
        for a in bwd_attrs:
            v = op.get_attr(a)
            attrs[a] = v.decode() if isinstance(v, bytes) else v
        res = ns.op(bwd["op"])(*args, **attrs)
        res = [res] if len(bwd_info["outputs"]) == 1 else list(res)
        by_input = grads_by_input(bwd, res, len(inputs))
        # One gradient per flattened TF input; gradients of absent optional inputs are dropped,
        # inputs without a backward output (non-differentiable) get None.
        return [g for g, p in zip(by_input, present) if p]

    grad.__name__ = f"_polyop_{name}_grad"
    _register(tf_type, grad)


def _register(tf_type: str, grad: Any) -> None:
    """``tf.RegisterGradient(tf_type)(grad)``, once per process."""
    try:
        tf.RegisterGradient(tf_type)(grad)
    except KeyError:
        # Already registered in this process (e.g. the module was reloaded).
        pass
    _grads_registered.add(tf_type)


def _register_no_gradient(info: dict, prefix: str = STOCK_PREFIX, meta: Any = polyop) -> None:
    """An op that declares no backward op: differentiating through it raises TF's error for a
    missing gradient (``LookupError``) naming the op, as torch and JAX do."""
    name, tf_type = info["name"], prefix + info["camel_name"]
    if tf_type in _grads_registered:
        return

    def grad(op, *grads):
        raise LookupError(f"{op_label(meta, name)}: this op has no gradient (it declares no backward op)")

    grad.__name__ = f"_polyop_{name}_no_grad"
    _register(tf_type, grad)


def _wrappers_from_registry(infos: list[dict], prefix: str = STOCK_PREFIX) -> types.ModuleType:
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.framework import op_def_registry
    from tensorflow.python.framework import _pywrap_python_op_gen

    op_list = op_def_pb2.OpList()
    for info in infos:
        d = op_def_registry.get(prefix + info["camel_name"])
        if d is not None:
            op_list.op.add().CopyFrom(d)
    wrappers = _pywrap_python_op_gen.GetPythonWrappers(op_list.SerializeToString())
    module = types.ModuleType("polyop_tensorflow_ops")
    exec(wrappers, module.__dict__)  # noqa: S102 - TF's own generated wrapper code
    return module


def load(path: str | None = None) -> Loaded:
    """Load ``libpolyop_tensorflow.so`` (default: ``polyop.library_path("tensorflow")``),
    register gradients, and return the library as a :class:`polyop._library.Loaded` of
    clean-named op functions (``handle``: the module ``tf.load_op_library`` returned).

    ``path`` may also be an author's library (built with ``polyop_tensorflow::export!``):
    its ops, op-type prefix and shape inference then come from the library itself."""
    stock = path is None
    path = path or polyop.library_path("tensorflow")
    with _lock:
        ns = _loaded.get(path)
        if ns is not None:
            return ns
        raw = tf.load_op_library(path)
        prefix, meta, lib = STOCK_PREFIX, polyop, None
        if not stock:
            from . import _library

            lib = _library.open_library(path)
            if lib.framework != "tensorflow":
                raise RuntimeError(f"polyop: {path} is a {lib.framework} library, not a TensorFlow one")
            if lib.name != STOCK_PREFIX:
                prefix, meta = lib.name, lib
        infos = [i for i in meta.ops() if not i["flags"]["inplace"]]
        try:
            for info in infos[:1]:
                _raw_fn(raw, info, prefix)
        except AttributeError:
            # The library was already loaded under another path string: TF's loader then sees
            # no new registrations and returns an empty module. The ops are registered
            # globally, so generate the wrappers from TF's op registry instead.
            raw = _wrappers_from_registry(infos, prefix)
        fns = {info["name"]: _make_fn(raw, info, prefix, meta) for info in infos}
        ns = Loaded("tensorflow", path, prefix, raw, fns, library=lib)
        for info in infos:
            if info["backward"] is not None:
                _register_gradient(ns, info, prefix, meta)
            else:
                _register_no_gradient(info, prefix, meta)
        _loaded[path] = ns
        return ns


def __getattr__(attr: str) -> Any:
    if attr.startswith("__"):
        raise AttributeError(attr)
    ns = load()
    try:
        return getattr(ns, attr)
    except AttributeError:
        raise AttributeError(f"module 'polyop.tensorflow' has no attribute {attr!r}") from None
