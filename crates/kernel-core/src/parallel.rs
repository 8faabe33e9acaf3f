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

/// The default pool outside a framework: rayon's global pool (this library's own copy of
/// rayon), its threads named `polyop-N` so that they can be told apart from a framework's.
pub struct RayonPool;

/// Build rayon's global pool with named threads, once, before its first use (a no-op if
/// something in this library initialised it already: the names are only a label).
fn named_global_pool() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("polyop-{i}"))
            .build_global();
    });
}

impl ThreadPool for RayonPool {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        use rayon::prelude::*;
        named_global_pool();
        if num_tasks <= 1 || rayon::current_num_threads() <= 1 {
            (0..num_tasks).for_each(f);
        } else {
            (0..num_tasks).into_par_iter().for_each(f);
        }
    }
    fn num_threads(&self) -> usize {
        named_global_pool();
        rayon::current_num_threads()
    }
}

/// The number of threads this process may run at once (`std::thread::available_parallelism`,
/// 1 if unknown), read once: on Linux every query reads the cgroup's CPU quota from files, which
/// cost a tenth of a small convolution's time when a pool's `num_threads` asked on every call.
pub fn available_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
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
/// on `pool`. Each chunk a pool thread runs computes in the kernel floating-point environment
/// ([`KernelFpEnv`](crate::fpenv::KernelFpEnv)), whichever thread that is; a single chunk runs
/// on the calling thread, in the environment `call::run` set.
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
/// each pool task in the kernel floating-point environment
/// ([`KernelFpEnv`](crate::fpenv::KernelFpEnv)): a framework's worker thread may flush
/// subnormals. Kernels that hand their own tasks to a pool use this, not [`ThreadPool::run`].
pub fn run_tasks(pool: &dyn ThreadPool, count: usize, f: impl Fn(usize) + Sync) {
    match count {
        0 => {}
        // the calling thread: a kernel's, already in the kernel environment (`call::run`)
        1 => f(0),
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

/// The tasks of one [`ThreadPool::run`] handed to a framework's C parallel-for, which calls
/// back on its threads with a context pointer and a task index or range.
pub struct CJob<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    panics: PanicSlot,
}

impl CJob<'_> {
    /// Run tasks `range` on the calling (framework) thread; a panic is kept, never unwound.
    pub fn run(&self, range: Range<usize>) {
        range.for_each(|i| self.panics.catch(|| (self.f)(i)));
    }

    /// The job behind a context pointer given to `submit` by [`run_c_job`].
    ///
    /// # Safety
    /// `ctx` is the pointer `run_c_job` passed to `submit`, used before `run_c_job` returns.
    pub unsafe fn from_ctx<'b>(ctx: *mut std::ffi::c_void) -> &'b CJob<'b> {
        // SAFETY: this function's contract: `ctx` points to the live job of `run_c_job`.
        unsafe { &*(ctx as *const CJob<'b>) }
    }
}

/// [`ThreadPool::run`] over a framework's C parallel-for: `submit(ctx)` hands the job (see
/// [`CJob::from_ctx`]) to the framework, which runs every task through [`CJob::run`] before it
/// returns `true`. No task or `0..1` run inline; if `submit` returns `false` (the framework
/// refused) every task runs here (tasks write disjoint outputs, so rerunning one is harmless).
/// A task's panic is re-raised on the calling thread.
pub fn run_c_job(
    num_tasks: usize,
    f: &(dyn Fn(usize) + Sync),
    submit: impl FnOnce(*mut std::ffi::c_void) -> bool,
) {
    if num_tasks <= 1 {
        return (0..num_tasks).for_each(f);
    }
    let job = CJob {
        f,
        panics: PanicSlot::new(),
    };
    if !submit(&job as *const CJob as *mut std::ffi::c_void) {
        job.run(0..num_tasks);
    }
    job.panics.resume();
}

/// The state shared by the caller and the helpers of [`run_with_helpers`].
struct Claimed {
    next: std::sync::atomic::AtomicUsize,
    done: std::sync::atomic::AtomicUsize,
    n: usize,
    /// Lifetime-erased task closure; only dereferenced after claiming an index `< n`, and the
    /// caller waits for every claimed index to finish before the closure goes away.
    f: *const (dyn Fn(usize) + Sync),
    panics: PanicSlot,
    lock: Mutex<()>,
    cv: std::sync::Condvar,
}

// SAFETY: the only non-thread-safe field is the raw `f`. It points to a `dyn Fn + Sync`, which
// may be called from any thread through a shared reference, and (see `f`) is dereferenced only
// while the closure is alive. The other fields are atomics, a `PanicSlot`, a mutex and a
// condvar. A late helper may drop the last `Arc` on another thread; dropping `f` frees nothing.
unsafe impl Send for Claimed {}
// SAFETY: as for `Send`: every method takes `&self` and touches `f` only as a shared call.
unsafe impl Sync for Claimed {}

impl Claimed {
    fn work(&self) {
        use std::sync::atomic::Ordering;
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= self.n {
                return;
            }
            // SAFETY: i < n was claimed, so the caller is still waiting for it (see `f`).
            let f = unsafe { &*self.f };
            self.panics.catch(|| f(i));
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
                let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                self.cv.notify_all();
            }
        }
    }
}

/// One helper of [`run_with_helpers`]: run it once, on any thread, at any time, or drop it.
pub struct Helper(std::sync::Arc<Claimed>);

impl Helper {
    /// Claim and run task indices until none is left; never unwinds (task panics are kept for
    /// the caller).
    pub fn run(self) {
        self.0.work();
    }
}

/// A [`ThreadPool::run`] for frameworks whose pool only *schedules* fire-and-forget tasks that
/// may run later, on the caller's thread, or never before the caller blocks (XLA's FFI thread
/// pool): the calling thread claims task indices itself from a shared counter, `helpers`
/// helpers handed to `schedule` claim the rest, and the caller only waits for indices a helper
/// has already claimed (so is running). A helper that starts after every index was claimed
/// returns without touching `f`; the shared state is reference-counted, so it never sees freed
/// memory. `schedule` returns false when it could not hand the helper over (then no more are
/// tried). The first task panic is re-raised here.
pub fn run_with_helpers(
    num_tasks: usize,
    helpers: usize,
    schedule: &mut dyn FnMut(Helper) -> bool,
    f: &(dyn Fn(usize) + Sync),
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // SAFETY: erase the lifetime; see `Claimed::f`: this function returns only after every
    // claimed index has finished, and unclaimed helpers never dereference it.
    let f: *const (dyn Fn(usize) + Sync) = unsafe {
        std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f)
    };
    let shared = std::sync::Arc::new(Claimed {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        n: num_tasks,
        f,
        panics: PanicSlot::new(),
        lock: Mutex::new(()),
        cv: std::sync::Condvar::new(),
    });
    for _ in 0..helpers.min(num_tasks.saturating_sub(1)) {
        if !schedule(Helper(shared.clone())) {
            break;
        }
    }
    shared.work();
    let mut g = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
    while shared.done.load(Ordering::Acquire) < num_tasks {
        g = shared.cv.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    drop(g);
    shared.panics.resume();
}
