"""polyop ops as JAX functions, backed by the XLA typed-FFI targets in ``libpolyop_xla.so``.

    import polyop.jax as pj
    values, indices = jax.jit(lambda x: pj.topk(x, k=2))(x)
    y = pj.rms_norm(x, weight=None, eps=1e-6)

Every op of ``polyop.ops()`` (except torch-only in-place ops) becomes a function here,
generated from its metadata; nothing in this file knows a particular op:

- **targets**: ``load()`` (called on first use) loads ``polyop.library_path("xla")`` with
  ctypes and registers target ``polyop_<name>`` for every op with
  ``jax.ffi.register_ffi_target(..., jax.ffi.pycapsule(lib.polyop_xla_handler(b"<name>")), platform="cpu")``.
  It returns the object every ``polyop.<framework>.load()`` returns
  (:class:`polyop._library.Loaded`): one attribute per op (the functions of this module),
  ``call``, ``path``, ``name`` (the target prefix), ``op_names``, ``library``/``info`` and
  ``handle``, a dict op name -> registered FFI target name.
- **shapes**: result shapes/dtypes come from kernel-core's shape inference through
  ``polyop.infer`` (bad inputs therefore fail at trace time, with the kernel's message) and
  become ``jax.ShapeDtypeStruct``s for ``jax.ffi.ffi_call``; so ``jax.jit`` and
  ``jax.eval_shape`` work without running anything.
- **attributes**: passed to the FFI call by name: ints as ``np.int64``, floats as
  ``np.float64``, bools as ``np.bool_``, strings as ``str``, int/float lists as arrays.
- **vmap**: a ``jax.custom_batching.custom_vmap`` rule chosen per call, see
  :func:`vmap_strategy`: either "direct" (call the op once on the batched operands, the
  batch axis being one more leading dim; unbatched operands are NOT broadcast) or
  "sequential" (``lax.map`` over the batch). Attributes the schema declares with the role
  ``"axis"`` (``op_info(name)["attrs"][i]["role"]``: they select an axis of the first tensor
  input) are normalised to negative values before the call, so a leading batch axis never
  changes which axis they name; no attribute is recognised by its name.
- **gradients**: ``jax.custom_vjp`` driven by ``polyop.op_info(name)["backward"]``: the
  backward op (itself an FFI target) is called on the incoming gradients / forward inputs /
  forward outputs it asks for, with the forward call's attributes taken by name. Gradients of
  absent optional inputs are dropped, integer inputs get no (zero) cotangent, inputs the
  backward op does not produce a gradient for get zero.
- ``nonzero`` (data-dependent output shape) is refused at trace time: XLA needs static shapes.
- **export**: shapes may be symbolic (``jax.export.symbolic_shape("b, 16")``): output dims are
  JAX dim expressions from kernel-core's symbolic inference. :func:`export` is
  ``jax.export.export`` with the safety checks for polyop's targets disabled
  (:func:`safety_checks`), so users never write them by hand.

Enable float64 with ``jax.config.update("jax_enable_x64", True)`` as usual in JAX.

Importing this module without JAX installed raises one ``ImportError`` naming the pip package
(:func:`polyop._library.require_framework`).
"""

from __future__ import annotations

import ctypes
import functools
import struct
import inspect
import threading
from typing import Any

from ._library import require_framework

require_framework("xla")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax import custom_batching  # noqa: E402

import polyop  # noqa: E402

from . import _sharding, _shapes  # noqa: E402
from ._library import Loaded, axis_attrs, backward_args, grads_by_input, namespace_of, op_label  # noqa: E402

__all__ = ["load", "call", "vmap_strategy", "op_names", "export", "safety_checks"]

_LOCK = threading.Lock()
_LIB: Loaded | None = None
_INFOS: dict[str, dict] = {o["name"]: o for o in polyop.ops()}

#: Batch size used to probe shape inference when choosing a vmap strategy: a prime that no
#: real dim is expected to equal, so broadcasting cannot line it up with a real dim by chance.
_PROBE = 7919


class _Src:
    """Where a family of JAX functions comes from: FFI target prefix, op metadata and shape
    inference (the stock core, or an author's library), and how to register the targets."""

    def __init__(self, prefix: str, infos: dict, meta: Any, ensure):
        self.prefix, self.infos, self.meta, self.ensure = prefix, infos, meta, ensure
        #: the library's namespace, which errors name an op with (``polyop`` for the stock)
        self.namespace = namespace_of(meta)

    def label(self, name: str) -> str:
        return op_label(self.meta, name)


