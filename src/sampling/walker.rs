//! From a sample to a named stack in the trees: unwind the copied stack, look each
//! frame up in tendril's symbol tables, add the path to the sampled trees.
//!
//! The one idea: this is all the controller does per sample, and it is what must keep
//! up with the kernel (benches/sampling.rs measures it against 64 threads × 1 kHz). A
//! walk that stops early is kept under a `[truncated stack]` root, never dropped, and a
//! frame outside every known module (a library loaded after sampling began) asks for
//! the tables to be read again, at most once every [`RELOAD_INTERVAL`] — the ELF
//! files only if the process's code objects changed. The names of JIT code (the
//! runtime's perf map and jitdumps, `symbols::jit`) are read again as they grow: every
//! [`JIT_REFRESH_INTERVAL`], or [`JIT_REFRESH_SOON`] after a frame in JIT code had no
//! name; when a name changed, every address is named anew from then on.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::marks::StackMarks;
use super::records::{Record, Sample, parse};
use super::tree::{SampledTrees, TRUNCATED, UNKNOWN};
use super::unwind::{MAX_FRAMES, StackUnwinder, WalkEnd, WalkStop, WalkedFrame};
use crate::symbols::jit::{JIT_MODULE, JitSymbols};
use crate::symbols::{ProcessSymbols, SymbolError};

/// The shortest time between two reloads of the symbol and unwind tables.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);
/// How often the JIT names are read again.
pub const JIT_REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// How soon they are read again after a frame of JIT code had no name.
pub const JIT_REFRESH_SOON: Duration = Duration::from_millis(100);

/// Walks and names samples, and keeps the trees and counts they build.
pub struct SampleWalker {
    pid: i32,
    symbols: ProcessSymbols,
    unwinder: StackUnwinder,
    /// The names of the process's JIT code, and their generation the trees' names of
    /// addresses were made with.
    jit: JitSymbols,
    jit_generation: u64,
    pub trees: SampledTrees,
    /// Each thread's previous deep walk, where the next one may stop (`marks`).
    pub marks: StackMarks,
    /// Whether walks stop at marks (on unless turned off, for comparison).
    marking: bool,
    frames: Vec<WalkedFrame>,
    /// The sample's functions, innermost first.
    functions: Vec<u32>,
    stack: Vec<u32>,
    /// What one CPU-clock sample stands for.
    pub period_ns: u64,
    /// Samples the kernel dropped (its `PERF_RECORD_LOST` counts).
    pub lost: u64,
    /// Samples whose walk stopped before the outermost frame.
    pub truncated: u64,
    /// Frames outside every known module since the tables were last read.
    unknown_frames: u64,
    /// Frames of JIT code without a name since the JIT names were last read.
    unnamed_jit_frames: u64,
    last_reload: Instant,
}

impl SampleWalker {
    pub fn new(
        pid: i32,
        symbols: ProcessSymbols,
        unwinder: StackUnwinder,
        period_ns: u64,
    ) -> SampleWalker {
        let jit = JitSymbols::for_process(pid);
        SampleWalker {
            pid,
            symbols,
            unwinder,
            jit_generation: jit.generation(),
            jit,
            trees: SampledTrees::default(),
            marks: StackMarks::default(),
            marking: true,
            frames: Vec::new(),
            functions: Vec::new(),
            stack: Vec::new(),
            period_ns,
            lost: 0,
            truncated: 0,
            unknown_frames: 0,
            unnamed_jit_frames: 0,
            last_reload: Instant::now(),
        }
    }

    /// A walker over the tables of `pid` as it is mapped now.
    pub fn for_process(pid: i32, period_ns: u64) -> Result<SampleWalker, SymbolError> {
        Ok(SampleWalker::new(
            pid,
            ProcessSymbols::load(pid)?,
            StackUnwinder::for_process(pid)?,
            period_ns,
        ))
    }

    /// Adds a raw CPU-clock sample record (as read from a ring) to the trees, weighing
    /// one period; returns whether it was a sample with a stack.
    pub fn add_record(&mut self, bytes: &[u8]) -> bool {
        let Record::Sample(sample) = parse(bytes) else {
            return false;
        };
        match self.stack_of(&sample) {
            Some(stack) => {
                self.trees.add(sample.tid, &stack, self.period_ns);
                true
            }
            None => false,
        }
    }

