//! Compressed regular files (`-z`; docs/FORMAT.md, "Compressed files"): data cut into physical
//! clusters by [`codecs::Compressor::fill`], indexed after the inode for `zmap.c`.
//!
//! - Files are compressed before layout (it needs their sizes), on all cores, in fixed-size
//!   segments: output never depends on the thread count.
//! - A file whose clusters take as many blocks as its plain data stays uncompressed.

use super::tree::{Content, Kind, NodeId, Tree};
use super::{Error, Progress};
use crate::zformat::*;
use codecs::{Algorithm, Compression, Compressor};
use rayon::prelude::*;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use zerocopy::IntoBytes;

/// Input of one segment: compressed independently, so it is the unit of parallel work.
/// A multiple of every block size; a cluster never spans two segments.
const SEGMENT: u64 = 4 << 20;
/// Most input one cluster may take (the kernel refuses extents over 12 MiB decoded;
/// erofs-utils 1.5 fed at most its queue of about 1 MiB).
const MAX_EXTENT_INPUT: usize = 1 << 20;

/// What to compress with and into which cluster size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Compressor to use.
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

/// A regular file compressed: where its clusters wait in the spill file, and what
/// indexes them.
#[derive(Debug)]
pub struct Packed {
    /// `(spill offset, length)` of each segment's clusters, in file order; back to back
    /// they are the file's stored blocks (compressed data ends its cluster, after zeros).
    parts: Vec<(u64, u64)>,
    extents: Vec<Extent>,
    /// The file's fs-verity digest (of its uncompressed contents), when sealing.
    pub digest: Option<Vec<u8>>,
}

impl Packed {
    /// Number of blocks the file's stored clusters take, for block size `bs`.
    pub fn blocks(&self, bs: u64) -> u64 {
        self.parts.iter().map(|p| p.1).sum::<u64>() / bs
    }

    /// Copies the file's stored blocks from the spill file into `dst`.
    pub fn copy_to(&self, spill: &Spill, dst: &mut [u8]) -> Result<(), Error> {
        let mut at = 0;
        for &(from, len) in &self.parts {
            let len = len as usize;
            spill
                .file
                .read_exact_at(&mut dst[at..at + len], from)
                .map_err(|e| Error::source(&spill.path, e))?;
            at += len;
        }
        Ok(())
    }

    /// Bytes after an inode whose body (inode and inline xattrs) is `head` bytes long:
    /// padding to 8, the map header, then the indexes.
    pub fn meta_len(&self, head: u64, size: u64, bs: u64) -> u64 {
        let lclusters = size.div_ceil(bs);
        let indexes = match Packing::for_block_size(bs) {
            None => 8 + LCLUSTER_INDEX_SIZE as u64 * lclusters,
            Some(two_b) => {
                let (initial, packs_2b, end) = compact_split(head, lclusters, two_b);
                let pack_4b = size_of::<raw::CompactPack4B>() as u64;
                let pack_2b = size_of::<raw::CompactPack2B>() as u64;
                (initial / 2 + end.div_ceil(2)) * pack_4b + packs_2b * pack_2b
            }
        };
        map_header_start(head) - head + MAP_HEADER_SIZE as u64 + indexes
    }

    /// The map header and indexes (from the 8-aligned end of an inode body of `head`
    /// bytes), for data stored from block `start`.
    pub fn encode_meta(&self, settings: &Settings, start: u32, bs: u64, head: u64) -> Vec<u8> {
        let big = settings.pcluster as u64 > bs;
        let packing = Packing::for_block_size(bs);
        let mut advise = 0;
        if big {
            // Compact indexes say it for both head kinds, or the kernel refuses them.
            advise |= ADVISE_BIG_PCLUSTER_1;
            if packing.is_some() {
                advise |= ADVISE_BIG_PCLUSTER_2;
            }
        }
        if packing == Some(true) {
            advise |= ADVISE_COMPACTED_2B;
        }
        let header = MapHeader {
            word0: 0,
            advise,
            algorithm_type: settings.compression.algorithm.erofs_id(),
            cluster_bits: 0, // logical clusters of one block, as mkfs.erofs makes them
        };
        let mut out = header.encode().to_vec();
        let full = full_indexes(&self.extents, start, bs, big);
        match packing {
            None => {
                out.extend_from_slice(&[0u8; 8]);
                for i in full {
                    out.extend_from_slice(&i.encode());
                }
            }
            Some(two_b) => {
                let bits = bs.trailing_zeros();
                out.extend(compact_indexes(&full, head, start, big, two_b, bits));
            }
        }
        out
    }
}

