"""An author's op crate, built and loaded in one call, or packaged as a wheel.

``polyop.load_crate(path)`` is to a polyop op crate what ``torch.utils.cpp_extension.load`` is
to a C++ extension: it builds the crate's libraries (``cargo build --release``), keeps them in
a cache keyed by a hash of the crate's sources, and opens them. ``python -m polyop build PATH``
packages the same libraries as a wheel (``<namespace>-<version>-py3-none-<platform>.whl``)
whose ``<namespace>.load()`` opens them from the installed package."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Mapping
from pathlib import Path

#: Framework libraries in the order a crate's libraries are reported.
FRAMEWORKS = ("torch", "tensorflow", "onnxruntime", "xla")


def cache_root() -> Path:
    """``$POLYOP_CACHE``, else ``$XDG_CACHE_HOME/polyop``, else ``~/.cache/polyop``."""
    env = os.environ.get("POLYOP_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "polyop"


def _skip(rel: Path) -> bool:
    return any(p == "target" or p.startswith(".") or p == "__pycache__" for p in rel.parts)


def content_hash(root: Path) -> str:
    """A hash of every source file of the crate at ``root`` (paths and bytes; build outputs,
    hidden files and caches left out) and of polyop's version."""
    from . import __version__

    h = hashlib.sha256(f"polyop {__version__}\n".encode())
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not _skip(rel):
            h.update(str(rel).encode() + b"\0")
            h.update(p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:20]


def _cdylibs(manifest: Path, env: dict) -> list[tuple[str, str]]:
    """(package version, library file name) of every cdylib target of the workspace."""
    p = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1", "--manifest-path",
                        str(manifest)], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"polyop: cargo metadata failed for {manifest}:\n{p.stderr[-3000:]}")
    out = []
    for pkg in json.loads(p.stdout)["packages"]:
        for t in pkg["targets"]:
            if "cdylib" in t["kind"]:
                out.append((pkg["version"], f"lib{t['name'].replace('-', '_')}.so"))
    return out


def _framework_of(path: Path) -> str | None:
    from ._check import elf_symbols, guess_framework

    return guess_framework(*elf_symbols(str(path)))


