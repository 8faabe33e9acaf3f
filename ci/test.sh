#!/usr/bin/env bash
# The whole test suite, from a fresh clone: set-up, Rust checks and tests, every Python test
# file in its own process (frameworks never share a process), and the conformance suite.
# Ends with one line "N passed, N failed[, N skipped]" and exits non-zero on any failure.
#
# Every step is bounded in time (`timeout`): a hang fails with the step's name instead of
# stalling CI. The limits (seconds) can be raised for slow machines with
# POLYOP_CI_TIMEOUT_SCALE (a whole-number factor, default 1). A pytest collection error is
# reported with the file whose tests it hid.
set -uo pipefail

SCALE=${POLYOP_CI_TIMEOUT_SCALE:-1}
PASSED=0
FAILED=0
SKIPPED=0
FAILURES=()
DETAILS=()

# Each section header says when it started, in seconds since the run began (where time goes).
section() { printf '\n==== %s [+%ss]\n' "$*" "$(($(date +%s) - ${START:-$(date +%s)}))"; }
fail() { FAILED=$((FAILED + 1)); FAILURES+=("$1"); }

# bounded NAME SECONDS CMD...: run CMD with a time limit; on expiry print and return 124.
bounded() {
    local name=$1 secs=$(($2 * SCALE))
    shift 2
    timeout --kill-after=30 "$secs" "$@"
    local rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "TIMEOUT: $name did not finish within ${secs}s" >&2
        return 124
    fi
    return "$rc"
}

# A whole step counted as one check.
check() {
    local name=$1 secs=$2
    shift 2
    section "$name"
    bounded "$name" "$secs" "$@"
    local rc=$?
    if [ "$rc" -eq 0 ]; then
        PASSED=$((PASSED + 1))
    elif [ "$rc" -eq 124 ]; then
        fail "$name: timed out after $((secs * SCALE))s"
    else
        fail "$name"
    fi
}

# One pytest process per file: run_pytest FILE [SECONDS] [PYTHON] (default: .venv's).
run_pytest() {
    local file=$1 secs=${2:-1800} py=${3:-$VPY}
    local xml
    xml="$LOGDIR/$(echo "$file" | tr '/' '_').xml"
    rm -f "$xml"
    section "pytest $file"
    # --durations: the log names each file's slowest tests (where CI's time goes)
    bounded "pytest $file" "$secs" "$py" -m pytest -q -p no:cacheprovider --durations=8 --durations-min=15 \
        --junit-xml="$xml" "$file"
    local rc=$?
    if [ "$rc" -eq 124 ]; then
        fail "pytest $file: timed out after $((secs * SCALE))s"
        return
    fi
    if [ ! -f "$xml" ]; then
        fail "pytest $file (exit $rc, no report)"
        return
    fi
    # tests, failures, errors (collection errors apart), skipped, then a line per collection
    # error ("H" and the file whose tests it hid) and per failed test ("D", its name and the
    # start of its message: the summary repeats them, so the tail of a CI log says why)
    local counts hidden
    counts=$("$VPY" - "$xml" <<'PY'
import os, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
tot = lambda k: sum(int(s.get(k, 0)) for s in suites)
hidden, details = [], []
for tc in root.iter("testcase"):
    for e in tc.findall("failure") + tc.findall("error"):
        msg = e.get("message") or ""
        if e.tag == "error" and msg.startswith("collection failure"):
            name = tc.get("name") or tc.get("classname") or "?"
            path = name.replace(".", "/") + ".py"  # the module pytest could not import
            hidden.append(path if os.path.exists(path) else name)
        else:
            text = " ".join((msg or e.text or "").split())
            details.append(f"{tc.get('name')}: {text[:400]}")
print(tot("tests") - len(hidden), tot("failures"), tot("errors") - len(hidden), tot("skipped"))
for h in hidden:
    print("H", h)
for d in details[:5]:
    print("D", d)
PY
)
    local t f e s
    read -r t f e s <<<"$(head -n1 <<<"$counts")"
    hidden=$(sed -n 's/^H //p' <<<"$counts")
    local d
    while IFS= read -r d; do
        [ -n "$d" ] && DETAILS+=("$file::$d")
    done < <(sed -n 's/^D //p' <<<"$counts")
    PASSED=$((PASSED + t - f - e - s))
    FAILED=$((FAILED + f + e))
    SKIPPED=$((SKIPPED + s))
    [ $((f + e)) -ne 0 ] && FAILURES+=("pytest $file: $((f + e)) failed")
    local h
    while IFS= read -r h; do
        [ -n "$h" ] && fail "pytest $file: collection error in $h (none of its tests ran)"
    done <<<"$hidden"
    if [ -z "$hidden" ]; then
        if [ "$rc" -eq 5 ]; then
            fail "pytest $file collected no tests"
        elif [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ]; then
            fail "pytest $file (exit $rc)"
        fi
    fi
}

