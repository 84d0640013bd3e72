//! One thread of the target, seized with ptrace for the duration of an injection.
//!
//! A [`Tracee`] is obtained with `PTRACE_SEIZE` + `PTRACE_INTERRUPT`, which stops only that
//! thread and, unlike `PTRACE_ATTACH`, sends no `SIGSTOP` that the target could observe.
//! Before its registers are changed, all of them — general purpose and the whole xsave
//! area (x87, SSE, AVX…) — are saved, and they are put back before it is released.
//! Dropping a `Tracee` always restores and detaches, so no error path can leave the
//! target stopped, traced or with altered registers.

use crate::process::AttachError;
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// `NT_X86_XSTATE`: the regset holding the full extended register state.
const NT_X86_XSTATE: libc::c_int = 0x202;
/// Large enough for every xsave layout in use, AMX included.
const XSTATE_BUFFER_SIZE: usize = 16 * 1024;

/// Everything the thread had in its registers when it stopped.
#[derive(Clone)]
pub struct SavedRegisters {
    pub general: libc::user_regs_struct,
    xstate: Vec<u8>,
}

/// How a resumed tracee came back to us.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// It received this signal (a signal-delivery-stop); the signal is not yet delivered.
    Signal(Signal),
    /// A ptrace event stop, such as the group-stop of a `SIGSTOP` sent by someone else.
    Event,
}

pub struct Tracee {
    pid: i32,
    tid: i32,
    saved: Option<SavedRegisters>,
    attached: bool,
    /// Resumed and not yet seen stopping again.
    running: bool,
}

impl Tracee {
    /// Seizes thread `tid` of process `pid` and waits until it is stopped.
    pub fn seize(pid: i32, tid: i32, timeout: Duration) -> Result<Tracee, AttachError> {
        let thread = Pid::from_raw(tid);
        seize_thread(pid, tid)?;
        let mut tracee = Tracee {
            pid,
            tid,
            saved: None,
            attached: true,
            running: true,
        };
        ptrace::interrupt(thread).map_err(|e| errno_to_attach_error(pid, e))?;
        // The first stop may be a signal-delivery-stop for a signal that was pending:
        // deliver it and keep waiting for the interrupt's event stop.
        loop {
            match tracee.wait(timeout)? {
                Stop::Event => break,
                Stop::Signal(signal) => tracee.resume(Some(signal))?,
            }
        }
        Ok(tracee)
    }

    /// Takes over thread `tid`, which this process already traces and which is stopped
    /// (a program `tendril run` started with `PTRACE_TRACEME`).
    pub fn adopt_stopped(pid: i32, tid: i32) -> Tracee {
        Tracee {
            pid,
            tid,
            saved: None,
            attached: true,
            running: false,
        }
    }

    /// Puts back the saved registers and keeps the thread stopped and traced (see
    /// [`Tracee::adopt_stopped`]); dropping the tracee later lets it go.
    pub fn restore_registers(&mut self) -> Result<(), AttachError> {
        if let Some(saved) = self.saved.clone() {
            self.set_registers(saved.general)?;
            self.write_xstate(&saved.xstate)?;
        }
        Ok(())
    }

    /// Saves every register now, to be put back when the tracee is released. Needed
    /// before anything that changes the thread's registers, such as a remote call.
    pub fn save_registers(&mut self) -> Result<(), AttachError> {
        let general = self.get_registers()?;
        let xstate = self.read_xstate()?;
        self.saved = Some(SavedRegisters { general, xstate });
        Ok(())
    }

