//! From the recorder's [`Profile`] to the terminal UI's view-model ([`ProfileSnapshot`]).
//!
//! The one idea: the UI owns its own tree type, so every snapshot is copied node by node
//! — with an explicit stack, because a recursion's tree can be 100,000 levels deep — and
//! the status bar's figures are derived here from the profile's own statistics, so a
//! live recording and a saved file show the same numbers the same way.

use crate::profile::{Node, Profile, Timing};
use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};
use tendril_tui::{ProfileSnapshot, SamplingStatus, Status, ThreadSummary, TreeNode};

/// Copies calling context trees into the UI's type, without recursion.
pub fn tree_nodes(roots: &[Node]) -> Vec<TreeNode> {
    let shallow = |node: &Node| {
        let mut copy = TreeNode::new(
            node.name.clone(),
            node.module.clone(),
            // A sampled profile's count is its samples (at or below the node).
            node.samples.unwrap_or(node.calls),
            node.total_ns as f64,
            node.self_ns as f64,
        );
        copy.below_resolution = node.below_resolution;
        copy.in_caller = node.timing == Timing::InCaller;
        copy.error_ns = node.error_ns.map(|ns| ns as f64);
        copy.address = node.address;
        // Sampled JIT frames have samples to show; only an instrumented leaf is marked.
        copy.jit = node.jit && node.samples.is_none();
        if let (Some(cpu), Some(self_cpu)) = (node.cpu_ns, node.self_cpu_ns) {
            copy.other_clock = Some((cpu as f64, self_cpu as f64));
        }
        copy.children.reserve_exact(node.children.len());
        copy
    };
    let mut out = Vec::with_capacity(roots.len());
    for root in roots {
        // Each frame: the source node, its copy being filled, the next child to copy.
        let mut frames: Vec<(&Node, TreeNode, usize)> = vec![(root, shallow(root), 0)];
        while let Some((source, _, next_child)) = frames.last_mut() {
            let source: &Node = source;
            if let Some(child) = source.children.get(*next_child) {
                *next_child += 1;
                frames.push((child, shallow(child), 0));
                continue;
            }
            let (_, finished, _) = frames.pop().expect("the loop saw a frame");
            match frames.last_mut() {
                Some((_, parent, _)) => parent.children.push(finished),
                None => out.push(finished),
            }
        }
    }
    out
}

/// "pid 4242 calltree": the target as the status bar names it — by the name `ps` and
/// `top` show (`comm`, empty if unknown) when the process gave itself one that is not
/// its executable's (`tendril-demo` runs `tendril`), else by its executable's file name
/// (of which `comm` keeps only 15 bytes).
pub fn target_label(pid: u32, exe: &str, comm: &str) -> String {
    let exe_name = Path::new(exe)
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| exe.to_string());
    let name = if comm.is_empty() || exe_name.starts_with(comm) {
        exe_name
    } else {
        comm.to_string()
    };
    if name.is_empty() {
        format!("pid {pid}")
    } else {
        format!("pid {pid} {name}")
    }
}

/// Copies the profile's counters (instrumented, invoked, indirect call sites, lost
/// events, overhead) into `status`; the session fields are left as they are.
pub fn fill_counters(profile: &Profile, status: &mut Status) {
    status.instrumented_functions = profile.stats.instrumented_functions;
    status.invoked_functions = profile.stats.invoked_functions;
    status.indirect_call_sites = profile.stats.indirect_call_sites;
    status.indirect_sites_followed = profile.stats.indirect_sites_followed;
    status.indirect_targets = profile.stats.indirect_targets;
    status.lost_events = profile.stats.lost_events;
    status.estimated_overhead_percent = profile.estimated_overhead_percent();
    status.cpu_unmeasured = profile.stats.cpu_unmeasured.clone();
    status.untimed = (profile.stats.timing.as_ref())
        .map(|timing| (timing.untimed_functions, timing.threshold_ns));
}

/// The whole view-model for `profile`, with `status` (its counters are filled in here).
pub fn snapshot_of(profile: &Profile, mut status: Status) -> ProfileSnapshot {
    fill_counters(profile, &mut status);
    let mut threads: Vec<ThreadSummary> = profile
        .threads
        .iter()
        .map(|thread| ThreadSummary {
            tid: thread.tid,
            name: thread.name.clone(),
            calls: thread
                .roots
                .iter()
                .map(|root| root.samples.unwrap_or(root.calls))
                .sum(),
            total_ns: thread.roots.iter().map(|root| root.total_ns as f64).sum(),
            roots: tree_nodes(&thread.roots),
        })
        .collect();
    // The threads tab lists them by thread id (its header says so): rows keep their
    // place while the totals change.
    threads.sort_by_key(|thread| thread.tid);
    ProfileSnapshot {
        merged: tree_nodes(&profile.merged.roots),
        threads,
        status,
    }
}

