//! conv2d (NCHW input, OIHW weight, zero padding, stride; no dilation or groups) and its
//! backward, through im2col + `gemm`.
//!
//! Half types are converted to f32 first (one rounding at the end). Work is split into fixed
//! tasks whose boundaries depend only on the problem size (forward: batch x blocks of output
//! positions; weight gradient: blocks of im2col rows, summing the batch in order; input
//! gradient: batch x input channel), and every `gemm` call runs with `Parallelism::None`, so
//! results do not depend on the thread count.

use crate::common::{in_ptr, with_float, Num, OutPtr, Real, Scalar};
use crate::elementwise::req;
use gemm::{gemm, Parallelism};
use kernel_core::fmt_dims;
use kernel_core::{
    parallel_for, BwdInput, Dim, Error, Factor, InferCtx, KernelCtx, OpDef, Registry, Result,
    ShapeOut, ShardCtx, ShardingRule, TensorRef,
};

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder(
            "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int stride=1, int padding=0) -> Tensor",
        )
        .doc("2-D convolution, NCHW input, OIHW weight, zero padding, no dilation/groups")
        .infer(conv2d_infer)
        .cpu(conv2d_cpu)
        .backward(
            "conv2d_backward",
            &[
                BwdInput::Grad(0),
                BwdInput::Input(0),
                BwdInput::Input(1),
                BwdInput::Input(2),
            ],
            &[0, 1, 2],
        )
        .sharding(conv_sharding)
        .build()?,
    )?;
    r.register(
        OpDef::builder(
            "conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor? bias=None, int stride=1, int padding=0) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)",
        )
        .doc("gradients of conv2d for input, weight and bias (grad_bias is [O] even without a bias)")
        .infer(conv2d_backward_infer)
        .cpu(conv2d_backward_cpu)
        .backward_only()
        .sharding(conv_backward_sharding)
        .build()?,
    )?;
    Ok(())
}

/// conv2d's factors: the batch `n` is split (images are independent); the output channels
/// `o` are split when `groups` is 1 (each output channel reads every input channel); the
/// input channels and the spatial dims (windows overlap) are whole. `tensors` names, per
/// input and then per output, which of `n`, `c`, `o` its first two dims are (`b` for a bias
/// or bias gradient: one dim, `o`). A gradient without `n` (or without `o`) is summed over it,
/// which is what splitting gives (kernel_core::sharding).
fn conv_rule(ctx: &ShardCtx, tensors: &[&str]) -> Result<ShardingRule> {
    let groups = ctx.attrs.int("groups").unwrap_or(1);
    let mut r = ShardingRule::default();
    let n = r.factor(Factor::Split);
    let o = r.factor(if groups == 1 {
        Factor::Split
    } else {
        Factor::Whole
    });
    let c = r.factor(Factor::Whole);
    let ranks: Vec<Option<usize>> = (0..ctx.inputs.len())
        .map(|i| ctx.input_rank(i))
        .chain(ctx.outputs.iter().map(|s| s.rank()))
        .collect();
    let mut maps = Vec::with_capacity(ranks.len());
    for (rank, t) in ranks.into_iter().zip(tensors) {
        maps.push(rank.map(|rank| match (*t, rank) {
            ("b", 1) => vec![o],
            (t, 4) => {
                let head = |ch: u8| match ch {
                    b'n' => n,
                    b'o' => o,
                    _ => c,
                };
                let mut m = vec![head(t.as_bytes()[0]), head(t.as_bytes()[1])];
                m.extend(r.factors(Factor::Whole, 2));
                m
            }
            (_, rank) => r.factors(Factor::Whole, rank),
        }));
    }
    r.outputs = maps.split_off(ctx.inputs.len());
    r.inputs = maps;
    Ok(r)
}

fn conv_sharding(ctx: &ShardCtx) -> Result<ShardingRule> {
    // input, weight, bias -> output
    conv_rule(ctx, &["nc", "oc", "b", "no"])
}

