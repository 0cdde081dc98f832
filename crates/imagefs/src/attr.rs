//! Attributes as the kernel is told them: from an image inode, or from a host file's stat.

use erofs::format::{S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFSOCK};
use erofs::read::Inode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An object's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    RegularFile,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A named pipe (FIFO).
    NamedPipe,
    /// A Unix domain socket.
    Socket,
}

/// An object's attributes, as a reply carries them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Size, in bytes.
    pub size: u64,
    /// In 512-byte units.
    pub blocks: u64,
    /// Last access time.
    pub atime: SystemTime,
    /// Last modification time.
    pub mtime: SystemTime,
    /// Last status change time.
    pub ctime: SystemTime,
    /// Creation time.
    pub crtime: SystemTime,
    /// Type.
    pub kind: Kind,
    /// Permission bits (the mode less its type bits).
    pub perm: u16,
    /// Number of hard links.
    pub nlink: u32,
    /// Owner's user id.
    pub uid: u32,
    /// Owner's group id.
    pub gid: u32,
    /// As `new_encode_dev()`, which the kernel decodes FUSE's rdev with.
    pub rdev: u32,
    /// Preferred I/O block size, in bytes.
    pub blksize: u32,
}

impl Attr {
    /// Attributes of an image inode, reported as inode number `ino`.
    pub(crate) fn of_inode(ino: u64, i: &Inode, block_size: u32) -> Attr {
        let t = time(i.mtime, i.mtime_nsec);
        let (major, minor) = i.rdev;
        Attr {
            ino,
            size: i.size,
            // As the kernel's erofs reports it (compressed files: their clusters' blocks).
            blocks: i.stat_blocks(block_size),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: kind(i.mode.into()),
            perm: i.mode & 0o7777,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: encode_dev(major, minor),
            blksize: block_size,
        }
    }

    /// Attributes of a host file, reported as inode number `ino`.
    pub(crate) fn of_stat(ino: u64, st: &rustix::fs::Stat) -> Attr {
        let t = |s: i64, ns: u64| time(s, ns.min(999_999_999) as u32);
        Attr {
            ino,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: t(st.st_atime as i64, st.st_atime_nsec),
            mtime: t(st.st_mtime as i64, st.st_mtime_nsec),
            ctime: t(st.st_ctime as i64, st.st_ctime_nsec),
            crtime: t(st.st_mtime as i64, st.st_mtime_nsec),
            kind: kind(st.st_mode),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: encode_dev(rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev)),
            blksize: st.st_blksize as u32,
        }
    }

    /// A negative entry: nodeid 0 with a timeout makes the kernel cache the miss.
    pub fn negative() -> Attr {
        Attr {
            ino: 0,
            size: 0,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: Kind::RegularFile,
            perm: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 0,
        }
    }
}

/// new_encode_dev(), which the kernel decodes FUSE's rdev with.
pub(crate) fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

pub(crate) fn time(secs: i64, nsec: u32) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(nsec.min(999_999_999)));
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nsec
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nsec
    }
}

/// The type in a mode's `S_IFMT` bits.
pub(crate) fn kind(mode: u32) -> Kind {
    match (mode & u32::from(S_IFMT)) as u16 {
        S_IFDIR => Kind::Directory,
        S_IFLNK => Kind::Symlink,
        S_IFCHR => Kind::CharDevice,
        S_IFBLK => Kind::BlockDevice,
        S_IFIFO => Kind::NamedPipe,
        S_IFSOCK => Kind::Socket,
        _ => Kind::RegularFile,
    }
}

/// The type an EROFS directory entry records.
pub(crate) fn kind_of_dirent(ft: u8) -> Kind {
    use erofs::format::*;
    match ft {
        FT_DIR => Kind::Directory,
        FT_SYMLINK => Kind::Symlink,
        FT_CHRDEV => Kind::CharDevice,
        FT_BLKDEV => Kind::BlockDevice,
        FT_FIFO => Kind::NamedPipe,
        FT_SOCK => Kind::Socket,
        _ => Kind::RegularFile,
    }
}
