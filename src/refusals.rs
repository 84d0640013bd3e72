//! Functions that no hook may go into, known by name or by the code they are, refused
//! before the agent sees them (the agent knows addresses only).
//!
//! The one idea: some code is never entered the way a hook assumes, and only its name
//! tells it apart. A `.cold` part is the rarely run half of a function that the compiler
//! moved away; the function jumps there from inside its body, with its frame in place,
//! so the word at the stack pointer is no return address (a return hook would overwrite
//! a word of the frame) and the stack below it may be the function's red zone.
//!
//! A function that returns twice (`setjmp`, `vfork`, `getcontext`) cannot have its return
//! hooked: `setjmp` saves the word at the stack pointer as the address its second return
//! (a `longjmp`) goes to, and a return hook has put the address of tendril's exit code
//! there; the second return then comes through that code with no frame of tendril's left
//! to match, and the agent stops the process rather than return to an unknown address.
//! `vfork` returns through the same word in the child and then in the parent. Counting
//! their calls without hooking returns is safe.
//!
//! Go code is known by where it lies rather than by its name (`Function::go_code`, from
//! the module's `.gopclntab`). Go's runtime walks goroutine stacks by return address —
//! to grow and copy a stack, to scan it for the collector, to print a traceback — and
//! throws on a return address it does not know ("unexpected return pc"), which a return
//! hook's exit stub is; and a relocated Go prologue would call `runtime.morestack` from
//! a trampoline, whose frame the runtime cannot describe either. So Go-compiled code is
//! never patched; the C code of a cgo program, and the libraries it uses, are.
//!
//! What a thread's signal mask is never makes code refused: a patch writes no `int3`,
//! and the agent knows where every thread is whatever signals it blocks, so glibc's
//! functions that run with every signal blocked (a thread's start and end) are patched
//! like any other.

use crate::symbols::Function;

/// The reason for a `.cold` part.
pub const COLD_PART: &str =
    "the cold part of a function, entered by a jump from inside it rather than by a call";

/// The reason for a function compiled by Go.
pub const GO_CODE: &str =
    "Go code: its runtime walks stacks by return address; tendril cannot hook it";

/// The reason for a function that returns twice, when its returns would be hooked.
pub const RETURNS_TWICE: &str = "it returns twice (as setjmp, vfork and getcontext do), and its \
     second return would come through tendril's return hook with nothing left to match it";

/// The functions that return twice, by any of their names (`__GI_` aliases are matched
/// without the prefix), in glibc and in statically linked programs alike.
const RETURNING_TWICE: [&str; 11] = [
    "setjmp",
    "_setjmp",
    "__sigsetjmp",
    "sigsetjmp",
    "__libc_sigsetjmp",
    "vfork",
    "__vfork",
    "__libc_vfork",
    "getcontext",
    "__getcontext",
    "savectx",
];

/// Why `function` is refused by its name, if it is; `hooks_returns` says whether its
/// return would be hooked too (`record`, `count --returns`) or only its entry.
pub fn reason(function: &Function, hooks_returns: bool) -> Option<&'static str> {
    let name = function
        .raw_name
        .strip_prefix("__GI_")
        .unwrap_or(&function.raw_name);
    if function.go_code {
        Some(GO_CODE)
    } else if function.raw_name.ends_with(".cold") {
        Some(COLD_PART)
    } else if hooks_returns && RETURNING_TWICE.contains(&name) {
        Some(RETURNS_TWICE)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::ProcessSymbols;

    #[test]
    fn cold_parts_are_refused() {
        let function = |raw_name: &str| Function::for_tests("app", raw_name, 0x1000);
        assert_eq!(reason(&function("level1.cold"), false), Some(COLD_PART));
        assert_eq!(reason(&function("level1"), true), None);
        let go = Function {
            go_code: true,
            ..function("main.leaf")
        };
        assert_eq!(reason(&go, false), Some(GO_CODE));
    }

    #[test]
    fn functions_that_return_twice_are_refused_only_with_their_returns() {
        let symbols = ProcessSymbols::load(std::process::id() as i32).unwrap();
        for name in ["_setjmp", "__sigsetjmp", "vfork", "getcontext"] {
            let found = symbols.find(&format!("libc.so.6:{name}")).unwrap();
            assert!(!found.is_empty(), "libc has {name}");
            for function in found {
                assert_eq!(reason(function, true), Some(RETURNS_TWICE), "{name}");
                assert_eq!(reason(function, false), None, "{name}");
            }
        }
        assert!(
            symbols
                .find("libc.so.6:__sigjmp_save")
                .unwrap()
                .iter()
                .all(|f| reason(f, true).is_none())
        );
    }

    #[test]
    fn glibc_s_thread_start_and_end_are_not_refused() {
        let symbols = ProcessSymbols::load(std::process::id() as i32).unwrap();
        for name in ["madvise", "malloc", "start_thread", "__ctype_init"] {
            for function in symbols.find(&format!("libc.so.6:{name}")).unwrap() {
                if !function.raw_name.ends_with(".cold") {
                    assert_eq!(reason(function, true), None, "{name}");
                }
            }
        }
    }
}
