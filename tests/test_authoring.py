"""The out-of-tree authoring path (docs/authoring.md): the example op `swiglu`
(examples/swiglu, its own cargo workspace) built into four framework libraries, run by each
framework's ordinary loading call next to the stock library, checked against independent
references (NumPy and each framework's own built-in ops), and `python -m polyop check` on the
stock libraries, the example's libraries and broken files.

`ci/example.sh` (build + the example's conformance run + check) runs here too, so the test
command covers it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polyop
import pytest

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "swiglu"
LIBS = EX / "target" / "release"
PY = sys.executable
FRAMEWORKS = ("torch", "tensorflow", "onnxruntime", "xla")


def _run(cmd, timeout=1800, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw)


@pytest.fixture(scope="module")
def example_libs() -> dict[str, str]:
    """Builds the example workspace (a no-op when up to date)."""
    env = dict(os.environ, POLYOP_PYTHON=os.environ.get("POLYOP_PYTHON", PY))
    p = _run(["cargo", "build", "--release", "--manifest-path", str(EX / "Cargo.toml")], env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    libs = {fw: str(LIBS / f"libswiglu_{fw}.so") for fw in FRAMEWORKS}
    for path in libs.values():
        assert Path(path).is_file(), path
    return libs


def _stock(fw: str) -> str:
    import polyop

    return polyop.library_path(fw)


def _py(code: str, timeout=600) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (one framework per process)."""
    return _run([PY, "-c", textwrap.dedent(code)], timeout=timeout)


def _swiglu_ref(x, g):
    x = np.asarray(x, np.float64)
    g = np.asarray(g, np.float64)
    return x * g / (1.0 + np.exp(-g))


# ----------------------------------------------------------------------------- ci/example.sh


def test_ci_example_script():
    p = _run(["bash", "ci/example.sh"], timeout=3000)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    line = next(l for l in out.splitlines() if l.startswith("swiglu conformance:"))
    passed = int(line.split(":")[1].split()[0])
    assert " 0 failed" in line and passed > 100, line
    for backend in ("native", "torch", "tensorflow", "onnxruntime", "xla"):
        assert any(l.startswith(backend) and " 0 failed" in l for l in out.splitlines()), backend
    assert out.count("result:    OK") == 4, out[-3000:]


# ----------------------------------------------------------------------------- metadata


def test_library_metadata_and_infer_come_from_the_authors_rust(example_libs):
    from polyop._library import open_library

    lib = polyop.load(example_libs["xla"])  # the public way; loads without a framework
    assert lib is open_library(example_libs["xla"])
    assert (lib.framework, lib.name_key, lib.name) == ("xla", "prefix", "example_")
    assert lib.exported == ["swiglu", "swiglu_backward"]
    info = lib.op_info("swiglu")
    assert info["schema"] == "swiglu(Tensor x, Tensor gate) -> Tensor"
    assert info["backward"] == {"op": "swiglu_backward", "inputs": [("grad", 0), ("input", 0), ("input", 1)],
                                "outputs": [0, 1]}
    assert info["dtypes"] == ["float16", "bfloat16", "float32", "float64"]
    # unknown dims merge across inputs (the author's shape function, not a Python rule)
    assert lib.infer("swiglu", [((None, 4), "float32"), ((2, None), "float32")]) == [((2, 4), "float32")]
    with pytest.raises(ValueError, match=r"swiglu_ops\.swiglu: shape mismatch"):
        lib.infer("swiglu", [((2, 3), "float32"), ((2, 4), "float32")])
    with pytest.raises(TypeError, match="unsupported dtype int32"):
        lib.infer("swiglu", [((2,), "int32"), ((2,), "int32")])
    # direct execution on NumPy arrays (strided views) through polyop_run
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 4))[::2].T
    g = rng.normal(size=(4, 3))
    np.testing.assert_allclose(lib.run("swiglu", x, g), _swiglu_ref(x, g), rtol=1e-13)
    meta = {fw: open_library(p).info for fw, p in example_libs.items() if fw == "xla"}
    assert meta["xla"]["ops"][0]["name"] == "swiglu"


def test_each_library_names_its_framework(example_libs):
    from polyop._check import elf_symbols, guess_framework

    for fw, path in example_libs.items():
        assert guess_framework(*elf_symbols(path)) == fw


# ----------------------------------------------------------------------------- frameworks


