//! The writable upper directory, laid out as overlayfs lays it out so both take turns on it
//! (docs/FORMAT.md, "Upper directories").
//!
//! - Everything is relative to directory descriptors: nothing resolves outside the upper.
//! - Objects are made in the work directory and renamed into place once complete.
//! - Markers are overlayfs's ([`overlay`]), in the mount's [`overlay::Namespace`].

#![forbid(unsafe_code)]

use host::sparse::{write_sparse, Run, Zeros};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, RenameFlags};
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};

mod claim;
pub mod overlay;
pub use claim::Claim;
pub use overlay::{Namespace, Opacity};

/// Our directory inside the work directory (overlayfs uses `work/work`).
const WORK_SUBDIR: &str = "verilay";

/// An object's lstat, as the upper directory's calls return it.
pub type Stat = rfs::Stat;

/// Metadata of an object being copied up or created.
#[derive(Clone, Debug)]
pub struct Meta {
    /// Type and permission bits (`st_mode`).
    pub mode: u32,
    /// The owner's user ID.
    pub uid: u32,
    /// The owner's group ID.
    pub gid: u32,
    /// Modification time, seconds and nanoseconds since the epoch.
    pub mtime: (i64, u32),
    /// A device node's (major, minor).
    pub rdev: (u32, u32),
    /// Full names and values (ACLs included).
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The contents an object is made with.
pub enum Contents<'a> {
    /// A directory.
    Dir,
    /// A regular file of `size` bytes, read through `read(offset, buf) -> bytes read`.
    File {
        /// Its size, in bytes.
        size: u64,
        /// Reads from a byte offset into the buffer, returning how many bytes it read.
        read: &'a mut dyn FnMut(u64, &mut [u8]) -> io::Result<usize>,
    },
    /// A symlink to this target.
    Symlink(&'a [u8]),
    /// Devices, FIFOs and sockets (made with mknod).
    Special,
}

impl Contents<'_> {
    /// The same contents, lent for one attempt at making the object.
    pub fn reborrow(&mut self) -> Contents<'_> {
        match self {
            Contents::Dir => Contents::Dir,
            Contents::File { size, read } => Contents::File {
                size: *size,
                read: &mut **read,
            },
            Contents::Symlink(t) => Contents::Symlink(t),
            Contents::Special => Contents::Special,
        }
    }
}

/// An upper directory opened for making objects in, with our directory in its work
/// directory.
pub struct Upper {
    root: OwnedFd,
    work: OwnedFd,
    /// Where the mount's markers are: `trusted.overlay.` as root, `user.overlay.` otherwise.
    pub ns: Namespace,
    seq: AtomicU64,
}

fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc_einval()))
}

fn libc_einval() -> i32 {
    rustix::io::Errno::INVAL.raw_os_error()
}

pub use host::objects::fd_path;

