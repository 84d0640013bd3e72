//! `tendril status <PID>`: make sure an agent is resident in the target and report it.

use crate::inject;
use crate::terminal_text::printable;

/// The one-line report `status` prints for a target.
pub fn status_line(pid: i32, status: &crate::agent_connection::AgentStatus) -> String {
    let mut line = format!(
        "agent ready: pid={pid} version={} threads={} patched={}",
        status.version, status.threads, status.patched
    );
    if status.pending_restore > 0 {
        line.push_str(&format!(
            " pending_restore={} ({}; they come out by themselves once it leaves)",
            status.pending_restore,
            status
                .pending_reason
                .as_deref()
                .unwrap_or("a thread is inside tendril's hooks")
        ));
    }
    line
}

pub fn run(pid: i32) -> anyhow::Result<()> {
    let (_, session) = inject::attach(pid)?;
    // The version and the reason come from the agent, which the target controls.
    println!("{}", printable(&status_line(pid, &session.status)));
    Ok(())
}
