//! Compressed regular files (`-z`): each file's data is cut into physical clusters
//! ("pclusters") filled by [`codecs::Compressor::fill`], described by full (8-byte)
//! logical-cluster indexes after the inode, as the kernel's `zmap.c` reads them.
//!
//! Files are compressed before layout, all cores at once, in fixed-size segments (so
//! a large file uses every core too, and the output never depends on the thread count):
//! the layout then knows each file's index size and stored blocks. A file whose
//! clusters would take as many blocks as its plain data stays uncompressed.

use super::tree::{Content, Kind, NodeId, Tree};
use super::{Error, Progress};
use crate::zformat::*;
use codecs::{Algorithm, Compression, Compressor};
use rayon::prelude::*;
use std::os::unix::fs::FileExt;

/// Input of one segment: compressed independently, so it is the unit of parallel work.
/// A multiple of every block size; a cluster never spans two segments.
const SEGMENT: u64 = 4 << 20;
/// Most input one cluster may take (the kernel refuses extents over 12 MiB decoded;
/// erofs-utils 1.5 fed at most its queue of about 1 MiB).
const MAX_EXTENT_INPUT: usize = 1 << 20;

/// What to compress with and into which cluster size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub compression: Compression,
    /// Physical cluster size: a multiple of the block size, at most 1 MiB.
    pub pcluster: u32,
}

/// One extent: `len` bytes of the file stored in `blocks` blocks, compressed or raw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    len: u32,
    blocks: u32,
    raw: bool,
}

/// A regular file compressed: its clusters back to back and what indexes them.
#[derive(Debug)]
pub struct Packed {
    /// The clusters, block-aligned; compressed data ends its cluster (zero padding first).
    pub data: Vec<u8>,
    extents: Vec<Extent>,
    /// The file's fs-verity digest (of its uncompressed contents), when sealing.
    pub digest: Option<Vec<u8>>,
}

impl Packed {
    pub fn blocks(&self, bs: u64) -> u64 {
        self.data.len() as u64 / bs
    }

    /// Bytes after an inode whose body (inode and inline xattrs) is `head` bytes long:
    /// padding to 8, the map header, 8 reserved bytes, then one index per logical cluster.
    pub fn meta_len(&self, head: u64, size: u64, bs: u64) -> u64 {
        full_index_start(head) - head + LCLUSTER_INDEX_SIZE as u64 * size.div_ceil(bs)
    }

    /// The map header and indexes (from the 8-aligned end of the inode body), for data
    /// stored from block `start`.
    pub fn encode_meta(&self, settings: &Settings, start: u32, bs: u64) -> Vec<u8> {
        let big = settings.pcluster as u64 > bs;
        let header = MapHeader {
            word0: 0,
            advise: if big { ADVISE_BIG_PCLUSTER_1 } else { 0 },
            algorithm_type: settings.compression.algorithm.erofs_id(),
            cluster_bits: 0, // logical clusters of one block, as mkfs.erofs makes them
        };
        let mut out = header.encode().to_vec();
        out.extend_from_slice(&[0u8; 8]);
        for i in full_indexes(&self.extents, start, bs, big) {
            out.extend_from_slice(&i.encode());
        }
        out
    }
}

