//! `kernel_core::ThreadPool` over torch's intra-op pool (`torch_parallel_for` from the stable
//! C shim), so `torch.set_num_threads` governs polyop kernels and they never oversubscribe the
//! cores torch already uses. Partitioning is decided by kernel-core (fixed chunks), so results
//! do not depend on the thread count.

use crate::sys as ffi;
use kernel_core::{run_c_job, CJob, ThreadPool};
use std::ffi::c_void;

/// Runs tasks on torch's intra-op thread pool (`at::parallel_for` behind the stable ABI).
pub struct TorchPool;

unsafe extern "C" fn run_range(begin: i64, end: i64, ctx: *mut c_void) {
    // SAFETY: `ctx` is the job `run_c_job` handed to torch_parallel_for, alive for that call.
    unsafe { CJob::from_ctx(ctx) }.run(begin as usize..end as usize);
}

impl ThreadPool for TorchPool {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        run_c_job(num_tasks, f, |ctx| {
            // SAFETY: `run_range` only reads the job behind `ctx`, which outlives this
            // (blocking) call.
            let rc =
                unsafe { ffi::torch_parallel_for(0, num_tasks as i64, 1, Some(run_range), ctx) };
            rc == ffi::SUCCESS
        });
    }

    fn num_threads(&self) -> usize {
        let mut n = 1u32;
        // SAFETY: plain out-parameter.
        let rc = unsafe { ffi::torch_get_num_threads(&mut n) };
        if rc == ffi::SUCCESS {
            n.max(1) as usize
        } else {
            1
        }
    }
}
