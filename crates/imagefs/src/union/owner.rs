//! Ownership: as root, new objects belong to the caller; rootless, the host file stays the
//! mounting user's and the owner and mode the tree shows live in
//! `user.containers.override_stat`.

use super::{is_dir_mode, UnionFs};
use crate::attr::{kind, Attr};
use crate::ops::{Caller, Errno};
use crate::xattrs::OVERRIDE_XATTR;
use erofs::read::ByteSource;
use rustix::fd::BorrowedFd;
use rustix::fs::{self as rfs, AtFlags, Mode};
use std::ffi::CStr;
use upper::Meta;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Override {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits, and the type bits when recorded.
    pub mode: u32,
}

impl Override {
    pub(super) fn encode(&self) -> Vec<u8> {
        format!("{}:{}:0{:o}", self.uid, self.gid, self.mode).into_bytes()
    }

    pub(super) fn parse(v: &[u8]) -> Option<Override> {
        let s = std::str::from_utf8(v).ok()?;
        let mut f = s.trim_end_matches('\0').split(':');
        let o = Override {
            uid: f.next()?.parse().ok()?,
            gid: f.next()?.parse().ok()?,
            mode: u32::from_str_radix(f.next()?, 8).ok()?,
        };
        // A fourth field (a type name, as some tools write) is allowed and not needed.
        Some(o)
    }

    pub(super) fn apply(&self, a: &mut Attr) {
        a.uid = self.uid;
        a.gid = self.gid;
        a.perm = (self.mode & 0o7777) as u16;
        if self.mode & 0o170000 != 0 {
            a.kind = kind(self.mode);
        }
    }
}

pub(super) fn read_override(fd: BorrowedFd<'_>) -> Option<Override> {
    let mut buf = [0u8; 128];
    let path = upper::fd_path(fd);
    let n = rfs::getxattr(path.as_c_str(), OVERRIDE_XATTR, &mut buf).ok()?;
    Override::parse(&buf[..n])
}

pub(super) fn write_override(fd: BorrowedFd<'_>, o: &Override) -> rustix::io::Result<()> {
    let path = upper::fd_path(fd);
    rfs::setxattr(
        path.as_c_str(),
        OVERRIDE_XATTR,
        &o.encode(),
        rfs::XattrFlags::empty(),
    )
}

/// The permissions an upper file gets on the host in a rootless mount: what was asked,
/// plus whatever we need to keep reading and writing it ourselves.
pub(super) fn host_perm(mode: u32) -> u32 {
    let perm = mode & 0o7777;
    if is_dir_mode(mode) {
        perm | 0o700
    } else {
        perm | 0o600
    }
}

impl<S: ByteSource + 'static> UnionFs<S> {
    /// Gives the upper object `fd` (at `path`) the owner and mode asked for: as root on
    /// the host file; rootless in the override xattr (an ordinary user cannot give files
    /// away), the host file staying ours and usable by us.
    #[allow(unsafe_code)] // rustix id constructors, unsafe for -1
    pub(super) fn set_owner_mode(
        &self,
        fd: BorrowedFd<'_>,
        path: &CStr,
        uid: Option<u32>,
        gid: Option<u32>,
        mode: Option<u32>,
    ) -> Result<(), Errno> {
        if !self.as_root && (uid.is_some() || gid.is_some() || mode.is_some()) {
            let st = rfs::fstat(fd)?;
            let mut o = read_override(fd).unwrap_or(Override {
                uid: st.st_uid,
                gid: st.st_gid,
                mode: st.st_mode,
            });
            o.uid = uid.unwrap_or(o.uid);
            o.gid = gid.unwrap_or(o.gid);
            if let Some(m) = mode {
                o.mode = (o.mode & !0o7777) | (m & 0o7777);
                let host = Mode::from_raw_mode(host_perm(o.mode));
                rfs::chmodat(rfs::CWD, path, host, AtFlags::empty())?;
            }
            write_override(fd, &o)?;
        }
        if self.as_root && (uid.is_some() || gid.is_some()) {
            // SAFETY: ids from the kernel's setattr are real ids, never -1 ("unchanged"
            // is None here).
            let (u, g) = unsafe {
                (
                    uid.map(|u| rfs::Uid::from_raw(u)),
                    gid.map(|g| rfs::Gid::from_raw(g)),
                )
            };
            rfs::chownat(rfs::CWD, path, u, g, AtFlags::empty())?;
        }
        if let Some(m) = mode.filter(|_| self.as_root) {
            let perm = Mode::from_raw_mode(m & 0o7777);
            rfs::chmodat(rfs::CWD, path, perm, AtFlags::empty())?;
        }
        Ok(())
    }

    /// Owner of a new object: the caller's as root (group from a set-group-id parent),
    /// ours otherwise.
    pub(super) fn owner(&self, caller: &Caller, parent_fd: BorrowedFd<'_>) -> (u32, u32) {
        if !self.as_root {
            return (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            );
        }
        let gid = match rfs::fstat(parent_fd) {
            Ok(st) if st.st_mode & 0o2000 != 0 => st.st_gid,
            _ => caller.gid,
        };
        (caller.uid, gid)
    }
}

/// Rootless, what an image object is copied up with: the host file is the mounting
/// user's, readable and writable by it, and only `user.*` and ACLs are set (what an
/// ordinary user may); the owner and mode the tree shows go into the override xattr when
/// they differ, if the object `carries` `user.*` xattrs (files and directories).
pub(super) fn rootless_copy(meta: &mut Meta, carries: bool) {
    let me = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    let shown = Override {
        uid: meta.uid,
        gid: meta.gid,
        mode: meta.mode,
    };
    meta.xattrs
        .retain(|(k, _)| k.starts_with(b"user.") || k.starts_with(b"system.posix_acl_"));
    if carries && ((meta.uid, meta.gid) != me || host_perm(meta.mode) != meta.mode & 0o7777) {
        meta.xattrs
            .push((OVERRIDE_XATTR.as_bytes().to_vec(), shown.encode()));
    }
    (meta.uid, meta.gid) = me;
    meta.mode = (meta.mode & !0o7777) | host_perm(meta.mode);
}

/// Rootless, what a new object is made with: when the caller is not the mounting user,
/// the owner the tree shows is the caller, recorded in the override xattr (on files and
/// directories, which can carry `user.*` xattrs).
pub(super) fn rootless_shown(meta: &mut Meta, caller: &Caller) {
    let carries = matches!(
        rfs::FileType::from_raw_mode(meta.mode),
        rfs::FileType::RegularFile | rfs::FileType::Directory
    );
    if carries && (caller.uid, caller.gid) != (meta.uid, meta.gid) {
        let shown = Override {
            uid: caller.uid,
            gid: caller.gid,
            mode: meta.mode,
        };
        meta.xattrs
            .push((OVERRIDE_XATTR.as_bytes().to_vec(), shown.encode()));
    }
}