def build_crate(path: str | os.PathLike, verbose: bool = False) -> dict[str, Path]:
    """Build the op crate (or workspace) at ``path`` and return ``{framework: library path}``
    for its framework libraries, from the cache when the sources are unchanged.

    The libraries land in ``<cache>/crates/<content hash>/``; cargo's target directory is
    ``$CARGO_TARGET_DIR`` if set, else one per crate location under ``<cache>/target/``, so a
    changed crate rebuilds incrementally. The torch and TensorFlow adapters are compiled
    against this interpreter's frameworks (``POLYOP_PYTHON`` defaults to ``sys.executable``)."""
    root = Path(path).resolve()
    manifest = root / "Cargo.toml"
    if not manifest.is_file():
        raise FileNotFoundError(f"polyop: no Cargo.toml in {root} (expected an op crate or workspace)")
    out = cache_root() / "crates" / content_hash(root)
    done = out / "libraries.json"
    if done.is_file():
        return {fw: out / name for fw, name in json.loads(done.read_text()).items()}
    env = dict(os.environ)
    env.setdefault("POLYOP_PYTHON", sys.executable)
    target = Path(env.get("CARGO_TARGET_DIR") or cache_root() / "target" / hashlib.sha256(
        str(root).encode()).hexdigest()[:16])
    env["CARGO_TARGET_DIR"] = str(target)
    p = subprocess.run(["cargo", "build", "--release", "--manifest-path", str(manifest)],
                       capture_output=not verbose, text=True, env=env, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"polyop: cargo build failed for {root}:\n{(p.stderr or '')[-4000:]}")
    libs: dict[str, str] = {}
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for _version, name in _cdylibs(manifest, env):
        built = target / "release" / name
        fw = _framework_of(built) if built.is_file() else None
        if fw is None:
            continue
        if fw in libs:
            raise RuntimeError(f"polyop: {root} builds two {fw} libraries ({libs[fw]}, {name})")
        shutil.copy2(built, tmp / name)
        libs[fw] = name
    if not libs:
        raise RuntimeError(f"polyop: {root} built no polyop framework library (no cdylib with an export!)")
    (tmp / "libraries.json").write_text(json.dumps(libs, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # complete or absent: a half-written entry is never found
    return {fw: out / name for fw, name in libs.items()}


class CrateLibraries(Mapping):
    """``{framework: polyop._library.Library}`` for an op crate's libraries, each opened on
    first access (opening a torch or TensorFlow library imports that framework), and
    ``paths``: ``{framework: library path}``."""

    def __init__(self, paths: dict[str, Path]):
        self.paths = {fw: paths[fw] for fw in FRAMEWORKS if fw in paths}

    def __getitem__(self, fw: str):
        from ._library import open_library

        return open_library(str(self.paths[fw]))

    def __iter__(self):
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self) -> str:
        return f"<polyop crate libraries {', '.join(f'{k}={v}' for k, v in self.paths.items())}>"


def load_crate(path: str | os.PathLike, verbose: bool = False) -> CrateLibraries:
    """Build (cached by content hash, see :func:`build_crate`) and open an op crate's
    libraries: a mapping ``{framework: polyop._library.Library}`` for each framework it
    builds, each as ``polyop.load(path)`` returns it (``ops()``, ``run``, ``infer``,
    ``framework_ops()``), opened on first access."""
    return CrateLibraries(build_crate(path, verbose))


# ------------------------------------------------------------------------------ the wheel

INIT = '''"""{name}: polyop ops built from an op crate (packaged by `python -m polyop build`)."""

from pathlib import Path

#: framework -> this package's library file
LIBRARIES = {libraries!r}
LIB_DIR = Path(__file__).resolve().parent / "lib"
__version__ = {version!r}


def library_path(framework: str) -> str:
    return str(LIB_DIR / LIBRARIES[framework])


def load() -> dict:
    """{{framework: polyop library}} for every framework this package has a library for
    (see polyop.load)."""
    import polyop

    return {{fw: polyop.load(library_path(fw)) for fw in LIBRARIES}}
'''


def _record_line(arc: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


def build_wheel(path: str | os.PathLike, out_dir: str | os.PathLike, verbose: bool = False) -> Path:
    """Package the op crate at ``path`` as a wheel in ``out_dir``: a package named after the
    crate's registry namespace holding its framework libraries (``lib/``) and ``load()``."""
    from . import __version__
    from ._library import open_library

    libs = build_crate(path, verbose)
    # the namespace and version, from a library that needs no framework to open
    probe = next((libs[fw] for fw in ("onnxruntime", "xla") if fw in libs), next(iter(libs.values())))
    name = open_library(str(probe)).namespace
    manifest = Path(path).resolve() / "Cargo.toml"
    versions = {v for v, _ in _cdylibs(manifest, dict(os.environ))}
    version = sorted(versions)[0] if versions else "0.0.0"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    tag = f"py3-none-{plat}"
    dist = f"{name}-{version}"
    files: dict[str, bytes] = {}
    files[f"{name}/__init__.py"] = INIT.format(
        name=name, version=version, libraries={fw: p.name for fw, p in libs.items()}).encode()
    for p in libs.values():
        files[f"{name}/lib/{p.name}"] = p.read_bytes()
    files[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        f"Summary: polyop ops ({', '.join(libs)}) built from {manifest.parent.name}\n"
        f"Requires-Dist: polyop>={__version__}\n"
    ).encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: polyop {__version__}\nRoot-Is-Purelib: false\nTag: {tag}\n"
    ).encode()
    record = [_record_line(a, d) for a, d in files.items()] + [f"{dist}.dist-info/RECORD,,"]
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    whl = out / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files.items():
            z.writestr(arc, data)
    return whl
