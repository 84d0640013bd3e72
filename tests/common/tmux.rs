//! A terminal UI test's terminal: tmux runs `tendril` in a detached 100×30 session of a
//! server of its own, the test types keys into it and reads the screen back.
//!
//! The one idea: the test does what a user does and sees what the user sees; every wait
//! polls the screen with a timeout and prints the screen when it fails.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long any one thing may take to appear on screen (attaching is slow in debug builds).
pub const SCREEN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long tendril may take to exit after `q`.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A tmux server of its own (its own socket, so parallel tests never meet) running one
/// command in a fixed-size session; killed, with its scratch directory, on drop.
pub struct Tmux {
    socket: String,
    /// The command's working directory; its exit status lands in `exit-status` here.
    pub dir: PathBuf,
}

impl Tmux {
    /// Runs `tendril args...` in a new 100×30 session, in a fresh directory.
    pub fn tendril(test: &str, args: &[&str]) -> Tmux {
        Tmux::start(test, args, false)
    }

    /// As [`Tmux::tendril`], in a tmux server (and so a tendril) whose
    /// `perf_event_open` calls the kernel refuses with EPERM — as a container's default
    /// seccomp profile does — by a seccomp filter its processes inherit.
    pub fn tendril_without_perf_events(test: &str, args: &[&str]) -> Tmux {
        Tmux::start(test, args, true)
    }

    fn start(test: &str, args: &[&str], deny_perf_events: bool) -> Tmux {
        let socket = format!("tendril-ui-{}-{test}", std::process::id());
        let dir = std::env::temp_dir().join(&socket);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("cannot create the test's directory");
        let mut command = quote(env!("CARGO_BIN_EXE_tendril"));
        for arg in args {
            command.push(' ');
            command.push_str(&quote(arg));
        }
        // Keep the pane after tendril exits, so its last screen can still be read.
        let script = format!(
            "cd {} && {command}; echo $? > exit-status; sleep 600",
            quote(&dir.display().to_string())
        );
        let tmux = Tmux { socket, dir };
        let mut new_session = tmux.command();
        if deny_perf_events {
            // SAFETY: the closure runs in the forked child before exec and makes only
            // two prctl system calls over a filter on its own stack: async-signal-safe.
            unsafe { new_session.pre_exec(deny_perf_event_open) };
        }
        tmux.run_command(
            new_session,
            &[
                "new-session",
                "-d",
                "-x",
                "100",
                "-y",
                "30",
                "-s",
                "ui",
                "sh",
                "-c",
                &script,
            ],
        );
        tmux
    }

