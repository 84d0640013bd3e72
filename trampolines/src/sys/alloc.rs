//! The agent's own memory allocator: everything the agent's Rust code allocates comes
//! from anonymous mappings, never from the target's `malloc`.
//!
//! The one idea: the agent runs inside a process whose allocator may be locked at any
//! moment by a thread the agent is waiting for — a thread stopped for a patch, or a
//! target thread blocked on the agent while it holds an arena lock (it was inside
//! `malloc` when it entered an instrumented function). Calling the target's `malloc`
//! from the agent could then wait forever. So the agent brings its own: small blocks
//! come from per-size-class free lists carved out of 1 MiB mappings, large ones are
//! mappings of their own. A size class is guarded by a spin lock that only agent code
//! takes; no agent code allocates while it keeps the target's threads parked, so no
//! holder of such a lock can be parked under a waiter.

use std::alloc::{GlobalAlloc, Layout};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

/// Block sizes of the classes: 16, 32, ..., 32 KiB.
const SMALLEST_CLASS_SHIFT: u32 = 4;
const CLASS_COUNT: usize = 12;
const LARGEST_CLASS: usize = 1 << (SMALLEST_CLASS_SHIFT as usize + CLASS_COUNT - 1);
/// Each class carves its blocks out of mappings of this size.
const CARVE_BYTES: usize = 1 << 20;
const PAGE: usize = 4096;

/// One size class: a free list of blocks and the unused tail of its current mapping.
struct SizeClass {
    locked: AtomicBool,
    state: std::cell::UnsafeCell<ClassState>,
}

struct ClassState {
    free: *mut FreeBlock,
    /// The next block to carve, derived from the mapping's pointer (so a block keeps
    /// the mapping's provenance), and the bytes left after it.
    carve_next: *mut u8,
    carve_left: usize,
}

struct FreeBlock {
    next: *mut FreeBlock,
}

// SAFETY: `state` is only touched while `locked` is held (see `SizeClass::with`).
unsafe impl Sync for SizeClass {}

impl SizeClass {
    const fn new() -> Self {
        SizeClass {
            locked: AtomicBool::new(false),
            state: std::cell::UnsafeCell::new(ClassState {
                free: null_mut(),
                carve_next: null_mut(),
                carve_left: 0,
            }),
        }
    }

    fn with<R>(&self, body: impl FnOnce(&mut ClassState) -> R) -> R {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the spin lock above gives this thread exclusive access to the state.
        let result = body(unsafe { &mut *self.state.get() });
        self.locked.store(false, Ordering::Release);
        result
    }
}

/// The allocator every agent allocation goes through (see the module comment).
pub struct AgentAllocator {
    classes: [SizeClass; CLASS_COUNT],
}

impl AgentAllocator {
    pub const fn new() -> Self {
        AgentAllocator {
            classes: [const { SizeClass::new() }; CLASS_COUNT],
        }
    }
}

impl Default for AgentAllocator {
    fn default() -> Self {
        Self::new()
    }
}

/// The class whose blocks fit `layout` (size and alignment), if a class does.
fn class_index(layout: Layout) -> Option<usize> {
    let needed = layout
        .size()
        .max(layout.align())
        .max(1 << SMALLEST_CLASS_SHIFT);
    if needed > LARGEST_CLASS || layout.align() > PAGE {
        return None;
    }
    let shift = needed.next_power_of_two().trailing_zeros();
    Some((shift - SMALLEST_CLASS_SHIFT) as usize)
}

/// Gives back a mapping made by [`map_anonymous`].
///
/// # Safety
/// `pointer..pointer + bytes` must be a whole mapping that nothing uses any more.
unsafe fn unmap(pointer: *mut u8, bytes: usize) {
    // SAFETY: the caller vouches for the mapping. (Miri runs no inline assembly.)
    #[cfg(miri)]
    unsafe {
        libc::munmap(pointer.cast(), bytes)
    };
    // SAFETY: as above; a raw system call, as libc's munmap may be code being patched.
    #[cfg(not(miri))]
    unsafe {
        crate::sys::syscall4(libc::SYS_munmap, pointer as u64, bytes as u64, 0, 0)
    };
}

