//! The subnormal policy (SPEC.md §2, docs/reliability.md): kernels compute with flush-to-zero
//! and denormals-are-zero off, round to nearest, whatever mode the calling thread or the pool's
//! worker threads are in, and the caller's mode is back afterwards — also after a panic.
//!
//! The threads here are put in TensorFlow / XLA's mode (FTZ and DAZ on) plus rounding upward,
//! with the deprecated-but-independent `_mm_setcsr` (not kernel-core's own code). Expected
//! results are bit patterns worked out by hand: a subnormal f32 is `k * 2^-149` with bits `k`,
//! a subnormal f64 `k * 2^-1074` with bits `k`.
#![cfg(target_arch = "x86_64")]

use kernel_core::*;
use num_traits::Float;
use std::sync::Mutex;

const FTZ: u32 = 1 << 15;
const DAZ: u32 = 1 << 6;
/// Rounding control = 10: toward +infinity.
const RC_UP: u32 = 0b10 << 13;
/// What TF / XLA worker threads run with (FTZ, DAZ), plus a non-default rounding mode.
const HOSTILE: u32 = FTZ | DAZ | RC_UP;
const CONTROL: u32 = 0xFFC0;

#[allow(deprecated)]
fn csr() -> u32 {
    // SAFETY: reads MXCSR; SSE is part of the x86-64 baseline.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_getcsr()
    }
}

#[allow(deprecated)]
fn set_csr(v: u32) {
    // SAFETY: `v` is a value read from MXCSR with only control bits (6..=15) changed, so no
    // reserved bit is set; SSE is part of the x86-64 baseline.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_setcsr(v)
    }
}

/// This thread in `HOSTILE` mode while alive; its previous MXCSR back on drop.
struct Hostile(u32);
impl Hostile {
    fn enter() -> Self {
        let old = csr();
        set_csr(old | HOSTILE);
        assert_eq!(
            csr() & HOSTILE,
            HOSTILE,
            "could not set FTZ/DAZ on this thread"
        );
        Hostile(old)
    }
}
impl Drop for Hostile {
    fn drop(&mut self) {
        set_csr(self.0);
    }
}

/// MXCSR control bits seen inside kernels and tasks, to check them directly.
static SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// Held by each test: `SEEN` is shared, and the test harness runs tests concurrently.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pool whose worker threads run in `HOSTILE` mode, as XLA's and (for its own ops)
/// TensorFlow's do; it checks that each worker's mode is unchanged after each task.
struct HostilePool {
    restored: Mutex<Vec<bool>>,
}
impl ThreadPool for HostilePool {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        std::thread::scope(|s| {
            for i in 0..num_tasks {
                s.spawn(move || {
                    let _h = Hostile::enter();
                    let before = csr() & CONTROL;
                    f(i);
                    let ok = csr() & CONTROL == before;
                    self.restored.lock().unwrap().push(ok);
                });
            }
        });
    }
    fn num_threads(&self) -> usize {
        4
    }
}

// --- ops defined here: elementwise, one element per chunk so that every element of a
// multi-element input is computed by a pool task ---

fn same_shape(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![ctx.input(0).shape.clone()])
}

fn elementwise<T: Element + Float + Send + Sync>(
    ctx: &mut KernelCtx,
    f: impl Fn(T, T) -> T + Sync,
    second: impl Fn(&KernelCtx, usize) -> Result<T>,
) -> Result<()> {
    SEEN.lock().unwrap().push(csr() & CONTROL);
    let x = ctx.input(0).contiguous::<T>()?.into_owned();
    let ys = (0..x.len())
        .map(|i| second(ctx, i))
        .collect::<Result<Vec<T>>>()?;
    let res: Vec<Mutex<T>> = x.iter().map(|_| Mutex::new(T::zero())).collect();
    parallel_for(ctx.pool, x.len(), 1, |r| {
        SEEN.lock().unwrap().push(csr() & CONTROL);
        for i in r {
            *res[i].lock().unwrap() = f(x[i], ys[i]);
        }
    });
    for (o, v) in ctx.outputs[0].as_mut_slice::<T>()?.iter_mut().zip(res) {
        *o = v.into_inner().unwrap();
    }
    Ok(())
}

fn alpha<T: Float>(ctx: &KernelCtx, _: usize) -> Result<T> {
    Ok(T::from(ctx.attrs.float("alpha")?).unwrap())
}
fn unused<T: Float>(_: &KernelCtx, _: usize) -> Result<T> {
    Ok(T::zero())
}
fn y_at<T: Element + Float>(ctx: &KernelCtx, i: usize) -> Result<T> {
    Ok(ctx.input(1).contiguous::<T>()?[i])
}

