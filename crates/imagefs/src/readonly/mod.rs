//! An EROFS image, or a stack of them (`stack`), served read-only over FUSE.
//!
//! - Per inode only its last parent and name are kept (`nodes`); a READ touches no shared
//!   state.
//! - Images are immutable: every reply is cacheable forever.
//! - Each inode is checked against the images' absent-namespace claims (`claims`).
//! - A directory is handed out only where its own `..` says it is: the parents form a tree.

mod claims;
mod measured;
mod nodes;

use crate::attr::Attr;
use crate::backing::{Backing, Failed};
use crate::ino::{fits, ino_obj, obj_ino};
use crate::measuring::{self, Hook};
use crate::ops::{
    AddEntry, AddEntryPlus, Caller, DirEntry, Errno, Granted, Logger, NotifierSlot, Opened, Ops,
    Register, Statfs, Wants,
};
use crate::paths::logged_subject;
use crate::stack::{self, Obj, Resolved, Stack};
use crate::xattrs::{name_list, Rules};
use erofs::read::{ByteSource, Image, Inode};
use nodes::{DirNode, Names};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use upper::overlay::MAX_LAYERS;

/// How long the kernel may cache anything we say: the image never changes.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// One image, or a stack of them with overlayfs's rules, served read-only.
pub struct ImageFs<S: ByteSource> {
    stack: Stack<S>,
    /// Two or more layers: overlayfs's rules apply (whiteouts, opaque directories, private
    /// xattrs hidden, merged directories). One layer is served as it is.
    overlay: bool,
    root: Resolved,
    /// With `overlay`: every directory met so far, by inode number (filled by lookups,
    /// never emptied).
    dirs: papaya::HashMap<u64, DirNode>,
    name: String,
    log: Logger,
    /// Negotiated at init: the kernel stops sending OPEN / OPENDIR after one ENOSYS.
    no_open: bool,
    no_opendir: bool,
    /// What the images record as absent: `security.*` xattrs, POSIX ACLs, any xattr (see
    /// the module comment).
    record: claims::Record,
    /// Which xattrs are shown and refused (from `overlay` and `record`).
    xattrs: Rules,
    /// Measuring: with a policy, opens are measured, so the kernel must send them.
    hook: Hook,
    /// Every name the kernel learns, for the paths the measurement list and log lines name.
    names: Names,
    /// When the kernel sends OPEN (with a policy): per inode, the handles open on it and
    /// whether its bytes were handed to the kernel since it last learnt the inode; and the
    /// session's notifier to hand them over (see `prime`).
    /// Each value is an `OPEN_HANDLES` count and the `PRIMED` bit, changed in place:
    /// an open or a release allocates nothing once the inode has an entry.
    opens: papaya::HashMap<u64, AtomicU64>,
    notifier: NotifierSlot,
    /// Remote images: the executables read whole already, by inode ([`Self::read_executables_whole`]).
    read_whole: Option<crate::whole::ReadWhole>,
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
        let record = claims::absent_namespaces(&layers)?;
        let overlay = layers.len() > 1;
        let stack = Stack { layers };
        let root = root_of(&stack)?;
        claims::check_root(&stack, &root, record, &name)?;
        Ok(ImageFs {
            record,
            xattrs: Rules::read_only(overlay, record),
            stack,
            overlay,
            root,
            dirs: papaya::HashMap::new(),
            name,
            log,
            no_open: false,
            no_opendir: false,
            hook: Hook::default(),
            names: Names::new(),
            opens: papaya::HashMap::new(),
            notifier: Arc::new(OnceLock::new()),
            read_whole: None,
        })
    }

    /// For remote images: the first read of an executable's start reads all of it in one
    /// go (`whole`). A reader starting elsewhere is left as it was.
    pub fn read_executables_whole(&mut self) {
        self.read_whole = Some(Default::default());
    }

    /// Serves a read from the whole file when it is the first read of an executable of a
    /// remote image; `None` to read as usual.
    fn first_read_whole(
        &self,
        ino: u64,
        o: Obj,
        inode: &Inode,
        offset: u64,
        buf: &mut [u8],
    ) -> Option<usize> {
        let read_whole = self.read_whole.as_ref()?;
        if offset != 0 || !inode.is_reg() || inode.mode & 0o111 == 0 {
            return None;
        }
        let _reading = read_whole.start(ino, inode.size)?;
        let mut whole = vec![0u8; inode.size as usize];
        let n = self.backing(o, inode).read(0, &mut whole).ok()?;
        let take = buf.len().min(n);
        buf[..take].copy_from_slice(&whole[..take]);
        Some(take)
    }

    /// Measures opens from now on (before mounting).
    pub fn set_measuring(&mut self, setup: measuring::Setup) {
        self.hook.setup = Some(setup);
    }

    /// Adds members to what `verilay stats` prints.
    pub fn set_extra_stats(&mut self, extra: crate::measuring::ExtraStats) {
        self.hook.extra = Some(extra);
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
        ino_obj(ino, self.root.top, self.stack.layers.len())
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

    fn inode(&self, ino: u64) -> Result<(Obj, Inode), Errno> {
        let o = self.obj(ino)?;
        self.obj_inode(o, About::Known(ino)).map(|i| (o, i))
    }

    /// The inode of `o` (which `about` names for a log line).
    fn obj_inode(&self, o: Obj, about: About<'_>) -> Result<Inode, Errno> {
        if !fits(o) {
            return Err(Errno::IO);
        }
        self.stack
            .inode(o)
            .map_err(|e| self.fail("inode", about, e))
    }

    fn image(&self, o: Obj) -> &Image<S> {
        self.stack.image(o.layer)
    }

    /// The errno for a failed read of what backs `about`, logged as `fail` logs.
    fn failed(&self, what: &str, about: About<'_>, e: Failed) -> Errno {
        match e {
            Failed::Image(e) => self.fail(what, about, e),
            Failed::Host(e) => e,
        }
    }

    /// Where the reads of object `o` (inode `inode`) go.
    fn backing<'a>(&'a self, o: Obj, inode: &'a Inode) -> Backing<'a, S> {
        Backing::Image {
            image: self.image(o),
            inode,
        }
    }

    /// Attributes of a resolved object (merged directories have nlink 1, as in overlayfs).
    fn resolved_attr(&self, r: &Resolved) -> Attr {
        let mut a = self.attr(r.top, &r.inode);
        if r.is_merged() {
            a.nlink = 1;
        }
        a
    }

    fn attr(&self, o: Obj, i: &Inode) -> Attr {
        Attr::of_inode(self.ino(o), i, self.image(o).block_size())
    }
}

