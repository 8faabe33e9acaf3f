"""One model's nodes through ONNX Runtime, with and without polyop's execution provider, side by
side: where a whole-model gap (`bench/ep_models.py`) comes from, node by node.

Each session is profiled on its own (ONNX Runtime's profile: each node's kernel time, the
median over the runs after a warm-up) and its nodes are listed in the order they ran, the CPU
provider's on the left, the session with polyop's provider on the right, row by row. The two
orders are each session's own: ONNX Runtime's layout transformer turns the CPU session's
convolutions into NCHWc nodes (`r<i>_nchwc`, with `ReorderInput`/`ReorderOutput` at the
ends), polyop's fused chains are named after the provider, and two branches of a block may
run in either order, so read a row as "the n-th node that ran", not as the same node.

    .venv/bin/python bench/ep_nodes.py squeezenet       # a light model of the onnx wheel
    .venv/bin/python bench/ep_nodes.py transformer      # bench/ep_models.py's transformer block
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections import defaultdict

import onnxruntime as ort

from ep_models import EP, MODELS, light_model, profiled_runs, transformer_block


def node_times(raw: bytes, feeds: dict, provider: bool, runs: int) -> list[tuple[str, str, str, float]]:
    """(node name, op type, output shapes, median kernel microseconds) per node, in the order
    the nodes ran, from a profile of `runs` runs after three warm-up runs; the op type of a
    node polyop's provider ran ends in " (polyop)"."""
    events, _ = profiled_runs(raw, feeds, provider, runs + 3)
    per, info, order = defaultdict(list), {}, {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name, a = e["name"].removesuffix("_kernel_time"), e.get("args", {})
        per[name].append(e["dur"])
        op = "polyop chain" if name.startswith(EP) else a.get("op_name", "?")
        if a.get("provider") == EP:
            op += " (polyop)"
        shapes = ", ".join("x".join(map(str, s)) for o in a.get("output_type_shape", []) for s in o.values())
        info[name] = (op, shapes)
        order.setdefault(name, len(order))
    return [(n, *info[n], statistics.median(per[n][3:] or per[n])) for n in sorted(order, key=order.get)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=MODELS + ["transformer"])
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    ort.set_default_logger_severity(3)
    model, feeds = transformer_block() if a.model == "transformer" else light_model(a.model)
    raw = model.SerializeToString()
    cpu, ep = node_times(raw, feeds, False, a.runs), node_times(raw, feeds, True, a.runs)
    print(f"{a.model}: kernel time per run, CPU provider {sum(t for *_, t in cpu):.0f} us, "
          f"with polyop's provider {sum(t for *_, t in ep):.0f} us\n")
    print("| CPU provider: op | output | us | with polyop: op | output | us |")
    print("|---|---|---|---|---|---|")
    for c, e in itertools.zip_longest(cpu, ep, fillvalue=("", "", "", None)):
        cell = lambda r: f"{r[1]} | {r[2]} | {'' if r[3] is None else f'{r[3]:.0f}'}"  # noqa: E731
        print(f"| {cell(c)} | {cell(e)} |")


if __name__ == "__main__":
    main()
