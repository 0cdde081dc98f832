//! The node table: every object the kernel knows, with its parent and name (for a later
//! copy-up, and the paths log lines and measurements name), what the images have at its
//! path, and a descriptor of its upper object; and the ids objects go by.

use super::owner::read_override;
use super::{errno, is_dir_mode, UnionFs, FIRST_UPPER_ID};
use crate::attr::Attr;
use crate::backing::{Backing, Failed};
use crate::ino::obj_ino;
use crate::ops::{Errno, Passthrough};
use crate::paths::{logged_path, logged_subject};
use crate::reaper::Held;
use crate::stack::{Obj, Resolved};
use erofs::read::ByteSource;
use papaya::Guard as _;
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::fs as rfs;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use upper::Stat;

#[derive(Clone)]
pub(super) struct Node {
    pub parent: u64,
    pub name: Vec<u8>,
    /// What the images have at this path (for a directory: the merged chain), while the
    /// node still reads from them.
    pub lower: Option<Resolved>,
    /// The upper object: directories open for reading, everything else `O_PATH`.
    pub upper: Option<Arc<OwnedFd>>,
    /// Lower directories merge into this one (false once the upper one is opaque).
    pub merge: bool,
    /// Kernel references (lookups minus forgets), shared by every version of the node.
    pub lookups: Arc<AtomicU64>,
    /// How the kernel does the file's I/O, shared by every version of the node.
    pub io: Arc<FileIo>,
}

/// FUSE keeps an inode in one I/O mode while files of it are open: cached (reads and
/// writes through us and the page cache) or passthrough (the host file); an open in the
/// other mode fails with EIO. Image files can only be cached, so a file once opened from
/// the image keeps all its later opens cached too, also after its copy-up.
#[derive(Default)]
pub(super) struct FileIo {
    pub mode: AtomicU8,
    /// The upper file registered with the kernel for passthrough (one per inode, as the
    /// kernel wants); `None` inside when refused.
    pub backing: OnceLock<Option<Arc<Passthrough>>>,
    /// With measuring only: how the file is open now (its digest is not reused while a
    /// writer has it; IMA's violations are decided from it).
    pub opens: crate::measuring::Opens,
    /// With measuring only: the object was made through the mount and no digest of its
    /// content can be kept yet (cleared before a reading open's measurement or a hash at
    /// close could keep one). While set, a change of attributes has no digest to carry
    /// over and skips looking (`setattr`). A node the kernel forgot and learns again
    /// starts unset: looking is never wrong, and a digest not carried over is only
    /// computed again.
    pub fresh: std::sync::atomic::AtomicBool,
    /// The reaper's clock when the kernel last looked the node up.
    pub seen: AtomicU64,
}

pub(super) const IO_UNDECIDED: u8 = 0;
pub(super) const IO_CACHED: u8 = 1;
pub(super) const IO_PASSTHROUGH: u8 = 2;

