//! The thread that registers the copies' unwind information with the process's
//! unwinder, so that the patcher never waits for the unwinder's lock.
//!
//! The patcher builds a function's copy with the loader held (`loaded_modules`), and its
//! `.eh_frame` must be registered before the copy's entry goes in. libgcc's
//! `__register_frame` takes the unwinder's lock (`object_mutex`), and a target thread
//! may hold that lock while it waits for the loader: a thread that unwinds (an
//! exception, `pthread_exit`) searches the registered sections under the lock and calls
//! `malloc` there, and a hooked `malloc`'s first call is discovered, with the loader
//! held. Had the patcher taken the unwinder's lock itself, each would wait for the
//! other for ever (`blocked_traps`' test of all of libc hung so, one run in three).
//!
//! The one idea: the patcher hands the section to this thread and waits at most
//! [`REGISTRATION_WAIT`]. Past it, the copy is given up (the function is patched
//! without one, or the command refused with the reason): the loader is let go, the
//! target thread goes on, and the registrar, once the lock is free, registers the
//! section of a copy nobody enters, which is harmless. While a registration is still
//! waiting, later ones are refused at once. The control thread runs the registrar
//! while a session is open, as it does the discoverer.

use crate::sys::frame_registry;
use crate::sys::state::{Registrar, RegistrarQueue, STATE};
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long the patcher waits for a registration. The unwinder's lock is held for a
/// search of the registered sections: microseconds, a millisecond for a large one.
const REGISTRATION_WAIT: Duration = Duration::from_millis(250);

fn lock(registrar: &Registrar) -> MutexGuard<'_, RegistrarQueue> {
    registrar.queue.lock().unwrap_or_else(|p| p.into_inner())
}

fn registrar() -> Option<&'static Registrar> {
    // SAFETY: a non-null pointer here is a leaked `Registrar`, never freed.
    unsafe { STATE.frame_registrar.load(Ordering::Acquire).as_ref() }
}

/// Why a copy's unwind information was not registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRegistered {
    /// No session runs the registrar (the copy was asked for outside one).
    NoRegistrar,
    /// The unwinder's lock stayed taken past the wait.
    UnwinderBusy,
}

impl std::fmt::Display for NotRegistered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotRegistered::NoRegistrar => {
                "the agent's unwind registrar is not running, so a copy of the function \
                 could not be unwound through"
            }
            NotRegistered::UnwinderBusy => {
                "the process's unwinder stayed locked by one of its threads, so a copy \
                 of the function could not be made unwindable; try again"
            }
        })
    }
}

/// Registers `section` (as `frame_registry::register_on_this_thread`) on the
/// registrar's thread, waiting at most [`REGISTRATION_WAIT`] for it: safe with the
/// loader held.
pub fn register(section: Vec<u8>) -> Result<(), NotRegistered> {
    let registrar = registrar().ok_or(NotRegistered::NoRegistrar)?;
    let mut queue = lock(registrar);
    if !queue.serving || queue.ending {
        return Err(NotRegistered::NoRegistrar);
    }
    if queue.stuck {
        return Err(NotRegistered::UnwinderBusy);
    }
    queue.sections.push_back(section);
    queue.asked += 1;
    let ticket = queue.asked;
    registrar.asked.notify_one();
    let deadline = Instant::now() + REGISTRATION_WAIT;
    while queue.done < ticket {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            queue.stuck = true;
            return Err(NotRegistered::UnwinderBusy);
        }
        queue = (registrar.done.wait_timeout(queue, left))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    Ok(())
}

/// Says a registrar serves from now on, before its thread starts (or while one that
/// was asked to end may still be running, which then goes on): a copy made as soon as
/// the session begins finds it.
pub fn expect_serving() {
    let mut queue = lock(own_registrar());
    queue.serving = true;
    queue.ending = false;
}

/// The registrar's state, made on first use.
fn own_registrar() -> &'static Registrar {
    registrar().unwrap_or_else(|| {
        let fresh: &'static Registrar = Box::leak(Box::default());
        let made = fresh as *const Registrar as *mut Registrar;
        // Only the control thread (or a test) makes one: the first one made stays.
        match (STATE.frame_registrar).compare_exchange(
            std::ptr::null_mut(),
            made,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => fresh,
            // SAFETY: a non-null pointer here is a leaked `Registrar`, never freed.
            Err(existing) => unsafe { &*existing },
        }
    })
}

/// The registrar's loop, on an agent thread the control thread started: registers
/// each section handed over, until asked to end (the sections still queued first).
pub fn serve() {
    let registrar = own_registrar();
    let mut queue = lock(registrar);
    queue.serving = true;
    loop {
        let Some(section) = queue.sections.pop_front() else {
            if queue.ending {
                queue.serving = false;
                return;
            }
            queue = (registrar.asked.wait(queue)).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        drop(queue);
        frame_registry::register_on_this_thread(section);
        queue = lock(registrar);
        queue.done += 1;
        if queue.done == queue.asked {
            queue.stuck = false;
        }
        registrar.done.notify_all();
    }
}

/// Asks the registrar to end once the sections queued are registered (the control
/// thread then joins it).
pub fn ask_to_end() {
    if let Some(registrar) = registrar() {
        lock(registrar).ending = true;
        registrar.asked.notify_one();
    }
}

/// In a forked child: the parent's registrar is not there (see `STATE.frame_registrar`). Only an
/// atomic store, as a fork handler must.
pub fn forget_in_forked_child() {
    STATE
        .frame_registrar
        .store(std::ptr::null_mut(), Ordering::Release);
}

// Real registrations with the process's unwinder, which Miri cannot make.
#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    #[test]
    fn sections_handed_over_are_registered_by_the_registrar_and_refused_without_one() {
        // One test: the registrar is the process's only one.
        let page = crate::sys::frame_registry::tests_support::leaked_page();
        let section = crate::sys::frame_registry::tests_support::leaf_function_section(page, 32);
        assert_eq!(
            register(section.clone()),
            Err(NotRegistered::NoRegistrar),
            "no registrar runs yet"
        );
        let serving = std::thread::spawn(serve);
        while !registrar().is_some_and(|r| lock(r).serving) {
            std::thread::yield_now();
        }
        assert_eq!(register(section), Ok(()));
        let found = frame_registry::unwinder_finds(page + 31).expect("registered");
        assert_eq!(found.function, page);
        ask_to_end();
        serving.join().unwrap();
        let again = crate::sys::frame_registry::tests_support::leaf_function_section(page + 64, 8);
        assert_eq!(register(again), Err(NotRegistered::NoRegistrar));
    }
}
