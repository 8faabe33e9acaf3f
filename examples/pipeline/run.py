#!/usr/bin/env python
"""From training to serving with polyop ops, end to end.

Route 1 (PyTorch -> ONNX -> ONNX Runtime, Python and Rust): a tiny conv net built only from
polyop ops is trained for a few SGD steps in torch, exported with
``torch.onnx.export(dynamo=True, custom_translation_table=polyop.torch.onnx_translation_table())``
with a dynamic batch, served by ONNX Runtime from Python and from a Rust program (the ``ort``
crate, ``serve/``), and the three outputs (torch eager, ORT Python, ORT Rust) must be
bit-identical.

Route 2 (Keras -> SavedModel): a Keras 3 model with ``polyop.keras`` layers is fitted, exported
with ``model.export``, reloaded in a fresh process that only calls ``tf.load_op_library``, and
served; its output must equal the Keras model's bit for bit.

    python examples/pipeline/run.py            # both routes; exits non-zero on any mismatch
    python examples/pipeline/run.py --route torch

Each framework runs in its own process (route 2 in a subprocess).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def torch_route(work: Path) -> None:
    import onnxruntime as ort
    import torch

    import polyop
    import polyop.torch

    P = polyop.torch.load().handle
    torch.manual_seed(0)

    class TinyNet(torch.nn.Module):
        """conv -> gelu -> conv -> rms_norm -> softmax, every op a polyop op."""

        def __init__(self):
            super().__init__()
            self.w1 = torch.nn.Parameter(torch.randn(4, 1, 3, 3) * 0.3)
            self.b1 = torch.nn.Parameter(torch.zeros(4))
            self.w2 = torch.nn.Parameter(torch.randn(2, 4, 3, 3) * 0.3)
            self.b2 = torch.nn.Parameter(torch.zeros(2))
            self.g = torch.nn.Parameter(torch.ones(8))

        def forward(self, x):
            h = P.gelu(P.conv2d(x, self.w1, self.b1, stride=1, padding=1))
            h = P.conv2d(h, self.w2, self.b2, stride=1, padding=1)
            return P.softmax(P.rms_norm(h, self.g, eps=1e-5), axis=-1)

    model = TinyNet()
    gen = torch.Generator().manual_seed(1)
    xs, target = torch.randn(16, 1, 8, 8, generator=gen), torch.rand(16, 2, 8, 8, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(8):  # gradients through polyop's backward ops
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xs), target / target.sum(-1, keepdim=True))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"torch: trained 8 SGD steps, loss {losses[0]:.5f} -> {losses[-1]:.5f}")
    if not losses[-1] < losses[0]:
        raise SystemExit("torch: the loss did not go down")

    path = work / "tinynet.onnx"
    batch = torch.export.Dim("batch", min=1, max=256)
    prog = torch.onnx.export(model, (xs[:2],), dynamo=True,
                             custom_translation_table=polyop.torch.onnx_translation_table(),
                             dynamic_shapes=({0: batch},))
    prog.save(str(path))
    print(f"torch: exported {path.name} (ai.polyop nodes, dynamic batch)")

    x = torch.randn(3, 1, 8, 8, generator=gen)  # a batch size the export never saw
    with torch.no_grad():
        eager = model(x).numpy()

    so = ort.SessionOptions()
    so.register_custom_ops_library(polyop.library_path("onnxruntime"))
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    in_name, out_name = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    (py,) = sess.run(None, {in_name: x.numpy()})

    serve = HERE / "serve"
    subprocess.run(["cargo", "build", "-q", "--manifest-path", str(serve / "Cargo.toml")], check=True)
    ort_dylib = sorted(glob.glob(os.path.join(os.path.dirname(ort.__file__), "capi", "libonnxruntime.so*")))[-1]
    x.numpy().astype("<f4").tofile(work / "x.f32")
    dims = "x".join(str(d) for d in x.shape)
    out = subprocess.run(
        [str(serve / "target" / "debug" / "polyop-pipeline-serve"), ort_dylib,
         polyop.library_path("onnxruntime"), str(path), str(work), f"{in_name}={work / 'x.f32'}:{dims}"],
        check=True, capture_output=True, text=True).stdout
    shape = tuple(int(d) for d in dict(line.split() for line in out.splitlines())[out_name].split("x"))
    rust = np.fromfile(work / f"{out_name}.f32", dtype="<f4").reshape(shape)

    for name, got in (("ONNX Runtime (Python)", py), ("ONNX Runtime (Rust, ort crate)", rust)):
        if got.shape != eager.shape or not np.array_equal(got, eager):
            raise SystemExit(f"{name} differs from torch eager: max |diff| "
                             f"{np.abs(got.astype(np.float64) - eager).max() if got.shape == eager.shape else got.shape}")
    # the result is a softmax over the last dim: every row sums to 1 (not a zero output)
    np.testing.assert_allclose(eager.sum(-1), 1.0, rtol=1e-5)
    print(f"torch route: torch eager, ORT Python and ORT Rust are bit-identical {eager.shape}")


def keras_route(work: Path) -> None:
    import keras

    import polyop
    import polyop.keras as pk

    keras.utils.set_random_seed(0)
    x = keras.Input((16,))
    h = pk.RMSNorm(eps=1e-5)(x)
    h = keras.layers.Dense(8)(h)
    y = pk.Op("softmax", axis=-1)(pk.Op("gelu", approximate="tanh")(h))
    model = keras.Model(x, y)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 16)).astype(np.float32)
    Y = rng.random((64, 8)).astype(np.float32)
    Y /= Y.sum(-1, keepdims=True)
    hist = model.fit(X, Y, epochs=5, batch_size=16, verbose=0, shuffle=False).history["loss"]
    print(f"keras: fitted 5 epochs, loss {hist[0]:.5f} -> {hist[-1]:.5f}")
    if not hist[-1] < hist[0]:
        raise SystemExit("keras: the loss did not go down")
    served = work / "keras_served"
    model.export(str(served), verbose=False)
    x_test = rng.standard_normal((5, 16)).astype(np.float32)
    np.save(work / "kx.npy", x_test)
    np.save(work / "ky.npy", np.asarray(model(x_test)))
    code = f"""
        import sys
        import numpy as np, tensorflow as tf
        tf.load_op_library({polyop.library_path("tensorflow")!r})
        m = tf.saved_model.load({str(served)!r})
        y = m.serve(tf.constant(np.load({str(work / 'kx.npy')!r}))).numpy()
        want = np.load({str(work / 'ky.npy')!r})
        assert "polyop" not in sys.modules
        sys.exit(0 if y.shape == want.shape and np.array_equal(y, want) else 1)
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"keras: the reloaded SavedModel differs from the Keras model\n{r.stderr[-2000:]}")
    print("keras route: the SavedModel reloaded with only tf.load_op_library serves the Keras "
          "model's outputs bit for bit")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--route", choices=("all", "torch", "keras"), default="all")
    ap.add_argument("--work", help="directory for the artifacts (default: a temporary one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.route == "torch":
            torch_route(work)
        elif args.route == "keras":
            keras_route(work)
        else:  # one framework per process
            for route in ("torch", "keras"):
                subprocess.run([sys.executable, __file__, "--route", route, "--work", str(work)], check=True)
            print("pipeline: both routes OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
