//! An EROFS image served read-only over FUSE.
//!
//! The filesystem holds nothing but the image reader: every request is answered from the
//! image through its byte source (the verified block source in verilay), so no per-inode
//! state, lock or counter is shared between the worker threads. Images are immutable, so
//! every reply is cacheable forever: entries, attributes, negative lookups, symlinks,
//! directory listings and file pages (zero-message open and opendir, which default to
//! kept caches).
//!
//! An image without a single `security.*` xattr answers every `security.*` name with
//! EOPNOTSUPP rather than ENODATA, as filesystems without security labels do. FUSE cannot
//! cache xattr replies, and `ls -l`, `cp -a` and friends ask for `security.selinux` on
//! every file unless the filesystem says it has no such namespace: then they stop asking.
//!
//! Inode numbers: the root is FUSE's inode 1, every other inode is its nid + 2. Stable
//! across mounts, collision-free, and recoverable without a table.

use erofs::format::{S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFSOCK};
use erofs::read::{ByteSource, Image, Inode};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache anything we say: the image never changes.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// Largest read the kernel sends (with `FUSE_MAX_PAGES` and the default page limit).
const MAX_READ: usize = 1 << 20;

/// Where integrity failures and other serving errors are reported (one line each).
pub type Logger = Box<dyn Fn(&str) + Send + Sync>;

pub struct ImageFs<S: ByteSource> {
    img: Image<S>,
    root_nid: u64,
    name: String,
    log: Logger,
    /// Negotiated at init: the kernel stops sending OPEN / OPENDIR after one ENOSYS.
    no_open: bool,
    no_opendir: bool,
    /// The image records that it holds no `security.*` xattr (see the module comment).
    unlabelled: bool,
}

thread_local! {
    /// Per worker thread: the buffer a READ is served from.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl<S: ByteSource + 'static> ImageFs<S> {
    /// `name` prefixes log lines (usually the image path).
    pub fn new(img: Image<S>, name: String, log: Logger) -> ImageFs<S> {
        // Unreadable or unrecorded means "maybe labelled": fall back to per-inode answers.
        let unlabelled = img
            .namespace_absent(erofs::format::XATTR_INDEX_SECURITY)
            .unwrap_or(false);
        ImageFs {
            unlabelled,
            root_nid: img.root_nid(),
            img,
            name,
            log,
            no_open: false,
            no_opendir: false,
        }
    }

    fn ino(&self, nid: u64) -> INodeNo {
        if nid == self.root_nid {
            INodeNo::ROOT
        } else {
            INodeNo(nid + 2)
        }
    }

    fn nid(&self, ino: INodeNo) -> u64 {
        match u64::from(ino) {
            1 => self.root_nid,
            n => n - 2,
        }
    }

    /// The errno for a reader error; integrity failures and corruption are logged.
    fn fail(&self, what: &str, e: erofs::read::Error) -> Errno {
        let errno = e.errno();
        if errno != rustix::io::Errno::NOENT.raw_os_error() {
            (self.log)(&format!("{}: {what}: {e}", self.name));
        }
        Errno::from_i32(errno)
    }

    fn inode(&self, ino: INodeNo) -> Result<Inode, Errno> {
        let nid = self.nid(ino);
        // nids come from the image; one that cannot be an inode never maps back to one.
        if nid > 1 << 60 {
            return Err(Errno::EIO);
        }
        self.img
            .inode(nid)
            .map_err(|e| self.fail(&format!("inode {nid}"), e))
    }

    fn attr(&self, i: &Inode) -> FileAttr {
        let bs = u64::from(self.img.block_size());
        let t = time(i.mtime, i.mtime_nsec);
        let (major, minor) = i.rdev;
        FileAttr {
            ino: self.ino(i.nid),
            size: i.size,
            // As the kernel's erofs reports it for uncompressed inodes.
            blocks: i.size.next_multiple_of(bs) >> 9,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: kind(i.mode),
            perm: i.mode & 0o7777,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            // new_encode_dev(), which the kernel decodes FUSE's rdev with.
            rdev: (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12),
            blksize: self.img.block_size(),
            flags: 0,
        }
    }

    /// Hands a directory's entries from `offset` on to `add` (read lazily: a reply holds
    /// only a few KiB) until it says the reply is full.
    fn fill_dir(
        &self,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(erofs::read::DirEntry) -> Result<bool, Errno>,
    ) -> Result<(), Errno> {
        let dir = self.inode(ino)?;
        let entries = self
            .img
            .readdir(&dir, offset)
            .map_err(|e| self.fail("readdir", e))?;
        for e in entries {
            if add(e.map_err(|e| self.fail("readdir", e))?)? {
                break;
            }
        }
        Ok(())
    }

    /// Names in `trusted.` are listed for privileged callers only, as the kernel's erofs
    /// does (the VFS already refuses to *get* them for others).
    fn visible(req: &Request, name: &[u8]) -> bool {
        !name.starts_with(b"trusted.") || req.uid() == 0
    }
}

fn time(secs: i64, nsec: u32) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(nsec.min(999_999_999)));
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nsec
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nsec
    }
}

