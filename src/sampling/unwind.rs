//! Walking a sampled stack: framehop over each module's `.eh_frame`, and Go's own table
//! for Go code (`go_unwind`), from the registers and the stack bytes a sample carries.
//!
//! The one idea: the unwinder needs only what the kernel copied (the instruction, stack
//! and frame pointers, and the top of the stack) plus each mapped module's unwind
//! tables, read from its file through `/proc/PID/root` (the vDSO from the target's
//! memory). DWARF CFI describes every instruction, so code built without frame pointers
//! unwinds as well as code with them; framehop falls back to frame pointers only where a
//! module has no CFI. Go code has no CFI: each frame inside a module's `.gopclntab`
//! text is stepped with that table instead, frame by frame, so Go and C frames mix as
//! cgo stacks do. A frame outside every module's code (JIT code) steps with
//! [`jit_unwind`](super::jit_unwind): its first instructions, where the runtime's perf
//! map or jitdump says where it starts, else its frame pointer. A walk that cannot
//! reach the outermost frame (the copy ended, CFI missing, a corrupt stack, a Go stack
//! switch) is reported as truncated, never guessed.

use std::ops::{Deref, Range};
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, MayAllocateDuringUnwind, Module, Unwinder,
};
use goblin::elf::Elf;
use goblin::elf::program_header::PT_LOAD;
use memmap2::Mmap;

use super::go_unwind::{GoModule, GoStep};
use super::jit_unwind::JitUnwinder;
use super::records::UserRegs;
use crate::symbols::go_pclntab;
use crate::symbols::jit::JitSymbols;
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
    /// The modules with Go code, whose Go frames step with `.gopclntab`.
    go_modules: Vec<GoModule<SectionBytes>>,
    /// Frames outside every module's code (JIT code).
    jit: JitUnwinder,
    /// Code objects that could not be read (their frames end walks as truncated).
    pub skipped: Vec<(String, String)>,
    /// The frames of the last [`walk`](Self::walk), kept to save an allocation.
    scratch: Vec<WalkedFrame>,
}

