//! The `siginfo` of a signal queued with `rt_tgsigqueueinfo` (`SI_QUEUE`).
//!
//! libc's `siginfo_t` only has read accessors for its union (`si_pid()`, `si_value()`),
//! so the sender fills this `#[repr(C)]` twin instead: the same size as `siginfo_t`,
//! with the fields `SI_QUEUE` defines, whose offsets are checked at compile time
//! against libc's struct and the kernel's ABI, and by a unit test against libc's own
//! accessors. Nothing is written at a hard-coded offset.

use std::mem::{offset_of, size_of};

/// A `siginfo_t` as the kernel lays it out for `SI_QUEUE` (`_sifields._rt`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QueuedSignalInfo {
    pub si_signo: libc::c_int,
    pub si_errno: libc::c_int,
    pub si_code: libc::c_int,
    /// The union is 8-byte aligned (it holds pointers).
    _align: libc::c_int,
    /// `_rt.si_pid`: the sender's process id.
    pub si_pid: libc::pid_t,
    /// `_rt.si_uid`: the sender's real user id.
    pub si_uid: libc::uid_t,
    /// `_rt.si_sigval`: the value the handler reads with `siginfo_t::si_value`.
    pub si_value: u64,
    _rest: [u64; 12],
}

const _: () = {
    assert!(size_of::<QueuedSignalInfo>() == size_of::<libc::siginfo_t>());
    assert!(std::mem::align_of::<QueuedSignalInfo>() >= std::mem::align_of::<libc::siginfo_t>());
    assert!(offset_of!(QueuedSignalInfo, si_signo) == offset_of!(libc::siginfo_t, si_signo));
    assert!(offset_of!(QueuedSignalInfo, si_errno) == offset_of!(libc::siginfo_t, si_errno));
    assert!(offset_of!(QueuedSignalInfo, si_code) == offset_of!(libc::siginfo_t, si_code));
    // The kernel's x86-64 ABI (include/uapi/asm-generic/siginfo.h): the union starts
    // at 16; `_rt` holds the pid, the uid, then the sigval.
    assert!(offset_of!(QueuedSignalInfo, si_pid) == 16);
    assert!(offset_of!(QueuedSignalInfo, si_uid) == 20);
    assert!(offset_of!(QueuedSignalInfo, si_value) == 24);
};

impl QueuedSignalInfo {
    /// The siginfo of `signal`, queued by process `pid` of user `uid`, carrying `value`.
    pub fn new(signal: i32, pid: libc::pid_t, uid: libc::uid_t, value: u64) -> Self {
        QueuedSignalInfo {
            si_signo: signal,
            si_errno: 0,
            si_code: libc::SI_QUEUE,
            _align: 0,
            si_pid: pid,
            si_uid: uid,
            si_value: value,
            _rest: [0; 12],
        }
    }
}

/// The `si_value` of a queued signal, as the handler receives it.
///
/// # Safety
/// `info` points at a valid `siginfo_t` of an `SI_QUEUE` signal.
pub unsafe fn queued_value(info: *const libc::siginfo_t) -> u64 {
    // SAFETY: per the contract; `si_value` is libc's accessor of `_rt.si_sigval`.
    unsafe { (*info).si_value().sival_ptr as u64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The twin's fields are where libc's accessors read them.
    #[test]
    fn pure_queued_signal_info_matches_libc_accessors() {
        let info = QueuedSignalInfo::new(libc::SIGRTMAX(), 4242, 1000, 0xdead_beef_1234);
        // SAFETY: the two types have the same size (asserted) and siginfo_t is plain data.
        let as_libc: libc::siginfo_t = unsafe { std::mem::transmute(info) };
        assert_eq!(as_libc.si_signo, libc::SIGRTMAX());
        assert_eq!(as_libc.si_code, libc::SI_QUEUE);
        // SAFETY: an SI_QUEUE siginfo has the `_rt` member these accessors read.
        unsafe {
            assert_eq!(as_libc.si_pid(), 4242);
            assert_eq!(as_libc.si_uid(), 1000);
            assert_eq!(queued_value(&as_libc), 0xdead_beef_1234);
        }
    }
}
