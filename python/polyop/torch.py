"""PyTorch glue for polyop.

``libpolyop_torch.so`` alone gives every op as ``torch.ops.polyop.<name>`` (CPU + Meta kernels,
schemas, errors): ``torch.ops.load_library(polyop.library_path("torch"))`` is enough for
forward computation, FakeTensor, ``torch.compile`` and ``torch.library.opcheck``.

This module adds what only Python can add:

- autograd for every op that declares a backward, through ``torch.library.register_autograd``,
  driven generically by the backward metadata of ``polyop.op_info(name)["backward"]``: the
  gradient is computed by calling the registered backward op (``torch.ops.polyop.<op>_backward``
  or whichever op the metadata names). There is no gradient formula here.
- fake kernels for every op from kernel-core's symbolic shape inference (docs/shapes.md):
  ``SymInt`` sizes stay symbolic (``torch.compile(dynamic=True)`` compiles once across sizes,
  ``torch.export`` keeps ``Dim``s), requirements between sizes become ``torch._check``s, and
  the data-dependent count of ``nonzero`` is an unbacked size (traced under ``torch.compile``
  when ``torch._dynamo.config.capture_dynamic_output_shape_ops = True``). The library's own
  Meta kernel, which this replaces, gives correct shapes but specializes symbolic sizes.

Usage::

    import polyop.torch
    ops = polyop.torch.load()          # a polyop._library.Loaded, idempotent
    y = ops.rms_norm(x, w, eps=1e-5)   # == torch.ops.polyop.rms_norm (ops.handle is torch.ops.polyop)
    y.sum().backward()

``load()`` returns the object every ``polyop.<framework>.load()`` returns
(:class:`polyop._library.Loaded`): ``path``, ``name`` (the namespace), ``op_names``,
``handle`` (``torch.ops.<namespace>``), ``library``/``info`` (the library's own metadata),
``call(name, *tensors, **attrs)`` and one attribute per op (the ``torch.ops`` packet, so
``ops.topk.default`` is the overload for ``torch.library.opcheck``).

An author's library (built with ``polyop_torch::export!``, see docs/authoring.md) loads the
same way by path: ``ops = polyop.torch.load("libmy_torch.so")`` calls
``torch.ops.load_library`` and registers autograd / fake kernels from *that* library's
metadata (``polyop_library_info``); ``ops.handle`` is ``torch.ops.<its namespace>``.

Importing this module without torch installed raises one ``ImportError`` naming the pip package
(:func:`polyop._library.require_framework`).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
from typing import Any

from ._library import require_framework

require_framework("torch")

import torch  # noqa: E402

import polyop  # noqa: E402

from . import _library, _sharding, _shapes  # noqa: E402
from ._library import Loaded, backward_args, grads_by_input, op_label  # noqa: E402

__all__ = ["load", "ops", "library_path", "onnx_translation_table", "register_onnx_symbolics"]

_lock = threading.Lock()
_loaded: Loaded | None = None

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def library_path() -> str:
    """Path of ``libpolyop_torch.so``."""
    return polyop.library_path("torch")


def _library_loaded() -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(
            f"polyop::{polyop.ops()[0]['name']}", "CPU"
        )
    except Exception:
        return False


_authored: dict[str, Loaded] = {}


def _loaded_object(path: str, ns: str, names: list[str], library: Any = None) -> Loaded:
    handle = getattr(torch.ops, ns)
    return Loaded("torch", path, ns, handle, {n: getattr(handle, n) for n in names}, library=library)


#: The oldest torch whose stable ABI the libraries target (``TORCH_TARGET_VERSION`` in
#: adapters/torch/build.rs; tests/test_compat.py checks the two agree).
TORCH_ABI_FLOOR = (2, 13)


def _load_library(path: str) -> None:
    """``torch.ops.load_library(path)``; a torch too old for the library's stable-ABI target
    is refused naming both versions (torch itself says only "Could not load this library")."""
    try:
        torch.ops.load_library(path)
    except OSError as e:
        import ctypes

        try:
            ctypes.CDLL(path)  # the dynamic loader's own reason
            detail = str(e)
        except OSError as le:
            detail = str(le)
        have = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
        floor = ".".join(map(str, TORCH_ABI_FLOOR))
        if have < TORCH_ABI_FLOOR:
            raise RuntimeError(
                f"polyop: {path} needs torch {floor} or newer (it is built for torch's stable ABI "
                f"of version {floor}); this is torch {torch.__version__} ({detail})"
            ) from None
        raise OSError(f"polyop: cannot load {path} into torch {torch.__version__}: {detail}") from None


def load(path: str | None = None) -> Loaded:
    """Load ``libpolyop_torch.so`` (once), register autograd and fake kernels, and return the
    library as a :class:`polyop._library.Loaded` (``handle``: ``torch.ops.polyop``; one
    attribute per op).

    With ``path``: load that polyop torch library (an author's, built with
    ``polyop_torch::export!``) with ``torch.ops.load_library`` and register autograd and fake
    kernels from its own metadata (``handle``: ``torch.ops.<namespace>``).
    """
    if path is not None:
        return _load_path(path)
    return _load_stock(None)


def _load_stock(path: str | None) -> Loaded:
    """The stock library: ``path`` when it was loaded by path (already loaded then), else
    ``libpolyop_torch.so`` from :func:`library_path` unless torch has the ops already."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        lib_path = path
        if not _library_loaded():
            lib_path = library_path()
            _load_library(lib_path)
            _library.open_library(lib_path)  # raises if its ops failed to register
        infos = polyop.ops()
        for info in infos:
            _register_fake(info)
            _register_sharding(info)
            if info.get("backward"):
                _register_autograd(info)
            else:
                _register_no_gradient(info)
        if lib_path is None:  # loaded by the user's own torch.ops.load_library call
            lib_path = next((p for p in sorted(getattr(torch.ops, "loaded_libraries", ()))
                             if os.path.basename(p) == "libpolyop_torch.so"), None) or library_path()
        _loaded = _loaded_object(lib_path, "polyop", [i["name"] for i in infos])
    return _loaded


