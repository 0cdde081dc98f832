//! Compressed files: logical offset → physical cluster (kernel `zmap.c`), for every index and
//! lcluster kind the format has (docs/FORMAT.md, "Compressed files").
//!
//! - A mapping spans the whole extent (the kernel's FIEMAP answer): what the reader decodes
//!   once and caches.
//! - Every walk over the indexes is bounded by the largest extent the format allows.

use super::{corrupt, unsupported, ByteSource, Error, Image, Inode, Result};
use crate::zformat::{self as z, LclusterIndex, MapHeader};

/// What a cluster's bytes are, once read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZFormat {
    /// Compressed with this algorithm (`Z_EROFS_COMPRESSION_*`).
    Codec(codecs::Algorithm),
    /// Stored as is from the cluster's first byte (`SHIFTED`).
    Shifted,
    /// Stored as is, rotated so each file block sits at its own block offset (`INTERLACED`).
    Interlaced,
}

impl std::fmt::Display for ZFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZFormat::Codec(a) => a.fmt(f),
            ZFormat::Shifted => f.write_str("uncompressed"),
            ZFormat::Interlaced => f.write_str("uncompressed (interlaced)"),
        }
    }
}

/// Where an extent's stored bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZStored {
    /// `len` bytes at image byte `at`: whole blocks, or the inline tail (ztailpacking).
    Cluster {
        /// Image byte offset of the stored bytes.
        at: u64,
        /// Number of stored bytes.
        len: u64,
        /// Whether the bytes are the inline tail after the indexes.
        inline: bool,
    },
    /// Inside the packed inode's data, from byte `offset` (already decoded there).
    Fragment {
        /// Byte offset in the packed inode's data.
        offset: u64,
    },
}

/// One extent of a compressed file: file bytes `[logical, logical + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZExtent {
    /// First file byte of the extent.
    pub logical: u64,
    /// Length of the extent, in bytes.
    pub len: u64,
    /// Where the extent's stored bytes are.
    pub stored: ZStored,
    /// How the stored bytes are encoded.
    pub format: ZFormat,
    /// The cluster decodes to more than this extent (a shared cluster); only a prefix is ours.
    pub partial: bool,
}

/// The map header, read and checked, plus where the tail lives (kernel
/// `z_erofs_fill_inode_lazy`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ZHeader {
    pub advise: u16,
    pub lclusterbits: u32,
    pub algs: [u8; 2],
    /// ztailpacking: the inline cluster's size, and where it is (after the indexes).
    pub idata_size: u64,
    pub idata_at: u64,
    /// Fragments: the tail extent (or the whole file) is in the packed inode from here.
    pub fragment: bool,
    pub fragment_off: u64,
    /// lcn of the tail extent's head, when the tail is inline or a fragment.
    pub tail_headlcn: u64,
    pub whole_fragment: bool,
    pub compact: bool,
    /// Byte offset of the map header.
    pub at: u64,
}

/// The lcluster being looked at (kernel `z_erofs_maprecorder`).
#[derive(Clone, Copy, Debug, Default)]
struct Rec {
    lcn: u64,
    kind: u8,
    headtype: u8,
    clusterofs: u64,
    delta: [u64; 2],
    pblk: u64,
    compressedblks: u64,
    nextpackoff: u64,
    partialref: bool,
}

/// One mapping query over one inode.
struct Mapper<'a, S: ByteSource> {
    img: &'a Image<S>,
    inode: &'a Inode,
    h: ZHeader,
    /// Lclusters one extent may span at most: bounds every walk over the indexes.
    max_span: u64,
}

impl<S: ByteSource> Image<S> {
    /// The whole extent of compressed `inode` holding file offset `pos` (< size).
    pub fn zmap(&self, inode: &Inode, pos: u64) -> Result<ZExtent> {
        let h = self.zheader(inode)?;
        let m = Mapper::new(self, inode, h);
        m.map(pos)
    }

