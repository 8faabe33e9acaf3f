//! Unary and binary elementwise ops: negate, add, scale, relu, relu_, add_relu, gelu, and their
//! backward ops.
//!
//! Every kernel goes through [`zip_map`]: inputs are read through their strides (broadcast dims
//! have stride 0), dims that are contiguous in every operand are merged so a same-shape
//! contiguous add is one flat loop, work is split into fixed chunks of [`GRAIN`] elements, and
//! half types are converted a block at a time to f32 (computed there, rounded once).
//! Integer negate/add wrap on overflow.

use crate::common::{
    half_quiet_bit, in_ptr, out_ptr, prefetch_ahead, with_float, with_numeric, with_simd, zip_map,
    InPtr, Num, Real, Scalar, GRAIN,
};
use kernel_core::{
    broadcast_dims, fmt_dims, numel, parallel_for, AttrValue, BwdInput, DType, EpilogueFn, Error,
    InferCtx, KernelCtx, OnnxOp, OpDef, OwnedTensor, Registry, Result, ShapeOut, ShardCtx,
    ShardingRule, TensorMut, TensorRef, ThreadPool,
};

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder("negate(Tensor x) -> Tensor")
            .doc("-x (integers wrap on overflow)")
            .dtypes(DType::NUMERIC)
            .infer(same_shape)
            .cpu(negate_cpu)
            .backward("negate", &[BwdInput::Grad(0)], &[0])
            .onnx(OnnxOp::new("Neg", &[6, 13]))
            .sharding(ShardingRule::broadcast)
            .build()?,
    )?;
    r.register(
        OpDef::builder("add(Tensor x, Tensor y) -> Tensor")
            .doc("x + y with NumPy broadcasting (integers wrap on overflow)")
            .dtypes(DType::NUMERIC)
            .infer(broadcast_infer)
            .cpu(add_cpu)
            .epilogue(EpilogueFn::Binary(add_in_place))
            // (Add-7 on: NumPy broadcasting; Sum-8 on, with exactly two inputs)
            .onnx(OnnxOp::new("Add", &[7, 13, 14]))
            .onnx(OnnxOp::new("Sum", &[8, 13]))
            .backward(
                "add_backward",
                &[BwdInput::Grad(0), BwdInput::Input(0), BwdInput::Input(1)],
                &[0, 1],
            )
            .sharding(ShardingRule::broadcast)
            .build()?,
    )?;
    r.register(
        OpDef::builder(
            "add_backward(Tensor grad, Tensor x, Tensor y) -> (Tensor grad_x, Tensor grad_y)",
        )
        .doc("gradients of add: grad summed over the broadcast dims of x and of y")
        .dtypes(DType::NUMERIC)
        .infer(add_backward_infer)
        .cpu(add_backward_cpu)
        .backward_only()
        .sharding(broadcast_backward)
        .build()?,
    )?;
    r.register(
        OpDef::builder("scale(Tensor x, float alpha) -> Tensor")
            .doc("x * alpha (alpha rounded to the compute type: f32 for half types and f32)")
            .dtypes(DType::FLOAT)
            .infer(same_shape)
            .cpu(scale_cpu)
            .backward("scale", &[BwdInput::Grad(0)], &[0])
            .sharding(ShardingRule::broadcast)
            .build()?,
    )?;
    r.register(
        OpDef::builder("relu(Tensor x) -> Tensor")
            .doc("max(x, 0); NaN stays NaN")
            .dtypes(DType::NUMERIC)
            .infer(same_shape)
            .cpu(relu_cpu)
            .epilogue(EpilogueFn::Unary(relu_in_place))
            .onnx(OnnxOp::new("Relu", &[6, 13, 14]))
            .backward(
                "relu_backward",
                &[BwdInput::Grad(0), BwdInput::Input(0)],
                &[0],
            )
            .sharding(ShardingRule::broadcast)
            .build()?,
    )?;
    r.register(
        OpDef::builder("relu_backward(Tensor grad, Tensor x) -> Tensor")
            .doc("grad where x > 0, else 0 (NaN x gives 0)")
            .dtypes(DType::NUMERIC)
            .infer(relu_backward_infer)
            .cpu(relu_backward_cpu)
            .backward_only()
            .sharding(ShardingRule::broadcast)
            .build()?,
    )?;
    r.register(
        OpDef::builder("relu_(Tensor(a!) x) -> Tensor(a!)")
            .doc("in-place relu (torch surface; elsewhere use relu)")
            .dtypes(DType::NUMERIC)
            .infer(same_shape)
            .cpu(relu_cpu)
            .inplace()
            .sharding(ShardingRule::broadcast)
            .build()?,
    )?;
    r.register(
        OpDef::builder("add_relu(Tensor x, Tensor y) -> Tensor")
            .doc("fused max(x + y, 0) with NumPy broadcasting")
            .dtypes(DType::NUMERIC)
            .infer(broadcast_infer)
            .cpu(add_relu_cpu)
            .backward(
                "add_relu_backward",
                &[BwdInput::Grad(0), BwdInput::Input(0), BwdInput::Input(1)],
                &[0, 1],
            )
            .sharding(ShardingRule::broadcast)
            .build()?,
    )?;
    r.register(
        OpDef::builder(
            "add_relu_backward(Tensor grad, Tensor x, Tensor y) -> (Tensor grad_x, Tensor grad_y)",
        )
        .doc("gradients of add_relu: grad where x + y > 0, summed over broadcast dims")
        .dtypes(DType::NUMERIC)
        .infer(add_backward_infer)
        .cpu(add_relu_backward_cpu)
        .backward_only()
        .sharding(broadcast_backward)
        .build()?,
    )?;
    r.register(
        OpDef::builder("gelu(Tensor x, str approximate=\"none\") -> Tensor")
            .doc("\"none\": 0.5x(1+erf(x/sqrt 2)); \"tanh\": 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))")
            .dtypes(DType::FLOAT)
            .infer(gelu_infer)
            .cpu(gelu_cpu)
            .onnx(OnnxOp::new("Gelu", &[20]).attr_default(
                "approximate",
                "approximate",
                AttrValue::Str("none".into()),
            ))
            .backward(
                "gelu_backward",
                &[BwdInput::Grad(0), BwdInput::Input(0)],
                &[0],
            )
            .sharding(ShardingRule::broadcast)
            .build()?,
    )?;
    r.register(
        OpDef::builder("gelu_backward(Tensor grad, Tensor x, str approximate=\"none\") -> Tensor")
            .doc("grad * gelu'(x)")
            .dtypes(DType::FLOAT)
            .infer(gelu_backward_infer)
            .cpu(gelu_backward_cpu)
            .backward_only()
            .sharding(ShardingRule::broadcast)
            .build()?,
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// shape functions

/// Output 0 has the shape of input 0.
pub fn same_shape(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![ctx.input(0).shape.clone()])
}

