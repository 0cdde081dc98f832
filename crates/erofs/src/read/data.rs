//! Logical file offset → image bytes (kernel `data.c` `erofs_map_blocks`), and `read`.

use std::fmt;

use super::inode::Data;
pub use super::zdata::ZLayout;
use super::{corrupt, unsupported, ByteSource, Error, Image, Inode, Result};
use crate::format::{self, raw};
use zerocopy::IntoBytes;

/// A run of file bytes `[logical, logical + len)` stored contiguously at `physical`, or a
/// hole (reads as zeros) when `physical` is `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First file byte of the run.
    pub logical: u64,
    /// Length of the run, in bytes.
    pub len: u64,
    /// Image byte offset of the stored bytes, or `None` for a hole.
    pub physical: Option<u64>,
    /// The bytes are stored compressed (`physical` is where the cluster starts, or the
    /// offset in the packed inode for a fragment): not the file's bytes, read them only
    /// through `read`. See [`Image::zmap`] for the details.
    pub encoded: bool,
}

/// Where an inode and its data live, for `verilay inspect`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutInfo {
    /// Data layout (`LAYOUT_*`).
    pub layout: u16,
    /// Byte offset of the inode.
    pub inode_offset: u64,
    /// On-disk size of the inode, in bytes.
    pub inode_size: u64,
    /// Byte offset of the inline xattr body.
    pub xattr_offset: u64,
    /// Size of the inline xattr body, in bytes.
    pub xattr_size: u64,
    /// First data block (FLAT_PLAIN, and FLAT_INLINE with at least one full block).
    pub start_block: Option<u64>,
    /// Full blocks stored at `start_block`.
    pub blocks: u64,
    /// FLAT_INLINE tail: (byte offset, length).
    pub tail: Option<(u64, u64)>,
    /// Chunk size in bytes (CHUNK_BASED only).
    pub chunk_size: Option<u64>,
    /// Number of chunks (zero unless CHUNK_BASED).
    pub chunk_count: u64,
    /// Byte offset of the chunk index array and the size of one entry (4 or 8).
    pub chunk_index: Option<(u64, u64)>,
    /// Compressed files: what `inspect` shows of them (None if the map cannot be read).
    pub compressed: Option<ZLayout>,
}

impl fmt::Display for LayoutInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.layout {
            format::LAYOUT_FLAT_PLAIN => "flat-plain",
            format::LAYOUT_FLAT_INLINE => "flat-inline",
            format::LAYOUT_CHUNK_BASED => "chunk-based",
            crate::zformat::LAYOUT_COMPRESSED_FULL => "compressed-full",
            crate::zformat::LAYOUT_COMPRESSED_COMPACT => "compressed-compact",
            _ => "unknown",
        };
        write!(
            f,
            "{name}, inode at byte {} ({} bytes)",
            self.inode_offset, self.inode_size
        )?;
        if self.xattr_size > 0 {
            write!(
                f,
                ", xattrs at byte {} ({} bytes)",
                self.xattr_offset, self.xattr_size
            )?;
        }
        if let Some(b) = self.start_block {
            write!(f, ", {} blocks from block {b}", self.blocks)?;
        }
        if let Some((off, len)) = self.tail {
            write!(f, ", tail {len} bytes at byte {off}")?;
        }
        if let (Some(cs), Some((off, unit))) = (self.chunk_size, self.chunk_index) {
            write!(
                f,
                ", {} chunks of {cs} bytes, {unit}-byte indexes at byte {off}",
                self.chunk_count
            )?;
        }
        if let Some(z) = &self.compressed {
            write!(
                f,
                ", map header at byte {}, {} indexes, {} lclusters, {}{}",
                z.map_header,
                if z.compact { "compact" } else { "full" },
                z.lcluster_size,
                z.algorithms.join("/"),
                if z.big_pclusters {
                    ", big pclusters"
                } else {
                    ""
                }
            )?;
            if let Some((at, len)) = z.inline_tail {
                write!(f, ", inline tail cluster {len} bytes at byte {at}")?;
            }
            if let Some(off) = z.fragment {
                write!(f, ", fragment at byte {off} of the packed inode")?;
            }
            write!(
                f,
                ", {} extents, largest cluster {} bytes, {} bytes stored",
                z.extents, z.max_cluster, z.stored
            )?;
        }
        Ok(())
    }
}

