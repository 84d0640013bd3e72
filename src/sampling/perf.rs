//! One thread's perf events: `perf_event_open` on a thread of the target, the mapped
//! ring the kernel writes its samples into, and reading that ring from the controller
//! (and, for the off-CPU watch, one core's context-switch records: `SwitchScope`).
//!
//! The one idea: the kernel does the sampling. A `cpu-clock` software event on a thread
//! fires every N ns of that thread's CPU time and, with `PERF_SAMPLE_REGS_USER` and
//! `PERF_SAMPLE_STACK_USER`, copies the thread's user registers and the top of its user
//! stack into a ring this process maps. Nothing is loaded into the target, no code
//! changes, no signal is sent: a thread that blocks every signal is sampled like any
//! other. Wall-clock sampling adds a `context-switches` event on the same thread whose
//! samples (the stack where the thread went to sleep) and `PERF_RECORD_SWITCH` records
//! (when it came back) go into the same ring.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys as sys;
use perf_event_open_sys::bindings as perf;

/// The user registers each sample carries, in the kernel's order (ascending bit).
/// x86-64 `perf_regs.h`: BP = 6, SP = 7, IP = 8.
pub const REGS_MASK: u64 = (1 << 6) | (1 << 7) | (1 << 8);
/// How many registers [`REGS_MASK`] selects.
pub const REGS_COUNT: usize = 3;

/// What every sample record holds, in order: identifier, pid/tid, time, user regs, user
/// stack. The identifier tells the clock event's samples from the switch event's.
pub const SAMPLE_TYPE: u64 = perf::PERF_SAMPLE_IDENTIFIER as u64
    | perf::PERF_SAMPLE_TID as u64
    | perf::PERF_SAMPLE_TIME as u64
    | perf::PERF_SAMPLE_REGS_USER as u64
    | perf::PERF_SAMPLE_STACK_USER as u64;

/// Which clock drives the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// `cpu-clock`: one sample per period of the thread's own CPU time.
    CpuClock { period_ns: u64 },
    /// `context-switches`, one sample at every switch-out, with `PERF_RECORD_SWITCH`
    /// records for the switches in.
    ContextSwitches,
}

/// Why a thread could not be sampled.
#[derive(Debug)]
pub enum OpenError {
    /// The thread ended before its event could be opened: not an error for a sampler.
    Gone,
    /// The kernel refused: permissions, `perf_event_paranoid`, a container's seccomp.
    Refused(io::Error),
    /// Anything else (no perf events in this kernel, out of memory, too many files).
    Other(io::Error),
}

/// Whose context switches an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchScope {
    Thread(i32),
    Core(u32),
}

/// An open perf event on one thread, and its ring if it has one of its own.
pub struct PerfEvent {
    fd: OwnedFd,
    /// The kernel's identifier of this event (`PERF_EVENT_IOC_ID`), as in its samples.
    pub id: u64,
}

impl PerfEvent {
    /// Opens a sampling event of `kind` on thread `tid`, disabled, user space only
    /// unless `with_kernel` (context switches happen in the kernel, so the switch event
    /// needs it; the samples still hold only user registers and stack). Each sample
    /// copies `stack_bytes` of the user stack (a multiple of 8).
    pub fn open(
        tid: i32,
        kind: EventKind,
        stack_bytes: u32,
        with_kernel: bool,
        wakeup_bytes: u32,
    ) -> Result<PerfEvent, OpenError> {
        let mut attr = perf::perf_event_attr {
            size: std::mem::size_of::<perf::perf_event_attr>() as u32,
            type_: perf::PERF_TYPE_SOFTWARE,
            sample_type: SAMPLE_TYPE,
            sample_regs_user: REGS_MASK,
            sample_stack_user: stack_bytes,
            ..Default::default()
        };
        match kind {
            EventKind::CpuClock { period_ns } => {
                attr.config = perf::PERF_COUNT_SW_CPU_CLOCK as u64;
                attr.__bindgen_anon_1.sample_period = period_ns.max(1);
            }
            EventKind::ContextSwitches => {
                attr.config = perf::PERF_COUNT_SW_CONTEXT_SWITCHES as u64;
                attr.__bindgen_anon_1.sample_period = 1;
                attr.set_context_switch(1);
            }
        }
        attr.set_disabled(1);
        attr.set_exclude_kernel(u64::from(!with_kernel));
        attr.set_exclude_hv(1);
        attr.set_exclude_callchain_kernel(1);
        attr.set_sample_id_all(1);
        open_with(&mut attr, (tid, -1), wakeup_bytes)
    }

