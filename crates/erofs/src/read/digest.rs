//! verilay's per-file fs-verity digests (the table at the end of the EROFS area, see
//! `format::DigestFooter`): a search by nid, never a read of the file's data. The first
//! lookup reads the footer and the first nid of every group of entries; each lookup then
//! reads one group (at most 4 KiB), so a measured open costs one read, not a dozen.

use super::{corrupt, ByteSource, Error, Image, Result};
use crate::format::{DigestFooter, DIGEST_ENTRY_SIZE, DIGEST_FOOTER_SIZE};

impl<S: ByteSource> Image<S> {
    /// Bytes of the EROFS area by the superblock's block count (the image may be followed
    /// by other data, such as a verity section).
    pub fn erofs_len(&self) -> u64 {
        u64::from(self.sb.blocks) << self.blkbits
    }

    /// The digest table's footer, `None` for images built without one.
    pub fn digest_table(&self) -> Result<Option<DigestFooter>> {
        let end = self.erofs_len();
        if end < DIGEST_FOOTER_SIZE || end > self.len {
            return Ok(None);
        }
        let at = end - DIGEST_FOOTER_SIZE;
        let mut raw = [0u8; DIGEST_FOOTER_SIZE as usize];
        self.read_at(&mut raw, at, || "file digest table footer".into())?;
        let Some(f) =
            DigestFooter::decode(&raw).map_err(|what| Error::Corrupt { offset: at, what })?
        else {
            return Ok(None);
        };
        let fits = f
            .entries
            .checked_mul(DIGEST_ENTRY_SIZE)
            .and_then(|n| n.checked_add(f.table_offset))
            .is_some_and(|table_end| table_end <= at);
        if !fits {
            return corrupt(
                at,
                format!(
                    "digest table of {} entries at byte {} overruns its footer",
                    f.entries, f.table_offset
                ),
            );
        }
        Ok(Some(f))
    }

    /// True when the image records that no xattr of short name index `index` (e.g.
    /// `XATTR_INDEX_SECURITY`) occurs anywhere in it; false when unknown.
    pub fn namespace_absent(&self, index: u8) -> Result<bool> {
        let ns = self.digest_table()?.and_then(|f| f.namespaces);
        Ok(ns.is_some_and(|m| m & 1u32.checked_shl(index.into()).unwrap_or(0) == 0))
    }

    /// The stored fs-verity digest (SHA-256, 4 KiB blocks, no salt) of regular file `nid`;
    /// `None` if the image has no table or no entry for it.
    pub fn file_digest(&self, nid: u64) -> Result<Option<[u8; 32]>> {
        let Some(ix) = self.digest_index()? else {
            return Ok(None);
        };
        // The last group starting at or below `nid`.
        let Some(g) = ix
            .firsts
            .partition_point(|&first| first <= nid)
            .checked_sub(1)
        else {
            return Ok(None);
        };
        let start = g as u64 * GROUP;
        let count = GROUP.min(ix.footer.entries - start) as usize;
        let mut buf = [0u8; (GROUP * DIGEST_ENTRY_SIZE) as usize];
        let group = &mut buf[..count * DIGEST_ENTRY_SIZE as usize];
        let at = ix.footer.table_offset + start * DIGEST_ENTRY_SIZE;
        // In pieces that each stay inside one 4 KiB block: a verified source keeps its
        // checked copy of such blocks, and re-hashes reads that span two.
        let mut done = 0;
        while done < group.len() {
            let here = at + done as u64;
            let piece = (group.len() - done).min((4096 - here % 4096) as usize);
            self.read_at(&mut group[done..done + piece], here, || {
                "file digest table entries".into()
            })?;
            done += piece;
        }
        let entry =
            |i: usize| &group[i * DIGEST_ENTRY_SIZE as usize..][..DIGEST_ENTRY_SIZE as usize];
        let nid_of = |i: usize| u64::from_le_bytes(entry(i)[..8].try_into().expect("8 bytes"));
        let (mut lo, mut hi) = (0, count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match nid_of(mid).cmp(&nid) {
                std::cmp::Ordering::Equal => {
                    return Ok(Some(entry(mid)[8..].try_into().expect("32 bytes")));
                }
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        Ok(None)
    }

    /// The table's footer and each group's first nid, read on first use; an error is
    /// not kept (the next lookup tries again).
    fn digest_index(&self) -> Result<Option<&DigestIndex>> {
        if let Some(ix) = self.digest_index.get() {
            return Ok(ix.as_ref());
        }
        let ix = match self.digest_table()? {
            None => None,
            Some(footer) => {
                let mut firsts = Vec::with_capacity(footer.entries.div_ceil(GROUP) as usize);
                for g in 0..footer.entries.div_ceil(GROUP) {
                    let mut e = [0u8; 8];
                    let at = footer.table_offset + g * GROUP * DIGEST_ENTRY_SIZE;
                    self.read_at(&mut e, at, || "file digest table entry".into())?;
                    firsts.push(u64::from_le_bytes(e));
                }
                Some(DigestIndex { footer, firsts })
            }
        };
        Ok(self.digest_index.get_or_init(|| ix).as_ref())
    }
}

/// Entries per group: as many as fit in 4 KiB.
const GROUP: u64 = 4096 / DIGEST_ENTRY_SIZE;

#[derive(Debug)]
pub(crate) struct DigestIndex {
    footer: DigestFooter,
    /// The nid of the first entry of each group of `GROUP` entries.
    firsts: Vec<u64>,
}
