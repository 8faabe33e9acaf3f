"""ci/test.sh's bookkeeping, on small fake steps: a collection error is reported with the file
whose tests it hid, and a step that hangs fails with its name (no step may stall CI)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _ci(tmp_path, script: str) -> str:
    """Run ``script`` in bash after sourcing ci/test.sh (functions only), from tmp_path."""
    code = f"""
source {REPO / 'ci' / 'test.sh'}
VPY={sys.executable}
LOGDIR=$(mktemp -d)
{script}
summary
"""
    p = subprocess.run(["bash", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return p.stdout + p.stderr


def test_collection_error_names_the_hidden_file(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_broken.py").write_text("import no_such_module_xyz\n\ndef test_a():\n    pass\n")
    (tmp_path / "tests" / "test_fine.py").write_text("def test_ok():\n    pass\n")
    out = _ci(tmp_path, "run_pytest tests/test_broken.py 120; run_pytest tests/test_fine.py 120")
    assert "FAILED: pytest tests/test_broken.py: collection error in tests/test_broken.py (none of its tests ran)" in out, out
    assert "1 passed, 1 failed" in out.splitlines(), out


def test_failures_are_counted_per_test(tmp_path):
    (tmp_path / "test_mixed.py").write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert 0\n")
    out = _ci(tmp_path, "run_pytest test_mixed.py 120")
    assert "FAILED: pytest test_mixed.py: 1 failed" in out and "1 passed, 1 failed" in out.splitlines(), out


def test_the_summary_says_why_a_test_failed(tmp_path):
    # the tail of a CI log is often all that is shown: it must carry each failure's message
    (tmp_path / "test_why.py").write_text(
        "def test_fine():\n    pass\n\ndef test_threads():\n    assert 3 <= 2, ('threads', 3)\n")
    out = _ci(tmp_path, "run_pytest test_why.py 120")
    tail = out.splitlines()[-3:]
    assert any(l.startswith("WHY: test_why.py::test_threads: ") and "('threads', 3)" in l for l in tail), out
    assert not any("test_fine" in l for l in out.splitlines() if l.startswith("WHY:")), out


def test_a_hanging_step_fails_with_its_name(tmp_path):
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hang():\n    time.sleep(600)\n")
    out = _ci(tmp_path, 'check "a sleepy step" 1 sleep 600; run_pytest test_hang.py 5')
    assert "FAILED: a sleepy step: timed out after 1s" in out, out
    assert "FAILED: pytest test_hang.py: timed out after 5s" in out, out
    assert "0 passed, 2 failed" in out.splitlines(), out


def test_low_disk_deletes_the_build_cache_first(tmp_path):
    cache = tmp_path / "cache"
    (cache / "target").mkdir(parents=True)
    (cache / "target" / "big").write_text("x")
    out = _ci(tmp_path, f"POLYOP_CI_CACHE={cache} POLYOP_CI_FREE_GB=3 ensure_disk 32 16 || echo STOPPED")
    assert "3 GB free, a cold run needs ~32 GB: deleting the build cache" in out, out
    assert not cache.exists()
    assert "only 3 GB free here" in out and "STOPPED" in out, out  # the stand-in does not grow


def test_too_little_disk_stops_with_the_figures(tmp_path):
    out = _ci(tmp_path, "POLYOP_CI_CACHE=none POLYOP_CI_FREE_GB=3 ensure_disk 32 16 || echo STOPPED")
    assert "only 3 GB free here" in out and "needs ~32 GB" in out and "STOPPED" in out, out
    out = _ci(tmp_path, "POLYOP_CI_CACHE=none POLYOP_CI_FREE_GB=40 ensure_disk 32 16 && echo ROOM")
    assert "ROOM" in out and "free here" not in out, out


def test_a_warm_cache_is_kept_when_a_warm_run_fits(tmp_path):
    cache = tmp_path / "cache"
    (cache / "target").mkdir(parents=True)
    out = _ci(tmp_path, f"POLYOP_CI_CACHE={cache} POLYOP_CI_FREE_GB=20 ensure_disk 32 16 && echo ROOM")
    assert "ROOM" in out and "deleting" not in out and cache.exists(), out


def test_examples_targets_are_kept_per_checkout_and_the_workspace_target_shared(tmp_path):
    """An example's target directory is its checkout's own (cargo builds the polyop crates it
    reaches by paths outside its workspace as other units from elsewhere, but names a cdylib
    crate's outputs without a hash: shared, one checkout's rlib was linked into another's
    build); the workspace's target/ is shared; the three checkouts used last keep theirs."""
    cache = tmp_path / "cache"
    (cache / "examples" / "rust_ort" / "target").mkdir(parents=True)  # the shared layout before
    dirs = ["target", "examples/rust_ort/target", "examples/swiglu/target"]
    seen = {}
    for name in ["a", "b", "c", "d"]:
        checkout = tmp_path / name
        checkout.mkdir()
        out = _ci(checkout, f"POLYOP_CI_CACHE={cache} link_caches")
        seen[name] = {d: Path(os.path.realpath(checkout / d)) for d in dirs}
        assert all(p.is_dir() for p in seen[name].values()), (name, out)
        time.sleep(0.05)
    assert {seen[n]["target"] for n in seen} == {cache / "target"}, seen
    for d in dirs[1:]:
        assert len({seen[n][d] for n in seen}) == 4, (d, seen)
        assert all(cache / "checkouts" in seen[n][d].parents for n in seen), seen
    assert not (cache / "examples").exists()
    assert len(list((cache / "checkouts").iterdir())) == 3
    assert not seen["a"]["examples/rust_ort/target"].exists()  # the least recently used
    assert all(seen[n]["examples/rust_ort/target"].is_dir() for n in "bcd")


