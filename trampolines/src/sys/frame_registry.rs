//! The process's unwinder, as the copies of functions need it: finding a function's
//! FDE, and registering the `.eh_frame` of a copy.
//!
//! Registration goes through libgcc's unwinder (`libgcc_s`), which the agent links like
//! every Rust library and which C++ exceptions, Rust panics and thread cancellation
//! use: `__register_frame` adds a section of CIEs and FDEs ended by a zero word. It
//! takes the unwinder's lock, so it runs on a thread of its own (`frame_registrar`).
//! The FDE of a library's function is found here, from the library's `.eh_frame_hdr`
//! (read with gimli), and not with libgcc's `_Unwind_Find_FDE`, which takes that same
//! lock: the patcher looks with the loader held, and a target thread that holds the
//! unwinder's lock (unwinding through a registered copy) can call a hooked function
//! that waits for the loader (its first call, discovered), which would wait forever.

use crate::sys::loaded_modules;
use gimli::{BaseAddresses, EhFrame, EhFrameHdr, LittleEndian, UnwindSection};
use std::ffi::c_void;

unsafe extern "C" {
    fn __register_frame(begin: *const c_void);
}

/// Where the FDE of a function lies in memory, with its CIE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoundFde {
    /// The FDE's first byte (its length field).
    pub fde: u64,
    /// The CIE it points at.
    pub cie: u64,
    /// Just past the FDE.
    pub end: u64,
    /// The start of the code it describes.
    pub function: u64,
}

impl FoundFde {
    /// The bytes from the lower of the CIE and the FDE to the end of the FDE: a piece
    /// of the `.eh_frame` section holding both. They stay mapped as long as the module
    /// that holds them, which outlives any use the caller makes of them at once.
    pub fn section(&self) -> (u64, &'static [u8]) {
        let start = self.cie.min(self.fde);
        // SAFETY: `_Unwind_Find_FDE` returned an FDE of a loaded module (or of a
        // registered section, which is never freed); its CIE lies in the same section;
        // both are readable memory for as long as the module stays loaded.
        let bytes =
            unsafe { std::slice::from_raw_parts(start as *const u8, (self.end - start) as usize) };
        (start, bytes)
    }
}

/// The FDE of the library function at `pc`, from its library's `.eh_frame_hdr`: the
/// FDE libgcc's unwinder would find for it (sections registered here are not searched:
/// no copy is copied again). Takes no lock but the loader's (see the module comment).
///
/// The text and data bases are not needed: on x86-64 compilers encode FDE pointers
/// `pcrel` or absolute. The end of the code the FDE covers is encoded in it: its parser
/// (`code::copy_unwind`) reads it.
pub fn find_fde(pc: u64) -> Option<FoundFde> {
    let index = loaded_modules::unwind_index_of(pc)?;
    let (hdr_at, hdr_len) = index.eh_frame_hdr;
    // SAFETY: the library's PT_GNU_EH_FRAME segment, mapped and readable for as long as
    // the library is loaded, which outlasts this lookup (the caller holds the loader,
    // or looks at code it runs).
    let hdr = unsafe { std::slice::from_raw_parts(hdr_at as *const u8, hdr_len as usize) };
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_at);
    let parsed = EhFrameHdr::new(hdr, LittleEndian).parse(&bases, 8).ok()?;
    let frame_at = parsed.eh_frame_ptr().direct().ok()?;
    let &(_, segment_end) = (index.segments.iter()).find(|&&(s, e)| (s..e).contains(&frame_at))?;
    // SAFETY: from the `.eh_frame` to the end of the loaded segment holding it: bytes of
    // the library's file, mapped as long as the library is (as above).
    let frame = unsafe {
        std::slice::from_raw_parts(frame_at as *const u8, (segment_end - frame_at) as usize)
    };
    let bases = bases.set_eh_frame(frame_at);
    let fde = (parsed.table()?)
        .fde_for_address(
            &EhFrame::new(frame, LittleEndian),
            &bases,
            pc,
            EhFrame::cie_from_offset,
        )
        .ok()?;
    let fde_at = frame_at + fde.offset() as u64;
    // A 64-bit DWARF length (0xffffffff, then 8 bytes) is not what `FoundFde` describes.
    if frame.get(fde.offset()..fde.offset() + 4) == Some(&[0xff; 4]) {
        return None;
    }
    Some(FoundFde {
        fde: fde_at,
        cie: frame_at + fde.cie().offset() as u64,
        end: fde_at + 4 + fde.entry_len() as u64,
        function: fde.initial_address(),
    })
}

