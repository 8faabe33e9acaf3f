//! `swiglu(Tensor x, Tensor gate) -> Tensor` = `x * silu(gate)` = `x * gate * sigmoid(gate)`,
//! written once against kernel-core and built into four framework libraries by the sibling
//! crates (`torch/`, `tensorflow/`, `onnxruntime/`, `xla/`), each a five-line `cdylib`.
//!
//! - dtypes: float16, bfloat16, float32, float64 (half types compute in f32, round once);
//! - shapes: `x` and `gate` have the same shape (unknown dims are merged);
//! - backward: `swiglu_backward(grad, x, gate) -> (grad_x, grad_gate)`, itself an op;
//! - kernels: contiguous views, fixed chunks through `parallel_for` (the host's thread pool),
//!   so results do not depend on the thread count.

use kernel_core::{
    dispatch_float, parallel_for, BwdInput, DType, Dim, Error, FloatElem, InferCtx, KernelCtx,
    OpDef, Registry, Result, ShapeOut, SharedMut,
};
use num_traits::{Float, One};
use std::sync::OnceLock;

/// Elements per parallel task (fixed, so partitioning never depends on the thread count).
const GRAIN: usize = 1 << 14;

/// The registry an adapter's `export!` macro turns into a framework library.
pub fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| {
        let mut r = Registry::named("swiglu_ops");
        r.register(
            OpDef::builder("swiglu(Tensor x, Tensor gate) -> Tensor")
                .doc("x * silu(gate), silu(g) = g * sigmoid(g); x and gate have the same shape")
                .dtypes(DType::FLOAT)
                .infer(|ctx| same_shapes(ctx, 2).map(|s| vec![s]))
                .cpu(swiglu_cpu)
                .backward(
                    "swiglu_backward",
                    &[BwdInput::Grad(0), BwdInput::Input(0), BwdInput::Input(1)],
                    &[0, 1],
                )
                .build()
                .expect("swiglu op definition"),
        )
        .expect("register swiglu");
        r.register(
            OpDef::builder(
                "swiglu_backward(Tensor grad, Tensor x, Tensor gate) -> (Tensor grad_x, Tensor grad_gate)",
            )
            .doc("gradients of swiglu w.r.t. x and gate")
            .dtypes(DType::FLOAT)
            .infer(|ctx| same_shapes(ctx, 3).map(|s| vec![s.clone(), s]))
            .cpu(swiglu_backward_cpu)
            .backward_only()
            .build()
            .expect("swiglu_backward op definition"),
        )
        .expect("register swiglu_backward");
        r.validate().expect("valid registry");
        r
    })
}

/// The common shape of the first `n` inputs, which must agree (unknown dims / rank merge).
fn same_shapes(ctx: &InferCtx, n: usize) -> Result<ShapeOut> {
    let names: Vec<&str> = ctx
        .op
        .schema
        .tensor_args()
        .map(|a| a.name.as_str())
        .collect();
    let mut out: Option<Vec<Dim>> = None;
    for i in 0..n {
        let Some(dims) = ctx.dims(i) else { continue };
        match &mut out {
            None => out = Some(dims.to_vec()),
            Some(o) => {
                if o.len() != dims.len() {
                    return Err(Error::invalid(format!(
                        "`{}` has rank {} but `{}` has rank {}; shapes must match",
                        names[i],
                        dims.len(),
                        names[0],
                        o.len()
                    )));
                }
                for (k, (a, b)) in o.iter_mut().zip(dims).enumerate() {
                    // Known sizes must match now; symbolic ones become a constraint the
                    // framework checks (torch guards, JAX export) instead of a specialization.
                    ctx.require_eq(b, a, || {
                        format!(
                            "shape mismatch at dim {k}: `{}` has {b}, `{}` has {a}; shapes must match",
                            names[i], names[0]
                        )
                    })?;
                    if a.is_unknown() {
                        *a = b.clone();
                    }
                }
            }
        }
    }
    Ok(out)
}

#[inline(always)]
fn sigmoid<A: Float>(g: A) -> A {
    A::one() / (A::one() + (-g).exp())
}

fn swiglu_cpu(ctx: &mut KernelCtx) -> Result<()> {
    let dtype = ctx.input(0).dtype;
    dispatch_float!(dtype, T => swiglu_typed::<T>(ctx), _ => Err(Error::unsupported(format!("dtype {dtype}"))))
}

