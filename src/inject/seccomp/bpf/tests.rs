//! The interpreter on hand-assembled programs, each checked against what the kernel
//! would do with it.

use super::*;

const KILL_PROCESS: u32 = 0x8000_0000;
const TRAP: u32 = 0x0003_0000;
const ERRNO: u32 = 0x0005_0000;
const LOG: u32 = 0x7ffc_0000;
const ALLOW: u32 = 0x7fff_0000;

const LD_ABS: u16 = 0x20;
const LD_IMM: u16 = 0x00;
const LD_MEM: u16 = 0x60;
const LDX_IMM: u16 = 0x01;
const LDX_MEM: u16 = 0x61;
const ST_: u16 = 0x02;
const STX_: u16 = 0x03;
const JA: u16 = 0x05;
const JEQ_K: u16 = 0x15;
const JGT_K: u16 = 0x25;
const JGE_X: u16 = 0x3d;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const RET_A_: u16 = 0x16;
const AND_K: u16 = 0x54;
const OR_K: u16 = 0x44;
const XOR_X: u16 = 0xac;
const MOD_K: u16 = 0x94;
const DIV_X: u16 = 0x3c;
const NEG: u16 = 0x84;
const TAX: u16 = 0x07;
const TXA_: u16 = 0x87;

const SYS_MMAP: u32 = 9;
const SYS_MPROTECT: u32 = 10;
const SYS_SOCKET: u32 = 41;
const PROT_READ: u64 = 1;
const PROT_EXEC: u64 = 4;
const ARG2_LOW: u32 = 16 + 2 * 8;

fn call(nr: i32, args: [u64; 6]) -> SeccompData {
    SeccompData {
        nr,
        arch: AUDIT_ARCH_X86_64,
        instruction_pointer: 0,
        args,
    }
}