fn kind(mode: u16) -> FileType {
    match mode & S_IFMT {
        S_IFDIR => FileType::Directory,
        S_IFLNK => FileType::Symlink,
        S_IFCHR => FileType::CharDevice,
        S_IFBLK => FileType::BlockDevice,
        S_IFIFO => FileType::NamedPipe,
        S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn kind_of_dirent(ft: u8) -> FileType {
    use erofs::format::*;
    match ft {
        FT_DIR => FileType::Directory,
        FT_SYMLINK => FileType::Symlink,
        FT_CHRDEV => FileType::CharDevice,
        FT_BLKDEV => FileType::BlockDevice,
        FT_FIFO => FileType::NamedPipe,
        FT_SOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// A negative entry: nodeid 0 with a timeout makes the kernel cache the miss.
fn negative() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// Replies to getxattr/listxattr: the size when asked for it, ERANGE when it does not fit.
fn xattr_reply(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

impl<S: ByteSource + 'static> Filesystem for ImageFs<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each is optional: an older kernel that lacks one just does without.
        for cap in [
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            // Always plus (not _AUTO, which uses it for a directory's first chunk only):
            // attributes cost us one cached inode read, and spare a LOOKUP per entry.
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_POSIX_ACL,
            InitFlags::FUSE_MAX_PAGES,
        ] {
            let _ = config.add_capabilities(cap);
        }
        self.no_open = config
            .add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT)
            .is_ok();
        self.no_opendir = config
            .add_capabilities(InitFlags::FUSE_NO_OPENDIR_SUPPORT)
            .is_ok();
        let _ = config.set_max_readahead(MAX_READ as u32);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let dir = match self.inode(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        if !dir.is_dir() {
            return reply.error(Errno::ENOTDIR);
        }
        match self.img.lookup(&dir, name.as_bytes()) {
            Ok(Some(e)) => match self
                .img
                .inode(e.nid)
                .map_err(|err| self.fail(&format!("inode {}", e.nid), err))
            {
                Ok(i) => reply.entry(&FOREVER, &self.attr(&i), Generation(0)),
                Err(err) => reply.error(err),
            },
            Ok(None) => reply.entry(&FOREVER, &negative(), Generation(0)),
            Err(e) => reply.error(self.fail("lookup", e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.inode(ino) {
            Ok(i) => reply.attr(&FOREVER, &self.attr(&i)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self
            .inode(ino)
            .and_then(|i| self.img.readlink(&i).map_err(|e| self.fail("readlink", e)))
        {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            // Once: from now on the kernel opens files without asking, keeping caches.
            return reply.error(Errno::ENOSYS);
        }
        match self.inode(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let inode = match self.inode(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        READ_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            let want = size as usize;
            if buf.len() < want {
                buf.resize(want, 0);
            }
            match self.img.read(&inode, offset, &mut buf[..want]) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(self.fail(&format!("read of inode {}", inode.nid), e)),
            }
        })
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            return reply.error(Errno::ENOSYS);
        }
        match self.inode(ino) {
            Ok(i) if i.is_dir() => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
            ),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let filled = self.fill_dir(ino, offset, |e| {
            let name = OsStr::from_bytes(&e.name);
            Ok(reply.add(
                self.ino(e.nid),
                e.next_offset,
                kind_of_dirent(e.file_type),
                name,
            ))
        });
        match filled {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let filled = self.fill_dir(ino, offset, |e| {
            // "." and ".." get no dentry from readdirplus; their attributes are not used.
            let attr = if e.name == b"." || e.name == b".." {
                let mut a = negative();
                a.ino = self.ino(e.nid);
                a.kind = FileType::Directory;
                a
            } else {
                let i = self
                    .img
                    .inode(e.nid)
                    .map_err(|err| self.fail("readdirplus", err))?;
                self.attr(&i)
            };
            let name = OsStr::from_bytes(&e.name);
            Ok(reply.add(
                self.ino(e.nid),
                e.next_offset,
                name,
                &FOREVER,
                &attr,
                Generation(0),
            ))
        });
        match filled {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let sb = self.img.superblock();
        let bs = self.img.block_size();
        // As the kernel's erofs: no free space, and "unlimited" inodes minus those used.
        reply.statfs(
            u64::from(sb.blocks),
            0,
            0,
            u64::MAX,
            u64::MAX - sb.inos,
            bs,
            255,
            bs,
        );
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name.as_bytes();
        if !Self::visible(req, name) {
            return reply.error(Errno::NO_XATTR);
        }
        if self.unlabelled && name.starts_with(b"security.") {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let inode = match self.inode(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        match self.img.getxattr(&inode, name) {
            Ok(Some(v)) => xattr_reply(reply, size, &v),
            Ok(None) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(self.fail("getxattr", e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let inode = match self.inode(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        match self.img.listxattr(&inode) {
            Ok(names) => {
                let mut out = Vec::new();
                for n in names.iter().filter(|n| Self::visible(req, n)) {
                    out.extend_from_slice(n);
                    out.push(0);
                }
                xattr_reply(reply, size, &out)
            }
            Err(e) => reply.error(self.fail("listxattr", e)),
        }
    }
}