/// Registers `section` (CIEs and FDEs, ended by a zero word: libgcc's `__register_frame`
/// on x86-64 Linux takes a whole section, not one FDE) with the unwinder, for good.
///
/// The section is copied to 4-byte-aligned memory that is never freed: libgcc keeps a
/// pointer to it and reads it on later lookups (its own, and every search that walks
/// the registered sections), and the code it describes, a copy, is never freed either,
/// so there is nothing to deregister (deregistering would also race with an unwind in
/// progress). libgcc allocates and takes its lock here, which a target thread may hold
/// while it waits for the loader: only the registrar thread (`frame_registrar`) calls
/// this, never a thread holding the loader, a signal handler, or with threads stopped.
pub fn register_on_this_thread(section: Vec<u8>) {
    // 4-byte alignment for the unwinder's reads of 32-bit fields.
    let words: Vec<u32> = section
        .chunks(4)
        .map(|chunk| {
            let mut word = [0u8; 4];
            word[..chunk.len()].copy_from_slice(chunk);
            u32::from_le_bytes(word)
        })
        .collect();
    let section: &'static [u32] = Box::leak(words.into_boxed_slice());
    // SAFETY: the section is well formed (written by gimli, ended by a zero word) and
    // lives forever, as `__register_frame` requires.
    unsafe { __register_frame(section.as_ptr().cast()) };
}

/// libgcc's `struct dwarf_eh_bases`.
#[cfg(test)]
#[repr(C)]
struct DwarfEhBases {
    tbase: *mut c_void,
    dbase: *mut c_void,
    func: *mut c_void,
}

#[cfg(test)]
unsafe extern "C" {
    fn _Unwind_Find_FDE(pc: *mut c_void, bases: *mut DwarfEhBases) -> *const c_void;
}

/// The FDE libgcc's unwinder itself finds for `pc` (in registered sections too), for
/// tests: a registered section is found as an exception would find it.
#[cfg(test)]
pub fn unwinder_finds(pc: u64) -> Option<FoundFde> {
    let mut bases = DwarfEhBases {
        tbase: std::ptr::null_mut(),
        dbase: std::ptr::null_mut(),
        func: std::ptr::null_mut(),
    };
    // SAFETY: `_Unwind_Find_FDE` only reads the unwinder's tables and writes `bases`.
    let fde = unsafe { _Unwind_Find_FDE(pc as *mut c_void, &mut bases) } as u64;
    if fde == 0 {
        return None;
    }
    // SAFETY: an FDE starts with a 32-bit length then a 32-bit CIE pointer (the
    // distance back from that field to the CIE).
    let (length, cie_pointer) = unsafe {
        (
            std::ptr::read_unaligned(fde as *const u32),
            std::ptr::read_unaligned((fde + 4) as *const u32),
        )
    };
    Some(FoundFde {
        fde,
        cie: (fde + 4).checked_sub(u64::from(cie_pointer))?,
        end: fde + 4 + u64::from(length),
        function: bases.func as u64,
    })
}

/// What the tests of registration share: memory for code that never runs, and a
/// section describing it.
#[cfg(all(test, not(miri)))]
pub mod tests_support {
    use gimli::write::{
        Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec,
        FrameDescriptionEntry, FrameTable,
    };
    use gimli::{Encoding, Format, LittleEndian, Register};

    /// A page of its own, never unmapped (the unwinder keeps what is registered for it).
    pub fn leaked_page() -> u64 {
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        page as u64
    }