fn scale_cpu(ctx: &mut KernelCtx) -> Result<()> {
    match ctx.input(0).dtype {
        DType::F32 => elementwise::<f32>(ctx, |x, a| x * a, alpha),
        _ => elementwise::<f64>(ctx, |x, a| x * a, alpha),
    }
}
fn relu_cpu(ctx: &mut KernelCtx) -> Result<()> {
    fn relu<T: Float>(x: T, _: T) -> T {
        if x > T::zero() {
            x
        } else {
            T::zero()
        }
    }
    match ctx.input(0).dtype {
        DType::F32 => elementwise::<f32>(ctx, relu, unused),
        _ => elementwise::<f64>(ctx, relu, unused),
    }
}
fn add_cpu(ctx: &mut KernelCtx) -> Result<()> {
    match ctx.input(0).dtype {
        DType::F32 => elementwise::<f32>(ctx, |x, y| x + y, y_at),
        _ => elementwise::<f64>(ctx, |x, y| x + y, y_at),
    }
}
fn boom_cpu(_: &mut KernelCtx) -> Result<()> {
    SEEN.lock().unwrap().push(csr() & CONTROL);
    panic!("boom in a kernel");
}

fn registry() -> Registry {
    let mut r = Registry::new();
    for (schema, cpu) in [
        (
            "scale(Tensor x, float alpha) -> Tensor",
            scale_cpu as fn(&mut KernelCtx) -> Result<()>,
        ),
        ("relu(Tensor x) -> Tensor", relu_cpu),
        ("add(Tensor x, Tensor y) -> Tensor", add_cpu),
        ("boom(Tensor x) -> Tensor", boom_cpu),
    ] {
        r.register(
            OpDef::builder(schema)
                .dtypes(&[DType::F32, DType::F64])
                .infer(same_shape)
                .cpu(cpu)
                .build()
                .unwrap(),
        )
        .unwrap();
    }
    r
}

fn f32s(bits: &[u32]) -> Vec<f32> {
    bits.iter().map(|&b| f32::from_bits(b)).collect()
}
fn f64s(bits: &[u64]) -> Vec<f64> {
    bits.iter().map(|&b| f64::from_bits(b)).collect()
}

/// Run `op` on the inputs and return the output's bits, checking that the caller's mode is
/// what it was and that the kernel and every task saw FTZ, DAZ off and round-to-nearest.
fn run_bits<T: Element + Copy>(
    reg: &Registry,
    pool: &dyn ThreadPool,
    op: &str,
    inputs: &[&[T]],
    attrs: &[(&str, f64)],
) -> Vec<T> {
    let op = reg.lookup(op).unwrap();
    let views: Vec<_> = inputs
        .iter()
        .map(|d| Some(TensorRef::from_slice(d, &[d.len()]).unwrap()))
        .collect();
    let attrs = op
        .bind_attrs(attrs.iter().map(|&(k, v)| (k, AttrValue::Float(v))))
        .unwrap();
    SEEN.lock().unwrap().clear();
    let before = csr();
    let out = exec::run_op(op, &views, &attrs, pool).unwrap();
    assert_eq!(
        csr() & CONTROL,
        before & CONTROL,
        "{}: the caller's MXCSR control bits were not restored",
        op.name
    );
    let seen = std::mem::take(&mut *SEEN.lock().unwrap());
    assert!(seen.len() > inputs[0].len(), "{}: {seen:?}", op.name);
    for s in seen {
        assert_eq!(
            s, 0x1F80,
            "{}: a kernel or task ran with MXCSR control {s:#06x} (FTZ/DAZ/rounding not reset)",
            op.name
        );
    }
    out[0].to_vec::<T>().unwrap()
}

