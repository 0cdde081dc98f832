//! EROFS on-disk structures, shared by the builder and the reader.
//!
//! Mirrors `fs/erofs/erofs_fs.h` for the uncompressed subset verilay writes and reads.
//! Each structure's layout is declared once, in [`raw`]; the plain structs here decode from
//! and encode to those. Every `decode` takes a fixed-size array, so it can never read out
//! of bounds; semantic validation is the reader's job.

use zerocopy::little_endian::U32;
use zerocopy::IntoBytes;

/// Bytes before the superblock that EROFS ignores.
pub const SUPER_OFFSET: u64 = 1024;
/// Size of the base superblock (no extension slots).
pub const SUPER_SIZE: usize = size_of::<raw::Superblock>();
/// Size of each of the superblock's `sb_extslots` extension slots.
pub const SB_EXTSLOT_SIZE: u64 = 16;
/// Superblock magic (`EROFS_SUPER_MAGIC_V1`).
pub const MAGIC: u32 = 0xE0F5_E1E2;

/// Compat feature: the superblock carries a crc32c checksum.
pub const FEATURE_COMPAT_SB_CHKSUM: u32 = 0x1;
/// Compat feature: inode timestamps hold the mtime (`EROFS_FEATURE_COMPAT_MTIME`).
pub const FEATURE_COMPAT_MTIME: u32 = 0x2;
/// Compat feature: inode xattr headers carry a name bloom filter.
pub const FEATURE_COMPAT_XATTR_FILTER: u32 = 0x4;

/// Incompat feature: chunk-based files exist.
pub const FEATURE_INCOMPAT_CHUNKED_FILE: u32 = 0x4;
/// Incompat feature: a long xattr name prefix table exists.
pub const FEATURE_INCOMPAT_XATTR_PREFIXES: u32 = 0x40;
/// Incompat feature: compressed data is zero-padded at the start of its pcluster.
pub const FEATURE_INCOMPAT_LZ4_0PADDING: u32 = 0x1;
/// Per-algorithm config records follow the superblock; `available_compr_algs` is a bitmap.
pub const FEATURE_INCOMPAT_COMPR_CFGS: u32 = 0x2;
/// Same bit as `COMPR_CFGS`: physical clusters may span several blocks.
pub const FEATURE_INCOMPAT_BIG_PCLUSTER: u32 = 0x2;
/// Incompat feature: HEAD2 lclusters may use a second algorithm.
pub const FEATURE_INCOMPAT_COMPR_HEAD2: u32 = 0x8;
/// Incompat feature: a compressed tail may be stored inline after the indexes.
pub const FEATURE_INCOMPAT_ZTAILPACKING: u32 = 0x10;
/// Incompat feature: file tails or whole files may be fragments in the packed inode.
pub const FEATURE_INCOMPAT_FRAGMENTS: u32 = 0x20;
/// Same bit as `FRAGMENTS`.
pub const FEATURE_INCOMPAT_DEDUPE: u32 = 0x20;
/// Incompat features this crate implements; a reader rejects anything else.
pub const FEATURE_INCOMPAT_SUPPORTED: u32 = FEATURE_INCOMPAT_CHUNKED_FILE
    | FEATURE_INCOMPAT_XATTR_PREFIXES
    // Compressed files (the reader's `zmap`/`zdata`).
    | FEATURE_INCOMPAT_LZ4_0PADDING
    | FEATURE_INCOMPAT_COMPR_CFGS
    | FEATURE_INCOMPAT_COMPR_HEAD2
    | FEATURE_INCOMPAT_ZTAILPACKING
    | FEATURE_INCOMPAT_FRAGMENTS;

/// Seed of the superblock crc32c, as the kernel feeds it (no final inversion).
pub const SB_CRC_SEED: u32 = 0x5045_B54A;

/// Inode slots are 32 bytes: `offset = meta_blkaddr * bs + nid * 32`.
pub const ISLOT_BITS: u32 = 5;
/// Size of a compact inode (32 bytes).
pub const INODE_COMPACT_SIZE: usize = size_of::<raw::InodeCompact>();
/// Size of an extended inode (64 bytes).
pub const INODE_EXTENDED_SIZE: usize = size_of::<raw::InodeExtended>();

/// Data layout: data in consecutive blocks, no inline tail.
pub const LAYOUT_FLAT_PLAIN: u16 = 0;
/// Data layout: consecutive blocks, the last partial block inline after the inode.
pub const LAYOUT_FLAT_INLINE: u16 = 2;
/// Data layout: data in chunks located through a block map or chunk indexes.
pub const LAYOUT_CHUNK_BASED: u16 = 4;

