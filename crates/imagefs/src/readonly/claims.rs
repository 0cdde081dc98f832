//! The images' namespace record, checked: a record that says no layer holds a
//! `security.*` xattr (or an ACL) has the mount answer those names EOPNOTSUPP and leave
//! ACLs off; each inode handed to the kernel is checked against it first, and against
//! its place in the tree.

use super::{About, ImageFs};
use crate::ops::Errno;
use crate::stack::{Dir, Obj, Resolved, Stack};
use erofs::read::{ByteSource, Image, Inode};

/// Whether every layer records that it holds no `security.*` xattr, and no ACL.
/// Unrecorded means "maybe labelled": per-inode answers. Unreadable (a block of the
/// table that fails its hash) fails the mount: the footer is read here, so this is the
/// read that meets it.
pub(super) fn absent_namespaces<S: ByteSource>(
    layers: &[Image<S>],
) -> Result<(bool, bool), erofs::read::Error> {
    let absent_everywhere = |ns: u8| -> Result<bool, erofs::read::Error> {
        for img in layers {
            if !img.namespace_absent(ns)? {
                return Ok(false);
            }
        }
        Ok(true)
    };
    let unlabelled = absent_everywhere(erofs::format::XATTR_INDEX_SECURITY)?;
    let aclless = absent_everywhere(erofs::format::XATTR_INDEX_POSIX_ACL_ACCESS)?
        && absent_everywhere(erofs::format::XATTR_INDEX_POSIX_ACL_DEFAULT)?;
    Ok((unlabelled, aclless))
}

/// The root, checked against the record (`unlabelled`, `aclless`) before mounting: a
/// false record there is no mount (`name` is the mount's, for the error).
pub(super) fn check_root<S: ByteSource>(
    stack: &Stack<S>,
    root: &Resolved,
    (unlabelled, aclless): (bool, bool),
    name: &str,
) -> Result<(), erofs::read::Error> {
    let img = stack.image(root.top.layer);
    let Some(hidden) = hidden_xattr(img, &root.inode, aclless, unlabelled)? else {
        return Ok(());
    };
    let overlay = stack.layers.len() > 1;
    Err(erofs::read::Error::Corrupt {
        offset: root.inode.offset(),
        what: format!(
            "{name}: {}",
            false_record(root.top, &root.inode, &hidden, overlay)
        ),
    })
}

impl<S: ByteSource + 'static> ImageFs<S> {
    /// Whether inode `i` of `o` may be handed to the kernel as the image's namespace
    /// record has the mount serve it: with ACLs off, it must have none, and answering
    /// `security.*` with EOPNOTSUPP, it must have no such name. The ACL names are asked
    /// as the kernel's erofs asks them (through the inode's name filter), so a filter
    /// that lies too hides the ACL from both alike; `security.*` names are listed. A
    /// false record is EIO for that inode and one log line: the image lies about itself.
    /// Images recording every namespace present (or none) pay nothing here.
    pub(super) fn check_claims(&self, o: Obj, i: &Inode, about: About<'_>) -> Result<(), Errno> {
        match hidden_xattr(self.image(o), i, self.aclless, self.unlabelled) {
            Ok(None) => Ok(()),
            Ok(Some(name)) => {
                let what = false_record(o, i, &name, self.overlay);
                (self.log)(&format!("{}: {what}", self.name));
                Err(Errno::IO)
            }
            Err(e) => Err(self.fail("xattrs", about, e)),
        }
    }

    /// Checks a single image's entry `name` of directory `dir` (its place, and what the
    /// namespace record says of it) before the kernel learns it.
    pub(super) fn check_entry(
        &self,
        dir: u64,
        name: &[u8],
        o: Obj,
        i: &Inode,
    ) -> Result<(), Errno> {
        let about = About::entry(dir, name, Some(o));
        self.stack
            .check_placement(o.layer, self.obj(dir)?.nid, name, i)
            .map_err(|e| self.fail("lookup", about, e))?;
        self.check_claims(o, i, about)
    }

    /// Checks a stack's entry `name` of the merged directory `dir` (whose layers'
    /// directories are `chain`; listed unchecked).
    pub(super) fn check_merged(
        &self,
        dir: u64,
        chain: &[Dir],
        name: &[u8],
        r: &Resolved,
    ) -> Result<(), Errno> {
        let about = About::entry(dir, name, Some(r.top));
        self.stack
            .check_resolved(chain, name, r)
            .map_err(|e| self.fail("lookup", about, e))?;
        self.check_claims(r.top, &r.inode, about)
    }
}

/// An xattr of inode `i` in a namespace the image records as absent (ACLs when
/// `aclless`, `security.*` when `unlabelled`), if it has one; see `ImageFs::check_claims`.
fn hidden_xattr<S: ByteSource>(
    img: &Image<S>,
    i: &Inode,
    aclless: bool,
    unlabelled: bool,
) -> Result<Option<Vec<u8>>, erofs::read::Error> {
    // A header-only body (icount 1) holds nothing (the kernel answers EOPNOTSUPP).
    if !(aclless || unlabelled) || i.xattr_icount <= 1 {
        return Ok(None);
    }
    if aclless {
        for acl in [ACL_ACCESS, ACL_DEFAULT] {
            if img.getxattr(i, acl)?.is_some() {
                return Ok(Some(acl.to_vec()));
            }
        }
    }
    if unlabelled {
        let names = img.listxattr(i)?;
        if let Some(n) = names.into_iter().find(|n| n.starts_with(b"security.")) {
            return Ok(Some(n));
        }
    }
    Ok(None)
}

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// The log line (after the image's name) for inode `i` of `o` holding `xattr` in a
/// namespace its image records as absent.
fn false_record(o: Obj, i: &Inode, xattr: &[u8], overlay: bool) -> String {
    let layer = if overlay {
        format!("layer {}: ", o.layer)
    } else {
        String::new()
    };
    format!(
        "{layer}inode {} (byte {}) has xattr {}, a namespace the image's footer records as absent: refused (the image's record is false)",
        i.nid,
        i.offset(),
        String::from_utf8_lossy(xattr)
    )
}
