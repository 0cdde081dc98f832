//! fanotify permission events on one mount: every open (and exec) on it waits for the group's
//! answer unless an ignore mark spares it.
//!
//! - fanotify fails open: once the group closes, opens are allowed; the reader records the gap.
//! - Ignore marks are evictable: no inode pinned.
//! - How a file is open is asked of the kernel ([`open_flags`], [`has_writers`]): merged close
//!   events cannot be counted.

use anyhow::Context;
use nix::sys::fanotify::{EventFFlags, Fanotify, InitFlags, MarkFlags, MaskFlags};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A group watching opens on one mount.
pub struct Group {
    fan: Fanotify,
}

/// One thread's wait for a group's events ([`Group::waiter`]).
pub struct Waiter {
    epoll: OwnedFd,
}

/// One open waiting for its answer: the file the kernel opened for us (closed when the
/// event is dropped), the opening thread and what it asked.
pub struct Event {
    file: OwnedFd,
    tid: i32,
    mask: u64,
}

/// `struct fanotify_event_metadata` (include/uapi/linux/fanotify.h): an event's length,
/// version, metadata length, mask, descriptor and pid, as the kernel writes them (no
/// information records follow: the group asks for none).
const EVENT_LEN: usize = 24;

/// What an event asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Open {
    /// An open for reading or writing (`FAN_OPEN_PERM`).
    File,
    /// An execve's open of the program (`FAN_OPEN_EXEC_PERM`).
    Exec,
}

impl Group {
    /// A group that hears the opens of `kinds` (files' and programs') on the mount whose
    /// root is `mount_root` (open; the mount may still be detached), or with
    /// `whole_filesystem` on every mount of its filesystem: the opens other mounts
    /// stacked on it make too (an overlayfs whose lower layer it is: a container's),
    /// which a mount mark misses. An exec's open is also a file's open: without
    /// [`Open::File`], an exec raises one event.
    ///
    /// The group is `FAN_CLASS_PRE_CONTENT` (a denial is EIO from Linux 6.14, EPERM before),
    /// `FAN_UNLIMITED_QUEUE` (no open let through for want of room) and `FAN_REPORT_TID`
    /// (credentials are per thread); it needs CAP_SYS_ADMIN in the first user namespace.
    pub fn on_mount(
        mount_root: BorrowedFd<'_>,
        whole_filesystem: bool,
        kinds: &[Open],
    ) -> anyhow::Result<Group> {
        let fan = Fanotify::init(
            InitFlags::FAN_CLASS_PRE_CONTENT
                | InitFlags::FAN_CLOEXEC
                | InitFlags::FAN_UNLIMITED_QUEUE
                | InitFlags::FAN_REPORT_TID
                | InitFlags::FAN_NONBLOCK,
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
            kinds.iter().map(|&k| mask_of(k)).collect(),
            Some(mount_root.as_raw_fd()),
            None,
        )
        .context("fanotify_mark")?;
        Ok(Group { fan })
    }

