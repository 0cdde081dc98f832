//! Extended attributes (kernel `xattr.c`): the inline body after the inode, shared entries
//! by id, long name prefixes, and the name bloom filter (docs/FORMAT.md, "Xattr bodies").
//!
//! - Lookup and listing order is the kernel's: inline entries, then shared ones by id order.

use std::ops::ControlFlow;

use super::{corrupt, unsupported, ByteSource, Image, Inode, Result};
use crate::format::{self, XattrEntry, XATTR_ENTRY_HEADER_SIZE, XATTR_IBODY_HEADER_SIZE};

/// One stored entry, as found.
struct RawXattr<'a> {
    /// `e_name_index` as stored (bit 7 = long prefix).
    index: u8,
    name: &'a [u8],
    /// The value, when the walk was asked for values (shared values are otherwise not read).
    value: &'a [u8],
    /// Where the value lives and how long it is (checked to lie inside the image).
    value_off: u64,
    value_size: u16,
    /// Byte offset of the entry header, for messages.
    offset: u64,
}

/// One visible xattr with its name split the way the filter hashes it.
pub(crate) struct Xattr {
    /// Short prefix index (the base index for long-prefix entries).
    pub index: u8,
    /// Name after the short prefix (infix + stored name for long-prefix entries).
    pub suffix: Vec<u8>,
    pub value: Vec<u8>,
    pub offset: u64,
}

impl Xattr {
    pub fn full_name(&self) -> Vec<u8> {
        let mut n = format::xattr_prefix(self.index)
            .unwrap_or("")
            .as_bytes()
            .to_vec();
        n.extend_from_slice(&self.suffix);
        n
    }
}

