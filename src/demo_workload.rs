//! The bundled demo target: a small multithreaded "server" with a known shape, run by
//! `tendril demo` as a child process (`tendril demo-target`), so the demo needs nothing
//! but the tendril binary.
//!
//! Worker threads loop over `demo_serve_requests` → `demo_handle_request`, which parses
//! (libc `strlen`/`memcpy`), looks up a cache (the hot leaf `demo_hash_block`), renders
//! (the recursive `demo_fib`) and sorts (libc `qsort` calling back `demo_compare` through
//! a function pointer: a call through a pointer, followed into the tree below `qsort`).
//! The functions have C names and are never inlined, so they are easy to pick as roots.
//! The process names itself `tendril-demo`.

use std::hint::black_box;
use std::time::Duration;

/// Number of worker threads the demo runs.
pub const DEMO_WORKERS: usize = 3;
/// The function `tendril demo` profiles from.
pub const DEMO_ROOT: &str = "demo_handle_request";

/// The demo process's name (`comm`), as process lists show it.
pub const DEMO_PROCESS_NAME: &str = "tendril-demo";

/// Runs the demo workload until killed.
pub fn run() -> ! {
    // Named for what it is, not after the tendril binary it runs from.
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"tendril-demo".as_ptr()) };
    for worker in 0..DEMO_WORKERS {
        std::thread::Builder::new()
            .name(format!("demo-worker-{worker}"))
            .spawn(move || demo_serve_requests(worker as u64))
            .expect("cannot start a demo worker thread");
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

#[unsafe(no_mangle)]
#[inline(never)]
pub fn demo_serve_requests(worker: u64) {
    let mut request_id = worker << 32;
    loop {
        black_box(demo_handle_request(request_id));
        request_id += 1;
        // A little idle time now and then, like a real server.
        if request_id.is_multiple_of(8) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

#[unsafe(no_mangle)]
#[inline(never)]
pub fn demo_handle_request(request_id: u64) -> u64 {
    let mut buffer = [0u8; 256];
    let length = demo_parse_request(request_id, &mut buffer);
    let cached = demo_lookup_cache(&buffer[..length]);
    let rendered = demo_render_response(cached);
    demo_sort_results(rendered) ^ cached
}

#[unsafe(no_mangle)]
#[inline(never)]
pub fn demo_parse_request(request_id: u64, buffer: &mut [u8; 256]) -> usize {
    let text = format!("GET /item/{request_id} HTTP/1.1\0");
    // SAFETY: `text` ends with a NUL byte, so strlen stays inside it; the copy length is
    // bounded by both the source and the 256-byte destination.
    unsafe {
        let length = libc::strlen(text.as_ptr().cast()).min(buffer.len());
        libc::memcpy(buffer.as_mut_ptr().cast(), text.as_ptr().cast(), length);
        length
    }
}

#[unsafe(no_mangle)]
#[inline(never)]
pub fn demo_lookup_cache(key: &[u8]) -> u64 {
    (0..64).fold(0, |acc, round| acc ^ demo_hash_block(key, round))
}

/// The hot leaf: FNV-1a over the key, seeded per round.
#[unsafe(no_mangle)]
#[inline(never)]
pub fn demo_hash_block(key: &[u8], seed: u64) -> u64 {
    key.iter()
        .fold(0xcbf2_9ce4_8422_2325 ^ seed, |hash, &byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

#[unsafe(no_mangle)]
#[inline(never)]
pub fn demo_render_response(seed: u64) -> u64 {
    demo_fib(18 + (seed % 4) as u32)
}

/// Deliberately naive recursion: deep, repeated frames of one function.
#[unsafe(no_mangle)]
#[inline(never)]
pub fn demo_fib(n: u32) -> u64 {
    if n < 2 {
        u64::from(n)
    } else {
        demo_fib(n - 1) + demo_fib(n - 2)
    }
}

#[unsafe(no_mangle)]
#[inline(never)]
pub fn demo_sort_results(seed: u64) -> u64 {
    let mut values: Vec<u64> = (0..256u64)
        .map(|i| (i.wrapping_mul(seed | 1)) % 1009)
        .collect();
    // SAFETY: qsort gets a valid pointer to `values.len()` elements of 8 bytes each and a
    // comparator that reads exactly two such elements.
    unsafe {
        libc::qsort(
            values.as_mut_ptr().cast(),
            values.len(),
            8,
            Some(demo_compare),
        );
    }
    values[values.len() / 2]
}

/// qsort's comparator: an indirect call from libc back into the demo.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn demo_compare(a: *const libc::c_void, b: *const libc::c_void) -> libc::c_int {
    // SAFETY: qsort passes pointers to two elements of the u64 array being sorted.
    let (a, b) = unsafe { (*a.cast::<u64>(), *b.cast::<u64>()) };
    a.cmp(&b) as libc::c_int
}
