//! The agent's control channel under load and after damage: many connections (clean,
//! concurrent beyond the session limit, garbage, silent) leave no threads or mappings
//! behind in the target, a connection beyond the limit is refused with the reason, a
//! connection that never says hello is closed, and a deleted socket is recreated.

use crate::common;

use common::{Target, tendril};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tendril_wire::{PROTOCOL_VERSION, Request, Response};

/// The most sessions the agent serves at once.
const MAX_SESSIONS: usize = 8;
/// What the agent's refusal of a connection beyond the limit says.
const REFUSAL: &str = "the agent already serves 8 sessions";
/// How long the agent may take to settle (join ended sessions, close silent ones).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one answer from the agent may take on a loaded machine.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// The agent's control socket in `pid` (a fixture running as this test's user).
fn socket_of(pid: i32) -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    tendril_wire::control_socket_path(uid, pid)
}

fn connect(pid: i32) -> UnixStream {
    let stream = UnixStream::connect(socket_of(pid)).expect("cannot connect to the agent");
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
    stream
}

/// Reads one answer line; `None` at end of stream.
fn read_answer(stream: &UnixStream) -> Option<Response> {
    let mut line = Vec::new();
    match BufReader::new(stream).read_until(b'\n', &mut line) {
        Ok(0) => None,
        Ok(_) => Some(tendril_wire::decode(&line).expect("the agent sent a malformed line")),
        Err(e) => panic!("no answer from the agent within {ANSWER_TIMEOUT:?}: {e}"),
    }
}

/// Connects and says hello; the agent's answer (Ready, or an Error refusing it).
fn open_session(pid: i32) -> (UnixStream, Response) {
    let mut stream = connect(pid);
    let hello = tendril_wire::encode(&Request::Hello {
        version: PROTOCOL_VERSION.into(),
    });
    // A refused connection may be closed before the hello arrives; its answer waits.
    let _ = stream.write_all(&hello);
    let answer = read_answer(&stream).expect("the agent closed the connection without an answer");
    (stream, answer)
}

