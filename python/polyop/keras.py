"""polyop ops as Keras 3 layers, on whichever backend Keras runs (TensorFlow, PyTorch, JAX):
the layers call the backend's polyop glue (``polyop.tensorflow``, ``polyop.torch``,
``polyop.jax``), so the same kernels run and gradients flow through the registered backward
ops.

    import keras, polyop.keras as pk
    x = keras.Input((16,))
    h = pk.RMSNorm(eps=1e-5)(x)                      # a learnable weight over the last dim
    y = pk.Op("gelu", approximate="tanh")(h)         # any polyop op, attributes by name
    model = keras.Model(x, y)

Both layers are registered Keras serializables (package ``polyop``): a ``.keras`` file loads
after ``import polyop.keras``. With the TensorFlow backend, ``model.export(path)`` writes a
SavedModel that serves in a process that only calls ``tf.load_op_library`` (docs/deploy.md).
Under the TensorFlow backend the layers set ``supports_jit = False`` (TF's XLA cannot compile
custom ops), so ``jit_compile="auto"`` leaves them out of XLA.
"""

from __future__ import annotations

from typing import Any

try:
    import keras
except ImportError as e:  # pragma: no cover - exercised without keras installed
    raise ImportError(
        f"polyop.keras needs Keras 3: cannot import `keras` ({type(e).__name__}: {e}). "
        "Install it with `pip install keras`; `import polyop` itself works without it.",
        name="keras",
    ) from e

__all__ = ["Op", "RMSNorm", "backend_ops"]


def backend_ops():
    """The polyop ops of Keras's current backend (a :class:`polyop._library.Loaded`)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from . import tensorflow as glue
    elif backend == "torch":
        from . import torch as glue
    elif backend == "jax":
        from . import jax as glue
    else:
        raise NotImplementedError(
            f"polyop.keras: no polyop glue for the Keras backend {backend!r} "
            "(tensorflow, torch and jax have one)")
    return glue.load()


class _PolyopLayer(keras.layers.Layer):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # TensorFlow's XLA cannot compile custom ops; JAX's can (polyop.jax's FFI targets).
        self.supports_jit = keras.backend.backend() != "tensorflow"


@keras.saving.register_keras_serializable(package="polyop")
class Op(_PolyopLayer):
    """Any polyop op as a layer: ``Op(name, **attrs)(*inputs)`` is ``op(*inputs, **attrs)``;
    an op with several outputs (``topk``) returns a tuple."""

    def __init__(self, op: str, name: str | None = None, **attrs: Any) -> None:
        layer_kw = {k: attrs.pop(k) for k in ("dtype", "trainable") if k in attrs}
        super().__init__(name=name, **layer_kw)
        self.op, self.attrs = op, attrs

    def call(self, *inputs):
        return backend_ops().call(self.op, *inputs, **self.attrs)

    def get_config(self) -> dict:
        return {**super().get_config(), "op": self.op, **self.attrs}


@keras.saving.register_keras_serializable(package="polyop")
class RMSNorm(_PolyopLayer):
    """``rms_norm`` over the last dim with a learnable weight (initialised to ones)."""

    def __init__(self, eps: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.eps = eps

    def build(self, input_shape) -> None:
        self.weight = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="weight")

    def call(self, x):
        return backend_ops().rms_norm(x, self.weight, eps=self.eps)

    def get_config(self) -> dict:
        return {**super().get_config(), "eps": self.eps}
