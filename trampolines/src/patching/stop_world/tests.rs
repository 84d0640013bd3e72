//! The stop's plan for each thread, without a stop: which threads a stop parks, holds
//! with ptrace or leaves asleep; and a peek, for real, in the test's own process.

use super::*;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Held by each test here: a peek signals (or traces) the other tests' threads, whose
/// states the plan test reads.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
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

/// Code a thread can be caught in: `jmp $` (spins where it is), then `ret`.
struct SpinThenReturn {
    page: *mut libc::c_void,
}

impl SpinThenReturn {
    const SPIN_LEN: u64 = 2;
    const PAGE: usize = 4096;

    fn new() -> SpinThenReturn {
        // SAFETY: a fresh anonymous mapping, owned by the value; nothing else refers to it.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::PAGE,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        // SAFETY: the mapping is writable and at least three bytes long.
        unsafe {
            std::ptr::copy_nonoverlapping([0xeb_u8, 0xfe, 0xc3].as_ptr(), page.cast::<u8>(), 3)
        };
        SpinThenReturn { page }
    }

    fn start(&self) -> u64 {
        self.page as u64
    }
}

impl Drop for SpinThenReturn {
    fn drop(&mut self) {
        // SAFETY: the mapping is this value's, and no thread runs in it any more (the
        // test joins the thread that did first).
        unsafe { libc::munmap(self.page, Self::PAGE) };
    }
}

/// A thread that runs `code`'s loop until something moves it past: its tid, whether it
/// returned, and its handle.
fn spin_in(code: &SpinThenReturn) -> (i32, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let start = code.start();
    let (tid_sender, tid) = std::sync::mpsc::channel();
    let returned = Arc::new(AtomicBool::new(false));
    let spinner = {
        let returned = returned.clone();
        std::thread::spawn(move || {
            tid_sender.send(sys::gettid()).unwrap();
            // SAFETY: the page holds `jmp $; ret`, a function with no arguments that
            // returns once something moves the thread past its loop.
            let spin: extern "C" fn() = unsafe { std::mem::transmute(start as *const ()) };
            spin();
            returned.store(true, Ordering::Release);
        })
    };
    (tid.recv().unwrap(), returned, spinner)
}

#[test]
fn a_peek_moves_a_thread_off_the_bytes_it_names_and_parks_no_one() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    install().unwrap();
    let code = SpinThenReturn::new();
    let start = code.start();
    let (spinner_tid, returned, spinner) = spin_in(&code);
    // The thread may not have reached its loop by the first peek: peek until it has
    // been moved past it, each time checking that nobody was left parked.
    let mut peeks = 0;
    while !returned.load(Ordering::Acquire) && peeks < 1000 {
        let parked_spinner = with_every_thread_peeked(
            &[(
                start,
                start + SpinThenReturn::SPIN_LEN,
                start + SpinThenReturn::SPIN_LEN,
            )],
            |world| world.stopped.iter().any(|t| t.tid() == spinner_tid),
        )
        .unwrap();
        assert!(
            !parked_spinner,
            "a peek holds no thread that takes its signal"
        );
        peeks += 1;
        wait_until(|| {
            returned.load(Ordering::Acquire) || tasks::state(spinner_tid) == TaskState::Running
        });
    }
    assert!(
        wait_until(|| returned.load(Ordering::Acquire)),
        "moved past its loop"
    );
    spinner.join().unwrap();
}

/// Where the self-check below found the spinner's loop, and which thread it found
/// there.
static LOOP_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static FOUND_IN_LOOP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// A self-check: notes the calling thread if it was interrupted in the loop.
fn note_if_in_loop(pc: u64) {
    let at = LOOP_AT.load(Ordering::Acquire);
    if (at..at + SpinThenReturn::SPIN_LEN).contains(&pc) {
        FOUND_IN_LOOP.store(sys::gettid(), Ordering::Release);
    }
}