    /// Reads and checks the map header of `inode`, and finds its tail.
    ///
    /// (Kept per call rather than per inode: the header and index blocks are small reads
    /// the verified source caches.)
    pub(crate) fn zheader(&self, inode: &Inode) -> Result<ZHeader> {
        let at = z::map_header_start(inode.xattr_off + inode.xattr_size);
        let mut raw = [0u8; z::MAP_HEADER_SIZE];
        self.read_at(&mut raw, at, || {
            format!("inode {}: compression map header", inode.nid)
        })?;
        let mh = MapHeader::decode(&raw);
        let nid = inode.nid;
        let mut h = ZHeader {
            advise: 0,
            lclusterbits: self.blkbits,
            algs: [0; 2],
            idata_size: 0,
            idata_at: 0,
            fragment: false,
            fragment_off: 0,
            tail_headlcn: 0,
            whole_fragment: false,
            compact: inode.layout == z::LAYOUT_COMPRESSED_COMPACT,
            at,
        };
        if mh.whole_file_in_packed_inode() {
            h.advise = z::ADVISE_FRAGMENT_PCLUSTER;
            h.fragment = true;
            h.whole_fragment = true;
            h.fragment_off = mh.whole_file_fragment_offset();
            self.check_fragments(inode, at)?;
            return Ok(h);
        }
        h.advise = mh.advise;
        h.lclusterbits = mh.lcluster_bits(self.sb.blkszbits);
        if !h.compact && h.advise & z::ADVISE_EXTENTS != 0 {
            return unsupported(
                at,
                format!("inode {nid}: extent records (Linux 6.15+ compressed format)"),
            );
        }
        h.algs = [mh.head1_algorithm(), mh.head2_algorithm()];
        let big = h.advise & (z::ADVISE_BIG_PCLUSTER_1 | z::ADVISE_BIG_PCLUSTER_2) != 0;
        if big && self.sb.feature_incompat & z::FEATURE_INCOMPAT_BIG_PCLUSTER == 0 {
            return corrupt(
                at,
                format!("inode {nid}: big pclusters without the superblock feature"),
            );
        }
        let b1 = h.advise & z::ADVISE_BIG_PCLUSTER_1 != 0;
        let b2 = h.advise & z::ADVISE_BIG_PCLUSTER_2 != 0;
        if h.compact && b1 != b2 {
            return corrupt(
                at,
                format!("inode {nid}: compact indexes with big pcluster HEAD1/HEAD2 differing"),
            );
        }
        if h.advise & z::ADVISE_FRAGMENT_PCLUSTER != 0 {
            h.fragment = true;
            h.fragment_off = u64::from(mh.fragment_offset());
            self.check_fragments(inode, at)?;
        } else if h.advise & z::ADVISE_INLINE_PCLUSTER != 0 {
            h.idata_size = u64::from(mh.idata_size());
        }
        // The inline cluster and the fragment hold the tail: find its head lcluster.
        if (h.idata_size > 0 || h.fragment) && inode.size > 0 {
            h = Mapper::new(self, inode, h).find_tail()?;
        }
        Ok(h)
    }

    fn check_fragments(&self, inode: &Inode, at: u64) -> Result<()> {
        if self.sb.feature_incompat & z::FEATURE_INCOMPAT_FRAGMENTS == 0 {
            return corrupt(
                at,
                format!(
                    "inode {}: fragment without the superblock feature",
                    inode.nid
                ),
            );
        }
        if inode.nid == self.sb.packed_nid {
            return corrupt(
                at,
                format!(
                    "inode {}: the packed inode has a fragment itself",
                    inode.nid
                ),
            );
        }
        Ok(())
    }
}

/// `zmap` with the header already read (one read serves a whole request).
pub(crate) fn map_with_header<S: ByteSource>(
    img: &Image<S>,
    inode: &Inode,
    h: ZHeader,
    pos: u64,
) -> Result<ZExtent> {
    Mapper::new(img, inode, h).map(pos)
}

impl<'a, S: ByteSource> Mapper<'a, S> {
    fn new(img: &'a Image<S>, inode: &'a Inode, h: ZHeader) -> Self {
        let max_span = (u64::from(z::PCLUSTER_MAX_DSIZE) >> h.lclusterbits.min(63)) + 2;
        Mapper {
            img,
            inode,
            h,
            max_span,
        }
    }

    fn bad<T>(&self, what: String) -> Result<T> {
        corrupt(self.h.at, format!("inode {}: {what}", self.inode.nid))
    }

    fn lcluster_size(&self) -> u64 {
        1u64 << self.h.lclusterbits
    }