    /// The named stack of a sample, outermost frame first; None without user registers.
    /// A deep walk stops at a frame the thread's previous sample walked and takes its
    /// outer frames from there (`marks`).
    pub fn stack_of(&mut self, sample: &Sample) -> Option<Vec<u32>> {
        let regs = sample.regs?;
        let marks = match self.marking {
            true => self.marks.for_thread(sample.tid),
            false => None,
        };
        let mut mark = None;
        let stop = self.unwinder.walk_frames(
            regs,
            sample.stack,
            Some(&self.jit),
            &mut self.frames,
            |frame| {
                mark = marks
                    .as_ref()
                    .and_then(|marks| marks.find(regs.sp, sample.stack, frame));
                mark.is_some()
            },
        );
        // The marked frame itself is named by the previous walk.
        let walked = match stop {
            WalkStop::Stopped => self.frames.len() - 1,
            WalkStop::End(_) => self.frames.len(),
        };
        self.functions.clear();
        for frame in &self.frames[..walked] {
            let functions = &mut self.trees.functions;
            let function = functions.symbolize(&self.symbols, &self.jit, frame.address);
            match functions.name(function) {
                (UNKNOWN, _) => self.unknown_frames += 1,
                (_, JIT_MODULE) if functions.address(function).is_none() => {
                    self.unnamed_jit_frames += 1
                }
                _ => {}
            }
            self.functions.push(function);
        }
        let end = match (stop, mark) {
            (WalkStop::Stopped, Some(mark)) => {
                let room = MAX_FRAMES - walked;
                let end = match self.marks.reuse(sample.tid, mark, room) {
                    Some(reused) => {
                        self.functions.extend_from_slice(reused.functions);
                        reused.end
                    }
                    None => WalkEnd::Truncated,
                };
                self.marks.remember_after_mark(
                    sample.tid,
                    regs.sp,
                    sample.stack,
                    &self.frames[..walked],
                    &self.functions[..walked],
                    mark,
                );
                end
            }
            (stop, _) => {
                let end = match stop {
                    WalkStop::End(end) => end,
                    // (A stop is only ever asked for with a mark.)
                    WalkStop::Stopped => WalkEnd::Truncated,
                };
                if self.marking {
                    self.marks.remember(
                        sample.tid,
                        regs.sp,
                        sample.stack,
                        &self.frames,
                        &self.functions,
                        end,
                    );
                }
                end
            }
        };
        self.stack.clear();
        if end == WalkEnd::Truncated {
            self.truncated += 1;
            self.stack
                .push(self.trees.functions.intern(TRUNCATED, "", None));
        }
        self.stack.extend(self.functions.iter().rev());
        Some(self.stack.clone())
    }

    /// Turns stack marking on or off (it is on): the trees are the same either way,
    /// marking only saves walking and naming the outer frames of deep stacks again.
    pub fn set_marking(&mut self, marking: bool) {
        self.marking = marking;
        self.marks.clear();
    }

    /// The symbol tables in use (the modules a profile lists).
    pub fn symbols(&self) -> &ProcessSymbols {
        &self.symbols
    }

    /// The JIT names in use.
    pub fn jit(&self) -> &JitSymbols {
        &self.jit
    }

    /// What could not be read of the JIT names, and why (each said once).
    pub fn take_notes(&mut self) -> Vec<String> {
        self.jit.take_notes()
    }

    /// The files JIT names came from, with the bytes read of each.
    pub fn jit_sources(&self) -> Vec<(PathBuf, u64)> {
        self.jit.sources()
    }

    /// Reads the JIT names again when due, and the symbol and unwind tables if frames
    /// were found outside every known module and the last reload is old enough.
    pub fn reload_tables_if_needed(&mut self) {
        let soon = self.unnamed_jit_frames > 0 || self.unknown_frames > 0;
        let interval = if soon {
            JIT_REFRESH_SOON
        } else {
            JIT_REFRESH_INTERVAL
        };
        if self
            .jit
            .since_refresh()
            .is_none_or(|since| since >= interval)
        {
            self.unnamed_jit_frames = 0;
            if self.jit.refresh() {
                self.names_changed();
            }
        }
        if self.unknown_frames == 0 || self.last_reload.elapsed() < RELOAD_INTERVAL {
            return;
        }
        self.last_reload = Instant::now();
        self.unknown_frames = 0;
        // New anonymous code needs no new tables: the JIT refresh above saw it.
        let same_code = crate::symbols::maps::read_maps(self.pid)
            .is_ok_and(|mappings| self.symbols.same_code_objects(&mappings));
        if !same_code
            && let (Ok(symbols), Ok(unwinder)) = (
                ProcessSymbols::load(self.pid),
                StackUnwinder::for_process(self.pid),
            )
        {
            self.symbols = symbols;
            self.unwinder = unwinder;
        }
        self.names_changed();
    }

    /// Names every address anew from now on (what was named before stays as named).
    fn names_changed(&mut self) {
        self.jit_generation = self.jit.generation();
        self.trees.functions.forget_addresses();
        self.marks.clear();
    }
}
