//! Placement: the order of inodes, where each inode (with its xattrs and inline tail)
//! lives in the metadata area, and which data blocks each file, directory and symlink gets.
//!
//! Image map: `[block 0: 1 KiB pad + superblock + first inodes][metadata blocks]`
//! `[long-prefix table + shared xattr pool][data blocks]`.

use super::compress::Packed;
use super::tree::{Kind, NodeId, Tree};
use super::xattr::XattrPlan;
use super::Error;
use crate::format::*;

/// How an inode's data is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataPlan {
    /// Nothing stored (special files, empty files).
    None,
    /// `blocks` whole blocks from `start` (FLAT_PLAIN); the last may be partial.
    Plain {
        /// First data block.
        start: u64,
        /// Number of blocks, the last maybe partial.
        blocks: u64,
    },
    /// Full blocks at `start` plus `tail` bytes right after the inode (FLAT_INLINE).
    Inline {
        /// First data block.
        start: u64,
        /// Number of full blocks from `start`.
        blocks: u64,
        /// Bytes of the inline tail.
        tail: usize,
    },
    /// Compressed (COMPRESSED_COMPACT, or _FULL): the map header and lcluster indexes
    /// follow the inode; the file's `blocks` cluster blocks are stored from `start`.
    Compressed {
        /// First cluster block.
        start: u64,
        /// Number of cluster blocks.
        blocks: u64,
    },
    /// Chunk-based: one u32 block address per chunk (`NULL_ADDR` for a hole) after the
    /// inode; the data chunks are stored back to back from `start`.
    Chunked {
        /// log2 of the chunk size, in bytes.
        chunk_bits: u32,
        /// Block address of each chunk, `NULL_ADDR` for a hole.
        map: Vec<u32>,
        /// First block of the data chunks.
        start: u64,
        /// Number of blocks the data chunks take.
        blocks: u64,
    },
}

/// Where an inode goes and how its data is stored.
#[derive(Clone, Debug)]
pub struct InodePlan {
    /// Node number of the inode.
    pub nid: u64,
    /// Whether the inode is extended (64 bytes) rather than compact (32 bytes).
    pub extended: bool,
    /// Hard link count.
    pub nlink: u32,
    /// File size in bytes.
    pub size: u64,
    /// How the data is stored.
    pub data: DataPlan,
}

/// A directory's entries (including `.` and `..`) cut into blocks, in memcmp order.
#[derive(Clone, Debug, Default)]
pub struct DirPlan {
    /// Each block's entries: name and node.
    pub blocks: Vec<Vec<(Vec<u8>, NodeId)>>,
    /// Directory size in bytes.
    pub size: u64,
}

/// Where everything goes in the image.
pub struct Layout {
    /// Filesystem block size, in bytes.
    pub block_size: u64,
    /// Nodes in image order (each directory's entries, then its subdirectories', depth
    /// first; sorted names; hardlinks once).
    pub order: Vec<NodeId>,
    /// Inode plan per node, `None` for nodes not in `order`.
    pub inodes: Vec<Option<InodePlan>>,
    /// Directory plan per node, `None` for other nodes and nodes not in `order`.
    pub dirs: Vec<Option<DirPlan>>,
    /// Number of blocks of the metadata area.
    pub meta_blocks: u64,
    /// Byte offset of the long-prefix table, then the shared xattr pool.
    pub prefix_table_offset: u64,
    /// Byte offset of the shared xattr pool.
    pub shared_pool_offset: u64,
    /// Start block of the shared xattr area.
    pub xattr_blkaddr: u64,
    /// Number of blocks in the image.
    pub total_blocks: u64,
    /// Most common mtime (seconds, nanoseconds): the superblock's `epoch` and `fixed_nsec`.
    pub epoch: (i64, u32),
    /// The file-digest table at the end of the image, when asked for.
    pub digest_table: Option<crate::format::DigestFooter>,
}

