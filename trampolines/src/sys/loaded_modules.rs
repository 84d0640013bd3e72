//! The libraries the dynamic loader has mapped, held in place while code is patched.
//!
//! A program may unload a library (`dlclose`) while tendril has it patched, and load
//! another at the same address: bytes written for the first would land in the second.
//! The one idea: glibc's loader takes its list's write lock (`dl_load_write_lock`)
//! both to unmap a library it unloads and to add one it loads, and `dl_iterate_phdr`
//! holds that same lock while it calls back. So the patcher reads and writes code from
//! inside a `dl_iterate_phdr` callback ([`with_modules_held`]): while it runs, no
//! library of the list is unmapped and none joins it, and the bytes the patcher checks
//! are the bytes it then writes over. The lock is recursive, so a thread that patches
//! from inside the loader (a hooked function called by a constructor) takes it again.
//!
//! The loader also counts every library it has added and removed (`dlpi_adds`,
//! `dlpi_subs`): [`LoadedModules::unloads`] tells the patcher when a library has gone
//! since it last looked, so that it checks which of its patches went with it. Other
//! C libraries (musl) never unmap a library; there the counts stay 0.

use std::panic::AssertUnwindSafe;

/// The loader's counts, read while it is held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LoadedModules {
    /// Libraries the loader has added since the process started.
    pub loads: u64,
    /// Libraries the loader has removed since the process started.
    pub unloads: u64,
}

/// Runs `work` while the loader can neither map nor unmap a library, giving it the
/// loader's counts then. A panic in `work` is resumed after the lock is released.
pub fn with_modules_held<W: FnOnce(&LoadedModules) -> R, R>(work: W) -> R {
    let mut held = Held {
        work: Some(work),
        outcome: None,
    };
    // SAFETY: `run_held` matches the callback type and only touches `held`, which outlives
    // the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(run_held::<W, R>),
            &mut held as *mut Held<W, R> as *mut libc::c_void,
        )
    };
    match held.outcome {
        Some(Ok(result)) => result,
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        // No library is listed at all (no loader): nothing can be unloaded either.
        None => (held.work.take().expect("the work has not run"))(&LoadedModules::default()),
    }
}

/// The loader's counts of libraries added and removed so far.
pub fn generation() -> (u64, u64) {
    let counts = with_modules_held(|modules| *modules);
    (counts.loads, counts.unloads)
}

/// One executable segment of a library the loader lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedCode {
    pub start: u64,
    pub end: u64,
    /// The library's name as the loader has it (its path; empty for the program).
    pub name: String,
}

/// The executable segments of every library the loader lists now. Allocates: not for
/// signal handlers.
pub fn loaded_code() -> Vec<LoadedCode> {
    extern "C" fn collect(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: `data` is the Vec `loaded_code` passed, alive for the whole call; `info`
        // is the loader's, valid during this callback.
        let (code, info) = unsafe { (&mut *(data as *mut Vec<LoadedCode>), &*info) };
        add_code_of(info, code);
        0
    }
    let mut code: Vec<LoadedCode> = Vec::new();
    // SAFETY: `collect` matches the callback type and only touches `code`, which
    // outlives the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(collect),
            &mut code as *mut Vec<LoadedCode> as *mut libc::c_void,
        )
    };
    code
}

/// Adds the executable segments of the library `info` describes to `code`.
fn add_code_of(info: &libc::dl_phdr_info, code: &mut Vec<LoadedCode>) {
    let headers = program_headers(info);
    if headers.is_empty() {
        return;
    }
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: the loader's NUL-terminated name for the library, valid while it is
        // listed (the callback runs under the loader's lock).
        unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    for header in headers {
        if header.p_type == libc::PT_LOAD && header.p_flags & libc::PF_X != 0 {
            let start = info.dlpi_addr.wrapping_add(header.p_vaddr);
            code.push(LoadedCode {
                start,
                end: start.saturating_add(header.p_memsz),
                name: name.clone(),
            });
        }
    }
}

/// Where a loaded library keeps the index of its unwind information: its
/// `.eh_frame_hdr` (the `PT_GNU_EH_FRAME` segment), and the loaded segments it and the
/// `.eh_frame` it points into lie in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnwindIndex {
    /// The `.eh_frame_hdr`'s first byte and length.
    pub eh_frame_hdr: (u64, u64),
    /// The library's loaded segments, (start, end) of the bytes read from its file.
    pub segments: Vec<(u64, u64)>,
}

