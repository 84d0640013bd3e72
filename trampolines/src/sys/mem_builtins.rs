//! The agent's own `memcpy`, `memmove`, `memset`, `memcmp` and `bcmp`.
//!
//! The one idea: the compiler turns copies, zeroed buffers and slice comparisons into
//! calls to these five functions, which would bind to the target's libc — code a user
//! may have instrumented, and code a guard may hold while the agent patches it (the
//! patching thread must never reach a guard). The agent's library defines them itself
//! and is linked with `-Bsymbolic-functions` (see `build.rs`), so its own calls stay
//! inside it (not `-Bsymbolic`, which would also make `dlsym(RTLD_DEFAULT)` from the
//! agent find these before libc's).
//! They are written with string instructions in assembly, which the compiler cannot
//! turn back into calls to themselves. Not in unit tests, where the test executable
//! would export them to the whole process.

use std::arch::asm;

/// # Safety
/// `dest` and `src` are valid for `n` bytes and do not overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: per the contract; `rep movsb` copies forwards with the direction flag
    // clear, as the ABI guarantees on entry.
    unsafe {
        asm!(
            "rep movsb",
            inout("rdi") dest => _,
            inout("rsi") src => _,
            inout("rcx") n => _,
            options(nostack, preserves_flags),
        );
    }
    dest
}

/// # Safety
/// `dest` and `src` are valid for `n` bytes; they may overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize).wrapping_sub(src as usize) >= n {
        // The destination does not start inside the source: forwards is safe.
        // SAFETY: per the contract.
        return unsafe { memcpy(dest, src, n) };
    }
    // SAFETY: per the contract; copies backwards from the last byte with the direction
    // flag set, and clears it again as the ABI requires.
    unsafe {
        asm!(
            "std",
            "rep movsb",
            "cld",
            inout("rdi") dest.add(n).wrapping_sub(1) => _,
            inout("rsi") src.add(n).wrapping_sub(1) => _,
            inout("rcx") n => _,
            options(nostack),
        );
    }
    dest
}

/// # Safety
/// `dest` is valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dest: *mut u8, value: i32, n: usize) -> *mut u8 {
    // SAFETY: per the contract; `rep stosb` stores forwards.
    unsafe {
        asm!(
            "rep stosb",
            inout("rdi") dest => _,
            inout("rcx") n => _,
            in("al") value as u8,
            options(nostack, preserves_flags),
        );
    }
    dest
}

/// # Safety
/// `a` and `b` are valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut index = 0;
    while index < n {
        // SAFETY: per the contract, index < n. Volatile reads keep the compiler from
        // turning this loop into a call to memcmp.
        let (x, y) = unsafe {
            (
                std::ptr::read_volatile(a.add(index)),
                std::ptr::read_volatile(b.add(index)),
            )
        };
        if x != y {
            return x as i32 - y as i32;
        }
        index += 1;
    }
    0
}

/// # Safety
/// `a` and `b` are valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: per the contract.
    unsafe { memcmp(a, b, n) }
}
