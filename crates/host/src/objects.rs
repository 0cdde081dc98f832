//! Objects under a directory descriptor: opened beneath it following no link, and given
//! owner, mode, xattrs and times through a handle that reaches exactly the object meant.
//!
//! - [`open_beneath`]: `openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)`, or a name at a time
//!   with `O_NOFOLLOW` where the kernel has no openat2.
//! - [`Handle`]: the object's descriptor, an `O_PATH` one, or a name in a directory.

use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Timestamps, XattrFlags};
use rustix::io::{Errno, Result};
use std::ffi::{CStr, CString};

/// Opens `rel` (one name, or names joined by `/`) under `dir` without following any
/// symlink or leaving `dir`. Without openat2 (filtered by seccomp, say), or for a path
/// longer than PATH_MAX, it walks one name at a time with `O_NOFOLLOW`, which for single
/// names the caller validated (no `/`, `.` or `..`) is just as strict.
pub fn open_beneath(dir: BorrowedFd<'_>, rel: &[u8], flags: OFlags, mode: Mode) -> Result<OwnedFd> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(dir, rel, flags, mode, resolve) {
        Err(Errno::NOSYS | Errno::NAMETOOLONG) if rel.contains(&b'/') => {
            let mut names = rel.split(|&b| b == b'/');
            let last = names.next_back().unwrap_or_default();
            let mut at: Option<OwnedFd> = None;
            for name in names {
                let here = at.as_ref().map_or(dir, |f| f.as_fd());
                at = Some(open_beneath(
                    here,
                    name,
                    OFlags::PATH | OFlags::DIRECTORY,
                    Mode::empty(),
                )?);
            }
            open_beneath(at.as_ref().map_or(dir, |f| f.as_fd()), last, flags, mode)
        }
        Err(Errno::NOSYS) => rustix::fs::openat(dir, rel, flags, mode),
        r => r,
    }
}

/// How metadata reaches an object.
#[derive(Clone, Copy)]
pub enum Handle<'f> {
    /// Its own open descriptor (a regular file, a directory).
    Open(BorrowedFd<'f>),
    /// An `O_PATH` descriptor of it (a symlink or special file, which opening for real
    /// could block on or act on).
    Path(BorrowedFd<'f>),
    /// Its name in a directory (never followed if a symlink).
    At(BorrowedFd<'f>, &'f CStr),
}

/// `/proc/self/fd/N`: reaches the very object a descriptor (an `O_PATH` one too) holds,
/// and never follows it further when it is a symlink: for the calls that take no
/// descriptor of that kind (`chmod`, xattrs, reopening).
pub fn fd_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number")
}

/// [`fd_path`] of `fd`, then `/NAME` where given: that name in the directory `fd` holds.
fn proc_path(fd: BorrowedFd<'_>, name: Option<&CStr>) -> Vec<u8> {
    let mut p = fd_path(fd).into_bytes();
    if let Some(name) = name {
        p.push(b'/');
        p.extend_from_slice(name.to_bytes());
    }
    p
}

