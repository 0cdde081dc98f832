//! EROFS compressed-file structures (`erofs_fs.h`, the `z_erofs_*` half), shared by the
//! builder and the reader. Like `format`: layouts are declared once, in [`raw`]; every
//! `decode` takes a fixed-size array (or checks the length) and leaves semantic checks to
//! the reader.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, IntoBytes};

/// The superblock's compression feature bits, declared with the others in `format`.
pub use crate::format::{
    FEATURE_INCOMPAT_BIG_PCLUSTER, FEATURE_INCOMPAT_COMPR_CFGS, FEATURE_INCOMPAT_COMPR_HEAD2,
    FEATURE_INCOMPAT_DEDUPE, FEATURE_INCOMPAT_FRAGMENTS, FEATURE_INCOMPAT_LZ4_0PADDING,
    FEATURE_INCOMPAT_ZTAILPACKING,
};

/// Data layout: compressed, with full (8-byte) lcluster indexes.
pub const LAYOUT_COMPRESSED_FULL: u16 = 1;
/// Data layout: compressed, with compact (2- or 4-byte) lcluster indexes.
pub const LAYOUT_COMPRESSED_COMPACT: u16 = 3;

/// Largest encoded (stored) size of one physical cluster.
pub const PCLUSTER_MAX_SIZE: u32 = 1024 * 1024;
/// Largest decoded size of one physical cluster.
pub const PCLUSTER_MAX_DSIZE: u32 = 12 * 1024 * 1024;
/// Largest LZMA dictionary size, in bytes.
pub const LZMA_MAX_DICT_SIZE: u32 = 8 * PCLUSTER_MAX_SIZE;
/// Largest Zstandard dictionary size, in bytes.
pub const ZSTD_MAX_DICT_SIZE: u32 = PCLUSTER_MAX_SIZE;

/// Default LZ4 window when the superblock records none.
pub const LZ4_MAX_DISTANCE_DEFAULT: u16 = u16::MAX;

// h_advise bits.
/// (COMPRESSED_COMPACT only) 2-byte index packs are used where aligned.
pub const ADVISE_COMPACTED_2B: u16 = 0x0001;
/// (COMPRESSED_FULL only, kernel 6.15+) extent records instead of lcluster indexes.
pub const ADVISE_EXTENTS: u16 = 0x0001;
/// HEAD1 pclusters may span several blocks.
pub const ADVISE_BIG_PCLUSTER_1: u16 = 0x0002;
/// HEAD2 pclusters may span several blocks.
pub const ADVISE_BIG_PCLUSTER_2: u16 = 0x0004;
/// The last pcluster is stored inline after the indexes (ztailpacking).
pub const ADVISE_INLINE_PCLUSTER: u16 = 0x0008;
/// Uncompressed pclusters are stored interlaced (rotated by the cluster offset).
pub const ADVISE_INTERLACED_PCLUSTER: u16 = 0x0010;
/// The file's tail is a fragment in the packed inode.
pub const ADVISE_FRAGMENT_PCLUSTER: u16 = 0x0020;

/// Lcluster type: the head of an uncompressed pcluster.
pub const LCLUSTER_TYPE_PLAIN: u8 = 0;
/// Lcluster type: the head of a pcluster compressed with HEAD1's algorithm.
pub const LCLUSTER_TYPE_HEAD1: u8 = 1;
/// Lcluster type: a continuation of the pcluster of an earlier head.
pub const LCLUSTER_TYPE_NONHEAD: u8 = 2;
/// Lcluster type: the head of a pcluster compressed with HEAD2's algorithm.
pub const LCLUSTER_TYPE_HEAD2: u8 = 3;
/// (full indexes, HEAD) the cluster's output is only partly this extent's.
pub const LI_PARTIAL_REF: u16 = 1 << 15;
/// Set on the first NONHEAD lcluster: `delta[0]` is the pcluster's block count.
pub const LI_D0_CBLKCNT: u16 = 1 << 11;