/// The root: a stack's merged root, or a single image's root directory.
fn root_of<S: ByteSource>(stack: &Stack<S>) -> Result<Resolved, erofs::read::Error> {
    if stack.layers.len() > 1 {
        return stack.root();
    }
    let top = Obj {
        layer: 0,
        nid: stack.layers[0].root_nid(),
    };
    Ok(Resolved {
        top,
        inode: stack.inode(top)?,
        chain: Vec::new(),
    })
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

impl<S: ByteSource + 'static> Ops for ImageFs<S> {
    fn wants(&self) -> Wants {
        // Measuring needs every open, unless no rule can measure any layer's files.
        let measured = self
            .hook
            .setup
            .as_ref()
            .is_some_and(|s| s.layers.iter().any(|l| s.measuring.may_measure(l)));
        Wants {
            ttl: FOREVER,
            readdirplus: true,
            cache_symlinks: true,
            posix_acl: !self.record.aclless,
            no_open: !measured,
            no_opendir: true,
            dont_mask: false,
            writes: false,
            passthrough: false,
            kills_privileges: false,
            background: Some((64, 48)),
            async_dio: false,
        }
    }

    fn granted(&mut self, granted: &Granted) {
        self.no_open = granted.no_open;
        self.no_opendir = granted.no_opendir;
    }

    fn stats(&self) -> crate::stats::StatsSource {
        self.hook.source()
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
        self.backing(o, &i)
            .readlink()
            .map_err(|e| self.failed("readlink", About::Known(ino), e))
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
        if let Some(n) = self.first_read_whole(ino, o, &inode, offset, buf) {
            return Ok(n);
        }
        self.backing(o, &inode)
            .read(offset, buf)
            .map_err(|e| self.failed("read", About::Known(ino), e))
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
            let (name, ino, kind) = self.plain(&e);
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
        self.fill_dir(ino, offset, |e, next| {
            let (name, attr) = self.plus(ino, &e)?;
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
        Ok(Statfs::read_only(blocks, bs, u64::MAX, u64::MAX - inos))
    }

    fn getxattr(&self, caller: &Caller, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        self.hook.requests.get.add(1);
        if let Some(v) = self.xattrs.get(caller, ino, name, || self.hook.stats())? {
            return Ok(v);
        }
        let (o, inode) = self.inode(ino)?;
        match self.backing(o, &inode).getxattr(name) {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(Errno::NODATA),
            Err(e) => Err(self.failed("getxattr", About::Known(ino), e)),
        }
    }

    fn listxattr(&self, caller: &Caller, ino: u64) -> Result<Vec<u8>, Errno> {
        self.hook.requests.list.add(1);
        self.xattrs.any()?;
        let (o, inode) = self.inode(ino)?;
        match self.backing(o, &inode).listxattr() {
            Ok(names) => Ok(name_list(&names, |n| self.xattrs.listed(caller, n))),
            Err(e) => Err(self.failed("listxattr", About::Known(ino), e)),
        }
    }
}