    /// Kernel `z_erofs_load_full_lcluster`.
    fn load_full(&self, lcn: u64) -> Result<Rec> {
        let base = z::full_index_start(self.inode.xattr_off + self.inode.xattr_size);
        let pos = lcn
            .checked_mul(z::LCLUSTER_INDEX_SIZE as u64)
            .and_then(|o| o.checked_add(base))
            .ok_or_else(|| Error::Corrupt {
                offset: base,
                what: format!("inode {}: lcluster {lcn} index overflows", self.inode.nid),
            })?;
        let mut raw = [0u8; z::LCLUSTER_INDEX_SIZE];
        self.img.read_at(&mut raw, pos, || {
            format!("inode {}: lcluster {lcn} index", self.inode.nid)
        })?;
        let di = LclusterIndex::decode(&raw);
        let mut m = Rec {
            lcn,
            kind: di.kind(),
            nextpackoff: pos + z::LCLUSTER_INDEX_SIZE as u64,
            ..Rec::default()
        };
        if m.kind == z::LCLUSTER_TYPE_NONHEAD {
            m.clusterofs = self.lcluster_size();
            let [d0, d1] = di.delta();
            m.delta = [u64::from(d0), u64::from(d1)];
            if d0 & z::LI_D0_CBLKCNT != 0 {
                self.need_big_pcluster(lcn)?;
                m.compressedblks = u64::from(d0 & !z::LI_D0_CBLKCNT);
                m.delta[0] = 1;
            }
        } else {
            m.partialref = di.advise & z::LI_PARTIAL_REF != 0;
            m.clusterofs = u64::from(di.cluster_ofs);
            m.pblk = u64::from(di.blkaddr());
        }
        Ok(m)
    }

    fn need_big_pcluster(&self, lcn: u64) -> Result<()> {
        if self.h.advise & (z::ADVISE_BIG_PCLUSTER_1 | z::ADVISE_BIG_PCLUSTER_2) == 0 {
            return self.bad(format!(
                "lcluster {lcn} has a block count but big pclusters are off"
            ));
        }
        Ok(())
    }

    /// Kernel `z_erofs_load_compact_lcluster`: 4-byte packs of 2 and 32-byte packs of 16
    /// lclusters, each ending in the pack's first block address.
    fn load_compact(&self, lcn: u64, lookahead: bool) -> Result<Rec> {
        let img = self.img;
        let ebase = self.h.at + z::MAP_HEADER_SIZE as u64;
        let lcb = self.h.lclusterbits;
        let totalidx = self.inode.size.div_ceil(u64::from(img.block_size()));
        if lcn >= totalidx || lcb > 14 {
            return self.bad(format!(
                "compact lcluster {lcn} out of range ({totalidx} indexes, lcluster bits {lcb})"
            ));
        }
        let initial_4b = ((32 - ebase % 32) / 4) & 7;
        let compacted_2b = if self.h.advise & z::ADVISE_COMPACTED_2B != 0 && initial_4b < totalidx {
            (totalidx - initial_4b) / 16 * 16
        } else {
            0
        };
        let mut pos = ebase;
        let mut rel = lcn;
        let mut shift = 2u32;
        if rel >= initial_4b {
            pos += initial_4b * 4;
            rel -= initial_4b;
            if rel < compacted_2b {
                shift = 1;
            } else {
                pos += compacted_2b * 2;
                rel -= compacted_2b;
            }
        }
        pos += rel << shift;
        let vcnt: u64 = match shift {
            2 => 2,
            _ if lcb <= 12 => 16,
            _ => {
                return unsupported(
                    self.h.at,
                    format!(
                        "inode {}: 2-byte compact indexes with lcluster bits {lcb}",
                        self.inode.nid
                    ),
                )
            }
        };
        let pack = vcnt << shift;
        let pack_at = pos / pack * pack;
        let mut buf = [0u8; 32];
        let buf = &mut buf[..pack as usize];
        img.read_at(buf, pack_at, || {
            format!(
                "inode {}: compact index pack of lcluster {lcn}",
                self.inode.nid
            )
        })?;
        let lobits = lcb.max(12);
        let encodebits = ((pack - 4) * 8 / vcnt) as u32;
        let i = ((pos - pack_at) >> shift) as usize;
        // Each entry: `lobits` of value, then 2 bits of type, at bit `encodebits * i`.
        let decode = |i: usize| -> (u32, u8) {
            let bit = encodebits as usize * i;
            let b = |k: usize| u32::from(buf.get(bit / 8 + k).copied().unwrap_or(0));
            let v = (b(0) | b(1) << 8 | b(2) << 16 | b(3) << 24) >> (bit & 7);
            (v & ((1 << lobits) - 1), ((v >> lobits) & 3) as u8)
        };
        let mut m = Rec {
            lcn,
            nextpackoff: pack_at + pack,
            ..Rec::default()
        };
        let (lo, kind) = decode(i);
        m.kind = kind;
        let cblkcnt = u32::from(z::LI_D0_CBLKCNT);
        let big = self.h.advise & z::ADVISE_BIG_PCLUSTER_1 != 0;
        let vcnt = vcnt as usize;
        if kind == z::LCLUSTER_TYPE_NONHEAD {
            m.clusterofs = self.lcluster_size();
            if lookahead {
                m.delta[1] = compact_lookahead(&decode, vcnt, i);
            }
            if lo & cblkcnt != 0 {
                if !big {
                    return self.bad(format!(
                        "lcluster {lcn} has a block count but big pclusters are off"
                    ));
                }
                m.compressedblks = u64::from(lo & !cblkcnt);
                m.delta[0] = 1;
            } else if i + 1 != vcnt {
                m.delta[0] = u64::from(lo);
            } else {
                // The pack's last entry keeps delta[1]: delta[0] follows from the one before.
                let (plo, ptype) = decode(i - 1);
                let plo = if ptype != z::LCLUSTER_TYPE_NONHEAD {
                    0
                } else if plo & cblkcnt != 0 {
                    1
                } else {
                    u64::from(plo)
                };
                m.delta[0] = plo + 1;
            }
            return Ok(m);
        }
        m.clusterofs = u64::from(lo);
        // The block address: the pack's base plus the clusters of the heads before.
        let mut nblk: u64 = 0;
        let mut j = i as i64;
        if !big {
            nblk = 1;
            while j > 0 {
                j -= 1;
                let (lo, t) = decode(j as usize);
                if t == z::LCLUSTER_TYPE_NONHEAD {
                    j -= i64::from(lo);
                }
                if j >= 0 {
                    nblk += 1;
                }
            }
        } else {
            while j > 0 {
                j -= 1;
                let (lo, t) = decode(j as usize);
                if t == z::LCLUSTER_TYPE_NONHEAD {
                    if lo & cblkcnt != 0 {
                        j -= 1;
                        nblk += u64::from(lo & !cblkcnt);
                        continue;
                    }
                    if lo <= 1 {
                        return self.bad(format!(
                            "lcluster {lcn}: big pcluster pack has a plain delta of {lo}"
                        ));
                    }
                    j -= i64::from(lo) - 2;
                    continue;
                }
                nblk += 1;
            }
        }
        // `buf` is a whole pack of 8 or 32 bytes.
        let Some(base) = z::compact_pack_blkaddr(buf) else {
            return self.bad(format!(
                "lcluster {lcn}: compact index pack of {pack} bytes"
            ));
        };
        m.pblk = u64::from(base) + nblk;
        Ok(m)
    }

