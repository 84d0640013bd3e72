//! Redirecting threads that hit the transient `int3` written at a function entry while it
//! is being patched or restored.
//!
//! The patch protocol first replaces a function's first byte with `int3`. A thread that
//! executes it raises `SIGTRAP`; our handler finds the site in a lock-free table and
//! moves the thread to the site's trampoline, which runs the function correctly whatever
//! state the patch is in. Any other `SIGTRAP` (a debugger's breakpoint, a program's own
//! `int3`) goes to the handler that was installed before ours.
//!
//! Entries are never removed: a thread may have trapped just before a patch completed
//! and still be on its way into the handler. The trampolines they point to live forever.

use crate::sys::{self, agent_threads, tasks};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Open-addressing table capacity (a power of two); at most half of it is used.
const CAPACITY: usize = 1 << 18;

static SITES: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
static REDIRECTS: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
static USED: Mutex<usize> = Mutex::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
static PREVIOUS_ACTION: OnceLock<libc::sigaction> = OnceLock::new();

fn slot_of(site: u64) -> usize {
    (site.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize & (CAPACITY - 1)
}

/// Records that a thread trapping on the `int3` at `site` must continue at `redirect`.
pub fn register_site(site: u64, redirect: u64) -> Result<(), String> {
    let mut used = USED.lock().unwrap_or_else(|p| p.into_inner());
    let mut slot = slot_of(site);
    loop {
        let current = SITES[slot].load(Ordering::Acquire);
        if current == site {
            REDIRECTS[slot].store(redirect, Ordering::Release);
            return Ok(());
        }
        if current == 0 {
            if *used >= CAPACITY / 2 {
                return Err("too many functions patched in this process's lifetime".into());
            }
            // Publish the redirect before the site, so a reader never sees a site
            // without its redirect.
            REDIRECTS[slot].store(redirect, Ordering::Release);
            SITES[slot].store(site, Ordering::Release);
            *used += 1;
            return Ok(());
        }
        slot = (slot + 1) & (CAPACITY - 1);
    }
}

/// The redirect for `site`, if one was registered. Async-signal-safe.
fn redirect_for(site: u64) -> Option<u64> {
    let mut slot = slot_of(site);
    loop {
        match SITES[slot].load(Ordering::Acquire) {
            0 => return None,
            s if s == site => return Some(REDIRECTS[slot].load(Ordering::Acquire)),
            _ => slot = (slot + 1) & (CAPACITY - 1),
        }
    }
}

/// How long a patch waits for every thread to take SIGTRAP again before it is refused.
pub const INSTALL_WAIT: Duration = Duration::from_millis(200);
/// How long a restore waits for the same before it goes ahead anyway.
pub const RESTORE_WAIT: Duration = Duration::from_secs(2);

/// Waits until no thread of the target blocks SIGTRAP, for at most `timeout`.
///
/// A thread that runs into an `int3` with SIGTRAP blocked never reaches the handler
/// below: the kernel ends the process. glibc blocks every signal for a moment while
/// it starts or ends a thread, raises a signal or spawns a process; a program may block
/// them for good in some thread (one that waits in `sigwait`, say). The transient
/// `int3`s of a patch are written only once no thread does — the moments pass; a
/// thread that keeps SIGTRAP blocked makes the patch impossible, and the error says
/// which thread.
pub fn wait_until_deliverable(timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let Some(tid) = thread_blocking_traps() else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            let mut buffer = [0u8; 64];
            let name = tasks::name(tid, &mut buffer)
                .map(|name| String::from_utf8_lossy(name.trim_ascii()).into_owned())
                .unwrap_or_default();
            return Err(format!(
                "thread {tid} ({name}) blocks SIGTRAP, and the int3 that patching writes \
                 for a moment would end the process if that thread ran into it"
            ));
        }
        sys::sleep_microseconds(500);
    }
}

/// A target thread (not the agent's) that blocks SIGTRAP now, if there is one.
fn thread_blocking_traps() -> Option<i32> {
    let me = sys::gettid();
    let mut found = None;
    tasks::for_each_thread(|tid| {
        // The agent's own threads first: they are many, and cheaper to rule out than
        // a read of a thread's status.
        if found.is_none()
            && tid != me
            && !agent_threads::is_agent_thread(tid)
            && tasks::blocks_signal(tid, libc::SIGTRAP)
        {
            found = Some(tid);
        }
    });
    found
}

/// Installs the `SIGTRAP` handler, remembering the previous one. Idempotent.
pub fn install() -> Result<(), String> {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    // SAFETY: installs an SA_SIGINFO handler with the matching signature; `previous` is a
    // valid, writable sigaction that receives the old disposition.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = trap_handler as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_NODEFER;
        libc::sigemptyset(&mut action.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTRAP, &action, &mut previous) != 0 {
            INSTALLED.store(false, Ordering::Release);
            return Err(format!(
                "cannot install a SIGTRAP handler: {}",
                std::io::Error::last_os_error()
            ));
        }
        let _ = PREVIOUS_ACTION.set(previous);
    }
    Ok(())
}

extern "C" fn trap_handler(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let context = context.cast::<libc::ucontext_t>();
    // SAFETY: the kernel passes a valid ucontext for an SA_SIGINFO handler; rip is the
    // address after the int3 that trapped.
    let pc = unsafe { (*context).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 };
    if let Some(redirect) = redirect_for(pc.wrapping_sub(1)) {
        // SAFETY: as above; the kernel resumes the thread at the edited rip.
        unsafe { (*context).uc_mcontext.gregs[libc::REG_RIP as usize] = redirect as i64 };
        return;
    }
    chain_to_previous(signal, info, context.cast());
}

/// Gives a `SIGTRAP` that is not ours to whoever handled it before.
fn chain_to_previous(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let Some(previous) = PREVIOUS_ACTION.get() else {
        return;
    };
    match previous.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // The default action ends the process with a core dump: restore it and
            // re-raise, as if we had never been there.
            // SAFETY: resetting a disposition to SIG_DFL and raising are async-signal-safe.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
                libc::raise(signal);
            }
        }
        handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this
            // signature and expects exactly these arguments.
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(handler) };
            handler(signal, info, context);
        }
        handler => {
            // SAFETY: a handler installed without SA_SIGINFO takes just the signal number.
            let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            handler(signal);
        }
    }
}