/// What `plan` lays out the image with.
pub struct LayoutOptions<'a> {
    /// Filesystem block size, in bytes.
    pub block_size: u64,
    /// Whether file tails are stored inline after their inode (FLAT_INLINE).
    pub inline_data: bool,
    /// Whether the file-digest table is added at the end.
    pub file_digests: bool,
    /// Per node, its compressed data when it is stored compressed (empty: none is).
    pub packed: &'a [Option<Packed>],
    /// Bytes right after the superblock kept for the compression config records.
    pub super_extra: u64,
}

/// Lays out the tree: nids, data blocks and the xattr areas.
pub fn plan(tree: &Tree, xattrs: &XattrPlan, opts: &LayoutOptions) -> Result<Layout, Error> {
    let bs = opts.block_size;
    let n = tree.nodes.len();

    // A directory's entries together (sorted), then each subdirectory's, depth first:
    // the lookups of one directory (an import, `ls -l`) read neighbouring inodes, and a
    // walk of the tree (`find`, `tar`, `cp -a`) goes forward through inodes and data.
    // A hardlinked node takes the place of its first name.
    let mut order = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    let mut parent = vec![Tree::ROOT; n];
    let mut nlink = vec![0u32; n];
    seen[Tree::ROOT] = true;
    order.push(Tree::ROOT);
    let mut dirs_left = vec![Tree::ROOT];
    let mut subdirs = Vec::new();
    while let Some(id) = dirs_left.pop() {
        for &(_, child) in tree.children(id) {
            if tree.nodes[child].is_dir() {
                nlink[id] += 1; // the child's ".."
            } else {
                nlink[child] += 1; // one per name
            }
            if !seen[child] {
                seen[child] = true;
                parent[child] = id;
                order.push(child);
                if tree.nodes[child].is_dir() {
                    subdirs.push(child);
                }
            } else if tree.nodes[child].is_dir() {
                return Err(Error::Input(
                    "a directory is linked twice in the tree".into(),
                ));
            }
        }
        dirs_left.extend(subdirs.drain(..).rev());
    }
    for &id in &order {
        if tree.nodes[id].is_dir() {
            nlink[id] += 2; // "." and its name in the parent (the root's own "..")
        }
    }

    // Compact inodes carry the superblock's timestamp: choose the most common one.
    let epoch = most_common_mtime(tree, &order);

    let mut dirs: Vec<Option<DirPlan>> = vec![None; n];
    for &id in &order {
        if tree.nodes[id].is_dir() {
            dirs[id] = Some(plan_dir(tree, id, parent[id], bs));
        }
    }

    // Metadata placement, best fit so inline tails fill the holes other inodes leave.
    let mut meta = MetaAlloc::new(bs, opts.super_extra);
    let mut inodes: Vec<Option<InodePlan>> = vec![None; n];
    let mut meta_offsets = vec![0u64; n];
    for &id in &order {
        let node = &tree.nodes[id];
        let size = match &dirs[id] {
            Some(d) => d.size,
            None => node.size,
        };
        let extended = node.uid > 0xFFFF
            || node.gid > 0xFFFF
            || nlink[id] > 0xFFFF
            || size > u32::MAX as u64
            || (node.mtime, node.mtime_nsec) != epoch;
        let head = if extended {
            INODE_EXTENDED_SIZE
        } else {
            INODE_COMPACT_SIZE
        } as u64
            + xattrs.per_node[id].ibody_size() as u64;
        let packed = opts.packed.get(id).and_then(Option::as_ref);
        let (data, inline_len) = match packed {
            Some(p) => (
                DataPlan::Compressed {
                    start: 0,
                    blocks: p.blocks(bs),
                },
                p.meta_len(head, size, bs),
            ),
            None => plan_data(node, size, head, bs, opts.inline_data).map_err(|e| match e {
                Error::Input(m) => Error::Input(format!("{}: {m}", tree.path_of(id))),
                e => e,
            })?,
        };
        let off = meta.alloc(head + inline_len);
        meta_offsets[id] = off;
        inodes[id] = Some(InodePlan {
            nid: off >> ISLOT_BITS,
            extended,
            nlink: nlink[id],
            size,
            data,
        });
    }
    if inodes[Tree::ROOT]
        .as_ref()
        .is_some_and(|r| r.nid > u16::MAX as u64)
    {
        return Err(Error::Input("root inode does not fit a 16-bit nid".into()));
    }
    let meta_blocks = meta.blocks();

    let prefix_table_offset = meta_blocks * bs;
    let prefix_len = xattrs.encode_prefix_table().len() as u64;
    let shared_pool_offset = prefix_table_offset + prefix_len;
    let xattr_end = shared_pool_offset + xattrs.shared_pool.len() as u64;
    let data_start = xattr_end.div_ceil(bs);
    let mut next_block = data_start;

    // Data blocks follow in inode order, so reading a directory's files is sequential.
    for &id in &order {
        let plan = inodes[id].as_mut().expect("planned above");
        match &mut plan.data {
            DataPlan::None => {}
            DataPlan::Plain { start, blocks }
            | DataPlan::Inline { start, blocks, .. }
            | DataPlan::Compressed { start, blocks } => {
                if *blocks > 0 {
                    *start = next_block;
                    next_block += *blocks;
                }
            }
            DataPlan::Chunked {
                map,
                start,
                blocks,
                chunk_bits,
            } => {
                *start = next_block;
                let per_chunk = 1u64 << (*chunk_bits - bs.trailing_zeros());
                for (k, e) in map.iter_mut().enumerate() {
                    if *e != NULL_ADDR {
                        let left = plan.size - ((k as u64) << *chunk_bits);
                        *e = u32::try_from(next_block).map_err(|_| too_large())?;
                        next_block += per_chunk.min(left.div_ceil(bs));
                    }
                }
                *blocks = next_block - *start;
            }
        }
    }
    // The digest table takes the last blocks, its footer ending the image.
    let digest_table = opts.file_digests.then(|| {
        let entries = order
            .iter()
            .filter(|&&id| matches!(tree.nodes[id].kind, Kind::Regular { .. }))
            .count() as u64;
        let table_offset = next_block * bs;
        next_block += (entries * DIGEST_ENTRY_SIZE + DIGEST_FOOTER_SIZE).div_ceil(bs);
        DigestFooter {
            table_offset,
            entries,
            namespaces: Some(xattrs.namespaces),
        }
    });
    if next_block > u32::MAX as u64 {
        return Err(too_large());
    }
    Ok(Layout {
        block_size: bs,
        order,
        inodes,
        dirs,
        meta_blocks,
        prefix_table_offset,
        shared_pool_offset,
        xattr_blkaddr: shared_pool_offset / bs,
        total_blocks: next_block,
        epoch,
        digest_table,
    })
}

