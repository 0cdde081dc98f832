//! Compressed files: the superblock's compression configs (`decompressor.c`), reading a
//! range (each extent decoded once, through a cache of decoded extents), and checking that
//! every extent decodes (`fsck`). Stored bytes come only through the image's
//! [`ByteSource`]: on a verified mount, clusters are verified before they are decoded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::zmap::{ZExtent, ZFormat, ZStored};
use super::{corrupt, unsupported, ByteSource, Error, Image, Inode, Result};
use crate::format;
use crate::zformat::{self as z, ComprCfg};
use zerocopy::little_endian::U16;
use zerocopy::IntoBytes;

/// Bytes of decoded extents kept per image. A FUSE read is at most 1 MiB and most are
/// 4-128 KiB, while one extent decodes to 4 KiB-1 MiB (mkfs's `-C` sizes): 32 MiB keeps
/// the extents of a few dozen sequential readers (the daemon's threads and the kernel's
/// readahead) and the hot small files, so an extent is decoded once per pass, not once
/// per 4 KiB page; and it is a fixed cost per opened image however hostile the image.
const CACHE_BYTES: u64 = 32 << 20;

/// What the superblock says about compression (kernel `erofs_sb_info` fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZConfig {
    /// Bit n: algorithm n may be used (`available_compr_algs`, or LZ4 alone without cfgs).
    pub algs: u16,
    /// LZ4's largest cluster in blocks (1 without config records).
    pub lz4_max_pclusterblks: u16,
    /// LZ4 window size in bytes, as the image records it (0 when it records none).
    pub lz4_max_distance: u16,
    /// The clusters' stored bytes start with zero padding to strip (always for the
    /// algorithms after LZ4; for LZ4 only with `LZ4_0PADDING`).
    pub lz4_zero_padding: bool,
    /// Config records read after the superblock.
    pub records: u16,
}

/// A compressed file's settings and sizes, for `verilay inspect`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZLayout {
    pub map_header: u64,
    pub compact: bool,
    pub lcluster_size: u64,
    /// The algorithms of HEAD1 and HEAD2 clusters.
    pub algorithms: Vec<String>,
    pub big_pclusters: bool,
    /// Inline tail cluster (ztailpacking): (byte offset, stored bytes).
    pub inline_tail: Option<(u64, u64)>,
    /// Tail (or whole file) in the packed inode, from this offset of it.
    pub fragment: Option<u64>,
    pub extents: u64,
    /// Largest stored cluster.
    pub max_cluster: u64,
    /// Bytes of clusters the file's extents point at (a shared cluster counts each time).
    pub stored: u64,
}

/// Extents `inspect` walks at most (a hostile index could claim millions).
const INSPECT_EXTENTS: u64 = 1 << 20;

/// A decoded extent is fully determined by where its cluster is, how it is stored, and
/// how much of it is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    at: u64,
    stored_len: u64,
    decoded_len: u64,
    format: ZFormat,
    /// Interlaced clusters: where in its block the extent starts.
    shift: u64,
}

#[derive(Clone)]
struct ByBytes;

impl quick_cache::Weighter<Key, Arc<Vec<u8>>> for ByBytes {
    fn weight(&self, _key: &Key, val: &Arc<Vec<u8>>) -> u64 {
        <[u8]>::len(val) as u64 + 64
    }
}

/// Decoded extents, shared by every thread reading the image (CLOCK-Pro eviction by bytes;
/// concurrent misses on one extent decode it once).
pub(crate) struct ZCache {
    /// A `Vec` behind the `Arc` so a decoded extent is kept without a copy.
    extents: quick_cache::sync::Cache<Key, Arc<Vec<u8>>, ByBytes>,
    /// Extents decoded so far (the cache's misses).
    decodes: AtomicU64,
}