impl<S: ByteSource> Image<S> {
    /// Value of xattr `name` (full name, e.g. `user.foo`), or `None` when absent.
    ///
    /// With a trusted filter, a set bit for the name answers "absent" from the header read
    /// together with the inode: no body read, no scan (the `ls -lR` ACL probe case).
    pub fn getxattr(&self, inode: &Inode, name: &[u8]) -> Result<Option<Vec<u8>>> {
        // Most inodes have no xattrs: answer before even parsing the name.
        if inode.xattr_icount == 0 {
            return Ok(None);
        }
        // Names without a kernel handler can never be found.
        let Some((index, suffix)) = format::split_xattr_name(name) else {
            return Ok(None);
        };
        let Some((filter, _)) = self.xattr_header(inode)? else {
            return Ok(None);
        };
        if self.xattr_filter_enabled()
            && filter & (1 << format::xattr_filter_bit(index, suffix)) != 0
        {
            return Ok(None);
        }
        // Match on names only; read just the one value asked for.
        let mut found = None;
        self.walk_xattrs(inode, false, &mut |x| {
            if self.entry_matches(x.index, x.name, index, suffix) {
                found = Some((x.value_off, x.value_size));
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        let Some((off, size)) = found else {
            return Ok(None);
        };
        let mut value = vec![0u8; usize::from(size)];
        self.read_at(&mut value, off, || {
            format!("inode {}: xattr value", inode.nid)
        })?;
        Ok(Some(value))
    }

    /// Full names, inline entries first then shared (kernel order). Entries the kernel would
    /// not show (unknown prefix index, long prefix out of range) are skipped like it does.
    pub fn listxattr(&self, inode: &Inode) -> Result<Vec<Vec<u8>>> {
        let mut names = Vec::new();
        self.walk_xattrs(inode, false, &mut |x| {
            if let Some((index, suffix)) = self.resolve(x.index, x.name) {
                let mut n = format::xattr_prefix(index)
                    .unwrap_or("")
                    .as_bytes()
                    .to_vec();
                n.extend_from_slice(&suffix);
                names.push(n);
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(names)
    }

    /// All visible (name, value) pairs in `listxattr` order.
    pub fn xattrs(&self, inode: &Inode) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(self
            .xattr_list(inode, true)?
            .into_iter()
            .map(|x| (x.full_name(), x.value))
            .collect())
    }

    /// Whether the inode's filter says `name` is absent (false when there is no filter).
    pub fn xattr_filter_says_absent(&self, inode: &Inode, name: &[u8]) -> bool {
        match inode.xattr_header {
            Some((filter, _)) if inode.xattr_icount > 1 && self.xattr_filter_enabled() => {
                let Some((index, suffix)) = format::split_xattr_name(name) else {
                    return false;
                };
                filter & (1 << format::xattr_filter_bit(index, suffix)) != 0
            }
            _ => false,
        }
    }

    /// Visible xattrs; values are left empty unless `values`.
    pub(crate) fn xattr_list(&self, inode: &Inode, values: bool) -> Result<Vec<Xattr>> {
        let mut out = Vec::new();
        self.walk_xattrs(inode, values, &mut |x| {
            if let Some((index, suffix)) = self.resolve(x.index, x.name) {
                out.push(Xattr {
                    index,
                    suffix,
                    value: x.value.to_vec(),
                    offset: x.offset,
                });
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }

    /// (filter, shared count) of the body, `None` without a body. Mirrors the kernel's
    /// `erofs_init_inode_xattrs`: a header-only body (icount 1) is "not supported yet", and
    /// the shared id array must fit inside the body (2026 hardening).
    fn xattr_header(&self, inode: &Inode) -> Result<Option<(u32, u8)>> {
        let nid = inode.nid;
        match inode.xattr_icount {
            0 => Ok(None),
            1 => unsupported(
                inode.xattr_off,
                format!("inode {nid}: xattr body with only a header (icount 1)"),
            ),
            _ => {
                let Some((filter, shared)) = inode.xattr_header else {
                    return corrupt(
                        inode.xattr_off,
                        format!("inode {nid}: xattr header missing"),
                    );
                };
                let need = XATTR_IBODY_HEADER_SIZE as u64 + 4 * u64::from(shared);
                if need > inode.xattr_size {
                    return corrupt(
                        inode.xattr_off,
                        format!(
                            "inode {nid}: {shared} shared xattr ids do not fit in a {}-byte body",
                            inode.xattr_size
                        ),
                    );
                }
                Ok(Some((filter, shared)))
            }
        }
    }

    /// Calls `f` on every stored entry, inline first, then shared; stops on `Break`. Shared
    /// values (up to 255 × 64 KiB per inode) are only read when `values` is set.
    fn walk_xattrs(
        &self,
        inode: &Inode,
        values: bool,
        f: &mut dyn FnMut(RawXattr<'_>) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        let Some((_, shared)) = self.xattr_header(inode)? else {
            return Ok(());
        };
        let nid = inode.nid;
        // icount ≤ 65535 → at most 12 + 4 * 65534 bytes: a bounded allocation.
        let mut body = vec![0u8; inode.xattr_size as usize];
        self.read_at(&mut body, inode.xattr_off, || {
            format!("inode {nid}: xattr body")
        })?;
        let ids_end = XATTR_IBODY_HEADER_SIZE + 4 * usize::from(shared);
        let mut pos = ids_end;
        while pos < body.len() {
            let at = inode.xattr_off + pos as u64;
            let rest = body.get(pos..).unwrap_or(&[]);
            let Some(hdr) = rest.first_chunk() else {
                return corrupt(
                    at,
                    format!(
                        "inode {nid}: {} trailing bytes in the xattr body",
                        rest.len()
                    ),
                );
            };
            let e = XattrEntry::decode(hdr);
            // The kernel rejects an entry that runs past the body (EFSCORRUPTED).
            if e.size() > rest.len() {
                return corrupt(
                    at,
                    format!(
                        "inode {nid}: xattr entry of {} bytes overflows the body ({} bytes left)",
                        e.size(),
                        rest.len()
                    ),
                );
            }
            let name_end = XATTR_ENTRY_HEADER_SIZE + usize::from(e.name_len);
            let value_end = name_end + usize::from(e.value_size);
            let x = RawXattr {
                index: e.name_index,
                name: rest.get(XATTR_ENTRY_HEADER_SIZE..name_end).unwrap_or(&[]),
                value: rest.get(name_end..value_end).unwrap_or(&[]),
                value_off: at + name_end as u64,
                value_size: e.value_size,
                offset: at,
            };
            if f(x)?.is_break() {
                return Ok(());
            }
            pos += e.size();
        }
        for i in 0..usize::from(shared) {
            let p = XATTR_IBODY_HEADER_SIZE + 4 * i;
            let id = body
                .get(p..p + 4)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            // xattr_base < 2^48 and 4 * id < 2^34: cannot overflow.
            let at = self.xattr_base + 4 * u64::from(id);
            let mut hdr = [0u8; XATTR_ENTRY_HEADER_SIZE];
            self.read_at(&mut hdr, at, || {
                format!("inode {nid}: shared xattr id {id}")
            })?;
            let e = XattrEntry::decode(&hdr);
            let name_off = at + XATTR_ENTRY_HEADER_SIZE as u64;
            let value_off = name_off + u64::from(e.name_len);
            // Checked even when not read, so listing and getting agree on what is corrupt.
            self.check_range(value_off, u64::from(e.value_size), || {
                format!("inode {nid}: shared xattr id {id} value")
            })?;
            // name ≤ 255 and value ≤ 65535 bytes: bounded by the header's field widths.
            let value_len = if values { usize::from(e.value_size) } else { 0 };
            let mut nv = vec![0u8; usize::from(e.name_len) + value_len];
            self.read_at(&mut nv, name_off, || {
                format!("inode {nid}: shared xattr id {id}")
            })?;
            let (name, value) = nv.split_at(usize::from(e.name_len));
            let x = RawXattr {
                index: e.name_index,
                name,
                value,
                value_off,
                value_size: e.value_size,
                offset: at,
            };
            if f(x)?.is_break() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// (short index, name after the short prefix) of a stored entry, or `None` if the kernel
    /// has no handler for it (it then neither lists nor finds it).
    fn resolve(&self, stored_index: u8, name: &[u8]) -> Option<(u8, Vec<u8>)> {
        if stored_index & format::XATTR_LONG_PREFIX != 0 {
            let p = self
                .prefixes
                .get(usize::from(stored_index & format::XATTR_LONG_PREFIX_MASK))?;
            format::xattr_prefix(p.base_index)?;
            let mut suffix = p.infix.clone();
            suffix.extend_from_slice(name);
            Some((p.base_index, suffix))
        } else {
            format::xattr_prefix(stored_index)?;
            Some((stored_index, name.to_vec()))
        }
    }

    /// Kernel `erofs_xattr_entrymatch`, without allocating.
    fn entry_matches(&self, stored_index: u8, name: &[u8], index: u8, suffix: &[u8]) -> bool {
        if stored_index & format::XATTR_LONG_PREFIX != 0 {
            let Some(p) = self
                .prefixes
                .get(usize::from(stored_index & format::XATTR_LONG_PREFIX_MASK))
            else {
                return false;
            };
            p.base_index == index && suffix.strip_prefix(p.infix.as_slice()) == Some(name)
        } else {
            stored_index == index && suffix == name
        }
    }
}
