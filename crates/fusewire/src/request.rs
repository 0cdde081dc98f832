//! The typed requests verilay serves, borrowing names and data from the request buffer.

use crate::abi;
use std::time::SystemTime;
use zerocopy::FromBytes;

/// Who sent a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The caller's filesystem user id.
    pub uid: u32,
    /// The caller's filesystem group id.
    pub gid: u32,
    /// The caller's thread group id.
    pub pid: u32,
}

/// A time a SETATTR sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    /// The current time (`UTIME_NOW`).
    Now,
    /// This time.
    At(SystemTime),
}

/// The changes of a SETATTR (`None` stays as it is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New mode.
    pub mode: Option<u32>,
    /// New owner's user id.
    pub uid: Option<u32>,
    /// New owner's group id.
    pub gid: Option<u32>,
    /// New size, in bytes.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
    /// New change time.
    pub ctime: Option<SystemTime>,
    /// The handle the change came through.
    pub fh: Option<u64>,
    /// The lock owner, when the kernel sends one.
    pub lock_owner: Option<u64>,
    /// With HANDLE_KILLPRIV_V2: the caller lacks CAP_FSETID, drop setuid/setgid.
    pub kill_suidgid: bool,
}

/// One decoded request. Inode numbers are the kernel's node ids (1 is the root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// INIT: the kernel's version and what it supports.
    Init {
        /// The kernel's major version.
        major: u32,
        /// The kernel's minor version.
        minor: u32,
        /// The kernel's largest readahead, in bytes.
        max_readahead: u32,
        /// INIT flags the kernel supports (`abi::init`), flags2 included.
        flags: u64,
    },
    /// DESTROY: the session ends.
    Destroy,
    /// LOOKUP: a name in a directory.
    Lookup {
        /// The parent directory's node.
        parent: u64,
        /// The name.
        name: &'a [u8],
    },
    /// FORGET: lookups of a node dropped.
    Forget {
        /// The node.
        ino: u64,
        /// How many lookups to drop.
        nlookup: u64,
    },
    /// (node id, nlookup) pairs, 16 bytes each: read them with [`Request::forgets`].
    BatchForget {
        /// The `abi::ForgetOne` entries, as bytes.
        entries: &'a [u8],
    },
    /// INTERRUPT: a pending request interrupted.
    Interrupt {
        /// The interrupted request's id.
        unique: u64,
    },
    /// GETATTR.
    GetAttr {
        /// The node.
        ino: u64,
        /// The open file, when GETATTR came through one.
        fh: Option<u64>,
    },
    /// SETATTR.
    SetAttr {
        /// The node.
        ino: u64,
        /// The changes.
        set: SetAttr,
    },
    /// READLINK.
    ReadLink {
        /// The node.
        ino: u64,
    },
    /// SYMLINK.
    Symlink {
        /// The parent directory's node.
        parent: u64,
        /// The name.
        name: &'a [u8],
        /// The link's target.
        target: &'a [u8],
    },
    /// MKNOD.
    MkNod {
        /// The parent directory's node.
        parent: u64,
        /// The name.
        name: &'a [u8],
        /// File type and permissions.
        mode: u32,
        /// Device number, for a device node.
        rdev: u32,
        /// The caller's umask.
        umask: u32,
    },
    /// MKDIR.
    MkDir {
        /// The parent directory's node.
        parent: u64,
        /// The name.
        name: &'a [u8],
        /// Permissions.
        mode: u32,
        /// The caller's umask.
        umask: u32,
    },
    /// UNLINK.
    Unlink {
        /// The parent directory's node.
        parent: u64,
        /// The name.
        name: &'a [u8],
    },
    /// RMDIR.
    RmDir {
        /// The parent directory's node.
        parent: u64,
        /// The name.
        name: &'a [u8],
    },
    /// RENAME (flags 0) and RENAME2.
    Rename {
        /// The old parent directory's node.
        parent: u64,
        /// The old name.
        name: &'a [u8],
        /// The new parent directory's node.
        new_parent: u64,
        /// The new name.
        new_name: &'a [u8],
        /// `RENAME_*` flags (0 for RENAME).
        flags: u32,
    },
    /// LINK.
    Link {
        /// The node to link.
        ino: u64,
        /// The new parent directory's node.
        new_parent: u64,
        /// The new name.
        new_name: &'a [u8],
    },
    /// OPEN.
    Open {
        /// The node.
        ino: u64,
        /// open(2) flags.
        flags: i32,
        /// Clear the set-id bits (HANDLE_KILLPRIV_V2).
        kill_suidgid: bool,
    },
    /// CREATE: make and open a regular file.
    Create {
        /// The parent directory's node.
        parent: u64,
        /// The name.
        name: &'a [u8],
        /// File type and permissions.
        mode: u32,
        /// The caller's umask.
        umask: u32,
        /// open(2) flags.
        flags: i32,
        /// Clear the set-id bits (HANDLE_KILLPRIV_V2).
        kill_suidgid: bool,
    },
    /// READ.
    Read {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// Byte offset.
        offset: u64,
        /// Bytes wanted.
        size: u32,
        /// open(2) flags.
        flags: i32,
        /// The lock owner, when the kernel sends one.
        lock_owner: Option<u64>,
    },
    /// WRITE.
    Write {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// Byte offset.
        offset: u64,
        /// The bytes to write.
        data: &'a [u8],
        /// open(2) flags.
        flags: i32,
        /// `FUSE_WRITE_*` flags.
        write_flags: u32,
        /// The lock owner, when the kernel sends one.
        lock_owner: Option<u64>,
    },
    /// FLUSH: a close(2) of an open file.
    Flush {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// The lock owner.
        lock_owner: u64,
    },
    /// RELEASE: the open file's last reference dropped.
    Release {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// open(2) flags.
        flags: i32,
        /// `FUSE_RELEASE_*` flags.
        release_flags: u32,
        /// The lock owner.
        lock_owner: u64,
    },
    /// FSYNC.
    Fsync {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// Sync data only (fdatasync).
        datasync: bool,
    },
    /// FALLOCATE.
    Fallocate {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        length: u64,
        /// fallocate(2) mode (`FALLOC_FL_*`).
        mode: i32,
    },
    /// LSEEK: SEEK_DATA or SEEK_HOLE.
    Lseek {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// Offset to start from.
        offset: u64,
        /// `SEEK_DATA` or `SEEK_HOLE`.
        whence: u32,
    },
    /// OPENDIR.
    OpenDir {
        /// The node.
        ino: u64,
        /// open(2) flags.
        flags: i32,
    },
    /// READDIR.
    ReadDir {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// Where to continue: the `off` of the last entry returned (0: the start).
        offset: u64,
        /// Bytes of entries wanted at most.
        size: u32,
    },
    /// READDIRPLUS: entries with their lookups.
    ReadDirPlus {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// Where to continue: the `off` of the last entry returned (0: the start).
        offset: u64,
        /// Bytes of entries wanted at most.
        size: u32,
    },
    /// RELEASEDIR.
    ReleaseDir {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// open(2) flags.
        flags: i32,
    },
    /// FSYNCDIR.
    FsyncDir {
        /// The node.
        ino: u64,
        /// The handle OPEN (or OPENDIR) returned.
        fh: u64,
        /// Sync data only (fdatasync).
        datasync: bool,
    },
    /// STATFS.
    StatFs {
        /// The node.
        ino: u64,
    },
    /// ACCESS.
    Access {
        /// The node.
        ino: u64,
        /// access(2) mask.
        mask: u32,
    },
    /// SETXATTR.
    SetXattr {
        /// The node.
        ino: u64,
        /// The attribute's name.
        name: &'a [u8],
        /// The value.
        value: &'a [u8],
        /// setxattr(2) flags (`XATTR_CREATE`, `XATTR_REPLACE`).
        flags: i32,
        /// `FUSE_SETXATTR_ACL_KILL_SGID`.
        setxattr_flags: u32,
    },
    /// GETXATTR.
    GetXattr {
        /// The node.
        ino: u64,
        /// The attribute's name.
        name: &'a [u8],
        /// The caller's buffer size (0: asks for the size).
        size: u32,
    },
    /// LISTXATTR.
    ListXattr {
        /// The node.
        ino: u64,
        /// The caller's buffer size (0: asks for the size).
        size: u32,
    },
    /// REMOVEXATTR.
    RemoveXattr {
        /// The node.
        ino: u64,
        /// The attribute's name.
        name: &'a [u8],
    },
}

