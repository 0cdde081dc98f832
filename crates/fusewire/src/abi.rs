//! The FUSE kernel ABI (`include/uapi/linux/fuse.h`, protocol 7.45 as in Linux 6.18): the
//! on-wire structs verilay's operations use, as plain `zerocopy` types (read from and
//! written to byte buffers without `unsafe`), their opcodes and flags.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `FUSE_KERNEL_VERSION`: the protocol's major version.
pub const KERNEL_VERSION: u32 = 7;
/// `FUSE_KERNEL_MINOR_VERSION`: the minor version this crate is written against.
pub const KERNEL_MINOR_VERSION: u32 = 45;
/// The oldest minor this crate speaks: 7.36 brought `flags2` (INIT_EXT), which every flag
/// past bit 31 (passthrough, io_uring) travels in.
pub const MIN_KERNEL_MINOR_VERSION: u32 = 36;
/// `FUSE_ROOT_ID`: the node id of the filesystem's root.
pub const ROOT_ID: u64 = 1;
/// The smallest read buffer the kernel accepts on /dev/fuse.
pub const MIN_READ_BUFFER: usize = 8192;

/// `enum fuse_opcode`.
pub mod op {
    /// Look up a name in a directory.
    pub const LOOKUP: u32 = 1;
    /// Drop lookups of a node (no reply).
    pub const FORGET: u32 = 2;
    /// Get a node's attributes.
    pub const GETATTR: u32 = 3;
    /// Set a node's attributes.
    pub const SETATTR: u32 = 4;
    /// Read a symlink's target.
    pub const READLINK: u32 = 5;
    /// Make a symlink.
    pub const SYMLINK: u32 = 6;
    /// Make a device node, FIFO, socket or regular file.
    pub const MKNOD: u32 = 8;
    /// Make a directory.
    pub const MKDIR: u32 = 9;
    /// Remove a non-directory.
    pub const UNLINK: u32 = 10;
    /// Remove a directory.
    pub const RMDIR: u32 = 11;
    /// Rename an entry.
    pub const RENAME: u32 = 12;
    /// Make a hard link.
    pub const LINK: u32 = 13;
    /// Open a file.
    pub const OPEN: u32 = 14;
    /// Read from an open file.
    pub const READ: u32 = 15;
    /// Write to an open file.
    pub const WRITE: u32 = 16;
    /// Get filesystem statistics.
    pub const STATFS: u32 = 17;
    /// Close an open file (its last reference).
    pub const RELEASE: u32 = 18;
    /// Sync an open file.
    pub const FSYNC: u32 = 20;
    /// Set an extended attribute.
    pub const SETXATTR: u32 = 21;
    /// Get an extended attribute.
    pub const GETXATTR: u32 = 22;
    /// List extended attribute names.
    pub const LISTXATTR: u32 = 23;
    /// Remove an extended attribute.
    pub const REMOVEXATTR: u32 = 24;
    /// A close(2) of an open file.
    pub const FLUSH: u32 = 25;
    /// Start the session: negotiate version and flags.
    pub const INIT: u32 = 26;
    /// Open a directory.
    pub const OPENDIR: u32 = 27;
    /// Read directory entries.
    pub const READDIR: u32 = 28;
    /// Close an open directory.
    pub const RELEASEDIR: u32 = 29;
    /// Sync an open directory.
    pub const FSYNCDIR: u32 = 30;
    /// Check access permissions.
    pub const ACCESS: u32 = 34;
    /// Make and open a regular file.
    pub const CREATE: u32 = 35;
    /// Interrupt a pending request.
    pub const INTERRUPT: u32 = 36;
    /// End the session (unmount).
    pub const DESTROY: u32 = 38;
    /// Drop lookups of several nodes (no reply).
    pub const BATCH_FORGET: u32 = 42;
    /// Allocate, punch or zero a file range.
    pub const FALLOCATE: u32 = 43;
    /// Read directory entries with each entry's lookup.
    pub const READDIRPLUS: u32 = 44;
    /// Rename with `RENAME_*` flags.
    pub const RENAME2: u32 = 45;
    /// Find data or a hole (SEEK_DATA, SEEK_HOLE).
    pub const LSEEK: u32 = 46;
    /// Counters are kept per opcode below this (the rest share the last slot).
    pub const COUNTED: usize = 64;
}