def test_torch_author_lib_next_to_stock(example_libs):
    p = _py(f"""
        import numpy as np, torch, polyop.torch as pt
        stock = pt.load()                                    # handle: torch.ops.polyop
        ops = pt.load({example_libs['torch']!r})             # handle: torch.ops.swiglu_ops
        assert ops.handle is torch.ops.swiglu_ops and ops.swiglu is torch.ops.swiglu_ops.swiglu
        assert (ops.framework, ops.name, ops.op_names) == ("torch", "swiglu_ops", ("swiglu", "swiglu_backward"))
        assert ops.library.path == ops.path and pt.load({example_libs['torch']!r}) is ops
        x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
        g = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
        y = ops.swiglu(x, g)
        ref = x * torch.nn.functional.silu(g)                # torch's own ops
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
        (gx, gg) = torch.autograd.grad(y.sum(), (x, g))
        (rx, rg) = torch.autograd.grad(ref.sum(), (x, g))
        torch.testing.assert_close(gx, rx); torch.testing.assert_close(gg, rg)
        assert torch.autograd.gradcheck(ops.swiglu, (x, g))
        # the stock library still works in the same process (no symbol interposition)
        torch.testing.assert_close(stock.negate(x.detach()), -x.detach())
        # torch.compile + opcheck use the Meta kernel (shape inference from the author's Rust)
        f = torch.compile(lambda a, b: ops.swiglu(a, b), fullgraph=True)
        a, b = torch.randn(3, 4), torch.randn(3, 4)
        torch.testing.assert_close(f(a, b), a * torch.nn.functional.silu(b))
        torch.library.opcheck(torch.ops.swiglu_ops.swiglu.default, (a, b))
        try:
            ops.swiglu(a, torch.randn(3, 5))
            raise SystemExit("no error")
        except RuntimeError as e:
            assert "swiglu_ops.swiglu: shape mismatch" in str(e), e
        print("OK")
    """)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]


def test_torch_author_lib_after_stock_loaded_rtld_global(example_libs):
    """Both torch libraries carry the adapter's cxx entry symbol under one name. With the stock
    library loaded RTLD_GLOBAL first, the author's library must still reach its own entry point
    (-Wl,-Bsymbolic; registration checks it): its ops and the stock ops both give the right
    answers, against torch's own ops."""
    p = _py(f"""
        import ctypes, os, torch
        ctypes.CDLL({_stock('torch')!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        torch.ops.load_library({example_libs['torch']!r})
        x = torch.randn(3, 4, dtype=torch.float64); g = torch.randn(3, 4, dtype=torch.float64)
        torch.testing.assert_close(torch.ops.swiglu_ops.swiglu(x, g), x * torch.nn.functional.silu(g),
                                   rtol=1e-14, atol=0)
        torch.testing.assert_close(torch.ops.polyop.negate(x), -x, rtol=0, atol=0)
        try:
            torch.ops.swiglu_ops.swiglu(x, torch.randn(3, 5, dtype=torch.float64))
            raise SystemExit("no error")
        except RuntimeError as e:
            assert "swiglu_ops.swiglu: shape mismatch" in str(e), e
        print("OK")
    """)
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]


def test_tensorflow_author_lib_next_to_stock(example_libs):
    p = _py(f"""
        import numpy as np, tensorflow as tf, polyop.tensorflow as ptf
        stock = ptf.load()
        raw = tf.load_op_library({example_libs['tensorflow']!r})   # the ordinary call works alone
        x = tf.random.normal([4, 6], dtype=tf.float64); g = tf.random.normal([4, 6], dtype=tf.float64)
        ref = x * tf.nn.silu(g)                                   # TF's own ops
        np.testing.assert_allclose(raw.example_swiglu(x=x, gate=g).numpy(), ref.numpy(), rtol=1e-12)
        ops = ptf.load({example_libs['tensorflow']!r})
        assert (ops.framework, ops.name) == ("tensorflow", ops.info["prefix"]) and "swiglu" in ops.op_names
        with tf.GradientTape(persistent=True) as t:
            t.watch([x, g]); y = ops.swiglu(x, g); r = x * tf.nn.silu(g)
        for a, b in zip(t.gradient(y, [x, g]), t.gradient(r, [x, g])):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)
        # graph mode with unknown dims: static shapes from the author's shape function
        f = tf.function(lambda a, b: ops.swiglu(a, b),
                        input_signature=[tf.TensorSpec([None, 6], tf.float32), tf.TensorSpec([4, None], tf.float32)])
        assert f.get_concrete_function().structured_outputs.shape.as_list() == [4, 6]
        np.testing.assert_allclose(stock.negate(x).numpy(), -x.numpy())
        try:
            ops.swiglu(tf.ones([2, 3]), tf.ones([2, 4])); raise SystemExit("no error")
        except tf.errors.InvalidArgumentError as e:
            assert "swiglu_ops.swiglu: shape mismatch" in str(e), e
        print("OK")
    """)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]


