//! What a read-only mount keeps per object: the parent and name the kernel last learnt
//! it under (`Names`), and for a stack's directories which layers' directories merge
//! there, its parent, and its merged listing once read (`DirNode`).

use super::{About, ImageFs};
use crate::attr::{kind, kind_of_dirent, Attr, Kind};
use crate::ops::Errno;
use crate::stack::{Dir, Obj, Resolved};
use erofs::read::ByteSource;
use std::sync::{Mutex, OnceLock};

/// Object → (parent, name) for every name the kernel learnt. Never emptied: at most one
/// entry per object of the images. A cold walk of a big tree learns every entry once, so
/// this is shards of plain maps under mutexes (held for one map operation), which fill at
/// about half the cost of a lock-free map.
pub(super) struct Names {
    shards: Box<[Mutex<NameMap>]>,
}

type NameMap = std::collections::HashMap<u64, (u64, Box<[u8]>), foldhash::fast::RandomState>;

impl Names {
    /// 64 shards: threads rarely meet on one.
    const SHARD_BITS: u32 = 6;

    pub(super) fn new() -> Names {
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
    pub(super) fn get(&self, id: u64) -> Option<(u64, Box<[u8]>)> {
        self.shard(id).get(&id).cloned()
    }
}

/// A directory of a stack: the layers' directories merged at its path, its parent, and its
/// merged listing once read.
pub(super) struct DirNode {
    pub chain: Vec<Dir>,
    pub parent: u64,
    listing: OnceLock<Vec<(Vec<u8>, Resolved)>>,
}

impl<S: ByteSource + 'static> ImageFs<S> {
    /// Remembers that `child` is `name` in `parent`, for the paths that measurements and
    /// log lines name. The root and an object as its own child are never recorded
    /// (lookups refuse a directory out of its place, so none should come here).
    pub(super) fn learn(&self, parent: u64, name: &[u8], child: u64) {
        if name == b"." || name == b".." || child == parent || child == 1 {
            return;
        }
        self.names.learn(child, parent, name);
        if self.hook.setup.is_some() {
            self.forget_primed(child);
        }
    }

    /// With `overlay`: the directory node of `ino` (registered by the lookup that found
    /// it; built from the object alone for a number the kernel kept from elsewhere).
    pub(super) fn dir_node<'g>(
        &self,
        ino: u64,
        guard: &'g impl papaya::Guard,
    ) -> Result<&'g DirNode, Errno> {
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

    pub(super) fn remember<'g>(
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
    pub(super) fn child_attr(&self, r: &Resolved, parent: u64, guard: &impl papaya::Guard) -> Attr {
        let ino = self.ino(r.top);
        if !r.chain.is_empty() && ino != 1 {
            self.remember(ino, r.chain.clone(), parent, guard);
        }
        self.resolved_attr(r)
    }

    /// The merged listing of a stack's directory `ino`, read once.
    pub(super) fn listing<'g>(
        &self,
        ino: u64,
        d: &'g DirNode,
    ) -> Result<&'g [(Vec<u8>, Resolved)], Errno> {
        if d.listing.get().is_none() {
            let l = self
                .stack
                .list(&d.chain)
                .map_err(|e| self.fail("readdir", About::Known(ino), e))?;
            let _ = d.listing.set(l);
        }
        Ok(d.listing.get().expect("just set"))
    }

    /// Hands a directory's entries from `offset` on to `add`, with the offset after each,
    /// until it says the reply is full. One image is read lazily (a reply holds only a few
    /// KiB); a stack's directory is merged once and kept: `.` is offset 0, `..` 1, entry
    /// `i` of the merged listing `2 + i`.
    pub(super) fn fill_dir(
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
            if add(Listed::Merged(name, r, ino, &guard), i as u64 + 3)? {
                break;
            }
        }
        Ok(())
    }

    /// A listed entry as READDIR gives it: name, inode number and type.
    pub(super) fn plain<'e>(&self, e: &'e Listed<'_>) -> (&'e [u8], u64, Kind) {
        match e {
            Listed::Plain(e) => (
                &e.name[..],
                self.ino(Obj {
                    layer: 0,
                    nid: e.nid,
                }),
                kind_of_dirent(e.file_type),
            ),
            Listed::Dot(name, ino) => (name, *ino, Kind::Directory),
            Listed::Merged(name, r, _, _) => (name, self.ino(r.top), kind(r.inode.mode.into())),
        }
    }

    /// A listed entry of directory `dir` as READDIRPLUS gives it: name and attributes,
    /// each checked as a lookup checks it. "." and ".." get no dentry from readdirplus
    /// (their attributes are not used). An entry refused (`check_entry`, `check_merged`:
    /// an inode or xattr block that fails its hash, a false record) fails the whole
    /// listing with EIO, as a damaged directory block does: a listing never comes back
    /// short (nodeid 0 would have had readdir(3) skip the entry, so a tampered block
    /// could hide chosen files from a program that enumerates a directory).
    pub(super) fn plus<'e>(&self, dir: u64, e: &'e Listed<'_>) -> Result<(&'e [u8], Attr), Errno> {
        let dot = |ino| Attr {
            ino,
            kind: Kind::Directory,
            ..Attr::negative()
        };
        Ok(match e {
            Listed::Plain(e) => {
                let o = Obj {
                    layer: 0,
                    nid: e.nid,
                };
                let attr = if e.name == b"." || e.name == b".." {
                    dot(self.ino(o))
                } else {
                    let i = self.obj_inode(o, About::entry(dir, &e.name, Some(o)))?;
                    self.check_entry(dir, &e.name, o, &i)?;
                    self.attr(o, &i)
                };
                (&e.name[..], attr)
            }
            Listed::Dot(name, ino) => (name, dot(*ino)),
            Listed::Merged(name, r, d, guard) => {
                self.check_merged(*d, name, r)?;
                (name, self.child_attr(r, *d, *guard))
            }
        })
    }
}

/// One directory entry as `fill_dir` hands it out.
pub(super) enum Listed<'a> {
    /// From a single image, as stored.
    Plain(erofs::read::DirEntry),
    /// `.` or `..` of a stack's directory.
    Dot(&'a [u8], u64),
    /// From a stack's merged listing: name, what it resolves to, the directory's inode
    /// number, and the guard of the directory map (to register subdirectories).
    Merged(&'a [u8], &'a Resolved, u64, &'a papaya::LocalGuard<'a>),
}
