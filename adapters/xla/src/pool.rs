//! kernel-core's [`ThreadPool`] over XLA's intra-op thread pool (`XLA_FFI_ThreadPool_Schedule`,
//! FFI API >= 0.1). On XLA:CPU that is the Eigen pool that runs every other compute task, so a
//! polyop kernel inside a jitted program never oversubscribes the cores.
//!
//! `Schedule` is fire-and-forget and XLA documents that tasks may run on the caller's thread,
//! later, or on a pool of size 1. So `run` never *waits for* a helper to start: the calling
//! thread claims task indices itself from a shared counter, helpers claim the rest, and the
//! caller only waits for tasks that a helper has already claimed (and is therefore running).
//! A helper that starts after all indices are claimed exits without touching the closure.
//! The shared state is reference-counted, so such a late helper never sees freed memory.

use crate::sys;
use kernel_core::{PanicSlot, ThreadPool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// XLA's intra-op pool, for one handler invocation. The thread count is asked for only when
/// a kernel actually splits its work (most tiny calls never do).
pub struct XlaPool {
    api: *const sys::XLA_FFI_Api,
    ctx: *mut sys::XLA_FFI_ExecutionContext,
    /// XLA's thread count; 0 when XLA reports none (then kernel-core's default pool runs
    /// the tasks).
    threads: std::sync::OnceLock<usize>,
}

// SAFETY: `Sync` lets kernel-core hand `&XlaPool` to pool tasks (`ThreadPool: Sync`). Through
// a shared reference the pool only reads the API table and passes `ctx` to
// `XLA_FFI_ThreadPool_NumThreads` (once, under the `OnceLock`) and `XLA_FFI_ThreadPool_Schedule`,
// which XLA's intra-op pool accepts from any thread; both pointers stay valid while any task
// runs, since an `XlaPool` lives inside one handler call and `run` returns only after all of
// its tasks have finished.
unsafe impl Sync for XlaPool {}
// SAFETY: the pointers are not tied to the creating thread: the table is immutable and the
// execution context may be used from any thread of the call, as for `Sync`.
unsafe impl Send for XlaPool {}

impl XlaPool {
    /// The pool XLA offers this call, or `None` when its API has no thread pool (then the
    /// adapter uses kernel-core's default pool).
    ///
    /// # Safety
    /// `api` and `ctx` come from the current call frame, which outlives the pool.
    pub unsafe fn from_call(
        api: *const sys::XLA_FFI_Api,
        ctx: *mut sys::XLA_FFI_ExecutionContext,
    ) -> Option<XlaPool> {
        if api.is_null() || ctx.is_null() {
            return None;
        }
        // SAFETY: non-null, and by this function's contract the frame's API table, already
        // checked by `check_api` to be at least our version's size, so the thread-pool entries
        // (API 0.1) are in it.
        let a = unsafe { &*api };
        a.XLA_FFI_ThreadPool_NumThreads?;
        a.XLA_FFI_ThreadPool_Schedule?;
        Some(XlaPool {
            api,
            ctx,
            threads: std::sync::OnceLock::new(),
        })
    }

    fn threads(&self) -> usize {
        *self.threads.get_or_init(|| {
            // SAFETY: checked present in `from_call`; api/ctx valid for the call.
            let Some(num_threads_fn) = (unsafe { (*self.api).XLA_FFI_ThreadPool_NumThreads })
            else {
                return 0;
            };
            let mut n: i64 = 0;
            let mut args = sys::XLA_FFI_ThreadPool_NumThreads_Args {
                struct_size: sys::XLA_FFI_ThreadPool_NumThreads_Args_STRUCT_SIZE as usize,
                extension_start: std::ptr::null_mut(),
                ctx: self.ctx,
                num_threads: &mut n,
            };
            // SAFETY: `self.ctx` is the live execution context of this call (`from_call`'s
            // contract); `args` is a complete, correctly sized argument struct and `n` a
            // writable local.
            let err = unsafe { num_threads_fn(&mut args) };
            if !err.is_null() {
                // SAFETY: `err` was just created by this table and is not used again.
                unsafe { crate::error::destroy_error(self.api, err) };
                return 0;
            }
            n.max(0) as usize
        })
    }
}

struct Shared {
    next: AtomicUsize,
    done: AtomicUsize,
    n: usize,
    /// Lifetime-erased task closure; only dereferenced after claiming an index `< n`, and the
    /// caller waits for every claimed index to finish before the closure goes away.
    f: *const (dyn Fn(usize) + Sync),
    panics: PanicSlot,
    lock: Mutex<()>,
    cv: Condvar,
}

// SAFETY: the only non-thread-safe field is the raw `f`. It points to a `dyn Fn + Sync`, which
// may be called from any thread through a shared reference, and (see `f`) is dereferenced only
// while the closure is alive. The other fields are atomics, a `PanicSlot`, a mutex and a
// condvar. A late helper may drop the last `Arc` on another thread; dropping `f` frees nothing.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`: every method takes `&self` and touches `f` only as a shared call.
unsafe impl Sync for Shared {}

impl Shared {
    fn work(&self) {
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

unsafe extern "C" fn task_entry(data: *mut std::ffi::c_void) {
    // Nothing may unwind into XLA: `work` catches task panics; this catches the rest.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `data` is the Box<Arc<Shared>> leaked by `run` for this task.
        let shared: Box<Arc<Shared>> = unsafe { Box::from_raw(data as *mut Arc<Shared>) };
        shared.work();
    });
}

impl ThreadPool for XlaPool {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if num_tasks <= 1 {
            (0..num_tasks).for_each(f);
            return;
        }
        let threads = self.threads();
        if threads == 0 {
            return kernel_core::default_pool().run(num_tasks, f);
        }
        if threads == 1 {
            (0..num_tasks).for_each(f);
            return;
        }
        // SAFETY: erase the lifetime; see `Shared::f`.
        let f_static: *const (dyn Fn(usize) + Sync) = unsafe {
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f)
        };
        let shared = Arc::new(Shared {
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            n: num_tasks,
            f: f_static,
            panics: PanicSlot::new(),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        });
        // SAFETY: the API table of this call (`from_call`'s contract), checked to hold the entry.
        let schedule = unsafe { (*self.api).XLA_FFI_ThreadPool_Schedule };
        if let Some(schedule) = schedule {
            let helpers = (num_tasks - 1).min(threads);
            for _ in 0..helpers {
                let data = Box::into_raw(Box::new(shared.clone())) as *mut std::ffi::c_void;
                let mut args = sys::XLA_FFI_ThreadPool_Schedule_Args {
                    struct_size: sys::XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE as usize,
                    extension_start: std::ptr::null_mut(),
                    ctx: self.ctx,
                    task: Some(task_entry),
                    data,
                };
                // SAFETY: `self.ctx` is the live execution context of this call; `args` is a
                // complete argument struct; `data` is a leaked `Box<Arc<Shared>>` that
                // `task_entry` takes back exactly once when XLA runs it, and `task_entry`
                // catches every panic.
                let err = unsafe { schedule(&mut args) };
                if !err.is_null() {
                    // Not scheduled: reclaim the reference; the caller does the work.
                    // SAFETY: XLA refused the task, so `task_entry` will never see `data`: this
                    // is its only release. `err` was just created by this table.
                    unsafe {
                        drop(Box::from_raw(data as *mut Arc<Shared>));
                        crate::error::destroy_error(self.api, err);
                    }
                    break;
                }
            }
        }
        shared.work();
        {
            let mut g = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            while shared.done.load(Ordering::Acquire) < num_tasks {
                g = shared.cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        shared.panics.resume();
    }
    fn num_threads(&self) -> usize {
        match self.threads() {
            0 => kernel_core::default_pool().num_threads(),
            n => n,
        }
    }
}
