//! Root profiling another user's process: whatever that user plants in the directories
//! they control (links at tendril's file names, a library of the right length, a link
//! in place of their runtime directory or of the agent's socket, a perf map at a root
//! process's name), root's tendril never writes through it, never loads it, never reads
//! names from it, and never talks to anything but the target. And
//! the agent itself holds out against a connection that sends too much or asks for
//! nonsense.
//!
//! Each test runs fixtures as a dedicated unprivileged user (`tendril-sectest`, made if
//! missing) and tendril as root. The tests share that user's runtime directory, so they
//! take turns (`serial`).

use crate::common;
#[path = "security/namespaces.rs"]
mod namespaces;

use common::{Recording, Target, tendril};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use tendril_wire::{PROTOCOL_VERSION, Request, Response};

const USER: &str = "tendril-sectest";

/// The tests share the user's runtime directory: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The test user's (uid, gid), made if missing.
fn test_user() -> (u32, u32) {
    static USER_IDS: OnceLock<(u32, u32)> = OnceLock::new();
    *USER_IDS.get_or_init(|| {
        let id = |flag: &str| {
            Command::new("id")
                .args([flag, USER])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        };
        if id("-u").is_none() {
            let made = Command::new("useradd")
                .args(["--system", "--no-create-home", "--shell", "/bin/sh", USER])
                .status()
                .expect("cannot run useradd");
            assert!(made.success(), "useradd {USER} failed");
        }
        (id("-u").unwrap(), id("-g").unwrap())
    })
}

