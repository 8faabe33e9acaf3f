"""The native backend: the NumPy core, ``polyop.run`` (no framework). It is the baseline
every framework backend must match bit for bit."""

from __future__ import annotations

import numpy as np

import polyop

from ..harness import GRAD, Backend, Case


class NativeBackend(Backend):
    name = "native"
    modes = ("eager",)
    version = f"polyop {polyop.__version__} (NumPy {np.__version__})"

    def __init__(self, library: str | None = None) -> None:
        # An author's library: its kernels run on NumPy arrays through its `polyop_run` export
        # (use the XLA library, which loads without any framework).
        self.meta = polyop
        if library is not None:
            from polyop._library import open_library

            self.meta = open_library(library)
            self.version += f", {self.meta.path}"

    def unsupported(self, case: Case, mode: str) -> str | None:
        if mode == GRAD:
            return "the NumPy core has no autograd; gradients are checked in each framework"
        return None

    def run(self, case: Case, mode: str) -> list[np.ndarray]:
        # In-place ops (relu_) run out of place in the NumPy core.
        out = self.meta.run(case.op, *case.inputs, **case.attrs)
        return list(out) if isinstance(out, tuple) else [out]


BACKEND = NativeBackend()
