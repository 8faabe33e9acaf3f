#!/usr/bin/env bash
# Build the polyop wheel from a clean clone: the Python package, the NumPy core and the four
# framework libraries (python/polyop/lib/, relocatable: no absolute RUNPATH), in one file.
#   bash ci/wheel.sh [OUT_DIR]      (default: dist/)
# Uses ci/setup.sh's venv for the frameworks the torch and TensorFlow adapters compile and
# link against, and maturin from it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=${1:-dist}

# CI has just run set-up (and runs other tests beside this one: set-up's `maturin develop`
# would rewrite the extension module under them)
[ "${POLYOP_SETUP_DONE:-}" = 1 ] || bash ci/setup.sh
rm -rf python/polyop/lib
mkdir -p python/polyop/lib
for fw in torch tensorflow onnxruntime xla; do
    cp "target/release/libpolyop_$fw.so" python/polyop/lib/
done
VIRTUAL_ENV="$ROOT/.venv" PATH="$ROOT/.venv/bin:$PATH" maturin build --release -o "$OUT" >&2
ls -1 "$OUT"/polyop-*.whl | tail -n 1
