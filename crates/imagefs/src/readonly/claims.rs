//! The images' namespace record, checked: a record that says no layer holds a
//! `security.*` xattr (or an ACL, or any xattr at all) has the mount answer those names
//! EOPNOTSUPP and leave ACLs off (or answer GETXATTR and LISTXATTR with ENOSYS); each
//! inode handed to the kernel is checked against it first, and against its place in the
//! tree.

use super::{About, ImageFs};
use crate::ops::Errno;
use crate::stack::{Obj, Resolved, Stack};
use erofs::read::{ByteSource, Image, Inode};

pub(super) use crate::xattrs::Absent as Record;

/// What every layer records as absent. Unreadable (a block of the table that fails its
/// hash) fails the mount: the footer is read here, so this is the read that meets it.
/// The footer is one block the mount reads anyway (a remote image's too): knowing costs
/// no scan of the inodes.
pub(super) fn absent_namespaces<S: ByteSource>(
    layers: &[Image<S>],
) -> Result<Record, erofs::read::Error> {
    let everywhere = |absent: &dyn Fn(&Image<S>) -> erofs::read::Result<bool>| {
        for img in layers {
            if !absent(img)? {
                return Ok::<_, erofs::read::Error>(false);
            }
        }
        Ok(true)
    };
    let ns = |index: u8| move |img: &Image<S>| img.namespace_absent(index);
    Ok(Record {
        unlabelled: everywhere(&ns(erofs::format::XATTR_INDEX_SECURITY))?,
        aclless: everywhere(&ns(erofs::format::XATTR_INDEX_POSIX_ACL_ACCESS))?
            && everywhere(&ns(erofs::format::XATTR_INDEX_POSIX_ACL_DEFAULT))?,
        xattrless: everywhere(&|img: &Image<S>| img.records_no_xattr())?,
    })
}

/// The root, checked against the record before mounting: a false record there is no
/// mount (`name` is the mount's, for the error).
pub(super) fn check_root<S: ByteSource>(
    stack: &Stack<S>,
    root: &Resolved,
    record: Record,
    name: &str,
) -> Result<(), erofs::read::Error> {
    let img = stack.image(root.top.layer);
    let Some(hidden) = hidden_xattr(img, &root.inode, record)? else {
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
    /// record has the mount serve it: with ACLs off, it must have none, answering
    /// `security.*` with EOPNOTSUPP, it must have no such name, and answering ENOSYS to
    /// every xattr request, no xattr at all. The ACL names are asked
    /// as the kernel's erofs asks them (through the inode's name filter), so a filter
    /// that lies too hides the ACL from both alike; `security.*` names are listed. A
    /// false record is EIO for that inode and one log line: the image lies about itself.
    /// Images recording every namespace present (or none) pay nothing here.
    pub(super) fn check_claims(&self, o: Obj, i: &Inode, about: About<'_>) -> Result<(), Errno> {
        match hidden_xattr(self.image(o), i, self.record) {
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

    /// Checks a stack's entry `name` of the merged directory `dir` (listed unchecked).
    pub(super) fn check_merged(&self, dir: u64, name: &[u8], r: &Resolved) -> Result<(), Errno> {
        let about = About::entry(dir, name, Some(r.top));
        self.stack
            .check_resolved(name, r)
            .map_err(|e| self.fail("lookup", about, e))?;
        self.check_claims(r.top, &r.inode, about)
    }
}

/// An xattr of inode `i` in a namespace the image records as absent (any, when
/// `xattrless`; ACLs when `aclless`; `security.*` when `unlabelled`), if it has one; see
/// `ImageFs::check_claims`.
fn hidden_xattr<S: ByteSource>(
    img: &Image<S>,
    i: &Inode,
    record: Record,
) -> Result<Option<Vec<u8>>, erofs::read::Error> {
    let Record {
        unlabelled,
        aclless,
        xattrless,
    } = record;
    // A header-only body (icount 1) holds nothing (the kernel answers EOPNOTSUPP).
    if !(aclless || unlabelled || xattrless) || i.xattr_icount <= 1 {
        return Ok(None);
    }
    if aclless {
        for acl in [ACL_ACCESS, ACL_DEFAULT] {
            if img.getxattr(i, acl)?.is_some() {
                return Ok(Some(acl.to_vec()));
            }
        }
    }
    if unlabelled || xattrless {
        let names = img.listxattr(i)?;
        let hidden = |n: &Vec<u8>| xattrless || n.starts_with(b"security.");
        if let Some(n) = names.into_iter().find(hidden) {
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