fn conv_backward_sharding(ctx: &ShardCtx) -> Result<ShardingRule> {
    // grad, input, weight, bias -> grad_input, grad_weight, grad_bias
    conv_rule(ctx, &["no", "nc", "oc", "b", "nc", "oc", "b"])
}

/// The output shape of conv2d from (possibly unknown) input/weight/bias dims; validates
/// attributes and shapes.
fn conv_out(ctx: &InferCtx, xi: usize, wi: usize, bi: usize) -> Result<Vec<Dim>> {
    let stride = ctx.attrs.int("stride")?;
    let padding = ctx.attrs.int("padding")?;
    if stride < 1 {
        return Err(Error::invalid(format!("stride must be >= 1, got {stride}")));
    }
    if padding < 0 {
        return Err(Error::invalid(format!(
            "padding must be >= 0, got {padding}"
        )));
    }
    if padding > i32::MAX as i64 || stride > i32::MAX as i64 {
        return Err(Error::invalid(format!(
            "stride={stride} / padding={padding} too large (at most {})",
            i32::MAX
        )));
    }
    let (s, p) = (Dim::Known(stride as usize), padding as usize);
    let unknown = vec![Dim::Unknown; 4];
    let x = ctx.dims(xi).map(<[Dim]>::to_vec);
    let w = ctx.dims(wi).map(<[Dim]>::to_vec);
    if let Some(x) = &x {
        if x.len() != 4 {
            return Err(Error::invalid(format!(
                "input must be 4-D (N, C, H, W), got shape {}",
                fmt_dims(x)
            )));
        }
    }
    if let Some(w) = &w {
        if w.len() != 4 {
            return Err(Error::invalid(format!(
                "weight must be 4-D (O, C, KH, KW), got shape {}",
                fmt_dims(w)
            )));
        }
    }
    let x = x.unwrap_or_else(|| unknown.clone());
    let w = w.unwrap_or(unknown);
    ctx.require_eq(&x[1], &w[1], || {
        format!("input has {} channels but weight expects {}", x[1], w[1])
    })?;
    if let Some(b) = ctx.input_opt(bi).and_then(|b| b.shape.as_deref()) {
        let msg = || {
            let want = match &w[0] {
                Dim::Unknown => "[O]".to_string(),
                o => format!("[{o}]"),
            };
            format!(
                "bias must have shape {want} (the output channels of weight), got {}",
                fmt_dims(b)
            )
        };
        match b {
            [o] => ctx.require_eq(o, &w[0], msg)?,
            _ => return Err(Error::invalid(msg())),
        }
    }
    // Checked arithmetic: a (possibly huge) input dim from a caller's shape spec must not wrap.
    let padded: Vec<Dim> = [2, 3]
        .iter()
        .map(|&i| {
            x[i].add(&Dim::Known(2 * p)).map_err(|_| {
                Error::invalid(format!(
                    "input size {} with padding {p} overflows a 64-bit integer",
                    x[i]
                ))
            })
        })
        .collect::<Result<_>>()?;
    let spatial = |i: usize| -> Result<Dim> {
        let hp = &padded[i - 2];
        ctx.require_le(&w[i], hp, || {
            format!(
                "kernel size {}x{} is larger than the padded input {}x{} (input {}x{} with padding {p})",
                w[2], w[3], padded[0], padded[1], x[2], x[3],
            )
        })?;
        // (H + 2p - kH) // stride + 1
        hp.sub(&w[i])?.floor_div(&s)?.add(&Dim::Known(1))
    };
    Ok(vec![x[0].clone(), w[0].clone(), spatial(2)?, spatial(3)?])
}

fn conv2d_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![Some(conv_out(ctx, 0, 1, 2)?)])
}

fn conv2d_backward_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    let out = conv_out(ctx, 1, 2, 3)?;
    ctx.require_shape(Some(&out), ctx.dims(0), || {
        format!(
            "grad has shape {} but the conv2d output has shape {}",
            fmt_dims(ctx.dims(0).unwrap_or_default()),
            fmt_dims(&out)
        )
    })?;
    let o = ctx
        .dims(2)
        .and_then(|w| w.first().cloned())
        .unwrap_or(Dim::Unknown);
    Ok(vec![
        ctx.input(1).shape.clone(),
        ctx.input(2).shape.clone(),
        Some(vec![o]),
    ])
}

