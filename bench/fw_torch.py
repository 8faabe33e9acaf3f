"""PyTorch: torch.ops.polyop.<op> against torch's built-ins and a torch.library.custom_op."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import polyop
from common import Result, Workload, measure_workloads

BUILTIN = {
    "negate": ("torch.neg", lambda x: torch.neg(x)),
    "add": ("torch.add", lambda x, y: torch.add(x, y)),
    "scale": ("torch.mul", lambda x, alpha: torch.mul(x, alpha)),
    "relu": ("torch.relu", lambda x: torch.relu(x)),
    "add_relu": ("torch.relu(torch.add)", lambda x, y: torch.relu(torch.add(x, y))),
    "gelu": ("F.gelu", lambda x, approximate: F.gelu(x, approximate=approximate)),
    "softmax": ("torch.softmax", lambda x, axis: torch.softmax(x, axis)),
    "rms_norm": ("F.rms_norm", lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps)),
    "topk": ("torch.topk", lambda x, k, axis, largest: torch.topk(x, k, axis, largest)),
    "conv2d": ("F.conv2d", lambda x, w, b, stride, padding: F.conv2d(x, w, b, stride, padding)),
    "nonzero": ("torch.nonzero", lambda x: torch.nonzero(x)),
}


def custom_op_versions():
    out = {}

    @torch.library.custom_op("polyop_bench::negate", mutates_args=())
    def negate(x: torch.Tensor) -> torch.Tensor:
        return torch.neg(x)

    @torch.library.custom_op("polyop_bench::add", mutates_args=())
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.add(x, y)

    @torch.library.custom_op("polyop_bench::scale", mutates_args=())
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return torch.mul(x, alpha)

    @torch.library.custom_op("polyop_bench::relu", mutates_args=())
    def relu(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)

    @torch.library.custom_op("polyop_bench::add_relu", mutates_args=())
    def add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.add(x, y))

    @torch.library.custom_op("polyop_bench::gelu", mutates_args=())
    def gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
        return F.gelu(x, approximate=approximate)

    @torch.library.custom_op("polyop_bench::softmax", mutates_args=())
    def softmax(x: torch.Tensor, axis: int) -> torch.Tensor:
        return torch.softmax(x, axis)

    @torch.library.custom_op("polyop_bench::rms_norm", mutates_args=())
    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    @torch.library.custom_op("polyop_bench::topk", mutates_args=())
    def topk(x: torch.Tensor, k: int, axis: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
        v, i = torch.topk(x, k, axis, largest)
        return v, i

    @torch.library.custom_op("polyop_bench::conv2d", mutates_args=())
    def conv2d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: int, padding: int) -> torch.Tensor:
        return F.conv2d(x, w, b, stride, padding)

    @torch.library.custom_op("polyop_bench::nonzero", mutates_args=())
    def nonzero(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x)

    for name, f in list(locals().items()):
        if name in BUILTIN:
            out[name] = f
    return out


def tensor(a: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing `a`'s memory; ml_dtypes' bfloat16 (which torch.from_numpy does not
    know) through its bits."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def run(workloads: list[Workload]) -> list[Result]:
    torch.ops.load_library(polyop.library_path("torch"))
    P = torch.ops.polyop
    customs = custom_op_versions()

    def calls(w: Workload) -> dict:
        ts = [None if a is None else tensor(a) for a in w.inputs]
        attrs = list(w.attrs.values())
        builtin = BUILTIN[w.op][1]
        pfn = getattr(P, w.op)
        fns = {
            "polyop": lambda: pfn(*ts, **w.attrs),
            "builtin": lambda: builtin(*ts, *attrs),
        }
        if w.kind == "overhead":
            fns["custom_op"] = lambda: customs[w.op](*ts, *attrs)
        return fns

    results = []
    for w, t, extra in measure_workloads(workloads, calls):
        name = BUILTIN[w.op][0]
        if "custom_op" in t:
            extra["custom_op_s"] = t["custom_op"]
        results.append(Result("torch", w.op, w.kind, w.label, t["polyop"], t["builtin"], name, w.unit, w.work, extra))
    return results


def set_threads(n: int) -> str:
    """Thread count n for torch's intra-op pool, which polyop's torch kernels run on too
    (adapters/torch/src/pool.rs: `torch_parallel_for`)."""
    torch.set_num_threads(n)
    return f"torch.set_num_threads({n}) (torch.get_num_threads() = {torch.get_num_threads()})"


def versions() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads()}


if __name__ == "__main__":  # quick manual check
    print(np.__version__, versions())