def test_onnxruntime_author_lib_next_to_stock(example_libs):
    p = _py(f"""
        import numpy as np, onnxruntime as ort, polyop.onnxruntime as pox
        from onnx import helper, TensorProto
        path = {example_libs['onnxruntime']!r}
        # the ordinary call, with a hand-built model in the author's domain
        node = helper.make_node("Swiglu", ["x", "g"], ["y"], domain="ai.example")
        vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 5])
        model = helper.make_model(helper.make_graph([node], "m", [vi("x"), vi("g")], [vi("y")]),
                                  opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ai.example", 1)],
                                  ir_version=10)
        so = ort.SessionOptions(); so.register_custom_ops_library(path)
        so.register_custom_ops_library(pox.library_path())        # and the stock one
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        x = rng.normal(size=(3, 5)).astype(np.float32); g = rng.normal(size=(3, 5)).astype(np.float32)
        ref = x.astype(np.float64) * g / (1 + np.exp(-g.astype(np.float64)))
        np.testing.assert_allclose(sess.run(["y"], {{"x": x, "g": g}})[0], ref, rtol=1e-5)
        lib = pox.load(path)
        assert (lib.framework, lib.name) == ("onnxruntime", "ai.example") and "swiglu" in lib.op_names
        np.testing.assert_allclose(lib.swiglu(x, g), ref, rtol=1e-5)
        np.testing.assert_allclose(lib.call("swiglu", x, g), ref, rtol=1e-5)
        np.testing.assert_allclose(pox.run("swiglu", x, g, library=path), ref, rtol=1e-5)
        sess = ort.InferenceSession(pox.make_model("swiglu", [x, g], library=path).SerializeToString(),
                                    lib.handle(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, {{"x": x, "gate": g}})[0], ref, rtol=1e-5)
        np.testing.assert_array_equal(pox.run("negate", x), -x)
        try:
            lib.swiglu(x, g[:, :4]); raise SystemExit("no error")
        except Exception as e:
            assert "swiglu_ops.swiglu" in str(e), e
        print("OK")
    """)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]


def test_jax_author_lib_next_to_stock(example_libs):
    p = _py(f"""
        import ctypes, numpy as np, jax, jax.numpy as jnp
        jax.config.update("jax_enable_x64", True)
        import polyop.jax as pj
        path = {example_libs['xla']!r}
        # the ordinary call: register the target with the handler from the library's lookup
        lib = ctypes.cdll.LoadLibrary(path)
        handler = lib.example_xla_handler
        handler.restype, handler.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
        jax.ffi.register_ffi_target("example_swiglu", jax.ffi.pycapsule(handler(b"swiglu")), platform="cpu")
        x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)))
        g = jnp.asarray(np.random.default_rng(1).normal(size=(4, 3)))
        raw = jax.ffi.ffi_call("example_swiglu", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, g)
        ref = lambda a, b: a * jax.nn.silu(b)                     # JAX's own ops
        np.testing.assert_allclose(raw, ref(x, g), rtol=1e-12)
        ops = pj.load(path)
        assert (ops.framework, ops.name) == ("xla", "example_") and ops.handle["swiglu"] == "example_swiglu"
        np.testing.assert_allclose(jax.jit(ops.swiglu)(x, g), ref(x, g), rtol=1e-12)
        for a, b in zip(jax.grad(lambda a, b: ops.swiglu(a, b).sum(), (0, 1))(x, g),
                        jax.grad(lambda a, b: ref(a, b).sum(), (0, 1))(x, g)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        v = jax.vmap(ops.swiglu)(jnp.stack([x, g]), jnp.stack([g, x]))
        np.testing.assert_allclose(v[1], ref(g, x), rtol=1e-12)
        s = jax.eval_shape(ops.swiglu, jax.ShapeDtypeStruct((2, 7), jnp.float32), jax.ShapeDtypeStruct((2, 7), jnp.float32))
        assert s.shape == (2, 7) and s.dtype == jnp.float32
        np.testing.assert_array_equal(pj.negate(x), -x)          # stock next to it
        try:
            ops.swiglu(x, g[:, :2]); raise SystemExit("no error")
        except ValueError as e:
            assert "swiglu_ops.swiglu: shape mismatch" in str(e), e
        print("OK")
    """)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]


# ----------------------------------------------------------------------------- the checker


def _check(*paths, timeout=900):
    return _run([PY, "-m", "polyop", "check", *map(str, paths)], timeout=timeout)


