"""polyop ops in the ONNX format, independent of any runtime: the ``ai.polyop`` OpSchemas
for ``onnx.defs`` and the type and attribute mappings every ONNX route shares (model helpers
and sessions in :mod:`polyop.onnxruntime`, the torch exporter's translation table in
:mod:`polyop.torch`).

Importing this module registers the stock domain's OpSchemas, built from the registry:
inputs (optional ones marked), outputs, the type variable ``T`` over each op's dtypes,
attributes with their ONNX types and defaults, and a shape-inference function that calls
kernel-core's symbolic inference (docs/shapes.md). So ``onnx.checker.check_model(m,
full_check=True)`` validates ``ai.polyop`` nodes, ``onnx.shape_inference`` types their
outputs with ``dim_param``s flowing through, and tools that build nodes from schemas
(``onnxscript``) know the ops.

Needs only the ``onnx`` package (``pip install onnx``).
"""

from __future__ import annotations

from typing import Any

try:
    import onnx
    from onnx import TensorProto, helper
except ImportError as e:  # pragma: no cover - exercised without onnx installed
    raise ImportError(
        f"polyop.onnx needs ONNX: cannot import `onnx` ({type(e).__name__}: {e}). Install it "
        "with `pip install onnx`; `import polyop` itself works without it.", name="onnx"
    ) from e

import numpy as np

import polyop

from . import _shapes

__all__ = ["DOMAIN", "OPSET_VERSION", "register_schemas", "tensor_type", "onnx_attr"]

#: The ONNX domain of every polyop op, and its (only) version.
DOMAIN = "ai.polyop"
OPSET_VERSION = 1

_DTYPE_TO_ONNX = {
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "bool": TensorProto.BOOL,
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
    "int16": TensorProto.INT16,
    "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32,
    "uint64": TensorProto.UINT64,
}


_ONNX_TYPE_STR = {
    "float16": "tensor(float16)",
    "bfloat16": "tensor(bfloat16)",
    "float32": "tensor(float)",
    "float64": "tensor(double)",
    "int32": "tensor(int32)",
    "int64": "tensor(int64)",
    "bool": "tensor(bool)",
}
_registered_schemas: set[str] = set()