def ops():
    """``torch.ops.polyop``, loading the library first if needed."""
    return load().handle


def _load_path(path: str) -> Loaded:
    real = os.path.realpath(path)
    with _lock:
        if real in _authored:
            return _authored[real]
        _load_library(real)
        lib = _library.open_library(real)
        if lib.framework != "torch":
            raise RuntimeError(f"polyop: {path} is a {lib.framework} library, not a torch one")
        if lib.name != "polyop":
            ns = lib.name
            for info in lib.ops():
                _register_fake(info, ns, lib)
                _register_sharding(info, ns, lib)
                if info.get("backward"):
                    _register_autograd(info, ns)
                else:
                    _register_no_gradient(info, ns, lib.namespace)
            _authored[real] = _loaded_object(real, ns, list(lib.exported), library=lib)
            return _authored[real]
    # The stock library under an explicit path: the stock glue.
    return _load_stock(real)


# --------------------------------------------------------------------------------------------
# autograd


def _arg_layout(info: dict[str, Any], ns: str = "polyop"):
    """Positions of the tensor inputs and attributes among the op's arguments (schema order)."""
    schema = _schema(info["name"], ns)
    tensor_pos, attr_pos = [], {}
    for i, a in enumerate(schema.arguments):
        if "Tensor" in str(a.type):
            tensor_pos.append(i)
        else:
            attr_pos[a.name] = i
    return schema, tensor_pos, attr_pos


def _schema(name: str, ns: str = "polyop"):
    return getattr(getattr(torch.ops, ns), name).default._schema