    /// A tmux client of this test's server.
    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        command.args(["-L", &self.socket, "-f", "/dev/null"]);
        command
    }

    pub fn run(&self, args: &[&str]) -> String {
        self.run_command(self.command(), args)
    }

    fn run_command(&self, mut command: Command, args: &[&str]) -> String {
        let output = command
            .args(args)
            .output()
            .expect("cannot run tmux (is it installed?)");
        assert!(
            output.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "ui"])
    }

    /// Types `text` literally.
    pub fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", "ui", "-l", text]);
    }

    /// Resizes the window, as a user dragging the terminal's corner does.
    pub fn resize(&self, width: u16, height: u16) {
        let (width, height) = (width.to_string(), height.to_string());
        self.run(&["resize-window", "-t", "ui", "-x", &width, "-y", &height]);
    }

    /// Presses a key by tmux's name for it (`Enter`, `q`, `C-c`).
    pub fn press(&self, key: &str) {
        self.run(&["send-keys", "-t", "ui", key]);
    }

    /// Polls the screen until `check` finds what it wants in it; panics with the last
    /// screen after `SCREEN_TIMEOUT`.
    pub fn wait_for<T>(&self, what: &str, mut check: impl FnMut(&str) -> Option<T>) -> T {
        let deadline = Instant::now() + SCREEN_TIMEOUT;
        loop {
            let screen = self.screen();
            if let Some(found) = check(&screen) {
                return found;
            }
            if let Some(status) = self.exit_status() {
                panic!(
                    "tendril exited (status {status}) while waiting for {what}; the screen:\n{screen}"
                );
            }
            if Instant::now() >= deadline {
                panic!("waited {SCREEN_TIMEOUT:?} for {what}; the screen:\n{screen}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the text `text` to be on screen.
    ///
    /// Only `text` is sure to be there: a screen may be captured while a frame is still
    /// being drawn, so what else a test needs of the same screen goes in one
    /// [`Tmux::wait_for_all`] or [`Tmux::wait_for`] check.
    pub fn wait_for_text(&self, text: &str) -> String {
        self.wait_for(&format!("{text:?}"), |screen| {
            screen.contains(text).then(|| screen.to_string())
        })
    }

    /// Waits for a screen with every one of `texts` on it.
    pub fn wait_for_all(&self, texts: &[&str]) -> String {
        self.wait_for(&format!("all of {texts:?}"), |screen| {
            texts
                .iter()
                .all(|text| screen.contains(text))
                .then(|| screen.to_string())
        })
    }

    /// tendril's exit status, once it has exited.
    pub fn exit_status(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.dir.join("exit-status")).ok()?;
        text.trim().parse().ok()
    }

    /// The pid of the `tendril` the session's shell started (a child of the pane's shell).
    pub fn tendril_pid(&self) -> i32 {
        let shell: i32 = self
            .run(&["display-message", "-p", "-t", "ui", "#{pane_pid}"])
            .trim()
            .parse()
            .expect("tmux names the pane's pid");
        let ppid = format!("{shell}");
        let children = std::fs::read_dir("/proc")
            .expect("/proc is readable")
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
                status.is_ok_and(|status| {
                    status.lines().any(|line| {
                        line.strip_prefix("PPid:").map(str::trim) == Some(ppid.as_str())
                    }) && status.lines().next() == Some("Name:\ttendril")
                })
            });
        let found: Vec<i32> = children.collect();
        assert_eq!(
            found.len(),
            1,
            "tendril processes under the pane's shell {shell}"
        );
        found[0]
    }

    /// Waits for tendril to exit; returns its exit status.
    pub fn wait_exit(&self) -> i32 {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(status) = self.exit_status() {
                return status;
            }
            if Instant::now() >= deadline {
                panic!(
                    "tendril did not exit within {EXIT_TIMEOUT:?}; the screen:\n{}",
                    self.screen()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Installs a seccomp filter on the calling process (and so on everything it starts)
/// under which `perf_event_open` fails with EPERM and every other call is allowed.
fn deny_perf_event_open() -> std::io::Result<()> {
    // Classic BPF over `struct seccomp_data` (nr at offset 0, arch at offset 4).
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let mut filter = [
        op(LD_W_ABS, 0, 0, 4),
        op(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        op(LD_W_ABS, 0, 0, 0),
        op(JEQ_K, 0, 1, libc::SYS_perf_event_open as u32),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes plain integers; PR_SET_SECCOMP reads
    // the program through a pointer valid for the call (the kernel copies it).
    let failed = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog,
            ) != 0
    };
    if failed {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `text` in single quotes for sh.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A count as the UI prints it: exact, or with a k/M/G suffix.
pub fn parse_count(text: &str) -> Option<f64> {
    let (number, scale) = match text.char_indices().last()? {
        (at, 'k') => (&text[..at], 1e3),
        (at, 'M') => (&text[..at], 1e6),
        (at, 'G') => (&text[..at], 1e9),
        _ => (text, 1.0),
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}

/// The CALLS (or SAMPLES) cell of the call tree's (or hot spots') first row naming
/// `function`. Rows are `[indent][▾▸] name module calls total self % bar` at this width;
/// a stripped function's row (`module+0xOFFSET`) leaves the module cell empty.
pub fn calls_of(screen: &str, function: &str) -> Option<f64> {
    let module_cells = if function.contains("+0x") { 0 } else { 1 };
    screen.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|word| *word == function)?;
        parse_count(words.get(at + 1 + module_cells)?)
    })
}
