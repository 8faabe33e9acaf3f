//! `kernel_core::ThreadPool` over torch's intra-op pool (`torch_parallel_for` from the stable
//! C shim), so `torch.set_num_threads` governs polyop kernels and they never oversubscribe the
//! cores torch already uses. Partitioning is decided by kernel-core (fixed chunks), so results
//! do not depend on the thread count.

use crate::sys as ffi;
use kernel_core::{PanicSlot, ThreadPool};
use std::ffi::c_void;

/// Runs tasks on torch's intra-op thread pool (`at::parallel_for` behind the stable ABI).
pub struct TorchPool;

struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    panics: &'a PanicSlot,
}

unsafe extern "C" fn run_range(begin: i64, end: i64, ctx: *mut c_void) {
    // SAFETY: ctx is the &Job passed to torch_parallel_for below, alive for the whole call.
    let job = unsafe { &*(ctx as *const Job) };
    for i in begin..end {
        // Never unwind into torch's (C++) worker threads: keep the panic, re-raise later.
        job.panics.catch(|| (job.f)(i as usize));
    }
}

impl ThreadPool for TorchPool {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if num_tasks == 0 {
            return;
        }
        if num_tasks == 1 {
            f(0);
            return;
        }
        let panics = PanicSlot::new();
        let job = Job { f, panics: &panics };
        // SAFETY: run_range only reads `job`, which outlives the (blocking) call.
        let rc = unsafe {
            ffi::torch_parallel_for(
                0,
                num_tasks as i64,
                1,
                Some(run_range),
                &job as *const Job as *mut c_void,
            )
        };
        panics.resume();
        if rc != ffi::SUCCESS {
            // Only reachable if torch itself failed to schedule; surfaces as an internal error
            // (the boxed entry point catches panics).
            panic!("torch_parallel_for failed: {}", ffi::last_error());
        }
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
