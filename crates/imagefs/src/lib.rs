//! An EROFS image served read-only over FUSE.
//!
//! The filesystem holds little but the image reader: every request is answered from the
//! image through its byte source (the verified block source in verilay). Per inode it
//! keeps only the parent and name the kernel last learnt it under (`Names`, filled by
//! lookups and READDIRPLUS), so that a log line or a measurement can name a file by its
//! path; a READ touches no shared state. Images are immutable, so every reply is
//! cacheable forever: entries, attributes, negative lookups, symlinks, directory listings
//! and file pages (zero-message open and opendir, which default to kept caches).
//!
//! An image without a single `security.*` xattr answers every `security.*` name with
//! EOPNOTSUPP rather than ENODATA, as filesystems without security labels do. FUSE cannot
//! cache xattr replies, and `ls -l`, `cp -a` and friends ask for `security.selinux` on
//! every file unless the filesystem says it has no such namespace: then they stop asking.
//! Likewise an image set without a single POSIX ACL does not negotiate FUSE_POSIX_ACL and
//! answers both ACL names with EOPNOTSUPP: the kernel would otherwise fetch every inode's
//! ACL with a round trip before caching it (one per entry of a cold `ls -l`), while
//! without it permission checks use the mode alone, which is all such a tree has.
//! That record is the builder's claim: each inode handed to the kernel (lookup,
//! readdirplus, the root at mount) is checked against it first (`check_claims`), so a
//! false record makes the inode it hides an xattr of EIO (the root: no mount) instead of
//! served as the kernel's erofs would not serve it (an ACL ignored, a label dropped).
//!
//! A directory is handed out only where its own `..` says it is (`stack::Misplaced`), so
//! the parents kept for measured paths and merged listings form a tree.
//!
//! Several images are stacked with overlayfs's rules (see `stack`); one image is served
//! as the kernel's erofs shows it.
//!
//! Inode numbers: the root is FUSE's inode 1, every other object is
//! `(layer << 48 | nid) + 2` for the topmost layer holding it (so a single image's are
//! nid + 2). Stable across mounts, collision-free, and decoded without a table. Only
//! directories of a stack need one: which layers' directories merge at that path, kept in
//! a lock-free map filled by lookups and never emptied.

pub mod measuring;
mod reaper;
pub mod stack;
pub mod union;

pub mod attr;
pub mod fuse;
pub mod ops;

pub use attr::{Attr, Kind};
pub use fuse::Fuse;
pub use ops::Ops;
pub use union::UnionFs;

use attr::{kind, kind_of_dirent};
use erofs::read::{ByteSource, Image, Inode};
use ops::{
    AddEntry, AddEntryPlus, Caller, DirEntry, Errno, Granted, NotifierSlot, Opened, Register,
    Statfs, Wants,
};
use stack::{Dir, Obj, Resolved, Stack};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use upper::overlay::{MAX_LAYERS, PRIVATE_XATTR_PREFIX};

/// How long the kernel may cache anything we say: the image never changes.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// Files up to this size are handed to the kernel with their first open (see `prime`):
/// the kernel's default readahead window, what one READ would have fetched.
const PRIME_MAX: u64 = 128 << 10;

/// Where integrity failures and other serving errors are reported (one line each).
pub type Logger = Box<dyn Fn(&str) + Send + Sync>;

/// Bits of an inode number below the layer index.
const LAYER_SHIFT: u32 = 48;

pub struct ImageFs<S: ByteSource> {
    stack: Stack<S>,
    /// Two or more layers: overlayfs's rules apply (whiteouts, opaque directories, private
    /// xattrs hidden, merged directories). One layer is served as it is.
    overlay: bool,
    root: Resolved,
    /// With `overlay`: every directory met so far, by inode number.
    dirs: papaya::HashMap<u64, DirNode>,
    name: String,
    log: Logger,
    /// Negotiated at init: the kernel stops sending OPEN / OPENDIR after one ENOSYS.
    no_open: bool,
    no_opendir: bool,
    /// The image records that it holds no `security.*` xattr (see the module comment).
    unlabelled: bool,
    /// No layer holds a POSIX ACL (see the module comment).
    aclless: bool,
    /// With a policy: opens are measured (see `measuring`), so the kernel must send them.
    measure: Option<measuring::Setup>,
    /// More for `verilay stats` (a remote image's fetching).
    extra_stats: Option<crate::measuring::ExtraStats>,
    /// Every name the kernel learns, for the paths the measurement list and log lines name.
    names: Names,
    /// When the kernel sends OPEN (with a policy): per inode, the handles open on it and
    /// whether its bytes were handed to the kernel since it last learnt the inode; and the
    /// session's notifier to hand them over (see `prime`).
    /// Each value is an [`OPEN_HANDLES`] count and the [`PRIMED`] bit, changed in place:
    /// an open or a release allocates nothing once the inode has an entry.
    opens: papaya::HashMap<u64, AtomicU64>,
    notifier: NotifierSlot,
}

/// Object → (parent, name) for every name the kernel learnt. Never emptied: at most one
/// entry per object of the images. A cold walk of a big tree learns every entry once, so
/// this is shards of plain maps under mutexes (held for one map operation), which fill at
/// about half the cost of a lock-free map.
struct Names {
    shards: Box<[Mutex<NameMap>]>,
}