# A checkout's path baked in at compile time: `env!("CARGO_MANIFEST_DIR")` (or `option_env!`).
_BAKED_PATH = re.compile(r'\b(?:option_)?env!\(\s*"CARGO_MANIFEST_DIR"')


def _baked_paths(root: Path) -> list[str]:
    """The lines of the workspace's Rust sources (not the examples', whose targets are per
    checkout) that bake their checkout's directory into what they build."""
    hits = []
    for top in ["crates", "kernels", "adapters"]:
        for f in sorted((root / top).rglob("*.rs")):
            if "target" in f.relative_to(root).parts:
                continue
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if _BAKED_PATH.search(line.split("//")[0]):
                    hits.append(f"{f.relative_to(root)}:{n}: {line.strip()}")
    return hits


def test_no_workspace_build_bakes_in_its_checkouts_path(tmp_path):
    """The workspace's target/ is shared between checkouts at different paths, and cargo
    counts a unit built in one checkout as fresh in another (its fingerprint holds paths
    relative to the workspace). A test binary with its checkout's path compiled in failed in
    the official run pointing into a clone since deleted (author_build: "examples/swiglu/
    Cargo.toml" under /tmp/ci-check): tests read CARGO_MANIFEST_DIR when they run, build
    scripts write what the link needs into OUT_DIR."""
    assert _baked_paths(REPO) == []
    planted = tmp_path / "crates" / "x" / "tests"
    planted.mkdir(parents=True)
    (planted / "t.rs").write_text('let d = env!("CARGO_MANIFEST_DIR");\n// env!("CARGO_MANIFEST_DIR")\n')
    assert _baked_paths(tmp_path) == ['crates/x/tests/t.rs:1: let d = env!("CARGO_MANIFEST_DIR");']


