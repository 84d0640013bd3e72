//! The fixture programs and the test harness themselves: every fixture builds and behaves
//! as its header comment says, and the harness's checks see what they should.

use crate::common;

use std::fs;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{FIXTURE_NAMES, Target, code_bytes_match_file, fixture, tendril};
use goblin::elf::Elf;

const LINE_TIMEOUT: Duration = Duration::from_secs(10);

fn read_elf(path: &Path, check: impl FnOnce(&Elf)) {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let elf = Elf::parse(&bytes).unwrap_or_else(|e| panic!("{} is not ELF: {e}", path.display()));
    check(&elf);
}

/// Runs a fixture to completion (its ROUNDS argument makes it stop) and returns stdout.
fn run_to_end(name: &str, args: &[&str]) -> String {
    let output = Command::new(fixture(name))
        .args(args)
        .output()
        .expect("cannot run the fixture");
    assert!(
        output.status.success(),
        "{name} {args:?} failed: {}",
        output.status
    );
    assert!(
        output.stderr.is_empty(),
        "{name} {args:?} wrote to stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the output is UTF-8")
}

/// The numbers after `checksum` on the output's `round` lines.
fn checksums(output: &str) -> Vec<u64> {
    output
        .lines()
        .filter_map(common::Round::parse)
        .filter_map(|r| r.get("checksum"))
        .collect()
}

fn assert_all_equal(values: &[u64], what: &str) {
    assert!(
        values.windows(2).all(|w| w[0] == w[1]),
        "{what} differ: {values:?}"
    );
}

#[test]
fn every_fixture_builds_into_an_executable() {
    let go = common::have_go("building the Go fixtures");
    for name in FIXTURE_NAMES.iter().filter(|n| go || !n.starts_with("go_")) {
        let path = fixture(name);
        let mode = fs::metadata(&path)
            .expect("the fixture exists")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o555,
            0o555,
            "{} is not readable and executable by all",
            path.display()
        );
    }
}

#[test]
fn the_go_fixtures_have_go_s_table_and_no_eh_frame_for_go_code() {
    if !common::have_go("the_go_fixtures_have_go_s_table_and_no_eh_frame_for_go_code") {
        return;
    }
    let sections = |elf: &Elf| -> Vec<String> {
        elf.section_headers
            .iter()
            .filter_map(|h| elf.shdr_strtab.get_at(h.sh_name).map(str::to_string))
            .collect()
    };
    read_elf(&fixture("go_leaf"), |elf| {
        let names = sections(elf);
        assert!(names.iter().any(|n| n == ".gopclntab"), "{names:?}");
        assert!(!names.iter().any(|n| n == ".eh_frame"), "{names:?}");
        assert!(elf.interpreter.is_none(), "go_leaf is static");
        assert!(
            elf.syms
                .iter()
                .any(|s| elf.strtab.get_at(s.st_name) == Some("main.leaf"))
        );
    });
    read_elf(&fixture("go_leaf_stripped"), |elf| {
        assert!(elf.syms.is_empty(), "go_leaf_stripped still has a .symtab");
        assert!(sections(elf).iter().any(|n| n == ".gopclntab"));
    });
    read_elf(&fixture("go_cgo"), |elf| {
        assert!(elf.interpreter.is_some(), "go_cgo is dynamically linked");
        assert!(sections(elf).iter().any(|n| n == ".gopclntab"));
    });
}

#[test]
fn go_cgo_computes_the_same_checksums_every_time() {
    if !common::have_go("go_cgo_computes_the_same_checksums_every_time") {
        return;
    }
    let mut target = Target::spawn("go_cgo", &[]);
    let mut lines = Vec::new();
    for _ in 0..2 {
        target.write_stdin("work 1000\ncallback 10\n");
        lines.push(target.expect_line("counted ", LINE_TIMEOUT));
        lines.push(target.expect_line("called ", LINE_TIMEOUT));
    }
    assert!(lines[0].starts_with("counted c_work=1000 getppid=1000 checksum="));
    assert!(lines[1].starts_with("called back=10 checksum="));
    assert_eq!(lines[0], lines[2]);
    assert_eq!(lines[1], lines[3]);
}

#[test]
fn the_tendril_binary_is_built() {
    assert!(Path::new(tendril().get_program()).is_file());
}

#[test]
fn calltree_prints_the_same_checksum_every_round() {
    let mut target = Target::spawn("calltree", &["3"]);
    let expected = format!("ready pid={} threads=3", target.pid());
    assert_eq!(target.ready_line(), Some(expected.as_str()));

    let sums = target.checksum_lines(3, LINE_TIMEOUT);
    assert_all_equal(&sums, "calltree checksums");
}