/// Chunk-based `i_u` format bits.
pub const CHUNK_FORMAT_BLKBITS_MASK: u16 = 0x1F;
/// Chunk format bit: `i_u` chunks use 8-byte chunk indexes instead of 4-byte block map entries.
pub const CHUNK_FORMAT_INDEXES: u16 = 0x20;
/// A 4-byte block-map entry (or an 8-byte index's `startblk_lo`) meaning "hole".
pub const NULL_ADDR: u32 = 0xFFFF_FFFF;

/// Size of a directory entry (12 bytes).
pub const DIRENT_SIZE: usize = size_of::<raw::Dirent>();
/// Maximum length of a file name, in bytes.
pub const NAME_LEN: usize = 255;

/// Directory-entry file type: unknown.
pub const FT_UNKNOWN: u8 = 0;
/// Directory-entry file type: regular file.
pub const FT_REG_FILE: u8 = 1;
/// Directory-entry file type: directory.
pub const FT_DIR: u8 = 2;
/// Directory-entry file type: character device.
pub const FT_CHRDEV: u8 = 3;
/// Directory-entry file type: block device.
pub const FT_BLKDEV: u8 = 4;
/// Directory-entry file type: FIFO.
pub const FT_FIFO: u8 = 5;
/// Directory-entry file type: socket.
pub const FT_SOCK: u8 = 6;
/// Directory-entry file type: symbolic link.
pub const FT_SYMLINK: u8 = 7;

/// Mask of the file-type bits of a mode.
pub const S_IFMT: u16 = 0o170000;
/// File type bits of a socket.
pub const S_IFSOCK: u16 = 0o140000;
/// File type bits of a symbolic link.
pub const S_IFLNK: u16 = 0o120000;
/// File type bits of a regular file.
pub const S_IFREG: u16 = 0o100000;
/// File type bits of a block device.
pub const S_IFBLK: u16 = 0o060000;
/// File type bits of a directory.
pub const S_IFDIR: u16 = 0o040000;
/// File type bits of a character device.
pub const S_IFCHR: u16 = 0o020000;
/// File type bits of a FIFO.
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
// On-disk layouts

/// Declares on-disk structures: `repr(C)` of byte-order-explicit integers and byte arrays,
/// so of alignment 1 and without padding (the derives check both), read from and written
/// to bytes without `unsafe`.
macro_rules! ondisk {
    ($($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* })*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(
            zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable,
            zerocopy::KnownLayout, zerocopy::Unaligned,
            Clone, Copy, Debug, Default, PartialEq, Eq,
        )]
        pub struct $name { $($(#[$fm])* pub $f: $t,)* }
    )*};
}
pub(crate) use ondisk;

/// The on-disk structures, field for field as `erofs_fs.h` names them (a union under the
/// name of the member verilay uses), all little-endian: the one place each layout is
/// written down. The plain structs of this module decode from and encode to them.
pub mod raw {
    use zerocopy::little_endian::{U16, U32, U64};

