//! kernel-core's [`ThreadPool`] over ONNX Runtime's intra-op pool (`KernelContext_ParallelFor`),
//! so `SessionOptions.intra_op_num_threads` governs polyop kernels too. Partitioning is decided
//! by kernel-core (fixed chunks), so results do not depend on the thread count.

use crate::sys::Api;
use kernel_core::{run_c_job, CJob, ThreadPool};
use ort_sys::OrtKernelContext;
use std::ffi::c_void;

pub struct OrtPool {
    pub api: Api,
    pub ctx: *const OrtKernelContext,
}

// SAFETY: `Sync` lets kernel-core hand `&OrtPool` to pool tasks (`ThreadPool: Sync`). The only
// use of `ctx` through a shared reference is passing it to `KernelContext_ParallelFor`, which
// only reads the context (to find its intra-op pool); the context stays valid while any task
// runs, since an `OrtPool` lives inside one compute call and `run` returns only after all of
// its tasks have finished.
unsafe impl Sync for OrtPool {}

unsafe extern "C" fn trampoline(ctx: *mut c_void, i: usize) {
    // SAFETY: `ctx` is the job `run_c_job` handed to ParallelFor, alive for that call.
    unsafe { CJob::from_ctx(ctx) }.run(i..i + 1);
}

impl ThreadPool for OrtPool {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        run_c_job(num_tasks, f, |ctx| {
            // num_batch = 0: onnxruntime's TrySimpleParallelFor, one call per task index, on
            // the session's intra-op pool (inline when the pool has one thread).
            // SAFETY: the kernel context is live for the compute call that made `self`;
            // `trampoline` only reads the job behind `ctx`, which outlives this (blocking) call.
            let st = unsafe {
                (self.api.0.KernelContext_ParallelFor)(self.ctx, trampoline, num_tasks, 0, ctx)
            };
            // A failed ParallelFor (no pool) runs the tasks here.
            self.api.check(st).is_ok()
        });
    }

    fn num_threads(&self) -> usize {
        // The C API does not expose the intra-op thread count; this is only a hint.
        kernel_core::available_threads()
    }
}
