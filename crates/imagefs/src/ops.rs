//! The operations a mount serves, free of any transport: plain methods on typed arguments,
//! implemented by [`crate::ImageFs`] and [`crate::UnionFs`], called by the FUSE adapter
//! (`fuse.rs`). An operation not served answers as an unimplemented FUSE handler does
//! (ENOSYS; EPERM for symlink and link).

use crate::attr::{Attr, Kind};
use rustix::fd::BorrowedFd;
use std::any::Any;
use std::io;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

pub use rustix::fs::RenameFlags;
pub use rustix::io::Errno;

/// Where integrity failures and other serving errors are reported (one line each).
pub type Logger = Box<dyn Fn(&str) + Send + Sync>;

/// Who may use a mount (the kernel lets others in only with `allow_other`; the session
/// checks the rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The mounting user alone (root, for a root mount).
    Owner,
    /// Root and the mounting user (`allow_root`; for a root mount, the same).
    RootAndOwner,
    /// Every user (`allow_other`).
    All,
}

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// The caller's user id.
    pub uid: u32,
    /// The caller's group id.
    pub gid: u32,
    /// The caller's process id, as the request carries it.
    pub pid: u32,
}

/// What a filesystem asks of the kernel at INIT (each optional: a kernel that lacks one
/// does without), and how long the kernel may cache its replies. Both ask for
/// asynchronous and 1 MiB reads and parallel directory operations; the rest differs, as
/// each field says.
#[derive(Clone, Copy, Debug)]
pub struct Wants {
    /// Entries, attributes and negative lookups: forever for images (100 years), a year
    /// for a writable mount (it tells the kernel of the changes it cannot see).
    pub ttl: Duration,
    /// READDIRPLUS for every listing (read-only; a writable mount lists plainly).
    pub readdirplus: bool,
    /// Symlink targets cached by the kernel (read-only).
    pub cache_symlinks: bool,
    /// FUSE_POSIX_ACL: always on a writable mount, on a read-only one only when some
    /// layer holds an ACL.
    pub posix_acl: bool,
    /// No OPEN round trip (read-only, when nothing is measured).
    pub no_open: bool,
    /// No OPENDIR round trip (read-only).
    pub no_opendir: bool,
    /// The umask is the filesystem's to apply (writable: a parent's default ACL replaces it).
    pub dont_mask: bool,
    /// Big (1 MiB) writes (writable).
    pub writes: bool,
    /// Upper files read and written by the kernel itself (writable, as root).
    pub passthrough: bool,
    /// Setuid, setgid and file capabilities dropped on write, truncate and chown by the
    /// filesystem, told per request whether the caller lacks CAP_FSETID
    /// (FUSE_HANDLE_KILLPRIV_V2; writable). The kernel then caches that a file has
    /// none to drop, instead of asking for `security.capability` on every write.
    pub kills_privileges: bool,
    /// The kernel's background queue and congestion threshold (read-only: 64 and 48;
    /// a writable mount keeps the kernel's defaults).
    pub background: Option<(u16, u16)>,
    /// An asynchronous direct read (erofs reading the kernel engine's image files) left
    /// in flight while the reader goes on (FUSE_ASYNC_DIO): its next reads can be served
    /// at once, on other workers.
    pub async_dio: bool,
}

/// What the kernel agreed to at INIT, of what [`Wants`] asked.
#[derive(Clone, Copy, Debug, Default)]
pub struct Granted {
    /// No OPEN round trip.
    pub no_open: bool,
    /// No OPENDIR round trip.
    pub no_opendir: bool,
    /// Upper files read and written by the kernel itself.
    pub passthrough: bool,
}

/// How the kernel is told of changes it cannot see, and handed pages (notifications).
pub trait Notify: Send + Sync {
    /// Hands the kernel `data` as `ino`'s cached pages from `offset` on.
    fn store(&self, ino: u64, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Whether a store now would be let through (a hint: `store` decides).
    fn may_store(&self) -> bool;
    /// Drops cached attributes (and pages from `offset` on, for `len` bytes; a negative
    /// offset leaves pages alone).
    fn inval_inode(&self, ino: u64, offset: i64, len: i64) -> io::Result<()>;
    /// Drops the kernel's cached entry `name` in directory `parent`.
    fn inval_entry(&self, parent: u64, name: &[u8]) -> io::Result<()>;
}

/// Where the transport puts its notifier once the session exists.
pub type NotifierSlot = Arc<OnceLock<Box<dyn Notify>>>;

/// A file registered for passthrough (the kernel reads and writes it itself), once per
/// inode; dropping it ends the registration. What it holds is the transport's.
pub struct Passthrough(Box<dyn Any + Send + Sync>);

impl Passthrough {
    /// Wraps the transport's registration.
    pub fn new<T: Any + Send + Sync>(registration: T) -> Passthrough {
        Passthrough(Box::new(registration))
    }

