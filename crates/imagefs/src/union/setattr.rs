//! SETATTR: owner, mode, size and times of an upper object (copied up first), and the
//! privileges a truncate or chown drops (`privileges`).

use super::io::from_node;
use super::privileges::may_drop_unasked;
use super::UnionFs;
use crate::attr::Attr;
use crate::ops::{Errno, Ops, SetAttr, SetTime};
use erofs::read::ByteSource;
use rustix::fd::AsFd;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use std::time::UNIX_EPOCH;

impl<S: ByteSource + 'static> UnionFs<S> {
    /// Changes node `id`'s attributes (copying it up first); a digest kept for its
    /// content survives a change of attributes alone.
    pub(super) fn set_attr(&self, id: u64, set: &SetAttr) -> Result<Attr, Errno> {
        let kept = match set.size {
            None => self.kept_digest(id),
            Some(_) => None,
        };
        let r = self.change_attrs(id, set);
        if set.size.is_some() {
            self.measure_changed(id);
        }
        if let Some(kept) = kept {
            self.carry_digest(id, kept);
        }
        r
    }

    fn change_attrs(&self, id: u64, set: &SetAttr) -> Result<Attr, Errno> {
        if let Some(c) = set.kill_privileges.filter(|_| set.changes_nothing()) {
            let a = self.attr(id, &self.node(id)?)?;
            let setid = u32::from(a.perm) & (libc::S_ISUID | libc::S_ISGID) != 0;
            let has_acl = || {
                Ops::getxattr(self, &c, id, b"system.posix_acl_access").is_ok_and(|v| !v.is_empty())
            };
            if setid && !may_drop_unasked(&c, (a.uid, a.gid), u32::from(a.perm), has_acl) {
                return Err(Errno::PERM);
            }
        }
        let fd = self.copied_up(id)?;
        let path = Self::real_path(fd.as_fd());
        // The kernel never sends a mode with the request to drop privileges (fs/attr.c
        // turns that request into the mode it would set, which fuse_setattr drops).
        match set.kill_privileges.filter(|_| set.mode.is_none()) {
            Some(c) => {
                self.chown_dropping_privileges(&c, fd.as_fd(), set.uid, set.gid)?;
            }
            None => self.set_owner_mode(fd.as_fd(), &path, set.uid, set.gid, set.mode)?,
        }
        if let Some(len) = set.size {
            match set.fh.filter(|f| !from_node(*f)) {
                Some(f) => self.with_file(f, |fd| rfs::ftruncate(fd, len))?,
                None => {
                    let f = self.with_room(|| {
                        rfs::open(
                            path.as_c_str(),
                            OFlags::WRONLY | OFlags::CLOEXEC,
                            Mode::empty(),
                        )
                    })?;
                    rfs::ftruncate(&f, len)?;
                }
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let t = rfs::Timestamps {
                last_access: set.atime.map_or_else(omit, ts),
                last_modification: set.mtime.map_or_else(omit, ts),
            };
            rfs::utimensat(rfs::CWD, path.as_c_str(), &t, AtFlags::empty())?;
        }
        let n = self.node(id)?;
        self.attr(id, &n)
    }
}

pub(super) fn ts(t: SetTime) -> rfs::Timespec {
    match t {
        SetTime::Now => rfs::Timespec {
            tv_sec: 0,
            tv_nsec: rfs::UTIME_NOW,
        },
        SetTime::At(t) => {
            let (s, n) = match t.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
                Err(e) => {
                    let d = e.duration();
                    let mut s = -(d.as_secs() as i64);
                    let mut n = -(d.subsec_nanos() as i64);
                    if n < 0 {
                        s -= 1;
                        n += 1_000_000_000;
                    }
                    (s, n)
                }
            };
            rfs::Timespec {
                tv_sec: s,
                tv_nsec: n as _,
            }
        }
    }
}

pub(super) fn omit() -> rfs::Timespec {
    rfs::Timespec {
        tv_sec: 0,
        tv_nsec: rfs::UTIME_OMIT,
    }
}