/// The view-model of a sampled profile being taken (the Sampled view): `target` as the
/// status bar names it, `threads` sampled now, `stopped` once sampling has ended.
pub fn sampled_snapshot(
    profile: &Profile,
    target: &str,
    threads: usize,
    stopped: bool,
) -> ProfileSnapshot {
    let sampling = profile.sampling.as_ref().map(|info| SamplingStatus {
        rate_hz: info.rate_hz,
        clock: info.clock.clone(),
        samples: info.samples,
        lost_samples: info.lost_samples,
        truncated_stacks: info.truncated_stacks,
        threads,
        stopped,
    });
    let status = Status {
        target: target.to_string(),
        elapsed: Duration::from_nanos(profile.duration_ns),
        sampling: Some(sampling.unwrap_or_default()),
        ..Status::default()
    };
    snapshot_of(profile, status)
}

/// The view-model of a saved profile (`tendril view`): the file is the target, the
/// recording's duration is the elapsed time, and it is neither paused nor detached.
pub fn saved_snapshot(profile: &Profile, path: &Path) -> ProfileSnapshot {
    let file = path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into(),
    );
    let elapsed = Duration::from_nanos(profile.duration_ns);
    let events_per_second = if profile.duration_ns > 0 {
        profile.stats.events as f64 / elapsed.as_secs_f64()
    } else {
        0.0
    };
    let status = Status {
        target: format!("{file} · {}", target_label(profile.pid, &profile.exe, "")),
        roots: profile.roots.clone(),
        elapsed,
        events_per_second,
        ..Status::default()
    };
    match profile.sampling {
        // A sampled profile (`tendril sample`, `w` in the Sampled view) is shown as one.
        Some(_) => {
            let mut snapshot =
                sampled_snapshot(profile, &status.target, profile.threads.len(), true);
            snapshot.status.elapsed = elapsed;
            snapshot
        }
        None => snapshot_of(profile, status),
    }
}

/// Events per second over about the last second, from samples of a growing count.
#[derive(Debug, Default)]
pub struct EventRate {
    samples: VecDeque<(Instant, u64)>,
}

/// How far back the rate looks.
const RATE_WINDOW: Duration = Duration::from_secs(1);

impl EventRate {
    /// Forgets the samples (after a reset, the count starts again from zero).
    pub fn clear(&mut self) {
        self.samples.clear();
    }