/// Opens directory `name` of `dir` to read, never through a symlink.
pub(crate) fn open_subdir(dir: impl AsFd, name: impl rustix::path::Arg) -> io::Result<OwnedFd> {
    Ok(rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Whether an lstat is a whiteout's: a character device 0/0.
pub fn is_whiteout(st: &Stat) -> bool {
    overlay::is_whiteout(st.st_mode, (rfs::major(st.st_rdev), rfs::minor(st.st_rdev)))
}

impl Upper {
    /// Opens the claimed upper and work directories (checked not to overlap, on one
    /// mount, and locked by `claim`) and empties our directory in the work one.
    pub fn open(claim: &Claim) -> io::Result<Upper> {
        let root = claim.upper.try_clone()?;
        let work = open_work_subdir(claim)?;
        remove_contents(work.as_fd())?;
        Ok(Upper {
            root,
            work,
            ns: Namespace::of_this_process(),
            seq: AtomicU64::new(0),
        })
    }

    /// The upper directory.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// `name` in directory `dir`: its lstat, or `None` when absent.
    pub fn stat(&self, dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<Stat>> {
        match rfs::statat(dir, cstr(name)?.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// A descriptor of `name` in `dir`: a readable directory descriptor for directories
    /// (usable with the `*at` calls), `O_PATH` for everything else (opening a FIFO or a
    /// device for real would block or touch the device).
    pub fn open_entry(&self, dir: BorrowedFd<'_>, name: &[u8], st: &Stat) -> io::Result<OwnedFd> {
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        let flags = if is_dir {
            OFlags::RDONLY | OFlags::DIRECTORY
        } else {
            OFlags::PATH
        };
        Ok(rfs::openat(
            dir,
            cstr(name)?.as_c_str(),
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// The directory's marker.
    pub fn opacity(&self, dir: BorrowedFd<'_>) -> Opacity {
        let mut buf = [0u8; 8];
        let n = rfs::fgetxattr(dir, self.ns.opaque(), &mut buf).ok();
        Opacity::of(n.map(|n| &buf[..n]))
    }

    /// The directory's redirect (see the module comment), whatever its length (an xattr
    /// holds at most 64 KiB): one too long to name anything is the caller's to refuse.
    pub fn redirect(&self, dir: BorrowedFd<'_>) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        loop {
            match rfs::fgetxattr(dir, self.ns.redirect(), &mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Some(buf);
                }
                Err(rustix::io::Errno::RANGE) if buf.len() < 1 << 16 => buf.resize(1 << 16, 0),
                Err(_) => return None,
            }
        }
    }

    /// Sets a directory's redirect, in our namespace.
    pub fn set_redirect(&self, dir: BorrowedFd<'_>, to: &[u8]) -> io::Result<()> {
        Ok(rfs::fsetxattr(
            dir,
            self.ns.redirect(),
            to,
            rfs::XattrFlags::empty(),
        )?)
    }

    /// The directory's entries (without `.` and `..`), with their types.
    pub fn list(&self, dir: BorrowedFd<'_>) -> io::Result<Vec<(Vec<u8>, FileType)>> {
        let mut out = Vec::new();
        for e in rfs::Dir::read_from(dir)? {
            let e = e?;
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            out.push((name.to_vec(), e.file_type()));
        }
        Ok(out)
    }

    fn temp_name(&self) -> CString {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        CString::new(format!("t{}.{n}", std::process::id())).expect("no NUL")
    }

    /// Makes an object in the work directory, complete with metadata, xattrs and
    /// contents; returns its temporary name there.
    fn make(&self, meta: &Meta, contents: Contents<'_>) -> io::Result<CString> {
        let tmp = self.temp_name();
        let work = self.work.as_fd();
        let made = (|| -> io::Result<()> {
            make_bare(work, &tmp, meta, contents)?;
            let st = rfs::statat(work, tmp.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            finish(work, &tmp, meta, &st, true)?;
            let t = rfs::Timestamps {
                last_access: rfs::Timespec {
                    tv_sec: meta.mtime.0,
                    tv_nsec: meta.mtime.1 as _,
                },
                last_modification: rfs::Timespec {
                    tv_sec: meta.mtime.0,
                    tv_nsec: meta.mtime.1 as _,
                },
            };
            rfs::utimensat(work, tmp.as_c_str(), &t, AtFlags::SYMLINK_NOFOLLOW)?;
            Ok(())
        })();
        match made {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = remove_named(work, tmp.as_c_str());
                Err(e)
            }
        }
    }

    /// Makes `name` in `dir` atomically (it must not exist yet); returns its lstat.
    pub fn create(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        meta: &Meta,
        contents: Contents<'_>,
    ) -> io::Result<Stat> {
        let tmp = self.make(meta, contents)?;
        let target = cstr(name)?;
        self.move_in(&tmp, dir, &target)?;
        Ok(rfs::statat(
            dir,
            target.as_c_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// Moves the finished object `tmp` from the work directory to `target` in `dir`, which
    /// must not exist; on failure `tmp` is removed.
    fn move_in(&self, tmp: &CStr, dir: BorrowedFd<'_>, target: &CStr) -> io::Result<()> {
        rfs::renameat_with(self.work.as_fd(), tmp, dir, target, RenameFlags::NOREPLACE).map_err(
            |e| {
                let _ = remove_named(self.work.as_fd(), tmp);
                e.into()
            },
        )
    }

    /// Makes a new, empty object `name` in `dir` directly (nothing to hide or to copy, so
    /// nothing half-made can be seen: like overlayfs, only creation over a whiteout and
    /// copy-up go through the work directory). Times are the host's "now". With
    /// `inherit_acl`, the parent's default ACL (applied by the host) decides the mode.
    /// Returns its lstat and, for a regular file, a descriptor open for reading and writing.
    pub fn create_fresh(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        meta: &Meta,
        contents: Contents<'_>,
        inherit_acl: bool,
    ) -> io::Result<(Stat, Option<OwnedFd>)> {
        let c = cstr(name)?;
        let file = make_bare(dir, &c, meta, contents)?;
        let done = (|| -> io::Result<Stat> {
            let st = match &file {
                Some(f) => rfs::fstat(f)?,
                None => rfs::statat(dir, c.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?,
            };
            // With a default ACL inherited from the parent, the host already made the mode
            // what POSIX says it is.
            if !finish(dir, &c, meta, &st, !inherit_acl)? {
                return Ok(st);
            }
            Ok(rfs::statat(dir, c.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?)
        })();
        match done {
            Ok(st) => Ok((st, file)),
            Err(e) => {
                let _ = remove_named(dir, c.as_c_str());
                Err(e)
            }
        }
    }

    /// Makes `name` in `dir` atomically in place of what is there now (a whiteout, or an
    /// empty directory of whiteouts); returns its lstat.
    pub fn replace(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        meta: &Meta,
        contents: Contents<'_>,
    ) -> io::Result<Stat> {
        let tmp = self.make(meta, contents)?;
        let target = cstr(name)?;
        let swapped = rfs::renameat_with(
            self.work.as_fd(),
            tmp.as_c_str(),
            dir,
            target.as_c_str(),
            RenameFlags::EXCHANGE,
        );
        match swapped {
            // The old entry is now in the work directory under the temporary name.
            Ok(()) => {
                let _ = remove_named(self.work.as_fd(), tmp.as_c_str());
            }
            Err(rustix::io::Errno::NOENT) => self.move_in(&tmp, dir, &target)?,
            Err(e) => {
                let _ = remove_named(self.work.as_fd(), tmp.as_c_str());
                return Err(e.into());
            }
        }
        Ok(rfs::statat(
            dir,
            target.as_c_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// Puts a whiteout at `name` in `dir`, atomically replacing whatever is there.
    pub fn whiteout(&self, dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
        let meta = Meta {
            mode: rfs::FileType::CharacterDevice.as_raw_mode(),
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            mtime: now(),
            rdev: overlay::WHITEOUT_DEVICE,
            xattrs: Vec::new(),
        };
        self.replace(dir, name, &meta, Contents::Special)
            .map(|_| ())
    }

    /// Marks a directory opaque (`opaque = y` in our namespace).
    pub fn set_opaque(&self, dir: BorrowedFd<'_>) -> io::Result<()> {
        Ok(rfs::fsetxattr(
            dir,
            self.ns.opaque(),
            overlay::OPAQUE,
            rfs::XattrFlags::empty(),
        )?)
    }

    /// Removes `name` from `dir`: a directory with everything in it (whiteouts, in the
    /// cases the stack allows), anything else as it is.
    pub fn remove(&self, dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
        remove_named(dir, cstr(name)?.as_c_str())
    }
}

/// Our directory in the claimed work directory, made if missing. Refused when it, or
/// anything in it, is a mount point: emptying it must never reach into another
/// filesystem (a bind mount left there, or made by someone else), and nothing is
/// removed before that is known.
fn open_work_subdir(claim: &Claim) -> io::Result<OwnedFd> {
    let work_root = claim.work.as_fd();
    match rfs::mkdirat(work_root, WORK_SUBDIR, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let work = open_subdir(work_root, WORK_SUBDIR)?;
    let shown = claim.work_path.join(WORK_SUBDIR);
    if let Some(mounted) = find_mount(work.as_fd(), claim::mount_id(work_root)?, &shown)? {
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "{}: something is mounted there, and the work directory's cleanup does not \
                 cross into another filesystem: unmount it",
                mounted.display()
            ),
        ));
    }
    Ok(work)
}

/// The first mount point at or below `dir` (shown as `shown`), whose filesystem mount is
/// `mount`; found by each entry's mount id, so bind mounts of the same filesystem count.
fn find_mount(
    dir: BorrowedFd<'_>,
    mount: u64,
    shown: &std::path::Path,
) -> io::Result<Option<std::path::PathBuf>> {
    if claim::mount_id(dir)? != mount {
        return Ok(Some(shown.to_path_buf()));
    }
    let mut todo = vec![(dir.try_clone_to_owned()?, shown.to_path_buf())];
    while let Some((fd, path)) = todo.pop() {
        for name in entry_names(fd.as_fd())? {
            let here = path.join(show(name.to_bytes()));
            let sx = rfs::statx(
                &fd,
                name.as_c_str(),
                AtFlags::SYMLINK_NOFOLLOW,
                rfs::StatxFlags::MNT_ID | rfs::StatxFlags::TYPE,
            )?;
            if sx.stx_mnt_id != mount {
                return Ok(Some(here));
            }
            if FileType::from_raw_mode(sx.stx_mode.into()) == FileType::Directory {
                let sub = open_subdir(&fd, name.as_c_str())?;
                todo.push((sub, here));
            }
        }
    }
    Ok(None)
}

/// A directory's entry names, without `.` and `..`.
fn entry_names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    Ok(rfs::Dir::read_from(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.to_bytes() != b"." && n.to_bytes() != b"..")
        .collect())
}

fn now() -> (i64, u32) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

/// Makes the bare object `name` in `dir` with `meta`'s type and permissions; a regular
/// file is filled from `contents` (and made durable) and returned open for reading and
/// writing.
fn make_bare(
    dir: BorrowedFd<'_>,
    name: &CStr,
    meta: &Meta,
    contents: Contents<'_>,
) -> io::Result<Option<OwnedFd>> {
    let perm = Mode::from_raw_mode(meta.mode & 0o7777);
    match contents {
        Contents::Dir => rfs::mkdirat(dir, name, perm)?,
        Contents::Symlink(target) => rfs::symlinkat(cstr(target)?.as_c_str(), dir, name)?,
        Contents::Special => rfs::mknodat(
            dir,
            name,
            FileType::from_raw_mode(meta.mode),
            perm,
            rfs::makedev(meta.rdev.0, meta.rdev.1),
        )?,
        Contents::File { size, read } => {
            let f = rfs::openat(
                dir,
                name,
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                perm,
            )?;
            // Copied data is durable before it becomes visible under its name (as
            // overlayfs does); a new empty file has nothing to lose.
            if size > 0 {
                copy_into(&f, size, read)?;
                rfs::fsync(&f)?;
            }
            return Ok(Some(f));
        }
    }
    Ok(None)
}

/// Gives the object `name` in `dir` (whose lstat is `st`) `meta`'s owner, its permissions
/// when `set_mode` (the daemon's umask, or chown clearing set-id bits, must not change what
/// was asked for), and its xattrs; true when that changed anything.
fn finish(
    dir: BorrowedFd<'_>,
    name: &CStr,
    meta: &Meta,
    st: &Stat,
    set_mode: bool,
) -> io::Result<bool> {
    let at = host::objects::Handle::At(dir, name);
    let chown = (st.st_uid, st.st_gid) != (meta.uid, meta.gid);
    if chown {
        at.chown(meta.uid, meta.gid)?;
    }
    let is_link = FileType::from_raw_mode(meta.mode) == FileType::Symlink;
    let chmod = !is_link && set_mode && (chown || st.st_mode & 0o7777 != meta.mode & 0o7777);
    if chmod {
        at.chmod(meta.mode)?;
    }
    for (xname, value) in &meta.xattrs {
        at.setxattr(xname, value)?;
    }
    Ok(chown || chmod || !meta.xattrs.is_empty())
}

/// Copies a lower file up. Its source has no map of its holes, so runs of zeros are left
/// holes: a copied-up sparse file stays sparse.
fn copy_into(
    f: &OwnedFd,
    size: u64,
    read: &mut dyn FnMut(u64, &mut [u8]) -> io::Result<usize>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut all_data = |_| {
        Ok(Run {
            end: size,
            data: true,
        })
    };
    write_sparse(f.as_fd(), size, &mut buf, Zeros::Hole, &mut all_data, read)
}

/// Removes `name` in `dir`, recursively for a directory.
fn remove_named(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    match rfs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => return Ok(()),
        Err(rustix::io::Errno::ISDIR) | Err(rustix::io::Errno::PERM) => {}
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let sub = open_subdir(dir, name)?;
    // Never into another filesystem mounted here: EBUSY, as rmdir of it would say.
    if claim::mount_id(sub.as_fd())? != claim::mount_id(dir)? {
        return Err(rustix::io::Errno::BUSY.into());
    }
    remove_contents(sub.as_fd())?;
    Ok(rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

/// Empties a directory.
fn remove_contents(dir: BorrowedFd<'_>) -> io::Result<()> {
    for n in entry_names(dir)? {
        remove_named(dir, n.as_c_str())?;
    }
    Ok(())
}

/// A name as an `OsStr`, for error messages.
pub fn show(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}
