//! `tendril demo`: the README's main job on the bundled demo target.
//!
//! Starts the demo workload (`tendril demo-target`, a child process), attaches to it as
//! to any running process, prints the agent's status line, then samples where the
//! demo's threads are for a moment and prints the hottest-looking functions — the
//! natural roots to profile. The demo process is always stopped before returning.

use crate::demo_workload;
use crate::symbols::ProcessSymbols;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long the demo samples.
const SAMPLE_DURATION: Duration = Duration::from_secs(1);
/// How many functions it lists.
const TOP: usize = 12;

/// The demo child; killed and reaped however `run` ends.
struct DemoProcess(Child);

impl Drop for DemoProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run() -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .arg("demo-target")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the demo target: {e}"))?;
    let demo = DemoProcess(child);
    let pid = demo.0.id() as i32;
    // Let the workers start, as with any process one attaches to.
    std::thread::sleep(Duration::from_millis(200));
    println!(
        "demo target started: pid={pid} ({} worker threads)",
        demo_workload::DEMO_WORKERS
    );

    let (_, session) = crate::inject::attach(pid)?;
    println!("{}", super::status::status_line(pid, &session.status));

    let symbols = ProcessSymbols::load(pid)?;
    let pcs = crate::sampler::sample_pcs(pid, SAMPLE_DURATION, Duration::from_millis(2))?;
    let mut per_function: HashMap<(String, String), usize> = HashMap::new();
    for pc in &pcs {
        let key = match symbols.lookup(*pc) {
            Some(f) => (f.name.clone(), f.module.clone()),
            None => (format!("{pc:#x}"), "?".into()),
        };
        *per_function.entry(key).or_default() += 1;
    }
    let mut ranked: Vec<_> = per_function.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    println!(
        "hottest-looking functions ({} pc samples over {} ms, statistical; profile a root for exact times):",
        pcs.len(),
        SAMPLE_DURATION.as_millis()
    );
    for ((name, module), count) in ranked.into_iter().take(TOP) {
        let share = 100.0 * count as f64 / pcs.len().max(1) as f64;
        println!("  {share:5.1}%  {name}  ({module})");
    }
    println!(
        "suggested root: {} — try `tendril symbols {pid} 'demo_*'`",
        demo_workload::DEMO_ROOT
    );
    Ok(())
}
