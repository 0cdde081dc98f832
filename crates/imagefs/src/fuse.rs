//! The FUSE adapter, on `fuser`: decodes each request, calls the filesystem's [`Ops`] and
//! replies. INIT is negotiated here, once for both filesystems, from what each
//! [`Wants`](crate::ops::Wants); and a mounted /dev/fuse is served here ([`Session`]).
//! This is the only file that knows `fuser`.

use crate::attr::{Attr, Kind};
use crate::ops::{
    Access, Caller, DirEntry, Errno, Granted, Notify, Ops, Passthrough, SetAttr, SetTime,
};
use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use rustix::fd::BorrowedFd;
use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// Largest read the kernel sends (with `FUSE_MAX_PAGES` and the default page limit).
const MAX_READ: u32 = 1 << 20;
/// Largest write a writable mount takes.
const MAX_WRITE: u32 = 1 << 20;

thread_local! {
    /// Per worker thread: the buffer a READ is served from.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A filesystem served over FUSE.
pub struct Fuse<O: Ops> {
    ops: O,
    /// How long the kernel may cache entries and attributes (the filesystem's, from INIT).
    ttl: Duration,
}

impl<O: Ops> Fuse<O> {
    pub fn new(ops: O) -> Fuse<O> {
        let ttl = ops.wants().ttl;
        Fuse { ops, ttl }
    }
}

/// A filesystem on a mounted /dev/fuse descriptor, its first request (INIT) answered.
pub struct Session<O: Ops>(fuser::Session<Fuse<O>>);

/// The workers serving a mount.
pub struct Running(fuser::BackgroundSession);

impl<O: Ops> Session<O> {
    /// Serves `ops` on `fd` to the users `access` lets in, with `threads` workers, each on
    /// a /dev/fuse descriptor of its own when `clone_fd`. The filesystem's notifier slot
    /// gets the session's notifier.
    pub fn new(
        ops: O,
        fd: OwnedFd,
        access: Access,
        threads: usize,
        clone_fd: bool,
    ) -> std::io::Result<Session<O>> {
        let acl = match access {
            Access::All => fuser::SessionACL::All,
            Access::RootAndOwner => fuser::SessionACL::RootAndOwner,
            Access::Owner => fuser::SessionACL::Owner,
        };
        let mut cfg = fuser::Config::default();
        cfg.acl = acl;
        cfg.n_threads = Some(threads);
        cfg.clone_fd = clone_fd;
        let slot = ops.notifier_slot();
        let session = fuser::Session::from_fd(Fuse::new(ops), fd, acl, cfg)?;
        let _ = slot.set(Box::new(session.notifier()));
        Ok(Session(session))
    }

    /// Starts the workers.
    pub fn spawn(self) -> std::io::Result<Running> {
        self.0.spawn().map(Running)
    }
}

impl Running {
    /// Waits until all `n` workers run: fuser clones every /dev/fuse descriptor, then
    /// starts the threads one by one, and its session thread ends with the error if any of
    /// that fails (with the workers started so far left serving, which unmounting stops).
    pub fn wait_for_workers(self, n: usize, timeout: Duration) -> Result<Running, String> {
        let start = Instant::now();
        let deadline = start.checked_add(timeout).unwrap_or(start);
        loop {
            if self.0.guard.is_finished() {
                return Err(match self.0.join() {
                    Err(e) => format!("{e}"),
                    Ok(()) => "the session ended".into(),
                });
            }
            if running_workers() >= n {
                return Ok(self);
            }
            if Instant::now() >= deadline {
                return Err(format!("not all running after {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Returns once the filesystem is unmounted.
    pub fn join(self) {
        let _ = self.0.join();
    }
}

/// The threads of this process named as fuser names its workers (`fuser-N`).
fn running_workers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| {
                c.trim_end()
                    .strip_prefix("fuser-")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .count()
}

impl Notify for fuser::Notifier {
    fn store(&self, ino: u64, offset: u64, data: &[u8]) -> std::io::Result<()> {
        fuser::Notifier::store(self, INodeNo(ino), offset, data)
    }

    fn inval_inode(&self, ino: u64, offset: i64, len: i64) -> std::io::Result<()> {
        fuser::Notifier::inval_inode(self, INodeNo(ino), offset, len)
    }

    fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()> {
        fuser::Notifier::inval_entry(self, INodeNo(parent), OsStr::from_bytes(name))
    }
}

fn errno(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.raw_os_error())
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::RegularFile => FileType::RegularFile,
        Kind::Directory => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
        Kind::NamedPipe => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.crtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    }
}

fn fopen_flags(keep_cache: bool, cache_dir: bool) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if cache_dir {
        f |= FopenFlags::FOPEN_CACHE_DIR;
    }
    f
}

/// The registration a passthrough open replies with (made by this adapter's `open_backing`).
fn backing(p: &Passthrough) -> &fuser::BackingId {
    p.get().expect("registered by this adapter")
}

impl<O: Ops> Fuse<O> {
    fn entry(&self, reply: ReplyEntry, r: Result<Attr, Errno>) {
        match r {
            Ok(a) => reply.entry(&self.ttl, &file_attr(&a), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn attr(&self, reply: ReplyAttr, r: Result<Attr, Errno>) {
        match r {
            Ok(a) => reply.attr(&self.ttl, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// Replies to getxattr/listxattr: the size when asked for it, ERANGE when it does not fit.
fn xattr(reply: ReplyXattr, size: u32, r: Result<Vec<u8>, Errno>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(fuser::Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(e)),
    }
}

impl<O: Ops> Filesystem for Fuse<O> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let w = self.ops.wants();
        self.ttl = w.ttl;
        let mut ask = |on: bool, cap: InitFlags| on && config.add_capabilities(cap).is_ok();
        for (on, cap) in [
            (true, InitFlags::FUSE_ASYNC_READ),
            (true, InitFlags::FUSE_PARALLEL_DIROPS),
            (true, InitFlags::FUSE_MAX_PAGES),
            (w.cache_symlinks, InitFlags::FUSE_CACHE_SYMLINKS),
            // Always plus (not _AUTO, which uses it for a directory's first chunk only).
            (w.readdirplus, InitFlags::FUSE_DO_READDIRPLUS),
            (w.posix_acl, InitFlags::FUSE_POSIX_ACL),
            // Not FUSE_ATOMIC_O_TRUNC: with it the kernel sends O_TRUNC in OPEN and checks
            // ETXTBSY only afterwards, so an O_RDONLY|O_TRUNC open of a running program
            // would truncate it and then fail. Without it the kernel truncates with a
            // SETATTR once its checks pass, as overlayfs does.
            (w.dont_mask, InitFlags::FUSE_DONT_MASK),
            (w.writes, InitFlags::FUSE_BIG_WRITES),
        ] {
            ask(on, cap);
        }
        let mut granted = Granted {
            no_open: ask(w.no_open, InitFlags::FUSE_NO_OPEN_SUPPORT),
            no_opendir: ask(w.no_opendir, InitFlags::FUSE_NO_OPENDIR_SUPPORT),
            passthrough: false,
        };
        let _ = config.set_max_readahead(MAX_READ);
        if w.writes {
            let _ = config.set_max_write(MAX_WRITE);
        }
        if let Some((background, congestion)) = w.background {
            let _ = config.set_max_background(background);
            let _ = config.set_congestion_threshold(congestion);
        }
        // Registering a backing file needs CAP_SYS_ADMIN; the backing file must not be
        // on a stacked filesystem itself.
        granted.passthrough = w.passthrough
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok();
        self.ops.granted(&granted);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.ops.lookup(parent.into(), name.as_bytes());
        self.entry(reply, found.map(|a| a.unwrap_or_else(Attr::negative)))
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.ops.forget(ino.into(), nlookup)
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr(reply, self.ops.getattr(ino.into()))
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            fh: fh.map(u64::from),
        };
        self.attr(reply, self.ops.setattr(ino.into(), &set))
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.ops.readlink(ino.into()) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let made = self.ops.mknod(
            &caller(req),
            parent.into(),
            name.as_bytes(),
            mode,
            umask,
            rdev,
        );
        self.entry(reply, made)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self
            .ops
            .mkdir(&caller(req), parent.into(), name.as_bytes(), mode, umask);
        self.entry(reply, made)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let made = self.ops.symlink(
            &caller(req),
            parent.into(),
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
        self.entry(reply, made)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let register = |fd: BorrowedFd<'_>| reply.open_backing(fd).map(Passthrough::new);
        let made = self.ops.create(
            &caller(req),
            parent.into(),
            name.as_bytes(),
            mode,
            umask,
            flags,
            &register,
        );
        let c = match made {
            Ok(c) => c,
            Err(e) => return reply.error(errno(e)),
        };
        let (attr, fh) = (file_attr(&c.attr), FileHandle(c.fh));
        let flags = FopenFlags::empty();
        match &c.passthrough {
            Some(p) => {
                reply.created_passthrough(&self.ttl, &attr, Generation(0), fh, flags, backing(p))
            }
            None => reply.created(&self.ttl, &attr, Generation(0), fh, flags),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.ops.unlink(parent.into(), name.as_bytes()))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.ops.rmdir(parent.into(), name.as_bytes()))
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let flags = crate::ops::RenameFlags::from_bits_retain(flags.bits());
        let moved = self.ops.rename(
            parent.into(),
            name.as_bytes(),
            newparent.into(),
            newname.as_bytes(),
            flags,
        );
        empty(reply, moved)
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let linked = self
            .ops
            .link(ino.into(), newparent.into(), newname.as_bytes());
        self.entry(reply, linked)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let register = |fd: BorrowedFd<'_>| reply.open_backing(fd).map(Passthrough::new);
        let o = match self.ops.open(&caller(req), ino.into(), flags.0, &register) {
            Ok(o) => o,
            Err(e) => return reply.error(errno(e)),
        };
        let (fh, flags) = (FileHandle(o.fh), fopen_flags(o.keep_cache, o.cache_dir));
        match &o.passthrough {
            Some(p) => reply.opened_passthrough(fh, flags, backing(p)),
            None => reply.opened(fh, flags),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        READ_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            let want = size as usize;
            if buf.len() < want {
                buf.resize(want, 0);
            }
            match self
                .ops
                .read(ino.into(), fh.into(), offset, &mut buf[..want])
            {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(errno(e)),
            }
        })
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.ops.write(ino.into(), fh.into(), offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.ops.flush(ino.into(), fh.into()))
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut reply = Some(reply);
        let mut answer = || {
            if let Some(r) = reply.take() {
                r.ok()
            }
        };
        self.ops.release(ino.into(), fh.into(), &mut answer);
        answer();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.ops.fsync(ino.into(), fh.into(), datasync))
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let done = self
            .ops
            .fallocate(ino.into(), fh.into(), offset, length, mode);
        empty(reply, done)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.ops.opendir(ino.into()) {
            Ok(o) => reply.opened(FileHandle(o.fh), fopen_flags(o.keep_cache, o.cache_dir)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut add = |e: DirEntry<'_>| {
            let name = OsStr::from_bytes(e.name);
            reply.add(INodeNo(e.ino), e.next, file_type(e.kind), name)
        };
        match self.ops.readdir(ino.into(), fh.into(), offset, &mut add) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.ttl;
        let mut add = |e: DirEntry<'_>, a: &Attr| {
            let name = OsStr::from_bytes(e.name);
            let attr = file_attr(a);
            reply.add(INodeNo(e.ino), e.next, name, &ttl, &attr, Generation(0))
        };
        match self
            .ops
            .readdirplus(ino.into(), fh.into(), offset, &mut add)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.ops.releasedir(ino.into(), fh.into());
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.ops.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let set = self.ops.setxattr(ino.into(), name.as_bytes(), value, flags);
        empty(reply, set)
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.ops.removexattr(ino.into(), name.as_bytes()))
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let value = self.ops.getxattr(&caller(req), ino.into(), name.as_bytes());
        xattr(reply, size, value)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr(reply, size, self.ops.listxattr(&caller(req), ino.into()))
    }
}
