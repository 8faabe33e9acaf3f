"""polyop ops on DTensors and in DDP, 2 gloo processes on localhost.
Run: python examples/distributed/torch_dtensor.py"""

import datetime
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    import polyop.torch as pt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    ops = pt.ops()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    x = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0)])
    w = distribute_tensor(torch.ones(16), mesh, [Replicate()])
    with CommDebugMode() as comm:
        y = ops.softmax(ops.rms_norm(ops.gelu(x), w), -1)
    if rank == 0:
        print("placements:", y.placements, "collectives:", comm.get_total_counts())  # (Shard(dim=0),) 0

    # DDP: gradients of polyop's ops are averaged like any other
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    loss = ops.gelu(ddp(torch.randn(4, 16))).pow(2).mean()
    loss.backward()
    if rank == 0:
        print("DDP step done, loss", loss.item())
    # DDP's reducer holds the process group: release it before the group is destroyed, or gloo's
    # threads are torn down with the interpreter (SIGABRT, "terminate called without an active
    # exception": seen once in CI)
    del ddp, loss
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:  # a free localhost port for the group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(main, args=(2, port), nprocs=2, join=True)