/// Runs `tendril <args>`: (success, stdout, stderr).
fn run_tendril(args: &[&str]) -> (bool, String, String) {
    let output = tendril().args(args).output().expect("cannot run tendril");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn status_ok(pid: i32) {
    let (ok, stdout, stderr) = run_tendril(&["status", &pid.to_string()]);
    assert!(ok, "status {pid} failed: {stderr}");
    assert!(
        stdout.starts_with(&format!("agent ready: pid={pid} ")),
        "unexpected status output: {stdout:?}"
    );
}

fn thread_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

fn mapping_count(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .count()
}

/// Waits until `pid` has `expected` threads; panics with the count seen if it does not
/// within `SETTLE_TIMEOUT`.
fn wait_for_thread_count(pid: i32, expected: usize, context: &str) {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let count = thread_count(pid);
        if count == expected {
            return;
        }
        if Instant::now() >= deadline {
            let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .unwrap()
                .flatten()
                .map(|task| {
                    std::fs::read_to_string(task.path().join("comm"))
                        .unwrap_or_default()
                        .trim()
                        .to_string()
                })
                .collect();
            panic!("{context}: {count} threads, expected {expected}: {names:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fixture with the agent loaded and idle: (target, its own threads, its checksum).
fn target_with_agent() -> (Target, usize, u64) {
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    let checksum = target.steady_checksum(3, ANSWER_TIMEOUT);
    let own_threads = thread_count(pid);
    status_ok(pid);
    // The agent's one fixed thread: its control thread.
    wait_for_thread_count(pid, own_threads + 1, "after the first status");
    (target, own_threads, checksum)
}

#[test]
fn a_thousand_connections_leave_no_threads_or_mappings_behind() {
    let (mut target, own_threads, checksum) = target_with_agent();
    let pid = target.pid();
    let mappings_before = mapping_count(pid);
    let mut connections = 0;

    // 20 rounds of 12 sessions at once, beyond the limit: each is served or refused.
    for round in 0..20 {
        let together = Arc::new(Barrier::new(12));
        let clients: Vec<_> = (0..12)
            .map(|_| {
                let together = Arc::clone(&together);
                std::thread::spawn(move || {
                    let (stream, answer) = open_session(pid);
                    // Everyone holds its connection until all have their answers.
                    together.wait();
                    drop(stream);
                    answer
                })
            })
            .collect();
        let answers: Vec<Response> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        let served = answers
            .iter()
            .filter(|a| matches!(a, Response::Ready { .. }))
            .count();
        assert!(
            served <= MAX_SESSIONS,
            "round {round}: {served} served at once"
        );
        for answer in &answers {
            match answer {
                Response::Ready { .. } => {}
                Response::Error { message } => {
                    assert!(message.contains(REFUSAL), "round {round}: {message}")
                }
                other => panic!("round {round}: unexpected answer {other:?}"),
            }
        }
        connections += 12;
    }

    // 200 connections that misbehave: garbage lines, requests before hello, bytes with
    // no line end, and nothing at all.
    for i in 0..200 {
        let mut stream = connect(pid);
        match i % 4 {
            0 => {
                stream.write_all(b"garbage\n").unwrap();
                assert!(
                    matches!(read_answer(&stream), Some(Response::Error { .. })),
                    "garbage must be answered with an error"
                );
            }
            1 => {
                stream
                    .write_all(&tendril_wire::encode(&Request::Detach))
                    .unwrap();
                assert!(matches!(read_answer(&stream), Some(Response::Error { .. })));
            }
            2 => stream.write_all(&[0xff; 100]).unwrap(),
            _ => {}
        }
        connections += 1;
    }

    // The rest: clean sessions, one after another.
    // A session the client closed ends when the agent's thread for it reads the end:
    // on a busy machine, the next may come first and find the earlier ones still in
    // their slots. So a refusal is tried again until they are gone (and only then
    // counted as a failure).
    while connections < 1000 {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        let answer = loop {
            let (_, answer) = open_session(pid);
            let refused =
                matches!(&answer, Response::Error { message } if message.contains(REFUSAL));
            if !refused || Instant::now() > deadline {
                break answer;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            matches!(answer, Response::Ready { .. }),
            "a lone session was not served: {answer:?}"
        );
        connections += 1;
    }

    wait_for_thread_count(pid, own_threads + 1, "after 1,000 connections");
    let mappings_after = mapping_count(pid);
    // Freed thread stacks may stay cached by glibc (40 MiB at most), a few dozen maps.
    assert!(
        mappings_after <= mappings_before + 64,
        "mappings grew from {mappings_before} to {mappings_after}"
    );
    assert_eq!(
        target.steady_checksum(3, ANSWER_TIMEOUT),
        checksum,
        "the target computes differently after the connections"
    );
    status_ok(pid);
}

#[test]
fn a_ninth_concurrent_session_is_refused_with_the_reason() {
    let (target, own_threads, _) = target_with_agent();
    let pid = target.pid();
    let mut sessions: Vec<UnixStream> = (0..MAX_SESSIONS)
        .map(|i| match open_session(pid) {
            (stream, Response::Ready { .. }) => stream,
            (_, other) => panic!("session {i} was not served: {other:?}"),
        })
        .collect();

    // A ninth connection gets one error line, unasked, and is closed.
    let ninth = connect(pid);
    match read_answer(&ninth) {
        Some(Response::Error { message }) => {
            assert!(message.contains(REFUSAL), "{message}");
            assert!(
                message.contains(&std::process::id().to_string()),
                "the refusal names the connected processes: {message}"
            );
        }
        other => panic!("the ninth connection got {other:?}"),
    }
    assert!(
        read_answer(&ninth).is_none(),
        "the refused connection stays open"
    );

    // tendril itself prints the reason as its one-line error.
    let (ok, _, stderr) = run_tendril(&["status", &pid.to_string()]);
    assert!(!ok, "a ninth session was served");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.contains(REFUSAL), "{stderr}");
    assert!(stderr.contains("try again"), "{stderr}");

    // Once one session ends, a new one is served.
    drop(sessions.pop());
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let (ok, _, stderr) = run_tendril(&["status", &pid.to_string()]);
        if ok {
            break;
        }
        assert!(stderr.contains(REFUSAL), "{stderr}");
        assert!(
            Instant::now() < deadline,
            "still refused after a session ended: {stderr}"
        );
    }
    drop(sessions);
    wait_for_thread_count(pid, own_threads + 1, "after the sessions ended");
}

#[test]
fn connections_that_never_say_hello_are_closed() {
    let (target, own_threads, _) = target_with_agent();
    let pid = target.pid();
    let silent: Vec<UnixStream> = (0..MAX_SESSIONS).map(|_| connect(pid)).collect();
    for mut stream in silent {
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => {}
            Ok(_) => panic!("the agent spoke unasked to a silent connection"),
            Err(e) => panic!("a silent connection was not closed within {ANSWER_TIMEOUT:?}: {e}"),
        }
    }
    status_ok(pid);
    wait_for_thread_count(pid, own_threads + 1, "after the silent connections");
}

#[test]
fn a_deleted_socket_is_recreated_and_status_works() {
    let (mut target, own_threads, checksum) = target_with_agent();
    let pid = target.pid();
    let socket = socket_of(pid);
    std::fs::remove_file(&socket).unwrap();
    status_ok(pid);
    assert!(socket.exists(), "the socket was not recreated");
    status_ok(pid);
    wait_for_thread_count(pid, own_threads + 1, "after the socket came back");
    assert_eq!(target.steady_checksum(3, ANSWER_TIMEOUT), checksum);
}

#[test]
fn an_agent_that_cannot_recreate_its_socket_is_reported_as_such() {
    let (target, _, _) = target_with_agent();
    let pid = target.pid();
    let socket = socket_of(pid);
    // A directory in the socket's place: the agent cannot bind there. (The agent may
    // bind a new socket between the two steps; then they are done again.)
    loop {
        std::fs::remove_file(&socket).unwrap();
        match std::fs::create_dir(&socket) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot create {}: {e}", socket.display()),
        }
    }
    let (ok, _, stderr) = run_tendril(&["status", &pid.to_string()]);
    let _ = std::fs::remove_dir(&socket);
    assert!(!ok, "status succeeded without a socket");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(
        stderr.contains("cannot be reached") && stderr.contains("control socket"),
        "{stderr}"
    );
    assert!(!stderr.contains("did not start"), "{stderr}");
    // With the way clear again, the agent binds its socket and answers.
    status_ok(pid);
}
