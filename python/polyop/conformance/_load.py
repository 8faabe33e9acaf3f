"""Loading ``path/to/file.py[:name]`` specs (cases and reference modules)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


def load_spec(spec: str, default_name: str) -> Any:
    """``"conformance/cases.py:cases"`` -> the object; ``"pkg.module:name"`` works too."""
    path, _, name = spec.partition(":")
    name = name or default_name
    if path.endswith(".py") or "/" in path:
        p = Path(path).resolve()
        if str(p.parent) not in sys.path:
            sys.path.insert(0, str(p.parent))
        modname = f"_polyop_conformance_{p.stem}"
        if modname in sys.modules:
            mod = sys.modules[modname]
        else:
            s = importlib.util.spec_from_file_location(modname, p)
            if s is None or s.loader is None:
                raise ImportError(f"cannot load {p}")
            mod = importlib.util.module_from_spec(s)
            sys.modules[modname] = mod
            s.loader.exec_module(mod)
    else:
        mod = importlib.import_module(path)
    obj = getattr(mod, name)
    return obj
