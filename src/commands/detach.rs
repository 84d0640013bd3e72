//! `tendril detach <PID>`: tell a resident agent to restore every byte it patched.
//!
//! Never loads an agent: a process without one has nothing to restore.

use crate::inject;
use crate::terminal_text::printable;
use tendril_wire::{Request, Response};

pub fn run(pid: i32) -> anyhow::Result<()> {
    let Some((_, mut session)) = inject::connect_existing(pid)? else {
        println!("pid {pid} has no tendril agent; nothing to restore");
        return Ok(());
    };
    match session.request(&Request::Detach)? {
        Response::Detached {
            restored,
            unloaded,
            pending,
            pending_reason,
        } => {
            let gone = match unloaded.len() {
                0 => String::new(),
                n => format!(
                    "; {n} patched function{} had been unloaded with {} library (nothing of \
                     {} to restore)",
                    if n == 1 { "" } else { "s" },
                    if n == 1 { "its" } else { "their" },
                    if n == 1 { "it" } else { "theirs" },
                ),
            };
            let lingering = match pending {
                0 => String::new(),
                _ => format!(
                    "; {pending} of tendril's own hooks on the unwinder are still in ({}), and \
                     come out by themselves once it leaves (`tendril status {pid}` shows them)",
                    printable(
                        pending_reason
                            .as_deref()
                            .unwrap_or("a thread is inside tendril's hooks")
                    )
                ),
            };
            println!(
                "detached: pid={pid} restored={restored} functions{gone}{lingering}; the agent \
                 stays dormant"
            );
            Ok(())
        }
        other => anyhow::bail!("unexpected answer from the agent in {pid}: {other:?}"),
    }
}
