"""PyTorch surface of polyop: libpolyop_torch.so loaded by torch.ops.load_library, plus the
autograd glue of polyop.torch. Every check compares against torch's own built-in ops or a
hand-computed value, never against polyop itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import polyop
import polyop.torch
from polyop.conformance.tolerances import rtol_atol

REPO = Path(__file__).resolve().parents[1]
LIB = Path(polyop.library_path("torch"))

ops = polyop.torch.load()

# The SPEC section 3 surface (forward ops), written out independently of the registry.
SPEC_SCHEMAS = {
    "negate": "negate(Tensor x) -> Tensor",
    "add": "add(Tensor x, Tensor y) -> Tensor",
    "scale": "scale(Tensor x, float alpha) -> Tensor",
    "relu": "relu(Tensor x) -> Tensor",
    "relu_": "relu_(Tensor(a!) x) -> Tensor(a!)",
    "add_relu": "add_relu(Tensor x, Tensor y) -> Tensor",
    "gelu": 'gelu(Tensor x, str approximate="none") -> Tensor',
    "softmax": "softmax(Tensor x, int axis=-1) -> Tensor",
    "rms_norm": "rms_norm(Tensor x, Tensor? weight=None, float eps=1e-06, int axis=-1) -> Tensor",
    "topk": "topk(Tensor x, int k, int axis=-1, bool largest=True) -> (Tensor values, Tensor indices)",
    "conv2d": "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[] padding=0, "
              "int[2] dilation=1, int groups=1) -> Tensor",
    "nonzero": "nonzero(Tensor x) -> Tensor",
}


def torch_form(schema: str) -> str:
    """A polyop schema as torch declares it: an `int[]` with a single-int default is torch's
    `int[1]` ("a list or one int"; torch's `int[]` refuses a scalar default), docs/torch.md."""
    return re.sub(r"\bint\[\] (\w+)=(-?\d+)", r"int[1] \1=\2", schema)


def registered() -> list[dict]:
    return polyop.ops()


def run_python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def g(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed + sum(shape) * 7 + len(shape))
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------------------------------------
# loading and the issue check


def test_issue_check_raw_library_no_env():
    """The issue's command, in a fresh process with no LD_LIBRARY_PATH and no polyop import."""
    r = run_python(
        """
        import torch
        torch.ops.load_library('target/release/libpolyop_torch.so')
        v, i = torch.ops.polyop.topk(torch.tensor([[1., 3., 3., 2.]]), 2)
        print(v.tolist(), i.tolist(), i.dtype)
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[[3.0, 3.0]] [[1, 2]] torch.int64", r.stdout


def test_load_is_idempotent():
    assert polyop.torch.load() is ops
    assert polyop.torch.load().handle is torch.ops.polyop
    assert polyop.torch.ops() is torch.ops.polyop
    # loading the raw library again (same path) is harmless too
    torch.ops.load_library(str(LIB))
    assert torch.equal(ops.negate(torch.tensor([1.0])), torch.tensor([-1.0]))


def test_load_returns_the_common_library_object():
    """polyop.<framework>.load() returns the same kind of object in every framework."""
    from polyop._library import Loaded

    assert isinstance(ops, Loaded)
    assert (ops.framework, ops.name) == ("torch", "polyop")
    assert ops.path == os.path.realpath(LIB)
    assert ops.info["framework"] == "torch" and ops.info[ops.info["name_key"]] == "polyop"
    assert list(ops.op_names) == [o["name"] for o in polyop.ops()]
    assert set(ops.op_names) == set(ops.library.exported)
    # each op is the torch.ops packet itself (so .default works for opcheck / compile)
    assert ops.topk is torch.ops.polyop.topk and ops.op("topk") is torch.ops.polyop.topk
    x = torch.tensor([1.0, -2.0])
    assert torch.equal(ops.call("negate", x), -x)
    with pytest.raises(ValueError, match="no op `nope`"):
        ops.op("nope")


def test_spec_schemas_registered_exactly():
    names = {o["name"] for o in registered()}
    missing = sorted(set(SPEC_SCHEMAS) - names)
    assert not missing, f"SPEC ops missing from the registry: {missing}"
    for name, schema in SPEC_SCHEMAS.items():
        # compare parsed schemas: torch prints float defaults its own way (1e-06 -> 9.99...e-07)
        assert getattr(ops, name).default._schema == torch._C.parse_schema(f"polyop::{torch_form(schema)}")


def test_every_registry_op_is_a_dispatcher_op_with_its_schema():
    for o in registered():
        op = getattr(ops, o["name"]).default
        assert op._schema == torch._C.parse_schema("polyop::" + torch_form(o["schema"]))
        for key in ("CPU", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"polyop::{o['name']}", key)
    assert str(ops.rms_norm_backward.default._schema).startswith("polyop::rms_norm_backward(")


# ---------------------------------------------------------------------------------------------
# forward results against torch built-ins


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_against_torch_builtins_float(dtype):
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    x, y, yb = g(3, 4, 5, dtype=dtype), g(3, 4, 5, dtype=dtype, seed=1), g(5, dtype=dtype, seed=2)
    torch.testing.assert_close(ops.negate(x), torch.neg(x), rtol=0, atol=0)
    torch.testing.assert_close(ops.add(x, yb), torch.add(x, yb), **tol)
    torch.testing.assert_close(ops.scale(x, 2.5), x * 2.5, **tol)
    torch.testing.assert_close(ops.relu(x), F.relu(x), rtol=0, atol=0)
    torch.testing.assert_close(ops.add_relu(x, y), F.relu(x + y), **tol)
    torch.testing.assert_close(ops.gelu(x), F.gelu(x), **tol)
    torch.testing.assert_close(ops.gelu(x, approximate="tanh"), F.gelu(x, approximate="tanh"), **tol)
    for axis in (-1, 0, 1):
        torch.testing.assert_close(ops.softmax(x, axis=axis), torch.softmax(x, dim=axis), **tol)
    w = g(5, dtype=dtype, seed=3)
    torch.testing.assert_close(
        ops.rms_norm(x, w, eps=1e-5), F.rms_norm(x, (5,), w, eps=1e-5), **tol
    )
    torch.testing.assert_close(ops.rms_norm(x), F.rms_norm(x, (5,), None, eps=1e-6), **tol)
    inp, wt, b = g(2, 3, 7, 6, dtype=dtype), g(4, 3, 3, 2, dtype=dtype, seed=4), g(4, dtype=dtype)
    torch.testing.assert_close(ops.conv2d(inp, wt), F.conv2d(inp, wt), **tol)
    torch.testing.assert_close(
        ops.conv2d(inp, wt, b, stride=2, padding=1),
        F.conv2d(inp, wt, b, stride=2, padding=1),
        **tol,
    )


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_against_torch_builtins_int(dtype):
    x = torch.randint(-50, 50, (4, 6), generator=torch.Generator().manual_seed(1)).to(dtype)
    y = torch.randint(-50, 50, (6,), generator=torch.Generator().manual_seed(2)).to(dtype)
    assert torch.equal(ops.negate(x), torch.neg(x))
    assert torch.equal(ops.add(x, y), torch.add(x, y))
    assert torch.equal(ops.relu(x), F.relu(x))
    assert torch.equal(ops.add_relu(x, y), F.relu(x + y))
    assert torch.equal(ops.nonzero(x), torch.nonzero(x))


def test_topk_against_torch():
    # distinct values so torch's (unspecified) tie order does not matter
    x = torch.randperm(60, generator=torch.Generator().manual_seed(3)).reshape(3, 4, 5).float()
    for k, axis, largest in [(2, -1, True), (3, 1, False), (0, 0, True), (3, 0, True)]:
        v, i = ops.topk(x, k, axis=axis, largest=largest)
        tv, ti = torch.topk(x, k, dim=axis, largest=largest, sorted=True)
        assert torch.equal(v, tv) and torch.equal(i, ti), (k, axis, largest)
        assert i.dtype == torch.int64


def test_topk_ties_and_nan():
    v, i = ops.topk(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), 2)
    assert v.tolist() == [[3.0, 3.0]] and i.tolist() == [[1, 2]]
    v, i = ops.topk(torch.tensor([1.0, float("nan"), 5.0]), 2)
    assert torch.isnan(v[0]) and v[1] == 5.0 and i.tolist() == [1, 2]


def test_nonzero_against_torch():
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    assert torch.equal(ops.nonzero(x), torch.nonzero(x))
    e = ops.nonzero(torch.zeros(3, 0))
    assert e.shape == (0, 2) and e.dtype == torch.int64
    assert torch.equal(ops.nonzero(torch.tensor(3.0)), torch.nonzero(torch.tensor(3.0)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types(dtype):
    x = g(4, 33, dtype=dtype)
    for mine, ref in [
        (ops.gelu(x), F.gelu(x.double())),
        (ops.softmax(x), torch.softmax(x.double(), -1)),
        (ops.add(x, x), x.double() + x.double()),
    ]:
        assert mine.dtype == dtype
        # computed in f32 and rounded once: within 0.5 ulp of the exact result plus f32's
        # error (a small fraction of a half-precision ulp), so within 1 ulp of the dtype
        # (see polyop/conformance/tolerances.txt); the floor is the dtype's smallest normal
        rtol, atol = rtol_atol(str(dtype).removeprefix("torch."), 1.0)
        torch.testing.assert_close(mine.double(), ref, rtol=rtol, atol=atol)


def test_empty_and_rank0():
    assert ops.negate(torch.empty(0, 3)).shape == (0, 3)
    assert ops.add(torch.empty(2, 0), torch.empty(0)).shape == (2, 0)
    assert ops.negate(torch.tensor(2.0)).item() == -2.0
    assert ops.softmax(torch.tensor(5.0)).item() == 1.0


def test_rank8():
    x = g(2, 1, 2, 1, 2, 1, 2, 3)
    torch.testing.assert_close(ops.softmax(x, axis=3), torch.softmax(x, 3))


# ---------------------------------------------------------------------------------------------
# strides, threads, in-place


def test_non_contiguous_inputs():
    base = g(6, 8, dtype=torch.float64)
    views = [base.t(), base[::2, 1::3], base.unsqueeze(0).expand(3, 6, 8), base[:, 2]]
    for v in views:
        assert not v.is_contiguous() or v.dim() == 1
        c = v.contiguous()
        assert torch.equal(ops.negate(v), torch.neg(c))
        assert torch.equal(ops.relu(v), F.relu(c))
        torch.testing.assert_close(ops.softmax(v), torch.softmax(c, -1), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ops.gelu(v), F.gelu(c), rtol=1e-12, atol=1e-12)
        m = (v > 0.3).to(v.dtype)
        assert torch.equal(ops.nonzero(m), torch.nonzero(m.contiguous()))
    a, b = base.t(), g(8, 1, dtype=torch.float64)[:, :1].expand(8, 6)
    torch.testing.assert_close(ops.add(a, b), a + b, rtol=1e-12, atol=1e-12)
    inp = g(1, 2, 9, 9, dtype=torch.float64).transpose(2, 3)
    w = g(3, 2, 3, 3, dtype=torch.float64).transpose(2, 3)
    torch.testing.assert_close(
        ops.conv2d(inp, w, padding=1), F.conv2d(inp, w, padding=1), rtol=1e-12, atol=1e-12
    )
    x = g(5, 4, dtype=torch.float64).t()
    v1, i1 = ops.topk(x, 2, axis=0)
    v2, i2 = torch.topk(x.contiguous(), 2, dim=0)
    assert torch.equal(v1, v2) and torch.equal(i1, i2)


def _thread_results():
    x = g(64, 4099, dtype=torch.float32)  # large enough for many parallel chunks
    y = g(4099, dtype=torch.float32, seed=5)
    w = g(4099, dtype=torch.float32, seed=6)
    inp, wt = g(2, 8, 40, 40), g(16, 8, 3, 3, seed=7)
    return [
        ops.add(x, y),
        ops.gelu(x),
        ops.softmax(x, axis=0),
        ops.softmax(x),
        ops.rms_norm(x, w),
        *ops.topk(x, 5, axis=0),
        ops.conv2d(inp, wt, padding=1),
        ops.nonzero((x > 1.0).float()),
    ]


def test_same_bits_with_1_and_2_threads():
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _thread_results()
        torch.set_num_threads(2)
        two = _thread_results()
    finally:
        torch.set_num_threads(old)
    for a, b in zip(one, two):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_kernels_use_torchs_pool_not_a_second_one():
    """With torch's intra-op pool already running, a large polyop op starts no new thread
    (a private pool such as rayon's global one would add one thread per core)."""

    def nthreads():
        return len(os.listdir(f"/proc/{os.getpid()}/task"))

    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        x = g(256, 4096)
        F.gelu(x)  # torch's own pool is up
        torch.softmax(x, 0)
        before = nthreads()
        for _ in range(3):
            torch.testing.assert_close(ops.gelu(x), F.gelu(x))
            ops.softmax(x, axis=0)
            ops.conv2d(g(2, 8, 40, 40), g(16, 8, 3, 3, seed=7), padding=1)
        assert nthreads() == before
    finally:
        torch.set_num_threads(old)


def test_relu_inplace():
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    ptr = x.data_ptr()
    r = ops.relu_(x)
    assert r is x or (r.data_ptr() == ptr and r._cdata == x._cdata) or r.data_ptr() == ptr
    assert x.data_ptr() == ptr
    assert x.tolist() == [0.0, 2.0, 0.0, 4.0]
    # non-contiguous view: writes through to the base
    base = torch.tensor([[-1.0, 2.0], [-3.0, 4.0]])
    v = base.t()
    out = ops.relu_(v)
    assert out.data_ptr() == v.data_ptr()
    assert base.tolist() == [[0.0, 2.0], [0.0, 4.0]]
    # a failed call leaves the input untouched
    bad = torch.tensor([-1, 2], dtype=torch.uint8)
    before = bad.clone()
    with pytest.raises(RuntimeError, match=r"^polyop\.relu_: unsupported dtype uint8"):
        ops.relu_(bad)
    assert torch.equal(bad, before)


# ---------------------------------------------------------------------------------------------
# errors


BAD_INPUTS = [
    ("gelu", lambda: ops.gelu(torch.tensor([1, 2], dtype=torch.int32)), "unsupported dtype int32"),
    ("negate", lambda: ops.negate(torch.tensor([1], dtype=torch.uint8)), "unsupported dtype uint8"),
    # torch's unsigned and float8 dtypes by name (they used to read "<torch dtype code 27>")
    ("negate", lambda: ops.negate(torch.tensor([1], dtype=torch.uint16)), "unsupported dtype uint16 for input `x`"),
    ("negate", lambda: ops.negate(torch.tensor([1], dtype=torch.uint32)), "unsupported dtype uint32 for input `x`"),
    ("negate", lambda: ops.negate(torch.tensor([1], dtype=torch.uint64)), "unsupported dtype uint64 for input `x`"),
    ("relu", lambda: ops.relu(torch.ones(1).to(torch.float8_e4m3fn)), "unsupported dtype float8_e4m3fn for input `x`"),
    ("add", lambda: ops.add(torch.ones(2), torch.ones(2, dtype=torch.float64)), "dtype mismatch"),
    ("add", lambda: ops.add(torch.ones(3), torch.ones(4)), "shapes [3] and [4] cannot be broadcast"),
    ("softmax", lambda: ops.softmax(torch.ones(2, 3), axis=2), "out of range"),
    ("topk", lambda: ops.topk(torch.ones(2, 3), 4), "k=4 is out of range for axis 1 of size 3"),
    ("topk", lambda: ops.topk(torch.ones(2, 3), -1), "k=-1 must be >= 0"),
    ("topk", lambda: ops.topk(torch.ones(2, 3), 1, axis=-3), "out of range"),
    ("gelu", lambda: ops.gelu(torch.ones(2), approximate="fast"), 'approximate must be "none" or "tanh", got "fast"'),
    ("rms_norm", lambda: ops.rms_norm(torch.ones(2, 4), torch.ones(3)), "weight must have shape [4]"),
    (
        "conv2d",
        lambda: ops.conv2d(torch.ones(1, 3, 5, 5), torch.ones(2, 4, 3, 3)),
        "input has 3 channels but weight expects 4",
    ),
    ("scale", lambda: ops.scale(torch.ones(2, dtype=torch.int64), 2.0), "unsupported dtype int64"),
]


@pytest.mark.parametrize("op,call,problem", BAD_INPUTS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_INPUTS)])
def test_bad_input_raises_runtime_error(op, call, problem):
    with pytest.raises(RuntimeError) as ei:
        call()
    msg = str(ei.value)
    assert f"polyop.{op}" in msg, msg
    assert problem in msg, msg
    # the process survives and the next call works
    assert torch.equal(ops.negate(torch.tensor([1.0, -2.0])), torch.tensor([-1.0, 2.0]))


def test_errors_leave_inputs_untouched_and_complex_is_refused():
    # (was "..._and_bad_device_is_refused", which checked neither: only that some error of
    # either of two types was raised)
    x, y = torch.tensor([-1.0, 2.0, 0.5]), torch.ones(4)
    keep = x.clone(), y.clone()
    with pytest.raises(RuntimeError, match=r"^polyop\.add: shapes \[3\] and \[4\] cannot be broadcast"):
        ops.add(x, y)
    assert torch.equal(x, keep[0]) and torch.equal(y, keep[1])
    # in place: a refused relu_ does not touch its argument
    v = torch.tensor([-1.0, 2.0]).to(torch.complex64)
    v0 = v.clone()
    with pytest.raises(RuntimeError, match=r"^polyop\.relu_: unsupported dtype complex64"):
        ops.relu_(v)
    assert torch.equal(v, v0)
    with pytest.raises(RuntimeError, match=r"^polyop\.negate: unsupported dtype complex64 for input `x`"):
        ops.negate(torch.ones(2, dtype=torch.complex64))
    # and the next call works
    assert torch.equal(ops.negate(torch.tensor([1.0, -2.0])), torch.tensor([-1.0, 2.0]))


# ---------------------------------------------------------------------------------------------
# autograd


def _grad_cases():
    d = torch.float64

    def r(*s, seed=0):
        return g(*s, dtype=d, seed=seed).requires_grad_(True)

    away = r(3, 4) + 0.5  # keep away from relu's kink
    away = (away.detach().sign() * (away.detach().abs() + 0.1)).requires_grad_(True)
    return {
        "negate": (ops.negate, (r(3, 4),), {}),
        "add": (ops.add, (r(3, 4), r(4, seed=1)), {}),
        "scale": (ops.scale, (r(3, 4),), {"alpha": -1.5}),
        "relu": (ops.relu, (away,), {}),
        "add_relu": (ops.add_relu, (away, r(1, 4, seed=2) * 0.01), {}),
        "gelu": (ops.gelu, (r(3, 4),), {"approximate": "tanh"}),
        "softmax": (ops.softmax, (r(3, 4),), {"axis": 0}),
        "rms_norm": (ops.rms_norm, (r(3, 4), r(4, seed=3)), {"eps": 1e-5}),
        "topk": (ops.topk, (r(3, 6),), {"k": 2, "axis": -1}),
        "conv2d": (ops.conv2d, (r(1, 2, 5, 5), r(3, 2, 3, 3, seed=4), r(3, seed=5)), {"stride": 2, "padding": 1}),
    }


def test_gradcheck_every_op_with_a_gradient():
    cases = _grad_cases()
    with_grad = [o["name"] for o in registered() if o.get("backward")]
    assert set(with_grad) <= set(cases), f"no gradcheck case for {set(with_grad) - set(cases)}"
    for name in with_grad:
        fn, args, kw = cases[name]
        assert torch.autograd.gradcheck(lambda *a: fn(*a, **kw), args), name


def test_gradients_match_torch_autograd():
    x = g(3, 5, dtype=torch.float64).requires_grad_(True)
    w = g(5, dtype=torch.float64, seed=1).requires_grad_(True)
    gy = g(3, 5, dtype=torch.float64, seed=2)
    for mine, ref, inputs in [
        (lambda: ops.rms_norm(x, w, eps=1e-5), lambda: F.rms_norm(x, (5,), w, eps=1e-5), (x, w)),
        (lambda: ops.softmax(x, axis=0), lambda: torch.softmax(x, 0), (x,)),
        (lambda: ops.gelu(x), lambda: F.gelu(x), (x,)),
    ]:
        a = torch.autograd.grad(mine(), inputs, gy)
        b = torch.autograd.grad(ref(), inputs, gy)
        for u, v in zip(a, b):
            torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)