/// The inode layout compressed files get with blocks of `bs` bytes.
pub fn layout_for(bs: u64) -> u16 {
    match Packing::for_block_size(bs) {
        Some(_) => LAYOUT_COMPRESSED_COMPACT,
        None => LAYOUT_COMPRESSED_FULL,
    }
}

/// Compact indexes (what mkfs.erofs writes by default): 2 bytes per logical cluster in
/// packs of 16 between packs of two 4-byte ones (`Some(true)`), or 4-byte ones only
/// (`Some(false)`, unused). Only for 4 KiB blocks, the one size both the kernel here and
/// Debian's fsck.erofs read compressed (and the only one 2-byte packs allow); other
/// block sizes get full indexes (`None`), the simpler format, for 4 more bytes per block.
struct Packing;

impl Packing {
    fn for_block_size(bs: u64) -> Option<bool> {
        match bs {
            4096 => Some(true),
            _ => None,
        }
    }
}

/// How many indexes go into the leading 4-byte packs (up to the 32-byte alignment 2-byte
/// packs need), into 2-byte packs of 16, and into the trailing 4-byte packs, as the
/// kernel's `compacted_load_cluster_from_disk` finds them. `head`: the inode body's size
/// (inodes are 32-byte aligned, so offsets modulo 32 are the image's).
fn compact_split(head: u64, lclusters: u64, two_b: bool) -> (u64, u64, u64) {
    if !two_b {
        return (0, 0, lclusters);
    }
    let ebase = map_header_start(head) + MAP_HEADER_SIZE as u64;
    let initial = (32 - ebase % 32) / 4 % 8;
    if initial > lclusters {
        return (0, 0, lclusters);
    }
    let packs_2b = (lclusters - initial) / 16;
    (initial, packs_2b, lclusters - initial - packs_2b * 16)
}

/// Full indexes converted to compact packs, as erofs-utils'
/// `z_erofs_convert_to_compacted_format` does: block addresses are implicit (each pack
/// records the address the pclusters before it end at; a HEAD takes one block, or
/// the CBLKCNT of the NONHEAD after it), so clusters must lie back to back from `start`.
fn compact_indexes(
    full: &[LclusterIndex],
    head: u64,
    start: u32,
    big: bool,
    two_b: bool,
    lclusterbits: u32,
) -> Vec<u8> {
    let (initial, packs_2b, end) = compact_split(head, full.len() as u64, two_b);
    let mut out = Vec::new();
    let mut pack = PackWriter {
        lclusterbits,
        // Before big pclusters, the address was bumped on reaching each HEAD.
        blkaddr: if big { start } else { start.wrapping_sub(1) },
        dummy_head: !big,
        big,
    };
    let mut rest = full;
    let mut take = |n: usize| {
        let (now, later) = rest.split_at(n.min(rest.len()));
        rest = later;
        now.to_vec()
    };
    for _ in 0..initial / 2 {
        let p: raw::CompactPack4B = pack.write(&take(2));
        out.extend_from_slice(p.as_bytes());
    }
    for _ in 0..packs_2b {
        let p: raw::CompactPack2B = pack.write(&take(16));
        out.extend_from_slice(p.as_bytes());
    }
    for _ in 0..end.div_ceil(2) {
        // The last pack of an odd count is padded with a zeroed (PLAIN) index.
        let mut two = take(2);
        two.resize(2, LclusterIndex::default());
        let p: raw::CompactPack4B = pack.write(&two);
        out.extend_from_slice(p.as_bytes());
    }
    out
}

struct PackWriter {
    lclusterbits: u32,
    blkaddr: u32,
    dummy_head: bool,
    big: bool,
}

