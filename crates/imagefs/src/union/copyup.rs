//! Copy-up: an image object becomes an upper one (its ancestors first) before anything
//! changes it, atomically through the work directory, its parent's times kept, and an
//! image file's other names made hardlinks to the copy.

use super::nodes::{is_dir_node, Lower, Node};
use super::owner::rootless_copy;
use super::{cname, errno, UnionFs};
use crate::ops::Errno;
use crate::stack::Obj;
use erofs::read::{ByteSource, Inode};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags};
use std::sync::Arc;
use upper::{Contents, Meta, Stat};

/// Per nid, every path (as name components) of a hardlinked image file.
pub(super) type LinkPaths = std::collections::HashMap<u64, Vec<Vec<Vec<u8>>>>;

impl<S: ByteSource + 'static> UnionFs<S> {
    /// The upper directory of `id`, copying it (and its parents) up first.
    pub(super) fn upper_dir(&self, id: u64) -> Result<Arc<OwnedFd>, Errno> {
        self.copy_up(id)
    }

    /// `copy_up` for callers that do not hold `change`: an object already in the upper
    /// directory (the common case) needs no lock.
    pub(super) fn copied_up(&self, id: u64) -> Result<Arc<OwnedFd>, Errno> {
        if let Some(fd) = self.with_node(id, |n| Ok(n.upper.clone()))? {
            return Ok(fd);
        }
        let _l = self.lock();
        self.copy_up(id)
    }

    /// Makes `id` an upper object (a no-op when it is one): the ancestors it lacks first,
    /// from the topmost down, then the object. A loop, not recursion: a tree may be
    /// thousands of levels deep. Callers hold `change`.
    pub(super) fn copy_up(&self, id: u64) -> Result<Arc<OwnedFd>, Errno> {
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
    pub(super) fn copy_up_one(
        &self,
        id: u64,
        n: Node,
        pfd: &OwnedFd,
    ) -> Result<Arc<OwnedFd>, Errno> {
        let r = n.lower.as_ref().ok_or(Errno::STALE)?;
        let (img, inode) = (self.stack.image(r.top.layer), &r.inode);
        let meta = self.copy_up_meta(id, img, inode)?;
        // A failure is logged here, where the file is known, and keeps its errno.
        let mut read = |off: u64, buf: &mut [u8]| {
            img.read(inode, off, buf).map_err(|e| {
                let errno = self.lower_err("copy-up read", Lower::Node(id), e);
                std::io::Error::from_raw_os_error(errno.raw_os_error())
            })
        };
        let target;
        let mut contents = if inode.is_dir() {
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
            // A failed copy leaves nothing behind, so one out of descriptors starts over.
            self.with_room(|| {
                self.upper
                    .create(pfd.as_fd(), &n.name, &meta, contents.reborrow())
                    .map_err(errno)
            })
        })?;
        let fd = self.now_upper(id, &n, pfd, &st, inode.is_dir())?;
        if inode.is_reg() && inode.nlink > 1 {
            self.link_other_names(r.top, &fd)?;
        }
        Ok(fd)
    }

    /// What image object `inode` of node `id` is copied up with: its owner, mode, times
    /// and xattrs (not the mount's own; rootless, only those an ordinary user may set,
    /// and the owner and mode shown recorded instead), and a non-directory's image id.
    fn copy_up_meta(
        &self,
        id: u64,
        img: &erofs::read::Image<S>,
        inode: &Inode,
    ) -> Result<Meta, Errno> {
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
            // Linux allows user.* xattrs on files and directories only.
            rootless_copy(&mut meta, inode.is_reg() || inode.is_dir());
        }
        // Rootless, the record is a `user.*` xattr, which Linux keeps on files alone.
        if inode.is_reg() || (self.as_root && !inode.is_dir()) {
            meta.xattrs.push((
                self.upper.ns.origin().as_bytes().to_vec(),
                id.to_string().into_bytes(),
            ));
        }
        Ok(meta)
    }

    /// Node `id` (`n`) now has the upper object `st` in `pfd`: the node keeps a
    /// descriptor of it, and the kernel drops a copied-up directory's attributes.
    fn now_upper(
        &self,
        id: u64,
        n: &Node,
        pfd: &OwnedFd,
        st: &Stat,
        is_dir: bool,
    ) -> Result<Arc<OwnedFd>, Errno> {
        let fd = Arc::new(self.with_room(|| self.open_entry(pfd.as_fd(), &n.name, st))?);
        self.upper_ids.pin().insert((st.st_dev, st.st_ino), id);
        let mut up = n.clone();
        up.upper = Some(fd.clone());
        if !is_dir {
            up.lower = None;
        }
        self.nodes.pin().insert(id, up);
        if is_dir {
            // Its size and link count are the upper directory's now (attributes only:
            // a negative offset leaves cached pages alone).
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(id, -1, 0);
            }
        }
        Ok(fd)
    }

    /// Runs `copy`, a copy-up into `pfd` (the upper directory of node `parent`), and then
    /// gives that directory back its access and modification times, as overlayfs does
    /// (`ovl_set_timestamps` on the parent in copy_up.c): a copy-up is no change of the
    /// merged directory. Its ctime still moves, so the kernel's cached attributes of
    /// `parent` are dropped, for the merged directory to show the upper one's times.
    pub(super) fn keeping_times<T>(
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
    pub(super) fn link_other_names(&self, obj: Obj, fd: &OwnedFd) -> Result<(), Errno> {
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
    pub(super) fn hardlink_paths(&self, layer: u16) -> Result<&LinkPaths, Errno> {
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
}
