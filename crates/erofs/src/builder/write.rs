//! Serialises a planned image through a shared mapping of the output: metadata on one
//! thread, then file data read by all cores straight to its fixed offset (on ext4 faster
//! than pwrite from every core, one writer thread or `copy_file_range`), then the
//! superblock and checksum. For a sealed image, `seal` then hashes every block once and
//! writes the digest table.

use super::compress::{self, Packed};
use super::layout::{DataPlan, Layout};
use super::tree::{Content, Kind, Tree};
use super::xattr::XattrPlan;
use super::{Error, Progress};
use crate::format::*;
use rayon::prelude::*;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use zerocopy::IntoBytes;

/// Superblock fields chosen by the caller rather than the layout.
pub struct SuperParams<'a> {
    /// Whether xattr name filters are stored (sets `FEATURE_COMPAT_XATTR_FILTER`).
    pub xattr_filter: bool,
    /// Build time, seconds since the Unix epoch.
    pub build_time: u64,
    /// Volume UUID, or `None` to derive it from the image contents.
    pub uuid: Option<[u8; 16]>,
    /// Volume name, zero-padded.
    pub volume_name: [u8; 16],
    /// Compression settings, the superblock fields they need, and the compressed files.
    pub compression: Option<Compressed<'a>>,
}

/// What compressed files need of the writer.
pub struct Compressed<'a> {
    /// Compression settings.
    pub settings: compress::Settings,
    /// Superblock fields for compression.
    pub fields: compress::SuperFields,
    /// Per node, its clusters when it is stored compressed, waiting in `spill`.
    pub packed: &'a [Option<Packed>],
    /// Spill file holding the compressed clusters.
    pub spill: &'a compress::Spill,
}

