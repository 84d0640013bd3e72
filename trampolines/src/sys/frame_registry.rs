//! The process's unwinder, as the copies of functions need it: finding a function's
//! FDE, and registering the `.eh_frame` of a copy.
//!
//! Both go through libgcc's unwinder (`libgcc_s`), which the agent links like every
//! Rust library and which C++ exceptions, Rust panics and thread cancellation use:
//! `_Unwind_Find_FDE` finds the FDE of any loaded code (and of registered sections),
//! `__register_frame` adds a section of CIEs and FDEs ended by a zero word.

use std::ffi::c_void;

/// libgcc's `struct dwarf_eh_bases`.
#[repr(C)]
struct DwarfEhBases {
    tbase: *mut c_void,
    dbase: *mut c_void,
    func: *mut c_void,
}

unsafe extern "C" {
    fn _Unwind_Find_FDE(pc: *mut c_void, bases: *mut DwarfEhBases) -> *const c_void;
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

/// The FDE of the code at `pc`, if the unwinder knows one.
pub fn find_fde(pc: u64) -> Option<FoundFde> {
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
    // distance back from that field to the CIE); the unwinder only hands out FDEs of
    // this form (a 64-bit DWARF length, 0xffffffff, is refused below).
    let (length, cie_pointer) = unsafe {
        (
            std::ptr::read_unaligned(fde as *const u32),
            std::ptr::read_unaligned((fde + 4) as *const u32),
        )
    };
    if length == u32::MAX {
        return None;
    }
    Some(FoundFde {
        fde,
        cie: (fde + 4).checked_sub(u64::from(cie_pointer))?,
        end: fde + 4 + u64::from(length),
        function: bases.func as u64,
    })
}

/// Registers `section` (CIEs and FDEs, ended by a zero word) with the unwinder, for
/// good: the unwinder keeps reading it, and copies are never freed, so neither is it.
pub fn register_eh_frame(section: Vec<u8>) {
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

#[cfg(all(test, not(miri)))]
mod tests {
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
        assert!(found.cie < found.fde);
        let (start, bytes) = found.section();
        assert_eq!(start, found.cie);
        assert_eq!(bytes.len() as u64, found.end - found.cie);
    }

    #[test]
    fn a_registered_section_is_found_by_the_unwinder() {
        use crate::code::copy_unwind::{OriginalUnwind, eh_frame_for_copy};
        use crate::code::function_copy::PlacedInstruction;
        // A libc function: C, so no exception tables.
        // SAFETY: dlsym with a NUL-terminated name in the global scope.
        let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()) } as u64;
        let found = find_fde(address).unwrap();
        let (start, bytes) = found.section();
        let original = OriginalUnwind::parse(bytes, start, found.fde).unwrap();
        // A pretend copy somewhere no code is: an address in a leaked buffer.
        let memory: &'static [u8] = Box::leak(vec![0u8; 256].into_boxed_slice());
        let copy = memory.as_ptr() as u64;
        let instructions: Vec<PlacedInstruction> = (0..original.end - original.start)
            .map(|offset| PlacedInstruction {
                copy: copy + offset,
                original: Some(original.start + offset),
                row_of: original.start + offset,
                extra_stack: 0,
            })
            .collect();
        let len = original.end - original.start;
        register_eh_frame(eh_frame_for_copy(&original, copy, len, &instructions).unwrap());
        let registered = find_fde(copy + len / 2).expect("the copy's FDE is registered");
        assert_eq!(registered.function, copy);
    }
}
