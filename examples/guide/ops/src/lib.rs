//! The ops of docs/authoring.md ("Attributes, several outputs, optional inputs, a backward with
//! attributes"), as an author writes them against kernel-core alone:
//!
//! - `leaky_relu_scaled(Tensor x, float slope=0.01, float scale=1.0)`: float attributes read
//!   as f64 and narrowed to the element's compute type; a backward op that receives the
//!   forward call's attributes by name.
//! - `minmax(Tensor x, int axis=-1) -> (Tensor min, Tensor max)`: an attribute-dependent shape
//!   (`normalize_axis`), two outputs, a reduction along an axis of a strided view, no gradient.
//! - `pad_add(Tensor x, Tensor? bias=None, int[] pads=[0, 0])`: an `int[]` attribute that
//!   changes the output size, an optional input, symbolic sizes (`Dim` arithmetic).
//!
//! `tests/test_authoring_guide.py` builds them into all four framework libraries and runs them
//! in every framework; `cargo test -p guide-ops` runs the checks below.

use kernel_core::{
    dispatch_float, normalize_axis, BwdInput, DType, Dim, Error, FloatElem, InferCtx, KernelCtx,
    OpDef, Registry, Result, ShapeOut,
};
use num_traits::{Float, One, Zero};
use std::sync::OnceLock;

/// The guide's ops.
pub fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| {
        let mut r = Registry::named("guide_ops");
        r.register(
            OpDef::builder("leaky_relu_scaled(Tensor x, float slope=0.01, float scale=1.0) -> Tensor")
                .dtypes(DType::FLOAT)
                .infer(|ctx| Ok(vec![ctx.input(0).shape.clone()]))
                .cpu(leaky_cpu)
                // d/dx: the backward op gets grad and x; its own schema repeats the forward's
                // attributes, which it receives by name from the forward call.
                .backward("leaky_relu_scaled_backward", &[BwdInput::Grad(0), BwdInput::Input(0)], &[0])
                .build()
                .expect("leaky_relu_scaled"),
        )
        .expect("register");
        r.register(
            OpDef::builder(
                "leaky_relu_scaled_backward(Tensor grad, Tensor x, float slope=0.01, float scale=1.0) -> Tensor",
            )
            .dtypes(DType::FLOAT)
            .infer(|ctx| {
                ctx.require_shape(ctx.dims(1), ctx.dims(0), || "grad must have the shape of x".into())?;
                Ok(vec![ctx.input(1).shape.clone()])
            })
            .cpu(leaky_backward_cpu)
            .backward_only()
            .build()
            .expect("leaky_relu_scaled_backward"),
        )
        .expect("register");
        r.register(
            OpDef::builder("minmax(Tensor x, int axis=-1) -> (Tensor min, Tensor max)")
                .dtypes(DType::FLOAT)
                .axis_attr("axis") // JAX's vmap rule keeps it pointing at the same axis
                .infer(minmax_infer)
                .cpu(minmax_cpu)
                .build()
                .expect("minmax"),
        )
        .expect("register");
        r.register(
            OpDef::builder("pad_add(Tensor x, Tensor? bias=None, int[] pads=[0, 0]) -> Tensor")
                .dtypes(DType::FLOAT)
                .infer(pad_add_infer)
                .cpu(pad_add_cpu)
                .build()
                .expect("pad_add"),
        )
        .expect("register");
        r
    })
}

// ---- leaky_relu_scaled: float attributes, a backward receiving them -----------------------

fn leaky_cpu(ctx: &mut KernelCtx) -> Result<()> {
    let dtype = ctx.input(0).dtype;
    dispatch_float!(dtype, T => leaky::<T>(ctx, false), _ => Err(Error::unsupported(format!("dtype {dtype}"))))
}

fn leaky_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    let dtype = ctx.input(0).dtype;
    dispatch_float!(dtype, T => leaky::<T>(ctx, true), _ => Err(Error::unsupported(format!("dtype {dtype}"))))
}

