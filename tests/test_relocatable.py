"""The framework libraries can be moved (issue 19): no absolute RUNPATH/RPATH, a copy in
another directory loads and runs through each framework's normal call in a fresh process, and
the one relative RUNPATH entry finds the framework from a wheel layout
(``site-packages/polyop/lib/`` next to ``site-packages/torch``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import polyop
from polyop._check import elf_dynamic

FRAMEWORKS = ["torch", "tensorflow", "onnxruntime", "xla"]
#: the package a library's relative RUNPATH points at from site-packages/polyop/lib/
WHEEL_RUNPATH = {"torch": "$ORIGIN/../../torch/lib", "tensorflow": "$ORIGIN/../../tensorflow"}


def _fresh(code: str, cwd: Path) -> str:
    # no LD_LIBRARY_PATH / LD_PRELOAD: only what the library itself says
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "POLYOP_LIB_DIR")}
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=300, cwd=cwd, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p.stdout


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_no_absolute_search_path(fw):
    d = elf_dynamic(polyop.library_path(fw))
    paths = d["runpath"] + d["rpath"]
    assert all(p.startswith("$ORIGIN") for p in paths), (fw, paths)
    assert d["runpath"] == ([WHEEL_RUNPATH[fw]] if fw in WHEEL_RUNPATH else []), d


@pytest.fixture(scope="module")
def moved(tmp_path_factory) -> Path:
    """Every stock library copied into a directory far from the build and the venv."""
    d = tmp_path_factory.mktemp("moved")
    for fw in FRAMEWORKS:
        shutil.copy(polyop.library_path(fw), d)
    return d


def test_moved_torch_library_runs_through_the_dispatcher(moved):
    out = _fresh(f"""
        import numpy as np, torch
        torch.ops.load_library({str(moved / 'libpolyop_torch.so')!r})
        x = torch.tensor([[1.5, -2.0, 0.25]], dtype=torch.float64)
        y = torch.tensor([[0.5], [-1.0]], dtype=torch.float64)
        got = torch.ops.polyop.add(x, y).numpy()
        assert np.array_equal(got, x.numpy() + y.numpy()), got
        v, i = torch.ops.polyop.topk(x, 2)
        assert v.tolist() == [[1.5, 0.25]] and i.tolist() == [[0, 2]], (v, i)
        print("ok")
    """, moved)
    assert out.strip() == "ok"


def test_moved_tensorflow_library_runs_through_load_op_library(moved):
    out = _fresh(f"""
        import numpy as np, tensorflow as tf
        m = tf.load_op_library({str(moved / 'libpolyop_tensorflow.so')!r})
        x = tf.constant([[1.5, -2.0, 0.25]], tf.float64)
        y = tf.constant([[0.5], [-1.0]], tf.float64)
        assert np.array_equal(m.polyop_add(x, y).numpy(), tf.add(x, y).numpy())
        print("ok")
    """, moved)
    assert out.strip() == "ok"


@pytest.mark.parametrize("fw", ["torch", "tensorflow"])
def test_polyop_load_of_a_moved_library_imports_its_framework(moved, fw):
    # polyop.load reads the library's metadata through ctypes; the library needs the
    # framework's own library, which polyop.load has the framework load first.
    name = {"torch": "libpolyop_torch.so", "tensorflow": "libpolyop_tensorflow.so"}[fw]
    out = _fresh(f"""
        import sys, numpy as np, polyop
        assert {fw!r} not in sys.modules
        lib = polyop.load({str(moved / name)!r})
        assert lib.framework == {fw!r} and {fw!r} in sys.modules, lib
        x = np.array([1.0, -2.0, 3.0])
        assert np.array_equal(lib.run("negate", x), -x)
        print("ok")
    """, moved)
    assert out.strip() == "ok"


def test_wheel_layout_finds_torch_through_the_relative_runpath(tmp_path):
    # site-packages/{polyop/lib/libpolyop_torch.so, torch -> the installed torch}: a process
    # that never imports torch still loads the library (the loader follows $ORIGIN).
    import importlib.util

    torch_dir = Path(importlib.util.find_spec("torch").submodule_search_locations[0])
    site = tmp_path / "site-packages"
    (site / "polyop" / "lib").mkdir(parents=True)
    (site / "torch").symlink_to(torch_dir, target_is_directory=True)
    lib = site / "polyop" / "lib" / "libpolyop_torch.so"
    shutil.copy(polyop.library_path("torch"), lib)
    out = _fresh(f"""
        import ctypes, sys
        ctypes.CDLL({str(lib)!r})
        assert "torch" not in sys.modules
        print("ok")
    """, tmp_path)
    assert out.strip() == "ok"
    # and without the torch next to it, the same load fails naming the missing library
    (site / "torch").unlink()
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    p = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(lib)!r})"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0 and "libtorch_cpu.so" in p.stderr, p.stderr
