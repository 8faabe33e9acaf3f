"""Op metadata, shape inference and direct execution from a built polyop library.

Every library built with an adapter's ``export!`` macro (the four stock ``libpolyop_<fw>.so``
and any author's library) exports, besides its framework entry points::

    const char* polyop_library_info(void);     // JSON: framework, name, op metadata
    char* polyop_infer(const char* request);   // JSON shape inference
    char* polyop_run(op, attrs_json, inputs, n_inputs, outputs, n_outputs)
    void polyop_free_string(char*);

(see ``crates/polyop-export``). :class:`Library` reads them with ``ctypes`` and offers the
same interface as the stock core ``polyop._core``: ``ops()``, ``op_info(name)``,
``infer(name, specs, **attrs)``, ``run(name, *arrays, **attrs)``. :data:`STOCK` is that
interface over ``polyop._core`` for the stock registry, so the framework glue is written once
against "a metadata source" and serves both.

A torch or TensorFlow library links its framework: import (and load the library through) the
framework first, as the glue does; an XLA library loads on its own.

The framework glue shares two more things from here: :func:`require_framework`, the one
availability check every ``polyop.<framework>`` module runs on import (one ``ImportError``
naming the framework and its pip package), and :class:`Loaded`, what every
``polyop.<framework>.load()`` returns.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import math
import os
import threading
from typing import Any, Callable, Iterable, Mapping, NamedTuple

__all__ = [
    "Library", "STOCK", "open_library", "LibraryError", "NAME_KEYS", "op_notes",
    "backward_args", "grads_by_input", "FRAMEWORKS", "framework_available", "require_framework",
    "Loaded", "axis_attrs",
]


# ------------------------------------------------------------------------ framework availability


class Framework(NamedTuple):
    """A framework polyop has glue for."""

    #: The name libraries give it (``polyop_library_info``'s ``framework``).
    name: str
    #: What users call it in messages.
    display: str
    #: The Python modules the glue imports, the framework's own first.
    modules: tuple[str, ...]
    #: What to ``pip install`` for them (the versions CI pins are in ci/requirements.lock).
    pip: str
    #: The polyop module with its glue.
    glue: str


#: Every framework with a ``polyop.<module>`` glue, by library framework name.
FRAMEWORKS: dict[str, Framework] = {
    "torch": Framework("torch", "PyTorch", ("torch",), "torch", "polyop.torch"),
    "tensorflow": Framework("tensorflow", "TensorFlow", ("tensorflow",), "tensorflow-cpu",
                            "polyop.tensorflow"),
    "onnxruntime": Framework("onnxruntime", "ONNX Runtime", ("onnxruntime", "onnx"),
                             "onnxruntime onnx", "polyop.onnxruntime"),
    "xla": Framework("xla", "JAX", ("jax", "jaxlib", "ml_dtypes"), "jax", "polyop.jax"),
    "mindspore": Framework("mindspore", "MindSpore", ("mindspore",), "mindspore",
                           "polyop.mindspore"),
}
_ALIASES = {"jax": "xla"}


def _framework(name: str) -> Framework:
    try:
        return FRAMEWORKS[_ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(
            f"polyop: unknown framework {name!r} (expected one of {', '.join(FRAMEWORKS)})"
        ) from None


def framework_available(name: str) -> bool:
    """Whether the modules ``polyop.<framework>`` needs are installed (found without importing
    them). ``name``: ``"torch"``, ``"tensorflow"``, ``"onnxruntime"``, ``"xla"`` (or ``"jax"``)."""
    fw = _framework(name)
    try:
        return all(importlib.util.find_spec(m) is not None for m in fw.modules)
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken parent
        return False


def require_framework(name: str):
    """Import the modules the glue for framework ``name`` needs and return the framework's own
    module; the one availability check of every ``polyop.<framework>`` module. A missing (or
    unimportable) module raises ``ImportError`` naming the framework, the module and the pip
    package, chained to the original error."""
    fw = _framework(name)
    mods = []
    for m in fw.modules:
        try:
            mods.append(importlib.import_module(m))
        except ImportError as e:
            raise ImportError(
                f"{fw.glue} needs {fw.display}: cannot import `{m}` ({type(e).__name__}: {e}). "
                f"Install it with `pip install {fw.pip}`; `import polyop` itself works without it.",
                name=m,
            ) from e
    return mods[0]


# ------------------------------------------------------------------------ what load() returns


def namespace_of(meta: Any) -> str:
    """The namespace errors name a library's ops with: a :class:`Library`'s ``namespace``
    (``Registry::named`` in Rust), ``polyop`` for the stock ops (the ``polyop`` module)."""
    return getattr(meta, "namespace", None) or "polyop"


def op_label(meta: Any, name: str) -> str:
    """``<namespace>.<op>``, as every error names an op (see :func:`namespace_of`)."""
    return f"{namespace_of(meta)}.{name}"


def axis_attrs(info: Mapping) -> tuple[str, ...]:
    """The names of op ``info``'s attributes whose declared role is ``"axis"`` (they select an
    axis of the op's first tensor input), from the schema metadata, in schema order."""
    return tuple(a["name"] for a in info["attrs"] if a.get("role") == "axis")