/// Full lcluster indexes for extents stored back to back from block `start`, as
/// erofs-utils' `z_erofs_write_full_indexes` writes them (logical clusters of one block):
/// a HEAD (or PLAIN, for raw data) where an extent starts, NONHEADs with the distances
/// back to it and on to the next HEAD, the first NONHEAD carrying the cluster's block
/// count when clusters may span blocks, and a final PLAIN marking where the data ends in
/// a last, partly used logical cluster.
fn full_indexes(extents: &[Extent], start: u32, bs: u64, big: bool) -> Vec<LclusterIndex> {
    let bits = bs.trailing_zeros();
    let mut out = Vec::new();
    let mut clusterofs = 0u64;
    let mut blkaddr = start;
    for e in extents {
        let head_kind = if e.raw {
            LCLUSTER_TYPE_PLAIN
        } else {
            LCLUSTER_TYPE_HEAD1
        };
        let mut count = u64::from(e.len);
        let mut d0 = 0u64;
        let mut d1 = (clusterofs + count) >> bits;
        if d1 == 0 {
            // The file's last extent, starting and ending inside its last lcluster.
            out.push(LclusterIndex {
                advise: u16::from(head_kind),
                cluster_ofs: clusterofs as u16,
                word: blkaddr,
            });
            clusterofs = 0;
            blkaddr += e.blocks;
            continue;
        }
        loop {
            let index = if d0 == 0 {
                LclusterIndex {
                    advise: u16::from(head_kind),
                    cluster_ofs: clusterofs as u16,
                    word: blkaddr,
                }
            } else {
                let delta0 = if d0 == 1 && big {
                    e.blocks as u16 | LI_D0_CBLKCNT
                } else {
                    // Past 2047 the CBLKCNT bit would be misread: the kernel looks back
                    // 2047 at a time instead.
                    d0.min(u64::from(LI_D0_CBLKCNT) - 1) as u16
                };
                LclusterIndex {
                    advise: u16::from(LCLUSTER_TYPE_NONHEAD),
                    cluster_ofs: 0,
                    word: u32::from(delta0) | (d1.min(u64::from(u16::MAX)) as u32) << 16,
                }
            };
            out.push(index);
            count -= bs - clusterofs;
            clusterofs = 0;
            d0 += 1;
            d1 -= 1;
            if clusterofs + count < bs {
                break;
            }
        }
        clusterofs += count;
        blkaddr += e.blocks;
    }
    if clusterofs != 0 {
        out.push(LclusterIndex {
            advise: u16::from(LCLUSTER_TYPE_PLAIN),
            cluster_ofs: clusterofs as u16,
            word: 0,
        });
    }
    out
}

/// The superblock's share of compression: incompat bits, the `u1` word
/// (`available_compr_algs`, or LZ4's window without config records) and the config
/// records that follow the superblock.
pub struct SuperFields {
    pub incompat: u32,
    pub u1: u16,
    pub records: Vec<u8>,
}

pub fn super_fields(s: &Settings, bs: u64) -> SuperFields {
    let alg = s.compression.algorithm;
    let window = codecs::window_size(alg, s.pcluster);
    // Data ends its cluster after zero padding: required for all but LZ4, where it also
    // lets the kernel decode exactly instead of guessing the end.
    let mut incompat = FEATURE_INCOMPAT_LZ4_0PADDING;
    if alg == Algorithm::Lz4 && u64::from(s.pcluster) == bs {
        // The kernel's defaults (one-block clusters, LZ4 only) need no records.
        return SuperFields {
            incompat,
            u1: window as u16,
            records: Vec::new(),
        };
    }
    incompat |= FEATURE_INCOMPAT_COMPR_CFGS; // also BIG_PCLUSTER, the same bit
    let cfg = match alg {
        Algorithm::Lz4 => ComprCfg::Lz4 {
            max_distance: window as u16,
            max_pclusterblks: (u64::from(s.pcluster) / bs) as u16,
        },
        Algorithm::Lzma => ComprCfg::Lzma {
            dict_size: window,
            format: 0,
        },
        Algorithm::Deflate => ComprCfg::Deflate {
            windowbits: codecs::DEFLATE_WINDOW_BITS,
        },
        Algorithm::Zstd => ComprCfg::Zstd {
            format: 0,
            windowlog: (window.trailing_zeros() - 10) as u8,
        },
    };
    SuperFields {
        incompat,
        u1: 1 << alg.erofs_id(),
        records: cfg.encode(),
    }
}

/// One segment's result.
struct Segment {
    extents: Vec<Extent>,
    data: Vec<u8>,
    /// Level-0 fs-verity hashes of the segment's uncompressed blocks.
    level0: Vec<u8>,
}

/// Compresses every non-empty regular file; `None` for files left uncompressed.
pub fn compress_files(
    tree: &Tree,
    s: &Settings,
    bs: u64,
    digests: bool,
    progress: &dyn Progress,
) -> Result<Vec<Option<Packed>>, Error> {
    let mut work: Vec<(NodeId, u64)> = Vec::new();
    for (id, node) in tree.nodes.iter().enumerate() {
        if matches!(node.kind, Kind::Regular { .. }) && node.size > 0 {
            work.extend((0..node.size.div_ceil(SEGMENT)).map(|k| (id, k * SEGMENT)));
        }
    }
    let total = work
        .iter()
        .map(|&(id, from)| SEGMENT.min(tree.nodes[id].size - from))
        .sum();
    progress.compressing(total);
    let segments: Vec<Segment> = work
        .par_iter()
        .map_init(
            || Compressor::with_max_pcluster(s.compression, s.pcluster),
            |z, &(id, from)| {
                let seg = compress_segment(tree, id, from, z, s.pcluster as usize, bs, digests)?;
                progress.wrote(SEGMENT.min(tree.nodes[id].size - from));
                Ok(seg)
            },
        )
        .collect::<Result<_, Error>>()?;

    let mut out: Vec<Option<Packed>> = (0..tree.nodes.len()).map(|_| None).collect();
    let mut segments = segments.into_iter();
    let mut k = 0;
    while k < work.len() {
        let id = work[k].0;
        let n = tree.nodes[id].size.div_ceil(SEGMENT) as usize;
        let parts: Vec<Segment> = segments.by_ref().take(n).collect();
        k += n;
        out[id] = assemble(tree, id, parts, bs, digests);
    }
    Ok(out)
}

