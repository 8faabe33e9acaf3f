//! kernel-core's [`ThreadPool`] over ONNX Runtime's intra-op pool (`KernelContext_ParallelFor`),
//! so `SessionOptions.intra_op_num_threads` governs polyop kernels too. Partitioning is decided
//! by kernel-core (fixed chunks), so results do not depend on the thread count.

use crate::sys::Api;
use kernel_core::{PanicSlot, ThreadPool};
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

struct Task<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    slot: &'a PanicSlot,
}

unsafe extern "C" fn trampoline(data: *mut c_void, i: usize) {
    // SAFETY: `data` is the `Task` that `run` keeps alive until ParallelFor returns.
    let t = unsafe { &*(data as *const Task) };
    // No panic may unwind into onnxruntime's threads: keep it, re-raise after the loop.
    t.slot.catch(|| (t.f)(i));
}

impl ThreadPool for OrtPool {
    fn run(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        match num_tasks {
            0 => return,
            1 => return f(0),
            _ => {}
        }
        let slot = PanicSlot::new();
        {
            let task = Task { f, slot: &slot };
            // num_batch = 0: onnxruntime's TrySimpleParallelFor, one call per task index, on
            // the session's intra-op pool (inline when the pool has one thread).
            // SAFETY: `self.ctx` is the kernel context of the compute call this pool was made
            // for, still running on this thread; `task` outlives the call, which returns only
            // after every `trampoline(&task, i)` has finished, and `trampoline` catches panics
            // so none unwinds into onnxruntime.
            let st = unsafe {
                (self.api.0.KernelContext_ParallelFor)(
                    self.ctx,
                    trampoline,
                    num_tasks,
                    0,
                    &task as *const Task as *mut c_void,
                )
            };
            if !st.0.is_null() {
                // No pool available: run the tasks here. Tasks write disjoint, fixed ranges,
                // so re-running any that already ran gives the same bytes.
                self.api.release(st);
                for i in 0..num_tasks {
                    slot.catch(|| f(i));
                }
            }
        }
        slot.resume();
    }

    fn num_threads(&self) -> usize {
        // The C API does not expose the intra-op thread count; this is only a hint.
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}
