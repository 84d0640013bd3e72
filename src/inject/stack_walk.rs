//! Walking a stopped thread's call stack from outside, with the `.eh_frame` unwind
//! tables of the modules it runs in.
//!
//! The one idea: the compiler's unwind information says, for every instruction, where
//! the caller's frame (the CFA) and the return address are, so a stopped thread's real
//! return addresses can be listed exactly — unlike a scan of raw stack words, which also
//! finds stale return addresses that earlier calls left in uninitialised locals. Where
//! the tables give out (a frame without CFI, a signal frame described by a DWARF
//! expression), the walk says so and the caller decides what to assume.

use crate::symbols::fde;
use crate::symbols::maps::{self, Mapping};
use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection,
};
use std::collections::HashMap;
use std::path::PathBuf;

/// Most frames walked; deeper stacks are cut off as incomplete.
const MAX_FRAMES: usize = 256;
/// DWARF register numbers of x86-64: rsp and the return-address column.
const RSP: u16 = 7;
const RETURN_ADDRESS: u16 = 16;
/// Registers 0..=16 (general purpose and the return address) are tracked.
const TRACKED: usize = 17;

/// The result of a walk: the return addresses found, innermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackWalk {
    pub return_addresses: Vec<u64>,
    /// `None` when the walk reached the outermost frame; otherwise the stack pointer of
    /// the first frame the tables could not describe (everything above it is unknown).
    pub stopped_at: Option<u64>,
}

/// The unwind tables of one mapped file, kept with the file's bytes (sections as
/// ranges of `data`, so the cache owns plain bytes).
struct ModuleCfi {
    data: Vec<u8>,
    bias: u64,
    eh_frame: (u64, std::ops::Range<usize>),
    eh_frame_hdr: Option<(u64, std::ops::Range<usize>)>,
    text: Option<u64>,
    got: Option<u64>,
}

/// Walks stacks of one process; caches each module's tables across walks.
pub struct StackWalker<'a> {
    pid: i32,
    maps: &'a [Mapping],
    modules: HashMap<PathBuf, Option<ModuleCfi>>,
}

impl<'a> StackWalker<'a> {
    pub fn new(pid: i32, maps: &'a [Mapping]) -> Self {
        StackWalker {
            pid,
            maps,
            modules: HashMap::new(),
        }
    }

    /// Walks from the given registers; `read_word` reads 8 bytes of the target's memory.
    pub fn walk(
        &mut self,
        regs: &libc::user_regs_struct,
        mut read_word: impl FnMut(u64) -> Option<u64>,
    ) -> StackWalk {
        let mut values: [Option<u64>; TRACKED] = [
            Some(regs.rax),
            Some(regs.rdx),
            Some(regs.rcx),
            Some(regs.rbx),
            Some(regs.rsi),
            Some(regs.rdi),
            Some(regs.rbp),
            Some(regs.rsp),
            Some(regs.r8),
            Some(regs.r9),
            Some(regs.r10),
            Some(regs.r11),
            Some(regs.r12),
            Some(regs.r13),
            Some(regs.r14),
            Some(regs.r15),
            Some(regs.rip),
        ];
        let mut return_addresses = Vec::new();
        let mut context = Box::new(UnwindContext::new());
        for depth in 0..MAX_FRAMES {
            let pc = values[RETURN_ADDRESS as usize].unwrap_or(0);
            let sp = values[RSP as usize].unwrap_or(0);
            // A return address points after its call: look up the call itself.
            let lookup = if depth == 0 { pc } else { pc.wrapping_sub(1) };
            match self.unwind_step(lookup, &mut values, &mut context, &mut read_word) {
                Some(true) => {}
                Some(false) => {
                    return StackWalk {
                        return_addresses,
                        stopped_at: None,
                    };
                }
                None => {
                    return StackWalk {
                        return_addresses,
                        stopped_at: Some(sp),
                    };
                }
            }
            match values[RETURN_ADDRESS as usize] {
                Some(0) | None => {
                    return StackWalk {
                        return_addresses,
                        stopped_at: None,
                    };
                }
                Some(address) => return_addresses.push(address),
            }
        }
        let sp = values[RSP as usize].unwrap_or(0);
        StackWalk {
            return_addresses,
            stopped_at: Some(sp),
        }
    }

