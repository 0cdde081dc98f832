//! verilay's per-file fs-verity digests (the table at the end of the EROFS area, see
//! `format::DigestFooter`): a binary search by nid, never a read of the file's data.

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
        let Some(f) = self.digest_table()? else {
            return Ok(None);
        };
        let (mut lo, mut hi) = (0u64, f.entries);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let at = f.table_offset + mid * DIGEST_ENTRY_SIZE;
            let mut e = [0u8; DIGEST_ENTRY_SIZE as usize];
            self.read_at(&mut e, at, || "file digest table entry".into())?;
            let got = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
            match got.cmp(&nid) {
                std::cmp::Ordering::Equal => {
                    return Ok(Some(e[8..].try_into().expect("32 bytes")));
                }
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        Ok(None)
    }
}
