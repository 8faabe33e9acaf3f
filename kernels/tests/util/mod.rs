//! Test helpers: building tensors of any dtype from f64 values, strided views, running ops,
//! tolerance checks and a generic central-difference gradient check driven by the op's
//! `Backward` metadata.
#![allow(dead_code)]

use kernel_core::exec::run_op;
use kernel_core::half::{bf16, f16};
use kernel_core::{
    contiguous_strides, AttrValue, BwdInput, DType, Error, OwnedTensor, RayonPool, SerialPool,
    TensorRef, ThreadPool,
};

pub const FLOAT: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];
pub const NUMERIC: [DType; 6] = [
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
];

/// A tensor of `dtype` holding `vals` rounded to that dtype.
pub fn tensor(vals: &[f64], shape: &[usize], dtype: DType) -> OwnedTensor {
    let r = match dtype {
        DType::F16 => {
            OwnedTensor::from_vec(vals.iter().map(|&v| f16::from_f64(v)).collect(), shape)
        }
        DType::BF16 => {
            OwnedTensor::from_vec(vals.iter().map(|&v| bf16::from_f64(v)).collect(), shape)
        }
        DType::F32 => OwnedTensor::from_vec(vals.iter().map(|&v| v as f32).collect(), shape),
        DType::F64 => OwnedTensor::from_vec(vals.to_vec(), shape),
        DType::I32 => OwnedTensor::from_vec(vals.iter().map(|&v| v as i32).collect(), shape),
        DType::I64 => OwnedTensor::from_vec(vals.iter().map(|&v| v as i64).collect(), shape),
        DType::Bool => OwnedTensor::from_vec(vals.iter().map(|&v| v != 0.0).collect(), shape),
    };
    r.unwrap()
}

pub fn f64t(vals: &[f64], shape: &[usize]) -> OwnedTensor {
    tensor(vals, shape, DType::F64)
}

/// Values of any tensor as f64.
pub fn vals(t: &OwnedTensor) -> Vec<f64> {
    match t.dtype {
        DType::F16 => t
            .as_slice::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::BF16 => t
            .as_slice::<bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::F32 => t
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DType::F64 => t.as_slice::<f64>().unwrap().to_vec(),
        DType::I32 => t
            .as_slice::<i32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DType::I64 => t
            .as_slice::<i64>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DType::Bool => t
            .as_slice::<bool>()
            .unwrap()
            .iter()
            .map(|&v| v as u8 as f64)
            .collect(),
    }
}

/// Round-trip values through a dtype (what the kernel actually sees).
pub fn rounded(v: &[f64], dtype: DType) -> Vec<f64> {
    vals(&tensor(v, &[v.len()], dtype))
}