#[test]
fn calltree_checksums_repeat_across_runs_and_after_strip() {
    let first = run_to_end("calltree", &["2", "3"]);
    let second = run_to_end("calltree", &["2", "3"]);
    let stripped = run_to_end("calltree_stripped", &["2", "3"]);

    let sums = checksums(&first);
    assert_eq!(sums.len(), 3, "calltree 2 3 printed:\n{first}");
    assert_all_equal(&sums, "calltree checksums");
    assert_eq!(checksums(&second), sums);
    assert_eq!(checksums(&stripped), sums);
    assert_ne!(
        checksums(&run_to_end("calltree", &["1", "1"])),
        sums,
        "THREADS should matter"
    );
}

#[test]
fn calltree_stripped_has_no_symbol_table_but_keeps_eh_frame() {
    read_elf(&fixture("calltree"), |elf| {
        assert!(
            elf.syms
                .iter()
                .any(|s| elf.strtab.get_at(s.st_name) == Some("work_round"))
        );
    });
    read_elf(&fixture("calltree_stripped"), |elf| {
        assert!(elf.syms.is_empty(), "calltree_stripped still has a .symtab");
        let names: Vec<_> = elf
            .section_headers
            .iter()
            .filter_map(|s| elf.shdr_strtab.get_at(s.sh_name))
            .collect();
        assert!(names.contains(&".eh_frame"), "no .eh_frame in {names:?}");
    });
}

#[test]
fn calltree_runs_the_counted_workload_on_sigusr1() {
    let mut target = Target::spawn("calltree", &["2"]);
    for _ in 0..2 {
        target.signal(libc::SIGUSR1);
        let line = target.expect_line("counted", LINE_TIMEOUT);
        assert_eq!(line, "counted outer=1 inner=1000 leaf=2000");
    }
    // The round lines passed over while waiting are still there.
    assert_all_equal(
        &target.checksum_lines(2, LINE_TIMEOUT),
        "calltree checksums",
    );
}

#[test]
fn exceptions_are_thrown_and_caught_the_same_way_every_round() {
    let mut target = Target::spawn("exceptions", &["2"]);
    let rounds = target.rounds(3, LINE_TIMEOUT);
    for round in &rounds {
        assert_eq!(round.get("thrown"), Some(2 * 358), "{round:?}");
        assert_eq!(round.get("caught"), round.get("thrown"), "{round:?}");
    }
    let sums: Vec<u64> = rounds.iter().filter_map(|r| r.get("checksum")).collect();
    assert_eq!(sums.len(), 3);
    assert_all_equal(&sums, "exceptions checksums");
}

#[test]
fn exceptions_runs_on_the_main_thread_alone_by_default() {
    let target = Target::spawn("exceptions", &[]);
    let expected = format!("ready pid={} threads=1", target.pid());
    assert_eq!(target.ready_line(), Some(expected.as_str()));
    let tasks = fs::read_dir(format!("/proc/{}/task", target.pid())).expect("the task list");
    assert_eq!(tasks.count(), 1);
}

#[test]
fn rust_panics_are_caught_the_same_way_every_round_with_a_quiet_stderr() {
    let output = run_to_end("rust_panics", &["2", "3"]);
    let rounds: Vec<_> = output.lines().filter_map(common::Round::parse).collect();
    assert_eq!(rounds.len(), 3, "rust_panics 2 3 printed:\n{output}");
    assert!(
        rounds.iter().all(|r| r.get("panics") == Some(2 * 143)),
        "{rounds:?}"
    );
    assert_all_equal(&checksums(&output), "rust_panics checksums");
    assert_eq!(
        checksums(&output),
        checksums(&run_to_end("rust_panics", &["2", "3"]))
    );
}

/// The name and system call number (-1 if none) of every thread of process `pid`.
fn thread_syscalls(pid: i32) -> Vec<(String, i64)> {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).expect("the task list");
    let mut threads: Vec<(String, i64)> = tasks
        .map(|task| {
            let task = task.expect("a task entry").path();
            let comm = fs::read_to_string(task.join("comm")).unwrap_or_default();
            // "running", "-1 <sp> <pc>" outside a system call, or "<nr> <args>... <sp> <pc>"
            let syscall = fs::read_to_string(task.join("syscall")).unwrap_or_default();
            let number = syscall
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok());
            (comm.trim().to_string(), number.unwrap_or(-1))
        })
        .collect();
    threads.sort();
    threads
}