    /// Adds the count `events` seen at `now` and returns the rate over the window.
    pub fn sample(&mut self, now: Instant, events: u64) -> f64 {
        if self.samples.back().is_some_and(|&(_, last)| events < last) {
            self.samples.clear();
        }
        self.samples.push_back((now, events));
        // Keep one sample at or beyond the window's start, so the rate spans a full second.
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= RATE_WINDOW {
            self.samples.pop_front();
        }
        let (first_time, first_events) = self.samples[0];
        let seconds = now.duration_since(first_time).as_secs_f64();
        if seconds <= 0.0 {
            return 0.0;
        }
        (events - first_events) as f64 / seconds
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_is_named_as_ps_names_it_unless_that_is_its_executables_name_cut() {
        use super::target_label;
        assert_eq!(
            target_label(7, "/usr/bin/tendril", "tendril-demo"),
            "pid 7 tendril-demo"
        );
        assert_eq!(
            target_label(7, "/opt/calltree", "calltree"),
            "pid 7 calltree"
        );
        assert_eq!(
            target_label(7, "/opt/a_very_long_program_name", "a_very_long_pro"),
            "pid 7 a_very_long_program_name"
        );
        assert_eq!(target_label(7, "/opt/calltree", ""), "pid 7 calltree");
    }

    use super::*;
    use crate::profile::{Calibration, MergedProfile, Stats, ThreadProfile};

    fn profile(merged: Vec<Node>, threads: Vec<ThreadProfile>) -> Profile {
        Profile {
            format: Profile::FORMAT.into(),
            version: Profile::VERSION,
            pid: 4242,
            exe: "/usr/bin/calltree".into(),
            roots: vec!["work_round".into()],
            scheme: "B".into(),
            calibration: Calibration {
                tsc_hz: 2_600_000_000,
                inner_ns: 10.0,
                outer_ns: 20.0,
                inner_spread_ns: 0.0,
                outer_spread_ns: 0.0,
                ..Default::default()
            },
            stats: Stats {
                instrumented_functions: 43,
                invoked_functions: 19,
                events: 1_000,
                lost_events: 2,
                indirect_call_sites: 8,
                ..Stats::default()
            },
            threads,
            merged: MergedProfile { roots: merged },
            duration_ns: 2_000_000_000,
            discovery: None,
            gross: Vec::new(),
            sampling: None,
            modules: Vec::new(),
            trace: None,
        }
    }

    fn chain(depth: usize) -> Node {
        let mut node = Node::leaf("fib_rec", "calltree", 1, 1, 1);
        for _ in 1..depth {
            let mut parent = Node::leaf("fib_rec", "calltree", 1, 1, 0);
            parent.children.push(node);
            node = parent;
        }
        node
    }

    #[test]
    fn trees_keep_their_shape_and_figures() {
        let mut root = Node::leaf("work_round", "calltree", 3, 900, 100);
        root.children
            .push(Node::leaf("compute_block", "calltree", 384, 700, 700));
        root.children
            .push(Node::leaf("mix", "calltree", 390, 100, 100));
        let converted = tree_nodes(std::slice::from_ref(&root));
        let expected = TreeNode::new("work_round", "calltree", 3, 900.0, 100.0).with_children([
            TreeNode::new("compute_block", "calltree", 384, 700.0, 700.0),
            TreeNode::new("mix", "calltree", 390, 100.0, 100.0),
        ]);
        assert_eq!(converted, vec![expected]);
    }

    #[test]
    fn a_100000_deep_tree_converts_on_a_small_stack() {
        let root = chain(100_000);
        let converted = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                let converted = tree_nodes(std::slice::from_ref(&root));
                (converted[0].depth(), converted[0].node_count())
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(converted, (100_000, 100_000));
    }

    #[test]
    fn the_snapshot_has_threads_counters_and_overhead() {
        let thread_root = Node::leaf("work_round", "calltree", 5, 4_000, 4_000);
        let threads = vec![ThreadProfile {
            tid: 7,
            name: "worker".into(),
            roots: vec![thread_root],
            ..ThreadProfile::default()
        }];
        let merged = vec![Node::leaf("work_round", "calltree", 5, 80_000, 80_000)];
        let profile = profile(merged, threads);
        let snapshot = snapshot_of(&profile, Status::default());
        assert_eq!(snapshot.threads.len(), 1);
        assert_eq!(snapshot.threads[0].calls, 5);
        assert_eq!(snapshot.threads[0].total_ns, 4_000.0);
        assert_eq!(snapshot.status.instrumented_functions, 43);
        assert_eq!(snapshot.status.invoked_functions, 19);
        assert_eq!(snapshot.status.indirect_call_sites, 8);
        assert_eq!(snapshot.status.lost_events, 2);
        // 500 calls × 20 ns = 10 µs of overhead against 80 µs of corrected time.
        let overhead = snapshot.status.estimated_overhead_percent;
        assert!(
            (overhead - 100.0 * 10_000.0 / 90_000.0).abs() < 1e-9,
            "{overhead}"
        );
    }

    #[test]
    fn saved_profiles_name_the_file_and_the_target() {
        let profile = profile(Vec::new(), Vec::new());
        let snapshot = saved_snapshot(&profile, Path::new("/tmp/run.json"));
        assert_eq!(snapshot.status.target, "run.json · pid 4242 calltree");
        assert_eq!(snapshot.status.elapsed, Duration::from_secs(2));
        assert_eq!(snapshot.status.events_per_second, 500.0);
        assert_eq!(snapshot.status.estimated_overhead_percent, 100.0);
    }

    #[test]
    fn a_sampled_profile_shows_samples_as_its_counts() {
        let mut root = Node::leaf("worker_main", "calltree", 0, 8_000_000, 0);
        root.samples = Some(4);
        let mut leaf = Node::leaf("compute", "calltree", 0, 8_000_000, 8_000_000);
        leaf.samples = Some(4);
        root.children.push(leaf);
        let threads = vec![ThreadProfile {
            tid: 7,
            roots: vec![root.clone()],
            ..ThreadProfile::default()
        }];
        let mut profile = profile(vec![root], threads);
        profile.scheme = "sampled".into();
        profile.sampling = Some(crate::profile::SamplingInfo {
            clock: "cpu".into(),
            rate_hz: 499,
            samples: 4,
            lost_samples: 0,
            truncated_stacks: 1,
            stack_bytes: 32768,
        });
        let live = sampled_snapshot(&profile, "pid 4242 calltree", 3, false);
        let sampling = live.status.sampling.clone().expect("marked as sampled");
        assert_eq!((sampling.samples, sampling.threads), (4, 3));
        assert!(!sampling.stopped);
        assert_eq!(live.merged[0].calls, 4);
        assert_eq!(live.merged[0].children[0].calls, 4);
        assert_eq!(live.threads[0].calls, 4);
        let saved = saved_snapshot(&profile, Path::new("/tmp/sampled.json"));
        assert!(saved.status.sampling.is_some_and(|s| s.stopped));
        assert_eq!(saved.status.target, "sampled.json · pid 4242 calltree");
    }

    #[test]
    fn the_event_rate_spans_the_last_second() {
        let mut rate = EventRate::default();
        let start = Instant::now();
        assert_eq!(rate.sample(start, 0), 0.0);
        let ms = |n| start + Duration::from_millis(n);
        assert_eq!(rate.sample(ms(500), 500), 1_000.0);
        rate.sample(ms(1_000), 1_000);
        // From 1.0 s on the rate only counts the last second: 3,000 events in it.
        let late = rate.sample(ms(2_000), 4_000);
        assert!((late - 3_000.0).abs() < 1e-6, "{late}");
        // A reset starts over.
        assert_eq!(rate.sample(ms(2_100), 10), 0.0);
    }
}
