//! Which clock a profile's times are shown in: wall-clock (the default) or on-CPU.
//!
//! The one idea: a recording that measured CPU time carries both in every node
//! (`total_ns`/`self_ns` and `cpu_ns`/`self_cpu_ns`). Showing CPU time swaps them, so
//! every view and export — the tree, hot spots, folded stacks, flame graphs — works
//! unchanged on whichever clock was asked for.

use super::model::{Node, Profile};

/// The clock a report, an export or the live view shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Clock {
    /// Wall-clock time: waiting in a system call, on a lock or for a CPU included.
    #[default]
    Wall,
    /// On-CPU time: the time the thread ran.
    Cpu,
}

impl std::fmt::Display for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Clock::Wall => "wall",
            Clock::Cpu => "cpu",
        })
    }
}

/// Why a profile cannot be shown in CPU time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoCpuTime(pub String);

impl Profile {
    /// Whether every node has a CPU time (a sampled profile, or an empty one, has not).
    pub fn has_cpu_time(&self) -> bool {
        let all = |roots: &[Node]| !roots.is_empty() && roots.iter().all(has_cpu_time);
        all(&self.merged.roots)
    }

    /// Shows the times in `clock`: for [`Clock::Cpu`], every node's total and self
    /// times become its CPU times (and the wall times go where those were).
    pub fn show_clock(&mut self, clock: Clock) -> Result<(), NoCpuTime> {
        if (clock == Clock::Cpu) == self.stats.shows_cpu_time {
            return Ok(());
        }
        if clock == Clock::Cpu && !self.has_cpu_time() {
            let why = match &self.stats.cpu_unmeasured {
                Some(reason) => reason.clone(),
                None if self.scheme == "sampled" => {
                    "a sampled profile has no CPU times per node (its samples are CPU \
                     time already, unless it was sampled with --wall)"
                        .to_owned()
                }
                None => "this profile has no CPU times (recorded by a tendril before \
                         they were measured, or with no calls)"
                    .to_owned(),
            };
            return Err(NoCpuTime(why));
        }
        let swap = |roots: &mut Vec<Node>| roots.iter_mut().for_each(swap_clocks);
        swap(&mut self.merged.roots);
        for thread in &mut self.threads {
            swap(&mut thread.roots);
        }
        self.stats.shows_cpu_time = clock == Clock::Cpu;
        Ok(())
    }
}

fn has_cpu_time(node: &Node) -> bool {
    node.cpu_ns.is_some() && node.self_cpu_ns.is_some() && node.children.iter().all(has_cpu_time)
}

/// Swaps one subtree's wall and CPU times, without recursion (trees can be 100,000 deep).
fn swap_clocks(root: &mut Node) {
    let mut pending: Vec<&mut Node> = vec![root];
    while let Some(node) = pending.pop() {
        if let (Some(cpu), Some(self_cpu)) = (node.cpu_ns, node.self_cpu_ns) {
            node.cpu_ns = Some(std::mem::replace(&mut node.total_ns, cpu));
            node.self_cpu_ns = Some(std::mem::replace(&mut node.self_ns, self_cpu));
            // A CPU time is a measurement, never one clamped below resolution.
            node.below_resolution = false;
        }
        pending.extend(node.children.iter_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::cct::{CctBuilder, FunctionName, RecordingInfo};
    use crate::profile::model::Calibration;

    /// A profile with no trees yet.
    fn empty() -> Profile {
        let calibration = Calibration {
            tsc_hz: 1_000_000_000,
            inner_ns: 0.0,
            outer_ns: 0.0,
            inner_spread_ns: 0.0,
            outer_spread_ns: 0.0,
            ..Default::default()
        };
        let names: Vec<FunctionName> = Vec::new();
        CctBuilder::new(calibration)
            .unwrap()
            .snapshot(&RecordingInfo::default(), &names)
    }

    fn timed(name: &str, total: u64, self_ns: u64, cpu: u64, self_cpu: u64) -> Node {
        let mut node = Node::leaf(name, "m", 1, total, self_ns);
        node.cpu_ns = Some(cpu);
        node.self_cpu_ns = Some(self_cpu);
        node
    }

    #[test]
    fn cpu_time_swaps_every_node_and_back() {
        let mut root = timed("root", 100, 40, 30, 10);
        root.children.push(timed("leaf", 60, 60, 20, 20));
        let mut profile = empty();
        profile.merged.roots.push(root.clone());
        profile.show_clock(Clock::Cpu).unwrap();
        let shown = &profile.merged.roots[0];
        assert_eq!((shown.total_ns, shown.self_ns), (30, 10));
        assert_eq!(
            (shown.children[0].total_ns, shown.children[0].self_ns),
            (20, 20)
        );
        assert_eq!(shown.cpu_ns, Some(100));
        profile.show_clock(Clock::Cpu).unwrap();
        assert_eq!(
            profile.merged.roots[0].total_ns, 30,
            "already shown in CPU time"
        );
        profile.show_clock(Clock::Wall).unwrap();
        assert_eq!(profile.merged.roots[0], root, "back to wall time");
    }

    #[test]
    fn a_profile_without_cpu_times_says_why() {
        let mut profile = empty();
        profile
            .merged
            .roots
            .push(Node::leaf("root", "m", 1, 10, 10));
        profile.stats.cpu_unmeasured = Some("refused".into());
        assert_eq!(
            profile.show_clock(Clock::Cpu),
            Err(NoCpuTime("refused".into()))
        );
        assert!(profile.show_clock(Clock::Wall).is_ok());
    }
}