/// Writes the image planned by `layout` into `out`.
pub fn write_image(
    tree: &Tree,
    xattrs: &XattrPlan,
    layout: &Layout,
    params: &SuperParams,
    out: &File,
    out_path: &Path,
    progress: &dyn Progress,
) -> Result<Written, Error> {
    let bs = layout.block_size;
    let image_len = layout.total_blocks * bs;
    let werr = |e: std::io::Error| Error::source(out_path, e);
    // `out` is new and empty. Never truncate it: ext4 treats truncate-then-write as the
    // "replace a file" pattern and flushes all of it on close (auto_da_alloc).
    out.set_len(image_len).map_err(werr)?;
    // Reserve the space now, so running out of it is an error here rather than a
    // fault while writing through the mapping. Filesystems without fallocate just skip it.
    match rustix::fs::fallocate(out, rustix::fs::FallocateFlags::empty(), 0, image_len) {
        Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) => {}
        Err(e) => return Err(werr(e.into())),
    }
    if image_len == 0 {
        return Ok(Written {
            len: 0,
            level0: None,
        });
    }
    // The image is written through a shared mapping: file data is read straight into its
    // final place (one copy), and workers on different cores never contend on the
    // output file's inode lock as they would with write(2).
    #[allow(unsafe_code)] // mmap, a syscall
    // SAFETY: `out` is the builder's own freshly created temporary file; nothing else
    // truncates or maps it while `map` lives, so the mapping stays valid.
    let mut map = unsafe { memmap2::MmapMut::map_mut(out) }.map_err(werr)?;
    // Fault the whole image in up front, both cores each taking every other 8 MiB: one
    // call maps thousands of pages instead of trapping once per page while copying.
    const STRIDE: usize = 8 << 20;
    let len = map.len();
    (0..len.div_ceil(STRIDE)).into_par_iter().for_each(|i| {
        let off = i * STRIDE;
        // Best effort: without MADV_POPULATE_WRITE (Linux < 5.14) pages fault on first touch.
        let _ = map.advise_range(memmap2::Advice::PopulateWrite, off, STRIDE.min(len - off));
    });
    let img: &mut [u8] = &mut map;

    let shared_ids: Vec<u32> = xattrs
        .shared_offsets
        .iter()
        .map(|&o| ((layout.shared_pool_offset + o as u64 - layout.xattr_blkaddr * bs) / 4) as u32)
        .collect();

    // Pass 1, one thread: inodes, xattr bodies, directories, symlinks and chunk maps.
    let mut file_jobs: Vec<FileJob> = Vec::new();
    let mut empty_files: Vec<u64> = Vec::new();
    let mut known_digests: Vec<(u64, Vec<u8>)> = Vec::new();
    for (serial, &id) in layout.order.iter().enumerate() {
        let node = &tree.nodes[id];
        let plan = layout.inodes[id]
            .as_ref()
            .expect("every ordered node is planned");
        let x = &xattrs.per_node[id];
        let (layout_kind, i_u) = match (&plan.data, &node.kind) {
            (_, Kind::CharDevice { major, minor } | Kind::BlockDevice { major, minor }) => {
                (LAYOUT_FLAT_PLAIN, encode_dev(*major, *minor))
            }
            (DataPlan::None, _) => (LAYOUT_FLAT_PLAIN, 0),
            (DataPlan::Plain { start, .. }, _) => (LAYOUT_FLAT_PLAIN, *start as u32),
            (DataPlan::Inline { start, .. }, _) => (LAYOUT_FLAT_INLINE, *start as u32),
            // i_u counts the blocks the clusters take (stat's st_blocks).
            (DataPlan::Compressed { blocks, .. }, _) => (compress::layout_for(bs), *blocks as u32),
            (DataPlan::Chunked { chunk_bits, .. }, _) => {
                (LAYOUT_CHUNK_BASED, chunk_bits - bs.trailing_zeros())
            }
        };
        let disk = DiskInode {
            extended: plan.extended,
            format: inode_format(plan.extended, layout_kind),
            xattr_icount: x.icount().expect("checked by build_tree"),
            mode: node.mode(),
            nlink: plan.nlink,
            size: plan.size,
            i_u,
            ino: serial as u32 + 1, // the 32-bit stat-compat inode number
            uid: node.uid,
            gid: node.gid,
            mtime: node.mtime as u64,
            mtime_nsec: node.mtime_nsec,
            i_nb: 0,
        };
        let mut head = vec![0u8; disk.disk_size()];
        disk.encode(&mut head);
        x.encode(&shared_ids, &mut head);
        let pos = plan.nid << ISLOT_BITS;
        img[pos as usize..pos as usize + head.len()].copy_from_slice(&head);
        let inline_at = pos + head.len() as u64;

        match &node.kind {
            Kind::Directory { .. } => {
                let dir = layout.dirs[id].as_ref().expect("directories are planned");
                let bytes = encode_dir(tree, dir, layout, bs);
                for (from, len, to) in copies(&plan.data, plan.size, inline_at, bs) {
                    img[to as usize..(to + len) as usize]
                        .copy_from_slice(&bytes[from as usize..(from + len) as usize]);
                }
            }
            Kind::Symlink { target } => {
                for (from, len, to) in copies(&plan.data, plan.size, inline_at, bs) {
                    img[to as usize..(to + len) as usize]
                        .copy_from_slice(&target[from as usize..(from + len) as usize]);
                }
            }
            Kind::Regular { .. } if matches!(plan.data, DataPlan::Compressed { .. }) => {
                let (DataPlan::Compressed { start, .. }, Some(z)) =
                    (&plan.data, &params.compression)
                else {
                    unreachable!("a compressed plan comes from a packed file");
                };
                let p = z.packed[id].as_ref().expect("planned compressed");
                let meta = p.encode_meta(&z.settings, *start as u32, bs, head.len() as u64);
                let at = crate::zformat::map_header_start(inline_at) as usize;
                img[at..at + meta.len()].copy_from_slice(&meta);
                let at = (*start * bs) as usize;
                let len = (p.blocks(bs) * bs) as usize;
                p.copy_to(z.spill, &mut img[at..at + len])?;
                if let Some(d) = &p.digest {
                    known_digests.push((plan.nid, d.clone()));
                }
            }
            Kind::Regular { content, .. } if plan.size > 0 => {
                if let DataPlan::Chunked { map, .. } = &plan.data {
                    let size = size_of::<raw::BlockMapEntry>();
                    let at = inline_at as usize;
                    let slots = img[at..at + size * map.len()].chunks_exact_mut(size);
                    for (slot, &blkaddr) in slots.zip(map) {
                        let e = raw::BlockMapEntry {
                            blkaddr: blkaddr.into(),
                        };
                        slot.copy_from_slice(e.as_bytes());
                    }
                }
                file_jobs.push(FileJob {
                    nid: plan.nid,
                    content,
                    size: plan.size,
                    copies: copies(&plan.data, plan.size, inline_at, bs),
                });
            }
            Kind::Regular { .. } => empty_files.push(plan.nid),
            _ => {}
        }
    }

    // Long-prefix table and shared xattrs sit between metadata and data.
    let mut xattr_area = xattrs.encode_prefix_table();
    xattr_area.extend_from_slice(&xattrs.shared_pool);
    let at = layout.prefix_table_offset as usize;
    img[at..at + xattr_area.len()].copy_from_slice(&xattr_area);

    super::trace("metadata");
    // Pass 2, all cores: file contents, each into its own disjoint slices of the image.
    let total: u64 = file_jobs.iter().map(|j| j.size).sum();
    progress.writing(total);
    let mut targets = carve(img, &file_jobs);
    targets
        .par_iter_mut()
        .zip(file_jobs.par_iter())
        .try_for_each(|(dsts, job)| {
            copy_file(job, dsts)?;
            progress.wrote(job.size);
            Ok::<_, Error>(())
        })?;
    drop(targets);
    super::trace("data");

    // Pass 3: the superblock; its checksum covers the inodes in block 0.
    let mut feature_compat = FEATURE_COMPAT_SB_CHKSUM | FEATURE_COMPAT_MTIME;
    if params.xattr_filter {
        feature_compat |= FEATURE_COMPAT_XATTR_FILTER;
    }
    let mut feature_incompat = 0;
    if !xattrs.prefixes.is_empty() {
        feature_incompat |= FEATURE_INCOMPAT_XATTR_PREFIXES;
    }
    if layout
        .inodes
        .iter()
        .flatten()
        .any(|p| matches!(p.data, DataPlan::Chunked { .. }))
    {
        feature_incompat |= FEATURE_INCOMPAT_CHUNKED_FILE;
    }
    let mut available_compr_algs = 0;
    if let Some(Compressed { fields: f, .. }) = &params.compression {
        feature_incompat |= f.incompat;
        available_compr_algs = f.u1;
        let at = (SUPER_OFFSET as usize) + SUPER_SIZE;
        img[at..at + f.records.len()].copy_from_slice(&f.records);
    }
    let epoch = layout.epoch;
    let meta_len = (layout.meta_blocks * bs) as usize;
    let uuid = params
        .uuid
        .unwrap_or_else(|| derived_uuid(&img[..meta_len], &xattr_area, params.build_time));
    let mut sb = Superblock {
        feature_compat,
        blkszbits: bs.trailing_zeros() as u8,
        root_nid: layout.inodes[Tree::ROOT].as_ref().expect("root").nid as u16,
        inos: layout.order.len() as u64,
        epoch: epoch.0 as u64,
        fixed_nsec: epoch.1,
        blocks: layout.total_blocks as u32,
        meta_blkaddr: 0,
        xattr_blkaddr: layout.xattr_blkaddr as u32,
        uuid,
        volume_name: params.volume_name,
        feature_incompat,
        xattr_prefix_count: xattrs.prefixes.len() as u8,
        xattr_prefix_start: (layout.prefix_table_offset / 4) as u32,
        build_time: u32::try_from(params.build_time as i64 - epoch.0).unwrap_or(0),
        available_compr_algs,
        ..Default::default()
    };
    let sb_at = SUPER_OFFSET as usize;
    img[sb_at..sb_at + SUPER_SIZE].copy_from_slice(&sb.encode());
    // The checksum covers the superblock from past its own field: written again with it,
    // the superblock changes in that field alone.
    sb.checksum = superblock_checksum(img, bs as usize).expect("the image spans the first block");
    img[sb_at..sb_at + SUPER_SIZE].copy_from_slice(&sb.encode());

    // Pass 4, all cores: hash the image for its Merkle tree, deriving every file's own
    // digest from the same block hashes, and store those digests in the table.
    let level0 = layout.digest_table.map(|footer| {
        let done = Digests {
            empty: &empty_files,
            known: &known_digests,
        };
        seal(img, &file_jobs, &done, footer, progress)
    });
    super::trace("hashed");
    Ok(Written {
        len: image_len,
        level0,
    })
}