impl ZCache {
    pub(crate) fn new() -> ZCache {
        ZCache {
            extents: quick_cache::sync::Cache::with_weighter(1024, CACHE_BYTES, ByBytes),
            decodes: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for ZCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZCache({} extents)", self.extents.len())
    }
}

/// Reads the compression configuration: the records after the superblock (COMPR_CFGS),
/// or LZ4 alone with `lz4_max_distance` in the same superblock field.
pub(crate) fn read_config<S: ByteSource>(
    src: &S,
    len: u64,
    sb: &format::Superblock,
) -> Result<ZConfig> {
    let sb_off = format::SUPER_OFFSET;
    let mut c = ZConfig {
        lz4_zero_padding: sb.feature_incompat & z::FEATURE_INCOMPAT_LZ4_0PADDING != 0,
        lz4_max_pclusterblks: 1,
        ..ZConfig::default()
    };
    if sb.feature_incompat & z::FEATURE_INCOMPAT_COMPR_CFGS == 0 {
        c.algs = 1 << codecs::Algorithm::Lz4.erofs_id();
        c.lz4_max_distance = sb.available_compr_algs;
        return Ok(c);
    }
    c.algs = sb.available_compr_algs;
    let known = (1u16 << codecs::Algorithm::ALL.len()) - 1;
    if c.algs & !known != 0 {
        return unsupported(
            sb_off + core::mem::offset_of!(format::raw::Superblock, available_compr_algs) as u64,
            format!("unknown compression algorithms {:#x}", c.algs & !known),
        );
    }
    let mut pos =
        sb_off + format::SUPER_SIZE as u64 + format::SB_EXTSLOT_SIZE * u64::from(sb.sb_extslots);
    for alg in 0..codecs::Algorithm::ALL.len() as u8 {
        if c.algs & (1 << alg) == 0 {
            continue;
        }
        // Records are 4-aligned: a le16 size, then the payload (kernel `erofs_read_metadata`).
        pos = pos.next_multiple_of(4);
        let mut sz = U16::ZERO;
        read(src, len, sz.as_mut_bytes(), pos, alg)?;
        let size = u64::from(sz.get());
        let want = ComprCfg::payload_size(alg).unwrap_or(0);
        if size < want as u64 {
            return corrupt(
                pos,
                format!("compression config {alg}: {size} bytes, expected {want}"),
            );
        }
        let mut payload = [0u8; 14];
        let payload = &mut payload[..want];
        read(src, len, payload, pos + 2, alg)?;
        let cfg = ComprCfg::decode(alg, payload).ok_or_else(|| Error::Corrupt {
            offset: pos,
            what: format!("compression config {alg} does not decode"),
        })?;
        check_config(&mut c, cfg, pos, sb.blkszbits)?;
        c.records += 1;
        pos += 2 + size;
    }
    Ok(c)
}

fn read<S: ByteSource>(src: &S, len: u64, buf: &mut [u8], at: u64, alg: u8) -> Result<()> {
    if at.saturating_add(buf.len() as u64) > len {
        return corrupt(
            at,
            format!("compression config {alg} extends past the end of the image"),
        );
    }
    src.read_exact_at(buf, at)
        .map_err(|err| Error::Io { offset: at, err })
}

/// The kernel's `z_erofs_load_*_config` checks.
fn check_config(c: &mut ZConfig, cfg: ComprCfg, pos: u64, blkszbits: u8) -> Result<()> {
    match cfg {
        ComprCfg::Lz4 {
            max_distance,
            max_pclusterblks,
        } => {
            let blocks = max_pclusterblks.max(1);
            if u64::from(blocks) << blkszbits > u64::from(z::PCLUSTER_MAX_SIZE) {
                return corrupt(
                    pos,
                    format!("lz4 clusters of {blocks} blocks exceed the 1 MiB limit"),
                );
            }
            c.lz4_max_pclusterblks = blocks;
            c.lz4_max_distance = max_distance;
        }
        ComprCfg::Lzma { dict_size, format } => {
            if format != 0 || dict_size > z::LZMA_MAX_DICT_SIZE {
                return unsupported(
                    pos,
                    format!("lzma format {format} with a {dict_size}-byte dictionary"),
                );
            }
        }
        ComprCfg::Deflate { windowbits } => {
            if windowbits > 15 {
                return unsupported(pos, format!("deflate window bits {windowbits} > 15"));
            }
        }
        ComprCfg::Zstd { format, windowlog } => {
            if format != 0 || u32::from(windowlog) + 10 > z::ZSTD_MAX_DICT_SIZE.ilog2() {
                return unsupported(
                    pos,
                    format!("zstd format {format} with window log {windowlog} + 10"),
                );
            }
        }
    }
    Ok(())
}

impl<S: ByteSource> Image<S> {
    /// How many extents have been decoded (cache misses), for tests and stats.
    pub fn zdecodes(&self) -> u64 {
        self.zcache.decodes.load(Ordering::Relaxed)
    }

    /// The superblock's compression settings.
    pub fn zconfig(&self) -> &ZConfig {
        &self.zconfig
    }

    /// pread on a compressed file (`read` dispatches here): each extent is decoded whole,
    /// once, and kept in the cache.
    pub(crate) fn zread(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if offset >= inode.size {
            return Ok(0);
        }
        let total = (inode.size - offset).min(buf.len() as u64) as usize;
        let h = self.zheader(inode)?;
        let mut done = 0;
        while done < total {
            let pos = offset + done as u64;
            let e = self.zmap_with(inode, h, pos)?;
            let n = (e.logical + e.len - pos).min((total - done) as u64) as usize;
            let out = &mut buf[done..done + n];
            let skip = pos - e.logical;
            match e.stored {
                ZStored::Fragment { offset: frag } => self.read_fragment(inode, frag, skip, out)?,
                ZStored::Cluster { .. } => {
                    let data = self.decoded(inode, &e)?;
                    out.copy_from_slice(&data[skip as usize..skip as usize + n]);
                }
            }
            done += n;
        }
        Ok(total)
    }

