"""The framework installs tests/test_compat.py runs against: each pinned ``package==version``
installed with pip into its own directory (``.cache/compat/<pkg>-<version>``, git-ignored,
reused when complete).

``python tests/_compat.py`` installs them all ahead of the tests: ci/test.sh starts it in the
background as soon as the project venv exists, so the downloads (about 10 GB, two torch
releases with their CUDA dependencies) overlap the Rust builds instead of adding to the run.
Installs take a file lock, so the tests wait for an install in progress rather than start a
second one; a failed install is left incomplete and retried by the test that needs it."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "ci" / "compat.lock"
INSTALLS = ROOT / ".cache" / "compat"

#: package -> (the test file it must pass, whether its dependencies come along)
COLUMNS = {
    # torch's CUDA dependencies are pinned exactly per release: they must come along
    "torch": ("tests/test_torch.py", True),
    # onnxruntime's few pure-Python dependencies are in the project venv already
    "onnxruntime": ("tests/test_onnxruntime.py", False),
}

#: The newest onnxruntime whose shape-inference context crashed on an absent optional input
#: (inside onnxruntime; 1.24 fixed it). The adapter gives such ops no shape function there.
ORT_BEFORE_OPTIONAL_FIX = "1.23.2"

#: A torch older than the libraries' stable-ABI floor: refused with both versions named.
TORCH_TOO_OLD = "2.12.1"


def pins() -> dict[str, str]:
    """The newest releases, from ci/compat.lock."""
    out = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[name.strip()] = version.strip()
    return out


def wanted() -> list[tuple[str, str]]:
    """Every (package, version) the tests install."""
    return sorted(pins().items()) + [("onnxruntime", ORT_BEFORE_OPTIONAL_FIX), ("torch", TORCH_TOO_OLD)]


def _prune(keep: set[str]) -> None:
    """Delete installs of versions no longer used (a raised pin leaves its old one, GBs for
    torch, in a build cache that CI keeps between runs)."""
    for d in INSTALLS.glob("*-*"):
        if d.name not in keep:
            shutil.rmtree(d, ignore_errors=True)


def install(pkg: str, version: str) -> Path:
    """The directory holding ``pkg==version`` (installed first when not complete)."""
    d = INSTALLS / f"{pkg}-{version}"
    done = d / ".complete"
    INSTALLS.mkdir(parents=True, exist_ok=True)
    with open(INSTALLS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one pip at a time; a second caller waits for it
        if not done.exists():
            _prune({f"{p}-{v}" for p, v in wanted()})
            args = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--upgrade", "--target", str(d), f"{pkg}=={version}"]
            if not COLUMNS[pkg][1]:
                args.insert(4, "--no-deps")
            p = subprocess.run(args, capture_output=True, text=True, timeout=1500)
            assert p.returncode == 0, p.stderr[-4000:]
            done.write_text(version)
    return d


if __name__ == "__main__":
    failed = 0
    for pkg, version in wanted():
        try:
            print(f"compat: {install(pkg, version)}", flush=True)
        except Exception as e:  # noqa: BLE001 (reported; the test retries the install)
            failed += 1
            print(f"compat: {pkg}=={version} failed: {e}", flush=True)
    sys.exit(1 if failed else 0)