/// Forward `y = scale * (x > 0 ? x : slope * x)`; backward `dx = grad * scale * (x > 0 ? 1 : slope)`.
fn leaky<T: FloatElem>(ctx: &mut KernelCtx, backward: bool) -> Result<()> {
    // Attributes are f64 (torch, TF and ONNX float attributes are widened exactly); narrow
    // them once to the type the kernel computes in (f32 for half types).
    let slope = T::acc_from_f64(ctx.attrs.float("slope")?);
    let scale = T::acc_from_f64(ctx.attrs.float("scale")?);
    let x_in = if backward { 1 } else { 0 };
    let x = ctx.input(x_in).contiguous::<T>()?; // borrows a contiguous input, copies a view
    let grad = if backward {
        Some(ctx.input(0).contiguous::<T>()?)
    } else {
        None
    };
    let out = ctx.outputs[0].as_mut_slice::<T>()?;
    for (i, (o, &v)) in out.iter_mut().zip(x.iter()).enumerate() {
        let v = v.to_acc();
        let pos = v > T::Acc::zero();
        *o = T::from_acc(match &grad {
            None => scale * if pos { v } else { slope * v },
            Some(g) => g[i].to_acc() * scale * if pos { T::Acc::one() } else { slope },
        });
    }
    Ok(())
}

// ---- minmax: attribute-dependent shape, two outputs, reduction along an axis -----------------

fn minmax_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    let axis = ctx.attrs.int("axis")?;
    let Some(dims) = ctx.dims(0) else {
        return Ok(vec![None, None]); // unknown rank in, unknown rank out
    };
    let ax = normalize_axis(axis, dims.len())?; // negative axes, range errors
    if dims[ax] == Dim::Known(0) {
        return Err(Error::invalid(format!("axis {ax} is empty: no min or max")));
    }
    let mut out = dims.to_vec();
    out.remove(ax);
    Ok(vec![Some(out.clone()), Some(out)])
}

fn minmax_cpu(ctx: &mut KernelCtx) -> Result<()> {
    let dtype = ctx.input(0).dtype;
    dispatch_float!(dtype, T => minmax::<T>(ctx), _ => Err(Error::unsupported(format!("dtype {dtype}"))))
}

fn minmax<T: FloatElem>(ctx: &mut KernelCtx) -> Result<()> {
    let x = ctx.input(0);
    let ax = normalize_axis(ctx.attrs.int("axis")?, x.rank())?;
    // `contiguous` borrows a contiguous input and copies a strided view (a transpose, a
    // slice) once into row-major order; then the axis splits the data into
    // [outer, n, inner] blocks.
    let (n, inner) = (x.shape[ax], x.shape[ax + 1..].iter().product::<usize>());
    let data = x.contiguous::<T>()?;
    let outer = data.len() / (n * inner).max(1);
    let mut mins = Vec::with_capacity(outer * inner);
    let mut maxs = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let (mut lo, mut hi) = (T::Acc::infinity(), T::Acc::neg_infinity());
            for j in 0..n {
                let v = data[(o * n + j) * inner + i].to_acc();
                lo = lo.min(v);
                hi = hi.max(v);
            }
            mins.push(T::from_acc(lo));
            maxs.push(T::from_acc(hi));
        }
    }
    ctx.outputs[0].as_mut_slice::<T>()?.copy_from_slice(&mins); // output 0: min
    ctx.outputs[1].as_mut_slice::<T>()?.copy_from_slice(&maxs); // output 1: max
    Ok(())
}

// ---- pad_add: an int[] attribute, an optional input, size arithmetic ------------------------