_STOCK = _Src("polyop_", _INFOS, polyop, lambda: load())
_AUTHORED: dict[str, Loaded] = {}


def op_names() -> list[str]:
    """Ops available under JAX (every registered op except in-place ones)."""
    return [n for n, o in _INFOS.items() if not o["flags"]["inplace"]]


def load(path: str | None = None) -> Loaded:
    """Load ``libpolyop_xla.so``, register one FFI target per op (idempotent) and return the
    library as a :class:`polyop._library.Loaded` (one attribute per op: the JAX functions of
    this module; ``handle``: op name -> FFI target name).

    ``path`` may be an author's XLA library (built with ``polyop_xla::export!``, see
    docs/authoring.md): its targets ``<prefix><name>`` are registered and its ops become JAX
    functions (jit / vmap / grad / eval_shape like the stock ones, shapes from that library's
    own ``polyop_infer``).
    """
    global _LIB
    if path is not None:
        from . import _library

        lib = _library.open_library(path)
        if lib.framework != "xla":
            raise RuntimeError(f"polyop: {path} is a {lib.framework} library, not an XLA one")
        if lib.name != "polyop_":
            return _load_authored(lib)
    with _LOCK:
        if _LIB is not None:
            return _LIB
        lib_path = path or polyop.library_path("xla")
        targets = _register_targets(ctypes.cdll.LoadLibrary(lib_path), "polyop_", op_names(), lib_path)
        _LIB = Loaded("xla", lib_path, "polyop_", targets, {n: globals()[n] for n in op_names()},
                      call=call)
        return _LIB


def _register_targets(dll, prefix: str, names, path: str, ns: str = "polyop") -> dict[str, str]:
    """Register ``<prefix><name>`` for every op in ``names`` with the handler the library's
    ``<prefix>xla_handler(name)`` lookup gives (``polyop_xla::export!``)."""
    lookup = getattr(dll, f"{prefix}xla_handler", None)
    if lookup is None:
        raise RuntimeError(
            f"polyop: {path} exports no symbol {prefix}xla_handler (built by an older polyop?); "
            "rebuild it (cargo build --release)"
        )
    lookup.restype = ctypes.c_void_p
    lookup.argtypes = [ctypes.c_char_p]
    targets = {}
    for name in names:
        target = f"{prefix}{name}"
        fn = lookup(name.encode())
        if not fn:
            raise RuntimeError(f"{ns}.{name}: {path} has no XLA handler for {name!r}; rebuild it")
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(fn), platform="cpu")
        targets[name] = target
    return targets


def _load_authored(lib) -> Loaded:
    with _LOCK:
        loaded = _AUTHORED.get(lib.path)
        if loaded is not None:
            return loaded
        dll = ctypes.cdll.LoadLibrary(lib.path)
        targets = _register_targets(dll, lib.name, lib.exported, lib.path, lib.namespace)
        infos = {o["name"]: o for o in lib.ops() if o["name"] in lib.exported}
        src = _Src(lib.name, infos, lib, lambda: None)
        loaded = Loaded(
            "xla", lib.path, lib.name, targets, {name: _make_op(name, src) for name in infos},
            library=lib, call=lambda name, *tensors, **attrs: _apply(name, tensors, attrs, src=src),
        )
        _AUTHORED[lib.path] = loaded
        return loaded


# ---------------------------------------------------------------------------- export


def safety_checks() -> list:
    """The ``jax.export.DisabledSafetyCheck``s that let ``jax.export`` serialize calls to
    every polyop FFI target loaded in this process (the stock ones and authors'). JAX refuses
    custom calls it does not know to be stable; polyop's targets keep their ABI for as long as
    the library that registers them is the same build, which the process that deserializes
    must load again (``polyop.jax.load()``) before calling."""
    load()
    targets = set(_LIB.handle.values())
    for loaded in _AUTHORED.values():
        targets.update(loaded.handle.values())
    return [jax.export.DisabledSafetyCheck.custom_call(t) for t in sorted(targets)]