/// A deterministic xorshift generator.
pub struct XRng(u64);
impl XRng {
    pub fn new(seed: u64) -> Self {
        XRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    /// Small integers in [lo, hi] as f64 (exact in every dtype when small).
    pub fn ints(&mut self, n: usize, lo: i64, hi: i64) -> Vec<f64> {
        (0..n)
            .map(|_| (lo + (self.next_u64() % (hi - lo + 1) as u64) as i64) as f64)
            .collect()
    }
}

/// A non-contiguous tensor: its storage holds the data with every axis reversed in memory
/// order (a transpose), and `view()` reads it back with permuted strides so the logical values
/// equal the input's. For rank >= 2 the view is never contiguous.
pub struct Strided {
    pub storage: OwnedTensor,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
}

impl Strided {
    pub fn new(t: &OwnedTensor) -> Strided {
        let shape = t.shape.clone();
        let rank = shape.len();
        let rev: Vec<usize> = shape.iter().rev().copied().collect();
        let mut storage = OwnedTensor::zeros(t.dtype, &rev);
        let es = t.dtype.size();
        let src = t.as_bytes().to_vec();
        let rs = contiguous_strides(&rev);
        let n = t.numel();
        {
            let p = storage.view_mut().ptr();
            let dst_bytes: &mut [u8] = if n == 0 {
                &mut []
            } else {
                // SAFETY: `storage` is a fresh, zero-filled contiguous tensor of `n` elements
                // of `es` bytes (the reversed shape has the same numel), so `p` points to
                // `n * es` initialised bytes; `u8` needs no alignment, and `storage` is not
                // touched otherwise until `dst_bytes` is dropped at the end of this block.
                unsafe { std::slice::from_raw_parts_mut(p, n * es) }
            };
            let cs = contiguous_strides(&shape);
            for flat in 0..n {
                // multi-index of flat in shape
                let mut rem = flat;
                let mut off = 0isize;
                for d in 0..rank {
                    let i = rem / cs[d] as usize;
                    rem %= cs[d] as usize;
                    off += i as isize * rs[rank - 1 - d];
                }
                let o = off as usize * es;
                dst_bytes[o..o + es].copy_from_slice(&src[flat * es..flat * es + es]);
            }
        }
        let strides: Vec<isize> = (0..rank).map(|d| rs[rank - 1 - d]).collect();
        Strided {
            storage,
            shape,
            strides,
        }
    }
    pub fn view(&self) -> TensorRef<'_> {
        self.storage
            .view()
            .restrided(self.shape.clone(), self.strides.clone())
    }
}

pub fn attrs_of(op: &str, attrs: &[(&str, AttrValue)]) -> kernel_core::Result<kernel_core::Attrs> {
    let op = polyop_kernels::registry().lookup(op)?;
    op.bind_attrs(attrs.iter().map(|(n, v)| (*n, v.clone())))
}

/// Run `op` on views with the serial pool.
pub fn run_views(
    op: &str,
    inputs: &[Option<TensorRef>],
    attrs: &[(&str, AttrValue)],
    pool: &dyn ThreadPool,
) -> Result<Vec<OwnedTensor>, Error> {
    let def = polyop_kernels::registry().lookup(op)?;
    let a = def.bind_attrs(attrs.iter().map(|(n, v)| (*n, v.clone())))?;
    // absent trailing optional inputs may be left out
    let mut inputs = inputs.to_vec();
    let optional = def
        .schema
        .tensor_args()
        .skip(inputs.len())
        .all(|a| a.ty == kernel_core::ArgType::OptionalTensor);
    if optional {
        inputs.resize(def.num_inputs().max(inputs.len()), None);
    }
    run_op(def, &inputs, &a, pool)
}

/// Run `op` on owned tensors (None = absent optional input), serially.
pub fn run(
    op: &str,
    inputs: &[Option<&OwnedTensor>],
    attrs: &[(&str, AttrValue)],
) -> Result<Vec<OwnedTensor>, Error> {
    let views: Vec<Option<TensorRef>> = inputs.iter().map(|t| t.map(|t| t.view())).collect();
    run_views(op, &views, attrs, &SerialPool)
}

pub fn run_ok(op: &str, inputs: &[&OwnedTensor], attrs: &[(&str, AttrValue)]) -> Vec<OwnedTensor> {
    let ins: Vec<Option<&OwnedTensor>> = inputs.iter().map(|t| Some(*t)).collect();
    run(op, &ins, attrs).unwrap_or_else(|e| panic!("{op} failed: {e}"))
}

/// The error message of a failing call (panics if it succeeds).
pub fn run_err(op: &str, inputs: &[Option<&OwnedTensor>], attrs: &[(&str, AttrValue)]) -> String {
    match run(op, inputs, attrs) {
        Ok(_) => panic!("{op} was expected to fail"),
        Err(e) => e.to_string(),
    }
}

pub fn assert_err_contains(
    op: &str,
    inputs: &[Option<&OwnedTensor>],
    attrs: &[(&str, AttrValue)],
    want: &str,
) {
    let msg = run_err(op, inputs, attrs);
    assert!(msg.contains(want), "error `{msg}` should contain `{want}`");
    assert!(
        msg.starts_with(&format!("polyop.{op}:")),
        "error `{msg}` should name the op"
    );
}

