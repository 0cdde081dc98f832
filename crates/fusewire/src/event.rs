//! An eventfd: how a session wakes threads blocked on the kernel (to stop, or to look).

// This module makes syscalls; each unsafe block says why it holds.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd(2) takes no pointers; a non-negative result is a new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by eventfd(2) and is owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds 1: pollers see it readable until someone reads it.
    pub(crate) fn signal(&self) {
        let n = 1u64;
        // SAFETY: writes the 8 bytes of a live u64. It cannot fail short of the counter
        // overflowing, after which the fd is still readable, which is all a signal means.
        unsafe { libc::write(self.0.as_raw_fd(), (&n as *const u64).cast(), 8) };
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