type NameMap = std::collections::HashMap<u64, (u64, Box<[u8]>), foldhash::fast::RandomState>;

impl Names {
    /// 64 shards: threads rarely meet on one.
    const SHARD_BITS: u32 = 6;

    fn new() -> Names {
        Names {
            shards: (0..1 << Self::SHARD_BITS)
                .map(|_| Mutex::default())
                .collect(),
        }
    }

    fn shard(&self, id: u64) -> std::sync::MutexGuard<'_, NameMap> {
        // Fibonacci hashing: numbers a stride apart (inode slots) spread over the shards.
        let i = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - Self::SHARD_BITS);
        self.shards[i as usize]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `id` as `name` in `parent`. Looked up again after the kernel forgot it, an
    /// object usually has the same name: then nothing is allocated or replaced.
    fn learn(&self, id: u64, parent: u64, name: &[u8]) {
        use std::collections::hash_map::Entry;
        match self.shard(id).entry(id) {
            Entry::Occupied(e) if e.get().0 == parent && e.get().1[..] == *name => {}
            Entry::Occupied(mut e) => *e.get_mut() = (parent, name.into()),
            Entry::Vacant(e) => {
                e.insert((parent, name.into()));
            }
        }
    }

    /// The parent and name `id` was last learnt under.
    fn get(&self, id: u64) -> Option<(u64, Box<[u8]>)> {
        self.shard(id).get(&id).cloned()
    }
}

/// An inode's open handles (the low bits of its `opens` value), and whether the kernel
/// was handed its bytes (see `prime`).
const OPEN_HANDLES: u64 = u32::MAX as u64;
const PRIMED: u64 = 1 << 32;

/// A directory of a stack: the layers' directories merged at its path, its parent, and its
/// merged listing once read.
struct DirNode {
    chain: Vec<Dir>,
    parent: u64,
    listing: OnceLock<Vec<(Vec<u8>, Resolved)>>,
}

