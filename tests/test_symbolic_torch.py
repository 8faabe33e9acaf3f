"""Symbolic shapes in PyTorch: a small decoder block (RMSNorm, softmax attention, GELU MLP)
built from polyop ops compiles once across sequence lengths under
``torch.compile(dynamic=True)``, exports with a dynamic sequence ``Dim``, and the saved
program (and an AOTInductor package of it) reloads and runs at new sizes in a fresh process
that loads only torch and ``libpolyop_torch.so``. References: the same block with torch's built-in ops, and the source's
eager outputs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import polyop
import polyop.torch
from polyop.conformance.tolerances import rtol_atol

REPO = Path(__file__).resolve().parents[1]
LIB = Path(polyop.library_path("torch"))
P = polyop.torch.load().handle

D = 32
SEQS = (5, 9, 13, 17)


class Block(torch.nn.Module):
    """One pre-norm decoder block; ``builtin`` picks torch's ops instead of polyop's."""

    def __init__(self, builtin: bool):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.builtin = builtin
        self.norm_w = torch.nn.Parameter(torch.rand(D, generator=gen) + 0.5)
        self.qkv = torch.nn.Parameter(torch.randn(D, 3 * D, generator=gen) / D**0.5)
        self.out = torch.nn.Parameter(torch.randn(D, D, generator=gen) / D**0.5)
        self.up = torch.nn.Parameter(torch.randn(D, 4 * D, generator=gen) / D**0.5)
        self.down = torch.nn.Parameter(torch.randn(4 * D, D, generator=gen) / (4 * D) ** 0.5)

    def norm(self, x):
        if self.builtin:
            return F.rms_norm(x, (D,), self.norm_w, eps=1e-6)
        return P.rms_norm(x, self.norm_w, eps=1e-6)

    def forward(self, x):
        h = self.norm(x)
        q, k, v = (h @ self.qkv).chunk(3, dim=-1)
        s = q @ k.transpose(-1, -2) * D**-0.5
        a = torch.softmax(s, dim=-1) if self.builtin else P.softmax(s, axis=-1)
        x = x + (a @ v) @ self.out
        h = self.norm(x) @ self.up
        h = F.gelu(h) if self.builtin else P.gelu(h)
        return x + h @ self.down


def inputs(seq: int, batch: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seq)
    return torch.randn(batch, seq, D, generator=gen)


def assert_close_to_builtin(got, want):
    # A whole block of float32 ops with differently ordered sums: 64 ulps of the output's
    # scale (residual adds make small elements of large rows cancel).
    rtol, _ = rtol_atol("float32", ulps=64)
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * float(want.detach().abs().max()))
    assert want.abs().max() > 0.1  # a zero output cannot pass


def count_graphs(model, seqs) -> tuple[int, list[torch.Tensor]]:
    from torch._dynamo.backends.debugging import aot_eager

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)  # runs the fake kernels through AOTAutograd

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    outs = [compiled(inputs(s)) for s in seqs]
    return len(graphs), outs


def test_block_compiles_once_across_sequence_lengths():
    ours, builtin = Block(builtin=False), Block(builtin=True)
    n_ours, outs = count_graphs(ours, SEQS)
    n_builtin, want = count_graphs(builtin, SEQS)
    assert n_ours <= n_builtin, (n_ours, n_builtin)
    assert n_ours == 1, f"{n_ours} graphs for {len(SEQS)} sequence lengths"
    for s, got, w in zip(SEQS, outs, want):
        assert got.shape == (2, s, D)
        assert_close_to_builtin(got, w)


def test_conv2d_output_size_is_a_symbolic_expression():
    class Conv(torch.nn.Module):
        def forward(self, x, w):
            return P.conv2d(x, w, stride=2, padding=1)

    h = torch.export.Dim("h", min=3, max=64)
    ep = torch.export.export(
        Conv(),
        (torch.randn(2, 3, 9, 11), torch.randn(4, 3, 3, 3)),
        dynamic_shapes=({2: h, 3: torch.export.Dim("w", min=3, max=64)}, None),
    )
    out = next(n for n in ep.graph.nodes if n.op == "output").args[0][0]
    size = out.meta["val"].shape
    # (h + 2*1 - 3) // 2 + 1 over torch's symbol for h, not a constant
    assert isinstance(size[2], torch.SymInt) and isinstance(size[3], torch.SymInt), size
    assert re.fullmatch(r"\(*s\d+ - 1\)*//2\)* \+ 1", str(size[2])), size
    # and it runs at a new size, matching torch's own conv
    x, w = torch.randn(2, 3, 20, 15), torch.randn(4, 3, 3, 3)
    torch.testing.assert_close(ep.module()(x, w), F.conv2d(x, w, stride=2, padding=1),
                               rtol=1e-5, atol=1e-5)


def run_fresh(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_export_with_dynamic_seq_reloads_in_a_fresh_process(tmp_path):
    model = Block(builtin=False)
    seq = torch.export.Dim("seq", min=2, max=128)
    ep = torch.export.export(model, (inputs(8),), dynamic_shapes=({1: seq},))
    path = tmp_path / "block.pt2"
    torch.export.save(ep, str(path))
    sizes = (3, 8, 21, 40)  # 21 and 40 were never traced
    for s in sizes:
        x = inputs(s)
        np.save(tmp_path / f"x{s}.npy", x.numpy())
        np.save(tmp_path / f"y{s}.npy", model(x).detach().numpy())  # the source's eager output
    r = run_fresh(f"""
        import numpy as np, torch
        torch.ops.load_library({str(LIB)!r})
        ep = torch.export.load({str(path)!r})
        m = ep.module()
        for s in {sizes!r}:
            x = torch.from_numpy(np.load({str(tmp_path)!r} + f"/x{{s}}.npy"))
            y = m(x).detach().numpy()
            want = np.load({str(tmp_path)!r} + f"/y{{s}}.npy")
            assert y.shape == want.shape, (y.shape, want.shape)
            assert np.array_equal(y, want), (s, np.abs(y - want).max())
        import sys
        assert "polyop" not in sys.modules
        print("ok", len({sizes!r}))
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"ok {len(sizes)}"