def _register_no_gradient(info: dict[str, Any], ns: str = "polyop", label_ns: str = "polyop") -> None:
    """An op that declares no backward op: ``backward()`` through it raises a ``RuntimeError``
    naming the op, as JAX and TensorFlow raise their errors, instead of torch's warning and a
    silently missing gradient. In-place ops are left alone (torch refuses autograd
    registrations for ops that mutate)."""
    if info["flags"]["inplace"]:
        return
    name = info["name"]

    def backward(ctx, *grads):
        raise RuntimeError(f"{label_ns}.{name}: this op has no gradient (it declares no backward op)")

    torch.library.register_autograd(f"{ns}::{name}", backward,
                                    setup_context=lambda ctx, inputs, output: None)


def _register_autograd(info: dict[str, Any], ns: str = "polyop") -> None:
    name = info["name"]
    bwd = info["backward"]
    bwd_name = bwd["op"]
    bwd_inputs = [(kind, int(i)) for kind, i in bwd["inputs"]]
    _, tensor_pos, attr_pos = _arg_layout(info, ns)
    bwd_schema = _schema(bwd_name, ns)
    bwd_tensor_args = [
        a.name for a in bwd_schema.arguments if "Tensor" in str(a.type)
    ]
    bwd_attr_names = [a.name for a in bwd_schema.arguments if "Tensor" not in str(a.type)]
    bwd_op = getattr(getattr(torch.ops, ns), bwd_name).default
    n_args = len(tensor_pos) + len(attr_pos)
    need_inputs = sorted({i for k, i in bwd_inputs if k == "input"})
    need_outputs = sorted({i for k, i in bwd_inputs if k == "output"})

    def setup_context(ctx, inputs, output):
        outs = output if isinstance(output, (tuple, list)) else (output,)
        tensors = [inputs[p] for p in tensor_pos]
        ctx.polyop_present = [t is not None for t in tensors]
        ctx.polyop_attrs = {n: inputs[p] for n, p in attr_pos.items()}
        ctx.polyop_out_meta = [(o.shape, o.dtype) for o in outs]
        non_diff = [o for o in outs if o.dtype not in _FLOAT_DTYPES]
        if non_diff:
            ctx.mark_non_differentiable(*non_diff)
        ctx.save_for_backward(
            *[tensors[i] for i in need_inputs], *[outs[i] for i in need_outputs]
        )

    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        saved_in = dict(zip(need_inputs, saved[: len(need_inputs)]))
        saved_out = dict(zip(need_outputs, saved[len(need_inputs) :]))
        def grad(i):
            g = grads[i] if i < len(grads) else None
            if g is None:
                shape, dtype = ctx.polyop_out_meta[i]
                g = torch.zeros(shape, dtype=dtype)
            return g

        args = backward_args(name, bwd, grad, saved_in.__getitem__, saved_out.__getitem__)
        kwargs = dict(zip(bwd_tensor_args, args))
        for n in bwd_attr_names:
            kwargs[n] = ctx.polyop_attrs[n]
        res = bwd_op(**kwargs)
        res = res if isinstance(res, (tuple, list)) else (res,)
        grads_in: list[Any] = [None] * n_args
        for fwd_input, g in enumerate(grads_by_input(bwd, res, len(tensor_pos))):
            # Drop gradients of absent optional inputs (the kernel may still produce one).
            if ctx.polyop_present[fwd_input]:
                grads_in[tensor_pos[fwd_input]] = g
        return tuple(grads_in)

    torch.library.register_autograd(
        f"{ns}::{name}", backward, setup_context=setup_context
    )


# --------------------------------------------------------------------------------------------
# fake kernels: symbolic shapes under torch.compile / torch.export


def _sym_broadcast(a, b):
    """NumPy broadcasting of two (possibly symbolic) sizes, guarding the way torch's own
    broadcasting does (on whether a size is 1)."""
    if isinstance(a, int) and a == 1:
        return b
    if isinstance(b, int) and b == 1:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    torch._check(a == b, lambda: f"sizes {a} and {b} do not broadcast")
    return a