/// Problem geometry.
#[derive(Clone, Copy)]
struct Geom {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    s: usize,
    p: usize,
}

impl Geom {
    /// The geometry of `x` (N, C, H, W) and `wt` (O, C, KH, KW). Checks again what the shape
    /// function checked, in overflow-free arithmetic, because the raw-pointer `gemm` calls rely
    /// on it: the kernels may be called directly, with a `KernelCtx` no inference has seen.
    fn new(x: &TensorRef, wt: &TensorRef, s: usize, p: usize) -> Result<Geom> {
        let bad = |why: &str| {
            Err(Error::internal(format!(
                "conv2d: {why} (input {:?}, weight {:?}, stride {s}, padding {p})",
                x.shape, wt.shape
            )))
        };
        let (&[n, c, h, w], &[o, wc, kh, kw]) = (x.shape.as_slice(), wt.shape.as_slice()) else {
            return bad("input and weight must be 4-D");
        };
        if wc != c || s == 0 {
            return bad("channel mismatch or zero stride");
        }
        let out_len = |len: usize, k: usize| {
            p.checked_mul(2)
                .and_then(|pp| len.checked_add(pp))
                .and_then(|v| v.checked_sub(k))
                .map(|v| v / s + 1)
        };
        let (Some(oh), Some(ow)) = (out_len(h, kh), out_len(w, kw)) else {
            return bad("kernel larger than the padded input, or sizes overflow");
        };
        let g = Geom {
            n,
            c,
            h,
            w,
            o,
            kh,
            kw,
            oh,
            ow,
            s,
            p,
        };
        // every product the kernels form (0 when a factor is 0) must fit in usize
        let fits = |d: &[usize]| {
            d.contains(&0)
                || d.iter()
                    .try_fold(1usize, |a, &v| a.checked_mul(v))
                    .is_some()
        };
        let products: [&[usize]; 6] = [
            &[n, c, h, w],
            &[o, c, kh, kw],
            &[n, o, oh, ow],
            &[c, kh, kw],
            &[kh, kw, oh, ow],
            &[c, kh, kw, oh, ow],
        ];
        if !products.into_iter().all(fits) {
            return bad("sizes overflow");
        }
        Ok(g)
    }
    /// Err unless a buffer that the `gemm` calls read or write has the length the geometry
    /// gives it.
    fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
        if got != want {
            return Err(Error::internal(format!(
                "conv2d: {what} has {got} elements, the geometry needs {want}"
            )));
        }
        Ok(())
    }
    /// Output positions per image.
    fn positions(&self) -> usize {
        self.oh * self.ow
    }
    /// im2col rows: C * KH * KW.
    fn ckk(&self) -> usize {
        self.c * self.kh * self.kw
    }

    /// Fill `col` (`rows.len() x (p1 - p0)`, row-major) with im2col rows `rows` of image `img`
    /// for output positions `p0..p1`.
    fn im2col<C: Num>(
        &self,
        x: &[C],
        img: usize,
        rows: std::ops::Range<usize>,
        p0: usize,
        p1: usize,
        col: &mut [C],
    ) {
        let width = p1 - p0;
        let kk = self.kh * self.kw;
        let plane = self.h * self.w;
        let (s, pad, w) = (self.s, self.p, self.w);
        for (ri, r) in rows.enumerate() {
            let (ch, ki, kj) = (r / kk, (r % kk) / self.kw, r % self.kw);
            let src = &x[(img * self.c + ch) * plane..(img * self.c + ch + 1) * plane];
            let dst = &mut col[ri * width..(ri + 1) * width];
            // output columns whose input column ow * s + kj - pad is inside [0, w)
            let ow_lo = if kj >= pad { 0 } else { (pad - kj).div_ceil(s) };
            let ow_hi = if w + pad <= kj {
                0
            } else {
                (w + pad - kj).div_ceil(s)
            };
            let mut p = p0;
            while p < p1 {
                // one output row's segment [ow0, ow1) of positions
                let (oh, ow0) = (p / self.ow, p % self.ow);
                let ow1 = self.ow.min(ow0 + (p1 - p));
                let seg = &mut dst[p - p0..p - p0 + (ow1 - ow0)];
                let ih = (oh * s + ki) as isize - pad as isize;
                if ih < 0 || ih as usize >= self.h {
                    seg.fill(C::ZERO);
                } else {
                    let row = &src[ih as usize * w..(ih as usize + 1) * w];
                    let lo = ow_lo.clamp(ow0, ow1);
                    let hi = ow_hi.clamp(lo, ow1);
                    seg[..lo - ow0].fill(C::ZERO);
                    seg[hi - ow0..].fill(C::ZERO);
                    let out = &mut seg[lo - ow0..hi - ow0];
                    if hi > lo {
                        let first = lo * s + kj - pad;
                        if s == 1 {
                            out.copy_from_slice(&row[first..first + (hi - lo)]);
                        } else {
                            for (j, d) in out.iter_mut().enumerate() {
                                *d = row[first + j * s];
                            }
                        }
                    }
                }
                p += ow1 - ow0;
            }
        }
    }
}

