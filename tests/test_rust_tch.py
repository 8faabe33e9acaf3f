"""A Rust program calls polyop ops on ``tch::Tensor``s through the torch dispatcher (issue 16,
point 1): ``examples/rust_tch`` (the ``polyop_tch`` crate and a program using it) loads
``libpolyop_torch.so`` into a process that links libtorch through the ``tch`` crate and calls
every stock op by the schema in the library's own metadata, computes gradients with the
backward ops the metadata names, and trains a small model with them.

Every output is compared here with NumPy references written independently of polyop (float64
formulas from the float32 inputs; gradients by float64 central finite differences, and the
training by a NumPy re-implementation with a hand-derived chain rule)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polyop
from polyop._check import elf_dynamic

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "rust_tch"
TARGET = EX / "target"
F32_ULP = 2.0**-23


@pytest.fixture(scope="module")
def program() -> Path:
    # tch links the pip wheel's libtorch: torch-sys asks `python` (this venv's) where it is.
    # The variable's value is the torch it must find (torch-sys reads only whether it is set):
    # cargo reruns the build scripts when it changes, so a target directory cached from
    # another checkout (CI's build cache) is not reused with an rpath into that checkout's
    # venv (it was: all of this file failed, libtorch not found, once that clone was gone).
    # Resolved: CI's venv is a link into its build cache (ci/setup.sh), the same from one
    # clone to the next, so torch-sys's build (minutes) stays fresh across CI runs.
    torch_dir = os.path.realpath(importlib.util.find_spec("torch").submodule_search_locations[0])
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET), LIBTORCH_USE_PYTORCH=torch_dir,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    p = subprocess.run(["cargo", "build", "--release", "--manifest-path", str(EX / "Cargo.toml")],
                       capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    prog = TARGET / "release" / "polyop-rust-tch"
    d = elf_dynamic(str(prog))
    want = (Path(torch_dir) / "lib").resolve()
    assert any(Path(r).resolve() == want for r in d["runpath"] + d["rpath"]), (d, want)
    return prog


class Spec:
    """Writes input arrays to files and builds the program's JSON spec."""

    def __init__(self, tmp: Path):
        self.tmp, self.n = tmp, 0

    def t(self, a: np.ndarray | None, transpose: tuple[int, int] | None = None):
        if a is None:
            return None
        self.n += 1
        f = self.tmp / f"t{self.n}.bin"
        stored = a if transpose is None else a.swapaxes(*transpose)
        f.write_bytes(np.ascontiguousarray(stored).astype(stored.dtype.newbyteorder("<")).tobytes())
        d = {"file": str(f), "shape": list(a.shape), "dtype": str(a.dtype)}
        if transpose is not None:
            d["transpose"] = list(transpose)
        return d


def _run(program: Path, tmp: Path, spec: dict, library: str | None = None) -> dict:
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    library = library or polyop.library_path("torch")
    p = subprocess.run([str(program), library, str(tmp / "spec.json")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _arr(v: dict) -> np.ndarray:
    return np.asarray(v["data"], dtype=np.float64 if v["dtype"].startswith("float") else np.int64).reshape(v["shape"])


# ------------------------------------------------------------------------------------------
# NumPy references (float64), written from the op semantics in SPEC.md §3

_erf = np.vectorize(math.erf)


def r_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def r_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def r_rms_norm(x, w=None, eps=1e-6):
    y = x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)
    return y if w is None else y * w


def r_topk(x, k, axis=-1, largest=True):
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis), idx


def r_conv2d(x, w, b=None, stride=1, padding=0):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out if b is None else out + b[None, :, None, None]


