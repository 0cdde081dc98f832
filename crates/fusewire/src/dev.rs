//! The /dev/fuse transport: each worker reads requests from its own clone of the session's
//! descriptor (FUSE_DEV_IOC_CLONE, so the kernel wakes one waiting reader per request) and
//! writes each reply with one writev(2).

// This module makes syscalls; each unsafe block says why it holds.
#![allow(unsafe_code)]

use crate::abi::{self, OutHeader};
use crate::channel::write_all_parts;
use crate::dispatch::{serve, Filesystem};
use crate::event::EventFd;
use crate::reply::Sink;
use crate::spin::{spin, Activity};
use crate::split::split_dev;
use crate::stats::Stats;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use zerocopy::{FromBytes, IntoBytes};

/// A new /dev/fuse descriptor attached to the session of `session` (non-blocking: workers
/// poll it together with the shutdown eventfd).
pub(crate) fn clone_fd(session: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: open(2) of a NUL-terminated literal path.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let src = session.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads a u32 (the session's descriptor) from the pointer.
    if unsafe { libc::ioctl(fd.as_raw_fd(), abi::DEV_IOC_CLONE as _, &src) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A worker's descriptor: a clone, or, where /dev/fuse may not be opened (a rootless mount
/// in a container that passed only fusermount3's descriptor), a duplicate of the session's
/// made non-blocking, so workers sharing it never wait in read(2) for a request another took.
pub(crate) fn worker_fd(session: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    clone_fd(session).or_else(|_| {
        let fd = session.try_clone_to_owned()?;
        // SAFETY: F_GETFL/F_SETFL on a descriptor we own; no pointers involved.
        let ok = unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    })
}

/// What waiting for a request gave.
pub(crate) enum Got {
    Request(usize),
    /// The connection is gone (unmounted or aborted).
    Gone,
    /// The session is shutting down.
    Stopped,
}

/// Waits for a request on `fd` (or for the stop: `stopping` set, then `stop` signalled)
/// and reads it into `buf`: looks for one while the session is busy (see `spin`), then
/// sleeps in poll(2).
pub(crate) fn next_request(
    fd: RawFd,
    (stop, stopping): (&EventFd, &AtomicBool),
    buf: &mut [u8],
    poll: Duration,
    activity: &Activity,
) -> io::Result<Got> {
    let mut look_for = poll;
    loop {
        // A worker kept busy never reaches poll(2): it sees the stop here.
        let look = || match stopping.load(Ordering::Acquire) {
            true => Ok(Some(Got::Stopped)),
            false => read_once(fd, buf),
        };
        if let Some(got) = spin(look_for, activity, look)? {
            return Ok(got);
        }
        // Woken for a request another worker took: back to sleep at once. Looking, this
        // worker (likely on another CPU than the caller's) would take the caller's next
        // request and wake the caller across CPUs (see `affinity::pin_worker`).
        look_for = Duration::ZERO;
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a live array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            match io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::EINTR) => continue,
                e => return Err(e),
            }
        }
        if fds[1].revents != 0 {
            return Ok(Got::Stopped);
        }
        if fds[0].revents != 0 {
            if let Some(got) = read_once(fd, buf)? {
                return Ok(got);
            }
        }
    }
}

/// One non-blocking read: `None` when another reader took the request (or it was
/// interrupted before we got it).
fn read_once(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<Got>> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        return Ok(Some(Got::Request(n as usize)));
    }
    let e = io::Error::last_os_error();
    read_error(e.raw_os_error()).ok_or(e)
}

/// What a failed read of /dev/fuse means, or `None` for a real error.
/// ENODEV: unmounted. ECONNABORTED: the kernel took a request off its queue just as the
/// connection was torn down (fuse_dev_do_read, "must not put request on fpq->io queue
/// after having been shut down"), or the connection was aborted through fusectl: gone
/// either way.
fn read_error(errno: Option<i32>) -> Option<Option<Got>> {
    match errno {
        Some(libc::ENODEV | libc::ECONNABORTED) => Some(Some(Got::Gone)),
        Some(libc::EAGAIN | libc::EINTR | libc::ENOENT) => Some(None),
        _ => None,
    }
}

/// Replies on /dev/fuse: the body is built in the worker's buffer.
pub(crate) struct DevSink<'a> {
    pub(crate) fd: RawFd,
    pub(crate) out: &'a mut [u8],
}

impl Sink for DevSink<'_> {
    fn body(&mut self) -> &mut [u8] {
        self.out
    }

    fn send(&mut self, unique: u64, error: i32, len: usize) {
        let len = len.min(self.out.len());
        let header = OutHeader {
            len: (16 + len) as u32,
            error: -error,
            unique,
        };
        // ENOENT: the request was interrupted meanwhile; ENODEV: unmounted. Neither
        // leaves anyone waiting for this reply.
        let _ = write_all_parts(self.fd, &[header.as_bytes(), &self.out[..len]]);
    }
}

/// A zeroed buffer of `len` bytes, or ENOMEM: made before a thread starts, so a memory
/// limit fails the session's start instead of aborting the process in a new thread.
pub(crate) fn buffer(len: usize) -> io::Result<Vec<u8>> {
    let mut b = Vec::new();
    b.try_reserve_exact(len)
        .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
    b.resize(len, 0);
    Ok(b)
}

/// Serves requests from `fd` until the connection goes away or the session stops, with
/// `input` and `output` (each as large as the largest request) as its buffers.
pub(crate) fn worker<F: Filesystem>(
    fd: OwnedFd,
    fs: &F,
    setxattr_ext: bool,
    (mut input, mut output): (Vec<u8>, Vec<u8>),
    stats: &Stats,
    stop: (&EventFd, &AtomicBool),
    poll: Duration,
) -> io::Result<()> {
    let raw_fd = fd.as_raw_fd();
    // Each worker looks only while it itself is busy, not while any is (as io_uring's
    // threads do): one queue feeds them all, so a worker looking on another CPU than the
    // caller's would take each request and wake the caller across CPUs.
    let activity = Activity::new();
    loop {
        let n = match next_request(raw_fd, stop, &mut input, poll, &activity)? {
            Got::Request(n) => n,
            Got::Gone | Got::Stopped => return Ok(()),
        };
        activity.found(poll);
        let buf = &input[..n];
        let header = abi::InHeader::read_from_prefix(buf).ok().map(|(h, _)| h);
        stats.count_dev(header.map_or(0, |h| h.opcode));
        let mut sink = DevSink {
            fd: raw_fd,
            out: &mut output,
        };
        serve(
            fs,
            split_dev(buf, setxattr_ext),
            header.map_or(0, |h| h.unique),
            &mut sink,
        );
    }
}