/// Size of the map header (8 bytes).
pub const MAP_HEADER_SIZE: usize = size_of::<raw::MapHeader>();
/// Size of a full lcluster index (8 bytes).
pub const LCLUSTER_INDEX_SIZE: usize = size_of::<raw::LclusterIndex>();

/// The on-disk structures of compressed files, named as in `erofs_fs.h`, all little-endian
/// (see `format::raw`).
pub mod raw {
    use crate::format::ondisk;
    use zerocopy::little_endian::{U16, U32};

    ondisk! {
        /// `struct z_erofs_map_header`, where a compressed inode's indexes start.
        pub struct MapHeader {
            /// Union: `h_fragmentoff`, or `h_reserved1` then `h_idata_size` (its high half).
            pub h_fragmentoff: U32,
            /// `ADVISE_*` bits.
            pub h_advise: U16,
            /// Bits 0-3 HEAD1's algorithm, 4-7 HEAD2's.
            pub h_algorithmtype: u8,
            /// Bits 0-3 lcluster bits - block bits; bit 7 the whole file in the packed inode.
            pub h_clusterbits: u8,
        }

        /// `struct z_erofs_lcluster_index`, one logical cluster of a COMPRESSED_FULL inode.
        pub struct LclusterIndex {
            /// Lcluster type (bits 0-1) and `LI_PARTIAL_REF`.
            pub di_advise: U16,
            /// Offset in the lcluster where the extent starting here begins.
            pub di_clusterofs: U16,
            /// Union `di_u`: `blkaddr` (HEAD/PLAIN) or `delta[0]`, `delta[1]` (NONHEAD), the
            /// low and high half.
            pub di_u: U32,
        }

        /// `struct z_erofs_lz4_cfgs`.
        pub struct Lz4Cfgs {
            /// LZ4 window size, in bytes.
            pub max_distance: U16,
            /// Largest pcluster size, in blocks.
            pub max_pclusterblks: U16,
            /// Reserved (zero).
            pub reserved: [u8; 10],
        }

        /// `struct z_erofs_lzma_cfgs`.
        pub struct LzmaCfgs {
            /// LZMA dictionary size, in bytes.
            pub dict_size: U32,
            /// LZMA format variant.
            pub format: U16,
            /// Reserved (zero).
            pub reserved: [u8; 8],
        }

        /// `struct z_erofs_deflate_cfgs`.
        pub struct DeflateCfgs {
            /// log2 of the DEFLATE window size.
            pub windowbits: u8,
            /// Reserved (zero).
            pub reserved: [u8; 5],
        }

        /// `struct z_erofs_zstd_cfgs`.
        pub struct ZstdCfgs {
            /// Zstandard format variant.
            pub format: u8,
            /// windowLog - 10 (ZSTD_WINDOWLOG_ABSOLUTEMIN).
            pub windowlog: u8,
            /// Reserved (zero).
            pub reserved: [u8; 4],
        }
    }

    /// A pack of COMPRESSED_COMPACT indexes (kernel `unpack_compacted_index`): `entries`
    /// holds each lcluster's type and low bits, bit-packed, and `blkaddr` is the block the
    /// pack's first HEAD counts from.
    #[repr(C)]
    #[derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::Immutable,
        zerocopy::KnownLayout,
        zerocopy::Unaligned,
        Clone,
        Copy,
        Debug,
        PartialEq,
        Eq,
    )]
    pub struct CompactPack<const N: usize> {
        /// Bit-packed lcluster types and low bits.
        pub entries: [u8; N],
        /// Block the pack's first HEAD counts from.
        pub blkaddr: U32,
    }

    /// 2 lclusters of 4 bytes each (amortized).
    pub type CompactPack4B = CompactPack<4>;
    /// 16 lclusters of 2 bytes each (amortized).
    pub type CompactPack2B = CompactPack<28>;
}