impl<S: ByteSource> Image<S> {
    /// Describes where `inode` and its data live.
    pub fn layout_info(&self, inode: &Inode) -> LayoutInfo {
        let bs = u64::from(self.block_size());
        let mut info = LayoutInfo {
            layout: inode.layout,
            inode_offset: inode.offset,
            inode_size: inode.inode_size(),
            xattr_offset: inode.xattr_off,
            xattr_size: inode.xattr_size,
            start_block: None,
            blocks: 0,
            tail: None,
            chunk_size: None,
            chunk_count: 0,
            chunk_index: None,
            compressed: None,
        };
        let nblocks = inode.size.div_ceil(bs);
        match inode.data {
            Data::None => {}
            Data::Plain { start } => {
                if nblocks > 0 {
                    info.start_block = Some(start >> self.blkbits);
                    info.blocks = nblocks;
                }
            }
            Data::Inline { start, tail } => {
                if nblocks > 1 {
                    info.start_block = Some(start >> self.blkbits);
                    info.blocks = nblocks - 1;
                }
                if nblocks > 0 {
                    info.tail = Some((tail, inode.size - (nblocks - 1) * bs));
                }
            }
            Data::Chunked {
                chunkbits,
                index,
                unit,
                count,
            } => {
                info.chunk_size = Some(1 << chunkbits);
                info.chunk_count = count;
                info.chunk_index = Some((index, unit));
            }
            Data::Compressed { .. } => info.compressed = self.zlayout(inode).ok(),
        }
        info
    }

    /// The extent containing file offset `pos`. Past EOF (or for inodes without data) the
    /// answer is an empty hole at `pos`.
    pub fn map(&self, inode: &Inode, pos: u64) -> Result<Extent> {
        let size = inode.size;
        if pos >= size {
            return Ok(Extent {
                logical: pos,
                len: 0,
                physical: None,
                encoded: false,
            });
        }
        let bs = u64::from(self.block_size());
        // Offsets below were validated against the image when the inode was read.
        Ok(match inode.data {
            Data::None => Extent {
                logical: 0,
                len: size,
                physical: None,
                encoded: false,
            },
            Data::Plain { start } => Extent {
                logical: 0,
                len: size,
                physical: Some(start),
                encoded: false,
            },
            Data::Inline { start, tail } => {
                let full = (size - 1) / bs * bs;
                if pos < full {
                    Extent {
                        logical: 0,
                        len: full,
                        physical: Some(start),
                        encoded: false,
                    }
                } else {
                    Extent {
                        logical: full,
                        len: size - full,
                        physical: Some(tail),
                        encoded: false,
                    }
                }
            }
            Data::Chunked {
                chunkbits,
                index,
                unit,
                count,
            } => self.map_chunk(inode, pos, chunkbits, index, unit, count)?,
            Data::Compressed { .. } => {
                let z = self.zmap(inode, pos)?;
                Extent {
                    logical: z.logical,
                    len: z.len,
                    physical: Some(match z.stored {
                        super::ZStored::Cluster { at, .. } => at,
                        super::ZStored::Fragment { offset } => offset,
                    }),
                    encoded: true,
                }
            }
        })
    }

