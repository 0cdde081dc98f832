//! The FUSE kernel ABI (`include/uapi/linux/fuse.h`, protocol 7.45 as in Linux 6.18): the
//! on-wire structs verilay's operations use, as plain `zerocopy` types (read from and
//! written to byte buffers without `unsafe`), their opcodes and flags.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 45;
/// The oldest minor this crate speaks: 7.36 brought `flags2` (INIT_EXT), which every flag
/// past bit 31 (passthrough, io_uring) travels in.
pub const MIN_KERNEL_MINOR_VERSION: u32 = 36;
pub const ROOT_ID: u64 = 1;
/// The smallest read buffer the kernel accepts on /dev/fuse.
pub const MIN_READ_BUFFER: usize = 8192;

/// `enum fuse_opcode`.
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    /// Counters are kept per opcode below this (the rest share the last slot).
    pub const COUNTED: usize = 64;
}

/// INIT flags, as one 64-bit word: bits 32.. travel in `flags2` (with `INIT_EXT`).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_setattr_in.valid`.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_open_out.open_flags`.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
    pub const PASSTHROUGH: u32 = 1 << 7;
}

pub const GETATTR_FH: u32 = 1 << 0;
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// `fuse_notify_inval_entry_out.flags`: expire the entry instead of dropping it.
pub const EXPIRE_ONLY: u32 = 1 << 0;

/// `enum fuse_notify_code`: the `error` field of a notification's out header.
pub mod notify {
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
    pub const STORE: i32 = 4;
    pub const DELETE: i32 = 6;
}

/// `_IOR(229, 0, uint32_t)`: attach a new /dev/fuse descriptor to a session.
pub const DEV_IOC_CLONE: u64 = 0x8004_e500;
/// `_IOW(229, 1, struct fuse_backing_map)`: register a backing file for passthrough.
pub const DEV_IOC_BACKING_OPEN: u64 = 0x4010_e501;
/// `_IOW(229, 2, uint32_t)`: drop a backing file registration.
pub const DEV_IOC_BACKING_CLOSE: u64 = 0x4004_e502;

/// `enum fuse_uring_cmd`.
pub const URING_CMD_REGISTER: u32 = 1;
pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// Sizes of the two fixed areas of `fuse_uring_req_header`.
pub const URING_IN_OUT_HEADER_SZ: usize = 128;
pub const URING_OP_IN_OUT_SZ: usize = 128;

macro_rules! wire {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $f: $t,)* }
    };
}

wire! {
    /// `struct fuse_in_header`.
    pub struct InHeader {
        pub len: u32,
        pub opcode: u32,
        pub unique: u64,
        pub nodeid: u64,
        pub uid: u32,
        pub gid: u32,
        pub pid: u32,
        /// Length of the extension headers after the arguments, in units of 8 bytes.
        pub total_extlen: u16,
        pub padding: u16,
    }
}

wire! {
    /// `struct fuse_out_header`; a notification has `unique` 0 and its code in `error`.
    pub struct OutHeader {
        pub len: u32,
        pub error: i32,
        pub unique: u64,
    }
}

wire! {
    pub struct InitIn {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub flags2: u32,
        pub unused: [u32; 11],
    }
}

wire! {
    pub struct InitOut {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub max_background: u16,
        pub congestion_threshold: u16,
        pub max_write: u32,
        pub time_gran: u32,
        pub max_pages: u16,
        pub map_alignment: u16,
        pub flags2: u32,
        pub max_stack_depth: u32,
        pub request_timeout: u16,
        pub unused: [u16; 11],
    }
}

wire! {
    /// `struct fuse_attr`.
    pub struct Attr {
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub rdev: u32,
        pub blksize: u32,
        pub flags: u32,
    }
}

wire! {
    pub struct EntryOut {
        pub nodeid: u64,
        pub generation: u64,
        pub entry_valid: u64,
        pub attr_valid: u64,
        pub entry_valid_nsec: u32,
        pub attr_valid_nsec: u32,
        pub attr: Attr,
    }
}

wire! {
    pub struct AttrOut {
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub dummy: u32,
        pub attr: Attr,
    }
}

wire! {
    pub struct ForgetIn { pub nlookup: u64, }
}

wire! {
    pub struct ForgetOne { pub nodeid: u64, pub nlookup: u64, }
}

wire! {
    pub struct BatchForgetIn { pub count: u32, pub dummy: u32, }
}

wire! {
    pub struct GetattrIn { pub getattr_flags: u32, pub dummy: u32, pub fh: u64, }
}

wire! {
    pub struct SetattrIn {
        pub valid: u32,
        pub padding: u32,
        pub fh: u64,
        pub size: u64,
        pub lock_owner: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub unused4: u32,
        pub uid: u32,
        pub gid: u32,
        pub unused5: u32,
    }
}

wire! {
    pub struct MknodIn { pub mode: u32, pub rdev: u32, pub umask: u32, pub padding: u32, }
}

