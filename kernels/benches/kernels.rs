//! Throughput of the stock kernels on large inputs, run the way a framework runs them
//! (pre-allocated outputs, `op.compute`, the default rayon pool).
//!
//! `cargo bench -p polyop-kernels --bench kernels` (criterion prints GiB/s for memory-bound ops,
//! "elem/s" = FLOP/s for conv2d). `POLYOP_BENCH_QUICK=1` shortens the measurement.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kernel_core::half::{bf16, f16};
use kernel_core::{
    default_pool, AttrValue, Element, KernelCtx, OpDef, OwnedTensor, TensorMut, TensorRef,
};
use std::time::Duration;

fn op(name: &str) -> &'static OpDef {
    polyop_kernels::registry().lookup(name).unwrap()
}

fn filled<T: Element>(n: usize, shape: &[usize], f: impl Fn(usize) -> T) -> OwnedTensor {
    OwnedTensor::from_vec((0..n).map(f).collect(), shape).unwrap()
}

fn f32s(shape: &[usize]) -> OwnedTensor {
    let n = shape.iter().product();
    filled(n, shape, |i| {
        ((i.wrapping_mul(2_654_435_761) % 2001) as f32 - 1000.0) / 250.0
    })
}

/// A prepared call: inputs, bound attributes and pre-allocated outputs.
struct Call {
    op: &'static OpDef,
    inputs: Vec<OwnedTensor>,
    attrs: kernel_core::Attrs,
    outputs: Vec<OwnedTensor>,
}

impl Call {
    fn new(name: &str, inputs: Vec<OwnedTensor>, attrs: &[(&str, AttrValue)]) -> Call {
        let op = op(name);
        let attrs = op
            .bind_attrs(attrs.iter().map(|(n, v)| (*n, v.clone())))
            .unwrap();
        let views: Vec<Option<TensorRef>> = inputs.iter().map(|t| Some(t.view())).collect();
        let specs = op.infer_concrete(&views, &attrs).unwrap();
        let outputs = specs
            .iter()
            .map(|s| OwnedTensor::zeros(s.dtype, &s.concrete().unwrap()))
            .collect();
        Call {
            op,
            inputs,
            attrs,
            outputs,
        }
    }
    fn run(&mut self) {
        let views: Vec<Option<TensorRef>> = self.inputs.iter().map(|t| Some(t.view())).collect();
        let mut outs: Vec<TensorMut> = self.outputs.iter_mut().map(|o| o.view_mut()).collect();
        let mut ctx = KernelCtx::new(self.op, &views, &mut outs, &self.attrs, default_pool());
        self.op.compute(&mut ctx).unwrap();
    }
    /// Bytes read + written.
    fn bytes(&self) -> u64 {
        self.inputs
            .iter()
            .chain(&self.outputs)
            .map(|t| (t.numel() * t.dtype.size()) as u64)
            .sum()
    }
}

fn config() -> Criterion {
    let quick = std::env::var_os("POLYOP_BENCH_QUICK").is_some();
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(if quick { 200 } else { 1000 }))
        .measurement_time(Duration::from_millis(if quick { 600 } else { 3000 }))
}

fn bench_calls(c: &mut Criterion, group: &str, calls: Vec<(String, Call)>) {
    let mut g = c.benchmark_group(group);
    for (name, mut call) in calls {
        g.throughput(Throughput::Bytes(call.bytes()));
        g.bench_function(BenchmarkId::from_parameter(name), |b| b.iter(|| call.run()));
    }
    g.finish();
}

const N: usize = 1 << 24; // 16M elements