def _attr_from_proto(decl: dict, a: onnx.AttributeProto) -> Any:
    v = helper.get_attribute_value(a)
    if decl["type"] == "bool":
        return bool(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    return list(v) if isinstance(v, (list, tuple)) or decl["type"].endswith("[]") else v


def _schema_for(info: dict, domain: str, meta: Any) -> Any:
    """The ``onnx.defs.OpSchema`` of one op, from its metadata: inputs (optional ones marked),
    outputs, the type variable ``T`` over the op's dtypes, typed attributes with defaults,
    and a shape-inference function that calls kernel-core's symbolic inference."""
    from onnx.defs import OpSchema

    op = info["name"]
    F = OpSchema.FormalParameter
    Opt = OpSchema.FormalParameterOption

    def ty(d):
        return "T" if d == "T" else _ONNX_TYPE_STR[d]

    inputs = [F(i["name"], ty(i["dtype"]), "",
                param_option=Opt.Optional if i["optional"] else Opt.Single)
              for i in info["inputs"]]
    outputs = [F(o["name"], ty(o["dtype"]), "") for o in info["outputs"]]
    attrs = []
    for a in info["attrs"]:
        if a["required"] or a.get("default") is None:
            kind = {"int": "INT", "bool": "INT", "float": "FLOAT", "str": "STRING",
                    "int[]": "INTS", "float[]": "FLOATS"}[a["type"]]
            attrs.append(OpSchema.Attribute(a["name"], getattr(OpSchema.AttrType, kind), "",
                                            required=bool(a["required"])))
        else:
            attrs.append(OpSchema.Attribute(a["name"], onnx_attr(op, a, a["default"]), ""))
    schema = OpSchema(
        info["onnx_name"], domain, OPSET_VERSION, info.get("doc", ""),
        inputs=inputs, outputs=outputs,
        type_constraints=[("T", [_ONNX_TYPE_STR[d] for d in info["dtypes"]], "")],
        attributes=attrs,
    )
    decls = {a["name"]: a for a in info["attrs"]}
    onnx_to_name = {v: k for k, v in _DTYPE_TO_ONNX.items()}

    def infer(ctx):
        specs = []
        for i in range(len(info["inputs"])):
            if i >= ctx.get_num_inputs() or not ctx.has_input(i):
                specs.append(None)
                continue
            t = ctx.get_input_type(i)
            if t is None or not t.HasField("tensor_type"):
                return  # nothing known about this input yet
            tt = t.tensor_type
            dtype = onnx_to_name.get(tt.elem_type)
            if dtype is None:
                return
            dims = None if not tt.HasField("shape") else [
                d.dim_value if d.HasField("dim_value")
                else (d.dim_param if d.HasField("dim_param") and d.dim_param else None)
                for d in tt.shape.dim
            ]
            specs.append((dims, dtype))
        given = {}
        for name, decl in decls.items():
            a = ctx.get_attribute(name)
            if a is not None:
                given[name] = _attr_from_proto(decl, a)
        try:
            r = meta.infer_symbolic(op, specs, **given)
        except (TypeError, ValueError) as e:
            raise onnx.shape_inference.InferenceError(str(e)) from None
        for i, (shape, dtype) in enumerate(r["outputs"]):
            if i < ctx.get_num_outputs() and ctx.has_output(i):
                dims = None if shape is None else [_shapes.onnx_dim(d) for d in shape]
                ctx.set_output_type(i, helper.make_tensor_type_proto(tensor_type(dtype), dims))

    schema.set_type_and_shape_inference_function(infer)
    return schema


def register_schemas(meta: Any = None, domain: str = DOMAIN) -> list[str]:
    """Register the ``onnx.defs`` OpSchemas of a domain (default: the stock ``ai.polyop`` from
    ``polyop``'s own metadata; or an author's library's metadata source and domain, see
    ``polyop.onnxruntime.register_schemas(path)``), once per process, so ``onnx.checker``
    validates polyop nodes (attributes by name and type, input types) and
    ``onnx.shape_inference`` types their outputs through kernel-core's shape inference, with
    symbolic ``dim_param``s flowing through (``N`` in gives ``N`` out where the op says so;
    conv2d gives ``(H - 1) // 2 + 1``). Called on import for the stock domain. Returns the
    op types registered now."""
    meta = polyop if meta is None else meta
    done = []
    for info in meta.ops():
        if info["flags"]["inplace"]:
            continue
        key = f"{domain}::{info['onnx_name']}"
        if key in _registered_schemas or onnx.defs.has(info["onnx_name"], domain):
            continue
        onnx.defs.register_schema(_schema_for(info, domain, meta))
        _registered_schemas.add(key)
        done.append(info["onnx_name"])
    return done


def tensor_type(dtype: Any) -> int:
    """ONNX ``TensorProto`` element type for a NumPy dtype or polyop dtype name."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name in _DTYPE_TO_ONNX:
        return _DTYPE_TO_ONNX[name]
    return helper.np_dtype_to_tensor_dtype(np.dtype(name))


def onnx_attr(op: str, decl: dict, value: Any, ns: str = "polyop") -> onnx.AttributeProto:
    """One attribute as ONNX wants it for the schema's declared type."""
    name, ty = decl["name"], decl["type"]
    A = onnx.AttributeProto
    try:
        if ty == "bool":
            if not isinstance(value, (bool, int, np.bool_, np.integer)) or int(value) not in (0, 1):
                raise TypeError
            return helper.make_attribute(name, int(value), attr_type=A.INT)
        if ty == "int":
            if not isinstance(value, (int, np.integer)):
                raise TypeError
            return helper.make_attribute(name, int(value), attr_type=A.INT)
        if ty == "float":
            if not isinstance(value, (float, int, np.floating, np.integer)) or isinstance(value, bool):
                raise TypeError
            return helper.make_attribute(name, float(value), attr_type=A.FLOAT)
        if ty == "str":
            if not isinstance(value, str):
                raise TypeError
            return helper.make_attribute(name, value, attr_type=A.STRING)
        if ty == "int[]":
            if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
                # a single int: repeated to an int[N]'s length, one element for an int[]
                value = [value] * (decl.get("len") or 1)
            return helper.make_attribute(name, [int(v) for v in value], attr_type=A.INTS)
        if ty == "float[]":
            return helper.make_attribute(name, [float(v) for v in value], attr_type=A.FLOATS)
    except TypeError:
        raise TypeError(
            f"{ns}.{op}: attribute `{name}` must be {ty}, got {type(value).__name__}"
        ) from None
    raise TypeError(f"{ns}.{op}: attribute `{name}` has unsupported type {ty}")


# onnx.reference (which onnxscript imports) builds a table of every registered schema by op
# name when it is first imported and refuses two domains with one name (ai.polyop's Gelu,
# Softmax, TopK, ... and the standard ones). Built before ours are registered, it holds only
# the standard ops, as it expects.
try:
    import onnx.reference.op_run  # noqa: F401
except ImportError:  # pragma: no cover - an onnx without the reference evaluator
    pass

# The stock domain's schemas, so onnx.checker / onnx.shape_inference / onnxscript know them.
register_schemas()