    /// Bytes of a fragment, from the packed inode (which is itself a file of this image).
    fn read_fragment(&self, inode: &Inode, frag: u64, skip: u64, out: &mut [u8]) -> Result<()> {
        let packed = self.inode(self.sb.packed_nid)?;
        if packed.nid == inode.nid || !packed.is_reg() {
            return corrupt(
                packed.offset,
                format!(
                    "inode {}: packed inode {} is not a regular file",
                    inode.nid, packed.nid
                ),
            );
        }
        let at = frag.checked_add(skip).ok_or_else(|| Error::Corrupt {
            offset: inode.offset,
            what: format!("inode {}: fragment offset {frag} overflows", inode.nid),
        })?;
        // The packed inode holds no fragments itself (checked when its header is read), so
        // this recursion is one level deep.
        let got = self.read(&packed, at, out)?;
        if got != out.len() {
            return corrupt(
                inode.offset,
                format!(
                    "inode {}: fragment at byte {at} of the packed inode ends early",
                    inode.nid
                ),
            );
        }
        Ok(())
    }

    /// The decoded bytes of extent `e` (a cluster), from the cache or decoded now.
    fn decoded(&self, inode: &Inode, e: &ZExtent) -> Result<Arc<Vec<u8>>> {
        let ZStored::Cluster { at, len, .. } = e.stored else {
            return corrupt(inode.offset, "fragment has no cluster");
        };
        let bs = u64::from(self.block_size());
        let key = Key {
            at,
            stored_len: len,
            decoded_len: e.len,
            format: e.format,
            shift: match e.format {
                ZFormat::Interlaced => e.logical % bs,
                _ => 0,
            },
        };
        self.zcache.extents.get_or_insert_with(&key, || {
            self.zcache.decodes.fetch_add(1, Ordering::Relaxed);
            self.decode(inode, e, key).map(Arc::new)
        })
    }

    /// Reads a cluster's stored bytes (through the source: verified first) and decodes
    /// them into exactly the extent's length. Sizes were bounded by `zmap`.
    fn decode(&self, inode: &Inode, e: &ZExtent, key: Key) -> Result<Vec<u8>> {
        let nid = inode.nid;
        let at = key.at;
        let mut stored = vec![0u8; key.stored_len as usize];
        self.read_at(&mut stored, at, || {
            format!("inode {nid}: cluster of file offset {}", e.logical)
        })?;
        let mut out = vec![0u8; e.len as usize];
        let n = out.len();
        match e.format {
            ZFormat::Shifted => out.copy_from_slice(&stored[..n]),
            ZFormat::Interlaced => {
                // Kernel `z_erofs_transform_plain`: the extent's first block part sits at
                // the cluster's end, the rest from its start.
                let bs = u64::from(self.block_size());
                let first = ((bs - key.shift) as usize).min(n);
                let s = stored.len();
                out[..first].copy_from_slice(&stored[s - first..]);
                out[first..].copy_from_slice(&stored[..n - first]);
            }
            ZFormat::Codec(alg) => {
                let input = self.strip_padding(&stored, at, alg);
                if input.is_empty() {
                    return corrupt(
                        at,
                        format!(
                            "inode {nid}: cluster of file offset {} is all zeros (no {alg} data)",
                            e.logical
                        ),
                    );
                }
                codecs::decompress(alg, input, &mut out).map_err(|err| Error::Corrupt {
                    offset: at,
                    what: format!(
                        "inode {nid}: cluster of file offset {} ({} stored bytes): {err}",
                        e.logical,
                        stored.len()
                    ),
                })?;
            }
        }
        Ok(out)
    }