fn broadcast_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![broadcast_dims(ctx.dims(0), ctx.dims(1))?])
}

fn add_backward_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    let b = broadcast_dims(ctx.dims(1), ctx.dims(2))?;
    ctx.require_shape(b.as_deref(), ctx.dims(0), || {
        format!(
            "grad has shape {} but x and y broadcast to {}",
            fmt_dims(ctx.dims(0).unwrap_or_default()),
            fmt_dims(b.as_deref().unwrap_or_default())
        )
    })?;
    Ok(vec![ctx.input(1).shape.clone(), ctx.input(2).shape.clone()])
}

/// The backward of a broadcasting binary op: `grad` (input 0) has the broadcast shape; each
/// gradient has its input's factors, so the dims an input broadcast along are summed over
/// (a partial sum per shard when split, see `kernel_core::sharding`).
fn broadcast_backward(ctx: &ShardCtx) -> Result<ShardingRule> {
    let Some(full) = ctx.inputs[0].as_ref().and_then(|g| g.shape.as_deref()) else {
        return Ok(ShardingRule::replicated(ctx));
    };
    let mut r = ShardingRule::broadcast_over(ctx, full);
    r.outputs = vec![r.inputs[1].clone(), r.inputs[2].clone()];
    Ok(r)
}

/// `grad` must have the shape of `x` (input 1); the output has x's shape.
fn same_as_x_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    ctx.require_shape(ctx.dims(1), ctx.dims(0), || {
        format!(
            "grad has shape {} but x has shape {}",
            fmt_dims(ctx.dims(0).unwrap_or_default()),
            fmt_dims(ctx.dims(1).unwrap_or_default())
        )
    })?;
    Ok(vec![ctx.input(1).shape.clone()])
}