fn pad_add_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    let pads = ctx.attrs.int_list("pads")?;
    let &[before, after] = pads else {
        return Err(Error::invalid(format!(
            "pads must have 2 values, got {}",
            pads.len()
        )));
    };
    if before < 0 || after < 0 {
        return Err(Error::invalid(format!("pads must be >= 0, got {pads:?}")));
    }
    let Some(dims) = ctx.dims(0) else {
        return Ok(vec![None]);
    };
    let Some(last) = dims.last() else {
        return Err(Error::invalid("x must have at least one dim"));
    };
    // An optional input: absent, or [last dim of x] (a requirement, not an assumption, when
    // the sizes are symbolic).
    if let Some(b) = ctx.input_opt(1).and_then(|b| b.shape.as_deref()) {
        match b {
            [n] => ctx.require_eq(n, last, || format!("bias must have shape [{last}]"))?,
            _ => return Err(Error::invalid("bias must be 1-D")),
        }
    }
    // `Dim` arithmetic works on known, unknown and symbolic sizes alike (`n + 3`).
    let mut out = dims.to_vec();
    let padded = last.add(&Dim::Known(before as usize + after as usize))?;
    *out.last_mut().expect("rank >= 1") = padded;
    Ok(vec![Some(out)])
}

fn pad_add_cpu(ctx: &mut KernelCtx) -> Result<()> {
    let dtype = ctx.input(0).dtype;
    dispatch_float!(dtype, T => pad_add::<T>(ctx), _ => Err(Error::unsupported(format!("dtype {dtype}"))))
}