/// The file digests `seal` need not compute from the image: empty files', and those of
/// compressed files, computed from their uncompressed contents while compressing.
struct Digests<'a> {
    empty: &'a [u64],
    known: &'a [(u64, Vec<u8>)],
}

/// What `write_image` produced.
pub struct Written {
    /// Bytes of EROFS image.
    pub len: u64,
    /// Level-0 Merkle hashes of the image (SHA-256, 4 KiB blocks), when it was sealed.
    pub level0: Option<Vec<u8>>,
}

const VERITY_BLOCK: usize = 1 << DIGEST_LOG_BLOCK_SIZE;
const HASH: usize = 32;

/// Hashes every 4 KiB block of the image (level 0 of its Merkle tree), computes each
/// regular file's fs-verity digest mostly from those same hashes, and writes the digest
/// table; data is hashed once.
fn seal(
    img: &mut [u8],
    jobs: &[FileJob],
    done: &Digests,
    footer: DigestFooter,
    progress: &dyn Progress,
) -> Vec<u8> {
    let params = super::verity_params();
    let len = img.len();
    progress.hashing(len as u64);
    let mut level0 = vec![0u8; len.div_ceil(VERITY_BLOCK) * HASH];
    // Blocks wholly before the table can be hashed now; the rest once it is written.
    let before = footer.table_offset as usize / VERITY_BLOCK;
    let (head, tail) = level0.split_at_mut(before * HASH);
    hash_into(&params, &img[..before * VERITY_BLOCK], head, progress);

    let zero = {
        let mut h = [0u8; HASH];
        params.alg.hash_into(&[], &[0u8; VERITY_BLOCK], &mut h);
        h
    };
    let ctx = FileHashCtx {
        img,
        level0: head,
        zero,
        params: &params,
    };
    let mut entries: Vec<(u64, Vec<u8>)> = jobs
        .par_iter()
        .map(|j| (j.nid, ctx.file_digest(j)))
        .collect();
    let empty_digest = verity::Descriptor::new(&params, 0, &[0u8; HASH]).digest(params.alg);
    entries.extend(done.empty.iter().map(|&nid| (nid, empty_digest.clone())));
    entries.extend(done.known.iter().cloned());
    entries.sort_unstable_by_key(|e| e.0);
    debug_assert_eq!(entries.len() as u64, footer.entries);

    let mut at = footer.table_offset as usize;
    for (nid, digest) in &entries {
        let mut e = raw::DigestEntry {
            nid: (*nid).into(),
            ..Default::default()
        };
        e.digest.copy_from_slice(digest);
        img[at..at + DIGEST_ENTRY_SIZE as usize].copy_from_slice(e.as_bytes());
        at += DIGEST_ENTRY_SIZE as usize;
    }
    img[len - DIGEST_FOOTER_SIZE as usize..].copy_from_slice(&footer.encode());
    hash_into(&params, &img[before * VERITY_BLOCK..], tail, progress);
    level0
}