    pub fn tid(&self) -> i32 {
        self.tid
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The registers saved by [`Tracee::save_registers`].
    pub fn saved(&self) -> &SavedRegisters {
        self.saved
            .as_ref()
            .expect("save_registers must be called before the registers are changed")
    }

    pub fn get_registers(&self) -> Result<libc::user_regs_struct, AttachError> {
        ptrace::getregs(Pid::from_raw(self.tid)).map_err(|e| errno_to_attach_error(self.pid, e))
    }

    pub fn set_registers(&self, regs: libc::user_regs_struct) -> Result<(), AttachError> {
        ptrace::setregs(Pid::from_raw(self.tid), regs)
            .map_err(|e| errno_to_attach_error(self.pid, e))
    }

    /// Resumes the thread, delivering `signal` if given.
    pub fn resume(&mut self, signal: Option<Signal>) -> Result<(), AttachError> {
        ptrace::cont(Pid::from_raw(self.tid), signal)
            .map_err(|e| errno_to_attach_error(self.pid, e))?;
        self.running = true;
        Ok(())
    }

    /// Waits for the resumed thread to stop again. On timeout an error is returned and
    /// the thread is still running; dropping the tracee then stops and restores it.
    pub fn wait(&mut self, timeout: Duration) -> Result<Stop, AttachError> {
        let deadline = Instant::now() + timeout;
        let thread = Pid::from_raw(self.tid);
        loop {
            match waitpid(thread, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {
                    if Instant::now() >= deadline {
                        return Err(AttachError::Other {
                            pid: self.pid,
                            message: "the target's thread did not respond in time".into(),
                        });
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                Ok(WaitStatus::PtraceEvent(_, _, _)) => {
                    self.running = false;
                    return Ok(Stop::Event);
                }
                Ok(WaitStatus::Stopped(_, signal)) => {
                    self.running = false;
                    return Ok(Stop::Signal(signal));
                }
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                    self.attached = false;
                    return Err(AttachError::Exited(self.pid));
                }
                Ok(_) => {}
                Err(Errno::EINTR) => {}
                Err(e) => {
                    self.attached = false;
                    return Err(errno_to_attach_error(self.pid, e));
                }
            }
        }
    }

    /// Stops a thread that is running (after [`Tracee::resume`]) and waits for the stop.
    pub fn interrupt_and_wait(&mut self, timeout: Duration) -> Result<(), AttachError> {
        ptrace::interrupt(Pid::from_raw(self.tid))
            .map_err(|e| errno_to_attach_error(self.pid, e))?;
        loop {
            match self.wait(timeout)? {
                Stop::Event => return Ok(()),
                // A signal that arrived meanwhile: deliver it, then stop for our interrupt.
                Stop::Signal(signal) => self.resume(Some(signal))?,
            }
        }
    }

    /// Writes into the target's memory (any mapping, writable or not).
    pub fn write_memory(&self, address: u64, bytes: &[u8]) -> Result<(), AttachError> {
        self.mem_file()?
            .write_all_at(bytes, address)
            .map_err(|e| AttachError::Other {
                pid: self.pid,
                message: format!("cannot write target memory: {e}"),
            })
    }

    /// Reads up to `buffer.len()` bytes; returns how many could be read.
    pub fn read_memory(&self, address: u64, buffer: &mut [u8]) -> usize {
        let Ok(mem) = self.mem_file() else { return 0 };
        let mut done = 0;
        while done < buffer.len() {
            match mem.read_at(&mut buffer[done..], address + done as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => done += n,
            }
        }
        done
    }

    fn mem_file(&self) -> Result<std::fs::File, AttachError> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{}/mem", self.pid))
            .map_err(|e| crate::process::io_to_attach_error(self.pid, &e))
    }

    fn read_xstate(&self) -> Result<Vec<u8>, AttachError> {
        let mut buffer = vec![0u8; XSTATE_BUFFER_SIZE];
        let mut iov = libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: buffer.len(),
        };
        // SAFETY: PTRACE_GETREGSET writes at most iov_len bytes into the buffer the iovec
        // describes, which lives until after the call, and updates iov_len to the size.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGSET,
                self.tid,
                NT_X86_XSTATE as usize,
                &mut iov as *mut libc::iovec,
            )
        };
        if rc != 0 {
            return Err(errno_to_attach_error(self.pid, Errno::last()));
        }
        buffer.truncate(iov.iov_len);
        Ok(buffer)
    }

    fn write_xstate(&self, xstate: &[u8]) -> Result<(), AttachError> {
        let mut copy = xstate.to_vec();
        let mut iov = libc::iovec {
            iov_base: copy.as_mut_ptr().cast(),
            iov_len: copy.len(),
        };
        // SAFETY: PTRACE_SETREGSET reads iov_len bytes from the buffer, which is valid for
        // the whole call; the data is exactly what PTRACE_GETREGSET returned earlier.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGSET,
                self.tid,
                NT_X86_XSTATE as usize,
                &mut iov as *mut libc::iovec,
            )
        };
        if rc != 0 {
            return Err(errno_to_attach_error(self.pid, Errno::last()));
        }
        Ok(())
    }

    /// Puts back the registers saved by [`Tracee::save_registers`], if any, and lets the
    /// thread go.
    pub fn restore_and_detach(mut self) -> Result<(), AttachError> {
        self.restore_and_detach_inner()
    }

    fn restore_and_detach_inner(&mut self) -> Result<(), AttachError> {
        if !self.attached {
            return Ok(());
        }
        if self.running {
            self.interrupt_and_wait(Duration::from_secs(2))?;
        }
        let restored = match &self.saved {
            Some(saved) => {
                let saved = saved.clone();
                self.set_registers(saved.general)
                    .and_then(|_| self.write_xstate(&saved.xstate))
            }
            None => Ok(()),
        };
        let detached = ptrace::detach(Pid::from_raw(self.tid), None)
            .map_err(|e| errno_to_attach_error(self.pid, e));
        self.attached = false;
        restored.and(detached)
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        let _ = self.restore_and_detach_inner();
    }
}

/// How often, and how far apart, a refused seize is tried again when no tracer shows:
/// another tracer may have let go of the thread just before its `TracerPid` was read.
const SEIZE_RETRIES: u32 = 20;
const SEIZE_RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// `PTRACE_SEIZE` of thread `tid`. Refused because another tracer holds the thread (or
/// another thread of the process: another tendril attaching, a debugger), it says who.
fn seize_thread(pid: i32, tid: i32) -> Result<(), AttachError> {
    let mut retries = 0;
    loop {
        match ptrace::seize(Pid::from_raw(tid), ptrace::Options::empty()) {
            Ok(()) => return Ok(()),
            Err(Errno::EPERM) => {
                if let Some(tracer) = crate::process::tracer_of(pid, tid) {
                    return Err(AttachError::traced_by(pid, tracer));
                }
                if retries == SEIZE_RETRIES || crate::process::is_gone_or_exiting(pid) {
                    return Err(errno_to_attach_error(pid, Errno::EPERM));
                }
                retries += 1;
                std::thread::sleep(SEIZE_RETRY_INTERVAL);
            }
            Err(errno) => return Err(errno_to_attach_error(pid, errno)),
        }
    }
}

/// The user-facing meaning of a ptrace failure.
pub fn errno_to_attach_error(pid: i32, errno: Errno) -> AttachError {
    match errno {
        Errno::ESRCH => AttachError::Exited(pid),
        // The kernel also refuses to trace a process that is exiting.
        Errno::EPERM | Errno::EACCES if crate::process::is_gone_or_exiting(pid) => {
            AttachError::Exited(pid)
        }
        Errno::EPERM | Errno::EACCES => AttachError::PermissionDenied(pid),
        other => AttachError::Other {
            pid,
            message: format!("ptrace failed: {}", other.desc()),
        },
    }
}
