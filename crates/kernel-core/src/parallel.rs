//! The parallel-for hook. Kernels split work into chunks whose boundaries depend only on the
//! problem size (never on the thread count), so results are identical however many threads
//! run them. Adapters bind [`ThreadPool`] to their framework's intra-op pool.

use std::ops::Range;
use std::sync::Mutex;

use crate::fpenv::with_kernel_env;

/// Runs `f(i)` for every `i` in `0..num_tasks`, possibly concurrently, and returns when all have
/// finished. Implementations must not let a panic escape a task across an FFI boundary: use
/// [`PanicSlot`] to catch it in the task and re-raise it on the calling thread.
pub trait ThreadPool: Sync {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync));
    /// How many threads may run tasks at once (a hint only; never changes results).
    fn num_threads(&self) -> usize;
}

/// Runs every task on the calling thread.
pub struct SerialPool;

impl ThreadPool for SerialPool {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..num_tasks).for_each(f);
    }
    fn num_threads(&self) -> usize {
        1
    }
}

/// The default pool outside a framework: rayon's global pool.
pub struct RayonPool;

impl ThreadPool for RayonPool {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        use rayon::prelude::*;
        if num_tasks <= 1 || rayon::current_num_threads() <= 1 {
            (0..num_tasks).for_each(f);
        } else {
            (0..num_tasks).into_par_iter().for_each(f);
        }
    }
    fn num_threads(&self) -> usize {
        rayon::current_num_threads()
    }
}

/// The default pool for callers that have none of their own.
pub fn default_pool() -> &'static dyn ThreadPool {
    static POOL: RayonPool = RayonPool;
    &POOL
}

/// Upper bound on the number of chunks of one `parallel_for`; enough to keep many cores busy,
/// few enough that per-task overhead stays small.
pub const MAX_CHUNKS: usize = 256;

/// The fixed partition of `0..n` used by [`parallel_for`]: chunk size depends on `n` and
/// `grain` only.
pub fn chunks(n: usize, grain: usize) -> (usize, usize) {
    if n == 0 {
        return (0, 0);
    }
    let grain = grain.max(1);
    let size = grain.max(n.div_ceil(MAX_CHUNKS));
    (n.div_ceil(size), size)
}

/// Call `f(range)` over a fixed partition of `0..n` into ranges of at least `grain` items,
/// on `pool`. Each chunk computes in the kernel floating-point environment
/// ([`KernelFpEnv`](crate::fpenv::KernelFpEnv)), whichever thread runs it.
pub fn parallel_for(
    pool: &dyn ThreadPool,
    n: usize,
    grain: usize,
    f: impl Fn(Range<usize>) + Sync,
) {
    let (count, size) = chunks(n, grain);
    run_tasks(pool, count, |i| {
        let start = i * size;
        f(start..(start + size).min(n))
    });
}

/// Run `f(i)` for every `i` in `0..count` on `pool` (on the calling thread when `count` is 1),
/// each task in the kernel floating-point environment ([`KernelFpEnv`](crate::fpenv::KernelFpEnv): a framework's worker
/// thread may flush subnormals, see `fpenv`). Kernels that hand their own tasks to a pool use
/// this rather than [`ThreadPool::run`].
pub fn run_tasks(pool: &dyn ThreadPool, count: usize, f: impl Fn(usize) + Sync) {
    match count {
        0 => {}
        1 => with_kernel_env(|| f(0)),
        _ => pool.run(count, &|i| with_kernel_env(|| f(i))),
    }
}

/// Catches the first panic of the tasks of one `run`, to be re-raised on the calling thread
/// once every task is done. For pool implementations whose tasks run behind an FFI boundary.
#[derive(Default)]
pub struct PanicSlot(Mutex<Option<Box<dyn std::any::Any + Send>>>);

impl PanicSlot {
    pub fn new() -> Self {
        Self::default()
    }
    /// Run `f`, keeping its panic (if any) instead of unwinding.
    pub fn catch(&self, f: impl FnOnce()) {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(p);
        }
    }
    /// Re-raise a kept panic on this thread.
    pub fn resume(&self) {
        let p = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = p {
            std::panic::resume_unwind(p);
        }
    }
}
