//! Calling a function inside the target on a borrowed, stopped thread.
//!
//! The call runs on the thread's own stack, below its red zone, with a return address of
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

/// A call frame being prepared on the target thread's stack.
pub struct RemoteFrame<'a> {
    tracee: &'a mut Tracee,
    stack_pointer: u64,
}

impl<'a> RemoteFrame<'a> {
    pub fn new(tracee: &'a mut Tracee) -> Self {
        let stack_pointer = tracee.saved().general.rsp - RED_ZONE;
        RemoteFrame {
            tracee,
            stack_pointer,
        }
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
