//! Walking a sampled stack: framehop over each module's `.eh_frame`, from the registers
//! and the stack bytes a sample carries.
//!
//! The one idea: the unwinder needs only what the kernel copied (the instruction, stack
//! and frame pointers, and the top of the stack) plus each mapped module's unwind
//! tables, read from its file through `/proc/PID/root` (the vDSO from the target's
//! memory). DWARF CFI describes every instruction, so code built without frame pointers
//! unwinds as well as code with them; framehop falls back to frame pointers only where a
//! module has no CFI. A walk that cannot reach the outermost frame (the copy ended, CFI
//! missing, a corrupt stack) is reported as truncated, never guessed.

use std::ops::{Deref, Range};
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, MayAllocateDuringUnwind, Module, Unwinder,
};
use goblin::elf::Elf;
use goblin::elf::program_header::PT_LOAD;
use memmap2::Mmap;

use super::records::UserRegs;
use crate::symbols::maps::{self, MappedObject, ObjectKind};
use crate::symbols::{SymbolError, load_bias};

/// Frames deeper than this are cut (the walk is reported truncated).
pub const MAX_FRAMES: usize = 1024;

/// The bytes of one module's file (mapped) or image (copied, for the vDSO).
enum Image {
    Mapped(Mmap),
    Copied(Vec<u8>),
}

impl Image {
    fn bytes(&self) -> &[u8] {
        match self {
            Image::Mapped(map) => map,
            Image::Copied(bytes) => bytes,
        }
    }
}

/// One section of a module's image, shared with the unwinder without copying.
#[derive(Clone)]
pub struct SectionBytes {
    image: Arc<Image>,
    range: Range<usize>,
}

impl Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.image.bytes()[self.range.clone()]
    }
}

/// How a walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkEnd {
    /// The unwinder reached the outermost frame.
    Complete,
    /// It stopped before: the stack copy ended, no unwind information, or a bad frame.
    Truncated,
}

/// An unwinder for the modules of one process.
pub struct StackUnwinder {
    unwinder: UnwinderX86_64<SectionBytes, MayAllocateDuringUnwind>,
    cache: CacheX86_64<MayAllocateDuringUnwind>,
    /// Code objects that could not be read (their frames end walks as truncated).
    pub skipped: Vec<(String, String)>,
}

impl StackUnwinder {
    /// Reads the unwind tables of every code object mapped into `pid` now.
    pub fn for_process(pid: i32) -> Result<StackUnwinder, SymbolError> {
        let mappings = maps::read_maps(pid)?;
        let mut unwinder = StackUnwinder {
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            skipped: Vec::new(),
        };
        for object in maps::code_objects(&mappings) {
            match module_for(pid, &object) {
                Ok(module) => unwinder.unwinder.add_module(module),
                Err(SymbolError::NoProcess { pid }) => return Err(SymbolError::NoProcess { pid }),
                Err(e) => unwinder
                    .skipped
                    .push((object.path.display().to_string(), e.to_string())),
            }
        }
        Ok(unwinder)
    }

    /// Walks the stack of one sample: `frames` gets the lookup address of each frame,
    /// innermost first (the instruction pointer, then each return address minus one,
    /// so that a call at a function's very end is looked up in that function).
    pub fn walk(&mut self, regs: UserRegs, stack: &[u8], frames: &mut Vec<u64>) -> WalkEnd {
        frames.clear();
        let stack_start = regs.sp;
        let mut read_stack = |address: u64| -> Result<u64, ()> {
            let offset = address.checked_sub(stack_start).ok_or(())? as usize;
            let bytes = stack
                .get(offset..offset.checked_add(8).ok_or(())?)
                .ok_or(())?;
            Ok(u64::from_ne_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut iter = self.unwinder.iter_frames(
            regs.ip,
            UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
            &mut self.cache,
            &mut read_stack,
        );
        loop {
            match iter.next() {
                Ok(Some(frame)) => {
                    if frames.len() == MAX_FRAMES {
                        return WalkEnd::Truncated;
                    }
                    frames.push(lookup_address(frame));
                }
                Ok(None) => return WalkEnd::Complete,
                Err(_) => return WalkEnd::Truncated,
            }
        }
    }
}

fn lookup_address(frame: FrameAddress) -> u64 {
    frame.address_for_lookup()
}

/// The framehop module of one mapped code object: its `.text`, `.eh_frame`,
/// `.eh_frame_hdr`, `.debug_frame` and `.got`, at the object's load bias.
fn module_for(pid: i32, object: &MappedObject) -> Result<Module<SectionBytes>, SymbolError> {
    let image = match object.kind {
        ObjectKind::Vdso => {
            let m = &object.mappings[0];
            Image::Copied(maps::read_memory(pid, m.start, m.end)?)
        }
        ObjectKind::File { .. } => {
            let file = maps::open_object(pid, object)?;
            // SAFETY: a read-only private mapping of a file; a file changed under it
            // (rare: loaded code is not rewritten in place) can give wrong frames, never
            // undefined behaviour in this process beyond reading stale bytes.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| SymbolError::io(&object.path, e))?;
            Image::Mapped(map)
        }
    };
    let image = Arc::new(image);
    let bad = |reason: String| SymbolError::BadElf {
        path: object.path.clone(),
        reason,
    };
    let elf = Elf::parse(image.bytes()).map_err(|e| bad(e.to_string()))?;
    let ranges: Vec<(u64, u64)> = object
        .mappings
        .iter()
        .map(|m| (m.start, m.offset))
        .collect();
    let bias = load_bias(&elf, &ranges)
        .ok_or_else(|| bad("no mapping corresponds to a PT_LOAD segment".into()))?;
    let base_svma = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .map(|p| p.p_vaddr & !0xfff)
        .min()
        .unwrap_or(0);
    let section = |name: &str| -> Option<(Range<u64>, SectionBytes)> {
        let header = elf
            .section_headers
            .iter()
            .find(|h| elf.shdr_strtab.get_at(h.sh_name) == Some(name))?;
        let svma = header.sh_addr..header.sh_addr + header.sh_size;
        let start = header.sh_offset as usize;
        let end = start.checked_add(header.sh_size as usize)?;
        if header.sh_type == goblin::elf::section_header::SHT_NOBITS || end > image.bytes().len() {
            return None;
        }
        Some((
            svma,
            SectionBytes {
                image: image.clone(),
                range: start..end,
            },
        ))
    };
    let (text_svma, text) = section(".text").unzip();
    let (eh_frame_svma, eh_frame) = section(".eh_frame").unzip();
    let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr").unzip();
    let (got_svma, _) = section(".got").unzip();
    let debug_frame = section(".debug_frame").map(|(_, bytes)| bytes);
    let info = ExplicitModuleSectionInfo {
        base_svma,
        text_svma,
        text,
        got_svma,
        eh_frame_svma,
        eh_frame,
        eh_frame_hdr_svma,
        eh_frame_hdr,
        debug_frame,
        stubs_svma: None,
        stub_helper_svma: None,
        unwind_info: None,
        text_segment_svma: None,
        text_segment: None,
    };
    let start = object.mappings.iter().map(|m| m.start).min().unwrap_or(0);
    let end = object.mappings.iter().map(|m| m.end).max().unwrap_or(0);
    Ok(Module::new(
        object.path.display().to_string(),
        start..end,
        base_svma.wrapping_add(bias),
        info,
    ))
}