fn relu_backward_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    same_as_x_infer(ctx)
}

/// Whether gelu's `approximate` is the tanh form; anything but "none"/"tanh" is an error.
fn gelu_mode(ctx_attrs: &kernel_core::Attrs) -> Result<bool> {
    match ctx_attrs.str("approximate")? {
        "none" => Ok(false),
        "tanh" => Ok(true),
        other => Err(Error::invalid(format!(
            "approximate must be \"none\" or \"tanh\", got \"{other}\""
        ))),
    }
}

fn gelu_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    gelu_mode(ctx.attrs)?;
    same_shape(ctx)
}

fn gelu_backward_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    gelu_mode(ctx.attrs)?;
    same_as_x_infer(ctx)
}

// ---------------------------------------------------------------------------------------------
// kernels

/// Required input `i` (the op's arity was validated before the kernel runs).
pub(crate) fn req<'a, 'b>(
    inputs: &'b [Option<TensorRef<'a>>],
    i: usize,
) -> Result<&'b TensorRef<'a>> {
    inputs
        .get(i)
        .and_then(Option::as_ref)
        .ok_or_else(|| Error::internal(format!("missing input {i}")))
}

/// Apply `f` elementwise from input 0 into output 0 (kept for external callers of the old
/// helper; every stock kernel uses [`zip_map`]).
pub fn unary_map<T: Scalar>(ctx: &mut KernelCtx, f: impl Fn(T::C) -> T::C + Sync) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    zip_map::<T, 1>(pool, [req(inputs, 0)?], &mut ctx.outputs[0], |[a]| f(a))
}

fn negate_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => {
        // a 16-bit float: the sign flipped, a NaN quieted (what the f32 round trip gives)
        if half_bits_map::<T>(ctx, |h, inf| {
            let quiet = if h & 0x7FFF > inf { half_quiet_bit(inf) } else { 0 };
            (h ^ 0x8000) | quiet
        })? {
            return Ok(());
        }
        unary_map::<T>(ctx, |v| v.neg())
    })
}

#[inline(always)]
pub(crate) fn relu_c<C: Num>(v: C) -> C {
    // NaN < 0 is false, so NaN stays NaN.
    if v < C::ZERO {
        C::ZERO
    } else {
        v
    }
}

/// add as an epilogue ([`EpilogueFn`]): `out + other` (or `other + out`) per value, the f32
/// kernel's bits (the operands in the node's order, so even a NaN's payload is the same).
/// (Inside `with_simd`: a kernel calls an epilogue through a function pointer, so its loop is
/// compiled here, on its own, and was baseline SSE2 code without it.)
// (clippy takes `a + b` and `b + a` for the same; with two NaNs, x86 returns the first one's)
#[allow(clippy::if_same_then_else)]
fn add_in_place(out: &mut [f32], other: &[f32], out_first: bool) {
    with_simd(
        #[inline(always)]
        || {
            for (o, &b) in out.iter_mut().zip(other) {
                *o = if out_first { *o + b } else { b + *o };
            }
        },
    )
}

