//! Executable memory for tests that run copied code in this process (`function_copy`'s
//! and `path_register`'s).

/// A private anonymous mapping, readable, writable and executable, unmapped when
/// dropped.
pub struct Mapped {
    /// Its start.
    pub address: u64,
    len: usize,
}

impl Mapped {
    pub fn new(len: usize) -> Mapped {
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(address, libc::MAP_FAILED);
        Mapped {
            address: address as u64,
            len,
        }
    }

    /// Copies `bytes` in at `offset`.
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.len);
        // SAFETY: inside the mapping, which nothing is running yet.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                (self.address as *mut u8).add(offset),
                bytes.len(),
            )
        };
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `new`, which no function pointer outlives.
        unsafe { libc::munmap(self.address as *mut libc::c_void, self.len) };
    }
}
