//! nid → validated inode (kernel `inode.c` `erofs_read_inode`).
//!
//! Everything that later code relies on is settled here, once: the layout is one we implement,
//! the type is known, the size is sane, and every data location derived from the inode (flat
//! extent, inline tail, chunk index array) lies inside the image. Later reads then only have
//! to check what the inode cannot promise (chunk targets).

use super::sb::align_up;
use super::{corrupt, unsupported, ByteSource, Error, Image, Result};
use crate::format::{self, DiskInode};
use zerocopy::FromBytes;

/// Kernel EROFS_I_ALL before 6.15: version bit + 3 layout bits. Bit 4 (NLINK_1 / DOT_OMITTED)
/// changes the meaning of other fields, so an implementation without it must refuse it.
const I_FORMAT_KNOWN: u16 = 0x000F;
/// Chunk format bits we implement: block bits (0x1F) and 8-byte indexes (0x20); 0x40 is the
/// 6.15 48-bit index format.
const CHUNK_FORMAT_KNOWN: u16 = format::CHUNK_FORMAT_BLKBITS_MASK | format::CHUNK_FORMAT_INDEXES;

/// Where an inode's data lives (private: callers go through `read`/`map`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Data {
    /// Device, FIFO, socket: `i_u` is not an address.
    None,
    /// `ceil(size/bs)` consecutive bytes from `start` (a byte offset).
    Plain { start: u64 },
    /// Full blocks from `start`; the last logical block at byte `tail`.
    Inline { start: u64, tail: u64 },
    /// COMPRESSED_FULL or COMPRESSED_COMPACT: the map header after the xattrs says the rest
    /// (read when the data is, as the kernel does, so a bad index fails reads, not stat).
    Compressed { blocks: u32 },
    /// `count` index entries of `unit` bytes at byte `index`, each mapping `1 << chunkbits`.
    Chunked {
        chunkbits: u32,
        index: u64,
        unit: u64,
        count: u64,
    },
}

/// A parsed, validated inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    /// Node number: the inode's position in the metadata area, in 32-byte slots.
    pub nid: u64,
    /// Full `st_mode` (type and permission bits).
    pub mode: u16,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Hard link count.
    pub nlink: u32,
    /// File size in bytes.
    pub size: u64,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: u32,
    /// (major, minor) for character and block devices, (0, 0) otherwise.
    pub rdev: (u32, u32),
    /// `FLAT_PLAIN`, `FLAT_INLINE`, `CHUNK_BASED`, `COMPRESSED_FULL` or `COMPRESSED_COMPACT`.
    pub layout: u16,
    /// Whether the inode is extended (64 bytes) rather than compact (32 bytes).
    pub extended: bool,
    /// Inline xattr size in 4-byte units (`i_xattr_icount`).
    pub xattr_icount: u16,
    /// The on-disk `i_ino` (32-bit stat compatibility only; the kernel uses the nid).
    pub ino: u32,
    /// Byte offset of the inode.
    pub(crate) offset: u64,
    /// Byte offset and size of the inline xattr body.
    pub(crate) xattr_off: u64,
    pub(crate) xattr_size: u64,
    /// The xattr body header, read together with the inode so the bloom filter can answer
    /// "absent" without another read: (name filter, shared count).
    pub(crate) xattr_header: Option<(u32, u8)>,
    pub(crate) data: Data,
}

impl Inode {
    /// Directory-entry file type of the mode (`FT_UNKNOWN` for an invalid type).
    pub fn file_type(&self) -> u8 {
        format::file_type_of(self.mode).unwrap_or(format::FT_UNKNOWN)
    }

    /// Whether the inode is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & format::S_IFMT == format::S_IFDIR
    }

    /// Whether the inode is a regular file.
    pub fn is_reg(&self) -> bool {
        self.mode & format::S_IFMT == format::S_IFREG
    }

    /// Whether the inode is a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.mode & format::S_IFMT == format::S_IFLNK
    }

    /// Permission bits (including setuid/setgid/sticky).
    pub fn perm(&self) -> u16 {
        self.mode & !format::S_IFMT
    }

    /// `st_blocks` as the kernel's erofs reports it: the blocks a compressed file's
    /// clusters take (its `i_u`), else the size rounded up to blocks.
    pub fn stat_blocks(&self, block_size: u32) -> u64 {
        match self.data {
            Data::Compressed { blocks } => (u64::from(blocks) * u64::from(block_size)) >> 9,
            _ => self.size.next_multiple_of(u64::from(block_size)) >> 9,
        }
    }

    /// Byte offset of the on-disk inode.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// 32 or 64.
    pub fn inode_size(&self) -> u64 {
        if self.extended {
            format::INODE_EXTENDED_SIZE as u64
        } else {
            format::INODE_COMPACT_SIZE as u64
        }
    }
}