wire! {
    pub struct MkdirIn { pub mode: u32, pub umask: u32, }
}

wire! {
    pub struct RenameIn { pub newdir: u64, }
}

wire! {
    pub struct Rename2In { pub newdir: u64, pub flags: u32, pub padding: u32, }
}

wire! {
    pub struct LinkIn { pub oldnodeid: u64, }
}

wire! {
    pub struct OpenIn { pub flags: u32, pub open_flags: u32, }
}

wire! {
    pub struct CreateIn { pub flags: u32, pub mode: u32, pub umask: u32, pub open_flags: u32, }
}

wire! {
    pub struct OpenOut { pub fh: u64, pub open_flags: u32, pub backing_id: i32, }
}

wire! {
    pub struct ReleaseIn { pub fh: u64, pub flags: u32, pub release_flags: u32, pub lock_owner: u64, }
}

wire! {
    pub struct FlushIn { pub fh: u64, pub unused: u32, pub padding: u32, pub lock_owner: u64, }
}

wire! {
    pub struct ReadIn {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub read_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }
}

wire! {
    pub struct WriteIn {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub write_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }
}

wire! {
    pub struct WriteOut { pub size: u32, pub padding: u32, }
}

wire! {
    /// `struct fuse_kstatfs` (the whole of `fuse_statfs_out`).
    pub struct Kstatfs {
        pub blocks: u64,
        pub bfree: u64,
        pub bavail: u64,
        pub files: u64,
        pub ffree: u64,
        pub bsize: u32,
        pub namelen: u32,
        pub frsize: u32,
        pub padding: u32,
        pub spare: [u32; 6],
    }
}

wire! {
    pub struct FsyncIn { pub fh: u64, pub fsync_flags: u32, pub padding: u32, }
}

wire! {
    /// `struct fuse_setxattr_in` with SETXATTR_EXT; without it the kernel sends only the
    /// first 8 bytes (`FUSE_COMPAT_SETXATTR_IN_SIZE`).
    pub struct SetxattrIn { pub size: u32, pub flags: u32, pub setxattr_flags: u32, pub padding: u32, }
}

wire! {
    pub struct GetxattrIn { pub size: u32, pub padding: u32, }
}

wire! {
    pub struct GetxattrOut { pub size: u32, pub padding: u32, }
}

wire! {
    pub struct AccessIn { pub mask: u32, pub padding: u32, }
}

wire! {
    pub struct InterruptIn { pub unique: u64, }
}

wire! {
    pub struct FallocateIn { pub fh: u64, pub offset: u64, pub length: u64, pub mode: u32, pub padding: u32, }
}

wire! {
    pub struct LseekIn { pub fh: u64, pub offset: u64, pub whence: u32, pub padding: u32, }
}

wire! {
    pub struct LseekOut { pub offset: u64, }
}

wire! {
    /// `struct fuse_dirent` without its name (which follows, padded to 8 bytes).
    pub struct Dirent { pub ino: u64, pub off: u64, pub namelen: u32, pub typ: u32, }
}

wire! {
    pub struct NotifyInvalInodeOut { pub ino: u64, pub off: i64, pub len: i64, }
}

wire! {
    pub struct NotifyInvalEntryOut { pub parent: u64, pub namelen: u32, pub flags: u32, }
}

wire! {
    pub struct NotifyDeleteOut { pub parent: u64, pub child: u64, pub namelen: u32, pub padding: u32, }
}

wire! {
    pub struct NotifyStoreOut { pub nodeid: u64, pub offset: u64, pub size: u32, pub padding: u32, }
}

wire! {
    /// `struct fuse_backing_map`, the argument of `FUSE_DEV_IOC_BACKING_OPEN`.
    pub struct BackingMap { pub fd: i32, pub flags: u32, pub padding: u64, }
}

wire! {
    /// `struct fuse_uring_ent_in_out`.
    pub struct UringEntInOut {
        pub flags: u64,
        /// The request's `unique`, echoed by COMMIT_AND_FETCH.
        pub commit_id: u64,
        /// Bytes of the payload buffer used: the request's, then the reply's.
        pub payload_sz: u32,
        pub padding: u32,
        pub reserved: u64,
    }
}

/// `struct fuse_uring_req_header`: `in_out` holds the in header of a request and the out
/// header of its reply, `op_in` the request's first argument.
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringReqHeader {
    pub in_out: [u8; URING_IN_OUT_HEADER_SZ],
    pub op_in: [u8; URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: UringEntInOut,
}

wire! {
    /// `struct fuse_uring_cmd_req`, at the start of the 80-byte command area of an SQE.
    pub struct UringCmdReq { pub flags: u64, pub commit_id: u64, pub qid: u16, pub padding: [u8; 6], }
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<InHeader>() == 40);
    assert!(size_of::<OutHeader>() == 16);
    assert!(size_of::<InitIn>() == 64);
    assert!(size_of::<InitOut>() == 64);
    assert!(size_of::<Attr>() == 88);
    assert!(size_of::<EntryOut>() == 128);
    assert!(size_of::<AttrOut>() == 104);
    assert!(size_of::<SetattrIn>() == 88);
    assert!(size_of::<ReadIn>() == 40);
    assert!(size_of::<WriteIn>() == 40);
    assert!(size_of::<Kstatfs>() == 80);
    assert!(size_of::<Dirent>() == 24);
    assert!(size_of::<UringReqHeader>() == 288);
    assert!(size_of::<UringCmdReq>() == 24);
    assert!(size_of::<BackingMap>() == 16);
};