/// INIT flags, as one 64-bit word: bits 32.. travel in `flags2` (with `INIT_EXT`).
pub mod init {
    /// Asynchronous read requests.
    pub const ASYNC_READ: u64 = 1 << 0;
    /// Remote POSIX file locks.
    pub const POSIX_LOCKS: u64 = 1 << 1;
    /// The filesystem handles O_TRUNC in OPEN.
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    /// The filesystem handles lookups of "." and "..".
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    /// Writes larger than 4 KiB.
    pub const BIG_WRITES: u64 = 1 << 5;
    /// The kernel does not apply the umask to modes on create.
    pub const DONT_MASK: u64 = 1 << 6;
    /// Cached pages are invalidated when the file's mtime or size changes.
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    /// READDIRPLUS is used.
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    /// The kernel chooses between READDIRPLUS and READDIR.
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    /// Asynchronous direct I/O submission.
    pub const ASYNC_DIO: u64 = 1 << 15;
    /// The writeback cache for buffered writes.
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    /// The kernel supports opens without an OPEN request.
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    /// Parallel lookups and readdirs in one directory.
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    /// The filesystem clears set-id bits and capabilities on write, chown and truncate.
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    /// The filesystem supports POSIX ACLs (the kernel checks them).
    pub const POSIX_ACL: u64 = 1 << 20;
    /// Reading /dev/fuse after an abort returns ECONNABORTED.
    pub const ABORT_ERROR: u64 = 1 << 21;
    /// `InitOut::max_pages` is set.
    pub const MAX_PAGES: u64 = 1 << 22;
    /// READLINK answers are cached.
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    /// The kernel supports opendirs without an OPENDIR request.
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    /// Cached pages are invalidated only when the filesystem asks.
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    /// HANDLE_KILLPRIV with the v2 rules (the kernel says when to clear).
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    /// `SetxattrIn` is the extended struct.
    pub const SETXATTR_EXT: u64 = 1 << 29;
    /// `flags2` carries flags 32..63.
    pub const INIT_EXT: u64 = 1 << 30;
    /// A security context comes with CREATE, MKDIR, SYMLINK and MKNOD.
    pub const SECURITY_CTX: u64 = 1 << 32;
    /// A supplementary group comes with CREATE, MKDIR, SYMLINK and MKNOD.
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    /// The kernel supports expiring an entry instead of dropping it (`EXPIRE_ONLY`).
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    /// Passthrough of reads and writes to a backing file.
    pub const PASSTHROUGH: u64 = 1 << 37;
    /// Export support explicitly off.
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    /// The kernel may resend pending requests (the top bit of `unique` marks one).
    pub const HAS_RESEND: u64 = 1 << 39;
    /// Requests over io_uring.
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_setattr_in.valid`.
pub mod fattr {
    /// `mode` is set.
    pub const MODE: u32 = 1 << 0;
    /// `uid` is set.
    pub const UID: u32 = 1 << 1;
    /// `gid` is set.
    pub const GID: u32 = 1 << 2;
    /// `size` is set.
    pub const SIZE: u32 = 1 << 3;
    /// `atime` is set.
    pub const ATIME: u32 = 1 << 4;
    /// `mtime` is set.
    pub const MTIME: u32 = 1 << 5;
    /// `fh` is set.
    pub const FH: u32 = 1 << 6;
    /// atime is set to now.
    pub const ATIME_NOW: u32 = 1 << 7;
    /// mtime is set to now.
    pub const MTIME_NOW: u32 = 1 << 8;
    /// `lock_owner` is set.
    pub const LOCKOWNER: u32 = 1 << 9;
    /// `ctime` is set.
    pub const CTIME: u32 = 1 << 10;
    /// Clear the set-id bits.
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_open_out.open_flags`.
pub mod fopen {
    /// Bypass the page cache for this open file.
    pub const DIRECT_IO: u32 = 1 << 0;
    /// Keep the page cache on open.
    pub const KEEP_CACHE: u32 = 1 << 1;
    /// The file is not seekable.
    pub const NONSEEKABLE: u32 = 1 << 2;
    /// Cache this directory's entries.
    pub const CACHE_DIR: u32 = 1 << 3;
    /// The file is a stream (no file position).
    pub const STREAM: u32 = 1 << 4;
    /// No FLUSH on close.
    pub const NOFLUSH: u32 = 1 << 5;
    /// Direct writes to one inode may run in parallel.
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
    /// Reads and writes go to the backing file `backing_id`.
    pub const PASSTHROUGH: u32 = 1 << 7;
}

/// `fuse_getattr_in.getattr_flags`: `fh` is set.
pub const GETATTR_FH: u32 = 1 << 0;
/// `fuse_fsync_in.fsync_flags`: sync data only.
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
/// `fuse_write_in.write_flags`: clear the set-id bits.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_open_in.open_flags` and `fuse_create_in.open_flags`: clear the set-id bits.
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// `fuse_notify_inval_entry_out.flags`: expire the entry instead of dropping it.
pub const EXPIRE_ONLY: u32 = 1 << 0;

/// `enum fuse_notify_code`: the `error` field of a notification's out header.
pub mod notify {
    /// Drop an inode's cached attributes and a range of its pages.
    pub const INVAL_INODE: i32 = 2;
    /// Drop (or expire) a cached directory entry.
    pub const INVAL_ENTRY: i32 = 3;
    /// Store data in an inode's page cache.
    pub const STORE: i32 = 4;
    /// Drop a cached entry and tell watchers it was deleted.
    pub const DELETE: i32 = 6;
}

/// `_IOR(229, 0, uint32_t)`: attach a new /dev/fuse descriptor to a session.
pub const DEV_IOC_CLONE: u64 = 0x8004_e500;
/// `_IOW(229, 1, struct fuse_backing_map)`: register a backing file for passthrough.
pub const DEV_IOC_BACKING_OPEN: u64 = 0x4010_e501;
/// `_IOW(229, 2, uint32_t)`: drop a backing file registration.
pub const DEV_IOC_BACKING_CLOSE: u64 = 0x4004_e502;

/// `FUSE_IO_URING_CMD_REGISTER` (`enum fuse_uring_cmd`): hand the kernel a ring entry to
/// put a request in.
pub const URING_CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: send an entry's reply and wait for its next
/// request.
pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// Size of `fuse_uring_req_header.in_out`.
pub const URING_IN_OUT_HEADER_SZ: usize = 128;
/// Size of `fuse_uring_req_header.op_in`.
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
        /// Length of the whole request, this header included.
        pub len: u32,
        /// The operation (`op`).
        pub opcode: u32,
        /// The request's id, echoed by its reply.
        pub unique: u64,
        /// The node the request is about.
        pub nodeid: u64,
        /// The caller's filesystem user id.
        pub uid: u32,
        /// The caller's filesystem group id.
        pub gid: u32,
        /// The caller's thread group id.
        pub pid: u32,
        /// Length of the extension headers after the arguments, in units of 8 bytes.
        pub total_extlen: u16,
        /// Padding.
        pub padding: u16,
    }
}