    ondisk! {
        /// `struct erofs_super_block`, its base 128 bytes: `sb_extslots` 16-byte slots may
        /// follow (the header's 144 counts the first, `metabox_nid`, unused here).
        pub struct Superblock {
            /// Superblock magic, `MAGIC`.
            pub magic: U32,
            /// crc32c of the superblock's block (with `FEATURE_COMPAT_SB_CHKSUM`).
            pub checksum: U32,
            /// Compatible feature flags.
            pub feature_compat: U32,
            /// Filesystem block size, as a bit shift.
            pub blkszbits: u8,
            /// Number of 16-byte extension slots after the base superblock.
            pub sb_extslots: u8,
            /// Union `rb`: the root nid (or, with 48BIT, `blocks_hi`).
            pub rootnid_2b: U16,
            /// Total number of valid inode numbers.
            pub inos: U64,
            /// Base seconds of compact inodes' mtimes.
            pub epoch: U64,
            /// Fixed nanoseconds of compact inodes' mtimes.
            pub fixed_nsec: U32,
            /// Block count (low 32 bits).
            pub blocks_lo: U32,
            /// Start block address of the metadata area.
            pub meta_blkaddr: U32,
            /// Start block address of the shared xattr area.
            pub xattr_blkaddr: U32,
            /// 128-bit UUID of the volume.
            pub uuid: [u8; 16],
            /// Volume name.
            pub volume_name: [u8; 16],
            /// Incompatible feature flags.
            pub feature_incompat: U32,
            /// Union `u1`: with `COMPR_CFGS` a bitmap of algorithms, else `lz4_max_distance`.
            pub available_compr_algs: U16,
            /// Number of devices besides the primary device.
            pub extra_devices: U16,
            /// Offset of the device table, in device-slot units.
            pub devt_slotoff: U16,
            /// Directory block size, as a bit shift added to `blkszbits`.
            pub dirblkbits: u8,
            /// Number of long xattr name prefixes.
            pub xattr_prefix_count: u8,
            /// Start of the long xattr name prefix table.
            pub xattr_prefix_start: U32,
            /// Nid of the special packed inode.
            pub packed_nid: U64,
            /// Reserved for the xattr name filter (zero).
            pub xattr_filter_reserved: u8,
            /// Reserved (zero).
            pub reserved: [u8; 3],
            /// Seconds from `epoch` to the build (6.15+).
            pub build_time: U32,
            /// (48BIT) the root nid.
            pub rootnid_8b: U64,
            /// Reserved (zero).
            pub reserved2: U64,
        }

        /// `struct erofs_inode_compact`.
        pub struct InodeCompact {
            /// Bit 0 the version (0: compact), bits 1-3 the data layout.
            pub i_format: U16,
            /// Inline xattr size in 4-byte units, counted as in `xattr_ibody_size`.
            pub i_xattr_icount: U16,
            /// File mode: type and permission bits.
            pub i_mode: U16,
            /// Union `i_nb`: the link count (6.15+ may also keep `blocks_hi`/`startblk_hi`).
            pub i_nb: U16,
            /// File size in bytes.
            pub i_size: U32,
            /// Seconds after the superblock's `epoch` (6.15+; reserved before).
            pub i_mtime: U32,
            /// Union `i_u`: start block, compressed block count, `rdev` or [`ChunkInfo`].
            pub i_u: U32,
            /// Inode number, only used for 32-bit stat compatibility.
            pub i_ino: U32,
            /// Owner user id.
            pub i_uid: U16,
            /// Owner group id.
            pub i_gid: U16,
            /// Reserved (zero).
            pub i_reserved: U32,
        }

        /// `struct erofs_inode_extended`.
        pub struct InodeExtended {
            /// Bit 0 the version (1: extended), bits 1-3 the data layout.
            pub i_format: U16,
            /// Inline xattr size in 4-byte units, counted as in `xattr_ibody_size`.
            pub i_xattr_icount: U16,
            /// File mode: type and permission bits.
            pub i_mode: U16,
            /// Union `i_nb` (6.15+: `blocks_hi`/`startblk_hi`; reserved before).
            pub i_nb: U16,
            /// File size in bytes.
            pub i_size: U64,
            /// Union `i_u`, as in [`InodeCompact`].
            pub i_u: U32,
            /// Inode number, only used for 32-bit stat compatibility.
            pub i_ino: U32,
            /// Owner user id.
            pub i_uid: U32,
            /// Owner group id.
            pub i_gid: U32,
            /// Modification time, seconds.
            pub i_mtime: U64,
            /// Modification time, nanoseconds.
            pub i_mtime_nsec: U32,
            /// Hard link count.
            pub i_nlink: U32,
            /// Reserved (zero).
            pub i_reserved2: [u8; 16],
        }

        /// `struct erofs_inode_chunk_info`: `i_u` of a chunk-based inode.
        pub struct ChunkInfo {
            /// Chunk format: `CHUNK_FORMAT_BLKBITS_MASK` bits and `CHUNK_FORMAT_INDEXES`.
            pub format: U16,
            /// Reserved (zero).
            pub reserved: U16,
        }

        /// `struct erofs_xattr_ibody_header`; `h_shared_count` le32 shared xattr ids follow.
        pub struct XattrIbodyHeader {
            /// Name filter: a set bit means no name hashing to that bit is present.
            pub h_name_filter: U32,
            /// Number of shared xattr ids that follow the header.
            pub h_shared_count: u8,
            /// Reserved (zero).
            pub h_reserved2: [u8; 7],
        }

        /// `struct erofs_xattr_entry`; the name and the value follow, padded to 4 bytes.
        pub struct XattrEntry {
            /// Length of the name suffix, in bytes.
            pub e_name_len: u8,
            /// Name prefix: `XATTR_INDEX_*`, or `XATTR_LONG_PREFIX` plus a table index.
            pub e_name_index: u8,
            /// Size of the value, in bytes.
            pub e_value_size: U16,
        }

        /// One entry of a chunk-based inode's block map (`EROFS_BLOCK_MAP_ENTRY_SIZE`),
        /// the format without `CHUNK_FORMAT_INDEXES`.
        pub struct BlockMapEntry {
            /// Start block of the chunk, or `NULL_ADDR` for a hole.
            pub blkaddr: U32,
        }

        /// `struct erofs_inode_chunk_index`, the format with `CHUNK_FORMAT_INDEXES`.
        pub struct ChunkIndex {
            /// Start block of the chunk (high 16 bits).
            pub startblk_hi: U16,
            /// Device id of the chunk's backing storage (0: the primary device).
            pub device_id: U16,
            /// Start block of the chunk (low 32 bits), or `NULL_ADDR` for a hole.
            pub startblk_lo: U32,
        }

        /// `struct erofs_dirent`; a block's names follow its dirents.
        pub struct Dirent {
            /// Nid of the entry's inode.
            pub nid: U64,
            /// Offset of the entry's name within the directory block.
            pub nameoff: U16,
            /// File type of the entry (`FT_*`).
            pub file_type: u8,
            /// Reserved (zero).
            pub reserved: u8,
        }

        /// One entry of verilay's file-digest table (not an EROFS structure).
        pub struct DigestEntry {
            /// Nid of the regular file.
            pub nid: U64,
            /// fs-verity digest of the file.
            pub digest: [u8; 32],
        }

        /// The footer of verilay's file-digest table (not an EROFS structure).
        pub struct DigestFooter {
            /// Footer magic, `DIGEST_FOOTER_MAGIC`.
            pub magic: [u8; 8],
            /// 1, or 2 with `namespaces`.
            pub version: u8,
            /// Digest algorithm, `DIGEST_ALG_SHA256`.
            pub alg: u8,
            /// fs-verity block size, as a bit shift (`DIGEST_LOG_BLOCK_SIZE`).
            pub log_blocksize: u8,
            /// Reserved (zero).
            pub reserved: u8,
            /// Size of one entry, in bytes.
            pub entry_size: U32,
            /// Byte offset of the first entry.
            pub table_offset: U64,
            /// Number of entries.
            pub entries: U64,
            /// Namespace bits, as in [`super::DigestFooter::namespaces`] (zero in version 1).
            pub namespaces: U32,
            /// Reserved (zero).
            pub reserved2: [u8; 28],
        }
    }
}