def test_rms_norm_without_weight_gets_grad_for_x_only():
    x = g(2, 3, dtype=torch.float64).requires_grad_(True)
    y = ops.rms_norm(x)
    (gx,) = torch.autograd.grad(y.sum(), (x,))
    (rx,) = torch.autograd.grad(F.rms_norm(x, (3,), eps=1e-6).sum(), (x,))
    torch.testing.assert_close(gx, rx)


def test_topk_indices_not_differentiable():
    x = g(2, 5, dtype=torch.float64).requires_grad_(True)
    v, i = ops.topk(x, 2)
    assert v.requires_grad and not i.requires_grad
    v.sum().backward()
    expected = torch.zeros_like(x).scatter_(1, torch.topk(x.detach(), 2).indices, 1.0)
    assert torch.equal(x.grad, expected)


# ---------------------------------------------------------------------------------------------
# opcheck, fake tensors, torch.compile


def _opcheck_samples():
    x, y = g(3, 4), g(4, seed=1)
    gr = g(3, 4, seed=2)
    samples = {
        "negate": ((x,), {}),
        "add": ((x, y), {}),
        "add_backward": ((gr, x, y), {}),
        "scale": ((x,), {"alpha": 0.5}),
        "relu": ((x,), {}),
        "relu_backward": ((gr, x), {}),
        "relu_": ((x.clone(),), {}),
        "add_relu": ((x, y), {}),
        "add_relu_backward": ((gr, x, y), {}),
        "gelu": ((x,), {"approximate": "tanh"}),
        "gelu_backward": ((gr, x), {"approximate": "none"}),
        "softmax": ((x,), {"axis": 0}),
        "rms_norm": ((x, y), {"eps": 1e-5}),
        "topk": ((x, 2), {"axis": -1, "largest": False}),
        "conv2d": ((g(1, 2, 6, 6), g(3, 2, 3, 3, seed=3), g(3, seed=4)), {"stride": 1, "padding": 1}),
        "nonzero": (((x > 0).float(),), {}),
    }
    for o in registered():
        name = o["name"]
        if name in samples or not o["flags"]["backward_only"]:
            continue
        # backward ops: feed them what the forward's backward metadata says
        fwd = next(p for p in registered() if (p.get("backward") or {}).get("op") == name)
        fargs, fkw = samples[fwd["name"]]
        tensors = [a for a in fargs if isinstance(a, torch.Tensor) or a is None]
        fouts = getattr(ops, fwd["name"])(*fargs, **fkw)
        fouts = fouts if isinstance(fouts, tuple) else (fouts,)
        args = []
        for kind, i in fwd["backward"]["inputs"]:
            args.append(
                torch.ones_like(fouts[i]) if kind == "grad" else tensors[i] if kind == "input" else fouts[i]
            )
        bschema = getattr(ops, name).default._schema
        kw = {a.name: fkw[a.name] for a in bschema.arguments if a.name in fkw}
        samples[name] = (tuple(args), kw)
    # inputs require grad exactly where the op is differentiable (so the autograd
    # registration is exercised), never for backward-only, in-place or integer-valued ops
    for name, (args, kw) in list(samples.items()):
        if (polyop.op_info(name).get("backward")) is None:
            continue
        samples[name] = (
            tuple(
                a.detach().requires_grad_(True)
                if isinstance(a, torch.Tensor) and a.is_floating_point()
                else a
                for a in args
            ),
            kw,
        )
    return samples


