"""conv2d layer by layer against the framework's own convolution (oneDNN in torch and TensorFlow):
ResNet-like shapes, polyop and the built-in alternated in one process, the best of 9 pairs of
calls each, at 1 and 2 threads; one child process per framework and thread count.

    .venv/bin/python bench/conv_layers.py                 # markdown table, both frameworks
    .venv/bin/python bench/conv_layers.py --smoke         # tiny shapes: checks the script (CI)

ratio = built-in time / polyop time (> 1.00: polyop is faster). TensorFlow's CPU convolution
takes NHWC/HWIO only: its inputs are transposed before the timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# (batch, channels, height = width, kernel, outputs, stride, padding)
LAYERS = [
    (1, 64, 56, 3, 64, 1, 1),
    (8, 64, 56, 3, 64, 1, 1),
    (8, 256, 56, 1, 64, 1, 0),
    (8, 64, 56, 1, 256, 1, 0),
    (1, 128, 28, 3, 128, 1, 1),
    (1, 256, 14, 3, 256, 1, 1),
    (1, 512, 7, 3, 512, 1, 1),
    (1, 256, 28, 3, 256, 2, 1),
    (1, 3, 224, 7, 64, 2, 3),
]
SMOKE = [(1, 5, 9, 3, 20, 1, 1), (2, 8, 8, 1, 4, 1, 0), (1, 3, 15, 7, 16, 2, 3)]


def child(framework: str, threads: int, smoke: bool) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(0)
    if framework == "torch":
        import torch
        import torch.nn.functional as F

        import polyop

        torch.set_num_threads(threads)
        torch.ops.load_library(polyop.library_path("torch"))
        P = torch.ops.polyop

        def fns(x, w, b, s, p):
            x, w, b = (torch.from_numpy(a) for a in (x, w, b))
            return (lambda: P.conv2d(x, w, b, stride=[s, s], padding=[p, p]).numpy(),
                    lambda: F.conv2d(x, w, b, s, p).numpy())
    else:
        import tensorflow as tf

        import polyop

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        m = tf.load_op_library(polyop.library_path("tensorflow"))

        def fns(x, w, b, s, p):
            xn, wn = tf.constant(x.transpose(0, 2, 3, 1)), tf.constant(w.transpose(2, 3, 1, 0))
            x, w, b = tf.constant(x), tf.constant(w), tf.constant(b)
            pads = [[0, 0], [p, p], [p, p], [0, 0]]
            return (lambda: m.polyop_conv2d(x, w, [b], stride=[s, s], padding=[p, p]).numpy(),
                    lambda: tf.nn.bias_add(tf.nn.conv2d(xn, wn, strides=s, padding=pads), b).numpy().transpose(0, 3, 1, 2))
    rows = []
    for n, c, h, k, o, s, p in SMOKE if smoke else LAYERS:
        x = rng.standard_normal((n, c, h, h)).astype(np.float32)
        w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        b = rng.standard_normal(o).astype(np.float32)
        ours, builtin = fns(x, w, b, s, p)
        got, want = ours(), builtin()
        best = {"polyop": float("inf"), "builtin": float("inf")}
        for _ in range(1 if smoke else 9):
            for key, f in (("polyop", ours), ("builtin", builtin)):
                t = time.perf_counter()
                f()
                f()
                best[key] = min(best[key], (time.perf_counter() - t) / 2)
        oh = (h + 2 * p - k) // s + 1
        rows.append({
            "layer": f"{n}x{c}x{h}x{h} {k}x{k} stride {s} -> {o}",
            "flop": 2 * n * o * c * k * k * oh * oh,
            "polyop_s": best["polyop"],
            "builtin_s": best["builtin"],
            "shape_ok": got.shape == want.shape,
            # largest difference over the largest output (both round the same sums differently)
            "rel_diff": float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)),
        })
    return rows


def markdown(results: dict[tuple[str, int], list[dict]]) -> str:
    lines = ["| framework | threads | layer | polyop | built-in | ratio | max rel. difference |",
             "|---|---|---|---|---|---|---|"]
    for (fw, threads), rows in results.items():
        for r in rows:
            gp, gb = r["flop"] / r["polyop_s"] / 1e9, r["flop"] / r["builtin_s"] / 1e9
            lines.append(f"| {fw} | {threads} | {r['layer']} | {r['polyop_s'] * 1e3:.2f} ms ({gp:.1f} GFLOP/s) "
                         f"| {r['builtin_s'] * 1e3:.2f} ms ({gb:.1f}) | {r['builtin_s'] / r['polyop_s']:.2f} "
                         f"| {r['rel_diff']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--frameworks", default="torch,tensorflow")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        fw, threads = a.child.split(":")
        print(json.dumps(child(fw, int(threads), a.smoke)))
        return
    results = {}
    for fw in a.frameworks.split(","):
        for threads in (int(t) for t in a.threads.split(",")):
            cmd = [sys.executable, __file__, "--child", f"{fw}:{threads}"] + (["--smoke"] if a.smoke else [])
            # polyop's TensorFlow kernels run on kernel-core's rayon pool (TF's C API exposes no
            # pool): sized for the child, as TF's own
            env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
            results[(fw, threads)] = json.loads(out.strip().splitlines()[-1])
    print(markdown(results))


if __name__ == "__main__":
    main()
