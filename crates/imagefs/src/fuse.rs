//! The FUSE adapter, on `fusewire`: each decoded request is answered by calling the
//! filesystem's [`Ops`]. INIT is asked for here, once for both filesystems, from what each
//! [`Wants`](crate::ops::Wants); the session (`fusewire::Session`) picks the transport,
//! /dev/fuse or io_uring, and serves on it. This is the only file that knows `fusewire`'s
//! requests and replies.

use crate::attr::{Attr, Kind};
use crate::ops::{self, Access, Caller, DirEntry, Errno, Granted, Notify, Ops, Passthrough};
use crate::stats::StatsSource;
use fusewire::abi::{self, fopen, init};
use fusewire::{Channel, Context, Entry, Negotiated, Open, Reply, Request};
use rustix::fd::BorrowedFd;
use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use fusewire::{Chosen, Stats, Transport};

/// Largest read the kernel sends, and largest write a writable mount takes.
const MAX_IO: u32 = 1 << 20;

/// How far the kernel reads ahead of a sequential reader: two requests of [`MAX_IO`], so
/// one is served while the other is verified (a cold 256 MiB read from disk measured
/// 1.14x and 1.05x squashfuse's time, against 1.19x and 1.32x with one). INIT cannot
/// raise the kernel's 128 KiB: root sets the mount's bdi (`mount::kernel::raise_readahead`);
/// rootless mounts keep 128 KiB.
pub(crate) const READ_AHEAD: u32 = 2 * MAX_IO;

/// A filesystem served over FUSE.
pub struct Fuse<O: Ops> {
    ops: O,
    /// How long the kernel may cache entries and attributes (the filesystem's).
    ttl: Duration,
    access: Access,
    /// The user the session runs as: with [`Access::Owner`] or [`Access::RootAndOwner`]
    /// the one (besides root, for the latter) whose requests are served.
    owner: u32,
    /// Notifications and passthrough registrations, once INIT is agreed.
    channel: OnceLock<Channel>,
}

/// What the filesystem wants of INIT, in the kernel's flags.
fn wire_wants(w: &ops::Wants) -> fusewire::Wants {
    let mut flags = init::ASYNC_READ | init::PARALLEL_DIROPS | init::MAX_PAGES;
    for (on, flag) in [
        (w.cache_symlinks, init::CACHE_SYMLINKS),
        // Always plus (not READDIRPLUS_AUTO, which uses it for a directory's first chunk).
        (w.readdirplus, init::DO_READDIRPLUS),
        (w.posix_acl, init::POSIX_ACL),
        // Not ATOMIC_O_TRUNC: with it the kernel sends O_TRUNC in OPEN and checks
        // ETXTBSY only afterwards, so an O_RDONLY|O_TRUNC open of a running program would
        // truncate it and then fail. Without it the kernel truncates with a SETATTR once
        // its checks pass, as overlayfs does.
        (w.dont_mask, init::DONT_MASK),
        (w.writes, init::BIG_WRITES),
        (w.no_open, init::NO_OPEN_SUPPORT),
        (w.no_opendir, init::NO_OPENDIR_SUPPORT),
        // Registering a backing file needs CAP_SYS_ADMIN.
        (w.passthrough, init::PASSTHROUGH),
        (w.kills_privileges, init::HANDLE_KILLPRIV_V2),
        (w.async_dio, init::ASYNC_DIO),
    ] {
        if on {
            flags |= flag;
        }
    }
    fusewire::Wants {
        flags,
        max_write: MAX_IO,
        max_readahead: READ_AHEAD,
        max_pages: (MAX_IO / 4096) as u16,
        background: w.background,
        time_gran: 1,
    }
}

impl<O: Ops> Fuse<O> {
    /// Serves `ops` to the users `access` lets in.
    pub fn new(ops: O, access: Access) -> Fuse<O> {
        let wants = ops.wants();
        Fuse {
            ttl: wants.ttl,
            ops,
            access,
            owner: rustix::process::geteuid().as_raw(),
            channel: OnceLock::new(),
        }
    }

    /// Whether `uid` may use the mount. The kernel lets others in only with allow_other,
    /// and root-and-owner is allow_other to the kernel; requests the kernel may send on
    /// another's behalf (reads, writes and closes of open files) are always served, as
    /// libfuse and fuser do.
    fn admits(&self, uid: u32, req: &Request<'_>) -> bool {
        let ok = match self.access {
            Access::All => true,
            Access::RootAndOwner => uid == self.owner || uid == 0,
            Access::Owner => uid == self.owner,
        };
        ok || matches!(
            req,
            Request::Destroy
                | Request::Read { .. }
                | Request::ReadDir { .. }
                | Request::ReadDirPlus { .. }
                | Request::Write { .. }
                | Request::Fsync { .. }
                | Request::FsyncDir { .. }
                | Request::Release { .. }
                | Request::ReleaseDir { .. }
        )
    }

