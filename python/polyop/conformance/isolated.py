"""Run backends each in its own subprocess (``python -m polyop.conformance.worker``) and
merge the results. A worker that crashes, hangs or exits non-zero becomes a failure with its
exit status and the tail of its stderr; results it wrote before that are kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .harness import Result


@dataclass
class BackendRun:
    backend: str
    results: list[Result] = field(default_factory=list)
    version: str = ""
    modes: list[str] = field(default_factory=list)
    num_cases: int = 0
    seconds: float = 0.0
    returncode: int | None = None


def run_isolated(
    backends: Sequence[str],
    cases: str,
    reference: str,
    baseline: str = "native",
    ops: Sequence[str] | None = None,
    timeout: float = 1800.0,
    python: str = sys.executable,
    env: dict | None = None,
    on_done: Callable[[BackendRun], None] | None = None,
    libraries: dict[str, str] | None = None,
) -> list[BackendRun]:
    """Run each backend in a fresh ``python`` process on the cases/reference given as
    ``FILE.py[:name]`` specs. Returns one :class:`BackendRun` per backend, in order.

    ``libraries``: backend name -> path of an op author's library for it (see
    ``polyop.conformance.backends.load``); backends not listed run the stock library."""
    runs = []
    for name in backends:
        run = _run_worker(name, cases, reference, baseline, ops, timeout, python, env, libraries or {})
        if on_done:
            on_done(run)
        runs.append(run)
    return runs


def interpreter(name: str, default: str = sys.executable) -> str:
    """The Python that backend ``name``'s worker runs in: ``$POLYOP_<NAME>_PYTHON``, else the
    checkout's ``.venv-<name>`` when there is one (a framework that cannot share the main
    environment: MindSpore needs numpy<2, see ci/setup.sh), else ``default``."""
    if not name.isidentifier():
        return default
    env = os.environ.get(f"POLYOP_{name.upper()}_PYTHON")
    if env:
        return env
    from .._paths import REPO_ROOT

    own = REPO_ROOT / f".venv-{name}" / "bin" / "python"
    return str(own) if own.exists() else default


def _run_worker(name, cases, reference, baseline, ops, timeout, python, env, libraries=None) -> BackendRun:
    libraries = libraries or {}
    run = BackendRun(name)
    with tempfile.TemporaryDirectory(prefix=f"polyop-conf-{name}-") as tmp:
        out = os.path.join(tmp, "results.jsonl")
        cmd = [interpreter(name, python), "-m", "polyop.conformance.worker", "--backend", name,
               "--cases", cases,
               "--reference", reference, "--baseline", baseline, "--out", out]
        if ops:
            cmd += ["--ops", ",".join(ops)]
        if libraries.get(name):
            cmd += ["--library", libraries[name]]
        if baseline and libraries.get(baseline):
            cmd += ["--baseline-library", libraries[baseline]]
        t0 = time.perf_counter()
        err_tail = ""
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=timeout, env=env)
            run.returncode = p.returncode
            err_tail = (p.stderr or "")[-2000:]
        except subprocess.TimeoutExpired as e:
            run.returncode = None
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            err_tail = f"timed out after {timeout:.0f}s. {err[-1500:]}"
        run.seconds = time.perf_counter() - t0
        done = False
        last_case = ""
        if os.path.exists(out):
            with open(out) as f:
                for i, line in enumerate(f):
                    line = line.strip()
                    if not line:
                        continue
                    d = json.loads(line)
                    if i == 0 and "backend" in d and "status" not in d:
                        run.version = d.get("version", "")
                        run.modes = d.get("modes", [])
                        run.num_cases = d.get("num_cases", 0)
                    elif d.get("done"):
                        done = True
                    else:
                        r = Result.from_dict(d)
                        run.results.append(r)
                        last_case = r.case_id
        if run.returncode != 0 or not done:
            what = (f"exit status {run.returncode}" if run.returncode is not None else "timeout")
            after = f" after case {last_case!r}" if last_case else " before any case"
            run.results.append(Result(name, "worker", "<worker>", "<worker>", "forward", "fail",
                                      f"worker process failed ({what}){after}: {err_tail.strip()}"))
    return run