impl PackWriter {
    /// One pack of the `cv.len()` indexes (erofs-utils' `write_compacted_indexes`): each
    /// index is its type and a low part (the HEAD's offset, or a NONHEAD's delta),
    /// bit-packed into `entries`; `blkaddr` is the block address its first HEAD's counting
    /// starts from.
    fn write<const N: usize>(&mut self, cv: &[LclusterIndex]) -> raw::CompactPack<N> {
        let vcnt = cv.len();
        let lobits = self.lclusterbits.max(LI_D0_CBLKCNT.trailing_zeros() + 1);
        let encodebits = N * 8 / vcnt;
        let mut base = self.blkaddr;
        let mut blkaddr = self.blkaddr;
        // With big pclusters the base is the pack's first HEAD's own address.
        let mut update = self.big;
        let mut entries = [0u8; N];
        let mut pos = 0;
        for (i, c) in cv.iter().enumerate() {
            let [d0, d1] = c.delta();
            let offset = if c.kind() == LCLUSTER_TYPE_NONHEAD {
                if d0 & LI_D0_CBLKCNT != 0 {
                    blkaddr += u32::from(d0 & !LI_D0_CBLKCNT);
                    self.dummy_head = false;
                    u32::from(d0)
                } else if i + 1 == vcnt {
                    // The last slot holds delta[1] (the lookahead) instead.
                    u32::from(d1.min(LI_D0_CBLKCNT - 1))
                } else {
                    u32::from(d0)
                }
            } else {
                if self.dummy_head {
                    blkaddr = blkaddr.wrapping_add(1);
                    if update {
                        base = blkaddr;
                    }
                }
                self.dummy_head = true;
                update = false;
                u32::from(c.cluster_ofs)
            };
            let v = (u32::from(c.kind()) << lobits) | offset;
            let rem = pos & 7;
            let keep = entries[pos / 8] & ((1u8 << rem) - 1);
            let bytes = [
                (v << rem) as u8 | keep,
                (v >> (8 - rem)) as u8,
                (v >> (16 - rem)) as u8,
            ];
            // Past `entries` fall only zero bits: an index is lobits + 2 <= encodebits bits.
            for (slot, b) in entries[pos / 8..].iter_mut().zip(bytes) {
                *slot = b;
            }
            pos += encodebits;
        }
        self.blkaddr = blkaddr;
        raw::CompactPack {
            entries,
            blkaddr: base.into(),
        }
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
    /// Incompat feature bits compression needs.
    pub incompat: u32,
    /// The superblock's `available_compr_algs` word.
    pub u1: u16,
    /// Config records to write after the superblock.
    pub records: Vec<u8>,
}

/// The superblock fields settings `s` need, for block size `bs`.
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

/// Where compressed clusters wait for the layout (which needs every file's size first):
/// an unlinked file next to the output, so a large tree's clusters are page cache the
/// kernel can write back, not memory the build holds.
pub struct Spill {
    file: std::fs::File,
    path: std::path::PathBuf,
    end: AtomicU64,
}

impl Spill {
    /// A new spill file at `path` (removed at once; it lives while it is open).
    pub fn create(path: &std::path::Path) -> Result<Spill, Error> {
        let _ = std::fs::remove_file(path); // a leftover of a killed build
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::source(path, e))?;
        std::fs::remove_file(path).map_err(|e| Error::source(path, e))?;
        Ok(Spill {
            file,
            path: path.to_path_buf(),
            end: AtomicU64::new(0),
        })
    }

    /// Appends `data` (from any thread); returns where it went.
    fn append(&self, data: &[u8]) -> Result<u64, Error> {
        let at = self.end.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.file
            .write_all_at(data, at)
            .map_err(|e| Error::source(&self.path, e))?;
        Ok(at)
    }
}

/// One segment's result.
struct Segment {
    extents: Vec<Extent>,
    /// Where its clusters went in the spill file, and their length.
    at: u64,
    len: u64,
    /// Level-0 fs-verity hashes of the segment's uncompressed blocks.
    level0: Vec<u8>,
}

