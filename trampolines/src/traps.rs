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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

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
