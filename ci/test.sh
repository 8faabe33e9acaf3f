#!/usr/bin/env bash
# The whole test suite, from a fresh clone: set-up, Rust checks and tests, every Python test
# file in its own process (frameworks never share a process), and the conformance suite.
# Ends with one line "N passed, N failed[, N skipped]" and exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
START=$(date +%s)

bash ci/setup.sh || { echo "ci/setup.sh failed"; echo "0 passed, 1 failed"; exit 1; }

VPY=$ROOT/.venv/bin/python
export PYO3_PYTHON=$VPY
export PATH="$ROOT/.venv/bin:$PATH"
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/polyop-ci.XXXXXX")
PASSED=0
FAILED=0
SKIPPED=0
FAILURES=()

section() { printf '\n==== %s\n' "$*"; }
fail() { FAILED=$((FAILED + 1)); FAILURES+=("$1"); }

# A whole step counted as one check.
check() {
    local name=$1
    shift
    section "$name"
    if "$@"; then
        PASSED=$((PASSED + 1))
    else
        fail "$name"
    fi
}

check "cargo fmt --all --check" cargo fmt --all --check
check "cargo clippy --workspace --all-targets -- -D warnings" \
    cargo clippy --workspace --all-targets --quiet -- -D warnings

section "cargo test --workspace"
cargo test --workspace --no-fail-fast 2>&1 | tee "$LOGDIR/cargo-test.log"
rc=${PIPESTATUS[0]}
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
if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then fail "cargo test (exit $rc, e.g. a build error)"; fi
[ "$f" -ne 0 ] && FAILURES+=("cargo test: $f failed")

# One pytest process per file.
run_pytest() {
    local file=$1
    local xml
    xml="$LOGDIR/$(echo "$file" | tr '/' '_').xml"
    section "pytest $file"
    "$VPY" -m pytest -q -p no:cacheprovider --junit-xml="$xml" "$file"
    local rc=$?
    if [ ! -f "$xml" ]; then
        fail "pytest $file (exit $rc, no report)"
        return
    fi
    read -r t f e s < <("$VPY" - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
tot = lambda k: sum(int(s.get(k, 0)) for s in suites)
print(tot("tests"), tot("failures"), tot("errors"), tot("skipped"))
PY
)
    PASSED=$((PASSED + t - f - e - s))
    FAILED=$((FAILED + f + e))
    SKIPPED=$((SKIPPED + s))
    [ $((f + e)) -ne 0 ] && FAILURES+=("pytest $file: $((f + e)) failed")
    if [ "$rc" -eq 5 ]; then
        fail "pytest $file collected no tests"
    elif [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ]; then
        fail "pytest $file (exit $rc)"
    fi
}

for f in tests/test_*.py; do
    run_pytest "$f"
done
run_pytest conformance/test_harness.py
run_pytest conformance/test_conformance.py

rm -rf "$LOGDIR"
section "summary ($(($(date +%s) - START))s)"
for x in "${FAILURES[@]+"${FAILURES[@]}"}"; do echo "FAILED: $x"; done
line="$PASSED passed, $FAILED failed"
[ "$SKIPPED" -ne 0 ] && line="$line, $SKIPPED skipped"
echo "$line"
[ "$FAILED" -eq 0 ]