/// A segment as compressed, before it goes to the spill file.
struct SegmentOut {
    extents: Vec<Extent>,
    data: Vec<u8>,
    level0: Vec<u8>,
}

/// Compresses every non-empty regular file into `spill`; `None` for files left
/// uncompressed.
pub fn compress_files(
    tree: &Tree,
    s: &Settings,
    bs: u64,
    digests: bool,
    spill: &Spill,
    progress: &dyn Progress,
) -> Result<Vec<Option<Packed>>, Error> {
    let mut work: Vec<(NodeId, u64)> = Vec::new();
    for (id, node) in tree.nodes.iter().enumerate() {
        if matches!(node.kind, Kind::Regular { .. }) && node.size > 0 && mostly_data(node) {
            work.extend((0..node.size.div_ceil(SEGMENT)).map(|k| (id, k * SEGMENT)));
        }
    }
    let total = work
        .iter()
        .map(|&(id, from)| SEGMENT.min(tree.nodes[id].size - from))
        .sum();
    progress.compressing(total);
    let segments: Vec<Segment> =
        batches(&work, |&(id, from)| SEGMENT.min(tree.nodes[id].size - from))
            .par_iter()
            // One batch a task: rayon otherwise runs long runs of neighbours on one thread,
            // and the Linux tree's multi-megabyte headers sit together (8 s of a 28 s build
            // ran on one core of two).
            .with_max_len(1)
            .map_init(
                || Compressor::with_max_pcluster(s.compression, s.pcluster),
                |z, batch| {
                    work[batch.clone()]
                        .iter()
                        .map(|&(id, from)| {
                            let out = compress_segment(
                                tree,
                                id,
                                from,
                                z,
                                s.pcluster as usize,
                                bs,
                                digests,
                            )?;
                            let seg = Segment {
                                extents: out.extents,
                                at: spill.append(&out.data)?,
                                len: out.data.len() as u64,
                                level0: out.level0,
                            };
                            progress.wrote(SEGMENT.min(tree.nodes[id].size - from));
                            Ok(seg)
                        })
                        .collect::<Result<Vec<_>, Error>>()
                },
            )
            .collect::<Result<Vec<_>, Error>>()?
            .into_iter()
            .flatten()
            .collect();

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

/// Consecutive runs of `items` of about one segment's input each (a whole segment alone,
/// or many small files together): units of parallel work of similar cost.
fn batches<T>(items: &[T], bytes: impl Fn(&T) -> u64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut sum) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let b = bytes(item);
        if i > start && sum + b > SEGMENT {
            out.push(start..i);
            (start, sum) = (i, 0);
        }
        sum += b;
    }
    if start < items.len() {
        out.push(start..items.len());
    }
    out
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
    let stored: u64 = parts.iter().map(|p| p.len).sum::<u64>() / bs;
    if stored >= plain_blocks(node, bs) {
        return None;
    }
    let mut extents = Vec::new();
    let mut level0 = Vec::new();
    let mut places = Vec::with_capacity(parts.len());
    for p in parts {
        places.push((p.at, p.len));
        extents.extend_from_slice(&p.extents);
        level0.extend_from_slice(&p.level0);
    }
    let digest = digests.then(|| {
        let params = super::verity_params();
        let tree = verity::Tree::from_level0(&params, level0);
        verity::Descriptor::new(&params, node.size, &tree.root).digest(params.alg)
    });
    Some(Packed {
        parts: places,
        extents,
        digest,
    })
}

