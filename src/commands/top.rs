//! `tendril top <PID> [--rate HZ] [--wall]`: a live table of the functions a running
//! process spends its time in, sampled from the outside, refreshed every second.
//!
//! The one idea: the sampler keeps per-function counts since the start; each refresh
//! takes the difference from the previous one, so the percentages are of the last
//! second (what the process does now, as in `py-spy top`) while the times add up since
//! the start. Nothing is loaded into the target: quitting leaves it as it was.

use crate::interrupt;
use crate::sampling::tree::{FunctionCounts, SampledTrees};
use crate::sampling::{Sampler, SamplerOptions};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tendril_tui::crossterm::event;
use tendril_tui::{TerminalGuard, TopAction, TopRow, TopSnapshot, TopView};

/// How often the table is recomputed.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// The longest wait for samples before keys are looked at again.
const POLL_TIMEOUT: Duration = Duration::from_millis(20);

pub fn run(pid: i32, options: SamplerOptions) -> anyhow::Result<()> {
    crate::live::require_terminal(&format!(
        "to sample without a terminal: `tendril sample {pid} --duration 5 -o FILE`"
    ))?;
    interrupt::install();
    let mut sampler = Sampler::start(pid, options)?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut table = TopTable::new(format!("pid {pid} ({exe})"));
    let mut view = TopView::new();
    view.update(table.refresh(&sampler));
    let mut guard = TerminalGuard::enter()?;
    let mut last_refresh = Instant::now();
    let mut exited = false;
    loop {
        guard.terminal().draw(|frame| view.draw(frame))?;
        if interrupt::requested() {
            break;
        }
        let mut quit = false;
        while event::poll(Duration::ZERO)? {
            if view.handle_event(&event::read()?) == Some(TopAction::Quit) {
                quit = true;
            }
        }
        if quit {
            break;
        }
        if exited {
            std::thread::sleep(POLL_TIMEOUT);
            continue;
        }
        sampler.poll(POLL_TIMEOUT)?;
        if last_refresh.elapsed() >= REFRESH_INTERVAL {
            last_refresh = Instant::now();
            let mut snapshot = table.refresh(&sampler);
            exited = sampler.target_exited();
            snapshot.exited = exited;
            view.update(snapshot);
        }
    }
    guard.restore()?;
    Ok(())
}

/// Turns the sampler's running counts into the table of one refresh.
pub struct TopTable {
    target: String,
    /// Each function's counts at the previous refresh, by its index in the sampler's
    /// function table (two functions may share a name and module).
    previous: HashMap<u32, FunctionCounts>,
    previous_samples: u64,
}

impl TopTable {
    pub fn new(target: String) -> TopTable {
        TopTable {
            target,
            previous: HashMap::new(),
            previous_samples: 0,
        }
    }

    /// The rows since the last refresh (percentages) and since the start (times).
    pub fn refresh(&mut self, sampler: &Sampler) -> TopSnapshot {
        let options = sampler.options();
        let period_s = 1.0 / f64::from(options.rate_hz.max(1));
        let trees: &SampledTrees = sampler.trees();
        let recent = trees.samples - self.previous_samples;
        let rows = self.rows(trees, period_s);
        TopSnapshot {
            target: self.target.clone(),
            threads: sampler.thread_count(),
            rate_hz: u64::from(options.rate_hz),
            recent_samples: recent,
            samples: trees.samples,
            lost_samples: sampler.lost_samples(),
            elapsed_seconds: sampler.elapsed().as_secs_f64(),
            rows,
            exited: false,
        }
    }

    /// One row per function sampled so far; `period_s` is the time a sample stands for.
    fn rows(&mut self, trees: &SampledTrees, period_s: f64) -> Vec<TopRow> {
        let recent = trees.samples - self.previous_samples;
        let percent = |count: u64| {
            if recent == 0 {
                0.0
            } else {
                100.0 * count as f64 / recent as f64
            }
        };
        let counted: Vec<(u32, FunctionCounts)> = trees.function_counts().collect();
        let mut named: HashMap<(&str, &str), usize> = HashMap::new();
        for &(function, _) in &counted {
            *named.entry(trees.functions.name(function)).or_default() += 1;
        }
        let mut rows = Vec::new();
        for (function, counts) in counted {
            let (name, module) = trees.functions.name(function);
            // Twins (`static` functions of two files) say where they are.
            let module = match trees.functions.address(function) {
                Some(address) if named[&(name, module)] > 1 => format!("{module} at {address:#x}"),
                _ => module.to_owned(),
            };
            let before = self.previous.get(&function).copied().unwrap_or_default();
            rows.push(TopRow {
                name: name.to_owned(),
                module,
                self_percent: percent(counts.self_samples - before.self_samples),
                total_percent: percent(counts.total_samples - before.total_samples),
                self_seconds: counts.self_samples as f64 * period_s,
                total_seconds: counts.total_samples as f64 * period_s,
            });
            self.previous.insert(function, counts);
        }
        self.previous_samples = trees.samples;
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twins_of_one_name_are_two_rows_each_with_its_own_last_second() {
        let mut trees = SampledTrees::default();
        let main = trees.functions.intern("main", "app", Some(0x10));
        let here = trees.functions.intern("step", "app", Some(0x1210));
        let other = trees.functions.intern("step", "app", Some(0x1260));
        let mut table = TopTable::new("pid 1".into());
        let add = |trees: &mut SampledTrees, leaf, samples| {
            for _ in 0..samples {
                trees.add(1, &[main, leaf], 10);
            }
        };
        add(&mut trees, here, 3);
        add(&mut trees, other, 1);
        table.rows(&trees, 0.01);
        // The next second: only the other one runs.
        add(&mut trees, other, 4);
        let mut rows: Vec<(String, f64, f64)> = (table.rows(&trees, 0.01).into_iter())
            .map(|row| {
                (
                    format!("{} ({})", row.name, row.module),
                    row.self_percent,
                    row.self_seconds,
                )
            })
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            rows,
            [
                ("main (app)".to_owned(), 0.0, 0.0),
                ("step (app at 0x1210)".to_owned(), 0.0, 0.03),
                ("step (app at 0x1260)".to_owned(), 100.0, 0.05),
            ]
        );
    }
}