// Sizes as `erofs_fs.h` checks them (`erofs_check_ondisk_layout_definitions`).
const _: () = {
    assert!(size_of::<raw::Superblock>() == 128);
    assert!(size_of::<raw::InodeCompact>() == 32);
    assert!(size_of::<raw::InodeExtended>() == 64);
    assert!(size_of::<raw::ChunkInfo>() == 4);
    assert!(size_of::<raw::XattrIbodyHeader>() == 12);
    assert!(size_of::<raw::XattrEntry>() == 4);
    assert!(size_of::<raw::BlockMapEntry>() == 4);
    assert!(size_of::<raw::ChunkIndex>() == 8);
    assert!(size_of::<raw::Dirent>() == 12);
    assert!(size_of::<raw::DigestEntry>() == 40);
    assert!(size_of::<raw::DigestFooter>() == 64);
};

// ---------------------------------------------------------------------------
// Superblock

/// A decoded superblock: the fields of [`raw::Superblock`] in native integers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Superblock {
    /// crc32c of the superblock's block (with `FEATURE_COMPAT_SB_CHKSUM`).
    pub checksum: u32,
    /// Compatible feature flags.
    pub feature_compat: u32,
    /// Filesystem block size, as a bit shift.
    pub blkszbits: u8,
    /// Number of 16-byte extension slots after the base superblock.
    pub sb_extslots: u8,
    /// Inode number of the root directory.
    pub root_nid: u16,
    /// Total number of valid inode numbers.
    pub inos: u64,
    /// Base seconds of compact inodes' mtimes.
    pub epoch: u64,
    /// Fixed nanoseconds of compact inodes' mtimes.
    pub fixed_nsec: u32,
    /// Block count (the low 32 bits, `blocks_lo`).
    pub blocks: u32,
    /// Start block address of the metadata area.
    pub meta_blkaddr: u32,
    /// Start block address of the shared xattr area.
    pub xattr_blkaddr: u32,
    /// 128-bit UUID of the volume.
    pub uuid: [u8; 16],
    /// Volume name.
    pub volume_name: [u8; 16],
    /// Incompatible feature flags.
    pub feature_incompat: u32,
    /// Bitmap of compression algorithms (with `COMPR_CFGS`), else `lz4_max_distance`.
    pub available_compr_algs: u16,
    /// Number of devices besides the primary device.
    pub extra_devices: u16,
    /// Offset of the device table, in device-slot units.
    pub devt_slotoff: u16,
    /// Directory block size, as a bit shift added to `blkszbits`.
    pub dirblkbits: u8,
    /// Number of long xattr name prefixes.
    pub xattr_prefix_count: u8,
    /// Start of the long xattr name prefix table.
    pub xattr_prefix_start: u32,
    /// Nid of the special packed inode.
    pub packed_nid: u64,
    /// Reserved for the xattr name filter (zero).
    pub xattr_filter_reserved: u8,
    /// Seconds from `epoch` to image build time (informational, 6.15+ name).
    pub build_time: u32,
    /// Whether `reserved`, `rootnid_8b` or `reserved2` of [`raw::Superblock`] is set: all
    /// must be zero for the features used here.
    pub reserved_nonzero: bool,
}

