//! A stack of images under a writable upper directory, with overlayfs's semantics: reads
//! fall through to the images, the first change to an image's object copies it up
//! (atomically, through the work directory), deletions of image objects leave whiteouts,
//! and a directory made where one was deleted is opaque.
//!
//! Node ids: an object from the images keeps its image id, `(layer << 48 | nid) + 2`,
//! also once copied up; objects made in the upper directory get ids from a counter above
//! 2^62, never reused in a mount (the host may reuse inode numbers; the kernel must not
//! see one id stand for two objects). Every node the kernel knows is in a lock-free map:
//! its parent and name (to copy it up later), what the images have at its path, and a
//! descriptor of its upper object. Changes to the tree (creating, removing, renaming,
//! copying up) are serialised by one mutex; lookups, attributes, reads and writes take none.
//!
//! An image file with several names is copied up once and every other name the merged
//! tree shows for it becomes a hardlink to the copy (found by one walk of that layer).
//!
//! A directory with image contents is renamed as overlayfs's `redirect_dir=on` does it:
//! the upper directory names where its image contents are (`trusted.overlay.redirect`).

use crate::attr::{kind, Attr, Kind};
use crate::backing::{host_xattr, Backing, Failed};
use crate::ino::obj_ino;
use crate::measuring::{Content, ContentKey, Cookie, ImageFile, Opening, Setup};
use crate::ops::{
    AddEntry, Caller, Created, DirEntry, Errno, Granted, NotifierSlot, Opened, Ops, Passthrough,
    Register, RenameFlags, SetAttr, SetTime, Statfs, Wants,
};
use crate::paths::{logged_path, logged_subject, measured_path};
use crate::reaper::{Held, Reaper};
use crate::stack::{Obj, Resolved, Stack};
use crate::xattrs::{name_list, Rules, OVERRIDE_XATTR};
use crate::Logger;
use erofs::read::{ByteSource, Inode};
use measure::policy::FsIdentity;
use papaya::Guard as _;
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use upper::overlay::{self, REDIRECT_MAX};
use upper::{Contents, Meta, Stat, Upper};

/// Names and attributes change only through this mount, which the kernel sees, except a
/// directory's when a child's copy-up copies it up too (size, link count): for those the
/// kernel is told (`inval_inode`).
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

const FIRST_UPPER_ID: u64 = 1 << 62;

#[derive(Clone)]
struct Node {
    parent: u64,
    name: Vec<u8>,
    /// What the images have at this path (for a directory: the merged chain), while the
    /// node still reads from them.
    lower: Option<Resolved>,
    /// The upper object: directories open for reading, everything else `O_PATH`.
    upper: Option<Arc<OwnedFd>>,
    /// Lower directories merge into this one (false once the upper one is opaque).
    merge: bool,
    /// Kernel references (lookups minus forgets), shared by every version of the node.
    lookups: Arc<AtomicU64>,
    /// How the kernel does the file's I/O, shared by every version of the node.
    io: Arc<FileIo>,
}

/// FUSE keeps an inode in one I/O mode while files of it are open: cached (reads and
/// writes through us and the page cache) or passthrough (the host file); an open in the
/// other mode fails with EIO. Image files can only be cached, so a file once opened from
/// the image keeps all its later opens cached too, also after its copy-up.
#[derive(Default)]
struct FileIo {
    mode: AtomicU8,
    /// The upper file registered with the kernel for passthrough (one per inode, as the
    /// kernel wants); `None` inside when refused.
    backing: OnceLock<Option<Arc<Passthrough>>>,
    /// With measuring only: how the file is open now (its digest is not reused while a
    /// writer has it; IMA's violations are decided from it).
    opens: crate::measuring::Opens,
    /// With measuring only: the object was made through the mount and no digest of its
    /// content can be kept yet (cleared before a reading open's measurement or a hash at
    /// close could keep one). While set, a change of attributes has no digest to carry
    /// over and skips looking (`setattr`). A node the kernel forgot and learns again
    /// starts unset: looking is never wrong, and a digest not carried over is only
    /// computed again.
    fresh: std::sync::atomic::AtomicBool,
    /// The reaper's clock when the kernel last looked the node up.
    seen: AtomicU64,
}

/// With a policy, what a handle is remembered as (`UnionFs::measured_fhs`).
#[derive(Clone, Copy)]
enum Handle {
    Writer {
        key: ContentKey,
        hash_at_close: bool,
    },
    Reader,
}

/// Marks a measured reader's handle served from the image, as handle 0 is (`measured`).
const IMAGE_HANDLE: u64 = 1 << 63;

/// Whether handle `fh` is served from the node (an image file's), not a descriptor.
fn from_node(fh: u64) -> bool {
    fh == 0 || fh & IMAGE_HANDLE != 0
}

