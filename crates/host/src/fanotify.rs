//! fanotify permission events on one mount: every open (and exec) of a file on it waits
//! until the group answers; ignore marks spare later opens of a file already decided.
//!
//! What holds, and why:
//! - The group is `FAN_CLASS_CONTENT` with `FAN_UNLIMITED_QUEUE` (an open is never let
//!   through for want of room) and `FAN_REPORT_TID` (the opener's thread: credentials are
//!   per thread). All need CAP_SYS_ADMIN in the first user namespace.
//! - fanotify fails open: when the group's descriptor closes (the daemon exits, or is
//!   killed), waiting and later opens are allowed. Whoever reads the events must say so
//!   where it matters (the measurement list marks the gap).
//! - Ignore marks are evictable inode marks: they cost no pinned inode, and an inode the
//!   kernel drops comes back as one event again.

use anyhow::Context;
use nix::sys::fanotify::{
    EventFFlags, Fanotify, FanotifyEvent, FanotifyResponse, InitFlags, MarkFlags, MaskFlags,
    Response,
};
use rustix::fd::{AsRawFd, BorrowedFd};

/// A group watching opens on one mount.
pub struct Group {
    fan: Fanotify,
}

/// One open waiting for its answer.
pub struct Event {
    inner: FanotifyEvent,
}

/// What an event asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Open {
    /// An open for reading or writing (`FAN_OPEN_PERM`).
    File,
    /// An execve's open of the program (`FAN_OPEN_EXEC_PERM`).
    Exec,
}

impl Group {
    /// A group that hears every open and exec on the mount whose root is `mount_root`
    /// (open; the mount may still be detached), or with `whole_filesystem` on every
    /// mount of its filesystem: the opens other mounts stacked on it make too (an
    /// overlayfs whose lower layer it is: a container's), which a mount mark misses.
    pub fn on_mount(mount_root: BorrowedFd<'_>, whole_filesystem: bool) -> anyhow::Result<Group> {
        let fan = Fanotify::init(
            InitFlags::FAN_CLASS_CONTENT
                | InitFlags::FAN_CLOEXEC
                | InitFlags::FAN_UNLIMITED_QUEUE
                | InitFlags::FAN_REPORT_TID,
            EventFFlags::O_RDONLY | EventFFlags::O_LARGEFILE | EventFFlags::O_CLOEXEC,
        )
        .context("fanotify_init (permission events need CAP_SYS_ADMIN)")?;
        fan.mark::<std::path::Path>(
            MarkFlags::FAN_MARK_ADD
                | if whole_filesystem {
                    MarkFlags::FAN_MARK_FILESYSTEM
                } else {
                    MarkFlags::FAN_MARK_MOUNT
                },
            MaskFlags::FAN_OPEN_PERM | MaskFlags::FAN_OPEN_EXEC_PERM,
            Some(mount_root.as_raw_fd()),
            None,
        )
        .context("fanotify_mark")?;
        Ok(Group { fan })
    }

    /// The next events, waiting for at least one.
    pub fn next(&self) -> std::io::Result<Vec<Event>> {
        loop {
            match self.fan.read_events() {
                Ok(events) => return Ok(events.into_iter().map(|inner| Event { inner }).collect()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Answers `event`: the open goes on, or fails with EPERM.
    pub fn answer(&self, event: &Event, allow: bool) -> std::io::Result<()> {
        let Some(fd) = event.inner.fd() else {
            return Ok(());
        };
        let response = if allow {
            Response::FAN_ALLOW
        } else {
            Response::FAN_DENY
        };
        self.fan
            .write_response(FanotifyResponse::new(fd, response))
            .map_err(Into::into)
    }

    /// Later opens of `kind` of the file `event` is about raise no event (until the
    /// kernel evicts the inode).
    pub fn ignore(&self, event: &Event, kind: Open) -> std::io::Result<()> {
        let Some(fd) = event.inner.fd() else {
            return Ok(());
        };
        let mask = match kind {
            Open::File => MaskFlags::FAN_OPEN_PERM,
            Open::Exec => MaskFlags::FAN_OPEN_EXEC_PERM,
        };
        self.fan
            .mark::<std::path::Path>(
                MarkFlags::FAN_MARK_ADD
                    | MarkFlags::FAN_MARK_IGNORED_MASK
                    | MarkFlags::FAN_MARK_IGNORED_SURV_MODIFY
                    | MarkFlags::FAN_MARK_EVICTABLE,
                mask,
                Some(fd.as_raw_fd()),
                None,
            )
            .map_err(Into::into)
    }
}

impl Event {
    /// The file opened (a descriptor the kernel opened for us, read-only).
    pub fn file(&self) -> Option<BorrowedFd<'_>> {
        self.inner.fd()
    }

    /// The opening thread.
    pub fn tid(&self) -> u32 {
        self.inner.pid().max(0) as u32
    }

    /// What is being opened: an exec's program, else a file.
    pub fn kind(&self) -> Open {
        if self.inner.mask().contains(MaskFlags::FAN_OPEN_EXEC_PERM) {
            Open::Exec
        } else {
            Open::File
        }
    }

    /// The queue overflowed (no file): cannot happen with an unlimited queue.
    pub fn is_overflow(&self) -> bool {
        self.inner.fd().is_none()
    }
}

/// Whether thread `tid` is inside execve or execveat now (an exec's second event, for
/// FAN_OPEN_PERM, comes while it is): `/proc/TID/syscall` starts with the number of the
/// system call the thread is blocked in.
pub fn in_exec(tid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{tid}/syscall")) else {
        return false;
    };
    let nr = text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse::<i64>().ok());
    nr == Some(libc::SYS_execve) || nr == Some(libc::SYS_execveat)
}