fn elementwise(c: &mut Criterion) {
    let x = f32s(&[N]);
    let y = f32s(&[N]);
    let big2 = f32s(&[N / 1024, 1024]);
    let row = f32s(&[1024]);
    let xb = filled(N, &[N], |i| bf16::from_f32((i % 977) as f32 / 100.0 - 4.0));
    let yb = filled(N, &[N], |i| bf16::from_f32((i % 613) as f32 / 100.0 - 3.0));
    let xi = filled(N, &[N], |i| i as i32);
    let calls = vec![
        (
            "negate_f32".into(),
            Call::new("negate", vec![x.clone()], &[]),
        ),
        (
            "negate_i32".into(),
            Call::new("negate", vec![xi.clone()], &[]),
        ),
        ("relu_f32".into(), Call::new("relu", vec![x.clone()], &[])),
        (
            "scale_f32".into(),
            Call::new(
                "scale",
                vec![x.clone()],
                &[("alpha", AttrValue::Float(0.5))],
            ),
        ),
        (
            "add_f32".into(),
            Call::new("add", vec![x.clone(), y.clone()], &[]),
        ),
        (
            "add_i32".into(),
            Call::new("add", vec![xi.clone(), xi], &[]),
        ),
        (
            "add_bf16".into(),
            Call::new("add", vec![xb.clone(), yb], &[]),
        ),
        (
            "add_f32_broadcast_row1024".into(),
            Call::new("add", vec![big2, row], &[]),
        ),
        (
            "add_relu_f32".into(),
            Call::new("add_relu", vec![x.clone(), y], &[]),
        ),
        ("gelu_f32".into(), Call::new("gelu", vec![x.clone()], &[])),
        (
            "gelu_tanh_f32".into(),
            Call::new(
                "gelu",
                vec![x],
                &[("approximate", AttrValue::Str("tanh".into()))],
            ),
        ),
        ("gelu_bf16".into(), Call::new("gelu", vec![xb], &[])),
    ];
    bench_calls(c, "elementwise_16M", calls);
}

/// The quick-mode sizes of bench/run.py: per-call overhead and L2-resident throughput.
fn small(c: &mut Criterion) {
    let n = 1usize << 16;
    let x = f32s(&[n]);
    let y = f32s(&[n]);
    let r = f32s(&[64, 1024]);
    let w = f32s(&[1024]);
    let calls = vec![
        (
            "negate_f32".into(),
            Call::new("negate", vec![x.clone()], &[]),
        ),
        ("relu_f32".into(), Call::new("relu", vec![x.clone()], &[])),
        (
            "scale_f32".into(),
            Call::new(
                "scale",
                vec![x.clone()],
                &[("alpha", AttrValue::Float(1.5))],
            ),
        ),
        (
            "add_f32".into(),
            Call::new("add", vec![x.clone(), y.clone()], &[]),
        ),
        ("gelu_f32".into(), Call::new("gelu", vec![x], &[])),
        (
            "softmax_64x1024".into(),
            Call::new("softmax", vec![r.clone()], &[]),
        ),
        (
            "rms_norm_64x1024".into(),
            Call::new("rms_norm", vec![r.clone(), w], &[]),
        ),
        (
            "topk_k8_64x1024".into(),
            Call::new("topk", vec![r], &[("k", AttrValue::Int(8))]),
        ),
    ];
    bench_calls(c, "small_64K", calls);
}