    /// Kernel `z_erofs_load_lcluster_from_disk`, with its checks.
    fn load(&self, lcn: u64, lookahead: bool) -> Result<Rec> {
        let m = if self.h.compact {
            self.load_compact(lcn, lookahead)?
        } else {
            self.load_full(lcn)?
        };
        if m.kind != z::LCLUSTER_TYPE_NONHEAD && m.clusterofs >= self.lcluster_size() {
            return self.bad(format!(
                "lcluster {lcn}: cluster offset {} past the lcluster size {}",
                m.clusterofs,
                self.lcluster_size()
            ));
        }
        Ok(m)
    }

    /// Kernel `z_erofs_extent_lookback`: from a NONHEAD lcluster back to its HEAD.
    fn lookback(&self, mut m: Rec, mut distance: u64) -> Result<(Rec, u64)> {
        let start = m.lcn;
        while m.lcn >= distance && distance > 0 {
            let lcn = m.lcn - distance;
            if start - lcn > self.max_span {
                break;
            }
            m = self.load(lcn, false)?;
            if m.kind == z::LCLUSTER_TYPE_NONHEAD {
                distance = m.delta[0];
                continue;
            }
            m.headtype = m.kind;
            return Ok((m, (lcn << self.h.lclusterbits) | m.clusterofs));
        }
        self.bad(format!(
            "bad lookback distance {distance} at lcluster {} (from lcluster {start})",
            m.lcn
        ))
    }