def test_opcheck_every_op():
    samples = _opcheck_samples()
    names = [o["name"] for o in registered()]
    assert set(names) <= set(samples), f"no opcheck sample for {set(names) - set(samples)}"
    for name in names:
        args, kw = samples[name]
        info = polyop.op_info(name)
        utils = list(torch.library._OPCHECK_DEFAULT_UTILS)
        if info["flags"]["inplace"]:
            # AOTAutograd cannot functionalize a custom op whose return aliases a mutated
            # input (`Tensor(a!) -> Tensor(a!)`, the SPEC schema); documented in docs/torch.md
            utils.remove("test_aot_dispatch_dynamic")
        result = torch.library.opcheck(getattr(ops, name).default, args, kw, test_utils=utils)
        assert all(v == "SUCCESS" for v in result.values()), (name, result)


def test_meta_kernels_give_inferred_shapes():
    m = torch.device("meta")
    assert ops.add(torch.empty(3, 1, device=m), torch.empty(4, device=m)).shape == (3, 4)
    v, i = ops.topk(torch.empty(2, 9, device=m), 3, axis=1)
    assert v.shape == (2, 3) and i.dtype == torch.int64 and v.device.type == "meta"
    assert ops.conv2d(torch.empty(1, 2, 8, 8, device=m), torch.empty(5, 2, 3, 3, device=m), stride=2).shape == (1, 5, 3, 3)
    with pytest.raises(RuntimeError, match="polyop.add.*broadcast"):
        ops.add(torch.empty(3, device=m), torch.empty(4, device=m))


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True)


