//! Stack marking (Whaley; Gnedt's incremental stack tracing) done from the outside: a
//! deep stack's walk stops at the first frame the same thread's previous sample
//! already walked, and takes that walk's outer frames, names and tree path from there.
//!
//! The one idea: tendril may not mark the target's frames (that would write to it), so
//! the mark is the controller's copy of the previous sample. A frame is the same frame
//! when its lookup address, stack pointer and frame pointer are equal and the stack
//! bytes its outer frames were unwound from are equal in both copies: the unwinder is a
//! function of exactly those, so what it found outward of that frame last time is what it
//! would find now. Only deep walks are kept ([`MARKED_DEPTH`] frames or more): for a
//! short stack, copying its bytes costs about what walking it again does.

use super::unwind::{MAX_FRAMES, WalkEnd, WalkedFrame};
use foldhash::HashMap;

/// The fewest frames for which a walk is kept for the thread's next sample.
pub const MARKED_DEPTH: usize = 32;

/// The previous deep walk of one thread.
struct PreviousWalk {
    /// Where its stack copy starts (the sample's stack pointer) and the copy.
    stack_start: u64,
    stack: Vec<u8>,
    /// Its frames, innermost first, with what the unwinder read from each outward.
    frames: Vec<WalkedFrame>,
    /// The function of each frame, innermost first.
    functions: Vec<u32>,
    end: WalkEnd,
}

/// Where a new walk met the previous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The frame's index in the previous walk (innermost first).
    pub previous_index: usize,
}

/// The outer frames a walk takes from the previous one at a mark.
pub struct Reused<'a> {
    /// Their functions, innermost first (the marked frame's first).
    pub functions: &'a [u32],
    pub end: WalkEnd,
}

/// Each thread's previous deep walk, and how much was saved.
#[derive(Default)]
pub struct StackMarks {
    threads: HashMap<u32, PreviousWalk>,
    /// Frames taken from a previous walk instead of being walked and named again.
    pub frames_reused: u64,
}

