//! Merged directory listings: read at OPENDIR, served from the handle.

use super::nodes::Lower;
use super::{errno, is_dir_mode, UnionFs};
use crate::attr::{kind, Kind};
use crate::ops::{AddEntry, DirEntry, Errno, Opened};
use erofs::read::ByteSource;
use rustix::fd::AsFd;
use std::sync::atomic::Ordering;

impl<S: ByteSource + 'static> UnionFs<S> {
    /// The merged directory's entries, without `.` and `..`: upper names first (whiteouts
    /// hide and are hidden), then the images' names not seen above.
    pub(super) fn listing(&self, id: u64) -> Result<Vec<(Vec<u8>, u64, Kind)>, Errno> {
        let n = self.node(id)?;
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        if let Some(fd) = &n.upper {
            for (name, _) in self.with_room(|| self.upper.list(fd.as_fd()).map_err(errno))? {
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

    /// Opens directory `id`: its merged listing, kept under a new handle.
    pub(super) fn open_listing(&self, id: u64) -> Result<Opened, Errno> {
        let list = self.listing(id)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.pin().insert(fh, list);
        Ok(Opened {
            fh,
            ..Opened::default()
        })
    }

    /// The entries of handle `fh` (directory `ino`) from `offset` on, `.` and `..` first.
    pub(super) fn list(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        add: AddEntry<'_>,
    ) -> Result<(), Errno> {
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
}
