//! `tendril status <PID>`: make sure an agent is resident in the target and report it.

use crate::inject;

/// The one-line report `status` prints for a target.
pub fn status_line(pid: i32, status: &crate::session::AgentStatus) -> String {
    format!(
        "agent ready: pid={pid} version={} threads={} patched={}",
        status.version, status.threads, status.patched
    )
}

pub fn run(pid: i32) -> anyhow::Result<()> {
    let (_, session) = inject::attach(pid)?;
    println!("{}", status_line(pid, &session.status));
    Ok(())
}
