#!/usr/bin/env bash
# Set everything up (idempotent) and run the demo: the same kernels through the NumPy core,
# PyTorch, TensorFlow, ONNX Runtime and JAX, compared bit for bit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash ci/setup.sh
exec .venv/bin/python examples/demo.py "$@"