    /// A thread's way to wait for events: woken alone for an event, where a blocking read
    /// of the group wakes every thread waiting in one (fanotify's queue is not an
    /// exclusive wait), of which all but one then find nothing.
    pub fn waiter(&self) -> std::io::Result<Waiter> {
        use rustix::event::epoll;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &epoll,
            self.fan.as_fd(),
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN | epoll::EventFlags::EXCLUSIVE,
        )?;
        Ok(Waiter { epoll })
    }

    /// The next event, waiting for it with `waiter` (this thread's): a read of exactly one
    /// event's length, so several threads each take the next event and answer it, with no
    /// hand-over (nix's reader takes a page of events at once: only groups and marks are
    /// nix's here).
    #[allow(unsafe_code)] // takes the descriptor the kernel opened for the event
    pub fn next(&self, waiter: &Waiter) -> std::io::Result<Event> {
        let mut buf = [0u8; EVENT_LEN];
        let mut ready = rustix::event::epoll::EventVec::with_capacity(1);
        loop {
            let n = match rustix::io::read(self.fan.as_fd(), &mut buf) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {
                    match rustix::event::epoll::wait(&waiter.epoll, &mut ready, -1) {
                        Ok(()) | Err(rustix::io::Errno::INTR) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            };
            let field = |at: usize, len: usize| {
                let mut b = [0u8; 8];
                b[..len].copy_from_slice(&buf[at..at + len]);
                u64::from_ne_bytes(b)
            };
            let (event_len, version) = (field(0, 4) as usize, buf[4]);
            if n != EVENT_LEN
                || event_len != EVENT_LEN
                || version != libc::FANOTIFY_METADATA_VERSION
            {
                return Err(std::io::Error::other(format!(
                    "fanotify gave {n} bytes, an event of {event_len} bytes, version {version}"
                )));
            }
            let (mask, fd, tid) = (
                field(8, 8),
                field(16, 4) as u32 as i32,
                field(20, 4) as u32 as i32,
            );
            if fd < 0 {
                // A queue overflow (FAN_NOFD): none with an unlimited queue.
                continue;
            }
            // SAFETY: the kernel opened `fd` for this event and handed it to us alone;
            // the event owns it from here and closes it once answered.
            let file = unsafe { OwnedFd::from_raw_fd(fd) };
            return Ok(Event { file, tid, mask });
        }
    }

    /// Answers `event`: the open goes on, or fails with EIO (EPERM where the kernel
    /// cannot say which error: before Linux 6.14).
    pub fn answer(&self, event: &Event, allow: bool) -> std::io::Result<()> {
        if allow {
            return self.respond(event, libc::FAN_ALLOW);
        }
        // FAN_DENY_ERRNO(EIO): the errno in the answer's top byte.
        match self.respond(event, libc::FAN_DENY | ((libc::EIO as u32) << 24)) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.respond(event, libc::FAN_DENY),
            r => r,
        }
    }

    /// Writes `struct fanotify_response`: the event's descriptor, then the answer.
    fn respond(&self, event: &Event, response: u32) -> std::io::Result<()> {
        let mut reply = [0u8; 8];
        reply[..4].copy_from_slice(&event.file.as_raw_fd().to_ne_bytes());
        reply[4..].copy_from_slice(&response.to_ne_bytes());
        let n = rustix::io::write(self.fan.as_fd(), &reply)?;
        if n != reply.len() {
            return Err(std::io::Error::other("a short write of a fanotify answer"));
        }
        Ok(())
    }

    /// Later opens of `kind` of the file `event` is about raise no event (until the
    /// kernel evicts the inode). Kept through modifications: for files that never change.
    pub fn ignore(&self, event: &Event, kind: Open) -> std::io::Result<()> {
        let fd = event.file.as_fd();
        let mask = mask_of(kind);
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

/// The permission event for opens of `kind`.
fn mask_of(kind: Open) -> MaskFlags {
    match kind {
        Open::File => MaskFlags::FAN_OPEN_PERM,
        Open::Exec => MaskFlags::FAN_OPEN_EXEC_PERM,
    }
}

impl Event {
    /// The file opened (a descriptor the kernel opened for us, read-only).
    pub fn file(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The opening thread.
    pub fn tid(&self) -> u32 {
        self.tid.max(0) as u32
    }

    /// What is being opened: an exec's program, else a file.
    pub fn kind(&self) -> Open {
        if self.mask & MaskFlags::FAN_OPEN_EXEC_PERM.bits() != 0 {
            Open::Exec
        } else {
            Open::File
        }
    }
}

/// Whether thread `tid` is inside execve or execveat now (an exec's second event, for
/// FAN_OPEN_PERM, comes while it is).
pub fn in_exec(tid: u32) -> bool {
    blocked_in(tid).is_some_and(|(nr, _)| nr == libc::SYS_execve || nr == libc::SYS_execveat)
}

/// The flags thread `tid` is opening a file with, from the system call it is blocked in:
/// open, openat, creat, open_by_handle_at, and openat2 (whose `struct open_how` begins
/// with the flags, read from the thread's memory). `None` for anything else: an io_uring
/// worker's open, a thread no longer there.
pub fn open_flags(tid: u32) -> Option<i32> {
    let (nr, args) = blocked_in(tid)?;
    match nr {
        libc::SYS_openat | libc::SYS_open_by_handle_at => Some(args[2] as i32),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open => Some(args[1] as i32),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_creat => Some(libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC),
        libc::SYS_openat2 => {
            let mem = std::fs::File::open(format!("/proc/{tid}/mem")).ok()?;
            let mut flags = [0u8; 8];
            std::os::unix::fs::FileExt::read_exact_at(&mem, &mut flags, args[2]).ok()?;
            Some(u64::from_ne_bytes(flags) as i32)
        }
        _ => None,
    }
}

/// The system call thread `tid` is blocked in and its arguments, from `/proc/TID/syscall`
/// (its number, then the arguments in hex). An opener's event is queued before it
/// sleeps waiting for the answer, so the file can still say `running`: read again until
/// it is blocked, for up to 50 ms (it waits for this answer, so it blocks at once unless
/// killed).
fn blocked_in(tid: u32) -> Option<(i64, [u64; 6])> {
    let start = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(format!("/proc/{tid}/syscall")).ok()?;
        let mut fields = text.split_whitespace();
        let first = fields.next()?;
        if first == "running" {
            if start.elapsed() > std::time::Duration::from_millis(50) {
                return None;
            }
            std::thread::yield_now();
            continue;
        }
        let nr: i64 = first.parse().ok()?;
        let mut args = [0u64; 6];
        for a in &mut args {
            *a = u64::from_str_radix(fields.next()?.strip_prefix("0x")?, 16).ok()?;
        }
        return Some((nr, args));
    }
}

/// Whether anyone has the file `fd` (open read-only) is open on for writing now: a read
/// lease is refused exactly then (the kernel's `i_writecount`; overlayfs included). The
/// lease is let go at once. A writer opening meanwhile waits for that (its open breaks
/// the lease, which signals SIGIO to this process: ignored from the first call on).
#[allow(unsafe_code)] // signal and fcntl(F_SETLEASE), syscalls
pub fn has_writers(fd: BorrowedFd<'_>) -> std::io::Result<bool> {
    static IGNORE_SIGIO: std::sync::Once = std::sync::Once::new();
    IGNORE_SIGIO.call_once(|| {
        // SAFETY: SIG_IGN installs no handler: nothing runs in signal context.
        unsafe {
            libc::signal(libc::SIGIO, libc::SIG_IGN);
        }
    });
    // SAFETY: fcntl(F_SETLEASE) takes an integer argument and touches no memory of ours.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
    if r == 0 {
        // SAFETY: as above.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
        return Ok(false);
    }
    match std::io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::EAGAIN) => Ok(true),
        e => Err(e),
    }
}
