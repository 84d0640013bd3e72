//! Every terminal UI mode ends when its terminal goes away or a signal asks it to, in a
//! bare pseudo-terminal that the test holds itself (issue #17).
//!
//! The one idea: unlike tmux (tests/live_ui.rs), a bare pty answers nothing: no query
//! of the cursor's position, nothing. The test starts `tendril` on the pty's slave side
//! as a session leader with the pty as its controlling terminal, reads the master side
//! on a thread (so tendril never blocks writing), and then closes the master or sends a
//! signal from outside. tendril must exit within a timeout, without spinning, and — when
//! the terminal is still there — give it back: raw mode off, alternate screen left,
//! cursor shown.

use crate::common;

use common::{Target, code_bytes_match_file, tendril};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long tendril may take to draw its first screen (debug builds, a busy machine).
/// How long output written just before an exit may take to reach the reader.
const EXIT_OUTPUT_GRACE: Duration = Duration::from_secs(2);
const DRAW_TIMEOUT: Duration = Duration::from_secs(60);
/// How long tendril may take to exit once its terminal is gone or a signal came.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// The most CPU time a UI may have used in all (a spinning one uses one core).
const MAX_CPU: Duration = Duration::from_secs(5);

/// Switches to the alternate screen: the UI has set the terminal up.
const ENTER_ALTERNATE_SCREEN: &str = "\x1b[?1049h";
/// Leaves it: the terminal is being given back.
const LEAVE_ALTERNATE_SCREEN: &str = "\x1b[?1049l";
const SHOW_CURSOR: &str = "\x1b[?25h";

/// `tendril` running on a pty of the test's own.
struct PtyTendril {
    pid: i32,
    /// A slave descriptor the test keeps, to read the terminal's modes after tendril
    /// exits (the last close of a pty's slave resets them).
    slave: Option<OwnedFd>,
    /// Everything tendril wrote to the terminal.
    output: Arc<Mutex<Vec<u8>>>,
    /// Tells the reader thread to close the master side.
    close_master: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    exited: Option<Exit>,
}

/// How tendril ended.
struct Exit {
    status: i32,
    cpu: Duration,
}

impl PtyTendril {
    fn start(args: &[&str]) -> PtyTendril {
        let mut command = tendril();
        command.args(args);
        PtyTendril::start_command(command)
    }