wire! {
    /// `struct fuse_out_header`; a notification has `unique` 0 and its code in `error`.
    pub struct OutHeader {
        /// Length of the whole reply, this header included.
        pub len: u32,
        /// 0, or a negative errno.
        pub error: i32,
        /// The request's id.
        pub unique: u64,
    }
}

wire! {
    /// `struct fuse_init_in`.
    pub struct InitIn {
        /// The kernel's major version.
        pub major: u32,
        /// The kernel's minor version.
        pub minor: u32,
        /// The kernel's largest readahead, in bytes.
        pub max_readahead: u32,
        /// Flags the kernel supports, bits 0..31 (`init`).
        pub flags: u32,
        /// Flags the kernel supports, bits 32..63.
        pub flags2: u32,
        /// Unused.
        pub unused: [u32; 11],
    }
}

wire! {
    /// `struct fuse_init_out`.
    pub struct InitOut {
        /// The filesystem's major version.
        pub major: u32,
        /// The filesystem's minor version.
        pub minor: u32,
        /// The largest readahead to use, in bytes.
        pub max_readahead: u32,
        /// Flags wanted, bits 0..31 (`init`).
        pub flags: u32,
        /// The most background requests outstanding at once.
        pub max_background: u16,
        /// Background requests outstanding at which the device counts as congested.
        pub congestion_threshold: u16,
        /// The largest WRITE, in bytes.
        pub max_write: u32,
        /// Timestamp granularity, in nanoseconds.
        pub time_gran: u32,
        /// The most pages in one request (with `init::MAX_PAGES`).
        pub max_pages: u16,
        /// DAX mapping alignment, as a power of two.
        pub map_alignment: u16,
        /// Flags wanted, bits 32..63.
        pub flags2: u32,
        /// How deeply a passthrough backing file may be stacked.
        pub max_stack_depth: u32,
        /// Seconds before the kernel aborts a request unanswered (0: never).
        pub request_timeout: u16,
        /// Unused.
        pub unused: [u16; 11],
    }
}

