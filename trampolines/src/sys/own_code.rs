//! Where the agent's own library is mapped: its code is never instrumented, and a
//! target thread whose PC is in it is inside tendril.

/// Whether `address` lies in the agent library's own code: it is never instrumented.
pub fn is_agent_code(address: u64) -> bool {
    use std::sync::OnceLock;
    static RANGES: OnceLock<Vec<(u64, u64)>> = OnceLock::new();
    let ranges = RANGES.get_or_init(|| {
        // SAFETY: dladdr fills `info` for an address inside a loaded object; this
        // function's own address is one.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        if unsafe { libc::dladdr(is_agent_code as *const libc::c_void, &mut info) } == 0
            || info.dli_fname.is_null()
        {
            return Vec::new();
        }
        // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
        let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        maps.lines()
            .filter(|line| line.ends_with(&path))
            .filter_map(|line| {
                let (start, end) = line.split_whitespace().next()?.split_once('-')?;
                Some((
                    u64::from_str_radix(start, 16).ok()?,
                    u64::from_str_radix(end, 16).ok()?,
                ))
            })
            .collect()
    });
    ranges
        .iter()
        .any(|&(start, end)| (start..end).contains(&address))
}
