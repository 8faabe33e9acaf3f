#!/usr/bin/env bash
# Build the polyop wheel from a clean clone: the Python package, the NumPy core and the four
# framework libraries (python/polyop/lib/, relocatable: no absolute RUNPATH), in one file.
#   bash ci/wheel.sh [OUT_DIR]      (default: dist/)
# Uses ci/setup.sh's venv for the frameworks the torch and TensorFlow adapters compile and
# link against, and maturin from it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1:-dist}

# CI has just run set-up (and runs other tests beside this one: set-up's `maturin develop`
# would rewrite the extension module under them)
[ "${POLYOP_SETUP_DONE:-}" = 1 ] || bash ci/setup.sh
rm -rf python/polyop/lib
mkdir -p python/polyop/lib
for fw in torch tensorflow onnxruntime xla; do
    cp "target/release/libpolyop_$fw.so" python/polyop/lib/
done
# (the venv by its resolved directory, as ci/setup.sh's `maturin develop` runs: one interpreter
# path for pyo3's build from every checkout)
VENV=$(cd .venv && pwd -P)
VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" maturin build --release -o "$OUT" >&2
ls -1 "$OUT"/polyop-*.whl | tail -n 1