def test_torch_compile_fullgraph():
    x, y, w = g(4, 6), g(6, seed=1), g(6, seed=2)
    f = _compiled(lambda x, y, w: ops.softmax(ops.add_relu(x, y), axis=0) + ops.rms_norm(x, w) + ops.scale(ops.gelu(x, approximate="tanh"), 2.0))
    torch.testing.assert_close(
        f(x, y, w),
        torch.softmax(F.relu(x + y), 0) + F.rms_norm(x, (6,), w, eps=1e-6) + 2.0 * F.gelu(x, approximate="tanh"),
    )
    ft = _compiled(lambda x: ops.topk(x, 3, axis=0, largest=False))
    v, i = ft(x)
    tv, ti = torch.topk(x, 3, dim=0, largest=False)
    assert torch.equal(v, tv) and torch.equal(i, ti)
    inp, wt = g(1, 2, 7, 7), g(3, 2, 3, 3, seed=3)
    fc = _compiled(lambda a, b: ops.conv2d(a, b, None, stride=2, padding=1))
    torch.testing.assert_close(fc(inp, wt), F.conv2d(inp, wt, stride=2, padding=1))


def test_torch_compile_backward():
    x = g(3, 5, dtype=torch.float64).requires_grad_(True)
    w = g(5, dtype=torch.float64, seed=1).requires_grad_(True)
    f = _compiled(lambda x, w: ops.rms_norm(x, w).sum())
    gx, gw = torch.autograd.grad(f(x, w), (x, w))
    rx, rw = torch.autograd.grad(F.rms_norm(x, (5,), w, eps=1e-6).sum(), (x, w))
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)