impl Handle<'_> {
    /// Gives the object owner `uid:gid`; -1 (`u32::MAX`), which chown reads as "leave as
    /// is", is refused (EINVAL).
    #[allow(unsafe_code)] // rustix id constructors, unsafe for -1
    pub fn chown(self, uid: u32, gid: u32) -> Result<()> {
        if uid == u32::MAX || gid == u32::MAX {
            return Err(Errno::INVAL);
        }
        // SAFETY: neither id is u32::MAX (-1), checked above.
        let (u, g) = unsafe {
            (
                rustix::fs::Uid::from_raw(uid),
                rustix::fs::Gid::from_raw(gid),
            )
        };
        let nofollow = AtFlags::SYMLINK_NOFOLLOW;
        match self {
            Handle::Open(fd) => rustix::fs::fchown(fd, Some(u), Some(g)),
            Handle::Path(fd) => {
                rustix::fs::chownat(fd, "", Some(u), Some(g), AtFlags::EMPTY_PATH | nofollow)
            }
            Handle::At(dir, name) => rustix::fs::chownat(dir, name, Some(u), Some(g), nofollow),
        }
    }

    /// Sets the permission bits (`mode & 0o7777`). Not for a symlink (Linux has no modes
    /// of its own for them).
    pub fn chmod(self, mode: u32) -> Result<()> {
        let mode = Mode::from_raw_mode(mode & 0o7777);
        match self {
            Handle::Open(fd) => rustix::fs::fchmod(fd, mode),
            Handle::Path(fd) => rustix::fs::chmod(proc_path(fd, None).as_slice(), mode),
            Handle::At(dir, name) => rustix::fs::chmodat(dir, name, mode, AtFlags::empty()),
        }
    }

    /// Sets the xattr `name` to `value` (made or replaced).
    pub fn setxattr(self, name: &[u8], value: &[u8]) -> Result<()> {
        let flags = XattrFlags::empty();
        match self {
            Handle::Open(fd) => rustix::fs::fsetxattr(fd, name, value, flags),
            // The magic link is followed to the object, and no further.
            Handle::Path(fd) => {
                rustix::fs::setxattr(proc_path(fd, None).as_slice(), name, value, flags)
            }
            Handle::At(dir, obj) => {
                rustix::fs::lsetxattr(proc_path(dir, Some(obj)).as_slice(), name, value, flags)
            }
        }
    }

    /// Sets the access and modification times.
    pub fn set_times(self, times: &Timestamps) -> Result<()> {
        let nofollow = AtFlags::SYMLINK_NOFOLLOW;
        match self {
            Handle::Open(fd) => rustix::fs::futimens(fd, times),
            Handle::Path(fd) => {
                rustix::fs::utimensat(fd, "", times, AtFlags::EMPTY_PATH | nofollow)
            }
            Handle::At(dir, name) => rustix::fs::utimensat(dir, name, times, nofollow),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_handle_of_each_kind_changes_the_object_itself_never_a_link_target() {
        let t = tempfile::tempdir().unwrap();
        let (file, link) = (t.path().join("f"), t.path().join("l"));
        std::fs::write(&file, b"x").unwrap();
        std::os::unix::fs::symlink("f", &link).unwrap();
        let dir =
            rustix::fs::open(t.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let own = open_beneath(dir.as_fd(), b"f", OFlags::RDONLY, Mode::empty()).unwrap();
        let path = open_beneath(dir.as_fd(), b"l", OFlags::PATH, Mode::empty()).unwrap();
        let ts = |s| Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: s,
                tv_nsec: 0,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: s,
                tv_nsec: 0,
            },
        };
        Handle::Open(own.as_fd()).chmod(0o640).unwrap();
        Handle::Open(own.as_fd()).set_times(&ts(1000)).unwrap();
        Handle::Path(path.as_fd()).set_times(&ts(2000)).unwrap();
        let l = c"l";
        Handle::At(dir.as_fd(), l).set_times(&ts(3000)).unwrap();
        let (f, s) = (
            std::fs::metadata(&file).unwrap(),
            std::fs::symlink_metadata(&link).unwrap(),
        );
        assert_eq!(f.mode() & 0o7777, 0o640);
        assert_eq!((f.mtime(), s.mtime()), (1000, 3000));
        Handle::At(dir.as_fd(), c"f").chmod(0o600).unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o7777, 0o600);
        assert_eq!(
            Handle::Open(own.as_fd()).chown(u32::MAX, 0),
            Err(Errno::INVAL)
        );
        std::fs::create_dir(t.path().join("d")).unwrap();
        let d = open_beneath(dir.as_fd(), b"d", OFlags::PATH, Mode::empty()).unwrap();
        Handle::Path(d.as_fd()).setxattr(b"user.k", b"v").unwrap();
        Handle::At(dir.as_fd(), c"f")
            .setxattr(b"user.k", b"w")
            .unwrap();
        let special = t.path().join("d");
        let got = |p: &std::path::Path| {
            let mut v = [0u8; 8];
            let n = rustix::fs::lgetxattr(p, "user.k", &mut v).unwrap();
            v[..n].to_vec()
        };
        assert_eq!((got(&special), got(&file)), (b"v".to_vec(), b"w".to_vec()));
        // A symlink is never followed out of the directory.
        assert_eq!(
            open_beneath(dir.as_fd(), b"l", OFlags::RDONLY, Mode::empty()).err(),
            Some(Errno::LOOP)
        );
    }
}
