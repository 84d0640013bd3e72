//! Judging filters against the table, on hand-assembled filters like the ones users run.

use super::bpf::{AUDIT_ARCH_X86_64, Instruction};
use super::*;

const KILL_PROCESS: u32 = 0x8000_0000;
const ERRNO: u32 = 0x0005_0000;
const ALLOW: u32 = 0x7fff_0000;
const LOG: u32 = 0x7ffc_0000;
const TRAP: u32 = 0x0003_0000;

fn stmt(code: u16, k: u32) -> Instruction {
    Instruction::statement(code, k)
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Instruction {
    Instruction::jump(code, k, jt, jf)
}

/// `result` for system call `nr`, `otherwise` for every other one (after an arch check).
fn one_call(nr: i64, result: u32, otherwise: u32) -> Vec<Instruction> {
    vec![
        stmt(0x20, 4),
        jump(0x15, AUDIT_ARCH_X86_64, 1, 0),
        stmt(0x06, KILL_PROCESS),
        stmt(0x20, 0),
        jump(0x15, nr as u32, 0, 1),
        stmt(0x06, result),
        stmt(0x06, otherwise),
    ]
}

/// KILL_PROCESS for mmap and mprotect with PROT_EXEC.
fn kill_exec() -> Vec<Instruction> {
    vec![
        stmt(0x20, 0),
        jump(0x15, libc::SYS_mmap as u32, 1, 0),
        jump(0x15, libc::SYS_mprotect as u32, 0, 3),
        stmt(0x20, 32),
        jump(0x45, libc::PROT_EXEC as u32, 0, 1),
        stmt(0x06, KILL_PROCESS),
        stmt(0x06, ALLOW),
    ]
}

fn refusal_of(filters: &[Vec<Instruction>]) -> Option<String> {
    judge(filters)
        .expect("the filters run")
        .map(|(call, result)| refusal(call, result))
}

#[test]
fn an_executable_mapping_killed_is_named_as_the_loaders() {
    let message = refusal_of(&[kill_exec()]).expect("refused");
    assert_eq!(
        message,
        "its seccomp filter would kill it (SECCOMP_RET_KILL_PROCESS) on mmap with \
         PROT_READ|PROT_EXEC, MAP_PRIVATE|MAP_FIXED|MAP_DENYWRITE, which loading tendril's \
         agent needs; nothing was changed"
    );
}

#[test]
fn a_refused_socket_is_named_as_the_agents() {
    let eperm = one_call(libc::SYS_socket, ERRNO | libc::EPERM as u32, ALLOW);
    let message = refusal_of(&[eperm]).expect("refused");
    assert!(
        message.starts_with(
            "its seccomp filter would fail with EPERM (SECCOMP_RET_ERRNO) on socket with \
             AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC, which tendril's agent needs"
        ),
        "{message}"
    );
    let trap = one_call(libc::SYS_socket, TRAP, ALLOW);
    assert!(
        refusal_of(&[trap])
            .unwrap()
            .contains("send it SIGSYS (SECCOMP_RET_TRAP)")
    );
}

#[test]
fn allowed_and_logged_calls_and_fallbacks_are_fine() {
    assert_eq!(refusal_of(&[]), None);
    assert_eq!(refusal_of(&[one_call(libc::SYS_socket, LOG, ALLOW)]), None);
    // Docker's default profile: clone3 fails with ENOSYS, and glibc falls back to clone.
    let docker = one_call(libc::SYS_clone3, ERRNO | libc::ENOSYS as u32, ALLOW);
    assert_eq!(refusal_of(&[docker]), None);
    // With another errno there is no fallback.
    let eperm = one_call(libc::SYS_clone3, ERRNO | libc::EPERM as u32, ALLOW);
    assert!(refusal_of(&[eperm]).unwrap().contains("on clone3,"));
    // rseq registration may fail: glibc goes on without it.
    let rseq = one_call(libc::SYS_rseq, ERRNO | libc::EINVAL as u32, ALLOW);
    assert_eq!(refusal_of(&[rseq]), None);
}

#[test]
fn the_worst_action_of_every_filter_and_call_is_the_one_named() {
    let eperm_socket = one_call(libc::SYS_socket, ERRNO | libc::EPERM as u32, ALLOW);
    let kill_thread_on_bind = one_call(libc::SYS_bind, 0, ALLOW);
    let message = refusal_of(&[eperm_socket.clone(), kill_thread_on_bind]).unwrap();
    assert!(
        message.contains("kill the calling thread (SECCOMP_RET_KILL_THREAD) on bind,"),
        "{message}"
    );
    let message = refusal_of(&[eperm_socket, kill_exec()]).unwrap();
    assert!(
        message.contains("(SECCOMP_RET_KILL_PROCESS) on mmap"),
        "{message}"
    );
}

#[test]
fn a_filter_that_cannot_be_run_is_an_error() {
    let out_of_range = vec![stmt(0x20, 64), stmt(0x06, ALLOW)];
    assert!(judge(&[out_of_range]).is_err());
}

#[test]
fn every_call_is_listed_once_with_its_arguments() {
    for (index, call) in SYSCALLS.iter().enumerate() {
        let twin = SYSCALLS[index + 1..]
            .iter()
            .find(|other| other.nr == call.nr && other.args == call.args);
        assert!(twin.is_none(), "{} is listed twice: {call:?}", call.name);
        let same_name = SYSCALLS.iter().find(|other| other.nr == call.nr).unwrap();
        assert_eq!(same_name.name, call.name, "one number, two names");
    }
    let numbers = agent_syscalls();
    assert!(numbers.windows(2).all(|pair| pair[0] < pair[1]));
    assert!(numbers.contains(&libc::SYS_mmap) && numbers.contains(&libc::SYS_socket));
}
