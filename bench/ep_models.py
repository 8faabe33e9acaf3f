"""Whole models with and without polyop's ONNX Runtime execution provider (issue 21, part 6).

The real-architecture models the ``onnx`` wheel ships under ``onnx/backend/test/data/light/``
(their constant weights replaced by random ones, so the arithmetic is real) and a standard-op
transformer block (RMSNormalization, MatMul, Softmax, Gelu, Add: nothing polyop-specific), each
run in one process through two sessions: ONNX Runtime's CPU provider alone, and polyop's
provider first with the CPU provider taking every node polyop does not claim; and a third,
the CPU provider alone with its NCHWc layout transformer off, to tell the layout's share of a
gap from the kernels'. Runs alternate between the sessions sample by sample, with a pause
between (`PAUSE`: each session's threads spin after its runs); the figure is the median. A profiled run of each
session gives the time per op type and where each node ran.

    .venv/bin/python bench/ep_models.py                 # prints the markdown section
    .venv/bin/python bench/ep_models.py --quick         # fewer samples, three models

``bench/run.py`` puts the same section into docs/benchmarks.md on a full run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx import TensorProto as TP

import polyop.onnxruntime as pox

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ["squeezenet", "shufflenet", "resnet50", "inception_v1", "inception_v2", "densenet121",
          "bvlc_alexnet", "zfnet512", "vgg19"]
QUICK_MODELS = ["squeezenet", "shufflenet", "resnet50"]
EP = "PolyopExecutionProvider"
#: Intra-op threads of both sessions; `EP_BENCH_THREADS=1` for one (the per-node split of
#: `bench/ep_nodes.py` without the threads' hand-offs).
THREADS = int(os.environ.get("EP_BENCH_THREADS", "2"))
#: Seconds between one session's batch of runs and the other's. Each session has its own
#: intra-op pool, whose threads spin for a while after a run: without a pause, the session
#: timed next shared the cores with them (a chain of six 1x1 convolutions ran 1.8x slower
#: on either provider, and the ratio moved by a fifth).
PAUSE = 0.1
#: Profiled runs per session for the time per op type (the median of each op type's per-run
#: sum). With 5, the transformer block's MatMul, which polyop does not claim, read 0.26 ms
#: without the provider and 0.47 with it (equal node by node over 15 runs, bench/ep_nodes.py).
PROFILE_RUNS = 15


def randomized(model: onnx.ModelProto) -> onnx.ModelProto:
    """The light models' weights are ConstantOfShape nodes (all one value): replace each by a
    random initializer of that shape, so a comparison sees real arithmetic."""
    rng = np.random.default_rng(0)
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    keep = []
    for n in model.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in consts:
            shape = [int(s) for s in consts[n.input[0]]]
            if len(shape) >= 2:
                v = rng.standard_normal(shape) / math.sqrt(max(1, int(np.prod(shape[1:]))))
            else:  # biases and normalization statistics: positive, near 1
                v = rng.uniform(0.5, 1.5, shape)
            model.graph.initializer.append(numpy_helper.from_array(v.astype(np.float32), n.output[0]))
        else:
            keep.append(n)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


def light_model(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model = randomized(onnx.load(LIGHT / f"light_{name}.onnx"))
    inits = {t.name for t in model.graph.initializer}
    data_in = [i for i in model.graph.input if i.name not in inits][0]
    shape = [d.dim_value for d in data_in.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    return model, {data_in.name: x}


def transformer_block(batch=1, seq=128, dim=256, heads=4, ff=1024) -> tuple[onnx.ModelProto, dict]:
    """One pre-norm transformer block in standard ONNX ops (opset 23), as an exporter writes
    it: RMSNormalization, Q/K/V MatMuls, scaled scores, Softmax, the output projection and a
    residual Add, then RMSNormalization, MatMul + bias Add, exact Gelu, MatMul + bias Add and
    the second residual Add."""
    rng = np.random.default_rng(2)
    dh = dim // heads

    def w(name, *shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32), name)

    def const(name, values, dtype=np.int64):
        return numpy_helper.from_array(np.array(values, dtype=dtype), name)

    inits = [w("wq", dim, dim), w("wk", dim, dim), w("wv", dim, dim), w("wo", dim, dim),
             w("w1", dim, ff), w("w2", ff, dim),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, dim).astype(np.float32), "g1"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, dim).astype(np.float32), "g2"),
             numpy_helper.from_array((0.1 * rng.standard_normal(ff)).astype(np.float32), "b1"),
             numpy_helper.from_array((0.1 * rng.standard_normal(dim)).astype(np.float32), "b2"),
             const("heads_shape", [batch, seq, heads, dh]), const("model_shape", [batch, seq, dim]),
             numpy_helper.from_array(np.array(1 / math.sqrt(dh), np.float32), "scale")]
    n = helper.make_node
    nodes = [
        n("RMSNormalization", ["x", "g1"], ["h"], axis=-1, name="norm1"),
        n("MatMul", ["h", "wq"], ["q0"], name="q"), n("MatMul", ["h", "wk"], ["k0"], name="k"),
        n("MatMul", ["h", "wv"], ["v0"], name="v"),
        n("Reshape", ["q0", "heads_shape"], ["q1"]), n("Transpose", ["q1"], ["q2"], perm=[0, 2, 1, 3]),
        n("Reshape", ["k0", "heads_shape"], ["k1"]), n("Transpose", ["k1"], ["k2"], perm=[0, 2, 3, 1]),
        n("Reshape", ["v0", "heads_shape"], ["v1"]), n("Transpose", ["v1"], ["v2"], perm=[0, 2, 1, 3]),
        n("MatMul", ["q2", "k2"], ["s0"], name="scores"), n("Mul", ["s0", "scale"], ["s1"]),
        n("Softmax", ["s1"], ["p"], axis=-1, name="softmax"),
        n("MatMul", ["p", "v2"], ["a0"], name="attend"), n("Transpose", ["a0"], ["a1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["a1", "model_shape"], ["a2"]), n("MatMul", ["a2", "wo"], ["o"], name="out"),
        n("Add", ["x", "o"], ["x1"], name="residual1"),
        n("RMSNormalization", ["x1", "g2"], ["h2"], axis=-1, name="norm2"),
        n("MatMul", ["h2", "w1"], ["f0"], name="ff1"), n("Add", ["f0", "b1"], ["f1"], name="bias1"),
        n("Gelu", ["f1"], ["f2"], name="gelu"),
        n("MatMul", ["f2", "w2"], ["f3"], name="ff2"), n("Add", ["f3", "b2"], ["f4"], name="bias2"),
        n("Add", ["x1", "f4"], ["y"], name="residual2"),
    ]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TP.FLOAT, [batch, seq, dim])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [batch, seq, dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(3).standard_normal((batch, seq, dim)).astype(np.float32)
    return model, {"x": x}


def _session(model: bytes, provider: bool, profile_prefix: str | None = None,
             blocked: bool = True) -> ort.InferenceSession:
    """A session of `model`: with polyop's provider (`provider`) or the CPU provider alone;
    `blocked=False` turns off the CPU provider's NCHWc layout transformer (its convolutions
    then run MLAS's NCHW kernels, polyop's layout)."""
    kw = {"intra_op_num_threads": THREADS, "inter_op_num_threads": 1}
    if profile_prefix:
        kw.update(enable_profiling=True, profile_file_prefix=profile_prefix)
    if provider:
        return ort.InferenceSession(model, pox.provider_session_options(**kw))
    so = ort.SessionOptions()
    for k, v in kw.items():
        setattr(so, k, v)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=[] if blocked else ["NchwcTransformer"])


def provider_session_under(model: bytes, var: str, value: str) -> ort.InferenceSession:
    """A provider session (as `_session`) made with environment variable `var` set to `value`
    (the provider reads its switches, `POLYOP_ORT_EP_FUSE`, `POLYOP_ORT_EP_PREPACK`, when a
    session makes its kernels); the variable is restored afterwards."""
    old = os.environ.get(var)
    os.environ[var] = value
    try:
        return _session(model, True)
    finally:
        if old is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old


def profiled_runs(model: bytes, feeds: dict, provider: bool, runs: int) -> tuple[list, dict]:
    """(ONNX Runtime's profile events of `runs` runs of a session made as `_session` makes it,
    {model node name: provider} for the provider's session, else {})."""
    with tempfile.TemporaryDirectory() as d:
        s = _session(model, provider, os.path.join(d, "p"))
        for _ in range(runs):
            s.run(None, feeds)
        with open(s.end_profiling()) as f:
            events = json.load(f)
        return events, pox.node_providers(s) if provider else {}


def _profile(model: bytes, feeds: dict, provider: bool, runs: int) -> tuple[dict, dict]:
    """({node name: provider}, {op type: median microseconds per run, summed over its nodes})
    from ONNX Runtime's own profile of `runs` runs after a warm-up run."""
    events, assigned = profiled_runs(model, feeds, provider, runs + 1)
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")[1:]
    where, per_run = {}, [defaultdict(float) for _ in spans]
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        a = e.get("args", {})
        name = e["name"].removesuffix("_kernel_time")
        where[name] = a.get("provider")
        # a node polyop fused (a Conv with the Relu, or Add + Relu, after it) is named after the
        # provider; ONNX Runtime's own fused convolution is FusedConv: both count as Conv
        op = a.get("op_name", "?")
        if (name.startswith(EP) and a.get("provider") == EP) or op == "FusedConv":
            op = "Conv"
        for i, (t0, t1) in enumerate(spans):
            if t0 <= e["ts"] <= t1:
                per_run[i][op] += e["dur"]
    # the model nodes inside fused nodes: ONNX Runtime's own record of the partitioning
    if any(k.startswith(EP) and v == EP for k, v in where.items()):
        where.update({k: v for k, v in assigned.items() if k not in where and v == EP})
    types = set().union(*per_run) if per_run else set()
    return where, {t: statistics.median(r.get(t, 0.0) for r in per_run) for t in types}


def measure(name: str, model: onnx.ModelProto, feeds: dict, samples: int, min_time: float) -> dict:
    raw = model.SerializeToString()
    claimable_types = {s["op_type"] for o in pox.load().info["ops"] for s in o["onnx_standard"]}
    with_ep, without = _session(raw, True), _session(raw, False)
    # (the CPU provider in polyop's layout: what is left of the gap once the layouts agree)
    without_nchw = _session(raw, False, blocked=False)
    ref = without.run(None, feeds)[0]
    got = with_ep.run(None, feeds)[0]
    err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    # calibrate: enough runs per sample for min_time
    t0 = time.perf_counter()
    without.run(None, feeds)
    reps = max(1, int(min_time / max(time.perf_counter() - t0, 1e-6)))
    t_with, t_without, t_nchw = [], [], []
    for _ in range(samples):
        for sess, acc in ((without, t_without), (with_ep, t_with), (without_nchw, t_nchw)):
            time.sleep(PAUSE)
            t0 = time.perf_counter()
            for _ in range(reps):
                sess.run(None, feeds)
            acc.append((time.perf_counter() - t0) / reps)
    where, split_ep = _profile(raw, feeds, True, PROFILE_RUNS)
    _, split_cpu = _profile(raw, feeds, False, PROFILE_RUNS)
    by_name = {nd.name or nd.output[0]: nd.op_type for nd in model.graph.node}
    ran = {k: v for k, v in where.items() if k in by_name}
    claimable = [k for k in ran if by_name[k] in claimable_types]
    claimed = [k for k in claimable if ran[k] == EP]
    return {
        "model": name, "claimed": len(claimed), "claimable": len(claimable),
        "with_ms": 1e3 * statistics.median(t_with), "without_ms": 1e3 * statistics.median(t_without),
        "without_nchw_ms": 1e3 * statistics.median(t_nchw),
        "max_rel_err": err, "split_ep": split_ep, "split_cpu": split_cpu,
        "claim_types": sorted(claimable_types),
    }


def run_all(quick: bool = False, smoke: bool = False) -> list[dict]:
    ort.set_default_logger_severity(3)  # the light models' unused-initializer warnings
    samples, min_time = (3, 0.02) if smoke else (5, 0.2) if quick else (9, 0.5)
    names = QUICK_MODELS[:1] if smoke else QUICK_MODELS if quick else MODELS
    out = []
    for name in names:
        model, feeds = light_model(name)
        out.append(measure(name, model, feeds, samples, min_time))
        print(f"  ep_models: {name} done", file=sys.stderr, flush=True)
    model, feeds = transformer_block(seq=16 if smoke else 128)
    out.append(measure("transformer block (1x128x256, 4 heads, ff 1024)" if not smoke
                       else "transformer block (smoke size)", model, feeds, samples, min_time))
    return out


def markdown(results: list[dict]) -> str:
    lines = [
        "## ONNX Runtime execution provider: whole models",
        "",
        "Unmodified models through `polyop.onnxruntime.provider_session_options()` against ONNX "
        "Runtime's CPU provider alone, same process, runs alternating between the sessions with "
        f"a {PAUSE} s pause before each batch (each session's threads spin after its runs) "
        f"(median; {THREADS} intra-op threads; weights random). **speed-up = time without polyop / "
        "time with polyop** (> 1.00: the model is faster with polyop). claimed / claimable: nodes of "
        "a type polyop implements that ran on `PolyopExecutionProvider` / all of them that ran "
        "(from ONNX Runtime's profile). **NCHW**: a third session, the CPU provider alone with its "
        "NCHWc layout transformer off (`disabled_optimizers=[\"NchwcTransformer\"]`: its "
        "convolutions on MLAS's NCHW kernels, polyop's layout), timed in the same rotation; "
        "speed-up vs NCHW = its time / time with polyop. Re-run: `.venv/bin/python "
        "bench/ep_models.py`.",
        "",
        "| model | claimed / claimable | without polyop | with polyop | speed-up | "
        "without polyop, NCHW | speed-up vs NCHW | max rel. difference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        nchw = r.get("without_nchw_ms")
        nchw_cells = f"{nchw:.2f} ms | {nchw / r['with_ms']:.2f}" if nchw else "— | —"
        lines.append(f"| {r['model']} | {r['claimed']} / {r['claimable']} | {r['without_ms']:.2f} ms | "
                     f"{r['with_ms']:.2f} ms | {r['without_ms'] / r['with_ms']:.2f} | {nchw_cells} | "
                     f"{r['max_rel_err']:.1e} |")
    lines += ["", "Time per op type (ONNX Runtime's profile, kernel time per run, summed over nodes; "
              "op types polyop claims in bold; `Conv` includes the `Relu` and `Add`/`Sum` nodes each "
              "provider fused into its convolutions: ONNX Runtime's `FusedConv`, polyop's fused "
              "chains):", "",
              "| model | op type | without polyop | with polyop | speed-up |", "|---|---|---|---|---|"]
    for r in results:
        claim_types = set(r["claim_types"])
        types = sorted(set(r["split_cpu"]) | set(r["split_ep"]),
                       key=lambda t: -max(r["split_cpu"].get(t, 0), r["split_ep"].get(t, 0)))
        for t in types:
            a, b = r["split_cpu"].get(t, 0.0), r["split_ep"].get(t, 0.0)
            name = f"**{t}**" if t in claim_types else t
            ratio = f"{a / b:.2f}" if a and b else "—"
            lines.append(f"| {r['model']} | {name} | {a / 1e3:.3f} ms | {b / 1e3:.3f} ms | {ratio} |")
    return "\n".join(lines) + "\n"


def fusion_ab(names: list[str], samples: int, min_time: float = 0.3) -> list[dict]:
    """Each model through two provider sessions in one process, one with the provider's fused
    chains (a Conv with the Relu, or Add/Sum + Relu, after it as one node) and one made under
    POLYOP_ORT_EP_FUSE=0, runs alternating; the median time of each."""
    ort.set_default_logger_severity(3)
    out = []
    for name in names:
        model, feeds = light_model(name)
        raw = model.SerializeToString()
        fused = provider_session_under(raw, "POLYOP_ORT_EP_FUSE", "1")
        plain = provider_session_under(raw, "POLYOP_ORT_EP_FUSE", "0")
        for s in (fused, plain):
            s.run(None, feeds)
        t0 = time.perf_counter()
        plain.run(None, feeds)
        reps = max(1, int(min_time / max(time.perf_counter() - t0, 1e-6)))
        times = {"fused": [], "unfused": []}
        for _ in range(samples):
            for k, s in (("fused", fused), ("unfused", plain)):
                time.sleep(PAUSE)
                t0 = time.perf_counter()
                for _ in range(reps):
                    s.run(None, feeds)
                times[k].append((time.perf_counter() - t0) / reps)
        out.append({"model": name, **{k: 1e3 * statistics.median(v) for k, v in times.items()}})
        print(f"  ep_models --fusion: {name} done", file=sys.stderr, flush=True)
    return out


def fusion_markdown(results: list[dict]) -> str:
    lines = [
        "Fused chains against none (`POLYOP_ORT_EP_FUSE=0`), both through polyop's provider in one "
        "process, runs alternating (median). Re-run: `.venv/bin/python bench/ep_models.py --fusion`.",
        "", "| model | unfused | fused | unfused / fused |", "|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['model']} | {r['unfused']:.2f} ms | {r['fused']:.2f} ms | "
                     f"{r['unfused'] / r['fused']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", help="also save the raw results here")
    ap.add_argument("--fusion", action="store_true",
                    help="instead: the provider with its fused Conv chains against POLYOP_ORT_EP_FUSE=0")
    a = ap.parse_args()
    if a.fusion:
        print(fusion_markdown(fusion_ab(QUICK_MODELS if a.quick else MODELS, 9 if a.quick else 21)))
        return
    res = run_all(a.quick, a.smoke)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    print(markdown(res))


if __name__ == "__main__":
    main()