    /// Kernel `z_erofs_get_extent_compressedlen`: the stored size in blocks.
    fn compressed_blocks(&self, m: &Rec) -> Result<u64> {
        let big1 = self.h.advise & z::ADVISE_BIG_PCLUSTER_1 != 0;
        let big2 = self.h.advise & z::ADVISE_BIG_PCLUSTER_2 != 0;
        let lcn = m.lcn + 1;
        let single = match m.headtype {
            z::LCLUSTER_TYPE_HEAD1 => !big1,
            _ => !big2,
        };
        if single || (lcn << self.h.lclusterbits) >= self.inode.size {
            return Ok(1);
        }
        let n = self.load(lcn, false)?;
        if n.kind != z::LCLUSTER_TYPE_NONHEAD {
            // The next lcluster starts another extent: a one-block cluster.
            return Ok(1);
        }
        if n.delta[0] != 1 || n.compressedblks == 0 {
            return self.bad(format!("lcluster {lcn}: no block count (CBLKCNT)"));
        }
        Ok(n.compressedblks)
    }

    /// Kernel `z_erofs_get_extent_decompressedlen`: where the extent starting at
    /// `la` (head lcluster `headlcn`) ends.
    fn extent_end(&self, headlcn: u64) -> Result<u64> {
        let size = self.inode.size;
        let lcb = self.h.lclusterbits;
        let mut lcn = headlcn;
        loop {
            if (lcn << lcb) >= size {
                return Ok(size);
            }
            if lcn - headlcn > self.max_span {
                return self.bad(format!(
                    "extent from lcluster {headlcn} decodes to more than {} bytes",
                    z::PCLUSTER_MAX_DSIZE
                ));
            }
            let mut m = self.load(lcn, true)?;
            if m.kind == z::LCLUSTER_TYPE_NONHEAD {
                // Pre-1.0 mkfs wrote 0 here; the kernel reads it as 1.
                m.delta[1] = m.delta[1].max(1);
            } else if lcn != headlcn {
                return Ok(((lcn << lcb) + m.clusterofs).min(size));
            } else {
                m.delta[1] = 1;
            }
            lcn += m.delta[1];
        }
    }

    /// The head lcluster of the extent holding `pos`, where that extent starts, where it
    /// ends when the lookup already knows, and the end of the first index pack read
    /// (where an inline tail starts).
    fn locate(&self, pos: u64) -> Result<(Rec, u64, Option<u64>, u64)> {
        let lcb = self.h.lclusterbits;
        let endoff = pos & (self.lcluster_size() - 1);
        let m = self.load(pos >> lcb, false)?;
        let nextpackoff = m.nextpackoff;
        if m.kind == z::LCLUSTER_TYPE_NONHEAD {
            let (m, la) = self.lookback(m, m.delta[0])?;
            return Ok((m, la, None, nextpackoff));
        }
        if endoff >= m.clusterofs {
            let mut m = m;
            m.headtype = m.kind;
            return Ok((m, (m.lcn << lcb) | m.clusterofs, None, nextpackoff));
        }
        // `pos` is before the extent starting in this lcluster: the previous one's tail.
        if m.lcn == 0 {
            return self.bad("lcluster 0 starts after its offset 0".into());
        }
        let end = (m.lcn << lcb) | m.clusterofs;
        let (m, la) = self.lookback(m, 1)?;
        Ok((m, la, Some(end), nextpackoff))
    }

    /// Kernel `EROFS_GET_BLOCKS_FINDTAIL`: the tail extent's head, and where an inline
    /// tail cluster starts (right after the last index pack).
    fn find_tail(&self) -> Result<ZHeader> {
        let mut h = self.h;
        let (m, _, _, nextpackoff) = self.locate(self.inode.size - 1)?;
        h.tail_headlcn = m.lcn;
        if h.idata_size > 0 {
            h.idata_at = nextpackoff;
        }
        // Full indexes keep the fragment offset's high half in the tail's block address.
        if h.fragment && !h.compact {
            h.fragment_off |= m.pblk << 32;
        }
        Ok(h)
    }

