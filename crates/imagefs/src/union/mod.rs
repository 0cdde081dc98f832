//! A stack of images under a writable upper directory, as overlayfs does it (docs/FORMAT.md,
//! "Upper directories").
//!
//! - Ids survive remounts: a copied-up object keeps its image id (`origin`), an upper-only
//!   one is `FIRST_UPPER_ID` + its inode; no id stands for two live objects.
//! - Tree changes take one mutex; lookups, getattr, reads and writes take none.
//! - A hardlinked image file is copied up once.

mod copyup;
mod create;
mod io;
mod listing;
mod measured;
mod nodes;
mod origin;
mod owner;
mod privileges;
mod remove;
mod rename;
mod resolve;
mod setattr;

use crate::attr::{Attr, Kind};
use crate::measuring::{Hook, Setup};
use crate::ops::{
    AddEntry, Caller, Created, Errno, Granted, Logger, NotifierSlot, Opened, Ops, Register,
    RenameFlags, SetAttr, Statfs, Wants,
};
use crate::reaper::Reaper;
use crate::stack::{Obj, Stack};
use crate::xattrs::{name_list, Rules};
use copyup::LinkPaths;
use erofs::read::ByteSource;
use measured::Handle;
use nodes::{Lower, Node};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, Mode, OFlags};
use std::ffi::CString;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use upper::Upper;

/// Names and attributes change only through this mount, which the kernel sees, except a
/// directory's when a child's copy-up copies it up too (size, link count): for those the
/// kernel is told (`inval_inode`).
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Where the ids of the upper directory's own objects start: `FIRST_UPPER_ID` + the
/// object's inode number on the upper filesystem (every image id is below 2^57).
const FIRST_UPPER_ID: u64 = 1 << 62;
/// Ids handed out one by one, never reused in a mount, where an object's own id cannot be
/// had: the host reused the inode number of an object the kernel still holds (one id must
/// never stand for two objects), or the object is on another filesystem.
const FIRST_COUNTED_ID: u64 = 1 << 63;

/// A map whose values hold descriptors. A removed value is freed once no reader can see
/// it, a batch at a time; papaya's batches of 32 per thread kept ~50 closed handles' and
/// ~80 forgotten nodes' descriptors open under `ulimit -n 256`. Batches of 4 keep few,
/// for one fence per 4 removals (closes and FORGETs, not reads; a fence, not a
/// membarrier(2): see Cargo.toml).
fn holding_descriptors<K, V>() -> papaya::HashMap<K, V> {
    papaya::HashMap::builder()
        .collector(seize::Collector::new().batch_size(4))
        .build()
}

/// Images stacked with overlayfs's rules under a writable upper directory.
pub struct UnionFs<S: ByteSource> {
    stack: Stack<S>,
    upper: Upper,
    root_top: Obj,
    /// Shared with the reaper's thread, which picks the names to drop from it.
    nodes: Arc<papaya::HashMap<u64, Node>>,
    /// Keeps the nodes' descriptors under the limit (see `reaper`).
    reaper: Arc<Reaper>,
    /// Upper objects by (device, inode): hardlinks share an id, and a copied-up object
    /// keeps its image id.
    upper_ids: papaya::HashMap<(u64, u64), u64>,
    files: papaya::HashMap<u64, OwnedFd>,
    dirs: papaya::HashMap<u64, Vec<(Vec<u8>, u64, Kind)>>,
    next_id: AtomicU64,
    /// The upper directory's filesystem: its objects' inode numbers are unique there.
    upper_dev: u64,
    next_fh: AtomicU64,
    change: Mutex<()>,
    /// Mounted by root: new objects belong to the caller; otherwise to us.
    as_root: bool,
    /// The kernel agreed to passthrough (root mounts): upper files' reads and writes then
    /// go to the host file without us.
    passthrough: bool,
    /// Per layer, the paths of its hardlinked files (walked on first need).
    hardlinks: Vec<OnceLock<LinkPaths>>,
    /// Set once the session exists: how the kernel is told of changes it cannot see.
    notifier: NotifierSlot,
    /// Measuring: with a policy, opens are measured, and the handles that can write are
    /// known, so a writer's close marks its file changed.
    hook: Hook,
    /// With a policy: the handles that can write (with their node, its content key, and
    /// whether the file is worth hashing after its close, see `Measuring::open`) and the
    /// read-only ones the policy measured (with their node).
    measured_fhs: papaya::HashMap<u64, (u64, Handle)>,
    /// Which xattrs are shown, refused and let change.
    xattrs: Rules,
    name: String,
    log: Logger,
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from_io_error(&e).unwrap_or(Errno::IO)
}

