//! The stop's plan for each thread, without a stop: which threads a stop parks, holds
//! with ptrace or leaves asleep.

use super::*;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Waits (up to 10 s) until `check` holds.
fn wait_until(mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

#[test]
fn without_a_free_signal_running_threads_are_traced_and_sleepers_left_alone() {
    let done = Arc::new(AtomicBool::new(false));
    // One channel each: the two threads may start in either order.
    let (spinner_tid, spinner_started) = std::sync::mpsc::channel();
    let spinning = {
        let done = done.clone();
        std::thread::spawn(move || {
            spinner_tid.send(sys::gettid()).unwrap();
            while !done.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let (wake, wait) = std::sync::mpsc::channel::<()>();
    let (sleeper_tid, sleeper_started) = std::sync::mpsc::channel();
    let sleeping = std::thread::spawn(move || {
        sleeper_tid.send(sys::gettid()).unwrap();
        let _ = wait.recv();
    });
    let (spinner, sleeper) = (
        spinner_started.recv().unwrap(),
        sleeper_started.recv().unwrap(),
    );
    assert!(wait_until(|| tasks::state(sleeper) == TaskState::Sleeping));
    assert!(wait_until(|| tasks::state(spinner) != TaskState::Sleeping));
    assert_eq!(plan_for(spinner, NO_FREE_SIGNAL), Plan::Trace);
    assert_eq!(plan_for(sleeper, NO_FREE_SIGNAL), Plan::Leave);
    // With a signal the spinner accepts, it is parked by the signal.
    assert_eq!(plan_for(spinner, libc::SIGRTMAX() - 1), Plan::Park);
    done.store(true, Ordering::Relaxed);
    drop(wake);
    spinning.join().unwrap();
    sleeping.join().unwrap();
}