fn pad_add<T: FloatElem>(ctx: &mut KernelCtx) -> Result<()> {
    let before = ctx.attrs.int_list("pads")?[0] as usize;
    let x = ctx.input(0).contiguous::<T>()?;
    let bias = match ctx.input_opt(1) {
        Some(b) => Some(b.contiguous::<T>()?), // present
        None => None,                          // absent optional input
    };
    let n = *ctx.input(0).shape.last().expect("rank >= 1");
    let out = ctx.outputs[0].as_mut_slice::<T>()?;
    let m = out.len() / (x.len() / n.max(1)).max(1);
    out.fill(T::from_acc(T::Acc::zero()));
    for (row, src) in x.chunks(n.max(1)).enumerate() {
        for (j, &v) in src.iter().enumerate() {
            let b = bias.as_ref().map_or(T::Acc::zero(), |b| b[j].to_acc());
            out[row * m + before + j] = T::from_acc(v.to_acc() + b);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The guide's claims, checked against hand-computed values.
    use super::*;
    use kernel_core::exec::run_op;
    use kernel_core::{default_pool, OwnedTensor, TensorSpec};

    fn t(v: &[f64], shape: &[usize]) -> OwnedTensor {
        OwnedTensor::from_vec(v.to_vec(), shape).unwrap()
    }

    fn run(
        op: &str,
        inputs: &[Option<&OwnedTensor>],
        attrs: &[(&str, kernel_core::AttrValue)],
    ) -> Result<Vec<Vec<f64>>> {
        let op = registry().lookup(op)?;
        let a = op.bind_attrs(attrs.iter().cloned())?;
        let views: Vec<_> = inputs.iter().map(|t| t.map(|t| t.view())).collect();
        let out = run_op(op, &views, &a, default_pool())?;
        Ok(out.iter().map(|o| o.to_vec::<f64>().unwrap()).collect())
    }

    #[test]
    fn leaky_relu_scaled_and_its_backward_see_the_attributes() {
        use kernel_core::AttrValue::Float;
        let x = t(&[-2.0, 0.5, 3.0], &[3]);
        let y = run(
            "leaky_relu_scaled",
            &[Some(&x)],
            &[("slope", Float(0.1)), ("scale", Float(2.0))],
        )
        .unwrap();
        assert_eq!(y[0], vec![-0.4, 1.0, 6.0]);
        let y = run("leaky_relu_scaled", &[Some(&x)], &[]).unwrap(); // defaults 0.01, 1.0
        assert_eq!(y[0], vec![-0.02, 0.5, 3.0]);
        // the backward op is called with the forward's attributes by name
        let op = registry().lookup("leaky_relu_scaled").unwrap();
        assert_eq!(op.backward.unwrap().op, "leaky_relu_scaled_backward");
        let g = t(&[1.0, 1.0, 10.0], &[3]);
        let dx = run(
            "leaky_relu_scaled_backward",
            &[Some(&g), Some(&x)],
            &[("slope", Float(0.1)), ("scale", Float(2.0))],
        )
        .unwrap();
        assert_eq!(dx[0], vec![0.2, 2.0, 20.0]);
    }

    #[test]
    fn minmax_reduces_a_strided_view_along_any_axis() {
        let x = t(&[1.0, 5.0, -2.0, 4.0, 0.0, 7.0], &[2, 3]);
        let both = run("minmax", &[Some(&x)], &[]).unwrap(); // axis -1
        assert_eq!(both, vec![vec![-2.0, 0.0], vec![5.0, 7.0]]);
        let both = run(
            "minmax",
            &[Some(&x)],
            &[("axis", kernel_core::AttrValue::Int(0))],
        )
        .unwrap();
        assert_eq!(both, vec![vec![1.0, 0.0, -2.0], vec![4.0, 5.0, 7.0]]);
        // a transposed view (strides [1, 3]: rows [1, 4], [5, 0], [-2, 7]) is read correctly
        let xt = x.view().restrided(vec![3, 2], vec![1, 3]);
        let op = registry().lookup("minmax").unwrap();
        let a = op.bind_attrs([]).unwrap();
        let out = run_op(op, &[Some(xt)], &a, default_pool()).unwrap();
        assert_eq!(out[0].to_vec::<f64>().unwrap(), vec![1.0, 0.0, -2.0]);
        assert_eq!(out[1].to_vec::<f64>().unwrap(), vec![4.0, 5.0, 7.0]);
        // shape inference depends on the attribute; a bad axis is an error naming the op
        let spec = Some(TensorSpec::with_dims(
            DType::F32,
            vec![Dim::sym("b"), Dim::Known(3)],
        ));
        let s = op.infer(std::slice::from_ref(&spec), &a).unwrap();
        assert_eq!(s[1].shape, Some(vec![Dim::sym("b")]));
        let e = op
            .infer(
                &[spec],
                &op.bind_attrs([("axis", kernel_core::AttrValue::Int(2))])
                    .unwrap(),
            )
            .unwrap_err();
        assert!(e.to_string().starts_with("guide_ops.minmax: axis"), "{e}");
    }

    #[test]
    fn pad_add_with_and_without_its_optional_input() {
        let x = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let b = t(&[10.0, 20.0], &[2]);
        let pads = ("pads", kernel_core::AttrValue::IntList(vec![1, 2]));
        let y = run(
            "pad_add",
            &[Some(&x), Some(&b)],
            std::slice::from_ref(&pads),
        )
        .unwrap();
        assert_eq!(
            y[0],
            vec![0.0, 11.0, 22.0, 0.0, 0.0, 0.0, 13.0, 24.0, 0.0, 0.0]
        );
        let y = run("pad_add", &[Some(&x), None], &[pads]).unwrap();
        assert_eq!(y[0], vec![0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0]);
        // symbolic sizes: `n + 3` out, and the bias tied to n as a constraint
        let op = registry().lookup("pad_add").unwrap();
        let a = op
            .bind_attrs([("pads", kernel_core::AttrValue::IntList(vec![1, 2]))])
            .unwrap();
        let r = op
            .infer_symbolic(
                &[
                    Some(TensorSpec::with_dims(
                        DType::F32,
                        vec![Dim::sym("b"), Dim::sym("n")],
                    )),
                    Some(TensorSpec::with_dims(DType::F32, vec![Dim::sym("m")])),
                ],
                &a,
            )
            .unwrap();
        assert_eq!(r.outputs[0].shape.as_ref().unwrap()[1].to_string(), "n + 3");
        assert_eq!(r.constraints.len(), 1);
    }
}