// Sizes as `erofs_fs.h` declares them (the packs: as the kernel's `zmap.c` reads them).
const _: () = {
    assert!(size_of::<raw::MapHeader>() == 8);
    assert!(size_of::<raw::LclusterIndex>() == 8);
    assert!(size_of::<raw::Lz4Cfgs>() == 14);
    assert!(size_of::<raw::LzmaCfgs>() == 14);
    assert!(size_of::<raw::DeflateCfgs>() == 6);
    assert!(size_of::<raw::ZstdCfgs>() == 6);
    assert!(size_of::<raw::CompactPack4B>() == 2 * 4);
    assert!(size_of::<raw::CompactPack2B>() == 16 * 2);
};

/// The `blkaddr` of a compact pack of either size; `None` for any other length.
pub fn compact_pack_blkaddr(pack: &[u8]) -> Option<u32> {
    let four = raw::CompactPack4B::ref_from_bytes(pack).map(|p| p.blkaddr);
    let two = raw::CompactPack2B::ref_from_bytes(pack).map(|p| p.blkaddr);
    four.ok().or(two.ok()).map(U32::get)
}

/// Where the map header of an inode whose inode + inline xattrs end at byte `end` starts.
pub fn map_header_start(end: u64) -> u64 {
    end.next_multiple_of(8)
}

/// Where full (8-byte) lcluster indexes start: the header, then 8 reserved bytes.
pub fn full_index_start(end: u64) -> u64 {
    map_header_start(end) + MAP_HEADER_SIZE as u64 + 8
}

/// `z_erofs_map_header`: how a compressed inode's indexes are to be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapHeader {
    /// `h_fragmentoff` (whole file in the packed inode), else `h_reserved1 | h_idata_size << 16`.
    pub word0: u32,
    /// `h_advise`: `ADVISE_*` bits.
    pub advise: u16,
    /// `h_algorithmtype`: bits 0-3 HEAD1's algorithm, 4-7 HEAD2's.
    pub algorithm_type: u8,
    /// `h_clusterbits`: bits 0-3 lcluster bits - block bits; bit 7 whole file in packed inode.
    pub cluster_bits: u8,
}

impl MapHeader {
    /// Bit of `cluster_bits` set when the whole file is in the packed inode.
    pub const FRAGMENT_INODE_BIT: u8 = 7;

    /// Decodes a map header.
    pub fn decode(b: &[u8; MAP_HEADER_SIZE]) -> MapHeader {
        let r: &raw::MapHeader = zerocopy::transmute_ref!(b);
        MapHeader {
            word0: r.h_fragmentoff.get(),
            advise: r.h_advise.get(),
            algorithm_type: r.h_algorithmtype,
            cluster_bits: r.h_clusterbits,
        }
    }

    /// Encodes the map header.
    pub fn encode(&self) -> [u8; MAP_HEADER_SIZE] {
        zerocopy::transmute!(raw::MapHeader {
            h_fragmentoff: self.word0.into(),
            h_advise: self.advise.into(),
            h_algorithmtype: self.algorithm_type,
            h_clusterbits: self.cluster_bits,
        })
    }

    /// Bytes of compressed tail stored inline after the indexes (ztailpacking).
    pub fn idata_size(&self) -> u16 {
        (self.word0 >> 16) as u16
    }

    /// Offset of the file's tail fragment in the packed inode (`h_fragmentoff`).
    pub fn fragment_offset(&self) -> u32 {
        self.word0
    }

    /// Compression algorithm of HEAD1 lclusters (`Z_EROFS_COMPRESSION_*`).
    pub fn head1_algorithm(&self) -> u8 {
        self.algorithm_type & 0xF
    }

    /// Compression algorithm of HEAD2 lclusters (`Z_EROFS_COMPRESSION_*`).
    pub fn head2_algorithm(&self) -> u8 {
        self.algorithm_type >> 4
    }

