//! The counters inside a function copied for `tendril edges`: one `inc` of the thread's
//! counter, found the way every hook finds its state.
//!
//! A counter is a function id of the per-thread counter tables (`thread_layout`), so the
//! runtime reads and resets edge counters exactly as it reads call counters, and
//! threads never contend for a cache line. The code runs in the middle of the target's
//! function, where every register may be live and a leaf function may keep data in
//! the 128 bytes below the stack pointer (the red zone):
//!
//! ```text
//! lea rsp,[rsp-128]        ; step over the red zone
//! push rcx
//! (push rax; lahf; seto al) only where the flags are live
//! mov rcx,fs:[slot]        ; the thread's state
//! test rcx,rcx / jz done   ; a thread moved into the copy mid-entry has none yet
//! test byte [rcx+flags],PASSTHROUGH / jnz done
//! inc qword [rcx+counter]
//! done: (add al,0x7f; sahf; pop rax)
//! pop rcx
//! lea rsp,[rsp+128]
//! ```

pub use super::inserted_code::Gate;
use super::inserted_code::{Sequence, fixed};
use super::path_register::PathRegister;
use super::pointer_checks::{SlowPath, check_code};
use crate::code::function_copy::{CounterCode, Inserted, Labels};
use crate::hooks::thread_layout as thread_state;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// Counters whose index `i` (in `function_copy::counter_sites` order) is the function
/// id `ids[i]` (none at all when `ids` is empty: a copy made for its pointer checks
/// only), the path register's code when paths are counted too, and the checks before
/// calls through pointers when the copy follows them.
pub struct EdgeCounters<'a> {
    pub ids: &'a [u32],
    pub paths: Option<PathRegister<'a>>,
    /// Which calls count (the path code has its own, the same).
    pub gate: Gate,
    /// A counter of the calls themselves, in the code each call runs first (a copy
    /// behind a recording hook, whose hook counts no calls).
    pub calls_id: Option<u32>,
    /// The checks before calls through pointers (a recorded function's copy).
    pub pointers: Option<PointerSites<'a>>,
}

/// The calls and tail jumps through pointers a copy checks (their original addresses,
/// sorted), and where their checks' slow path goes.
pub struct PointerSites<'a> {
    pub sites: &'a [u64],
    pub slow: SlowPath,
}

impl CounterCode for EdgeCounters<'_> {
    fn counter(&mut self, index: usize, flags_live: bool, labels: &mut Labels) -> Inserted {
        match self.ids.get(index) {
            Some(&id) => counter_code(id, flags_live, self.gate, labels),
            None => Inserted::default(),
        }
    }

    fn through_pointer(
        &mut self,
        site: u64,
        instruction: &Instruction,
        labels: &mut Labels,
    ) -> Inserted {
        let Some(pointers) = &self.pointers else {
            return Inserted::default();
        };
        match pointers.sites.binary_search(&site) {
            Ok(_) => check_code(site, instruction, pointers.slow, labels),
            Err(_) => Inserted::default(),
        }
    }

    fn entry(&mut self, labels: &mut Labels) -> Inserted {
        // A call starts with its flags dead (the ABI leaves them undefined).
        let mut code = match self.calls_id {
            Some(id) => counter_code(id, false, self.gate, labels),
            None => Inserted::default(),
        };
        if let Some(paths) = &self.paths {
            let path_entry = paths.entry(labels);
            code.instructions.extend(path_entry.instructions);
            code.extra_stack.extend(path_entry.extra_stack);
        }
        code
    }

    fn is_landing_pad(&self, block: usize) -> bool {
        self.paths
            .as_ref()
            .is_some_and(|paths| paths.landing_pads.iter().any(|&(pad, _)| pad == block))
    }

    fn landing_pad(
        &mut self,
        block: usize,
        flags_live: bool,
        row_of: u64,
        labels: &mut Labels,
    ) -> Inserted {
        match &self.paths {
            Some(paths) => paths.landing_pad(block, flags_live, row_of, labels),
            None => Inserted::default(),
        }
    }

    fn edge(
        &mut self,
        edge: usize,
        flags_live: bool,
        row_of: u64,
        labels: &mut Labels,
    ) -> Inserted {
        match &self.paths {
            Some(paths) => paths.edge(edge, flags_live, row_of, labels),
            None => Inserted::default(),
        }
    }
}

/// The code that adds one to the calling thread's counter `id`, for the calls `gate`
/// lets through.
pub fn counter_code(id: u32, flags_live: bool, gate: Gate, labels: &mut Labels) -> Inserted {
    let mut code = Sequence {
        gate,
        ..Sequence::default()
    };
    let mut depth = code.save(&[Register::RCX]);
    if flags_live {
        code.save_flags(&mut depth);
    }
    let done = labels.create();
    code.load_thread_state(depth, done);
    let counter = MemoryOperand::with_base_displ(
        Register::RCX,
        i64::from(thread_state::calls_displacement(id)),
    );
    code.push(fixed(Instruction::with1(Code::Inc_rm64, counter)), depth);
    code.restore(&[Register::RCX], flags_live, depth, done);
    code.inserted
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    fn disassemble(flags_live: bool) -> Vec<String> {
        let mut labels = Labels::new_for_tests();
        let inserted = counter_code(3, flags_live, Gate::EveryCall, &mut labels);
        crate::hooks::inserted_code::disassembled(&inserted, 0x7f00_0000_1000)
    }

    #[test]
    fn the_counter_steps_over_the_red_zone_and_increments_the_threads_counter() {
        for flags_live in [false, true] {
            let code = disassemble(flags_live);
            let text = code.join("\n");
            assert_eq!(code[0], "lea rsp,[rsp-80h]", "{text}");
            assert_eq!(code.last().unwrap(), "lea rsp,[rsp+80h]", "{text}");
            let slot = thread_state::slot_offset() as i64 as u64;
            let load = code.iter().find(|l| l.starts_with("mov rcx,fs:[")).unwrap();
            assert!(
                load.ends_with(&format!("{slot:X}h]")),
                "a 64-bit address: {text}"
            );
            let counter = thread_state::calls_displacement(3);
            assert!(
                text.contains(&format!("inc qword ptr [rcx+{counter:X}h]")),
                "{text}"
            );
            assert_eq!(text.contains("lahf"), flags_live, "{text}");
            assert_eq!(text.contains("sahf"), flags_live, "{text}");
        }
    }
}
