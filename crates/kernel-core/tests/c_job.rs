//! `run_c_job`: the ThreadPool glue over a framework's C parallel-for (torch, ONNX Runtime).

use kernel_core::{run_c_job, CJob};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A stand-in for a C parallel-for: calls back with the context pointer, in chunks of two, on
/// two threads.
fn two_thread_parallel_for(n: usize, ctx: *mut std::ffi::c_void) -> bool {
    let ctx = ctx as usize;
    std::thread::scope(|s| {
        for t in 0..2 {
            s.spawn(move || {
                for start in (t * 2..n).step_by(4) {
                    // SAFETY: `ctx` is the job of the running `run_c_job`, which outlives the
                    // scope.
                    unsafe { CJob::from_ctx(ctx as *mut _) }.run(start..(start + 2).min(n));
                }
            });
        }
    });
    true
}

#[test]
fn every_task_runs_once_through_the_framework() {
    let seen = Mutex::new(vec![0u32; 11]);
    run_c_job(11, &|i| seen.lock().unwrap()[i] += 1, |ctx| {
        two_thread_parallel_for(11, ctx)
    });
    assert_eq!(*seen.lock().unwrap(), vec![1; 11]);
}

#[test]
fn a_refusing_framework_runs_every_task_on_the_caller() {
    let count = AtomicUsize::new(0);
    let caller = std::thread::current().id();
    run_c_job(
        5,
        &|_| {
            assert_eq!(std::thread::current().id(), caller);
            count.fetch_add(1, Ordering::SeqCst);
        },
        |_| false,
    );
    assert_eq!(count.load(Ordering::SeqCst), 5);
}

#[test]
fn zero_or_one_task_never_reaches_the_framework() {
    for n in [0, 1] {
        let count = AtomicUsize::new(0);
        run_c_job(n, &|_| _ = count.fetch_add(1, Ordering::SeqCst), |_| {
            panic!("submitted")
        });
        assert_eq!(count.load(Ordering::SeqCst), n);
    }
}

#[test]
fn a_task_panic_is_raised_on_the_caller_after_all_tasks() {
    let count = AtomicUsize::new(0);
    let r = std::panic::catch_unwind(|| {
        run_c_job(
            8,
            &|i| {
                count.fetch_add(1, Ordering::SeqCst);
                assert!(i != 3, "task 3 failed");
            },
            |ctx| two_thread_parallel_for(8, ctx),
        )
    });
    let payload = r.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"task 3 failed"));
    assert_eq!(count.load(Ordering::SeqCst), 8);
}