/// Joins a file's segments; `None` when compression saves no block.
fn assemble(
    tree: &Tree,
    id: NodeId,
    parts: Vec<Segment>,
    bs: u64,
    digests: bool,
) -> Option<Packed> {
    let node = &tree.nodes[id];
    let stored: u64 = parts.iter().map(|p| p.data.len() as u64).sum::<u64>() / bs;
    if stored >= plain_blocks(node, bs) {
        return None;
    }
    let mut data = Vec::with_capacity((stored * bs) as usize);
    let mut extents = Vec::new();
    let mut level0 = Vec::new();
    for p in parts {
        data.extend_from_slice(&p.data);
        extents.extend_from_slice(&p.extents);
        level0.extend_from_slice(&p.level0);
    }
    let digest = digests.then(|| {
        let params = super::write::verity_params();
        let tree = verity::Tree::from_level0(&params, level0);
        verity::Descriptor::new(&params, node.size, &tree.root).digest(params.alg)
    });
    Some(Packed {
        data,
        extents,
        digest,
    })
}

/// Blocks the file takes uncompressed (a sparse file's holes take none).
fn plain_blocks(node: &super::tree::Node, bs: u64) -> u64 {
    match &node.kind {
        Kind::Regular {
            extents: Some(extents),
            ..
        } => extents.iter().map(|&(s, e)| e.div_ceil(bs) - s / bs).sum(),
        _ => node.size.div_ceil(bs),
    }
}

fn compress_segment(
    tree: &Tree,
    id: NodeId,
    from: u64,
    z: &mut Compressor,
    pcluster: usize,
    bs: u64,
    digests: bool,
) -> Result<Segment, Error> {
    let node = &tree.nodes[id];
    let len = SEGMENT.min(node.size - from) as usize;
    let src = read_segment(tree, id, from, len)?;
    let bsz = bs as usize;
    let mut seg = Segment {
        extents: Vec::new(),
        data: Vec::new(),
        level0: Vec::new(),
    };
    let mut dst = vec![0u8; pcluster];
    let mut pos = 0;
    while pos < len {
        let left = len - pos;
        // Blocks to store as is when compressing does not pay.
        let mut raw_blocks = 1;
        if left > bsz {
            let window = &src[pos..pos + left.min(MAX_EXTENT_INPUT)];
            let (used, wrote) = z
                .fill(window, &mut dst)
                .map_err(|e| Error::Input(format!("{}: {e}", tree.path_of(id))))?;
            let blocks = wrote.div_ceil(bsz);
            // Kept only when it takes fewer blocks than its input would.
            if wrote > 0 && blocks * bsz < used {
                seg.data.resize(seg.data.len() + blocks * bsz - wrote, 0);
                seg.data.extend_from_slice(&dst[..wrote]);
                seg.extents.push(Extent {
                    len: used as u32,
                    blocks: blocks as u32,
                    raw: false,
                });
                pos += used;
                continue;
            }
            // What did not shrink is stored as is, as erofs-utils does: retrying from
            // every next block would compress incompressible data a cluster at a time.
            raw_blocks = (used.min(pcluster) / bsz).max(1);
        }
        for _ in 0..raw_blocks {
            if pos == len {
                break;
            }
            // One block's worth per extent, from the block's start ("shifted").
            let n = (len - pos).min(bsz);
            seg.data.extend_from_slice(&src[pos..pos + n]);
            seg.data.resize(seg.data.len().next_multiple_of(bsz), 0);
            seg.extents.push(Extent {
                len: n as u32,
                blocks: 1,
                raw: true,
            });
            pos += n;
        }
    }
    if digests {
        let params = super::write::verity_params();
        let vb = params.block_size as usize;
        seg.level0 = vec![0u8; len.div_ceil(vb) * params.alg.digest_size()];
        verity::hash_blocks(&params, &[], &src, &mut seg.level0);
    }
    Ok(seg)
}