class Loaded:
    """One polyop library loaded into one framework: what every ``polyop.<framework>.load()``
    returns (``polyop.torch``, ``polyop.tensorflow``, ``polyop.onnxruntime``, ``polyop.jax``),
    with the same attributes everywhere:

    - ``framework``: ``"torch"``, ``"tensorflow"``, ``"onnxruntime"`` or ``"xla"``;
    - ``path``: the library file (real path);
    - ``name``: the library's torch namespace / TF op-type prefix / ONNX domain / XLA target
      prefix (``"polyop"``, ``"Polyop"``, ``"ai.polyop"``, ``"polyop_"`` for the stock ones);
    - ``op_names``: the ops callable through this object (the framework's surface: in-place
      ops are torch-only), in registry order;
    - ``handle``: the framework's own object for the library: torch ``torch.ops.<namespace>``,
      TensorFlow the module ``tf.load_op_library`` returned, ONNX Runtime a ``SessionOptions``
      factory (``handle(intra_op_num_threads=2)``), JAX a dict op name -> registered FFI target
      name;
    - ``library``: the library's metadata read from its own exports (a :class:`Library`:
      ``ops()``, ``op_info()``, ``infer()``, ``run()``, ``exported``) and ``info``, its
      ``polyop_library_info`` dict;
    - one attribute per op (``lib.topk(x, k=2)``; an op whose name clashes with one of these
      attributes is reached through ``op``/``call`` only), ``op(name)`` and
      ``call(name, *tensors, **attrs)``, taking the framework's tensors (ONNX Runtime: NumPy
      arrays, run in an ``InferenceSession``).
    """

    _RESERVED = frozenset(
        {"framework", "path", "name", "op_names", "handle", "library", "info", "op", "call"}
    )

    def __init__(
        self,
        framework: str,
        path: str,
        name: str,
        handle: Any,
        ops: Mapping[str, Callable],
        library: "Library | None" = None,
        call: Callable | None = None,
    ):
        self.framework = framework
        self.path = os.path.realpath(path)
        self.name = name
        self.handle = handle
        self._ops = dict(ops)
        self.op_names: tuple[str, ...] = tuple(self._ops)
        self._library = library
        self._call = call
        for n, fn in self._ops.items():
            if n not in self._RESERVED and not n.startswith("_"):
                setattr(self, n, fn)

    @property
    def library(self) -> "Library":
        if self._library is None:
            self._library = open_library(self.path)
        return self._library

    @property
    def info(self) -> dict:
        return self.library.info

    def op(self, name: str) -> Callable:
        """The callable of op ``name`` in this framework."""
        try:
            return self._ops[name]
        except KeyError:
            raise ValueError(
                f"polyop: {self.framework} library {self.name!r} has no op `{name}` "
                f"(known: {', '.join(self._ops)})"
            ) from None

    def call(self, name: str, *tensors: Any, **attrs: Any) -> Any:
        """Call op ``name`` on tensors (``None`` for an absent optional input) with attributes
        by name."""
        if self._call is not None:
            return self._call(name, *tensors, **attrs)
        return self.op(name)(*tensors, **attrs)

    def __dir__(self) -> Iterable[str]:
        return sorted(set(super().__dir__()) | set(self._ops))

    def __repr__(self) -> str:
        return (f"<polyop {self.framework} library {self.name!r} ({len(self.op_names)} ops) "
                f"{self.path}>")



