"""The TensorFlow backend: ``libpolyop_tensorflow.so`` (through ``polyop.tensorflow.load()``,
which adds gradients and exact static shapes) in eager mode and under ``tf.function`` with an
input signature of ``None`` dims (graph mode: TF runs the ops' shape functions); there the
concrete function's static output shapes must equal what kernel-core infers for the same
partially known inputs. Gradients: ``tf.test.compute_gradient`` in float64 (theoretical vs
numerical Jacobians). Symbolic mode: one ``tf.function`` concrete function traced with
``None`` for every symbolic dim, called at every size (no retracing)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tensorflow as tf

import polyop
import polyop.tensorflow as polyop_tf

from ..harness import GRAD, Backend, Case


def to_tf(a):
    """NumPy -> tf.Tensor (a copy; TF tensors are dense). ml_dtypes.bfloat16 arrays become
    tf.bfloat16 directly."""
    if a is None:
        return None
    return tf.constant(np.array(a, order="C", copy=True))


def to_numpy(t) -> np.ndarray:
    a = t.numpy()
    if t.dtype == tf.bfloat16:
        a = a.astype(ml_dtypes.bfloat16)
    return np.array(a, copy=True)


class TensorFlowBackend(Backend):
    name = "tensorflow"
    modes = ("eager", "function")
    version = f"tensorflow {tf.__version__}"

    def __init__(self, library: str | None = None) -> None:
        self._ops = None
        self.library = library
        self.meta = polyop
        if library is not None:
            self._ops = polyop_tf.load(library)  # a polyop._library.Loaded
            self.meta = self._ops.library

    @property
    def ops(self):
        if self._ops is None:
            self._ops = polyop_tf.load()
        return self._ops

    def unsupported(self, case: Case, mode: str) -> str | None:
        info = self.meta.op_info(case.op)
        if info["flags"]["inplace"]:
            return "in-place ops exist only on the torch surface; TF has the out-of-place op"
        if mode == GRAD and not info.get("backward"):
            return "op has no gradient"
        return None

    symbolic = True

    def run_symbolic(self, case: Case, pattern: list, cases) -> list:
        op = getattr(self.ops, case.op)
        attrs = dict(case.attrs)
        present = [k for k, p in enumerate(pattern) if p is not None]
        signature = [tf.TensorSpec([None if isinstance(d, str) else d for d in pattern[k]],
                                   to_tf(case.inputs[k]).dtype) for k in present]

        def fn(*xs):
            full = [None] * len(pattern)
            for k, x in zip(present, xs):
                full[k] = x
            return op(*full, **attrs)

        f = tf.function(fn, input_signature=signature)
        res = []
        for c in cases:
            out = f(*[to_tf(c.inputs[k]) for k in present])
            res.append([to_numpy(o) for o in (out if isinstance(out, (tuple, list)) else [out])])
        if f.experimental_get_tracing_count() != 1:
            raise AssertionError(f"traced {f.experimental_get_tracing_count()} times, not once")
        return res

    def _call(self, case: Case, mode: str, args: list):
        op = getattr(self.ops, case.op)
        attrs = dict(case.attrs)
        if mode == "eager":
            return op(*args, **attrs)
        if mode != "function":
            raise ValueError(f"unknown mode {mode}")
        present = [k for k, a in enumerate(args) if a is not None]
        signature = [tf.TensorSpec([None] * args[k].shape.rank, args[k].dtype) for k in present]

        def fn(*xs):
            full = list(args)
            for k, x in zip(present, xs):
                full[k] = x
            return op(*full, **attrs)

        concrete = tf.function(fn, input_signature=signature).get_concrete_function()
        outs = concrete.structured_outputs
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        specs = [None if a is None else ((None,) * a.shape.rank, a.dtype.name) for a in args]
        expected = self.meta.infer(case.op, specs, **attrs)
        got = [(None if o.shape.rank is None else tuple(o.shape.as_list()), o.dtype.name) for o in outs]
        want = [(None if s is None else tuple(s), d) for s, d in expected]
        if got != want:
            raise AssertionError(
                f"tf.function static output specs {got} != kernel-core's inference {want}"
            )
        return concrete(*[args[k] for k in present])

    def run(self, case: Case, mode: str) -> list[np.ndarray]:
        out = self._call(case, mode, [to_tf(a) for a in case.inputs])
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [to_numpy(o) for o in outs]

    def error(self, case: Case, mode: str) -> BaseException:
        try:
            self.run(case, mode)
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - returning it is the point
            return e
        raise AssertionError("no error was raised")

    def check_grad(self, case: Case) -> None:
        info = self.meta.op_info(case.op)
        op = getattr(self.ops, case.op)
        attrs = dict(case.attrs)
        args = []
        for a in case.inputs:
            if a is not None and np.asarray(a).dtype.kind == "f":
                a = np.asarray(a, dtype=np.float64)
            args.append(to_tf(a))
        diff_inputs = set(info["backward"]["outputs"])
        positions = [
            k for k, t in enumerate(args) if t is not None and t.dtype.is_floating and k in diff_inputs
        ]
        if not positions:
            raise AssertionError("no float input to differentiate")
        grad_outputs = sorted({i for kind, i in info["backward"]["inputs"] if kind == "grad"})
        for j in grad_outputs:

            def fn(*xs, j=j):
                full = list(args)
                for k, x in zip(positions, xs):
                    full[k] = x
                out = op(*full, **attrs)
                return out[j] if isinstance(out, (tuple, list)) else out

            theoretical, numerical = tf.test.compute_gradient(
                fn, [args[k] for k in positions], delta=1e-6
            )
            for k, t, n in zip(positions, theoretical, numerical):
                if t.shape != n.shape or not np.allclose(t, n, rtol=1e-4, atol=1e-5):
                    err = np.max(np.abs(t - n)) if t.shape == n.shape else "shape"
                    raise AssertionError(
                        f"output {j} w.r.t. input {k}: theoretical and numerical Jacobians "
                        f"differ (max abs diff {err})"
                    )


BACKEND = TensorFlowBackend()
