"""Sharding rules as kernel-core states them (``crates/kernel-core/src/sharding.rs``), read
by the framework glue (``polyop.jax``, ``polyop.torch``); nothing here knows a framework.

A rule comes with shape inference (``infer_symbolic(...)["sharding"]``)::

    {"factors": ["split" | "whole", ...],
     "inputs": [[factor, ...] | None, ...],   # per tensor input, one factor per dim
     "outputs": [[factor, ...] | None, ...]}

Tensors that share a factor are split along it together. A ``"split"`` factor: the op
computes independently along it, and an output without the factor is the *sum* of the
per-shard outputs (a weight gradient over a split batch). A ``"whole"`` factor must not be
split. ``None`` (a library without rules, an unknown rank): every dim whole.
"""

from __future__ import annotations

from typing import Any, Sequence


class Rule:
    """A rule restricted to the inputs actually passed (absent optionals dropped)."""

    def __init__(self, d: dict | None, present: Sequence[bool], ranks_in: Sequence[int], ranks_out: Sequence[int]):
        ins = None
        if d is not None and all(m is not None for m in d["outputs"]):
            ins = [m for m, p in zip(d["inputs"], present) if p]
            if len(ins) != len(ranks_in) or any(m is None for m in ins):
                ins = None
        if ins is None:
            d = _replicated(ranks_in, ranks_out)
            ins = d["inputs"]
        self.factors: list[str] = list(d["factors"])
        self.inputs: list[list[int]] = [list(m) for m in ins]
        self.outputs: list[list[int]] = [list(m) for m in d["outputs"]]

    def split(self, f: int) -> bool:
        return self.factors[f] == "split"

    def summed(self, out: int) -> list[int]:
        """The split factors output ``out`` is summed over: in some input, not in it."""
        have = set(self.outputs[out])
        seen: list[int] = []
        for m in self.inputs:
            for f in m:
                if self.split(f) and f not in have and f not in seen:
                    seen.append(f)
        return seen

    def einsum(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """Shardy's einsum-like rule string, its need-replication factors (whole) and its
        reduction factors (split factors in no output)."""
        name = lambda f: f"f{f}"  # noqa: E731
        side = lambda ms: ", ".join(" ".join(name(f) for f in m) for m in ms)  # noqa: E731
        # Shardy numbers factors in order of first appearance and wants the special ones
        # listed in that order.
        order = list(dict.fromkeys(f for m in self.inputs + self.outputs for f in m))
        in_outputs = {f for m in self.outputs for f in m}
        whole = tuple(name(f) for f in order if not self.split(f))
        reduction = tuple(name(f) for f in order if self.split(f) and f not in in_outputs)
        return f"{side(self.inputs)} -> {side(self.outputs)}", whole, reduction

    def assign(self, input_axes: Sequence[Sequence[Any]]) -> dict[int, Any]:
        """Mesh axes per split factor from the inputs' current placements (``input_axes[i][d]``:
        the mesh axis or axes dim ``d`` of input ``i`` is split along, or None). The first
        input that splits a factor decides; a mesh axis serves one factor at most."""
        chosen: dict[int, Any] = {}
        taken: set = set()
        for m, axes in zip(self.inputs, input_axes):
            for f, a in zip(m, axes):
                if a is None or not self.split(f) or f in chosen:
                    continue
                names = _names(a)
                if taken.intersection(names):
                    continue
                chosen[f] = a
                taken.update(names)
        return chosen

    def summed_axes(self, out: int, chosen: dict[int, Any]) -> tuple:
        """The mesh axes output ``out`` must be summed over, given :meth:`assign`'s choice."""
        return tuple(a for f in self.summed(out) if f in chosen for a in _names(chosen[f]))


def _names(a) -> tuple:
    """A placement's mesh axis names: one name or a tuple of them."""
    return a if isinstance(a, tuple) else (a,)


def _replicated(ranks_in: Sequence[int], ranks_out: Sequence[int]) -> dict:
    n = 0
    ins, outs = [], []
    for r in ranks_in:
        ins.append(list(range(n, n + r)))
        n += r
    for r in ranks_out:
        outs.append(list(range(n, n + r)))
        n += r
    return {"factors": ["whole"] * n, "inputs": ins, "outputs": outs}