fn stmt(code: u16, k: u32) -> Instruction {
    Instruction::statement(code, k)
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Instruction {
    Instruction::jump(code, k, jt, jf)
}

/// The fixture's `kill-exec` filter: an arch check, then KILL_PROCESS for mmap and
/// mprotect whose third argument has PROT_EXEC.
fn kill_exec() -> Vec<Instruction> {
    vec![
        stmt(LD_ABS, 4),
        jump(JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(RET_K, KILL_PROCESS),
        stmt(LD_ABS, 0),
        jump(JEQ_K, SYS_MMAP, 1, 0),
        jump(JEQ_K, SYS_MPROTECT, 0, 3),
        stmt(LD_ABS, ARG2_LOW),
        jump(JSET_K, PROT_EXEC as u32, 0, 1),
        stmt(RET_K, KILL_PROCESS),
        stmt(RET_K, ALLOW),
    ]
}

#[test]
fn jset_on_an_argument_tells_executable_mappings_apart() {
    let program = kill_exec();
    let mmap = |prot| call(SYS_MMAP as i32, [0, 4096, prot, 0x802, 3, 0]);
    assert_eq!(
        run(&program, &mmap(PROT_READ | PROT_EXEC)),
        Ok(KILL_PROCESS)
    );
    assert_eq!(run(&program, &mmap(PROT_READ)), Ok(ALLOW));
    let mprotect = call(SYS_MPROTECT as i32, [0, 4096, 7, 0, 0, 0]);
    assert_eq!(run(&program, &mprotect), Ok(KILL_PROCESS));
    // PROT_EXEC in the high half of the argument is not what the filter tests.
    assert_eq!(run(&program, &mmap(PROT_EXEC << 32)), Ok(ALLOW));
    assert_eq!(
        run(&program, &call(SYS_SOCKET as i32, [1, 0, 0, 0, 0, 0])),
        Ok(ALLOW)
    );
}

#[test]
fn a_filter_that_checks_the_architecture_sees_x86_64() {
    let program = kill_exec();
    let mut read = call(0, [0; 6]);
    assert_eq!(run(&program, &read), Ok(ALLOW));
    read.arch = 0x4000_0003; // AUDIT_ARCH_I386
    assert_eq!(run(&program, &read), Ok(KILL_PROCESS));
}

#[test]
fn ret_a_returns_a_computed_errno() {
    // ERRNO with the low 16 bits of args[0] as the errno.
    let program = [
        stmt(LD_ABS, 16),
        stmt(AND_K, 0xffff),
        stmt(OR_K, ERRNO),
        stmt(RET_A_, 0),
    ];
    let result = run(&program, &call(1, [0x1_0000_000d, 0, 0, 0, 0, 0])).unwrap();
    assert_eq!(result, ERRNO | 13);
    assert_eq!(Action::of(result), Action::Errno(13));
    // The kernel cuts an errno above 4095 down to 4095.
    assert_eq!(Action::of(ERRNO | 0xffff), Action::Errno(4095));
}

#[test]
fn the_high_half_of_an_argument_is_the_next_word() {
    let program = [
        stmt(LD_ABS, 16 + 4),
        jump(JEQ_K, 0xdead_beef, 0, 1),
        stmt(RET_K, TRAP),
        stmt(RET_K, ALLOW),
    ];
    let data = |arg| call(1, [arg, 0, 0, 0, 0, 0]);
    assert_eq!(run(&program, &data(0xdead_beef_0000_0000)), Ok(TRAP));
    assert_eq!(run(&program, &data(0xdead_beef)), Ok(ALLOW));
}

#[test]
fn loads_outside_the_data_are_errors() {
    let read = call(0, [0; 6]);
    let load = |offset| [stmt(LD_ABS, offset), stmt(RET_K, ALLOW)];
    assert_eq!(
        run(&load(64), &read),
        Err(BpfError::LoadOutOfRange { pc: 0, offset: 64 })
    );
    assert_eq!(
        run(&load(u32::MAX - 1), &read),
        Err(BpfError::LoadOutOfRange {
            pc: 0,
            offset: u32::MAX - 1
        })
    );
    // Misaligned.
    assert_eq!(
        run(&load(2), &read),
        Err(BpfError::LoadOutOfRange { pc: 0, offset: 2 })
    );
    assert_eq!(run(&load(60), &read), Ok(ALLOW));
    // A byte-sized load is not one seccomp allows.
    assert_eq!(
        run(&[stmt(0x30, 0), stmt(RET_K, ALLOW)], &read),
        Err(BpfError::Unsupported { pc: 0, code: 0x30 })
    );
    assert_eq!(
        run(&[stmt(LD_MEM, 16), stmt(RET_K, ALLOW)], &read),
        Err(BpfError::ScratchOutOfRange { pc: 0, index: 16 })
    );
}

#[test]
fn jumps_past_the_end_and_programs_without_a_return_are_errors() {
    let read = call(0, [0; 6]);
    assert_eq!(
        run(&[stmt(JA, 1), stmt(RET_K, ALLOW)], &read),
        Err(BpfError::JumpOutOfRange { pc: 0 })
    );
    assert_eq!(
        run(&[jump(JEQ_K, 0, 2, 0), stmt(RET_K, ALLOW)], &read),
        Err(BpfError::JumpOutOfRange { pc: 0 })
    );
    assert_eq!(
        run(&[stmt(JA, u32::MAX), stmt(RET_K, ALLOW)], &read),
        Err(BpfError::JumpOutOfRange { pc: 0 })
    );
    assert_eq!(run(&[stmt(LD_IMM, 1)], &read), Err(BpfError::NoReturn));
    assert_eq!(run(&[], &read), Err(BpfError::NoReturn));
    // A taken jump to the last instruction is fine.
    assert_eq!(
        run(
            &[jump(JEQ_K, 0, 1, 0), stmt(RET_K, TRAP), stmt(RET_K, LOG)],
            &read
        ),
        Ok(LOG)
    );
}

#[test]
fn the_alu_scratch_words_and_register_moves_compute_as_the_kernel_does() {
    let read = call(0, [0; 6]);
    // A = 7; M[3] = A; X = 5; M[4] = X; A = -A; A ^= X; X = A; A = M[3]; A %= 4;
    // then A must be 3, X must be (-7 ^ 5), and M[4] 5.
    let program = [
        stmt(LD_IMM, 7),
        stmt(ST_, 3),
        stmt(LDX_IMM, 5),
        stmt(STX_, 4),
        stmt(NEG, 0),
        stmt(XOR_X, 0),
        stmt(TAX, 0),
        stmt(LD_MEM, 3),
        stmt(MOD_K, 4),
        jump(JEQ_K, 3, 0, 4),
        stmt(TXA_, 0),
        jump(JEQ_K, 7u32.wrapping_neg() ^ 5, 0, 2),
        stmt(LDX_MEM, 4),
        jump(JGE_X, 0, 1, 0), // A >= X: (-7 ^ 5) is far above 5
        stmt(RET_K, KILL_PROCESS),
        stmt(RET_K, ALLOW),
    ];
    assert_eq!(run(&program, &read), Ok(ALLOW));
    // Dividing by an X of 0 ends the program with 0, which is KILL_THREAD.
    let divide = [
        stmt(LD_IMM, 9),
        stmt(LDX_IMM, 0),
        stmt(DIV_X, 0),
        stmt(RET_K, ALLOW),
    ];
    assert_eq!(run(&divide, &read), Ok(0));
    assert_eq!(Action::of(0), Action::KillThread);
    assert_eq!(
        run(&[stmt(MOD_K, 0), stmt(RET_K, ALLOW)], &read),
        Err(BpfError::DivisionByZero { pc: 0 })
    );
    // Unsigned comparisons.
    let above = [jump(JGT_K, 1, 0, 1), stmt(RET_K, TRAP), stmt(RET_K, ALLOW)];
    assert_eq!(run(&above, &call(-1, [0; 6])), Ok(ALLOW));
    let above = [
        stmt(LD_ABS, 0),
        jump(JGT_K, 1, 0, 1),
        stmt(RET_K, TRAP),
        stmt(RET_K, ALLOW),
    ];
    assert_eq!(run(&above, &call(-1, [0; 6])), Ok(TRAP));
}

#[test]
fn filters_combine_by_the_kernels_precedence_newest_first_on_ties() {
    assert_eq!(combine([]), ALLOW);
    assert_eq!(combine([ALLOW, ERRNO | 1, TRAP]), TRAP);
    assert_eq!(combine([LOG, KILL_PROCESS, 0]), KILL_PROCESS);
    assert_eq!(combine([LOG, 0]), 0);
    assert_eq!(combine([ERRNO | 1, ERRNO | 2]), ERRNO | 1);
    assert_eq!(combine([LOG, ALLOW]), LOG);
    assert_eq!(combine([0x7ff0_0000, 0x7fc0_0000]), 0x7fc0_0000);
    assert_eq!(Action::of(0x0001_0000), Action::Unknown(0x0001_0000));
}
