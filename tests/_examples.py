"""Building the example Rust programs the tests run (examples/<name>, each its own cargo
project with its own target directory)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cargo_build(example: Path, binary: str, **env: str) -> Path:
    """``cargo build --release`` of ``example`` (extra environment ``env``); the path of its
    ``binary``. A failed build fails the calling fixture with cargo's output."""
    target = example / "target"
    full_env = dict(os.environ, CARGO_TARGET_DIR=str(target), **env)
    p = subprocess.run(["cargo", "build", "--release", "--manifest-path",
                        str(example / "Cargo.toml")],
                       capture_output=True, text=True, timeout=1800, env=full_env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    return target / "release" / binary