/// `FUSE_COMPAT_SETXATTR_IN_SIZE`: the setxattr argument without SETXATTR_EXT.
pub const COMPAT_SETXATTR_IN_SIZE: usize = 8;

/// Size of a request's first (fixed) argument: on /dev/fuse it leads the body, over io_uring
/// the kernel puts it in `op_in` and the rest of the body in the payload buffer.
/// `setxattr_ext` says whether SETXATTR_EXT was negotiated (it widens SETXATTR's).
pub fn first_arg_size(opcode: u32, setxattr_ext: bool) -> usize {
    use std::mem::size_of;
    match opcode {
        op::FORGET => size_of::<ForgetIn>(),
        op::GETATTR => size_of::<GetattrIn>(),
        op::SETATTR => size_of::<SetattrIn>(),
        op::MKNOD => size_of::<MknodIn>(),
        op::MKDIR => size_of::<MkdirIn>(),
        op::RENAME => size_of::<RenameIn>(),
        op::RENAME2 => size_of::<Rename2In>(),
        op::LINK => size_of::<LinkIn>(),
        op::OPEN | op::OPENDIR => size_of::<OpenIn>(),
        op::CREATE => size_of::<CreateIn>(),
        op::READ | op::READDIR | op::READDIRPLUS => size_of::<ReadIn>(),
        op::WRITE => size_of::<WriteIn>(),
        op::RELEASE | op::RELEASEDIR => size_of::<ReleaseIn>(),
        op::FLUSH => size_of::<FlushIn>(),
        op::FSYNC | op::FSYNCDIR => size_of::<FsyncIn>(),
        op::SETXATTR if setxattr_ext => size_of::<SetxattrIn>(),
        op::SETXATTR => COMPAT_SETXATTR_IN_SIZE,
        op::GETXATTR | op::LISTXATTR => size_of::<GetxattrIn>(),
        op::ACCESS => size_of::<AccessIn>(),
        op::INIT => size_of::<InitIn>(),
        op::INTERRUPT => size_of::<InterruptIn>(),
        op::BATCH_FORGET => size_of::<BatchForgetIn>(),
        op::FALLOCATE => size_of::<FallocateIn>(),
        op::LSEEK => size_of::<LseekIn>(),
        // LOOKUP, SYMLINK, UNLINK, RMDIR, READLINK, STATFS, REMOVEXATTR, DESTROY: an
        // empty first argument (since 6.14), the names in the payload.
        _ => 0,
    }
}

/// The opcode's name, for counters and messages.
pub fn op_name(opcode: u32) -> &'static str {
    match opcode {
        op::LOOKUP => "LOOKUP",
        op::FORGET => "FORGET",
        op::GETATTR => "GETATTR",
        op::SETATTR => "SETATTR",
        op::READLINK => "READLINK",
        op::SYMLINK => "SYMLINK",
        op::MKNOD => "MKNOD",
        op::MKDIR => "MKDIR",
        op::UNLINK => "UNLINK",
        op::RMDIR => "RMDIR",
        op::RENAME => "RENAME",
        op::LINK => "LINK",
        op::OPEN => "OPEN",
        op::READ => "READ",
        op::WRITE => "WRITE",
        op::STATFS => "STATFS",
        op::RELEASE => "RELEASE",
        op::FSYNC => "FSYNC",
        op::SETXATTR => "SETXATTR",
        op::GETXATTR => "GETXATTR",
        op::LISTXATTR => "LISTXATTR",
        op::REMOVEXATTR => "REMOVEXATTR",
        op::FLUSH => "FLUSH",
        op::INIT => "INIT",
        op::OPENDIR => "OPENDIR",
        op::READDIR => "READDIR",
        op::RELEASEDIR => "RELEASEDIR",
        op::FSYNCDIR => "FSYNCDIR",
        op::ACCESS => "ACCESS",
        op::CREATE => "CREATE",
        op::INTERRUPT => "INTERRUPT",
        op::DESTROY => "DESTROY",
        op::BATCH_FORGET => "BATCH_FORGET",
        op::FALLOCATE => "FALLOCATE",
        op::READDIRPLUS => "READDIRPLUS",
        op::RENAME2 => "RENAME2",
        op::LSEEK => "LSEEK",
        _ => "other",
    }
}
