//! A long hash stays stoppable: it looks now and then whether the mount is gone or the
//! opener is being killed.

use std::io;
use std::os::unix::ffi::OsStrExt;

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
            let table = host::mountinfo::table(None).ok()?;
            let point = std::ffi::OsStr::from_bytes(&self.mountpoint);
            table
                .iter()
                .rev()
                .find(|m| {
                    let served = matches!(m.fs_name(), "fuse" | "erofs" | "overlay");
                    served && m.point.as_os_str() == point
                })
                .map(|m| m.id)
        });
    }

    fn gone(&self) -> bool {
        let Some(Some(id)) = self.id.get() else {
            return false;
        };
        host::mountinfo::table(None).is_ok_and(|t| !t.iter().any(|m| m.id == *id))
    }
}

/// Whether task `pid` (a thread) has SIGKILL pending: it is being killed, by SIGKILL or
/// by any signal it does not handle (the kernel turns those into SIGKILL for each
/// thread), and waits only for its request's answer; or it is gone (a killed opener
/// does not wait for a fanotify answer). Pid 0 is an opener this daemon cannot see.
fn being_killed(pid: u32) -> bool {
    match host::status::of(pid) {
        Ok(status) => status.being_killed(),
        Err(e) => pid != 0 && e.kind() == io::ErrorKind::NotFound,
    }
}