/// What a failed read of the images was about, as its log line names it
/// (`UnionFs::subject`).
#[derive(Clone, Copy)]
enum Lower<'a> {
    /// A node the kernel knows.
    Node(u64),
    /// Entry `name` of directory node `dir`, before the kernel knows it.
    Entry(u64, &'a [u8]),
    /// A directory of one layer, by its path there (the walk for hardlinks).
    Walk(u16, &'a [Vec<u8>]),
}

const IO_UNDECIDED: u8 = 0;
const IO_CACHED: u8 = 1;
const IO_PASSTHROUGH: u8 = 2;

impl FileIo {
    /// Moves to `mode` unless already in the other one; true when in `mode` now. Once
    /// decided it only reads: opens from many threads share no written cache line.
    fn enter(&self, mode: u8) -> bool {
        let now = self.mode.load(Ordering::Acquire);
        if now != IO_UNDECIDED {
            return now == mode;
        }
        match self
            .mode
            .compare_exchange(IO_UNDECIDED, mode, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == mode,
        }
    }
}

impl Node {
    fn lower_chain(&self) -> &[crate::stack::Dir] {
        match &self.lower {
            Some(r) if self.merge => &r.chain,
            _ => &[],
        }
    }
}

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
    /// With a policy: opens are measured (see `measuring`), and the handles that can write
    /// are known, so a writer's close marks its file changed.
    measure: Option<Setup>,
    /// More for `verilay stats` (a remote image's fetching).
    extra_stats: Option<crate::measuring::ExtraStats>,
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

impl<S: ByteSource + 'static> UnionFs<S> {
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
            nodes: Arc::new(papaya::HashMap::new()),
            reaper: Arc::new(Reaper::for_this_process()),
            upper_ids: papaya::HashMap::new(),
            files: papaya::HashMap::new(),
            dirs: papaya::HashMap::new(),
            next_id: AtomicU64::new(FIRST_UPPER_ID),
            next_fh: AtomicU64::new(1),
            change: Mutex::new(()),
            as_root: rustix::process::geteuid().is_root(),
            notifier: Arc::new(OnceLock::new()),
            hardlinks,
            passthrough: false,
            measure: None,
            extra_stats: None,
            measured_fhs: papaya::HashMap::new(),
            xattrs: Rules::writable(upper.ns),
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
        self.measure = Some(setup);
    }

    /// Adds members to what `verilay stats` prints.
    pub fn set_extra_stats(&mut self, extra: crate::measuring::ExtraStats) {
        self.extra_stats = Some(extra);
    }

    /// The path the measurement list names for node `id`: the mountpoint joined with the
    /// names from the root down (borrowed from the nodes, joined once; bounded as the
    /// kernel's, see `crate::measured_path`).
    fn measured_path(&self, setup: &Setup, id: u64) -> Vec<u8> {
        let guard = self.nodes.guard();
        measured_path(setup, id, |at| {
            self.nodes.get(&at, &guard).map(|n| (n.parent, &n.name[..]))
        })
    }

    /// What a node's content is measured as: its layer's identity, and its content key
    /// and cookie. `None` when no rule can measure that layer (nothing more to do).
    /// `made`: the upper file's stat when the caller just made it (saves taking another).
    fn measured_as<'s>(
        &self,
        s: &'s Setup,
        n: &Node,
        made: Option<&rustix::fs::Stat>,
    ) -> Result<Option<MeasuredAs<'s>>, Errno> {
        let fs = match (&n.upper, &n.lower) {
            (Some(_), _) => s.upper.as_ref().ok_or(Errno::IO)?,
            (None, Some(r)) => &s.layers[r.top.layer as usize],
            _ => return Err(Errno::STALE),
        };
        if !s.measuring.may_measure(fs) {
            return Ok(None);
        }
        Ok(Some(match (&n.upper, &n.lower) {
            (Some(fd), _) => {
                let st = match made {
                    Some(st) => *st,
                    None => rfs::fstat(fd.as_fd())?,
                };
                let key = ContentKey::Upper {
                    dev: st.st_dev,
                    ino: st.st_ino,
                };
                // Rootless, the owner shown lives in the override xattr (see `attr`).
                let owner = self.as_root.then_some((st.st_uid, st.st_gid));
                (fs, key, Some(crate::measuring::cookie(&st)), owner)
            }
            (None, Some(r)) => {
                let key = ContentKey::Image {
                    layer: r.top.layer,
                    nid: r.top.nid,
                };
                (fs, key, None, Some((r.inode.uid, r.inode.gid)))
            }
            _ => return Err(Errno::STALE),
        }))
    }

    /// With a policy: measures the open of node `id` by `pid` with `flags`, and says what
    /// its handle must be remembered as: a writer (its close marks the file changed) or
    /// a measured reader (its close is counted, for IMA's violations).
    fn measure_open(
        &self,
        id: u64,
        flags: i32,
        pid: u32,
        fh: u64,
        made: Option<&rustix::fs::Stat>,
    ) -> Result<Option<Handle>, Errno> {
        let Some(s) = &self.measure else {
            return Ok(None);
        };
        let guard = self.nodes.guard();
        let n = self.nodes.get(&id, &guard).ok_or(Errno::STALE)?;
        let writes = crate::measuring::writes(flags);
        let Some((fs, key, cookie, owner)) = self.measured_as(s, n, made)? else {
            if writes {
                let path = || self.measured_path(s, id);
                s.write_opened(&n.io.opens, path, &self.log, &self.name)?;
            }
            return Ok(None);
        };
        let owner = match owner {
            Some(o) => o,
            None => self.attr(id, n).map(|a| (a.uid, a.gid))?,
        };
        if writes {
            // Counted before measuring, so the measurement keeps no digest; the handle is
            // remembered (for its close) once measured. Nothing below fails before that
            // but the measurement, which undoes the count.
            n.io.opens.writer_opened();
            s.measuring.changed(key);
        } else {
            n.io.fresh.store(false, Ordering::Release);
        }
        let o = Opening {
            flags,
            pid,
            owner,
            fs,
            key,
            cookie,
            opens: Some(&n.io.opens),
        };
        let files = self.files.pin();
        let content = UnionContent {
            fs: self,
            node: n,
            id,
            setup: s,
            handle: files
                .get(&fh)
                .map(|f| f.as_fd())
                .filter(|_| flags & libc::O_ACCMODE != libc::O_WRONLY),
        };
        match s.measure(&o, &content, &self.log, &self.name) {
            Ok(m) if writes => Ok(Some(Handle::Writer {
                key,
                hash_at_close: m.hash_at_close,
            })),
            Ok(m) => Ok(m.reader.then_some(Handle::Reader)),
            Err(e) => {
                if writes {
                    n.io.opens.writer_closed();
                }
                Err(e)
            }
        }
    }

    /// `measure_open` for a handle just opened: on failure the handle is closed again.
    /// A measured reader served from the image (no descriptor, `fh` 0) gets a handle of
    /// its own, so its close can be counted.
    fn measured(
        &self,
        id: u64,
        flags: i32,
        pid: u32,
        fh: u64,
        made: Option<&rustix::fs::Stat>,
    ) -> Result<u64, Errno> {
        match self.measure_open(id, flags, pid, fh, made) {
            Ok(None) => Ok(fh),
            Ok(Some(h)) => {
                let fh = match fh {
                    0 => IMAGE_HANDLE | self.next_fh.fetch_add(1, Ordering::Relaxed),
                    fh => fh,
                };
                self.measured_fhs.pin().insert(fh, (id, h));
                Ok(fh)
            }
            Err(e) => {
                if fh != 0 {
                    self.files.pin().remove(&fh);
                }
                Err(e)
            }
        }
    }

    /// With a policy: the handle `fh` (still readable through `handle`, if given) is
    /// closed; a writer's close marks its file changed, and the last writer's close may
    /// hash the file (`Measuring::closed`).
    fn measure_release(&self, fh: u64, handle: Option<BorrowedFd<'_>>) {
        let Some(s) = &self.measure else {
            return;
        };
        let Some((id, h)) = self.measured_fhs.pin().remove(&fh).copied() else {
            return;
        };
        let Handle::Writer { key, hash_at_close } = h else {
            let _ = self.with_node(id, |n| {
                if n.io.opens.reader_closed() {
                    s.measuring.released();
                }
                Ok(())
            });
            return;
        };
        s.measuring.changed(key);
        let _ = self.with_node(id, |n| {
            let last = n.io.opens.writer_closed();
            if last {
                s.measuring.released();
            }
            let Some(fd) = n.upper.as_ref().filter(|_| last && hash_at_close) else {
                return Ok(());
            };
            let st = rfs::fstat(fd.as_fd())?;
            let now = ContentKey::Upper {
                dev: st.st_dev,
                ino: st.st_ino,
            };
            if now == key {
                if crate::measuring::HASH_AT_CLOSE.contains(&(st.st_size as u64)) {
                    n.io.fresh.store(false, Ordering::Release);
                }
                // Only once it hashes (the file's size is in range) does it need to
                // know whether the closed handle can read.
                s.measuring.closed(key, crate::measuring::cookie(&st), || {
                    let readable = |h: &BorrowedFd<'_>| {
                        rfs::fcntl_getfl(h).is_ok_and(|m| m & OFlags::ACCMODE != OFlags::WRONLY)
                    };
                    let content = UnionContent {
                        fs: self,
                        node: n,
                        id,
                        setup: s,
                        handle: handle.filter(readable),
                    };
                    content.upper_reader(fd.as_fd())
                });
            }
            Ok(())
        });
    }

    /// With a policy: node `id`'s content changed without an open (a truncation by path).
    fn measure_changed(&self, id: u64) {
        let Some(s) = &self.measure else {
            return;
        };
        if let Ok(Some((_, key, _, _))) = self.with_node(id, |n| self.measured_as(s, n, None)) {
            s.measuring.changed(key);
        }
    }

    fn lower_id(&self, o: Obj) -> u64 {
        obj_ino(o, self.root_top)
    }

    /// A copy of a node, for the paths that change the tree.
    fn node(&self, id: u64) -> Result<Node, Errno> {
        self.nodes.pin().get(&id).cloned().ok_or(Errno::STALE)
    }

    /// Runs `f` on a node in place: the per-request paths (lookup, getattr, open, read,
    /// xattrs) copy nothing and bump no shared count.
    fn with_node<T>(&self, id: u64, f: impl FnOnce(&Node) -> Result<T, Errno>) -> Result<T, Errno> {
        let guard = self.nodes.guard();
        f(self.nodes.get(&id, &guard).ok_or(Errno::STALE)?)
    }

    /// Where node `n`'s attributes, bytes and xattrs come from.
    fn backing<'a>(&'a self, n: &'a Node) -> Result<Backing<'a, S>, Errno> {
        match (&n.upper, &n.lower) {
            (Some(fd), _) => Ok(Backing::Upper(fd.as_fd())),
            (None, Some(r)) => Ok(Backing::Image {
                image: self.stack.image(r.top.layer),
                inode: &r.inode,
            }),
            (None, None) => Err(Errno::STALE),
        }
    }

    /// The errno for a failed read of what backs a node, an image's logged as `lower_err`
    /// logs it.
    fn failed(&self, what: &str, about: Lower<'_>, e: Failed) -> Errno {
        match e {
            Failed::Image(e) => self.lower_err(what, about, e),
            Failed::Host(e) => e,
        }
    }

    /// The errno for an error reading the images, logged in one line naming `what` was
    /// done to which file (`read of /usr/bin/ls (inode 1234)`).
    fn lower_err(&self, what: &str, about: Lower<'_>, e: erofs::read::Error) -> Errno {
        let errno = e.errno();
        let subject = self.subject(about);
        (self.log)(&format!(
            "{}: {what} of {subject}: {}",
            self.name,
            crate::stack::describe(&e)
        ));
        Errno::from_raw_os_error(errno)
    }

    /// How a log line names what `about` stands for: its path in the mount, from the
    /// nodes' parents and names, as `measured_path` finds it (see `logged_subject`).
    fn subject(&self, about: Lower<'_>) -> String {
        let stacked = self.stack.layers.len() > 1;
        let guard = self.nodes.guard();
        let up = |at| self.nodes.get(&at, &guard).map(|n| (n.parent, &n.name[..]));
        match about {
            Lower::Node(id) => {
                let obj = self.nodes.get(&id, &guard).and_then(|n| n.lower.as_ref());
                logged_subject(id, None, obj.map(|r| (r.top, stacked)), up)
            }
            Lower::Entry(dir, name) => logged_subject(dir, Some(name), None, up),
            Lower::Walk(layer, path) => {
                let p = logged_path(path);
                format!("{p} of layer {layer}")
            }
        }
    }

    /// A directory has one place. One that a lookup finds while the kernel knows it under
    /// another name or parent (a directory of the images under two names, two upper
    /// directories redirected to one image directory, a bind mount inside the upper
    /// directory) is EIO and one log line: the kernel would otherwise show one inode in
    /// two places, and the parents kept for copy-up and paths would stop being a tree.
    /// That covers a directory found inside itself too: the ancestors of a node the
    /// kernel knows are known. Renames move a node before the kernel looks it up again.
    fn check_one_place(&self, id: u64, n: &Node) -> Result<(), Errno> {
        let guard = self.nodes.guard();
        let Some(known) = self.nodes.get(&id, &guard) else {
            return Ok(());
        };
        if (known.parent, &known.name) == (n.parent, &n.name) || !is_dir_node(n) {
            return Ok(());
        }
        (self.log)(&format!(
            "{}: directory {id} is {:?} in directory {}, and was found again as {:?} in directory {}: refused (one directory in two places)",
            self.name,
            String::from_utf8_lossy(&known.name),
            known.parent,
            String::from_utf8_lossy(&n.name),
            n.parent
        ));
        Err(Errno::IO)
    }

    /// The id an upper object goes by: the one it already has, else `fallback` (its image
    /// id) or a new one.
    fn upper_id(&self, st: &Stat, fallback: impl FnOnce() -> Option<u64>) -> u64 {
        let key = (st.st_dev, st.st_ino);
        let ids = self.upper_ids.pin();
        if let Some(&id) = ids.get(&key) {
            return id;
        }
        let id = fallback().unwrap_or_else(|| self.next_id.fetch_add(1, Ordering::Relaxed));
        *ids.get_or_insert(key, id)
    }

    /// The image id a copied-up regular file keeps after a remount: the one its copy-up
    /// recorded, if the images still have that very object at its path and nowhere else
    /// (one name), so no other object can show the same number.
    fn origin_id(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        st: &Stat,
        lower: &Option<Resolved>,
    ) -> Option<u64> {
        let r = lower.as_ref()?;
        if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile
            || !r.inode.is_reg()
            || r.inode.nlink != 1
        {
            return None;
        }
        let id = self.lower_id(r.top);
        let mut path = Self::real_path(dir).into_bytes();
        path.push(b'/');
        path.extend_from_slice(name);
        let path = CString::new(path).ok()?;
        let mut buf = [0u8; 24];
        let n = rfs::lgetxattr(path.as_c_str(), self.upper.ns.origin(), &mut buf).ok()?;
        (buf[..n] == *id.to_string().as_bytes()).then_some(id)
    }

    /// `name` in directory `parent` as the merged tree has it: (id, node), or `None`.
    fn resolve(&self, parent: u64, name: &[u8]) -> Result<Option<(u64, Node)>, Errno> {
        self.with_node(parent, |p| self.resolve_in(parent, p, name))
    }

    fn resolve_in(&self, parent: u64, p: &Node, name: &[u8]) -> Result<Option<(u64, Node)>, Errno> {
        let mut upper_st = None;
        if let Some(pfd) = &p.upper {
            match self.upper.stat(pfd.as_fd(), name) {
                Ok(Some(st)) if upper::is_whiteout(&st) => return Ok(None),
                Ok(found) => upper_st = found,
                Err(e) => return Err(errno(e)),
            }
        }
        let chain = p.lower_chain();
        let lower = if chain.is_empty() {
            None
        } else {
            self.stack
                .lookup(chain, name)
                .map_err(|e| self.lower_err("lookup", Lower::Entry(parent, name), e))?
        };
        let node = |lower, upper, merge| Node {
            parent,
            name: name.to_vec(),
            lower,
            upper,
            merge,
            lookups: Arc::new(AtomicU64::new(0)),
            io: Arc::default(),
        };
        let Some(st) = upper_st else {
            return Ok(lower.map(|r: Resolved| (self.lower_id(r.top), node(Some(r), None, true))));
        };
        let pfd = p.upper.as_ref().expect("stat came from it");
        let fd = self.open_entry(pfd.as_fd(), name, &st)?;
        let is_dir = is_dir_mode(st.st_mode);
        let merge = is_dir && self.upper.opacity(fd.as_fd()) != upper::Opacity::Opaque;
        // A directory moved here merges with the image directories it was moved from.
        let lower = match merge.then(|| self.upper.redirect(fd.as_fd())).flatten() {
            Some(to) => self.lower_at(chain, &to, Lower::Entry(parent, name))?,
            None => lower,
        };
        // An upper directory merges with image directories only.
        let (lower, at_path) = match lower {
            Some(r) if merge && !r.chain.is_empty() => (Some(r), None),
            other => (None, other),
        };
        let id = self.upper_id(&st, || match &lower {
            Some(r) => Some(self.lower_id(r.top)),
            None => self.origin_id(pfd.as_fd(), name, &st, &at_path),
        });
        Ok(Some((id, node(lower, Some(Arc::new(fd)), merge))))
    }

    /// What the images have where a redirect points: a name in `chain` (the parent's
    /// image directories), or a path from the image root when it starts with `/`.
    /// `about` is the directory redirected, for a log line.
    fn lower_at(
        &self,
        chain: &[crate::stack::Dir],
        to: &[u8],
        about: Lower<'_>,
    ) -> Result<Option<Resolved>, Errno> {
        let look = |chain: &[crate::stack::Dir], name: &[u8]| {
            self.stack
                .lookup(chain, name)
                .map_err(|e| self.lower_err("redirect lookup", about, e))
        };
        if !overlay::valid_redirect(to) {
            (self.log)(&format!(
                "{}: invalid redirect {:?} in the upper directory",
                self.name,
                String::from_utf8_lossy(to)
            ));
            return Err(Errno::IO);
        }
        let Some(path) = to.strip_prefix(b"/") else {
            return look(chain, to);
        };
        let mut at = self.with_node(1, |root| Ok(root.lower.clone()))?;
        for part in path.split(|&b| b == b'/') {
            at = match at {
                Some(r) if !r.chain.is_empty() => look(&r.chain, part)?,
                _ => return Ok(None),
            };
        }
        Ok(at)
    }

    /// The redirect a directory with image contents needs before it moves (overlayfs's
    /// rules): none if it has one that still holds (any absolute one; a relative one
    /// within the same parent), its current name within the same parent, else its image
    /// path from the root, made of its ancestors' redirects and names.
    fn redirect_for(&self, id: u64, same_parent: bool) -> Result<Option<Vec<u8>>, Errno> {
        let own = |n: &Node| {
            n.upper
                .as_ref()
                .and_then(|fd| self.upper.redirect(fd.as_fd()))
        };
        let n = self.node(id)?;
        if let Some(r) = own(&n) {
            if same_parent || r.starts_with(b"/") {
                return Ok(None);
            }
        }
        if same_parent {
            return Ok(Some(n.name.clone()));
        }
        // Built as overlayfs builds it (`ovl_get_redirect`), within its limit: longer
        // is EXDEV, and `mv` copies instead. Every step adds a byte, so this ends.
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let mut len = 0;
        let mut cur = (id, n);
        while cur.0 != 1 {
            let part = own(&cur.1).unwrap_or_else(|| cur.1.name.clone());
            let absolute = part.starts_with(b"/");
            len += part.len() + usize::from(!absolute);
            if len > REDIRECT_MAX {
                return Err(Errno::XDEV);
            }
            parts.push(part);
            if absolute {
                break;
            }
            let parent = cur.1.parent;
            cur = (parent, self.node(parent)?);
        }
        let mut path = Vec::new();
        for p in parts.iter().rev() {
            if !p.starts_with(b"/") {
                path.push(b'/');
            }
            path.extend_from_slice(p);
        }
        Ok(Some(path))
    }

    /// Readies a copied-up object that is about to move under `dest_parent`: a directory
    /// with image contents gets its redirect; one of the upper layer alone, moving into a
    /// merged directory, becomes opaque, so it never merges with what the images have at
    /// its new name.
    fn mark_moving_dir(
        &self,
        fd: BorrowedFd<'_>,
        m: Moving,
        dest_parent: u64,
    ) -> Result<(), Errno> {
        if let Some(to) = &m.redirect {
            return self.upper.set_redirect(fd, to).map_err(errno);
        }
        if m.is_dir
            && !m.lower_dir
            && self.upper.opacity(fd) != upper::Opacity::Opaque
            && self.with_node(dest_parent, |p| Ok(!p.lower_chain().is_empty()))?
        {
            self.upper.set_opaque(fd).map_err(errno)?;
        }
        Ok(())
    }

    /// Keeps a node the daemon itself needs (to copy it up, to list it) without counting a
    /// kernel reference: one already known stays as it is.
    fn ensure_node(&self, id: u64, n: Node) {
        let nodes = self.nodes.pin();
        if nodes.get(&id).is_none() {
            nodes.insert(id, n);
        }
    }

    /// Records that node `id` is now `name` in `parent`.
    fn moved(&self, id: u64, parent: u64, name: &[u8]) {
        let nodes = self.nodes.pin();
        if let Some(n) = nodes.get(&id) {
            let mut m = n.clone();
            m.parent = parent;
            m.name = name.to_vec();
            nodes.insert(id, m);
        }
    }

    /// Registers a node the kernel is told about (one more lookup).
    fn remember(&self, id: u64, mut n: Node) {
        let nodes = self.nodes.pin();
        if let Some(old) = nodes.get(&id) {
            n.lookups = old.lookups.clone();
            n.io = old.io.clone();
        }
        n.lookups.fetch_add(1, Ordering::Relaxed);
        n.io.seen.store(self.reaper.tick(), Ordering::Relaxed);
        let over = n
            .upper
            .as_ref()
            .is_some_and(|fd| self.reaper.over(fd.as_raw_fd()));
        nodes.insert(id, n);
        if over {
            self.reap();
        }
    }

    /// The descriptor a node keeps for upper object `name` in `dir`. Out of descriptors
    /// (a burst of lookups outran the reaper), it waits for a pass and tries once more.
    fn open_entry(&self, dir: BorrowedFd<'_>, name: &[u8], st: &Stat) -> Result<OwnedFd, Errno> {
        match self.upper.open_entry(dir, name, st) {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error()) => {
                self.reap();
                self.reaper.wait();
                self.upper.open_entry(dir, name, st).map_err(errno)
            }
            r => r.map_err(errno),
        }
    }

    /// Has the kernel drop the names looked up longest ago, so that their nodes' upper
    /// descriptors close (see `reaper`). Directories too: the kernel forgets one only
    /// after its children, so a node's parent is always there for it.
    fn reap(&self) {
        let nodes = self.nodes.clone();
        self.reaper.start(&self.notifier, move || {
            let guard = nodes.guard();
            nodes
                .iter(&guard)
                .filter(|(&id, n)| {
                    id != 1 && n.upper.is_some() && n.lookups.load(Ordering::Relaxed) > 0
                })
                .map(|(_, n)| Held {
                    seen: n.io.seen.load(Ordering::Relaxed),
                    parent: n.parent,
                    name: n.name.clone(),
                })
                .collect()
        });
    }

    /// A node's attributes: its upper object's (rootless, with the owner and mode the
    /// override xattr records), else its image object's. A directory merging layers has
    /// nlink 1, as in overlayfs.
    fn attr(&self, id: u64, n: &Node) -> Result<Attr, Errno> {
        let mut a = self.backing(n)?.attr(id)?;
        match (&n.upper, &n.lower) {
            (Some(fd), _) if !self.as_root => {
                if let Some(o) = read_override(fd.as_fd()) {
                    o.apply(&mut a);
                }
            }
            _ => {}
        }
        let merged = match (&n.upper, &n.lower) {
            (Some(_), _) => !n.lower_chain().is_empty(),
            (None, Some(r)) => r.is_merged(),
            (None, None) => false,
        };
        if merged {
            a.nlink = 1;
        }
        Ok(a)
    }

    /// The upper directory of `id`, copying it (and its parents) up first.
    fn upper_dir(&self, id: u64) -> Result<Arc<OwnedFd>, Errno> {
        self.copy_up(id)
    }

    /// `copy_up` for callers that do not hold `change`: an object already in the upper
    /// directory (the common case) needs no lock.
    fn copied_up(&self, id: u64) -> Result<Arc<OwnedFd>, Errno> {
        if let Some(fd) = self.with_node(id, |n| Ok(n.upper.clone()))? {
            return Ok(fd);
        }
        let _l = self.lock();
        self.copy_up(id)
    }

    /// Makes `id` an upper object (a no-op when it is one): the ancestors it lacks first,
    /// from the topmost down, then the object. A loop, not recursion: a tree may be
    /// thousands of levels deep. Callers hold `change`.
    fn copy_up(&self, id: u64) -> Result<Arc<OwnedFd>, Errno> {
        let mut missing = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut at = id;
        let mut pfd = loop {
            let n = self.node(at)?;
            if let Some(fd) = &n.upper {
                break fd.clone();
            }
            // Lookups keep the parents a tree (`check_one_place`); should that ever fail,
            // this is an error, not a walk around a loop.
            if !seen.insert(at) {
                (self.log)(&format!(
                    "{}: copy-up of {id}: its parents loop at directory {at}",
                    self.name
                ));
                return Err(Errno::IO);
            }
            let parent = n.parent;
            missing.push((at, n));
            at = parent;
        };
        for (id, n) in missing.into_iter().rev() {
            pfd = self.copy_up_one(id, n, &pfd)?;
        }
        Ok(pfd)
    }

    /// Copies node `id` (`n`, not yet in the upper directory) into `pfd`, its parent's
    /// upper directory: with its metadata, xattrs and contents, atomically.
    fn copy_up_one(&self, id: u64, n: Node, pfd: &OwnedFd) -> Result<Arc<OwnedFd>, Errno> {
        let r = n.lower.as_ref().ok_or(Errno::STALE)?;
        let img = self.stack.image(r.top.layer);
        let inode: &Inode = &r.inode;
        let xattrs = img
            .xattrs(inode)
            .map_err(|e| self.lower_err("copy-up xattrs", Lower::Node(id), e))?
            .into_iter()
            .filter(|(k, _)| self.xattrs.copied_up(k))
            .collect();
        let mut meta = Meta {
            mode: u32::from(inode.mode),
            uid: inode.uid,
            gid: inode.gid,
            mtime: (inode.mtime, inode.mtime_nsec),
            rdev: inode.rdev,
            xattrs,
        };
        if !self.as_root {
            let me = (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            );
            let shown = Override {
                uid: meta.uid,
                gid: meta.gid,
                mode: meta.mode,
            };
            // Only user.* and ACLs can be set by an ordinary user.
            meta.xattrs
                .retain(|(k, _)| k.starts_with(b"user.") || k.starts_with(b"system.posix_acl_"));
            // Linux allows user.* xattrs on files and directories only.
            let carries = inode.is_reg() || inode.is_dir();
            if carries && ((meta.uid, meta.gid) != me || host_perm(meta.mode) != meta.mode & 0o7777)
            {
                meta.xattrs
                    .push((OVERRIDE_XATTR.as_bytes().to_vec(), shown.encode()));
            }
            (meta.uid, meta.gid) = me;
            meta.mode = (meta.mode & !0o7777) | host_perm(meta.mode);
        }
        if inode.is_reg() {
            meta.xattrs.push((
                self.upper.ns.origin().as_bytes().to_vec(),
                id.to_string().into_bytes(),
            ));
        }
        let target;
        // A failure is logged here, where the file is known, and keeps its errno.
        let mut read = |off: u64, buf: &mut [u8]| {
            img.read(inode, off, buf).map_err(|e| {
                let errno = self.lower_err("copy-up read", Lower::Node(id), e);
                std::io::Error::from_raw_os_error(errno.raw_os_error())
            })
        };
        let contents = if inode.is_dir() {
            Contents::Dir
        } else if inode.is_reg() {
            Contents::File {
                size: inode.size,
                read: &mut read,
            }
        } else if inode.is_symlink() {
            target = img
                .readlink(inode)
                .map_err(|e| self.lower_err("copy-up readlink", Lower::Node(id), e))?;
            Contents::Symlink(&target)
        } else {
            Contents::Special
        };
        let st = self.keeping_times(n.parent, pfd, || {
            self.upper
                .create(pfd.as_fd(), &n.name, &meta, contents)
                .map_err(errno)
        })?;
        let fd = Arc::new(self.open_entry(pfd.as_fd(), &n.name, &st)?);
        self.upper_ids.pin().insert((st.st_dev, st.st_ino), id);
        let mut up = n.clone();
        up.upper = Some(fd.clone());
        if !inode.is_dir() {
            up.lower = None;
        }
        self.nodes.pin().insert(id, up);
        if inode.is_dir() {
            // Its size and link count are the upper directory's now (attributes only:
            // a negative offset leaves cached pages alone).
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(id, -1, 0);
            }
        }
        if inode.is_reg() && inode.nlink > 1 {
            self.link_other_names(r.top, &fd)?;
        }
        Ok(fd)
    }

    /// Runs `copy`, a copy-up into `pfd` (the upper directory of node `parent`), and then
    /// gives that directory back its access and modification times, as overlayfs does
    /// (`ovl_set_timestamps` on the parent in copy_up.c): a copy-up is no change of the
    /// merged directory. Its ctime still moves, so the kernel's cached attributes of
    /// `parent` are dropped, for the merged directory to show the upper one's times.
    fn keeping_times<T>(
        &self,
        parent: u64,
        pfd: &OwnedFd,
        copy: impl FnOnce() -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let before = rfs::fstat(pfd)?;
        let done = copy()?;
        let t = rfs::Timestamps {
            last_access: rfs::Timespec {
                tv_sec: before.st_atime as _,
                tv_nsec: before.st_atime_nsec as _,
            },
            last_modification: rfs::Timespec {
                tv_sec: before.st_mtime as _,
                tv_nsec: before.st_mtime_nsec as _,
            },
        };
        // Best effort, as in overlayfs: the copy-up itself has succeeded.
        let _ = rfs::utimensat(
            rfs::CWD,
            Self::real_path(pfd.as_fd()).as_c_str(),
            &t,
            AtFlags::empty(),
        );
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(parent, -1, 0);
        }
        Ok(done)
    }

    /// Keeps an image file's hardlinks together when it is copied up: every other name
    /// the merged tree shows for the same image inode becomes a link to the new upper file
    /// (in the layout overlayfs itself would read as plain hardlinks).
    fn link_other_names(&self, obj: Obj, fd: &OwnedFd) -> Result<(), Errno> {
        let paths = self.hardlink_paths(obj.layer)?;
        for path in paths.get(&obj.nid).into_iter().flatten() {
            let (name, dirs) = path.split_last().expect("paths are not empty");
            // Walk the merged tree to the parent, keeping the nodes copy-up will need.
            let mut parent = Some(1u64);
            for part in dirs {
                parent = match (parent, parent.map(|p| self.resolve(p, part)).transpose()?) {
                    (Some(_), Some(Some((cid, n)))) if is_dir_node(&n) => {
                        self.ensure_node(cid, n);
                        Some(cid)
                    }
                    _ => None,
                };
            }
            // Skip a name that no longer shows this image file.
            let Some(parent) = parent else { continue };
            let shows = matches!(
                self.resolve(parent, name)?,
                Some((_, n)) if n.upper.is_none() && n.lower.as_ref().map(|r| r.top) == Some(obj)
            );
            if !shows {
                continue;
            }
            let pfd = self.copy_up(parent)?;
            self.keeping_times(parent, &pfd, || {
                rfs::linkat(
                    rfs::CWD,
                    Self::real_path(fd.as_fd()).as_c_str(),
                    pfd.as_fd(),
                    cname(name)?.as_c_str(),
                    AtFlags::SYMLINK_FOLLOW,
                )
            })?;
        }
        Ok(())
    }

    /// For one layer: every path of each regular file with more than one link, by nid.
    /// Walked once, on the first copy-up of such a file; a directory out of its place
    /// (which no lookup shows) is not entered.
    fn hardlink_paths(&self, layer: u16) -> Result<&LinkPaths, Errno> {
        let slot = &self.hardlinks[usize::from(layer)];
        if let Some(m) = slot.get() {
            return Ok(m);
        }
        let img = self.stack.image(layer);
        let mut map = LinkPaths::default();
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![(img.root_nid(), Vec::<Vec<u8>>::new())];
        while let Some((nid, path)) = stack.pop() {
            if !seen.insert(nid) {
                continue;
            }
            let dir = img
                .inode(nid)
                .map_err(|e| self.lower_err("hardlink walk", Lower::Walk(layer, &path), e))?;
            for e in img
                .readdir(&dir, 0)
                .map_err(|e| self.lower_err("hardlink walk", Lower::Walk(layer, &path), e))?
            {
                let e =
                    e.map_err(|e| self.lower_err("hardlink walk", Lower::Walk(layer, &path), e))?;
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let mut p = path.clone();
                p.push(e.name.clone());
                if e.file_type == erofs::format::FT_DIR {
                    let child = img
                        .inode(e.nid)
                        .map_err(|e| self.lower_err("hardlink walk", Lower::Walk(layer, &p), e))?;
                    match self.stack.check_placement(layer, nid, &e.name, &child) {
                        Ok(()) => stack.push((e.nid, p)),
                        Err(e) if crate::stack::misplaced(&e).is_some() => {}
                        Err(e) => {
                            return Err(self.lower_err("hardlink walk", Lower::Walk(layer, &p), e))
                        }
                    }
                } else if e.file_type == erofs::format::FT_REG_FILE {
                    let i = img
                        .inode(e.nid)
                        .map_err(|e| self.lower_err("hardlink walk", Lower::Walk(layer, &p), e))?;
                    if i.nlink > 1 {
                        map.entry(e.nid).or_default().push(p);
                    }
                }
            }
        }
        let _ = slot.set(map);
        Ok(slot.get().expect("just set"))
    }

    /// Owner of a new object: the caller's as root (group from a set-group-id parent),
    /// ours otherwise.
    fn owner(&self, caller: &Caller, parent_fd: BorrowedFd<'_>) -> (u32, u32) {
        if !self.as_root {
            return (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            );
        }
        let gid = match rfs::fstat(parent_fd) {
            Ok(st) if st.st_mode & 0o2000 != 0 => st.st_gid,
            _ => caller.gid,
        };
        (caller.uid, gid)
    }

    /// Makes a new object `name` in `parent`: in place of a whiteout (a directory made so
    /// is opaque, hiding the images' one), else fresh. Returns its id, attributes, the
    /// descriptor the creation opened (if any) and the host's stat of it.
    fn make(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        want: Want,
        contents: Contents<'_>,
    ) -> Result<(u64, Attr, Option<OwnedFd>, rustix::fs::Stat), Errno> {
        let Want { mode, umask, rdev } = want;
        let pfd = self.upper_dir(parent)?;
        let (uid, gid) = self.owner(caller, pfd.as_fd());
        // A default ACL on the parent takes the umask's place (POSIX.1e), and the host
        // applies it when the object is made there; otherwise the umask applies.
        let mut buf = [0u8; 1];
        let inherits = matches!(
            rfs::fgetxattr(pfd.as_fd(), "system.posix_acl_default", &mut buf),
            Ok(_) | Err(rustix::io::Errno::RANGE)
        );
        let mut mode = if inherits {
            mode
        } else {
            mode & !(umask & 0o777)
        };
        let dir_mode = is_dir_mode(mode);
        if dir_mode && gid != caller.gid && self.as_root {
            mode |= 0o2000; // directories inherit set-group-id
        }
        let mut meta = Meta {
            mode,
            uid,
            gid,
            mtime: now(),
            rdev,
            xattrs: Vec::new(),
        };
        let carries = matches!(
            rfs::FileType::from_raw_mode(mode),
            rfs::FileType::RegularFile | rfs::FileType::Directory
        );
        if !self.as_root && carries && (caller.uid, caller.gid) != (uid, gid) {
            let shown = Override {
                uid: caller.uid,
                gid: caller.gid,
                mode,
            };
            meta.xattrs
                .push((OVERRIDE_XATTR.as_bytes().to_vec(), shown.encode()));
        }
        // A directory made in a merged one is opaque, as overlayfs makes it (with
        // redirect_dir): over a whiteout it must be, so the images' one stays hidden, and
        // it is made so before it appears.
        let opaque = (
            self.upper.ns.opaque().as_bytes().to_vec(),
            overlay::OPAQUE.to_vec(),
        );
        if dir_mode && self.with_node(parent, |p| Ok(!p.lower_chain().is_empty()))? {
            meta.xattrs.push(opaque.clone());
        }
        let mut contents = contents;
        // The kernel looked the name up and found nothing, so it is free in the upper
        // directory too, or holds a whiteout (the images have the name): only then does
        // the object go through the work directory.
        let (st, file) =
            match self
                .upper
                .create_fresh(pfd.as_fd(), name, &meta, contents.reborrow(), inherits)
            {
                Err(e) if e.raw_os_error() == Some(Errno::EXIST.raw_os_error()) => {
                    let existing = self.upper.stat(pfd.as_fd(), name).map_err(errno)?;
                    if !existing.as_ref().is_some_and(upper::is_whiteout) {
                        return Err(Errno::EXIST);
                    }
                    if dir_mode && !meta.xattrs.contains(&opaque) {
                        meta.xattrs.push(opaque);
                    }
                    let st = self
                        .upper
                        .replace(pfd.as_fd(), name, &meta, contents)
                        .map_err(errno)?;
                    (st, None)
                }
                made => made.map_err(errno)?,
            };
        let fd = self.open_entry(pfd.as_fd(), name, &st)?;
        let id = self.upper_id(&st, || None);
        let io = FileIo::default();
        io.fresh.store(true, Ordering::Relaxed);
        let node = Node {
            parent,
            name: name.to_vec(),
            lower: None,
            upper: Some(Arc::new(fd)),
            merge: false,
            lookups: Arc::new(AtomicU64::new(0)),
            io: Arc::new(io),
        };
        let attr = Attr::of_stat(id, &st);
        self.remember(id, node);
        Ok((id, attr, file, st))
    }

    /// Whether the images have something at `name` under `parent` (a whiteout is then
    /// needed once the upper object goes).
    fn lower_has(&self, parent: u64, name: &[u8]) -> Result<bool, Errno> {
        self.with_node(parent, |p| {
            let chain = p.lower_chain();
            if chain.is_empty() {
                return Ok(false);
            }
            Ok(self
                .stack
                .lookup(chain, name)
                .map_err(|e| self.lower_err("lookup", Lower::Entry(parent, name), e))?
                .is_some())
        })
    }

    /// The merged directory's entries, without `.` and `..`: upper names first (whiteouts
    /// hide and are hidden), then the images' names not seen above.
    fn listing(&self, id: u64) -> Result<Vec<(Vec<u8>, u64, Kind)>, Errno> {
        let n = self.node(id)?;
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        if let Some(fd) = &n.upper {
            for (name, _) in self.upper.list(fd.as_fd()).map_err(errno)? {
                seen.insert(name.clone());
                let Some(st) = self.upper.stat(fd.as_fd(), &name).map_err(errno)? else {
                    continue;
                };
                if upper::is_whiteout(&st) {
                    continue;
                }
                // Without opening anything: the id it has, else for a directory that
                // merges with the images' one their id, else a new one.
                let known = self.upper_ids.pin().get(&(st.st_dev, st.st_ino)).copied();
                let id = known.unwrap_or_else(|| {
                    let lower = if n.lower_chain().is_empty() {
                        None
                    } else {
                        self.stack.lookup(n.lower_chain(), &name).ok().flatten()
                    };
                    self.upper_id(&st, || match &lower {
                        Some(r) if is_dir_mode(st.st_mode) && !r.chain.is_empty() => {
                            Some(self.lower_id(r.top))
                        }
                        _ => self.origin_id(fd.as_fd(), &name, &st, &lower),
                    })
                });
                out.push((name, id, kind(st.st_mode)));
            }
        }
        let chain = n.lower_chain();
        if !chain.is_empty() {
            for (name, r) in self
                .stack
                .list(chain)
                .map_err(|e| self.lower_err("readdir", Lower::Node(id), e))?
            {
                if seen.insert(name.clone()) {
                    out.push((name, self.lower_id(r.top), kind(r.inode.mode.into())));
                }
            }
        }
        Ok(out)
    }

    fn real_path(fd: BorrowedFd<'_>) -> CString {
        upper::fd_path(fd)
    }

    fn open_real(&self, fd: BorrowedFd<'_>, flags: i32) -> Result<u64, Errno> {
        // O_DIRECT is not passed on: FUSE hands us unaligned buffers and lets callers use
        // any alignment, which the host's direct I/O refuses. O_SYNC and O_DSYNC are, so
        // writes are as durable as asked.
        let keep = OFlags::from_bits_truncate(flags as u32)
            & (OFlags::ACCMODE | OFlags::APPEND | OFlags::TRUNC | OFlags::SYNC | OFlags::DSYNC);
        let f = rfs::open(
            Self::real_path(fd).as_c_str(),
            keep | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.pin().insert(fh, f);
        Ok(fh)
    }

    /// The passthrough registration of node `id`, opened as handle `fh`: made on first
    /// use (the kernel takes only the file's path from the descriptor, and `O_PATH` ones
    /// it refuses); `None` for image files, or when the kernel refuses.
    fn passthrough_of(&self, id: u64, fh: u64, register: Register<'_>) -> Option<Arc<Passthrough>> {
        let guard = self.nodes.guard();
        let files = self.files.pin();
        let (n, open) = (self.nodes.get(&id, &guard)?, files.get(&fh)?);
        if !self.passthrough || n.upper.is_none() || !n.io.enter(IO_PASSTHROUGH) {
            return None;
        }
        n.io.backing
            .get_or_init(|| register(open.as_fd()).ok().map(Arc::new))
            .clone()
    }

    fn with_file<T>(
        &self,
        fh: u64,
        f: impl FnOnce(BorrowedFd<'_>) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let files = self.files.pin();
        let fd = files.get(&fh).ok_or(Errno::BADF)?;
        f(fd.as_fd())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.change.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An object about to be renamed: the redirect it needs (see `redirect_for`), whether it
/// is a directory with image contents, and whether it is a directory at all.
struct Moving {
    redirect: Option<Vec<u8>>,
    lower_dir: bool,
    is_dir: bool,
}

/// Whether a node is a directory (its upper object's type, else the image's).
fn is_dir_node(n: &Node) -> bool {
    match (&n.upper, &n.lower) {
        (Some(fd), _) => rfs::fstat(fd.as_fd()).is_ok_and(|st| is_dir_mode(st.st_mode)),
        (None, Some(r)) => r.inode.is_dir(),
        _ => false,
    }
}

/// Per nid, every path (as name components) of a hardlinked image file.
type LinkPaths = std::collections::HashMap<u64, Vec<Vec<Vec<u8>>>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Override {
    uid: u32,
    gid: u32,
    /// Permission bits, and the type bits when recorded.
    mode: u32,
}

impl Override {
    fn encode(&self) -> Vec<u8> {
        format!("{}:{}:0{:o}", self.uid, self.gid, self.mode).into_bytes()
    }

    fn parse(v: &[u8]) -> Option<Override> {
        let s = std::str::from_utf8(v).ok()?;
        let mut f = s.trim_end_matches('\0').split(':');
        let o = Override {
            uid: f.next()?.parse().ok()?,
            gid: f.next()?.parse().ok()?,
            mode: u32::from_str_radix(f.next()?, 8).ok()?,
        };
        // A fourth field (a type name, as some tools write) is allowed and not needed.
        Some(o)
    }

    fn apply(&self, a: &mut Attr) {
        a.uid = self.uid;
        a.gid = self.gid;
        a.perm = (self.mode & 0o7777) as u16;
        if self.mode & 0o170000 != 0 {
            a.kind = kind(self.mode);
        }
    }
}

fn read_override(fd: BorrowedFd<'_>) -> Option<Override> {
    let mut buf = [0u8; 128];
    let path = upper::fd_path(fd);
    let n = rfs::getxattr(path.as_c_str(), OVERRIDE_XATTR, &mut buf).ok()?;
    Override::parse(&buf[..n])
}

fn write_override(fd: BorrowedFd<'_>, o: &Override) -> rustix::io::Result<()> {
    let path = upper::fd_path(fd);
    rfs::setxattr(
        path.as_c_str(),
        OVERRIDE_XATTR,
        &o.encode(),
        rfs::XattrFlags::empty(),
    )
}

/// The permissions an upper file gets on the host in a rootless mount: what was asked,
/// plus whatever we need to keep reading and writing it ourselves.
fn host_perm(mode: u32) -> u32 {
    let perm = mode & 0o7777;
    if is_dir_mode(mode) {
        perm | 0o700
    } else {
        perm | 0o600
    }
}

/// What the caller asked a new object to be: type and permission bits, the umask to apply
/// (unless a default ACL replaces it), and a device number.
struct Want {
    mode: u32,
    umask: u32,
    rdev: (u32, u32),
}

fn ts(t: SetTime) -> rfs::Timespec {
    match t {
        SetTime::Now => rfs::Timespec {
            tv_sec: 0,
            tv_nsec: rfs::UTIME_NOW,
        },
        SetTime::At(t) => {
            let (s, n) = match t.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
                Err(e) => {
                    let d = e.duration();
                    let mut s = -(d.as_secs() as i64);
                    let mut n = -(d.subsec_nanos() as i64);
                    if n < 0 {
                        s -= 1;
                        n += 1_000_000_000;
                    }
                    (s, n)
                }
            };
            rfs::Timespec {
                tv_sec: s,
                tv_nsec: n as _,
            }
        }
    }
}

fn omit() -> rfs::Timespec {
    rfs::Timespec {
        tv_sec: 0,
        tv_nsec: rfs::UTIME_OMIT,
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
            background: None,
        }
    }

    fn granted(&mut self, granted: &Granted) {
        self.passthrough = granted.passthrough;
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
        if id == 1 {
            return;
        }
        // No lock: a lookup racing with this one bumps the shared count first, and the
        // removal only happens if the count is still zero then.
        let nodes = self.nodes.pin();
        if let Some(n) = nodes.get(&id) {
            if n.lookups.fetch_sub(nlookup, Ordering::Relaxed) <= nlookup
                && matches!(
                    nodes.remove_if(&id, |_, n| n.lookups.load(Ordering::Relaxed) == 0),
                    Ok(Some(_))
                )
                && self.reaper.pressed()
            {
                // The node's descriptor closes when the map frees it, which it does a
                // batch at a time; while the reaper is at work, the batch goes now (at
                // the cost of a barrier).
                self.nodes.guard().flush();
            }
        }
    }

    fn getattr(&self, id: u64) -> Result<Attr, Errno> {
        let nodes = self.nodes.pin();
        match nodes.get(&id) {
            Some(n) => self.attr(id, n),
            None => Err(Errno::STALE),
        }
    }

    fn setattr(&self, id: u64, set: &SetAttr) -> Result<Attr, Errno> {
        let SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        } = *set;
        let run = || -> Result<Attr, Errno> {
            let fd = self.copied_up(id)?;
            let path = Self::real_path(fd.as_fd());
            let cwd = rfs::CWD;
            if !self.as_root && (uid.is_some() || gid.is_some() || mode.is_some()) {
                // An ordinary user cannot give files away: the owner and mode the tree shows
                // live in the override xattr; the host file stays ours and usable by us.
                let st = rfs::fstat(fd.as_fd())?;
                let mut o = read_override(fd.as_fd()).unwrap_or(Override {
                    uid: st.st_uid,
                    gid: st.st_gid,
                    mode: st.st_mode,
                });
                o.uid = uid.unwrap_or(o.uid);
                o.gid = gid.unwrap_or(o.gid);
                if let Some(m) = mode {
                    o.mode = (o.mode & !0o7777) | (m & 0o7777);
                    rfs::chmodat(
                        cwd,
                        path.as_c_str(),
                        Mode::from_raw_mode(host_perm(o.mode)),
                        AtFlags::empty(),
                    )?;
                }
                write_override(fd.as_fd(), &o)?;
            }
            if self.as_root && (uid.is_some() || gid.is_some()) {
                // SAFETY: ids from the kernel's setattr are real ids, never -1 ("unchanged"
                // is None here).
                let (u, g) = unsafe {
                    (
                        uid.map(|u| rfs::Uid::from_raw(u)),
                        gid.map(|g| rfs::Gid::from_raw(g)),
                    )
                };
                rfs::chownat(cwd, path.as_c_str(), u, g, AtFlags::empty())?;
            }
            if let Some(m) = mode.filter(|_| self.as_root) {
                rfs::chmodat(
                    cwd,
                    path.as_c_str(),
                    Mode::from_raw_mode(m & 0o7777),
                    AtFlags::empty(),
                )?;
            }
            if let Some(len) = size {
                match fh.filter(|f| !from_node(*f)) {
                    Some(f) => self.with_file(f, |fd| rfs::ftruncate(fd, len))?,
                    None => {
                        let f = rfs::open(
                            path.as_c_str(),
                            OFlags::WRONLY | OFlags::CLOEXEC,
                            Mode::empty(),
                        )?;
                        rfs::ftruncate(&f, len)?;
                    }
                }
            }
            if atime.is_some() || mtime.is_some() {
                let t = rfs::Timestamps {
                    last_access: atime.map_or_else(omit, ts),
                    last_modification: mtime.map_or_else(omit, ts),
                };
                rfs::utimensat(cwd, path.as_c_str(), &t, AtFlags::empty())?;
            }
            let n = self.node(id)?;
            self.attr(id, &n)
        };
        // A digest kept for an upper file survives a change of its attributes alone. A file
        // made through the mount and not yet read or hashed has none to look for (`fresh`).
        let before = self
            .measure
            .as_ref()
            .filter(|_| size.is_none())
            .and_then(|s| {
                let (_, key, cookie, _) = self
                    .with_node(id, |n| match n.io.fresh.load(Ordering::Acquire) {
                        true => Ok(None),
                        false => self.measured_as(s, n, None),
                    })
                    .ok()??;
                s.measuring.keeps(key).then_some((s, key, cookie?))
            });
        let r = run();
        if size.is_some() {
            self.measure_changed(id);
        }
        if let Some((s, key, before)) = before {
            if let Ok(st) = self.with_node(id, |n| match &n.upper {
                Some(fd) => rfs::fstat(fd.as_fd()),
                None => Err(Errno::STALE),
            }) {
                s.measuring
                    .touched(key, before, crate::measuring::cookie(&st));
            }
        }
        r
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
        let dev = (rfs::major(u64::from(rdev)), rfs::minor(u64::from(rdev)));
        // A 0/0 character device is a whiteout in the upper directory; overlayfs refuses
        // to make one through the mount, and so do we.
        if overlay::is_whiteout(mode, dev) {
            return Err(Errno::PERM);
        }
        let _l = self.lock();
        let contents = if rfs::FileType::from_raw_mode(mode) == rfs::FileType::RegularFile {
            Contents::File {
                size: 0,
                read: &mut |_, _| Ok(0),
            }
        } else {
            Contents::Special
        };
        let want = Want {
            mode,
            umask,
            rdev: dev,
        };
        let (_, a, _, _) = self.make(caller, parent, name, want, contents)?;
        Ok(a)
    }

    fn mkdir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr, Errno> {
        let _l = self.lock();
        let mode = rfs::FileType::Directory.as_raw_mode() | (mode & 0o7777);
        let want = Want {
            mode,
            umask,
            rdev: (0, 0),
        };
        let (_, a, _, _) = self.make(caller, parent, name, want, Contents::Dir)?;
        Ok(a)
    }

    fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr, Errno> {
        let _l = self.lock();
        let mode = rfs::FileType::Symlink.as_raw_mode() | 0o777;
        let want = Want {
            mode,
            umask: 0,
            rdev: (0, 0),
        };
        let (_, a, _, _) = self.make(caller, parent, name, want, Contents::Symlink(target))?;
        Ok(a)
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
        let run = || -> Result<(u64, Attr, u64, rustix::fs::Stat), Errno> {
            let _l = self.lock();
            let mode = rfs::FileType::RegularFile.as_raw_mode() | (mode & 0o7777);
            let mut empty = |_: u64, _: &mut [u8]| Ok(0);
            let (id, a, file, st) = self.make(
                caller,
                parent,
                name,
                Want {
                    mode,
                    umask,
                    rdev: (0, 0),
                },
                Contents::File {
                    size: 0,
                    read: &mut empty,
                },
            )?;
            let o = OFlags::from_bits_truncate(flags as u32);
            // The descriptor creation made serves as the handle, unless the caller wants
            // synchronous writes (which only open can ask for).
            if let Some(f) = file.filter(|_| !o.intersects(OFlags::SYNC | OFlags::DSYNC)) {
                if o.contains(OFlags::APPEND) {
                    rfs::fcntl_setfl(&f, OFlags::APPEND)?;
                }
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.files.pin().insert(fh, f);
                return Ok((id, a, fh, st));
            }
            let n = self.node(id)?;
            let fd = n.upper.as_ref().ok_or(Errno::IO)?;
            let fh = self.open_real(fd.as_fd(), flags & !libc_trunc())?;
            Ok((id, a, fh, st))
        };
        // Measured as made: the file is new and empty, and the open is its creation.
        let (id, attr, fh, st) = run()?;
        let fh = self.measured(id, flags, caller.pid, fh, Some(&st))?;
        Ok(Created {
            attr,
            fh,
            passthrough: self.passthrough_of(id, fh, register),
        })
    }

    fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        let _l = self.lock();
        // The parent's upper entry decides; the images only whether a whiteout is due.
        let pfd = self.upper_dir(parent)?;
        let upper = self
            .upper
            .stat(pfd.as_fd(), name)
            .map_err(errno)?
            .filter(|st| !upper::is_whiteout(st));
        let lower = self.lower_has(parent, name)?;
        if upper.is_none() && !lower {
            return Err(Errno::NOENT);
        }
        if let Some(st) = upper.filter(|st| st.st_nlink <= 1) {
            self.upper_ids.pin().remove(&(st.st_dev, st.st_ino));
        }
        if lower {
            self.upper.whiteout(pfd.as_fd(), name).map_err(errno)
        } else {
            rfs::unlinkat(pfd.as_fd(), cname(name)?.as_c_str(), AtFlags::empty())
        }
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        let _l = self.lock();
        let (id, n) = self.resolve(parent, name)?.ok_or(Errno::NOENT)?;
        let is_dir = is_dir_node(&n);
        self.ensure_node(id, n);
        if !is_dir {
            return Err(Errno::NOTDIR);
        }
        if !self.listing(id)?.is_empty() {
            return Err(Errno::NOTEMPTY);
        }
        let lower = self.lower_has(parent, name)?;
        let pfd = self.upper_dir(parent)?;
        if lower {
            // Also removes the upper directory and the whiteouts in it.
            self.upper.whiteout(pfd.as_fd(), name).map_err(errno)
        } else {
            self.upper.remove(pfd.as_fd(), name).map_err(errno)
        }
    }

    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let _l = self.lock();
        let (sid, snode) = self.resolve(parent, name)?.ok_or(Errno::NOENT)?;
        self.ensure_node(sid, snode.clone());
        let target = self.resolve(newparent, newname)?;
        let src_lower_dir = snode.upper.is_none()
            && snode.lower.as_ref().is_some_and(|r| r.inode.is_dir())
            || !snode.lower_chain().is_empty();
        // A directory with image contents moves with a redirect to them (both, when
        // two trade places), worked out before anything moves.
        let same_parent = parent == newparent;
        let redirect = if src_lower_dir {
            self.redirect_for(sid, same_parent)?
        } else {
            None
        };
        if flags.contains(RenameFlags::EXCHANGE) {
            // Both names stay occupied, so no whiteout is needed: both objects are
            // copied up and trade places, a directory with image contents with a
            // redirect to them.
            let (tid, t) = target.as_ref().ok_or(Errno::NOENT)?;
            let t_lower_dir = t.upper.is_none()
                && t.lower.as_ref().is_some_and(|r| r.inode.is_dir())
                || !t.lower_chain().is_empty();
            self.ensure_node(*tid, t.clone());
            let t_redirect = if t_lower_dir {
                self.redirect_for(*tid, same_parent)?
            } else {
                None
            };
            let tfd = self.copy_up(*tid)?;
            let t_moves = Moving {
                redirect: t_redirect,
                lower_dir: t_lower_dir,
                is_dir: is_dir_node(t),
            };
            self.mark_moving_dir(tfd.as_fd(), t_moves, parent)?;
        }
        if let Some((tid, t)) = &target {
            if flags.contains(RenameFlags::NOREPLACE) {
                return Err(Errno::EXIST);
            }
            if !flags.contains(RenameFlags::EXCHANGE)
                && (!t.lower_chain().is_empty()
                    || (t.upper.is_none() && t.lower.as_ref().is_some_and(|r| r.inode.is_dir())))
            {
                // A directory with image contents is replaced only when the merged
                // tree shows it empty; its upper side (whiteouts) goes after the move.
                if !self.listing(*tid)?.is_empty() {
                    return Err(Errno::NOTEMPTY);
                }
            }
        }
        let sfd = self.copy_up(sid)?;
        let src_is_dir = is_dir_node(&snode);
        let s_moves = Moving {
            redirect,
            lower_dir: src_lower_dir,
            is_dir: src_is_dir,
        };
        self.mark_moving_dir(sfd.as_fd(), s_moves, newparent)?;
        let src_lower = self.lower_has(parent, name)?;
        let pfd = self.upper_dir(parent)?;
        let dpfd = self.upper_dir(newparent)?;
        let exchange = flags.contains(RenameFlags::EXCHANGE);
        let at_target = if exchange {
            None
        } else {
            self.upper.stat(dpfd.as_fd(), newname).map_err(errno)?
        };
        // Over a whiteout or a lower-only name the upper entry simply shadows it; a
        // directory cannot replace a whiteout (a device), so it trades places with it.
        let over_whiteout = src_is_dir && at_target.as_ref().is_some_and(upper::is_whiteout);
        // Over a directory of the upper layer that holds whiteouts (an emptied merged
        // one): trade places, then clear it away.
        let over_dir = at_target.is_some_and(|st| is_dir_mode(st.st_mode))
            && target
                .as_ref()
                .is_some_and(|(_, t)| !t.lower_chain().is_empty());
        let mut rflags = rfs::RenameFlags::empty();
        if exchange || over_whiteout || over_dir {
            rflags |= rfs::RenameFlags::EXCHANGE;
        }
        let (from, to) = (cname(name)?, cname(newname)?);
        rfs::renameat_with(
            pfd.as_fd(),
            from.as_c_str(),
            dpfd.as_fd(),
            to.as_c_str(),
            rflags,
        )?;
        if over_dir && src_lower {
            self.upper.whiteout(pfd.as_fd(), name).map_err(errno)?;
        } else if over_dir {
            self.upper.remove(pfd.as_fd(), name).map_err(errno)?;
        } else if over_whiteout && !src_lower {
            // The whiteout now at the old name hides nothing.
            rfs::unlinkat(pfd.as_fd(), from.as_c_str(), AtFlags::empty())?;
        } else if src_lower && !exchange && !over_whiteout {
            self.upper.whiteout(pfd.as_fd(), name).map_err(errno)?;
        }
        self.moved(sid, newparent, newname);
        if let Some((tid, t)) = target.filter(|_| flags.contains(RenameFlags::EXCHANGE)) {
            self.ensure_node(tid, t);
            self.moved(tid, parent, name);
        }
        Ok(())
    }

    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr, Errno> {
        let _l = self.lock();
        let fd = self.copy_up(ino)?;
        let dpfd = self.upper_dir(newparent)?;
        let to = cname(newname)?;
        if let Some(st) = self.upper.stat(dpfd.as_fd(), newname).map_err(errno)? {
            if upper::is_whiteout(&st) {
                rfs::unlinkat(dpfd.as_fd(), to.as_c_str(), AtFlags::empty())?;
            }
        }
        rfs::linkat(
            rfs::CWD,
            Self::real_path(fd.as_fd()).as_c_str(),
            dpfd.as_fd(),
            to.as_c_str(),
            AtFlags::SYMLINK_FOLLOW,
        )?;
        let mut n = self.node(ino)?;
        // OPEN carries no path: a file with several names is measured under the one
        // learnt last, by a lookup or, as here, a link (see docs/SECURITY.md).
        (n.parent, n.name) = (newparent, newname.to_vec());
        self.remember(ino, n.clone());
        self.attr(ino, &n)
    }

    fn open(
        &self,
        caller: &Caller,
        id: u64,
        flags: i32,
        register: Register<'_>,
    ) -> Result<Opened, Errno> {
        let writes =
            flags & (rustix::fs::OFlags::ACCMODE.bits() as i32) != 0 || flags & libc_trunc() != 0;
        let run = || -> Result<u64, Errno> {
            if writes && self.with_node(id, |n| Ok(n.upper.is_none()))? {
                let _l = self.lock();
                self.copy_up(id)?;
            }
            // Read-only from the images: served from the node, no descriptor, cached I/O.
            // Marked before the node is read again, so a racing copy-up keeps its opens
            // cached too; if one already went passthrough, the file is upper by now.
            let image_open =
                self.with_node(id, |n| Ok(n.upper.is_none() && n.io.enter(IO_CACHED)))?;
            if image_open {
                return Ok(0);
            }
            self.with_node(id, |n| match &n.upper {
                Some(fd) => self.open_real(fd.as_fd(), flags),
                None => Err(Errno::IO),
            })
        };
        let fh = self.measured(id, flags, caller.pid, run()?, None)?;
        if from_node(fh) {
            return Ok(Opened {
                fh,
                keep_cache: true,
                ..Opened::default()
            });
        }
        Ok(Opened {
            fh,
            passthrough: self.passthrough_of(id, fh, register),
            ..Opened::default()
        })
    }

    fn read(&self, ino: u64, fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        if !from_node(fh) {
            return self.with_file(fh, |fd| rustix::io::pread(fd, buf, offset));
        }
        // Opened from the image; once copied up (by a writer), the copy is the file,
        // as in overlayfs.
        self.with_node(ino, |n| {
            self.backing(n)?
                .read(offset, buf)
                .map_err(|e| self.failed("read", Lower::Node(ino), e))
        })
    }

    fn write(&self, _ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        self.with_file(fh, |fd| {
            let mut done = 0;
            while done < data.len() {
                done += rustix::io::pwrite(fd, &data[done..], offset + done as u64)?;
            }
            Ok(done)
        })
    }

    fn flush(&self, _ino: u64, _fh: u64) -> Result<(), Errno> {
        // Writes go straight to the upper file, so close has nothing to report: one ENOSYS
        // and the kernel stops sending FLUSH on every close.
        Err(Errno::NOSYS)
    }

    fn release(&self, _ino: u64, fh: u64, answer: &mut dyn FnMut()) {
        // Answered first: nobody waits for a release, and a writer's may hash its file.
        answer();
        if fh != 0 {
            let files = self.files.pin();
            let handle = files.remove(&fh);
            self.measure_release(fh, handle.map(|f| f.as_fd()));
        }
    }

    fn fsync(&self, _ino: u64, fh: u64, datasync: bool) -> Result<(), Errno> {
        if from_node(fh) {
            return Ok(());
        }
        self.with_file(fh, |fd| {
            if datasync {
                rfs::fdatasync(fd)
            } else {
                rfs::fsync(fd)
            }
        })
    }

    fn fallocate(
        &self,
        _ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        // The modes FUSE forwards (fs/fuse/file.c refuses COLLAPSE_RANGE and INSERT_RANGE
        // itself), passed to the host as they are: none of them exposes old data, as the
        // host zeroes or marks unwritten what it allocates. Anything else is refused.
        let known = rfs::FallocateFlags::KEEP_SIZE
            | rfs::FallocateFlags::PUNCH_HOLE
            | rfs::FallocateFlags::ZERO_RANGE;
        let flags = rfs::FallocateFlags::from_bits_retain(mode as u32);
        if !known.contains(flags) {
            return Err(Errno::OPNOTSUPP);
        }
        self.with_file(fh, |fd| rfs::fallocate(fd, flags, offset, length))
    }

    fn opendir(&self, id: u64) -> Result<Opened, Errno> {
        let list = self.listing(id)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.pin().insert(fh, list);
        Ok(Opened {
            fh,
            ..Opened::default()
        })
    }

    fn readdir(&self, ino: u64, fh: u64, offset: u64, add: AddEntry<'_>) -> Result<(), Errno> {
        let dirs = self.dirs.pin();
        let list = dirs.get(&fh).ok_or(Errno::BADF)?;
        let parent = self.with_node(ino, |n| Ok(n.parent)).unwrap_or(1);
        let dots = [(b"." as &[u8], ino), (b"..", parent)];
        for (i, (name, id)) in dots.into_iter().enumerate().skip(offset as usize) {
            let dot = DirEntry {
                ino: id,
                next: i as u64 + 1,
                kind: Kind::Directory,
                name,
            };
            if add(dot) {
                return Ok(());
            }
        }
        for (i, (name, id, kind)) in list
            .iter()
            .enumerate()
            .skip(offset.saturating_sub(2) as usize)
        {
            let e = DirEntry {
                ino: *id,
                next: i as u64 + 3,
                kind: *kind,
                name,
            };
            if add(e) {
                break;
            }
        }
        Ok(())
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
        let stats = || {
            let (setup, extra) = (self.measure.as_ref(), self.extra_stats.as_ref());
            crate::measuring::stats_xattr(setup, extra, ino, name)
        };
        if let Some(v) = self.xattrs.get(caller, ino, name, stats)? {
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
        let names = self.with_node(ino, |n| {
            self.backing(n)?
                .listxattr()
                .map_err(|e| self.failed("listxattr", Lower::Node(ino), e))
        })?;
        Ok(name_list(&names, |n| self.xattrs.listed(caller, n)))
    }
}