def _fd_grads(f, inputs, dys, h=1e-6):
    """Central finite differences (float64) of sum_k dys[k] * f(*inputs)[k] w.r.t. each
    float input (None for non-float / absent ones)."""
    inputs = [None if a is None else np.asarray(a, np.float64) for a in inputs]

    def scalar(args):
        outs = f(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum(float(np.sum(dy * o)) for dy, o in zip(dys, outs) if dy is not None)

    grads = []
    for i, a in enumerate(inputs):
        if a is None:
            grads.append(None)
            continue
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus, minus = [x if x is None else x.copy() for x in inputs], [x if x is None else x.copy() for x in inputs]
            plus[i][idx] += h
            minus[i][idx] -= h
            g[idx] = (scalar(plus) - scalar(minus)) / (2 * h)
        grads.append(g)
    return grads


# ------------------------------------------------------------------------------------------
# every stock op, forward and backward


def _cases(rng):
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    away = lambda *s: (np.sign(f32(*s)) * (0.1 + np.abs(f32(*s)))).astype(np.float32)  # noqa: E731 - no kinks
    x34, y14 = away(3, 4), away(1, 4)
    distinct = rng.permutation(24).reshape(4, 6).astype(np.float32) / 4  # no ties for topk
    img, ker, bias = f32(2, 3, 5, 5), f32(4, 3, 3, 3), f32(4)
    g5, w5 = f32(3, 5), f32(5)
    # (op, inputs, attrs, reference(*float64 inputs), differentiable, transpose of input 0)
    return [
        ("negate", [x34], {}, lambda x: -x, True, None),
        ("negate", [np.arange(-3, 3, dtype=np.int32).reshape(2, 3)], {}, lambda x: -x, False, None),
        ("add", [x34, y14], {}, lambda x, y: x + y, True, None),
        ("add", [np.arange(6, dtype=np.int64).reshape(2, 3), np.full((2, 3), 7, np.int64)], {},
         lambda x, y: x + y, False, None),
        ("scale", [x34], {"alpha": 0.75}, lambda x: x * 0.75, True, None),
        ("relu", [x34], {}, lambda x: np.maximum(x, 0), True, None),
        ("relu_", [x34.copy()], {}, lambda x: np.maximum(x, 0), False, None),
        ("add_relu", [x34, y14], {}, lambda x, y: np.maximum(x + y, 0), True, None),
        ("gelu", [f32(3, 4)], {}, r_gelu, True, None),
        ("gelu", [f32(3, 4)], {"approximate": "tanh"}, lambda x: r_gelu(x, "tanh"), True, None),
        ("gelu", [rng.standard_normal((2, 3))], {}, r_gelu, True, None),  # float64
        ("softmax", [f32(3, 5)], {}, r_softmax, True, None),
        ("softmax", [f32(3, 5)], {"axis": 0}, lambda x: r_softmax(x, 0), True, None),
        ("softmax", [f32(4, 3)], {}, r_softmax, True, (0, 1)),  # a strided (transposed) view
        ("rms_norm", [g5, w5], {"eps": 1e-5}, lambda x, w: r_rms_norm(x, w, 1e-5), True, None),
        ("rms_norm", [g5], {}, r_rms_norm, True, None),  # no weight, default eps
        ("topk", [distinct], {"k": 3}, lambda x: r_topk(x, 3), True, None),
        ("topk", [distinct], {"k": 2, "axis": 0, "largest": False},
         lambda x: r_topk(x, 2, 0, False), True, None),
        ("conv2d", [img, ker, bias], {"stride": 2, "padding": 1},
         lambda x, w, b: r_conv2d(x, w, b, 2, 1), True, None),
        ("conv2d", [img, ker], {}, r_conv2d, True, None),
        ("nonzero", [np.array([[0, 1.5, 0], [2, 0, -1]], np.float32)], {},
         lambda x: np.argwhere(x), False, None),
    ]


def test_every_stock_op_forward_and_backward(program, tmp_path):
    rng = np.random.default_rng(16)
    cases = _cases(rng)
    assert {c[0] for c in cases} == {o["name"] for o in polyop.ops() if not o["flags"]["backward_only"]}
    sp = Spec(tmp_path)
    calls, dys = [], []
    for name, ins, attrs, ref, diff, tr in cases:
        call = {"op": name, "inputs": [sp.t(a, tr if i == 0 else None) for i, a in enumerate(ins)], "attrs": attrs}
        outs = ref(*[a.astype(np.float64) for a in ins])
        outs = outs if isinstance(outs, tuple) else (outs,)
        dy = None
        if diff:  # an incoming gradient for every float output (None for topk's indices)
            dy = [rng.standard_normal(o.shape).astype(ins[0].dtype) if o.dtype.kind == "f" else None for o in outs]
            call["grads"] = [sp.t(d) for d in dy]
            # and through torch's autograd: float inputs require grad, the program runs
            # backward() on sum_k sum(out_k * dy_k) (tch's mul/sum) and reads each input's .grad
            call["autograd_grads"] = call["grads"]
            for i, a in enumerate(ins):
                if a.dtype.kind == "f":
                    call["inputs"][i] = dict(call["inputs"][i], requires_grad=True)
        calls.append(call)
        dys.append(dy)
    got = _run(program, tmp_path, {"calls": calls})
    assert got["namespace"] == "polyop"
    n_grads = 0
    for (name, ins, attrs, ref, diff, _), dy, res in zip(cases, dys, got["calls"]):
        assert "outputs" in res, (name, res)
        x64 = [a.astype(np.float64) for a in ins]
        want = ref(*x64)
        want = want if isinstance(want, tuple) else (want,)
        assert len(res["outputs"]) == len(want), name
        f64 = ins[0].dtype == np.float64
        for o, w in zip(res["outputs"], want):
            a = _arr(o)
            assert a.shape == w.shape, (name, a.shape, w.shape)
            if w.dtype.kind in "iub":
                assert o["dtype"] == ("int64" if name in ("topk", "nonzero") else str(ins[0].dtype)), name
                np.testing.assert_array_equal(a, w, err_msg=name)
            else:
                assert o["dtype"] == str(ins[0].dtype), name
                # float32 (float64) kernels on the same inputs: a few roundings of the result
                # and of its terms (gelu/softmax/rms_norm: tolerances.txt's 8-64 ulps)
                ulp = 2.0**-52 if f64 else F32_ULP
                scale = np.abs(w) + (np.abs(x64[0]).max() if name in ("rms_norm", "conv2d", "softmax") else 0)
                if name == "conv2d":
                    scale = scale * 27  # a sum of C*kH*kW products
                bound = 16 * ulp * scale + 2.0**-126
                assert np.all(np.abs(a - w) <= bound), (name, np.max(np.abs(a - w) / bound))
        if not diff:
            continue
        fd = _fd_grads(ref, x64, [None if d is None else d.astype(np.float64) for d in dy])
        assert "error" not in res["autograd"], (name, res["autograd"])
        # Library::backward (the backward op called directly) and torch's autograd
        for how, g in (("Library::backward", res["input_grads"]), ("autograd", res["autograd"]["input_grads"])):
            for i, (gi, fi) in enumerate(zip(g, fd)):
                assert gi is not None, (name, how, i)
                a = _arr(gi)
                # the float32 backward kernel vs float64 central differences (truncation ~h^2 =
                # 1e-12, cancellation ~1e-16/h = 1e-10, which bounds the float64 case): the
                # kernel's rounding, a few ulps of the largest term (2 seen)
                ulp = 2.0**-52 if f64 else F32_ULP
                tol = 16 * ulp * max(1.0, np.abs(fi).max()) + (1e-9 if f64 else 0)
                np.testing.assert_allclose(a, fi, rtol=0, atol=tol, err_msg=f"{name} {how} grad {i}")
                n_grads += 1
    assert n_grads >= 40


def test_bad_calls_are_errors_and_the_next_call_works(program, tmp_path):
    sp = Spec(tmp_path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    calls = [
        {"op": "topk", "inputs": [sp.t(x)], "attrs": {"k": 9}},                       # kernel check
        {"op": "gelu", "inputs": [sp.t(np.ones((2, 2), np.int32))], "attrs": {}},     # dtype
        {"op": "gelu", "inputs": [sp.t(x)], "attrs": {"approximate": "cubic"}},       # attr value
        {"op": "add", "inputs": [sp.t(x), sp.t(x.astype(np.float64))], "attrs": {}},  # mixed dtypes
        {"op": "topk", "inputs": [sp.t(x)], "attrs": {"k": "two"}},                   # attr type
        {"op": "softmax", "inputs": [sp.t(x)], "attrs": {"dim": 0}},                  # unknown attr
        {"op": "nonzero", "inputs": [sp.t(x)], "attrs": {}, "grads": [None]},         # no gradient
        {"op": "relu_", "inputs": [dict(sp.t(x), requires_grad=True)], "attrs": {}},  # in-place
        # inside a grad-recording graph: a bad forward call, and a second backward() through
        # freed saved tensors (an error raised by polyop's graph node)
        {"op": "topk", "inputs": [dict(sp.t(x), requires_grad=True)], "attrs": {"k": 9}},
        {"op": "gelu", "inputs": [dict(sp.t(x), requires_grad=True)], "attrs": {},
         "autograd_grads": [sp.t(x)], "backward_twice": True},
        {"op": "negate", "inputs": [sp.t(x)], "attrs": {}},                           # still works
    ]
    got = _run(program, tmp_path, {"calls": calls})["calls"]
    errs = [r.get("error", "") for r in got[:6]]
    assert "polyop.topk: k=9 is out of range for axis 1 of size 4" in errs[0], errs[0]
    assert errs[1].startswith("polyop.gelu") and "int32" in errs[1], errs[1]
    assert errs[2].startswith("polyop.gelu") and "cubic" in errs[2], errs[2]
    assert errs[3].startswith("polyop.add") and "float64" in errs[3], errs[3]
    assert errs[4] == "polyop.topk: attribute 'k' must be int, got a str", errs[4]
    assert errs[5] == "polyop.softmax: unknown attribute 'dim'", errs[5]
    assert got[6]["grad_error"] == "polyop.nonzero: this op has no gradient (it declares no backward op)"
    assert got[7]["error"] == ("polyop.relu_: input 0 requires grad, but this in-place op records no "
                               "autograd graph; pass a detached tensor"), got[7]
    assert "polyop.topk: k=9 is out of range for axis 1 of size 4" in got[8]["error"], got[8]
    ag = got[9]["autograd"]
    assert ag["input_grads"][0] is not None, ag
    assert "polyop.gelu: trying to backward through the graph a second time" in ag["second_error"], ag
    np.testing.assert_array_equal(_arr(got[10]["outputs"][0]), -x)


# ------------------------------------------------------------------------------------------
# training: p = softmax(rms_norm(gelu(x W1 + b1, "tanh"), gamma) W2), loss = sum((p-t)^2)/B


def _forward(x, w1, b1, gamma, w2, eps):
    a = x @ w1 + b1
    g = r_gelu(a, "tanh")
    n = r_rms_norm(g, gamma, eps)
    p = r_softmax(n @ w2)
    return a, g, n, p


def _loss(params, x, t, eps):
    p = _forward(x, *params, eps)[-1]
    return float(((p - t) ** 2).sum() / x.shape[0])


def _grads(params, x, t, eps):
    """The chain rule by hand, in float64 (independent of polyop's backward kernels)."""
    w1, b1, gamma, w2 = params
    a, g, n, p = _forward(x, *params, eps)
    B, D = x.shape[0], g.shape[1]
    dp = 2 * (p - t) / B
    dz = p * (dp - (dp * p).sum(-1, keepdims=True))
    dw2 = n.T @ dz
    dn = dz @ w2.T
    r = 1 / np.sqrt((g**2).mean(-1, keepdims=True) + eps)
    dgamma = (dn * g * r).sum(0)
    wdn = dn * gamma
    dg = r * wdn - g * r**3 / D * (wdn * g).sum(-1, keepdims=True)
    c = math.sqrt(2 / math.pi)
    th = np.tanh(c * (a + 0.044715 * a**3))
    da = dg * (0.5 * (1 + th) + 0.5 * a * (1 - th**2) * c * (1 + 3 * 0.044715 * a**2))
    return [x.T @ da, da.sum(0), dgamma, dw2]


@pytest.mark.parametrize("autograd", [False, True], ids=["chain-rule-by-hand", "torch-autograd"])
def test_training_a_small_model_in_rust(program, tmp_path, autograd):
    """Gradients by `Library::backward` and a chain rule written in Rust, or by torch's
    autograd (`loss.backward()` through tch's matmul/sub/mul/sum and polyop's ops)."""
    rng = np.random.default_rng(5)
    B, I, H, O = 8, 4, 6, 3
    x = rng.standard_normal((B, I)).astype(np.float32)
    t = np.eye(O, dtype=np.float32)[rng.integers(0, O, B)]
    params = [(rng.standard_normal((I, H)) * 0.7).astype(np.float32), (rng.standard_normal(H) * 0.1).astype(np.float32),
              (1 + 0.1 * rng.standard_normal(H)).astype(np.float32), (rng.standard_normal((H, O)) * 0.7).astype(np.float32)]
    lr, steps, eps = 0.5, 30, 1e-5
    sp = Spec(tmp_path)
    train = {"x": sp.t(x), "t": sp.t(t), "w1": sp.t(params[0]), "b1": sp.t(params[1]),
             "gamma": sp.t(params[2]), "w2": sp.t(params[3]), "lr": lr, "steps": steps, "eps": eps,
             "autograd": autograd}
    got = _run(program, tmp_path, {"calls": [], "train": train})["train"]
    losses = np.asarray(got["losses"])
    assert len(losses) == steps + 1
    assert losses[-1] < 0.5 * losses[0], losses  # the loss goes down...
    assert np.all(np.diff(losses) < 0), losses   # ...at every step (small lr, smooth loss)

    x64, t64 = x.astype(np.float64), t.astype(np.float64)
    p64 = [p.astype(np.float64) for p in params]
    # gradients at the initial parameters: Rust (float32 polyop backward ops + matmul) vs
    # float64 central finite differences of the NumPy loss, and vs the NumPy chain rule
    fd = _fd_grads(lambda *ps: _loss(ps, x64, t64, eps), p64, [1.0])
    ana = _grads(p64, x64, t64, eps)
    for name, g, f, a in zip(["W1", "b1", "gamma", "W2"], got["grads0"], fd, ana):
        g = _arr(g)
        np.testing.assert_allclose(a, f, rtol=0, atol=1e-8, err_msg=f"NumPy chain rule {name}")
        # float32 forward and backward through ~10 ops: rounding of a few ulps per op of the
        # largest gradient entry (6 seen; the FD error, ~1e-10, is far below)
        np.testing.assert_allclose(g, f, rtol=0, atol=32 * F32_ULP * np.abs(f).max(), err_msg=name)

    # the same training in float64 NumPy; Rust's float32 run drifts from it by float32
    # roundings: each step adds ~0.5 ulp of |W| (the update's rounding) plus lr times the
    # gradient's float32 error (the 32 ulps of max|grad| allowed above), and the few steps
    # here do not amplify it much (smooth loss, small lr), so allow steps * that per-step
    # error (the run stays within ~2 ulps of max|W|, 1% of this bound).
    ref, ref_losses = p64, []
    for _ in range(steps):
        ref_losses.append(_loss(ref, x64, t64, eps))
        gs = _grads(ref, x64, t64, eps)
        ref = [p - lr * g for p, g in zip(ref, gs)]
    ref_losses.append(_loss(ref, x64, t64, eps))
    gmax = max(np.abs(g).max() for g in ana)
    for name, got_p, want in zip(["W1", "b1", "gamma", "W2"], got["final"], ref):
        a = _arr(got_p)
        per_step = F32_ULP * np.abs(want).max() + lr * 32 * F32_ULP * gmax
        np.testing.assert_allclose(a, want, rtol=0, atol=steps * per_step, err_msg=name)
    # each loss is a float32 evaluation (a few ulps per op, ~6 ulps seen) at parameters within
    # the bound above
    np.testing.assert_allclose(losses, ref_losses, rtol=64 * F32_ULP, atol=0)


# ------------------------------------------------------------------------------------------
# an author's library: the crate names no op, so examples/swiglu's torch library works the same


def test_an_authors_library(program, tmp_path):
    swiglu = ROOT / "examples" / "swiglu"
    env = dict(os.environ, POLYOP_PYTHON=os.environ.get("POLYOP_PYTHON", sys.executable))
    # the whole workspace, as tests/test_authoring.py builds it (CI runs the two side by side:
    # a build of swiglu-torch alone could resolve other features and relink the library the
    # other file is running)
    p = subprocess.run(["cargo", "build", "--release", "--manifest-path", str(swiglu / "Cargo.toml")],
                       capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    lib = swiglu / "target" / "release" / "libswiglu_torch.so"
    rng = np.random.default_rng(2)
    x, g, dy = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3))
    sp = Spec(tmp_path)
    calls = [{"op": "swiglu", "inputs": [sp.t(x), sp.t(g)], "attrs": {}, "grads": [sp.t(dy)]},
             {"op": "swiglu", "inputs": [sp.t(x), sp.t(g[:, :4])], "attrs": {}}]
    got = _run(program, tmp_path, {"calls": calls}, str(lib))
    assert got["namespace"] == "swiglu_ops"

    def ref(x, g):  # x * silu(g)
        return x * g / (1 + np.exp(-g))

    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    want = ref(x64, g64)
    out = _arr(got["calls"][0]["outputs"][0])
    assert np.all(np.abs(out - want) <= 16 * F32_ULP * (np.abs(want) + np.abs(x64)) + 2.0**-126)
    fd = _fd_grads(ref, [x64, g64], [dy.astype(np.float64)])
    for gi, fi in zip(got["calls"][0]["input_grads"], fd):
        np.testing.assert_allclose(_arr(gi), fi, rtol=0, atol=16 * F32_ULP * max(1.0, np.abs(fi).max()))
    err = got["calls"][1]["error"]
    assert err.startswith("swiglu_ops.swiglu: shape mismatch"), err  # the author's namespace


# ------------------------------------------------------------------------------------------
# ownership of the handles on the dispatcher's stack, under Valgrind memcheck


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_handle_ownership_under_valgrind(program, tmp_path):
    """Tensors, optional tensors (absent and present), strings, ints, bools and results, on
    successful and failing calls, through `Library::call`, `Library::backward` and torch's
    autograd (graph nodes, saved tensors, a failing second backward): no invalid
    or mismatched free (a handle released twice) and no definitely lost block but torch's own
    (the library registration, and 32 bytes per str argument that torch 2.13's `to_ivalue`
    allocates in `torch_call_dispatcher` and never frees). About 45 s."""
    sp = Spec(tmp_path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    w = np.ones(4, np.float32)
    calls = [
        {"op": "gelu", "inputs": [sp.t(x)], "attrs": {"approximate": "tanh"}, "grads": [sp.t(x)]},
        {"op": "rms_norm", "inputs": [sp.t(x), sp.t(w)], "attrs": {}, "grads": [sp.t(x)]},
        {"op": "rms_norm", "inputs": [sp.t(x), None], "attrs": {"eps": 1e-3}},
        {"op": "topk", "inputs": [sp.t(x)], "attrs": {"k": 2, "largest": False}, "grads": [sp.t(x[:, :2]), None]},
        {"op": "topk", "inputs": [sp.t(x)], "attrs": {"k": 9}},                               # fails
        {"op": "rms_norm", "inputs": [sp.t(x.astype(np.int32)), sp.t(w)], "attrs": {}},      # fails
        {"op": "gelu", "inputs": [sp.t(x)], "attrs": {"approximate": "cubic"}},               # fails
        {"op": "relu_", "inputs": [sp.t(x)], "attrs": {}},
        # torch's autograd: graph nodes, saved inputs/outputs, the backward ops they call
        {"op": "gelu", "inputs": [dict(sp.t(x), requires_grad=True)], "attrs": {"approximate": "tanh"},
         "autograd_grads": [sp.t(x)]},
        {"op": "rms_norm", "inputs": [dict(sp.t(x), requires_grad=True), dict(sp.t(w), requires_grad=True)],
         "attrs": {}, "autograd_grads": [sp.t(x)]},
        {"op": "softmax", "inputs": [dict(sp.t(x), requires_grad=True)], "attrs": {},
         "autograd_grads": [sp.t(x)], "backward_twice": True},
    ]
    n_str_args = 4  # gelu, its gelu_backward, the failing gelu, the autograd gelu
    (tmp_path / "spec.json").write_text(json.dumps({"calls": calls}))
    log = tmp_path / "memcheck.log"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    # --undef-value-errors=no: this test's claims are frees and leaks, which memcheck checks
    # without tracking definedness (addressability and the heap are tracked either way); it
    # runs in 103 s instead of 141 (ci/memcheck.sh checks uninitialised values, on the
    # NumPy and ONNX Runtime routes)
    p = subprocess.run(["valgrind", "--undef-value-errors=no", "--leak-check=full",
                        "--show-leak-kinds=definite", f"--log-file={log}",
                        str(program), polyop.library_path("torch"), str(tmp_path / "spec.json")],
                       capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])["calls"]
    assert [("error" in r) for r in res] == [False] * 4 + [True] * 3 + [False] * 4, res
    assert all(g is not None for r in res[8:] for g in r["autograd"]["input_grads"]), res[8:]
    assert "polyop.softmax: trying to backward" in res[10]["autograd"]["second_error"], res[10]
    text = log.read_text()
    assert "Invalid " not in text and "Mismatched free" not in text, text[-6000:]
    # each record: its "N bytes in M blocks are definitely lost" line and the stack lines
    # after it, up to valgrind's empty "==pid== " line
    records, cur = [], None
    for line in text.splitlines():
        body = line.split("== ", 1)[-1] if line.startswith("==") else line
        if "are definitely lost in loss record" in body:
            cur = [body]
            records.append(cur)
        elif cur is not None and body.strip() and "==" not in body:
            cur.append(body)
        else:
            cur = None
    records = ["\n".join(r) for r in records]
    torch_str = [r for r in records if "to_ivalue" in r and "torch_call_dispatcher" in r]
    others = [r for r in records if r not in torch_str
              and not any(s in r for s in ("polyop_on_load", "Library::load"))]
    assert not others, "\n\n".join(others)
    lost = sum(int(r.split(" bytes in ")[1].split(" blocks")[0].replace(",", "")) for r in torch_str)
    assert lost == n_str_args, torch_str
