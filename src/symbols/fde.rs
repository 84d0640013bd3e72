//! Function ranges from `.eh_frame`: the symbol table of stripped code.
//!
//! Every function the compiler emits unwind information for has a Frame Description Entry
//! giving its start address and length, and `.eh_frame` is an allocated section, so it
//! survives `strip`. We enumerate the FDEs with gimli. When the section headers are gone
//! too, the `PT_GNU_EH_FRAME` header (`.eh_frame_hdr`) still points at the section.

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CieOrFde, CommonInformationEntry, EhFrame, EhFrameHdr, EndianSlice,
    LittleEndian, Pointer, UnwindSection,
};
use goblin::elf::Elf;
use goblin::elf::program_header::{PT_GNU_EH_FRAME, PT_LOAD};
use goblin::elf::section_header::SHT_NOBITS;

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// `(start, length)` of every FDE with a non-zero length, in ELF virtual addresses.
/// A malformed entry ends the walk; what was read before it is kept.
pub(super) fn ranges(elf: &Elf, data: &[u8]) -> Vec<(u64, u64)> {
    let Some((eh_addr, eh_bytes)) = eh_frame(elf, data) else {
        return Vec::new();
    };
    let mut bases = BaseAddresses::default().set_eh_frame(eh_addr);
    if let Some(text) = section(elf, data, ".text") {
        bases = bases.set_text(text.0);
    }
    if let Some(got) = section(elf, data, ".got") {
        bases = bases.set_got(got.0);
    }
    let mut eh = EhFrame::new(eh_bytes, LittleEndian);
    eh.set_address_size(8);

    let mut cies: HashMap<usize, CommonInformationEntry<Slice>> = HashMap::new();
    let mut out = Vec::new();
    let mut entries = eh.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|section, bases, offset| {
            if let Some(cie) = cies.get(&offset.0) {
                return Ok(cie.clone());
            }
            let cie = section.cie_from_offset(bases, offset)?;
            cies.insert(offset.0, cie.clone());
            Ok(cie)
        });
        if let Ok(fde) = fde
            && fde.len() > 0
        {
            out.push((fde.initial_address(), fde.len()));
        }
    }
    out
}

/// `.eh_frame` as (virtual address, bytes): from the section header, else through
/// `PT_GNU_EH_FRAME`, in which case the bytes run to the end of the containing segment
/// (the walk stops at the zero terminator).
pub(crate) fn eh_frame<'a>(elf: &Elf, data: &'a [u8]) -> Option<(u64, &'a [u8])> {
    if let Some(found) = section(elf, data, ".eh_frame") {
        return Some(found);
    }
    let hdr = elf
        .program_headers
        .iter()
        .find(|p| p.p_type == PT_GNU_EH_FRAME)?;
    let hdr_bytes = file_slice(data, hdr.p_offset, hdr.p_filesz)?;
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr.p_vaddr);
    let parsed = EhFrameHdr::new(hdr_bytes, LittleEndian)
        .parse(&bases, 8)
        .ok()?;
    let Pointer::Direct(addr) = parsed.eh_frame_ptr() else {
        return None;
    };
    let seg = elf
        .program_headers
        .iter()
        .find(|p| p.p_type == PT_LOAD && addr >= p.p_vaddr && addr < p.p_vaddr + p.p_filesz)?;
    let offset = seg.p_offset + (addr - seg.p_vaddr);
    let len = seg.p_filesz - (addr - seg.p_vaddr);
    Some((addr, file_slice(data, offset, len)?))
}

/// A section's virtual address and file bytes, by name.
pub(crate) fn section<'a>(elf: &Elf, data: &'a [u8], name: &str) -> Option<(u64, &'a [u8])> {
    let sh = elf
        .section_headers
        .iter()
        .find(|sh| sh.sh_type != SHT_NOBITS && elf.shdr_strtab.get_at(sh.sh_name) == Some(name))?;
    Some((sh.sh_addr, file_slice(data, sh.sh_offset, sh.sh_size)?))
}

fn file_slice(data: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    data.get(start..end)
}
