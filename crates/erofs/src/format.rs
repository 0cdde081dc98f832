//! EROFS on-disk structures, shared by the builder and the reader.
//!
//! Mirrors `fs/erofs/erofs_fs.h` for the uncompressed subset verilay writes and reads.
//! All integers are little-endian. Every `decode` takes a fixed-size array, so it can
//! never read out of bounds; semantic validation is the reader's job.

/// Bytes before the superblock that EROFS ignores.
pub const SUPER_OFFSET: u64 = 1024;
/// Size of the base superblock (no extension slots).
pub const SUPER_SIZE: usize = 128;
pub const MAGIC: u32 = 0xE0F5_E1E2;

pub const FEATURE_COMPAT_SB_CHKSUM: u32 = 0x1;
pub const FEATURE_COMPAT_MTIME: u32 = 0x2;
pub const FEATURE_COMPAT_XATTR_FILTER: u32 = 0x4;

pub const FEATURE_INCOMPAT_CHUNKED_FILE: u32 = 0x4;
pub const FEATURE_INCOMPAT_XATTR_PREFIXES: u32 = 0x40;
/// Incompat features this crate implements; a reader rejects anything else.
pub const FEATURE_INCOMPAT_SUPPORTED: u32 = FEATURE_INCOMPAT_CHUNKED_FILE
    | FEATURE_INCOMPAT_XATTR_PREFIXES
    // Compressed files (the reader's `zmap`/`zdata`).
    | crate::zformat::FEATURE_INCOMPAT_LZ4_0PADDING
    | crate::zformat::FEATURE_INCOMPAT_COMPR_CFGS
    | crate::zformat::FEATURE_INCOMPAT_COMPR_HEAD2
    | crate::zformat::FEATURE_INCOMPAT_ZTAILPACKING
    | crate::zformat::FEATURE_INCOMPAT_FRAGMENTS;

/// Seed of the superblock crc32c, as the kernel feeds it (no final inversion).
pub const SB_CRC_SEED: u32 = 0x5045_B54A;

/// Inode slots are 32 bytes: `offset = meta_blkaddr * bs + nid * 32`.
pub const ISLOT_BITS: u32 = 5;
pub const INODE_COMPACT_SIZE: usize = 32;
pub const INODE_EXTENDED_SIZE: usize = 64;

pub const LAYOUT_FLAT_PLAIN: u16 = 0;
pub const LAYOUT_FLAT_INLINE: u16 = 2;
pub const LAYOUT_CHUNK_BASED: u16 = 4;

/// Chunk-based `i_u` format bits.
pub const CHUNK_FORMAT_BLKBITS_MASK: u16 = 0x1F;
pub const CHUNK_FORMAT_INDEXES: u16 = 0x20;
/// A 4-byte block-map entry (or an 8-byte index's `startblk_lo`) meaning "hole".
pub const NULL_ADDR: u32 = 0xFFFF_FFFF;

pub const DIRENT_SIZE: usize = 12;
pub const NAME_LEN: usize = 255;

pub const FT_UNKNOWN: u8 = 0;
pub const FT_REG_FILE: u8 = 1;
pub const FT_DIR: u8 = 2;
pub const FT_CHRDEV: u8 = 3;
pub const FT_BLKDEV: u8 = 4;
pub const FT_FIFO: u8 = 5;
pub const FT_SOCK: u8 = 6;
pub const FT_SYMLINK: u8 = 7;

pub const S_IFMT: u16 = 0o170000;
pub const S_IFSOCK: u16 = 0o140000;
pub const S_IFLNK: u16 = 0o120000;
pub const S_IFREG: u16 = 0o100000;
pub const S_IFBLK: u16 = 0o060000;
pub const S_IFDIR: u16 = 0o040000;
pub const S_IFCHR: u16 = 0o020000;
pub const S_IFIFO: u16 = 0o010000;