/// A tensor's values in row-major order, in the compute type.
fn to_c<T: Scalar>(t: &TensorRef) -> Result<Vec<T::C>> {
    let v = t.contiguous::<T>()?;
    let mut out = vec![T::C::ZERO; v.len()];
    T::load(&v, &mut out);
    Ok(out)
}

/// `dst (m x n) = [dst +] lhs (m x k) * rhs (k x n)`, strides in elements (row stride, column
/// stride), single-threaded.
///
/// # Safety
/// `dst + i * dst_rs + j * dst_cs` must be valid for reads and writes for every `i < m`,
/// `j < n`, `lhs` for reads at every (`i < m`, `l < k`), `rhs` at every (`l < k`, `j < n`),
/// all initialised; no other thread may access the dst elements meanwhile, and dst must not
/// overlap lhs or rhs.
#[allow(clippy::too_many_arguments)]
unsafe fn mm<C: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut C,
    dst_rs: isize,
    dst_cs: isize,
    accumulate: bool,
    lhs: *const C,
    lhs_rs: isize,
    lhs_cs: isize,
    rhs: *const C,
    rhs_rs: isize,
    rhs_cs: isize,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    // SAFETY: `gemm` reads and writes exactly the m x n / m x k / k x n strided elements that
    // the caller guarantees valid and unaliased (its arguments take column stride before row
    // stride, as passed here); `Parallelism::None` keeps it on this thread.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst,
            dst_cs,
            dst_rs,
            accumulate,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            C::ONE,
            C::ONE,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

/// Output positions per forward task.
fn pos_block(ckk: usize) -> usize {
    ((1usize << 16) / ckk.max(1)).clamp(64, 1024)
}

