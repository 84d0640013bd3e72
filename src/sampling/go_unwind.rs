//! Unwinding Go frames with Go's own table (`.gopclntab`), one frame at a time.
//!
//! The one idea: Go code has no `.eh_frame`, and a frame-pointer walk skips the caller
//! of every frameless leaf (the leaf never saved a frame pointer, so the saved one read
//! is its caller's caller's). Go's runtime unwinds its stacks exactly from the table
//! every Go binary keeps: at `pc` a function's stack pointer is `pcsp(pc)` bytes below
//! its entry's, so the return address is the word at `sp + pcsp(pc)` and the caller's
//! stack pointer (the canonical frame address) is 8 above it. The walker asks this
//! module first for every frame (`unwind.rs`): a frame in a Go module's text steps here,
//! any other with framehop, so a cgo stack mixes both as it goes.
//!
//! The frame pointer is carried along for the frames that framehop may step after a
//! Go one: a Go function with a frame keeps its caller's frame pointer at `CFA - 16`
//! and points `bp` at that slot once its prologue has run; until then, and in a
//! frameless function, `bp` is still the caller's.
//!
//! A walk ends complete at an outermost function (`runtime.goexit`, `runtime.mstart`:
//! the table flags them) and truncated at one that switches stacks
//! (`runtime.systemstack`, `runtime.asmcgocall`: its SP offsets describe the stack it
//! left, and the stack it came from was not copied by the kernel).

use std::ops::{Deref, Range};

use framehop::x86_64::UnwindRegsX86_64;

use crate::symbols::go_pclntab::{FLAG_SP_WRITE, FLAG_TOP_FRAME, PcLineTable};

/// One Go module's table, at its load bias.
pub struct GoModule<D> {
    /// Go's text, at run time.
    text: Range<u64>,
    bias: u64,
    table: PcLineTable<D>,
}

/// What one Go step found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoStep {
    /// The caller's return address; the registers now hold the caller's sp and bp.
    Caller(u64),
    /// The outermost frame of its stack: the walk is complete.
    Outermost,
    /// The frame cannot be unwound (a stack switch, no table, an unreadable word).
    Unknown,
}

impl<D: Deref<Target = [u8]>> GoModule<D> {
    /// The module of `table` loaded at `bias`; `None` if the table lists no text.
    pub fn new(table: PcLineTable<D>, bias: u64) -> Option<GoModule<D>> {
        let text = table.text_range()?;
        Some(GoModule {
            text: text.start.wrapping_add(bias)..text.end.wrapping_add(bias),
            bias,
            table,
        })
    }

    /// Whether `address` (a run-time address) lies in Go's text.
    pub fn contains(&self, address: u64) -> bool {
        self.text.contains(&address)
    }

