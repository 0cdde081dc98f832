//! Which xattr names a mount shows, refuses and lets change: one set of rules for both
//! filesystems (docs/SECURITY.md section 5).
//!
//! - A read-only mount whose images record no xattr answers GETXATTR and LISTXATTR ENOSYS: the
//!   kernel stops sending either, so `ls -l` and exec cost no round trip.
//! - Otherwise the first match answers (`Rules::get`), then the layer's value.

use crate::measuring::STATS_XATTR;
use crate::ops::{Caller, Errno};
use upper::overlay::{Namespace, PRIVATE_XATTR_PREFIX};

/// The owner and mode a rootless mount shows (containers/storage's format,
/// `uid:gid:0mode`, as fuse-overlayfs and rootless container tools read it).
pub const OVERRIDE_XATTR: &str = "user.containers.override_stat";
/// [`OVERRIDE_XATTR`] and its siblings: fuse-overlayfs keeps names it may not store (such
/// as `security.capability`) as other `user.containers.override_*` names.
const OVERRIDE_PREFIX: &[u8] = b"user.containers.override_";

const ACL_PREFIX: &[u8] = b"system.posix_acl_";

pub(crate) struct Rules {
    /// overlayfs's namespaces in this mount, hidden and refused: none for one image
    /// (served as the kernel's erofs shows it, `trusted.overlay.*` included),
    /// `trusted.overlay.` for a stack, and on a writable mount `user.overlay.` as well. The mount, a later one and kernel overlayfs read them
    /// as markers, so none is shown, read, set or removed through the mount.
    overlay: [Option<&'static [u8]>; 2],
    /// A writable mount's `user.containers.override_*` (its rootless ownership): hidden,
    /// ENODATA, never set; whoever could write one could forge a `root:root 4755` file.
    overrides: bool,
    /// Read-only mounts whose images record no `security.*` xattr, or no ACL: the
    /// namespace answers EOPNOTSUPP (a writable mount always reads the layer).
    unlabelled: bool,
    aclless: bool,
    /// Read-only mounts whose images record no xattr at all: ENOSYS to every request.
    /// Never a writable mount: its upper directory can gain xattrs.
    xattrless: bool,
}

/// What a read-only mount's images record as absent (every layer's footer).
/// Unrecorded means "maybe present": per-inode answers.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Absent {
    /// No `security.*` xattr.
    pub unlabelled: bool,
    /// No POSIX ACL.
    pub aclless: bool,
    /// No xattr at all (the other two then hold as well).
    pub xattrless: bool,
}

impl Rules {
    /// A read-only mount of one image (`stacked` false) or several.
    pub fn read_only(stacked: bool, absent: Absent) -> Rules {
        Rules {
            overlay: [stacked.then_some(PRIVATE_XATTR_PREFIX), None],
            overrides: false,
            unlabelled: absent.unlabelled,
            aclless: absent.aclless,
            xattrless: absent.xattrless,
        }
    }

    /// A writable mount: both of overlayfs's namespaces are markers, whichever this mount
    /// keeps its own in, since its upper directory is also mounted the other way (root,
    /// rootless, kernel overlayfs with `userxattr`): an image's `user.overlay.opaque`,
    /// copied up by a root mount, would be a marker to a rootless one.
    pub fn writable() -> Rules {
        Rules {
            overlay: [
                Some(PRIVATE_XATTR_PREFIX),
                Some(Namespace::User.prefix().as_bytes()),
            ],
            overrides: true,
            unlabelled: false,
            aclless: false,
            xattrless: false,
        }
    }

    fn overlay(&self, name: &[u8]) -> bool {
        self.overlay.iter().flatten().any(|p| name.starts_with(p))
    }

    /// The names the mount keeps for itself.
    fn own(&self, name: &[u8]) -> bool {
        self.overlay(name) || self.overrides && name.starts_with(OVERRIDE_PREFIX)
    }

    /// Whether the caller sees `name` listed: not one of the mount's own, and `trusted.*`
    /// to root only, as the kernel's erofs lists them (the VFS refuses to get them to
    /// others anyway).
    pub fn listed(&self, caller: &Caller, name: &[u8]) -> bool {
        !self.own(name) && (!name.starts_with(b"trusted.") || caller.uid == 0)
    }

    /// What GETXATTR of `name` on `ino` gets without reading a layer: `Some` value (the
    /// root's counters, from `stats`), an error, or `None`: read the layer.
    ///
    /// First match: the root's `verilay.stats` (for readers without `verilay stats`'s
    /// socket); overlayfs's namespace, EOPNOTSUPP (as overlayfs answered before Linux 6.7
    /// escaped such names); a name the caller may not see, ENODATA; a namespace the images
    /// record as absent, EOPNOTSUPP.
    pub fn get(
        &self,
        caller: &Caller,
        ino: u64,
        name: &[u8],
        stats: impl FnOnce() -> Vec<u8>,
    ) -> Result<Option<Vec<u8>>, Errno> {
        self.any()?;
        if ino == 1 && name == STATS_XATTR {
            return Ok(Some(stats()));
        }
        if self.overlay(name) {
            return Err(Errno::OPNOTSUPP);
        }
        if !self.listed(caller, name) {
            return Err(Errno::NODATA);
        }
        if self.unlabelled && name.starts_with(b"security.")
            || self.aclless && name.starts_with(ACL_PREFIX)
        {
            return Err(Errno::OPNOTSUPP);
        }
        Ok(None)
    }