/// Directory-entry file type for a mode, or `None` for an invalid type.
pub fn file_type_of(mode: u16) -> Option<u8> {
    Some(match mode & S_IFMT {
        S_IFREG => FT_REG_FILE,
        S_IFDIR => FT_DIR,
        S_IFCHR => FT_CHRDEV,
        S_IFBLK => FT_BLKDEV,
        S_IFIFO => FT_FIFO,
        S_IFSOCK => FT_SOCK,
        S_IFLNK => FT_SYMLINK,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------
// Superblock

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Superblock {
    pub checksum: u32,
    pub feature_compat: u32,
    pub blkszbits: u8,
    pub sb_extslots: u8,
    pub root_nid: u16,
    pub inos: u64,
    pub epoch: u64,
    pub fixed_nsec: u32,
    pub blocks: u32,
    pub meta_blkaddr: u32,
    pub xattr_blkaddr: u32,
    pub uuid: [u8; 16],
    pub volume_name: [u8; 16],
    pub feature_incompat: u32,
    pub available_compr_algs: u16,
    pub extra_devices: u16,
    pub devt_slotoff: u16,
    pub dirblkbits: u8,
    pub xattr_prefix_count: u8,
    pub xattr_prefix_start: u32,
    pub packed_nid: u64,
    pub xattr_filter_reserved: u8,
    /// Seconds from `epoch` to image build time (informational, 6.15+ name).
    pub build_time: u32,
    /// Bytes 0x69..0x6C and 0x70..0x80 must be zero for the features used here.
    pub reserved_nonzero: bool,
}

impl Superblock {
    pub fn decode(b: &[u8; SUPER_SIZE]) -> (u32, Superblock) {
        let magic = le32(b, 0);
        let sb = Superblock {
            checksum: le32(b, 0x04),
            feature_compat: le32(b, 0x08),
            blkszbits: b[0x0C],
            sb_extslots: b[0x0D],
            root_nid: le16(b, 0x0E),
            inos: le64(b, 0x10),
            epoch: le64(b, 0x18),
            fixed_nsec: le32(b, 0x20),
            blocks: le32(b, 0x24),
            meta_blkaddr: le32(b, 0x28),
            xattr_blkaddr: le32(b, 0x2C),
            uuid: b[0x30..0x40].try_into().unwrap_or_default(),
            volume_name: b[0x40..0x50].try_into().unwrap_or_default(),
            feature_incompat: le32(b, 0x50),
            available_compr_algs: le16(b, 0x54),
            extra_devices: le16(b, 0x56),
            devt_slotoff: le16(b, 0x58),
            dirblkbits: b[0x5A],
            xattr_prefix_count: b[0x5B],
            xattr_prefix_start: le32(b, 0x5C),
            packed_nid: le64(b, 0x60),
            xattr_filter_reserved: b[0x68],
            build_time: le32(b, 0x6C),
            reserved_nonzero: b[0x69..0x6C].iter().chain(&b[0x70..0x80]).any(|&x| x != 0),
        };
        (magic, sb)
    }

    pub fn encode(&self) -> [u8; SUPER_SIZE] {
        let mut b = [0u8; SUPER_SIZE];
        put32(&mut b, 0, MAGIC);
        put32(&mut b, 0x04, self.checksum);
        put32(&mut b, 0x08, self.feature_compat);
        b[0x0C] = self.blkszbits;
        b[0x0D] = self.sb_extslots;
        put16(&mut b, 0x0E, self.root_nid);
        put64(&mut b, 0x10, self.inos);
        put64(&mut b, 0x18, self.epoch);
        put32(&mut b, 0x20, self.fixed_nsec);
        put32(&mut b, 0x24, self.blocks);
        put32(&mut b, 0x28, self.meta_blkaddr);
        put32(&mut b, 0x2C, self.xattr_blkaddr);
        b[0x30..0x40].copy_from_slice(&self.uuid);
        b[0x40..0x50].copy_from_slice(&self.volume_name);
        put32(&mut b, 0x50, self.feature_incompat);
        put16(&mut b, 0x54, self.available_compr_algs);
        put16(&mut b, 0x56, self.extra_devices);
        put16(&mut b, 0x58, self.devt_slotoff);
        b[0x5A] = self.dirblkbits;
        b[0x5B] = self.xattr_prefix_count;
        put32(&mut b, 0x5C, self.xattr_prefix_start);
        put64(&mut b, 0x60, self.packed_nid);
        b[0x68] = self.xattr_filter_reserved;
        put32(&mut b, 0x6C, self.build_time);
        b
    }
}

/// The superblock checksum over the first block (`block` is the whole first filesystem
/// block, or at least its first `max(block_size, 2048)` bytes for small block sizes).
///
/// The kernel checks `crc32c(seed, sb[8..])` over the rest of the block holding the
/// superblock: `len = bs; if len > 1024 { len -= 1024 }; len -= 8` bytes from offset 1032.
/// `crc32c` crates apply the standard final inversion; the kernel does not, so invert back.
pub fn superblock_checksum(first_block: &[u8], block_size: usize) -> Option<u32> {
    let mut len = block_size;
    if len > SUPER_OFFSET as usize {
        len -= SUPER_OFFSET as usize;
    }
    let len = len.checked_sub(8)?;
    let start = SUPER_OFFSET as usize + 8;
    let data = first_block.get(start..start.checked_add(len)?)?;
    // The seed is the raw register after magic + zeroed checksum from ~0; the crate takes
    // and returns the inverted register, so pass !seed and invert the result.
    Some(!crc32c::crc32c_append(!SB_CRC_SEED, data))
}

// ---------------------------------------------------------------------------
// Inodes

/// An inode as stored, compact or extended, before any semantic validation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskInode {
    pub extended: bool,
    /// Raw `i_format`; `layout()` extracts bits 1..=3.
    pub format: u16,
    pub xattr_icount: u16,
    pub mode: u16,
    pub nlink: u32,
    pub size: u64,
    /// Union: start block, rdev or chunk format.
    pub i_u: u32,
    pub ino: u32,
    pub uid: u32,
    pub gid: u32,
    /// Only meaningful for extended inodes; compact ones take the superblock epoch.
    pub mtime: u64,
    pub mtime_nsec: u32,
    /// Compact 0x0C (6.15+ per-inode mtime delta) or extended 0x06 (`i_nb`); both zero here.
    pub i_nb: u32,
}

impl DiskInode {
    pub fn layout(&self) -> u16 {
        (self.format >> 1) & 0x7
    }

    pub fn disk_size(&self) -> usize {
        if self.extended {
            INODE_EXTENDED_SIZE
        } else {
            INODE_COMPACT_SIZE
        }
    }

    /// Decodes from 64 bytes (a compact inode uses only the first 32).
    pub fn decode(b: &[u8; INODE_EXTENDED_SIZE]) -> DiskInode {
        let format = le16(b, 0);
        if format & 1 == 0 {
            DiskInode {
                extended: false,
                format,
                xattr_icount: le16(b, 0x02),
                mode: le16(b, 0x04),
                nlink: le16(b, 0x06) as u32,
                size: le32(b, 0x08) as u64,
                i_nb: le32(b, 0x0C),
                i_u: le32(b, 0x10),
                ino: le32(b, 0x14),
                uid: le16(b, 0x18) as u32,
                gid: le16(b, 0x1A) as u32,
                mtime: 0,
                mtime_nsec: 0,
            }
        } else {
            DiskInode {
                extended: true,
                format,
                xattr_icount: le16(b, 0x02),
                mode: le16(b, 0x04),
                i_nb: le16(b, 0x06) as u32,
                size: le64(b, 0x08),
                i_u: le32(b, 0x10),
                ino: le32(b, 0x14),
                uid: le32(b, 0x18),
                gid: le32(b, 0x1C),
                mtime: le64(b, 0x20),
                mtime_nsec: le32(b, 0x28),
                nlink: le32(b, 0x2C),
            }
        }
    }

    /// Encodes into `out`, which must be at least `disk_size()` bytes.
    pub fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..self.disk_size()];
        out.fill(0);
        put16(out, 0, self.format);
        put16(out, 0x02, self.xattr_icount);
        put16(out, 0x04, self.mode);
        put32(out, 0x10, self.i_u);
        put32(out, 0x14, self.ino);
        if self.extended {
            put64(out, 0x08, self.size);
            put32(out, 0x18, self.uid);
            put32(out, 0x1C, self.gid);
            put64(out, 0x20, self.mtime);
            put32(out, 0x28, self.mtime_nsec);
            put32(out, 0x2C, self.nlink);
        } else {
            put16(out, 0x06, self.nlink as u16);
            put32(out, 0x08, self.size as u32);
            put16(out, 0x18, self.uid as u16);
            put16(out, 0x1A, self.gid as u16);
        }
    }
}