    /// Runs `command` (which runs tendril) on a new pty.
    fn start_command(mut command: Command) -> PtyTendril {
        let (master, slave) = open_pty();
        command
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave.try_clone().unwrap()));
        // SAFETY: the closure only makes async-signal-safe system calls (setsid, ioctl)
        // between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // Reaped with wait4 (for its CPU time) in `try_wait`, or in Drop.
        #[allow(clippy::zombie_processes)]
        let child = command.spawn().expect("cannot start tendril");
        let output = Arc::new(Mutex::new(Vec::new()));
        let close_master = Arc::new(AtomicBool::new(false));
        let reader = {
            let (output, close_master) = (output.clone(), close_master.clone());
            std::thread::spawn(move || read_master(master, &output, &close_master))
        };
        PtyTendril {
            pid: child.id() as i32,
            slave: Some(slave),
            output,
            close_master,
            reader: Some(reader),
            exited: None,
        }
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits until tendril has written `text`; panics with its output otherwise.
    fn wait_for(&mut self, text: &str) {
        let deadline = Instant::now() + DRAW_TIMEOUT;
        let mut exited_at = None;
        while !self.output().contains(text) {
            // What the process wrote just before it ended may still be on its way
            // through the pty to the reader thread: give it a moment after the exit.
            if let Some(status) = self.try_wait().map(|exit| exit.status)
                && *exited_at.get_or_insert_with(Instant::now) + EXIT_OUTPUT_GRACE < Instant::now()
            {
                panic!(
                    "tendril exited (status {status}) before writing {text:?}; it wrote:\n{:?}",
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "tendril did not write {text:?} within {DRAW_TIMEOUT:?}; it wrote:\n{:?}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Closes the pty's master side (and the test's slave descriptor): the terminal
    /// hangs up, as when its window is closed.
    fn close_terminal(&mut self) {
        self.slave = None;
        self.close_master.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions; `pid` is our child, not yet
        // reaped, so it names no other process.
        assert_eq!(unsafe { libc::kill(self.pid, signal) }, 0);
    }

    /// Reaps tendril if it has exited.
    fn try_wait(&mut self) -> Option<&Exit> {
        if self.exited.is_none() {
            let mut status = 0;
            // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: status and usage are valid for writes; pid is our child.
            let reaped = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut usage) };
            if reaped == self.pid {
                let time = |t: libc::timeval| {
                    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
                };
                self.exited = Some(Exit {
                    status,
                    cpu: time(usage.ru_utime) + time(usage.ru_stime),
                });
            }
        }
        self.exited.as_ref()
    }

    /// Waits for tendril to exit; panics (after killing it) if it does not within
    /// `EXIT_TIMEOUT`, saying how much CPU it was using.
    fn wait_exit(&mut self, after: &str) -> &Exit {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while self.try_wait().is_none() {
            if Instant::now() >= deadline {
                let stat =
                    std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
                self.signal(libc::SIGKILL);
                panic!("tendril went on for {EXIT_TIMEOUT:?} after {after}; its stat: {stat}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let exit = self.exited.as_ref().unwrap();
        assert!(
            exit.cpu < MAX_CPU,
            "tendril used {:?} of CPU: it spun after {after}",
            exit.cpu
        );
        exit
    }

    /// Whether the terminal is in its normal (cooked) mode, as tendril left it.
    fn terminal_is_cooked(&self) -> bool {
        let slave = self.slave.as_ref().expect("the test's slave descriptor");
        // SAFETY: an all-zero termios is a valid value for tcgetattr to overwrite.
        let mut modes: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open and `modes` is valid for writes.
        let got = unsafe { libc::tcgetattr(slave.as_raw_fd(), &mut modes) };
        assert_eq!(got, 0, "tcgetattr: {}", std::io::Error::last_os_error());
        let cooked = libc::ICANON | libc::ECHO;
        modes.c_lflag & cooked == cooked
    }
}

impl Drop for PtyTendril {
    fn drop(&mut self) {
        if self.try_wait().is_none() {
            // SAFETY: as in `signal`: the child leads a session and a process group of
            // its own (setsid), so this names only what the test started.
            unsafe { libc::kill(-self.pid, libc::SIGKILL) };
            self.signal(libc::SIGKILL);
            // SAFETY: as in try_wait; a blocking reap of our own child.
            unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
        }
        self.close_master.store(true, Ordering::SeqCst);
    }
}

/// A new pty, 100×30: (master, slave).
fn open_pty() -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    let size = libc::winsize {
        ws_row: 30,
        ws_col: 100,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes the two descriptors; no name buffer or termios is passed,
    // and `size` is a valid winsize.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
    for fd in [master, slave] {
        // Tendril must not inherit the test's own ends (a master kept open by tendril
        // would never hang up).
        // SAFETY: fcntl on a descriptor just opened.
        let set = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        assert_eq!(set, 0);
    }
    // SAFETY: openpty succeeded, so both are open descriptors owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// Reads the master side into `output` until told to close it (or the slave side is
/// gone for good).
fn read_master(master: OwnedFd, output: &Mutex<Vec<u8>>, close: &AtomicBool) {
    let mut file = File::from(master);
    let mut buffer = [0u8; 4096];
    while !close.load(Ordering::SeqCst) {
        let mut fds = [libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: fds is a valid array of one pollfd.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 20) };
        if ready <= 0 || fds[0].revents & libc::POLLIN == 0 {
            if fds[0].revents & libc::POLLHUP != 0 {
                // No slave open at the moment (between the test's and tendril's).
                std::thread::sleep(Duration::from_millis(20));
            }
            continue;
        }
        match file.read(&mut buffer) {
            Ok(0) | Err(_) => std::thread::sleep(Duration::from_millis(20)),
            Ok(read) => output.lock().unwrap().extend_from_slice(&buffer[..read]),
        }
    }
}

/// A saved profile to view: two functions, written by the test.
fn profile_file(test: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "tendril-terminal-signals-{}-{test}.json",
        std::process::id()
    ));
    let node = |name: &str, children: &str| {
        format!(
            r#"{{"name":"{name}","module":"app","calls":3,"total_ns":3000,"self_ns":1000,"children":[{children}]}}"#
        )
    };
    let tree = node("main", &node("compute", ""));
    let json = format!(
        r#"{{"format":"tendril-profile","version":1,"pid":42,"exe":"/usr/bin/app","roots":["main"],
        "scheme":"B","calibration":{{"tsc_hz":1000000000,"inner_ns":1.0,"outer_ns":2.0}},
        "stats":{{"instrumented_functions":2,"invoked_functions":2,"events":12,"lost_events":0,
        "indirect_call_sites":0,"pause_ns":0}},
        "threads":[{{"tid":42,"name":"app","roots":[{tree}]}}],"merged":{{"roots":[{tree}]}}}}"#
    );
    std::fs::write(&path, json).unwrap();
    path
}