impl<S: ByteSource> Image<S> {
    /// Where inode `nid` starts, for error reports (saturating: only ever printed).
    pub(crate) fn inode_offset(&self, nid: u64) -> u64 {
        self.meta_base
            .saturating_add(nid.saturating_mul(1 << format::ISLOT_BITS))
    }

    /// Reads and validates inode `nid`.
    pub fn inode(&self, nid: u64) -> Result<Inode> {
        // Bit 63 marks metabox nids (6.17+), which this reader does not implement.
        if nid >> 63 != 0 {
            return unsupported(self.meta_base, format!("nid {nid:#x} lives in the metabox"));
        }
        let offset = nid
            .checked_mul(1 << format::ISLOT_BITS)
            .and_then(|o| o.checked_add(self.meta_base))
            .ok_or_else(|| Error::Corrupt {
                offset: self.meta_base,
                what: format!("nid {nid} overflows the address space"),
            })?;
        if offset >= self.len {
            return corrupt(
                offset,
                format!(
                    "inode {nid} starts past the end of the image ({} bytes)",
                    self.len
                ),
            );
        }
        // Inode plus the 12-byte xattr header that may follow it, in one read.
        let mut buf = [0u8; format::INODE_EXTENDED_SIZE + format::XATTR_IBODY_HEADER_SIZE];
        let avail = (self.len - offset).min(buf.len() as u64) as usize;
        let got = buf.get_mut(..avail).unwrap_or_default();
        self.read_at(got, offset, || format!("inode {nid}"))?;
        let mut raw = [0u8; format::INODE_EXTENDED_SIZE];
        raw.copy_from_slice(&buf[..format::INODE_EXTENDED_SIZE]);
        let d = DiskInode::decode(&raw);
        let isize = d.disk_size();
        let ctx = |what: String| format!("inode {nid}: {what}");
        if avail < isize {
            return corrupt(
                offset,
                ctx(format!(
                    "{isize}-byte inode is cut off by the end of the image"
                )),
            );
        }
        if d.format & !I_FORMAT_KNOWN != 0 {
            return unsupported(
                offset,
                ctx(format!(
                    "i_format {:#x} has unknown bits (>= 0x10)",
                    d.format
                )),
            );
        }
        let layout = d.layout();
        match layout {
            format::LAYOUT_FLAT_PLAIN | format::LAYOUT_FLAT_INLINE | format::LAYOUT_CHUNK_BASED => {
            }
            crate::zformat::LAYOUT_COMPRESSED_FULL | crate::zformat::LAYOUT_COMPRESSED_COMPACT => {
                // mkfs.erofs compresses regular files only; the kernel reads a compressed
                // directory or symlink, but nothing makes one.
                if format::file_type_of(d.mode) != Some(format::FT_REG_FILE) {
                    return unsupported(
                        offset,
                        ctx(format!(
                            "compressed data layout {layout} on a non-regular file"
                        )),
                    );
                }
            }
            _ => return unsupported(offset, ctx(format!("unknown data layout {layout}"))),
        }
        let ftype = match format::file_type_of(d.mode) {
            Some(t) => t,
            None => {
                return corrupt(
                    offset,
                    ctx(format!("mode {:#o} has an invalid file type", d.mode)),
                )
            }
        };
        // The kernel refuses negative sizes (EFSCORRUPTED) since loff_t is signed.
        if d.size >> 63 != 0 {
            return corrupt(offset, ctx(format!("size {:#x} is negative", d.size)));
        }
        let (mtime, mtime_nsec) = if d.extended {
            // 6.15+ kernels OR extended i_nb into bits 32..47 of the start block; older ones
            // ignore it. Refuse rather than pick one meaning.
            if d.i_nb != 0 {
                return unsupported(
                    offset,
                    ctx(format!(
                        "extended i_nb {:#x} (48-bit block address)",
                        d.i_nb
                    )),
                );
            }
            (d.mtime as i64, d.mtime_nsec)
        } else {
            // 6.15+: compact inodes carry seconds since the superblock epoch at 0x0C.
            let t = (self.sb.epoch as i64).checked_add(i64::from(d.i_nb));
            match t {
                Some(t) => (t, self.sb.fixed_nsec),
                None => return corrupt(offset, ctx("epoch + compact mtime overflows".into())),
            }
        };
        // isize ≤ 64 and offset < len ≤ u64::MAX: no overflow, but keep the arithmetic checked.
        let overflow = || Error::Corrupt {
            offset,
            what: ctx("layout offsets overflow".into()),
        };
        let xattr_off = offset.checked_add(isize as u64).ok_or_else(overflow)?;
        let xattr_size = format::xattr_ibody_size(d.xattr_icount) as u64;
        let xattr_header = if d.xattr_icount == 0 {
            None
        } else {
            let h = buf
                .get(isize..avail)
                .and_then(|b| format::raw::XattrIbodyHeader::read_from_prefix(b).ok());
            match h {
                Some((h, _)) => Some((h.h_name_filter.get(), h.h_shared_count)),
                None => {
                    return corrupt(
                        xattr_off,
                        ctx("xattr body starts past the end of the image".into()),
                    )
                }
            }
        };
        let data_off = xattr_off.checked_add(xattr_size).ok_or_else(overflow)?;
        let bs = u64::from(self.block_size());
        let rdev = match ftype {
            format::FT_CHRDEV | format::FT_BLKDEV => format::decode_dev(d.i_u),
            _ => (0, 0),
        };
        let data = match ftype {
            format::FT_REG_FILE | format::FT_DIR | format::FT_SYMLINK => {
                self.data_layout(&d, layout, offset, data_off, bs, &ctx)?
            }
            _ => Data::None,
        };
        Ok(Inode {
            nid,
            mode: d.mode,
            uid: d.uid,
            gid: d.gid,
            nlink: d.nlink,
            size: d.size,
            mtime,
            mtime_nsec,
            rdev,
            layout,
            extended: d.extended,
            xattr_icount: d.xattr_icount,
            ino: d.ino,
            offset,
            xattr_off,
            xattr_size,
            xattr_header,
            data,
        })
    }

