"""Where the framework libraries (`libpolyop_<fw>.so`) live."""

from __future__ import annotations

import os
from pathlib import Path

#: framework name -> library stem. "jax" is accepted as an alias of "xla".
FRAMEWORKS = {
    "torch": "polyop_torch",
    "tensorflow": "polyop_tensorflow",
    "onnxruntime": "polyop_onnxruntime",
    "xla": "polyop_xla",
    "jax": "polyop_xla",
    "mindspore": "polyop_mindspore",
}

_PKG_DIR = Path(__file__).resolve().parent
#: The repository root when running from a checkout (python/polyop/ -> repo).
REPO_ROOT = _PKG_DIR.parent.parent


def library_dirs() -> list[Path]:
    """Directories searched for libraries, in order.

    ``$POLYOP_LIB_DIR`` when set (and then only it), else the checkout's ``target/release``,
    then the package's own ``lib/`` directory (for wheels that bundle the libraries).
    """
    env = os.environ.get("POLYOP_LIB_DIR")
    if env:
        return [Path(env)]
    return [REPO_ROOT / "target" / "release", _PKG_DIR / "lib"]


def library_path(framework: str) -> str:
    """Absolute path of ``libpolyop_<framework>.so`` for ``framework`` in
    {"torch", "tensorflow", "onnxruntime", "xla"} ("jax" = "xla").

    Raises ``ValueError`` for an unknown framework and ``FileNotFoundError`` (saying how to
    build it) when the library is not built.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(
            f"polyop: unknown framework {framework!r} (expected one of "
            f"{', '.join(sorted(set(FRAMEWORKS) - {'jax'}))})"
        )
    fname = f"lib{FRAMEWORKS[framework]}.so"
    dirs = library_dirs()
    for d in dirs:
        p = d / fname
        if p.is_file():
            return str(p.resolve())
    searched = ", ".join(str(d) for d in dirs)
    raise FileNotFoundError(
        f"polyop: {fname} not found (searched: {searched}). Build it with "
        f"`cargo build --release` at the repository root (or `cargo build --release -p "
        f"{FRAMEWORKS[framework].replace('_', '-')}`), or set POLYOP_LIB_DIR to the directory "
        f"that holds it."
    )
