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
            pending: 0,
            ..
        } => {
            println!("detached: pid={pid} restored={restored} functions; the agent stays dormant");
            Ok(())
        }
        Response::Detached {
            restored,
            pending,
            pending_reason,
        } => {
            println!(
                "detached: pid={pid} restored={restored} functions; {pending} of tendril's own \
                 hooks on the unwinder are still in ({}), and come out by themselves once it \
                 leaves (`tendril status {pid}` shows them)",
                printable(
                    pending_reason
                        .as_deref()
                        .unwrap_or("a thread is inside tendril's hooks")
                )
            );
            Ok(())
        }
        other => anyhow::bail!("unexpected answer from the agent in {pid}: {other:?}"),
    }
}
