//! Where the agent's own library is mapped: its code is never instrumented, and a
//! target thread whose PC is in it is inside tendril.

/// Whether `address` lies in the agent library's own code: it is never instrumented.
pub fn is_agent_code(address: u64) -> bool {
    use crate::sys::state::STATE;
    let ranges = STATE.own_code_ranges.get_or_init(|| {
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
        super::maps::read_own()
            .unwrap_or_default()
            .into_iter()
            .filter(|mapping| mapping.name == path)
            .map(|mapping| (mapping.start, mapping.end))
            .collect()
    });
    ranges
        .iter()
        .any(|&(start, end)| (start..end).contains(&address))
}