#[test]
fn blocked_threads_sit_in_system_calls_and_the_reader_echoes_stdin() {
    let mut target = Target::spawn("blocked", &[]);
    // "ready" promises the three blocking threads; the main thread is on its way to
    // pthread_join, so give it a moment.
    let mut threads = thread_syscalls(target.pid());
    for _ in 0..100 {
        if threads.iter().all(|&(_, number)| number >= 0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        threads = thread_syscalls(target.pid());
    }
    let names: Vec<&str> = threads.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["blocked", "poller", "reader", "sleeper"]);
    assert!(
        threads.iter().all(|&(_, number)| number >= 0),
        "not all in system calls: {threads:?}"
    );

    target.write_stdin("hello\n");
    assert_eq!(
        target.next_line(LINE_TIMEOUT).as_deref(),
        Some("got: hello")
    );
    target.write_stdin("two ");
    target.write_stdin("parts\n");
    assert_eq!(
        target.next_line(LINE_TIMEOUT).as_deref(),
        Some("got: two parts")
    );
    target.close_stdin();
    assert_eq!(target.next_line(LINE_TIMEOUT).as_deref(), Some("eof"));
    let status = target
        .wait_exit(LINE_TIMEOUT)
        .expect("blocked exits after eof");
    assert!(status.success(), "{status}");
}