/// Whether the chain `epi` starts with relu, and the rest of it (None where nothing is left):
/// for a kernel that applies relu to values in registers as it stores them (`relu_c`'s bits:
/// `max(0, v)` with 0 as the first operand, so a NaN and -0 stay) and runs only the rest.
pub(crate) fn split_leading_relu<'s, 't>(
    epi: Option<&'s [kernel_core::Epilogue<'t>]>,
) -> (bool, Option<&'s [kernel_core::Epilogue<'t>]>) {
    let Some(steps) = epi else {
        return (false, None);
    };
    let (relu, rest) = match steps.split_first() {
        Some((kernel_core::Epilogue::Unary(f), rest))
            if std::ptr::fn_addr_eq(*f, relu_in_place as fn(&mut [f32])) =>
        {
            (true, rest)
        }
        _ => (false, steps),
    };
    (relu, Some(rest).filter(|r| !r.is_empty()))
}

/// relu as an epilogue ([`EpilogueFn`]): `relu_c` on each value, the f32 kernel's bits
/// (inside `with_simd`, as [`add_in_place`]).
fn relu_in_place(v: &mut [f32]) {
    with_simd(
        #[inline(always)]
        || {
            for x in v.iter_mut() {
                *x = relu_c(*x);
            }
        },
    )
}

fn relu_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => {
        // a 16-bit float: as `relu_c` through f32 (a negative value but -0 becomes +0, a NaN
        // comes back quiet)
        if half_bits_map::<T>(ctx, |h, inf| {
            let a = h & 0x7FFF;
            if a > inf {
                h | half_quiet_bit(inf)
            } else if h & 0x8000 != 0 && a != 0 {
                0
            } else {
                h
            }
        })? {
            return Ok(());
        }
        unary_map::<T>(ctx, relu_c)
    })
}

/// For a 16-bit float type (f16, bf16) with a contiguous input of the output's shape: `out =
/// f(bits, bits of +inf)` on the storage bits, 16 to a vector, no conversion, and true; false
/// (nothing done) otherwise. `f` must give exactly the bits of the op computed in f32 (the
/// tests compare it with the converting path for every one of the 65536 bit patterns).
/// Blocks are copied to the stack before being written, as in [`unary_blocks`].
fn half_bits_map<T: Scalar>(
    ctx: &mut KernelCtx,
    f: impl Fn(u16, u16) -> u16 + Sync,
) -> Result<bool> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let x = req(inputs, 0)?;
    let out = &mut ctx.outputs[0];
    if T::as_half_bits(&[]).is_none() || !x.is_contiguous() || x.shape != out.shape {
        return Ok(false);
    }
    let n = numel(&out.shape);
    let (p, o) = (in_ptr::<T>(x)?, out_ptr::<T>(out)?);
    parallel_for(pool, n, GRAIN, |range| {
        let p: InPtr<T> = p;
        with_simd(
            #[inline(always)]
            || {
                let mut a = [0u16; UBLOCK];
                let mut i = range.start;
                while i < range.end {
                    let len = UBLOCK.min(range.end - i);
                    prefetch_ahead(p.0, i, len, range.end);
                    prefetch_ahead(o.0 as *const T, i, len, range.end);
                    // SAFETY: as in `unary_blocks`: x is contiguous with the output's `n`
                    // elements, `i..i + len` is in this task's range, and the input slice is
                    // dropped (copied into `a`) before the output block is written.
                    let src = unsafe { std::slice::from_raw_parts(p.0.add(i), len) };
                    let bits = T::as_half_bits(src).unwrap_or(&[]);
                    a[..bits.len()].copy_from_slice(bits);
                    // SAFETY: the output is contiguous with `n` elements and `i..i + len` is
                    // this task's alone (`parallel_for` ranges are disjoint).
                    let dst = unsafe { o.slice(i, len) };
                    if let Some(d) = T::as_half_bits_mut(dst) {
                        for (d, &h) in d.iter_mut().zip(&a[..len]) {
                            *d = f(h, T::HALF_INF);
                        }
                    }
                    i += len;
                }
            },
        )
    });
    Ok(true)
}