    /// log2 of the logical cluster size, given the block size's.
    pub fn lcluster_bits(&self, blkszbits: u8) -> u32 {
        u32::from(blkszbits) + u32::from(self.cluster_bits & 0xF)
    }

    /// Whether the whole file is a fragment in the packed inode.
    pub fn whole_file_in_packed_inode(&self) -> bool {
        self.cluster_bits & (1 << Self::FRAGMENT_INODE_BIT) != 0
    }

    /// With the whole file in the packed inode, the header is one le64 (kernel
    /// `z_erofs_fill_inode_lazy`): this bit 63, and below it the offset there.
    pub fn whole_file_fragment_offset(&self) -> u64 {
        let word: U64 = zerocopy::transmute!(self.encode());
        word.get() & !(1 << 63)
    }
}

/// `z_erofs_lcluster_index` (COMPRESSED_FULL): one logical cluster's record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LclusterIndex {
    /// `di_advise`: bits 0-1 the lcluster type, plus `LI_PARTIAL_REF`.
    pub advise: u16,
    /// Where in this lcluster the extent that starts here starts (HEAD/PLAIN).
    pub cluster_ofs: u16,
    /// HEAD/PLAIN: the pcluster's first block. NONHEAD: `delta[0] | delta[1] << 16`.
    pub word: u32,
}

impl LclusterIndex {
    /// Decodes a full lcluster index.
    pub fn decode(b: &[u8; LCLUSTER_INDEX_SIZE]) -> LclusterIndex {
        let r: &raw::LclusterIndex = zerocopy::transmute_ref!(b);
        LclusterIndex {
            advise: r.di_advise.get(),
            cluster_ofs: r.di_clusterofs.get(),
            word: r.di_u.get(),
        }
    }

    /// Encodes the lcluster index.
    pub fn encode(&self) -> [u8; LCLUSTER_INDEX_SIZE] {
        zerocopy::transmute!(raw::LclusterIndex {
            di_advise: self.advise.into(),
            di_clusterofs: self.cluster_ofs.into(),
            di_u: self.word.into(),
        })
    }

    /// Lcluster type (`LCLUSTER_TYPE_*`), bits 0-1 of `advise`.
    pub fn kind(&self) -> u8 {
        (self.advise & 3) as u8
    }

    /// HEAD/PLAIN: the pcluster's first block.
    pub fn blkaddr(&self) -> u32 {
        self.word
    }

    /// NONHEAD: (distance back to the HEAD lcluster, distance on to the next HEAD).
    pub fn delta(&self) -> [u16; 2] {
        [self.word as u16, (self.word >> 16) as u16]
    }
}

/// The per-algorithm config records that follow the superblock when `COMPR_CFGS` is set:
/// for each bit of `available_compr_algs`, lowest first, a little-endian u16 length then
/// that many bytes (LZ4 14, LZMA 14, DEFLATE 6, Zstandard 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComprCfg {
    /// LZ4 (`Z_EROFS_COMPRESSION_LZ4`).
    Lz4 {
        /// LZ4 window size, in bytes.
        max_distance: u16,
        /// Largest pcluster size, in blocks.
        max_pclusterblks: u16,
    },
    /// LZMA (`Z_EROFS_COMPRESSION_LZMA`).
    Lzma {
        /// LZMA dictionary size, in bytes.
        dict_size: u32,
        /// LZMA format variant.
        format: u16,
    },
    /// DEFLATE (`Z_EROFS_COMPRESSION_DEFLATE`).
    Deflate {
        /// log2 of the DEFLATE window size.
        windowbits: u8,
    },
    /// Zstandard (`Z_EROFS_COMPRESSION_ZSTD`).
    Zstd {
        /// Zstandard format variant.
        format: u8,
        /// windowLog - 10 (ZSTD_WINDOWLOG_ABSOLUTEMIN).
        windowlog: u8,
    },
}

