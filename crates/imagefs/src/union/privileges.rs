//! Privileges a change drops (FUSE_HANDLE_KILLPRIV_V2): a write, truncate or chown of a
//! regular file drops its set-id bits and `security.capability`, as the VFS does
//! (`setattr_should_drop_suidgid`, `chown_common`, `cap_inode_killpriv`). The kernel says
//! when; the host would not drop them (we change files as root, or rootless in the override
//! xattr), so we do.

use super::owner::read_override;
use super::UnionFs;
use crate::ops::{Caller, Errno};
use erofs::read::ByteSource;
use rustix::fd::BorrowedFd;
use rustix::fs::{self as rfs, FileType};
use std::ffi::CStr;

const CAPABILITY_XATTR: &str = "security.capability";
const SETUID: u32 = libc::S_ISUID;
const SETGID: u32 = libc::S_ISGID;
const GROUP_EXEC: u32 = libc::S_IXGRP;

/// `mode` (of a file in group `gid`) without the set-id bits `caller`'s change drops:
/// setuid always; setgid with group execute always, and without it (where it marks
/// mandatory locking) unless the caller is in the group or is root (the VFS asks for
/// CAP_FSETID, which the kernel only tells apart on a write or truncate, where root is
/// the one that has it).
pub(super) fn without_setid(mode: u32, gid: u32, caller: &Caller) -> u32 {
    let m = mode & !SETUID;
    // Group membership is looked up only for the rare file that needs it.
    let keeps_setgid =
        mode & SETGID == 0 || mode & GROUP_EXEC == 0 && (caller.uid == 0 || in_group(caller, gid));
    match keeps_setgid {
        true => m,
        false => m & !SETGID,
    }
}

/// Whether `caller` is in group `gid`: its own, or one of its supplementary groups (read
/// from /proc: the request names the caller's thread, which waits for the answer).
fn in_group(caller: &Caller, gid: u32) -> bool {
    if caller.gid == gid {
        return true;
    }
    host::status::of(caller.pid).is_ok_and(|s| s.groups.contains(&gid))
}

/// Whether `caller` may drop the set-id bits of a file owned by `uid` and `gid` with
/// `mode` by a SETATTR that changes nothing else. It comes from a write's
/// `file_remove_privs`, and from `chown(-1, -1)`, which FUSE passes on without the VFS's
/// owner check (fs/fuse/dir.c), so the check is made here: root, the owner and anyone the
/// mode lets write may; others get EPERM. With an ACL (`has_acl`, asked only then) the
/// group bits are its mask, so a group-writable file may have writers outside the group:
/// anyone may then drop the bits, as its writers could anyway.
pub(super) fn may_drop_unasked(
    caller: &Caller,
    (uid, gid): (u32, u32),
    mode: u32,
    has_acl: impl FnOnce() -> bool,
) -> bool {
    caller.uid == 0
        || caller.uid == uid
        || mode & 0o002 != 0
        || mode & 0o020 != 0 && (in_group(caller, gid) || has_acl())
}

fn is_regular(mode: u32) -> bool {
    FileType::from_raw_mode(mode) == FileType::RegularFile
}