/// The unwind index of the library whose loaded segments hold `pc`, if it has one.
/// Takes only the loader's lock (recursive: callable with the modules held), none of
/// the unwinder's. Allocates: not for signal handlers.
pub fn unwind_index_of(pc: u64) -> Option<UnwindIndex> {
    struct Search {
        pc: u64,
        found: Option<UnwindIndex>,
    }
    extern "C" fn look(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: `data` is the Search `unwind_index_of` passed, alive for the whole
        // call; `info` is the loader's, valid during this callback.
        let (search, info) = unsafe { (&mut *(data as *mut Search), &*info) };
        let headers = program_headers(info);
        let at = |header: &libc::Elf64_Phdr| info.dlpi_addr.wrapping_add(header.p_vaddr);
        let segments: Vec<(u64, u64)> = (headers.iter())
            .filter(|header| header.p_type == libc::PT_LOAD)
            .map(|header| (at(header), at(header).saturating_add(header.p_filesz)))
            .collect();
        if !segments
            .iter()
            .any(|&(start, end)| (start..end).contains(&search.pc))
        {
            return 0;
        }
        search.found = (headers.iter())
            .find(|header| header.p_type == libc::PT_GNU_EH_FRAME)
            .map(|header| UnwindIndex {
                eh_frame_hdr: (at(header), header.p_memsz),
                segments,
            });
        1
    }
    let mut search = Search { pc, found: None };
    // SAFETY: `look` matches the callback type and only touches `search`, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(look), &mut search as *mut Search as *mut libc::c_void) };
    search.found
}

/// The program headers of the library `info` describes (none when the loader gives
/// none).
fn program_headers(info: &libc::dl_phdr_info) -> &[libc::Elf64_Phdr] {
    if info.dlpi_phdr.is_null() {
        return &[];
    }
    // SAFETY: the loader's program headers for this library: `dlpi_phnum` entries at
    // `dlpi_phdr`, mapped for as long as the library is, and read only during the
    // callback `info` was given to.
    unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
}

/// The work, and what it gave.
struct Held<W, R> {
    work: Option<W>,
    outcome: Option<std::thread::Result<R>>,
}

/// At the loader's first library, with its lock held: runs the work, and ends the
/// iteration (the lock is what the work needed, not the libraries).
extern "C" fn run_held<W: FnOnce(&LoadedModules) -> R, R>(
    info: *mut libc::dl_phdr_info,
    size: usize,
    data: *mut libc::c_void,
) -> i32 {
    // SAFETY: `data` is the Held `with_modules_held` passed, alive for the whole call;
    // `info` is the loader's, valid for `size` bytes during this callback.
    let (held, info) = unsafe { (&mut *(data as *mut Held<W, R>), &*info) };
    let (loads, unloads) = counts(info, size);
    let modules = LoadedModules { loads, unloads };
    if let Some(work) = held.work.take() {
        held.outcome = Some(std::panic::catch_unwind(AssertUnwindSafe(|| {
            work(&modules)
        })));
    }
    1
}

/// The loader's counts of libraries added and removed, if its `dl_phdr_info` has them.
fn counts(info: &libc::dl_phdr_info, size: usize) -> (u64, u64) {
    let has_counts = size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8;
    if has_counts {
        (info.dlpi_adds, info.dlpi_subs)
    } else {
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_counts_this_process_libraries() {
        let modules = with_modules_held(|modules| *modules);
        assert!(modules.loads > 0);
        assert_eq!(generation(), (modules.loads, modules.unloads));
    }

    #[test]
    fn this_code_is_in_a_loaded_library() {
        let here = this_code_is_in_a_loaded_library as *const () as u64;
        let code = loaded_code();
        assert!(
            code.iter().any(|c| (c.start..c.end).contains(&here)),
            "{code:x?}"
        );
    }

    #[test]
    fn this_code_has_an_unwind_index_in_its_library() {
        let here = this_code_has_an_unwind_index_in_its_library as *const () as u64;
        let index = unwind_index_of(here).expect("Rust code has unwind information");
        let (hdr, len) = index.eh_frame_hdr;
        assert!(len > 0);
        assert!(
            index
                .segments
                .iter()
                .any(|&(s, e)| s <= hdr && hdr + len <= e)
        );
        // Memory no library maps has none.
        assert_eq!(unwind_index_of(8), None);
    }

    #[test]
    fn work_may_look_again_from_inside() {
        // The lock is recursive: a patch made from inside the loader takes it again.
        let inner = with_modules_held(|_| with_modules_held(|modules| modules.loads));
        assert!(inner > 0);
    }
}
