//! The profile of a recording as it stands: the builder's trees named with the agent's
//! function registry, and the statistics the agent keeps in the rings' header.
//!
//! The one idea: a snapshot changes nothing (only the names learnt so far are kept), so
//! the live view may take one several times a second.

use super::*;

impl Recorder {
    /// The profile as it stands (frames still open count up to their thread's latest
    /// event).
    pub fn snapshot(&mut self) -> Profile {
        self.refresh_names();
        let counters = self.rings().counters();
        let info = self.recording_info(&counters);
        let builder = self.builder.as_ref().expect("a recording has begun");
        let mut profile = builder.snapshot(&info, self.names.as_slice());
        self.add_extras(&mut profile, &counters);
        self.add_jit_callees(&mut profile);
        self.mark_tail_calls(&mut profile);
        self.add_trace(&mut profile);
        profile
    }

    fn recording_info(&self, counters: &AgentCounters) -> RecordingInfo {
        RecordingInfo {
            pid: self.target.pid as u32,
            exe: self.target.exe.display().to_string(),
            roots: self.root_names.clone(),
            scheme: match self.scheme {
                Scheme::A => "A".into(),
                Scheme::B => "B".into(),
            },
            instrumented_functions: counters.instrumented + self.instrumented_up_front,
            invoked_functions: counters.invoked,
            lost_events: counters.lost_events,
            indirect_call_sites: counters.indirect_call_sites + self.static_indirect_call_sites,
            timing: self.adaptive.policy(),
        }
    }

    /// Fields beyond the builder's: pauses, the gross-time distribution, the duration,
    /// how calls through pointers were followed.
    fn add_extras(&mut self, profile: &mut Profile, counters: &AgentCounters) {
        self.late_modules.fill_stats(&mut profile.stats);
        let hz = profile.calibration.tsc_hz.max(1) as f64;
        // The agent's own pauses, and the waits for a core the drain held (the trees').
        let ns = |ticks: u64| (ticks as f64 * 1e9 / hz) as u64;
        profile.stats.pause_ns = ns(counters.pause_ticks) + profile.stats.core_wait_ns;
        profile.stats.ring_wait_ns = ns(counters.ring_wait_ticks);
        profile.stats.ring_fault_ns = ns(counters.ring_fault_ticks);
        profile.duration_ns =
            ((tsc::read().saturating_sub(self.started_tsc)) as f64 * 1e9 / hz) as u64;
        let mean_ns = |ticks: u64, count: u64| {
            if count == 0 {
                0
            } else {
                (ticks as f64 * 1e9 / hz / count as f64) as u64
            }
        };
        profile.discovery = Some(crate::profile::DiscoveryStats {
            discoveries: counters.discoveries,
            mean_pause_ns: mean_ns(counters.discovery_ticks, counters.discoveries),
            median_pause_ns: {
                let mut samples = self.rings().discovery_samples();
                samples.sort_unstable();
                samples
                    .get(samples.len() / 2)
                    .map_or(0, |&ticks| (ticks as f64 * 1e9 / hz) as u64)
            },
            refused_callees: counters.refused_callees,
            waits: counters.discovery_waits,
            mean_wait_ns: mean_ns(counters.discovery_wait_ticks, counters.discovery_waits),
            indirect_not_followed: self
                .indirect
                .as_ref()
                .map(|i| i.all_not_followed())
                .unwrap_or_default(),
            not_followed: self.go_callees_not_followed(),
        });
        profile.stats.cpu_unmeasured = self.cpu_unmeasured.clone();
        profile.stats.off_cpu_lost = self.off_cpu.as_ref().map_or(0, |w| w.lost());
        profile.stats.indirect_sites_followed = counters.indirect_sites_followed;
        profile.stats.indirect_targets = counters.indirect_targets;
        profile.stats.indirect_candidates = self.indirect.as_ref().map_or(0, |i| i.instrumented);
        if let Some(gross) = &self.gross {
            profile.gross = gross.summaries(&|id| self.name_of(id));
        }
    }

    fn name_of(&self, id: u32) -> String {
        self.names
            .get(id as usize)
            .map_or_else(|| format!("function #{id}"), |n| n.name.clone())
    }

    /// Names every id the registry has an address for, up to the highest id seen.
    pub(super) fn refresh_names(&mut self) {
        let mut id = self.names.len() as u32;
        let Some(rings) = self.rings.as_ref() else {
            return;
        };
        while let Some(address) = rings.function_address(id) {
            let (name, module) = match self.symbols.lookup(address) {
                Some(function) if function.addr == address => {
                    (function.name.to_string(), function.module.to_string())
                }
                _ => (format!("{address:#x}"), "?".to_string()),
            };
            self.names.push(FunctionName {
                name,
                module,
                address: Some(address),
            });
            id += 1;
        }
    }
}