/// `i_format` for a layout and inode version.
pub fn inode_format(extended: bool, layout: u16) -> u16 {
    (layout << 1) | extended as u16
}

/// Size of the inline xattr body for an `i_xattr_icount`.
pub fn xattr_ibody_size(icount: u16) -> usize {
    if icount == 0 {
        0
    } else {
        XATTR_IBODY_HEADER_SIZE + 4 * (icount as usize - 1)
    }
}

/// Linux "new" dev_t encoding used in `i_u` of device inodes.
pub fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xFF) | ((major & 0xFFF) << 8) | ((minor & !0xFF) << 12)
}

pub fn decode_dev(v: u32) -> (u32, u32) {
    let major = (v & 0xFFF00) >> 8;
    let minor = (v & 0xFF) | ((v >> 12) & 0xFFF00);
    (major, minor)
}

// ---------------------------------------------------------------------------
// Directories

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dirent {
    pub nid: u64,
    pub nameoff: u16,
    pub file_type: u8,
}

impl Dirent {
    pub fn decode(b: &[u8; DIRENT_SIZE]) -> Dirent {
        Dirent {
            nid: le64(b, 0),
            nameoff: le16(b, 8),
            file_type: b[10],
        }
    }

    pub fn encode(&self, out: &mut [u8]) {
        put64(out, 0, self.nid);
        put16(out, 8, self.nameoff);
        out[10] = self.file_type;
        out[11] = 0;
    }
}

