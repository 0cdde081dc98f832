//! Serialises a planned image: metadata in memory, file data streamed from the source
//! straight to its final offset by parallel workers (the layout is fixed in advance).

use super::layout::{DataPlan, Layout};
use super::tree::{Content, Kind, Tree};
use super::xattr::XattrPlan;
use super::{Error, Progress};
use crate::format::*;
use rayon::prelude::*;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Superblock fields chosen by the caller rather than the layout.
pub struct SuperParams {
    pub xattr_filter: bool,
    pub build_time: u64,
    pub uuid: Option<[u8; 16]>,
    pub volume_name: [u8; 16],
}

pub fn write_image(
    tree: &Tree,
    xattrs: &XattrPlan,
    layout: &Layout,
    params: &SuperParams,
    out: &File,
    out_path: &Path,
    progress: &dyn Progress,
) -> Result<u64, Error> {
    let bs = layout.block_size;
    let image_len = layout.total_blocks * bs;
    let werr = |e: std::io::Error| Error::source(out_path, e);
    out.set_len(0).map_err(werr)?;
    out.set_len(image_len).map_err(werr)?;

    let shared_ids: Vec<u32> = xattrs
        .shared_offsets
        .iter()
        .map(|&o| ((layout.shared_pool_offset + o as u64 - layout.xattr_blkaddr * bs) / 4) as u32)
        .collect();

    // Metadata area: inodes, xattr bodies, inline tails and chunk maps.
    let mut meta = vec![0u8; (layout.meta_blocks * bs) as usize];
    let mut file_jobs = Vec::new();
    let mut ino_serial = 0u32;
    for &id in &layout.order {
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
            (DataPlan::Chunked { chunk_bits, .. }, _) => {
                (LAYOUT_CHUNK_BASED, chunk_bits - bs.trailing_zeros())
            }
        };
        ino_serial += 1;
        let disk = DiskInode {
            extended: plan.extended,
            format: inode_format(plan.extended, layout_kind),
            xattr_icount: x.icount(),
            mode: node.mode(),
            nlink: plan.nlink,
            size: plan.size,
            i_u,
            ino: ino_serial,
            uid: node.uid,
            gid: node.gid,
            mtime: node.mtime as u64,
            mtime_nsec: node.mtime_nsec,
            i_nb: 0,
        };
        let mut head = vec![0u8; disk.disk_size()];
        disk.encode(&mut head);
        x.encode(&shared_ids, &mut head);
        let pos = (plan.nid << ISLOT_BITS) as usize;
        meta[pos..pos + head.len()].copy_from_slice(&head);
        let inline_at = pos + head.len();

        match &node.kind {
            Kind::Directory { .. } => {
                let dir = layout.dirs[id].as_ref().expect("directories are planned");
                let bytes = encode_dir(tree, dir, layout, bs);
                place(&plan.data, &bytes, &mut meta, inline_at, out, bs).map_err(werr)?;
            }
            Kind::Symlink { target } => {
                place(&plan.data, target, &mut meta, inline_at, out, bs).map_err(werr)?;
            }
            Kind::Regular { content, .. } if plan.size > 0 => {
                if let DataPlan::Chunked { map, .. } = &plan.data {
                    for (k, e) in map.iter().enumerate() {
                        meta[inline_at + 4 * k..inline_at + 4 * k + 4]
                            .copy_from_slice(&e.to_le_bytes());
                    }
                }
                file_jobs.push((id, content, inline_at));
            }
            _ => {}
        }
    }

    // File data: the slow part, in parallel; each job returns its inline tail.
    let total: u64 = file_jobs.iter().map(|&(id, ..)| tree.nodes[id].size).sum();
    progress.writing(total);
    let tails: Vec<(usize, Vec<u8>)> = file_jobs
        .par_iter()
        .map_init(
            || vec![0u8; 1 << 20],
            |buf, &(id, content, inline_at)| {
                let plan = layout.inodes[id].as_ref().expect("planned");
                let tail = copy_file(content, plan.size, &plan.data, bs, out, buf)?;
                progress.wrote(plan.size);
                Ok((inline_at, tail))
            },
        )
        .collect::<Result<_, Error>>()?;
    for (at, tail) in tails {
        meta[at..at + tail.len()].copy_from_slice(&tail);
    }

    // Long-prefix table and shared xattrs sit between metadata and data.
    let mut xattr_area = xattrs.encode_prefix_table();
    xattr_area.extend_from_slice(&xattrs.shared_pool);
    out.write_all_at(&xattr_area, layout.prefix_table_offset)
        .map_err(werr)?;

    // The superblock goes in last: its checksum covers the inodes in block 0.
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
    let epoch = layout.epoch;
    let uuid = params
        .uuid
        .unwrap_or_else(|| derived_uuid(&meta, &xattr_area, params.build_time));
    let sb = Superblock {
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
        ..Default::default()
    };
    let sb_at = SUPER_OFFSET as usize;
    meta[sb_at..sb_at + SUPER_SIZE].copy_from_slice(&sb.encode());
    let csum = superblock_checksum(&meta, bs as usize).expect("metadata spans the first block");
    meta[sb_at + 4..sb_at + 8].copy_from_slice(&csum.to_le_bytes());
    out.write_all_at(&meta, 0).map_err(werr)?;
    Ok(image_len)
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

