"""Conformance backends, one module per framework, discovered by file name.

Each module ``<name>.py`` here defines ``BACKEND``, an instance of
:class:`polyop.conformance.harness.Backend`. A module that fails to import (for example
because its framework is not installed) is reported as a failing backend with the reason,
never skipped silently.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..harness import Backend, BrokenBackend

_DIR = Path(__file__).resolve().parent

#: Report order; other discovered backends follow alphabetically.
PREFERRED_ORDER = ("native", "torch", "tensorflow", "onnxruntime", "xla", "mindspore")


def available() -> list[str]:
    """Names of the backend modules in this package (``native`` first)."""
    names = sorted(p.stem for p in _DIR.glob("*.py") if not p.stem.startswith("_"))
    return [n for n in PREFERRED_ORDER if n in names] + [n for n in names if n not in PREFERRED_ORDER]


def load(name: str, library: str | None = None) -> Backend:
    """The backend called ``name`` (a module of this package), or given as
    ``path/to/file.py[:ATTR]`` / ``package.module[:ATTR]`` (default attribute ``BACKEND``) for
    backends that live outside polyop; a :class:`BrokenBackend` carrying the import error when
    its module cannot be imported or defines no ``BACKEND``.

    ``library``: the path of an op author's library for this framework (built with the
    adapter's ``export!`` macro); the backend then runs that library's ops with that library's
    metadata (``native``: any of the author's libraries, run through its ``polyop_run``
    export). The built-in backend classes take ``library=`` in their constructor."""
    try:
        if ":" in name or name.endswith(".py") or "." in name:
            from .._load import load_spec

            b = load_spec(name, "BACKEND")
            if not isinstance(b, Backend):
                return BrokenBackend(name, f"{name} is not a Backend instance")
            return b
        mod = importlib.import_module(f"{__name__}.{name}")
    except BaseException as e:  # noqa: BLE001 - ImportError, OSError from dlopen, SystemExit...
        if isinstance(e, KeyboardInterrupt):
            raise
        return BrokenBackend(name, f"backend module failed to import: {type(e).__name__}: {e}")
    b = getattr(mod, "BACKEND", None)
    if not isinstance(b, Backend):
        return BrokenBackend(name, f"backend module {name}.py defines no BACKEND instance")
    if library is not None:
        try:
            b = type(b)(library=library)
        except BaseException as e:  # noqa: BLE001 - a library that fails to load is a failure
            if isinstance(e, KeyboardInterrupt):
                raise
            return BrokenBackend(name, f"library {library} failed to load: {type(e).__name__}: {e}")
    return b