impl Superblock {
    /// Decodes the base superblock: its magic and its fields.
    pub fn decode(b: &[u8; SUPER_SIZE]) -> (u32, Superblock) {
        let r: &raw::Superblock = zerocopy::transmute_ref!(b);
        let sb = Superblock {
            checksum: r.checksum.get(),
            feature_compat: r.feature_compat.get(),
            blkszbits: r.blkszbits,
            sb_extslots: r.sb_extslots,
            root_nid: r.rootnid_2b.get(),
            inos: r.inos.get(),
            epoch: r.epoch.get(),
            fixed_nsec: r.fixed_nsec.get(),
            blocks: r.blocks_lo.get(),
            meta_blkaddr: r.meta_blkaddr.get(),
            xattr_blkaddr: r.xattr_blkaddr.get(),
            uuid: r.uuid,
            volume_name: r.volume_name,
            feature_incompat: r.feature_incompat.get(),
            available_compr_algs: r.available_compr_algs.get(),
            extra_devices: r.extra_devices.get(),
            devt_slotoff: r.devt_slotoff.get(),
            dirblkbits: r.dirblkbits,
            xattr_prefix_count: r.xattr_prefix_count,
            xattr_prefix_start: r.xattr_prefix_start.get(),
            packed_nid: r.packed_nid.get(),
            xattr_filter_reserved: r.xattr_filter_reserved,
            build_time: r.build_time.get(),
            reserved_nonzero: r.reserved != [0; 3]
                || r.rootnid_8b.get() != 0
                || r.reserved2.get() != 0,
        };
        (r.magic.get(), sb)
    }

    /// The superblock with `MAGIC`; reserved bytes are zero.
    pub fn encode(&self) -> [u8; SUPER_SIZE] {
        let r = raw::Superblock {
            magic: MAGIC.into(),
            checksum: self.checksum.into(),
            feature_compat: self.feature_compat.into(),
            blkszbits: self.blkszbits,
            sb_extslots: self.sb_extslots,
            rootnid_2b: self.root_nid.into(),
            inos: self.inos.into(),
            epoch: self.epoch.into(),
            fixed_nsec: self.fixed_nsec.into(),
            blocks_lo: self.blocks.into(),
            meta_blkaddr: self.meta_blkaddr.into(),
            xattr_blkaddr: self.xattr_blkaddr.into(),
            uuid: self.uuid,
            volume_name: self.volume_name,
            feature_incompat: self.feature_incompat.into(),
            available_compr_algs: self.available_compr_algs.into(),
            extra_devices: self.extra_devices.into(),
            devt_slotoff: self.devt_slotoff.into(),
            dirblkbits: self.dirblkbits,
            xattr_prefix_count: self.xattr_prefix_count,
            xattr_prefix_start: self.xattr_prefix_start.into(),
            packed_nid: self.packed_nid.into(),
            xattr_filter_reserved: self.xattr_filter_reserved,
            build_time: self.build_time.into(),
            ..Default::default()
        };
        zerocopy::transmute!(r)
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
    // From past `magic` and `checksum`, which the seed stands for.
    let skip = core::mem::offset_of!(raw::Superblock, feature_compat);
    let len = len.checked_sub(skip)?;
    let start = SUPER_OFFSET as usize + skip;
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
    /// Whether the inode is extended (64 bytes) rather than compact (32 bytes).
    pub extended: bool,
    /// Raw `i_format`; `layout()` extracts bits 1..=3.
    pub format: u16,
    /// Inline xattr size in 4-byte units, counted as in [`xattr_ibody_size`].
    pub xattr_icount: u16,
    /// File mode: type and permission bits.
    pub mode: u16,
    /// Hard link count.
    pub nlink: u32,
    /// File size in bytes.
    pub size: u64,
    /// Union: start block, rdev or chunk format.
    pub i_u: u32,
    /// Inode number, only used for 32-bit stat compatibility.
    pub ino: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Only meaningful for extended inodes; compact ones take the superblock epoch.
    pub mtime: u64,
    /// Modification time, nanoseconds (extended inodes only).
    pub mtime_nsec: u32,
    /// Compact `i_mtime` (6.15+: seconds after the epoch) or extended `i_nb`; zero here.
    pub i_nb: u32,
}

impl DiskInode {
    /// Data layout (`LAYOUT_*`), bits 1..=3 of `format`.
    pub fn layout(&self) -> u16 {
        (self.format >> 1) & 0x7
    }

    /// On-disk size of the inode: 32 or 64 bytes.
    pub fn disk_size(&self) -> usize {
        if self.extended {
            INODE_EXTENDED_SIZE
        } else {
            INODE_COMPACT_SIZE
        }
    }