fn is_dir_mode(mode: u32) -> bool {
    rfs::FileType::from_raw_mode(mode) == rfs::FileType::Directory
}

fn cname(name: &[u8]) -> Result<CString, Errno> {
    CString::new(name).map_err(|_| Errno::INVAL)
}

fn now() -> (i64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

fn libc_trunc() -> i32 {
    OFlags::TRUNC.bits() as i32
}

impl<S: ByteSource + 'static> UnionFs<S> {
    /// `layers` (top first) under `upper`, named `name` in log lines to `log`; an error
    /// when the stack's root cannot be read or the upper directory opened.
    pub fn new(
        layers: Vec<erofs::read::Image<S>>,
        upper: Upper,
        name: String,
        log: Logger,
    ) -> Result<UnionFs<S>, erofs::read::Error> {
        let hardlinks = layers.iter().map(|_| OnceLock::new()).collect();
        let stack = Stack { layers };
        let root = stack.root()?;
        let root_fd = rfs::openat(
            upper.root(),
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| erofs::read::Error::Io {
            offset: 0,
            err: e.into(),
        })?;
        // The root always merges, whatever its `opaque` says (see `Stack::root`).
        let merge = true;
        let fs = UnionFs {
            root_top: root.top,
            stack,
            nodes: Arc::new(holding_descriptors()),
            reaper: Arc::new(Reaper::for_this_process()),
            upper_ids: papaya::HashMap::new(),
            files: holding_descriptors(),
            dirs: papaya::HashMap::new(),
            next_id: AtomicU64::new(FIRST_COUNTED_ID),
            upper_dev: rfs::fstat(&root_fd).map_or(u64::MAX, |st| st.st_dev),
            next_fh: AtomicU64::new(1),
            change: Mutex::new(()),
            as_root: rustix::process::geteuid().is_root(),
            notifier: Arc::new(OnceLock::new()),
            hardlinks,
            passthrough: false,
            hook: Hook::default(),
            measured_fhs: papaya::HashMap::new(),
            xattrs: Rules::writable(),
            upper,
            name,
            log,
        };
        if let Ok(st) = rfs::fstat(&root_fd) {
            fs.upper_ids.pin().insert((st.st_dev, st.st_ino), 1);
        }
        fs.nodes.pin().insert(
            1,
            Node {
                parent: 1,
                name: Vec::new(),
                lower: Some(root),
                upper: Some(Arc::new(root_fd)),
                merge,
                lookups: Arc::new(AtomicU64::new(1)),
                io: Arc::default(),
            },
        );
        Ok(fs)
    }

    /// Measures opens from now on (before mounting).
    pub fn set_measuring(&mut self, setup: Setup) {
        self.hook.setup = Some(setup);
    }

    /// Adds members to what `verilay stats` prints.
    pub fn set_extra_stats(&mut self, extra: crate::measuring::ExtraStats) {
        self.hook.extra = Some(extra);
    }

    fn real_path(fd: BorrowedFd<'_>) -> CString {
        upper::fd_path(fd)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.change.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<S: ByteSource + 'static> Ops for UnionFs<S> {
    fn wants(&self) -> Wants {
        Wants {
            ttl: TTL,
            readdirplus: false,
            cache_symlinks: false,
            posix_acl: true,
            no_open: false,
            no_opendir: false,
            // The umask is ours to apply: a parent's default ACL replaces it.
            dont_mask: true,
            writes: true,
            // Upper files hold nothing to verify: as root, the kernel may read and write
            // them itself.
            passthrough: self.as_root,
            // Privileges dropped here (`privileges.rs`), not by the kernel asking for
            // `security.capability` on every write.
            kills_privileges: true,
            background: None,
            async_dio: false,
        }
    }

    fn granted(&mut self, granted: &Granted) {
        self.passthrough = granted.passthrough;
    }

    fn stats(&self) -> crate::stats::StatsSource {
        self.hook.source()
    }

    fn notifier_slot(&self) -> NotifierSlot {
        self.notifier.clone()
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Option<Attr>, Errno> {
        let Some((id, n)) = self.resolve(parent, name)? else {
            return Ok(None);
        };
        self.check_one_place(id, &n)?;
        let a = self.attr(id, &n)?;
        self.remember(id, n);
        Ok(Some(a))
    }

    fn forget(&self, id: u64, nlookup: u64) {
        self.forget_node(id, nlookup)
    }

    fn getattr(&self, id: u64) -> Result<Attr, Errno> {
        let nodes = self.nodes.pin();
        match nodes.get(&id) {
            Some(n) => self.attr(id, n),
            None => Err(Errno::STALE),
        }
    }

    fn setattr(&self, id: u64, set: &SetAttr) -> Result<Attr, Errno> {
        self.set_attr(id, set)
    }

    fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        self.with_node(ino, |n| {
            self.backing(n)?
                .readlink()
                .map_err(|e| self.failed("readlink", Lower::Node(ino), e))
        })
    }

    fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr, Errno> {
        self.make_node(caller, parent, name, mode, umask, rdev)
    }

    fn mkdir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr, Errno> {
        self.make_dir(caller, parent, name, mode, umask)
    }

    fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr, Errno> {
        self.make_symlink(caller, parent, name, target)
    }

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
        self.create_file(caller, parent, name, mode, umask, flags, register)
    }

    fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        self.remove(parent, name)
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        self.remove_dir(parent, name)
    }

    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        self.move_entry(parent, name, newparent, newname, flags)
    }

    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr, Errno> {
        self.link_name(ino, newparent, newname)
    }

    fn open(
        &self,
        caller: &Caller,
        id: u64,
        flags: i32,
        register: Register<'_>,
    ) -> Result<Opened, Errno> {
        self.open_file(caller, id, flags, register)
    }

    fn read(&self, ino: u64, fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        self.read_file(ino, fh, offset, buf)
    }

    fn write(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_privileges: Option<&Caller>,
    ) -> Result<usize, Errno> {
        let dropped = match kill_privileges {
            Some(caller) => self.with_file(fh, |fd| self.drop_privileges(caller, fd))?,
            None => false,
        };
        if dropped {
            // A write drops the kernel's cached size and times, not the mode. (Its
            // file_remove_privs sends a SETATTR first, whose reply has the new mode, unless
            // its cache said there was nothing to drop.)
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(ino, -1, 0);
            }
        }
        self.write_file(fh, offset, data)
    }

    fn flush(&self, _ino: u64, _fh: u64) -> Result<(), Errno> {
        // Writes go straight to the upper file, so close has nothing to report: one ENOSYS
        // and the kernel stops sending FLUSH on every close.
        Err(Errno::NOSYS)
    }

    fn release(&self, _ino: u64, fh: u64, answer: &mut dyn FnMut()) {
        self.release_file(fh, answer)
    }

    fn fsync(&self, _ino: u64, fh: u64, datasync: bool) -> Result<(), Errno> {
        self.sync_file(fh, datasync)
    }

    fn fallocate(
        &self,
        _ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        self.allocate(fh, offset, length, mode)
    }

    fn opendir(&self, id: u64) -> Result<Opened, Errno> {
        self.open_listing(id)
    }

    fn readdir(&self, ino: u64, fh: u64, offset: u64, add: AddEntry<'_>) -> Result<(), Errno> {
        self.list(ino, fh, offset, add)
    }

    fn releasedir(&self, _ino: u64, fh: u64) {
        self.dirs.pin().remove(&fh);
    }

    fn statfs(&self) -> Result<Statfs, Errno> {
        let s = rfs::fstatvfs(self.upper.root())?;
        Ok(Statfs {
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            bsize: s.f_bsize as u32,
            namelen: s.f_namemax as u32,
            frsize: s.f_frsize as u32,
        })
    }

    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<(), Errno> {
        self.xattrs.may_change(ino, name)?;
        let fd = self.copied_up(ino)?;
        rfs::setxattr(
            Self::real_path(fd.as_fd()).as_c_str(),
            cname(name)?.as_c_str(),
            value,
            rfs::XattrFlags::from_bits_truncate(flags as u32),
        )
    }

    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<(), Errno> {
        self.xattrs.may_change(ino, name)?;
        let fd = self.copied_up(ino)?;
        rfs::removexattr(
            Self::real_path(fd.as_fd()).as_c_str(),
            cname(name)?.as_c_str(),
        )
    }

    fn getxattr(&self, caller: &Caller, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        self.hook.requests.get.add(1);
        if let Some(v) = self.xattrs.get(caller, ino, name, || self.hook.stats())? {
            return Ok(v);
        }
        let value = self.with_node(ino, |n| {
            self.backing(n)?
                .getxattr(name)
                .map_err(|e| self.failed("getxattr", Lower::Node(ino), e))
        })?;
        value.ok_or(Errno::NODATA)
    }

    fn listxattr(&self, caller: &Caller, ino: u64) -> Result<Vec<u8>, Errno> {
        self.hook.requests.list.add(1);
        let names = self.with_node(ino, |n| {
            self.backing(n)?
                .listxattr()
                .map_err(|e| self.failed("listxattr", Lower::Node(ino), e))
        })?;
        Ok(name_list(&names, |n| self.xattrs.listed(caller, n)))
    }
}