    /// Unwinds the frame whose lookup address is `address` (the pc of the innermost
    /// frame, a return address minus one for the others), updating `regs` to the
    /// caller's; `read` reads a stack word.
    pub fn step(
        &self,
        address: u64,
        regs: &mut UnwindRegsX86_64,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> GoStep {
        let pc = address.wrapping_sub(self.bias);
        let Some(function) = self.table.find(pc) else {
            return GoStep::Unknown;
        };
        let flags = self.table.flags(&function);
        if flags & FLAG_TOP_FRAME != 0 {
            return GoStep::Outermost;
        }
        if flags & FLAG_SP_WRITE != 0 {
            return GoStep::Unknown;
        }
        let Some(delta) = self
            .table
            .sp_delta(&function, pc)
            .and_then(|d| u64::try_from(d).ok())
        else {
            return GoStep::Unknown;
        };
        let sp = regs.sp();
        let Some(return_slot) = sp.checked_add(delta) else {
            return GoStep::Unknown;
        };
        let Ok(return_address) = read(return_slot) else {
            return GoStep::Unknown;
        };
        let cfa = return_slot + 8;
        let bp = regs.bp();
        let caller_bp = if bp == cfa.wrapping_sub(16) {
            match read(bp) {
                Ok(saved) => saved,
                Err(()) => return GoStep::Unknown,
            }
        } else {
            bp
        };
        if return_address == 0 {
            return GoStep::Outermost;
        }
        regs.set_sp(cfa);
        regs.set_bp(caller_bp);
        regs.set_ip(return_address);
        GoStep::Caller(return_address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of two functions at 0x1000 (text start): `leaf` (frameless, 0x40
    /// bytes) and `top` (0x18 bytes of frame from offset 6 to 0x3c, then 0).
    fn module() -> GoModule<Vec<u8>> {
        // Built by hand in the layout `go_pclntab`'s tests check: a Go 1.18 header,
        // names, pc-value tables, the function table, the records.
        let names = b"main.leaf\0main.top\0runtime.goexit\0";
        let leaf_sp: &[u8] = &[0x02, 0x40, 0x00]; // value 0 up to 0x40 (zig-zag: +1 is 2)
        // 0 up to 6, 0x18 up to 0x3c, 0 up to 0x40.
        let top_sp: &[u8] = &[0x02, 0x06, 0x30, 0x36, 0x2f, 0x04, 0x00];
        let exit_sp: &[u8] = &[0x02, 0x10, 0x00];
        let mut pc_tables = vec![0u8];
        let mut offsets = Vec::new();
        for table in [leaf_sp, top_sp, exit_sp] {
            offsets.push(pc_tables.len() as u32);
            pc_tables.extend_from_slice(table);
        }
        let names_at = 72u64;
        let pc_at = names_at + names.len() as u64;
        let table_at = pc_at + pc_tables.len() as u64;
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0xffff_fff0u32.to_le_bytes());
        bytes.extend_from_slice(&[0, 0, 1, 8]);
        for word in [3u64, 0, 0x1000, names_at, 0, 0, pc_at, table_at] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(names);
        bytes.extend(pc_tables);
        let entries = [(0u32, 0u32), (0x40, 10), (0x80, 19)];
        for (index, (entry, _)) in entries.iter().enumerate() {
            bytes.extend_from_slice(&entry.to_le_bytes());
            bytes.extend_from_slice(&(32 + 44 * index as u32).to_le_bytes());
        }
        bytes.extend_from_slice(&0x90u32.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        for (index, (entry, name)) in entries.iter().enumerate() {
            let mut record = [0u8; 44];
            record[..4].copy_from_slice(&entry.to_le_bytes());
            record[4..8].copy_from_slice(&name.to_le_bytes());
            record[16..20].copy_from_slice(&offsets[index].to_le_bytes());
            record[37] = if index == 2 { FLAG_TOP_FRAME } else { 0 };
            bytes.extend_from_slice(&record);
        }
        GoModule::new(PcLineTable::parse(bytes).unwrap(), 0x10_0000).unwrap()
    }

    #[test]
    fn a_frameless_leaf_returns_to_its_caller_and_the_caller_to_its_own() {
        let module = module();
        let base = 0x10_1000;
        // The stack: leaf's return address into top at sp; top's frame of 0x18 bytes
        // above it, its saved bp at the top of the frame, then top's return address.
        let sp = 0x7000u64;
        let words: [(u64, u64); 3] = [
            (sp, base + 0x4a),            // leaf returns into top
            (sp + 8 + 0x10, 0x7777),      // top's saved bp (its caller's)
            (sp + 8 + 0x18, base + 0x85), // top returns into goexit
        ];
        let mut read = |address: u64| {
            words
                .iter()
                .find(|(a, _)| *a == address)
                .map(|&(_, v)| v)
                .ok_or(())
        };
        // In leaf, bp is top's: it points at top's saved-bp slot.
        let mut regs = UnwindRegsX86_64::new(base + 0x10, sp, sp + 8 + 0x10);
        assert!(module.contains(base + 0x10));
        assert_eq!(
            module.step(base + 0x10, &mut regs, &mut read),
            GoStep::Caller(base + 0x4a)
        );
        assert_eq!((regs.sp(), regs.bp()), (sp + 8, sp + 8 + 0x10));
        // In top, after its prologue: bp is its own frame's, so the caller's is read.
        assert_eq!(
            module.step(base + 0x4a - 1, &mut regs, &mut read),
            GoStep::Caller(base + 0x85)
        );
        assert_eq!((regs.sp(), regs.bp()), (sp + 8 + 0x20, 0x7777));
        assert_eq!(
            module.step(base + 0x85 - 1, &mut regs, &mut read),
            GoStep::Outermost
        );
    }

    #[test]
    fn a_prologue_keeps_the_callers_frame_pointer_and_unknown_code_stops() {
        let module = module();
        let base = 0x10_1000;
        let sp = 0x7000u64;
        let mut read = |address: u64| {
            if address == sp {
                Ok(base + 0x85)
            } else {
                Err(())
            }
        };
        // At top's entry nothing is pushed yet: the return address is at sp.
        let mut regs = UnwindRegsX86_64::new(base + 0x40, sp, 0x5555);
        assert_eq!(
            module.step(base + 0x40, &mut regs, &mut read),
            GoStep::Caller(base + 0x85)
        );
        assert_eq!((regs.sp(), regs.bp()), (sp + 8, 0x5555));
        assert!(!module.contains(base + 0x90));
        let mut regs = UnwindRegsX86_64::new(0, sp, 0);
        assert_eq!(
            module.step(base + 0x90, &mut regs, &mut read),
            GoStep::Unknown
        );
        // A word that cannot be read stops the walk.
        let mut regs = UnwindRegsX86_64::new(0, sp + 8, 0);
        assert_eq!(
            module.step(base + 0x10, &mut regs, &mut read),
            GoStep::Unknown
        );
    }
}