    /// Decodes from 64 bytes (a compact inode uses only the first 32).
    pub fn decode(b: &[u8; INODE_EXTENDED_SIZE]) -> DiskInode {
        let e: &raw::InodeExtended = zerocopy::transmute_ref!(b);
        if e.i_format.get() & 1 == 0 {
            let halves: &[[u8; INODE_COMPACT_SIZE]; 2] = zerocopy::transmute_ref!(b);
            let c: &raw::InodeCompact = zerocopy::transmute_ref!(&halves[0]);
            DiskInode {
                extended: false,
                format: c.i_format.get(),
                xattr_icount: c.i_xattr_icount.get(),
                mode: c.i_mode.get(),
                nlink: c.i_nb.get().into(),
                size: c.i_size.get().into(),
                i_nb: c.i_mtime.get(),
                i_u: c.i_u.get(),
                ino: c.i_ino.get(),
                uid: c.i_uid.get().into(),
                gid: c.i_gid.get().into(),
                mtime: 0,
                mtime_nsec: 0,
            }
        } else {
            DiskInode {
                extended: true,
                format: e.i_format.get(),
                xattr_icount: e.i_xattr_icount.get(),
                mode: e.i_mode.get(),
                i_nb: e.i_nb.get().into(),
                size: e.i_size.get(),
                i_u: e.i_u.get(),
                ino: e.i_ino.get(),
                uid: e.i_uid.get(),
                gid: e.i_gid.get(),
                mtime: e.i_mtime.get(),
                mtime_nsec: e.i_mtime_nsec.get(),
                nlink: e.i_nlink.get(),
            }
        }
    }

    /// Encodes into `out`, which must be at least `disk_size()` bytes. `i_nb` is written
    /// as zero: verilay writes neither 48-bit addresses nor per-inode compact mtimes.
    pub fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..self.disk_size()];
        if self.extended {
            let e = raw::InodeExtended {
                i_format: self.format.into(),
                i_xattr_icount: self.xattr_icount.into(),
                i_mode: self.mode.into(),
                i_size: self.size.into(),
                i_u: self.i_u.into(),
                i_ino: self.ino.into(),
                i_uid: self.uid.into(),
                i_gid: self.gid.into(),
                i_mtime: self.mtime.into(),
                i_mtime_nsec: self.mtime_nsec.into(),
                i_nlink: self.nlink.into(),
                ..Default::default()
            };
            out.copy_from_slice(e.as_bytes());
        } else {
            let c = raw::InodeCompact {
                i_format: self.format.into(),
                i_xattr_icount: self.xattr_icount.into(),
                i_mode: self.mode.into(),
                i_nb: (self.nlink as u16).into(),
                i_size: (self.size as u32).into(),
                i_u: self.i_u.into(),
                i_ino: self.ino.into(),
                i_uid: (self.uid as u16).into(),
                i_gid: (self.gid as u16).into(),
                ..Default::default()
            };
            out.copy_from_slice(c.as_bytes());
        }
    }

    /// `i_u` read as a chunk-based inode's [`raw::ChunkInfo`]: its `format`.
    pub fn chunk_format(&self) -> u16 {
        let c: raw::ChunkInfo = zerocopy::transmute!(U32::new(self.i_u));
        c.format.get()
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

/// Major and minor numbers of a Linux "new" dev_t encoding, the inverse of [`encode_dev`].
pub fn decode_dev(v: u32) -> (u32, u32) {
    let major = (v & 0xFFF00) >> 8;
    let minor = (v & 0xFF) | ((v >> 12) & 0xFFF00);
    (major, minor)
}

// ---------------------------------------------------------------------------
// Directories

/// A decoded directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dirent {
    /// Nid of the entry's inode.
    pub nid: u64,
    /// Offset of the entry's name within the directory block.
    pub nameoff: u16,
    /// File type of the entry (`FT_*`).
    pub file_type: u8,
}

impl Dirent {
    /// Decodes a directory entry.
    pub fn decode(b: &[u8; DIRENT_SIZE]) -> Dirent {
        let r: &raw::Dirent = zerocopy::transmute_ref!(b);
        Dirent {
            nid: r.nid.get(),
            nameoff: r.nameoff.get(),
            file_type: r.file_type,
        }
    }

    /// Encodes into the first `DIRENT_SIZE` bytes of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        let r = raw::Dirent {
            nid: self.nid.into(),
            nameoff: self.nameoff.into(),
            file_type: self.file_type,
            reserved: 0,
        };
        out[..DIRENT_SIZE].copy_from_slice(r.as_bytes());
    }
}

// ---------------------------------------------------------------------------
// Extended attributes

/// Size of the inline xattr body header (12 bytes).
pub const XATTR_IBODY_HEADER_SIZE: usize = size_of::<raw::XattrIbodyHeader>();
/// Size of an xattr entry header (4 bytes).
pub const XATTR_ENTRY_HEADER_SIZE: usize = size_of::<raw::XattrEntry>();