/// Whether a file is worth reading whole to compress: a sparse file mostly of holes
/// (a 1 TB file with a few blocks of data, say) stays chunk-based, where holes cost
/// nothing to read or store.
fn mostly_data(node: &super::tree::Node) -> bool {
    match &node.kind {
        Kind::Regular {
            extents: Some(extents),
            ..
        } => extents.iter().map(|&(s, e)| e - s).sum::<u64>() >= node.size / 2,
        _ => true,
    }
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
) -> Result<SegmentOut, Error> {
    let node = &tree.nodes[id];
    let len = SEGMENT.min(node.size - from) as usize;
    let src = read_segment(tree, id, from, len)?;
    let bsz = bs as usize;
    let mut seg = SegmentOut {
        extents: Vec::new(),
        data: Vec::new(),
        level0: Vec::new(),
    };
    // A segment's output must not depend on what this thread compressed before it.
    z.reset();
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
            // (Nothing fitted at all: not even a cluster's worth shrinks.)
            let tried = if used == 0 {
                pcluster
            } else {
                used.min(pcluster)
            };
            raw_blocks = (tried / bsz).max(1);
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
        let params = super::verity_params();
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
                .map_err(|e| Error::changed(path, e))?;
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

    /// What the kernel's `unpack_compacted_index` reads for logical cluster `lcn`
    /// (a port, 4 KiB logical clusters): (type, HEAD offset or NONHEAD delta[0],
    /// HEAD block address or NONHEAD CBLKCNT).
    fn kernel_compact(meta: &[u8], head: u64, total: u64, lcn: u64, big: bool) -> (u8, u32, u32) {
        let mh = map_header_start(head);
        let ebase = mh + MAP_HEADER_SIZE as u64;
        let initial = (32 - ebase % 32) / 4 % 8;
        let c2b = if initial < total {
            (total - initial) / 16 * 16
        } else {
            0
        };
        let (mut pos, mut l, shift);
        pos = ebase;
        l = lcn;
        if l < initial {
            shift = 2;
        } else {
            pos += initial * 4;
            l -= initial;
            if l < c2b {
                shift = 1;
            } else {
                pos += c2b * 2;
                l -= c2b;
                shift = 2;
            }
        }
        pos += l << shift;
        let vcnt: u64 = if shift == 2 { 2 } else { 16 };
        let packbytes = vcnt << shift;
        let encodebits = (packbytes - 4) * 8 / vcnt;
        let base = pos / packbytes * packbytes;
        let pack = &meta[(base - mh) as usize..(base - mh + packbytes) as usize];
        let bit = |i: u64| {
            let at = (encodebits * i) as usize;
            let mut w = [0u8; 4];
            let n = (pack.len() - at / 8).min(4);
            w[..n].copy_from_slice(&pack[at / 8..at / 8 + n]);
            let v = u32::from_le_bytes(w) >> (at & 7);
            (v & 0xFFF, ((v >> 12) & 3) as u8)
        };
        let mut i = (pos - base) >> shift;
        let (lo, kind) = bit(i);
        let cblk = u32::from(LI_D0_CBLKCNT);
        if kind == LCLUSTER_TYPE_NONHEAD {
            if lo & cblk != 0 {
                return (kind, 1, lo & !cblk);
            }
            if i + 1 != vcnt {
                return (kind, lo, 0);
            }
            let (plo, pkind) = bit(i - 1);
            let d0 = if pkind != LCLUSTER_TYPE_NONHEAD {
                0
            } else if plo & cblk != 0 {
                1
            } else {
                plo
            };
            return (kind, d0 + 1, 0);
        }
        let mut nblk: i64 = if big { 0 } else { 1 };
        let mut j = i as i64;
        while j > 0 {
            j -= 1;
            let (lo, kind) = bit(j as u64);
            if !big {
                if kind == LCLUSTER_TYPE_NONHEAD {
                    j -= i64::from(lo);
                }
                if j >= 0 {
                    nblk += 1;
                }
            } else if kind == LCLUSTER_TYPE_NONHEAD {
                if lo & cblk != 0 {
                    j -= 1;
                    nblk += i64::from(lo & !cblk);
                } else {
                    assert!(lo > 1, "bigpcluster shouldn't have plain d0 == 1");
                    j -= i64::from(lo) - 2;
                }
            } else {
                nblk += 1;
            }
        }
        i = packbytes - 4;
        let at = i as usize;
        let start = u32::from_le_bytes(pack[at..at + 4].try_into().unwrap());
        (kind, lo, (i64::from(start) + nblk) as u32)
    }

    #[test]
    fn compact_packs_read_back_as_the_kernel_reads_them() {
        let mut s = 12345u32;
        for case in 0..200 {
            let big = case % 2 == 0;
            let mut extents = Vec::new();
            let mut size = 0u64;
            let n = 1 + case % 40;
            for _ in 0..n {
                s = s.wrapping_mul(1_103_515_245).wrapping_add(12345);
                let e = if (s >> 16).is_multiple_of(3) {
                    ext(4096, 1, true)
                } else {
                    let blocks = if big { 1 + (s >> 20) % 16 } else { 1 };
                    ext(blocks * 4096 + 1 + (s >> 8) % 20000, blocks, false)
                };
                size += u64::from(e.len);
                extents.push(e);
            }
            // A short raw tail, as a file's end has.
            if case % 3 == 0 {
                extents.push(ext(1 + (s % 4095), 1, true));
                size += u64::from(extents.last().unwrap().len);
            }
            let start = 1000 + case;
            let full = full_indexes(&extents, start, 4096, big);
            let total = size.div_ceil(4096);
            assert_eq!(full.len() as u64, total);
            for head in [32u64, 44, 64, 76, 96, 112] {
                let packed = compact_indexes(&full, head, start, big, true, 12);
                let mut meta = MapHeader::default().encode().to_vec();
                meta.extend(&packed);
                let p = Packed {
                    parts: Vec::new(),
                    extents: extents.clone(),
                    digest: None,
                };
                assert_eq!(
                    p.meta_len(head, size, 4096),
                    map_header_start(head) - head + meta.len() as u64
                );
                for (lcn, f) in full.iter().enumerate() {
                    let got = kernel_compact(&meta, head, total, lcn as u64, big);
                    let want = if f.kind() == LCLUSTER_TYPE_NONHEAD {
                        let d0 = f.delta()[0];
                        if d0 & LI_D0_CBLKCNT != 0 {
                            (f.kind(), 1, u32::from(d0 & !LI_D0_CBLKCNT))
                        } else {
                            (f.kind(), u32::from(d0), 0)
                        }
                    } else {
                        (f.kind(), u32::from(f.cluster_ofs), f.blkaddr())
                    };
                    // The closing PLAIN past the data has no address anyone reads.
                    let closing = lcn + 1 == full.len() && f.blkaddr() == 0;
                    if closing {
                        assert_eq!(got.0, want.0);
                        assert_eq!(got.1, want.1);
                    } else {
                        assert_eq!(got, want, "case {case} head {head} lcn {lcn} big {big}");
                    }
                }
            }
        }
    }

    #[test]
    fn mostly_hole_files_are_not_read_to_be_compressed() {
        use crate::builder::tree::Node;
        // 1 TiB with one block of text at its end: reading it whole to compress its
        // zeros would take minutes; it stays chunk-based. A half-data file is read.
        let dir = tempfile::tempdir().unwrap();
        let node = |name: &str, size: u64, data_at: u64| {
            let path = dir.path().join(name);
            let f = std::fs::File::create(&path).unwrap();
            f.set_len(size).unwrap();
            f.write_all_at(&b"compressible ".repeat(315)[..4095], data_at)
                .unwrap();
            Node {
                kind: Kind::Regular {
                    content: Content::File(path),
                    extents: Some(vec![(data_at, data_at + 4095)]),
                },
                perm: 0o644,
                uid: 0,
                gid: 0,
                mtime: 0,
                mtime_nsec: 0,
                size,
                xattrs: Vec::new(),
            }
        };
        let mut tree = Tree::default();
        tree.add(node("huge", 1 << 40, (1 << 40) - 4095));
        tree.add(node("half", 8190, 4095));
        let spill = Spill::create(&dir.path().join("spill")).unwrap();
        let s = Settings {
            compression: "lz4".parse().unwrap(),
            pcluster: 4096,
        };
        let start = std::time::Instant::now();
        let packed = compress_files(&tree, &s, 4096, true, &spill, &super::super::Silent).unwrap();
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
        assert!(packed[0].is_none());
        // Half data: read, and its hole and text fit one compressed block.
        assert_eq!(packed[1].as_ref().map(|p| p.blocks(4096)), Some(1));
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