def backward_args(name: str, bwd: dict, grad: Any, fwd_input: Any, fwd_output: Any) -> list:
    """The backward op's tensor arguments, in order, from an op's ``backward`` metadata: each
    ``("grad", i)``, ``("input", i)`` or ``("output", i)`` entry is supplied by ``grad(i)``,
    ``fwd_input(i)`` or ``fwd_output(i)``. Each framework's gradient glue passes its own
    accessors (and its own zero-filling of missing incoming gradients)."""
    pick = {"grad": grad, "input": fwd_input, "output": fwd_output}
    args = []
    for kind, i in bwd["inputs"]:
        if kind not in pick:  # pragma: no cover - metadata contract of the core
            raise RuntimeError(f"polyop.{name}: unknown backward input kind {kind!r}")
        args.append(pick[kind](i))
    return args


def grads_by_input(bwd: dict, results: Any, n_inputs: int) -> list:
    """Scatter the backward op's results onto the forward op's tensor inputs (``None`` for an
    input the backward does not differentiate)."""
    out: list[Any] = [None] * n_inputs
    for j, fwd_input in enumerate(bwd["outputs"]):
        out[fwd_input] = results[j]
    return out


def op_notes(flags: dict, grad_op: str | None) -> list[str]:
    """Short human labels for an op's flags and gradient, for listings (`python -m polyop ops`,
    `python -m polyop check`)."""
    notes = []
    if flags["backward_only"]:
        notes.append("backward")
    if flags["inplace"]:
        notes.append("in-place")
    if flags["data_dependent_shape"]:
        notes.append("data-dependent shape")
    if grad_op:
        notes.append(f"grad: {grad_op}")
    return notes

#: framework -> the key naming the library's ops (torch namespace, TF op-type prefix, ONNX
#: domain, XLA target prefix).
NAME_KEYS = {"torch": "namespace", "tensorflow": "prefix", "onnxruntime": "domain", "xla": "prefix"}


class LibraryError(RuntimeError):
    """A file that is not a usable polyop library (missing symbols, bad metadata)."""


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int64),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("data", ctypes.c_void_p),
    ]


_ERRORS = {"type": TypeError, "value": ValueError, "unsupported": NotImplementedError, "internal": RuntimeError}


def _raise(d: dict) -> None:
    raise _ERRORS.get(d.get("kind"), RuntimeError)(d.get("error", "polyop: unknown error"))


def _json_attr(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (list, tuple)):
        return [_json_attr(x) for x in v]
    if hasattr(v, "tolist"):
        return _json_attr(v.tolist())
    return v


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        return dtype
    import numpy as np

    return np.dtype(dtype).name


#: A framework library a polyop library links to (its soname prefix) -> the Python package
#: whose import loads it. The libraries carry no absolute RUNPATH (they can be moved), so
#: the loader finds these only once the framework has loaded them.
_FRAMEWORK_SONAMES = {"libtorch_cpu.so": "torch", "libtensorflow_framework.so": "tensorflow"}


def _load_dll(path: str):
    """``ctypes.CDLL(path)``; if the library needs a framework's own library that is not
    loaded yet, import that framework (as ``torch.ops.load_library`` / ``tf.load_op_library``
    users do) and try again."""
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        module = next((m for so, m in _FRAMEWORK_SONAMES.items() if so in str(e)), None)
        if module is None:
            raise
        import importlib

        try:
            importlib.import_module(module)
        except ImportError as ie:
            raise OSError(f"{e} (it is a {module} library and {module} is not installed: {ie})") from None
        return ctypes.CDLL(path)


