//! Run one stock op `reps` times on the inputs of the `half_64K` benchmark group, for
//! instruction counts that a busy machine cannot blur:
//!
//!     cargo build --release -p polyop-kernels --example op_loop
//!     valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!         target/release/examples/op_loop add f16 20
//!     target/release/examples/op_loop add f16 2000 time   # best-of-7 elements per second
//!     target/release/examples/op_loop conv:512,7,512,3,1,1,1 f32 10 prepack   # packed weights
//!
//! (run it with reps 0 and N: the difference / N is one call's count). Single-threaded (the
//! serial pool), so the count is the kernel's alone; `OP_LOOP_THREADS=2` runs it on a rayon
//! pool of two threads instead, for thread scaling, and `OP_LOOP_SIMD=avx2` (or `baseline`) runs
//! it below the best instruction-set level the CPU has, to time one level against another.
//! With `prepack`, `OP_LOOP_COLD=16` writes 16 MiB elsewhere before each call (timed apart),
//! so the op's tensors come from L3 as inside a model, where a node's tensors were last
//! touched a whole run ago.

use kernel_core::half::{bf16, f16};
use kernel_core::{AttrValue, Element, KernelCtx, OwnedTensor, TensorMut, TensorRef};

fn tensor(n: usize, shape: &[usize], dt: &str, f: impl Fn(usize) -> f32) -> OwnedTensor {
    fn own<T: Element>(v: Vec<T>, shape: &[usize]) -> OwnedTensor {
        OwnedTensor::from_vec(v, shape).unwrap()
    }
    let v = (0..n).map(f);
    match dt {
        "f32" => own(v.collect::<Vec<f32>>(), shape),
        "f16" => own(v.map(f16::from_f32).collect::<Vec<_>>(), shape),
        "bf16" => own(v.map(bf16::from_f32).collect::<Vec<_>>(), shape),
        _ => panic!("dtype f32, f16 or bf16"),
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (name, dt) = (a[1].as_str(), a[2].as_str());
    let reps: usize = a[3].parse().unwrap();
    let val = |i: usize| ((i.wrapping_mul(2_654_435_761) % 2001) as f32 - 1000.0) / 250.0;
    // OP_LOOP_N=N: elements of the elementwise ops' input and of the long softmax row (rows of
    // 1024 for softmax, rms_norm and topk: N / 1024 of them); 65536 by default (in cache)
    let n: usize = std::env::var("OP_LOOP_N").map_or(1 << 16, |v| v.parse().unwrap());
    let x = tensor(n, &[n], dt, val);
    let y = tensor(n, &[n], dt, |i| (i % 613) as f32 / 100.0 - 3.0);
    let r = tensor(n, &[n / 1024, 1024], dt, val);
    let w = tensor(1024, &[1024], dt, |i| 0.5 + (i % 7) as f32 / 7.0);
    // conv2d of one image [c, h, w] by weight [o, c/groups, kh, kw], with a bias
    let conv = |[c, h, wd]: [usize; 3], ws: [usize; 4], stride: i64, pad: i64, groups: i64| {
        let inputs = vec![
            tensor(c * h * wd, &[1, c, h, wd], dt, val),
            tensor(ws.iter().product(), &ws, dt, val),
            tensor(ws[0], &[ws[0]], dt, val),
        ];
        let attrs = vec![
            ("stride", AttrValue::IntList(vec![stride, stride])),
            ("padding", AttrValue::IntList(vec![pad, pad])),
            ("groups", AttrValue::Int(groups)),
        ];
        (inputs, attrs)
    };
    let (inputs, attrs): (Vec<OwnedTensor>, Vec<(&str, AttrValue)>) = match name {
        "negate" | "relu" | "gelu" => (vec![x], vec![]),
        "gelu_tanh" => (
            vec![x],
            vec![("approximate", AttrValue::Str("tanh".into()))],
        ),
        "add" | "add_relu" => (vec![x, y], vec![]),
        "scale" => (vec![x], vec![("alpha", AttrValue::Float(1.5))]),
        "softmax" => (vec![r], vec![]),
        "softmax_long" => (vec![tensor(n, &[1, n], dt, val)], vec![]),
        // rows of 128 (attention scores of a 128-token sequence)
        "softmax_short" => (vec![tensor(n, &[n / 128, 128], dt, val)], vec![]),
        // the same rows under a causal mask (row i of each 128 x 128 keeps i + 1 elements, the
        // rest -inf), as a decoder's attention
        "softmax_causal" => {
            let causal = |i: usize| {
                let (row, col) = ((i / 128) % 128, i % 128);
                if col <= row {
                    val(i)
                } else {
                    f32::NEG_INFINITY
                }
            };
            (vec![tensor(n, &[n / 128, 128], dt, causal)], vec![])
        }
        // rows of 65536 (the benchmark's long rows; OP_LOOP_N=4194304 for its 64 of them)
        "softmax_wide" => (vec![tensor(n, &[n / 65536, 65536], dt, val)], vec![]),
        "rms_norm" => (vec![r, w], vec![]),
        "topk" => (vec![r], vec![("k", AttrValue::Int(8))]),
        // ShuffleNet's layers: the first (3 -> 24 channels, 224x224, 3x3, stride 2: im2col
        // gathers), a grouped 1x1 (136 -> 136 in 4 groups, 28x28: read in place), a stride-2
        // depthwise 3x3 (112 channels, 56x56)
        "stem" => conv([3, 224, 224], [24, 3, 3, 3], 2, 1, 1),
        "grouped" => conv([136, 28, 28], [136, 34, 1, 1], 1, 0, 4),
        "depthwise" => conv([112, 56, 56], [112, 1, 3, 3], 2, 1, 112),
        // ResNet-50's layers: a 3x3 (256 channels, 14x14) and a 1x1 expansion (64 -> 256, 56x56)
        "res3x3" => conv([256, 14, 14], [256, 256, 3, 3], 1, 1, 1),
        "res1x1" => conv([64, 56, 56], [256, 64, 1, 1], 1, 0, 1),
        // any other layer of one image: conv:C,H,O,K,STRIDE,PAD,GROUPS (square input and kernel)
        // (conv_relu:...: the same with relu as its epilogue, as ONNX Runtime's provider runs a
        // fused Conv + Relu)
        spec if spec.starts_with("conv:") || spec.starts_with("conv_relu:") => {
            let spec = &spec[spec.find(':').unwrap() + 1..];
            let v: Vec<usize> = spec.split(',').map(|t| t.parse().unwrap()).collect();
            let [c, h, o, k, s, p, g] = v[..] else {
                panic!("conv:C,H,O,K,STRIDE,PAD,GROUPS")
            };
            conv([c, h, h], [o, c / g, k, k], s as i64, p as i64, g as i64)
        }
        _ => panic!("unknown op {name}"),
    };
    // (every layer case has a weight of rank 4)
    let is_conv = inputs.get(1).is_some_and(|w| w.view().shape.len() == 4);
    let op = polyop_kernels::registry()
        .lookup(match name {
            "gelu_tanh" => "gelu",
            "softmax_long" | "softmax_wide" | "softmax_short" | "softmax_causal" => "softmax",
            _ if is_conv => "conv2d",
            _ => name,
        })
        .unwrap();
    let attrs = op.bind_attrs(attrs).unwrap();
    let views: Vec<Option<TensorRef>> = inputs.iter().map(|t| Some(t.view())).collect();
    let specs = op.infer_concrete(&views, &attrs).unwrap();
    let mut outputs: Vec<OwnedTensor> = specs
        .iter()
        .map(|s| OwnedTensor::zeros(s.dtype, &s.concrete().unwrap()))
        .collect();
    // OP_LOOP_SIMD=avx2 or baseline: run at that instruction-set level, not the best the CPU
    // has (the levels give the same bits; this times one against another)
    match std::env::var("OP_LOOP_SIMD").as_deref() {
        Ok("avx2") => polyop_kernels::force_simd_level(Some(polyop_kernels::SimdLevel::Avx2Fma)),
        Ok("baseline") => {
            polyop_kernels::force_simd_level(Some(polyop_kernels::SimdLevel::Baseline))
        }
        _ => {}
    }
    // OP_LOOP_THREADS=N: on a rayon pool of N threads (thread scaling), else serially
    let threads: usize = std::env::var("OP_LOOP_THREADS").map_or(1, |v| v.parse().unwrap());
    let rayon_pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let pool: &dyn kernel_core::ThreadPool = if threads > 1 {
        &kernel_core::RayonPool
    } else {
        &kernel_core::SerialPool
    };
    let relu = match polyop_kernels::registry().lookup("relu").unwrap().epilogue {
        Some(kernel_core::EpilogueFn::Unary(f)) => [kernel_core::Epilogue::Unary(f)],
        _ => panic!("relu has a unary epilogue form"),
    };
    let epilogue = name.starts_with("conv_relu:").then_some(&relu[..]);
    let mut run = |prepacked: &[(usize, kernel_core::Prepacked)]| {
        let mut outs: Vec<TensorMut> = outputs.iter_mut().map(|o| o.view_mut()).collect();
        let mut ctx = KernelCtx::new(op, &views, &mut outs, &attrs, pool)
            .with_epilogue(epilogue)
            .with_prepacked(prepacked);
        op.compute(&mut ctx).unwrap();
        // (an epilogue the kernel left, as the call path would apply it)
        if ctx.take_epilogue().is_some() {
            kernel_core::Epilogue::apply_all(&relu, outs[0].as_mut_slice::<f32>().unwrap(), 0);
        }
    };
    // (a single thread: on the calling thread itself; `install` on a one-thread pool costs a
    // thread switch there and back per call, about 50 us on a VM, which swamped small calls)
    let mut run = |pp: &[(usize, kernel_core::Prepacked)]| {
        if threads > 1 {
            rayon_pool.install(|| run(pp))
        } else {
            run(pp)
        }
    };
    if a.get(4).map(String::as_str) == Some("prepack") {
        // The op's inputs prepacked as for a constant (ONNX Runtime's initializers: a conv2d
        // weight) against the same calls without: 9 rounds alternating, best batch of each.
        let pp: Vec<(usize, kernel_core::Prepacked)> = views
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((i, (op.prepack?)(i, v.as_ref()?, &attrs)?)))
            .collect();
        // OP_LOOP_COLD=MiB: before each call, write that many MiB elsewhere, so that the
        // op's inputs and outputs have left the core's L2 as they have inside a model (where
        // each node's tensors were last touched a whole run ago); each call is timed alone.
        let cold_mib: usize = std::env::var("OP_LOOP_COLD").map_or(0, |v| v.parse().unwrap());
        let mut flush = vec![0u8; cold_mib << 20];
        let mut best = [f64::INFINITY; 2];
        for round in 0..9 {
            for (packed, b) in best.iter_mut().enumerate() {
                let mut took = std::time::Duration::ZERO;
                for _ in 0..reps {
                    if cold_mib > 0 {
                        flush
                            .iter_mut()
                            .step_by(64)
                            .for_each(|v| *v = v.wrapping_add(round));
                    }
                    let t = std::time::Instant::now();
                    run(if packed == 1 { &pp } else { &[] });
                    took += t.elapsed();
                }
                *b = b.min(took.as_secs_f64() / reps as f64);
            }
        }
        std::hint::black_box(&flush);
        println!(
            "{name} {dt} unpacked {:.1} us prepacked {:.1} us ({} inputs) speed-up {:.3}",
            best[0] * 1e6,
            best[1] * 1e6,
            pp.len(),
            best[0] / best[1]
        );
        return;
    }
    if a.get(4).map(String::as_str) == Some("time") {
        // The fastest of 7 batches of `reps` calls: elements per second.
        let best = (0..7)
            .map(|_| {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    run(&[]);
                }
                t.elapsed().as_secs_f64() / reps as f64
            })
            .fold(f64::INFINITY, f64::min);
        if op.name == "conv2d" {
            // multiply-adds: every output element's kernel rows (the weight's [C/g, KH, KW])
            let (o, w) = (outputs[0].view(), inputs[1].view());
            let flops =
                2 * o.shape.iter().product::<usize>() * w.shape[1..].iter().product::<usize>();
            println!(
                "{name} {dt} {:.1} us {:.1} GFLOP/s",
                best * 1e6,
                flops as f64 / best / 1e9
            );
            return;
        }
        println!("{name} {dt} {:.3} Gelem/s", n as f64 / best / 1e9);
        return;
    }
    for _ in 0..reps {
        run(&[]);
    }
}