fn too_large() -> Error {
    Error::Input("image would exceed 2^32 blocks; use a larger --block-size".into())
}

fn most_common_mtime(tree: &Tree, order: &[NodeId]) -> (i64, u32) {
    let mut counts: std::collections::HashMap<(i64, u32), u64> = Default::default();
    for &id in order {
        let n = &tree.nodes[id];
        *counts.entry((n.mtime, n.mtime_nsec)).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(t, _)| t)
        .unwrap_or((0, 0))
}

fn plan_dir(tree: &Tree, id: NodeId, parent: NodeId, bs: u64) -> DirPlan {
    let mut entries: Vec<(Vec<u8>, NodeId)> = Vec::with_capacity(tree.children(id).len() + 2);
    entries.push((b".".to_vec(), id));
    entries.push((b"..".to_vec(), parent));
    entries.extend(tree.children(id).iter().cloned());
    // memcmp order over all entries: "." and ".." sort among the names, not first.
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut plan = DirPlan::default();
    let mut used = 0u64;
    let mut block = Vec::new();
    for e in entries {
        let need = (DIRENT_SIZE + e.0.len()) as u64;
        if used + need > bs {
            plan.blocks.push(std::mem::take(&mut block));
            used = 0;
        }
        used += need;
        block.push(e);
    }
    plan.blocks.push(block);
    plan.size = (plan.blocks.len() as u64 - 1) * bs + used;
    plan
}