thread_local! {
    /// Per worker thread: the buffer a READ is served from.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl<S: ByteSource + 'static> ImageFs<S> {
    /// `layers` top first; `name` prefixes log lines (usually the image path).
    pub fn new(
        layers: Vec<Image<S>>,
        name: String,
        log: Logger,
    ) -> Result<ImageFs<S>, erofs::read::Error> {
        assert!(
            (1..=MAX_LAYERS).contains(&layers.len()),
            "1 to {MAX_LAYERS} layers",
        );
        // Unrecorded means "maybe labelled": per-inode answers. Unreadable (a block of the
        // table that fails its hash) fails the mount: the footer is read here, so this is
        // the read that meets it.
        let absent_everywhere = |ns: u8| -> Result<bool, erofs::read::Error> {
            for img in &layers {
                if !img.namespace_absent(ns)? {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let unlabelled = absent_everywhere(erofs::format::XATTR_INDEX_SECURITY)?;
        let aclless = absent_everywhere(erofs::format::XATTR_INDEX_POSIX_ACL_ACCESS)?
            && absent_everywhere(erofs::format::XATTR_INDEX_POSIX_ACL_DEFAULT)?;
        let overlay = layers.len() > 1;
        let stack = Stack { layers };
        let root = if overlay {
            stack.root()?
        } else {
            let top = Obj {
                layer: 0,
                nid: stack.layers[0].root_nid(),
            };
            Resolved {
                top,
                inode: stack.inode(top)?,
                chain: Vec::new(),
            }
        };
        if let Some(hidden) = hidden_xattr(
            stack.image(root.top.layer),
            &root.inode,
            aclless,
            unlabelled,
        )? {
            return Err(erofs::read::Error::Corrupt {
                offset: root.inode.offset(),
                what: format!(
                    "{name}: {}",
                    false_record(root.top, &root.inode, &hidden, overlay)
                ),
            });
        }
        Ok(ImageFs {
            unlabelled,
            aclless,
            stack,
            overlay,
            root,
            dirs: papaya::HashMap::new(),
            name,
            log,
            no_open: false,
            no_opendir: false,
            measure: None,
            extra_stats: None,
            names: Names::new(),
            opens: papaya::HashMap::new(),
            notifier: Arc::new(OnceLock::new()),
        })
    }

    /// Measures opens from now on (before mounting).
    pub fn set_measuring(&mut self, setup: measuring::Setup) {
        self.measure = Some(setup);
    }

    /// Adds members to what `verilay stats` prints.
    pub fn set_extra_stats(&mut self, extra: crate::measuring::ExtraStats) {
        self.extra_stats = Some(extra);
    }

    /// A measured open costs a round trip that an unmeasured one (`no_open`) does not;
    /// for a small file it also carries the file's verified bytes into the kernel's page
    /// cache (FUSE_NOTIFY_STORE), so the read that usually follows needs no round trip.
    /// Called before the open is answered, so its own opener cannot be reading yet.
    ///
    /// Only when no other handle is open on the inode: storing locks the inode's pages,
    /// and a reader holding one of those locks while its READ waits for a worker could
    /// otherwise leave every worker stuck here (every reader holds a handle, and the
    /// kernel sends RELEASE only after its reads are done). Once per inode until the
    /// kernel learns it again (`forget_primed`): an inode the kernel keeps keeps its
    /// pages, unless reclaimed, when a read just asks. Best effort: a failure leaves the
    /// cache cold and the read asks.
    fn prime(&self, ino: u64, o: Obj, inode: &Inode, flags: i32) {
        let was = {
            let opens = self.opens.pin();
            let o = opens.get_or_insert_with(ino, || AtomicU64::new(0));
            let one_more = |v: u64| Some(((v & OPEN_HANDLES) + 1).min(OPEN_HANDLES) | PRIMED);
            o.fetch_update(Ordering::AcqRel, Ordering::Acquire, one_more)
                .unwrap_or_else(|v| v)
        };
        let first = was & OPEN_HANDLES == 0 && was & PRIMED == 0;
        if !first || flags & libc::O_DIRECT != 0 {
            return;
        }
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        if !inode.is_reg() || inode.size == 0 || inode.size > PRIME_MAX {
            return;
        }
        READ_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            let want = inode.size as usize;
            if buf.len() < want {
                buf.resize(want, 0);
            }
            let Ok(n) = self.image(o).read(inode, 0, &mut buf[..want]) else {
                return;
            };
            if notifier.store(ino, 0, &buf[..n]).is_ok() {
                if let Some(s) = &self.measure {
                    s.measuring.counters.primed.add(1);
                    s.measuring.counters.bytes_primed.add(n as u64);
                }
            }
        });
    }

    /// A handle on `ino` is closed.
    fn closed(&self, ino: u64) {
        if let Some(o) = self.opens.pin().get(&ino) {
            let one_less = |v: u64| (v & OPEN_HANDLES > 0).then(|| v - 1);
            let _ = o.fetch_update(Ordering::AcqRel, Ordering::Acquire, one_less);
        }
    }

    /// The kernel learns `ino` (again, perhaps after evicting it and its pages): its next
    /// first open hands its bytes over again.
    fn forget_primed(&self, ino: u64) {
        if let Some(o) = self.opens.pin().get(&ino) {
            o.fetch_and(!PRIMED, Ordering::AcqRel);
        }
    }

    /// Remembers that `child` is `name` in `parent`, for the paths that measurements and
    /// log lines name. The root and an object as its own child are never recorded
    /// (lookups refuse a directory out of its place, so none should come here).
    fn learn(&self, parent: u64, name: &[u8], child: u64) {
        if name == b"." || name == b".." || child == parent || child == 1 {
            return;
        }
        self.names.learn(child, parent, name);
        if self.measure.is_some() {
            self.forget_primed(child);
        }
    }

    /// With a policy: measures an open of `ino` (see `measuring`).
    fn measure_open(
        &self,
        ino: u64,
        o: Obj,
        inode: &Inode,
        flags: i32,
        pid: u32,
    ) -> Result<(), Errno> {
        let Some(s) = &self.measure else {
            return Ok(());
        };
        let fs = &s.layers[o.layer as usize];
        if !s.measuring.may_measure(fs) {
            return Ok(());
        }
        let opening = measuring::Opening {
            flags,
            pid,
            owner: (inode.uid, inode.gid),
            fs,
            key: measuring::ContentKey::Image {
                layer: o.layer,
                nid: o.nid,
            },
            cookie: None,
            opens: None,
        };
        let content = ImageContent {
            fs: self,
            ino,
            file: measuring::ImageFile {
                image: self.image(o),
                inode,
            },
            setup: s,
        };
        s.measure(&opening, &content, &self.log, &self.name)
            .map(|_| ())
    }

    /// `name` in the merged directory `parent` of a stack.
    fn lookup_merged(&self, parent: u64, name: &[u8]) -> Result<Option<Attr>, Errno> {
        let guard = self.dirs.guard();
        let d = self.dir_node(parent, &guard)?;
        let found = self
            .stack
            .lookup(&d.chain, name)
            .map_err(|e| self.fail("lookup", About::entry(parent, name, None), e))?;
        let Some(r) = found else {
            return Ok(None);
        };
        let about = About::entry(parent, name, Some(r.top));
        self.check_claims(r.top, &r.inode, about)?;
        let a = self.child_attr(&r, parent, &guard);
        self.learn(parent, name, a.ino);
        Ok(Some(a))
    }

    fn ino(&self, o: Obj) -> u64 {
        obj_ino(o, self.root.top)
    }

    /// The object an inode number stands for; EIO for numbers we never gave out.
    fn obj(&self, ino: u64) -> Result<Obj, Errno> {
        let n = match ino {
            1 => return Ok(self.root.top),
            0 => return Err(Errno::IO),
            n => n - 2,
        };
        let layer = n >> LAYER_SHIFT;
        if layer >= self.stack.layers.len() as u64 {
            return Err(Errno::IO);
        }
        Ok(Obj {
            layer: layer as u16,
            nid: n & ((1 << LAYER_SHIFT) - 1),
        })
    }

    /// The errno for a reader error; integrity failures and corruption are logged, one
    /// line naming `what` was done to which file (`read of /usr/bin/ls (inode 1234)`).
    fn fail(&self, what: &str, about: About<'_>, e: erofs::read::Error) -> Errno {
        let errno = e.errno();
        if errno != rustix::io::Errno::NOENT.raw_os_error() {
            let subject = self.subject(about);
            (self.log)(&format!(
                "{}: {what} of {subject}: {}",
                self.name,
                stack::describe(&e)
            ));
        }
        Errno::from_raw_os_error(errno)
    }

    /// How a log line names what `about` stands for (see `logged_subject`).
    fn subject(&self, about: About<'_>) -> String {
        let (start, name, obj) = match about {
            About::Known(ino) => (ino, None, self.obj(ino).ok()),
            About::Entry { dir, name, obj } => (dir, Some(name), obj),
        };
        logged_subject(start, name, obj.map(|o| (o, self.overlay)), |at| {
            self.names.get(at)
        })
    }

    /// Whether inode `i` of `o` may be handed to the kernel as the image's namespace
    /// record has the mount serve it: with ACLs off, it must have none, and answering
    /// `security.*` with EOPNOTSUPP, it must have no such name. The ACL names are asked
    /// as the kernel's erofs asks them (through the inode's name filter), so a filter
    /// that lies too hides the ACL from both alike; `security.*` names are listed. A
    /// false record is EIO for that inode and one log line: the image lies about itself.
    /// Images recording every namespace present (or none) pay nothing here.
    fn check_claims(&self, o: Obj, i: &Inode, about: About<'_>) -> Result<(), Errno> {
        match hidden_xattr(self.image(o), i, self.aclless, self.unlabelled) {
            Ok(None) => Ok(()),
            Ok(Some(name)) => {
                let what = false_record(o, i, &name, self.overlay);
                (self.log)(&format!("{}: {what}", self.name));
                Err(Errno::IO)
            }
            Err(e) => Err(self.fail("xattrs", about, e)),
        }
    }

    /// Checks a single image's entry `name` of directory `dir` (its place, and what the
    /// namespace record says of it) before the kernel learns it.
    fn check_entry(&self, dir: u64, name: &[u8], o: Obj, i: &Inode) -> Result<(), Errno> {
        let about = About::entry(dir, name, Some(o));
        self.stack
            .check_placement(o.layer, self.obj(dir)?.nid, name, i)
            .map_err(|e| self.fail("lookup", about, e))?;
        self.check_claims(o, i, about)
    }

    /// Checks a stack's entry `name` of the merged directory `dir` (whose layers'
    /// directories are `chain`; listed unchecked).
    fn check_merged(
        &self,
        dir: u64,
        chain: &[Dir],
        name: &[u8],
        r: &Resolved,
    ) -> Result<(), Errno> {
        let about = About::entry(dir, name, Some(r.top));
        self.stack
            .check_resolved(chain, name, r)
            .map_err(|e| self.fail("lookup", about, e))?;
        self.check_claims(r.top, &r.inode, about)
    }

    fn inode(&self, ino: u64) -> Result<(Obj, Inode), Errno> {
        let o = self.obj(ino)?;
        self.obj_inode(o, About::Known(ino)).map(|i| (o, i))
    }

    /// The inode of `o` (which `about` names for a log line).
    fn obj_inode(&self, o: Obj, about: About<'_>) -> Result<Inode, Errno> {
        // A nid too large for an inode number cannot be given out unambiguously.
        if o.nid >= 1 << LAYER_SHIFT {
            return Err(Errno::IO);
        }
        self.stack
            .inode(o)
            .map_err(|e| self.fail("inode", about, e))
    }

    fn image(&self, o: Obj) -> &Image<S> {
        self.stack.image(o.layer)
    }

    /// Attributes of a resolved object (merged directories have nlink 1, as in overlayfs).
    fn resolved_attr(&self, r: &Resolved) -> Attr {
        let mut a = self.attr(r.top, &r.inode);
        if r.is_merged() {
            a.nlink = 1;
        }
        a
    }

    /// With `overlay`: the directory node of `ino` (registered by the lookup that found
    /// it; built from the object alone for a number the kernel kept from elsewhere).
    fn dir_node<'g>(&self, ino: u64, guard: &'g impl papaya::Guard) -> Result<&'g DirNode, Errno> {
        if let Some(d) = self.dirs.get(&ino, guard) {
            return Ok(d);
        }
        let (o, inode) = self.inode(ino)?;
        if !inode.is_dir() {
            return Err(Errno::NOTDIR);
        }
        let chain = if ino == 1 {
            self.root.chain.clone()
        } else {
            vec![self
                .stack
                .dir(o, &inode)
                .map_err(|e| self.fail("opaque xattr", About::Known(ino), e))?]
        };
        Ok(self.remember(ino, chain, 1, guard))
    }

    fn remember<'g>(
        &self,
        ino: u64,
        chain: Vec<Dir>,
        parent: u64,
        guard: &'g impl papaya::Guard,
    ) -> &'g DirNode {
        self.dirs.get_or_insert_with(
            ino,
            || DirNode {
                chain,
                parent,
                listing: OnceLock::new(),
            },
            guard,
        )
    }

    /// A resolved child of `parent`: its attributes, registering it if it is a directory.
    fn child_attr(&self, r: &Resolved, parent: u64, guard: &impl papaya::Guard) -> Attr {
        let ino = self.ino(r.top);
        if !r.chain.is_empty() && ino != 1 {
            self.remember(ino, r.chain.clone(), parent, guard);
        }
        self.resolved_attr(r)
    }

    /// The merged listing of a stack's directory `ino`, read once.
    fn listing<'g>(&self, ino: u64, d: &'g DirNode) -> Result<&'g [(Vec<u8>, Resolved)], Errno> {
        if d.listing.get().is_none() {
            let l = self
                .stack
                .list(&d.chain)
                .map_err(|e| self.fail("readdir", About::Known(ino), e))?;
            let _ = d.listing.set(l);
        }
        Ok(d.listing.get().expect("just set"))
    }

    fn attr(&self, o: Obj, i: &Inode) -> Attr {
        Attr::of_inode(self.ino(o), i, self.image(o).block_size())
    }

    /// Hands a directory's entries from `offset` on to `add`, with the offset after each,
    /// until it says the reply is full. One image is read lazily (a reply holds only a few
    /// KiB); a stack's directory is merged once and kept: `.` is offset 0, `..` 1, entry
    /// `i` of the merged listing `2 + i`.
    fn fill_dir(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(Listed<'_>, u64) -> Result<bool, Errno>,
    ) -> Result<(), Errno> {
        if !self.overlay {
            let (o, dir) = self.inode(ino)?;
            if !dir.is_dir() {
                return Err(Errno::NOTDIR);
            }
            let entries = self
                .image(o)
                .readdir(&dir, offset)
                .map_err(|e| self.fail("readdir", About::Known(ino), e))?;
            for e in entries {
                let e = e.map_err(|e| self.fail("readdir", About::Known(ino), e))?;
                let next = e.next_offset;
                if add(Listed::Plain(e), next)? {
                    break;
                }
            }
            return Ok(());
        }
        let guard = self.dirs.guard();
        let d = self.dir_node(ino, &guard)?;
        let list = self.listing(ino, d)?;
        let dots: [(&[u8], u64); 2] = [(b".", ino), (b"..", d.parent)];
        for (i, (name, dot)) in dots.into_iter().enumerate().skip(offset as usize) {
            if add(Listed::Dot(name, dot), i as u64 + 1)? {
                return Ok(());
            }
        }
        let start = offset.saturating_sub(2) as usize;
        for (i, (name, r)) in list.iter().enumerate().skip(start) {
            if add(Listed::Merged(name, r, ino, &d.chain, &guard), i as u64 + 3)? {
                break;
            }
        }
        Ok(())
    }

    /// Names in `trusted.` are listed for privileged callers only, as the kernel's erofs
    /// does (the VFS already refuses to *get* them for others). A stack also hides
    /// overlayfs's own `trusted.overlay.*`, as overlayfs does.
    fn visible(&self, caller: &Caller, name: &[u8]) -> bool {
        (!name.starts_with(b"trusted.") || caller.uid == 0)
            && !(self.overlay && name.starts_with(PRIVATE_XATTR_PREFIX))
    }
}