    /// Kernel `z_erofs_map_blocks_fo`, extended to the whole extent.
    fn map(&self, pos: u64) -> Result<ZExtent> {
        let h = self.h;
        let size = self.inode.size;
        if pos >= size {
            return self.bad(format!("map past the end at offset {pos}"));
        }
        if h.whole_fragment || (h.fragment && h.tail_headlcn == 0) {
            return Ok(ZExtent {
                logical: 0,
                len: size,
                stored: ZStored::Fragment {
                    offset: h.fragment_off,
                },
                format: ZFormat::Shifted,
                partial: false,
            });
        }
        let (m, la, known_end, _) = self.locate(pos)?;
        let is_tail = (h.idata_size > 0 || h.fragment) && m.lcn == h.tail_headlcn;
        let stored = if is_tail && h.idata_size > 0 {
            let at = h.idata_at;
            let bs = u64::from(self.img.block_size());
            if at % bs + h.idata_size > bs {
                return self.bad(format!(
                    "inline cluster of {} bytes at byte {at} crosses a block",
                    h.idata_size
                ));
            }
            ZStored::Cluster {
                at,
                len: h.idata_size,
                inline: true,
            }
        } else if is_tail {
            ZStored::Fragment {
                offset: h.fragment_off,
            }
        } else {
            let blocks = self.compressed_blocks(&m)?;
            ZStored::Cluster {
                at: m.pblk << self.img.blkbits,
                len: blocks << self.img.blkbits,
                inline: false,
            }
        };
        let format = self.format(m.headtype)?;
        let end = match known_end {
            Some(e) => e,
            None => self.extent_end(m.lcn)?,
        };
        if end <= la {
            return self.bad(format!("empty extent at file offset {la}"));
        }
        let e = ZExtent {
            logical: la,
            len: end - la,
            stored,
            format,
            partial: m.partialref,
        };
        self.sanity(&e, pos)?;
        Ok(e)
    }

    /// What a head lcluster's cluster holds: its algorithm must be one the superblock
    /// announces (kernel: "inconsistent algorithmtype").
    fn format(&self, headtype: u8) -> Result<ZFormat> {
        let h = self.h;
        let id = match headtype {
            z::LCLUSTER_TYPE_PLAIN if h.advise & z::ADVISE_INTERLACED_PCLUSTER != 0 => {
                return Ok(ZFormat::Interlaced)
            }
            z::LCLUSTER_TYPE_PLAIN => return Ok(ZFormat::Shifted),
            z::LCLUSTER_TYPE_HEAD2 => h.algs[1],
            _ => h.algs[0],
        };
        let algs = self.img.zconfig.algs;
        match codecs::Algorithm::from_erofs_id(id) {
            Some(a) if algs & (1 << id) != 0 => Ok(ZFormat::Codec(a)),
            _ => self.bad(format!(
                "algorithm {id} is not among the image's ({algs:#x})"
            )),
        }
    }

    /// Kernel `z_erofs_map_sanity_check`, plus what bounds our memory: stored and decoded
    /// sizes within the format's limits (and the LZ4 config's), stored data as large as
    /// the plain data it holds.
    fn sanity(&self, e: &ZExtent, pos: u64) -> Result<()> {
        if e.logical > pos || e.logical + e.len <= pos {
            return self.bad(format!(
                "extent [{}, +{}) does not hold offset {pos}",
                e.logical, e.len
            ));
        }
        let ZStored::Cluster { at, len, .. } = e.stored else {
            return Ok(());
        };
        let mut max = u64::from(z::PCLUSTER_MAX_SIZE);
        if e.format == ZFormat::Codec(codecs::Algorithm::Lz4) {
            let blocks = u64::from(self.img.zconfig.lz4_max_pclusterblks);
            max = max.min(blocks << self.img.blkbits);
        }
        if len > max {
            return self.bad(format!(
                "cluster at byte {at} stores {len} bytes, more than the limit {max}"
            ));
        }
        if e.len > u64::from(z::PCLUSTER_MAX_DSIZE) {
            return self.bad(format!(
                "extent at file offset {} decodes to {} bytes, more than {}",
                e.logical,
                e.len,
                z::PCLUSTER_MAX_DSIZE
            ));
        }
        if matches!(e.format, ZFormat::Shifted | ZFormat::Interlaced) && e.len > len {
            return self.bad(format!(
                "uncompressed extent of {} bytes in a {len}-byte cluster",
                e.len
            ));
        }
        self.img.check_range(at, len, || {
            format!("inode {}: cluster of file offset {pos}", self.inode.nid)
        })
    }
}

/// Kernel `get_compacted_la_distance`: lclusters from entry `i` to the next HEAD.
fn compact_lookahead(decode: &dyn Fn(usize) -> (u32, u8), vcnt: usize, mut i: usize) -> u64 {
    let mut d1 = 0;
    let mut lo = 0;
    while i < vcnt {
        let (l, t) = decode(i);
        lo = l;
        if t != z::LCLUSTER_TYPE_NONHEAD {
            return d1;
        }
        d1 += 1;
        i += 1;
    }
    if lo & u32::from(z::LI_D0_CBLKCNT) == 0 {
        d1 += u64::from(lo).saturating_sub(1);
    }
    d1
}