fn hash_into(params: &verity::Params, data: &[u8], out: &mut [u8], progress: &dyn Progress) {
    const PER_TASK: usize = 64;
    data.par_chunks(VERITY_BLOCK * PER_TASK)
        .zip(out.par_chunks_mut(HASH * PER_TASK))
        .for_each(|(d, o)| {
            verity::hash_blocks(params, &[], d, o);
            progress.hashed(d.len() as u64);
        });
}

struct FileHashCtx<'a> {
    img: &'a [u8],
    /// Level-0 hashes of the first `level0.len() / HASH` image blocks.
    level0: &'a [u8],
    /// The hash of an all-zero block (holes).
    zero: [u8; HASH],
    params: &'a verity::Params,
}

impl FileHashCtx<'_> {
    /// A file's fs-verity digest. A file block stored whole at a 4 KiB-aligned image offset
    /// (zero-padded there if it is the short last one) has the image block's hash; only
    /// inline tails, holes and unaligned data (block sizes under 4 KiB) are hashed here.
    fn file_digest(&self, job: &FileJob) -> Vec<u8> {
        let vb = VERITY_BLOCK as u64;
        let blocks = job.size.div_ceil(vb);
        let mut l0 = vec![0u8; blocks as usize * HASH];
        let mut buf = vec![0u8; VERITY_BLOCK];
        let mut k = 0; // first copy that may overlap the current block
        for (i, out) in l0.chunks_mut(HASH).enumerate() {
            let s = i as u64 * vb;
            let e = job.size.min(s + vb);
            while k < job.copies.len() && job.copies[k].0 + job.copies[k].1 <= s {
                k += 1;
            }
            let mut j = k;
            while j < job.copies.len() && job.copies[j].0 < e {
                j += 1;
            }
            match &job.copies[k..j] {
                [] => out.copy_from_slice(&self.zero),
                &[(from, len, to)] if from <= s && from + len >= e => {
                    let at = (to + s - from) as usize;
                    let n = (e - s) as usize;
                    let whole = at.is_multiple_of(VERITY_BLOCK)
                        && (at / VERITY_BLOCK + 1) * HASH <= self.level0.len()
                        && self.img[at + n..at + VERITY_BLOCK].iter().all(|&b| b == 0);
                    if whole {
                        let h = at / VERITY_BLOCK * HASH;
                        out.copy_from_slice(&self.level0[h..h + HASH]);
                    } else {
                        buf.fill(0);
                        buf[..n].copy_from_slice(&self.img[at..at + n]);
                        self.params.alg.hash_into(&[], &buf, out);
                    }
                }
                copies => {
                    buf.fill(0);
                    for &(from, len, to) in copies {
                        let a = from.max(s);
                        let b = (from + len).min(e);
                        let src = (to + a - from) as usize;
                        buf[(a - s) as usize..(b - s) as usize]
                            .copy_from_slice(&self.img[src..src + (b - a) as usize]);
                    }
                    self.params.alg.hash_into(&[], &buf, out);
                }
            }
        }
        let tree = verity::Tree::from_level0(self.params, l0);
        verity::Descriptor::new(self.params, job.size, &tree.root).digest(self.params.alg)
    }
}