/// Stores in-memory content (a directory or symlink) according to its data plan.
fn place(
    plan: &DataPlan,
    bytes: &[u8],
    meta: &mut [u8],
    inline_at: usize,
    out: &File,
    bs: u64,
) -> std::io::Result<()> {
    match plan {
        DataPlan::None => Ok(()),
        DataPlan::Plain { start, .. } => out.write_all_at(bytes, start * bs),
        DataPlan::Inline {
            start,
            blocks,
            tail,
        } => {
            let full = (*blocks * bs) as usize;
            if *blocks > 0 {
                out.write_all_at(&bytes[..full], start * bs)?;
            }
            meta[inline_at..inline_at + tail].copy_from_slice(&bytes[full..]);
            Ok(())
        }
        DataPlan::Chunked { .. } => unreachable!("only regular files are chunked"),
    }
}

/// Copies one regular file to its blocks; returns the bytes that go inline.
fn copy_file(
    content: &Content,
    size: u64,
    plan: &DataPlan,
    bs: u64,
    out: &File,
    buf: &mut [u8],
) -> Result<Vec<u8>, Error> {
    let path = match content {
        Content::Bytes(bytes) => return copy_bytes(bytes, plan, bs, out),
        Content::File(p) => p,
    };
    let err = |e: std::io::Error| Error::source(path, e);
    let mut file = File::open(path).map_err(err)?;
    match plan {
        DataPlan::Chunked {
            chunk_bits, map, ..
        } => {
            for (k, &addr) in map.iter().enumerate() {
                if addr == NULL_ADDR {
                    continue;
                }
                let from = (k as u64) << chunk_bits;
                let len = (1u64 << chunk_bits).min(size - from);
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(buf.len() as u64) as usize;
                    file.read_exact_at(&mut buf[..n], from + done)
                        .map_err(|e| changed(path, e))?;
                    out.write_all_at(&buf[..n], addr as u64 * bs + done)
                        .map_err(err)?;
                    done += n as u64;
                }
            }
            Ok(Vec::new())
        }
        DataPlan::Plain { start, .. } | DataPlan::Inline { start, .. } => {
            let tail_len = match plan {
                DataPlan::Inline { tail, .. } => *tail as u64,
                _ => 0,
            };
            let body = size - tail_len;
            let mut tail = Vec::with_capacity(tail_len as usize);
            let mut pos = 0u64;
            // Ask for one byte more than remains, so a file that grew is noticed
            // without an extra read at EOF.
            loop {
                let want = (size - pos + 1).min(buf.len() as u64) as usize;
                let n = match file.read(&mut buf[..want]) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(err(e)),
                };
                if n == 0 && pos < size {
                    return Err(Error::Input(format!(
                        "{}: file shrank during the build",
                        path.display()
                    )));
                }
                if pos + n as u64 > size {
                    return Err(Error::Input(format!(
                        "{}: file grew during the build",
                        path.display()
                    )));
                }
                let chunk = &buf[..n];
                let body_part = (body.saturating_sub(pos) as usize).min(n);
                if body_part > 0 {
                    out.write_all_at(&chunk[..body_part], start * bs + pos)
                        .map_err(err)?;
                }
                tail.extend_from_slice(&chunk[body_part..]);
                pos += n as u64;
                if pos == size {
                    break;
                }
            }
            Ok(tail)
        }
        DataPlan::None => Ok(Vec::new()),
    }
}

fn changed(path: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Error::Input(format!("{}: file shrank during the build", path.display()))
    } else {
        Error::source(path, e)
    }
}

fn copy_bytes(bytes: &[u8], plan: &DataPlan, bs: u64, out: &File) -> Result<Vec<u8>, Error> {
    let io = |e| Error::Input(format!("writing image: {e}"));
    match plan {
        DataPlan::Plain { start, .. } => out.write_all_at(bytes, start * bs).map_err(io)?,
        DataPlan::Inline { start, blocks, .. } => {
            let full = (*blocks * bs) as usize;
            out.write_all_at(&bytes[..full], start * bs).map_err(io)?;
            return Ok(bytes[full..].to_vec());
        }
        DataPlan::Chunked {
            chunk_bits, map, ..
        } => {
            for (k, &addr) in map.iter().enumerate() {
                if addr != NULL_ADDR {
                    let from = k << chunk_bits;
                    let to = (from + (1 << chunk_bits)).min(bytes.len());
                    out.write_all_at(&bytes[from..to], addr as u64 * bs)
                        .map_err(io)?;
                }
            }
        }
        DataPlan::None => {}
    }
    Ok(Vec::new())
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