    fn entry(&self, a: &Attr) -> Entry {
        Entry {
            nodeid: a.ino,
            generation: 0,
            attr: wire_attr(a),
            entry_ttl: self.ttl,
            attr_ttl: self.ttl,
        }
    }

    fn reply_entry(&self, reply: Reply<'_>, r: Result<Attr, Errno>) {
        match r {
            Ok(a) => reply.entry(&self.entry(&a)),
            Err(e) => reply.error(e.raw_os_error()),
        }
    }

    fn reply_attr(&self, reply: Reply<'_>, r: Result<Attr, Errno>) {
        match r {
            Ok(a) => reply.attr(&wire_attr(&a), self.ttl),
            Err(e) => reply.error(e.raw_os_error()),
        }
    }

    /// Registers an open file for passthrough on the session's channel.
    fn register(&self, fd: BorrowedFd<'_>) -> std::io::Result<Passthrough> {
        let channel = self
            .channel
            .get()
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOTCONN))?;
        channel.open_backing(fd).map(Passthrough::new)
    }
}

fn empty(reply: Reply<'_>, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e.raw_os_error()),
    }
}

fn file_type_bits(k: Kind) -> u32 {
    match k {
        Kind::RegularFile => libc::S_IFREG,
        Kind::Directory => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::CharDevice => libc::S_IFCHR,
        Kind::BlockDevice => libc::S_IFBLK,
        Kind::NamedPipe => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
    }
}

/// Seconds and nanoseconds since the epoch, negative before it (the kernel reads the
/// seconds as signed).
fn wire_time(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs().min(i64::MAX as u64), d.subsec_nanos()),
        Err(before) => {
            let d = before.duration();
            let secs = d.as_secs().min(i64::MAX as u64) as i64;
            match d.subsec_nanos() {
                0 => ((-secs) as u64, 0),
                n => ((-secs - 1) as u64, 1_000_000_000 - n),
            }
        }
    }
}