/// One regular file's content and where its byte ranges go.
struct FileJob<'a> {
    nid: u64,
    content: &'a Content,
    size: u64,
    /// `(file offset, length, image offset)`, ascending in both.
    copies: Vec<(u64, u64, u64)>,
}

/// Where the bytes of an inode's content go: `(content offset, length, image offset)`.
fn copies(plan: &DataPlan, size: u64, inline_at: u64, bs: u64) -> Vec<(u64, u64, u64)> {
    match plan {
        // Compressed data is copied whole, not mapped byte for byte.
        DataPlan::None | DataPlan::Compressed { .. } => Vec::new(),
        DataPlan::Plain { start, .. } => vec![(0, size, start * bs)],
        DataPlan::Inline {
            start,
            blocks,
            tail,
        } => {
            let body = blocks * bs;
            let mut v = Vec::with_capacity(2);
            if body > 0 {
                v.push((0, body, start * bs));
            }
            v.push((body, *tail as u64, inline_at));
            v
        }
        DataPlan::Chunked {
            chunk_bits, map, ..
        } => map
            .iter()
            .enumerate()
            .filter(|(_, &addr)| addr != NULL_ADDR)
            .map(|(k, &addr)| {
                let from = (k as u64) << chunk_bits;
                (
                    from,
                    (1u64 << chunk_bits).min(size - from),
                    addr as u64 * bs,
                )
            })
            .collect(),
    }
}

