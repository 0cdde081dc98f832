//! Superblock validation and the long xattr name prefix table (kernel `super.c`).

use super::{corrupt, unsupported, ByteSource, Error, Result};
use crate::format::{self, raw, Superblock};
use core::mem::offset_of;
use zerocopy::little_endian::U16;
use zerocopy::IntoBytes;

/// Largest superblock (base + extension slots) the kernel accepts: it must fit in the page
/// that holds offset 1024 (`PAGE_SIZE - EROFS_SUPER_OFFSET` on 4 KiB pages).
const MAX_SB_SIZE: u64 = 4096 - format::SUPER_OFFSET;
/// Block sizes we accept: 512 B .. 64 KiB (the kernel's upper limit is PAGE_SHIFT).
const MIN_BLKSZBITS: u8 = 9;
const MAX_BLKSZBITS: u8 = 16;

/// One record of the long prefix table: a short prefix index plus an infix, e.g.
/// (`trusted.`, `overlay.`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LongPrefix {
    pub base_index: u8,
    pub infix: Vec<u8>,
}

/// An opened image: the validated superblock and prefix table over a byte source.
///
/// Immutable after `open`; every method takes `&self`, so one `Image` serves many threads.
#[derive(Debug)]
pub struct Image<S: ByteSource> {
    pub(crate) src: S,
    /// Source length captured at open; every read is checked against it.
    pub(crate) len: u64,
    pub(crate) sb: Superblock,
    pub(crate) blkbits: u32,
    /// Byte offset of nid 0.
    pub(crate) meta_base: u64,
    /// Byte offset of shared xattr id 0.
    pub(crate) xattr_base: u64,
    pub(crate) prefixes: Vec<LongPrefix>,
    /// The file-digest table's footer and the first nid of each group of its entries,
    /// read once on first use (see `claimed_file_digest`).
    pub(crate) digest_index: std::sync::OnceLock<Option<super::digest::DigestIndex>>,
    /// Compression settings, and the decoded extents of compressed files.
    pub(crate) zconfig: super::zdata::ZConfig,
    pub(crate) zcache: super::zdata::ZCache,
}

impl<S: ByteSource> Image<S> {
    /// Validates the superblock like the kernel does at mount (§1.5 of the reference), parses
    /// the long prefix table and checks that the root is a directory.
    pub fn open(src: S) -> Result<Self> {
        Self::open_inner(src, true)
    }

    /// Like [`Image::open`] but without the superblock checksum, which covers all of block
    /// 0: for diagnosing an image known to be damaged (naming what a bad block held).
    pub fn open_for_diagnosis(src: S) -> Result<Self> {
        Self::open_inner(src, false)
    }