/// Chooses the data layout; returns it with the bytes that follow the inode in metadata.
fn plan_data(
    node: &super::tree::Node,
    size: u64,
    head: u64,
    bs: u64,
    inline_data: bool,
) -> Result<(DataPlan, u64), Error> {
    let has_data = matches!(
        node.kind,
        Kind::Regular { .. } | Kind::Directory { .. } | Kind::Symlink { .. }
    );
    if !has_data || size == 0 {
        return Ok((DataPlan::None, 0));
    }
    if let Kind::Regular {
        extents: Some(extents),
        ..
    } = &node.kind
    {
        return plan_chunks(extents, size, bs).map_err(Error::Input);
    }
    let tail = size % bs;
    if inline_data && tail != 0 && head + tail <= bs {
        return Ok((
            DataPlan::Inline {
                start: 0,
                blocks: size / bs,
                tail: tail as usize,
            },
            tail,
        ));
    }
    Ok((
        DataPlan::Plain {
            start: 0,
            blocks: size.div_ceil(bs),
        },
        0,
    ))
}

/// Chunk-based layout for a sparse file: the largest chunk size that keeps every
/// data/hole boundary on a chunk boundary, so no hole is stored as zeros.
fn plan_chunks(extents: &[(u64, u64)], size: u64, bs: u64) -> Result<(DataPlan, u64), String> {
    let blkbits = bs.trailing_zeros();
    let end = size.div_ceil(bs) * bs;
    let mut bits = blkbits + 31;
    for &(s, e) in extents {
        let s = s / bs * bs;
        let e = e.div_ceil(bs) * bs;
        for b in [s, e] {
            if b != 0 && b < end {
                bits = bits.min(b.trailing_zeros());
            }
        }
    }
    // Never bigger than needed to cover the file with one chunk.
    let fit = 64 - (end - 1).leading_zeros();
    let chunk_bits = bits.min(fit.max(blkbits)).max(blkbits);
    let chunks = size.div_ceil(1 << chunk_bits);
    // A block map entry per chunk: refused when more than an image can hold, or more
    // than memory can, rather than aborting the build.
    let index_bytes = size_of::<raw::BlockMapEntry>() as u64 * chunks;
    if index_bytes > u64::from(u32::MAX) * bs {
        return Err(format!(
            "a sparse file of {size} bytes needs a chunk index of {index_bytes} bytes, more than an image can hold"
        ));
    }
    let mut map = Vec::new();
    map.try_reserve_exact(chunks as usize).map_err(|_| {
        format!("a sparse file of {size} bytes needs a chunk index of {index_bytes} bytes, more than memory holds")
    })?;
    map.resize(chunks as usize, NULL_ADDR);
    for &(s, e) in extents {
        let first = s >> chunk_bits;
        let last = (e - 1) >> chunk_bits;
        for k in first..=last.min(chunks - 1) {
            map[k as usize] = 0; // has data; the real address is assigned later
        }
    }
    Ok((
        DataPlan::Chunked {
            chunk_bits,
            map,
            start: 0,
            blocks: 0,
        },
        index_bytes,
    ))
}

/// Best-fit allocator over metadata blocks, in 32-byte slots.
/// How far back the inode placement looks for a block with room.
const RECENT_BLOCKS: u64 = 16;

struct MetaAlloc {
    bs: u64,
    fill: Vec<u64>,
    /// `free[k]`: blocks with exactly `k` free slots, most recent last.
    free: Vec<Vec<u64>>,
}

impl MetaAlloc {
    /// `extra`: bytes kept right after the superblock (compression config records).
    fn new(bs: u64, extra: u64) -> Self {
        let slots = (bs >> ISLOT_BITS) as usize;
        // Block 0 holds the superblock; inodes may follow it in the same block.
        let sb_end = (SUPER_OFFSET + SUPER_SIZE as u64 + extra).next_multiple_of(32);
        let mut a = MetaAlloc {
            bs,
            fill: vec![sb_end.min(bs)],
            free: vec![Vec::new(); slots + 1],
        };
        if sb_end >= bs {
            // Blocks smaller than 2 KiB: the superblock fills block 0 (and maybe 1).
            a.fill = vec![bs; sb_end.div_ceil(bs) as usize];
            let last = a.fill.len() - 1;
            a.fill[last] = sb_end - last as u64 * bs;
        }
        let last = a.fill.len() as u64 - 1;
        a.release(last);
        a
    }