fn bits32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
fn bits64(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

const NEG32: u32 = 0x8000_0000;
const NEG64: u64 = 0x8000_0000_0000_0000;

/// Every op, on subnormal inputs, gives the IEEE (no flush) bits on `pool` while the calling
/// thread is in `HOSTILE` mode.
fn check_ops(pool: &dyn ThreadPool) {
    let _one = one_at_a_time();
    let reg = registry();
    let _h = Hostile::enter();
    let hostile = csr();

    // f32: scale by 2 (exact: bits double), by 2^24 (normal results 2^-125, 3 * 2^-125)
    let x = f32s(&[1, 3, 0x0010_0000, NEG32 | 7]);
    let got = run_bits(&reg, pool, "scale", &[&x], &[("alpha", 2.0)]);
    assert_eq!(bits32(&got), vec![2, 6, 0x0020_0000, NEG32 | 14]);
    let got = run_bits(&reg, pool, "scale", &[&x[..2]], &[("alpha", 16777216.0)]);
    assert_eq!(bits32(&got), vec![0x0100_0000, 0x01c0_0000]);
    // relu keeps a positive subnormal, gives +0 for a negative one
    let x = f32s(&[1, NEG32 | 1, 0x007f_ffff, NEG32 | 5]);
    let got = run_bits(&reg, pool, "relu", &[&x], &[]);
    assert_eq!(bits32(&got), vec![1, 0, 0x007f_ffff, 0]);
    // add: subnormal + subnormal; smallest normal - smallest subnormal = largest subnormal.
    // With rounding upward, 1 + 2^-149 would be 1 + 2^-23 (not 1).
    let x = f32s(&[1, 0x0080_0000, NEG32 | 2, 0x3f80_0000]);
    let y = f32s(&[2, NEG32 | 1, NEG32 | 3, 1]);
    let got = run_bits(&reg, pool, "add", &[&x, &y], &[]);
    assert_eq!(bits32(&got), vec![3, 0x007f_ffff, NEG32 | 5, 0x3f80_0000]);

    // f64, the same with k * 2^-1074
    let x = f64s(&[1, 3, 1 << 50, NEG64 | 7]);
    let got = run_bits(&reg, pool, "scale", &[&x], &[("alpha", 2.0)]);
    assert_eq!(bits64(&got), vec![2, 6, 1 << 51, NEG64 | 14]);
    let x = f64s(&[1, NEG64 | 1, (1 << 52) - 1, NEG64 | 5]);
    let got = run_bits(&reg, pool, "relu", &[&x], &[]);
    assert_eq!(bits64(&got), vec![1, 0, (1 << 52) - 1, 0]);
    let x = f64s(&[1, 1 << 52, NEG64 | 2, 0x3ff0_0000_0000_0000]);
    let y = f64s(&[2, NEG64 | 1, NEG64 | 3, 1]);
    let got = run_bits(&reg, pool, "add", &[&x, &y], &[]);
    assert_eq!(
        bits64(&got),
        vec![3, (1 << 52) - 1, NEG64 | 5, 0x3ff0_0000_0000_0000]
    );

    // control bits as the caller set them; the exception flags (bits 0..=5) may have gained
    // the kernels' (inexact, denormal), as after any function call
    assert_eq!(
        csr() & CONTROL,
        hostile & CONTROL,
        "the caller's MXCSR changed"
    );
}

#[test]
fn kernels_ignore_the_calling_threads_ftz_daz_and_restore_it() {
    check_ops(&SerialPool);
}

#[test]
fn pool_tasks_ignore_the_worker_threads_ftz_daz_and_restore_it() {
    let pool = HostilePool {
        restored: Mutex::new(Vec::new()),
    };
    check_ops(&pool);
    let restored = pool.restored.into_inner().unwrap();
    assert!(restored.len() >= 4, "{restored:?}");
    assert!(
        restored.iter().all(|&ok| ok),
        "a task left its worker thread's MXCSR changed: {restored:?}"
    );
}

#[test]
fn parallel_for_alone_resets_a_workers_mode() {
    // Tasks on hostile workers, called from a clean thread: only parallel_for's guard (not
    // call::run's) can give the tasks the kernel environment.
    let _one = one_at_a_time();
    let pool = HostilePool {
        restored: Mutex::new(Vec::new()),
    };
    let x = f32s(&[1, 3, 5, 0x0010_0000]);
    let out: Vec<Mutex<u32>> = x.iter().map(|_| Mutex::new(0)).collect();
    parallel_for(&pool, x.len(), 1, |r| {
        for i in r {
            *out[i].lock().unwrap() = (x[i] * std::hint::black_box(2.0f32)).to_bits();
        }
    });
    let got: Vec<u32> = out.into_iter().map(|m| m.into_inner().unwrap()).collect();
    assert_eq!(got, vec![2, 6, 10, 0x0020_0000]);
    assert!(pool.restored.into_inner().unwrap().iter().all(|&ok| ok));
}

#[test]
fn the_callers_mode_is_restored_after_a_kernel_panic() {
    let _one = one_at_a_time();
    let reg = registry();
    let op = reg.lookup("boom").unwrap();
    SEEN.lock().unwrap().clear();
    let _h = Hostile::enter();
    let hostile = csr();
    let data = [f32::from_bits(1)];
    let x = TensorRef::from_slice(&data, &[1]).unwrap();
    let e = exec::run_op(op, &[Some(x)], &Attrs::default(), &SerialPool).unwrap_err();
    assert!(e.to_string().contains("boom in a kernel"), "{e}");
    assert_eq!(
        csr() & CONTROL,
        hostile & CONTROL,
        "MXCSR not restored after the panic"
    );
    assert_eq!(
        *SEEN.lock().unwrap(),
        vec![0x1F80],
        "the kernel ran in the caller's mode"
    );
}