    /// Kernel `z_erofs_fixup_insize`: the stream starts after the zero bytes that pad it to
    /// the cluster's end, looked for in the cluster's first block only.
    fn strip_padding<'b>(&self, stored: &'b [u8], at: u64, alg: codecs::Algorithm) -> &'b [u8] {
        if alg == codecs::Algorithm::Lz4 && !self.zconfig.lz4_zero_padding {
            return stored;
        }
        let bs = u64::from(self.block_size());
        let window = ((bs - at % bs) as usize).min(stored.len());
        match stored[..window].iter().position(|&b| b != 0) {
            Some(i) => &stored[i..],
            None => &[],
        }
    }

    /// Where a compressed file's data is, extent by extent (mapped, not decoded).
    pub(crate) fn zlayout(&self, inode: &Inode) -> Result<ZLayout> {
        let h = self.zheader(inode)?;
        let name = |id: u8| {
            codecs::Algorithm::from_erofs_id(id)
                .map_or(format!("algorithm {id}"), |a| a.to_string())
        };
        // A file wholly in the packed inode has no clusters (nor algorithm) of its own.
        let mut algorithms = Vec::new();
        if !h.whole_fragment {
            algorithms.push(name(h.algs[0]));
        }
        if !h.whole_fragment
            && self.sb.feature_incompat & z::FEATURE_INCOMPAT_COMPR_HEAD2 != 0
            && h.algs[1] != h.algs[0]
        {
            algorithms.push(name(h.algs[1]));
        }
        let mut z = ZLayout {
            map_header: h.at,
            compact: h.compact,
            lcluster_size: 1 << h.lclusterbits,
            algorithms,
            big_pclusters: h.advise & (z::ADVISE_BIG_PCLUSTER_1 | z::ADVISE_BIG_PCLUSTER_2) != 0,
            inline_tail: (h.idata_size > 0).then_some((h.idata_at, h.idata_size)),
            fragment: h.fragment.then_some(h.fragment_off),
            extents: 0,
            max_cluster: 0,
            stored: 0,
        };
        let mut pos = 0;
        while pos < inode.size && z.extents < INSPECT_EXTENTS {
            let e = self.zmap_with(inode, h, pos)?;
            if let ZStored::Cluster { len, .. } = e.stored {
                z.max_cluster = z.max_cluster.max(len);
                z.stored += len;
            }
            z.extents += 1;
            pos = e.logical + e.len;
        }
        Ok(z)
    }

    /// Every lcluster inside extent `e` maps back to `e`: a read starting there (the kernel
    /// maps each lcluster on its own) must find the same extent a read from its start did.
    fn zcheck_lclusters(&self, inode: &Inode, h: super::zmap::ZHeader, e: &ZExtent) -> Result<()> {
        let lsize = 1u64 << h.lclusterbits;
        let end = e.logical + e.len;
        let mut at = (e.logical / lsize + 1) * lsize;
        while at < end {
            let other = self.zmap_with(inode, h, at)?;
            if other != *e {
                return corrupt(
                    inode.offset,
                    format!(
                        "inode {}: file offset {at} maps to extent [{}, +{}) inside extent [{}, +{})",
                        inode.nid, other.logical, other.len, e.logical, e.len
                    ),
                );
            }
            at += lsize;
        }
        Ok(())
    }

    /// Whether a cluster of `inode` (blocks or inline tail) overlaps a range, for `owners`.
    pub(crate) fn zcluster_overlaps(
        &self,
        inode: &Inode,
        overlaps: &dyn Fn(u64, u64) -> bool,
    ) -> bool {
        let Ok(h) = self.zheader(inode) else {
            return false;
        };
        let mut pos = 0;
        let mut n = 0;
        while pos < inode.size && n < INSPECT_EXTENTS {
            let Ok(e) = self.zmap_with(inode, h, pos) else {
                return false;
            };
            if let ZStored::Cluster { at, len, .. } = e.stored {
                if overlaps(at, len) {
                    return true;
                }
            }
            n += 1;
            pos = e.logical + e.len;
        }
        false
    }

    /// `zmap` with the header already read (one read serves a whole request).
    fn zmap_with(&self, inode: &Inode, h: super::zmap::ZHeader, pos: u64) -> Result<ZExtent> {
        super::zmap::map_with_header(self, inode, h, pos)
    }

    /// Every extent of compressed `inode` maps and (with `decode`) decodes to its length:
    /// `(extents, stored bytes)`, or the first problem. For `fsck`; `budget` bounds the
    /// decoded bytes.
    pub fn zcheck(&self, inode: &Inode, decode: bool, budget: &mut u64) -> Result<(u64, u64)> {
        let h = self.zheader(inode)?;
        let (mut extents, mut stored) = (0u64, 0u64);
        let mut pos = 0;
        while pos < inode.size {
            let e = self.zmap_with(inode, h, pos)?;
            extents += 1;
            pos = e.logical + e.len;
            self.zcheck_lclusters(inode, h, &e)?;
            if !decode {
                if let ZStored::Cluster { len, .. } = e.stored {
                    stored += len;
                }
                continue;
            }
            if *budget < e.len {
                return corrupt(
                    inode.offset,
                    format!(
                        "inode {}: more decoded data than the image can hold honestly (work limit); check incomplete",
                        inode.nid
                    ),
                );
            }
            *budget -= e.len;
            match e.stored {
                ZStored::Cluster { len, .. } => {
                    self.decoded(inode, &e)?;
                    stored += len;
                }
                ZStored::Fragment { offset } => {
                    let mut probe = [0u8; 1];
                    // The fragment's last byte exists in the packed inode.
                    self.read_fragment(inode, offset, e.len - 1, &mut probe)?;
                }
            }
        }
        Ok((extents, stored))
    }
}
