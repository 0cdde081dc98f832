//! EROFS compressed-file structures (`erofs_fs.h`, the `z_erofs_*` half), shared by the
//! builder and the reader. Like `format`, every `decode` takes a fixed-size array and
//! leaves semantic checks to the reader.

use crate::format::{le16, le32, put16, put32};

pub const FEATURE_INCOMPAT_LZ4_0PADDING: u32 = 0x1;
/// Per-algorithm config records follow the superblock; `available_compr_algs` is a bitmap.
pub const FEATURE_INCOMPAT_COMPR_CFGS: u32 = 0x2;
/// Same bit as `COMPR_CFGS`: physical clusters may span several blocks.
pub const FEATURE_INCOMPAT_BIG_PCLUSTER: u32 = 0x2;
pub const FEATURE_INCOMPAT_COMPR_HEAD2: u32 = 0x8;
pub const FEATURE_INCOMPAT_ZTAILPACKING: u32 = 0x10;
pub const FEATURE_INCOMPAT_FRAGMENTS: u32 = 0x20;
/// Same bit as `FRAGMENTS`.
pub const FEATURE_INCOMPAT_DEDUPE: u32 = 0x20;

pub const LAYOUT_COMPRESSED_FULL: u16 = 1;
pub const LAYOUT_COMPRESSED_COMPACT: u16 = 3;

/// Largest encoded (stored) size of one physical cluster.
pub const PCLUSTER_MAX_SIZE: u32 = 1024 * 1024;
/// Largest decoded size of one physical cluster.
pub const PCLUSTER_MAX_DSIZE: u32 = 12 * 1024 * 1024;
pub const LZMA_MAX_DICT_SIZE: u32 = 8 * PCLUSTER_MAX_SIZE;
pub const ZSTD_MAX_DICT_SIZE: u32 = PCLUSTER_MAX_SIZE;

/// Default LZ4 window when the superblock records none.
pub const LZ4_MAX_DISTANCE_DEFAULT: u16 = u16::MAX;

// h_advise bits.
pub const ADVISE_COMPACTED_2B: u16 = 0x0001;
/// (COMPRESSED_FULL only, kernel 6.15+) extent records instead of lcluster indexes.
pub const ADVISE_EXTENTS: u16 = 0x0001;
pub const ADVISE_BIG_PCLUSTER_1: u16 = 0x0002;
pub const ADVISE_BIG_PCLUSTER_2: u16 = 0x0004;
pub const ADVISE_INLINE_PCLUSTER: u16 = 0x0008;
pub const ADVISE_INTERLACED_PCLUSTER: u16 = 0x0010;
pub const ADVISE_FRAGMENT_PCLUSTER: u16 = 0x0020;

pub const LCLUSTER_TYPE_PLAIN: u8 = 0;
pub const LCLUSTER_TYPE_HEAD1: u8 = 1;
pub const LCLUSTER_TYPE_NONHEAD: u8 = 2;
pub const LCLUSTER_TYPE_HEAD2: u8 = 3;
/// (full indexes, HEAD) the cluster's output is only partly this extent's.
pub const LI_PARTIAL_REF: u16 = 1 << 15;
/// Set on the first NONHEAD lcluster: `delta[0]` is the pcluster's block count.
pub const LI_D0_CBLKCNT: u16 = 1 << 11;

pub const MAP_HEADER_SIZE: usize = 8;
pub const LCLUSTER_INDEX_SIZE: usize = 8;

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
    pub advise: u16,
    /// `h_algorithmtype`: bits 0-3 HEAD1's algorithm, 4-7 HEAD2's.
    pub algorithm_type: u8,
    /// `h_clusterbits`: bits 0-3 lcluster bits - block bits; bit 7 whole file in packed inode.
    pub cluster_bits: u8,
}

impl MapHeader {
    pub const FRAGMENT_INODE_BIT: u8 = 7;

    pub fn decode(b: &[u8; MAP_HEADER_SIZE]) -> MapHeader {
        MapHeader {
            word0: le32(b, 0),
            advise: le16(b, 4),
            algorithm_type: b[6],
            cluster_bits: b[7],
        }
    }

    pub fn encode(&self) -> [u8; MAP_HEADER_SIZE] {
        let mut b = [0u8; MAP_HEADER_SIZE];
        put32(&mut b, 0, self.word0);
        put16(&mut b, 4, self.advise);
        b[6] = self.algorithm_type;
        b[7] = self.cluster_bits;
        b
    }