fn libc_trunc() -> i32 {
    OFlags::TRUNC.bits() as i32
}

/// A layer's identity, a content key, the upper file's cookie, and the owner the mount
/// shows when known without more work (see `measured_as`).
type MeasuredAs<'s> = (
    &'s FsIdentity,
    ContentKey,
    Option<Cookie>,
    Option<(u32, u32)>,
);

/// Reads a descriptor from the start with pread, leaving its offset alone.
struct PositionalReader<'a> {
    fd: BorrowedFd<'a>,
    at: u64,
}

impl std::io::Read for PositionalReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = rustix::io::pread(self.fd, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// A union node's content, for measuring.
struct UnionContent<'a, S: ByteSource> {
    fs: &'a UnionFs<S>,
    node: &'a Node,
    id: u64,
    setup: &'a Setup,
    /// The upper file's descriptor the open being measured just made (or the one just
    /// closed), if it can read.
    handle: Option<BorrowedFd<'a>>,
}

impl<'a, S: ByteSource + 'static> UnionContent<'a, S> {
    /// The upper file's bytes (`upper` is the node's `O_PATH` descriptor): through the
    /// open's own descriptor when it can read (positional reads leave its offset alone),
    /// else through a new one.
    fn upper_reader(&self, upper: BorrowedFd<'_>) -> std::io::Result<Box<dyn std::io::Read + 'a>> {
        if let Some(h) = self.handle {
            return Ok(Box::new(PositionalReader { fd: h, at: 0 }));
        }
        Ok(Box::new(std::fs::File::from(rfs::open(
            UnionFs::<S>::real_path(upper).as_c_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)))
    }

    /// The node's image file, while it has no upper copy.
    fn image_file(&self) -> Option<ImageFile<'a, S>> {
        match (&self.node.upper, &self.node.lower) {
            (None, Some(r)) => Some(ImageFile {
                image: self.fs.stack.image(r.top.layer),
                inode: &r.inode,
            }),
            _ => None,
        }
    }
}

