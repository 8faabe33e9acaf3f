"""polyop ops in torch.distributed: DTensor sharding strategies from every op's sharding
rule, and DDP training (docs/distributed.md).

Each scenario runs 2 processes (tests/_distributed_torch_worker.py) in a gloo group on
localhost, each bounded in time: the group has a 60 s timeout, the ranks meet at a barrier
before tearing it down, and a rank still running after the deadline is killed and the test
fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import polyop
import polyop.torch as pt

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _distributed_torch_worker import Model, model_step_data, train  # noqa: E402
from _sharding_cases import cases  # noqa: E402

WORLD = 2
DEADLINE = 240  # seconds for a whole scenario


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scenario: str, tmp_path) -> dict:
    out = tmp_path / f"{scenario}.json"
    port = str(_free_port())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "python"), os.environ.get("PYTHONPATH", "")]))
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_distributed_torch_worker.py"), scenario, str(r), str(WORLD), port, str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        for r in range(WORLD)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=DEADLINE)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"scenario {scenario}: a rank did not finish within {DEADLINE} s")
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} of {scenario} failed:\n{log[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def ops_found(tmp_path_factory):
    return run_ranks("all", tmp_path_factory.mktemp("all"))


def test_every_torch_op_has_a_case():
    names = {o["name"] for o in polyop.ops() if not o["flags"]["inplace"] and not o["flags"]["data_dependent_shape"]}
    assert set(cases()) == names


@pytest.mark.parametrize("name", sorted(cases()))
def test_batch_sharded_dtensor_op_communicates_nothing(ops_found, name):
    found = ops_found[name]
    assert found["comm"] == 0, found
    inputs, attrs = cases()[name]
    rule = polyop.infer_symbolic(name, [(a.shape, a.dtype.name) for a in inputs], **attrs)["sharding"]
    batch = rule["inputs"][0][0]
    for out, got in zip(rule["outputs"], found["outputs"]):
        if batch in out:
            # stays sharded along the batch, and equals the single-process run bit for bit
            assert got["placements"] == [f"Shard(dim={out.index(batch)})"], got
            assert got["equal"], got
        else:
            # summed over the batch (a weight gradient): a Partial sum until it is needed
            assert got["placements"] == ["Partial(sum)"], got
            assert got["max_rel_diff"] <= 16 * 2.0**-23, got


@pytest.mark.parametrize("key", ["softmax axis 0 on Shard(0)", "softmax axis 1 on Shard(1)", "topk on Shard(1)"])
def test_sharded_along_a_whole_dim_is_redistributed_and_correct(ops_found, key):
    found = ops_found[key]
    assert found["comm"] >= 1, found  # the input had to be gathered
    assert all(o["equal"] for o in found["outputs"]), found


def test_autograd_through_dtensors(ops_found):
    found = ops_found["autograd"]
    assert found["comm"] == 0, found
    assert found["x_grad"] == ["Shard(dim=0)"]
    assert found["w_grad"] == ["Partial(sum)"]


def test_without_the_rule_dtensor_has_no_strategy(tmp_path):
    """What the strategies fix: with polyop's registration blocked, DTensor refuses the op."""
    found = run_ranks("norule", tmp_path)["without rule"]
    assert found.startswith("NotImplementedError") and "polyop.gelu" in found, found


def test_ddp_training_matches_single_process(ops_found):
    found = ops_found["ddp"]
    params, x, t = model_step_data()
    model = Model(params)
    loss = train(model, x, t)
    for k, v in model.p.items():
        got = np.asarray(found["weights"][k])
        want = v.detach().numpy()
        moved = np.abs(want - params[k].numpy()).max()
        assert moved > 1e-3, f"{k} did not train"  # a no-op training would also "match"
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    assert np.isfinite(loss) and np.isfinite(found["loss"])


def test_dtensor_strategies_registered_when_dtensor_is_imported_first(tmp_path):
    """Registration waits for torch.distributed.tensor; the other import order works too."""
    code = (
        "import torch.distributed.tensor\n"
        "import polyop.torch as pt\n"
        "pt.load()\n"
        "from torch.distributed.tensor import DTensor\n"
        "s = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "assert torch.ops.polyop.softmax.default in s\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "python"))
    p = subprocess.run([sys.executable, "-c", "import torch\n" + code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-3000:]


def test_loading_polyop_does_not_import_dtensor():
    code = "import sys, polyop.torch as pt; pt.load(); print('torch.distributed.tensor' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "python"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr[-3000:]


def test_single_process_ops_still_plain_tensors():
    x = torch.randn(4, 8)
    assert torch.equal(pt.ops().negate(x), -x)


def test_docs_example_runs():
    """examples/distributed/torch_dtensor.py, as docs/distributed.md shows it."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "python"))
    p = subprocess.run([sys.executable, str(HERE.parent / "examples/distributed/torch_dtensor.py")],
                       capture_output=True, text=True, timeout=DEADLINE, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "placements: (Shard(dim=0),) collectives: 0" in p.stdout, p.stdout
    assert "DDP step done" in p.stdout
