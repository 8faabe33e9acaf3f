//! `parallel::run_with_helpers`: every task runs exactly once whether helpers run at once, on
//! other threads, after the call returned, or never; a task panic reaches the caller.

use kernel_core::parallel::{run_with_helpers, Helper};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

fn counts(n: usize) -> Vec<AtomicUsize> {
    (0..n).map(|_| AtomicUsize::new(0)).collect()
}

#[test]
fn helpers_on_other_threads() {
    let hits = counts(1000);
    let mut threads = Vec::new();
    run_with_helpers(
        1000,
        3,
        &mut |h: Helper| {
            threads.push(std::thread::spawn(move || h.run()));
            true
        },
        &|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        },
    );
    assert!(hits.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    threads.into_iter().for_each(|t| t.join().unwrap());
}

#[test]
fn helpers_that_run_late_or_never_change_nothing() {
    let hits = counts(64);
    let parked: Mutex<Vec<Helper>> = Mutex::new(Vec::new());
    let mut refused = 0;
    run_with_helpers(
        64,
        4,
        &mut |h: Helper| {
            let mut p = parked.lock().unwrap();
            if p.len() < 2 {
                p.push(h); // held until after the call: the caller must not wait for it
                true
            } else {
                refused += 1;
                false // dropped: the framework could not take it
            }
        },
        &|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        },
    );
    assert_eq!(refused, 1, "no helper is offered after a refusal");
    assert!(hits.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    // A late helper finds nothing left to claim (and never touches the finished closure).
    parked
        .into_inner()
        .unwrap()
        .into_iter()
        .for_each(Helper::run);
    assert!(hits.iter().all(|c| c.load(Ordering::Relaxed) == 1));
}

#[test]
fn a_task_panic_reaches_the_caller_after_every_task_ran() {
    let hits = counts(100);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_with_helpers(
            100,
            2,
            &mut |h: Helper| {
                std::thread::spawn(move || h.run());
                true
            },
            &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
                assert!(i != 37, "task 37 fails");
            },
        )
    }));
    let msg = r.unwrap_err();
    assert_eq!(msg.downcast_ref::<&str>(), Some(&"task 37 fails"));
    assert!(hits.iter().all(|c| c.load(Ordering::Relaxed) == 1));
}
