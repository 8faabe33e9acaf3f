"""One rank of tests/test_distributed_torch.py: ``python _distributed_torch_worker.py SCENARIO
RANK WORLD PORT OUT``. Joins a gloo group on localhost (bounded by a timeout), runs the
scenario, writes rank 0's findings as JSON to OUT, and meets the other ranks at a barrier
before tearing the group down."""

from __future__ import annotations

import datetime
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _ops_scenario(rank: int, world: int) -> dict:
    from _sharding_cases import cases
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    import polyop.torch as pt

    ops = pt.ops()
    mesh = init_device_mesh("cpu", (world,))
    found = {}

    def run(name, inputs, attrs, first):
        local = [torch.from_numpy(a) for a in inputs]
        dt = [distribute_tensor(local[0], mesh, [first])] + [distribute_tensor(t, mesh, [Replicate()]) for t in local[1:]]
        with CommDebugMode() as comm:
            y = getattr(ops, name)(*dt, **attrs)
        ys = y if isinstance(y, (tuple, list)) else (y,)
        want = getattr(ops, name)(*local, **attrs)
        wants = want if isinstance(want, (tuple, list)) else (want,)
        outs = []
        for g, w in zip(ys, wants):
            full = g.full_tensor()
            outs.append({
                "placements": [repr(p) for p in g.placements],
                "equal": bool(torch.equal(full, w)),
                "max_rel_diff": float(((full - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()) if w.is_floating_point() else 0.0,
            })
        return {"comm": int(comm.get_total_counts()), "outputs": outs}

    for name, (inputs, attrs) in cases().items():
        found[name] = run(name, inputs, attrs, Shard(0))
    # split along a dim the op needs whole: redistributed, then correct
    x = cases()["softmax"][0][0]
    found["softmax axis 0 on Shard(0)"] = run("softmax", [x], {"axis": 0}, Shard(0))
    found["softmax axis 1 on Shard(1)"] = run("softmax", [x], {"axis": 1}, Shard(1))
    found["topk on Shard(1)"] = run("topk", [x], {"k": 5}, Shard(1))

    # autograd through DTensors: the backward ops' strategies keep the batch split
    xr = distribute_tensor(torch.from_numpy(x), mesh, [Shard(0)]).requires_grad_()
    wr = distribute_tensor(torch.ones(16), mesh, [Replicate()]).requires_grad_()
    with CommDebugMode() as comm:
        loss = ops.softmax(ops.rms_norm(ops.gelu(xr), wr), -1)
        loss.backward(torch.ones_like(loss))
    found["autograd"] = {
        "comm": int(comm.get_total_counts()),
        "x_grad": [repr(p) for p in xr.grad.placements],
        "w_grad": [repr(p) for p in wr.grad.placements],
    }

    return found


def _norule_scenario(rank: int, world: int) -> dict:
    """What a polyop op does on a DTensor without polyop's strategies (registration blocked)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import polyop.torch as pt

    mesh = init_device_mesh("cpu", (world,))
    x = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0)])
    try:
        pt.ops().gelu(x)
        return {"without rule": "ran"}
    except Exception as e:  # noqa: BLE001 - recorded for the test to check
        return {"without rule": f"{type(e).__name__}: {str(e).splitlines()[0]}"}


def model_step_data(seed: int = 0):
    """The DDP scenario's model parameters, data and targets (float64)."""
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(16, 32, generator=g, dtype=torch.float64) * 0.3,
        "b1": torch.randn(32, generator=g, dtype=torch.float64) * 0.1,
        "gamma": torch.ones(32, dtype=torch.float64),
        "w2": torch.randn(32, 4, generator=g, dtype=torch.float64) * 0.3,
    }
    x = torch.randn(16, 16, generator=g, dtype=torch.float64)
    t = torch.softmax(torch.randn(16, 4, generator=g, dtype=torch.float64), -1)
    return params, x, t


class Model(torch.nn.Module):
    """``softmax(rms_norm(gelu(x w1 + b1), gamma) w2)``: polyop's add, gelu, rms_norm and
    softmax between torch's own matmuls."""

    def __init__(self, params):
        super().__init__()
        self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(v.clone()) for k, v in params.items()})

    def forward(self, x):
        import polyop.torch as pt

        ops = pt.ops()
        h = ops.gelu(ops.add(x @ self.p["w1"], self.p["b1"]))
        return ops.softmax(ops.rms_norm(h, self.p["gamma"]) @ self.p["w2"], -1)


def train(model, x, t, steps: int = 5, lr: float = 0.5):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - t) ** 2).mean()
        loss.backward()
        opt.step()
    return loss.item()


def _ddp_scenario(rank: int, world: int) -> dict:
    params, x, t = model_step_data()
    n = x.shape[0] // world
    ddp = torch.nn.parallel.DistributedDataParallel(Model(params))
    loss = train(ddp, x[rank * n:(rank + 1) * n], t[rank * n:(rank + 1) * n])
    weights = {k: v.detach().numpy().tolist() for k, v in ddp.module.p.items()}
    return {"loss": loss, "weights": weights}


def _all_scenario(rank: int, world: int) -> dict:
    """The ops and the DDP scenario in one group (one start-up of the processes)."""
    found = _ops_scenario(rank, world)
    found["ddp"] = _ddp_scenario(rank, world)
    return found


def main() -> None:
    scenario, rank, world, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    if scenario == "norule":
        import polyop.torch as pt

        pt.load()
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_AfterDTensorImport"]
        pt._sharding_pending.clear()
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        found = {"ops": _ops_scenario, "ddp": _ddp_scenario, "norule": _norule_scenario, "all": _all_scenario}[scenario](rank, world)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(found, f)
    finally:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    np.random.seed(0)
    main()