/// The memory-bound ops in f32, f16 and bf16 at bench/run.py's quick sizes (L2-resident), for
/// the half types' elements per second against f32's (criterion's GiB/s counts 2 bytes per
/// half element: equal elements per second is half f32's GiB/s).
fn half(c: &mut Criterion) {
    let n = 1usize << 16;
    let xf = f32s(&[n]);
    let yf = filled(n, &[n], |i| ((i % 613) as f32) / 100.0 - 3.0);
    let rf = f32s(&[64, 1024]);
    let wf = filled(1024, &[1024], |i| 0.5 + (i % 7) as f32 / 7.0);
    let cast = |t: &OwnedTensor, dt: &str| -> OwnedTensor {
        let v: &[f32] = t.as_slice::<f32>().unwrap();
        match dt {
            "f16" => OwnedTensor::from_vec(v.iter().map(|&x| f16::from_f32(x)).collect(), &t.shape)
                .unwrap(),
            "bf16" => {
                OwnedTensor::from_vec(v.iter().map(|&x| bf16::from_f32(x)).collect(), &t.shape)
                    .unwrap()
            }
            _ => t.clone(),
        }
    };
    let mut calls = Vec::new();
    for dt in ["f32", "f16", "bf16"] {
        let (x, y, r, w) = (cast(&xf, dt), cast(&yf, dt), cast(&rf, dt), cast(&wf, dt));
        let alpha = [("alpha", AttrValue::Float(1.5))];
        let k = [("k", AttrValue::Int(8))];
        for (name, call) in [
            ("negate", Call::new("negate", vec![x.clone()], &[])),
            ("add", Call::new("add", vec![x.clone(), y.clone()], &[])),
            ("scale", Call::new("scale", vec![x.clone()], &alpha)),
            ("relu", Call::new("relu", vec![x.clone()], &[])),
            ("add_relu", Call::new("add_relu", vec![x.clone(), y], &[])),
            ("gelu", Call::new("gelu", vec![x], &[])),
            (
                "softmax_64x1024",
                Call::new("softmax", vec![r.clone()], &[]),
            ),
            (
                "rms_norm_64x1024",
                Call::new("rms_norm", vec![r.clone(), w], &[]),
            ),
            ("topk_k8_64x1024", Call::new("topk", vec![r], &k)),
        ] {
            calls.push((format!("{name}_{dt}"), call));
        }
    }
    bench_calls(c, "half_64K", calls);
}

fn rows(c: &mut Criterion) {
    let shape = [8192usize, 1024];
    let x = f32s(&shape);
    let w = f32s(&[1024]);
    let calls = vec![
        (
            "softmax_f32".into(),
            Call::new("softmax", vec![x.clone()], &[]),
        ),
        (
            "softmax_f32_axis0".into(),
            Call::new("softmax", vec![x.clone()], &[("axis", AttrValue::Int(0))]),
        ),
        (
            "rms_norm_f32".into(),
            Call::new("rms_norm", vec![x.clone(), w], &[]),
        ),
        (
            "topk_k8_f32".into(),
            Call::new("topk", vec![x.clone()], &[("k", AttrValue::Int(8))]),
        ),
        (
            "topk_k1024_f32".into(),
            Call::new("topk", vec![x], &[("k", AttrValue::Int(1024))]),
        ),
    ];
    bench_calls(c, "rows_8192x1024", calls);
}

fn conv(c: &mut Criterion) {
    let mut g = c.benchmark_group("conv2d");
    for (n, ch, hw) in [(1usize, 64usize, 56usize), (8, 64, 56)] {
        let x = f32s(&[n, ch, hw, hw]);
        let w = f32s(&[ch, ch, 3, 3]);
        let b = f32s(&[ch]);
        let mut call = Call::new("conv2d", vec![x, w, b], &[("padding", AttrValue::Int(1))]);
        let flops = 2 * n * ch * hw * hw * ch * 9;
        g.throughput(Throughput::Elements(flops as u64));
        g.bench_function(
            BenchmarkId::from_parameter(format!("{n}x{ch}x{hw}x{hw}_k3_f32_flops")),
            |bch| bch.iter(|| call.run()),
        );
    }
    g.finish();
}

fn nonzero(c: &mut Criterion) {
    let x = filled(N, &[N / 4096, 4096], |i| {
        (i.wrapping_mul(2_654_435_761) % 2) as i32
    });
    let op = op("nonzero");
    let attrs = op.bind_attrs([]).unwrap();
    let mut g = c.benchmark_group("nonzero_16M");
    g.throughput(Throughput::Bytes((N * 4) as u64));
    g.bench_function("half_nonzero_i32", |b| {
        b.iter(|| kernel_core::exec::run_op(op, &[Some(x.view())], &attrs, default_pool()).unwrap())
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = small, half, elementwise, rows, conv, nonzero
}
criterion_main!(benches);