    fn open_inner(src: S, checksum: bool) -> Result<Self> {
        let len = src.len();
        let sb_off = format::SUPER_OFFSET;
        // Where a superblock field is, for error reports.
        let field = |offset: usize| sb_off + offset as u64;
        let mut bytes = [0u8; format::SUPER_SIZE];
        if len < sb_off + format::SUPER_SIZE as u64 {
            return corrupt(
                sb_off,
                format!("image is {len} bytes, too short for a superblock"),
            );
        }
        src.read_exact_at(&mut bytes, sb_off)
            .map_err(|err| Error::Io {
                offset: sb_off,
                err,
            })?;
        let (magic, sb) = Superblock::decode(&bytes);
        if magic != format::MAGIC {
            return corrupt(
                sb_off,
                format!("bad magic {magic:#010x} (expected {:#010x})", format::MAGIC),
            );
        }
        if !(MIN_BLKSZBITS..=MAX_BLKSZBITS).contains(&sb.blkszbits) {
            return unsupported(
                field(offset_of!(raw::Superblock, blkszbits)),
                format!(
                    "block size bits {} outside {MIN_BLKSZBITS}..={MAX_BLKSZBITS}",
                    sb.blkszbits
                ),
            );
        }
        // The kernel reads the whole superblock from the first page; a larger one is refused.
        let sb_size =
            format::SUPER_SIZE as u64 + format::SB_EXTSLOT_SIZE * u64::from(sb.sb_extslots);
        if sb_size > MAX_SB_SIZE {
            return corrupt(
                field(offset_of!(raw::Superblock, sb_extslots)),
                format!(
                    "superblock size {sb_size} (extslots {}) too large",
                    sb.sb_extslots
                ),
            );
        }
        // Refusing unknown incompat bits is the whole point of having them.
        let unknown = sb.feature_incompat & !format::FEATURE_INCOMPAT_SUPPORTED;
        if unknown != 0 {
            return unsupported(
                field(offset_of!(raw::Superblock, feature_incompat)),
                format!("incompatible features {unknown:#x}"),
            );
        }
        // dirblkbits != 0 would change the directory block size; no kernel implements it.
        if sb.dirblkbits != 0 {
            return unsupported(
                field(offset_of!(raw::Superblock, dirblkbits)),
                format!("dirblkbits {} (must be 0)", sb.dirblkbits),
            );
        }
        let blkbits = u32::from(sb.blkszbits);
        let bs = 1u64 << blkbits;
        if checksum && sb.feature_compat & format::FEATURE_COMPAT_SB_CHKSUM != 0 {
            check_sb_checksum(&src, len, &sb, bs)?;
        }
        let zconfig = super::zdata::read_config(&src, len, &sb)?;
        // u32 << 16 cannot overflow u64.
        let meta_base = u64::from(sb.meta_blkaddr) << blkbits;
        let xattr_base = u64::from(sb.xattr_blkaddr) << blkbits;
        let mut img = Image {
            src,
            len,
            sb,
            blkbits,
            meta_base,
            xattr_base,
            prefixes: Vec::new(),
            digest_index: std::sync::OnceLock::new(),
            zconfig,
            zcache: super::zdata::ZCache::new(),
        };
        img.prefixes = img.read_prefixes()?;
        let root = img.inode(img.root_nid())?;
        if !root.is_dir() {
            return corrupt(
                root.offset,
                format!(
                    "root inode {} is not a directory (mode {:#o})",
                    root.nid, root.mode
                ),
            );
        }
        Ok(img)
    }

    /// The decoded superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Filesystem block size, in bytes.
    pub fn block_size(&self) -> u32 {
        1 << self.blkbits
    }

    /// Nid of the root directory.
    pub fn root_nid(&self) -> u64 {
        u64::from(self.sb.root_nid)
    }

    /// Length of the image in bytes (as captured at open).
    pub fn image_len(&self) -> u64 {
        self.len
    }

    /// The byte source the image is read from.
    pub fn source(&self) -> &S {
        &self.src
    }

    /// The kernel trusts the per-inode filter only with the compat bit and a zero reserved byte
    /// (a non-zero one announces a future change of the hash).
    pub fn xattr_filter_enabled(&self) -> bool {
        self.sb.feature_compat & format::FEATURE_COMPAT_XATTR_FILTER != 0
            && self.sb.xattr_filter_reserved == 0
    }

    /// Reads exactly `buf.len()` bytes at `offset`, after checking the range against the image.
    /// `what` names the structure for the error message and is only built on failure.
    pub(crate) fn read_at(
        &self,
        buf: &mut [u8],
        offset: u64,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        let inside = offset
            .checked_add(buf.len() as u64)
            .is_some_and(|end| end <= self.len);
        if !inside {
            return corrupt(
                offset,
                format!(
                    "{} ({} bytes) extends past the end of the image ({} bytes)",
                    what(),
                    buf.len(),
                    self.len
                ),
            );
        }
        self.src
            .read_exact_at(buf, offset)
            .map_err(|err| Error::Io { offset, err })
    }

    /// Checks that `[offset, offset + len)` lies inside the image.
    pub(crate) fn check_range(
        &self,
        offset: u64,
        len: u64,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        if offset.checked_add(len).is_some_and(|end| end <= self.len) {
            Ok(())
        } else {
            corrupt(
                offset,
                format!(
                    "{} ({len} bytes) extends past the end of the image ({} bytes)",
                    what(),
                    self.len
                ),
            )
        }
    }