/// Runs a shell script as the test user; panics if it fails.
fn as_user(script: &str) {
    let (uid, gid) = test_user();
    let output = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--clear-groups", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "as {USER}: {script}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn runtime_dir() -> PathBuf {
    tendril_wire::runtime_dir(test_user().0)
}

/// A file of root's, with known bytes, that no user may change.
struct Victim {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Victim {
    fn new(what: &str) -> Victim {
        let path = PathBuf::from(format!(
            "/tmp/tendril-sectest-victim-{what}-{}",
            std::process::id()
        ));
        let bytes = format!("root's own {what} file\n").into_bytes();
        let _ = std::fs::remove_file(&path);
        std::fs::write(&path, &bytes).unwrap();
        Victim { path, bytes }
    }

    fn assert_untouched(&self) {
        let meta = std::fs::symlink_metadata(&self.path).unwrap();
        assert_eq!(meta.uid(), 0, "{} was given away", self.path.display());
        assert_eq!(std::fs::read(&self.path).unwrap(), self.bytes);
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn status(pid: i32) -> (bool, String, String) {
    let output = tendril()
        .args(["status", &pid.to_string()])
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn status_ok(pid: i32) {
    let (ok, stdout, stderr) = status(pid);
    assert!(ok, "status {pid} failed: {stderr}");
    assert!(stdout.starts_with("agent ready: "), "{stdout}");
}

/// The agent's mapping in `pid`: (its `map_files` entry, its path).
fn agent_mapping(pid: i32) -> Option<(PathBuf, PathBuf)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .find(|l| l.contains("libtendril_agent") && l.split_whitespace().nth(1) == Some("r-xp"))
        .map(|l| {
            let range = l.split_whitespace().next().unwrap();
            let path = l.split_whitespace().skip(5).collect::<Vec<_>>().join(" ");
            (
                PathBuf::from(format!("/proc/{pid}/map_files/{range}")),
                PathBuf::from(path),
            )
        })
}

/// Asserts the agent `pid` maps is this build's agent in a sealed memfd (no file of
/// any directory); returns its bytes.
fn assert_genuine_agent(pid: i32) -> Vec<u8> {
    let (mapped, path) = agent_mapping(pid).expect("the agent is not loaded");
    let name = format!(
        "/memfd:{} (deleted)",
        tendril::agent_bundle::agent_file_name()
    );
    assert_eq!(
        path,
        PathBuf::from(&name),
        "the agent is not in tendril's memfd"
    );
    let file = std::fs::File::open(&mapped).unwrap();
    // SAFETY: fcntl on an open descriptor, F_GET_SEALS takes no argument.
    let seals = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_GET_SEALS) };
    let sealed = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    assert_eq!(seals & sealed, sealed, "the agent's memfd is not sealed");
    let bytes = std::fs::read(&mapped).unwrap();
    assert!(
        bytes == tendril::agent_bundle::AGENT_BYTES,
        "the mapped agent is not tendril's"
    );
    bytes
}

/// Where tendril used to install its agent (`/tmp/tendril-agent-EUID`): a user may
/// take the name now, since tendril writes no file.
fn old_agent_dir() -> PathBuf {
    PathBuf::from("/tmp/tendril-agent-0")
}

#[test]
fn root_writes_no_file_for_the_agent_whatever_the_user_plants() {
    let _turn = serial();
    let (uid, gid) = test_user();
    let victim = Victim::new("agent");
    let _ = std::fs::remove_dir_all(old_agent_dir());
    let name = tendril::agent_bundle::agent_file_name();
    let dir = runtime_dir();
    // Links at every name an agent file ever had, to a file of root's.
    as_user(&format!(
        "mkdir -p {old} {dir} && chmod 700 {dir} && ln -sf {victim} {old}/{name} && \
         ln -sf {victim} {dir}/{name}",
        old = old_agent_dir().display(),
        dir = dir.display(),
        victim = victim.path.display(),
    ));
    let target = Target::spawn_as_user("calltree", &["1"], uid, gid);
    status_ok(target.pid());
    victim.assert_untouched();
    assert_genuine_agent(target.pid());
    let _ = std::fs::remove_dir_all(old_agent_dir());
    let _ = std::fs::remove_file(dir.join(&name));
}

#[test]
fn a_planted_library_of_the_right_length_is_never_loaded() {
    let _turn = serial();
    let (uid, gid) = test_user();
    // The user's own library, of exactly the agent's length, at every name an agent
    // file ever had.
    let mut fake = tendril::agent_bundle::AGENT_BYTES.to_vec();
    fake[..4].copy_from_slice(b"FAKE");
    let staged = PathBuf::from(format!("/tmp/tendril-sectest-fake-{}", std::process::id()));
    std::fs::write(&staged, &fake).unwrap();
    std::os::unix::fs::chown(&staged, Some(uid), Some(gid)).unwrap();
    let _ = std::fs::remove_dir_all(old_agent_dir());
    let name = tendril::agent_bundle::agent_file_name();
    let dir = runtime_dir();
    as_user(&format!(
        "mkdir -p {old} {dir} && chmod 700 {dir} && cp {staged} {old}/{name} && \
         cp {staged} {dir}/{name}",
        old = old_agent_dir().display(),
        dir = dir.display(),
        staged = staged.display()
    ));
    let _ = std::fs::remove_file(&staged);

    let target = Target::spawn_as_user("calltree", &["1"], uid, gid);
    status_ok(target.pid());
    let _ = std::fs::remove_file(dir.join(&name));
    let _ = std::fs::remove_dir_all(old_agent_dir());
    assert_genuine_agent(target.pid());
}

#[test]
fn a_runtime_directory_replaced_by_a_link_is_refused_and_left_alone() {
    let _turn = serial();
    let (uid, gid) = test_user();
    let victim_dir = PathBuf::from(format!(
        "/tmp/tendril-sectest-victim-dir-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&victim_dir);
    std::fs::create_dir(&victim_dir).unwrap();
    std::fs::write(victim_dir.join("keep"), b"root's").unwrap();
    let before = std::fs::metadata(&victim_dir).unwrap();

    let target = Target::spawn_as_user("calltree", &["1"], uid, gid);
    let dir = runtime_dir();
    as_user(&format!(
        "rm -rf {dir} && ln -s {victim} {dir}",
        dir = dir.display(),
        victim = victim_dir.display()
    ));
    let (ok, stdout, stderr) = status(target.pid());
    as_user(&format!("rm -f {}", dir.display()));
    assert!(
        !ok,
        "status went through a linked runtime directory: {stdout}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("remove it"), "{stderr}");
    let after = std::fs::metadata(&victim_dir).unwrap();
    assert_eq!((after.uid(), after.mode()), (before.uid(), before.mode()));
    let entries: Vec<_> = std::fs::read_dir(&victim_dir).unwrap().flatten().collect();
    assert_eq!(
        entries.len(),
        1,
        "something was made in {}",
        victim_dir.display()
    );
    assert!(
        agent_mapping(target.pid()).is_none(),
        "the agent was loaded anyway"
    );
    std::fs::remove_dir_all(&victim_dir).unwrap();
}

#[test]
fn a_recording_puts_no_file_in_the_users_directories() {
    let _turn = serial();
    let (uid, gid) = test_user();
    let mut target = Target::spawn_as_user("calltree", &["1"], uid, gid);
    let recording = Recording::start(target.pid(), &["--root", "work_round"]);
    // Rounds that began after the hooks went in: work_round ran inside the recording.
    target.drain();
    target.rounds(2, Duration::from_secs(60));
    let mut found = Vec::new();
    for dir in [
        runtime_dir(),
        PathBuf::from(format!("/dev/shm/tendril-{uid}")),
    ] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                // The agent's own socket aside, nothing of this process.
                let ours = name.contains(&format!("-{}-", target.pid()))
                    || name.contains(&format!("-{}.", target.pid()));
                if ours && name != format!("agent-{}.sock", target.pid()) {
                    found.push(dir.join(name));
                }
            }
        }
    }
    let recorded = recording.finish();
    assert!(
        found.is_empty(),
        "a recording left files in the user's directories: {found:?}"
    );
    assert!(
        !recorded.profile.merged.roots.is_empty(),
        "nothing was recorded: {}",
        recorded.stderr
    );
}

#[test]
fn a_link_in_place_of_the_agents_socket_is_never_spoken_to() {
    let _turn = serial();
    let (uid, gid) = test_user();
    let decoy_path = PathBuf::from(format!(
        "/tmp/tendril-sectest-decoy-{}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&decoy_path);
    let decoy = std::os::unix::net::UnixListener::bind(&decoy_path).unwrap();
    std::fs::set_permissions(
        &decoy_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    decoy.set_nonblocking(true).unwrap();

    let target = Target::spawn_as_user("calltree", &["1"], uid, gid);
    // The runtime directory exists (another process of the user's has an agent); the
    // target has none yet, so the attach first tries the socket's name.
    status_ok(Target::spawn_as_user("calltree", &["1"], uid, gid).pid());
    let socket = tendril_wire::control_socket_path(uid, target.pid());
    as_user(&format!(
        "ln -sf {decoy} {socket}",
        decoy = decoy_path.display(),
        socket = socket.display()
    ));
    let (ok, _, stderr) = status(target.pid());
    let _ = std::fs::remove_file(&socket);
    let mut heard = Vec::new();
    if let Ok((mut connection, _)) = decoy.accept() {
        connection.set_nonblocking(true).unwrap();
        let _ = connection.read_to_end(&mut heard);
    }
    let _ = std::fs::remove_file(&decoy_path);
    assert!(
        heard.is_empty(),
        "tendril spoke to the decoy: {}",
        String::from_utf8_lossy(&heard)
    );
    assert!(!ok, "status went through a decoy socket");
    assert!(stderr.contains("not this process's agent"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

/// A greeted raw connection to the agent of `pid` (loaded first), as root.
fn greeted_connection(pid: i32, uid: u32) -> (UnixStream, BufReader<UnixStream>) {
    status_ok(pid);
    let stream = UnixStream::connect(tendril_wire::control_socket_path(uid, pid)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let hello = Request::Hello {
        version: PROTOCOL_VERSION.into(),
    };
    (&stream).write_all(&tendril_wire::encode(&hello)).unwrap();
    match read_response(&mut reader) {
        Some(Response::Ready { .. }) => {}
        other => panic!("no ready: {other:?}"),
    }
    (stream, reader)
}

fn read_response(reader: &mut BufReader<UnixStream>) -> Option<Response> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line).ok()?;
    tendril_wire::decode(&line).ok()
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn an_endless_request_is_refused_without_growing_the_target() {
    let _turn = serial();
    let (uid, gid) = test_user();
    let target = Target::spawn_as_user("calltree", &["1"], uid, gid);
    let (stream, mut reader) = greeted_connection(target.pid(), uid);
    let before = rss_kib(target.pid());
    stream
        .set_write_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut sent = 0usize;
    while sent < 256 << 20 {
        if (&stream).write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    assert!(sent < 256 << 20, "the agent read a 256 MiB line to its end");
    if let Some(answer) = read_response(&mut reader) {
        match answer {
            Response::Error { message } => assert!(message.contains("longer than"), "{message}"),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    drop((stream, reader));
    // The agent still serves, and what the long line cost it is given back.
    let (_fresh, _) = greeted_connection(target.pid(), uid);
    let grown = rss_kib(target.pid()).saturating_sub(before);
    assert!(grown < 8 << 10, "the target grew by {grown} KiB");
}

#[test]
fn the_agent_refuses_a_table_path_and_a_stack_address() {
    let _turn = serial();
    let (uid, gid) = test_user();
    let target = Target::spawn_as_user("calltree", &["1"], uid, gid);
    let (stream, mut reader) = greeted_connection(target.pid(), uid);

    // A request of the old form naming a file: refused, the file left alone.
    let named = Path::new("/tmp").join(format!("tendril-sectest-table-{}", std::process::id()));
    std::fs::write(&named, b"user's file").unwrap();
    std::os::unix::fs::chown(&named, Some(uid), Some(gid)).unwrap();
    let old_form = format!(
        "{{\"request\":\"start_recording\",\"functions_file\":\"{}\",\"discover\":true}}\n",
        named.display()
    );
    (&stream).write_all(old_form.as_bytes()).unwrap();
    let answer = read_response(&mut reader);
    let still_there = std::fs::read(&named).ok();
    let _ = std::fs::remove_file(&named);
    assert!(matches!(answer, Some(Response::Error { .. })), "{answer:?}");
    assert_eq!(still_there.as_deref(), Some(&b"user's file"[..]));

    // A patch target on the stack: refused with the reason, the stack untouched.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", target.pid())).unwrap();
    let stack = maps.lines().find(|l| l.ends_with("[stack]")).unwrap();
    let start = u64::from_str_radix(stack.split('-').next().unwrap(), 16).unwrap();
    let patch = Request::Patch {
        targets: vec![tendril_wire::PatchTarget {
            address: start + 0x100,
            size: 64,
            hook: tendril_wire::Hook::Count,
            module: None,
        }],
        code_ranges: vec![(start + 0x100, 64)],
    };
    (&stream).write_all(&tendril_wire::encode(&patch)).unwrap();
    match read_response(&mut reader) {
        Some(Response::Patched { outcomes }) => {
            let reason = outcomes[0].refused.clone().unwrap_or_default();
            assert!(
                reason.contains("[stack], which is not executable"),
                "{outcomes:?}"
            );
        }
        other => panic!("unexpected answer {other:?}"),
    }
    let mut target = target;
    target.steady_checksum(2, Duration::from_secs(30));
}

/// Samples `pid` until `done` holds of the notes the sampler gave so far and of the
/// profile (names of its merged tree); returns both.
fn sample_until_noted(
    pid: i32,
    done: impl Fn(&[String], &[String]) -> bool,
) -> (Vec<String>, Vec<String>) {
    let mut sampler = tendril::sampling::Sampler::start(pid, Default::default()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut notes = Vec::new();
    loop {
        sampler.poll(Duration::from_millis(50)).unwrap();
        notes.extend(sampler.take_notes());
        let mut names = Vec::new();
        let _ = tendril::profile::walk(&sampler.profile().merged.roots, |step| -> Result<(), ()> {
            if let tendril::profile::Visit::Enter { node, .. } = step {
                names.push(node.name.clone());
            }
            Ok(())
        });
        if done(&notes, &names) {
            return (notes, names);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never done: notes {notes:?}, names {names:?}"
        );
    }
}

#[test]
fn a_perf_map_planted_by_another_user_is_never_read() {
    let _turn = serial();
    let (uid, gid) = test_user();
    // Root's process, which writes no map of its own.
    let target = Target::spawn("jit", &["none"]);
    let pid = target.pid();
    let ready = target.ready_line().unwrap().to_string();
    let address = |key: &str| {
        let word = ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap();
        u64::from_str_radix(word.trim_start_matches("0x"), 16).unwrap()
    };
    let names = PathBuf::from(format!("/tmp/tendril-sectest-names-{}", std::process::id()));
    std::fs::write(
        &names,
        format!(
            "{:x} 15 planted_trampoline\n{:x} 2e planted_function\n",
            address("trampoline="),
            address("function=")
        ),
    )
    .unwrap();
    std::os::unix::fs::chown(&names, Some(uid), Some(gid)).unwrap();
    let map = format!("/tmp/perf-{pid}.map");
    let unnamed = |names: &[String]| names.iter().any(|n| n.starts_with("[jit] 0x"));
    let planted = |names: &[String]| names.iter().any(|n| n.starts_with("planted_"));

    // A link: not followed.
    as_user(&format!("ln -s {} {map}", names.display()));
    let (notes, seen) = sample_until_noted(pid, |notes, names| {
        notes.iter().any(|n| n.contains("symbolic link")) && unnamed(names)
    });
    assert!(
        !planted(&seen),
        "a planted link was followed: {seen:?} {notes:?}"
    );

    // A regular file of the other user: not the process's, not read.
    as_user(&format!("rm -f {map} && cp {} {map}", names.display()));
    let (notes, seen) = sample_until_noted(pid, |notes, names| {
        notes
            .iter()
            .any(|n| n.contains(&format!("belongs to uid {uid}")))
            && unnamed(names)
    });
    assert!(
        !planted(&seen),
        "another user's map was read: {seen:?} {notes:?}"
    );
    let _ = std::fs::remove_file(&map);
    let _ = std::fs::remove_file(&names);
}