    /// Opens an event that only reports context switches, enabled at once, no
    /// samples: those of thread `tid` (`PERF_RECORD_SWITCH`), or with
    /// [`SwitchScope::Core`] those of every thread that runs on one core
    /// (`PERF_RECORD_SWITCH_CPU_WIDE`, which needs root or `CAP_PERFMON`). Each record
    /// has the process and thread ids, the `CLOCK_MONOTONIC` time and the core. Not
    /// inherited: the kernel maps no ring of an inherited per-thread event, so each
    /// thread needs its own.
    pub fn open_switch_records(
        scope: SwitchScope,
        wakeup_bytes: u32,
    ) -> Result<PerfEvent, OpenError> {
        let mut attr = perf::perf_event_attr {
            size: std::mem::size_of::<perf::perf_event_attr>() as u32,
            type_: perf::PERF_TYPE_SOFTWARE,
            config: perf::PERF_COUNT_SW_DUMMY as u64,
            // The trailer `records::parse_switch_records` reads: pid and tid, time, CPU.
            sample_type: perf::PERF_SAMPLE_TID as u64
                | perf::PERF_SAMPLE_TIME as u64
                | perf::PERF_SAMPLE_CPU as u64,
            ..Default::default()
        };
        attr.set_context_switch(1);
        attr.set_sample_id_all(1);
        attr.set_exclude_kernel(1);
        attr.set_exclude_hv(1);
        match scope {
            SwitchScope::Thread(tid) => open_with(&mut attr, (tid, -1), wakeup_bytes),
            SwitchScope::Core(cpu) => open_with(&mut attr, (-1, cpu as i32), wakeup_bytes),
        }
    }

