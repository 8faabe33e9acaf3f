//! conv2d (NCHW input, `[O, C/groups, KH, KW]` weight, zero padding per side, per-axis stride
//! and dilation, grouped and depthwise) and its backward.
//!
//! Forward in f32, f16 and bf16 (half types are converted to f32 first and rounded once at the
//! end): layers with kernels larger than 1x1 through a micro-kernel vectorized along output
//! channels ([`cv`]); 1x1 layers as im2col of an L2-sized block of output positions (the input
//! itself where it can be), multiplied by the weights read in place (6 rows at a time) with an
//! AVX2+FMA 6x16 micro-kernel of our own ([`tile_f32`]); each
//! output is one chain of fused multiply-adds from its bias over its kernel rows in order, so
//! results depend on nothing but the inputs (tiling, thread count, SIMD level). Tasks are
//! (image, group, position block). Forward in f64 and the backward: im2col + `gemm`, one GEMM
//! per group, in fixed tasks whose boundaries depend only on the problem size (forward: batch
//! x group x blocks of output positions; weight gradient: group x blocks of im2col rows,
//! summing the batch in order; input gradient: batch x input channel), every `gemm` call with
//! `Parallelism::None`, so results do not depend on the thread count.

mod cv;

use crate::common::{
    copy_short, every_other, in_ptr, prefetch_l2, simd_level, with_float, with_scratch, with_simd,
    LineAligned, Num, OutPtr, Real, Scalar, SimdLevel,
};
use crate::elementwise::{relu_c, req, split_leading_relu};
use gemm::{gemm, Parallelism};
use half::{bf16, f16};
use kernel_core::fmt_dims;
use kernel_core::{
    parallel_for, ArgType, AttrValue, Attrs, BwdInput, DType, Dim, Epilogue, Error, Factor,
    InferCtx, KernelCtx, OnnxNode, OnnxOp, OpDef, Registry, Result, ShapeOut, ShardCtx,
    ShardingRule, TensorRef, TensorSpec,
};