/// What a failed request was about, as its log line names it (`ImageFs::subject`).
#[derive(Clone, Copy)]
enum About<'a> {
    /// An object the kernel knows by this number.
    Known(u64),
    /// Entry `name` of directory `dir`, before the kernel knows it; the object found
    /// there, once found.
    Entry {
        dir: u64,
        name: &'a [u8],
        obj: Option<Obj>,
    },
}

impl<'a> About<'a> {
    fn entry(dir: u64, name: &'a [u8], obj: Option<Obj>) -> About<'a> {
        About::Entry { dir, name, obj }
    }
}

/// One directory entry as `fill_dir` hands it out.
enum Listed<'a> {
    /// From a single image, as stored.
    Plain(erofs::read::DirEntry),
    /// `.` or `..` of a stack's directory.
    Dot(&'a [u8], u64),
    /// From a stack's merged listing: name, what it resolves to, the directory's inode
    /// number and layers' directories, and the guard of the directory map (to register
    /// subdirectories).
    Merged(
        &'a [u8],
        &'a Resolved,
        u64,
        &'a [Dir],
        &'a papaya::LocalGuard<'a>,
    ),
}

/// An xattr of inode `i` in a namespace the image records as absent (ACLs when
/// `aclless`, `security.*` when `unlabelled`), if it has one; see `ImageFs::check_claims`.
fn hidden_xattr<S: ByteSource>(
    img: &Image<S>,
    i: &Inode,
    aclless: bool,
    unlabelled: bool,
) -> Result<Option<Vec<u8>>, erofs::read::Error> {
    // A header-only body (icount 1) holds nothing (the kernel answers EOPNOTSUPP).
    if !(aclless || unlabelled) || i.xattr_icount <= 1 {
        return Ok(None);
    }
    if aclless {
        for acl in [ACL_ACCESS, ACL_DEFAULT] {
            if img.getxattr(i, acl)?.is_some() {
                return Ok(Some(acl.to_vec()));
            }
        }
    }
    if unlabelled {
        let names = img.listxattr(i)?;
        if let Some(n) = names.into_iter().find(|n| n.starts_with(b"security.")) {
            return Ok(Some(n));
        }
    }
    Ok(None)
}

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// The log line (after the image's name) for inode `i` of `o` holding `xattr` in a
/// namespace its image records as absent.
fn false_record(o: Obj, i: &Inode, xattr: &[u8], overlay: bool) -> String {
    let layer = if overlay {
        format!("layer {}: ", o.layer)
    } else {
        String::new()
    };
    format!(
        "{layer}inode {} (byte {}) has xattr {}, a namespace the image's footer records as absent: refused (the image's record is false)",
        i.nid,
        i.offset(),
        String::from_utf8_lossy(xattr)
    )
}

/// The kernel's PATH_MAX: IMA names a file by `d_absolute_path` into a buffer this big.
const PATH_MAX: usize = 4096;

/// The names from the root (1) down to object `start`, found by walking `up` (an
/// object's parent and name), and whether the walk reached the root. It stops early at an
/// object `up` does not know, or once the names fill PATH_MAX (which also ends a walk
/// around any cycle).
fn names_from_root<N: AsRef<[u8]>>(
    start: u64,
    up: impl Fn(u64) -> Option<(u64, N)>,
) -> (Vec<N>, bool) {
    let mut parts = Vec::new();
    let mut len = 0;
    let mut at = start;
    while at != 1 {
        let Some((parent, name)) = up(at) else {
            break;
        };
        len += name.as_ref().len() + 1;
        parts.push(name);
        if len >= PATH_MAX {
            break;
        }
        at = parent;
    }
    parts.reverse();
    (parts, at == 1)
}

/// The path a measurement names object `start` by: `setup.path` of the names from the
/// root (1) down, found by walking `up` (an object's parent and name). Bounded as the
/// kernel's is: a path `d_absolute_path` cannot fit in PATH_MAX bytes is named as
/// `ima_d_path` names it then, by the object's own name alone (at most NAME_MAX - 1
/// bytes, what its `strscpy` keeps).
pub(crate) fn measured_path<N: AsRef<[u8]>>(
    setup: &measuring::Setup,
    start: u64,
    up: impl Fn(u64) -> Option<(u64, N)>,
) -> Vec<u8> {
    let (parts, _) = names_from_root(start, up);
    let parts: Vec<&[u8]> = parts.iter().map(AsRef::as_ref).collect();
    let own = parts.last().copied().unwrap_or_default();
    let path = setup.path(&parts);
    if path.len() >= PATH_MAX {
        return own[..own.len().min(254)].to_vec();
    }
    path
}

/// How a log line names object `start`: its path inside the mount (`/usr/bin/ls`, from
/// the names `up` gives, as `measured_path` walks them), with `name` appended when given
/// (an entry of directory `start` not yet known), escaped so that it stays one line; and
/// then the image object, if known (`inode 1234`, `inode 1234 of layer 1` in a stack).
/// Without a whole path (an ancestor the mount never learnt, or one past PATH_MAX) the
/// object alone names it.
pub(crate) fn logged_subject<N: AsRef<[u8]>>(
    start: u64,
    name: Option<&[u8]>,
    obj: Option<(Obj, bool)>,
    up: impl Fn(u64) -> Option<(u64, N)>,
) -> String {
    let (parts, whole) = names_from_root(start, up);
    let mut parts: Vec<&[u8]> = parts.iter().map(AsRef::as_ref).collect();
    parts.extend(name);
    let obj = obj.map(|(o, stacked)| match stacked {
        true => format!("inode {} of layer {}", o.nid, o.layer),
        false => format!("inode {}", o.nid),
    });
    if !whole {
        return obj.unwrap_or_else(|| "an object whose path is unknown".into());
    }
    let path = logged_path(&parts);
    match obj {
        Some(o) => format!("{path} ({o})"),
        None => path,
    }
}

/// Names from the root down as a log line shows them: `/a/b`, each escaped so that the
/// line stays one line (`\n`, `\"`, invalid UTF-8 as U+FFFD).
pub(crate) fn logged_path(parts: &[impl AsRef<[u8]>]) -> String {
    let mut path = String::new();
    for p in parts {
        path.push('/');
        path.extend(String::from_utf8_lossy(p.as_ref()).escape_debug());
    }
    if path.is_empty() {
        path.push('/');
    }
    path
}

/// The inode number of an image object: 1 for the root, else `(layer << 48 | nid) + 2`.
pub(crate) fn obj_ino(o: Obj, root: Obj) -> u64 {
    if o == root {
        1
    } else {
        ((u64::from(o.layer) << LAYER_SHIFT) | o.nid) + 2
    }
}

/// A list of xattr names, each followed by a NUL, keeping those `keep` allows.
pub(crate) fn name_list(names: &[Vec<u8>], keep: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    for n in names.iter().filter(|n| keep(n)) {
        out.extend_from_slice(n);
        out.push(0);
    }
    out
}

impl<S: ByteSource + 'static> Ops for ImageFs<S> {
    fn wants(&self) -> Wants {
        // Measuring needs every open, unless no rule can measure any layer's files.
        let measured = self
            .measure
            .as_ref()
            .is_some_and(|s| s.layers.iter().any(|l| s.measuring.may_measure(l)));
        Wants {
            ttl: FOREVER,
            readdirplus: true,
            cache_symlinks: true,
            posix_acl: !self.aclless,
            no_open: !measured,
            no_opendir: true,
            dont_mask: false,
            writes: false,
            passthrough: false,
            background: Some((64, 48)),
        }
    }