wire! {
    /// `struct fuse_attr`.
    pub struct Attr {
        /// Inode number.
        pub ino: u64,
        /// Size, in bytes.
        pub size: u64,
        /// Blocks allocated, in 512-byte units.
        pub blocks: u64,
        /// Access time, seconds.
        pub atime: u64,
        /// Modification time, seconds.
        pub mtime: u64,
        /// Change time, seconds.
        pub ctime: u64,
        /// Access time, nanoseconds.
        pub atimensec: u32,
        /// Modification time, nanoseconds.
        pub mtimensec: u32,
        /// Change time, nanoseconds.
        pub ctimensec: u32,
        /// File type and permissions.
        pub mode: u32,
        /// Number of hard links.
        pub nlink: u32,
        /// Owner's user id.
        pub uid: u32,
        /// Owner's group id.
        pub gid: u32,
        /// Device number, for a device node.
        pub rdev: u32,
        /// Preferred I/O block size.
        pub blksize: u32,
        /// `FUSE_ATTR_*` flags.
        pub flags: u32,
    }
}

wire! {
    /// `struct fuse_entry_out`: a LOOKUP's (or a create's) answer.
    pub struct EntryOut {
        /// The node's id (0: a negative entry).
        pub nodeid: u64,
        /// Generation: with `nodeid`, unique over the filesystem's life.
        pub generation: u64,
        /// How long the name may be cached, seconds.
        pub entry_valid: u64,
        /// How long the attributes may be cached, seconds.
        pub attr_valid: u64,
        /// How long the name may be cached, nanoseconds.
        pub entry_valid_nsec: u32,
        /// How long the attributes may be cached, nanoseconds.
        pub attr_valid_nsec: u32,
        /// The node's attributes.
        pub attr: Attr,
    }
}

wire! {
    /// `struct fuse_attr_out`: a GETATTR's or SETATTR's answer.
    pub struct AttrOut {
        /// How long the attributes may be cached, seconds.
        pub attr_valid: u64,
        /// How long the attributes may be cached, nanoseconds.
        pub attr_valid_nsec: u32,
        /// Padding.
        pub dummy: u32,
        /// The attributes.
        pub attr: Attr,
    }
}

wire! {
    /// `struct fuse_forget_in`.
    pub struct ForgetIn {
        /// How many lookups to drop.
        pub nlookup: u64,
    }
}

wire! {
    /// `struct fuse_forget_one`: one node of a BATCH_FORGET.
    pub struct ForgetOne {
        /// The node.
        pub nodeid: u64,
        /// How many lookups to drop.
        pub nlookup: u64,
    }
}

wire! {
    /// `struct fuse_batch_forget_in`, followed by `count` `ForgetOne`s.
    pub struct BatchForgetIn {
        /// How many `ForgetOne`s follow.
        pub count: u32,
        /// Padding.
        pub dummy: u32,
    }
}

wire! {
    /// `struct fuse_getattr_in`.
    pub struct GetattrIn {
        /// `GETATTR_FH` when `fh` is set.
        pub getattr_flags: u32,
        /// Padding.
        pub dummy: u32,
        /// The open file's handle.
        pub fh: u64,
    }
}

wire! {
    /// `struct fuse_setattr_in`.
    pub struct SetattrIn {
        /// Which fields are set (`fattr`).
        pub valid: u32,
        /// Padding.
        pub padding: u32,
        /// The open file's handle.
        pub fh: u64,
        /// New size, in bytes.
        pub size: u64,
        /// The lock owner.
        pub lock_owner: u64,
        /// New access time, seconds.
        pub atime: u64,
        /// New modification time, seconds.
        pub mtime: u64,
        /// New change time, seconds.
        pub ctime: u64,
        /// New access time, nanoseconds.
        pub atimensec: u32,
        /// New modification time, nanoseconds.
        pub mtimensec: u32,
        /// New change time, nanoseconds.
        pub ctimensec: u32,
        /// New mode.
        pub mode: u32,
        /// Unused.
        pub unused4: u32,
        /// New owner's user id.
        pub uid: u32,
        /// New owner's group id.
        pub gid: u32,
        /// Unused.
        pub unused5: u32,
    }
}