def test_check_stock_libraries():
    paths = [_stock(fw) for fw in FRAMEWORKS]
    p = _check(*paths)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    out = p.stdout
    for fw, key, name in [("torch", "namespace", "polyop"), ("tensorflow", "prefix", "Polyop"),
                          ("onnxruntime", "domain", "ai.polyop"), ("xla", "prefix", "polyop_")]:
        assert f"framework: {fw}" in out
        assert any(l.split() == [key, name] for l in out.splitlines()), (key, name)
    assert out.count("result:    OK") == 4
    assert out.count("loads:     yes") == 4
    assert "topk(Tensor x, int k, int axis=-1, bool largest=True) -> (Tensor values, Tensor indices)" in out
    assert "  ok      conv2d_backward" in out
    assert "refused as expected" in out  # nonzero under XLA
    assert "fail" not in out.replace("FAIL", "")


def test_check_example_libraries(example_libs):
    p = _check(*example_libs.values())
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    out = p.stdout
    for key, name in [("namespace", "swiglu_ops"), ("prefix", "Example"), ("domain", "ai.example"),
                      ("prefix", "example_")]:
        assert any(l.split() == [key, name] for l in out.splitlines()), (key, name)
    assert out.count("  ok      swiglu float32[2, 3], float32[2, 3] -> float32[2, 3]") == 4
    assert out.count("  ok      swiglu_backward") == 4


def test_check_not_a_library(tmp_path):
    bogus = tmp_path / "bogus.so"
    bogus.write_text("this is not a shared library\n")
    p = _check(bogus)
    assert p.returncode == 1
    assert "not a polyop library: not an ELF file" in p.stdout
    assert "Traceback" not in p.stdout + p.stderr
    # an ordinary shared library that is not a polyop one
    import _ctypes

    p = _check(_ctypes.__file__)
    assert p.returncode == 1
    assert "no `polyop_library_info` export" in p.stdout
    p = _check(tmp_path / "missing.so")
    assert p.returncode == 2 and "no such file" in p.stdout


def _cc(tmp_path: Path, name: str, src: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed (it builds the torch adapter's trampolines too)"
    c = tmp_path / f"{name}.c"
    c.write_text(textwrap.dedent(src))
    so = tmp_path / f"lib{name}.so"
    p = subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(c)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return so


def test_check_diagnoses_a_library_for_another_framework_version(tmp_path):
    # A "torch library" that needs a stable-ABI function this torch does not have: what a
    # library built against a newer torch looks like.
    so = _cc(tmp_path, "future_torch", """
        extern int aoti_torch_function_from_a_future_release(void);
        const char* polyop_library_info(void) { return "{}"; }
        int use(void) { return aoti_torch_function_from_a_future_release(); }
    """)
    p = _check(so)
    assert p.returncode == 1, p.stdout
    assert "framework: torch" in p.stdout
    assert "loads:     no" in p.stdout
    assert "aoti_torch_function_from_a_future_release" in p.stdout
    assert "built against a different torch version" in p.stdout
    assert "Traceback" not in p.stdout


def test_check_diagnoses_a_crash_while_loading(tmp_path):
    # A library that aborts in its load-time constructor: the check survives and says so.
    so = _cc(tmp_path, "crashy", """
        #include <stdlib.h>
        const char* polyop_library_info(void) { return "{}"; }
        void* RegisterCustomOps(void* a, void* b) { return 0; }
        __attribute__((constructor)) static void boom(void) { abort(); }
    """)
    p = _check(so)
    assert p.returncode == 1, p.stdout
    assert "framework: onnxruntime" in p.stdout
    assert "crashed (killed by signal 6)" in p.stdout


def test_an_authors_library_is_first_class_in_python(example_libs):
    # `python -m polyop ops PATH` lists the author's ops like the stock ones (the XLA library
    # loads without its framework; a torch or TF library needs that framework's libraries)
    p = _run([sys.executable, "-m", "polyop", "ops", "--all", example_libs["xla"]], timeout=300)
    assert p.returncode == 0, p.stderr
    names = [line.split()[0] for line in p.stdout.splitlines()]
    assert names == ["swiglu", "swiglu_backward"], p.stdout
    # polyop.load(path).framework_ops() is the framework's own load of that library
    r = _py(f"""
        import numpy as np, torch, polyop  # torch first: the library links libtorch
        lib = polyop.load({example_libs['torch']!r})
        ops = lib.framework_ops()
        assert ops.framework == "torch" and ops.name == lib.name
        x = torch.tensor([[1.0, -2.0]], dtype=torch.float64, requires_grad=True)
        g = torch.tensor([[0.5, 3.0]], dtype=torch.float64)
        y = ops.swiglu(x, g)
        ref = lib.run("swiglu", x.detach().numpy(), g.numpy())  # the library's CPU kernel, no torch
        assert np.array_equal(y.detach().numpy(), ref)
        y.sum().backward()
        assert x.grad is not None
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
