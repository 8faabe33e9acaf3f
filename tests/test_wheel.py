"""The wheel (issue 19): ``bash ci/wheel.sh`` builds one wheel with the Python package, the
NumPy core and the four framework libraries; installed into fresh virtual environments that
have one framework (or none), each framework's ops run through its normal call and match the
framework's own built-in ops.

A fresh environment is ``python -m venv`` plus the wheel installed with pip (``--no-deps``),
plus the distributions one framework needs: that framework and its dependency closure, as
declared in its metadata, linked from the project venv rather than downloaded again (torch
alone is gigabytes with its CUDA dependencies). Everything else the project venv has is
absent, which each test checks."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LIBS = ["libpolyop_torch.so", "libpolyop_tensorflow.so", "libpolyop_onnxruntime.so", "libpolyop_xla.so"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    p = subprocess.run(["bash", "ci/wheel.sh", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    whl = Path(p.stdout.strip().splitlines()[-1])
    assert whl.is_file(), p.stdout
    return whl


def _closure(names: list[str]) -> list[md.Distribution]:
    """The installed distributions ``names`` need (their requirements without extras, whose
    markers hold here), ``names`` included."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        n = todo.pop()
        key = re.sub(r"[-_.]+", "-", n).lower()
        if key in seen:
            continue
        try:
            d = md.distribution(n)
        except md.PackageNotFoundError:
            continue
        seen[key] = d
        for r in d.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _env(tmp: Path, wheel: Path, frameworks: list[str]) -> Path:
    """A fresh venv with the wheel installed and ``frameworks`` (plus polyop's own
    dependencies) linked in. Returns its python."""
    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = next((env / "lib").glob("python3*/site-packages"))
    for d in _closure(frameworks + ["numpy", "ml_dtypes"]):
        tops = {Path(str(f)).parts[0] for f in d.files or [] if not str(f).startswith("..")}
        for t in tops:
            src = Path(d.locate_file(t))
            if src.exists() and not (site / t).exists():
                (site / t).symlink_to(src, target_is_directory=src.is_dir())
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                        "--disable-pip-version-check", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return env / "bin" / "python"


def _run(py: Path, code: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "POLYOP_LIB_DIR", "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV")}
    p = subprocess.run([str(py), "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=600, cwd=cwd, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return p.stdout


PRELUDE = """
    import importlib.util, sys
    import numpy as np
    import polyop
    site = {site!r}
    assert polyop.__file__.startswith(site), polyop.__file__      # the installed wheel
    for fw in ("torch", "tensorflow", "onnxruntime", "jax"):      # only what this env has
        assert (importlib.util.find_spec(fw) is not None) == (fw in {have!r}), fw
"""


def _prelude(py: Path, have: list[str]) -> str:
    site = str(next((py.parent.parent / "lib").glob("python3*/site-packages")))
    return textwrap.dedent(PRELUDE).format(site=site, have=have)


def test_wheel_holds_the_package_the_core_and_four_relocatable_libraries(wheel, tmp_path):
    names = zipfile.ZipFile(wheel).namelist()
    for lib in LIBS:
        assert f"polyop/lib/{lib}" in names, names
    assert any(n.startswith("polyop/_core") and n.endswith(".so") for n in names), names
    assert "polyop/torch.py" in names and "polyop/jax.py" in names
    from polyop._check import elf_dynamic

    zipfile.ZipFile(wheel).extractall(tmp_path)
    for lib in LIBS:
        d = elf_dynamic(str(tmp_path / "polyop" / "lib" / lib))
        assert all(p.startswith("$ORIGIN") for p in d["runpath"] + d["rpath"]), (lib, d)


def test_no_framework_installed(wheel, tmp_path):
    py = _env(tmp_path, wheel, [])
    out = _run(py, _prelude(py, []) + textwrap.dedent("""
        x = np.array([[1.5, -2.0], [0.25, 4.0]], np.float32)
        assert np.array_equal(polyop.run("add", x, x[:1]), x + x[:1])
        assert polyop.library_path("torch").startswith(site)        # bundled in the wheel
        try:
            import polyop.torch
            raise AssertionError("polyop.torch imported without torch")
        except ImportError as e:
            assert "torch" in str(e), e
        print("ok")
    """), tmp_path)
    assert out.strip().endswith("ok")


def test_torch_alone(wheel, tmp_path):
    py = _env(tmp_path, wheel, ["torch"])
    out = _run(py, _prelude(py, ["torch"]) + textwrap.dedent("""
        import torch, polyop.torch as pt
        ops = pt.load()
        assert ops.path.startswith(site), ops.path
        x = torch.tensor([[1.5, -2.0, 0.25], [3.0, -0.5, 2.0]], dtype=torch.float64, requires_grad=True)
        y = ops.gelu(x)
        assert torch.allclose(y, torch.nn.functional.gelu(x), rtol=4 * 2.0**-52, atol=0)
        y.sum().backward()
        ref = x.detach().clone().requires_grad_(True)
        torch.nn.functional.gelu(ref).sum().backward()
        assert torch.allclose(x.grad, ref.grad, rtol=16 * 2.0**-52, atol=0), (x.grad, ref.grad)
        v, i = ops.topk(x.detach(), k=2)
        tv, ti = torch.topk(x.detach(), 2)
        assert torch.equal(v, tv) and torch.equal(i, ti)
        print("ok")
    """), tmp_path)
    assert out.strip().endswith("ok")


def test_onnxruntime_alone(wheel, tmp_path):
    py = _env(tmp_path, wheel, ["onnxruntime", "onnx"])
    out = _run(py, _prelude(py, ["onnxruntime"]) + textwrap.dedent("""
        import polyop.onnxruntime as pox
        assert pox.library_path().startswith(site)
        x = np.array([[1.5, -2.0, 0.25], [3.0, -0.5, 2.0]], np.float64)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        got = pox.run("softmax", x)
        assert np.allclose(got, e / e.sum(axis=-1, keepdims=True), rtol=4 * 2.0**-52, atol=0), got
        v, i = pox.run("topk", x, k=2)
        assert v.tolist() == [[1.5, 0.25], [3.0, 2.0]] and i.tolist() == [[0, 2], [0, 2]], (v, i)
        print("ok")
    """), tmp_path)
    assert out.strip().endswith("ok")