def test_every_committed_lockfile_is_current():
    # A workspace dependency added without refreshing an example's Cargo.lock makes cargo
    # rewrite it during the tests: the authoring tests' content hash then changes under them
    # (a clean CI run failed so). `cargo metadata --locked` refuses a lockfile it would change.
    locks = subprocess.run(["git", "ls-files", "*Cargo.lock"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    assert "examples/guide/Cargo.lock" in locks, locks
    # Offline first (fast); where that fails, online: a crate the machine's cargo cache lacks (a
    # fresh machine that has not built that example yet) is fetched from crates.io, the registry
    # CI may reach. Cargo words a missing crate in several ways ("--offline was specified", "no
    # matching package named `torch-sys` found ... you're using offline mode": two clean CI runs
    # failed so), so any offline failure is retried; `--locked` still refuses, online too, a
    # lockfile cargo would change.
    for lock in locks:
        d = REPO / Path(lock).parent
        cmd = ["cargo", "metadata", "--format-version", "1", "--locked"]
        p = subprocess.run([*cmd, "--offline"], cwd=d, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            p = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"{lock} is stale (run cargo metadata in {d.relative_to(REPO)}):\n{p.stderr[-1500:]}"


def test_jobs_side_by_side_add_up_and_keep_their_output_together(tmp_path):
    # run_jobs: two at a time, each job's counts and failures in the summary, each job's
    # output printed whole (no interleaving), a job that dies counted as failed
    (tmp_path / "test_slow.py").write_text(
        "import time\n\ndef test_a():\n    time.sleep(3)\n\ndef test_b():\n    assert 0, 'slow b'\n")
    (tmp_path / "test_quick.py").write_text("def test_c():\n    pass\n")
    (tmp_path / "test_more.py").write_text("def test_d():\n    pass\n\ndef test_e():\n    pass\n")
    script = """
START=$(date +%s)
died() { kill -9 $BASHPID; }
JOBS=("run_pytest test_slow.py 120" "run_pytests test_quick.py test_more.py" died)
run_jobs
"""
    out = _ci(tmp_path, script)
    assert "4 passed, 2 failed" in out.splitlines(), out
    assert "FAILED: pytest test_slow.py: 1 failed" in out, out
    assert "FAILED: died: no result (the job died)" in out, out
    assert any(l.startswith("WHY: test_slow.py::test_b: ") and "slow b" in l for l in out.splitlines()), out
    lines = out.splitlines()
    # side by side: the second job starts before the first ends
    assert next(i for i, l in enumerate(lines) if l.startswith("---- start run_pytests test_quick")) < next(
        i for i, l in enumerate(lines) if l.startswith("---- end run_pytest test_slow.py")), out
    # each job's output whole: between a job's first section and its end line, no other job's
    for name, first in (("run_pytest test_slow.py", "test_slow.py"), ("run_pytests test_quick", "test_quick.py")):
        a = next(i for i, l in enumerate(lines) if l.startswith(f"==== pytest {first}"))
        b = next(i for i, l in enumerate(lines) if l.startswith(f"---- end {name}"))
        assert not [l for l in lines[a:b] if l.startswith("----")], out


def _features(*selection: str) -> dict[str, set[str]]:
    """package -> its resolved features, for a cargo selection of the workspace (no dev)."""
    p = subprocess.run(["cargo", "tree", *selection, "-e", "features,no-dev", "-f", "{p} {f}", "--prefix", "none",
                        "--offline"], cwd=REPO, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:  # a crate this machine's cargo cache lacks: fetch it
        p = subprocess.run(p.args[:-1], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    out: dict[str, set[str]] = {}
    for line in p.stdout.splitlines():
        parts = line.replace(" (*)", "").replace(" (proc-macro)", "").split()
        if len(parts) >= 2 and parts[1].startswith("v") and not parts[0].startswith("polyop"):
            out.setdefault(f"{parts[0]} {parts[1]}", set()).add(parts[2] if len(parts) > 2 and
                                                                 not parts[2].startswith("(") else "")
    return out


def test_every_build_of_the_stock_libraries_resolves_the_same_features():
    # set-up builds the framework libraries (first those that need no framework, beside pip)
    # and maturin builds polyop-py alone: a dependency those builds resolve with different
    # features is built twice, with everything above it (bytemuck, half, gemm, polyop-kernels:
    # ten minutes on a 2-core CI machine). crates/workspace-hack lists the union; a feature
    # missing there shows here.
    full = _features("--workspace", "--exclude", "polyop-py")
    assert "gemm v0.19.0" in full and "half v2.7.1" in full, sorted(full)[:20]
    for selection in (["-p", "polyop-py"],
                      ["-p", "polyop-kernels", "-p", "polyop-onnxruntime", "-p", "polyop-xla", "-p", "polyop-mindspore"]):
        other = _features(*selection)
        differ = {k: (sorted(full[k]), sorted(other[k])) for k in full.keys() & other.keys() if full[k] != other[k]}
        assert not differ, f"{selection} resolves other features than the workspace build: {differ}"


def test_source_mtimes_keep_unchanged_files_old_and_stamp_every_change_later(tmp_path):
    """ci/source_mtimes.py: a file keeps the mtime the last run gave it only while its content
    stays the same from run to run; any other content (changed, reverted to an older one, edited
    and not committed) gets the new run's start, later than anything built before."""
    repo, record = tmp_path / "repo", tmp_path / "record"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)
    git("init", "-q")
    (repo / "a.rs").write_text("fn a() {}\n")
    (repo / "b.rs").write_text("fn b() {}\n")
    git("add", ".")

    def run() -> tuple[dict[str, float], range]:
        for f in repo.iterdir():  # a fresh clone: every file written just now
            if f.is_file():
                os.utime(f, (time.time() + 1000, time.time() + 1000))
        start = time.time()
        p = subprocess.run([sys.executable, str(REPO / "ci" / "source_mtimes.py"), str(record)],
                           cwd=repo, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        now = range(int(start), int(time.time()) + 1)  # the run's start, in whole seconds
        return {n: (repo / n).stat().st_mtime for n in ("a.rs", "b.rs")}, now

    first, now = run()  # no record: both get this run's start (not the clone's future time)
    assert first["a.rs"] == first["b.rs"] in now, (first, now)
    time.sleep(1.1)
    (repo / "b.rs").write_text("fn b() { 1; }\n")  # an uncommitted edit counts
    second, now = run()
    assert second["a.rs"] == first["a.rs"] and second["b.rs"] in now, (first, second)
    assert second["b.rs"] > first["b.rs"]
    time.sleep(1.1)
    (repo / "b.rs").write_text("fn b() {}\n")  # back to the first run's content
    third, now = run()
    assert third["a.rs"] == first["a.rs"] and third["b.rs"] in now, (first, third)
    assert third["b.rs"] > second["b.rs"]
    (repo / "c.rs").write_text("fn c() {}\n")  # untracked, not ignored: recorded too
    run()
    assert "c.rs" in record.read_text() and (repo / "c.rs").stat().st_mtime < time.time() + 100
