//! kernel-core's [`ThreadPool`] over XLA's intra-op thread pool (`XLA_FFI_ThreadPool_Schedule`,
//! FFI API >= 0.1). On XLA:CPU that is the Eigen pool that runs every other compute task, so a
//! polyop kernel inside a jitted program never oversubscribes the cores.
//!
//! `Schedule` is fire-and-forget and XLA documents that tasks may run on the caller's thread,
//! later, or on a pool of size 1, so `run` is kernel-core's `run_with_helpers` (the caller
//! claims tasks itself and never waits for a helper to start) with XLA's `Schedule` handing the
//! helpers over.

use crate::error::FfiError;
use crate::sys;
use kernel_core::parallel::{run_with_helpers, Helper};
use kernel_core::ThreadPool;

/// XLA's intra-op pool, for one handler invocation. The thread count is asked for only when
/// a kernel actually splits its work (most tiny calls never do).
pub struct XlaPool {
    api: *const sys::XLA_FFI_Api,
    ctx: *mut sys::XLA_FFI_ExecutionContext,
    /// The table's `XLA_FFI_ThreadPool_NumThreads` and `XLA_FFI_ThreadPool_Schedule`.
    num_threads_fn: unsafe extern "C" fn(*mut sys::XLA_FFI_ThreadPool_NumThreads_Args) -> FfiError,
    schedule: unsafe extern "C" fn(*mut sys::XLA_FFI_ThreadPool_Schedule_Args) -> FfiError,
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
        Some(XlaPool {
            api,
            ctx,
            num_threads_fn: a.XLA_FFI_ThreadPool_NumThreads?,
            schedule: a.XLA_FFI_ThreadPool_Schedule?,
            threads: std::sync::OnceLock::new(),
        })
    }

    fn threads(&self) -> usize {
        *self.threads.get_or_init(|| {
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
            let err = unsafe { (self.num_threads_fn)(&mut args) };
            if !err.is_null() {
                // SAFETY: `err` was just created by this table and is not used again.
                unsafe { crate::error::destroy_error(self.api, err) };
                return 0;
            }
            n.max(0) as usize
        })
    }
}

unsafe extern "C" fn task_entry(data: *mut std::ffi::c_void) {
    // Nothing may unwind into XLA: `Helper::run` keeps task panics; this catches the rest.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `data` is the Box<Helper> leaked by `run` for this task, taken back once.
        unsafe { Box::from_raw(data as *mut Helper) }.run();
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
        let mut hand_over = |helper: Helper| {
            let data = Box::into_raw(Box::new(helper)) as *mut std::ffi::c_void;
            let mut args = sys::XLA_FFI_ThreadPool_Schedule_Args {
                struct_size: sys::XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE as usize,
                extension_start: std::ptr::null_mut(),
                ctx: self.ctx,
                task: Some(task_entry),
                data,
            };
            // SAFETY: `self.ctx` is the live execution context of this call; `args` is a
            // complete argument struct; `data` is a leaked `Box<Helper>` that `task_entry`
            // takes back exactly once when XLA runs it, and `task_entry` catches every panic.
            let err = unsafe { (self.schedule)(&mut args) };
            if err.is_null() {
                return true;
            }
            // Not scheduled: XLA refused the task, so `task_entry` will never see `data`: this
            // is its only release; `err` was just created by this table.
            // SAFETY: as said.
            unsafe {
                drop(Box::from_raw(data as *mut Helper));
                crate::error::destroy_error(self.api, err);
            }
            false
        };
        run_with_helpers(num_tasks, threads, &mut hand_over, f);
    }
    fn num_threads(&self) -> usize {
        match self.threads() {
            0 => kernel_core::default_pool().num_threads(),
            n => n,
        }
    }
}