/// `len` bytes of a file's contents from `from`, checking a host file did not change.
fn read_segment(tree: &Tree, id: NodeId, from: u64, len: usize) -> Result<Vec<u8>, Error> {
    let node = &tree.nodes[id];
    let Kind::Regular { content, .. } = &node.kind else {
        unreachable!("only regular files are compressed");
    };
    let mut buf = vec![0u8; len];
    match content {
        Content::Bytes(b) => buf.copy_from_slice(&b[from as usize..from as usize + len]),
        Content::Span { file, offset } => file
            .read_exact_at(&mut buf, offset + from)
            .map_err(|e| Error::Input(format!("reading spilled contents: {e}")))?,
        Content::File(path) => {
            let file = std::fs::File::open(path).map_err(|e| Error::source(path, e))?;
            file.read_exact_at(&mut buf, from)
                .map_err(|e| super::write::changed(path, e))?;
            let last = from + len as u64 == node.size;
            if last && file.metadata().map_err(|e| Error::source(path, e))?.len() != node.size {
                return Err(Error::Input(format!(
                    "{}: file changed size during the build",
                    path.display()
                )));
            }
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(len: u32, blocks: u32, raw: bool) -> Extent {
        Extent { len, blocks, raw }
    }

    #[test]
    fn indexes_cover_every_lcluster() {
        // 10000 bytes compressed into 1 block, then 5000 bytes raw in two extents, EOF
        // inside the last lcluster: 15000 bytes, 4 lclusters.
        let e = [ext(10000, 1, false), ext(4096, 1, true), ext(904, 1, true)];
        let idx = full_indexes(&e, 100, 4096, false);
        assert_eq!(idx.len(), 15000usize.div_ceil(4096));
        assert_eq!(
            (idx[0].kind(), idx[0].cluster_ofs, idx[0].blkaddr()),
            (LCLUSTER_TYPE_HEAD1, 0, 100)
        );
        assert_eq!(
            (idx[1].kind(), idx[1].delta()),
            (LCLUSTER_TYPE_NONHEAD, [1, 1])
        );
        // lcluster 2: the raw extent starts at 10000 - 8192 = 1808.
        assert_eq!(
            (idx[2].kind(), idx[2].cluster_ofs, idx[2].blkaddr()),
            (LCLUSTER_TYPE_PLAIN, 1808, 101)
        );
        // lcluster 3: the last raw extent starts at 14096 - 12288 = 1808 and ends at EOF.
        assert_eq!(
            (idx[3].kind(), idx[3].cluster_ofs, idx[3].blkaddr()),
            (LCLUSTER_TYPE_PLAIN, 1808, 102)
        );
    }

    #[test]
    fn big_clusters_record_their_block_count() {
        // 40000 bytes into 3 blocks, then 4096 raw: the first NONHEAD says 3 blocks.
        let e = [ext(40000, 3, false), ext(4096, 1, true), ext(100, 1, true)];
        let idx = full_indexes(&e, 7, 4096, true);
        assert_eq!(idx.len(), 44196usize.div_ceil(4096));
        assert_eq!(idx[1].delta()[0], 3 | LI_D0_CBLKCNT);
        assert_eq!(idx[2].delta()[0], 2);
        // delta[1]: lclusters on to the next HEAD (at 40000 / 4096 = lcluster 9).
        assert_eq!(idx[1].delta()[1], 8);
        let at = |i: &LclusterIndex| (i.kind(), i.cluster_ofs, i.blkaddr());
        assert_eq!(at(&idx[9]), (LCLUSTER_TYPE_PLAIN, 40000 - 36864, 10));
        // The last raw extent starts and ends inside lcluster 10.
        assert_eq!(at(&idx[10]), (LCLUSTER_TYPE_PLAIN, 44096 - 40960, 11));
        // Ending mid-lcluster after a full one: a closing PLAIN marks where data ends.
        let idx = full_indexes(&[ext(9000, 1, false)], 0, 4096, true);
        assert_eq!(idx.len(), 3);
        assert_eq!(idx[1].delta()[0], 1 | LI_D0_CBLKCNT);
        assert_eq!(
            (idx[2].kind(), idx[2].cluster_ofs),
            (LCLUSTER_TYPE_PLAIN, 9000 - 8192)
        );
    }
}