pub fn register(r: &mut Registry) -> Result<()> {
    r.register(
        OpDef::builder(
            "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[] padding=0, int[2] dilation=1, int groups=1) -> Tensor",
        )
        .doc("2-D convolution: NCHW input, weight [O, C/groups, kH, kW], zero padding (one int, [height, width] or [top, left, bottom, right]), per-axis stride and dilation, grouped and depthwise")
        .infer(conv2d_infer)
        .cpu(conv2d_cpu)
        .prepack(conv2d_prepack)
        .applies_epilogue()
        // 2-D Conv: `pads` is [top, left, bottom, right] like polyop's four-int padding;
        // `kernel_shape` and `auto_pad` are checked / resolved by `onnx_conv_check`
        .onnx(
            OnnxOp::new("Conv", &[1, 11, 22])
                .attr("strides", "stride")
                .attr("pads", "padding")
                .attr("dilations", "dilation")
                .attr("group", "groups")
                .ignore("kernel_shape")
                .ignore("auto_pad")
                .check(onnx_conv_check),
        )
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
            "conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[] padding=0, int[2] dilation=1, int groups=1) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)",
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

/// The ONNX `Conv` rules the declarative mapping cannot state: a 2-D convolution only (rank-4
/// input and weight with static kernel dims), `kernel_shape` equal to the weight's, and
/// `auto_pad` resolved to explicit pads (`SAME_*` from the static spatial input dims, as ONNX
/// defines it: total padding `max(0, (ceil(in / stride) - 1) * stride + (k - 1) * dilation + 1
/// - in)`, the odd unit at the end for `SAME_UPPER`, at the beginning for `SAME_LOWER`).
fn onnx_conv_check(
    node: &dyn OnnxNode,
    given: &mut Vec<(&'static str, AttrValue)>,
) -> std::result::Result<(), String> {
    let dims = |i: usize| -> Option<Vec<Option<usize>>> {
        match node.input(i)? {
            Ok(TensorSpec { shape: Some(s), .. }) => Some(s.iter().map(Dim::known).collect()),
            _ => None,
        }
    };
    let x = dims(0)
        .filter(|d| d.len() == 4)
        .ok_or("not a 2-D convolution (input rank != 4)")?;
    let w = dims(1)
        .filter(|d| d.len() == 4)
        .ok_or("not a 2-D convolution (weight rank != 4)")?;
    let (Some(kh), Some(kw)) = (w[2], w[3]) else {
        return Err("the kernel's spatial dims are not static".into());
    };
    if let Some(AttrValue::IntList(ks)) = node.attr("kernel_shape", &ArgType::IntList(None)) {
        if ks != [kh as i64, kw as i64] {
            return Err(format!(
                "kernel_shape {ks:?} differs from the weight's [{kh}, {kw}]"
            ));
        }
    }
    let pair = |name: &str| -> std::result::Result<[i64; 2], String> {
        match given.iter().find(|(n, _)| *n == name).map(|(_, v)| v) {
            None => Ok([1, 1]),
            Some(AttrValue::IntList(v)) if v.len() == 2 => Ok([v[0], v[1]]),
            Some(v) => Err(format!("{name} = {}", v.schema_literal())),
        }
    };
    let mode = match node.attr("auto_pad", &ArgType::Str) {
        Some(AttrValue::Str(s)) => s,
        _ => "NOTSET".into(),
    };
    let pads: Vec<i64> = match mode.as_str() {
        "NOTSET" => return Ok(()),
        "VALID" => vec![0; 4],
        "SAME_UPPER" | "SAME_LOWER" => {
            let (stride, dilation) = (pair("stride")?, pair("dilation")?);
            let mut begin = [0i64; 2];
            let mut end = [0i64; 2];
            for a in 0..2 {
                let n = x[2 + a].ok_or("auto_pad SAME with a dynamic spatial dim")? as i64;
                let k = [kh, kw][a] as i64;
                let s = stride[a].max(1);
                let total = (((n + s - 1) / s - 1) * s + (k - 1) * dilation[a] + 1 - n).max(0);
                begin[a] = if mode == "SAME_LOWER" {
                    (total + 1) / 2
                } else {
                    total / 2
                };
                end[a] = total - begin[a];
            }
            vec![begin[0], begin[1], end[0], end[1]]
        }
        other => return Err(format!("auto_pad {other}")),
    };
    given.retain(|(n, _)| *n != "padding");
    given.push(("padding", AttrValue::IntList(pads)));
    Ok(())
}

/// conv2d's factors: the batch `n` is split (images are independent); the output channels
/// `o` are split when `groups` is 1 (each output channel reads every input channel); the
/// input channels and the spatial dims (windows overlap) are whole. `tensors` names, per
/// input and then per output, which of `n`, `c`, `o` its first two dims are (`b` for a bias
/// or bias gradient: one dim, `o`). A gradient without `n` (or without `o`) is summed over it,
/// which is what splitting gives (kernel_core::sharding).
fn conv_rule(ctx: &ShardCtx, tensors: &[&str]) -> Result<ShardingRule> {
    let groups = ctx.attrs.int("groups")?;
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

/// The validated attributes: per-axis stride and dilation, pads per side, groups.
#[derive(Clone, Copy, Debug)]
struct Params {
    /// (height, width)
    stride: [usize; 2],
    dilation: [usize; 2],
    /// (before, after) per axis: `[[top, bottom], [left, right]]`
    pads: [[usize; 2]; 2],
    groups: usize,
}

impl Params {
    fn new(attrs: &Attrs) -> Result<Params> {
        let limit = |name: &str, v: i64, min: i64| -> Result<usize> {
            if v < min {
                return Err(Error::invalid(format!("{name} must be >= {min}, got {v}")));
            }
            if v > i32::MAX as i64 {
                return Err(Error::invalid(format!(
                    "{name}={v} too large (at most {})",
                    i32::MAX
                )));
            }
            Ok(v as usize)
        };
        let pair = |name: &str, min: i64| -> Result<[usize; 2]> {
            let v = attrs.int_list(name)?;
            match v {
                [a, b] => Ok([limit(name, *a, min)?, limit(name, *b, min)?]),
                _ => Err(Error::internal(format!("{name} is not bound to 2 values"))),
            }
        };
        let p = attrs.int_list("padding")?;
        let p: Vec<usize> = p
            .iter()
            .map(|&v| limit("padding", v, 0))
            .collect::<Result<_>>()?;
        let pads = match p[..] {
            [a] => [[a, a], [a, a]],
            [h, w] => [[h, h], [w, w]],
            [top, left, bottom, right] => [[top, bottom], [left, right]],
            _ => {
                return Err(Error::invalid(format!(
                    "padding must have 1, 2 or 4 values (all sides; [height, width]; [top, left, \
                     bottom, right]), got {} ({p:?})",
                    p.len()
                )))
            }
        };
        Ok(Params {
            stride: pair("stride", 1)?,
            dilation: pair("dilation", 1)?,
            pads,
            groups: limit("groups", attrs.int("groups")?, 1)?,
        })
    }
    /// The padding as `[top, left, bottom, right]`, for messages.
    fn pads_tlbr(&self) -> [usize; 4] {
        [
            self.pads[0][0],
            self.pads[1][0],
            self.pads[0][1],
            self.pads[1][1],
        ]
    }
}

/// The extent of a kernel of `k` taps dilated by `d`: `d * (k - 1) + 1` (0 for no taps).
fn dilated(k: usize, d: usize) -> Option<usize> {
    match k {
        0 => Some(0),
        k => d.checked_mul(k - 1)?.checked_add(1),
    }
}

/// The output shape of conv2d from (possibly unknown) input/weight/bias dims; validates
/// attributes and shapes.
fn conv_out(ctx: &InferCtx, xi: usize, wi: usize, bi: usize) -> Result<Vec<Dim>> {
    let prm = Params::new(ctx.attrs)?;
    let groups = prm.groups;
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
                "weight must be 4-D (O, C/groups, KH, KW), got shape {}",
                fmt_dims(w)
            )));
        }
    }
    let x = x.unwrap_or_else(|| unknown.clone());
    let w = w.unwrap_or(unknown);
    if let Some(c) = x[1].known().filter(|c| c % groups != 0) {
        return Err(Error::invalid(format!(
            "groups={groups} does not divide the input's {c} channels"
        )));
    }
    if let Some(o) = w[0].known().filter(|o| o % groups != 0) {
        return Err(Error::invalid(format!(
            "groups={groups} does not divide the {o} output channels (weight dim 0)"
        )));
    }
    let wc = w[1].mul(&Dim::Known(groups))?;
    ctx.require_eq(&x[1], &wc, || {
        if groups == 1 {
            format!("input has {} channels but weight expects {}", x[1], w[1])
        } else {
            format!(
                "input has {} channels but weight expects {} per group x groups={groups} (weight \
                 shape is [O, C/groups, KH, KW])",
                x[1], w[1]
            )
        }
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
    let pads = prm.pads_tlbr();
    // Checked arithmetic: a (possibly huge) input dim from a caller's shape spec must not wrap.
    let padded: Vec<Dim> = [2, 3]
        .iter()
        .map(|&i| {
            let [a, b] = prm.pads[i - 2];
            x[i].add(&Dim::Known(a + b)).map_err(|_| {
                Error::invalid(format!(
                    "input size {} with padding {pads:?} overflows a 64-bit integer",
                    x[i]
                ))
            })
        })
        .collect::<Result<_>>()?;
    // the dilated kernel extent d * (k - 1) + 1 (the kernel size itself when d == 1)
    let extent: Vec<Dim> = [2, 3]
        .iter()
        .map(|&i| {
            let d = prm.dilation[i - 2];
            match &w[i] {
                _ if d == 1 => Ok(w[i].clone()),
                Dim::Known(k) => Ok(Dim::Known(dilated(*k, d).ok_or_else(|| {
                    Error::invalid(format!("kernel size {k} with dilation {d} overflows"))
                })?)),
                k => k
                    .sub(&Dim::Known(1))?
                    .mul(&Dim::Known(d))?
                    .add(&Dim::Known(1)),
            }
        })
        .collect::<Result<_>>()?;
    let spatial = |i: usize| -> Result<Dim> {
        let hp = &padded[i - 2];
        ctx.require_le(&extent[i - 2], hp, || {
            let dil = if prm.dilation == [1, 1] {
                String::new()
            } else {
                format!(" (dilated to {}x{})", extent[0], extent[1])
            };
            format!(
                "kernel size {}x{}{dil} is larger than the padded input {}x{} (input {}x{} with \
                 padding [top, left, bottom, right] = {pads:?})",
                w[2], w[3], padded[0], padded[1], x[2], x[3],
            )
        })?;
        // (H + pads - extent) // stride + 1
        hp.sub(&extent[i - 2])?
            .floor_div(&Dim::Known(prm.stride[i - 2]))?
            .add(&Dim::Known(1))
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

/// Problem geometry. `c` and `o` count every channel; a group has `c / g` input and `o / g`
/// output channels.
#[derive(Clone, Copy, Debug)]
struct Geom {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    g: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    /// stride (height, width)
    sh: usize,
    sw: usize,
    /// dilation (height, width)
    dh: usize,
    dw: usize,
    /// padding before (top, left)
    pt: usize,
    pl: usize,
}

impl Geom {
    /// The geometry of `x` (N, C, H, W) and `wt` (O, C/groups, KH, KW). Checks again what the
    /// shape function checked, in overflow-free arithmetic, because the raw-pointer `gemm`
    /// calls rely on it: the kernels may be called directly, with a `KernelCtx` no inference
    /// has seen.
    fn new(x: &TensorRef, wt: &TensorRef, prm: &Params) -> Result<Geom> {
        let bad = |why: &str| {
            Err(Error::internal(format!(
                "conv2d: {why} (input {:?}, weight {:?}, {prm:?})",
                x.shape, wt.shape
            )))
        };
        let (&[n, c, h, w], &[o, wc, kh, kw]) = (x.shape.as_slice(), wt.shape.as_slice()) else {
            return bad("input and weight must be 4-D");
        };
        let g = prm.groups;
        let [sh, sw] = prm.stride;
        let [dh, dw] = prm.dilation;
        if g == 0 || c % g != 0 || o % g != 0 || wc.checked_mul(g) != Some(c) {
            return bad("channel mismatch (input channels, weight and groups disagree)");
        }
        if sh == 0 || sw == 0 || dh == 0 || dw == 0 {
            return bad("zero stride or dilation");
        }
        let out_len = |len: usize, k: usize, [p0, p1]: [usize; 2], s: usize, d: usize| {
            len.checked_add(p0)
                .and_then(|v| v.checked_add(p1))
                .and_then(|v| v.checked_sub(dilated(k, d)?))
                .map(|v| v / s + 1)
        };
        let (Some(oh), Some(ow)) = (
            out_len(h, kh, prm.pads[0], sh, dh),
            out_len(w, kw, prm.pads[1], sw, dw),
        ) else {
            return bad("kernel larger than the padded input, or sizes overflow");
        };
        let geom = Geom {
            n,
            c,
            h,
            w,
            o,
            g,
            kh,
            kw,
            oh,
            ow,
            sh,
            sw,
            dh,
            dw,
            pt: prm.pads[0][0],
            pl: prm.pads[1][0],
        };
        // every product the kernels form (0 when a factor is 0) must fit in usize, and so must
        // every input index they compute (output position x stride + tap x dilation)
        let fits = |d: &[usize]| {
            d.contains(&0)
                || d.iter()
                    .try_fold(1usize, |a, &v| a.checked_mul(v))
                    .is_some()
        };
        let products: [&[usize]; 8] = [
            &[n, c, h, w],
            &[o, c, kh, kw],
            &[n, o, oh, ow],
            &[c, kh, kw],
            &[kh, kw, oh, ow],
            &[c, kh, kw, oh, ow],
            &[oh + kh, sh + dh, 2],
            &[ow + kw, sw + dw, 2],
        ];
        if !products.into_iter().all(fits) {
            return bad("sizes overflow");
        }
        Ok(geom)
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
    /// Input channels per group.
    fn cg(&self) -> usize {
        self.c / self.g
    }
    /// Output channels per group.
    fn og(&self) -> usize {
        self.o / self.g
    }
    /// im2col rows of one group: C/groups * KH * KW (a weight row's length).
    fn ckk(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    /// The input row (height) of output row `oh` and kernel row `ki`, if inside the input.
    #[inline]
    fn in_row(&self, oh: usize, ki: usize) -> Option<usize> {
        (oh * self.sh + ki * self.dh)
            .checked_sub(self.pt)
            .filter(|&i| i < self.h)
    }
    /// The input column of output column `ow` and kernel column `kj`, if inside the input.
    #[inline]
    fn in_col(&self, ow: usize, kj: usize) -> Option<usize> {
        (ow * self.sw + kj * self.dw)
            .checked_sub(self.pl)
            .filter(|&i| i < self.w)
    }

    /// Fill `col` (`rows.len()` rows of `p1 - p0` values, row `i` starting at `i * ld`) with
    /// im2col rows `rows` (of group `grp`'s `ckk()`) of image `img` for output positions
    /// `p0..p1`. Elements between a row's end and the next row's start are left alone.
    #[allow(clippy::too_many_arguments)]
    fn im2col<C: Num>(
        &self,
        x: &[C],
        img: usize,
        grp: usize,
        rows: std::ops::Range<usize>,
        p0: usize,
        p1: usize,
        col: &mut [C],
        ld: usize,
    ) {
        let width = p1 - p0;
        let kk = self.kh * self.kw;
        let plane = self.h * self.w;
        let (s, pad, w) = (self.sw, self.pl, self.w);
        for (ri, r) in rows.enumerate() {
            let (ch, ki, kj) = (grp * self.cg() + r / kk, (r % kk) / self.kw, r % self.kw);
            let src = &x[(img * self.c + ch) * plane..(img * self.c + ch + 1) * plane];
            let dst = &mut col[ri * ld..ri * ld + width];
            // output columns whose input column ow * s + kj * dw - pad is inside [0, w)
            let off = kj * self.dw;
            let ow_lo = if off >= pad {
                0
            } else {
                (pad - off).div_ceil(s)
            };
            let ow_hi = if w + pad <= off {
                0
            } else {
                (w + pad - off).div_ceil(s)
            };
            let mut p = p0;
            while p < p1 {
                // one output row's segment [ow0, ow1) of positions
                let (oh, ow0) = (p / self.ow, p % self.ow);
                let ow1 = self.ow.min(ow0 + (p1 - p));
                let seg = &mut dst[p - p0..p - p0 + (ow1 - ow0)];
                match self.in_row(oh, ki) {
                    None => seg.fill(C::ZERO),
                    Some(ih) => {
                        let row = &src[ih * w..(ih + 1) * w];
                        let lo = ow_lo.clamp(ow0, ow1);
                        let hi = ow_hi.clamp(lo, ow1);
                        seg[..lo - ow0].fill(C::ZERO);
                        seg[hi - ow0..].fill(C::ZERO);
                        let out = &mut seg[lo - ow0..hi - ow0];
                        if hi > lo {
                            let first = lo * s + off - pad;
                            if s == 1 {
                                out.copy_from_slice(&row[first..first + (hi - lo)]);
                            } else if s == 2 {
                                every_other(out, &row[first..]);
                            } else {
                                for (j, d) in out.iter_mut().enumerate() {
                                    *d = row[first + j * s];
                                }
                            }
                        }
                    }
                }
                p += ow1 - ow0;
            }
        }
    }
}

/// A tensor's values in row-major order as f32: a contiguous f32 tensor's own memory, else a
/// converted copy.
fn as_f32<'a, T: Scalar<C = f32>>(t: &TensorRef<'a>) -> Result<std::borrow::Cow<'a, [f32]>> {
    use std::borrow::Cow;
    // (a strided tensor is gathered once: its contiguous copy is converted, not re-gathered)
    Ok(match t.contiguous::<T>()? {
        Cow::Borrowed(s) => match T::as_c(s) {
            Some(c) => Cow::Borrowed(c),
            None => Cow::Owned(load_c::<T>(s)),
        },
        Cow::Owned(v) => Cow::Owned(load_c::<T>(&v)),
    })
}

/// A tensor's values in row-major order, in the compute type.
fn to_c<T: Scalar>(t: &TensorRef) -> Result<Vec<T::C>> {
    Ok(load_c::<T>(&t.contiguous::<T>()?))
}

/// Contiguous values in the compute type.
fn load_c<T: Scalar>(v: &[T]) -> Vec<T::C> {
    let mut out = vec![T::C::ZERO; v.len()];
    T::load(v, &mut out);
    out
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
    let g = Geom::new(x, wt, &Params::new(ctx.attrs)?)?;
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
    let (ckk, pos, og) = (g.ckk(), g.positions(), g.og());
    // the lengths the raw writes and `gemm` reads below rely on (`wc` is [O, C/g*KH*KW] by
    // construction of `g` from the weight's shape)
    Geom::check_len("output", out.len(), g.n * g.o * pos)?;
    Geom::check_len("bias", bc.len(), g.o)?;
    let mut res = vec![T::C::ZERO; out.len()];
    let rp = OutPtr(res.as_mut_ptr());
    let pb = pos_block(ckk);
    let blocks = pos.div_ceil(pb);
    parallel_for(pool, g.n * g.g * blocks, 1, |range| {
        let mut col = vec![T::C::ZERO; ckk * pb];
        for t in range {
            let (img, grp, b) = (t / (g.g * blocks), (t / blocks) % g.g, t % blocks);
            let (p0, p1) = (b * pb, ((b + 1) * pb).min(pos));
            let width = p1 - p0;
            g.im2col(
                &xc,
                img,
                grp,
                0..ckk,
                p0,
                p1,
                &mut col[..ckk * width],
                width,
            );
            let oc0 = grp * og;
            // SAFETY: `res` has `n * o * pos` elements (checked above) and `img < n`,
            // `oc0 < o`, `p0 < pos`, so the offset is inside it.
            let dst = unsafe { rp.ptr().add((img * g.o + oc0) * pos + p0) };
            for (oc, &bv) in bc[oc0..oc0 + og].iter().enumerate() {
                for j in 0..width {
                    // SAFETY: `oc0 + oc < o` and `p0 + j < p1 <= pos`: element
                    // [img, oc0 + oc, p0 + j] of `res`, in the block of group `grp`'s output
                    // channels and positions p0..p1 of image img, which task `t` alone writes.
                    unsafe { *dst.add(oc * pos + j) = bv };
                }
            }
            // SAFETY: dst is the og x width block [img, oc0.., p0..p1] of `res` (row stride
            // pos), in bounds and this task's alone, as above; lhs is group grp's og x ckk
            // rows of the weight `wc` (o * ckk elements: it is the weight's values and `g`
            // came from its shape); rhs is the task-local `col`, ckk x width, just filled. dst
            // aliases neither.
            unsafe {
                mm(
                    og,
                    width,
                    ckk,
                    dst,
                    pos as isize,
                    1,
                    true,
                    wc.as_ptr().add(oc0 * ckk),
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

/// Whether the f32 paths prefetch the weights of their next tile or pass into L2 (a model's
/// weights come from memory on every run: ResNet-50 through ONNX Runtime ran 8-16% faster
/// with it). `POLYOP_CONV_PREFETCH=0` turns it off, to measure it; the bits are the same.
fn weight_prefetch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("POLYOP_CONV_PREFETCH").map_or(true, |v| v.trim() != "0"))
}

/// Output channels per micro-kernel tile of the f32 path.
const MR: usize = 6;
/// Output positions per micro-kernel tile (two AVX2 vectors).
const NR: usize = 16;
/// Output positions per micro-kernel tile on AVX-512 (two AVX-512 vectors): [`tile_width`].
const NR512: usize = 32;

/// Output positions per tile at the level the CPU runs now: two vectors of its widest
/// registers ([`NR512`] at the AVX-512 level, else [`NR`]).
fn tile_width() -> usize {
    if simd_level() == SimdLevel::Avx512 {
        NR512
    } else {
        NR
    }
}

/// Output positions per task of the f32 path: a multiple of `NR` whose im2col block (`ckk`
/// rows) stays near 256 KiB, inside a core's L2 beside the weights in use.
fn f32_pos_block(ckk: usize) -> usize {
    ((1usize << 16) / ckk.max(1) / NR * NR).clamp(4 * NR, 1024)
}

/// The tiles' columns of a block `width` positions wide, as `(first, count)`: `nr` at a time;
/// with packed weights (`tail`), a last 17 or 18 of tiles of 32 as a half tile of 16 and the
/// one or two left ([`tail_avx2`]), which fill every lane where a tile of 32 filled 17 or 18.
fn tile_columns(width: usize, nr: usize, tail: bool) -> impl Iterator<Item = (usize, usize)> {
    let step = move |j0: usize| {
        let left = width - j0;
        if tail && nr == NR512 && left > NR && left <= NR + TAIL_COLS {
            NR
        } else {
            nr.min(left)
        }
    };
    std::iter::successors((width > 0).then(|| (0, step(0))), move |&(j0, n)| {
        (j0 + n < width).then(|| (j0 + n, step(j0 + n)))
    })
}

/// One tile of the f32 path: for rows `r < mr` and columns `j < n`,
/// `c[r * ldc + j] = fma(a[r * lda + (k-1) * las], b[(k-1) * ldb + j], ... fma(a[r * lda], b[j],
/// s))`
/// with `s = bias[r]` when `first`, else the value `c[r * ldc + j]` holds (a previous tile's
/// result over the preceding kernel rows): every output is one chain of fused multiply-adds
/// over all its kernel rows in order, starting at its bias, whatever the tiles, the blocks or
/// the thread — and the same chain at every SIMD level (the AVX2 `vfmadd` and `f32::mul_add`
/// are both the correctly rounded fusedMultiplyAdd). `a` is `mr` weight rows: read in place
/// (`lda` the row's length, `las` 1: a layer's `[O, C/g, KH, KW]` weight as it is, since
/// packing a deep layer's weights on every call cost more than its multiply-adds at 7x7
/// positions), or from a panel prepacked once per session ([`PackedWeight`]: `lda` 1, `las`
/// `MR`); `b` a `k x n` panel with row stride `ldb`.
///
/// # Safety
/// `a` must be valid for reads of `a[r * lda + l * las]` (`r < mr`, `l < k`), `bias` for `MR` reads,
/// `b` for reads of `b[l * ldb + j]`
/// (`l < k`, `j < n`), `c` for reads (unless `first`) and writes of `c[r * ldc + j]`
/// (`r < mr`, `j < n`) that no other thread touches and that overlap no input; `mr <= MR`;
/// `n <= nr`, the tile width: [`NR`], or [`NR512`] only where [`tile_width`] chose it (the
/// CPU has AVX-512).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile_f32(
    nr: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    las: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    bias: *const f32,
    first: bool,
    relu: bool,
    mr: usize,
    n: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if nr == NR512 {
        // SAFETY: `tile_width` chose NR512 at the AVX-512 level, which `simd_level` reports
        // only on CPUs with AVX-512F, AVX2 and FMA; the pointer contract is the caller's,
        // the same as this function's, with n <= NR512.
        unsafe {
            match (n == NR512, n <= NR512 / 2, mr) {
                (true, _, 1) => tile_avx512::<true, false, 1>(
                    k, a, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (true, _, 2..=3) => tile_avx512::<true, false, 3>(
                    k, a, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (true, _, _) => tile_avx512::<true, false, MR>(
                    k, a, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (false, true, 1) => tile_avx512::<false, true, 1>(
                    k, a, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (false, true, _) => tile_avx512::<false, true, MR>(
                    k, a, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (false, false, 1) => tile_avx512::<false, false, 1>(
                    k, a, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (false, false, _) => tile_avx512::<false, false, MR>(
                    k, a, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // (with tiles of NR, the AVX-512 level runs this AVX2 tile too: every level above the
    // baseline has AVX2+FMA)
    if matches!(simd_level(), SimdLevel::Avx2Fma | SimdLevel::Avx512) {
        // SAFETY: the CPU has AVX2 and FMA (`simd_level` reports no level the CPU lacks, and
        // both levels matched include AVX2 and FMA); the pointer contract is the caller's, the
        // same as this function's.
        unsafe {
            // a tail of at most 8 positions (a 7x7 plane's 49th) takes half the work
            match (n == NR, n <= NR / 2, mr) {
                (true, _, 1) => tile_avx2::<true, false, 1>(
                    k, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (true, _, 2..=3) => tile_avx2::<true, false, 3>(
                    k, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (true, _, _) => tile_avx2::<true, false, MR>(
                    k, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (false, true, 1) => tile_avx2::<false, true, 1>(
                    k, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (false, true, _) => tile_avx2::<false, true, MR>(
                    k, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (false, false, 1) => tile_avx2::<false, false, 1>(
                    k, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
                (false, false, _) => tile_avx2::<false, false, MR>(
                    k, a, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
                ),
            }
        }
        return;
    }
    let mut acc = [[0f32; NR]; MR];
    for (r, row) in acc.iter_mut().enumerate() {
        if first {
            // SAFETY: r < MR, inside `bias` (caller's contract).
            *row = [unsafe { *bias.add(r) }; NR];
        } else if r < mr {
            // SAFETY: r < mr, n elements of row r of `c`, readable (caller's contract).
            unsafe { std::ptr::copy_nonoverlapping(c.add(r * ldc), row.as_mut_ptr(), n) };
        }
    }
    for l in 0..k {
        for (r, row) in acc[..mr].iter_mut().enumerate() {
            // SAFETY: l < k and r < mr: inside the weight rows `a` (caller's contract).
            let av = unsafe { *a.add(r * lda + l * las) };
            for (j, v) in row[..n].iter_mut().enumerate() {
                // SAFETY: l < k, j < n: inside `b` (caller's contract).
                *v = av.mul_add(unsafe { *b.add(l * ldb + j) }, *v);
            }
        }
    }
    for (r, row) in acc[..mr].iter_mut().enumerate() {
        if relu {
            for v in row[..n].iter_mut() {
                *v = relu_c(*v);
            }
        }
        // SAFETY: r < mr, n elements of row r of `c`, this caller's alone (contract).
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), c.add(r * ldc), n) };
    }
}

/// Two output-channel panels' tile at once on AVX-512 ([`tile_avx512`] with `2 * MR` rows:
/// 24 accumulators, each column of `b` loaded once for both): rows `r < MR` from `a`, rows
/// `MR..mr` from `a2`, output rows `r < mr` of `c` and bias entries `r < 2 * MR` consecutive.
/// The same chains as one panel at a time.
///
/// # Safety
/// As [`tile_f32`] for `mr <= 2 * MR` rows (`MR < mr`; rows from `MR` on at `a2`), `bias`
/// valid for `2 * MR` reads, `n <= NR512`; the CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile_pair_avx512(
    k: usize,
    (a, a2): (*const f32, *const f32),
    lda: usize,
    las: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    bias: *const f32,
    first: bool,
    relu: bool,
    mr: usize,
    n: usize,
) {
    // SAFETY: the caller's contract, the same as each variant's.
    unsafe {
        match (n == NR512, n <= NR512 / 2) {
            (true, _) => tile_avx512::<true, false, { 2 * MR }>(
                k, a, a2, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
            ),
            (false, true) => tile_avx512::<false, true, { 2 * MR }>(
                k, a, a2, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
            ),
            (false, false) => tile_avx512::<false, false, { 2 * MR }>(
                k, a, a2, lda, las, b, ldb, c, ldc, bias, first, relu, mr, n,
            ),
        }
    }
}

/// The mask of lanes `first..first + 8` of the first `n` values (all bits set where
/// `first + lane < n`), for masked loads and stores of a row's first `n` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lane_mask(n: usize, first: usize) -> std::arch::x86_64::__m256i {
    let lane = |i: usize| if first + i < n { -1 } else { 0 };
    std::arch::x86_64::_mm256_setr_epi32(
        lane(0),
        lane(1),
        lane(2),
        lane(3),
        lane(4),
        lane(5),
        lane(6),
        lane(7),
    )
}

/// A tile's accumulators at the start of a pass: its bias (`first`) or the values `c` holds
/// (rows `r < mr`; `ROWS` rows; the second vector of each row unless `HALF`).
///
/// # Safety
/// `bias` valid for `MR` reads when `first`; otherwise rows `r < mr` of `c` (row stride `ldc`)
/// readable for `NR` values (`FULL`) or those the masks select; the CPU supports AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_acc_init<const FULL: bool, const HALF: bool, const ROWS: usize>(
    c: *const f32,
    c1: usize,
    ldc: usize,
    bias: *const f32,
    first: bool,
    mr: usize,
    m0: std::arch::x86_64::__m256i,
    m1: std::arch::x86_64::__m256i,
) -> [std::arch::x86_64::__m256; 2 * MR] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 2 * MR];
    for r in 0..ROWS {
        if first {
            // SAFETY: r < MR, inside `bias` (caller's contract).
            let v = _mm256_set1_ps(unsafe { *bias.add(r) });
            acc[2 * r] = v;
            if !HALF {
                acc[2 * r + 1] = v;
            }
        } else if r < mr {
            // SAFETY: r < mr: row r of `c`, NR (FULL) or, through the masks, n readable
            // elements (caller's contract).
            unsafe {
                let cp = c.add(r * ldc);
                if FULL {
                    acc[2 * r] = _mm256_loadu_ps(cp);
                    acc[2 * r + 1] = _mm256_loadu_ps(cp.add(c1));
                } else {
                    acc[2 * r] = _mm256_maskload_ps(cp, m0);
                    if !HALF {
                        acc[2 * r + 1] = _mm256_maskload_ps(cp.add(c1), m1);
                    }
                }
            }
        }
    }
    acc
}

/// Store a tile's accumulators: rows `r < mr` of `c`, `NR` values or those the masks select.
///
/// # Safety
/// Rows `r < mr` of `c` (row stride `ldc`) writable as selected, this caller's alone; AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_acc_store<const FULL: bool, const HALF: bool>(
    acc: &[std::arch::x86_64::__m256; 2 * MR],
    c: *mut f32,
    c1: usize,
    ldc: usize,
    mr: usize,
    m0: std::arch::x86_64::__m256i,
    m1: std::arch::x86_64::__m256i,
    relu: bool,
) {
    use std::arch::x86_64::*;
    let zero = _mm256_setzero_ps();
    // relu's bits (`relu_c`): max with 0 as the first operand keeps a NaN and -0
    let fin = |v: __m256| if relu { _mm256_max_ps(zero, v) } else { v };
    for r in 0..mr {
        // SAFETY: r < mr: row r of `c`, NR (FULL) or, through the masks, n elements, this
        // caller's alone (contract).
        unsafe {
            let cp = c.add(r * ldc);
            if FULL {
                _mm256_storeu_ps(cp, fin(acc[2 * r]));
                _mm256_storeu_ps(cp.add(c1), fin(acc[2 * r + 1]));
            } else {
                _mm256_maskstore_ps(cp, m0, fin(acc[2 * r]));
                if !HALF {
                    _mm256_maskstore_ps(cp.add(c1), m1, fin(acc[2 * r + 1]));
                }
            }
        }
    }
}

/// [`tile_f32`] in AVX2 + FMA: `2 * ROWS` accumulators of 8 lanes (`ROWS` rows x two
/// vectors), the weights broadcast from `ROWS` row pointers (rows from `mr` on repeat row
/// `mr - 1`: computed, never stored, never read past the weights). `ROWS` below `MR`
/// computes only the panel's first rows (a depthwise convolution's panels have one): the
/// same chains, fewer wasted lanes. `FULL`: `n == NR`; otherwise `b` is read and `c` written
/// through lane masks, so nothing past column `n` is touched. `HALF` (`n <= 8`, not `FULL`):
/// only the first vector of each row is computed.
///
/// # Safety
/// As [`tile_f32`], `mr <= ROWS <= MR`, and the CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const FULL: bool, const HALF: bool, const ROWS: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    las: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    bias: *const f32,
    first: bool,
    relu: bool,
    mr: usize,
    n: usize,
) {
    use std::arch::x86_64::*;
    let (m0, m1) = (lane_mask(n, 0), lane_mask(n, 8));
    // SAFETY: the caller's contract for `c` and `bias`.
    let mut acc = unsafe { tile_acc_init::<FULL, HALF, ROWS>(c, 8, ldc, bias, first, mr, m0, m1) };
    // SAFETY: min(r, mr - 1) < mr: the start of a weight row (caller's contract); mr >= 1.
    let rows: [*const f32; ROWS] = std::array::from_fn(|r| unsafe { a.add(r.min(mr - 1) * lda) });
    let mut bp = b;
    for l in 0..k {
        // SAFETY: `bp` is row l < k of `b`: NR (FULL) or, through the masks, n valid
        // elements; `rows[r] + l * las` is element l < k of a weight row (caller's contract).
        unsafe {
            let (b0, b1) = if FULL {
                (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)))
            } else if HALF {
                (_mm256_maskload_ps(bp, m0), _mm256_setzero_ps())
            } else {
                (
                    _mm256_maskload_ps(bp, m0),
                    _mm256_maskload_ps(bp.add(8), m1),
                )
            };
            for (r, row) in rows.iter().enumerate() {
                let av = _mm256_broadcast_ss(&*row.add(l * las));
                acc[2 * r] = _mm256_fmadd_ps(av, b0, acc[2 * r]);
                if !HALF {
                    acc[2 * r + 1] = _mm256_fmadd_ps(av, b1, acc[2 * r + 1]);
                }
            }
            bp = bp.add(ldb);
        }
    }
    // SAFETY: the caller's contract for `c`.
    unsafe { tile_acc_store::<FULL, HALF>(&acc, c, 8, ldc, mr, m0, m1, relu) };
}

/// [`tile_f32`] in AVX-512 for up to [`NR512`] columns: `2 * ROWS` accumulators of 16 lanes
/// (`ROWS` rows x two vectors), otherwise as [`tile_avx2`] (rows from `mr` on repeat row `mr -
/// 1`, computed and never stored). Weight rows `r < MR` start at `a + r * lda`, rows `MR..` (a
/// second panel, [`tile_pair_avx512`]) at `a2 + (r - MR) * lda`. `FULL`: `n == NR512`;
/// otherwise `b` is read and `c` written through lane masks. `HALF` (`n <= 16`, not `FULL`):
/// only the first vector of each row.
///
/// # Safety
/// As [`tile_f32`] with `n <= NR512`, `mr <= ROWS <= 2 * MR` (weight rows from `MR` on at
/// `a2`), `bias` valid for `ROWS` reads; the CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile_avx512<const FULL: bool, const HALF: bool, const ROWS: usize>(
    k: usize,
    a: *const f32,
    a2: *const f32,
    lda: usize,
    las: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    bias: *const f32,
    first: bool,
    relu: bool,
    mr: usize,
    n: usize,
) {
    use std::arch::x86_64::*;
    // lanes j < n of the first and second vector
    let mask = |first: usize| -> __mmask16 {
        let lanes = n.saturating_sub(first).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    };
    let (m0, m1) = (mask(0), mask(16));
    let mut acc = [_mm512_setzero_ps(); 4 * MR];
    for r in 0..ROWS {
        if first {
            // SAFETY: r < ROWS, inside `bias` (caller's contract).
            let v = _mm512_set1_ps(unsafe { *bias.add(r) });
            acc[2 * r] = v;
            acc[2 * r + 1] = v;
        } else if r < mr {
            // SAFETY: row r < mr of `c`: NR512 (FULL) or, through the masks, n readable
            // elements (caller's contract).
            unsafe {
                let cp = c.add(r * ldc);
                if FULL {
                    acc[2 * r] = _mm512_loadu_ps(cp);
                    acc[2 * r + 1] = _mm512_loadu_ps(cp.add(16));
                } else {
                    acc[2 * r] = _mm512_maskz_loadu_ps(m0, cp);
                    if !HALF {
                        acc[2 * r + 1] = _mm512_maskz_loadu_ps(m1, cp.add(16));
                    }
                }
            }
        }
    }
    // SAFETY: min(r, mr - 1) < mr: the start of a weight row, of the first panel's (`a`) or,
    // from row MR on, the second's (`a2`) (caller's contract); mr >= 1.
    let rows: [*const f32; ROWS] = std::array::from_fn(|r| unsafe {
        let r = r.min(mr - 1);
        if r < MR {
            a.add(r * lda)
        } else {
            a2.add((r - MR) * lda)
        }
    });
    let mut bp = b;
    for l in 0..k {
        // SAFETY: `bp` is row l < k of `b`: NR512 (FULL) or, through the masks, n valid
        // elements; `rows[r] + l * las` is element l < k of a weight row (caller's contract).
        unsafe {
            let (b0, b1) = if FULL {
                (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)))
            } else if HALF {
                (_mm512_maskz_loadu_ps(m0, bp), _mm512_setzero_ps())
            } else {
                (
                    _mm512_maskz_loadu_ps(m0, bp),
                    _mm512_maskz_loadu_ps(m1, bp.add(16)),
                )
            };
            for (r, row) in rows.iter().enumerate() {
                let av = _mm512_set1_ps(*row.add(l * las));
                acc[2 * r] = _mm512_fmadd_ps(av, b0, acc[2 * r]);
                if !HALF {
                    acc[2 * r + 1] = _mm512_fmadd_ps(av, b1, acc[2 * r + 1]);
                }
            }
            bp = bp.add(ldb);
        }
    }
    // relu's bits (`relu_c`): max with 0 as the first operand keeps a NaN and -0
    let zero = _mm512_setzero_ps();
    let fin = |v: __m512| if relu { _mm512_max_ps(zero, v) } else { v };
    for r in 0..mr {
        // SAFETY: row r < mr of `c`: NR512 (FULL) or, through the masks, n elements, this
        // caller's alone (contract).
        unsafe {
            let cp = c.add(r * ldc);
            if FULL {
                _mm512_storeu_ps(cp, fin(acc[2 * r]));
                _mm512_storeu_ps(cp.add(16), fin(acc[2 * r + 1]));
            } else {
                _mm512_mask_storeu_ps(cp, m0, fin(acc[2 * r]));
                if !HALF {
                    _mm512_mask_storeu_ps(cp.add(16), m1, fin(acc[2 * r + 1]));
                }
            }
        }
    }
}

/// Which f32 path computes a layer: one decision for the kernel ([`conv2d_f32`]) and for its
/// weights prepacked once per session ([`conv2d_prepack`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum F32Path {
    /// One input channel per group and fewer than `MR` output channels each: [`depthwise_f32`].
    Depthwise,
    /// [`cv::cv_f32`], with panels of this many output channels ([`cv::panel_width`]: two
    /// vectors of the level's widest registers).
    ChannelVectorized(usize),
    /// The im2col tiles, [`gemm_tiles_f32`].
    Tiles,
}

impl F32Path {
    /// The path of a layer with a `kh x kw` kernel, `cg` input and `og` output channels per
    /// group.
    fn of(kh: usize, kw: usize, cg: usize, og: usize) -> F32Path {
        if cg == 1 && og < MR {
            F32Path::Depthwise
        } else if cv::cv_applies(kh * kw, cg) {
            F32Path::ChannelVectorized(cv::panel_width(og))
        } else {
            F32Path::Tiles
        }
    }
}

/// A conv2d weight packed once, for a caller that knows it constant (ONNX Runtime's
/// initializers: [`kernel_core::Prepacked`]), in the order its path's inner loop reads it, so
/// a call neither repacks it (the channel-vectorized path packed each panel on every call: a
/// fifth to a third of a 7x7 layer's time) nor reads it as `MR` streams a weight row apart (the
/// tiles), and a block's last one or two positions can run along output channels
/// ([`tail_avx2`]). Same values, so the same fma chains and bits as unpacked.
struct PackedWeight {
    /// What it was packed from and for: a call uses it only when all match ([`Self::fits`]).
    shape: Vec<usize>,
    dtype: DType,
    groups: usize,
    path: F32Path,
    /// [`F32Path::Tiles`]: `[group][panel of MR][ckk][MR]` (output channels past the group's
    /// zero); [`F32Path::ChannelVectorized`]: `[group][panel of cw][ckk][cw]` (the layout
    /// `cv::pack_panel` makes for one pass, over all of a panel's input channels).
    data: LineAligned,
}

impl PackedWeight {
    fn fits(&self, wt: &TensorRef, groups: usize, path: F32Path) -> bool {
        self.shape == wt.shape
            && self.dtype == wt.dtype
            && self.groups == groups
            && self.path == path
            && self.data.as_slice().len() == Self::len(&self.shape, groups, path)
    }

    /// The packed length of weight `shape` (`[O, C/g, KH, KW]`) in `groups` groups on `path`.
    fn len(shape: &[usize], groups: usize, path: F32Path) -> usize {
        let og = shape[0] / groups;
        let ckk: usize = shape[1..].iter().product();
        let width = match path {
            F32Path::Tiles => MR,
            F32Path::ChannelVectorized(cw) => cw,
            F32Path::Depthwise => 0,
        };
        groups * og.div_ceil(width.max(1)) * ckk * width
    }
}

/// conv2d's [`kernel_core::PrepackFn`]: its weight (input 1), f32, f16 or bf16, as the path the
/// layer takes reads it ([`PackedWeight`]); nothing for the depthwise path (it reads the
/// weights in place), other inputs, or a weight and attributes the kernel would refuse.
fn conv2d_prepack(input: usize, w: &TensorRef, attrs: &Attrs) -> Option<kernel_core::Prepacked> {
    let groups = Params::new(attrs).ok()?.groups;
    let &[o, cg, kh, kw] = &w.shape[..] else {
        return None;
    };
    if input != 1 || groups == 0 || o % groups != 0 || o * cg * kh * kw == 0 {
        return None;
    }
    let (og, ckk) = (o / groups, cg * kh * kw);
    let path = F32Path::of(kh, kw, cg, og);
    let wc = match w.dtype {
        DType::F32 => as_f32::<f32>(w).ok()?,
        DType::F16 => as_f32::<f16>(w).ok()?,
        DType::BF16 => as_f32::<bf16>(w).ok()?,
        _ => return None,
    };
    let mut packed = LineAligned::zeroed(PackedWeight::len(&w.shape, groups, path));
    let data = packed.as_mut_slice();
    match path {
        F32Path::Depthwise => return None,
        F32Path::Tiles => {
            let panels = og.div_ceil(MR);
            for (q, panel) in data.chunks_exact_mut(ckk * MR).enumerate() {
                let (grp, pi) = (q / panels, q % panels);
                for r in 0..MR.min(og - pi * MR) {
                    let row = &wc[(grp * og + pi * MR + r) * ckk..][..ckk];
                    for (l, &v) in row.iter().enumerate() {
                        panel[l * MR + r] = v;
                    }
                }
            }
        }
        F32Path::ChannelVectorized(cw) => cv::pack_weight(cw, &wc, groups, og, cg, kh * kw, data),
    }
    Some(Box::new(PackedWeight {
        shape: w.shape.to_vec(),
        dtype: w.dtype,
        groups,
        path,
        data: packed,
    }))
}

/// Columns (output positions) of a block's last tile at most this many: [`tail_avx2`].
const TAIL_COLS: usize = 2;

/// The last one or two output positions of a block (`N` columns: a 7x7 plane's 49th, after
/// three tiles of 16) for up to `P` panels of prepacked weights (`[l][MR]`, [`PackedWeight`]),
/// vectorized along each panel's `MR` output channels instead of positions: a tile spent a
/// vector of 8 lanes per output channel on the one position. Panel `q` reads weights from
/// `a[q]` (entry `l * MR + r`), writes rows `r < mr[q]` of `c[q]` (row stride `ldc`, columns
/// `j < N`), starting from `bias[q]` (`first`) or the values there; `b` is `k` rows of stride
/// `ldb`. Each output is the same chain as in [`tile_f32`] (`fma(w, x, acc)` over `l` in
/// order), so the bits do not change.
///
/// # Safety
/// The CPU supports AVX2 and FMA; for `q < P`: `a[q]` valid for `k * MR` reads, `bias[q]` for
/// `MR`, rows `r < mr[q] <= MR` of `c[q]` for reads (unless `first`) and writes of `N` values
/// that no other thread touches and no input overlaps; `b` for reads of `b[l * ldb + j]` (`l <
/// k`, `j < N`). (A caller with fewer than `P` panels repeats one, with `mr` 0.)
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tail_avx2<const N: usize, const P: usize>(
    k: usize,
    a: [*const f32; P],
    b: *const f32,
    ldb: usize,
    c: [*mut f32; P],
    ldc: usize,
    bias: [*const f32; P],
    first: bool,
    relu: bool,
    mr: [usize; P],
) {
    use std::arch::x86_64::*;
    let m = lane_mask(MR, 0);
    let mut acc = [[_mm256_setzero_ps(); N]; P];
    for (q, row) in acc.iter_mut().enumerate() {
        for (j, acc) in row.iter_mut().enumerate() {
            let mut t = [0f32; 8];
            for (r, v) in t.iter_mut().enumerate().take(MR) {
                // SAFETY: r < MR entries of the bias panel; r < mr[q] rows of `c[q]`, column
                // j < N (this function's contract).
                *v = unsafe {
                    if first {
                        *bias[q].add(r)
                    } else if r < mr[q] {
                        *c[q].add(r * ldc + j)
                    } else {
                        0.0
                    }
                };
            }
            // SAFETY: 8 floats of `t`.
            *acc = unsafe { _mm256_loadu_ps(t.as_ptr()) };
        }
    }
    for l in 0..k {
        // SAFETY: l < k rows of `b`, columns j < N; entries l * MR .. + MR of each panel,
        // through the mask (this function's contract).
        unsafe {
            let x: [__m256; N] = std::array::from_fn(|j| _mm256_broadcast_ss(&*b.add(l * ldb + j)));
            for (row, aq) in acc.iter_mut().zip(a) {
                let w = _mm256_maskload_ps(aq.add(l * MR), m);
                for (acc, xj) in row.iter_mut().zip(x) {
                    *acc = _mm256_fmadd_ps(w, xj, *acc);
                }
            }
        }
    }
    for (q, row) in acc.iter().enumerate() {
        for (j, acc) in row.iter().enumerate() {
            let mut t = [0f32; 8];
            // SAFETY: 8 floats of `t`.
            unsafe { _mm256_storeu_ps(t.as_mut_ptr(), *acc) };
            for (r, v) in t.iter().enumerate().take(mr[q]) {
                // SAFETY: r < mr[q] rows of `c[q]`, column j < N (this function's contract).
                unsafe { *c[q].add(r * ldc + j) = if relu { relu_c(*v) } else { *v } };
            }
        }
    }
}

/// conv2d for the types computed in f32 (f32, f16, bf16). Depthwise layers run directly
/// ([`depthwise_f32`]). Every other layer with a kernel larger than 1x1, on a CPU with AVX2
/// and FMA, runs vectorized along output channels from a padded copy of its input rows
/// ([`cv::cv_f32`]). The rest (1x1 layers, and every layer at the baseline SIMD level): im2col
/// of a block of output positions into a task-local buffer (L2-sized; 1x1 layers read the
/// input in place), multiplied by the weights in place, `MR` rows (output channels) at a time,
/// tile by tile ([`gemm_tiles_f32`], [`tile_f32`]). Tasks are cut as
/// [`split_work`] says; each output is one fma chain in a fixed order, so nothing depends on
/// the path, the partition or the thread count. An f32 input and output are used in place,
/// without conversion copies.
fn conv2d_f32<T: Scalar<C = f32>>(ctx: &mut KernelCtx) -> Result<()> {
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let (x, wt) = (req(inputs, 0)?, req(inputs, 1)?);
    let bias = inputs.get(2).and_then(Option::as_ref);
    let g = Geom::new(x, wt, &Params::new(ctx.attrs)?)?;
    in_ptr::<T>(x)?;
    let path = F32Path::of(g.kh, g.kw, g.cg(), g.og());
    let prepacked = ctx
        .prepacked::<PackedWeight>(1)
        .filter(|p| p.fits(wt, g.g, path))
        .map(|p| p.data.as_slice());
    // A fused elementwise op (`KernelCtx::take_epilogue`) is applied to each finished block of
    // an f32 output in place by the tile paths, while the block is in cache; the depthwise path
    // and the half types leave it to the call path (after the whole output).
    let epi = if x.dtype == DType::F32 && path != F32Path::Depthwise {
        ctx.take_epilogue()
    } else {
        None
    };
    let out = ctx.outputs[0].as_mut_slice::<T>()?;
    if out.is_empty() {
        return Ok(());
    }
    let (xc, wc) = (as_f32::<T>(x)?, as_f32::<T>(wt)?);
    let (xc, wc): (&[f32], &[f32]) = (&xc, &wc);
    let bc = match bias {
        Some(b) => to_c::<T>(b)?,
        None => vec![0f32; g.o],
    };
    let (ckk, pos) = (g.ckk(), g.positions());
    Geom::check_len("input", xc.len(), g.n * g.c * g.h * g.w)?;
    Geom::check_len("weight", wc.len(), g.o * ckk)?;
    Geom::check_len("output", out.len(), g.n * g.o * pos)?;
    Geom::check_len("bias", bc.len(), g.o)?;
    let mut res = match T::as_c_mut(out) {
        Some(_) => Vec::new(),
        None => vec![0f32; out.len()],
    };
    let op = match T::as_c_mut(out) {
        Some(o) => OutPtr(o.as_mut_ptr()),
        None => OutPtr(res.as_mut_ptr()),
    };
    if path == F32Path::Depthwise {
        depthwise_f32(&g, xc, wc, &bc, &op, pool);
    } else if let F32Path::ChannelVectorized(cw) = path {
        cv::cv_f32(cw, &g, xc, wc, prepacked, &bc, &op, pool, epi);
    } else {
        gemm_tiles_f32(&g, xc, wc, prepacked, &bc, &op, pool, epi);
    }
    if !res.is_empty() {
        T::store(&res, out);
    }
    Ok(())
}

/// Outputs of a depthwise run computed together in registers (four AVX2 vectors).
const DW_CHUNK: usize = 32;

/// Depthwise convolution (one input channel per group, fewer than `MR` output channels each,
/// where the tiles would leave most of their rows empty), directly. Per (image, channel) task
/// the input plane is copied once, zero-padded and split into `sh x sw` phases (padded row
/// `r`, column `c` goes to phase `(r % sh, c % sw)`, at row `r / sh`, entry `c / sw`), so that
/// every tap reads all its outputs as one contiguous run: output `(oh, j)` sits at
/// `oh * plen + j` of the run, the columns between `ow` and the phase width `plen` computed and
/// dropped. (Row by row, a stride-2 layer's taps were runs of 28 or 14 values: 5 GFLOP/s.)
/// Each output is the same fma chain as in [`tile_f32`] (from its bias, over the kernel taps
/// in order, a padded tap multiplying zero), so this path gives the tiles' bits. Column stride
/// 2 on AVX2 CPUs is the exception to the phase split: [`depthwise_s2_avx2`] reads the padded
/// plane as it is.
fn depthwise_f32(
    g: &Geom,
    xc: &[f32],
    wc: &[f32],
    bc: &[f32],
    op: &OutPtr<f32>,
    pool: &dyn kernel_core::ThreadPool,
) {
    let (pos, og, kk) = (g.positions(), g.og(), g.kh * g.kw);
    // padded rows and columns any tap reads
    let rows = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
    let span = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
    // Column stride 2 on AVX2 CPUs: the plane is only padded, not split (`sh = sw = 1` below),
    // and [`depthwise_s2_avx2`] takes each tap's 8 outputs as the even values of 16 in a row,
    // split in registers; its rows hold the 16 values past the last 8-output chunk's start.
    // (Split into phases, the fill's short gathers were three quarters of a 28x28 layer.)
    let s2 = g.sw == 2 && simd_level() >= SimdLevel::Avx2Fma;
    let (sh, sw) = if s2 { (1, 1) } else { (g.sh, g.sw) };
    // a phase's rows and row length
    let (prows, plen) = if s2 {
        (rows, span.max(16 * g.ow.div_ceil(8) + (g.kw - 1) * g.dw))
    } else {
        (rows.div_ceil(sh), span.div_ceil(sw))
    };
    // a tap's run: output rows at stride plen
    let len = (g.oh - 1) * plen + g.ow;
    let full = len.div_ceil(DW_CHUNK) * DW_CHUNK;
    // Where the input's values go in the phase-split plane: input row ih (padded row r = ih +
    // pt, if a tap reads it) to phase row r % sh, row r / sh, from `row_at[ih]` on; in it,
    // column phase p's entries lo..hi (entry m: input column m * sw + p - pl), as (offset of
    // entry lo from the row's start, hi - lo, input column of entry lo)
    let row_at: Vec<usize> = (0..g.h.min(rows.saturating_sub(g.pt)))
        .map(|ih| {
            let r = ih + g.pt;
            (r % sh * sw * prows + r / sh) * plen
        })
        .collect();
    let phase_cols: Vec<(usize, usize, usize)> = (0..sw)
        .map(|p| {
            let lo = g.pl.saturating_sub(p).div_ceil(sw).min(plen);
            let hi = (g.w + g.pl).saturating_sub(p).div_ceil(sw).clamp(lo, plen);
            // (lo * sw + p >= pl whenever hi > lo)
            let first = (lo * sw + p).saturating_sub(g.pl);
            (p * prows * plen + lo, hi - lo, first)
        })
        .filter(|&(_, n, _)| n > 0)
        .collect();
    let grain = (4096 / pos.max(1)).max(1);
    // [`depthwise_s2_avx2`]'s chunks of 8 outputs, row by row: where a chunk's taps start in
    // the plane, where its outputs go, whether it is its row's masked last chunk (computed per
    // chunk and channel, the divisions were a third of the time)
    let mut s2_chunks = Vec::new();
    if s2 {
        let nch = g.ow.div_ceil(8);
        for r in 0..g.oh {
            for jc in 0..nch {
                let masked = jc + 1 == nch && !g.ow.is_multiple_of(8);
                s2_chunks.push((r * g.sh * plen + 16 * jc, r * g.ow + 8 * jc, masked));
            }
        }
    }
    // tap (ki, kj) reads padded row oh * sh + ki * dh and column j * sw + kj * dw: phase
    // ((ki * dh) % sh, (kj * dw) % sw), from its row (ki * dh) / sh and entry (kj * dw) / sw on
    let tap_base: Vec<usize> = (0..kk)
        .map(|tap| {
            let (dr, dc) = ((tap / g.kw) * g.dh, (tap % g.kw) * g.dw);
            ((dr % sh * sw + dc % sw) * prows + dr / sh) * plen + dc / sw
        })
        .collect();
    parallel_for(pool, g.n * g.o, grain, |range| {
        // (DW_CHUNK more values than the phases hold: every chunk of the run is whole,
        // the values past the run computed from zeros and dropped)
        let mut plane = vec![0f32; sh * sw * prows * plen + DW_CHUNK];
        let mut acc = vec![0f32; if s2 { 0 } else { full }];
        with_simd(
            #[inline(always)]
            || {
                let first_task = range.start;
                for t in range {
                    let (img, oc) = (t / g.o, t % g.o);
                    let plane_in = (img * g.c + oc / og) * g.h * g.w;
                    let src = &xc[plane_in..plane_in + g.h * g.w];
                    // the padded, phase-split plane, rebuilt only when the input channel
                    // changes (a channel multiplier's outputs share it). Only the input's
                    // values are written, the same entries for every channel: the padding
                    // (and what no tap reads) stays zero from the allocation on.
                    if t == first_task || oc % og == 0 {
                        let (ra, pc) = (&row_at[..], &phase_cols[..]);
                        match sw {
                            1 => fill_plane(&mut plane, src, g.w, ra, pc, |d, s| {
                                copy_short(d, &s[..d.len()])
                            }),
                            2 => fill_plane(&mut plane, src, g.w, ra, pc, every_other),
                            _ => fill_plane(&mut plane, src, g.w, ra, pc, |d, s| {
                                for (m, v) in d.iter_mut().enumerate() {
                                    *v = s[m * sw];
                                }
                            }),
                        }
                    }
                    let taps = &wc[oc * kk..(oc + 1) * kk];
                    let out_plane = (img * g.o + oc) * pos;
                    #[cfg(target_arch = "x86_64")]
                    if s2 {
                        // SAFETY: AVX2 and FMA (`s2`); the plane has `rows` rows of `plen >=
                        // 16 * ceil(ow / 8) + (kw - 1) * dw` values, a chunk's taps from its
                        // row's start + 16 * jc + kj * dw on; its outputs are those of row r
                        // (8 from r * ow + 8 * jc, or the row's last ow % 8) of output plane oc
                        // of image img: inside the n * o * pos output (checked by the caller),
                        // written only by task t.
                        unsafe {
                            depthwise_s2_avx2(
                                &plane[..rows * plen],
                                &tap_base,
                                &s2_chunks,
                                taps,
                                bc[oc],
                                op.ptr().add(out_plane),
                                g.oh,
                                g.ow,
                            )
                        };
                        continue;
                    }
                    // The run in chunks of DW_CHUNK outputs held in registers over all the
                    // taps, stored once (tap by tap through `acc` in memory, the loads and
                    // stores of the partial sums bound a 14x14 layer: 7 GFLOP/s); the same
                    // chains in the same order.
                    for c0 in (0..full).step_by(DW_CHUNK) {
                        let mut r = [bc[oc]; DW_CHUNK];
                        for (&wv, &base) in taps.iter().zip(&tap_base) {
                            let src: &[f32; DW_CHUNK] =
                                plane[base + c0..base + c0 + DW_CHUNK].try_into().unwrap();
                            for (a, &x) in r.iter_mut().zip(src) {
                                *a = wv.mul_add(x, *a);
                            }
                        }
                        acc[c0..c0 + DW_CHUNK].copy_from_slice(&r);
                    }
                    for oh in 0..g.oh {
                        // SAFETY: output row oh of channel oc of image img: g.ow elements
                        // inside the n * o * pos output (checked by the caller), written only
                        // by task t.
                        copy_short(
                            unsafe { op.slice(out_plane + oh * g.ow, g.ow) },
                            &acc[oh * plen..oh * plen + g.ow],
                        );
                    }
                }
            },
        );
    });
}

/// The input's values into [`depthwise_f32`]'s padded plane: input row `ih` (of `w` values in
/// `src`) at `row_at[ih]`, column phase by column phase (`cols`: offset from the row's start,
/// entries, first input column), each by `gather(entries, row from that column on)`.
#[inline(always)]
fn fill_plane(
    plane: &mut [f32],
    src: &[f32],
    w: usize,
    row_at: &[usize],
    cols: &[(usize, usize, usize)],
    gather: impl Fn(&mut [f32], &[f32]),
) {
    for (ih, &r) in row_at.iter().enumerate() {
        for &(off, n, first) in cols {
            gather(
                &mut plane[r + off..r + off + n],
                &src[ih * w + first..(ih + 1) * w],
            );
        }
    }
}

/// One channel of a depthwise convolution of column stride 2 in AVX2 + FMA, from its padded
/// plane: chunk `c` of 8 outputs (written from `out + at[c].1` on, only the row's `ow % 8` last
/// ones where `at[c].2`) is, per tap, the even values of the 16 from `at[c].0 + tap_base[tap]`
/// on. `_mm256_shuffle_ps` takes them in the order 0 1 4 5 2 3 6 7 (per 128-bit lane); the sums
/// stay in that order over all taps and are put right once before the store. Each output is
/// the same fma chain as in [`tile_f32`] (from `bias`, over the taps in order). Four chunks at
/// a time, for independent chains.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `at` must have `oh * ceil(ow / 8)` entries (checked),
/// every `at[c].0 + tap_base[tap] + 16 <= plane.len()` (checked for the last chunk, whose
/// start is the largest); `out` must be valid for writes of the 8 (or, masked, `ow % 8`)
/// values from each `out + at[c].1` on, which nothing else touches meanwhile.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_s2_avx2(
    plane: &[f32],
    tap_base: &[usize],
    at: &[(usize, usize, bool)],
    taps: &[f32],
    bias: f32,
    out: *mut f32,
    oh: usize,
    ow: usize,
) {
    use std::arch::x86_64::*;
    const K: usize = 4;
    let chunks = oh * ow.div_ceil(8);
    assert_eq!(at.len(), chunks, "depthwise_s2_avx2: one entry per chunk");
    let last = tap_base.iter().max().copied().unwrap_or(0) + at[chunks - 1].0 + 16;
    assert!(last <= plane.len(), "depthwise_s2_avx2: plane too short");
    // the lanes of a row's last chunk that are outputs
    let tail = ow - (ow.div_ceil(8) - 1) * 8;
    let mask = lane_mask(tail, 0);
    let p = plane.as_ptr();
    for q in (0..chunks).step_by(K) {
        // chunks past the last repeat it: computed, never stored
        let base: [usize; K] = std::array::from_fn(|i| at[(q + i).min(chunks - 1)].0);
        let mut acc = [_mm256_set1_ps(bias); K];
        for (&w, &tb) in taps.iter().zip(tap_base) {
            let wv = _mm256_set1_ps(w);
            for (a, &b) in acc.iter_mut().zip(&base) {
                // SAFETY: b + tb + 16 <= last <= plane.len() (asserted above).
                let (lo, hi) = unsafe {
                    (
                        _mm256_loadu_ps(p.add(b + tb)),
                        _mm256_loadu_ps(p.add(b + tb + 8)),
                    )
                };
                *a = _mm256_fmadd_ps(wv, _mm256_shuffle_ps::<0b10_00_10_00>(lo, hi), *a);
            }
        }
        for (a, &(_, o, masked)) in acc.iter().zip(&at[q..]) {
            let v = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(*a)));
            // SAFETY: output (r, 8 * jc ..) with r < oh, 8 * jc < ow: 8 values, or through the
            // mask the row's `tail` last ones, inside the oh * ow the caller gave.
            unsafe {
                let dst = out.add(o);
                if masked {
                    _mm256_maskstore_ps(dst, mask, v);
                } else {
                    _mm256_storeu_ps(dst, v);
                }
            }
        }
    }
}

/// The im2col + micro-kernel tiles of [`conv2d_f32`].
/// The bias per panel of `MR` output channels of each group, `[group][panel][MR]`; entries
/// past the group's last channel are zero (computed, never stored).
fn bias_panels(g: &Geom, bc: &[f32]) -> Vec<f32> {
    let (og, panels) = (g.og(), g.og().div_ceil(MR));
    let mut bp = vec![0f32; g.g * panels * MR];
    for grp in 0..g.g {
        for oc in 0..og {
            bp[(grp * panels + oc / MR) * MR + oc % MR] = bc[grp * og + oc];
        }
    }
    bp
}

/// How a conv2d f32 call is cut into tasks ([`Split`]). Position blocks
/// start at `blocks` (what the caches allow); ranges of output-channel panels (`splits` per
/// image and group) share the work when the images and blocks are too few for the threads.
///
/// - Where a group's weights outweigh its positions (`og > positions`: the deep layers of a
///   network at batch 1) and a block is cheap to prepare again (`cheap_repeat`: the input
///   read in place, or the channel-vectorized path's padded copy), a task is panel-major: its share of the
///   panels over every block of an image, so each thread reads only its part of the weights.
///   (Split by positions, every thread streamed all of them: a 256 -> 1024 1x1 layer at
///   14x14 ran only 1.65x faster on two threads than on one. With im2col blocks, repeating
///   the im2col in every task made 3x3 stride-2 layers slower: 256x28x28 -> 14x14 2.09 ->
///   2.31 ms.)
/// - Otherwise blocks grow (up to `max_blocks`) until the tasks divide among the threads.
///   Tasks that still do not divide are split over panels where `cheap_repeat` (an 800 ->
///   128 1x1 layer at 14x14 has 3 blocks: 0.45 -> 0.34 ms on two threads), and otherwise only
///   when there are fewer tasks than threads (a repeated im2col cost more than the idle
///   share: 28x28 3x3 128 channels 1.87 -> 2.22 ms).
///
/// An output's chain is the same whichever task computes it, so results do not change.
fn split_work(
    g: &Geom,
    mut blocks: usize,
    max_blocks: usize,
    panels: usize,
    threads: usize,
    cheap_repeat: bool,
) -> Split {
    let images = g.n * g.g;
    let panel_major = cheap_repeat && g.og() > g.positions() && images < 8 * threads;
    let units = if panel_major {
        images
    } else {
        if images * blocks < 8 * threads {
            while !(images * blocks).is_multiple_of(threads) && blocks < max_blocks {
                blocks += 1;
            }
        }
        images * blocks
    };
    let mut splits = 1;
    if units < threads || (cheap_repeat && !units.is_multiple_of(threads)) {
        while (units * splits < threads || !(units * splits).is_multiple_of(threads))
            && splits < panels
        {
            splits += 1;
        }
    }
    Split {
        groups: g.g,
        blocks,
        panels,
        splits,
        per: panels.div_ceil(splits).max(1),
        tasks: units * splits,
        panel_major,
    }
}

/// A conv2d f32 call's tasks, as [`split_work`] cut them: task `t` is unit `t / splits`
/// (an image and group, with one position block or, `panel_major`, all of them) and panel
/// range `t % splits` (`per` panels each).
struct Split {
    groups: usize,
    blocks: usize,
    panels: usize,
    splits: usize,
    per: usize,
    tasks: usize,
    panel_major: bool,
}

impl Split {
    /// Task `t`'s image, group, position blocks and output-channel panels; `None` for a task
    /// whose panel range is empty (more splits than the panels fill).
    fn task(
        &self,
        t: usize,
    ) -> Option<(usize, usize, std::ops::Range<usize>, std::ops::Range<usize>)> {
        let (q, sp) = (t / self.splits, t % self.splits);
        let panels = sp * self.per..((sp + 1) * self.per).min(self.panels);
        if panels.is_empty() {
            return None;
        }
        let (g, b) = (self.groups, self.blocks);
        Some(if self.panel_major {
            (q / g, q % g, 0..b, panels)
        } else {
            (q / (g * b), (q / b) % g, q % b..q % b + 1, panels)
        })
    }
}

#[allow(clippy::too_many_arguments)]
fn gemm_tiles_f32(
    g: &Geom,
    xc: &[f32],
    wc: &[f32],
    prepacked: Option<&[f32]>,
    bc: &[f32],
    op: &OutPtr<f32>,
    pool: &dyn kernel_core::ThreadPool,
    epi: Option<&[Epilogue]>,
) {
    let (ckk, pos, og) = (g.ckk(), g.positions(), g.og());
    let panels = og.div_ceil(MR);
    // a leading relu goes into the tiles' last pass, as they store (a separate pass over a
    // 16 -> 64 1x1 layer's outputs at 55x55 cost a quarter of its time)
    let (relu, epi) = split_leading_relu(epi);
    let bp = bias_panels(g, bc);
    // Blocks of positions: at most the cache-sized block, a whole number of tiles each, their
    // sizes differing by at most one tile; with few tasks for the threads, as many blocks as
    // make the tasks a multiple of the thread count. (Fixed-size blocks of [1024, 1024, 1024,
    // 64] positions, or 7 on 2 threads, left a thread idle up to a third of the call.)
    let tiles = pos.div_ceil(NR);
    let threads = pool.num_threads().max(1);
    // A 1x1, stride-1, unpadded convolution's im2col block is the input itself (row l of a
    // block is channel l's plane from position p0 on): the tiles read it in place, row stride
    // the plane's size. (Its copy was a quarter of a small grouped 1x1 layer's time.) Same
    // values, same chains.
    let direct = g.kh == 1
        && g.kw == 1
        && g.sh == 1
        && g.sw == 1
        && g.pt == 0
        && g.pl == 0
        && (g.oh, g.ow) == (g.h, g.w);
    let split = split_work(
        g,
        // (read in place, a block's kernel rows are passes of at most 256: its working set is
        // a pass's, not all `ckk` rows': 1024 -> 512 1x1 at 14x14 ran 1.39 ms in blocks of
        // the whole plane, 1.60 in the 64 positions the `ckk` rows would allow)
        pos.div_ceil(f32_pos_block(if direct { ckk.min(256) } else { ckk })),
        tiles / 4,
        panels,
        threads,
        direct,
    );
    let blocks = split.blocks;
    // block b holds tiles b * tiles / blocks .. (b + 1) * tiles / blocks
    let block_range = |b: usize| {
        (
            b * tiles / blocks * NR,
            ((b + 1) * tiles / blocks * NR).min(pos),
        )
    };
    let pb = tiles.div_ceil(blocks) * NR;
    // the block's row stride: an odd number of cache lines, so that the rows a tile reads
    // (one line each) spread over every L1 set (a stride of 1024 floats put all of them in
    // one set: a 7x7 depthwise convolution ran 1.5x slower than with `gemm`)
    let ld = pb + if (pb / NR).is_multiple_of(2) { NR } else { 0 };
    let plane = g.h * g.w;
    // positions per tile: two vectors of the level's widest registers (blocks stay whole
    // numbers of NR, so a block's last tile may be a half one)
    let nr = tile_width();
    let pair_panels = nr == NR512 && pos <= 256;
    // kernel rows per pass over a block: a tile's `kc x nr` slice of the block (at most 16
    // KiB) stays in L1 while every output-channel panel uses it
    let kc = ckk.div_ceil(ckk.div_ceil(256 * NR / nr).max(1)).max(1);
    parallel_for(pool, split.tasks, 1, |range| {
        // (a reused scratch: a fresh zeroed block per task was a calloc and a memset of up
        // to a few hundred KiB per task; one thread, SqueezeNet's 3 -> 64 3x3 stride-2 stem
        // 470 -> 445 us. im2col writes every value the tiles read: a part-full tile's loads
        // are masked to its columns)
        with_scratch::<f32, _>(if direct { 0 } else { ckk * ld }, |col| {
            let mut packed_b = LineAligned::zeroed(if direct && split.per >= 16 {
                kc * nr
            } else {
                0
            });
            let packed = packed_b.as_mut_slice();
            for t in range {
                let Some((img, grp, bs, panel_range)) = split.task(t) else {
                    continue;
                };
                for b in bs {
                    let (p0, p1) = block_range(b);
                    let width = p1 - p0;
                    // Read in place, a tile's B rows lie a plane apart; with many output-channel panels
                    // to reuse them, they are first packed into one contiguous kc x NR slice (a 1x1
                    // layer 64 -> 256 at 56x56: 79 -> 86 GFLOP/s; with fewer than 16 panels the copy
                    // cost more than it saved). Same values, same chains.
                    let pack_b = direct && panel_range.len() >= 16;
                    // the block: `ckk` rows of `width` values, row l at `b0 + l * ldb`
                    let (b0, ldb) = if direct {
                        (&xc[(img * g.c + grp * ckk) * plane + p0..], plane)
                    } else {
                        g.im2col(xc, img, grp, 0..ckk, p0, p1, col, ld);
                        (&col[..], ld)
                    };
                    let mut applied = 0;
                    for l0 in (0..ckk).step_by(kc) {
                        let k = kc.min(ckk - l0);
                        for (j0, n) in tile_columns(width, nr, prepacked.is_some()) {
                            if pack_b {
                                for l in 0..k {
                                    let src = &b0[(l0 + l) * ldb + j0..(l0 + l) * ldb + j0 + n];
                                    copy_short(&mut packed[l * nr..l * nr + n], src);
                                }
                            }
                            let (bsrc, bld) = if pack_b {
                                (packed.as_ptr(), nr)
                            } else {
                                (b0[l0 * ldb + j0..].as_ptr(), ldb)
                            };
                            #[cfg(target_arch = "x86_64")]
                            if let Some(pw) = prepacked.filter(|_| {
                                n <= TAIL_COLS
                                    && matches!(
                                        simd_level(),
                                        SimdLevel::Avx2Fma | SimdLevel::Avx512
                                    )
                            }) {
                                // (a block's last one or two positions, along output channels,
                                // 8 / n panels at a time: panels c0..c1)
                                for c0 in panel_range.clone().step_by(8 / n) {
                                    let c1 = (c0 + 8 / n).min(panel_range.end);
                                    let ptrs = |q: usize| {
                                        let pi = (c0 + q).min(c1 - 1);
                                        let oc0 = grp * og + pi * MR;
                                        // (a repeated panel writes no rows)
                                        let mr = if c0 + q < c1 { MR.min(og - pi * MR) } else { 0 };
                                        (
                                            pw[((grp * panels + pi) * ckk + l0) * MR..][..k * MR]
                                                .as_ptr(),
                                            // SAFETY: row oc0 < o of image img at position p0 + j0
                                            // < pos: inside the output (checked above).
                                            unsafe {
                                                op.ptr().add((img * g.o + oc0) * pos + p0 + j0)
                                            },
                                            bp[(grp * panels + pi) * MR..][..MR].as_ptr(),
                                            mr,
                                        )
                                    };
                                    // (N columns, P panels at a time: 8 registers of sums)
                                    macro_rules! tail {
                                        ($n:literal, $p:literal) => {{
                                            let p: [_; $p] = std::array::from_fn(ptrs);
                                            tail_avx2::<$n, $p>(
                                                k,
                                                p.map(|t| t.0),
                                                bsrc,
                                                bld,
                                                p.map(|t| t.1),
                                                pos,
                                                p.map(|t| t.2),
                                                l0 == 0,
                                                relu && l0 + k == ckk,
                                                p.map(|t| t.3),
                                            )
                                        }};
                                    }
                                    // SAFETY: AVX2 and FMA (the level matched); each panel's k * MR
                                    // prepacked entries and MR bias entries are bounds-checked
                                    // slices; rows oc0..oc0 + mr (< o, the group's channels) at
                                    // positions p0 + j0.. (+ n <= pos) of image img are inside the
                                    // output and this task's alone (its panels, its block), as for
                                    // the tiles below; `bsrc` holds k rows of n columns (below).
                                    unsafe {
                                        if n == 1 {
                                            tail!(1, 8)
                                        } else {
                                            tail!(2, 4)
                                        }
                                    };
                                }
                                if let Some(steps) = epi.filter(|_| l0 + k == ckk) {
                                    let at = (img, grp, panel_range.clone());
                                    // SAFETY: as for the tiles' epilogue below.
                                    unsafe {
                                        epilogue_runs(
                                            steps,
                                            g,
                                            op,
                                            at,
                                            p0,
                                            width,
                                            j0 + n,
                                            &mut applied,
                                        )
                                    };
                                }
                                continue;
                            }
                            let mut next = panel_range.start;
                            while next < panel_range.end {
                                let pi = next;
                                // (on AVX-512, two panels a tile where the range has them and
                                // the layer is weight-heavy: one thread, 2048 -> 512 1x1 at 7x7
                                // 0.86 -> 0.73 ms, 256 -> 1024 at 14x14 0.73 -> 0.65; at 56x56,
                                // 5-8% slower)
                                let pair = pair_panels && pi + 1 < panel_range.end;
                                next += if pair { 2 } else { 1 };
                                let oc0 = grp * og + pi * MR;
                                let mr = (if pair { 2 * MR } else { MR }).min(og - pi * MR);
                                // The first column of a pass reads the pass's weight rows from
                                // memory: a model's weights do not stay in cache from one run to
                                // the next, and the rows of one panel are a short run the hardware
                                // prefetchers barely start on. So the next tile's weights are
                                // prefetched during this one.
                                if j0 == 0 && weight_prefetch() {
                                    for q in next..(next + 2).min(panel_range.end) {
                                        match prepacked {
                                            Some(pw) => prefetch_l2(
                                                pw[((grp * panels + q) * ckk + l0) * MR..].as_ptr(),
                                                k * MR,
                                            ),
                                            None => {
                                                let o0 = grp * og + q * MR;
                                                for r in o0..(o0 + MR).min(grp * og + og) {
                                                    prefetch_l2(wc[r * ckk + l0..].as_ptr(), k);
                                                }
                                            }
                                        }
                                    }
                                }
                                // SAFETY: `bsrc` is `packed` (k rows of stride nr whose first n
                                // values were just copied from b0's rows l0.., columns j0..; kc * nr
                                // long, k <= kc) or b0 from row l0, column j0 on. `b0` holds ckk rows
                                // of stride ldb >= width, of which rows l0..l0 + k (<= ckk), columns
                                // j0..j0 + n (<= width) are read: `col`
                                // just filled (ld >= pb >= width), or the input from channel grp *
                                // ckk's position p0 on, whose row l0 + k - 1's column j0 + n - 1 is
                                // input element (img * c + grp * ckk + l) * plane + p0 + j < n * c *
                                // plane (l < ckk = c / g channels of group grp, p0 + j < pos = plane);
                                // weight rows oc0..oc0 + mr (< o) of ckk elements, elements l0..l0 + k
                                // of each, are read (inside the o * ckk `wc`, checked above; or,
                                // prepacked, entries l0..l0 + k of the panel's [ckk][MR] block, inside
                                // the g * panels * ckk * MR floats `PackedWeight::fits` checked), and
                                // the panel's MR bias entries, inside `bp`; the
                                // destination rows oc0..oc0 + mr (< o: the group's channels) at
                                // positions p0 + j0.. (+ n <= pos) of image img lie inside the n * o *
                                // pos output (checked above), and only task t touches those rows
                                // (its panels) of that block of image img, group grp, positions
                                // p0..p1 (written by the l0 == 0 tile before later ones read it); the
                                // output is neither the input nor a task buffer. A `pair` is
                                // panels pi and pi + 1 (< the range's end <= panels): weight rows
                                // and bias entries of both, output rows oc0..oc0 + mr (mr counts
                                // both panels' rows, < o), all this task's; `pair_panels` holds
                                // only at NR512, which `tile_width` chose on an AVX-512 CPU.
                                unsafe {
                                    let (a, lda, las) = match prepacked {
                                        Some(pw) => (
                                            pw.as_ptr().add(((grp * panels + pi) * ckk + l0) * MR),
                                            1,
                                            MR,
                                        ),
                                        None => (wc.as_ptr().add(oc0 * ckk + l0), ckk, 1),
                                    };
                                    #[cfg(target_arch = "x86_64")]
                                    if pair {
                                        let a2 = match prepacked {
                                            Some(_) => a.add(ckk * MR),
                                            None => a.add(MR * lda),
                                        };
                                        tile_pair_avx512(
                                            k,
                                            (a, a2),
                                            lda,
                                            las,
                                            bsrc,
                                            bld,
                                            op.ptr().add((img * g.o + oc0) * pos + p0 + j0),
                                            pos,
                                            bp.as_ptr().add((grp * panels + pi) * MR),
                                            l0 == 0,
                                            relu && l0 + k == ckk,
                                            mr,
                                            n,
                                        );
                                        continue;
                                    }
                                    tile_f32(
                                        nr,
                                        k,
                                        a,
                                        lda,
                                        las,
                                        bsrc,
                                        bld,
                                        op.ptr().add((img * g.o + oc0) * pos + p0 + j0),
                                        pos,
                                        bp.as_ptr().add((grp * panels + pi) * MR),
                                        l0 == 0,
                                        relu && l0 + k == ckk,
                                        mr,
                                        n,
                                    )
                                };
                            }
                            // in the last pass, the epilogue on each run of finished positions
                            if let Some(steps) = epi.filter(|_| l0 + k == ckk) {
                                let at = (img, grp, panel_range.clone());
                                // SAFETY: this task's outputs (its panels' channels of image img,
                                // positions p0..p1 <= pos, the first j0 + n finished), which only
                                // it touches.
                                unsafe {
                                    epilogue_runs(steps, g, op, at, p0, width, j0 + n, &mut applied)
                                };
                            }
                        }
                    }
                }
            }
        })
    });
}

/// Output positions per application of an epilogue (their values for a task's output channels
/// stay in L2 from the pass that wrote them to the epilogue).
const EPILOGUE_RUN: usize = 256;

/// Apply a caller's epilogue (fused elementwise ops, [`Epilogue`]) to a task's outputs as they
/// are finished, while they are in cache. The outputs: the channels of output-channel panels
/// `panels` of group `grp`, image `img` (`at`), positions `p0..p0 + len`, of which the first
/// `done` are finished and the first `*applied` already had the epilogue. It is applied to the
/// finished rest once that makes a run of [`EPILOGUE_RUN`] positions, or reaches the end.
///
/// # Safety
/// Those outputs lie inside `op`'s `n * o * positions` output, and no other thread touches them
/// during the call; `*applied <= done <= len`.
#[allow(clippy::too_many_arguments)]
unsafe fn epilogue_runs(
    steps: &[Epilogue],
    g: &Geom,
    op: &OutPtr<f32>,
    (img, grp, panels): (usize, usize, std::ops::Range<usize>),
    p0: usize,
    len: usize,
    done: usize,
    applied: &mut usize,
) {
    if done == *applied || (done - *applied < EPILOGUE_RUN && done < len) {
        return;
    }
    let (og, pos) = (g.og(), g.positions());
    for pi in panels {
        for oc in grp * og + pi * MR..grp * og + (pi * MR + MR).min(og) {
            let at = (img * g.o + oc) * pos + p0 + *applied;
            // SAFETY: channel oc < o (a panel of group grp), finished positions p0 + applied..
            // p0 + done of image img: inside the output and this caller's alone (this
            // function's contract).
            let out = unsafe { std::slice::from_raw_parts_mut(op.ptr().add(at), done - *applied) };
            Epilogue::apply_all(steps, out, at);
        }
    }
    *applied = done;
}

/// Floats of a [`cv::cv_f32`] task's input block (256 KiB, inside a core's L2).
const SLAB_FLOATS: usize = 1 << 16;

fn conv2d_cpu(ctx: &mut KernelCtx) -> Result<()> {
    match ctx.input(0).dtype {
        DType::F32 => conv2d_f32::<f32>(ctx),
        DType::F16 => conv2d_f32::<f16>(ctx),
        DType::BF16 => conv2d_f32::<bf16>(ctx),
        dt => with_float!(dt, T => conv2d_k::<T>(ctx)),
    }
}

fn conv2d_backward_k<T: Scalar>(ctx: &mut KernelCtx) -> Result<()>
where
    T::C: Real,
{
    let (inputs, pool) = (ctx.inputs, ctx.pool);
    let (gr, x, wt) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    let g = Geom::new(x, wt, &Params::new(ctx.attrs)?)?;
    in_ptr::<T>(gr)?;
    let gc = to_c::<T>(gr)?;
    let xc = to_c::<T>(x)?;
    let wc = to_c::<T>(wt)?;
    let (ckk, pos, kk, og, cg) = (g.ckk(), g.positions(), g.kh * g.kw, g.og(), g.cg());
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

    // grad_weight, per group: [og, CKK] = sum_img grad[img, group] (og x P) * col[img]^T
    // (P x CKK)
    let mut gw = vec![T::C::ZERO; g.o * ckk];
    {
        let wp = OutPtr(gw.as_mut_ptr());
        let rb = 16usize;
        let row_blocks = ckk.div_ceil(rb);
        parallel_for(pool, g.g * row_blocks, 1, |range| {
            let mut col = vec![T::C::ZERO; rb * pos];
            for t in range {
                let (grp, b) = (t / row_blocks, t % row_blocks);
                let (r0, r1) = (b * rb, ((b + 1) * rb).min(ckk));
                let rows = r1 - r0;
                let oc0 = grp * og;
                for img in 0..g.n {
                    g.im2col(&xc, img, grp, r0..r1, 0, pos, &mut col[..rows * pos], pos);
                    // SAFETY: dst is the og x rows block [oc0.., r0..r1] of `gw` (o * ckk
                    // elements, row stride ckk, r1 <= ckk, oc0 + og <= o), written only by the
                    // task of (group, row block); lhs is grad[img, oc0..], og x pos inside `gc`
                    // (n * o * pos elements, checked above); rhs is the task-local `col`
                    // (rows * pos), read transposed. No operand aliases dst.
                    unsafe {
                        mm(
                            og,
                            rows,
                            pos,
                            wp.ptr().add(oc0 * ckk + r0),
                            ckk as isize,
                            1,
                            true,
                            gc.as_ptr().add((img * g.o + oc0) * pos),
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

    // grad_input[img, c] = col2im(W[group's og, c's taps]^T (KK x og) * grad[img, group]
    // (og x P))
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
                let (grp, lc) = (ch / cg, ch % cg);
                let oc0 = grp * og;
                dcol.fill(T::C::ZERO);
                // SAFETY: dst is the task-local `dcol`, kk x pos; lhs is W[oc0.., lc]^T, kk x og
                // with column stride ckk, whose last element (oc0 + og - 1) * ckk + lc*kk +
                // kk-1 is below o * ckk = wc.len(); rhs is grad[img, oc0..], og x pos inside
                // `gc` (checked above). dst aliases neither.
                unsafe {
                    mm(
                        kk,
                        pos,
                        og,
                        dcol.as_mut_ptr(),
                        pos as isize,
                        1,
                        false,
                        wc.as_ptr().add(oc0 * ckk + lc * kk),
                        1,
                        ckk as isize,
                        gc.as_ptr().add((img * g.o + oc0) * pos),
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
                        let Some(ih) = g.in_row(oh, ki) else {
                            continue;
                        };
                        let src = &dcol[i * pos + oh * g.ow..i * pos + (oh + 1) * g.ow];
                        let row = &mut dst[ih * g.w..(ih + 1) * g.w];
                        for (ow, &v) in src.iter().enumerate() {
                            if let Some(iw) = g.in_col(ow, kj) {
                                row[iw] = row[iw] + v;
                            }
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

#[cfg(test)]
mod onnx_tests {
    use super::*;
    use kernel_core::DType;

    struct Node {
        x: Vec<Option<usize>>,
        w: Vec<usize>,
        attrs: Vec<(&'static str, AttrValue)>,
    }
    impl OnnxNode for Node {
        fn since_version(&self) -> u32 {
            11
        }
        fn num_inputs(&self) -> usize {
            2
        }
        fn input(&self, i: usize) -> Option<std::result::Result<TensorSpec, String>> {
            Some(Ok(match i {
                0 => TensorSpec::with_dims(DType::F32, self.x.clone()),
                _ => TensorSpec::new(DType::F32, &self.w),
            }))
        }
        fn attr(&self, name: &str, _ty: &ArgType) -> Option<AttrValue> {
            self.attrs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        }
        fn const_ints(&self, _i: usize) -> Option<Vec<i64>> {
            None
        }
    }

    fn pads(
        node: &Node,
        given: Vec<(&'static str, AttrValue)>,
    ) -> std::result::Result<Vec<i64>, String> {
        let mut given = given;
        onnx_conv_check(node, &mut given)?;
        Ok(match given.iter().find(|(n, _)| *n == "padding") {
            Some((_, AttrValue::IntList(p))) => p.clone(),
            _ => vec![],
        })
    }

    #[test]
    fn auto_pad_resolves_as_onnx_defines_it() {
        let x = vec![Some(1), Some(2), Some(7), Some(6)];
        let same = |mode: &str| Node {
            x: x.clone(),
            w: vec![3, 2, 4, 3],
            attrs: vec![("auto_pad", AttrValue::Str(mode.into()))],
        };
        // height 7, stride 2: out 4, total pad (4-1)*2 + 4 - 7 = 3; width 6: out 3, 2*2+3-6 = 1
        let stride = vec![("stride", AttrValue::IntList(vec![2, 2]))];
        assert_eq!(
            pads(&same("SAME_UPPER"), stride.clone()).unwrap(),
            [1, 0, 2, 1]
        );
        assert_eq!(pads(&same("SAME_LOWER"), stride).unwrap(), [2, 1, 1, 0]);
        assert_eq!(pads(&same("VALID"), vec![]).unwrap(), [0, 0, 0, 0]);
        // NOTSET leaves the mapped `pads` alone
        assert_eq!(pads(&same("NOTSET"), vec![]).unwrap(), Vec::<i64>::new());
        // SAME over a dynamic spatial dim is not claimed
        let mut n = same("SAME_UPPER");
        n.x[2] = None;
        assert!(pads(&n, vec![]).unwrap_err().contains("dynamic"));
    }

    #[test]
    fn only_2d_convolutions_with_the_weight_s_kernel_shape() {
        let mut n = Node {
            x: vec![Some(1), Some(2), Some(9)],
            w: vec![3, 2, 3],
            attrs: vec![],
        };
        assert!(pads(&n, vec![]).unwrap_err().contains("2-D"));
        n.x = vec![Some(1), Some(2), Some(9), Some(9)];
        n.w = vec![3, 2, 3, 3];
        n.attrs = vec![("kernel_shape", AttrValue::IntList(vec![3, 2]))];
        assert!(pads(&n, vec![]).unwrap_err().contains("kernel_shape"));
        n.attrs = vec![("kernel_shape", AttrValue::IntList(vec![3, 3]))];
        assert!(pads(&n, vec![]).is_ok());
    }
}

#[cfg(test)]
mod depthwise_tests {
    use super::*;
    use kernel_core::{AttrValue, Epilogue, KernelCtx, OwnedTensor, RayonPool, SerialPool};

    /// Deterministic values in [-1, 1) (a small LCG; no test dependency needed).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn geom(
        c: usize,
        og: usize,
        hw: [usize; 2],
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
    ) -> [Geom; 4] {
        // paddings: none, symmetric, asymmetric, wider than the kernel (whole padded rows)
        [[0, 0, 0, 0], [1, 1, 1, 1], [0, 2, 1, 3], [4, 0, 5, 6]]
            .map(|p| geomk(2, c, c * og, c, hw, k, s, d, p))
    }

    /// A geometry: `n` images, `c` channels in `g` groups, `o` outputs, kernel `k`, stride
    /// `s`, dilation `d`, pads top, bottom, left, right.
    #[allow(clippy::too_many_arguments)]
    fn geomk(
        n: usize,
        c: usize,
        o: usize,
        g: usize,
        hw: [usize; 2],
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
    ) -> Geom {
        let [pt, pb, pl, pr] = p;
        let out = |len: usize, k: usize, p: usize, s: usize, d: usize| {
            (len + p - (k - 1) * d - 1) / s + 1
        };
        Geom {
            n,
            c,
            h: hw[0],
            w: hw[1],
            o,
            g,
            kh: k[0],
            kw: k[1],
            oh: out(hw[0], k[0], pt + pb, s[0], d[0]),
            ow: out(hw[1], k[1], pl + pr, s[1], d[1]),
            sh: s[0],
            sw: s[1],
            dh: d[0],
            dw: d[1],
            pt,
            pl,
        }
    }

    /// A 3x3 stride-1 geometry.
    fn geom3(n: usize, c: usize, o: usize, g: usize, hw: [usize; 2], p: [usize; 4]) -> Geom {
        geomk(n, c, o, g, hw, [3, 3], [1, 1], [1, 1], p)
    }

    /// The path vectorized along output channels (`cv::cv_f32`: a padded copy of the input
    /// rows, broadcast into 16-channel panels) gives the im2col tiles'
    /// bits (same fma chains, a -0.0 bias kept) and is within float32 rounding of a float64
    /// reference: tiles spanning rows, several channel passes and row blocks, groups, partial
    /// panels, asymmetric pads and pads wider than the kernel, strides, dilations, kernels from
    /// 1x1 (the path takes them too, though `cv_applies` leaves them to the tiles) to 11x11.
    #[test]
    fn channel_vectorized_path_matches_the_tiles_bit_for_bit_and_a_float64_reference() {
        // (the CPU's own level: other tests force the process-wide one meanwhile)
        if !matches!(
            crate::cpu_simd_level(),
            SimdLevel::Avx2Fma | SimdLevel::Avx512
        ) {
            return; // (the path runs only on AVX2 CPUs; `simd_levels.rs` covers the rest)
        }
        let cases = [
            // rows of 16; 13 outputs: one partial panel
            geom3(2, 8, 13, 1, [6, 16], [1, 1, 1, 1]),
            // 70 channels: three passes of at most 28; two row blocks; 33 outputs: three
            // panels, the last of one channel
            geom3(1, 70, 33, 1, [40, 28], [1, 1, 1, 1]),
            // two groups, asymmetric pads, rows of 56
            geom3(2, 12, 12, 2, [9, 54], [0, 2, 1, 3]),
            // pads wider than the kernel: whole padded rows and columns; rows of 39
            geom3(1, 4, 7, 1, [5, 30], [4, 0, 5, 6]),
            // rows of 7, three groups of two channels
            geom3(2, 6, 9, 3, [7, 7], [1, 1, 1, 1]),
            // one output position
            geom3(1, 5, 6, 1, [3, 3], [0, 0, 0, 0]),
            // more output channels than positions: tasks split over panels (panel-major)
            geom3(1, 40, 60, 1, [5, 6], [1, 1, 1, 1]),
            // 5x5, stride (2, 1), dilation (1, 2), two groups, asymmetric pads
            geomk(1, 6, 20, 2, [17, 19], [5, 5], [2, 1], [1, 2], [2, 0, 1, 3]),
            // 7x7 stride 2 (a network's first layer)
            geomk(2, 3, 16, 1, [30, 31], [7, 7], [2, 2], [1, 1], [3, 3, 3, 3]),
            // a 2x3 kernel, stride (3, 2), dilation (2, 1), unpadded
            geomk(3, 4, 33, 1, [11, 11], [2, 3], [3, 2], [2, 1], [0, 0, 0, 0]),
            // 11x11 stride 4: 121 taps a channel, two channels a pass
            geomk(
                1,
                5,
                17,
                1,
                [40, 43],
                [11, 11],
                [4, 4],
                [1, 1],
                [0, 0, 2, 1],
            ),
            // 1x1 with pads, and 1x1 at stride 2, 300 channels in two passes
            geomk(2, 10, 18, 2, [6, 9], [1, 1], [1, 1], [1, 1], [1, 0, 2, 1]),
            geomk(1, 300, 24, 1, [9, 8], [1, 1], [2, 2], [1, 1], [0, 0, 0, 0]),
            // 1x1 stride 2, 600 channels: several blocks of output rows
            geomk(
                1,
                600,
                20,
                1,
                [39, 24],
                [1, 1],
                [2, 2],
                [1, 1],
                [0, 0, 0, 0],
            ),
        ];
        for g in cases {
            let x = values(g.n * g.c * g.h * g.w, 1);
            let w = values(g.o * g.ckk(), 2);
            let mut b = values(g.o, 3);
            b[0] = -0.0;
            let len = g.n * g.o * g.positions();
            let (mut cv, mut tiles) = (vec![f32::NAN; len], vec![f32::NAN; len]);
            cv::cv_f32(
                cv::panel_width(g.og()),
                &g,
                &x,
                &w,
                None,
                &b,
                &OutPtr(cv.as_mut_ptr()),
                &RayonPool,
                None,
            );
            gemm_tiles_f32(
                &g,
                &x,
                &w,
                None,
                &b,
                &OutPtr(tiles.as_mut_ptr()),
                &SerialPool,
                None,
            );
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&cv), bits(&tiles), "{g:?}");
            assert_near_f64_reference(&g, &x, &w, &b, &cv);
        }
    }

    /// `got` (`[n, o, oh, ow]`) is within float32 rounding of a float64 convolution of `x`,
    /// `w`, `b` (at most `ckk + 1` roundings of the magnitudes summed).
    fn assert_near_f64_reference(g: &Geom, x: &[f32], w: &[f32], b: &[f32], got: &[f32]) {
        let (cg, og) = (g.cg(), g.og());
        for img in 0..g.n {
            for oc in 0..g.o {
                for p in 0..g.positions() {
                    let (oh, ow) = (p / g.ow, p % g.ow);
                    let (mut want, mut mag) = (b[oc] as f64, (b[oc] as f64).abs());
                    for ci in 0..cg {
                        for ki in 0..g.kh {
                            for kj in 0..g.kw {
                                if let (Some(ih), Some(iw)) = (g.in_row(oh, ki), g.in_col(ow, kj)) {
                                    let ch = oc / og * cg + ci;
                                    let xv = x[((img * g.c + ch) * g.h + ih) * g.w + iw];
                                    let wv = w[((oc * cg + ci) * g.kh + ki) * g.kw + kj];
                                    let t = wv as f64 * xv as f64;
                                    want += t;
                                    mag += t.abs();
                                }
                            }
                        }
                    }
                    let got = got[(img * g.o + oc) * g.positions() + p] as f64;
                    let tol = (g.ckk() + 1) as f64 * 2f64.powi(-24) * mag;
                    assert!(
                        (got - want).abs() <= tol,
                        "{g:?} {img} {oc} {p}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The relu op's epilogue, as a one-step chain.
    fn relu_epilogue() -> [Epilogue<'static>; 1] {
        match crate::registry().lookup("relu").unwrap().epilogue {
            Some(kernel_core::EpilogueFn::Unary(f)) => [Epilogue::Unary(f)],
            _ => unreachable!("relu has a unary epilogue form"),
        }
    }

    /// A fused relu is relu's own bits, also where a path applies it in registers (the
    /// channel-vectorized path's unpacking): a NaN output stays NaN and a -0 output stays -0
    /// (`v < 0 ? 0 : v`), on a 3x3 layer (that path where the CPU has AVX2) and a 1x1 layer.
    #[test]
    fn fused_relu_keeps_nan_and_negative_zero() {
        let op = crate::registry().lookup("conv2d").unwrap();
        let relu = relu_epilogue();
        for k in [3, 1] {
            let (c, o, hw) = (16, 40, 10);
            // every input negative, one NaN; output channel 0 has zero weights and bias -0,
            // so its outputs are -0 (each tap adds 0 * x = -0 to -0) or NaN
            let mut xs: Vec<f32> = values(c * hw * hw, 1)
                .iter()
                .map(|v| -v.abs() - 0.5)
                .collect();
            xs[3 * hw + 4] = f32::NAN;
            let mut ws = values(o * c * k * k, 2);
            ws[..c * k * k].fill(0.0);
            let mut bs = values(o, 3);
            bs[0] = -0.0;
            let x = OwnedTensor::from_vec(xs, &[1, c, hw, hw]).unwrap();
            let w = OwnedTensor::from_vec(ws, &[o, c, k, k]).unwrap();
            let b = OwnedTensor::from_vec(bs, &[o]).unwrap();
            let attrs = op.bind_attrs(vec![]).unwrap();
            let run = |epi: bool| {
                let ins = [Some(x.view()), Some(w.view()), Some(b.view())];
                let spec = &op.infer_concrete(&ins, &attrs).unwrap()[0];
                let mut out = OwnedTensor::zeros(DType::F32, &spec.concrete().unwrap());
                {
                    let mut outs = [out.view_mut()];
                    let mut ctx = KernelCtx::new(op, &ins, &mut outs, &attrs, &RayonPool)
                        .with_epilogue(epi.then_some(&relu[..]));
                    (op.cpu)(&mut ctx).unwrap();
                    if ctx.take_epilogue().is_some() {
                        Epilogue::apply_all(&relu, outs[0].as_mut_slice::<f32>().unwrap(), 0);
                    }
                }
                out.to_vec::<f32>().unwrap()
            };
            let plain = run(false);
            let want: Vec<u32> = plain
                .iter()
                .map(|&v| if v < 0.0 { 0.0f32 } else { v }.to_bits())
                .collect();
            let got: Vec<u32> = run(true).iter().map(|v| v.to_bits()).collect();
            let pos = plain.len() / o;
            let neg_zeros = want[..pos]
                .iter()
                .filter(|&&b| b == (-0.0f32).to_bits())
                .count();
            let nans = want.iter().filter(|&&b| f32::from_bits(b).is_nan()).count();
            assert!(
                neg_zeros > pos / 2 && nans >= o,
                "{k}x{k}: {neg_zeros} -0, {nans} NaN"
            );
            assert!(want.iter().filter(|&&b| b == 0).count() > want.len() / 5);
            assert_eq!(got, want, "{k}x{k}");
        }
    }

    /// Weights prepacked once for a caller that knows them constant ([`conv2d_prepack`], as
    /// ONNX Runtime's provider does for initializers) give the bits of the same call unpacked,
    /// within float32 rounding of a float64 reference, on both paths that read them (the tiles:
    /// 1x1 layers; the channel-vectorized path: larger kernels, where the CPU has AVX2); the
    /// kernel reads them (an altered packed copy changes the result), and ignores a form
    /// packed for another weight shape or group count.
    #[test]
    fn prepacked_weights_give_the_unpacked_bits_and_a_float64_reference() {
        let op = crate::registry().lookup("conv2d").unwrap();
        let relu = relu_epilogue();
        // (n, c, [h, w], o, kernel, stride, pad, groups)
        let cases = [
            // 1x1 at 7x7, read in place: 17 panels (the last of 4 rows), B rows packed; the
            // 49th position of each image along output channels (`tail_avx2`, 8 panels at a
            // time: 8, 8 and 1)
            (1, 40, [7, 7], 100, 1, 1, 0, 1),
            // 1x1 at 6x3: a last tile of 2 positions (4 panels at a time: 4 and 3)
            (2, 24, [6, 3], 40, 1, 1, 0, 1),
            // 1x1 at stride 2 (im2col), two groups of 11 outputs
            (2, 12, [9, 9], 22, 1, 2, 0, 2),
            // 1x1, 300 channels: two passes over the kernel rows (a tail of 4: the tiles)
            (1, 300, [6, 6], 20, 1, 1, 0, 1),
            // 1x1, 300 channels at 1x17: a tail of one position over two passes
            (1, 300, [1, 17], 13, 1, 1, 0, 1),
            // 3x3: panels of 16, the last of one channel; several channel passes
            (1, 70, [10, 10], 33, 3, 1, 1, 1),
            // 3x3, two channel passes: prepacked, 100 positions in chunks of 48, 48 and 4
            (1, 20, [10, 10], 33, 3, 1, 1, 1),
            // 5x5 at stride 2 in three groups
            (2, 12, [11, 11], 12, 5, 2, 2, 3),
        ];
        for (n, c, [h, wd], o, k, s, p, grp) in cases {
            let x = OwnedTensor::from_vec(values(n * c * h * wd, 1), &[n, c, h, wd]).unwrap();
            let w =
                OwnedTensor::from_vec(values(o * c / grp * k * k, 2), &[o, c / grp, k, k]).unwrap();
            let b = OwnedTensor::from_vec(values(o, 3), &[o]).unwrap();
            let attrs = op
                .bind_attrs(vec![
                    ("stride", AttrValue::Int(s as i64)),
                    ("padding", AttrValue::Int(p as i64)),
                    ("groups", AttrValue::Int(grp as i64)),
                ])
                .unwrap();
            let run_with = |prepacked: &[(usize, kernel_core::Prepacked)], epi: bool| {
                let ins = [Some(x.view()), Some(w.view()), Some(b.view())];
                let spec = &op.infer_concrete(&ins, &attrs).unwrap()[0];
                let mut out = OwnedTensor::zeros(DType::F32, &spec.concrete().unwrap());
                {
                    let mut outs = [out.view_mut()];
                    let mut ctx = KernelCtx::new(op, &ins, &mut outs, &attrs, &RayonPool)
                        .with_prepacked(prepacked)
                        .with_epilogue(epi.then_some(&relu[..]));
                    (op.cpu)(&mut ctx).unwrap();
                    if ctx.take_epilogue().is_some() {
                        Epilogue::apply_all(&relu, outs[0].as_mut_slice::<f32>().unwrap(), 0);
                    }
                }
                out.to_vec::<f32>().unwrap()
            };
            let run = |prepacked: &[(usize, kernel_core::Prepacked)]| run_with(prepacked, false);
            let case = format!("{n}x{c}x{h}x{wd} -> {o}, {k}x{k}, stride {s}, groups {grp}");
            let pack = || conv2d_prepack(1, &w.view(), &attrs).expect("a weight to prepack");
            let plain = run(&[]);
            let got = run(&[(1, pack())]);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&plain), "{case}");
            let g = geomk(n, c, o, grp, [h, wd], [k, k], [s, s], [1, 1], [p; 4]);
            let (xs, ws) = (x.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
            assert_near_f64_reference(&g, &xs, &ws, &b.to_vec::<f32>().unwrap(), &got);
            // with a fused relu: the bits of the relu applied to the unpacked result
            let relu_plain: Vec<f32> = plain
                .iter()
                .map(|&v| if v > 0.0 { v } else { 0.0 })
                .collect();
            assert!(relu_plain.iter().filter(|v| **v == 0.0).count() > relu_plain.len() / 5);
            assert_eq!(
                bits(&run_with(&[(1, pack())], true)),
                bits(&relu_plain),
                "{case}"
            );
            // the kernel computes from the packed copy: its first weight (output channel 0,
            // kernel row 0 on either layout) altered changes output channel 0
            let mut altered = pack();
            altered
                .downcast_mut::<PackedWeight>()
                .unwrap()
                .data
                .as_mut_slice()[0] += 1.0;
            assert_ne!(bits(&run(&[(1, altered)])), bits(&plain), "{case}");
            // a form packed for one more output channel, or for another group count, does
            // not fit this weight: computed from the weight itself
            let w2 = OwnedTensor::from_vec(
                values((o + grp) * c / grp * k * k, 2),
                &[o + grp, c / grp, k, k],
            )
            .unwrap();
            let other = conv2d_prepack(1, &w2.view(), &attrs).unwrap();
            assert_eq!(bits(&run(&[(1, other)])), bits(&plain), "{case}");
            if grp > 1 {
                let one = op.bind_attrs(vec![("groups", AttrValue::Int(1))]).unwrap();
                let wide = OwnedTensor::from_vec(values(o * c * k * k, 2), &[o, c, k, k]).unwrap();
                let mut other = conv2d_prepack(1, &wide.view(), &one).unwrap();
                // (same shape as `w` but packed for one group)
                let pw = other.downcast_mut::<PackedWeight>().unwrap();
                pw.shape = w.view().shape.to_vec();
                assert_eq!(bits(&run(&[(1, other)])), bits(&plain), "{case}");
            }
        }
    }

    /// 1x1 layers read in place, with their B rows packed per tile (16 or more panels) or
    /// not: every output is its own fma chain from its bias, bit for bit.
    #[test]
    fn one_by_one_layers_with_many_panels_are_each_output_s_fma_chain() {
        // 1x1, stride 1, unpadded: read in place; 100 and 17 output channels (17 and 3
        // panels: packed and unpacked B), 20x19 positions (a 12-position tail), 2 groups;
        // 400 output channels: more than positions, tasks split over panels (panel-major);
        // one 14x14 image of 800 channels: 3 blocks for 2 threads, each split over panels
        for (n, c, o, g, [h, w]) in [
            (2, 8, 100, 1, [20, 19]),
            (2, 10, 34, 2, [20, 19]),
            (2, 6, 17, 1, [20, 19]),
            (2, 8, 400, 1, [20, 19]),
            (1, 800, 20, 1, [14, 14]),
        ] {
            let geo = Geom {
                n,
                c,
                h,
                w,
                o,
                g,
                kh: 1,
                kw: 1,
                oh: h,
                ow: w,
                sh: 1,
                sw: 1,
                dh: 1,
                dw: 1,
                pt: 0,
                pl: 0,
            };
            let (pos, cg) = (h * w, c / g);
            let x = values(n * c * pos, 1);
            let wt = values(o * cg, 2);
            let b = values(o, 3);
            let mut got = vec![f32::NAN; n * o * pos];
            gemm_tiles_f32(
                &geo,
                &x,
                &wt,
                None,
                &b,
                &OutPtr(got.as_mut_ptr()),
                &RayonPool,
                None,
            );
            for img in 0..n {
                for oc in 0..o {
                    let grp = oc / (o / g);
                    for p in 0..pos {
                        let want = (0..cg).fold(b[oc], |acc, l| {
                            wt[oc * cg + l].mul_add(x[(img * c + grp * cg + l) * pos + p], acc)
                        });
                        let at = (img * o + oc) * pos + p;
                        assert_eq!(
                            got[at].to_bits(),
                            want.to_bits(),
                            "{c} {o} {g}: {img} {oc} {p}"
                        );
                    }
                }
            }
        }
    }

    /// The direct depthwise path gives the tiles' bits (same fma chains), including a -0.0
    /// bias, padded taps and both pools; and both are within float32 rounding of a float64
    /// reference (an independent check that the chains are the convolution).
    #[test]
    fn depthwise_path_matches_the_tiles_bit_for_bit_and_a_float64_reference() {
        let shapes = [
            (3, 1, [9, 11], [3, 3], [1, 1], [1, 1]),
            (4, 1, [12, 13], [3, 3], [2, 2], [1, 1]),
            (2, 2, [10, 9], [3, 2], [1, 3], [2, 1]),
            (5, 1, [7, 7], [5, 5], [1, 1], [1, 1]),
            (3, 3, [20, 37], [3, 3], [2, 1], [1, 2]),
            (2, 4, [8, 10], [3, 3], [1, 1], [1, 1]),
            (3, 2, [6, 9], [2, 3], [1, 1], [2, 2]),
            (2, 1, [5, 1], [1, 1], [1, 3], [1, 1]),
            // stride 2 across columns (its own deinterleaving fill): even widths, dilation
            (3, 2, [10, 16], [3, 2], [1, 2], [1, 2]),
            (2, 1, [9, 8], [5, 5], [2, 2], [1, 1]),
            // stride-2 columns in AVX2 (8 outputs a chunk, 4 chunks at a time): rows of 14
            // (a 6-output tail), of exactly 16 and of 17 to 19 (a 1-3 output tail), chunk
            // counts that leave 1-3 of 4, a row stride of 1 and 2, column dilation
            (3, 1, [28, 28], [3, 3], [2, 2], [1, 1]),
            (2, 1, [15, 32], [3, 3], [1, 2], [1, 1]),
            (2, 2, [19, 35], [3, 3], [2, 2], [2, 1]),
            (2, 1, [7, 40], [3, 3], [1, 2], [1, 2]),
        ];
        for (c, og, hw, k, s, d) in shapes {
            for g in geom(c, og, hw, k, s, d) {
                let x = values(g.n * g.c * g.h * g.w, 1);
                let w = values(g.o * g.kh * g.kw, 2);
                let mut b = values(g.o, 3);
                b[0] = -0.0;
                let len = g.n * g.o * g.positions();
                let (mut direct, mut tiles) = (vec![f32::NAN; len], vec![f32::NAN; len]);
                depthwise_f32(&g, &x, &w, &b, &OutPtr(direct.as_mut_ptr()), &SerialPool);
                gemm_tiles_f32(
                    &g,
                    &x,
                    &w,
                    None,
                    &b,
                    &OutPtr(tiles.as_mut_ptr()),
                    &RayonPool,
                    None,
                );
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&direct),
                    bits(&tiles),
                    "{c} {og} {hw:?} {k:?} {s:?} {d:?} pads {} {}",
                    g.pt,
                    g.pl
                );
                for img in 0..g.n {
                    for oc in 0..g.o {
                        for p in 0..g.positions() {
                            let (oh, ow) = (p / g.ow, p % g.ow);
                            let (mut want, mut mag) = (b[oc] as f64, (b[oc] as f64).abs());
                            for ki in 0..g.kh {
                                for kj in 0..g.kw {
                                    if let (Some(ih), Some(iw)) =
                                        (g.in_row(oh, ki), g.in_col(ow, kj))
                                    {
                                        let xv =
                                            x[((img * g.c + oc / og) * g.h + ih) * g.w + iw] as f64;
                                        let t = w[oc * g.kh * g.kw + ki * g.kw + kj] as f64 * xv;
                                        want += t;
                                        mag += t.abs();
                                    }
                                }
                            }
                            let got = direct[(img * g.o + oc) * g.positions() + p] as f64;
                            // one float32 rounding per tap, relative to the sum of magnitudes
                            let tol = (g.kh * g.kw + 1) as f64 * 2f64.powi(-24) * mag;
                            assert!((got - want).abs() <= tol, "{got} vs {want} (tol {tol})");
                        }
                    }
                }
                // the -0.0 bias survives where every tap is padding (a chain of fma(w, 0, -0))
                assert!(direct.iter().all(|v| !v.is_nan()));
            }
        }
    }
}