/// The per-op tolerances in ulps, with their justification: one table shared with the
/// conformance harness (python/polyop/conformance/tolerances.txt).
const TOLERANCES: &str = include_str!("../../../python/polyop/conformance/tolerances.txt");

/// `op`'s tolerance in ulps (panics for an op missing from the table).
pub fn ulps(op: &str) -> f64 {
    TOLERANCES
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some(op)).then(|| it.next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no tolerance for op `{op}` in tolerances.txt"))
}

/// The ulp of 1.0 in `dtype` (0 for integers: exact).
pub fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        DType::F32 => 2f64.powi(-23),
        DType::F64 => 2f64.powi(-52),
        _ => 0.0,
    }
}

/// The smallest positive normal number of `dtype` (0 for integers).
pub fn smallest_normal(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-14),
        DType::BF16 | DType::F32 => 2f64.powi(-126),
        DType::F64 => 2f64.powi(-1022),
        _ => 0.0,
    }
}

/// `got` equals the exact `want` within the tolerance of the op named by `what`'s first word
/// (see [`ulps`]): `|got - want| <= ulps * eps * |want| + ulps * smallest_normal`. NaN must
/// match NaN, infinities exactly.
pub fn assert_close(got: &[f64], want: &[f64], dtype: DType, what: &str) {
    assert_close_scaled(got, want, None, dtype, what)
}

/// [`assert_close`] with the error bound relative to `scale` (e.g. the sum of |terms| of a
/// computed sum) instead of `|want|`.
pub fn assert_close_scaled(
    got: &[f64],
    want: &[f64],
    scale: Option<&[f64]>,
    dtype: DType,
    what: &str,
) {
    let op = what.split_whitespace().next().unwrap_or(what);
    let u = ulps(op);
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let s = scale.map_or(w.abs(), |s| s[i]);
        let bound = u * eps(dtype) * s + u * smallest_normal(dtype);
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= bound
        };
        assert!(
            ok,
            "{what}: element {i}: got {g}, want {w} ({dtype}, {u} ulps of {op}: bound {bound:e})"
        );
    }
}

/// Outputs bitwise equal (same dtype, shape and bytes).
pub fn assert_bitwise(a: &[OwnedTensor], b: &[OwnedTensor], what: &str) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.dtype, y.dtype, "{what}");
        assert_eq!(x.shape, y.shape, "{what}");
        assert!(
            x.as_bytes() == y.as_bytes(),
            "{what}: outputs differ bitwise"
        );
    }
}

/// Serial vs rayon (several thread counts) give bitwise-identical outputs.
pub fn assert_thread_independent(
    op: &str,
    inputs: &[Option<&OwnedTensor>],
    attrs: &[(&str, AttrValue)],
) {
    let views: Vec<Option<TensorRef>> = inputs.iter().map(|t| t.map(|t| t.view())).collect();
    let serial = run_views(op, &views, attrs, &SerialPool).unwrap();
    for threads in [2, 3, 8] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let par = pool.install(|| run_views(op, &views, attrs, &RayonPool).unwrap());
        assert_bitwise(&serial, &par, &format!("{op} with {threads} threads"));
    }
}

/// Central-difference gradient check of `op`'s registered backward, in f64. `inputs` are f64
/// tensors (None = absent optional); the loss is sum_k <w_k, out_k> with random weights `w_k`
/// for each output that has a gradient.
pub fn grad_check(
    op: &str,
    inputs: &[Option<&OwnedTensor>],
    attrs: &[(&str, AttrValue)],
    seed: u64,
) {
    grad_check_tol(op, inputs, attrs, seed, 1e-6)
}

