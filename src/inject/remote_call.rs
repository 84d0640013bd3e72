//! Calling a function inside the target on a borrowed, stopped thread.
//!
//! The call runs on the thread's own stack, below its red zone — or on a stack of its
//! own that a first call of the target's `mmap` maps ([`RemoteFrame::use_fresh_stack`]:
//! the thread's stack may be small, as a goroutine's is) — with a return address of
//! 0: when the function returns, the thread faults on fetching address 0 and stops with
//! `SIGSEGV`, which we catch (and never deliver). `orig_rax` is set to -1 so that the
//! kernel does not try to restart a system call the thread was interrupted in while our
//! call runs; the original registers, restored afterwards, restart it as if nothing had
//! happened.

use super::tracee::{Stop, Tracee};
use crate::process::AttachError;
use nix::sys::signal::Signal;
use std::time::Duration;

/// The System V x86-64 red zone: 128 bytes below rsp that leaf code may use.
const RED_ZONE: u64 = 128;

/// How large a stack [`RemoteFrame::use_fresh_stack`] maps.
const FRESH_STACK: u64 = 256 * 1024;

/// A call frame being prepared on the target thread's stack.
pub struct RemoteFrame<'a> {
    tracee: &'a mut Tracee,
    stack_pointer: u64,
    /// A stack mapped for the calls (its start), and `munmap` to unmap it with.
    fresh: Option<(u64, u64)>,
}

impl<'a> RemoteFrame<'a> {
    pub fn new(tracee: &'a mut Tracee) -> Self {
        let stack_pointer = tracee.saved().general.rsp - RED_ZONE;
        RemoteFrame {
            tracee,
            stack_pointer,
            fresh: None,
        }
    }

    /// Makes the next calls run on a stack of their own, mapped with the target's
    /// `mmap` (a wrapper of one system call, called on the thread's own stack, which it
    /// barely uses). A borrowed thread's own stack may be small: a goroutine blocked in
    /// a system call runs on its goroutine's stack, with less than a kilobyte certain
    /// to be free below its stack pointer, and `dlopen` needs kilobytes. `munmap`
    /// unmaps it again ([`RemoteFrame::release_fresh_stack`]).
    pub fn use_fresh_stack(&mut self, mmap: u64, munmap: u64) -> Result<(), AttachError> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK;
        let protection = libc::PROT_READ | libc::PROT_WRITE;
        let args = [0, FRESH_STACK, protection as u64, flags as u64, u64::MAX, 0];
        let start = self.call(mmap, &args, Duration::from_secs(5))?;
        if start == libc::MAP_FAILED as u64 || start == 0 || start % 4096 != 0 {
            return Err(AttachError::Other {
                pid: self.tracee.pid(),
                message: "the target could not map a stack for tendril's call (mmap failed)".into(),
            });
        }
        self.fresh = Some((start, munmap));
        self.stack_pointer = start + FRESH_STACK;
        Ok(())
    }

    /// Unmaps the stack [`RemoteFrame::use_fresh_stack`] mapped, from the thread's own
    /// stack; the calls after it run there again.
    pub fn release_fresh_stack(&mut self) -> Result<(), AttachError> {
        let Some((start, munmap)) = self.fresh.take() else {
            return Ok(());
        };
        self.stack_pointer = self.tracee.saved().general.rsp - RED_ZONE;
        self.call(munmap, &[start, FRESH_STACK], Duration::from_secs(5))?;
        Ok(())
    }

    /// Copies `data` onto the target's stack and returns its address there.
    pub fn push_bytes(&mut self, data: &[u8]) -> Result<u64, AttachError> {
        self.stack_pointer = (self.stack_pointer - data.len() as u64) & !15;
        self.tracee.write_memory(self.stack_pointer, data)?;
        Ok(self.stack_pointer)
    }

    /// Reads target memory (see [`Tracee::read_memory`]).
    pub fn read_memory(&self, address: u64, buffer: &mut [u8]) -> usize {
        self.tracee.read_memory(address, buffer)
    }

    /// Calls `function(args...)` (at most 6 integer arguments) and returns rax.
    /// Signals that arrive for the thread meanwhile are delivered to it as usual.
    pub fn call(
        &mut self,
        function: u64,
        args: &[u64],
        timeout: Duration,
    ) -> Result<u64, AttachError> {
        assert!(
            args.len() <= 6,
            "remote calls take at most 6 register arguments"
        );
        // At a function's entry rsp + 8 must be 16-byte aligned: push a 0 return address.
        let return_slot = (self.stack_pointer & !15) - 8;
        self.tracee.write_memory(return_slot, &0u64.to_le_bytes())?;
        let mut regs = self.tracee.saved().general;
        regs.rip = function;
        regs.rsp = return_slot;
        regs.rax = 0;
        regs.orig_rax = u64::MAX;
        let argument_registers = [
            &mut regs.rdi,
            &mut regs.rsi,
            &mut regs.rdx,
            &mut regs.rcx,
            &mut regs.r8,
            &mut regs.r9,
        ];
        for (register, value) in argument_registers.into_iter().zip(args) {
            *register = *value;
        }
        self.tracee.set_registers(regs)?;
        self.tracee.resume(None)?;
        loop {
            match self.tracee.wait(timeout)? {
                Stop::Signal(Signal::SIGSEGV) => {
                    let now = self.tracee.get_registers()?;
                    if now.rip == 0 {
                        return Ok(now.rax);
                    }
                    return Err(AttachError::Other {
                        pid: self.tracee.pid(),
                        message: format!(
                            "the target faulted at {:#x} during tendril's call; its registers were restored",
                            now.rip
                        ),
                    });
                }
                Stop::Signal(other) => self.tracee.resume(Some(other))?,
                // Someone stopped the process (SIGSTOP) meanwhile: finish our call first.
                Stop::Event => self.tracee.resume(None)?,
            }
        }
    }
}