    /// Long prefix records: 4-aligned `le16 len, u8 base_index, infix[len - 1]`, starting at
    /// byte `xattr_prefix_start * 4` of the packed inode's data when the image has one
    /// (fragments; kernel `erofs_xattr_prefixes_init`), else of the image.
    fn read_prefixes(&self) -> Result<Vec<LongPrefix>> {
        let count = usize::from(self.sb.xattr_prefix_count);
        let packed = if count > 0
            && self.sb.feature_incompat & crate::zformat::FEATURE_INCOMPAT_FRAGMENTS != 0
            && self.sb.packed_nid != 0
        {
            Some(self.inode(self.sb.packed_nid)?)
        } else {
            None
        };
        let read_at = |buf: &mut [u8], pos: u64, what: &dyn Fn() -> String| -> Result<()> {
            let Some(p) = &packed else {
                return self.read_at(buf, pos, what);
            };
            if self.read(p, pos, buf)? != buf.len() {
                return corrupt(
                    p.offset,
                    format!("{} at byte {pos} of the packed inode: past its end", what()),
                );
            }
            Ok(())
        };
        let mut out = Vec::with_capacity(count);
        let mut pos = u64::from(self.sb.xattr_prefix_start) * 4;
        for i in 0..count {
            pos = align_up(pos, 4).ok_or_else(|| Error::Corrupt {
                offset: pos,
                what: "prefix table offset overflows".into(),
            })?;
            let mut lenb = U16::ZERO;
            read_at(lenb.as_mut_bytes(), pos, &|| {
                format!("long xattr prefix {i} length")
            })?;
            let rec_len = lenb.get();
            // Kernel: 1..=256 (base index byte + up to 255 infix bytes); 0 would have no index.
            if !(1..=256).contains(&rec_len) {
                return corrupt(
                    pos,
                    format!("long xattr prefix {i} record length {rec_len} outside 1..=256"),
                );
            }
            let body_off = pos + 2;
            let mut rec = vec![0u8; usize::from(rec_len)];
            read_at(&mut rec, body_off, &|| format!("long xattr prefix {i}"))?;
            let base_index = rec.first().copied().unwrap_or(0);
            out.push(LongPrefix {
                base_index,
                infix: rec.get(1..).unwrap_or(&[]).to_vec(),
            });
            pos = body_off + u64::from(rec_len);
        }
        Ok(out)
    }
}

/// crc32c over the rest of the block that holds the superblock (§1.2). A stale checksum is
/// exactly what makes the kernel refuse the mount, so refuse too.
fn check_sb_checksum<S: ByteSource>(src: &S, len: u64, sb: &Superblock, bs: u64) -> Result<()> {
    let sb_off = format::SUPER_OFFSET;
    let at = sb_off + offset_of!(raw::Superblock, checksum) as u64;
    let covered = if bs > sb_off { bs - sb_off } else { bs };
    let end = sb_off + covered; // ≤ 1024 + 65536
    if end > len {
        return corrupt(
            at,
            format!(
                "checksummed superblock block ends at byte {end}, past the image ({len} bytes)"
            ),
        );
    }
    let mut first = vec![0u8; end as usize];
    src.read_exact_at(&mut first, 0)
        .map_err(|err| Error::Io { offset: 0, err })?;
    match format::superblock_checksum(&first, bs as usize) {
        Some(crc) if crc == sb.checksum => Ok(()),
        Some(crc) => corrupt(
            at,
            format!(
                "superblock checksum {:#010x} does not match computed {crc:#010x}",
                sb.checksum
            ),
        ),
        None => corrupt(at, "superblock checksum range invalid"),
    }
}

pub(crate) fn align_up(v: u64, a: u64) -> Option<u64> {
    Some(v.checked_add(a - 1)? & !(a - 1))
}
