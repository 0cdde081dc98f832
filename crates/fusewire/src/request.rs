//! The typed requests verilay serves, borrowing names and data from the request buffer.

use crate::abi;
use std::time::SystemTime;
use zerocopy::FromBytes;

/// Who sent a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A time a SETATTR sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The changes of a SETATTR (`None` stays as it is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<SystemTime>,
    /// The handle the change came through.
    pub fh: Option<u64>,
    pub lock_owner: Option<u64>,
    /// With HANDLE_KILLPRIV_V2: the caller lacks CAP_FSETID, drop setuid/setgid.
    pub kill_suidgid: bool,
}

/// One decoded request. Inode numbers are the kernel's node ids (1 is the root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
    },
    Destroy,
    Lookup {
        parent: u64,
        name: &'a [u8],
    },
    Forget {
        ino: u64,
        nlookup: u64,
    },
    /// (node id, nlookup) pairs, 16 bytes each: read them with [`Request::forgets`].
    BatchForget {
        entries: &'a [u8],
    },
    Interrupt {
        unique: u64,
    },
    GetAttr {
        ino: u64,
        fh: Option<u64>,
    },
    SetAttr {
        ino: u64,
        set: SetAttr,
    },
    ReadLink {
        ino: u64,
    },
    Symlink {
        parent: u64,
        name: &'a [u8],
        target: &'a [u8],
    },
    MkNod {
        parent: u64,
        name: &'a [u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    MkDir {
        parent: u64,
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    Unlink {
        parent: u64,
        name: &'a [u8],
    },
    RmDir {
        parent: u64,
        name: &'a [u8],
    },
    /// RENAME (flags 0) and RENAME2.
    Rename {
        parent: u64,
        name: &'a [u8],
        new_parent: u64,
        new_name: &'a [u8],
        flags: u32,
    },
    Link {
        ino: u64,
        new_parent: u64,
        new_name: &'a [u8],
    },
    Open {
        ino: u64,
        flags: i32,
        kill_suidgid: bool,
    },
    Create {
        parent: u64,
        name: &'a [u8],
        mode: u32,
        umask: u32,
        flags: i32,
        kill_suidgid: bool,
    },
    Read {
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        flags: i32,
        lock_owner: Option<u64>,
    },
    Write {
        ino: u64,
        fh: u64,
        offset: u64,
        data: &'a [u8],
        flags: i32,
        write_flags: u32,
        lock_owner: Option<u64>,
    },
    Flush {
        ino: u64,
        fh: u64,
        lock_owner: u64,
    },
    Release {
        ino: u64,
        fh: u64,
        flags: i32,
        release_flags: u32,
        lock_owner: u64,
    },
    Fsync {
        ino: u64,
        fh: u64,
        datasync: bool,
    },
    Fallocate {
        ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    },
    Lseek {
        ino: u64,
        fh: u64,
        offset: u64,
        whence: u32,
    },
    OpenDir {
        ino: u64,
        flags: i32,
    },
    ReadDir {
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    },
    ReadDirPlus {
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    },
    ReleaseDir {
        ino: u64,
        fh: u64,
        flags: i32,
    },
    FsyncDir {
        ino: u64,
        fh: u64,
        datasync: bool,
    },
    StatFs {
        ino: u64,
    },
    Access {
        ino: u64,
        mask: u32,
    },
    SetXattr {
        ino: u64,
        name: &'a [u8],
        value: &'a [u8],
        flags: i32,
        setxattr_flags: u32,
    },
    GetXattr {
        ino: u64,
        name: &'a [u8],
        size: u32,
    },
    ListXattr {
        ino: u64,
        size: u32,
    },
    RemoveXattr {
        ino: u64,
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