pub fn grad_check_tol(
    op: &str,
    inputs: &[Option<&OwnedTensor>],
    attrs: &[(&str, AttrValue)],
    seed: u64,
    tolerance: f64,
) {
    let reg = polyop_kernels::registry();
    let def = reg.lookup(op).unwrap();
    let bwd = def.backward.expect("op has a backward");
    let outs = run(op, inputs, attrs).unwrap();
    let mut rng = XRng::new(seed);
    // upstream gradients only for outputs that the backward consumes; others get weight 0
    let grad_outs: Vec<usize> = bwd
        .inputs
        .iter()
        .filter_map(|b| match b {
            BwdInput::Grad(i) => Some(*i),
            _ => None,
        })
        .collect();
    let weights: Vec<Option<OwnedTensor>> = outs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            grad_outs
                .contains(&i)
                .then(|| f64t(&rng.vec(o.numel(), -1.0, 1.0), &o.shape))
        })
        .collect();
    let loss = |ins: &[Option<&OwnedTensor>]| -> f64 {
        let outs = run(op, ins, attrs).unwrap();
        outs.iter()
            .zip(&weights)
            .filter_map(|(o, w)| {
                w.as_ref()
                    .map(|w| vals(o).iter().zip(vals(w)).map(|(a, b)| a * b).sum::<f64>())
            })
            .sum()
    };
    // run the backward op
    let b_inputs: Vec<Option<&OwnedTensor>> = bwd
        .inputs
        .iter()
        .map(|b| match b {
            BwdInput::Grad(i) => weights[*i].as_ref(),
            BwdInput::Input(i) => inputs[*i],
            BwdInput::Output(i) => Some(&outs[*i]),
        })
        .collect();
    let bdef = reg.lookup(bwd.op).unwrap();
    // backward attributes by name from the forward call
    let fwd_attrs = def
        .bind_attrs(attrs.iter().map(|(n, v)| (*n, v.clone())))
        .unwrap();
    let b_attrs: Vec<(&str, AttrValue)> = bdef
        .schema
        .attr_args()
        .map(|a| (a.name.as_str(), fwd_attrs.get(&a.name).unwrap().clone()))
        .collect();
    let grads =
        run(bwd.op, &b_inputs, &b_attrs).unwrap_or_else(|e| panic!("{} failed: {e}", bwd.op));
    assert_eq!(grads.len(), bwd.outputs.len());
    for (j, &inp) in bwd.outputs.iter().enumerate() {
        let Some(x) = inputs[inp] else { continue };
        assert_eq!(grads[j].shape, x.shape, "{}: grad {j} shape", bwd.op);
        let analytic = vals(&grads[j]);
        let xv = vals(x);
        let h = 1e-6;
        for e in 0..xv.len() {
            let mut plus = xv.clone();
            plus[e] += h;
            let mut minus = xv.clone();
            minus[e] -= h;
            let tp = f64t(&plus, &x.shape);
            let tm = f64t(&minus, &x.shape);
            let mut ip: Vec<Option<&OwnedTensor>> = inputs.to_vec();
            ip[inp] = Some(&tp);
            let lp = loss(&ip);
            ip[inp] = Some(&tm);
            let lm = loss(&ip);
            let numeric = (lp - lm) / (2.0 * h);
            assert!(
                (numeric - analytic[e]).abs() <= tolerance * (1.0 + numeric.abs()),
                "{}: d/d input {inp} element {e}: analytic {} vs numeric {numeric}",
                bwd.op,
                analytic[e]
            );
        }
    }
}

pub fn int(v: i64) -> AttrValue {
    AttrValue::Int(v)
}
pub fn float(v: f64) -> AttrValue {
    AttrValue::Float(v)
}
pub fn boolean(v: bool) -> AttrValue {
    AttrValue::Bool(v)
}
pub fn string(v: &str) -> AttrValue {
    AttrValue::Str(v.to_string())
}

/// Row-major multi-index of a flat index.
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    idx
}

pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}