fn conv2d_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let (x, wt) = (req(inputs, 0)?, req(inputs, 1)?);
    let bias = inputs.get(2).and_then(Option::as_ref);
    let s = ctx.attrs.int("stride")? as usize;
    let p = ctx.attrs.int("padding")? as usize;
    let g = Geom::new(x, wt, s, p)?;
    in_ptr::<T>(x)?;
    let out = ctx.outputs[0].as_mut_slice::<T>()?;
    if out.is_empty() {
        return Ok(());
    }
    let xc = to_c::<T>(x)?;
    let wc = to_c::<T>(wt)?;
    let bc = match bias {
        Some(b) => to_c::<T>(b)?,
        None => vec![T::C::ZERO; g.o],
    };
    let (ckk, pos) = (g.ckk(), g.positions());
    // the lengths the raw writes and `gemm` reads below rely on (`wc` is [O, C*KH*KW] by
    // construction of `g` from the weight's shape)
    Geom::check_len("output", out.len(), g.n * g.o * pos)?;
    Geom::check_len("bias", bc.len(), g.o)?;
    let mut res = vec![T::C::ZERO; out.len()];
    let rp = OutPtr(res.as_mut_ptr());
    let pb = pos_block(ckk);
    let blocks = pos.div_ceil(pb);
    parallel_for(pool, g.n * blocks, 1, |range| {
        let mut col = vec![T::C::ZERO; ckk * pb];
        for t in range {
            let (img, b) = (t / blocks, t % blocks);
            let (p0, p1) = (b * pb, ((b + 1) * pb).min(pos));
            let width = p1 - p0;
            g.im2col(&xc, img, 0..ckk, p0, p1, &mut col[..ckk * width]);
            // SAFETY: `res` has `n * o * pos` elements (checked above) and `img < n`,
            // `p0 < pos`, so the offset is inside it.
            let dst = unsafe { rp.ptr().add(img * g.o * pos + p0) };
            for (oc, &bv) in bc.iter().enumerate() {
                for j in 0..width {
                    // SAFETY: `oc < o` (bias has o elements, checked above) and `p0 + j < p1
                    // <= pos`: element [img, oc, p0 + j] of `res`, in the block of positions
                    // p0..p1 of image img, which task `t` alone writes.
                    unsafe { *dst.add(oc * pos + j) = bv };
                }
            }
            // SAFETY: dst is the o x width block [img, :, p0..p1] of `res` (row stride pos),
            // in bounds and this task's alone, as above; lhs is the o x ckk weight `wc`
            // (o * ckk elements: it is the weight's values and `g` came from its shape); rhs
            // is the task-local `col`, ckk x width, just filled. dst aliases neither.
            unsafe {
                mm(
                    g.o,
                    width,
                    ckk,
                    dst,
                    pos as isize,
                    1,
                    true,
                    wc.as_ptr(),
                    ckk as isize,
                    1,
                    col.as_ptr(),
                    width as isize,
                    1,
                )
            };
        }
    });
    T::store(&res, out);
    Ok(())
}

fn conv2d_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => conv2d_k::<T>(ctx))
}