wire! {
    /// `struct fuse_mknod_in`, followed by the name.
    pub struct MknodIn {
        /// File type and permissions.
        pub mode: u32,
        /// Device number, for a device node.
        pub rdev: u32,
        /// The caller's umask.
        pub umask: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_mkdir_in`, followed by the name.
    pub struct MkdirIn {
        /// Permissions.
        pub mode: u32,
        /// The caller's umask.
        pub umask: u32,
    }
}

wire! {
    /// `struct fuse_rename_in`, followed by the old and new names.
    pub struct RenameIn {
        /// The new parent directory's node.
        pub newdir: u64,
    }
}

wire! {
    /// `struct fuse_rename2_in`, followed by the old and new names.
    pub struct Rename2In {
        /// The new parent directory's node.
        pub newdir: u64,
        /// `RENAME_*` flags.
        pub flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_link_in`, followed by the new name.
    pub struct LinkIn {
        /// The node to link.
        pub oldnodeid: u64,
    }
}

wire! {
    /// `struct fuse_open_in`.
    pub struct OpenIn {
        /// open(2) flags.
        pub flags: u32,
        /// `OPEN_KILL_SUIDGID`.
        pub open_flags: u32,
    }
}

wire! {
    /// `struct fuse_create_in`, followed by the name.
    pub struct CreateIn {
        /// open(2) flags.
        pub flags: u32,
        /// File type and permissions.
        pub mode: u32,
        /// The caller's umask.
        pub umask: u32,
        /// `OPEN_KILL_SUIDGID`.
        pub open_flags: u32,
    }
}

wire! {
    /// `struct fuse_open_out`.
    pub struct OpenOut {
        /// The open file's handle, sent with each request on it.
        pub fh: u64,
        /// `fopen` flags.
        pub open_flags: u32,
        /// The backing file's id, with `fopen::PASSTHROUGH`.
        pub backing_id: i32,
    }
}

wire! {
    /// `struct fuse_release_in`.
    pub struct ReleaseIn {
        /// The open file's handle.
        pub fh: u64,
        /// open(2) flags.
        pub flags: u32,
        /// `FUSE_RELEASE_*` flags.
        pub release_flags: u32,
        /// The lock owner.
        pub lock_owner: u64,
    }
}

wire! {
    /// `struct fuse_flush_in`.
    pub struct FlushIn {
        /// The open file's handle.
        pub fh: u64,
        /// Unused.
        pub unused: u32,
        /// Padding.
        pub padding: u32,
        /// The lock owner.
        pub lock_owner: u64,
    }
}

wire! {
    /// `struct fuse_read_in`.
    pub struct ReadIn {
        /// The open file's handle.
        pub fh: u64,
        /// Offset to read from.
        pub offset: u64,
        /// Bytes to read.
        pub size: u32,
        /// `FUSE_READ_*` flags.
        pub read_flags: u32,
        /// The lock owner.
        pub lock_owner: u64,
        /// open(2) flags.
        pub flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_write_in`, followed by the data.
    pub struct WriteIn {
        /// The open file's handle.
        pub fh: u64,
        /// Offset to write at.
        pub offset: u64,
        /// Bytes to write.
        pub size: u32,
        /// `FUSE_WRITE_*` flags.
        pub write_flags: u32,
        /// The lock owner.
        pub lock_owner: u64,
        /// open(2) flags.
        pub flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_write_out`.
    pub struct WriteOut {
        /// Bytes written.
        pub size: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_kstatfs` (the whole of `fuse_statfs_out`).
    pub struct Kstatfs {
        /// Total blocks, in `frsize` units.
        pub blocks: u64,
        /// Free blocks.
        pub bfree: u64,
        /// Free blocks an unprivileged user may use.
        pub bavail: u64,
        /// Total inodes.
        pub files: u64,
        /// Free inodes.
        pub ffree: u64,
        /// Block size.
        pub bsize: u32,
        /// Longest name.
        pub namelen: u32,
        /// Fragment size.
        pub frsize: u32,
        /// Padding.
        pub padding: u32,
        /// Unused.
        pub spare: [u32; 6],
    }
}

wire! {
    /// `struct fuse_fsync_in`.
    pub struct FsyncIn {
        /// The open file's handle.
        pub fh: u64,
        /// `FSYNC_FDATASYNC`.
        pub fsync_flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_setxattr_in` with SETXATTR_EXT; without it the kernel sends only the
    /// first 8 bytes (`FUSE_COMPAT_SETXATTR_IN_SIZE`). The name and value follow.
    pub struct SetxattrIn {
        /// The value's length.
        pub size: u32,
        /// setxattr(2) flags (`XATTR_CREATE`, `XATTR_REPLACE`).
        pub flags: u32,
        /// `FUSE_SETXATTR_ACL_KILL_SGID`.
        pub setxattr_flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_getxattr_in` (GETXATTR, followed by the name, and LISTXATTR).
    pub struct GetxattrIn {
        /// The caller's buffer size (0: asks for the size).
        pub size: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_getxattr_out`: the answer to a size query.
    pub struct GetxattrOut {
        /// The size the value (or list) needs.
        pub size: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_access_in`.
    pub struct AccessIn {
        /// access(2) mask.
        pub mask: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_interrupt_in`.
    pub struct InterruptIn {
        /// The interrupted request's id.
        pub unique: u64,
    }
}

wire! {
    /// `struct fuse_fallocate_in`.
    pub struct FallocateIn {
        /// The open file's handle.
        pub fh: u64,
        /// Start of the range.
        pub offset: u64,
        /// Length of the range.
        pub length: u64,
        /// fallocate(2) mode (`FALLOC_FL_*`).
        pub mode: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_lseek_in`.
    pub struct LseekIn {
        /// The open file's handle.
        pub fh: u64,
        /// Offset to start from.
        pub offset: u64,
        /// `SEEK_DATA` or `SEEK_HOLE`.
        pub whence: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_lseek_out`.
    pub struct LseekOut {
        /// The offset found.
        pub offset: u64,
    }
}

wire! {
    /// `struct fuse_dirent` without its name (which follows, padded to 8 bytes).
    pub struct Dirent {
        /// Inode number.
        pub ino: u64,
        /// Offset of the next entry (what the next READDIR starts from).
        pub off: u64,
        /// The name's length.
        pub namelen: u32,
        /// File type (`DT_*`).
        pub typ: u32,
    }
}

wire! {
    /// `struct fuse_notify_inval_inode_out`.
    pub struct NotifyInvalInodeOut {
        /// The inode.
        pub ino: u64,
        /// Start of the page range to drop (negative: attributes only).
        pub off: i64,
        /// Length of the range (0 or less: to the end).
        pub len: i64,
    }
}

wire! {
    /// `struct fuse_notify_inval_entry_out`, followed by the name.
    pub struct NotifyInvalEntryOut {
        /// The parent directory's node.
        pub parent: u64,
        /// The name's length.
        pub namelen: u32,
        /// `EXPIRE_ONLY`.
        pub flags: u32,
    }
}

wire! {
    /// `struct fuse_notify_delete_out`, followed by the name.
    pub struct NotifyDeleteOut {
        /// The parent directory's node.
        pub parent: u64,
        /// The deleted entry's node.
        pub child: u64,
        /// The name's length.
        pub namelen: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_notify_store_out`, followed by the data.
    pub struct NotifyStoreOut {
        /// The inode.
        pub nodeid: u64,
        /// Offset to store at.
        pub offset: u64,
        /// Bytes to store.
        pub size: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_backing_map`, the argument of `FUSE_DEV_IOC_BACKING_OPEN`.
    pub struct BackingMap {
        /// The backing file's descriptor.
        pub fd: i32,
        /// Flags (none defined).
        pub flags: u32,
        /// Padding.
        pub padding: u64,
    }
}

wire! {
    /// `struct fuse_uring_ent_in_out`.
    pub struct UringEntInOut {
        /// Flags (none defined).
        pub flags: u64,
        /// The request's `unique`, echoed by COMMIT_AND_FETCH.
        pub commit_id: u64,
        /// Bytes of the payload buffer used: the request's, then the reply's.
        pub payload_sz: u32,
        /// Padding.
        pub padding: u32,
        /// Reserved.
        pub reserved: u64,
    }
}

/// `struct fuse_uring_req_header`: `in_out` holds the in header of a request and the out
/// header of its reply, `op_in` the request's first argument.
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringReqHeader {
    /// The request's `InHeader`, then the reply's `OutHeader`.
    pub in_out: [u8; URING_IN_OUT_HEADER_SZ],
    /// The request's first argument.
    pub op_in: [u8; URING_OP_IN_OUT_SZ],
    /// The entry's commit id and payload size.
    pub ring_ent_in_out: UringEntInOut,
}

wire! {
    /// `struct fuse_uring_cmd_req`, at the start of the 80-byte command area of an SQE.
    pub struct UringCmdReq {
        /// Flags (none defined).
        pub flags: u64,
        /// The request being answered (COMMIT_AND_FETCH).
        pub commit_id: u64,
        /// The queue (CPU) the entry belongs to.
        pub qid: u16,
        /// Padding.
        pub padding: [u8; 6],
    }
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