    fn map_chunk(
        &self,
        inode: &Inode,
        pos: u64,
        chunkbits: u32,
        index: u64,
        unit: u64,
        count: u64,
    ) -> Result<Extent> {
        let nr = pos >> chunkbits;
        let size = inode.size;
        let nid = inode.nid;
        let at = nr
            .checked_mul(unit)
            .and_then(|o| o.checked_add(index))
            .filter(|_| nr < count)
            .ok_or_else(|| Error::Corrupt {
                offset: index,
                what: format!("inode {nid}: chunk {nr} index out of range"),
            })?;
        let what = || format!("inode {nid}: chunk {nr} index");
        let blk = if unit == size_of::<raw::BlockMapEntry>() as u64 {
            let mut e = raw::BlockMapEntry::default();
            self.read_at(e.as_mut_bytes(), at, what)?;
            e.blkaddr.get()
        } else {
            let mut e = raw::ChunkIndex::default();
            self.read_at(e.as_mut_bytes(), at, what)?;
            let (hi, dev, lo) = (e.startblk_hi.get(), e.device_id.get(), e.startblk_lo.get());
            if lo != format::NULL_ADDR {
                // Multi-device images need a device table; none is supported.
                if dev != 0 {
                    return unsupported(
                        at,
                        format!("inode {nid}: chunk {nr} on extra device {dev}"),
                    );
                }
                // 6.15+ uses this as block bits 32..47; older kernels ignore it.
                if hi != 0 {
                    return unsupported(
                        at,
                        format!("inode {nid}: chunk {nr} has 48-bit start block (hi {hi:#x})"),
                    );
                }
            }
            lo
        };
        let logical = nr << chunkbits;
        let len = (size - logical).min(1u64 << chunkbits);
        if blk == format::NULL_ADDR {
            return Ok(Extent {
                logical,
                len,
                physical: None,
                encoded: false,
            });
        }
        let physical = u64::from(blk) << self.blkbits;
        self.check_range(physical, len, || {
            format!("inode {nid}: chunk {nr} data at block {blk}")
        })?;
        Ok(Extent {
            logical,
            len,
            physical: Some(physical),
            encoded: false,
        })
    }

    /// pread semantics: fills `buf` from file offset `offset`, returns the number of bytes
    /// read; 0 at or after EOF, short only at EOF. Holes read as zeros.
    pub fn read(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if matches!(inode.data, Data::None) || offset >= inode.size {
            return Ok(0);
        }
        if matches!(inode.data, Data::Compressed { .. }) {
            return self.zread(inode, offset, buf);
        }
        let total = (inode.size - offset).min(buf.len() as u64) as usize;
        let mut done = 0usize;
        while done < total {
            let pos = offset + done as u64;
            let ext = self.map(inode, pos)?;
            let ext_end = ext.logical.saturating_add(ext.len);
            // Never trust a mapping that does not cover `pos`: it would loop forever.
            if ext.logical > pos || ext_end <= pos {
                return corrupt(
                    inode.offset,
                    format!("inode {}: mapping for offset {pos} is empty", inode.nid),
                );
            }
            let n = (ext_end - pos).min((total - done) as u64) as usize;
            let out = &mut buf[done..done + n];
            match ext.physical {
                Some(p) => {
                    let at = p + (pos - ext.logical);
                    self.read_at(out, at, || {
                        format!("inode {} data at offset {pos}", inode.nid)
                    })?;
                }
                None => out.fill(0),
            }
            done += n;
        }
        Ok(total)
    }

    /// Symlink target. Targets longer than 4095 bytes are refused: the kernel's page-based
    /// path silently cuts them at PAGE_SIZE - 1, and we never allocate by an untrusted size.
    pub fn readlink(&self, inode: &Inode) -> Result<Vec<u8>> {
        if !inode.is_symlink() {
            return Err(Error::NotASymlink {
                nid: inode.nid,
                offset: inode.offset,
            });
        }
        const MAX: u64 = 4095;
        if inode.size > MAX {
            return corrupt(
                inode.offset,
                format!(
                    "inode {}: symlink target of {} bytes exceeds {MAX}",
                    inode.nid, inode.size
                ),
            );
        }
        let mut target = vec![0u8; inode.size as usize];
        let n = self.read(inode, 0, &mut target)?;
        target.truncate(n);
        Ok(target)
    }
}