    /// Whether the mount answers xattr requests at all: ENOSYS when its images hold no
    /// xattr (the kernel stops asking, see the module comment). LISTXATTR asks this
    /// alone; GETXATTR asks it first.
    pub fn any(&self) -> Result<(), Errno> {
        if self.xattrless {
            return Err(Errno::NOSYS);
        }
        Ok(())
    }

    /// Whether `name` may be set or removed on `ino`: not the mount's own, nor the root's
    /// read-only `verilay.stats` (EPERM, as fuse-overlayfs answers; kernel overlayfs,
    /// since 6.7, stores such names escaped instead).
    pub fn may_change(&self, ino: u64, name: &[u8]) -> Result<(), Errno> {
        if self.own(name) || (ino == 1 && name == STATS_XATTR) {
            return Err(Errno::PERM);
        }
        Ok(())
    }

    /// Whether copy-up carries an image's xattr `name` up (never the mount's own).
    pub fn copied_up(&self, name: &[u8]) -> bool {
        !self.own(name)
    }
}

/// A list of xattr names, each followed by a NUL, keeping those `keep` allows.
pub(crate) fn name_list(names: &[Vec<u8>], keep: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    for n in names.iter().filter(|n| keep(n)) {
        out.extend_from_slice(n);
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 1,
    };
    const USER: Caller = Caller {
        uid: 1000,
        gid: 1000,
        pid: 2,
    };

    fn get(r: &Rules, c: &Caller, name: &str) -> Result<Option<Vec<u8>>, Errno> {
        r.get(c, 5, name.as_bytes(), Vec::new)
    }

    #[test]
    fn one_image_serves_overlay_names_as_erofs_does() {
        let r = Rules::read_only(false, Absent::default());
        assert_eq!(get(&r, &ROOT, "trusted.overlay.opaque"), Ok(None));
        assert_eq!(get(&r, &USER, "trusted.overlay.opaque"), Err(Errno::NODATA));
        assert!(r.listed(&ROOT, b"trusted.overlay.opaque"));
        assert!(!r.listed(&USER, b"trusted.x"));
    }

    #[test]
    fn a_stack_hides_and_refuses_overlayfs_names() {
        let none = Absent {
            unlabelled: true,
            aclless: true,
            xattrless: false,
        };
        let r = Rules::read_only(true, none);
        assert_eq!(get(&r, &ROOT, "trusted.overlay.x"), Err(Errno::OPNOTSUPP));
        assert!(!r.listed(&ROOT, b"trusted.overlay.x"));
        assert_eq!(get(&r, &USER, "security.selinux"), Err(Errno::OPNOTSUPP));
        assert_eq!(
            get(&r, &USER, "system.posix_acl_access"),
            Err(Errno::OPNOTSUPP)
        );
        // Hidden from the caller comes first.
        assert_eq!(get(&r, &USER, "trusted.x"), Err(Errno::NODATA));
    }

    #[test]
    fn a_writable_mount_keeps_its_markers_and_overrides() {
        let r = Rules::writable();
        assert_eq!(get(&r, &USER, "user.overlay.opaque"), Err(Errno::OPNOTSUPP));
        assert_eq!(
            get(&r, &ROOT, "trusted.overlay.opaque"),
            Err(Errno::OPNOTSUPP)
        );
        assert!(!r.listed(&ROOT, b"user.overlay.opaque"));
        assert!(!r.copied_up(b"user.overlay.opaque"));
        assert_eq!(r.may_change(5, b"user.overlay.x"), Err(Errno::PERM));
        assert_eq!(get(&r, &USER, OVERRIDE_XATTR), Err(Errno::NODATA));
        assert_eq!(get(&r, &USER, "security.selinux"), Ok(None));
        assert_eq!(
            r.may_change(5, b"user.containers.override_x"),
            Err(Errno::PERM)
        );
        assert_eq!(r.may_change(1, STATS_XATTR), Err(Errno::PERM));
        assert_eq!(r.may_change(5, b"user.a"), Ok(()));
        assert!(!r.copied_up(b"trusted.overlay.redirect"));
    }

    #[test]
    fn images_without_xattrs_answer_enosys_to_everything() {
        let none = Absent {
            unlabelled: true,
            aclless: true,
            xattrless: true,
        };
        let r = Rules::read_only(false, none);
        assert_eq!(r.any(), Err(Errno::NOSYS));
        for name in ["user.x", "security.selinux", "trusted.x", "verilay.stats"] {
            assert_eq!(get(&r, &ROOT, name), Err(Errno::NOSYS), "{name}");
            let stats = r.get(&ROOT, 1, name.as_bytes(), || b"{}".to_vec());
            assert_eq!(stats, Err(Errno::NOSYS), "{name} of the root");
        }
        assert_eq!(Rules::writable().any(), Ok(()));
        assert_eq!(Rules::read_only(true, Absent::default()).any(), Ok(()));
    }

    #[test]
    fn the_root_answers_stats() {
        let r = Rules::read_only(false, Absent::default());
        let v = r.get(&USER, 1, STATS_XATTR, || b"{}".to_vec());
        assert_eq!(v, Ok(Some(b"{}".to_vec())));
    }
}