fn binary<T: Scalar>(ctx: &mut KernelCtx, f: impl Fn(T::C, T::C) -> T::C + Sync) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    zip_map::<T, 2>(
        pool,
        [req(inputs, 0)?, req(inputs, 1)?],
        &mut ctx.outputs[0],
        |[a, b]| f(a, b),
    )
}

fn add_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => binary::<T>(ctx, |a, b| a.add(b)))
}

fn add_relu_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => binary::<T>(ctx, |a, b| relu_c(a.add(b))))
}

fn scale_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let alpha = T::C::from_f64(ctx.attrs.float("alpha")?);
    unary_map::<T>(ctx, move |v| v * alpha)
}

fn scale_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => scale_k::<T>(ctx))
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044715;

/// gelu of one element; `narrow`: to a 16-bit float result's precision ([`Scalar::NARROW`]).
#[inline(always)]
fn gelu_c<C: Real>(x: C, tanh: bool, narrow: bool) -> C {
    // both forms avoid the cancellation of 1 + erf / 1 + tanh in the negative tail, which
    // lost every digit of gelu's tiny negative values (issue 23); see `Real::gelu_tanh`
    match (tanh, narrow) {
        (true, false) => x.gelu_tanh(),
        (true, true) => x.gelu_tanh_narrow(),
        (false, false) => x.gelu_erf(),
        (false, true) => x.gelu_erf_narrow(),
    }
}

/// `(s, s (1 - s))` for `s = 1 / (1 + e^(-2u))`, from `e = e^(-2|u|)` in (0, 1]:
/// `s = 1 / (1 + e)` (u >= 0) or `e / (1 + e)` (u < 0), `s (1 - s) = e / (1 + e)^2`.
#[inline(always)]
fn gelu_tanh_parts<C: Real>(u: C) -> (C, C) {
    let e = (-(u + u).abs()).exp_v();
    let d = C::ONE + e;
    let s = if u >= C::ZERO { C::ONE / d } else { e / d };
    (s, e / (d * d))
}

#[inline(always)]
fn gelu_grad_c<C: Real>(x: C, tanh: bool) -> C {
    if tanh {
        // d/dx 0.5 x (1 + tanh u) = s + 0.5 x (1 - tanh^2 u) u', with (1 + tanh u) / 2 = s and
        // 1 - tanh^2 u = 4 s (1 - s) (see gelu_c for s and the cancellation this avoids).
        let k = C::from_f64(SQRT_2_OVER_PI);
        let c = C::from_f64(GELU_C);
        let x2 = x * x;
        let (s, s1s) = gelu_tanh_parts(k * (x + c * x2 * x));
        s + C::from_f64(2.0) * x * s1s * k * (C::ONE + C::from_f64(3.0) * c * x2)
    } else {
        x.gelu_erf_grad()
    }
}

fn gelu_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let tanh = gelu_mode(ctx.attrs)?;
    if tanh {
        unary_blocks::<T>(
            ctx,
            |v| gelu_c(v, true, T::NARROW),
            // (a closure inlined into `with_simd`'s body: passed as a bare function path it was
            // compiled outside it, for the baseline, 35x slower)
            #[allow(clippy::redundant_closure)]
            #[inline(always)]
            |s, d| T::C::gelu_tanh_slice(s, d, T::NARROW),
        )
    } else {
        unary_blocks::<T>(
            ctx,
            |v| gelu_c(v, false, T::NARROW),
            #[allow(clippy::redundant_closure)]
            #[inline(always)]
            |s, d| T::C::gelu_erf_slice(s, d, T::NARROW),
        )
    }
}

/// Elements per block of [`unary_blocks`].
const UBLOCK: usize = 256;