impl<S: ByteSource + 'static> UnionFs<S> {
    /// Drops the privileges of the upper object `fd` (open, or the node's own
    /// descriptor) that `caller`'s change drops, if it is a regular file: a directory's
    /// setgid is inherited by what is made in it, never dropped. Says whether its mode
    /// changed.
    pub(super) fn drop_privileges(
        &self,
        caller: &Caller,
        fd: BorrowedFd<'_>,
    ) -> Result<bool, Errno> {
        self.chown_dropping_privileges(caller, fd, None, None)
    }

    /// Gives the upper object `fd` owner `uid` and group `gid` (those asked) and drops
    /// the privileges `caller`'s change drops, in one change of the owner and mode. Says
    /// whether the mode changed.
    pub(super) fn chown_dropping_privileges(
        &self,
        caller: &Caller,
        fd: BorrowedFd<'_>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<bool, Errno> {
        let st = rfs::fstat(fd)?;
        let path = Self::real_path(fd);
        if !is_regular(st.st_mode) {
            self.set_owner_mode(fd, &path, uid, gid, None)?;
            return Ok(false);
        }
        // Rootless, the mode and group shown are the override's; the host file's are ours.
        let shown_override = if self.as_root {
            None
        } else {
            read_override(fd)
        };
        let (shown, group) = match shown_override {
            Some(o) => (o.mode & 0o7777, o.gid),
            None => (st.st_mode & 0o7777, st.st_gid),
        };
        let dropped = without_setid(shown, group, caller);
        let mode = (dropped != shown).then_some(dropped);
        self.set_owner_mode(fd, &path, uid, gid, mode)?;
        self.drop_capability(&path)?;
        Ok(mode.is_some())
    }

    /// Removes a regular file's `security.capability`. Only root can hold one (setting it
    /// needs CAP_SETFCAP on the host; a rootless copy-up leaves it behind).
    fn drop_capability(&self, path: &CStr) -> Result<(), Errno> {
        if !self.as_root {
            return Ok(());
        }
        match rfs::removexattr(path, CAPABILITY_XATTR) {
            Ok(()) | Err(Errno::NODATA) | Err(Errno::OPNOTSUPP) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller that /proc knows nothing of (pid 0): only its own group counts.
    fn caller(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, pid: 0 }
    }

    #[test]
    fn setuid_and_group_executable_setgid_always_go() {
        for c in [caller(1000, 1000), caller(0, 0)] {
            assert_eq!(without_setid(0o6777, 0, &c), 0o777);
            assert_eq!(without_setid(0o4755, 0, &c), 0o755);
            assert_eq!(without_setid(0o2750, 1000, &c), 0o750);
        }
    }

    #[test]
    fn setgid_without_group_execute_goes_only_for_a_stranger_to_the_group() {
        assert_eq!(without_setid(0o2666, 0, &caller(1000, 1000)), 0o666);
        assert_eq!(without_setid(0o2666, 1000, &caller(1000, 1000)), 0o2666);
        assert_eq!(without_setid(0o2666, 50, &caller(0, 0)), 0o2666);
    }

    #[test]
    fn only_root_the_owner_or_a_possible_writer_drops_bits_unasked() {
        let (owner, no_acl, acl) = ((1000, 1000), || false, || true);
        assert!(may_drop_unasked(&caller(0, 0), owner, 0o4755, no_acl));
        assert!(may_drop_unasked(&caller(1000, 1000), owner, 0o4755, no_acl));
        assert!(!may_drop_unasked(
            &caller(1001, 1001),
            owner,
            0o4755,
            no_acl
        ));
        assert!(may_drop_unasked(&caller(1001, 1001), owner, 0o4757, no_acl));
        // Group-writable: the group's members, or anyone when an ACL may name writers.
        assert!(may_drop_unasked(&caller(1001, 1000), owner, 0o4775, no_acl));
        assert!(!may_drop_unasked(
            &caller(1001, 1001),
            owner,
            0o4775,
            no_acl
        ));
        assert!(may_drop_unasked(&caller(1001, 1001), owner, 0o4775, acl));
        assert!(!may_drop_unasked(&caller(1001, 1001), owner, 0o4755, acl));
    }

    #[test]
    fn supplementary_groups_count() {
        let me = Caller {
            uid: 1000,
            gid: 1000,
            pid: std::process::id(),
        };
        let groups = rustix::process::getgroups().unwrap();
        if let Some(g) = groups.iter().map(|g| g.as_raw()).find(|&g| g != 1000) {
            assert_eq!(without_setid(0o2644, g, &me), 0o2644);
        }
        assert_eq!(without_setid(0o2644, 4_000_000, &me), 0o644);
    }
}
