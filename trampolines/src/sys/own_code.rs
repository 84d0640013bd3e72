//! Where the agent's own library is mapped: its code is never instrumented, and a
//! target thread whose PC is in it is inside tendril.

/// Whether `address` lies in the agent library's own code: it is never instrumented.
pub fn is_agent_code(address: u64) -> bool {
    use crate::sys::state::STATE;
    let ranges = STATE.own_code_ranges.get_or_init(|| {
        // The mappings of the file that holds this very function. Matched by the name
        // the kernel shows, not the loader's: an agent loaded from a memfd was opened
        // as /proc/self/fd/N, but is mapped as "/memfd:… (deleted)".
        let here = is_agent_code as fn(u64) -> bool as usize as u64;
        let mappings = super::maps::read_own().unwrap_or_default();
        let Some(own) = mappings
            .iter()
            .find(|mapping| (mapping.start..mapping.end).contains(&here))
            .map(|mapping| mapping.name.clone())
            .filter(|name| !name.is_empty())
        else {
            return Vec::new();
        };
        mappings
            .into_iter()
            .filter(|mapping| mapping.name == own)
            .map(|mapping| (mapping.start, mapping.end))
            .collect()
    });
    ranges
        .iter()
        .any(|&(start, end)| (start..end).contains(&address))
}