def test_torch_compile_errors_name_the_op():
    f = _compiled(lambda x: ops.softmax(x, axis=3))
    with pytest.raises(Exception, match=r"polyop\.softmax.*out of range"):
        f(g(2, 3))


def test_nonzero_under_compile_with_polyop_torch():
    """polyop.torch registers a fake kernel whose data-dependent dim is an unbacked size."""
    f = _compiled(lambda x: ops.nonzero(x) * 2)
    for x in (torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 3.0]]), torch.zeros(2, 2)):
        assert torch.equal(f(x), torch.nonzero(x) * 2)


def test_raw_library_nonzero_under_compile_refuses_clearly():
    """Without Python registration, the dynamic_output_shape tag makes dynamo refuse."""
    r = run_python(
        """
        import torch
        torch.ops.load_library('target/release/libpolyop_torch.so')
        f = torch.compile(lambda x: torch.ops.polyop.nonzero(x), fullgraph=True)
        try:
            f(torch.tensor([0.0, 1.0]))
        except Exception as e:
            print(str(e).splitlines()[0])
        """
    )
    assert r.returncode == 0, r.stderr
    assert "Dynamic shape operator" in r.stdout, r.stdout


def test_raw_library_meta_nonzero_is_a_clear_data_dependent_error():
    r = run_python(
        """
        import torch
        torch.ops.load_library('target/release/libpolyop_torch.so')
        try:
            torch.ops.polyop.nonzero(torch.empty(3, device='meta'))
        except RuntimeError as e:
            print(e)
        """
    )
    assert r.returncode == 0, r.stderr
    assert "polyop.nonzero: data-dependent output shape" in r.stdout, r.stdout


