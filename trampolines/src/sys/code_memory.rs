//! Executable memory for trampolines, and writing code without ever making a page
//! writable and executable at once.
//!
//! A `jmp rel32` reaches ±2 GiB, so every trampoline must lie within that distance of the
//! function it serves. [`CodeArena::allocate_near`] finds free address space near a
//! function (from `/proc/self/maps`), maps it read+execute, and hands out pieces of it.
//!
//! Why not the `region` crate: its `alloc_at` maps with `MAP_FIXED`, which silently
//! replaces whatever another thread of the target mapped there since the gap was read;
//! a chunk must be mapped with `MAP_FIXED_NOREPLACE`, which fails instead. And code is
//! written through `/proc/self/mem`, so no page's protection ever changes (no page is
//! ever writable and executable), which is the other thing `region` would do.
//! All code — trampolines and the patches in the target's own functions — is written
//! through `/proc/self/mem`, which the kernel lets a process use on its own read-only
//! pages. Arenas are never unmapped: a thread may still be inside a trampoline long
//! after its function was restored.

use super::error::AgentError;
use super::state::{MAX_CHUNKS, MAX_COPY_BODIES, STATE};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

/// Size of each mapping the arena takes from the kernel.
const CHUNK_SIZE: u64 = 256 * 1024;
/// How far a rel32 can reach, with a margin for the instruction's own length.
const REACH: u64 = (1 << 31) - 64 * 1024;
const PAGE: u64 = 4096;

fn proc_self_mem() -> std::io::Result<i32> {
    let pid = crate::sys::getpid();
    let fd = STATE.mem_fd.load(Ordering::Acquire);
    if fd >= 0 && STATE.mem_owner.load(Ordering::Acquire) == pid {
        return Ok(fd);
    }
    // SAFETY: open with a valid NUL-terminated path and constant flags.
    let fd = unsafe { libc::open(c"/proc/self/mem".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            error.kind(),
            format!("cannot open /proc/self/mem: {error}"),
        ));
    }
    STATE.mem_fd.store(fd, Ordering::Release);
    STATE.mem_owner.store(pid, Ordering::Release);
    Ok(fd)
}

/// Opens `/proc/self/mem` ahead of time, so that [`write_code`] neither allocates nor
/// opens files while the target's threads are parked.
pub fn prepare() -> Result<(), AgentError> {
    proc_self_mem()
        .map(drop)
        .map_err(|e| AgentError::Unusable(e.to_string()))
}

/// Writes `bytes` at `address` in this process, whatever the page's protection.
/// After [`prepare`], this is a single `pwrite` system call and never allocates.
pub fn write_code(address: u64, bytes: &[u8]) -> std::io::Result<()> {
    let fd = proc_self_mem()?;
    // SAFETY: pwrite reads `bytes`, which is valid for its length.
    let written = unsafe {
        crate::sys::syscall4(
            libc::SYS_pwrite64,
            fd as u64,
            bytes.as_ptr() as u64,
            bytes.len() as u64,
            address,
        ) as isize
    };
    if written == bytes.len() as isize {
        Ok(())
    } else if written < 0 {
        Err(std::io::Error::from_raw_os_error(-written as i32))
    } else {
        Err(std::io::Error::other(format!(
            "short write of code at {address:#x}"
        )))
    }
}

/// Reads `buffer.len()` bytes at `address` in this process; false instead of a fault
/// for an unmapped address. After [`prepare`], allocates nothing (safe while threads
/// are parked).
pub fn read_memory(address: u64, buffer: &mut [u8]) -> bool {
    proc_self_mem().is_ok_and(|fd| read_whole(fd, address, buffer))
}

/// Reads `buffer.len()` bytes at `address` in this process; fails instead of faulting
/// on an unmapped or unreadable address.
pub fn read_code(address: u64, buffer: &mut [u8]) -> std::io::Result<()> {
    if read_whole(proc_self_mem()?, address, buffer) {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "cannot read {} bytes of code at {address:#x}",
            buffer.len()
        )))
    }
}

/// Whether one `pread` of `/proc/self/mem` (open as `fd`) filled `buffer` from
/// `address`. A raw system call; allocates nothing.
fn read_whole(fd: i32, address: u64, buffer: &mut [u8]) -> bool {
    // SAFETY: pread writes at most buffer.len() bytes into `buffer`.
    let read = unsafe {
        crate::sys::syscall4(
            libc::SYS_pread64,
            fd as u64,
            buffer.as_mut_ptr() as u64,
            buffer.len() as u64,
            address,
        ) as isize
    };
    read == buffer.len() as isize
}

/// Whether `pc` lies in trampoline memory. Lock-free, for signal handlers.
pub fn is_trampoline_code(pc: u64) -> bool {
    let count = STATE.chunk_count.load(Ordering::Acquire).min(MAX_CHUNKS);
    STATE.chunk_starts[..count].iter().any(|start| {
        let start = start.load(Ordering::Acquire);
        start != 0 && (start..start + CHUNK_SIZE).contains(&pc)
    })
}

