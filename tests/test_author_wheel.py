"""An author's op crate in one call and as a wheel (issue 19): ``polyop.load_crate(PATH)``
builds the guide example (examples/guide) with cargo, caches the libraries by a hash of its
sources and opens them; ``python -m polyop build PATH`` packages them as a wheel that pip
installs and whose ``<namespace>.load()`` runs the ops in every framework from the installed
files. Values are checked against NumPy formulas."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import polyop
from polyop._build import content_hash

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "guide"
# the target directory tests/test_authoring_guide.py builds the guide into: compiled once
TARGET = ROOT / "examples" / "swiglu" / "target"
FRAMEWORKS = ["torch", "tensorflow", "onnxruntime", "xla"]


def leaky(x, slope, scale):
    return scale * np.where(x > 0, x, slope * x)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("polyop-cache")
    old = {k: os.environ.get(k) for k in ("POLYOP_CACHE", "CARGO_TARGET_DIR")}
    os.environ["POLYOP_CACHE"], os.environ["CARGO_TARGET_DIR"] = str(d), str(TARGET)
    yield d
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_load_crate_builds_caches_and_opens(cache):
    libs = polyop.load_crate(EX)
    assert list(libs) == FRAMEWORKS
    for fw in FRAMEWORKS:
        p = libs.paths[fw]
        assert p.is_file() and p.parent.parent == cache / "crates", p
    lib = libs["xla"]  # opening it needs no framework
    assert (lib.framework, lib.namespace) == ("xla", "guide_ops")
    x = np.array([[-2.0, 0.5, 3.0]])
    np.testing.assert_array_equal(lib.run("leaky_relu_scaled", x, slope=0.1, scale=2.0), leaky(x, 0.1, 2.0))
    # unchanged sources: the cached libraries, without running cargo (a failing cargo proves it)
    old_path = os.environ["PATH"]
    os.environ["PATH"] = "/nonexistent"
    try:
        again = polyop.load_crate(EX)
    finally:
        os.environ["PATH"] = old_path
    assert again.paths == libs.paths


def test_content_hash_follows_sources_not_outputs(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "Cargo.toml").write_text("[package]\nname = 'x'\n")
    (tmp_path / "src" / "lib.rs").write_text("// a\n")
    h = content_hash(tmp_path)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "libx.so").write_bytes(b"\0")  # build outputs do not count
    assert content_hash(tmp_path) == h
    (tmp_path / "src" / "lib.rs").write_text("// b\n")  # a source edit does
    assert content_hash(tmp_path) != h


def test_a_crate_without_a_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no Cargo.toml in .* \(expected an op crate"):
        polyop.load_crate(tmp_path)


def test_build_wheel_installs_and_runs_in_every_framework(cache, tmp_path):
    p = subprocess.run([sys.executable, "-m", "polyop", "build", str(EX), "--out", str(tmp_path / "dist")],
                       capture_output=True, text=True, timeout=1800, env=os.environ.copy())
    assert p.returncode == 0, p.stderr[-3000:]
    whl = Path(p.stdout.strip().splitlines()[-1])
    assert whl.name.startswith("guide_ops-0.1.0-py3-none-linux_x86_64"), whl.name
    names = zipfile.ZipFile(whl).namelist()
    for fw in FRAMEWORKS:
        assert f"guide_ops/lib/libguide_{fw}.so" in names, names
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--disable-pip-version-check", "--target", str(site), str(whl)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    code = textwrap.dedent(f"""
        import numpy as np
        import guide_ops
        assert guide_ops.__file__.startswith({str(site)!r}), guide_ops.__file__
        libs = guide_ops.load()
        assert sorted(libs) == sorted({FRAMEWORKS!r}), libs
        x = np.array([[-2.0, 0.5, 3.0], [1.0, -4.0, 0.25]])
        want = 2.0 * np.where(x > 0, x, 0.1 * x)
        import torch
        t = libs["torch"].framework_ops()
        assert np.array_equal(t.leaky_relu_scaled(torch.tensor(x), slope=0.1, scale=2.0).numpy(), want)
        lo, hi = libs["onnxruntime"].framework_ops().minmax(x, axis=0)
        assert np.array_equal(lo, x.min(0)) and np.array_equal(hi, x.max(0))
        import tensorflow as tf
        tfo = libs["tensorflow"].framework_ops()
        assert np.array_equal(tfo.leaky_relu_scaled(tf.constant(x), slope=0.1, scale=2.0).numpy(), want)
        import jax
        jax.config.update("jax_enable_x64", True)
        j = libs["xla"].framework_ops()
        assert np.array_equal(np.asarray(j.leaky_relu_scaled(x, slope=0.1, scale=2.0)), want)
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]