summary() {
    for x in "${DETAILS[@]+"${DETAILS[@]}"}"; do echo "WHY: $x"; done
    for x in "${FAILURES[@]+"${FAILURES[@]}"}"; do echo "FAILED: $x"; done
    local line="$PASSED passed, $FAILED failed"
    [ "$SKIPPED" -ne 0 ] && line="$line, $SKIPPED skipped"
    echo "$line"
}

# Heavy build products kept outside the clone, so that CI (a fresh clone each run) reuses
# them: the cargo target directories (cargo rebuilds whatever changed, and a clone's sources
# are newer than anything built before it) and the compat installs (one directory per package
# and version, tests/test_compat.py). Only paths a checkout does not have yet are linked, so a
# developer's own target/ is never touched. POLYOP_CI_CACHE=none turns it off.
#
# Two more things make a warm cache pay off in a fresh clone. Set-up's venvs live in the
# cache, one per lock file (POLYOP_VENV_CACHE, ci/setup.sh make_venv). And the clone's files
# get mtimes by content (ci/source_mtimes.py: a file unchanged since the last run keeps the
# mtime that run gave it), so cargo rebuilds only the crates whose sources changed: a clone's
# files are all newer than anything built before, and every workspace crate was rebuilt in
# every target directory (set-up's release build alone 240 s of wall time on 2 cores). Only
# when this run links target/ itself (a fresh checkout): a developer's own builds are not
# CI runs, and the record's reasoning holds only for a cache written by runs alone.
#
# The examples' target directories are kept per checkout directory (`checkouts/<key>`, the
# three used last), not shared: an example's workspace reaches polyop's crates by paths outside
# it, which cargo hashes whole, so a checkout elsewhere builds them as other units, yet the
# outputs of a library that is also a cdylib (polyop-onnxruntime, polyop-torch, swiglu's) have
# no hash in their names and are shared by both. A run from /tmp after one from elsewhere
# found its own units fresh and linked the other checkout's rlib of polyop-onnxruntime, built
# against another kernel_core: "multiple different versions of crate `kernel_core`", 20 tests
# failed. (The workspace's own crates are hashed by their paths inside it: target/ is shared.)
# Shared, so nothing built there may hold its checkout's path: a test binary with an
# `env!("CARGO_MANIFEST_DIR")` built in a clone was fresh in the next checkout and read from
# the deleted clone (6 tests failed). Tests read it when they run, build scripts put the files
# a link needs in OUT_DIR; tests/test_ci.py fails on the macro.
CACHED_DIRS=(target examples/guide/target examples/pipeline/serve/target
    examples/rust_ort/target examples/rust_ort_ep/target examples/rust_tch/target examples/rust_tf/target
    examples/swiglu/target .cache/compat)
