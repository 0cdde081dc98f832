//! Name resolution in the merged tree: the upper directory first (whiteouts hide), then
//! the images, and a directory's redirect to where its image contents are.

use super::nodes::{Lower, Node};
use super::{errno, is_dir_mode, UnionFs};
use crate::ops::Errno;
use crate::stack::Resolved;
use erofs::read::ByteSource;
use rustix::fd::AsFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use upper::overlay;

impl<S: ByteSource + 'static> UnionFs<S> {
    /// `name` in directory `parent` as the merged tree has it: (id, node), or `None`.
    pub(super) fn resolve(&self, parent: u64, name: &[u8]) -> Result<Option<(u64, Node)>, Errno> {
        self.with_room(|| self.with_node(parent, |p| self.resolve_in(parent, p, name)))
    }

    pub(super) fn resolve_in(
        &self,
        parent: u64,
        p: &Node,
        name: &[u8],
    ) -> Result<Option<(u64, Node)>, Errno> {
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
    pub(super) fn lower_at(
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

    /// Whether the images have something at `name` under `parent` (a whiteout is then
    /// needed once the upper object goes).
    pub(super) fn lower_has(&self, parent: u64, name: &[u8]) -> Result<bool, Errno> {
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
}