impl StackMarks {
    /// Thread `tid`'s previous walk, if one is kept, to look for marks in.
    pub fn for_thread(&self, tid: u32) -> Option<ThreadMarks<'_>> {
        self.threads
            .get(&tid)
            .map(|previous| ThreadMarks { previous })
    }

    /// Whether `frame`, met by a new walk of thread `tid` over `stack` (copied from
    /// `stack_start`), is a frame of the thread's previous walk with the same outer frames.
    pub fn find(
        &self,
        tid: u32,
        stack_start: u64,
        stack: &[u8],
        frame: &WalkedFrame,
    ) -> Option<Mark> {
        self.for_thread(tid)?.find(stack_start, stack, frame)
    }

    /// The outer frames of thread `tid`'s previous walk from `mark` on, at most `room`
    /// of them: a walk keeps [`MAX_FRAMES`] at most, so one that would be longer ends
    /// truncated there, as a full walk would.
    pub fn reuse(&mut self, tid: u32, mark: Mark, room: usize) -> Option<Reused<'_>> {
        let previous = self.threads.get(&tid)?;
        let outer = previous.functions.get(mark.previous_index..)?;
        let (functions, end) = match outer.len() > room {
            true => (&outer[..room], WalkEnd::Truncated),
            false => (outer, previous.end),
        };
        self.frames_reused += functions.len() as u64;
        Some(Reused { functions, end })
    }

    /// Keeps thread `tid`'s walk for its next sample if it is deep enough, and forgets
    /// an older one otherwise. `functions` are the frames' functions, innermost first.
    pub fn remember(
        &mut self,
        tid: u32,
        stack_start: u64,
        stack: &[u8],
        frames: &[WalkedFrame],
        functions: &[u32],
        end: WalkEnd,
    ) {
        if frames.len() < MARKED_DEPTH || frames.len() != functions.len() {
            if !self.threads.is_empty() {
                self.threads.remove(&tid);
            }
            return;
        }
        let previous = self.threads.entry(tid).or_insert_with(|| PreviousWalk {
            stack_start,
            stack: Vec::new(),
            frames: Vec::new(),
            functions: Vec::new(),
            end,
        });
        previous.stack_start = stack_start;
        previous.stack.clear();
        previous.stack.extend_from_slice(stack);
        previous.frames.clear();
        previous.frames.extend_from_slice(frames);
        previous.functions.clear();
        previous.functions.extend_from_slice(functions);
        previous.end = end;
    }

    /// Keeps thread `tid`'s walk that stopped at `mark` for its next sample: `inner`,
    /// the frames walked before the marked one (innermost first, the marked one not
    /// included) with their `inner_functions`, then the previous walk's frames from the
    /// mark on, over the new `stack` (which holds the same bytes where those were read).
    pub fn remember_after_mark(
        &mut self,
        tid: u32,
        stack_start: u64,
        stack: &[u8],
        inner: &[WalkedFrame],
        inner_functions: &[u32],
        mark: Mark,
    ) {
        let Some(previous) = self.threads.get_mut(&tid) else {
            return;
        };
        let at = mark.previous_index;
        if inner.len() + previous.frames.len() - at < MARKED_DEPTH
            || inner.len() != inner_functions.len()
        {
            self.threads.remove(&tid);
            return;
        }
        // The inner frames' outer frames now come from the mark's: so do their bytes.
        let (from, to) = (previous.frames[at].reads_from, previous.frames[at].reads_to);
        let mut frames: Vec<WalkedFrame> = inner
            .iter()
            .map(|frame| WalkedFrame {
                reads_from: frame.reads_from.min(from),
                reads_to: frame.reads_to.max(to),
                ..*frame
            })
            .collect();
        frames.extend_from_slice(&previous.frames[at..]);
        let mut functions = inner_functions.to_vec();
        functions.extend_from_slice(&previous.functions[at..]);
        // As long as a walk may be, like the samples' own stacks (see `reuse`).
        if frames.len() > MAX_FRAMES {
            frames.truncate(MAX_FRAMES);
            functions.truncate(MAX_FRAMES);
            previous.end = WalkEnd::Truncated;
        }
        previous.frames = frames;
        previous.functions = functions;
        previous.stack_start = stack_start;
        previous.stack.clear();
        previous.stack.extend_from_slice(stack);
    }

    /// Forgets every walk (the function table's addresses were read again).
    pub fn clear(&mut self) {
        self.threads.clear();
    }
}

/// One thread's previous walk, for a new walk of the thread to look for marks in.
pub struct ThreadMarks<'a> {
    previous: &'a PreviousWalk,
}

impl ThreadMarks<'_> {
    /// Whether `frame`, met by a new walk over `stack` (copied from `stack_start`), is a
    /// frame of the previous walk with the same outer frames.
    pub fn find(&self, stack_start: u64, stack: &[u8], frame: &WalkedFrame) -> Option<Mark> {
        let previous = self.previous;
        // Frames lie at rising stack pointers outward; look where this one would be.
        let from = previous.frames.partition_point(|f| f.sp < frame.sp);
        let previous_index = (from..previous.frames.len())
            .take_while(|&i| previous.frames[i].sp == frame.sp)
            .find(|&i| {
                let known = &previous.frames[i];
                known.address == frame.address && known.bp == frame.bp
            })?;
        let known = &previous.frames[previous_index];
        let same_bytes = match (
            bytes_at(
                previous.stack_start,
                &previous.stack,
                known.reads_from,
                known.reads_to,
            ),
            bytes_at(stack_start, stack, known.reads_from, known.reads_to),
        ) {
            (Some(before), Some(now)) => before == now,
            _ => false,
        };
        same_bytes.then_some(Mark { previous_index })
    }
}