/// Notes that `start..end` of the arena holds a function's copy (issue 18): the
/// target's own code with counters, run from the arena, where a thread may spend any
/// time. Called with the engine's lock held (one writer).
pub fn note_function_copy(start: u64, end: u64) {
    let index = STATE.copy_body_count.load(Ordering::Acquire);
    if index < MAX_COPY_BODIES {
        STATE.copy_bodies[index].1.store(end, Ordering::Release);
        STATE.copy_bodies[index].0.store(start, Ordering::Release);
        STATE.copy_body_count.store(index + 1, Ordering::Release);
    }
}

/// Whether `pc` is in a hook's code: tendril's trampolines, but not the function
/// copies among them (past the first [`MAX_COPY_BODIES`], a copy counts as a hook's).
/// Lock-free, for signal handlers.
pub fn is_hook_code(pc: u64) -> bool {
    if !is_trampoline_code(pc) {
        return false;
    }
    let count = STATE
        .copy_body_count
        .load(Ordering::Acquire)
        .min(MAX_COPY_BODIES);
    !STATE.copy_bodies[..count].iter().any(|(start, end)| {
        (start.load(Ordering::Acquire)..end.load(Ordering::Acquire)).contains(&pc)
    })
}

/// One read+execute mapping, filled from the bottom.
struct Chunk {
    start: u64,
    used: u64,
}

/// Hands out executable memory near requested addresses.
pub struct CodeArena {
    chunks: Mutex<Vec<Chunk>>,
}

impl Default for CodeArena {
    fn default() -> Self {
        Self::new()
    }
}

impl CodeArena {
    pub const fn new() -> Self {
        CodeArena {
            chunks: Mutex::new(Vec::new()),
        }
    }

    /// Returns the address of `len` bytes (16-byte aligned) of executable memory within
    /// rel32 reach of `near`, or an explanation when the address space there is full.
    pub fn allocate_near(&self, near: u64, len: u64) -> Result<u64, AgentError> {
        let len = (len + 15) & !15;
        let mut chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        let reachable =
            |start: u64, end: u64| start.abs_diff(near) < REACH && end.abs_diff(near) < REACH;
        if let Some(chunk) = chunks
            .iter_mut()
            .find(|c| c.used + len <= CHUNK_SIZE && reachable(c.start, c.start + CHUNK_SIZE))
        {
            let address = chunk.start + chunk.used;
            chunk.used += len;
            return Ok(address);
        }
        let start = map_chunk_near(near)?;
        chunks.push(Chunk { start, used: len });
        let index = STATE.chunk_count.load(Ordering::Acquire);
        if index < MAX_CHUNKS {
            STATE.chunk_starts[index].store(start, Ordering::Release);
            STATE.chunk_count.store(index + 1, Ordering::Release);
        }
        Ok(start)
    }
}

/// Maps a fresh read+execute chunk in a gap of the address space within reach of `near`.
fn map_chunk_near(near: u64) -> Result<u64, AgentError> {
    let mut taken: Vec<(u64, u64)> = super::maps::read_own()
        .map_err(|e| AgentError::io("cannot read /proc/self/maps", e))?
        .into_iter()
        .map(|mapping| (mapping.start, mapping.end))
        .collect();
    taken.sort_unstable();
    // Candidate addresses: just after and just before each mapping, closest first.
    let mut candidates: Vec<u64> = taken
        .iter()
        .flat_map(|&(start, end)| [end, start.saturating_sub(CHUNK_SIZE)])
        .filter(|&c| {
            c >= 0x10000
                && c % PAGE == 0
                && c.abs_diff(near) < REACH
                && (c + CHUNK_SIZE).abs_diff(near) < REACH
        })
        .filter(|&c| !taken.iter().any(|&(s, e)| c < e && s < c + CHUNK_SIZE))
        .collect();
    candidates.sort_by_key(|c| c.abs_diff(near));
    for candidate in candidates {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping: the kernel
        // either maps exactly at `candidate` in free space or fails.
        let mapped = unsafe {
            libc::mmap(
                candidate as *mut libc::c_void,
                CHUNK_SIZE as usize,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED && mapped as u64 == candidate {
            return Ok(candidate);
        }
    }
    Err(AgentError::NoAddressSpace { near })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_near_executable_and_writable_through_proc_self_mem() {
        let arena = CodeArena::new();
        let near = write_code as *const () as u64;
        let first = arena.allocate_near(near, 40).unwrap();
        let second = arena.allocate_near(near, 8).unwrap();
        assert!(first.abs_diff(near) < REACH);
        assert_eq!(second, first + 48, "pieces are 16-byte aligned and packed");
        // `mov eax, 42; ret`, written through /proc/self/mem into a read+execute page.
        write_code(first, &[0xb8, 42, 0, 0, 0, 0xc3]).unwrap();
        // SAFETY: `first` now holds a complete function with the C ABI returning an int.
        let function: extern "C" fn() -> i32 = unsafe { std::mem::transmute(first as usize) };
        assert_eq!(function(), 42);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| l.starts_with(&format!("{first:x}-")))
            .unwrap();
        assert!(
            line.contains(" r-xp "),
            "arena pages are never writable: {line}"
        );
    }
}