    fn blocks(&self) -> u64 {
        self.fill.len() as u64
    }

    fn release(&mut self, block: u64) {
        let free = (self.bs - self.fill[block as usize]) >> ISLOT_BITS;
        if free > 0 {
            self.free[free as usize].push(block);
        }
    }

    fn alloc(&mut self, len: u64) -> u64 {
        let len = len.next_multiple_of(32);
        if len <= self.bs {
            let want = (len >> ISLOT_BITS) as usize;
            // Only recent blocks: an inode stays near its neighbours in image order, so
            // a walk of the tree reads the inode area front to back (an image 0.5%
            // larger than with every block open, on the Linux source).
            let oldest = (self.fill.len() as u64).saturating_sub(RECENT_BLOCKS);
            for k in want..self.free.len() {
                while self.free[k].last().is_some_and(|&b| b < oldest) {
                    self.free[k].pop();
                }
                if let Some(b) = self.free[k].pop() {
                    let off = b * self.bs + self.fill[b as usize];
                    self.fill[b as usize] += len;
                    self.release(b);
                    return off;
                }
            }
        }
        // A fresh run of blocks; items larger than a block span several.
        let first = self.fill.len() as u64;
        let blocks = len.div_ceil(self.bs);
        for _ in 0..blocks {
            self.fill.push(self.bs);
        }
        let last = first + blocks - 1;
        self.fill[last as usize] = len - (blocks - 1) * self.bs;
        self.release(last);
        first * self.bs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_bits_follow_hole_alignment() {
        // 1 MiB file, data only in its last 4 KiB: 4 KiB chunks would need 256 entries,
        // but the boundary at 1 MiB - 4 KiB forces 4 KiB chunks.
        let (p, idx) = plan_chunks(&[(1020 * 1024, 1024 * 1024)], 1024 * 1024, 4096).unwrap();
        assert_eq!(idx, 256 * 4);
        assert!(matches!(p, DataPlan::Chunked { chunk_bits: 12, .. }));
        // Data in the first and third 64 KiB of 256 KiB: 64 KiB chunks.
        let (p, _) = plan_chunks(&[(0, 65536), (131072, 196608)], 262144, 4096).unwrap();
        match p {
            DataPlan::Chunked {
                chunk_bits, map, ..
            } => {
                assert_eq!(chunk_bits, 16);
                assert_eq!(map, vec![0, NULL_ADDR, 0, NULL_ADDR]);
            }
            _ => panic!(),
        }
    }

    #[test]
    fn meta_alloc_best_fit() {
        let mut a = MetaAlloc::new(4096, 0);
        assert_eq!(a.alloc(64), 1152);
        let big = a.alloc(3000); // does not fit block 0's remaining 2880 bytes
        assert_eq!(big, 4096);
        // 96 bytes left in block 1 after 3008; a 90-byte item goes there, not block 0.
        assert_eq!(a.alloc(90), 4096 + 3008);
        assert_eq!(a.alloc(10000), 2 * 4096);
        assert_eq!(a.blocks(), 5);
    }

    #[test]
    fn meta_alloc_looks_back_only_at_recent_blocks() {
        let mut a = MetaAlloc::new(4096, 0);
        assert_eq!(a.alloc(3000), 4096); // block 1, 1088 bytes left
        for k in 0..RECENT_BLOCKS {
            assert_eq!(a.alloc(4096), (2 + k) * 4096);
        }
        // Block 1 is now 16 blocks back: a small item opens a new block instead.
        assert_eq!(a.alloc(64), (2 + RECENT_BLOCKS) * 4096);
        let mut b = MetaAlloc::new(4096, 0);
        assert_eq!(b.alloc(3000), 4096);
        for k in 0..RECENT_BLOCKS - 2 {
            assert_eq!(b.alloc(4096), (2 + k) * 4096);
        }
        assert_eq!(b.alloc(64), 4096 + 3008); // still recent: the hole is filled
    }
}