impl FileIo {
    /// Moves to `mode` unless already in the other one; true when in `mode` now. Once
    /// decided it only reads: opens from many threads share no written cache line.
    pub(super) fn enter(&self, mode: u8) -> bool {
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
    pub(super) fn lower_chain(&self) -> &[crate::stack::Dir] {
        match &self.lower {
            Some(r) if self.merge => &r.chain,
            _ => &[],
        }
    }
}

/// Whether a node is a directory (its upper object's type, else the image's).
pub(super) fn is_dir_node(n: &Node) -> bool {
    match (&n.upper, &n.lower) {
        (Some(fd), _) => rfs::fstat(fd.as_fd()).is_ok_and(|st| is_dir_mode(st.st_mode)),
        (None, Some(r)) => r.inode.is_dir(),
        _ => false,
    }
}

/// What a failed read of the images was about, as its log line names it
/// (`UnionFs::subject`).
#[derive(Clone, Copy)]
pub(super) enum Lower<'a> {
    /// A node the kernel knows.
    Node(u64),
    /// Entry `name` of directory node `dir`, before the kernel knows it.
    Entry(u64, &'a [u8]),
    /// A directory of one layer, by its path there (the walk for hardlinks).
    Walk(u16, &'a [Vec<u8>]),
}

impl<S: ByteSource + 'static> UnionFs<S> {
    pub(super) fn lower_id(&self, o: Obj) -> u64 {
        obj_ino(o, self.root_top)
    }

    /// A copy of a node, for the paths that change the tree.
    pub(super) fn node(&self, id: u64) -> Result<Node, Errno> {
        self.nodes.pin().get(&id).cloned().ok_or(Errno::STALE)
    }

    /// Runs `f` on a node in place: the per-request paths (lookup, getattr, open, read,
    /// xattrs) copy nothing and bump no shared count.
    pub(super) fn with_node<T>(
        &self,
        id: u64,
        f: impl FnOnce(&Node) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let guard = self.nodes.guard();
        f(self.nodes.get(&id, &guard).ok_or(Errno::STALE)?)
    }

    /// Where node `n`'s attributes, bytes and xattrs come from.
    pub(super) fn backing<'a>(&'a self, n: &'a Node) -> Result<Backing<'a, S>, Errno> {
        match (&n.upper, &n.lower) {
            (Some(fd), _) => Ok(Backing::Upper(fd.as_fd())),
            (None, Some(r)) => Ok(Backing::Image {
                image: self.stack.image(r.top.layer),
                inode: &r.inode,
            }),
            (None, None) => Err(Errno::STALE),
        }
    }

    /// A node's attributes: its upper object's (rootless, with the owner and mode the
    /// override xattr records), else its image object's. A directory merging layers has
    /// nlink 1, as in overlayfs.
    pub(super) fn attr(&self, id: u64, n: &Node) -> Result<Attr, Errno> {
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

    /// The errno for a failed read of what backs a node, an image's logged as `lower_err`
    /// logs it.
    pub(super) fn failed(&self, what: &str, about: Lower<'_>, e: Failed) -> Errno {
        match e {
            Failed::Image(e) => self.lower_err(what, about, e),
            Failed::Host(e) => e,
        }
    }

    /// The errno for an error reading the images, logged in one line naming `what` was
    /// done to which file (`read of /usr/bin/ls (inode 1234)`).
    pub(super) fn lower_err(&self, what: &str, about: Lower<'_>, e: erofs::read::Error) -> Errno {
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
    pub(super) fn subject(&self, about: Lower<'_>) -> String {
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
    pub(super) fn check_one_place(&self, id: u64, n: &Node) -> Result<(), Errno> {
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
    pub(super) fn upper_id(&self, st: &Stat, fallback: impl FnOnce() -> Option<u64>) -> u64 {
        let key = (st.st_dev, st.st_ino);
        let ids = self.upper_ids.pin();
        if let Some(&id) = ids.get(&key) {
            return id;
        }
        let id = fallback().unwrap_or_else(|| self.own_id(st));
        *ids.get_or_insert(key, id)
    }

    /// The id of an object of the upper directory alone: `FIRST_UPPER_ID` + its inode
    /// number, the same in every mount; a counted one while an earlier object of that
    /// number is still held (the host reuses numbers) or on another filesystem.
    fn own_id(&self, st: &Stat) -> u64 {
        if st.st_dev == self.upper_dev && st.st_ino < FIRST_UPPER_ID {
            let id = FIRST_UPPER_ID + st.st_ino;
            if self.nodes.pin().get(&id).is_none() {
                return id;
            }
        }
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Keeps a node the daemon itself needs (to copy it up, to list it) without counting a
    /// kernel reference: one already known stays as it is.
    pub(super) fn ensure_node(&self, id: u64, n: Node) {
        let nodes = self.nodes.pin();
        if nodes.get(&id).is_none() {
            nodes.insert(id, n);
        }
    }

    /// Records that node `id` is now `name` in `parent`.
    pub(super) fn moved(&self, id: u64, parent: u64, name: &[u8]) {
        let nodes = self.nodes.pin();
        if let Some(n) = nodes.get(&id) {
            let mut m = n.clone();
            m.parent = parent;
            m.name = name.to_vec();
            nodes.insert(id, m);
        }
    }

    /// Registers a node the kernel is told about (one more lookup).
    pub(super) fn remember(&self, id: u64, mut n: Node) {
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

    /// The descriptor a node keeps for upper object `name` in `dir` (EMFILE when out of
    /// them: see `with_room`).
    pub(super) fn open_entry(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        st: &Stat,
    ) -> Result<OwnedFd, Errno> {
        self.upper.open_entry(dir, name, st).map_err(errno)
    }

    /// Runs `f`, which makes descriptors. Out of them (a burst of lookups outran the
    /// reaper, or the FORGETs of its pass are still on their way), it has a pass run and
    /// tries again until one frees room, for at most `reaper::ROOM_WAIT`. Never called
    /// holding a guard of the node map: a forgotten node's descriptor closes only once
    /// no guard older than its removal is held, so the wait would wait for itself.
    pub(super) fn with_room<T>(&self, mut f: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
        let start = std::time::Instant::now();
        loop {
            match f() {
                Err(Errno::MFILE) if start.elapsed() < crate::reaper::ROOM_WAIT => {
                    self.reap();
                    self.reaper.wait();
                    // The pass's FORGETs arrive on another thread; each one frees a
                    // node's descriptor once the map lets the node go.
                    self.nodes.guard().flush();
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                r => return r,
            }
        }
    }

    /// Has the kernel drop the names looked up longest ago, so that their nodes' upper
    /// descriptors close (see `reaper`). Directories too: the kernel forgets one only
    /// after its children, so a node's parent is always there for it.
    pub(super) fn reap(&self) {
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
}

impl<S: ByteSource + 'static> UnionFs<S> {
    /// The kernel forgot `nlookup` lookups of node `id`: the node goes once none is left.
    pub(super) fn forget_node(&self, id: u64, nlookup: u64) {
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
}