def test_export_of_nonzero_uses_an_unbacked_size():
    class NZ(torch.nn.Module):
        def forward(self, x):
            return P.nonzero(x)

    dims = {0: torch.export.Dim("r", min=2, max=64), 1: torch.export.Dim("c", min=2, max=64)}
    ep = torch.export.export(NZ(), (torch.tensor([[0.0, 1.0], [2.0, 0.0]]),),
                             dynamic_shapes=(dims,))
    out = next(n for n in ep.graph.nodes if n.op == "output").args[0][0]
    n = out.meta["val"].shape[0]
    assert isinstance(n, torch.SymInt) and str(n).startswith("u"), n
    x = torch.tensor([[1.0, 0.0, 3.0], [0.0, 0.0, 5.0], [7.0, 0.0, 0.0]])
    assert torch.equal(ep.module()(x), torch.nonzero(x))


def test_constraint_between_symbolic_sizes_is_checked():
    # rms_norm's weight must equal x's last dim: with the last dim dynamic and the weight
    # static, export must refuse the Dim (as it would for torch's own rms_norm), not guess.
    class Norm(torch.nn.Module):
        def forward(self, x, w):
            return P.rms_norm(x, w)

    with pytest.raises(Exception, match="d"):
        torch.export.export(
            Norm(), (torch.randn(2, 8), torch.randn(8)),
            dynamic_shapes=({1: torch.export.Dim("d", min=2, max=64)}, None),
        )
    # and with both dynamic and tied by the same Dim, it exports and runs at new sizes
    d = torch.export.Dim("d", min=2, max=64)
    ep = torch.export.export(Norm(), (torch.randn(2, 8), torch.randn(8) + 1.0),
                             dynamic_shapes=({1: d}, {0: d}))
    x, w = torch.randn(2, 20), torch.rand(20) + 0.5
    torch.testing.assert_close(ep.module()(x, w), F.rms_norm(x, (20,), w, eps=1e-6),
                               rtol=1e-5, atol=1e-6)


def test_aot_inductor_package_runs_in_a_fresh_process(tmp_path):
    model = Block(builtin=False)
    seq = torch.export.Dim("seq", min=2, max=128)
    ep = torch.export.export(model, (inputs(8),), dynamic_shapes=({1: seq},))
    pkg = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "block_aoti.pt2"))
    sizes = (4, 19, 33)
    rtol, _ = rtol_atol("float32", ulps=64)
    for s in sizes:
        x = inputs(s)
        np.save(tmp_path / f"x{s}.npy", x.numpy())
        np.save(tmp_path / f"y{s}.npy", model(x).detach().numpy())
    r = run_fresh(f"""
        import sys
        import numpy as np, torch
        torch.ops.load_library({str(LIB)!r})
        m = torch._inductor.aoti_load_package({pkg!r})
        for s in {sizes!r}:
            x = torch.from_numpy(np.load({str(tmp_path)!r} + f"/x{{s}}.npy"))
            y = m(x).detach().numpy()
            want = np.load({str(tmp_path)!r} + f"/y{{s}}.npy")
            assert y.shape == want.shape, (y.shape, want.shape)
            # Inductor may fuse and reorder the built-in ops around polyop's kernels
            np.testing.assert_allclose(y, want, rtol={rtol!r}, atol={rtol!r} * np.abs(want).max())
            assert np.abs(want).max() > 0.1
        assert "polyop" not in sys.modules
        print("ok", len({sizes!r}))
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"ok {len(sizes)}"