fn map_anonymous(bytes: usize) -> *mut u8 {
    #[cfg(miri)]
    {
        // Miri runs no inline assembly; its mmap gives the block the mapping's
        // provenance.
        // SAFETY: an anonymous private mapping with no address hint has no
        // preconditions; the result is checked against MAP_FAILED.
        let mapped = unsafe {
            libc::mmap(
                null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            null_mut()
        } else {
            mapped.cast()
        }
    }
    #[cfg(not(miri))]
    {
        // SAFETY: an anonymous private mapping with no address hint has no
        // preconditions; the result is checked for an error. (A raw system call:
        // libc's mmap may be code being patched.)
        let mapped = unsafe {
            crate::sys::syscall6(
                libc::SYS_mmap,
                0,
                bytes as u64,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            )
        };
        if mapped < 0 {
            null_mut()
        } else {
            mapped as *mut u8
        }
    }
}

fn large_mapping_bytes(layout: Layout) -> usize {
    layout.size().max(1).div_ceil(PAGE) * PAGE
}

// SAFETY: blocks handed out are at least `layout.size()` bytes, aligned to
// `layout.align()` (class blocks are carved at multiples of their power-of-two size from
// page-aligned mappings; large blocks are page-aligned mappings), and a block is only
// reused after `dealloc` returned it.
unsafe impl GlobalAlloc for AgentAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(index) = class_index(layout) else {
            return map_anonymous(large_mapping_bytes(layout));
        };
        let block_size = 1usize << (index as u32 + SMALLEST_CLASS_SHIFT);
        self.classes[index].with(|class| {
            if !class.free.is_null() {
                let block = class.free;
                // SAFETY: blocks on the free list are unused blocks of this class, each
                // starting with a FreeBlock written by `dealloc`.
                class.free = unsafe { (*block).next };
                // The pointer `dealloc` got carries only its last owner's rights (over
                // the old layout); the block is handed out with the mapping's, which
                // `alloc` exposed when it mapped it.
                return std::ptr::with_exposed_provenance_mut(block.addr());
            }
            if block_size > class.carve_left {
                let fresh = map_anonymous(CARVE_BYTES);
                if fresh.is_null() {
                    return null_mut();
                }
                class.carve_next = fresh;
                class.carve_left = CARVE_BYTES;
                let _ = fresh.expose_provenance();
            }
            let block = class.carve_next;
            // SAFETY: at least `block_size` bytes of the mapping are left after `block`,
            // so the result is inside it or one past its end.
            class.carve_next = unsafe { block.add(block_size) };
            class.carve_left -= block_size;
            block
        })
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        let Some(index) = class_index(layout) else {
            // SAFETY: large blocks are whole mappings of exactly this length.
            unsafe { unmap(pointer, large_mapping_bytes(layout)) };
            return;
        };
        self.classes[index].with(|class| {
            let block = pointer.cast::<FreeBlock>();
            // SAFETY: the block belongs to this class, is no longer used by its owner,
            // and is at least 16 bytes and 16-aligned, enough for a FreeBlock.
            unsafe { (*block).next = class.free };
            class.free = block;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_fit_size_and_alignment() {
        let class = |size, align| class_index(Layout::from_size_align(size, align).unwrap());
        assert_eq!(class(1, 1), Some(0));
        assert_eq!(class(16, 8), Some(0));
        assert_eq!(class(17, 8), Some(1));
        assert_eq!(class(8, 64), Some(2));
        assert_eq!(class(LARGEST_CLASS, 8), Some(CLASS_COUNT - 1));
        assert_eq!(class(LARGEST_CLASS + 1, 8), None);
        assert_eq!(class(16, 8192), None);
    }

    #[test]
    fn blocks_are_aligned_distinct_and_reused() {
        let allocator = AgentAllocator::new();
        let layout = Layout::from_size_align(48, 64).unwrap();
        // SAFETY: the blocks are used only between their alloc and dealloc, with the
        // layout they were allocated with.
        unsafe {
            let a = allocator.alloc(layout);
            let b = allocator.alloc(layout);
            assert!(!a.is_null() && !b.is_null() && a != b);
            assert_eq!(a as usize % 64, 0);
            a.write_bytes(0xab, 48);
            allocator.dealloc(a, layout);
            assert_eq!(
                allocator.alloc(layout),
                a,
                "a freed block is handed out again"
            );
            let big = Layout::from_size_align(100_000, 8).unwrap();
            let large = allocator.alloc(big);
            large.write_bytes(1, 100_000);
            allocator.dealloc(large, big);
        }
    }
}