    /// A section with one CIE and one FDE, for `len` bytes at `start`: a leaf function.
    pub fn leaf_function_section(start: u64, len: u32) -> Vec<u8> {
        let encoding = Encoding {
            format: Format::Dwarf32,
            version: 1,
            address_size: 8,
        };
        let mut cie = CommonInformationEntry::new(encoding, 1, -8, Register(16));
        cie.add_instruction(CallFrameInstruction::Cfa(Register(7), 8));
        cie.add_instruction(CallFrameInstruction::Offset(Register(16), -8));
        let mut table = FrameTable::default();
        let cie = table.add_cie(cie);
        table.add_fde(
            cie,
            FrameDescriptionEntry::new(Address::Constant(start), len),
        );
        let mut section = EhFrame(EndianVec::new(LittleEndian));
        table.write_eh_frame(&mut section).unwrap();
        let mut bytes = section.0.into_vec();
        bytes.extend_from_slice(&[0; 4]);
        bytes
    }
}

// Real calls into the process's unwinder, which Miri cannot make.
#[cfg(all(test, not(miri)))]
mod tests {
    use super::tests_support::{leaf_function_section, leaked_page};
    use super::*;

    #[inline(never)]
    extern "C" fn some_function(x: u64) -> u64 {
        std::hint::black_box(x) * 3 + 1
    }

    #[test]
    fn the_fde_of_a_function_of_this_process_is_found_with_its_cie() {
        let address = some_function as *const () as u64;
        assert_eq!(some_function(1), 4);
        let found = find_fde(address + 1).expect("Rust code has unwind information");
        assert_eq!(found.function, address);
        assert!(found.cie < found.fde && found.fde < found.end);
        let (start, bytes) = found.section();
        assert_eq!(start, found.cie);
        assert_eq!(bytes.len() as u64, found.end - found.cie);
        // The CIE's id, zero, and the FDE's pointer back to it.
        assert_eq!(bytes[4..8], [0; 4]);
        let fde = (found.fde - start) as usize;
        let cie_pointer = u32::from_le_bytes(bytes[fde + 4..fde + 8].try_into().unwrap());
        assert_eq!(u64::from(cie_pointer), found.fde + 4 - found.cie);
    }

    #[test]
    fn the_fde_found_from_the_libraries_index_is_the_one_the_unwinder_finds() {
        let functions = [
            some_function as *const () as u64,
            libc::getpid as *const () as u64,
            libc::qsort as *const () as u64,
            find_fde as *const () as u64,
        ];
        for function in functions {
            for pc in [function, function + 1, function + 3] {
                assert_eq!(find_fde(pc), unwinder_finds(pc), "{pc:#x}");
                assert!(find_fde(pc).is_some(), "{pc:#x}");
            }
        }
        // Outside every library: neither finds one.
        assert_eq!(find_fde(16), None);
        assert_eq!(unwinder_finds(16), None);
    }

    #[test]
    fn a_registered_section_is_found_by_the_unwinder_over_exactly_its_range() {
        let start = leaked_page();
        let len = 100;
        assert!(unwinder_finds(start + 10).is_none(), "no code there yet");
        let section = leaf_function_section(start, len as u32);
        register_on_this_thread(section.clone());
        for pc in start..start + len {
            let found = unwinder_finds(pc).expect("the registered FDE");
            assert_eq!(found.function, start);
            // The unwinder hands out the registered copy, which reads as written.
            let (at, bytes) = found.section();
            assert_ne!(at, section.as_ptr() as u64);
            assert_eq!(bytes, &section[..(found.end - at) as usize]);
        }
        assert!(unwinder_finds(start - 1).is_none());
        assert!(unwinder_finds(start + len).is_none());
    }

    #[test]
    fn sections_registered_one_after_another_are_each_found() {
        let starts: Vec<u64> = (0..4).map(|_| leaked_page()).collect();
        for &start in &starts {
            register_on_this_thread(leaf_function_section(start, 16));
        }
        for &start in &starts {
            assert_eq!(
                unwinder_finds(start + 15).map(|found| found.function),
                Some(start)
            );
        }
    }
}