def test_raw_library_compile_and_opcheck_without_python_registration():
    r = run_python(
        """
        import torch
        torch.ops.load_library('target/release/libpolyop_torch.so')
        x = torch.randn(3, 4)
        f = torch.compile(lambda x: torch.ops.polyop.softmax(torch.ops.polyop.negate(x), axis=0), fullgraph=True)
        print(torch.allclose(f(x), torch.softmax(-x, 0)))
        res = torch.library.opcheck(torch.ops.polyop.add.default, (x, x[0]),
            test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
        print(sorted(set(res.values())))
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "['SUCCESS']"], r.stdout


def test_a_registration_failure_at_load_time_is_a_load_error():
    """A library whose load-time registration fails (here: a second copy of the stock library,
    whose namespace is taken) is reported by polyop.torch.load as an error naming the library
    and torch's reason, instead of loading with its ops silently missing; the first copy keeps
    working."""
    r = run_python(
        """
        import shutil, tempfile, torch
        import polyop.torch as pt
        torch.ops.load_library('target/release/libpolyop_torch.so')
        copy = tempfile.mkdtemp() + '/libpolyop_torch_copy.so'
        shutil.copy('target/release/libpolyop_torch.so', copy)
        try:
            pt.load(copy)
            print('loaded')
        except RuntimeError as e:
            print('ERROR', e)
        print(torch.ops.polyop.negate(torch.tensor([1.0, -2.0])).tolist())
        """
    )
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("ERROR polyop: ") and "libpolyop_torch_copy.so failed to register its ops with torch" in first, r.stdout
    assert "Only a single TORCH_LIBRARY can be used to register the namespace polyop" in first, r.stdout
    assert r.stdout.splitlines()[-1] == "[-1.0, 2.0]", r.stdout


def test_backward_through_an_op_without_a_gradient_raises():
    # rms_norm_backward declares no backward op: torch used to warn and leave x.grad None
    g, w = torch.ones(2, 3), torch.ones(3)
    x = torch.randn(2, 3, requires_grad=True)
    gx, _ = ops.rms_norm_backward(g, x, w)
    with pytest.raises(RuntimeError, match=r"polyop\.rms_norm_backward: this op has no gradient"):
        gx.sum().backward()
    assert x.grad is None
    # differentiable ops next to it still work, and integer outputs need no gradient
    ops.rms_norm(x, w).sum().backward()
    assert x.grad is not None and x.grad.abs().max() > 0
    # (an op with only integer outputs is never differentiated through)
    y = torch.tensor([[0.0, 1.5], [2.0, 0.0]], requires_grad=True)
    assert torch.equal(ops.nonzero(y), torch.nonzero(y))


# ---------------------------------------------------------------------------------------------
# conv2d's list attributes (int[2] stride/dilation, int[] padding), groups; rms_norm's axis


def _pad_tlbr(x, p):
    t, l, b, r = p
    return F.pad(x, (l, r, t, b))


def test_conv2d_list_attributes_groups_dilation_vs_torch():
    x, w, b = g(2, 4, 9, 8, dtype=torch.float64), g(6, 2, 3, 3, dtype=torch.float64), g(6, dtype=torch.float64)
    got = torch.ops.polyop.conv2d(x, w, b, stride=[2, 1], padding=[1, 1, 2, 2], dilation=2, groups=2)
    want = F.conv2d(_pad_tlbr(x, (1, 1, 2, 2)), w, b, stride=(2, 1), dilation=2, groups=2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # a single int for int[2] and int[]; two values for padding are [height, width]
    torch.testing.assert_close(torch.ops.polyop.conv2d(x, w, b, stride=2, padding=1, groups=2),
                               F.conv2d(x, w, b, stride=2, padding=1, groups=2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.ops.polyop.conv2d(x, w, None, padding=[2, 0], dilation=[1, 2], groups=2),
                               F.conv2d(x, w, None, padding=(2, 0), dilation=(1, 2), groups=2),
                               rtol=1e-12, atol=1e-12)
    # depthwise, with gradients through the backward op
    xd = g(2, 3, 7, 6, dtype=torch.float64).requires_grad_()
    wd = g(6, 1, 3, 3, dtype=torch.float64).requires_grad_()
    bd = g(6, dtype=torch.float64).requires_grad_()
    f = lambda *a: torch.ops.polyop.conv2d(*a, stride=[1, 2], padding=[0, 1, 1, 2], groups=3)  # noqa: E731
    torch.testing.assert_close(f(xd, wd, bd), F.conv2d(_pad_tlbr(xd, (0, 1, 1, 2)), wd, bd, stride=(1, 2), groups=3))
    assert torch.autograd.gradcheck(f, (xd, wd, bd))
    torch.library.opcheck(torch.ops.polyop.conv2d.default, (xd.detach(), wd.detach(), bd.detach()),
                          {"stride": [1, 2], "padding": [0, 1, 1, 2], "dilation": [1, 1], "groups": 3})


def test_conv2d_list_attribute_errors():
    x, w = g(1, 4, 5, 5), g(2, 2, 3, 3)
    for attrs, msg in [
        ({"stride": [1, 1, 1]}, "attribute `stride` must be int[2] (a single int or 2 ints), got 3 ints"),
        ({"padding": [1, 1, 1]}, "padding must have 1, 2 or 4 values"),
        ({"dilation": 0}, "dilation must be >= 1, got 0"),
        ({"groups": 3}, "groups=3 does not divide the input's 4 channels"),
        ({"groups": 1}, "input has 4 channels but weight expects 2"),
    ]:
        with pytest.raises(RuntimeError, match="polyop.conv2d: " + re.escape(msg)):
            torch.ops.polyop.conv2d(x, w, None, **attrs)
    assert torch.ops.polyop.conv2d(x, w, None, groups=2).shape == (1, 2, 3, 3)  # the next call works


def test_rms_norm_axis_vs_torch():
    x = g(2, 3, 4, dtype=torch.float64).requires_grad_()
    w = g(3, 4, dtype=torch.float64).requires_grad_()
    for axis in (1, -2):
        torch.testing.assert_close(torch.ops.polyop.rms_norm(x, w, eps=1e-5, axis=axis),
                                   F.rms_norm(x, (3, 4), w, eps=1e-5))
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.polyop.rms_norm(a, b, axis=1), (x, w))
    with pytest.raises(RuntimeError, match=re.escape("polyop.rms_norm: weight must have shape [3, 4]")):
        torch.ops.polyop.rms_norm(x, w[0], axis=1)
    with pytest.raises(RuntimeError, match="polyop.rms_norm: axis 3 is out of range"):
        torch.ops.polyop.rms_norm(x, None, axis=3)


# ---------------------------------------------------------------------------------------------
# huge pages for large outputs (crates/kernel-core/src/hugepages.rs)

def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    m = re.search(r"\[(\w+)\]", text)
    return m and m.group(1)


def _reports_free_pages() -> bool:
    """A virtio balloon with free page reporting (feature bit 5 of its sysfs bit string)."""
    root = Path("/sys/bus/virtio/drivers/virtio_balloon")
    if not root.is_dir():
        return False
    return any((d / "features").is_file() and (d / "features").read_text().strip()[5:6] == "1"
               for d in root.iterdir())


_ELIGIBLE = """
    import re, torch, polyop
    torch.ops.load_library(polyop.library_path("torch"))
    x = torch.linspace(-4, 4, 16 << 20)          # 64 MiB: a fresh mapping of its own
    y = torch.ops.polyop.relu(x)
    assert torch.equal(y, torch.relu(x)), "relu's values"
    page = (y.data_ptr() + (4 << 20)) & ~((2 << 20) - 1)   # a whole 2 MiB page inside it
    inside = None
    for line in open("/proc/self/smaps"):
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m.group(1), 16) <= page < int(m.group(2), 16)
        elif inside and line.startswith("THPeligible:"):
            print("eligible", line.split()[1])
            break
"""


@pytest.mark.skipif(_thp_mode() != "madvise", reason="the advice changes something only under THP mode madvise")
@pytest.mark.parametrize("var", [None, "0", "1"])
def test_large_outputs_get_huge_pages_except_under_free_page_reporting(var):
    # torch's outputs are advised as huge pages, except in a VM that reports free pages to its
    # host (this project's machines), where fresh huge pages stalled torch's threads for runs of
    # calls; POLYOP_HUGE_PAGES=0 / 1 decide it either way.
    env = {k: v for k, v in os.environ.items() if k != "POLYOP_HUGE_PAGES"}
    if var is not None:
        env["POLYOP_HUGE_PAGES"] = var
    code = textwrap.dedent(_ELIGIBLE)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    want = {None: not _reports_free_pages(), "0": False, "1": True}[var]
    assert f"eligible {int(want)}" in r.stdout, (r.stdout, r.stderr)
