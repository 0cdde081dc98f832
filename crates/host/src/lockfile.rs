//! Lock files that name their holder: locked without blocking, the holder's record rewritten in
//! place once locked, read (capped) by whoever finds it taken. The caller opens the file.
//!
//! - Both kinds go with a killed holder (they belong to the open file description):
//!   [`Kind::Flock`] and whole-file OFD locks ([`Kind::Ofd`]).
//! - One file, one kind: the two never conflict with each other.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use rustix::fd::{AsFd, AsRawFd, BorrowedFd};

/// Which lock a file takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `flock(2)`, whose holders /proc/locks names.
    Flock,
    /// An OFD record lock (`F_OFD_SETLK`) on the whole file.
    Ofd,
}

/// How often a waiting taker tries again.
const RETRY: Duration = Duration::from_millis(10);

/// Takes the lock of `kind` on `fd` (`exclusive`, else shared) without blocking: false
/// if another holds it.
#[allow(unsafe_code)] // fcntl(F_OFD_SETLK), a syscall
pub fn try_lock(fd: BorrowedFd<'_>, kind: Kind, exclusive: bool) -> io::Result<bool> {
    match kind {
        Kind::Flock => {
            use rustix::fs::FlockOperation as Op;
            let op = if exclusive {
                Op::NonBlockingLockExclusive
            } else {
                Op::NonBlockingLockShared
            };
            match rustix::fs::flock(fd, op) {
                Ok(()) => Ok(true),
                Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
        Kind::Ofd => {
            let lock = libc::flock {
                l_type: (if exclusive {
                    libc::F_WRLCK
                } else {
                    libc::F_RDLCK
                }) as libc::c_short,
                l_whence: libc::SEEK_SET as libc::c_short,
                l_start: 0,
                l_len: 0,
                // Must be 0 for OFD locks.
                l_pid: 0,
            };
            // SAFETY: F_OFD_SETLK reads the flock struct, which lives for the call; the
            // descriptor is borrowed for the call.
            let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
            if r == 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
                _ => Err(e),
            }
        }
    }
}

/// Takes the lock, trying again every 10 ms while another holds it and `keep_waiting`
/// (asked after each refusal) says so: false once it gives up.
pub fn lock(
    fd: BorrowedFd<'_>,
    kind: Kind,
    exclusive: bool,
    mut keep_waiting: impl FnMut() -> bool,
) -> io::Result<bool> {
    loop {
        if try_lock(fd, kind, exclusive)? {
            return Ok(true);
        }
        if !keep_waiting() {
            return Ok(false);
        }
        std::thread::sleep(RETRY);
    }
}

/// Replaces the file's record with `text` (the lock is ours: nobody else writes it).
pub fn write_record(file: &File, text: &str) -> io::Result<()> {
    file.set_len(0)?;
    file.write_all_at(text.as_bytes(), 0)
}

/// The file's record from its start, at most `max` bytes (a holder's file may be
/// anything).
pub fn read_record(file: &File, max: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    ReadAt { file, at: 0 }.take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Reads `file` from `at` on, leaving its offset alone.
struct ReadAt<'a> {
    file: &'a File,
    at: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// The processes other than this one holding a `flock` on the file (dev, ino), from
/// /proc/locks (those this process can see): (pid, whether its lock is shared).
pub fn flock_holders(dev: u64, ino: u64) -> Vec<(u32, bool)> {
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    );
    let me = std::process::id();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(1) != Some(&"FLOCK") || f.get(5) != Some(&want.as_str()) {
                return None;
            }
            let pid = f.get(4)?.parse::<u32>().ok().filter(|&p| p != me)?;
            Some((pid, f.get(3) == Some(&"READ")))
        })
        .collect()
}

/// The pid of a process holding a `flock` on the file `fd` is open on (one of them, if
/// several do).
pub fn flock_holder(fd: impl AsFd) -> Option<u32> {
    let st = rustix::fs::fstat(fd).ok()?;
    flock_holders(st.st_dev, st.st_ino)
        .first()
        .map(|&(pid, _)| pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_description_of_the_file_is_refused_its_lock_and_reads_the_record() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("lock");
        for kind in [Kind::Flock, Kind::Ofd] {
            let a = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .unwrap();
            let b = File::options().read(true).write(true).open(&path).unwrap();
            assert!(try_lock(a.as_fd(), kind, true).unwrap());
            write_record(&a, "pid 1\nlonger than the next\n").unwrap();
            write_record(&a, "pid 2\n").unwrap();
            let mut asked = 0;
            let got = lock(b.as_fd(), kind, false, || {
                asked += 1;
                asked < 3
            })
            .unwrap();
            assert!(!got, "{kind:?}: a shared lock beside an exclusive one");
            assert_eq!(asked, 3, "{kind:?}");
            assert_eq!(read_record(&b, 4).unwrap(), b"pid ", "{kind:?}");
            assert_eq!(read_record(&b, 100).unwrap(), b"pid 2\n", "{kind:?}");
            if kind == Kind::Flock {
                // This process's own locks are not listed.
                assert_eq!(flock_holder(b.as_fd()), None);
            }
            drop(a);
            assert!(try_lock(b.as_fd(), kind, true).unwrap(), "{kind:?}");
        }
    }
}