fn wire_attr(a: &Attr) -> abi::Attr {
    let (atime, atimensec) = wire_time(a.atime);
    let (mtime, mtimensec) = wire_time(a.mtime);
    let (ctime, ctimensec) = wire_time(a.ctime);
    abi::Attr {
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: file_type_bits(a.kind) | u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

fn set_time(t: fusewire::SetTime) -> ops::SetTime {
    match t {
        fusewire::SetTime::Now => ops::SetTime::Now,
        fusewire::SetTime::At(t) => ops::SetTime::At(t),
    }
}

fn open_reply(o: &ops::Opened) -> Open {
    let mut flags = 0;
    if o.keep_cache {
        flags |= fopen::KEEP_CACHE;
    }
    if o.cache_dir {
        flags |= fopen::CACHE_DIR;
    }
    if o.direct_io {
        flags |= fopen::DIRECT_IO;
    }
    Open {
        fh: o.fh,
        flags,
        backing_id: o.passthrough.as_deref().and_then(backing_id),
    }
}

/// The id a passthrough open replies with (registered by [`Fuse::register`]).
fn backing_id(p: &Passthrough) -> Option<u32> {
    p.get::<fusewire::Backing>().map(|b| b.id())
}

impl Notify for Channel {
    fn store(&self, ino: u64, offset: u64, data: &[u8]) -> std::io::Result<()> {
        Channel::store(self, ino, offset, data)
    }

    fn may_store(&self) -> bool {
        Channel::may_store(self)
    }

    fn inval_inode(&self, ino: u64, offset: i64, len: i64) -> std::io::Result<()> {
        Channel::inval_inode(self, ino, offset, len)
    }

    fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()> {
        Channel::inval_entry(self, parent, name)
    }
}

impl<O: Ops> fusewire::Filesystem for Fuse<O> {
    fn init(&mut self, negotiated: &Negotiated, channel: &Channel) {
        self.ttl = self.ops.wants().ttl;
        let granted = Granted {
            no_open: negotiated.has(init::NO_OPEN_SUPPORT),
            no_opendir: negotiated.has(init::NO_OPENDIR_SUPPORT),
            passthrough: negotiated.has(init::PASSTHROUGH),
        };
        self.ops.granted(&granted);
        let _ = self.ops.notifier_slot().set(Box::new(channel.clone()));
        let _ = self.channel.set(channel.clone());
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        self.ops.forget(ino, nlookup)
    }

    fn request(&self, ctx: &Context, req: Request<'_>, reply: Reply<'_>) {
        if !self.admits(ctx.caller.uid, &req) {
            return reply.error(libc::EACCES);
        }
        let caller = Caller {
            uid: ctx.caller.uid,
            gid: ctx.caller.gid,
            pid: ctx.caller.pid,
        };
        let ops = &self.ops;
        match req {
            Request::Lookup { parent, name } => match ops.lookup(parent, name) {
                Ok(Some(a)) => reply.entry(&self.entry(&a)),
                Ok(None) => reply.entry(&Entry::negative(self.ttl)),
                Err(e) => reply.error(e.raw_os_error()),
            },
            Request::GetAttr { ino, .. } => self.reply_attr(reply, ops.getattr(ino)),
            Request::SetAttr { ino, set } => {
                let kill = set.kill_suidgid;
                let mut set = ops::SetAttr {
                    mode: set.mode,
                    uid: set.uid,
                    gid: set.gid,
                    size: set.size,
                    atime: set.atime.map(set_time),
                    mtime: set.mtime.map(set_time),
                    fh: set.fh,
                    kill_privileges: None,
                };
                // A SETATTR that sets nothing drops privileges too (`SetAttr::changes_nothing`).
                set.kill_privileges = (kill || set.changes_nothing()).then_some(caller);
                self.reply_attr(reply, ops.setattr(ino, &set))
            }
            Request::ReadLink { ino } => match ops.readlink(ino) {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(e.raw_os_error()),
            },
            Request::MkNod {
                parent,
                name,
                mode,
                rdev,
                umask,
            } => self.reply_entry(reply, ops.mknod(&caller, parent, name, mode, umask, rdev)),
            Request::MkDir {
                parent,
                name,
                mode,
                umask,
            } => self.reply_entry(reply, ops.mkdir(&caller, parent, name, mode, umask)),
            Request::Symlink {
                parent,
                name,
                target,
            } => self.reply_entry(reply, ops.symlink(&caller, parent, name, target)),
            Request::Link {
                ino,
                new_parent,
                new_name,
            } => self.reply_entry(reply, ops.link(ino, new_parent, new_name)),
            Request::Unlink { parent, name } => empty(reply, ops.unlink(parent, name)),
            Request::RmDir { parent, name } => empty(reply, ops.rmdir(parent, name)),
            Request::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => {
                let flags = ops::RenameFlags::from_bits_retain(flags);
                empty(reply, ops.rename(parent, name, new_parent, new_name, flags))
            }
            Request::Create {
                parent,
                name,
                mode,
                umask,
                flags,
                ..
            } => {
                let register = |fd: BorrowedFd<'_>| self.register(fd);
                match ops.create(&caller, parent, name, mode, umask, flags, &register) {
                    Ok(c) => {
                        let open = Open {
                            fh: c.fh,
                            flags: 0,
                            backing_id: c.passthrough.as_deref().and_then(backing_id),
                        };
                        reply.created(&self.entry(&c.attr), &open)
                    }
                    Err(e) => reply.error(e.raw_os_error()),
                }
            }
            Request::Open { ino, flags, .. } => {
                let register = |fd: BorrowedFd<'_>| self.register(fd);
                match ops.open(&caller, ino, flags, &register) {
                    Ok(o) => reply.opened(&open_reply(&o)),
                    Err(e) => reply.error(e.raw_os_error()),
                }
            }
            Request::Read {
                ino, fh, offset, ..
            } => {
                reply.data_with(|buf| ops.read(ino, fh, offset, buf).map_err(|e| e.raw_os_error()))
            }
            Request::Write {
                ino,
                fh,
                offset,
                data,
                write_flags,
                ..
            } => match ops.write(
                ino,
                fh,
                offset,
                data,
                (write_flags & abi::WRITE_KILL_SUIDGID != 0).then_some(&caller),
            ) {
                Ok(n) => reply.written(n as u32),
                Err(e) => reply.error(e.raw_os_error()),
            },
            Request::Flush { ino, fh, .. } => empty(reply, ops.flush(ino, fh)),
            Request::Release { ino, fh, .. } => {
                let mut reply = Some(reply);
                let mut answer = || {
                    if let Some(r) = reply.take() {
                        r.ok()
                    }
                };
                ops.release(ino, fh, &mut answer);
                answer();
            }
            Request::Fsync { ino, fh, datasync } => empty(reply, ops.fsync(ino, fh, datasync)),
            Request::Fallocate {
                ino,
                fh,
                offset,
                length,
                mode,
            } => empty(reply, ops.fallocate(ino, fh, offset, length, mode)),
            Request::OpenDir { ino, .. } => match ops.opendir(ino) {
                Ok(o) => reply.opened(&open_reply(&o)),
                Err(e) => reply.error(e.raw_os_error()),
            },
            Request::ReadDir {
                ino, fh, offset, ..
            } => {
                let mut dir = reply.dir();
                let mut add = |e: DirEntry<'_>| !dir.add(&dirent(&e));
                match ops.readdir(ino, fh, offset, &mut add) {
                    Ok(()) => dir.finish(),
                    Err(e) => dir.error(e.raw_os_error()),
                }
            }
            Request::ReadDirPlus {
                ino, fh, offset, ..
            } => {
                let mut dir = reply.dir_plus();
                let mut add =
                    |e: DirEntry<'_>, a: &Attr| !dir.add_plus(&dirent(&e), &self.entry(a));
                match ops.readdirplus(ino, fh, offset, &mut add) {
                    Ok(()) => dir.finish(),
                    Err(e) => dir.error(e.raw_os_error()),
                }
            }
            Request::ReleaseDir { ino, fh, .. } => {
                ops.releasedir(ino, fh);
                reply.ok()
            }
            Request::StatFs { .. } => match ops.statfs() {
                Ok(s) => reply.statfs(&abi::Kstatfs {
                    blocks: s.blocks,
                    bfree: s.bfree,
                    bavail: s.bavail,
                    files: s.files,
                    ffree: s.ffree,
                    bsize: s.bsize,
                    namelen: s.namelen,
                    frsize: s.frsize,
                    ..Default::default()
                }),
                Err(e) => reply.error(e.raw_os_error()),
            },
            Request::SetXattr {
                ino,
                name,
                value,
                flags,
                ..
            } => empty(reply, ops.setxattr(ino, name, value, flags)),
            Request::RemoveXattr { ino, name } => empty(reply, ops.removexattr(ino, name)),
            Request::GetXattr { ino, name, size } => match ops.getxattr(&caller, ino, name) {
                Ok(v) => reply.xattr(size, &v),
                Err(e) => reply.error(e.raw_os_error()),
            },
            Request::ListXattr { ino, size } => match ops.listxattr(&caller, ino) {
                Ok(v) => reply.xattr(size, &v),
                Err(e) => reply.error(e.raw_os_error()),
            },
            Request::Destroy => reply.ok(),
            // LSEEK, ACCESS, FSYNCDIR: not served, and the kernel stops asking.
            _ => reply.error(libc::ENOSYS),
        }
    }
}

fn dirent<'n>(e: &DirEntry<'n>) -> fusewire::DirEntry<'n> {
    fusewire::DirEntry {
        ino: e.ino,
        next: e.next,
        typ: fusewire::dirent_type(file_type_bits(e.kind)),
        name: e.name,
    }
}

