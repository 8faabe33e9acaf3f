"""The PyTorch backend: ``torch.ops.polyop.<op>`` from ``libpolyop_torch.so`` (loaded through
``polyop.torch.load()``, which adds autograd and the fake kernels), in eager mode and under
``torch.compile(fullgraph=True)``; gradients with ``torch.autograd.gradcheck`` in float64.
Symbolic mode: ``torch.export`` once with a ``Dim`` per symbolic size, the exported module run
at every size."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import torch

import polyop
import polyop.torch as polyop_torch

from ..harness import GRAD, SYMBOLIC, Backend, Case



def to_torch(a):
    """NumPy -> torch without losing non-contiguity (positive strides are shared as they
    are; negative-stride views are copied, which torch cannot represent)."""
    if a is None:
        return None
    a = np.asarray(a)
    if any(s < 0 for s in a.strides):
        a = a.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only arrays (broadcast views): we never write
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.contiguous().numpy().copy()


class TorchBackend(Backend):
    name = "torch"
    modes = ("eager", "compile")
    version = f"torch {torch.__version__}"

    def __init__(self, library: str | None = None) -> None:
        self._ops = None
        self.library = library
        self.meta = polyop
        if library is not None:
            self._ops = polyop_torch.load(library)  # a polyop._library.Loaded
            self.meta = self._ops.library

    @property
    def ops(self):
        if self._ops is None:
            self._ops = polyop_torch.load()
        return self._ops

    def unsupported(self, case: Case, mode: str) -> str | None:
        info = self.meta.op_info(case.op)
        if mode == "compile" and info["flags"]["inplace"]:
            return (
                "torch.compile cannot functionalize a custom op whose return aliases a mutated "
                "input (schema `Tensor(a!) -> Tensor(a!)`, fixed by SPEC); AOTAutograd refuses "
                "it for every custom op"
            )
        if mode == GRAD and not info.get("backward"):
            return "op has no gradient"
        if mode == SYMBOLIC and info["flags"]["inplace"]:
            return ("torch.export functionalizes mutation; an op whose return aliases its "
                    "mutated input cannot be exported")
        return None

    symbolic = True

    def run_symbolic(self, case: Case, pattern: list, cases) -> list:
        op = getattr(self.ops, case.op)
        attrs = dict(case.attrs)

        class Op(torch.nn.Module):
            def forward(self, *xs):
                return op(*xs, **attrs)

        # Each symbol's lower bound: 2 (torch specializes 0 and 1), raised where the op
        # requires `c <= symbol` (topk's k), which torch.export wants stated in the Dim.
        least = {d: 2 for p in pattern if p is not None for d in p if isinstance(d, str)}
        specs = [None if p is None else (p, np.asarray(a).dtype.name)
                 for p, a in zip(pattern, case.inputs)]
        for rel, lhs, rhs, _ in self.meta.infer_symbolic(case.op, specs, **attrs)["constraints"]:
            if rel == "le" and isinstance(lhs, int) and isinstance(rhs, str):
                least[rhs] = max(least[rhs], lhs)
        dims = {d: torch.export.Dim(d, min=m) for d, m in least.items()}
        dynamic = tuple(
            None if p is None else ({i: dims[d] for i, d in enumerate(p) if isinstance(d, str)} or None)
            for p in pattern
        )
        ep = torch.export.export(Op(), tuple(self._inputs(case)), dynamic_shapes={"xs": dynamic})
        m = ep.module()
        res = []
        for c in cases:
            out = m(*self._inputs(c))
            res.append([to_numpy(o) for o in (out if isinstance(out, (tuple, list)) else [out])])
        return res

    def _call(self, case: Case, mode: str, args: list):
        op = getattr(self.ops, case.op)
        attrs = dict(case.attrs)
        if mode == "eager":
            return op(*args, **attrs)
        if mode != "compile":
            raise ValueError(f"unknown mode {mode}")

        def fn(*xs):
            return op(*xs, **attrs)

        # A fresh cache per case: every case has its own shapes/attrs, and dynamo's recompile
        # limit would otherwise silently fall back to eager after a few.
        torch._dynamo.reset()
        data_dependent = self.meta.op_info(case.op)["flags"]["data_dependent_shape"]
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=data_dependent):
            compiled = torch.compile(fn, fullgraph=True, dynamic=False)
            return compiled(*args)

    def _inputs(self, case: Case) -> list:
        info = self.meta.op_info(case.op)
        mutable = [i.get("mutable", False) for i in info["inputs"]]
        args = []
        for k, a in enumerate(case.inputs):
            t = to_torch(a)
            if t is not None and k < len(mutable) and mutable[k]:
                t = t.clone()  # in-place ops must not write into the harness's arrays
            args.append(t)
        return args

    def run(self, case: Case, mode: str) -> list[np.ndarray]:
        out = self._call(case, mode, self._inputs(case))
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [to_numpy(o) for o in outs]

    def check_grad(self, case: Case) -> None:
        op = getattr(self.ops, case.op)
        attrs = dict(case.attrs)
        args = []
        for a in case.inputs:
            t = to_torch(a)
            if t is not None:
                if t.dtype.is_floating_point:
                    t = t.to(torch.float64).detach().requires_grad_(True)
            args.append(t)
        diff = [t for t in args if t is not None and t.requires_grad]
        if not diff:
            raise AssertionError("no float input to differentiate")
        positions = [k for k, t in enumerate(args) if t is not None and t.requires_grad]

        def fn(*xs):
            full = list(args)
            for k, x in zip(positions, xs):
                full[k] = x
            return op(*full, **attrs)

        try:
            ok = torch.autograd.gradcheck(fn, tuple(diff), eps=1e-6, atol=1e-5, rtol=1e-4)
        except Exception as e:  # GradcheckError is a RuntimeError
            raise AssertionError(f"gradcheck failed: {e}") from e
        if not ok:
            raise AssertionError("gradcheck returned False")


BACKEND = TorchBackend()