    fn granted(&mut self, granted: &Granted) {
        self.no_open = granted.no_open;
        self.no_opendir = granted.no_opendir;
    }

    fn notifier_slot(&self) -> NotifierSlot {
        self.notifier.clone()
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Option<Attr>, Errno> {
        if self.overlay {
            return self.lookup_merged(parent, name);
        }
        let (o, dir) = self.inode(parent)?;
        if !dir.is_dir() {
            return Err(Errno::NOTDIR);
        }
        let e = match self.image(o).lookup(&dir, name) {
            Ok(Some(e)) => e,
            Ok(None) => return Ok(None),
            Err(e) => return Err(self.fail("lookup", About::entry(parent, name, None), e)),
        };
        let child = Obj {
            layer: o.layer,
            nid: e.nid,
        };
        let i = self.obj_inode(child, About::entry(parent, name, Some(child)))?;
        self.check_entry(parent, name, child, &i)?;
        let a = self.attr(child, &i);
        self.learn(parent, name, a.ino);
        Ok(Some(a))
    }

    fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        let (o, i) = self.inode(ino)?;
        let mut a = self.attr(o, &i);
        if self.overlay && i.is_dir() {
            let guard = self.dirs.guard();
            if self.dir_node(ino, &guard).is_ok_and(|d| d.chain.len() > 1) {
                a.nlink = 1;
            }
        }
        Ok(a)
    }

    fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let (o, i) = self.inode(ino)?;
        self.image(o)
            .readlink(&i)
            .map_err(|e| self.fail("readlink", About::Known(ino), e))
    }

    fn open(
        &self,
        caller: &Caller,
        ino: u64,
        flags: i32,
        _register: Register<'_>,
    ) -> Result<Opened, Errno> {
        if self.no_open {
            // Once: from now on the kernel opens files without asking, keeping caches.
            return Err(Errno::NOSYS);
        }
        let (o, inode) = self.inode(ino)?;
        self.measure_open(ino, o, &inode, flags, caller.pid)?;
        self.prime(ino, o, &inode, flags);
        // Keeps what `prime` stored (and any earlier reads: the image never changes).
        Ok(Opened {
            keep_cache: true,
            ..Opened::default()
        })
    }

    fn release(&self, ino: u64, _fh: u64, _answer: &mut dyn FnMut()) {
        self.closed(ino);
    }

    fn read(&self, ino: u64, _fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let (o, inode) = self.inode(ino)?;
        self.image(o)
            .read(&inode, offset, buf)
            .map_err(|e| self.fail("read", About::Known(ino), e))
    }

    fn opendir(&self, ino: u64) -> Result<Opened, Errno> {
        if self.no_opendir {
            return Err(Errno::NOSYS);
        }
        match self.inode(ino)? {
            (_, i) if i.is_dir() => Ok(Opened {
                keep_cache: true,
                cache_dir: true,
                ..Opened::default()
            }),
            _ => Err(Errno::NOTDIR),
        }
    }

    fn readdir(&self, ino: u64, _fh: u64, offset: u64, add: AddEntry<'_>) -> Result<(), Errno> {
        self.fill_dir(ino, offset, |e, next| {
            let (name, ino, kind) = match &e {
                Listed::Plain(e) => (
                    &e.name[..],
                    self.ino(Obj {
                        layer: 0,
                        nid: e.nid,
                    }),
                    kind_of_dirent(e.file_type),
                ),
                Listed::Dot(name, ino) => (*name, *ino, Kind::Directory),
                Listed::Merged(name, r, _, _, _) => {
                    (*name, self.ino(r.top), kind(r.inode.mode.into()))
                }
            };
            Ok(add(DirEntry {
                ino,
                next,
                kind,
                name,
            }))
        })
    }

    fn readdirplus(
        &self,
        ino: u64,
        _fh: u64,
        offset: u64,
        add: AddEntryPlus<'_>,
    ) -> Result<(), Errno> {
        // "." and ".." get no dentry from readdirplus; their attributes are not used.
        let dot = |ino| Attr {
            ino,
            kind: Kind::Directory,
            ..Attr::negative()
        };
        // An entry refused (`check_entry`, `check_merged`) is listed without an inode
        // (nodeid 0, which readdir(3) skips): the kernel links no dentry, and a lookup of
        // the name gets the refusal.
        let refused = |kind| Attr {
            kind,
            ..Attr::negative()
        };
        self.fill_dir(ino, offset, |e, next| {
            let (name, attr) = match &e {
                Listed::Plain(e) => {
                    let o = Obj {
                        layer: 0,
                        nid: e.nid,
                    };
                    let attr = if e.name == b"." || e.name == b".." {
                        dot(self.ino(o))
                    } else {
                        let i = self.obj_inode(o, About::entry(ino, &e.name, Some(o)))?;
                        match self.check_entry(ino, &e.name, o, &i) {
                            Ok(()) => self.attr(o, &i),
                            Err(_) => refused(kind(i.mode.into())),
                        }
                    };
                    (&e.name[..], attr)
                }
                Listed::Dot(name, ino) => (*name, dot(*ino)),
                Listed::Merged(name, r, dir, chain, guard) => {
                    let attr = match self.check_merged(*dir, chain, name, r) {
                        Ok(()) => self.child_attr(r, *dir, *guard),
                        Err(_) => refused(kind(r.inode.mode.into())),
                    };
                    (*name, attr)
                }
            };
            if attr.ino != 0 {
                self.learn(ino, name, attr.ino);
            }
            let entry = DirEntry {
                ino: attr.ino,
                next,
                kind: attr.kind,
                name,
            };
            Ok(add(entry, &attr))
        })
    }

    fn statfs(&self) -> Result<Statfs, Errno> {
        // As the kernel's erofs: no free space, and "unlimited" inodes minus those used;
        // a stack counts its layers' blocks (in the top layer's block size) and inodes.
        let bs = self.stack.layers[0].block_size();
        let (mut blocks, mut inos) = (0u64, 0u64);
        for img in &self.stack.layers {
            let sb = img.superblock();
            blocks += img.erofs_len().div_ceil(u64::from(bs));
            inos = inos.saturating_add(sb.inos);
        }
        Ok(Statfs {
            blocks,
            bfree: 0,
            bavail: 0,
            files: u64::MAX,
            ffree: u64::MAX - inos,
            bsize: bs,
            namelen: 255,
            frsize: bs,
        })
    }

    fn getxattr(&self, caller: &Caller, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        if let Some(v) =
            measuring::stats_xattr(self.measure.as_ref(), self.extra_stats.as_ref(), ino, name)
        {
            return Ok(v);
        }
        // overlayfs refuses its own xattrs outright.
        if self.overlay && name.starts_with(PRIVATE_XATTR_PREFIX) {
            return Err(Errno::OPNOTSUPP);
        }
        if !self.visible(caller, name) {
            return Err(Errno::NODATA);
        }
        if self.unlabelled && name.starts_with(b"security.")
            || self.aclless && name.starts_with(b"system.posix_acl_")
        {
            return Err(Errno::OPNOTSUPP);
        }
        let (o, inode) = self.inode(ino)?;
        match self.image(o).getxattr(&inode, name) {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(Errno::NODATA),
            Err(e) => Err(self.fail("getxattr", About::Known(ino), e)),
        }
    }

    fn listxattr(&self, caller: &Caller, ino: u64) -> Result<Vec<u8>, Errno> {
        let (o, inode) = self.inode(ino)?;
        match self.image(o).listxattr(&inode) {
            Ok(names) => Ok(name_list(&names, |n| self.visible(caller, n))),
            Err(e) => Err(self.fail("listxattr", About::Known(ino), e)),
        }
    }
}

