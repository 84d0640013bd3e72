//! A terminal UI test's terminal: tmux runs `tendril` in a detached 100×30 session of a
//! server of its own, the test types keys into it and reads the screen back.
//!
//! The one idea: the test does what a user does and sees what the user sees; every wait
//! polls the screen with a timeout and prints the screen when it fails.

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
        tmux.run(&[
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
        ]);
        tmux
    }

    pub fn run(&self, args: &[&str]) -> String {
        let output = Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
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
    pub fn wait_for_text(&self, text: &str) -> String {
        self.wait_for(&format!("{text:?}"), |screen| {
            screen.contains(text).then(|| screen.to_string())
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

/// `text` in single quotes for sh.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}
