//! The image id a copied-up non-directory keeps across remounts, from its copy-up's record
//! (docs/FORMAT.md, "Upper directories").
//!
//! - `ID`: still where image object ID was, hiding it there.
//! - `ID INO PATH`: moved from PATH; kept while it is upper inode INO, the images have ID
//!   at PATH and the merged tree hides it there.

use super::nodes::{is_dir_node, Node};
use super::{is_dir_mode, UnionFs};
use crate::stack::Resolved;
use erofs::read::ByteSource;
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self as rfs, Stat};
use std::ffi::CString;

/// The longest record read: an id, an inode number and a path of at most PATH_MAX.
const RECORD_MAX: usize = 4200;

impl<S: ByteSource + 'static> UnionFs<S> {
    /// The image id the upper non-directory `name` in `dir` (`st`) keeps, if its record
    /// still holds; `lower`: what the images have at its path. The image object must have
    /// one name and the same type: no id stands for two objects.
    pub(super) fn origin_id(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        st: &Stat,
        lower: &Option<Resolved>,
    ) -> Option<u64> {
        if is_dir_mode(st.st_mode) {
            return None;
        }
        let record = self.read_origin(dir, name)?;
        let mut parts = record.splitn(3, |&b| b == b' ');
        let id: u64 = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let r = match (parts.next(), parts.next()) {
            (None, _) => lower.clone()?,
            (Some(ino), Some(path)) => {
                let ino: u64 = std::str::from_utf8(ino).ok()?.parse().ok()?;
                // The record is the upper directory's word: a path with an empty, `.` or
                // `..` part (which would lead out of the tree) is none of ours.
                if !upper::overlay::valid_redirect(&[b"/", path].concat()) {
                    return None;
                }
                // The images first: their walk cannot leave the tree.
                let r = self.images_at(path)?;
                if ino != st.st_ino || self.merged_shows(path, id) != Some(false) {
                    return None;
                }
                r
            }
            (Some(_), None) => return None,
        };
        let same_type = rfs::FileType::from_raw_mode(st.st_mode)
            == rfs::FileType::from_raw_mode(r.inode.mode.into());
        (same_type && !r.inode.is_dir() && r.inode.nlink == 1 && self.lower_id(r.top) == id)
            .then_some(id)
    }

    /// Before node `id`, the upper non-directory `name` of `parent`, moves: a record of
    /// its image id gains the path it leaves and its inode number (see the module doc).
    /// Only an object shown with an image id has a record to keep.
    pub(super) fn record_move(
        &self,
        id: u64,
        parent: u64,
        name: &[u8],
    ) -> Result<(), super::Errno> {
        if id == 1 || id >= super::FIRST_UPPER_ID {
            return Ok(());
        }
        let pfd = self.upper_dir(parent)?;
        let Some(record) = self.read_origin(pfd.as_fd(), name) else {
            return Ok(());
        };
        if record.contains(&b' ') {
            return Ok(());
        }
        let Some(st) = self.upper.stat(pfd.as_fd(), name).map_err(super::errno)? else {
            return Ok(());
        };
        let Some(path) = self.merged_path(parent, name) else {
            return Ok(());
        };
        let mut value = format!("{} {} ", String::from_utf8_lossy(&record), st.st_ino).into_bytes();
        value.extend_from_slice(&path);
        if value.len() > RECORD_MAX {
            return Ok(());
        }
        let at = entry_path(pfd.as_fd(), name).ok_or(super::Errno::INVAL)?;
        rfs::lsetxattr(
            at.as_c_str(),
            self.upper.ns.origin(),
            &value,
            rfs::XattrFlags::REPLACE,
        )
    }

    fn read_origin(&self, dir: BorrowedFd<'_>, name: &[u8]) -> Option<Vec<u8>> {
        let path = entry_path(dir, name)?;
        let mut buf = vec![0u8; RECORD_MAX];
        let n = rfs::lgetxattr(path.as_c_str(), self.upper.ns.origin(), &mut buf).ok()?;
        buf.truncate(n);
        Some(buf)
    }

    /// `name` of node `parent` as a path from the root (`a/b/name`), from the nodes the
    /// kernel holds.
    fn merged_path(&self, parent: u64, name: &[u8]) -> Option<Vec<u8>> {
        let mut parts = vec![name.to_vec()];
        let mut at = parent;
        while at != 1 {
            let (up, n) = self
                .with_node(at, |n| Ok((n.parent, n.name.clone())))
                .ok()?;
            parts.push(n);
            at = up;
            if parts.len() > 4096 {
                return None;
            }
        }
        parts.reverse();
        Some(parts.join(&b'/'))
    }

    /// What the images alone have at `path` (a path from the root).
    fn images_at(&self, path: &[u8]) -> Option<Resolved> {
        let mut at = self.with_node(1, |root| Ok(root.lower.clone())).ok()??;
        for part in path.split(|&b| b == b'/') {
            at = self.stack.lookup(&at.chain, part).ok()??;
        }
        Some(at)
    }

    /// Whether the merged tree shows image object `id` at `path` (`None`: not known).
    fn merged_shows(&self, path: &[u8], id: u64) -> Option<bool> {
        let (dirs, last) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&path[..0], path),
        };
        let mut node: Node = self.node(1).ok()?;
        let mut node_id = 1;
        for part in dirs.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
            match self.resolve_in(node_id, &node, part).ok()? {
                Some((i, n)) if is_dir_node(&n) && (n.merge || n.upper.is_none()) => {
                    (node_id, node) = (i, n)
                }
                // Hidden, or an upper directory that merges nothing: nothing of the
                // images shows below.
                _ => return Some(false),
            }
        }
        if let Some(fd) = &node.upper {
            if self.upper.stat(fd.as_fd(), last).ok()?.is_some() {
                return Some(false);
            }
        }
        let chain = node.lower_chain();
        if chain.is_empty() {
            return Some(false);
        }
        let shown = self.stack.lookup(chain, last).ok()?;
        Some(shown.is_some_and(|r| self.lower_id(r.top) == id))
    }
}

/// `name` in directory `dir`, as a path the `l*xattr` calls take (no link followed).
fn entry_path(dir: BorrowedFd<'_>, name: &[u8]) -> Option<CString> {
    let mut path = upper::fd_path(dir).into_bytes();
    path.push(b'/');
    path.extend_from_slice(name);
    CString::new(path).ok()
}
