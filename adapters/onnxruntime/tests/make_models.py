"""Regenerate the tiny ONNX models the Rust-side test (`tests/ort_session.rs`) runs.

    .venv/bin/python adapters/onnxruntime/tests/make_models.py

Built with `onnx.helper` only (no polyop import), so the committed bytes do not depend on the
code under test. IR version 10 so any onnxruntime >= 1.17 with opset 20 reads them.
"""

from pathlib import Path

from onnx import TensorProto as TP
from onnx import helper

OUT = Path(__file__).resolve().parent / "models"
OPSETS = [helper.make_opsetid("", 20), helper.make_opsetid("ai.polyop", 1)]


def save(name, nodes, inputs, outputs):
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=10, producer_name="polyop-tests")
    (OUT / f"{name}.onnx").write_bytes(model.SerializeToString())


def main():
    OUT.mkdir(exist_ok=True)
    # The issue check: TopK(k=2) on [[1, 3, 3, 2]] -> values [3, 3], indices [1, 2].
    save(
        "topk",
        [helper.make_node("TopK", ["x"], ["values", "indices"], domain="ai.polyop", k=2)],
        [helper.make_tensor_value_info("x", TP.FLOAT, [1, 4])],
        [
            helper.make_tensor_value_info("values", TP.FLOAT, None),
            helper.make_tensor_value_info("indices", TP.INT64, None),
        ],
    )
    # Built-in Relu feeding a polyop RmsNorm whose optional weight is an empty input name.
    save(
        "relu_rms_norm",
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("RmsNorm", ["r", ""], ["y"], domain="ai.polyop", eps=1e-6),
        ],
        [helper.make_tensor_value_info("x", TP.DOUBLE, ["n", 4])],
        [helper.make_tensor_value_info("y", TP.DOUBLE, None)],
    )
    # Dynamic shapes: a bad broadcast is only seen when the session runs.
    save(
        "add_dynamic",
        [helper.make_node("Add", ["x", "y"], ["z"], domain="ai.polyop")],
        [
            helper.make_tensor_value_info("x", TP.FLOAT, ["a"]),
            helper.make_tensor_value_info("y", TP.FLOAT, ["b"]),
        ],
        [helper.make_tensor_value_info("z", TP.FLOAT, None)],
    )
    # A test-only op from the Rust test's own registry (not a stock op).
    save(
        "boom",
        [helper.make_node("Boom", ["x"], ["y"], domain="ai.polyop")],
        [helper.make_tensor_value_info("x", TP.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
    )


if __name__ == "__main__":
    main()
