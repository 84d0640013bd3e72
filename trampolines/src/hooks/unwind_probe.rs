//! For tests: does a backtrace taken at every instruction of an assembly routine reach
//! the code that called it? That is what the routine's `.cfi_*` directives promise to
//! the unwinder (a profiler's sampler, a debugger, an exception passing through).
//!
//! The one idea: the probe calls the routine with the trap flag set, so the cpu stops
//! after every instruction with a `SIGTRAP`. Its handler walks the stack with libgcc's
//! `_Unwind_Backtrace` (through the signal frame) and notes whether the walk met the
//! probe's own return address — the instruction after its `call`. A routine without
//! unwind information ends the walk at itself; a wrong directive loses the caller at
//! the instruction it describes.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

unsafe extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(context: *mut c_void, found: *mut c_void) -> c_int,
        found: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(context: *mut c_void) -> usize;
}

/// The most single steps one probe notes; a routine and its callee take far fewer.
const MAX_STEPS: usize = 4096;

/// Where the probe's `call` returns: the walk must meet it.
static CALLER: AtomicU64 = AtomicU64::new(0);
/// The address of each step, and whether its walk met [`CALLER`].
static STEP_ADDRESSES: [AtomicU64; MAX_STEPS] = [const { AtomicU64::new(0) }; MAX_STEPS];
static STEP_FOUND: [AtomicBool; MAX_STEPS] = [const { AtomicBool::new(false) }; MAX_STEPS];
static STEPS: AtomicUsize = AtomicUsize::new(0);

/// One single step of the probe: where the cpu stopped, and whether a backtrace taken
/// there reached the probe's caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub address: u64,
    pub reaches_caller: bool,
}

/// Calls `routine` with `rdi`, `rsi`, `rdx` and `r11` set to `arguments` (in that
/// order), stopping after each instruction it and its callees run, and returns every
/// stop. The routine must follow the C calling convention or preserve more.
pub fn step_through(routine: u64, arguments: [u64; 4]) -> Vec<Step> {
    // One probe at a time: the trap handler and its notes are process-wide.
    static PROBE: Mutex<()> = Mutex::new(());
    let _probe = PROBE.lock().unwrap_or_else(|p| p.into_inner());
    STEPS.store(0, Ordering::SeqCst);
    CALLER.store(0, Ordering::SeqCst);
    // SAFETY: sigaction is plain data; all zeroes is a valid value (no handler, no mask).
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: installs an SA_SIGINFO handler with the matching signature for SIGTRAP,
    // which nothing else in the test process uses; the previous action is put back below.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_step as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGTRAP, &action, &mut previous), 0);
    }
    // SAFETY: calls the routine as a C function (every caller-saved register is declared
    // clobbered); the trap flag is set by `popfq`, so the first stop is after the `call`,
    // and the handler clears it when the routine has returned to label 2.
    unsafe {
        std::arch::asm!(
            "lea r10, [rip + 2f]",
            "mov qword ptr [rax], r10",
            "pushfq",
            "or qword ptr [rsp], 0x100",
            "popfq",
            "call rcx",
            "2:",
            in("rax") CALLER.as_ptr(),
            in("rcx") routine,
            in("rdi") arguments[0],
            in("rsi") arguments[1],
            in("rdx") arguments[2],
            in("r11") arguments[3],
            clobber_abi("C"),
        );
    }
    // SAFETY: puts back the action saved above.
    unsafe { libc::sigaction(libc::SIGTRAP, &previous, std::ptr::null_mut()) };
    let steps = STEPS.load(Ordering::SeqCst).min(MAX_STEPS);
    (0..steps)
        .map(|i| Step {
            address: STEP_ADDRESSES[i].load(Ordering::SeqCst),
            reaches_caller: STEP_FOUND[i].load(Ordering::SeqCst),
        })
        .collect()
}