fn swiglu_typed<T: FloatElem>(ctx: &mut KernelCtx) -> Result<()> {
    let x = ctx.input(0).contiguous::<T>()?;
    let g = ctx.input(1).contiguous::<T>()?;
    let pool = ctx.pool;
    let out = ctx.outputs[0].as_mut_slice::<T>()?;
    let n = out.len();
    let dst = SharedMut::new(out);
    parallel_for(pool, n, GRAIN, |r| {
        // SAFETY: each task writes its own disjoint range of the output.
        let o = unsafe { dst.slice(r.start, r.len()) };
        for ((o, &x), &g) in o.iter_mut().zip(&x[r.clone()]).zip(&g[r.clone()]) {
            let (x, g) = (x.to_acc(), g.to_acc());
            *o = T::from_acc(x * g * sigmoid(g));
        }
    });
    Ok(())
}

fn swiglu_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    let dtype = ctx.input(0).dtype;
    dispatch_float!(dtype, T => swiglu_backward_typed::<T>(ctx), _ => Err(Error::unsupported(format!("dtype {dtype}"))))
}

fn swiglu_backward_typed<T: FloatElem>(ctx: &mut KernelCtx) -> Result<()> {
    let dy = ctx.input(0).contiguous::<T>()?;
    let x = ctx.input(1).contiguous::<T>()?;
    let g = ctx.input(2).contiguous::<T>()?;
    let pool = ctx.pool;
    let (gx, gg) = ctx.outputs.split_at_mut(1);
    let gx = gx[0].as_mut_slice::<T>()?;
    let gg = gg[0].as_mut_slice::<T>()?;
    let n = gx.len();
    let (dx, dg) = (SharedMut::new(gx), SharedMut::new(gg));
    parallel_for(pool, n, GRAIN, |r| {
        // SAFETY: each task writes its own disjoint range of both outputs.
        let (dx, dg) = unsafe { (dx.slice(r.start, r.len()), dg.slice(r.start, r.len())) };
        for i in 0..r.len() {
            let k = r.start + i;
            let (dy, x, g) = (dy[k].to_acc(), x[k].to_acc(), g[k].to_acc());
            let s = sigmoid(g);
            let one = <T::Acc as One>::one();
            dx[i] = T::from_acc(dy * g * s);
            dg[i] = T::from_acc(dy * x * s * (one + g * (one - s)));
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_core::exec::run_op;
    use kernel_core::{default_pool, OwnedTensor, TensorSpec};

    #[test]
    fn forward_matches_the_formula() {
        let op = registry().lookup("swiglu").unwrap();
        let x = OwnedTensor::from_vec(vec![1.0f64, -2.0, 0.5], &[3]).unwrap();
        let g = OwnedTensor::from_vec(vec![0.0f64, 1.0, -3.0], &[3]).unwrap();
        let attrs = op.bind_attrs([]).unwrap();
        let out = run_op(
            op,
            &[Some(x.view()), Some(g.view())],
            &attrs,
            default_pool(),
        )
        .unwrap();
        let got = out[0].to_vec::<f64>().unwrap();
        let want: Vec<f64> = [(1.0f64, 0.0f64), (-2.0, 1.0), (0.5, -3.0)]
            .iter()
            .map(|&(x, g)| x * g / (1.0 + (-g).exp()))
            .collect();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-15, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn shapes_merge_and_mismatch_is_an_error() {
        let op = registry().lookup("swiglu").unwrap();
        let attrs = op.bind_attrs([]).unwrap();
        let a = TensorSpec::with_dims(DType::F32, vec![None, Some(4)]);
        let b = TensorSpec::with_dims(DType::F32, vec![Some(2), None]);
        let out = op.infer(&[Some(a), Some(b)], &attrs).unwrap();
        assert_eq!(out[0].concrete(), Some(vec![2, 4]));
        // symbolic sizes: the same symbol merges; two different ones become a constraint
        let s = |n: &str| Dim::sym(n);
        let a = TensorSpec::with_dims(DType::F32, vec![s("b"), Dim::Known(4)]);
        let b = TensorSpec::with_dims(DType::F32, vec![s("c"), Dim::Unknown]);
        let r = op.infer_symbolic(&[Some(a), Some(b)], &attrs).unwrap();
        assert_eq!(r.outputs[0].shape, Some(vec![s("b"), Dim::Known(4)]));
        assert_eq!(r.constraints.len(), 1, "{:?}", r.constraints);
        assert_eq!((&r.constraints[0].lhs, &r.constraints[0].rhs), (&s("c"), &s("b")));
        let e = op
            .infer(
                &[
                    Some(TensorSpec::new(DType::F32, &[2, 3])),
                    Some(TensorSpec::new(DType::F32, &[2, 4])),
                ],
                &attrs,
            )
            .unwrap_err();
        assert!(
            e.to_string().starts_with("swiglu_ops.swiglu: shape mismatch"),
            "{e}"
        );
    }
}