    fn data_layout(
        &self,
        d: &DiskInode,
        layout: u16,
        offset: u64,
        data_off: u64,
        bs: u64,
        ctx: &dyn Fn(String) -> String,
    ) -> Result<Data> {
        let size = d.size;
        let start = u64::from(d.i_u) << self.blkbits;
        match layout {
            crate::zformat::LAYOUT_COMPRESSED_FULL | crate::zformat::LAYOUT_COMPRESSED_COMPACT => {
                Ok(Data::Compressed { blocks: d.i_u })
            }
            format::LAYOUT_FLAT_PLAIN => {
                if size > 0 {
                    self.check_range(start, size, || {
                        ctx(format!("FLAT_PLAIN data at block {}", d.i_u))
                    })?;
                }
                Ok(Data::Plain { start })
            }
            format::LAYOUT_FLAT_INLINE => {
                if size == 0 {
                    return Ok(Data::Inline {
                        start,
                        tail: data_off,
                    });
                }
                let nblocks = (size - 1) / bs + 1;
                let full = (nblocks - 1) * bs; // < size: cannot overflow
                let tail_len = size - full;
                if full > 0 {
                    self.check_range(start, full, || {
                        ctx(format!("FLAT_INLINE blocks at block {}", d.i_u))
                    })?;
                }
                // Kernel: "inline data across blocks" → EFSCORRUPTED. The tail is read from the
                // single metadata block that holds it.
                if data_off % bs + tail_len > bs {
                    return corrupt(
                        data_off,
                        ctx(format!("inline tail of {tail_len} bytes at block offset {} crosses a block boundary", data_off % bs)),
                    );
                }
                self.check_range(data_off, tail_len, || ctx("inline tail".into()))?;
                Ok(Data::Inline {
                    start,
                    tail: data_off,
                })
            }
            _ => {
                let fmt = d.chunk_format();
                if fmt & !CHUNK_FORMAT_KNOWN != 0 {
                    return unsupported(
                        offset,
                        ctx(format!("chunk format {fmt:#x} has unknown bits")),
                    );
                }
                // Up to 16 + 31 = 47: shifts stay in u64.
                let chunkbits = self.blkbits + u32::from(fmt & format::CHUNK_FORMAT_BLKBITS_MASK);
                let unit = if fmt & format::CHUNK_FORMAT_INDEXES != 0 {
                    size_of::<format::raw::ChunkIndex>()
                } else {
                    size_of::<format::raw::BlockMapEntry>()
                } as u64;
                let count = if size == 0 {
                    0
                } else {
                    ((size - 1) >> chunkbits) + 1
                };
                let index = align_up(data_off, unit).ok_or_else(|| Error::Corrupt {
                    offset,
                    what: ctx("chunk index offset overflows".into()),
                })?;
                // The whole index array must be in the image: this is what bounds an absurd
                // i_size, without ever allocating per chunk.
                let bytes = count.checked_mul(unit).ok_or_else(|| Error::Corrupt {
                    offset,
                    what: ctx(format!("{count} chunks overflow")),
                })?;
                self.check_range(index, bytes, || {
                    ctx(format!("chunk index array of {count} entries"))
                })?;
                Ok(Data::Chunked {
                    chunkbits,
                    index,
                    unit,
                    count,
                })
            }
        }
    }
}