/// `tendril view` on a fresh profile, its first screen drawn.
fn view(test: &str) -> (PtyTendril, std::path::PathBuf) {
    let file = profile_file(test);
    let mut ui = PtyTendril::start(&["view", &file.display().to_string()]);
    ui.wait_for("READ-ONLY");
    (ui, file)
}

/// tendril exited with status 0 after `signal`, and gave the terminal back.
fn assert_signal_ends_view(signal: i32, name: &str) {
    let (mut ui, file) = view(name);
    assert!(!ui.terminal_is_cooked(), "the UI runs in raw mode");
    ui.signal(signal);
    let status = ui.wait_exit(name).status;
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "tendril's wait status after {name}: {status:#x}; it wrote:\n{:?}",
        ui.output()
    );
    // Its last writes may still be on their way through the pty.
    ui.wait_for(LEAVE_ALTERNATE_SCREEN);
    let output = ui.output();
    let left = output
        .rfind(LEAVE_ALTERNATE_SCREEN)
        .expect("the alternate screen was left");
    assert!(
        output[left..].contains(SHOW_CURSOR),
        "the cursor was shown again: {:?}",
        &output[left..]
    );
    assert!(ui.terminal_is_cooked(), "raw mode is off after {name}");
    let _ = std::fs::remove_file(file);
}

#[test]
fn view_exits_when_its_terminal_closes_before_the_first_screen() {
    let file = profile_file("closed-early");
    let mut ui = PtyTendril::start(&["view", &file.display().to_string()]);
    ui.wait_for(ENTER_ALTERNATE_SCREEN);
    ui.close_terminal();
    ui.wait_exit("its terminal closed");
    let _ = std::fs::remove_file(file);
}

#[test]
fn view_exits_when_its_terminal_closes() {
    let (mut ui, file) = view("closed");
    ui.close_terminal();
    ui.wait_exit("its terminal closed");
    let _ = std::fs::remove_file(file);
}

#[test]
fn view_exits_on_sigterm_and_restores_the_terminal() {
    assert_signal_ends_view(libc::SIGTERM, "SIGTERM");
}

#[test]
fn view_exits_on_sigint_from_outside_and_restores_the_terminal() {
    assert_signal_ends_view(libc::SIGINT, "SIGINT");
}

#[test]
fn view_exits_on_sighup_and_restores_the_terminal() {
    assert_signal_ends_view(libc::SIGHUP, "SIGHUP");
}

#[test]
fn process_picker_exits_when_its_terminal_closes() {
    let mut ui = PtyTendril::start(&[]);
    ui.wait_for("PID");
    ui.close_terminal();
    ui.wait_exit("its terminal closed");
}

#[test]
fn process_picker_exits_on_sigterm() {
    let mut ui = PtyTendril::start(&[]);
    ui.wait_for("PID");
    ui.signal(libc::SIGTERM);
    ui.wait_exit("SIGTERM");
    assert!(ui.terminal_is_cooked(), "raw mode is off after SIGTERM");
}

#[test]
fn attach_detaches_when_its_terminal_closes() {
    let mut target = Target::spawn("calltree", &["2"]);
    let expected = target.checksum_lines(2, Duration::from_secs(10));
    assert_eq!(expected[0], expected[1], "the fixture's checksum is stable");
    let pid = target.pid().to_string();
    let mut ui = PtyTendril::start(&["attach", &pid, "--root", "work_round"]);
    ui.wait_for("compute_block");
    ui.close_terminal();
    ui.wait_exit("its terminal closed");
    target.drain();
    let after = target.checksum_lines(3, Duration::from_secs(10));
    assert!(
        after.iter().all(|&c| c == expected[0]),
        "checksums changed: {expected:?} then {after:?}"
    );
    code_bytes_match_file(target.pid()).expect("the target runs its files' code");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.lines().any(|line| line == "TracerPid:\t0"),
        "the target is still traced:\n{status}"
    );
}

#[test]
fn the_ui_in_the_background_of_its_terminal_is_refused() {
    let file = profile_file("background");
    // `timeout` puts itself and tendril in a process group of their own, in the
    // terminal's background: the kernel stops such a process that sets the terminal up.
    let script = format!(
        "{} view '{}'",
        env!("CARGO_BIN_EXE_tendril"),
        file.display()
    );
    let mut shell = Command::new("sh");
    shell.args([
        "-c",
        &format!("timeout -s INT -k 5 20 {script}; echo exit=$?"),
    ]);
    let mut ui = PtyTendril::start_command(shell);
    ui.wait_for("exit=");
    let output = ui.output();
    assert!(
        output.contains("the terminal UI needs the foreground of its terminal")
            && output.contains("exit=1"),
        "{output:?}"
    );
    assert!(!output.contains(ENTER_ALTERNATE_SCREEN), "{output:?}");
    let _ = std::fs::remove_file(file);
}