# The build cache's directory ("none": no cache).
ci_cache() { echo "${POLYOP_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/polyop-ci}"; }
link_caches() {
    local cache
    cache=$(ci_cache)
    [ "$cache" = none ] && return 0
    local d to fresh= here
    [ -e target ] || [ -L target ] || fresh=1
    here=$cache/checkouts/$(pwd -P | sha256sum | cut -c1-16)
    mkdir -p "$here" && touch "$here"
    # the least recently used checkouts' sets beyond three, and the shared layout of before
    ls -1dt "$cache"/checkouts/*/ | tail -n +4 | xargs -r -d "\n" rm -rf
    rm -rf "$cache/examples"
    for d in "${CACHED_DIRS[@]}"; do
        case $d in
        examples/*) to=$here/$d ;;
        *) to=$cache/$d ;;
        esac
        if [ ! -e "$d" ] && [ ! -L "$d" ]; then
            mkdir -p "$to" "$(dirname "$d")" && ln -s "$to" "$d"
        fi
    done
    echo "build caches: $cache ($(du -sh "$cache" 2>/dev/null | cut -f1))"
    export POLYOP_VENV_CACHE=$cache/venvs
    # JAX's persistent compilation cache (its own key: the program, jaxlib, the flags; a
    # program that changed is a miss, and polyop's custom calls are looked up by name when an
    # executable loads): XLA compiles were 27% of the XLA conformance worker's time (gelu: 51
    # s cold, 37 s warm, the same results). Bounded here, whole, at the start of a run: JAX's
    # own bound (JAX_COMPILATION_CACHE_MAX_SIZE) walks the whole directory on every entry it
    # writes, quadratic in the entries (one XLA conformance run writes about 8000).
    if [ "$(du -sm "$cache/jax" 2>/dev/null | cut -f1)" -gt 1024 ] 2>/dev/null; then
        rm -rf "$cache/jax"
    fi
    export JAX_COMPILATION_CACHE_DIR=$cache/jax \
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
    if [ -n "$fresh" ]; then
        python3 ci/source_mtimes.py "$cache/source-mtimes" || echo "source mtimes not set: every crate rebuilds"
    fi
}

# A cold run writes about 30 GB (two venvs ~10, cargo targets ~9, compat installs ~12) on a
# disk it may share; with the build cache warm, about 16 (the venvs, rebuilt crates, logs).
# ensure_disk COLD_GB WARM_GB: when the free space is below what this run needs, the build
# cache (only a cache) is deleted to make room; if there is still too little, the run stops
# here with the figures instead of failing half-way through a pip install (it did: ENOSPC in
# set-up, with an 18 GB cache on a disk 7 GB from full). POLYOP_CI_FREE_GB stands in for the
# measured free space (tests/test_ci.py).
free_gb() { echo "${POLYOP_CI_FREE_GB:-$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')}"; }
ensure_disk() {
    local cold=$1 warm=$2 cache
    cache=$(ci_cache)
    local free
    free=$(free_gb)
    [ "$free" -ge "$cold" ] && return 0
    if [ "$cache" != none ] && [ -d "$cache" ]; then
        [ "$free" -ge "$warm" ] && [ -n "$(ls -A "$cache")" ] && return 0
        echo "disk: ${free} GB free, a cold run needs ~${cold} GB: deleting the build cache $cache"
        rm -rf "$cache"
        free=$(free_gb)
        [ "$free" -ge "$cold" ] && return 0
    fi
    echo "disk: only ${free} GB free here ($(df -Ph . | awk 'NR == 2 { print $1 }')), the run needs ~${cold} GB"
    return 1
}

# The Rust checks, one job: fmt, clippy, then the workspace's tests (clippy and the tests
# share target/, so running them side by side would only wait on cargo's lock).
rust_checks() {
    check "cargo fmt --all --check" 300 cargo fmt --all --check
    check "cargo clippy --workspace --all-targets -- -D warnings" 3600 \
        cargo clippy --workspace --all-targets --quiet -- -D warnings

    section "cargo test --workspace"
    # then the vmath ulp sweeps (kernels/sweeps, ignored in the debug build) optimised: their
    # package has no dev-dependencies, so its release test build reuses set-up's release build
    # of the kernels (the dense gelu sweep: 135 s, ~500 s at opt-level 0; the others ~45 s,
    # 140 s among the kernels' unit tests at opt-level 0)
    bounded "cargo test --workspace" 3600 bash -c 'cargo test --workspace --no-fail-fast &&
        cargo test --release -p polyop-kernel-sweeps' 2>&1 |
        tee "$LOGDIR/cargo-test.log"
    local rc=${PIPESTATUS[0]}
    local p f i
    read -r p f i < <(awk '/^test result:/ {
            for (k = 1; k <= NF; k++) {
                if ($(k+1) ~ /^passed/) p += $k;
                if ($(k+1) ~ /^failed/) f += $k;
                if ($(k+1) ~ /^ignored/) i += $k;
            }
        } END { print p + 0, f + 0, i + 0 }' "$LOGDIR/cargo-test.log")
    PASSED=$((PASSED + p))
    FAILED=$((FAILED + f))
    SKIPPED=$((SKIPPED + i))
    if [ "$rc" -eq 124 ]; then
        fail "cargo test --workspace: timed out after $((3600 * SCALE))s"
    elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        fail "cargo test (exit $rc, e.g. a build error)"
    fi
    [ "$f" -ne 0 ] && FAILURES+=("cargo test: $f failed")
    return 0
}

# Several pytest files in order, one job: files that build the same example workspace (whose
# libraries one rebuilds with other features while the other runs them) never run side by side.
run_pytests() {
    local t
    for t in "$@"; do run_pytest "$t" 1800; done
}

# Jobs run side by side, POLYOP_CI_JOBS at a time (default 2: most test files keep one core
# busy, waiting on a framework's start-up, a child process or the network). Each job runs in a
# subshell with its own counts, its output in its own log, printed whole when it ends (so no
# two jobs' lines interleave), its counts and failures added to the summary in job order.
#
# JOBS holds one job per element, a command line (functions of this file) split on spaces.
run_jobs() {
    local max=${POLYOP_CI_JOBS:-2} dir=$LOGDIR/jobs
    mkdir -p "$dir"
    local n=${#JOBS[@]} next=0 running=0 k
    local -a state=() pids=() # state: "", "run", "done" per job
    while [ "$next" -lt "$n" ] || [ "$running" -gt 0 ]; do
        while [ "$running" -lt "$max" ] && [ "$next" -lt "$n" ]; do
            k=$next
            next=$((next + 1))
            printf -- '---- start %s [+%ss]\n' "${JOBS[$k]}" "$(($(date +%s) - START))"
            (
                PASSED=0 FAILED=0 SKIPPED=0
                FAILURES=() DETAILS=()
                set -f # a pytest node id's [param] is not a glob
                # shellcheck disable=SC2086  # a job is a command line split on spaces
                ${JOBS[$k]} >"$dir/$k.log" 2>&1
                {
                    echo "$PASSED $FAILED $SKIPPED"
                    for x in "${FAILURES[@]+"${FAILURES[@]}"}"; do echo "F $x"; done
                    for x in "${DETAILS[@]+"${DETAILS[@]}"}"; do echo "W $x"; done
                } >"$dir/$k.res"
                touch "$dir/$k.done"
            ) &
            pids[k]=$!
            state[k]=run
            running=$((running + 1))
        done
        sleep 1
        for k in "${!state[@]}"; do
            # done, or died before it could say so (its pid gone: bash reaps its children)
            if [ "${state[k]}" = run ] && { [ -e "$dir/$k.done" ] || ! kill -0 "${pids[k]}" 2>/dev/null; }; then
                wait "${pids[k]}" 2>/dev/null || true # its status is in its .res file
                cat "$dir/$k.log"
                printf -- '---- end %s [+%ss]\n' "${JOBS[$k]}" "$(($(date +%s) - START))"
                state[k]=done
                running=$((running - 1))
            fi
        done
    done
    for ((k = 0; k < n; k++)); do
        if [ ! -s "$dir/$k.res" ]; then
            fail "${JOBS[$k]}: no result (the job died)"
            continue
        fi
        local p f s line
        read -r p f s <"$dir/$k.res"
        PASSED=$((PASSED + p))
        FAILED=$((FAILED + f))
        SKIPPED=$((SKIPPED + s))
        while IFS= read -r line; do
            case $line in
            "F "*) FAILURES+=("${line#F }") ;;
            "W "*) DETAILS+=("${line#W }") ;;
            esac
        done < <(tail -n +2 "$dir/$k.res")
    done
}

# The Python test files, one job each but for those that must run in order (run_pytests), the
# longest first so that the last to start are short. The conformance suite runs one job per
# backend (about 5 to 10 minutes each on a 2-core machine, 45 in all: one job was the longest
# by far). MindSpore's file runs in its own environment.
test_jobs() {
    # files that build examples/guide (polyop.load_crate's build and the guide's own)
    local guide="tests/test_author_wheel.py tests/test_authoring_guide.py"
    local conf=conformance/test_conformance.py
    # the slowest (a run on a 2-core machine), in order, beside the Rust checks and tch
    local heavy="$conf::test_backend[mindspore] $conf::test_backend[xla] $conf::test_backend[torch]
        tests/test_bench.py $conf::test_backend[tensorflow] tests/test_rust_ort.py
        $conf::test_backend[onnxruntime] $conf::test_backend[native] tests/test_authoring.py
        tests/test_rust_tf.py tests/test_properties_onnxruntime.py tests/test_properties_jax.py
        tests/test_compat.py $conf::test_every_op_and_backward_op_has_cases_in_every_dtype"
    JOBS=(rust_checks "run_pytest tests/test_rust_tch.py 3600")
    local t
    for t in $heavy; do JOBS+=("run_pytest $t 3600"); done
    # any other conformance test (a backend added since) still runs, as a job of its own; a
    # file that does not collect runs whole, to report why
    local ids
    ids=$("$VPY" -m pytest -q --collect-only -p no:cacheprovider "$conf" 2>/dev/null | grep "^$conf::")
    [ -n "$ids" ] || JOBS+=("run_pytest $conf 3600")
    for t in $ids; do
        case " $(echo $heavy) " in *" $t "*) ;; *) JOBS+=("run_pytest $t 3600") ;; esac
    done
    # polyop's libraries under Valgrind memcheck (NumPy core + ONNX Runtime; 139 s alone at the
    # end of a run): invalid reads/writes, uninitialised values and definite leaks in
    # libpolyop_* / _core. Early, beside other jobs: last, it was the run's single-lane tail.
    JOBS+=("check valgrind-memcheck 900 bash ci/memcheck.sh" "run_pytests $guide")
    for t in tests/test_*.py; do
        case " tests/test_rust_tch.py $guide $(echo $heavy) tests/test_mindspore.py " in
        *" $t "*) continue ;;
        esac
        JOBS+=("run_pytest $t 1800")
    done
    JOBS+=("run_pytest tests/test_mindspore.py 600 $ROOT/.venv-mindspore/bin/python"
        "run_pytest conformance/test_harness.py 600")
}

# The compat frameworks (tests/_compat.py, about 10 GB of wheels) are downloaded in the
# background as soon as set-up has installed the project venv, while it builds the Rust
# libraries: by the time tests/test_compat.py runs they are in place (it waits for an install
# in progress, and retries one that failed).
prefetch_compat() {
    local want
    want=$(sha256sum ci/requirements.lock | cut -d' ' -f1)
    until [ "$(cat .venv/.polyop-requirements.sha256 2>/dev/null)" = "$want" ]; do
        sleep 5
    done
    .venv/bin/python tests/_compat.py
}

main() {
    cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
    ROOT=$PWD
    START=$(date +%s)
    # CI builds from scratch or from the cache: incremental state and full debug info are
    # only disk (1.7 GB and most of target/debug's 3 GB of deps) there
    export CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=line-tables-only
    if ! ensure_disk 32 16; then
        echo "0 passed, 1 failed"
        exit 1
    fi
    link_caches
    LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/polyop-ci.XXXXXX")

    timeout 3600 bash -c "$(declare -f prefetch_compat); prefetch_compat" >"$LOGDIR/compat-prefetch.log" 2>&1 &
    local prefetch=$!
    # expanded now: at exit the local is gone (it printed "prefetch: unbound variable" and
    # left the prefetch running)
    # shellcheck disable=SC2064
    trap "kill $prefetch 2>/dev/null" EXIT

    # the first run installs several GB of frameworks and builds everything
    if ! bounded "ci/setup.sh" 5400 bash ci/setup.sh; then
        echo "ci/setup.sh failed (or timed out)"
        echo "0 passed, 1 failed"
        exit 1
    fi
    section "set-up done"

    # by the venv's resolved directory, as ci/setup.sh builds with (the same path from every
    # checkout: the build scripts that depend on it stay fresh in the cached targets)
    local venv
    venv=$(cd "$ROOT/.venv" && pwd -P)
    VPY=$venv/bin/python
    export PYO3_PYTHON=$VPY POLYOP_SETUP_DONE=1
    export PATH="$venv/bin:$PATH"

    test_jobs
    run_jobs
    cat "$LOGDIR/compat-prefetch.log"

    rm -rf "$LOGDIR"
    section "summary ($(($(date +%s) - START))s)"
    summary
    [ "$FAILED" -eq 0 ]
}

# `source ci/test.sh` defines the functions only (tests/test_ci.py exercises them).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
