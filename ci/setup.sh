#!/usr/bin/env bash
# Idempotent set-up from a fresh clone: Python venv with the pinned frameworks, the five
# framework libraries (cargo build --release), the `polyop` Python package (maturin) and
# MindSpore's own venv (.venv-mindspore).
# Needs: python3.11, cargo, a C/C++ compiler; network to PyPI and crates.io on first run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

log() { printf '[setup] %s\n' "$*" >&2; }

# make_venv DIR LOCK PY: the virtual environment DIR (with interpreter PY), unless it has one.
# With POLYOP_VENV_CACHE set (CI's build cache, ci/test.sh), DIR is a link to a venv kept there,
# one per lock file content and interpreter: the next run with the same pins reuses it whole
# (its packages already installed, their mtimes unchanged) instead of downloading and unpacking
# gigabytes again. The venv of an older lock is deleted. Nothing a run does writes into a venv
# but set-up (pip below, maturin develop, MindSpore's .pth), which rewrites it for each checkout.
make_venv() {
    local dir=$1 lock=$2 py=$3 key home
    [ -x "$dir/bin/python" ] && return 0
    # a directory there (a developer's broken venv) is repaired in place, not replaced
    if [ -z "${POLYOP_VENV_CACHE:-}" ] || { [ -e "$dir" ] && [ ! -L "$dir" ]; }; then
        log "creating $dir with $py"
        "$py" -m venv "$dir"
        return
    fi
    rm -f "$dir" # a link to a cached venv since deleted
    key=$({ cat "$lock"; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
    home=$POLYOP_VENV_CACHE/${dir#.}
    mkdir -p "$home"
    find "$home" -mindepth 1 -maxdepth 1 ! -name "$key" -exec rm -rf {} +
    if [ ! -x "$home/$key/bin/python" ]; then
        log "creating $home/$key with $py (cached for $lock)"
        "$py" -m venv "$home/$key"
    fi
    ln -s "$home/$key" "$dir"
}

# 1. Python 3.11 virtual environment.
if [ ! -x .venv/bin/python ]; then
    PY=${PYTHON:-}
    if [ -z "$PY" ]; then
        for c in python3.11 python3; do
            if command -v "$c" >/dev/null 2>&1 &&
                "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
                PY=$c
                break
            fi
        done
    fi
    [ -n "$PY" ] || { log "python3.11 not found (set PYTHON=/path/to/python3.11)"; exit 1; }
    make_venv .venv ci/requirements.lock "$PY"
fi
# The venv by its resolved directory (CI's is a link into the build cache): the interpreter
# path the builds see (PYO3_PYTHON, maturin's VIRTUAL_ENV, the package directories found
# through it) is then the same from every checkout, and cargo does not rerun the build scripts
# that depend on it (the torch and TensorFlow adapters, pyo3) for a checkout elsewhere.
VENV=$(cd .venv && pwd -P)
VPY=$VENV/bin/python

# install_lock VENV LOCK WHAT: pip-install the pinned LOCK file into VENV, skipped when the
# lock has not changed since the last successful install (its sha256 is stamped in VENV).
install_lock() {
    local venv=$1 lock=$2 what=$3 stamp want
    stamp=$venv/.polyop-requirements.sha256
    want=$(sha256sum "$lock" | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
        log "installing $lock into $venv ($what)"
        "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$lock"
        echo "$want" >"$stamp"
    else
        log "$lock: $venv up to date"
    fi
}

# 2. MindSpore in its own environment, in the background from the start (its downloads beside
#    the project venv's, not after them): MindSpore 2.10 needs numpy<2, .venv has numpy 2.
#    Pinned by ci/mindspore.lock (installed when its hash changes, as in step 3); polyop is
#    importable there from the checkout through a .pth file (polyop._core is abi3, so the
#    extension maturin builds below serves this interpreter too).
MS=.venv-mindspore
(
    make_venv "$MS" ci/mindspore.lock "$VPY"
    install_lock "$MS" ci/mindspore.lock "first run: a 767 MB wheel"
    "$MS/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/polyop-checkout.pth", "w").write(sys.argv[1] + "\n")' "$ROOT/python"
) &
ms_pid=$!

# 3. Pinned Python packages (ci/requirements.lock is the single pin file), downloaded while
#    cargo builds the crates that need no framework (the kernels, the ONNX Runtime, XLA and
#    MindSpore adapters): the network and the CPUs both busy, not one after the other.
export PYO3_PYTHON="$VPY"
install_lock .venv ci/requirements.lock "first run: several GB, a few minutes" &
pip_pid=$!
log "cargo build --release (the crates that need no framework), beside pip"
if ! cargo build --release -p polyop-kernels -p polyop-onnxruntime -p polyop-xla -p polyop-mindspore; then
    wait "$pip_pid" || true
    exit 1
fi
wait "$pip_pid" || { log "pip install of ci/requirements.lock failed"; exit 1; }

# 4. Rust: the rest of the workspace, the torch and TensorFlow adapters, which compile and
#    link against the frameworks' wheels (target/release/libpolyop_*.so). The Python
#    extension is built by maturin below (with its own PyO3 settings), so it is left out here
#    to avoid building it twice.
log "cargo build --release (workspace)"
if ! cargo build --release --workspace --exclude polyop-py; then
    wait "$ms_pid" || true
    exit 1
fi

# 5. The Python package (editable: python/polyop + the compiled polyop._core).
log "maturin develop --release"
if ! out=$(VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" maturin develop --release 2>&1); then
    printf '%s\n' "$out" >&2
    log "maturin develop failed"
    exit 1
fi
"$VPY" -c 'import polyop; print(f"[setup] polyop {polyop.__version__}: {len(polyop.ops())} ops")' >&2

wait "$ms_pid" || { log "setting up $MS failed"; exit 1; }