/// `out = f(x)` elementwise, where `fs(src, dst)` maps a whole block and gives exactly `f`'s
/// bits for every element (a slice version with per-chunk fast paths, such as
/// [`Real::gelu_erf_slice`]). A contiguous input goes through `fs` a block at a time (loaded
/// into a buffer first, so an aliasing output and half types are handled as in `zip_map`);
/// any other layout through [`unary_map`] with `f`. Fixed chunks of [`GRAIN`] elements.
fn unary_blocks<T: Scalar>(
    ctx: &mut KernelCtx,
    f: impl Fn(T::C) -> T::C + Sync,
    fs: impl Fn(&[T::C], &mut [T::C]) + Sync,
) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let x = req(inputs, 0)?;
    if !x.is_contiguous() || x.shape != ctx.outputs[0].shape {
        return unary_map::<T>(ctx, f);
    }
    let out = &mut ctx.outputs[0];
    let n = numel(&out.shape);
    let (p, o) = (in_ptr::<T>(x)?, out_ptr::<T>(out)?);
    parallel_for(pool, n, GRAIN, |range| {
        // (the whole `Sync` wrapper, not its raw-pointer field)
        let p: InPtr<T> = p;
        with_simd(
            #[inline(always)]
            || {
                let mut a = [T::C::default(); UBLOCK];
                let mut b = [T::C::default(); UBLOCK];
                let mut i = range.start;
                while i < range.end {
                    let len = UBLOCK.min(range.end - i);
                    prefetch_ahead(p.0, i, len, range.end);
                    prefetch_ahead(o.0 as *const T, i, len, range.end);
                    // SAFETY: x is contiguous with the output's shape (checked above), so its
                    // `n` elements are at `p + 0 .. p + n`; `i..i + len` lies in this task's
                    // `range` within `0..n`. The input slice is dropped after loading, before
                    // the output block (which may alias it) is written.
                    T::load(
                        unsafe { std::slice::from_raw_parts(p.0.add(i), len) },
                        &mut a[..len],
                    );
                    fs(&a[..len], &mut b[..len]);
                    // SAFETY: the output is contiguous (`out_ptr` checked it) with `n`
                    // elements; `parallel_for` gives each task a disjoint `range`, so
                    // `i..i + len` is this task's alone.
                    T::store(&b[..len], unsafe { o.slice(i, len) });
                    i += len;
                }
            },
        )
    });
    Ok(())
}

fn gelu_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => gelu_k::<T>(ctx))
}

fn gelu_backward_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let tanh = gelu_mode(ctx.attrs)?;
    if tanh {
        binary::<T>(ctx, |g, x| g * gelu_grad_c(x, true))
    } else {
        binary::<T>(ctx, |g, x| g * gelu_grad_c(x, false))
    }
}

fn gelu_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => gelu_backward_k::<T>(ctx))
}

fn relu_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    // x > 0 is false for NaN, so a NaN input passes no gradient.
    with_numeric!(ctx.input(0).dtype, T => binary::<T>(ctx, relu_grad_c))
}

#[inline(always)]
fn relu_grad_c<C: Num>(g: C, x: C) -> C {
    if x > C::ZERO {
        g
    } else {
        C::ZERO
    }
}