// ---------------------------------------------------------------------------
// Extended attributes

pub const XATTR_IBODY_HEADER_SIZE: usize = 12;
pub const XATTR_ENTRY_HEADER_SIZE: usize = 4;

pub const XATTR_INDEX_USER: u8 = 1;
pub const XATTR_INDEX_POSIX_ACL_ACCESS: u8 = 2;
pub const XATTR_INDEX_POSIX_ACL_DEFAULT: u8 = 3;
pub const XATTR_INDEX_TRUSTED: u8 = 4;
pub const XATTR_INDEX_SECURITY: u8 = 6;
/// `e_name_index` bit that selects a long prefix from the superblock table.
pub const XATTR_LONG_PREFIX: u8 = 0x80;
pub const XATTR_LONG_PREFIX_MASK: u8 = 0x7F;

/// Short prefixes the kernel has handlers for, by index. ACL indexes carry the whole name.
pub const XATTR_PREFIXES: [(u8, &str); 5] = [
    (XATTR_INDEX_USER, "user."),
    (XATTR_INDEX_POSIX_ACL_ACCESS, "system.posix_acl_access"),
    (XATTR_INDEX_POSIX_ACL_DEFAULT, "system.posix_acl_default"),
    (XATTR_INDEX_TRUSTED, "trusted."),
    (XATTR_INDEX_SECURITY, "security."),
];

/// Splits a full xattr name into (short index, suffix). ACL names need an empty suffix;
/// names with no kernel handler (e.g. `system.foo`, `lustre.*`) give `None`.
pub fn split_xattr_name(name: &[u8]) -> Option<(u8, &[u8])> {
    for (index, prefix) in XATTR_PREFIXES {
        if let Some(suffix) = name.strip_prefix(prefix.as_bytes()) {
            let is_acl = matches!(
                index,
                XATTR_INDEX_POSIX_ACL_ACCESS | XATTR_INDEX_POSIX_ACL_DEFAULT
            );
            if is_acl != suffix.is_empty() {
                return None;
            }
            return Some((index, suffix));
        }
    }
    None
}

/// Prefix string of a short index, or `None` for indexes without a kernel handler.
pub fn xattr_prefix(index: u8) -> Option<&'static str> {
    XATTR_PREFIXES
        .iter()
        .find(|(i, _)| *i == index)
        .map(|(_, p)| *p)
}

/// Header of an xattr entry; name and value follow, padded to 4 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XattrEntry {
    pub name_len: u8,
    pub name_index: u8,
    pub value_size: u16,
}

impl XattrEntry {
    pub fn decode(b: &[u8; XATTR_ENTRY_HEADER_SIZE]) -> XattrEntry {
        XattrEntry {
            name_len: b[0],
            name_index: b[1],
            value_size: le16(b, 2),
        }
    }

    /// Bytes the whole entry occupies, 4-aligned.
    pub fn size(&self) -> usize {
        xattr_entry_size(self.name_len as usize, self.value_size as usize)
    }
}