def _bind(schema, args, kwargs) -> list:
    """The op's argument values in schema order, defaults filled in."""
    values = list(args) + [None] * (len(schema.arguments) - len(args))
    for i, a in enumerate(schema.arguments):
        if a.name in kwargs:
            values[i] = kwargs[a.name]
        elif i >= len(args) and a.has_default_value():
            values[i] = a.default_value
    return values


def _register_fake(info: dict[str, Any], ns: str = "polyop", meta: Any = polyop) -> None:
    """Fake kernel from kernel-core's symbolic shape inference: ``SymInt`` input sizes go in as
    symbols, output sizes come out as ``SymInt`` expressions of them (conv2d's
    ``(h + 2p - k) // s + 1``), requirements between them become ``torch._check`` calls, and
    dims inference leaves unknown (``nonzero``'s count) become unbacked sizes. Replaces the
    library's Meta kernel, which sees sizes as plain integers and so would specialize every
    symbolic size to a constant (torch.compile(dynamic=True) recompiling per size,
    torch.export refusing ``Dim``s)."""
    name = info["name"]
    label = op_label(meta, name)
    inplace = info["flags"]["inplace"]
    data_dependent = info["flags"]["data_dependent_shape"]
    _, tensor_pos, attr_pos = _arg_layout(info, ns)

    def fake(*args, **kwargs):
        values = _bind(_schema(name, ns), args, kwargs)
        tensors = [values[p] for p in tensor_pos]
        specs, env = _shapes.symbolic_specs(
            (None if t is None else (tuple(t.shape), str(t.dtype).removeprefix("torch."))
             for t in tensors),
            lambda d: isinstance(d, torch.SymInt),
        )
        attrs = {n: values[p] for n, p in attr_pos.items()}
        try:
            r = meta.infer_symbolic(name, specs, **attrs)
        except (ValueError, TypeError) as e:
            # torch's error type for bad op input, as the CPU and Meta kernels raise
            raise RuntimeError(str(e)) from None

        def unknown():
            if not data_dependent:
                raise RuntimeError(f"{label}: shape inference left an output dim unknown")
            return torch.library.get_ctx().new_dynamic_size()

        ev = _shapes.Evaluator(env, torch.sym_max, _sym_broadcast, unknown)
        _shapes.check_constraints(
            r["constraints"], ev,
            lambda ok, msg: torch._check(ok, lambda: f"{label}: {msg}"),
        )
        if inplace:
            return tensors[0]
        device = next(t.device for t in tensors if t is not None)
        outs = []
        for shape, dtype in r["outputs"]:
            if shape is None:
                raise RuntimeError(
                    f"{label}: output rank is unknown before running; cannot trace"
                )
            outs.append(torch.empty(ev.shape(shape), dtype=getattr(torch, dtype), device=device))
        return outs[0] if len(outs) == 1 else tuple(outs)

    torch.library.register_fake(f"{ns}::{name}", fake, allow_override=True)


# --------------------------------------------------------------------------------------------
# DTensor: sharding strategies from the op's sharding rule


#: Ops whose DTensor strategies wait for ``torch.distributed.tensor`` to be imported.
_sharding_pending: list[tuple] = []


