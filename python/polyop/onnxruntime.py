"""polyop ops in ONNX Runtime: session options with the library registered, and ONNX model
helpers for the ``ai.polyop`` domain.

The raw library works on its own (``SessionOptions.register_custom_ops_library(path)``); this
module only adds conveniences::

    import polyop.onnxruntime as pox

    so = pox.session_options(intra_op_num_threads=2)     # SessionOptions + the library
    node = pox.make_node("topk", ["x"], ["v", "i"], k=2)  # an ai.polyop NodeProto
    model = pox.make_model("topk", [x], k=2)              # a one-node ModelProto
    values, indices = pox.run("topk", x, k=2)             # build + InferenceSession + run

    so = pox.provider_session_options()  # standard ONNX ops (Conv, Add, ...) on polyop's
                                         # execution provider, the rest on the CPU provider

``load(path=None)`` returns the object every ``polyop.<framework>.load()`` returns
(:class:`polyop._library.Loaded`): one attribute per op running it in an ``InferenceSession``
on NumPy arrays (``lib.topk(x, k=2)``, like :func:`run`), ``call(name, *arrays, **attrs)``,
``path``, ``name`` (the ONNX domain), ``op_names``, ``library``/``info`` and ``handle``, a
``SessionOptions`` factory with the library registered (``lib.handle(intra_op_num_threads=2)``).

An author's library (built with ``polyop_onnxruntime::export!``, see docs/authoring.md) is
used the same way: ``lib = pox.load(path)``, or pass ``library=path`` to any helper here (the
domain, op types, schemas and output shapes then come from that library's own metadata):
``pox.make_model("swiglu", [x, g], library=path)``.

Importing it imports :mod:`polyop.onnx`, which registers the ``ai.polyop`` OpSchemas with
``onnx.defs`` (``onnx.checker`` and ``onnx.shape_inference`` then know polyop nodes);
:func:`register_schemas` does the same for an author's library.

Attributes follow SPEC §1: a ``bool`` is an INT attribute 0/1 (ONNX has no bool), a ``float``
a FLOAT, a ``str`` a STRING; absent optional inputs are empty input names.

Importing this module without onnxruntime (or onnx) installed raises one ``ImportError``
naming the pip packages (:func:`polyop._library.require_framework`).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Iterable, Sequence

from ._library import require_framework

require_framework("onnxruntime")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import polyop  # noqa: E402

from . import _shapes  # noqa: E402
from . import onnx as _onnx  # noqa: E402  (registers the ai.polyop OpSchemas)
from ._library import Loaded, namespace_of  # noqa: E402
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph  # noqa: E402
from .onnx import DOMAIN, OPSET_VERSION, tensor_type  # noqa: E402,F401
from .onnx import onnx_attr as _onnx_attr  # noqa: E402

__all__ = [
    "load",
    "register_schemas",
    "DOMAIN",
    "OPSET_VERSION",
    "library_path",
    "session_options",
    "op_type",
    "make_node",
    "make_model",
    "session",
    "check_model",
    "run",
    "tensor_type",
]

#: Default opset for the standard ONNX domain in models built here (Gelu needs 20).
ONNX_OPSET = 20
#: IR version of models built here: IR 10 (ONNX 1.16) is understood by every onnxruntime
#: release the library supports that also has opset 20 (the onnx package may default to a
#: newer IR than the installed onnxruntime accepts).
IR_VERSION = 10

def library_path() -> str:
    """Path of ``libpolyop_onnxruntime.so`` (``$POLYOP_LIB_DIR`` or the checkout's build)."""
    return polyop.library_path("onnxruntime")


def _lib(library: str | None):
    """(library path, ONNX domain, metadata source) for the stock or an author's library."""
    if library is None:
        return library_path(), DOMAIN, polyop
    from . import _library

    lib = _library.open_library(library)
    if lib.framework != "onnxruntime":
        raise RuntimeError(f"polyop: {library} is a {lib.framework} library, not an ONNX Runtime one")
    return lib.path, lib.name, lib


_loaded: dict[str | None, Loaded] = {}


def load(path: str | None = None) -> Loaded:
    """The library at ``path`` (default: the stock ``libpolyop_onnxruntime.so``; or an
    author's library) as a :class:`polyop._library.Loaded`: one attribute per op that runs
    it through ONNX Runtime (:func:`run` with ``library=path``), ``call``, ``name`` (the ONNX
    domain) and ``handle``, a ``SessionOptions`` factory with the library registered
    (:func:`session_options` with ``library=path``). Nothing is registered until a session
    is made: ONNX Runtime registers a custom-op library per ``SessionOptions``."""
    lib_path, domain, meta = _lib(path)
    register_schemas(path)
    key = None if path is None else lib_path
    lib = _loaded.get(key)
    if lib is None:
        # In-place ops are torch-only: ONNX Runtime registers the out-of-place op.
        names = [o["name"] for o in meta.ops() if not o["flags"]["inplace"]]
        fns = {n: functools.partial(run, n, library=path) for n in names}
        lib = _loaded[key] = Loaded(
            "onnxruntime", lib_path, domain, functools.partial(session_options, path), fns,
            library=None if path is None else meta,
        )
    return lib


def session_options(library: str | None = None, **kw: Any) -> ort.SessionOptions:
    """A new ``onnxruntime.SessionOptions`` with the polyop library (or ``library``, an
    author's library path) registered. Keyword arguments set ``SessionOptions`` attributes
    (``intra_op_num_threads=2``, ...)."""
    so = ort.SessionOptions()
    for k, v in kw.items():
        if not hasattr(so, k):
            raise TypeError(f"polyop: onnxruntime.SessionOptions has no attribute {k!r}")
        setattr(so, k, v)
    so.register_custom_ops_library(_lib(library)[0])
    return so


#: The execution provider's name for the stock library (``<Namespace>ExecutionProvider`` for
#: an author's registry ``Registry::named("<namespace>")``).
PROVIDER = "PolyopExecutionProvider"

_providers: dict[str, str] = {}


def provider_name(library: str | None = None) -> str:
    """The execution provider name of the stock library (``PolyopExecutionProvider``) or of
    ``library``: its registry namespace in CamelCase + ``ExecutionProvider``."""
    if library is None:
        return PROVIDER
    ns = namespace_of(_lib(library)[2])
    return "".join(w[:1].upper() + w[1:] for w in ns.split("_")) + "ExecutionProvider"


def provider_devices(library: str | None = None) -> list:
    """The ``OrtEpDevice``s of polyop's execution provider (the stock library, or
    ``library``), registering the library with
    ``onnxruntime.register_execution_provider_library`` once per process."""
    path = _lib(library)[0]
    if path not in _providers:
        name = "polyop" if library is None else f"polyop:{path}"
        ort.register_execution_provider_library(name, path)
        _providers[path] = name
    ep = provider_name(library)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == ep]
    if not devices:
        raise RuntimeError(f"polyop: {path} registered but offers no {ep} device")
    return devices