impl<'a> Request<'a> {
    /// The (node id, nlookup) pairs of a FORGET or BATCH_FORGET.
    pub fn forgets(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        let (one, batch): (Option<(u64, u64)>, &'a [u8]) = match *self {
            Request::Forget { ino, nlookup } => (Some((ino, nlookup)), &[]),
            Request::BatchForget { entries } => (None, entries),
            _ => (None, &[]),
        };
        let batch = <[abi::ForgetOne]>::ref_from_bytes(batch).unwrap_or(&[]);
        one.into_iter()
            .chain(batch.iter().map(|f| (f.nodeid, f.nlookup)))
    }

    /// Whether the kernel waits for a reply (FORGET, BATCH_FORGET and INTERRUPT get none).
    pub fn wants_reply(&self) -> bool {
        !matches!(
            self,
            Request::Forget { .. } | Request::BatchForget { .. } | Request::Interrupt { .. }
        )
    }

    /// The most bytes the reply's body may hold, when the request says (READ, the
    /// listings, GETXATTR/LISTXATTR with a size).
    pub fn reply_limit(&self) -> Option<usize> {
        match *self {
            Request::Read { size, .. }
            | Request::ReadDir { size, .. }
            | Request::ReadDirPlus { size, .. } => Some(size as usize),
            Request::GetXattr { size, .. } | Request::ListXattr { size, .. } if size > 0 => {
                Some(size as usize)
            }
            _ => None,
        }
    }
}
