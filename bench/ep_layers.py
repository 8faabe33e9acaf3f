"""ResNet-50's convolution layers through ONNX Runtime: polyop's execution provider against
MLAS (the CPU provider alone), and the provider with and without its per-session weight
packing (`POLYOP_ORT_EP_PREPACK=0`), in one process.

Each layer is timed as a chain of six `Conv` nodes (C -> O, O -> C, three times; constant
weights and biases; opset 17), so that MLAS's NCHWc reorders at the chain's ends weigh little
and each layer reads the one before it, as in a model. The three sessions run batches of runs in
turn, with a pause before each batch (each session's intra-op threads spin after its runs, and
would share the cores with the next); the figure is the best batch.

    .venv/bin/python bench/ep_layers.py             # markdown table
    .venv/bin/python bench/ep_layers.py --smoke     # tiny layers: checks the script (CI)

MLAS / polyop = time with the CPU provider / time with polyop's (> 1.00: polyop is faster);
unpacked / packed = time without polyop's weight packing / with it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ep_models import PAUSE, THREADS, _session, provider_session_under

# (channels, height = width, outputs, kernel): ResNet-50's stride-1 layers at batch 1 (a 1x1
# chain holds both of a bottleneck's 1x1 layers, C -> O and O -> C)
LAYERS = [
    (64, 56, 256, 1), (128, 28, 512, 1), (256, 14, 1024, 1), (512, 7, 2048, 1),
    (64, 56, 64, 3), (128, 28, 128, 3), (256, 14, 256, 3), (512, 7, 512, 3),
]
SMOKE = [(8, 7, 20, 1), (6, 9, 16, 3)]


def chain(c: int, h: int, o: int, k: int) -> tuple[bytes, dict]:
    rng = np.random.default_rng(0)
    inits, nodes, cur = [], [], "x"
    for i in range(6):
        ci, co = (c, o) if i % 2 == 0 else (o, c)
        w = (rng.standard_normal((co, ci, k, k)) / math.sqrt(ci * k * k)).astype(np.float32)
        b = (0.1 * rng.standard_normal(co)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [cur, f"w{i}", f"b{i}"], [f"y{i}"], pads=[k // 2] * 4))
        cur = f"y{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TP.FLOAT, [1, c, h, h])],
                          [helper.make_tensor_value_info(cur, TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return m.SerializeToString(), {"x": rng.standard_normal((1, c, h, h)).astype(np.float32)}


def sessions(raw: bytes) -> dict[str, ort.InferenceSession]:
    return {"mlas": _session(raw, False), "packed": _session(raw, True),
            "unpacked": provider_session_under(raw, "POLYOP_ORT_EP_PREPACK", "0")}


def measure(layer: tuple, rounds: int, min_time: float) -> dict:
    raw, feeds = chain(*layer)
    sess = sessions(raw)
    ref = sess["mlas"].run(None, feeds)[0]
    diff = max(float(np.abs(s.run(None, feeds)[0] - ref).max() / np.abs(ref).max())
               for k, s in sess.items() if k != "mlas")
    t0 = time.perf_counter()
    sess["mlas"].run(None, feeds)
    reps = max(1, int(min_time / max(time.perf_counter() - t0, 1e-6)))
    best = {k: math.inf for k in sess}
    for _ in range(rounds):
        for k, s in sess.items():
            time.sleep(PAUSE)
            t0 = time.perf_counter()
            for _ in range(reps):
                s.run(None, feeds)
            best[k] = min(best[k], (time.perf_counter() - t0) / reps)
    return {"layer": layer, "diff": diff, **{k: 1e3 * v for k, v in best.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    ort.set_default_logger_severity(3)
    layers, rounds, min_time = (SMOKE, 2, 0.01) if args.smoke else (LAYERS, 9, 0.3)
    print(f"Six chained `Conv` layers (C -> O, O -> C, ...) at batch 1, {THREADS} intra-op threads, best "
          f"batch of {rounds}, sessions alternated with a {PAUSE} s pause. Re-run: "
          "`.venv/bin/python bench/ep_layers.py`.\n")
    print("| layer | MLAS | polyop | MLAS / polyop | polyop unpacked | unpacked / packed | max rel. difference |")
    print("|---|---|---|---|---|---|---|")
    for layer in layers:
        r = measure(layer, rounds, min_time)
        c, h, o, k = layer
        print(f"| {c}x{h}x{h} <-> {o} {k}x{k} | {r['mlas']:.3f} ms | {r['packed']:.3f} ms | "
              f"{r['mlas'] / r['packed']:.2f} | {r['unpacked']:.3f} ms | {r['unpacked'] / r['packed']:.2f} | "
              f"{r['diff']:.1e} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
