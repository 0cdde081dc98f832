//! Removal: an upper object goes, and a whiteout takes its place where the images still
//! have the name.

use super::nodes::is_dir_node;
use super::{cname, errno, UnionFs};
use crate::ops::Errno;
use erofs::read::ByteSource;
use rustix::fd::AsFd;
use rustix::fs::{self as rfs, AtFlags};

impl<S: ByteSource + 'static> UnionFs<S> {
    pub(super) fn remove(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
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

    pub(super) fn remove_dir(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
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
}