/// How a session is to serve.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Who may use the mount.
    pub access: Access,
    /// Threads that run the filesystem's handlers.
    pub workers: usize,
    /// How requests reach the workers.
    pub transport: Transport,
    /// How long a serving thread looks for the next request before it sleeps (`None`:
    /// the transport's default, `fusewire::Config::poll`).
    pub poll: Option<std::time::Duration>,
}

/// A filesystem being served on a mounted /dev/fuse descriptor.
pub struct Session {
    inner: fusewire::Session,
}

impl Session {
    /// Answers INIT on `fd` (already mounted), picks the transport and starts serving
    /// `ops` on it.
    pub fn start<O: Ops>(
        ops: O,
        fd: OwnedFd,
        config: &Config,
    ) -> Result<Session, fusewire::StartError> {
        let wants = wire_wants(&ops.wants());
        let cfg = fusewire::Config {
            transport: config.transport,
            workers: config.workers.max(1),
            poll: config.poll,
            wants,
        };
        let inner = fusewire::Session::start(fd, Fuse::new(ops, config.access), &cfg)?;
        Ok(Session { inner })
    }

    /// The transport chosen.
    pub fn transport(&self) -> Chosen {
        self.inner.transport()
    }

    /// Requests counted per channel (/dev/fuse, each ring queue).
    pub fn stats(&self) -> Arc<Stats> {
        self.inner.stats()
    }

    /// `stats` with the session's members added: `transport` (what serves the mount), `poll_us`
    /// (how long its threads look for the next request before sleeping) and
    /// `fuse_requests` (how many came on /dev/fuse and on each io_uring queue).
    pub fn add_to_stats(&self, stats: StatsSource) -> StatsSource {
        let (chosen, counts) = (self.transport(), self.stats());
        let poll_us = u64::try_from(self.inner.poll().as_micros()).unwrap_or(u64::MAX);
        Arc::new(move || {
            let mut s = stats();
            s.insert("transport".into(), chosen.to_string().into());
            s.insert("poll_us".into(), poll_us.into());
            let requests = serde_json::json!({
                "dev": counts.dev_requests(),
                "queues": counts.queue_requests(),
            });
            s.insert("fuse_requests".into(), requests);
            s
        })
    }

    /// Returns once the filesystem is unmounted.
    pub fn join(self) -> std::io::Result<()> {
        self.inner.join()
    }
}