impl ComprCfg {
    /// The record's payload size for an algorithm (`Z_EROFS_COMPRESSION_*`).
    pub fn payload_size(algorithm: u8) -> Option<usize> {
        match algorithm {
            0 => Some(size_of::<raw::Lz4Cfgs>()),
            1 => Some(size_of::<raw::LzmaCfgs>()),
            2 => Some(size_of::<raw::DeflateCfgs>()),
            3 => Some(size_of::<raw::ZstdCfgs>()),
            _ => None,
        }
    }

    /// Decodes one record's payload; `None` if the algorithm is unknown or the size wrong.
    pub fn decode(algorithm: u8, payload: &[u8]) -> Option<ComprCfg> {
        Some(match algorithm {
            0 => {
                let c = raw::Lz4Cfgs::ref_from_bytes(payload).ok()?;
                ComprCfg::Lz4 {
                    max_distance: c.max_distance.get(),
                    max_pclusterblks: c.max_pclusterblks.get(),
                }
            }
            1 => {
                let c = raw::LzmaCfgs::ref_from_bytes(payload).ok()?;
                ComprCfg::Lzma {
                    dict_size: c.dict_size.get(),
                    format: c.format.get(),
                }
            }
            2 => {
                let c = raw::DeflateCfgs::ref_from_bytes(payload).ok()?;
                ComprCfg::Deflate {
                    windowbits: c.windowbits,
                }
            }
            3 => {
                let c = raw::ZstdCfgs::ref_from_bytes(payload).ok()?;
                ComprCfg::Zstd {
                    format: c.format,
                    windowlog: c.windowlog,
                }
            }
            _ => return None,
        })
    }

    /// Algorithm number of the record (`Z_EROFS_COMPRESSION_*`).
    pub fn algorithm(&self) -> u8 {
        match self {
            ComprCfg::Lz4 { .. } => 0,
            ComprCfg::Lzma { .. } => 1,
            ComprCfg::Deflate { .. } => 2,
            ComprCfg::Zstd { .. } => 3,
        }
    }

