//! PLT stubs (`name@plt`), found by decoding the stubs rather than by trusting layout.
//!
//! Every stub in `.plt`, `.plt.sec` and `.plt.got` contains one indirect
//! `jmp [rip+disp]` (possibly after `endbr64`, possibly `bnd jmp`) whose memory operand is
//! a GOT slot. The dynamic relocation that fills that slot (`JUMP_SLOT`, `GLOB_DAT`, or
//! `IRELATIVE` for calls to IFUNCs inside the module) names the target. The PLT0 header
//! jumps through a slot no relocation fills, so it is never taken for a stub; the lazy
//! binding halves of `.plt` in IBT layouts contain no such jump and are skipped too.

use std::collections::HashMap;

use goblin::elf::reloc::{R_X86_64_GLOB_DAT, R_X86_64_IRELATIVE, R_X86_64_JUMP_SLOT};
use goblin::elf::section_header::{SHT_DYNSYM, SHT_NOBITS, SHT_SYMTAB};
use goblin::elf::sym::{STB_GLOBAL, STT_GNU_IFUNC};
use goblin::elf::{Elf, Reloc, RelocSection, Symtab};
use goblin::strtab::Strtab;
use iced_x86::{Decoder, DecoderOptions, Mnemonic};

/// One stub, in the module's ELF virtual address space (before load bias).
#[derive(Debug, Clone)]
pub(super) struct RawStub {
    pub addr: u64,
    pub size: u64,
    pub got_slot: u64,
    /// The symbol the stub jumps to, without `@plt`.
    pub target: String,
}

/// The sections that hold PLT stubs on x86-64 (GNU ld, gold, lld).
const PLT_SECTIONS: [&str; 3] = [".plt", ".plt.sec", ".plt.got"];

/// Every PLT stub of the module whose GOT slot a relocation names.
///
/// Each PLT section is decoded linearly (it holds nothing but stubs). Every
/// `jmp [rip+disp]` starts a stub — or the `endbr64` right before it does — and the stub
/// runs to the start of the next one (or the end of the section), padding included.
/// Stub sizes are not taken from `sh_entsize`: static executables have 8-byte `.plt`
/// stubs with an entry size of 0.
pub(super) fn stubs(elf: &Elf, data: &[u8]) -> Vec<RawStub> {
    let slots = got_slot_names(elf);
    if slots.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for sh in &elf.section_headers {
        let name = elf.shdr_strtab.get_at(sh.sh_name).unwrap_or("");
        if !PLT_SECTIONS.contains(&name) || sh.sh_type == SHT_NOBITS {
            continue;
        }
        let Some(code) = usize::try_from(sh.sh_offset)
            .ok()
            .zip(usize::try_from(sh.sh_size).ok())
            .and_then(|(off, len)| data.get(off..off.checked_add(len)?))
        else {
            continue;
        };
        let jumps = indirect_jumps(code, sh.sh_addr);
        let section_end = sh.sh_addr + code.len() as u64;
        for (i, &(start, slot)) in jumps.iter().enumerate() {
            let end = jumps.get(i + 1).map_or(section_end, |&(next, _)| next);
            if let Some(target) = slots.get(&slot) {
                out.push(RawStub {
                    addr: start,
                    size: end - start,
                    got_slot: slot,
                    target: target.clone(),
                });
            }
        }
    }
    out
}

/// `(stub start, GOT slot)` of every `jmp [rip+disp]` in `code`, which starts at `addr`.
/// The stub starts at the jump, or at an `endbr64` immediately before it.
fn indirect_jumps(code: &[u8], addr: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut endbr_at: Option<u64> = None;
    for instr in Decoder::with_ip(64, code, addr, DecoderOptions::NONE) {
        if instr.mnemonic() == Mnemonic::Jmp && instr.is_ip_rel_memory_operand() {
            out.push((
                endbr_at.unwrap_or(instr.ip()),
                instr.ip_rel_memory_address(),
            ));
        }
        endbr_at = (instr.mnemonic() == Mnemonic::Endbr64).then_some(instr.ip());
    }
    out
}

/// `(start, end)` of the PLT sections, in ELF virtual addresses. Their FDEs describe
/// the PLT as a whole (PLT0 included), which is not a function.
pub(super) fn section_ranges(elf: &Elf) -> Vec<(u64, u64)> {
    elf.section_headers
        .iter()
        .filter(|sh| PLT_SECTIONS.contains(&elf.shdr_strtab.get_at(sh.sh_name).unwrap_or("")))
        .map(|sh| (sh.sh_addr, sh.sh_addr.saturating_add(sh.sh_size)))
        .collect()
}