class Library:
    """One built polyop library (any framework), read through its C exports."""

    def __init__(self, path: str):
        self.path = os.path.realpath(path)
        try:
            self._dll = _load_dll(self.path)
        except OSError as e:
            raise LibraryError(f"polyop: cannot load {path}: {e}") from None
        try:
            info_fn = self._dll.polyop_library_info
            self._infer = self._dll.polyop_infer
            self._run = self._dll.polyop_run
            self._free = self._dll.polyop_free_string
        except AttributeError as e:
            raise LibraryError(
                f"polyop: {path} is not a polyop library (no {str(e).split()[-1]} symbol; build it "
                "with an adapter's export! macro)"
            ) from None
        info_fn.restype = ctypes.c_char_p
        self._infer.restype = ctypes.c_void_p
        self._infer.argtypes = [ctypes.c_char_p]
        self._run.restype = ctypes.c_void_p
        self._run.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_Tensor), ctypes.c_size_t,
                              ctypes.POINTER(_Tensor), ctypes.c_size_t]
        self._free.argtypes = [ctypes.c_void_p]
        try:
            self.info: dict = json.loads(info_fn().decode())
        except (ValueError, UnicodeDecodeError) as e:
            raise LibraryError(f"polyop: {path}: polyop_library_info returned bad JSON: {e}") from None
        if "error" in self.info or self.info.get("polyop_library") != 1:
            raise LibraryError(f"polyop: {path}: unsupported library info {str(self.info)[:200]}")
        if self.info.get("load_errors"):
            # The library's load-time constructor could not register (all) its ops with the
            # framework; the framework's loader cannot report that, so it is reported here.
            raise LibraryError(
                f"polyop: {path} failed to register its ops with {self.info['framework']}: "
                + "; ".join(self.info["load_errors"])
            )
        self.framework: str = self.info["framework"]
        self.name_key: str = self.info["name_key"]
        #: torch namespace / TF op-type prefix / ONNX domain / XLA target prefix.
        self.name: str = self.info[self.name_key]
        #: the registry's namespace: errors name an op ``<namespace>.<op>`` (``polyop`` for
        #: the stock ops; ``Registry::named`` in Rust).
        self.namespace: str = self.info.get("namespace") or "polyop"
        self.exported: list[str] = list(self.info["exported"])
        self._ops = self.info["ops"]
        for o in self._ops:
            o["backward"] = o["backward"] and {
                **o["backward"], "inputs": [tuple(i) for i in o["backward"]["inputs"]]
            }
        self._by_name = {o["name"]: o for o in self._ops}

    def __repr__(self) -> str:
        return f"<polyop library {self.framework} {self.name_key}={self.name!r} {self.path}>"

    def framework_ops(self) -> "Loaded":
        """The library loaded into its framework, as ``polyop.<framework>.load(path)`` gives it
        (autograd / gradients / fake kernels registered, one attribute per op)."""
        import importlib

        return importlib.import_module(_framework(self.framework).glue).load(self.path)

    # The polyop._core interface ------------------------------------------------------------

    def ops(self) -> list[dict]:
        return [dict(o) for o in self._ops]

    def op_info(self, name: str) -> dict:
        try:
            return dict(self._by_name[name])
        except KeyError:
            raise ValueError(
                f"polyop: unknown op `{name}` (known: {', '.join(self._by_name)})"
            ) from None

    def _call_str(self, fn, *args) -> str | None:
        p = fn(*args)
        if not p:
            return None
        try:
            return ctypes.string_at(p).decode()
        finally:
            self._free(p)

    def infer_symbolic(self, name: str, input_specs, **attrs) -> dict:
        """Shape inference with symbolic dims (strings name symbols): ``{"outputs": [[shape,
        dtype], ...], "constraints": [[relation, lhs, rhs, message], ...]}``, dims in the wire
        form of ``polyop.infer`` (docs/shapes.md)."""
        specs = []
        for s in input_specs:
            if s is None:
                specs.append(None)
            else:
                shape, dtype = s
                dims = None if shape is None else [
                    d if d is None or isinstance(d, str) else int(d) for d in shape
                ]
                specs.append([dims, _dtype_name(dtype)])
        req = json.dumps({"op": name, "inputs": specs, "attrs": {k: _json_attr(v) for k, v in attrs.items()}})
        d = json.loads(self._call_str(self._infer, req.encode()))
        if "error" in d:
            _raise(d)
        return d

    def infer(self, name: str, input_specs, **attrs) -> list[tuple]:
        d = self.infer_symbolic(name, input_specs, **attrs)
        return [(None if s is None else tuple(s), dt) for s, dt in d["outputs"]]

    def run(self, name: str, *arrays, **attrs):
        """Run the library's CPU kernel on NumPy arrays (no framework involved): outputs are
        allocated to the inferred shapes and written by the kernel. Ops with a data-dependent
        output shape are refused (NotImplementedError)."""
        import numpy as np

        info = self.op_info(name)
        if info["flags"]["data_dependent_shape"]:
            raise NotImplementedError(f"{self.namespace}.{name}: data-dependent output shape; run it in a framework")
        arrays = list(arrays) + [None] * (info["num_inputs"] - len(arrays))
        ins, keep = [], []
        for a in arrays:
            if a is None:
                ins.append(_Tensor(None, -1, None, None, None))
                continue
            a = np.asarray(a)
            if a.dtype.name == "bfloat16":
                import ml_dtypes  # noqa: F401
            item = a.dtype.itemsize
            if not a.flags.aligned or any(s % item for s in a.strides):
                a = np.ascontiguousarray(a)
            shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
            strides = (ctypes.c_int64 * max(a.ndim, 1))(*[s // item for s in a.strides])
            dt = a.dtype.name.encode()
            keep += [a, shape, strides, dt]
            ins.append(_Tensor(dt, a.ndim, shape, strides, a.__array_interface__["data"][0]))
        specs = [None if a is None else (np.asarray(a).shape, np.asarray(a).dtype.name) for a in arrays]
        out_specs = self.infer(name, specs, **attrs)
        outs, out_descs = [], []
        for shape, dtype in out_specs:
            if dtype == "bfloat16":
                import ml_dtypes

                o = np.empty(shape, dtype=ml_dtypes.bfloat16)
            else:
                o = np.empty(shape, dtype=dtype)
            sh = (ctypes.c_int64 * max(o.ndim, 1))(*o.shape)
            dt = dtype.encode()
            keep += [sh, dt]
            outs.append(o)
            out_descs.append(_Tensor(dt, o.ndim, sh, None, o.__array_interface__["data"][0]))
        in_arr = (_Tensor * max(len(ins), 1))(*ins)
        out_arr = (_Tensor * max(len(out_descs), 1))(*out_descs)
        attrs_json = json.dumps({k: _json_attr(v) for k, v in attrs.items()}).encode()
        err = self._call_str(self._run, name.encode(), attrs_json, in_arr, len(ins), out_arr, len(out_descs))
        del keep
        if err is not None:
            _raise(json.loads(err))
        return outs[0] if len(outs) == 1 else tuple(outs)


class _Stock:
    """The :class:`Library` interface over the stock registry (``polyop._core``)."""

    framework = None
    path = None

    def ops(self):
        from . import _core

        return _core.ops()

    def op_info(self, name):
        from . import _core

        return _core.op_info(name)

    def infer(self, name, input_specs, **attrs):
        from . import _core

        return _core.infer(name, input_specs, **attrs)

    def infer_symbolic(self, name, input_specs, **attrs):
        from . import _core

        return _core.infer_symbolic(name, input_specs, **attrs)

    def run(self, name, *arrays, **attrs):
        from . import _core

        return _core.run(name, *arrays, **attrs)


#: The stock registry as a metadata source.
STOCK = _Stock()

_cache: dict[str, Library] = {}
_lock = threading.Lock()


def open_library(path: str) -> Library:
    """The :class:`Library` at ``path`` (one object per real path)."""
    real = os.path.realpath(path)
    with _lock:
        lib = _cache.get(real)
        if lib is None:
            lib = _cache[real] = Library(real)
        return lib
