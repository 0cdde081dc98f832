//! Per-file fs-verity digests. The image's table (docs/FORMAT.md, "File-digest table") only
//! *claims* them: a digest is handed out only once checked ([`Image::file_digest`]) against
//! the image tree's level-0 hashes of the file (1/128 of its size), not its data. Lookups
//! by nid read the footer and each group's first nid once, then one group (≤ 4 KiB) each.

use super::{corrupt, ByteSource, Error, Image, Inode, Result};
use crate::format::{raw, DigestFooter, DIGEST_ENTRY_SIZE, DIGEST_FOOTER_SIZE};
use verity::TreeStream;
use zerocopy::little_endian::U64;
use zerocopy::IntoBytes;

/// fs-verity's block size for file digests (and the image tree's).
const VERITY_BLOCK: u64 = 4096;

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

    /// True when the image records that it holds no xattr at all (its namespace word is
    /// zero); false when it holds one or does not say.
    pub fn records_no_xattr(&self) -> Result<bool> {
        Ok(self.digest_table()?.and_then(|f| f.namespaces) == Some(0))
    }

    /// The fs-verity digest (SHA-256, 4 KiB blocks, no salt) of regular file `ino`, computed
    /// from its contents and, when the image has a digest table, equal to the table's
    /// claim: a missing or different claim is `Corrupt` at the claim's place.
    pub fn file_digest(&self, ino: &Inode) -> Result<[u8; 32]> {
        let digest = self.content_digest(ino)?;
        self.check_claim(ino, digest)?;
        Ok(digest)
    }

    /// `digest` (the contents' own) against the table's claim for `ino`, if the image
    /// has a table: a missing or different claim is `Corrupt` at the claim's place.
    pub(crate) fn check_claim(&self, ino: &Inode, digest: [u8; 32]) -> Result<()> {
        let Some(footer) = self.digest_table()? else {
            return Ok(());
        };
        match self.claimed_file_digest(ino.nid)? {
            Some((claim, _)) if claim == digest => Ok(()),
            Some((claim, at)) => corrupt(
                at,
                format!(
                    "the file digest table claims sha256:{} for inode {}, whose contents have sha256:{}",
                    verity::verified::hex(&claim),
                    ino.nid,
                    verity::verified::hex(&digest)
                ),
            ),
            None => corrupt(
                footer.table_offset,
                format!("the file digest table has no entry for regular file inode {}", ino.nid),
            ),
        }
    }

    /// The fs-verity digest of regular file `ino`'s contents as this image serves them.
    /// Whole 4 KiB blocks at 4 KiB-aligned image offsets take their hash from the
    /// source's checked tree when it has one (no data read); holes cost nothing per block;
    /// the rest (inline tails, short last blocks, images with smaller blocks) is read
    /// through the source, which checks it, and hashed here.
    pub fn content_digest(&self, ino: &Inode) -> Result<[u8; 32]> {
        let mut unbounded = u64::MAX;
        let digest = self.content_digest_within(ino, &mut unbounded)?;
        Ok(digest.expect("an unbounded budget never runs out"))
    }

    /// [`Image::content_digest`] for at most `budget` units of work (one per block hashed
    /// or taken from the tree, one per run of holes), taken from `budget`; `None` when it
    /// runs out: files sharing the same blocks could otherwise multiply the work of a
    /// check of a whole image without limit, while holes cost almost nothing.
    pub(crate) fn content_digest_within(
        &self,
        ino: &Inode,
        budget: &mut u64,
    ) -> Result<Option<[u8; 32]>> {
        const BS: u64 = VERITY_BLOCK;
        let mut spend = |n: u64| -> bool {
            match budget.checked_sub(n) {
                Some(left) => {
                    *budget = left;
                    true
                }
                None => false,
            }
        };
        let params = verity::Params::new(verity::HashAlg::Sha256, BS as u32, Vec::new())
            .expect("valid parameters");
        let mut tree = TreeStream::new(&params);
        let mut block = vec![0u8; BS as usize];
        let size = ino.size;
        // Always a multiple of BS: the start of the next file block to hash.
        let mut pos = 0u64;
        while pos < size {
            let ext = self.map(ino, pos)?;
            let ext_end = ext.logical.saturating_add(ext.len).min(size);
            if ext.logical > pos || ext_end <= pos {
                return corrupt(
                    self.inode_offset(ino.nid),
                    format!("inode {}: no extent maps file offset {pos}", ino.nid),
                );
            }
            let before = pos;
            // Compressed bytes are not the file's: their block hashes are no use here, each
            // block goes the slow way below.
            match ext.physical.filter(|_| !ext.encoded) {
                _ if ext.encoded => {}
                None => {
                    // A hole's whole blocks, and the file's short last block when the
                    // hole reaches the end (fs-verity pads it with zeros anyway).
                    let mut n = (ext_end - pos) / BS;
                    if ext_end == size && !(ext_end - pos).is_multiple_of(BS) {
                        n += 1;
                    }
                    if !spend(1) {
                        return Ok(None);
                    }
                    tree.push_zeros(n);
                    pos = pos.saturating_add(n * BS);
                }
                Some(phys) => {
                    while pos + BS <= ext_end {
                        let at = phys + (pos - ext.logical);
                        if !at.is_multiple_of(BS) {
                            break;
                        }
                        let hash = self
                            .src
                            .block_hash(at)
                            .map_err(|err| Error::Io { offset: at, err })?;
                        let Some(hash) = hash else { break };
                        if !spend(1) {
                            return Ok(None);
                        }
                        tree.push(&hash);
                        pos += BS;
                    }
                }
            }
            if pos != before {
                continue;
            }
            // One block the slow way: read (the source checks it), zero-pad, hash.
            if !spend(1) {
                return Ok(None);
            }
            let n = BS.min(size - pos) as usize;
            block.fill(0);
            if self.read(ino, pos, &mut block[..n])? != n {
                return corrupt(
                    self.inode_offset(ino.nid),
                    format!("inode {}: short read at file offset {pos}", ino.nid),
                );
            }
            let mut hash = [0u8; 32];
            params.alg.hash_into(&[], &block, &mut hash);
            tree.push(&hash);
            pos += BS;
        }
        Ok(Some(tree.digest(size).try_into().expect("32 bytes")))
    }

    /// What the image's digest table claims for regular file `nid`, and where the entry
    /// lies; `None` if the image has no table or no entry for it. Unchecked: see
    /// [`Image::file_digest`].
    pub fn claimed_file_digest(&self, nid: u64) -> Result<Option<([u8; 32], u64)>> {
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
        let mut entries = [raw::DigestEntry::default(); GROUP as usize];
        let entries = &mut entries[..count];
        let group = entries.as_mut_bytes();
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
        let (mut lo, mut hi) = (0, count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match entries[mid].nid.get().cmp(&nid) {
                std::cmp::Ordering::Equal => {
                    let digest = entries[mid].digest;
                    return Ok(Some((digest, at + mid as u64 * DIGEST_ENTRY_SIZE)));
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
                    let mut nid = U64::ZERO;
                    let at = footer.table_offset + g * GROUP * DIGEST_ENTRY_SIZE;
                    let at = at + core::mem::offset_of!(raw::DigestEntry, nid) as u64;
                    self.read_at(nid.as_mut_bytes(), at, || "file digest table entry".into())?;
                    firsts.push(nid.get());
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