pub fn xattr_entry_size(name_len: usize, value_size: usize) -> usize {
    (XATTR_ENTRY_HEADER_SIZE + name_len + value_size + 3) & !3
}

// Xattr name filter (kernel 6.6+): one xxh32 hash per name selects one of 32 bits.
pub const XATTR_FILTER_BITS: u32 = 32;
pub const XATTR_FILTER_SEED: u32 = 0x25BB_E08F;
pub const XATTR_FILTER_DEFAULT: u32 = 0xFFFF_FFFF;

/// The filter bit for a name: the suffix after the *short* prefix, hashed with the short
/// index added to the seed. This is what `erofs_getxattr()` computes from the VFS handler's
/// arguments, so long-prefix entries must be hashed by their base index and full suffix.
pub fn xattr_filter_bit(index: u8, suffix: &[u8]) -> u32 {
    xxhash_rust::xxh32::xxh32(suffix, XATTR_FILTER_SEED.wrapping_add(index as u32))
        & (XATTR_FILTER_BITS - 1)
}

/// The on-disk filter for an inode whose names hash to `bits`: a set bit means "absent".
pub fn xattr_filter_value<I: IntoIterator<Item = u32>>(bits: I) -> u32 {
    !bits.into_iter().fold(0u32, |acc, bit| acc | (1 << bit))
}

// ---------------------------------------------------------------------------
// Little-endian helpers (callers pass in-bounds offsets of fixed-size arrays).

pub(crate) fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
pub(crate) fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
pub(crate) fn le64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}
pub(crate) fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// verilay's file-digest table: the last blocks of the EROFS area hold one entry per
/// regular file, `(nid: u64, fs-verity digest: 32 bytes)` sorted by nid, and end in a
/// 64-byte footer. The kernel never looks there; the image's Merkle tree covers it.
pub const DIGEST_FOOTER_MAGIC: [u8; 8] = *b"VLFDIGST";
pub const DIGEST_FOOTER_SIZE: u64 = 64;
pub const DIGEST_ENTRY_SIZE: u64 = 40;
/// The per-file digests are fs-verity digests with SHA-256, 4 KiB blocks and no salt.
pub const DIGEST_ALG_SHA256: u8 = 1;
pub const DIGEST_LOG_BLOCK_SIZE: u8 = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DigestFooter {
    /// Byte offset of the first entry.
    pub table_offset: u64,
    pub entries: u64,
    /// Which xattr namespaces occur anywhere in the image: bit `i` for short name index `i`
    /// (long prefixes count as their base index). `None` in version-1 footers, which did
    /// not record it.
    pub namespaces: Option<u32>,
}

/// The namespace bits a footer may set: the short indexes with a kernel handler.
pub const XATTR_NAMESPACE_BITS: u32 = 1 << XATTR_INDEX_USER
    | 1 << XATTR_INDEX_POSIX_ACL_ACCESS
    | 1 << XATTR_INDEX_POSIX_ACL_DEFAULT
    | 1 << XATTR_INDEX_TRUSTED
    | 1 << XATTR_INDEX_SECURITY;