/// Sum `g` (shape S) into `out`, whose shape broadcasts to S (NumPy rules): every output
/// element is the sum, in row-major order and in the compute type, of the elements of `g` that
/// broadcasting maps to it. Parallel over output elements; each sum is done by one task.
pub(crate) fn reduce_into<T: Scalar>(
    pool: &dyn ThreadPool,
    g: &TensorRef,
    out: &mut TensorMut,
) -> Result<()> {
    let gr = g.rank();
    let os = out.shape.clone();
    if os.len() > gr {
        return Err(Error::internal(
            "reduce target has higher rank than the gradient",
        ));
    }
    let off = gr - os.len();
    // the raw reads below rely on every output dim being g's or a broadcast 1
    if (0..os.len()).any(|d| os[d] != g.shape[off + d] && os[d] != 1) {
        return Err(Error::internal(format!(
            "reduce target shape {os:?} does not broadcast to the gradient's {:?}",
            g.shape
        )));
    }
    // kept dims: the output's (stride 0 where the output dim is a broadcast 1)
    let mut kept_strides = Vec::with_capacity(os.len());
    let mut red_shape = Vec::new();
    let mut red_strides = Vec::new();
    for d in 0..gr {
        let reduced = d < off || (os[d - off] == 1 && g.shape[d] != 1);
        if reduced {
            red_shape.push(g.shape[d]);
            red_strides.push(g.strides[d]);
        }
        if d >= off {
            kept_strides.push(if reduced { 0 } else { g.strides[d] });
        }
    }
    if red_shape.is_empty() {
        // same element count: a strided copy
        let view = g.restrided(os.clone(), kept_strides);
        return zip_map::<T, 1>(pool, [&view], out, |[a]| a);
    }
    let p: InPtr<T> = in_ptr::<T>(g)?;
    let op = out_ptr::<T>(out)?;
    let n_out = numel(&os);
    let n_red = numel(&red_shape);
    let kept = crate::common::Lanes::new(
        &[os.as_slice(), &[1]].concat(),
        &[kept_strides.as_slice(), &[0]].concat(),
        os.len(),
    );
    // offsets of the reduced sub-space, in row-major order (precomputed when small)
    let red_offsets: Option<Vec<isize>> = (n_red <= 1 << 16).then(|| {
        let mut v = Vec::with_capacity(n_red);
        kernel_core::for_each_row(&red_shape, &red_strides, |base, len, st| {
            v.extend((0..len as isize).map(|j| base + j * st));
        });
        v
    });
    let grain = (GRAIN / n_red.max(1)).max(1);
    parallel_for(pool, n_out, grain, |range| {
        for o in range {
            let base = kept.base(o);
            let mut acc = T::C::ZERO;
            match &red_offsets {
                Some(offs) => {
                    for &r in offs {
                        // SAFETY: every output dim is g's or a reduced 1 (checked above), so
                        // `kept.base(o)` for `o < n_out` is an offset of g over its kept dims
                        // (reduced ones have stride 0), and `r` one over its reduced dims: the
                        // sum is an offset g's own shape and strides reach. g is only read.
                        acc = acc.add(unsafe { p.get(base + r) }.to_c());
                    }
                }
                None => kernel_core::for_each_row(&red_shape, &red_strides, |rb, len, st| {
                    for j in 0..len as isize {
                        // SAFETY: as above: `rb + j * st`, `j < len`, is an offset of g over
                        // its reduced dims, from its own shape and strides.
                        acc = acc.add(unsafe { p.get(base + rb + j * st) }.to_c());
                    }
                }),
            }
            // SAFETY: the output is contiguous with `n_out` elements (`out_ptr` checked), `o`
            // is in this task's `range` within `0..n_out`, and ranges are disjoint.
            unsafe { op.write(o as isize, T::from_c(acc)) };
        }
    });
    Ok(())
}

fn add_backward_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let g = req(inputs, 0)?;
    let (gx, gy) = ctx.outputs.split_at_mut(1);
    reduce_into::<T>(pool, g, &mut gx[0])?;
    reduce_into::<T>(pool, g, &mut gy[0])
}

fn add_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => add_backward_k::<T>(ctx))
}

fn add_relu_backward_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let (g, x, y) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    // masked gradient, in grad's (the broadcast) shape
    let mut masked = OwnedTensor::zeros(T::DTYPE, &g.shape);
    {
        let mut mv = masked.view_mut();
        zip_map::<T, 3>(pool, [g, x, y], &mut mv, |[g, x, y]| {
            if x.add(y) > T::C::ZERO {
                g
            } else {
                T::C::ZERO
            }
        })?;
    }
    let mv = masked.view();
    let (gx, gy) = ctx.outputs.split_at_mut(1);
    reduce_into::<T>(pool, &mv, &mut gx[0])?;
    reduce_into::<T>(pool, &mv, &mut gy[0])
}

fn add_relu_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_numeric!(ctx.input(0).dtype, T => add_relu_backward_k::<T>(ctx))
}