/// The bytes of `from..to` in a stack copy starting at `start`: None unless the copy
/// holds all of them. An empty range (nothing was read) is always held.
fn bytes_at(start: u64, stack: &[u8], from: u64, to: u64) -> Option<&[u8]> {
    if from >= to {
        return Some(&[]);
    }
    let offset = from.checked_sub(start)? as usize;
    let len = (to - from) as usize;
    stack.get(offset..offset.checked_add(len)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(address: u64, sp: u64, reads: (u64, u64)) -> WalkedFrame {
        WalkedFrame {
            address,
            sp,
            bp: 0,
            reads_from: reads.0,
            reads_to: reads.1,
        }
    }

    /// A 40-frame walk over a 4 KiB stack copied from 0x1000: frame i at sp 0x1000+64i,
    /// its outer frames unwound from the bytes 0x1000+64i..0x2000.
    fn deep_walk() -> (Vec<u8>, Vec<WalkedFrame>, Vec<u32>) {
        let stack: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        let frames = (0..40u64)
            .map(|i| frame(0x40_0000 + i, 0x1000 + 64 * i, (0x1000 + 64 * i, 0x2000)))
            .collect();
        (stack, frames, (100..140).collect())
    }

    #[test]
    fn a_frame_with_the_same_registers_and_bytes_outward_takes_the_previous_outer_frames() {
        let (stack, frames, functions) = deep_walk();
        let mut marks = StackMarks::default();
        marks.remember(7, 0x1000, &stack, &frames, &functions, WalkEnd::Complete);
        // A new sample: the innermost frames differ, frame 10 is the same frame, and the
        // stack below it changed (it is not read from frame 10 outward).
        let mut now = stack.clone();
        now[..64 * 10].fill(0xee);
        let mark = marks.find(7, 0x1000, &now, &frames[10]).unwrap();
        assert_eq!(mark.previous_index, 10);
        let reused = marks.reuse(7, mark, MAX_FRAMES).unwrap();
        assert_eq!(reused.functions, &functions[10..]);
        assert_eq!(reused.end, WalkEnd::Complete);
        assert_eq!(marks.frames_reused, 30);
        // With room for 20 frames only, the walk ends truncated after them.
        let reused = marks.reuse(7, mark, 20).unwrap();
        assert_eq!(reused.functions, &functions[10..30]);
        assert_eq!(reused.end, WalkEnd::Truncated);
    }

    #[test]
    fn a_changed_byte_outward_another_register_or_another_thread_is_no_mark() {
        let (stack, frames, functions) = deep_walk();
        let mut marks = StackMarks::default();
        marks.remember(7, 0x1000, &stack, &frames, &functions, WalkEnd::Complete);
        let mut changed = stack.clone();
        changed[4000] ^= 1; // read from frame 10 outward
        assert_eq!(marks.find(7, 0x1000, &changed, &frames[10]), None);
        let mut moved = frames[10];
        moved.bp = 8;
        assert_eq!(marks.find(7, 0x1000, &stack, &moved), None);
        let mut elsewhere = frames[10];
        elsewhere.address += 1;
        assert_eq!(marks.find(7, 0x1000, &stack, &elsewhere), None);
        assert_eq!(marks.find(8, 0x1000, &stack, &frames[10]), None);
        // A copy that starts above bytes the previous walk read cannot vouch for them.
        assert_eq!(
            marks.find(7, 0x1000 + 64 * 11, &stack[64 * 11..], &frames[10]),
            None
        );
    }

    #[test]
    fn shallow_walks_are_not_kept() {
        let (stack, frames, functions) = deep_walk();
        let mut marks = StackMarks::default();
        marks.remember(7, 0x1000, &stack, &frames, &functions, WalkEnd::Complete);
        let shallow = &frames[..MARKED_DEPTH - 1];
        marks.remember(
            7,
            0x1000,
            &stack,
            shallow,
            &functions[..MARKED_DEPTH - 1],
            WalkEnd::Truncated,
        );
        assert_eq!(marks.find(7, 0x1000, &stack, &frames[0]), None);
    }
}