class _AfterDTensorImport(importlib.abc.MetaPathFinder):
    """Registers the pending DTensor strategies right after ``torch.distributed.tensor`` is
    imported: importing it just for polyop would cost every torch user seconds at load."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.distributed.tensor":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _register_pending_sharding()

        spec.loader.exec_module = exec_module
        return spec


def _register_pending_sharding() -> None:
    while _sharding_pending:
        _register_sharding_now(*_sharding_pending.pop(0))


def _register_sharding(info: dict[str, Any], ns: str = "polyop", meta: Any = polyop) -> None:
    """DTensor strategies for op ``info`` (:func:`_register_sharding_now`): now when DTensor is
    loaded, else as soon as it is."""
    if not torch.distributed.is_available():
        return
    _sharding_pending.append((info, ns, meta))
    if "torch.distributed.tensor" in sys.modules:
        _register_pending_sharding()
    elif not any(isinstance(f, _AfterDTensorImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDTensorImport())


def _register_sharding_now(info: dict[str, Any], ns: str = "polyop", meta: Any = polyop) -> None:
    """DTensor sharding strategies (``register_sharding``) from kernel-core's sharding rule
    (polyop._sharding): per split factor, one strategy that shards every tensor having it
    along its dim, replicates the inputs without it and makes the outputs without it
    ``Partial`` (summed: a weight gradient over a sharded batch); plus all-replicated. Dims the
    rule says are whole are never sharded, so DTensor redistributes an input sharded along one
    (softmax's axis) before the op."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    name = info["name"]
    schema, tensor_pos, attr_pos = _arg_layout(info, ns)

    def strategies(*args, **kwargs):
        values = _bind(schema, args, kwargs)
        tensors = [values[p] for p in tensor_pos]
        present = [t is not None for t in tensors]
        specs = [
            None if t is None else (tuple(t.shape), str(t.tensor_meta.dtype).removeprefix("torch."))
            for t in tensors
        ]
        r = meta.infer_symbolic(name, specs, **{n: values[p] for n, p in attr_pos.items()})
        rule = _sharding.Rule(
            r.get("sharding"), present, [len(s[0]) for s in specs if s is not None],
            [len(s) for s, _ in r["outputs"]],
        )
        # placements for every argument (None: not a tensor, or absent)
        def inputs(place):
            out, it = [None] * len(schema.arguments), iter(rule.inputs)
            for p, t in zip(tensor_pos, tensors):
                if t is not None:
                    out[p] = place(next(it))
            return out

        found = [([Replicate()] * len(rule.outputs), inputs(lambda m: Replicate()))]
        for f in dict.fromkeys(f for m in rule.inputs for f in m):
            if not rule.split(f):
                continue
            outs = [
                Shard(m.index(f)) if f in m else (Partial() if f in rule.summed(i) else Replicate())
                for i, m in enumerate(rule.outputs)
            ]
            found.append((outs, inputs(lambda m: Shard(m.index(f)) if f in m else Replicate())))
        return found

    register_sharding(getattr(getattr(torch.ops, ns), name).default)(strategies)


# --------------------------------------------------------------------------------------------
# ONNX export: torch.onnx.export to ai.polyop nodes

_PY_ATTR_TYPES = {"int": int, "float": float, "bool": bool, "str": str,
                  "int[]": "Sequence[int]", "float[]": "Sequence[float]"}


def _exported_ops(library: str | None):
    """(namespace, metadata source, op infos) of the stock or an author's torch library,
    without in-place ops (ONNX has no mutation)."""
    loaded = load(library)
    meta = polyop if loaded.library is None else loaded.library
    return loaded.name, meta, [i for i in meta.ops() if not i["flags"]["inplace"]]


def _onnx_attrs(info: dict, values: dict) -> dict:
    """Attribute values as the ai.polyop schema types them (a bool is an INT 0/1, SPEC §1);
    absent ones (None) are left to the schema's defaults."""
    out = {}
    for d in info["attrs"]:
        v = values.get(d["name"])
        if v is None:
            continue
        out[d["name"]] = int(v) if d["type"] == "bool" else v
    return out


def _translation(info: dict, opset: Any):
    """An onnxscript-traceable function for one op: its signature is the op's schema
    (tensors, then typed attributes with defaults), its body one ai.polyop node."""
    import inspect

    P = inspect.Parameter
    params = [P(i["name"], P.POSITIONAL_OR_KEYWORD, default=None if i["optional"] else P.empty)
              for i in info["inputs"]]
    params += [P(a["name"], P.POSITIONAL_OR_KEYWORD,
                 default=None if a["required"] else a.get("default"),
                 annotation=_PY_ATTR_TYPES[a["type"]])
               for a in info["attrs"]]
    sig = inspect.Signature(params)
    names = [i["name"] for i in info["inputs"]]

    def translate(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        tensors = [bound.arguments[n] for n in names]
        while tensors and tensors[-1] is None:  # absent trailing optional inputs
            tensors.pop()
        return getattr(opset, info["onnx_name"])(*tensors, **_onnx_attrs(info, bound.arguments))

    translate.__name__ = translate.__qualname__ = info["name"]
    translate.__signature__ = sig
    translate.__annotations__ = {a["name"]: _PY_ATTR_TYPES[a["type"]] for a in info["attrs"]}
    return translate


def onnx_translation_table(library: str | None = None, domain: str | None = None) -> dict:
    """The ``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)``: every
    op of the library (default: the stock one) becomes one ``ai.polyop`` node with the
    schema's attributes, so a model using polyop ops exports with::

        torch.onnx.export(model, args, dynamo=True,
                          custom_translation_table=polyop.torch.onnx_translation_table())

    The exported model imports the ``ai.polyop`` domain (version 1), dynamic dims stay
    ``dim_param``s, and it runs in ONNX Runtime with polyop's library
    (``polyop.onnxruntime.session_options()``). ``domain``: an author's library's ONNX domain
    (its ONNX Runtime library's name); the stock domain by default. Needs ``onnxscript``."""
    import onnxscript

    from . import onnx as polyop_onnx  # registers the OpSchemas onnxscript builds nodes from

    ns, meta, infos = _exported_ops(library)
    domain = domain or polyop_onnx.DOMAIN
    if library is not None:
        polyop_onnx.register_schemas(meta, domain)
    opset = onnxscript.values.Opset(domain, polyop_onnx.OPSET_VERSION)
    handle = getattr(torch.ops, ns)
    return {getattr(handle, i["name"]).default: _translation(i, opset) for i in infos}


def register_onnx_symbolics(library: str | None = None, domain: str | None = None) -> list[str]:
    """Register a ``torch.onnx.register_custom_op_symbolic`` for every op, for the TorchScript
    exporter (``torch.onnx.export(..., dynamo=False)``): each call becomes one ``ai.polyop``
    node with the schema's attributes; pass ``custom_opsets={"ai.polyop": 1}`` to the export.
    Returns the registered ``ns::name``s."""
    from torch.onnx import symbolic_helper as sh

    from . import onnx as polyop_onnx

    ns, meta, infos = _exported_ops(library)
    domain = domain or polyop_onnx.DOMAIN
    kinds = {"int": "i", "float": "f", "bool": "b", "str": "s", "int[]": "is", "float[]": "fs"}
    suffix = {"int": "i", "float": "f", "bool": "i", "str": "s", "int[]": "i", "float[]": "f"}
    done = []
    for info in infos:
        n_in = len(info["inputs"])

        def symbolic(g, *args, info=info, n_in=n_in):
            tensors = list(args[:n_in])
            while tensors and sh._is_none(tensors[-1]):
                tensors.pop()
            values = {d["name"]: (None if sh._is_none(v) else sh._maybe_get_const(v, kinds[d["type"]]))
                      for d, v in zip(info["attrs"], args[n_in:])}
            attrs = {f"{k}_{suffix[d['type']]}": v for d in info["attrs"]
                     for k, v in _onnx_attrs(info, values).items() if k == d["name"]}
            return g.op(f"{domain}::{info['onnx_name']}", *tensors, outputs=len(info["outputs"]),
                        **attrs)

        torch.onnx.register_custom_op_symbolic(f"{ns}::{info['name']}", symbolic, 1)
        done.append(f"{ns}::{info['name']}")
    return done