impl StackUnwinder {
    /// Reads the unwind tables of every code object mapped into `pid` now.
    pub fn for_process(pid: i32) -> Result<StackUnwinder, SymbolError> {
        let mappings = maps::read_maps(pid)?;
        let objects = maps::code_objects(&mappings);
        let module_code = objects
            .iter()
            .flat_map(|o| o.mappings.iter())
            .filter(|m| m.executable)
            .map(|m| m.start..m.end)
            .collect();
        let mut unwinder = StackUnwinder {
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            go_modules: Vec::new(),
            jit: JitUnwinder::new(pid, module_code),
            skipped: Vec::new(),
            scratch: Vec::new(),
        };
        for object in objects {
            match module_for(pid, &object) {
                Ok((module, go)) => {
                    unwinder.unwinder.add_module(module);
                    unwinder.go_modules.extend(go);
                }
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
        let mut walked = std::mem::take(&mut self.scratch);
        let end = match self.walk_frames(regs, stack, None, &mut walked, |_| false) {
            WalkStop::End(end) => end,
            WalkStop::Stopped => WalkEnd::Truncated,
        };
        frames.clear();
        frames.extend(walked.iter().map(|frame| frame.address));
        self.scratch = walked;
        end
    }

    /// Walks like [`walk`](Self::walk), keeping with each frame the registers the
    /// unwinder had there and the stack bytes its steps read, and asking `stop` at each
    /// frame (before unwinding it) whether to go on: a walk that meets a frame already
    /// known stops there (`marks`). `jit`: where the process's JIT code starts (its
    /// frames step by frame pointer alone without it).
    pub fn walk_frames(
        &mut self,
        regs: UserRegs,
        stack: &[u8],
        jit: Option<&JitSymbols>,
        frames: &mut Vec<WalkedFrame>,
        mut stop: impl FnMut(&WalkedFrame) -> bool,
    ) -> WalkStop {
        frames.clear();
        let stack_start = regs.sp;
        // The lowest and highest stack address the current step reads (8 bytes each),
        // failed reads included: a walk that reused this frame must see the same bytes.
        let reads = std::cell::Cell::new((u64::MAX, 0u64));
        let mut read_stack = |address: u64| -> Result<u64, ()> {
            let (low, high) = reads.get();
            reads.set((low.min(address), high.max(address.saturating_add(8))));
            let offset = address.checked_sub(stack_start).ok_or(())? as usize;
            let bytes = stack
                .get(offset..offset.checked_add(8).ok_or(())?)
                .ok_or(())?;
            Ok(u64::from_ne_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut unwind_regs = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
        let mut address = FrameAddress::InstructionPointer(regs.ip);
        let end = loop {
            if frames.len() == MAX_FRAMES {
                break Some(WalkEnd::Truncated);
            }
            frames.push(WalkedFrame {
                address: lookup_address(address),
                sp: unwind_regs.sp(),
                bp: unwind_regs.bp(),
                reads_from: u64::MAX,
                reads_to: 0,
            });
            if stop(frames.last().expect("just pushed")) {
                break None;
            }
            reads.set((u64::MAX, 0));
            let lookup = lookup_address(address);
            let step = match self.go_modules.iter().find(|m| m.contains(lookup)) {
                Some(go) => match go.step(lookup, &mut unwind_regs, &mut read_stack) {
                    GoStep::Caller(return_address) => Ok(Some(return_address)),
                    GoStep::Outermost => Ok(None),
                    GoStep::Unknown => Err(()),
                },
                None if self.jit.covers(lookup) => self
                    .jit
                    .step(address, jit, &mut unwind_regs, &mut read_stack)
                    .map_err(|_| ()),
                None => self
                    .unwinder
                    .unwind_frame(address, &mut unwind_regs, &mut self.cache, &mut read_stack)
                    .map_err(|_| ()),
            };
            let frame = frames.last_mut().expect("just pushed");
            (frame.reads_from, frame.reads_to) = reads.get();
            match step {
                Ok(Some(return_address)) => match FrameAddress::from_return_address(return_address)
                {
                    Some(next) => address = next,
                    None => break Some(WalkEnd::Truncated),
                },
                Ok(None) => break Some(WalkEnd::Complete),
                Err(_) => break Some(WalkEnd::Truncated),
            }
        };
        // Each frame's range covers the reads of its own step and of every step after
        // it: all that its outer frames were computed from.
        let mut outer = (u64::MAX, 0u64);
        for frame in frames.iter_mut().rev() {
            outer = (outer.0.min(frame.reads_from), outer.1.max(frame.reads_to));
            (frame.reads_from, frame.reads_to) = outer;
        }
        match end {
            Some(end) => WalkStop::End(end),
            None => WalkStop::Stopped,
        }
    }
}

/// One frame of a walk, with what the unwinder knew there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkedFrame {
    /// The frame's lookup address (see [`StackUnwinder::walk`]).
    pub address: u64,
    /// The stack and frame pointers the unwinder had at this frame.
    pub sp: u64,
    pub bp: u64,
    /// The stack addresses `reads_from..reads_to` that the steps from this frame
    /// outward read (an empty range if none did): the outer frames depend only on
    /// these bytes and on the frame's address and registers.
    pub reads_from: u64,
    pub reads_to: u64,
}

/// Why [`StackUnwinder::walk_frames`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkStop {
    /// The walk ended by itself.
    End(WalkEnd),
    /// `stop` said so at the last frame pushed, which was not unwound (its read range
    /// is empty; the others' cover only the steps made).
    Stopped,
}

fn lookup_address(frame: FrameAddress) -> u64 {
    frame.address_for_lookup()
}

/// The framehop module of one mapped code object: its `.text`, `.eh_frame`,
/// `.eh_frame_hdr`, `.debug_frame` and `.got`, at the object's load bias; and its Go
/// table, if it has Go code.
fn module_for(
    pid: i32,
    object: &MappedObject,
) -> Result<(Module<SectionBytes>, Option<GoModule<SectionBytes>>), SymbolError> {
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
    let go = go_pclntab::from_elf(&elf, image.bytes().len(), |range| SectionBytes {
        image: image.clone(),
        range,
    })
    .and_then(Result::ok)
    .and_then(|table| GoModule::new(table, bias));
    let start = object.mappings.iter().map(|m| m.start).min().unwrap_or(0);
    let end = object.mappings.iter().map(|m| m.end).max().unwrap_or(0);
    let module = Module::new(
        object.path.display().to_string(),
        start..end,
        base_svma.wrapping_add(bias),
        info,
    );
    Ok((module, go))
}