def export(fn, *, platforms=None, disabled_checks=()):
    """``jax.export.export`` for functions that call polyop ops: ``fn`` (jitted here if it is
    not already) with :func:`safety_checks` added to ``disabled_checks``. Use it as
    ``jax.export.export``: ``polyop.jax.export(f)(jax.ShapeDtypeStruct(
    jax.export.symbolic_shape("b, 16"), jnp.float32)).serialize()``; shapes may be symbolic
    (docs/shapes.md). To run the result elsewhere: ``polyop.jax.load()``, then
    ``jax.export.deserialize(blob).call(x)``."""
    if not hasattr(fn, "lower"):
        fn = jax.jit(fn)
    return jax.export.export(
        fn, platforms=platforms, disabled_checks=[*safety_checks(), *disabled_checks]
    )


# ---------------------------------------------------------------------------- helpers


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _jnp_dtype(name: str):
    if name == "bfloat16":
        return jnp.dtype(ml_dtypes.bfloat16)
    return jnp.dtype(name)


def _hashable_attr(name: str, op: str, v: Any, ns: str = "polyop"):
    """Python attribute value -> hashable canonical form (type kept for the kernel's checks)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple, np.ndarray)):
        items = [_hashable_attr(name, op, x, ns) for x in np.asarray(v).ravel().tolist()]
        return tuple(items)
    if isinstance(v, jax.core.Tracer):
        raise TypeError(
            f"{ns}.{op}: attribute `{name}` is a traced value ({type(v).__name__}); "
            "attributes are compile-time constants: pass a Python value, and under jax.jit "
            f"mark the argument static (jax.jit(f, static_argnames=...)) or close over it"
        )
    raise TypeError(
        f"{ns}.{op}: attribute `{name}` has unsupported type {type(v).__name__} "
        "(expected int, float, bool, str or a list of ints/floats)"
    )


# Float equality bit for bit (so ``0.0 != -0.0`` and a NaN equals itself), for the two places
# a float attribute is compared: polyop's function cache key (:class:`_Bits`) and what
# ``jax.ffi.ffi_call`` gets (:class:`_FfiFloat`). Assigned as methods rather than inherited
# from a mixin: numpy takes a scalar subclass's dtype from its first base.
def _bitwise_eq(self, other):
    return isinstance(other, float) and struct.pack("<d", self) == struct.pack("<d", other)


def _bitwise_ne(self, other):
    return not _bitwise_eq(self, other)


def _bitwise_hash(self):
    return hash(struct.pack("<d", self))


class _FfiFloat(np.float64):
    """A float attribute handed to ``jax.ffi.ffi_call``: lowers like ``np.float64`` (an f64 FFI
    attribute) but compares bit for bit. JAX caches primitive executables by their parameters
    with ``==``, and ``0.0 == -0.0`` with equal hashes, so a plain float made
    ``scale(x, alpha=-0.0)`` after ``scale(x, alpha=0.0)`` reuse the ``+0.0`` executable."""

    __slots__ = ()
    __eq__, __ne__, __hash__ = _bitwise_eq, _bitwise_ne, _bitwise_hash


def _ffi_attr(v):
    """Canonical attribute -> what ``jax.ffi.ffi_call`` lowers to the FFI attribute types."""
    if isinstance(v, bool):
        return np.bool_(v)
    if isinstance(v, int):
        return np.int64(v)
    if isinstance(v, float):
        return _FfiFloat(v)
    if isinstance(v, str):
        return v
    if isinstance(v, tuple):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return np.asarray(v, dtype=np.int64)
        return np.asarray(v, dtype=np.float64)
    raise TypeError(f"unsupported attribute value {v!r}")


def _spec(x):
    """``(shape, dtype)`` of an operand; dims stay what JAX has (ints, or symbolic dims under
    ``jax.export`` shape polymorphism)."""
    return None if x is None else (tuple(x.shape), _dtype_name(x.dtype))


def _sym_broadcast(a, b):
    return jax.lax.broadcast_shapes((a,), (b,))[0]


def _infer(name: str, specs, attrs: dict, src: _Src = _STOCK):
    """Output ``(shape, dtype)``s from kernel-core's symbolic shape inference: symbolic input
    dims go in as symbols and the output dims come back as JAX dim expressions of them
    (docs/shapes.md). Requirements between symbolic dims are left to the kernel, which checks
    them on the concrete shapes of every call (JAX dims cannot state them at export)."""
    wire, env = _shapes.symbolic_specs(specs, jax.export.is_symbolic_dim)
    r = src.meta.infer_symbolic(name, wire, **attrs)

    def unknown():
        raise NotImplementedError(
            f"{src.label(name)}: an output size is unknown before running; XLA needs static shapes"
        )

    ev = _shapes.Evaluator(env, jax.core.max_dim, _sym_broadcast, unknown)
    return [(ev.shape(s), d) for s, d in r["outputs"]]


def _axis_attrs(info: dict) -> tuple[str, ...] | None:
    """The op's attributes whose declared role is ``"axis"`` (they select an axis of the first
    tensor input), from its schema metadata. ``None`` when the metadata declares no roles (a
    library built before roles existed) and the op has integer attributes: which of them name
    an axis is then unknown, and the vmap rule stays on the safe (sequential) strategy."""
    if all("role" in a for a in info["attrs"]):
        return axis_attrs(info)
    if any(a["type"] in ("int", "int[]") for a in info["attrs"]):
        return None
    return ()


def _negative_axis(v, rank: int):
    if isinstance(v, tuple):
        return tuple(_negative_axis(x, rank) for x in v)
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < rank:
        return v - rank
    return v


def _normalize_axes(info: dict, first_shape, attrs: dict) -> dict:
    """Make the op's axis-role attributes negative, relative to the first tensor input's
    shape ``first_shape`` (``None``: no tensor input, nothing to do)."""
    names = _axis_attrs(info)
    if not names or first_shape is None:
        return dict(attrs)
    rank = len(first_shape)
    out = dict(attrs)
    for a in names:
        if a in out:
            out[a] = _negative_axis(out[a], rank)
    return out


def _refuse_data_dependent(name: str, src: _Src = _STOCK):
    if src.infos[name]["flags"]["data_dependent_shape"]:
        raise NotImplementedError(
            f"{src.label(name)}: the output shape depends on the input values, which XLA/JAX "
            "cannot express (static shapes only); use polyop.run (NumPy), torch, TensorFlow "
            "or ONNX Runtime for this op"
        )


# ---------------------------------------------------------------------------- raw call


def _vma(x) -> frozenset:
    """The manual mesh axes (inside ``jax.shard_map``) along which ``x`` varies."""
    t = jax.typeof(x)
    try:
        return frozenset(t.mat.varying)  # jax 0.10
    except AttributeError:
        return frozenset(getattr(t, "vma", ()))  # jax 0.9: ShapedArray.vma


def _raw_call(name: str, attrs: dict, present: tuple[bool, ...], xs, src: _Src = _STOCK):
    """One FFI call on present operands ``xs`` (absent ones must be trailing)."""
    src.ensure()
    full = iter(xs)
    specs = [_spec(next(full)) if p else None for p in present]
    out_specs = _infer(name, specs, attrs, src)
    results = [jax.ShapeDtypeStruct(tuple(s), _jnp_dtype(d)) for s, d in out_specs]
    # Inside shard_map the FFI call needs operands that vary along the same manual axes, and
    # its results (declared without axes) vary along all of them: the kernel runs per shard.
    vma = frozenset().union(*(_vma(x) for x in xs))
    if vma:
        xs = [x if not (vma - _vma(x)) else jax.lax.pcast(x, tuple(vma - _vma(x)), to="varying")
              for x in xs]
    fn = jax.ffi.ffi_call(f"{src.prefix}{name}", results, vmap_method="sequential")
    outs = tuple(fn(*xs, **{k: _ffi_attr(v) for k, v in attrs.items()}))
    if vma:
        outs = tuple(o if not (vma - _vma(o)) else jax.lax.pcast(o, tuple(vma - _vma(o)), to="varying")
                     for o in outs)
    return outs


def _several_devices() -> bool:
    return len(jax.devices()) > 1


def _mesh_axes(sharding, rank: int) -> list:
    """Per dim, the mesh axis name(s) a ``NamedSharding`` splits it along (None: whole)."""
    spec = list(getattr(sharding, "spec", ()))
    return (spec + [None] * rank)[:rank]


def _partitioned_call(name: str, attrs: dict, present: tuple[bool, ...], xs, src: _Src = _STOCK):
    """:func:`_raw_call` under ``jax.experimental.custom_partitioning``: the op's sharding rule
    (kernel-core's, see polyop._sharding) becomes Shardy's ``sharding_rule``, so inputs split
    along a factor the op computes independently along stay split (no all-gather) and the
    outputs come out split the same way; dims the rule says are whole are gathered first. An
    output the rule says is summed over a split factor (a weight gradient over a split batch)
    is ``psum``-ed over that factor's mesh axes inside the partitioned call."""
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    full = iter(xs)
    specs = [_spec(next(full)) if p else None for p in present]
    wire, _env = _shapes.symbolic_specs(specs, jax.export.is_symbolic_dim)
    inferred = src.meta.infer_symbolic(name, wire, **attrs)
    rule = _sharding.Rule(
        inferred.get("sharding"), present, [len(x.shape) for x in xs], [len(s) for s, _ in inferred["outputs"]]
    )
    rule_str, whole, reduction = rule.einsum()

    def partition(mesh, arg_shapes, result_shape):
        chosen = rule.assign([_mesh_axes(a.sharding, len(a.shape)) for a in arg_shapes])
        spec = lambda m: NamedSharding(mesh, PartitionSpec(*[chosen.get(f) for f in m]))  # noqa: E731
        sums = [rule.summed_axes(i, chosen) for i in range(len(rule.outputs))]

        def lower(*local):
            outs = _raw_call(name, attrs, present, local, src)
            return tuple(jax.lax.psum(o, a) if a else o for o, a in zip(outs, sums))

        return mesh, lower, tuple(spec(m) for m in rule.outputs), tuple(spec(m) for m in rule.inputs)

    fn = custom_partitioning(lambda *a: _raw_call(name, attrs, present, a, src))
    fn.def_partition(partition, sharding_rule=rule_str, need_replication_factors=whole,
                     reduction_factors=reduction)
    return tuple(fn(*xs))


def _call(name: str, attrs: dict, present: tuple[bool, ...], xs, src: _Src = _STOCK):
    """One op call: traced with several devices present, through :func:`_partitioned_call`
    (the sharding rule decides how a sharded input is split); otherwise the plain FFI call."""
    if _several_devices() and any(isinstance(x, jax.core.Tracer) for x in xs):
        return _partitioned_call(name, attrs, present, xs, src)
    return _raw_call(name, attrs, present, xs, src)


def vmap_strategy(name: str, shapes, batched, **attrs) -> str:
    """How ``jax.vmap`` runs op ``name`` for per-example operand ``shapes`` (``None`` for an
    absent optional; pairs ``(shape, dtype_name)``) of which ``batched`` are mapped:

    - ``"direct"``: one call on the batched operands (batch axis = an extra leading dim,
      unbatched operands passed as they are). Chosen when shape inference confirms that
      prepending a batch dim to the batched operands prepends it to every output, the op's
      axis attributes (declared with the role ``"axis"`` in its schema metadata, normalised to
      negative values first) are negative and the first input is not a scalar when such an
      attribute exists. This holds for elementwise ops, broadcasting
      ops whose batched operands already have the full rank, softmax/topk/rms_norm along a
      non-batch axis, ...
    - ``"sequential"``: ``lax.map`` over the batch (e.g. conv2d, whose input must be 4-D;
      add with a lower-rank batched operand; rms_norm with a batched weight), and any op
      with integer attributes whose metadata declares no roles.

    Assumption (documented in docs/xla.md): an op whose shapes behave batch-like under a new
    leading dim also computes batch-like, unless an axis attribute says otherwise.
    """
    full_attrs = {a["name"]: a["default"] for a in _INFOS[name]["attrs"] if not a["required"]}
    full_attrs.update(attrs)
    attrs = {k: _hashable_attr(k, name, v) for k, v in full_attrs.items() if v is not None}
    specs = [None if s is None else (tuple(s[0]), s[1]) for s in shapes]
    first = next((s for s in specs if s is not None), None)
    attrs = _normalize_axes(_INFOS[name], None if first is None else first[0], attrs)
    return _strategy(name, tuple(specs), tuple(bool(b) for b in batched), tuple(sorted(attrs.items())))


@functools.lru_cache(maxsize=4096)
def _strategy(name, specs, batched, attrs_key, src: _Src = _STOCK) -> str:
    attrs = dict(attrs_key)
    first = next((s for s in specs if s is not None), None)
    axes = _axis_attrs(src.infos[name])
    if axes is None:
        return "sequential"  # no declared roles: an integer attribute may name an axis
    for a in axes:
        if a in attrs:
            v = attrs[a]
            vs = v if isinstance(v, tuple) else (v,)
            if first is None or len(first[0]) == 0 or any(
                not isinstance(x, int) or isinstance(x, bool) or x >= 0 for x in vs
            ):
                return "sequential"
    try:
        base = _infer(name, specs, attrs, src)
        probed = _infer(
            name,
            [
                None if s is None else (((_PROBE,) + tuple(s[0])) if b else tuple(s[0]), s[1])
                for s, b in zip(specs, batched)
            ],
            attrs,
            src,
        )
    except Exception:
        return "sequential"
    want = [((_PROBE,) + tuple(s), d) for s, d in base]
    got = [(tuple(s), d) for s, d in probed]
    return "direct" if want == got else "sequential"


# ---------------------------------------------------------------------------- op functions


class _Bits(float):
    """A float attribute as a cache key: equal only when bit-identical, so ``alpha=-0.0`` does not
    reuse the function cached for ``alpha=0.0`` (``0.0 == -0.0`` and they hash alike), and a
    NaN attribute finds its own cached function."""

    __slots__ = ()
    __eq__, __ne__, __hash__ = _bitwise_eq, _bitwise_ne, _bitwise_hash


def _cache_key(attrs: dict) -> tuple:
    def bits(v):
        if type(v) is float:
            return _Bits(v)
        return tuple(bits(x) for x in v) if isinstance(v, tuple) else v

    return tuple(sorted((k, bits(v)) for k, v in attrs.items()))


@functools.lru_cache(maxsize=4096)
def _op_fn(name: str, attrs_key: tuple, present: tuple[bool, ...], src: _Src = _STOCK):
    """The differentiable, batchable JAX function of the present operands of one op call."""
    info = src.infos[name]
    attrs = dict(attrs_key)

    @custom_batching.custom_vmap
    def batched_call(*xs):
        return _call(name, attrs, present, xs, src)

    @batched_call.def_vmap
    def _vmap_rule(axis_size, in_batched, *xs):
        in_batched = [bool(b) for b in in_batched]
        per_example = [
            ((tuple(x.shape[1:]) if b else tuple(x.shape)), _dtype_name(x.dtype))
            for x, b in zip(xs, in_batched)
        ]
        full_specs = []
        it = iter(per_example)
        full_batched = []
        itb = iter(in_batched)
        for p in present:
            full_specs.append(next(it) if p else None)
            full_batched.append(next(itb) if p else False)
        strategy = _strategy(name, tuple(full_specs), tuple(full_batched), attrs_key, src)
        n_out = info["num_outputs"]
        if strategy == "direct":
            outs = batched_call(*xs)
        else:
            bx = [x for x, b in zip(xs, in_batched) if b]

            def one(bs):
                it2 = iter(bs)
                return batched_call(*[next(it2) if b else x for x, b in zip(xs, in_batched)])

            outs = jax.lax.map(one, bx)
        return tuple(outs), (True,) * n_out

    bwd_info = info.get("backward")

    @jax.custom_vjp
    def f(*xs):
        return batched_call(*xs)

    def f_fwd(*xs):
        outs = batched_call(*xs)
        return outs, (xs, outs)

    def f_bwd(res, cts):
        xs, outs = res
        if not bwd_info:
            raise NotImplementedError(f"{src.label(name)}: this op has no gradient")
        it = iter(xs)
        full_inputs = [next(it) if p else None for p in present]
        def cotangent(i):
            ct = cts[i]
            return jnp.zeros(outs[i].shape, outs[i].dtype) if ct.dtype == jax.dtypes.float0 else ct

        args = backward_args(name, bwd_info, cotangent, full_inputs.__getitem__, outs.__getitem__)
        bname = bwd_info["op"]
        battr_names = {a["name"] for a in src.infos[bname]["attrs"]}
        battrs = {k: v for k, v in attrs.items() if k in battr_names}
        grads = _apply(bname, args, battrs, normalize=False, src=src)
        if not isinstance(grads, tuple):
            grads = (grads,)
        full_grads = grads_by_input(bwd_info, grads, len(present))
        out = []
        for p, x, g in zip(present, full_inputs, full_grads):
            if not p:
                continue  # absent optional: its gradient (if the backward made one) is dropped
            if not jnp.issubdtype(x.dtype, jnp.inexact):
                out.append(None)  # integer inputs: no cotangent
            elif g is None:
                out.append(jnp.zeros_like(x))
            else:
                # shard_map: an input replicated along some manual axes gets the sum of the
                # per-shard gradients (the transpose of broadcasting it to every shard).
                extra = _vma(g) - _vma(x)
                if extra:
                    g = jax.lax.psum(g, tuple(extra))
                out.append(g)
        return tuple(out)

    f.defvjp(f_fwd, f_bwd)
    return f


def _apply(name: str, tensors, attrs: dict, normalize: bool = True, src: _Src = _STOCK):
    if name not in src.infos:
        raise ValueError(f"polyop: unknown op {name!r} (known: {', '.join(src.infos)})")
    _refuse_data_dependent(name, src)
    info = src.infos[name]
    if info["flags"]["inplace"]:
        raise NotImplementedError(
            f"{src.label(name)}: in-place ops exist only on the torch surface; use the "
            "out-of-place op"
        )
    tensors = list(tensors)
    n = info["num_inputs"]
    if len(tensors) != n:
        raise TypeError(f"{src.label(name)}: expected {n} tensor input(s), got {len(tensors)}")
    present = tuple(t is not None for t in tensors)
    # XLA leaves absent optional operands out of the call, so they must be trailing.
    last = max((i for i, p in enumerate(present) if p), default=-1)
    for i in range(last):
        if not present[i]:
            if not info["inputs"][i]["optional"]:
                raise TypeError(f"{src.label(name)}: input `{info['inputs'][i]['name']}` is required")
            raise ValueError(
                f"{src.label(name)}: absent optional input `{info['inputs'][i]['name']}` followed "
                "by a present one cannot be expressed as an XLA call"
            )
    xs = [jnp.asarray(t) for t in tensors if t is not None]
    # Defaults filled in here so the vmap strategy sees every attribute (e.g. axis=-1).
    full_attrs = {a["name"]: a["default"] for a in info["attrs"] if not a["required"]}
    full_attrs.update(attrs)
    canon = {k: _hashable_attr(k, name, v, src.namespace) for k, v in full_attrs.items() if v is not None}
    if normalize:
        canon = _normalize_axes(info, xs[0].shape if xs else None, canon)
    # Validate at trace time (dtype, shapes, attributes) with the kernel's own messages, before
    # jax.ffi.ffi_call: XLA never runs a custom call whose results all have zero elements, so
    # for such a call the handler's own checks would not run and an invalid call would return
    # empty arrays instead of an error (docs/xla.md, "Zero-element results").
    _infer(name, [_spec(x) for x in _fill(xs, present)], canon, src)
    outs = _op_fn(name, _cache_key(canon), present, src)(*xs)
    return outs[0] if info["num_outputs"] == 1 else tuple(outs)


def _fill(xs, present):
    it = iter(xs)
    return [next(it) if p else None for p in present]


def call(name: str, *tensors, **attrs):
    """Call op ``name`` on tensors (``None`` for an absent optional) with attributes by name."""
    if name not in _INFOS:
        raise ValueError(f"polyop: unknown op {name!r} (known: {', '.join(op_names())})")
    return _apply(name, tensors, attrs)


def _make_op(name: str, src: _Src = _STOCK):
    info = src.infos[name]
    schema_args = []
    params = []
    for a in info["inputs"]:
        schema_args.append(("tensor", a["name"]))
        params.append(
            inspect.Parameter(
                a["name"],
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=None if a["optional"] else inspect.Parameter.empty,
            )
        )
    for a in info["attrs"]:
        schema_args.append(("attr", a["name"]))
        params.append(
            inspect.Parameter(
                a["name"],
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if a["required"] else a["default"],
            )
        )
    # Schema order is tensors first for the stock ops; keep the order the schema declares when
    # defaults allow it (Python requires non-default parameters first).
    sig = inspect.Signature(_order(params))
    tensor_names = [a["name"] for a in info["inputs"]]
    attr_names = [a["name"] for a in info["attrs"]]

    def op(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{src.label(name)}: {e}") from None
        tensors = [bound.arguments.get(t) for t in tensor_names]
        attrs = {a: bound.arguments[a] for a in attr_names if a in bound.arguments}
        return _apply(name, tensors, attrs, src=src)

    op.__name__ = name
    op.__qualname__ = name
    op.__signature__ = sig
    op.__doc__ = f"{info['schema']}\n\n{info.get('doc', '')}\n\nJAX function over the XLA FFI target {src.prefix}{name}."
    return op


def _order(params):
    req = [p for p in params if p.default is inspect.Parameter.empty]
    opt = [p for p in params if p.default is not inspect.Parameter.empty]
    return req + opt


for _name in op_names():
    globals()[_name] = _make_op(_name)
    __all__.append(_name)
