//! Reading a request line without ever holding more than the cap, reading a recording's
//! function table after it, and sending an answer with a descriptor attached.

use crate::sys::error::AgentError;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;

/// How reading one request line ended.
pub(super) enum RequestLine {
    Complete,
    /// The controller closed the connection.
    Ended,
    /// No newline within [`tendril_wire::MAX_REQUEST_BYTES`].
    TooLong,
}

/// Reads one request line into `line`, never more than
/// [`tendril_wire::MAX_REQUEST_BYTES`] of it.
pub(super) fn read_request_line(
    reader: &mut BufReader<UnixStream>,
    line: &mut Vec<u8>,
) -> std::io::Result<RequestLine> {
    let limit = tendril_wire::MAX_REQUEST_BYTES as u64;
    reader.by_ref().take(limit).read_until(b'\n', line)?;
    Ok(if line.last() == Some(&b'\n') {
        RequestLine::Complete
    } else if line.len() as u64 >= limit {
        RequestLine::TooLong
    } else {
        RequestLine::Ended
    })
}

/// Reads the `bytes` of function table that follow a `StartRecording` line.
pub(super) fn read_table(
    reader: &mut BufReader<UnixStream>,
    bytes: u64,
) -> Result<Vec<u8>, AgentError> {
    if bytes > tendril_wire::MAX_TABLE_BYTES {
        return Err(AgentError::Request(format!(
            "function table of {bytes} bytes refused (at most {} MiB); the connection is closed",
            tendril_wire::MAX_TABLE_BYTES >> 20
        )));
    }
    let mut table = vec![0u8; bytes as usize];
    reader
        .read_exact(&mut table)
        .map_err(|e| AgentError::io("the function table did not arrive whole", e))?;
    Ok(table)
}

/// Writes `bytes` with `fd` attached (`SCM_RIGHTS`), the rest of them plainly.
pub(super) fn send_with_descriptor(
    stream: &UnixStream,
    bytes: &[u8],
    fd: &std::os::fd::OwnedFd,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let raw = fd.as_raw_fd();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = space;
    // SAFETY: `message` points at `control`, which has room for one cmsg holding one
    // int (CMSG_SPACE above), so CMSG_FIRSTHDR is non-null and CMSG_DATA is in bounds.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as usize;
        std::ptr::copy_nonoverlapping(
            (&raw as *const libc::c_int).cast::<u8>(),
            libc::CMSG_DATA(header),
            std::mem::size_of::<libc::c_int>(),
        );
    }
    // SAFETY: `message` and everything it points at live across the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut writer = stream;
    writer.write_all(&bytes[sent as usize..])
}