/// An image file's content, for measuring.
struct ImageContent<'a, S: ByteSource> {
    fs: &'a ImageFs<S>,
    ino: u64,
    file: measuring::ImageFile<'a, S>,
    setup: &'a measuring::Setup,
}

impl<S: ByteSource + 'static> measuring::Content for ImageContent<'_, S> {
    fn path(&self) -> Vec<u8> {
        measured_path(self.setup, self.ino, |at| self.fs.names.get(at))
    }

    fn reader(&self, _size: Option<u64>) -> std::io::Result<(Box<dyn std::io::Read + '_>, u64)> {
        Ok(self.file.reader())
    }

    fn verity_digest(&self) -> std::io::Result<Option<[u8; 32]>> {
        self.file.verity_digest()
    }

    fn ima_xattr(&self) -> Option<Vec<u8>> {
        self.file.ima_xattr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// `up` over a table of (object → parent, name).
    fn subject(
        table: &HashMap<u64, (u64, Vec<u8>)>,
        start: u64,
        name: Option<&[u8]>,
        obj: Option<(Obj, bool)>,
    ) -> String {
        logged_subject(start, name, obj, |at| {
            table.get(&at).map(|(p, n)| (*p, &n[..]))
        })
    }

    #[test]
    fn a_logged_subject_is_the_path_in_the_mount_then_the_object() {
        let table = HashMap::from([
            (10, (1, b"usr".to_vec())),
            (11, (10, b"bin".to_vec())),
            (12, (11, b"ls".to_vec())),
        ]);
        let o = Obj { layer: 1, nid: 42 };
        assert_eq!(
            subject(&table, 12, None, Some((o, false))),
            "/usr/bin/ls (inode 42)"
        );
        assert_eq!(
            subject(&table, 12, None, Some((o, true))),
            "/usr/bin/ls (inode 42 of layer 1)"
        );
        assert_eq!(subject(&table, 11, Some(b"cat"), None), "/usr/bin/cat");
        assert_eq!(subject(&table, 1, None, None), "/");
        assert_eq!(subject(&table, 1, Some(b"etc"), None), "/etc");
    }

    #[test]
    fn an_unknown_ancestor_or_a_loop_falls_back_to_the_object() {
        // 21's parent 20 was never learnt; 30 and 31 are each other's parent.
        let table = HashMap::from([
            (21, (20, b"f".to_vec())),
            (30, (31, b"a".to_vec())),
            (31, (30, b"b".to_vec())),
        ]);
        let o = Obj { layer: 0, nid: 7 };
        assert_eq!(subject(&table, 21, None, Some((o, false))), "inode 7");
        assert_eq!(subject(&table, 30, None, Some((o, false))), "inode 7");
        assert_eq!(
            subject(&table, 21, Some(b"x"), None),
            "an object whose path is unknown"
        );
    }

    #[test]
    fn a_logged_path_stays_one_line() {
        let table = HashMap::from([(10, (1, b"a\nb\"c\xff".to_vec()))]);
        assert_eq!(subject(&table, 10, None, None), "/a\\nb\\\"c\u{fffd}");
    }
}