/// Xattr name index of the `user.` prefix.
pub const XATTR_INDEX_USER: u8 = 1;
/// Xattr name index of `system.posix_acl_access`.
pub const XATTR_INDEX_POSIX_ACL_ACCESS: u8 = 2;
/// Xattr name index of `system.posix_acl_default`.
pub const XATTR_INDEX_POSIX_ACL_DEFAULT: u8 = 3;
/// Xattr name index of the `trusted.` prefix.
pub const XATTR_INDEX_TRUSTED: u8 = 4;
/// Xattr name index of the `security.` prefix.
pub const XATTR_INDEX_SECURITY: u8 = 6;
/// `e_name_index` bit that selects a long prefix from the superblock table.
pub const XATTR_LONG_PREFIX: u8 = 0x80;
/// `e_name_index` bits that index the long prefix table (with `XATTR_LONG_PREFIX`).
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
    /// Length of the name suffix, in bytes.
    pub name_len: u8,
    /// Prefix index of the name (`XATTR_INDEX_*`, or `XATTR_LONG_PREFIX` with a table index).
    pub name_index: u8,
    /// Size of the value, in bytes.
    pub value_size: u16,
}

impl XattrEntry {
    /// Decodes an xattr entry header.
    pub fn decode(b: &[u8; XATTR_ENTRY_HEADER_SIZE]) -> XattrEntry {
        let r: &raw::XattrEntry = zerocopy::transmute_ref!(b);
        XattrEntry {
            name_len: r.e_name_len,
            name_index: r.e_name_index,
            value_size: r.e_value_size.get(),
        }
    }

    /// Encodes the xattr entry header.
    pub fn encode(&self) -> [u8; XATTR_ENTRY_HEADER_SIZE] {
        zerocopy::transmute!(raw::XattrEntry {
            e_name_len: self.name_len,
            e_name_index: self.name_index,
            e_value_size: self.value_size.into(),
        })
    }

    /// Bytes the whole entry occupies, 4-aligned.
    pub fn size(&self) -> usize {
        xattr_entry_size(self.name_len as usize, self.value_size as usize)
    }
}

/// Bytes an xattr entry with this name and value length occupies, 4-aligned.
pub fn xattr_entry_size(name_len: usize, value_size: usize) -> usize {
    (XATTR_ENTRY_HEADER_SIZE + name_len + value_size + 3) & !3
}

// Xattr name filter (kernel 6.6+): one xxh32 hash per name selects one of 32 bits.
/// Number of bits in the xattr name filter.
pub const XATTR_FILTER_BITS: u32 = 32;
/// Seed of the xattr name filter hash (xxh32), to which the name index is added.
pub const XATTR_FILTER_SEED: u32 = 0x25BB_E08F;
/// Name filter value that excludes no name (every bit set).
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

/// verilay's file-digest table: the last blocks of the EROFS area hold one entry per
/// regular file, `(nid: u64, fs-verity digest: 32 bytes)` sorted by nid, and end in a
/// 64-byte footer. The kernel never looks there; the image's Merkle tree covers it.
pub const DIGEST_FOOTER_MAGIC: [u8; 8] = *b"VLFDIGST";
/// Size of the digest table footer (64 bytes).
pub const DIGEST_FOOTER_SIZE: u64 = size_of::<raw::DigestFooter>() as u64;
/// Size of one digest table entry (40 bytes).
pub const DIGEST_ENTRY_SIZE: u64 = size_of::<raw::DigestEntry>() as u64;
/// The per-file digests are fs-verity digests with SHA-256, 4 KiB blocks and no salt.
pub const DIGEST_ALG_SHA256: u8 = 1;
/// fs-verity block size of the per-file digests, as a bit shift (4 KiB).
pub const DIGEST_LOG_BLOCK_SIZE: u8 = 12;

