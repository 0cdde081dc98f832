//! A long hash stays stoppable: it looks now and then whether the mount is gone or the
//! opener is being killed.

use std::io;

/// How many bytes a measured open's hash reads between looks at whether to stop: at the
/// 1-2 GB/s a hash runs, a few looks a second, each a read of two small /proc files.
const WATCH_EVERY: u64 = 64 << 20;

/// A file's bytes read for a measured open's hash. IMA hashes the whole file, and so does
/// verilay, however long that takes (a sparse file of 2^50 bytes: days); but the daemon
/// must stay stoppable. Every `WATCH_EVERY` bytes it looks whether the mount is gone (a
/// lazy unmount, which the daemon also does on SIGTERM) or the opener is being killed
/// (the adapter does not act on FUSE's INTERRUPT: the opener's pending signals tell
/// instead). Then the read fails, and with it the open (EIO, and a log line).
pub(super) struct Watched<'a, R> {
    inner: R,
    mount: &'a MountWatch,
    pid: u32,
    read: u64,
    next: u64,
}

impl<'a, R> Watched<'a, R> {
    /// `inner`, read for a measured open by `pid` of a file of the mount `mount` watches.
    pub(super) fn new(inner: R, mount: &'a MountWatch, pid: u32) -> Watched<'a, R> {
        mount.learn();
        Watched {
            inner,
            mount,
            pid,
            read: 0,
            next: WATCH_EVERY,
        }
    }
}

impl<R: io::Read> io::Read for Watched<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read >= self.next {
            self.next = self.read.saturating_add(WATCH_EVERY);
            let why = if self.mount.gone() {
                Some("the mount was unmounted")
            } else if being_killed(self.pid) {
                Some("the opener is being killed")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(io::Error::other(format!(
                    "hash stopped after {} bytes: {why}",
                    self.read
                )));
            }
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Tells whether the mount measured is still attached: by its mount id in
/// /proc/self/mountinfo, learnt before the first hash starts (the topmost verilay mount
/// on the mountpoint then: FUSE for the FUSE engine, erofs or overlayfs for the kernel
/// engine; an open came through it, so it is there unless already detached). If none is
/// found then, it is never taken for gone.
pub(super) struct MountWatch {
    mountpoint: Vec<u8>,
    id: std::sync::OnceLock<Option<u64>>,
}

impl MountWatch {
    pub(super) fn new(mountpoint: &[u8]) -> MountWatch {
        MountWatch {
            mountpoint: mountpoint.to_vec(),
            id: std::sync::OnceLock::new(),
        }
    }

    /// Learns the mount's id, once.
    fn learn(&self) {
        self.id.get_or_init(|| {
            let info = std::fs::read("/proc/self/mountinfo").ok()?;
            served_mount_on(&info, &self.mountpoint)
        });
    }

    fn gone(&self) -> bool {
        let Some(Some(id)) = self.id.get() else {
            return false;
        };
        std::fs::read("/proc/self/mountinfo").is_ok_and(|info| !mount_listed(&info, *id))
    }
}

/// The id of the last (topmost) mount of a type verilay serves on `mountpoint` in a
/// mountinfo text.
fn served_mount_on(info: &[u8], mountpoint: &[u8]) -> Option<u64> {
    info.split(|&b| b == b'\n')
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            let sep = fields.iter().position(|f| *f == b"-")?;
            let fstype = fields.get(sep + 1)?;
            let served =
                matches!(*fstype, b"fuse" | b"erofs" | b"overlay") || fstype.starts_with(b"fuse.");
            (served && unescape(fields.get(4)?) == mountpoint)
                .then(|| std::str::from_utf8(fields[0]).ok()?.parse().ok())
                .flatten()
        })
        .next_back()
}

/// Whether mount `id` is in a mountinfo text.
fn mount_listed(info: &[u8], id: u64) -> bool {
    let id = id.to_string();
    info.split(|&b| b == b'\n')
        .any(|line| line.split(|&b| b == b' ').next() == Some(id.as_bytes()))
}

/// A mountinfo path with its octal escapes (`\040` for a space...) undone.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// Whether task `pid` (a thread) has SIGKILL pending: it is being killed, by SIGKILL or
/// by any signal it does not handle (the kernel turns those into SIGKILL for each
/// thread), and waits only for its request's answer; or it is gone (a killed opener
/// does not wait for a fanotify answer). Pid 0 is an opener this daemon cannot see.
fn being_killed(pid: u32) -> bool {
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => status,
        Err(e) => return pid != 0 && e.kind() == io::ErrorKind::NotFound,
    };
    status.lines().any(|l| {
        let pending = l
            .strip_prefix("SigPnd:")
            .or_else(|| l.strip_prefix("ShdPnd:"));
        pending
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|v| v & SIGKILL_BIT != 0)
    })
}