    /// The registration, if it is a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

/// Registers an open descriptor of a file for passthrough.
pub type Register<'a> = &'a dyn Fn(BorrowedFd<'_>) -> io::Result<Passthrough>;

/// An open file or directory: its handle, and how the kernel is to treat its pages.
#[derive(Clone, Default)]
pub struct Opened {
    /// The handle, passed back with each request on the open file.
    pub fh: u64,
    /// Cached pages stay valid (images never change).
    pub keep_cache: bool,
    /// Directory listings are cached too.
    pub cache_dir: bool,
    /// read(2) and write(2) bypass the page cache (each is a request); pages reached
    /// through `read_folio` (mmap, a filesystem's metadata reads) are still cached.
    pub direct_io: bool,
    /// The kernel does the file's I/O itself.
    pub passthrough: Option<Arc<Passthrough>>,
}

/// A file made and opened at once.
pub struct Created {
    /// The new file's attributes.
    pub attr: Attr,
    /// Its handle.
    pub fh: u64,
    /// The kernel does the file's I/O itself.
    pub passthrough: Option<Arc<Passthrough>>,
}

/// A time to set: now, or this one.
#[derive(Clone, Copy, Debug)]
pub enum SetTime {
    /// The time the request is handled.
    Now,
    /// This time.
    At(SystemTime),
}

/// The changes of a SETATTR (what is `None` stays).
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    /// New mode.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size, in bytes.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
    /// The handle the change came through, if any.
    pub fh: Option<u64>,
    /// With [`Wants::kills_privileges`], the caller whose change (a write, truncate or
    /// chown) drops a regular file's setuid and setgid bits and `security.capability`,
    /// as the VFS drops them for this caller.
    pub kill_privileges: Option<Caller>,
}

impl SetAttr {
    /// Whether this sets nothing: with HANDLE_KILLPRIV_V2 that is the kernel's
    /// `file_remove_privs` (a write, fallocate or passthrough write by a caller without
    /// CAP_FSETID to a setuid, setgid or capability-holding file; fs/fuse/dir.c fuse_setattr
    /// drops the mode change it computed and sends the rest) or `chown(-1, -1)`, which drops
    /// them too. On a passthrough write no WRITE follows to carry the flag, so this request
    /// is the only word the filesystem gets. (OPEN never carries OPEN_KILL_SUIDGID here: the
    /// kernel sets it only for an O_TRUNC it passes on, and without ATOMIC_O_TRUNC it strips
    /// O_TRUNC and truncates with a SETATTR of the size, which carries FATTR_KILL_SUIDGID.)
    /// (The kernel sends a ctime only with the writeback cache, which no mount asks for.)
    pub fn changes_nothing(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.size.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
    }
}

/// One entry of a directory listing, and the offset of the one after it.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry<'a> {
    /// The entry's inode number.
    pub ino: u64,
    /// Offset of the entry after it (where a listing resumes).
    pub next: u64,
    /// The entry's type.
    pub kind: Kind,
    /// The entry's name.
    pub name: &'a [u8],
}

/// What statfs reports.
#[derive(Clone, Copy, Debug)]
pub struct Statfs {
    /// Total blocks, of `frsize` bytes.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks that unprivileged users may use.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Preferred I/O block size, in bytes.
    pub bsize: u32,
    /// Longest name, in bytes.
    pub namelen: u32,
    /// Fragment size, in bytes: the unit of `blocks`.
    pub frsize: u32,
}

impl Statfs {
    /// A read-only filesystem's: `blocks` of `bsize` bytes, none free; `files` inodes,
    /// `ffree` of them free.
    pub fn read_only(blocks: u64, bsize: u32, files: u64, ffree: u64) -> Statfs {
        Statfs {
            blocks,
            bfree: 0,
            bavail: 0,
            files,
            ffree,
            bsize,
            namelen: 255,
            frsize: bsize,
        }
    }
}

/// Takes a listing's entries until the reply is full (then it returns true).
pub type AddEntry<'a> = &'a mut dyn FnMut(DirEntry<'_>) -> bool;
/// Takes a READDIRPLUS listing's entries with their attributes, until the reply is full.
pub type AddEntryPlus<'a> = &'a mut dyn FnMut(DirEntry<'_>, &Attr) -> bool;

/// The operations of a mount. Inode 1 is the root.
#[allow(unused_variables)]
pub trait Ops: Send + Sync + 'static {
    /// What to ask of the kernel at INIT.
    fn wants(&self) -> Wants;
    /// Called once, after INIT and before any other request.
    fn granted(&mut self, granted: &Granted) {}
    /// Where the transport puts the notifier (how the filesystem tells the kernel of changes).
    fn notifier_slot(&self) -> NotifierSlot;
    /// What `verilay stats` reports of the filesystem (asked once, at mount, after
    /// everything it reports is set up).
    fn stats(&self) -> crate::stats::StatsSource {
        std::sync::Arc::new(crate::stats::Stats::new)
    }

    /// `name` in `parent`; `None` when absent (the kernel caches that too).
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Option<Attr>, Errno>;
    /// The kernel drops `nlookup` of its lookups of `ino`.
    fn forget(&self, ino: u64, nlookup: u64) {}
    /// The attributes of `ino`.
    fn getattr(&self, ino: u64) -> Result<Attr, Errno>;
    /// Applies `set` to `ino`; its attributes after.
    fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr, Errno> {
        Err(Errno::NOSYS)
    }
    /// The target of symlink `ino`.
    fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno>;
    /// Makes node `name` in `parent` with `mode` (type and permissions) and device `rdev`,
    /// `umask` as the request carries it; its attributes.
    fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr, Errno> {
        Err(Errno::NOSYS)
    }
    /// Makes directory `name` in `parent`; its attributes.
    fn mkdir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr, Errno> {
        Err(Errno::NOSYS)
    }
    /// Makes symlink `name` in `parent`, pointing at `target`; its attributes.
    fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr, Errno> {
        Err(Errno::PERM)
    }
    /// Makes `new_name` in `new_parent` a hard link to `ino`; its attributes.
    fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr, Errno> {
        Err(Errno::PERM)
    }
    /// Removes non-directory `name` from `parent`.
    fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        Err(Errno::NOSYS)
    }
    /// Removes directory `name` from `parent`.
    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        Err(Errno::NOSYS)
    }
    /// Moves `name` in `parent` to `new_name` in `new_parent`, as renameat2(2) with `flags`.
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        Err(Errno::NOSYS)
    }
    /// Makes regular file `name` in `parent` and opens it with `flags`; `register` registers
    /// it for passthrough.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
        register: Register<'_>,
    ) -> Result<Created, Errno> {
        Err(Errno::NOSYS)
    }
    /// Opens `ino` with `flags` (open(2)'s); `register` registers it for passthrough.
    fn open(
        &self,
        caller: &Caller,
        ino: u64,
        flags: i32,
        register: Register<'_>,
    ) -> Result<Opened, Errno>;
    /// Reads into `buf` (as long as the request asks); how many bytes were read.
    fn read(&self, ino: u64, fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize, Errno>;
    /// Writes `data`; with `kill_privileges`, first drops the file's privileges as
    /// [`SetAttr::kill_privileges`] says.
    fn write(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_privileges: Option<&Caller>,
    ) -> Result<usize, Errno> {
        Err(Errno::NOSYS)
    }
    /// A descriptor of handle `fh` is closed (close(2)).
    fn flush(&self, ino: u64, fh: u64) -> Result<(), Errno> {
        Err(Errno::NOSYS)
    }
    /// A handle is closed; the kernel is answered (always with success) when `answer` is
    /// called, or else on return: work nobody waits for may follow `answer`.
    fn release(&self, ino: u64, fh: u64, answer: &mut dyn FnMut()) {}
    /// Writes `ino`'s data (and its metadata, unless `datasync`) to storage.
    fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> Result<(), Errno> {
        Err(Errno::NOSYS)
    }
    /// Allocates or deallocates `length` bytes at `offset`, as fallocate(2) with `mode`.
    fn fallocate(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        Err(Errno::NOSYS)
    }
    /// Opens directory `ino`.
    fn opendir(&self, ino: u64) -> Result<Opened, Errno> {
        Ok(Opened::default())
    }
    /// Hands the entries from `offset` on to `add`, until it says the reply is full.
    fn readdir(&self, ino: u64, fh: u64, offset: u64, add: AddEntry<'_>) -> Result<(), Errno>;
    /// As `readdir`, each entry with its attributes.
    fn readdirplus(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        add: AddEntryPlus<'_>,
    ) -> Result<(), Errno> {
        Err(Errno::NOSYS)
    }
    /// Handle `fh` of directory `ino` is closed.
    fn releasedir(&self, ino: u64, fh: u64) {}
    /// What statfs reports of the filesystem.
    fn statfs(&self) -> Result<Statfs, Errno>;
    /// Sets extended attribute `name` of `ino` to `value` (`flags` as setxattr(2)'s).
    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<(), Errno> {
        Err(Errno::NOSYS)
    }
    /// Removes extended attribute `name` of `ino`.
    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<(), Errno> {
        Err(Errno::NOSYS)
    }
    /// The value of extended attribute `name` of `ino`, for `caller`.
    fn getxattr(&self, caller: &Caller, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno>;
    /// The names the caller may see, each followed by a NUL.
    fn listxattr(&self, caller: &Caller, ino: u64) -> Result<Vec<u8>, Errno>;
}