fn conv2d_backward_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let (gr, x, wt) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    let s = ctx.attrs.int("stride")? as usize;
    let p = ctx.attrs.int("padding")? as usize;
    let g = Geom::new(x, wt, s, p)?;
    in_ptr::<T>(gr)?;
    let gc = to_c::<T>(gr)?;
    let xc = to_c::<T>(x)?;
    let wc = to_c::<T>(wt)?;
    let (ckk, pos, kk) = (g.ckk(), g.positions(), g.kh * g.kw);
    // the length the `gemm` reads of the gradient rely on (`wc` has o * ckk elements by
    // construction of `g` from the weight's shape)
    Geom::check_len("grad", gc.len(), g.n * g.o * pos)?;

    // grad_bias[o] = sum over images and positions, in order
    let mut gb = vec![T::C::ZERO; g.o];
    {
        let bp = OutPtr(gb.as_mut_ptr());
        parallel_for(
            pool,
            g.o,
            (crate::common::GRAIN / (g.n * pos).max(1)).max(1),
            |range| {
                for oc in range {
                    let mut acc = T::C::ZERO;
                    for img in 0..g.n {
                        for &v in &gc[(img * g.o + oc) * pos..(img * g.o + oc + 1) * pos] {
                            acc = acc + v;
                        }
                    }
                    // SAFETY: `oc` is in this task's range within `0..o`, the length of `gb`;
                    // `parallel_for` ranges are disjoint.
                    unsafe { bp.write(oc as isize, acc) };
                }
            },
        );
    }

    // grad_weight [O, CKK] = sum_img grad[img] (O x P) * col[img]^T (P x CKK)
    let mut gw = vec![T::C::ZERO; g.o * ckk];
    {
        let wp = OutPtr(gw.as_mut_ptr());
        let rb = 16usize;
        let row_blocks = ckk.div_ceil(rb);
        parallel_for(pool, row_blocks, 1, |range| {
            let mut col = vec![T::C::ZERO; rb * pos];
            for b in range {
                let (r0, r1) = (b * rb, ((b + 1) * rb).min(ckk));
                let rows = r1 - r0;
                for img in 0..g.n {
                    g.im2col(&xc, img, r0..r1, 0, pos, &mut col[..rows * pos]);
                    // SAFETY: dst is the o x rows block [:, r0..r1] of `gw` (o * ckk elements,
                    // row stride ckk, r1 <= ckk), written only by the task of row block `b`;
                    // lhs is grad[img], o x pos inside `gc` (n * o * pos elements, checked
                    // above); rhs is the task-local `col` (rows * pos), read transposed. No
                    // operand aliases dst.
                    unsafe {
                        mm(
                            g.o,
                            rows,
                            pos,
                            wp.ptr().add(r0),
                            ckk as isize,
                            1,
                            true,
                            gc.as_ptr().add(img * g.o * pos),
                            pos as isize,
                            1,
                            col.as_ptr(),
                            1,
                            pos as isize,
                        )
                    };
                }
            }
        });
    }

    // grad_input[img, c] = col2im(W[:, c]^T (KK x O) * grad[img] (O x P))
    let mut gi = vec![T::C::ZERO; g.n * g.c * g.h * g.w];
    {
        let ip = OutPtr(gi.as_mut_ptr());
        let plane = g.h * g.w;
        parallel_for(pool, g.n * g.c, 1, |range| {
            let mut dcol = vec![T::C::ZERO; kk * pos];
            for t in range {
                let (img, ch) = (t / g.c, t % g.c);
                if kk == 0 || pos == 0 {
                    continue;
                }
                dcol.fill(T::C::ZERO);
                // SAFETY: dst is the task-local `dcol`, kk x pos; lhs is W[:, ch]^T, kk x o
                // with column stride ckk, whose last element ch*kk + kk-1 + (o-1)*ckk is
                // below o * ckk = wc.len(); rhs is grad[img], o x pos inside `gc` (checked
                // above). dst aliases neither.
                unsafe {
                    mm(
                        kk,
                        pos,
                        g.o,
                        dcol.as_mut_ptr(),
                        pos as isize,
                        1,
                        false,
                        wc.as_ptr().add(ch * kk),
                        1,
                        ckk as isize,
                        gc.as_ptr().add(img * g.o * pos),
                        pos as isize,
                        1,
                    )
                };
                // SAFETY: plane (img, ch) of `gi` (n * c * plane elements), with `img < n`,
                // `ch < c`; task `t` alone handles it.
                let dst = unsafe { ip.slice((img * g.c + ch) * plane, plane) };
                for i in 0..kk {
                    let (ki, kj) = (i / g.kw, i % g.kw);
                    for oh in 0..g.oh {
                        let ih = (oh * g.s + ki) as isize - g.p as isize;
                        if ih < 0 || ih as usize >= g.h {
                            continue;
                        }
                        for ow in 0..g.ow {
                            let iw = (ow * g.s + kj) as isize - g.p as isize;
                            if iw < 0 || iw as usize >= g.w {
                                continue;
                            }
                            let d = &mut dst[ih as usize * g.w + iw as usize];
                            *d = *d + dcol[i * pos + oh * g.ow + ow];
                        }
                    }
                }
            }
        });
    }

    let (o0, rest) = ctx.outputs.split_at_mut(1);
    let (o1, o2) = rest.split_at_mut(1);
    T::store(&gi, o0[0].as_mut_slice::<T>()?);
    T::store(&gw, o1[0].as_mut_slice::<T>()?);
    T::store(&gb, o2[0].as_mut_slice::<T>()?);
    Ok(())
}

fn conv2d_backward_cpu(ctx: &mut KernelCtx) -> Result<()> {
    with_float!(ctx.input(0).dtype, T => conv2d_backward_k::<T>(ctx))
}