/// Each thread's name and `SigBlk` mask (`/proc/PID/task/TID/status`), sorted by name.
fn thread_masks(pid: i32) -> Vec<(String, u64)> {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).expect("the task list");
    let mut threads: Vec<(String, u64)> = tasks
        .map(|task| {
            let task = task.expect("a task entry").path();
            let comm = fs::read_to_string(task.join("comm")).unwrap_or_default();
            let status = fs::read_to_string(task.join("status")).unwrap_or_default();
            let mask = status
                .lines()
                .find_map(|line| line.strip_prefix("SigBlk:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .expect("a SigBlk line");
            (comm.trim().to_string(), mask)
        })
        .collect();
    threads.sort();
    threads
}

#[test]
fn signal_blocking_threads_block_every_signal_and_count_their_own_calls() {
    // Every signal but SIGKILL and SIGSTOP; SIGUSR2 is bit 11.
    const EVERY: u64 = 0xffff_ffff_fffb_feff;
    const SIGUSR2: u64 = 1 << 11;
    let mut target = Target::spawn("signal_blocking", &["2"]);
    assert_eq!(
        target.ready_line().unwrap(),
        format!("ready pid={} callers=4", target.pid())
    );
    assert_eq!(
        thread_masks(target.pid()),
        [
            ("jemalloc_bg_thd".to_string(), EVERY),
            ("masked_busy".to_string(), EVERY),
            ("signal_blocking".to_string(), SIGUSR2),
            // The kernel unblocks the awaited SIGUSR2 while sigwait waits.
            ("sigwaiter".to_string(), EVERY & !SIGUSR2),
            ("worker0".to_string(), SIGUSR2),
            ("worker1".to_string(), SIGUSR2),
        ]
    );
    let sigwaiter = thread_syscalls(target.pid())
        .into_iter()
        .find(|(name, _)| name == "sigwaiter");
    assert_eq!(
        sigwaiter,
        Some(("sigwaiter".to_string(), libc::SYS_rt_sigtimedwait))
    );

    let mut checksums = Vec::new();
    for rounds in [1, 50, 50] {
        target.write_stdin(&format!("round {rounds}\n"));
        let round = &target.rounds(1, LINE_TIMEOUT)[0];
        let calls = 4 * rounds;
        let expected = [
            ("callers", 4),
            ("rounds", rounds),
            ("work_round", calls),
            ("sb_outer", 3 * calls),
            ("sb_inner", 6 * calls),
            ("spin_errors", 0),
        ];
        for (key, value) in expected {
            assert_eq!(round.get(key), Some(value), "{key}: {round:?}");
        }
        checksums.push(round.get("checksum").unwrap());
    }
    assert_ne!(
        checksums[0], checksums[1],
        "the checksum depends on the rounds"
    );
    assert_eq!(checksums[1], checksums[2], "and on nothing else");

    // Only the sigwaiter can take SIGUSR2; without it the signal would end the process.
    target.signal(libc::SIGUSR2);
    assert_eq!(
        target.expect_line("sigwait ", LINE_TIMEOUT),
        "sigwait got 12"
    );
    target.close_stdin();
    assert_eq!(target.expect_line("bye", LINE_TIMEOUT), "bye");
    let status = target.wait_exit(LINE_TIMEOUT).expect("it exits after bye");
    assert!(status.success(), "{status}");
}

#[test]
fn mallocs_keeps_allocating() {
    let mut target = Target::spawn("mallocs", &["2"]);
    for round in target.rounds(3, LINE_TIMEOUT) {
        assert!(round.get("ops").is_some_and(|ops| ops > 0), "{round:?}");
    }
    assert!(target.is_running());
}

#[test]
fn static_loop_is_statically_linked_and_runs() {
    read_elf(&fixture("static_loop"), |elf| {
        assert!(
            elf.interpreter.is_none(),
            "static_loop has a dynamic loader"
        );
        assert!(elf.dynamic.is_none(), "static_loop has a dynamic section");
    });
    let mut target = Target::spawn("static_loop", &[]);
    assert!(target.is_running());
}

#[test]
fn i386_loop_is_a_32_bit_program_that_keeps_running() {
    read_elf(&fixture("i386_loop"), |elf| {
        assert!(!elf.is_64);
        assert_eq!(elf.header.e_machine, goblin::elf::header::EM_386);
    });
    let mut target = Target::spawn_no_ready("i386_loop", &[]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        target.is_running(),
        "i386_loop exited: does this kernel run 32-bit programs?"
    );
}

#[test]
fn spawn_as_user_runs_the_fixture_as_that_user() {
    let target = Target::spawn_as_user("calltree", &["1"], 65534, 65534);
    let status = fs::read_to_string(format!("/proc/{}/status", target.pid())).expect("status");
    let uid_line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("a Uid line");
    assert!(
        uid_line
            .split_whitespace()
            .skip(1)
            .all(|uid| uid == "65534"),
        "{uid_line}"
    );
}

#[test]
fn dropping_a_target_kills_and_reaps_it() {
    let target = Target::spawn("calltree", &["1"]);
    let proc_dir = format!("/proc/{}", target.pid());
    drop(target);
    assert!(!Path::new(&proc_dir).exists(), "{proc_dir} is still there");
}

/// The address of `symbol` in process `pid`, which runs the PIE executable `exe`.
fn symbol_address(pid: i32, exe: &Path, symbol: &str) -> u64 {
    let bytes = fs::read(exe).expect("the executable");
    let elf = Elf::parse(&bytes).expect("ELF");
    let value = elf
        .syms
        .iter()
        .find(|s| elf.strtab.get_at(s.st_name) == Some(symbol))
        .unwrap_or_else(|| panic!("no symbol {symbol}"))
        .st_value;
    // The executable's first mapping (file offset 0) is where its address 0 lands.
    let exe = fs::canonicalize(exe).expect("the executable's path");
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let base = maps
        .lines()
        .find(|line| line.ends_with(exe.to_str().unwrap()))
        .and_then(|line| u64::from_str_radix(line.split('-').next()?, 16).ok())
        .expect("the executable's mapping");
    base + value
}

#[test]
fn code_bytes_match_file_passes_untouched_code_and_catches_a_changed_byte() {
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    code_bytes_match_file(pid).expect("an untouched process matches its files");

    // Change the first byte of counted_leaf, which only runs on SIGUSR1, then put it back.
    let address = symbol_address(pid, &fixture("calltree"), "counted_leaf");
    let mem = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .unwrap();
    let mut original = [0u8];
    mem.read_exact_at(&mut original, address).unwrap();
    mem.write_all_at(&[original[0] ^ 0xff], address).unwrap();

    let error = code_bytes_match_file(pid).expect_err("a changed byte must be found");
    assert!(error.contains("calltree+0x"), "{error}");
    assert!(error.contains(&format!("address {address:#x}")), "{error}");

    mem.write_all_at(&original, address).unwrap();
    code_bytes_match_file(pid).expect("the restored process matches its files again");
    target.signal(libc::SIGUSR1);
    assert_eq!(
        target.expect_line("counted", LINE_TIMEOUT),
        "counted outer=1 inner=1000 leaf=2000"
    );
}

#[test]
fn branches_gives_the_same_checksum_every_round_and_stops_after_its_rounds() {
    let mut target = Target::spawn("branches", &["3"]);
    let checksums = target.checksum_lines(3, LINE_TIMEOUT);
    assert_all_equal(&checksums, "branches' checksums");
    let status = target
        .wait_exit(LINE_TIMEOUT)
        .expect("it exits after 3 rounds");
    assert!(status.success(), "{status:?}");
}