impl DigestFooter {
    pub fn encode(&self) -> [u8; DIGEST_FOOTER_SIZE as usize] {
        let mut b = [0u8; DIGEST_FOOTER_SIZE as usize];
        b[0..8].copy_from_slice(&DIGEST_FOOTER_MAGIC);
        b[8] = if self.namespaces.is_some() { 2 } else { 1 }; // version
        b[9] = DIGEST_ALG_SHA256;
        b[10] = DIGEST_LOG_BLOCK_SIZE;
        b[12..16].copy_from_slice(&(DIGEST_ENTRY_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.table_offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.entries.to_le_bytes());
        if let Some(ns) = self.namespaces {
            b[32..36].copy_from_slice(&ns.to_le_bytes());
        }
        b
    }

    /// `None` without the magic; `Err` names what is wrong with a footer that has it.
    pub fn decode(b: &[u8; DIGEST_FOOTER_SIZE as usize]) -> Result<Option<DigestFooter>, String> {
        if b[0..8] != DIGEST_FOOTER_MAGIC {
            return Ok(None);
        }
        let version = b[8];
        let namespaces = u32::from_le_bytes(b[32..36].try_into().expect("4 bytes"));
        let ns_ok = match version {
            1 => namespaces == 0,
            2 => namespaces & !XATTR_NAMESPACE_BITS == 0,
            _ => false,
        };
        if !ns_ok
            || b[9] != DIGEST_ALG_SHA256
            || b[10] != DIGEST_LOG_BLOCK_SIZE
            || b[11] != 0
            || u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"))
                != DIGEST_ENTRY_SIZE as u32
            || b[36..].iter().any(|&x| x != 0)
        {
            return Err("file digest table footer has an unknown version or layout".into());
        }
        Ok(Some(DigestFooter {
            table_offset: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            entries: u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")),
            namespaces: (version >= 2).then_some(namespaces),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bit_of(name: &str) -> u32 {
        let (index, suffix) = split_xattr_name(name.as_bytes()).expect(name);
        xattr_filter_bit(index, suffix)
    }

    /// Bits from the erofs-utils patch that introduced the filter (30-name table) and the
    /// reference's extra vectors; the kernel hides an xattr if any of these is wrong.
    #[test]
    fn filter_bits_match_kernel_table() {
        let table: &[(&str, u32)] = &[
            ("security.ima", 0),
            ("trusted.overlay.nlink", 2),
            ("user.overlay.nlink", 4),
            ("trusted.overlay.upper", 5),
            ("user.overlay.origin", 6),
            ("trusted.overlay.protattr", 7),
            ("security.apparmor", 8),
            ("user.overlay.protattr", 9),
            ("user.overlay.opaque", 10),
            ("security.selinux", 11),
            ("security.SMACK64TRANSMUTE", 12),
            ("security.SMACK64", 13),
            ("security.SMACK64MMAP", 14),
            ("user.overlay.impure", 15),
            ("security.SMACK64IPIN", 16),
            ("trusted.overlay.redirect", 17),
            ("trusted.overlay.origin", 18),
            ("security.SMACK64IPOUT", 19),
            ("trusted.overlay.opaque", 20),
            ("system.posix_acl_default", 21),
            ("user.mime_type", 23),
            ("trusted.overlay.impure", 24),
            ("security.SMACK64EXEC", 25),
            ("user.overlay.redirect", 26),
            ("user.overlay.upper", 27),
            ("security.evm", 28),
            ("security.capability", 29),
            ("system.posix_acl_access", 30),
            ("trusted.overlay.metacopy", 31),
            ("user.overlay.metacopy", 31),
            ("user.foo", 12),
            ("trusted.overlay.whiteout", 5),
            ("trusted.overlay.overlay.opaque", 5),
        ];
        for &(name, bit) in table {
            assert_eq!(bit_of(name), bit, "{name}");
        }
    }

    #[test]
    fn filter_polarity() {
        assert_eq!(xattr_filter_value([]), XATTR_FILTER_DEFAULT);
        assert_eq!(xattr_filter_value([0, 31]), 0x7FFF_FFFE);
    }

    #[test]
    fn split_names() {
        assert_eq!(split_xattr_name(b"user.a"), Some((1, &b"a"[..])));
        assert_eq!(
            split_xattr_name(b"system.posix_acl_access"),
            Some((2, &b""[..]))
        );
        assert_eq!(split_xattr_name(b"system.posix_acl_accessX"), None);
        assert_eq!(split_xattr_name(b"system.foo"), None);
        assert_eq!(split_xattr_name(b"lustre.x"), None);
    }

    #[test]
    fn dev_roundtrip() {
        for (ma, mi) in [(1, 3), (259, 300000), (0, 0), (4095, 0xFFFFF)] {
            assert_eq!(decode_dev(encode_dev(ma, mi)), (ma, mi));
        }
    }

    #[test]
    fn inode_roundtrip() {
        let ino = DiskInode {
            extended: true,
            format: inode_format(true, LAYOUT_FLAT_INLINE),
            xattr_icount: 5,
            mode: S_IFREG | 0o644,
            nlink: 3,
            size: 1 << 33,
            i_u: 77,
            ino: 9,
            uid: 100000,
            gid: 5,
            mtime: 1_700_000_000,
            mtime_nsec: 123,
            i_nb: 0,
        };
        let mut buf = [0u8; 64];
        ino.encode(&mut buf);
        assert_eq!(DiskInode::decode(&buf), ino);
        assert_eq!(ino.layout(), LAYOUT_FLAT_INLINE);
    }
}