impl<S: ByteSource + 'static> Content for UnionContent<'_, S> {
    fn path(&self) -> Vec<u8> {
        self.fs.measured_path(self.setup, self.id)
    }

    fn reader(&self, size: Option<u64>) -> std::io::Result<(Box<dyn std::io::Read + '_>, u64)> {
        match (&self.node.upper, &self.node.lower) {
            (Some(fd), _) => {
                let size = match size {
                    Some(s) => s,
                    None => rfs::fstat(fd.as_fd())?.st_size as u64,
                };
                Ok((self.upper_reader(fd.as_fd())?, size))
            }
            _ => match self.image_file() {
                Some(f) => Ok(f.reader()),
                None => Err(std::io::Error::from_raw_os_error(
                    Errno::STALE.raw_os_error(),
                )),
            },
        }
    }

    fn verity_digest(&self) -> std::io::Result<Option<[u8; 32]>> {
        match self.image_file() {
            Some(f) => f.verity_digest(),
            None => Ok(None),
        }
    }

    fn ima_xattr(&self) -> Option<Vec<u8>> {
        match (&self.node.upper, &self.node.lower) {
            (Some(fd), _) => {
                let path = UnionFs::<S>::real_path(fd.as_fd());
                host_xattr(path.as_c_str(), c"security.ima").ok()?
            }
            _ => self.image_file()?.ima_xattr(),
        }
    }
}
