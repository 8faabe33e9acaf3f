"""The ONNX Runtime backend: each case as a one-node ``ai.polyop`` model (concrete input
shapes, absent optional inputs as empty names), run in an ``onnxruntime.InferenceSession``
whose options register ``libpolyop_onnxruntime.so``. Symbolic mode: one model whose inputs
have a ``dim_param`` per symbolic size, one session run at every size.

Attributes go to the model with their natural ONNX types (SPEC §1: bool -> INT 0/1, int -> INT,
float -> FLOAT, str -> STRING) and are *not* checked in Python, so bad-attribute cases exercise
the library's own validation. ONNX Runtime inference has no gradients: ``grad`` is reported
unsupported."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

import polyop
import polyop.onnxruntime as pox

from ..harness import GRAD, Backend, Case


def _attribute(name: str, value) -> onnx.AttributeProto:
    if isinstance(value, (bool, np.bool_)):
        return helper.make_attribute(name, int(value), attr_type=onnx.AttributeProto.INT)
    if isinstance(value, (int, np.integer)):
        return helper.make_attribute(name, int(value), attr_type=onnx.AttributeProto.INT)
    if isinstance(value, (float, np.floating)):
        return helper.make_attribute(name, float(value), attr_type=onnx.AttributeProto.FLOAT)
    return helper.make_attribute(name, value)


def _float_attr_survives(value) -> bool:
    """ONNX float attributes are float32; the library reads them back as the shortest
    decimal of that float32. True when that gives back exactly ``value``."""
    if not isinstance(value, (float, np.floating)) or isinstance(value, bool):
        return True
    v = float(value)
    if not np.isfinite(v):
        return True
    return float(str(np.float32(v))) == v


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    modes = ("session",)
    version = f"onnxruntime {ort.__version__}"

    def __init__(self, library: str | None = None) -> None:
        self.library = library
        self.meta = polyop
        self.domain = pox.DOMAIN
        if library is not None:
            lib = pox.load(library)
            self.meta, self.domain = lib.library, lib.name

    def unsupported(self, case: Case, mode: str) -> str | None:
        info = self.meta.op_info(case.op)
        if mode == GRAD:
            return (
                "ONNX Runtime inference has no gradients (the backward ops are exposed as "
                f"ordinary {self.domain} ops, <Op>Backward, and run forward like any op)"
            )
        if info["flags"]["inplace"]:
            return (
                "in-place ops exist only on the torch surface; ONNX Runtime exposes the "
                "out-of-place op"
            )
        for k, v in case.attrs.items():
            if not _float_attr_survives(v):
                return (
                    f"ONNX float attributes are float32: {k}={v!r} does not survive the "
                    "round trip, so the result cannot be bitwise identical to float64 native"
                )
        return None

    symbolic = True

    def run_symbolic(self, case: Case, pattern: list, cases) -> list:
        info = self.meta.op_info(case.op)
        sess = pox.session(self._model(case, pattern), library=self.library)
        in_names = [a["name"] for a in info["inputs"]]
        out_names = [o["name"] for o in info["outputs"]]
        res = []
        for c in cases:
            feed = {n: pox._feed(np.asarray(a)) for n, a in zip(in_names, c.inputs) if a is not None}
            res.append([np.asarray(o) for o in pox._run_ortvalues(sess, feed, out_names)])
        return res

    def _model(self, case: Case, pattern: list | None = None) -> onnx.ModelProto:
        info = self.meta.op_info(case.op)
        in_names = [a["name"] for a in info["inputs"]]
        out_names = [o["name"] for o in info["outputs"]]
        present = [(n, np.asarray(a)) for n, a in zip(in_names, case.inputs) if a is not None]
        # graph input shapes: the case's, or the pattern's `dim_param`s (symbolic mode)
        shapes = [list(a.shape) for _, a in present] if pattern is None else [
            list(p) for p in pattern if p is not None]
        node = helper.make_node(
            info["onnx_name"],
            [n if a is not None else "" for n, a in zip(in_names, case.inputs)],
            out_names,
            domain=self.domain,
        )
        node.attribute.extend(_attribute(k, v) for k, v in case.attrs.items())
        graph = helper.make_graph(
            [node],
            f"conformance_{case.op}",
            [helper.make_tensor_value_info(n, pox.tensor_type(a.dtype), shape)
             for (n, a), shape in zip(present, shapes)],
            # Untyped outputs: ONNX Runtime takes types and shapes from the library's inference.
            [helper.make_empty_tensor_value_info(n) for n in out_names],
        )
        return helper.make_model(
            graph,
            opset_imports=[
                helper.make_opsetid("", pox.ONNX_OPSET),
                helper.make_opsetid(self.domain, pox.OPSET_VERSION),
            ],
            ir_version=pox.IR_VERSION,
        )

    def run(self, case: Case, mode: str) -> list[np.ndarray]:
        if mode != "session":
            raise ValueError(f"unknown mode {mode}")
        info = self.meta.op_info(case.op)
        sess = pox.session(self._model(case), library=self.library)
        in_names = [a["name"] for a in info["inputs"]]
        feed = {n: pox._feed(np.asarray(a)) for n, a in zip(in_names, case.inputs) if a is not None}
        out_names = [o["name"] for o in info["outputs"]]
        return [np.asarray(o) for o in pox._run_ortvalues(sess, feed, out_names)]


BACKEND = OnnxRuntimeBackend()