#[test]
fn a_self_check_runs_on_each_running_thread_which_goes_on_at_once() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    install().unwrap();
    let code = SpinThenReturn::new();
    let start = code.start();
    LOOP_AT.store(start, Ordering::Release);
    let (spinner_tid, returned, spinner) = spin_in(&code);
    // The thread may not be in its loop yet at the first check.
    let mut checks = 0;
    while FOUND_IN_LOOP.load(Ordering::Acquire) != spinner_tid && checks < 1000 {
        let (stopped, peeked) = with_every_thread_checking_itself(note_if_in_loop, |world| {
            let held = world.stopped.iter().any(|t| t.tid() == spinner_tid);
            (held, world.peeked.binary_search(&spinner_tid).is_ok())
        })
        .unwrap();
        assert!(
            !stopped,
            "a self-check holds no thread that takes its signal"
        );
        assert!(
            peeked || tasks::state(spinner_tid) == TaskState::Sleeping,
            "a running thread is listed as peeked"
        );
        checks += 1;
        wait_until(|| tasks::state(spinner_tid) == TaskState::Running);
    }
    assert_eq!(FOUND_IN_LOOP.load(Ordering::Acquire), spinner_tid);
    // It went on spinning: move it past its loop to end it.
    assert!(!returned.load(Ordering::Acquire));
    let past = (
        start,
        start + SpinThenReturn::SPIN_LEN,
        start + SpinThenReturn::SPIN_LEN,
    );
    for _ in 0..1000 {
        if returned.load(Ordering::Acquire) {
            break;
        }
        with_every_thread_peeked(&[past], |_| ()).unwrap();
        wait_until(|| {
            returned.load(Ordering::Acquire) || tasks::state(spinner_tid) == TaskState::Running
        });
    }
    spinner.join().unwrap();
}

#[test]
fn a_running_thread_that_blocks_the_signal_is_held_with_ptrace_and_remembered() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let signal = install().unwrap();
    assert!(signal > 0, "a free real-time signal in the test process");
    let done = Arc::new(AtomicBool::new(false));
    let (tid_sender, tid) = std::sync::mpsc::channel();
    let spinner = {
        let done = done.clone();
        std::thread::spawn(move || {
            // SAFETY: blocks the park signal in this thread only; the mask is plain data.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, signal);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            tid_sender.send(sys::gettid()).unwrap();
            while !done.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let spinner_tid = tid.recv().unwrap();
    assert!(wait_until(
        || tasks::state(spinner_tid) == TaskState::Running
    ));
    // Not known yet: planned from its `syscall` file alone, it is signalled.
    assert!(!waiting::known_blocker(spinner_tid));
    let held =
        with_world_stopped(|world| world.stopped.iter().any(|t| t.tid() == spinner_tid)).unwrap();
    assert!(held, "held with ptrace once it did not park");
    // Known now: the next stop reads its status and holds it without a signal.
    assert!(waiting::known_blocker(spinner_tid));
    assert_eq!(plan_for(spinner_tid, signal), Plan::Trace);
    done.store(true, Ordering::Relaxed);
    spinner.join().unwrap();
}

#[test]
fn a_thread_that_wakes_before_the_fence_is_stopped_behind_it() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    install().unwrap();
    thread_tracer::prepare().unwrap();
    let mut pipe = [0; 2];
    // SAFETY: `pipe` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let awake = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let (tid_sender, tid) = std::sync::mpsc::channel();
    let sleeper = {
        let (awake, done) = (awake.clone(), done.clone());
        std::thread::spawn(move || {
            tid_sender.send(sys::gettid()).unwrap();
            let mut byte = 0u8;
            // SAFETY: reads one byte into `byte` from the pipe this test owns.
            unsafe { libc::read(pipe[0], (&mut byte as *mut u8).cast(), 1) };
            awake.store(true, Ordering::SeqCst);
            while !done.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let sleeper_tid = tid.recv().unwrap();
    assert!(wait_until(
        || tasks::whereabouts(sleeper_tid) == tasks::Whereabouts::InSystemCall
    ));
    // The fence wakes the sleeper, which the stop planned as asleep, and lets it run
    // user code: as a thread that woke between its look and the guards would.
    let fence = || {
        // SAFETY: writes one byte from a local to the pipe this test owns.
        unsafe { libc::write(pipe[1], [1u8].as_ptr().cast(), 1) };
        assert!(wait_until(|| awake.load(Ordering::SeqCst)));
    };
    let stopped = with_world_stopped_behind(&mut StopBuffers::new(), &fence, |world| {
        (
            world.stopped.iter().any(|t| t.tid() == sleeper_tid),
            world.asleep.contains(&sleeper_tid),
        )
    })
    .unwrap();
    assert_eq!(stopped, (true, false), "stopped behind the fence, not left");
    done.store(true, Ordering::Relaxed);
    sleeper.join().unwrap();
    // SAFETY: closes the pipe's descriptors, which nothing uses any more.
    unsafe {
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
}