    /// The whole record: a le16 length, then the payload.
    pub fn encode(&self) -> Vec<u8> {
        let payload = match *self {
            ComprCfg::Lz4 {
                max_distance,
                max_pclusterblks,
            } => raw::Lz4Cfgs {
                max_distance: max_distance.into(),
                max_pclusterblks: max_pclusterblks.into(),
                ..Default::default()
            }
            .as_bytes()
            .to_vec(),
            ComprCfg::Lzma { dict_size, format } => raw::LzmaCfgs {
                dict_size: dict_size.into(),
                format: format.into(),
                ..Default::default()
            }
            .as_bytes()
            .to_vec(),
            ComprCfg::Deflate { windowbits } => raw::DeflateCfgs {
                windowbits,
                ..Default::default()
            }
            .as_bytes()
            .to_vec(),
            ComprCfg::Zstd { format, windowlog } => raw::ZstdCfgs {
                format,
                windowlog,
                ..Default::default()
            }
            .as_bytes()
            .to_vec(),
        };
        let mut b = U16::new(payload.len() as u16).as_bytes().to_vec();
        b.extend_from_slice(&payload);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_header_round_trips() {
        let h = MapHeader {
            word0: 123 << 16,
            advise: ADVISE_BIG_PCLUSTER_1 | ADVISE_INLINE_PCLUSTER,
            algorithm_type: 0x30,
            cluster_bits: 0x81,
        };
        let d = MapHeader::decode(&h.encode());
        assert_eq!(d, h);
        assert_eq!(d.idata_size(), 123);
        assert_eq!((d.head1_algorithm(), d.head2_algorithm()), (0, 3));
        assert_eq!(d.lcluster_bits(12), 13);
        assert!(d.whole_file_in_packed_inode());
        // As erofs_fs.h checks at build time: bit 7 of h_clusterbits is bit 63 of the word.
        let only_fragment = MapHeader {
            cluster_bits: 1 << MapHeader::FRAGMENT_INODE_BIT,
            ..Default::default()
        };
        assert_eq!(u64::from_le_bytes(only_fragment.encode()), 1 << 63);
    }

    #[test]
    fn lcluster_index_round_trips() {
        let i = LclusterIndex {
            advise: u16::from(LCLUSTER_TYPE_NONHEAD) | LI_D0_CBLKCNT,
            cluster_ofs: 0,
            word: 4 | (7 << 16),
        };
        let d = LclusterIndex::decode(&i.encode());
        assert_eq!(d, i);
        assert_eq!(d.kind(), LCLUSTER_TYPE_NONHEAD);
        assert_eq!(d.delta(), [4, 7]);
    }

    #[test]
    fn config_records_round_trip() {
        for c in [
            ComprCfg::Lz4 {
                max_distance: 65535,
                max_pclusterblks: 16,
            },
            ComprCfg::Lzma {
                dict_size: 1 << 20,
                format: 0,
            },
            ComprCfg::Deflate { windowbits: 15 },
            ComprCfg::Zstd {
                format: 0,
                windowlog: 7,
            },
        ] {
            let rec = c.encode();
            let size = usize::from(u16::from_le_bytes([rec[0], rec[1]]));
            assert_eq!(size + 2, rec.len());
            assert_eq!(ComprCfg::decode(c.algorithm(), &rec[2..]), Some(c));
        }
        assert_eq!(ComprCfg::decode(4, &[0; 6]), None);
        assert_eq!(ComprCfg::decode(0, &[0; 6]), None);
    }

    /// Field offsets as `erofs_fs.h` lays them out.
    #[test]
    fn offsets_match_erofs_fs_h() {
        use core::mem::offset_of;
        assert_eq!(offset_of!(raw::MapHeader, h_advise), 4);
        assert_eq!(offset_of!(raw::MapHeader, h_algorithmtype), 6);
        assert_eq!(offset_of!(raw::MapHeader, h_clusterbits), 7);
        assert_eq!(offset_of!(raw::LclusterIndex, di_clusterofs), 2);
        assert_eq!(offset_of!(raw::LclusterIndex, di_u), 4);
        assert_eq!(offset_of!(raw::Lz4Cfgs, max_pclusterblks), 2);
        assert_eq!(offset_of!(raw::LzmaCfgs, format), 4);
        assert_eq!(offset_of!(raw::ZstdCfgs, windowlog), 1);
        assert_eq!(offset_of!(raw::CompactPack4B, blkaddr), 4);
        assert_eq!(offset_of!(raw::CompactPack2B, blkaddr), 28);
    }

    #[test]
    fn whole_file_fragment_offset() {
        let mut raw = (1u64 << 63 | 0x12_3456_789A).to_le_bytes();
        let h = MapHeader::decode(&raw);
        assert!(h.whole_file_in_packed_inode());
        assert_eq!(h.whole_file_fragment_offset(), 0x12_3456_789A);
        raw[7] = 0;
        assert!(!MapHeader::decode(&raw).whole_file_in_packed_inode());
    }

    #[test]
    fn compact_pack_blkaddr_is_the_last_word() {
        let mut pack = [0u8; 32];
        pack[28..].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(compact_pack_blkaddr(&pack), Some(7));
        pack[4..8].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(compact_pack_blkaddr(&pack[..8]), Some(9));
        assert_eq!(compact_pack_blkaddr(&pack[..12]), None);
    }

    #[test]
    fn index_positions() {
        // A 32-byte compact inode at byte 4096 with no xattrs: header at 4128, full
        // indexes from 4144.
        assert_eq!(map_header_start(4128), 4128);
        assert_eq!(map_header_start(4130), 4136);
        assert_eq!(full_index_start(4128), 4144);
    }
}
