//! Zero-copy transfer of a file range to a socket with sendfile(2); waits
//! with poll(2) on EAGAIN so non-blocking sockets work too. Every wait is
//! bounded: a peer that stops reading fails the send with TimedOut instead of
//! holding a worker thread forever.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Blocks until `fd` is writable, or fails with TimedOut after `timeout_ms`
/// (negative: wait without a bound).
fn wait_writable(fd: RawFd, timeout_ms: i32) -> io::Result<()> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
    loop {
        // SAFETY: pfd is a valid pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc > 0 {
            return Ok(());
        }
        if rc == 0 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "socket not writable within the send timeout"));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Runs one syscall that returns a byte count, retrying EINTR and EAGAIN
/// (each EAGAIN waits at most `timeout_ms` for the socket to drain).
fn retrying(fd: RawFd, timeout_ms: i32, mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let rc = call();
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => wait_writable(fd, timeout_ms)?,
            _ => return Err(err),
        }
    }
}

/// Writes all of `buf` to `fd`.
pub fn write_all_fd(fd: RawFd, mut buf: &[u8], timeout_ms: i32) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is valid for buf.len() bytes.
        let n = retrying(fd, timeout_ms, || unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) })?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n..];
    }
    Ok(())
}

/// Sends `prefix`, then `len` bytes of `file` from `position`, to `fd`.
/// Returns the file bytes sent (less than `len` only if the file shrank).
/// Each wait for the socket to drain is bounded by `timeout_ms`.
pub fn send_range(fd: RawFd, prefix: &[u8], file: &File, position: u64, len: u64, timeout_ms: i32) -> io::Result<u64> {
    write_all_fd(fd, prefix, timeout_ms)?;
    let mut off = position as libc::off_t;
    let mut sent = 0u64;
    while sent < len {
        let chunk = (len - sent).min(1 << 30) as usize;
        // SAFETY: off is a valid off_t the kernel advances; fds are open.
        let n = retrying(fd, timeout_ms, || unsafe { libc::sendfile(fd, file.as_raw_fd(), &mut off, chunk) })?;
        if n == 0 {
            break;
        }
        sent += n as u64;
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;

    #[test]
    fn sends_prefix_and_range_over_socketpair() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        f.write_all(&data).unwrap();
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            b.read_to_end(&mut got).unwrap();
            got
        });
        let n = send_range(a.as_raw_fd(), b"HDR", &f, 1000, 150_000, 5_000).unwrap();
        drop(a);
        let got = reader.join().unwrap();
        assert_eq!(n, 150_000);
        assert_eq!(&got[..3], b"HDR");
        assert_eq!(&got[3..], &data[1000..151_000]);
    }

    #[test]
    fn sends_over_tcp_and_stops_at_file_end() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"hello world").unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let n = send_range(c.as_raw_fd(), b"", &f, 6, 100, 5_000).unwrap();
        drop(c);
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        assert_eq!((n, got.as_str()), (5, "world"));
    }

    #[test]
    fn a_peer_that_stops_reading_times_out() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; 8 << 20]).unwrap();
        let (a, _b) = UnixStream::pair().unwrap(); // _b never reads
        a.set_nonblocking(true).unwrap();
        let started = std::time::Instant::now();
        let err = send_range(a.as_raw_fd(), b"", &f, 0, 8 << 20, 200).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}