/// GOT slot address → name of the function the slot will hold.
fn got_slot_names(elf: &Elf) -> HashMap<u64, String> {
    let mut names = SlotNames {
        elf,
        slots: HashMap::new(),
        ifuncs: None,
    };
    let dynamic = (&elf.dynsyms, &elf.dynstrtab);
    for relocs in [&elf.pltrelocs, &elf.dynrelas] {
        names.add(relocs, Some(dynamic));
    }
    // Static executables keep their IRELATIVE relocations only in section headers
    // (`.rela.plt`/`.rela.iplt`); dynamic ones list the same relocations again there.
    for (idx, relocs) in &elf.shdr_relocs {
        let link = elf.section_headers.get(*idx).map(|sh| sh.sh_link as usize);
        let table = match link
            .and_then(|l| elf.section_headers.get(l))
            .map(|sh| sh.sh_type)
        {
            Some(SHT_DYNSYM) => Some(dynamic),
            Some(SHT_SYMTAB) => Some((&elf.syms, &elf.strtab)),
            _ => None,
        };
        names.add(relocs, table);
    }
    names.slots
}

type SymTable<'e, 'a> = (&'e Symtab<'a>, &'e Strtab<'a>);

struct SlotNames<'e, 'a> {
    elf: &'e Elf<'a>,
    slots: HashMap<u64, String>,
    /// Resolver address → IFUNC name, built on the first `IRELATIVE`.
    ifuncs: Option<HashMap<u64, &'a str>>,
}

impl<'e, 'a> SlotNames<'e, 'a> {
    fn add(&mut self, relocs: &RelocSection, table: Option<SymTable<'e, 'a>>) {
        for r in relocs.iter() {
            if self.slots.contains_key(&r.r_offset) {
                continue;
            }
            let name = match r.r_type {
                R_X86_64_JUMP_SLOT | R_X86_64_GLOB_DAT => table.and_then(|t| symbol_name(t, &r)),
                R_X86_64_IRELATIVE => Some(self.ifunc_name(r.r_addend.unwrap_or(0) as u64)),
                _ => None,
            };
            if let Some(name) = name {
                self.slots.insert(r.r_offset, name);
            }
        }
    }

    /// The IFUNC symbol whose resolver sits at `resolver` (exported names first), or
    /// the name objdump gives such a stub: `*ABS*+0x<resolver>`.
    fn ifunc_name(&mut self, resolver: u64) -> String {
        let elf = self.elf;
        let ifuncs = self.ifuncs.get_or_insert_with(|| {
            // Of several aliases, keep the plainest: `memcpy` over `__new_memcpy`,
            // `strchr` (global) over `index` (weak).
            let rank = |name: &str, bind: u8| {
                let underscores = name.bytes().take_while(|&b| b == b'_').count();
                (underscores, bind != STB_GLOBAL, name.len())
            };
            let mut map: HashMap<u64, (&'a str, u8)> = HashMap::new();
            for (syms, strtab) in [(&elf.dynsyms, &elf.dynstrtab), (&elf.syms, &elf.strtab)] {
                for s in syms.iter() {
                    if s.st_type() != STT_GNU_IFUNC || s.st_shndx == 0 {
                        continue;
                    }
                    let Some(name) = strtab.get_at(s.st_name).filter(|n| !n.is_empty()) else {
                        continue;
                    };
                    let bind = s.st_bind();
                    match map.get(&s.st_value) {
                        Some(&(old, old_bind)) if rank(old, old_bind) <= rank(name, bind) => {}
                        _ => {
                            map.insert(s.st_value, (name, bind));
                        }
                    }
                }
            }
            map.into_iter()
                .map(|(addr, (name, _))| (addr, name))
                .collect()
        });
        match ifuncs.get(&resolver) {
            Some(name) => name.to_string(),
            None => format!("*ABS*+{resolver:#x}"),
        }
    }
}

fn symbol_name((syms, strtab): SymTable, r: &Reloc) -> Option<String> {
    let sym = syms.get(r.r_sym)?;
    let name = strtab.get_at(sym.st_name)?;
    (!name.is_empty()).then(|| name.to_string())
}