    /// Bytes of compressed tail stored inline after the indexes (ztailpacking).
    pub fn idata_size(&self) -> u16 {
        (self.word0 >> 16) as u16
    }

    pub fn fragment_offset(&self) -> u32 {
        self.word0
    }

    pub fn head1_algorithm(&self) -> u8 {
        self.algorithm_type & 0xF
    }

    pub fn head2_algorithm(&self) -> u8 {
        self.algorithm_type >> 4
    }

    /// log2 of the logical cluster size, given the block size's.
    pub fn lcluster_bits(&self, blkszbits: u8) -> u32 {
        u32::from(blkszbits) + u32::from(self.cluster_bits & 0xF)
    }

    pub fn whole_file_in_packed_inode(&self) -> bool {
        self.cluster_bits & (1 << Self::FRAGMENT_INODE_BIT) != 0
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
    pub fn decode(b: &[u8; LCLUSTER_INDEX_SIZE]) -> LclusterIndex {
        LclusterIndex {
            advise: le16(b, 0),
            cluster_ofs: le16(b, 2),
            word: le32(b, 4),
        }
    }

    pub fn encode(&self) -> [u8; LCLUSTER_INDEX_SIZE] {
        let mut b = [0u8; LCLUSTER_INDEX_SIZE];
        put16(&mut b, 0, self.advise);
        put16(&mut b, 2, self.cluster_ofs);
        put32(&mut b, 4, self.word);
        b
    }

    pub fn kind(&self) -> u8 {
        (self.advise & 3) as u8
    }

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
    Lz4 {
        max_distance: u16,
        max_pclusterblks: u16,
    },
    Lzma {
        dict_size: u32,
        format: u16,
    },
    Deflate {
        windowbits: u8,
    },
    Zstd {
        format: u8,
        /// windowLog - 10 (ZSTD_WINDOWLOG_ABSOLUTEMIN).
        windowlog: u8,
    },
}

impl ComprCfg {
    /// The record's payload size for an algorithm (`Z_EROFS_COMPRESSION_*`).
    pub fn payload_size(algorithm: u8) -> Option<usize> {
        match algorithm {
            0 | 1 => Some(14),
            2 | 3 => Some(6),
            _ => None,
        }
    }

    /// Decodes one record's payload; `None` if the algorithm is unknown or the size wrong.
    pub fn decode(algorithm: u8, payload: &[u8]) -> Option<ComprCfg> {
        if Some(payload.len()) != Self::payload_size(algorithm) {
            return None;
        }
        Some(match algorithm {
            0 => ComprCfg::Lz4 {
                max_distance: le16(payload, 0),
                max_pclusterblks: le16(payload, 2),
            },
            1 => ComprCfg::Lzma {
                dict_size: le32(payload, 0),
                format: le16(payload, 4),
            },
            2 => ComprCfg::Deflate {
                windowbits: payload[0],
            },
            _ => ComprCfg::Zstd {
                format: payload[0],
                windowlog: payload[1],
            },
        })
    }

    pub fn algorithm(&self) -> u8 {
        match self {
            ComprCfg::Lz4 { .. } => 0,
            ComprCfg::Lzma { .. } => 1,
            ComprCfg::Deflate { .. } => 2,
            ComprCfg::Zstd { .. } => 3,
        }
    }

    /// The whole record: length, then payload.
    pub fn encode(&self) -> Vec<u8> {
        let size = Self::payload_size(self.algorithm()).unwrap_or(0);
        let mut b = vec![0u8; 2 + size];
        put16(&mut b, 0, size as u16);
        let p = &mut b[2..];
        match *self {
            ComprCfg::Lz4 {
                max_distance,
                max_pclusterblks,
            } => {
                put16(p, 0, max_distance);
                put16(p, 2, max_pclusterblks);
            }
            ComprCfg::Lzma { dict_size, format } => {
                put32(p, 0, dict_size);
                put16(p, 4, format);
            }
            ComprCfg::Deflate { windowbits } => p[0] = windowbits,
            ComprCfg::Zstd { format, windowlog } => {
                p[0] = format;
                p[1] = windowlog;
            }
        }
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

    #[test]
    fn index_positions() {
        // A 32-byte compact inode at byte 4096 with no xattrs: header at 4128, full
        // indexes from 4144.
        assert_eq!(map_header_start(4128), 4128);
        assert_eq!(map_header_start(4130), 4136);
        assert_eq!(full_index_start(4128), 4144);
    }
}