def provider_session_options(library: str | None = None, **kw: Any) -> ort.SessionOptions:
    """A new ``onnxruntime.SessionOptions`` that runs the standard ONNX ops polyop implements
    (``Conv``, ``Softmax``, ``Add``, ...; docs/onnxruntime.md has the table) on polyop's
    execution provider, ONNX Runtime's CPU provider running every other node::

        so = pox.provider_session_options(enable_profiling=True)
        sess = onnxruntime.InferenceSession("resnet50.onnx", so)

    Keyword arguments set ``SessionOptions`` attributes. ``library``: an author's library.

    The graph optimization level defaults to ``ORT_ENABLE_EXTENDED``, not ONNX Runtime's
    ``ORT_ENABLE_ALL``: the one optimization left out is the CPU provider's NCHWc layout, which
    pays for itself through its own convolutions. With polyop running them, it only wraps the
    pooling nodes between them in layout conversions (SqueezeNet: 0.33 ms of reorders in a 6.3
    ms run; whole models 0-5% faster without it). Pass ``graph_optimization_level`` to choose."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    for k, v in kw.items():
        if not hasattr(so, k):
            raise TypeError(f"polyop: onnxruntime.SessionOptions has no attribute {k!r}")
        setattr(so, k, v)
    # keeps ONNX Runtime's record of which provider each model node went to (node_providers)
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(provider_devices(library), {})
    return so


def node_providers(session: ort.InferenceSession) -> dict[str, str]:
    """``{model node name: execution provider}`` for a session made with
    :func:`provider_session_options`, from ONNX Runtime's own record of its partitioning. A
    ``Conv`` whose only reader is a ``Relu`` runs with it as one fused node: the profile names
    that node ``PolyopExecutionProvider_...``, and this lists both model nodes under
    ``PolyopExecutionProvider``."""
    return {n.name: sg.ep_name for sg in session.get_provider_graph_assignment_info() for n in sg.get_nodes()}


def op_type(op: str, library: str | None = None) -> str:
    """The ONNX op type of polyop op ``op`` (``"topk"`` -> ``"TopK"``)."""
    return _lib(library)[2].op_info(op)["onnx_name"]


def register_schemas(library: str | None = None) -> list[str]:
    """Register the ``onnx.defs`` OpSchemas of the library's domain (default: the stock
    ``ai.polyop``, registered on import; or an author's library path): see
    :func:`polyop.onnx.register_schemas`. Returns the op types registered now."""
    _, domain, meta = _lib(library)
    return _onnx.register_schemas(meta, domain)


def make_node(
    op: str,
    inputs: Sequence[str | None],
    outputs: Sequence[str],
    name: str | None = None,
    library: str | None = None,
    **attrs: Any,
) -> onnx.NodeProto:
    """An ``ai.polyop`` node for polyop op ``op`` (snake_case name, e.g. ``"rms_norm"``).

    ``inputs``: tensor names in schema order; ``None`` or ``""`` for an absent optional input.
    Attributes are checked against the schema (unknown names are an error) and typed per SPEC
    §1 (bool -> INT 0/1, float -> FLOAT, str -> STRING). Attributes left out take the schema
    default inside the kernel.
    """
    _, domain, meta = _lib(library)
    info = meta.op_info(op)
    decls = {a["name"]: a for a in info["attrs"]}
    unknown = [k for k in attrs if k not in decls]
    if unknown:
        raise TypeError(
            f"{namespace_of(meta)}.{op}: unknown attribute `{unknown[0]}` (this op takes: "
            f"{', '.join(decls) or 'no attributes'})"
        )
    if len(inputs) > info["num_inputs"]:
        raise TypeError(
            f"{namespace_of(meta)}.{op}: expected at most {info['num_inputs']} input(s), got {len(inputs)}"
        )
    node = helper.make_node(
        info["onnx_name"],
        ["" if i is None else i for i in inputs],
        list(outputs),
        name=name,
        domain=domain,
    )
    node.attribute.extend(_onnx_attr(op, decls[k], v, namespace_of(meta)) for k, v in attrs.items())
    return node


def _spec(x: Any) -> tuple[tuple | None, str] | None:
    """An array, a ``(shape, dtype)`` spec or ``None`` as ``(shape, dtype_name)``."""
    if x is None:
        return None
    if isinstance(x, tuple) and len(x) == 2 and not isinstance(x[0], (int, np.integer)):
        shape, dtype = x
        dname = dtype if isinstance(dtype, str) else np.dtype(dtype).name
        return (None if shape is None else tuple(shape), dname)
    a = np.asarray(x)
    return (tuple(a.shape), a.dtype.name)


def make_model(
    op: str,
    inputs: Iterable[Any],
    library: str | None = None,
    **attrs: Any,
) -> onnx.ModelProto:
    """A one-node model running polyop op ``op``.

    ``inputs``: one entry per schema tensor input, each a NumPy array (its shape and dtype are
    used), a ``(shape, dtype)`` spec (``None`` for unknown dims, ``shape=None`` for unknown
    rank) or ``None`` for an absent optional input (an empty input name). Graph inputs and
    outputs are named after the schema (``x``, ``weight``; ``values``, ``indices``). Output
    types and shapes come from polyop's shape inference; when that rejects the inputs the
    outputs are left untyped so the session reports the op's own error.
    """
    _, domain, meta = _lib(library)
    info = meta.op_info(op)
    specs = [_spec(x) for x in inputs]
    in_names = [a["name"] for a in info["inputs"]][: len(specs)]
    out_names = [o["name"] for o in info["outputs"]]
    node = make_node(op, [n if s is not None else "" for n, s in zip(in_names, specs)], out_names,
                     library=library, **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(n, tensor_type(s[1]), None if s[0] is None else list(s[0]))
        for n, s in zip(in_names, specs)
        if s is not None
    ]
    try:
        out_specs = meta.infer(op, specs, **attrs)
    except (TypeError, ValueError):
        out_specs = None
    if out_specs is None:
        graph_outputs = [helper.make_empty_tensor_value_info(n) for n in out_names]
    else:
        graph_outputs = [
            helper.make_tensor_value_info(
                n, tensor_type(d), None if shp is None else [_shapes.onnx_dim(x) for x in shp])
            for n, (shp, d) in zip(out_names, out_specs)
        ]
    graph = helper.make_graph([node], f"polyop_{op}", graph_inputs, graph_outputs)
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", ONNX_OPSET),
            helper.make_opsetid(domain, OPSET_VERSION),
        ],
        ir_version=IR_VERSION,
        producer_name="polyop",
    )


def _nodes(nodes):
    """``nodes`` and every node of their subgraphs (If/Loop/Scan bodies), depth first."""
    for n in nodes:
        yield n
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                      a.graphs if a.type == onnx.AttributeProto.GRAPHS else []):
                yield from _nodes(g.node)


def check_model(model: onnx.ModelProto | bytes, library: str | None = None) -> None:
    """Check every node of the library's domain in ``model`` (subgraphs and model-local
    functions included): a known op type and only the op's own attribute names.

    ONNX Runtime does not do this for custom ops: it builds their schemas with
    ``AllowUncheckedAttributes()`` and gives a kernel no way to list its node's attributes,
    so a typo such as ``axes`` for ``axis`` would be ignored and the default used.
    :func:`session` runs this check on every model; call it before creating an
    ``InferenceSession`` from :func:`session_options` yourself. Raises ONNX Runtime's own
    ``InvalidGraph``, naming the op, the node and the problem."""
    if isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    _, domain, meta = _lib(library)
    by_type = {o["onnx_name"]: o for o in meta.ops() if not o["flags"]["inplace"]}
    for n in itertools.chain(_nodes(model.graph.node), *(_nodes(f.node) for f in model.functions)):
        if n.domain != domain:
            continue
        where = f'node "{n.name}" ({domain}::{n.op_type})' if n.name else f"{domain}::{n.op_type} node"
        info = by_type.get(n.op_type)
        if info is None:
            raise InvalidGraph(
                f"{namespace_of(meta)}: {where}: "
                f"no op {n.op_type!r} in domain {domain} (it has: {', '.join(sorted(by_type))})"
            )
        known = [a["name"] for a in info["attrs"]]
        for a in n.attribute:
            if a.name not in known:
                takes = ", ".join(known) if known else "no attributes"
                raise InvalidGraph(
                    f"{namespace_of(meta)}.{info['name']}: {where}: unknown attribute `{a.name}` "
                    f"(this op takes: {takes})"
                )


@functools.lru_cache(maxsize=256)
def _cached_session(model_bytes: bytes, threads: int, library: str | None = None) -> ort.InferenceSession:
    check_model(model_bytes, library)
    so = session_options(library=library, intra_op_num_threads=threads)
    # Each cached session has a thread pool of its own, whose threads spin after every run
    # (ONNX Runtime's default, for one session's latency): with many one-op sessions that
    # spinning takes the cores from the caller's next work. Off here: the ONNX Runtime
    # conformance worker (three ops' cases) ran in 10.7 s instead of 72.5, the same results.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def session(
    model: onnx.ModelProto | bytes, intra_op_num_threads: int = 0, library: str | None = None
) -> ort.InferenceSession:
    """An ``InferenceSession`` (CPU) for ``model`` with the polyop library (or ``library``)
    registered. Sessions for identical model bytes are reused; their intra-op threads do not
    spin between runs (``session.intra_op.allow_spinning`` 0: many small sessions)."""
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return _cached_session(data, intra_op_num_threads, library)


def _feed(a: np.ndarray) -> Any:
    # (np.ascontiguousarray would turn a rank-0 array into rank 1.)
    a = np.asarray(a, order="C")
    if a.dtype.name == "bfloat16":
        # onnxruntime's NumPy bridge has no bfloat16: hand it the bits with the ONNX type.
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), TensorProto.BFLOAT16)
    return a


def run(op: str, *arrays: Any, intra_op_num_threads: int = 0, library: str | None = None,
        **attrs: Any) -> Any:
    """Run polyop op ``op`` through ONNX Runtime on NumPy arrays (``None`` for an absent
    optional input): builds a one-node model with the arrays' shapes, creates (or reuses) an
    ``InferenceSession`` and runs it. Returns one array for a single-output op, a tuple
    otherwise — like ``polyop.run``. Errors are onnxruntime's exceptions with the op's
    "polyop.<op>: ..." message."""
    info = _lib(library)[2].op_info(op)
    model = make_model(op, arrays, library=library, **attrs)
    sess = session(model, intra_op_num_threads, library)
    in_names = [a["name"] for a in info["inputs"]]
    feed = {n: _feed(np.asarray(a)) for n, a in zip(in_names, arrays) if a is not None}
    out_names = [o["name"] for o in info["outputs"]]
    if any(not isinstance(v, np.ndarray) for v in feed.values()) or _has_bf16_output(model):
        outs = _run_ortvalues(sess, feed, out_names)
    else:
        outs = sess.run(out_names, feed)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _has_bf16_output(model: onnx.ModelProto) -> bool:
    return any(
        o.type.tensor_type.elem_type == TensorProto.BFLOAT16 for o in model.graph.output
    )


def _run_ortvalues(sess: ort.InferenceSession, feed: dict, out_names: list[str]) -> list[np.ndarray]:
    """Run with OrtValues so bfloat16 tensors can cross (as raw bits)."""
    import ml_dtypes

    vals = {
        k: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
        for k, v in feed.items()
    }
    res = sess.run_with_ort_values(out_names, vals)
    outs = []
    for r in res:
        if r.data_type() == "tensor(bfloat16)":
            # Read the raw bits through a uint16 copy of the tensor.
            outs.append(_bf16_numpy(r).view(ml_dtypes.bfloat16))
        else:
            outs.append(r.numpy())
    return outs


def _bf16_numpy(v: ort.OrtValue) -> np.ndarray:
    import ctypes

    shape = v.shape()
    n = int(np.prod(shape)) if shape else 1
    buf = (ctypes.c_uint16 * max(n, 1)).from_address(v.data_ptr()) if n else None
    out = np.frombuffer(buf, dtype=np.uint16, count=n).copy() if n else np.zeros(0, np.uint16)
    return out.reshape(shape)