    /// Replaces `values` (this frame's registers) with the caller's. `Some(true)`: done,
    /// `Some(false)`: this is the outermost frame, `None`: no usable unwind information.
    fn unwind_step(
        &mut self,
        pc: u64,
        values: &mut [Option<u64>; TRACKED],
        context: &mut UnwindContext<usize>,
        read_word: &mut impl FnMut(u64) -> Option<u64>,
    ) -> Option<bool> {
        let module = self.module_for(pc)?;
        let eh_frame_bytes = &module.data[module.eh_frame.1.clone()];
        let mut eh_frame = EhFrame::new(eh_frame_bytes, LittleEndian);
        eh_frame.set_address_size(8);
        let mut bases = BaseAddresses::default().set_eh_frame(module.eh_frame.0);
        if let Some(text) = module.text {
            bases = bases.set_text(text);
        }
        if let Some(got) = module.got {
            bases = bases.set_got(got);
        }
        let address = pc.wrapping_sub(module.bias);
        let row = match &module.eh_frame_hdr {
            Some((hdr_address, range)) => {
                let bases = bases.clone().set_eh_frame_hdr(*hdr_address);
                let hdr = EhFrameHdr::new(&module.data[range.clone()], LittleEndian)
                    .parse(&bases, 8)
                    .ok()?;
                match hdr.table() {
                    Some(table) => table
                        .unwind_info_for_address(
                            &eh_frame,
                            &bases,
                            context,
                            address,
                            EhFrame::cie_from_offset,
                        )
                        .ok()?,
                    None => eh_frame
                        .unwind_info_for_address(&bases, context, address, EhFrame::cie_from_offset)
                        .ok()?,
                }
            }
            None => eh_frame
                .unwind_info_for_address(&bases, context, address, EhFrame::cie_from_offset)
                .ok()?,
        };
        let cfa = match *row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => values
                .get(register.0 as usize)
                .copied()??
                .wrapping_add_signed(offset),
            CfaRule::Expression(_) => return None,
        };
        let mut caller = *values;
        for register in 0..TRACKED as u16 {
            let rule = row.register(gimli::Register(register));
            caller[register as usize] = match rule {
                Some(RegisterRule::Undefined) => None,
                Some(RegisterRule::SameValue) => values[register as usize],
                Some(RegisterRule::Offset(offset)) => {
                    Some(read_word(cfa.wrapping_add_signed(offset))?)
                }
                Some(RegisterRule::ValOffset(offset)) => Some(cfa.wrapping_add_signed(offset)),
                Some(RegisterRule::Register(other)) => {
                    values.get(other.0 as usize).copied().flatten()
                }
                Some(RegisterRule::Constant(value)) => Some(value),
                Some(_) => return None,
                // No rule: callee-saved registers keep their value; rsp is the CFA.
                None if register == RSP => Some(cfa),
                None if register == RETURN_ADDRESS => return Some(false),
                None => values[register as usize],
            };
        }
        if caller[RSP as usize].is_none() {
            caller[RSP as usize] = Some(cfa);
        }
        *values = caller;
        Some(true)
    }

    /// The unwind tables of the file mapped at `pc`, loaded on first use.
    fn module_for(&mut self, pc: u64) -> Option<&ModuleCfi> {
        let mapping = self
            .maps
            .iter()
            .find(|m| m.executable && m.start <= pc && pc < m.end)?;
        let path = mapping.file()?.to_path_buf();
        if !self.modules.contains_key(&path) {
            let loaded = load_module_cfi(self.pid, self.maps, &path);
            self.modules.insert(path.clone(), loaded);
        }
        self.modules.get(&path)?.as_ref()
    }
}

/// Reads a mapped file and finds its `.eh_frame` (and `.eh_frame_hdr`) and load bias.
fn load_module_cfi(pid: i32, all_maps: &[Mapping], path: &std::path::Path) -> Option<ModuleCfi> {
    let object = maps::code_objects(all_maps)
        .into_iter()
        .find(|o| o.path == path)?;
    let mut file = maps::open_object(pid, &object).ok()?;
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut data).ok()?;
    let elf = goblin::elf::Elf::parse(&data).ok()?;
    let pairs: Vec<(u64, u64)> = object
        .mappings
        .iter()
        .map(|m| (m.start, m.offset))
        .collect();
    let bias = crate::symbols::load_bias(&elf, &pairs)?;
    let range_of = |slice: &[u8]| {
        let start = slice.as_ptr() as usize - data.as_ptr() as usize;
        start..start + slice.len()
    };
    let (eh_address, eh_bytes) = fde::eh_frame(&elf, &data)?;
    let eh_frame = (eh_address, range_of(eh_bytes));
    let eh_frame_hdr = fde::section(&elf, &data, ".eh_frame_hdr")
        .map(|(address, bytes)| (address, range_of(bytes)));
    let text = fde::section(&elf, &data, ".text").map(|(address, _)| address);
    let got = fde::section(&elf, &data, ".got").map(|(address, _)| address);
    Some(ModuleCfi {
        data,
        bias,
        eh_frame,
        eh_frame_hdr,
        text,
        got,
    })
}
