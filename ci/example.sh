#!/usr/bin/env bash
# The out-of-tree example op (examples/swiglu): build its four framework libraries, run its
# Rust tests, run its conformance suite in torch, TensorFlow, ONNX Runtime and JAX (plus the
# native NumPy path), and check each library with `python -m polyop check`.
# Run from anywhere; needs the project venv (.venv, see ci/setup.sh) with polyop installed
# (`maturin develop --release`). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
# (the venv by its resolved directory, as ci/setup.sh builds with: the example's build
# scripts see one interpreter path from every checkout)
VPY=${POLYOP_PYTHON:-$(cd "$ROOT/.venv" && pwd -P)/bin/python}
export POLYOP_PYTHON=$VPY
MANIFEST=examples/swiglu/Cargo.toml
LIBS=examples/swiglu/target/release

echo "==== cargo build --release --manifest-path $MANIFEST"
cargo build --release --manifest-path "$MANIFEST"

echo "==== cargo test --manifest-path $MANIFEST -p swiglu-ops"
cargo test --manifest-path "$MANIFEST" -p swiglu-ops

echo "==== python examples/swiglu/conformance.py"
"$VPY" examples/swiglu/conformance.py

echo "==== python -m polyop check (the example's four libraries)"
"$VPY" -m polyop check "$LIBS"/libswiglu_torch.so "$LIBS"/libswiglu_tensorflow.so \
    "$LIBS"/libswiglu_onnxruntime.so "$LIBS"/libswiglu_xla.so
echo "==== example OK"
