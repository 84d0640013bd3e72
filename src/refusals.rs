//! Functions that no hook may go into, known by name, refused before the agent sees
//! them (the agent knows addresses only).
//!
//! The one idea: some code is never entered the way a hook assumes, or runs where the
//! transient `int3` of a patch would end the process, and only names tell it apart:
//!
//! * a `.cold` part is the rarely run half of a function that the compiler moved away;
//!   the function jumps there from inside its body, with its frame in place, so the
//!   word at the stack pointer is no return address (a return hook would overwrite a
//!   word of the frame) and the stack below it may be the function's red zone;
//! * glibc runs a few functions with every signal blocked, SIGTRAP included — while it
//!   starts a thread (`__ctype_init`, the `clone` of `pthread_create`), while a thread
//!   ends (freeing its stack) and while it raises a signal. A thread that meets an
//!   `int3` with SIGTRAP blocked is not sent on by tendril's handler: the kernel ends
//!   the process. In a program that starts threads, they may run at any moment.

use crate::symbols::{Function, ProcessSymbols};
use std::collections::HashSet;

/// The reason for a `.cold` part.
pub const COLD_PART: &str =
    "the cold part of a function, entered by a jump from inside it rather than by a call";
/// The reason for glibc's functions that run with every signal blocked.
pub const SIGNALS_BLOCKED: &str = "glibc runs it with every signal blocked (as a thread starts \
     or ends, or raises a signal), where the int3 a patch writes for a moment would end the \
     process";

/// glibc's functions that run with every signal blocked (found in glibc 2.36 by
/// following the direct calls made while `start_thread`, `pthread_create` and
/// `pthread_kill` have every signal blocked; error paths left out), by any of their
/// names (`__GI_` aliases are matched without the prefix). `free`, which a thread's end
/// calls only when the cache of thread stacks is full, is left to the user's judgement.
const GLIBC_SIGNALS_BLOCKED: [&str; 35] = [
    // A new thread, until it unblocks signals.
    "start_thread",
    "__ctype_init",
    "_setjmp",
    "__sigsetjmp",
    "__sigjmp_save",
    // pthread_create, from blocking signals until the new thread runs.
    "create_thread",
    "__clone_internal",
    "__clone3",
    "clone3",
    "__clone",
    "clone",
    "__pthread_sigmask",
    "pthread_sigmask",
    "__sigprocmask",
    "sigprocmask",
    // A thread's end, once it blocked every signal.
    "__getpagesize",
    "getpagesize",
    "madvise",
    "__madvise",
    "munmap",
    "__munmap",
    "__nptl_free_tcb",
    "__nptl_deallocate_stack",
    "__nptl_free_stacks",
    "__nptl_stack_list_del",
    "__nptl_stack_list_add",
    "__nptl_death_event",
    "__lll_lock_wait_private",
    "__lll_lock_wake_private",
    // raise, abort and pthread_kill block every signal around the kill.
    "__pthread_kill_implementation",
    "__pthread_kill_internal",
    "__getpid",
    "getpid",
    "__gettid",
    "gettid",
];

/// The functions of one process that are refused by name.
pub struct Refusals {
    signals_blocked: HashSet<u64>,
}

impl Refusals {
    pub fn new(symbols: &ProcessSymbols) -> Refusals {
        let signals_blocked = symbols
            .functions()
            .iter()
            .filter(|f| f.module.starts_with("libc.so"))
            .filter(|f| {
                let name = f.raw_name.strip_prefix("__GI_").unwrap_or(&f.raw_name);
                GLIBC_SIGNALS_BLOCKED.contains(&name)
            })
            .map(|f| f.addr)
            .collect();
        Refusals { signals_blocked }
    }

    /// Why `function` is refused, if it is.
    pub fn reason(&self, function: &Function) -> Option<&'static str> {
        if function.raw_name.ends_with(".cold") {
            Some(COLD_PART)
        } else if self.signals_blocked.contains(&function.addr) {
            Some(SIGNALS_BLOCKED)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::SymbolSource;

    #[test]
    fn glibc_s_thread_end_is_refused_and_malloc_is_not() {
        let symbols = ProcessSymbols::load(std::process::id() as i32).unwrap();
        let refusals = Refusals::new(&symbols);
        let reasons = |name: &str| -> Vec<Option<&str>> {
            let found = symbols.find(&format!("libc.so.6:{name}")).unwrap();
            found.into_iter().map(|f| refusals.reason(f)).collect()
        };
        let madvise = reasons("madvise");
        assert!(!madvise.is_empty(), "libc has madvise");
        assert!(
            madvise.iter().all(|r| *r == Some(SIGNALS_BLOCKED)),
            "{madvise:?}"
        );
        assert!(reasons("malloc").iter().all(Option::is_none));
    }

    #[test]
    fn cold_parts_are_refused() {
        let function = |raw_name: &str| Function {
            addr: 0x1000,
            size: 16,
            module: "app".into(),
            module_path: "/app".into(),
            name: raw_name.into(),
            raw_name: raw_name.into(),
            source: SymbolSource::Symtab,
            ifunc: false,
        };
        let refusals = Refusals {
            signals_blocked: HashSet::new(),
        };
        assert_eq!(refusals.reason(&function("level1.cold")), Some(COLD_PART));
        assert_eq!(refusals.reason(&function("level1")), None);
    }
}
