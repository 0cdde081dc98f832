//! Rename, as overlayfs does it with `redirect_dir=on`: a directory with image contents moves
//! with a redirect, and a name the images still have gets a whiteout.
//!
//! - `RENAME_EXCHANGE` copies both up and swaps them: no whiteout.
//! - A directory moving onto a whiteout trades places with it, so the name is never empty.
//! - An upper-only directory moving into a merged directory becomes opaque.

use super::nodes::{is_dir_node, Node};
use super::{cname, errno, is_dir_mode, UnionFs};
use crate::ops::{Errno, RenameFlags};
use erofs::read::ByteSource;
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self as rfs, AtFlags};
use upper::overlay::REDIRECT_MAX;

/// An object about to be renamed: the redirect it needs (see `redirect_for`), whether it
/// is a directory with image contents, and whether it is a directory at all.
pub(super) struct Moving {
    pub redirect: Option<Vec<u8>>,
    pub lower_dir: bool,
    pub is_dir: bool,
}

/// How a rename meets its target: trading places with it, a directory moving, onto a
/// directory merging image contents.
struct Swap {
    exchange: bool,
    src_is_dir: bool,
    target_merges: bool,
}

/// Whether a node is a directory with image contents.
fn has_lower_dir(n: &Node) -> bool {
    n.upper.is_none() && n.lower.as_ref().is_some_and(|r| r.inode.is_dir())
        || !n.lower_chain().is_empty()
}

impl<S: ByteSource + 'static> UnionFs<S> {
    /// The redirect a directory with image contents needs before it moves (overlayfs's
    /// rules): none if it has one that still holds (any absolute one; a relative one
    /// within the same parent), its current name within the same parent, else its image
    /// path from the root, made of its ancestors' redirects and names.
    pub(super) fn redirect_for(
        &self,
        id: u64,
        same_parent: bool,
    ) -> Result<Option<Vec<u8>>, Errno> {
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
    pub(super) fn mark_moving_dir(
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

    /// Moves `name` of `parent` to `newname` of `newparent` (`flags`: renameat2's).
    pub(super) fn move_entry(
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
        let exchange = flags.contains(RenameFlags::EXCHANGE);
        // A directory with image contents moves with a redirect to them (both, when
        // two trade places), worked out before anything moves.
        let same_parent = parent == newparent;
        let src = self.moving(sid, &snode, same_parent)?;
        if exchange {
            // Both names stay occupied, so no whiteout is needed: both objects are
            // copied up and trade places, a directory with image contents with a
            // redirect to them.
            let (tid, t) = target.as_ref().ok_or(Errno::NOENT)?;
            self.ensure_node(*tid, t.clone());
            let moves = self.moving(*tid, t, same_parent)?;
            let tfd = self.copy_up(*tid)?;
            self.mark_moving_dir(tfd.as_fd(), moves, parent)?;
            self.record_move(*tid, newparent, newname)?;
        }
        if let Some((tid, t)) = &target {
            self.check_replaceable(*tid, t, flags)?;
        }
        let sfd = self.copy_up(sid)?;
        self.record_move(sid, parent, name)?;
        let how = Swap {
            exchange,
            src_is_dir: src.is_dir,
            target_merges: target
                .as_ref()
                .is_some_and(|(_, t)| !t.lower_chain().is_empty()),
        };
        self.mark_moving_dir(sfd.as_fd(), src, newparent)?;
        self.swap_names((parent, name), (newparent, newname), how)?;
        self.moved(sid, newparent, newname);
        if let Some((tid, t)) = target.filter(|_| exchange) {
            self.ensure_node(tid, t);
            self.moved(tid, parent, name);
        }
        Ok(())
    }

    /// What node `id` (`n`) needs before it moves (see [`Moving`]).
    fn moving(&self, id: u64, n: &Node, same_parent: bool) -> Result<Moving, Errno> {
        let lower_dir = has_lower_dir(n);
        let redirect = match lower_dir {
            true => self.redirect_for(id, same_parent)?,
            false => None,
        };
        Ok(Moving {
            redirect,
            lower_dir,
            is_dir: is_dir_node(n),
        })
    }

    /// Whether the target of a rename, node `id` (`t`), may be replaced: not with
    /// RENAME_NOREPLACE; and a directory with image contents only when the merged tree
    /// shows it empty (its upper side, whiteouts, goes after the move).
    fn check_replaceable(&self, id: u64, t: &Node, flags: RenameFlags) -> Result<(), Errno> {
        if flags.contains(RenameFlags::NOREPLACE) {
            return Err(Errno::EXIST);
        }
        if !flags.contains(RenameFlags::EXCHANGE)
            && has_lower_dir(t)
            && !self.listing(id)?.is_empty()
        {
            return Err(Errno::NOTEMPTY);
        }
        Ok(())
    }

    /// Moves the upper entry `from` (parent, name) to `to`, both copied up, and leaves at
    /// the old name what the merged tree needs there: a whiteout where the images still
    /// have the name, nothing otherwise.
    fn swap_names(&self, from: (u64, &[u8]), to: (u64, &[u8]), how: Swap) -> Result<(), Errno> {
        let ((parent, name), (newparent, newname)) = (from, to);
        let src_lower = self.lower_has(parent, name)?;
        let pfd = self.upper_dir(parent)?;
        let dpfd = self.upper_dir(newparent)?;
        let at_target = if how.exchange {
            None
        } else {
            self.upper.stat(dpfd.as_fd(), newname).map_err(errno)?
        };
        // Over a whiteout or a lower-only name the upper entry simply shadows it; a
        // directory cannot replace a whiteout (a device), so it trades places with it.
        let over_whiteout = how.src_is_dir && at_target.as_ref().is_some_and(upper::is_whiteout);
        // Over a directory of the upper layer that holds whiteouts (an emptied merged
        // one): trade places, then clear it away.
        let over_dir = at_target.is_some_and(|st| is_dir_mode(st.st_mode)) && how.target_merges;
        let mut rflags = rfs::RenameFlags::empty();
        if how.exchange || over_whiteout || over_dir {
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
        } else if src_lower && !how.exchange && !over_whiteout {
            self.upper.whiteout(pfd.as_fd(), name).map_err(errno)?;
        }
        Ok(())
    }
}