/// A decoded digest table footer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DigestFooter {
    /// Byte offset of the first entry.
    pub table_offset: u64,
    /// Number of entries in the table.
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
    /// Encodes the footer, version 2 when `namespaces` is set, else version 1.
    pub fn encode(&self) -> [u8; DIGEST_FOOTER_SIZE as usize] {
        zerocopy::transmute!(raw::DigestFooter {
            magic: DIGEST_FOOTER_MAGIC,
            version: if self.namespaces.is_some() { 2 } else { 1 },
            alg: DIGEST_ALG_SHA256,
            log_blocksize: DIGEST_LOG_BLOCK_SIZE,
            entry_size: (DIGEST_ENTRY_SIZE as u32).into(),
            table_offset: self.table_offset.into(),
            entries: self.entries.into(),
            namespaces: self.namespaces.unwrap_or(0).into(),
            ..Default::default()
        })
    }

    /// `None` without the magic; `Err` names what is wrong with a footer that has it.
    pub fn decode(b: &[u8; DIGEST_FOOTER_SIZE as usize]) -> Result<Option<DigestFooter>, String> {
        let r: &raw::DigestFooter = zerocopy::transmute_ref!(b);
        if r.magic != DIGEST_FOOTER_MAGIC {
            return Ok(None);
        }
        let namespaces = r.namespaces.get();
        let ns_ok = match r.version {
            1 => namespaces == 0,
            2 => namespaces & !XATTR_NAMESPACE_BITS == 0,
            _ => false,
        };
        if !ns_ok
            || r.alg != DIGEST_ALG_SHA256
            || r.log_blocksize != DIGEST_LOG_BLOCK_SIZE
            || r.reserved != 0
            || r.entry_size.get() != DIGEST_ENTRY_SIZE as u32
            || r.reserved2 != [0; 28]
        {
            return Err("file digest table footer has an unknown version or layout".into());
        }
        Ok(Some(DigestFooter {
            table_offset: r.table_offset.get(),
            entries: r.entries.get(),
            namespaces: (r.version >= 2).then_some(namespaces),
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

    /// Field offsets as `erofs_fs.h` lays them out.
    #[test]
    fn offsets_match_erofs_fs_h() {
        use core::mem::offset_of;
        assert_eq!(offset_of!(raw::Superblock, checksum), 0x04);
        assert_eq!(offset_of!(raw::Superblock, blkszbits), 0x0C);
        assert_eq!(offset_of!(raw::Superblock, rootnid_2b), 0x0E);
        assert_eq!(offset_of!(raw::Superblock, epoch), 0x18);
        assert_eq!(offset_of!(raw::Superblock, blocks_lo), 0x24);
        assert_eq!(offset_of!(raw::Superblock, xattr_blkaddr), 0x2C);
        assert_eq!(offset_of!(raw::Superblock, feature_incompat), 0x50);
        assert_eq!(offset_of!(raw::Superblock, devt_slotoff), 0x58);
        assert_eq!(offset_of!(raw::Superblock, dirblkbits), 0x5A);
        assert_eq!(offset_of!(raw::Superblock, xattr_prefix_start), 0x5C);
        assert_eq!(offset_of!(raw::Superblock, packed_nid), 0x60);
        assert_eq!(offset_of!(raw::Superblock, xattr_filter_reserved), 0x68);
        assert_eq!(offset_of!(raw::Superblock, build_time), 0x6C);
        assert_eq!(offset_of!(raw::Superblock, rootnid_8b), 0x70);
        assert_eq!(offset_of!(raw::InodeCompact, i_nb), 0x06);
        assert_eq!(offset_of!(raw::InodeCompact, i_mtime), 0x0C);
        assert_eq!(offset_of!(raw::InodeCompact, i_u), 0x10);
        assert_eq!(offset_of!(raw::InodeCompact, i_uid), 0x18);
        assert_eq!(offset_of!(raw::InodeExtended, i_size), 0x08);
        assert_eq!(offset_of!(raw::InodeExtended, i_uid), 0x18);
        assert_eq!(offset_of!(raw::InodeExtended, i_mtime), 0x20);
        assert_eq!(offset_of!(raw::InodeExtended, i_nlink), 0x2C);
        assert_eq!(offset_of!(raw::XattrIbodyHeader, h_shared_count), 4);
        assert_eq!(offset_of!(raw::XattrEntry, e_value_size), 2);
        assert_eq!(offset_of!(raw::ChunkIndex, startblk_lo), 4);
        assert_eq!(offset_of!(raw::Dirent, nameoff), 8);
        assert_eq!(offset_of!(raw::Dirent, file_type), 10);
        assert_eq!(offset_of!(raw::DigestFooter, table_offset), 16);
        assert_eq!(offset_of!(raw::DigestFooter, namespaces), 32);
    }

    #[test]
    fn superblock_roundtrip() {
        let sb = Superblock {
            checksum: 1,
            blkszbits: 12,
            root_nid: 36,
            inos: 7,
            epoch: 1 << 40,
            blocks: 6,
            xattr_blkaddr: 3,
            uuid: [9; 16],
            packed_nid: 1 << 33,
            build_time: 5,
            ..Default::default()
        };
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b), (MAGIC, sb));
        b[0x7F] = 1;
        assert!(Superblock::decode(&b).1.reserved_nonzero);
    }

    #[test]
    fn compact_inode_roundtrip() {
        let ino = DiskInode {
            format: inode_format(false, LAYOUT_CHUNK_BASED),
            mode: S_IFREG | 0o600,
            nlink: 2,
            size: 3 << 12,
            i_u: u32::from(CHUNK_FORMAT_INDEXES | 3),
            ino: 4,
            uid: 5,
            gid: 6,
            ..Default::default()
        };
        let mut buf = [0xAAu8; 64];
        ino.encode(&mut buf);
        assert_eq!(buf[32..], [0xAA; 32], "a compact inode is 32 bytes");
        assert_eq!(DiskInode::decode(&buf), ino);
        assert_eq!(ino.chunk_format(), CHUNK_FORMAT_INDEXES | 3);
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