    /// Sends this event's records into `other`'s ring (both on the same thread).
    pub fn redirect_to(&self, other: &PerfEvent) -> io::Result<()> {
        // SAFETY: both are open perf event fds; the ioctl takes the target fd by value.
        let result = unsafe { sys::ioctls::SET_OUTPUT(self.fd.as_raw_fd(), other.fd.as_raw_fd()) };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Starts counting.
    pub fn enable(&self) -> io::Result<()> {
        // SAFETY: an ioctl without a pointer argument on an fd we own.
        if unsafe { sys::ioctls::ENABLE(self.fd.as_raw_fd(), 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stops counting; what is in the ring stays readable.
    pub fn disable(&self) -> io::Result<()> {
        // SAFETY: an ioctl without a pointer argument on an fd we own.
        if unsafe { sys::ioctls::DISABLE(self.fd.as_raw_fd(), 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// `perf_event_open` with `attr` on `(tid, cpu)` (thread `tid` on any core, or with tid
/// -1 every thread on core `cpu`), and the event's kernel id. Every event stamps its
/// records with CLOCK_MONOTONIC (which the controller can read too) and wakes a reader in
/// poll() once `wakeup_bytes` are waiting.
fn open_with(
    attr: &mut perf::perf_event_attr,
    (tid, cpu): (i32, i32),
    wakeup_bytes: u32,
) -> Result<PerfEvent, OpenError> {
    attr.set_use_clockid(1);
    attr.clockid = libc::CLOCK_MONOTONIC;
    attr.set_watermark(1);
    attr.__bindgen_anon_2.wakeup_watermark = wakeup_bytes.max(1);
    // SAFETY: attr is a valid, fully initialised perf_event_attr that lives across
    // the call; the kernel only reads it (and may write its size field back).
    let fd = unsafe { sys::perf_event_open(attr, tid, cpu, -1, perf::PERF_FLAG_FD_CLOEXEC as _) };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            Some(libc::ESRCH) => OpenError::Gone,
            Some(libc::EACCES) | Some(libc::EPERM) => OpenError::Refused(error),
            _ => OpenError::Other(error),
        });
    }
    // SAFETY: fd was just returned by perf_event_open and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut id = 0u64;
    // SAFETY: PERF_EVENT_IOC_ID writes one u64 through the pointer, which is valid.
    if unsafe { sys::ioctls::ID(fd.as_raw_fd(), &mut id) } < 0 {
        return Err(OpenError::Other(io::Error::last_os_error()));
    }
    Ok(PerfEvent { fd, id })
}

/// The mapped ring of one event: a metadata page, then `data_pages` pages of records
/// the kernel writes (`data_head`) and this process consumes (`data_tail`).
pub struct Ring {
    base: NonNull<u8>,
    map_len: usize,
    data_offset: usize,
    data_size: usize,
    /// A record that wraps around the ring's end is copied here to be read whole.
    scratch: Vec<u8>,
}

// SAFETY: the mapping is owned by the Ring and only reached through &mut self (reads of
// kernel-written memory and one atomic tail store); nothing ties it to a thread.
unsafe impl Send for Ring {}

/// The byte offsets of `data_head` and `data_tail` in `perf_event_mmap_page`.
const DATA_HEAD_OFFSET: usize = std::mem::offset_of!(perf::perf_event_mmap_page, data_head);
const DATA_TAIL_OFFSET: usize = std::mem::offset_of!(perf::perf_event_mmap_page, data_tail);
const DATA_OFFSET_OFFSET: usize = std::mem::offset_of!(perf::perf_event_mmap_page, data_offset);
const DATA_SIZE_OFFSET: usize = std::mem::offset_of!(perf::perf_event_mmap_page, data_size);

impl Ring {
    /// Maps `event`'s ring with `data_pages` pages of data (a power of two).
    pub fn map(event: &PerfEvent, data_pages: usize) -> io::Result<Ring> {
        let page = page_size();
        let map_len = page * (1 + data_pages);
        // SAFETY: a fresh shared mapping of a perf event fd; the kernel checks the size.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                event.raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).expect("mmap never returns null on success");
        let mut ring = Ring {
            base,
            map_len,
            data_offset: page,
            data_size: page * data_pages,
            scratch: Vec::new(),
        };
        // Kernels since 4.1 say where the data is; older ones put it after one page.
        let (offset, size) = (ring.meta(DATA_OFFSET_OFFSET), ring.meta(DATA_SIZE_OFFSET));
        if size != 0 {
            ring.data_offset = offset as usize;
            ring.data_size = size as usize;
        }
        Ok(ring)
    }

    fn meta(&self, offset: usize) -> u64 {
        // SAFETY: offset is a field of perf_event_mmap_page, inside the first page of the
        // live mapping and 8-byte aligned; the kernel may write it concurrently, hence
        // the atomic read.
        unsafe { (*self.base.as_ptr().add(offset).cast::<AtomicU64>()).load(Ordering::Acquire) }
    }

    /// Bytes written and not yet read.
    pub fn pending_bytes(&self) -> u64 {
        self.meta(DATA_HEAD_OFFSET)
            .wrapping_sub(self.meta(DATA_TAIL_OFFSET))
    }

    /// Hands every complete record written so far to `visit` (its header included),
    /// then gives the space back to the kernel. Returns how many records were read.
    pub fn drain(&mut self, mut visit: impl FnMut(&[u8])) -> usize {
        let head = self.meta(DATA_HEAD_OFFSET);
        let mut tail = self.meta(DATA_TAIL_OFFSET);
        let size = self.data_size as u64;
        let mut records = 0;
        // SAFETY: data_offset..data_offset+data_size is inside the live mapping.
        let data = unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().add(self.data_offset), self.data_size)
        };
        while head.wrapping_sub(tail) >= 8 {
            let start = (tail % size) as usize;
            let header = read_wrapping(data, start, 8, &mut self.scratch);
            let record_len = u16::from_ne_bytes([header[6], header[7]]) as usize;
            if record_len < 8 || head.wrapping_sub(tail) < record_len as u64 {
                break; // a torn header: the kernel never writes one; stop rather than loop
            }
            let record = if start + record_len <= data.len() {
                &data[start..start + record_len]
            } else {
                read_wrapping(data, start, record_len, &mut self.scratch)
            };
            visit(record);
            records += 1;
            tail = tail.wrapping_add(record_len as u64);
        }
        // SAFETY: data_tail is a field of the first page; the release store tells the
        // kernel the bytes before it were read.
        unsafe {
            (*self.base.as_ptr().add(DATA_TAIL_OFFSET).cast::<AtomicU64>())
                .store(tail, Ordering::Release);
        }
        records
    }
}

/// `len` bytes at `start` of the ring `data`, copied into `scratch` if they wrap.
fn read_wrapping<'a>(
    data: &'a [u8],
    start: usize,
    len: usize,
    scratch: &'a mut Vec<u8>,
) -> &'a [u8] {
    if start + len <= data.len() {
        return &data[start..start + len];
    }
    scratch.clear();
    let first = data.len() - start;
    scratch.extend_from_slice(&data[start..]);
    scratch.extend_from_slice(&data[..len - first]);
    scratch
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base/map_len are exactly what mmap returned; nothing borrows it now.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.map_len);
        }
    }
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as usize } else { 4096 }
}