/// The addresses of a straight-line routine's instructions, from `start` to its first
/// `ret` (included).
pub fn instructions_up_to_ret(start: u64) -> Vec<u64> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    // SAFETY: `start` is a routine of this binary's text; the decoder reads it up to its
    // `ret`, which lies well within 4 KiB of code that stays mapped.
    let code = unsafe { std::slice::from_raw_parts(start as *const u8, 4096) };
    let mut addresses = Vec::new();
    for instruction in Decoder::with_ip(64, code, start, DecoderOptions::NONE).iter() {
        addresses.push(instruction.ip());
        if instruction.mnemonic() == Mnemonic::Ret {
            break;
        }
    }
    addresses
}

/// Checks that `routine`'s every instruction was stepped and that every walk, inside
/// it and inside what it called, reached the probe's caller; panics with the offsets
/// (from `routine`) where the walk lost it.
pub fn assert_every_walk_reaches_the_caller(name: &str, routine: u64, steps: &[Step]) {
    let instructions = instructions_up_to_ret(routine);
    let stepped: Vec<u64> = steps.iter().map(|s| s.address).collect();
    let missed: Vec<u64> = instructions
        .iter()
        .filter(|a| !stepped.contains(a))
        .map(|a| a - routine)
        .collect();
    assert!(
        missed.is_empty(),
        "{name}: instructions never stepped, at offsets {missed:x?}"
    );
    let offset = |address: u64| {
        if instructions.contains(&address) {
            format!("{name}+{:#x}", address - routine)
        } else {
            format!("callee at {address:#x}")
        }
    };
    let lost: Vec<String> = steps
        .iter()
        .filter(|s| !s.reaches_caller)
        .map(|s| offset(s.address))
        .collect();
    assert!(
        lost.is_empty(),
        "{name}: a backtrace taken at these {} of {} steps does not reach the caller: {lost:?}",
        lost.len(),
        steps.len()
    );
}

/// The `SIGTRAP` handler: notes this step and its walk, or ends the stepping once the
/// routine has returned to the probe.
extern "C" fn on_step(_signal: c_int, _info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler.
    let context = unsafe { &mut *(context as *mut libc::ucontext_t) };
    let registers = &mut context.uc_mcontext.gregs;
    let address = registers[libc::REG_RIP as usize] as u64;
    if address == CALLER.load(Ordering::SeqCst) {
        registers[libc::REG_EFL as usize] &= !0x100;
        return;
    }
    let mut found = false;
    // SAFETY: walks this thread's own stack; `found` outlives the walk. The stepped code
    // is the probe's routine, which holds no lock the unwinder takes.
    unsafe { _Unwind_Backtrace(note_frame, &mut found as *mut bool as *mut c_void) };
    let step = STEPS.fetch_add(1, Ordering::SeqCst);
    if step < MAX_STEPS {
        STEP_ADDRESSES[step].store(address, Ordering::SeqCst);
        STEP_FOUND[step].store(found, Ordering::SeqCst);
    }
}

/// `_Unwind_Backtrace`'s callback: sets `found` when the frame is the probe's.
extern "C" fn note_frame(context: *mut c_void, found: *mut c_void) -> c_int {
    // SAFETY: the unwinder passes a live context; `found` is the handler's bool.
    unsafe {
        if _Unwind_GetIP(context) as u64 == CALLER.load(Ordering::SeqCst) {
            *(found as *mut bool) = true;
        }
    }
    0 // _URC_NO_REASON: go on walking.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    extern "C" fn add_one(value: u64) -> u64 {
        std::hint::black_box(value).wrapping_add(1)
    }

    /// The control: compiled code, whose unwind information the compiler wrote, passes.
    #[test]
    fn a_compiled_function_passes_the_probe() {
        let routine = add_one as *const () as u64;
        let steps = step_through(routine, [41, 0, 0, 0]);
        assert_eq!(steps.first().map(|s| s.address), Some(routine));
        // (Its debug build has branches, so not every instruction runs.)
        let lost: Vec<&Step> = steps.iter().filter(|s| !s.reaches_caller).collect();
        assert!(lost.is_empty(), "{lost:x?} of {}", steps.len());
    }
}