/// Splits the image into the disjoint destination slices of every job, in job order.
fn carve<'m>(img: &'m mut [u8], jobs: &[FileJob]) -> Vec<Vec<(u64, &'m mut [u8])>> {
    let mut regions: Vec<(u64, u64, usize, u64)> = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        for &(from, len, to) in &job.copies {
            regions.push((to, len, j, from));
        }
    }
    regions.sort_unstable_by_key(|r| r.0);
    let mut out: Vec<Vec<(u64, &mut [u8])>> = jobs
        .iter()
        .map(|j| Vec::with_capacity(j.copies.len()))
        .collect();
    let mut rest = img;
    let mut base = 0u64;
    for (to, len, j, from) in regions {
        let (_, tail) = rest.split_at_mut((to - base) as usize);
        let (dst, tail) = tail.split_at_mut(len as usize);
        out[j].push((from, dst));
        rest = tail;
        base = to + len;
    }
    out
}

/// Copies one regular file into its destination slices.
fn copy_file(job: &FileJob, dsts: &mut [(u64, &mut [u8])]) -> Result<(), Error> {
    let path = match job.content {
        Content::Bytes(bytes) => {
            for (from, dst) in dsts.iter_mut() {
                let from = *from as usize;
                dst.copy_from_slice(&bytes[from..from + dst.len()]);
            }
            return Ok(());
        }
        Content::Span { file, offset } => {
            for (from, dst) in dsts.iter_mut() {
                file.read_exact_at(dst, offset + *from)
                    .map_err(|e| Error::Input(format!("reading spilled contents: {e}")))?;
            }
            return Ok(());
        }
        Content::File(p) => p,
    };
    let err = |e: std::io::Error| Error::source(path, e);
    let file = File::open(path).map_err(err)?;
    for (from, dst) in dsts.iter_mut() {
        file.read_exact_at(dst, *from)
            .map_err(|e| Error::changed(path, e))?;
    }
    // A file that grew since the scan would be silently cut short.
    if file.metadata().map_err(err)?.len() != job.size {
        return Err(Error::Input(format!(
            "{}: file changed size during the build",
            path.display()
        )));
    }
    Ok(())
}

/// Dirents with names, block by block; the last block is only as long as it is used.
fn encode_dir(tree: &Tree, dir: &super::layout::DirPlan, layout: &Layout, bs: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(dir.size as usize);
    for (i, block) in dir.blocks.iter().enumerate() {
        let start = out.len();
        let mut nameoff = DIRENT_SIZE * block.len();
        for (name, target) in block {
            let d = Dirent {
                nid: layout.inodes[*target].as_ref().expect("planned").nid,
                nameoff: nameoff as u16,
                file_type: file_type_of(tree.nodes[*target].mode()).unwrap_or(FT_UNKNOWN),
            };
            let mut raw = [0u8; DIRENT_SIZE];
            d.encode(&mut raw);
            out.extend_from_slice(&raw);
            nameoff += name.len();
        }
        for (name, _) in block {
            out.extend_from_slice(name);
        }
        if i + 1 < dir.blocks.len() {
            out.resize(start + bs as usize, 0);
        }
    }
    out
}

/// A reproducible UUID: a hash of the metadata and the build time, shaped like a v4 UUID.
fn derived_uuid(meta: &[u8], xattr_area: &[u8], build_time: u64) -> [u8; 16] {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(meta);
    h.update(xattr_area);
    h.update(&build_time.to_le_bytes());
    let mut u = h.digest128().to_le_bytes();
    u[6] = (u[6] & 0x0F) | 0x40;
    u[8] = (u[8] & 0x3F) | 0x80;
    u
}
