//! The verified block source: every byte returned was hashed and checked against a Merkle tree
//! whose root is pinned (or read from the section, reported unpinned).
//!
//! - Data blocks are hashed on every read: the file may change between reads.
//! - Tree blocks are verified once and kept.
//! - A failing block is never returned ([`IntegrityError`]); below, it is forgotten and what
//!   passed handed down.

use crate::appended::{Section, TRAILER_SIZE};
use crate::descriptor::{Descriptor, Parsed, DESCRIPTOR_SIZE};
use crate::source::ByteSource;
use crate::{level_blocks, Params};
use rayon::prelude::*;
use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Reads of at least this many bytes are hashed on several threads.
const PARALLEL_BYTES: usize = 256 << 10;

/// Data blocks hashed together (and handed to one rayon task when hashing in parallel).
const CHECK_BATCH: usize = 32;
/// Reads of at least this many blocks trigger tree readahead.
const READAHEAD_MIN_BLOCKS: u64 = 8;

/// A block whose hash does not match the tree.
#[derive(Debug, thiserror::Error)]
#[error("integrity error: {what} at byte {offset} fails its hash")]
pub struct IntegrityError {
    /// Offset of the failing block in the underlying file.
    pub offset: u64,
    /// Which kind of block: "data block", "Merkle tree block (level N)".
    pub what: String,
    /// True for a data block (then `offset` is also the offset in the verified data).
    pub data: bool,
}

impl IntegrityError {
    /// The integrity error inside an `io::Error`, if that is what it carries.
    pub fn find(e: &io::Error) -> Option<&IntegrityError> {
        e.get_ref()?.downcast_ref::<IntegrityError>()
    }
}

/// Why a verified source could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file does not end in a verilay trailer.
    #[error("no verity section (the file does not end in a verilay trailer)")]
    NoSection,
    /// The section is malformed or inconsistent: what is wrong.
    #[error("{0}")]
    Bad(String),
    /// The descriptor does not hash to the pin.
    #[error("image digest is {found}, not the pinned {pinned}")]
    PinMismatch {
        /// The image's digest, `alg:hex`.
        found: String,
        /// The pin, `alg:hex`.
        pinned: String,
    },
    /// Reading failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

struct Level {
    /// Absolute offset of the level's first block in the underlying source.
    offset: u64,
    blocks: Vec<OnceLock<Box<[u8]>>>,
}

/// The data of `S`, every byte returned checked against the Merkle tree of the verity
/// section appended to it.
pub struct VerifiedSource<S> {
    inner: S,
    params: Params,
    salt: Vec<u8>,
    section: Section,
    root: Vec<u8>,
    digest: Vec<u8>,
    pinned: bool,
    /// Level 0 (hashes of data blocks) first; empty when the data is one block or none.
    levels: Vec<Level>,
    readahead: bool,
    /// Hash large reads on rayon's threads.
    parallel: bool,
    /// Blocks below this are read in groups on a small-read miss (see `set_dense_prefix`).
    dense_blocks: AtomicU64,
    /// Verified copies of blocks that small reads touched.
    small: SmallReadCache,
}

/// Verified copies of the blocks small reads touch (inodes, directories, xattrs), so a
/// walk does not re-read and re-hash a block for every structure in it. Sound because
/// the bytes are our own verified copy, never a re-read of the file.
///
/// Write-once slots, never evicted, in chunks allocated on first use: a hit is one atomic
/// load and hands out a plain borrow, so serving a request writes no lock, counter or
/// refcount shared with other threads. Memory is bounded per thread (each thread may fill
/// [`SMALL_CACHE_PER_THREAD`] bytes of slots, counted in a thread-local), after which its
/// misses are verified without being kept.
struct SmallReadCache {
    chunks: Box<[OnceLock<Chunk>]>,
}

/// `CACHE_CHUNK` consecutive blocks' slots.
type Chunk = Box<[OnceLock<Box<[u8]>>]>;

const CACHE_CHUNK: u64 = 1024;
/// Blocks read together on a small-read miss in the dense prefix (64 KiB of 4 KiB blocks).
const DENSE_GROUP: u64 = 16;
/// Bytes of blocks each thread may add to the cache.
pub const SMALL_CACHE_PER_THREAD: u64 = 64 << 20;

thread_local! {
    static CACHED_BY_THIS_THREAD: Cell<u64> = const { Cell::new(0) };
}

impl SmallReadCache {
    fn new(blocks: u64) -> SmallReadCache {
        SmallReadCache {
            chunks: (0..blocks.div_ceil(CACHE_CHUNK))
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    fn get(&self, block: u64) -> Option<&[u8]> {
        let chunk = self.chunks.get((block / CACHE_CHUNK) as usize)?.get()?;
        chunk[(block % CACHE_CHUNK) as usize].get().map(|b| &b[..])
    }

    /// Keeps `data` for `block` if this thread still has budget; returns the kept copy.
    fn put(&self, block: u64, data: Vec<u8>) -> Option<&[u8]> {
        let used = CACHED_BY_THIS_THREAD.with(Cell::get);
        let n = data.len() as u64;
        if used + n > SMALL_CACHE_PER_THREAD {
            return None;
        }
        let chunk = self
            .chunks
            .get((block / CACHE_CHUNK) as usize)?
            .get_or_init(|| (0..CACHE_CHUNK).map(|_| OnceLock::new()).collect());
        let slot = &chunk[(block % CACHE_CHUNK) as usize];
        let mut stored = false;
        let b = slot.get_or_init(|| {
            stored = true;
            data.into_boxed_slice()
        });
        if stored {
            CACHED_BY_THIS_THREAD.with(|c| c.set(used + n));
        }
        Some(b)
    }
}

/// Bytes at the end of an image: the fs-verity descriptor, then the trailer.
pub const TAIL_SIZE: u64 = DESCRIPTOR_SIZE as u64 + TRAILER_SIZE;

/// The end of an image, checked: the trailer and the descriptor (hashing to the pin, when
/// there is one) agree on the one layout a file of this length may have.
pub struct Tail {
    /// The section's layout.
    pub section: Section,
    /// The descriptor, parsed.
    pub parsed: Parsed,
    /// The image digest: the descriptor's hash.
    pub digest: Vec<u8>,
}

/// Checks `tail`, the last [`TAIL_SIZE`] bytes of a file of `len` bytes. A length that
/// passes is the one the descriptor (so the pin) allows.
pub fn check_tail(
    tail: &[u8; TAIL_SIZE as usize],
    len: u64,
    pin: Option<&[u8]>,
) -> Result<Tail, OpenError> {
    let (d, t) = tail.split_at(DESCRIPTOR_SIZE);
    let section = Section::decode_trailer(t.try_into().expect("the trailer's size"))
        .map_err(OpenError::Bad)?
        .ok_or(OpenError::NoSection)?;
    if section.descriptor_offset.checked_add(TAIL_SIZE) != Some(len) {
        return Err(OpenError::Bad(format!(
            "verity trailer puts the descriptor at byte {} in a file of {len} bytes",
            section.descriptor_offset
        )));
    }
    let d: [u8; DESCRIPTOR_SIZE] = d.try_into().expect("the descriptor's size");
    let parsed = Descriptor::parse(&d).map_err(|e| OpenError::Bad(e.to_string()))?;
    let digest = Descriptor { bytes: d }.digest(parsed.params.alg);
    if let Some(pin) = pin {
        if pin != digest.as_slice() {
            return Err(OpenError::PinMismatch {
                found: format!("{}:{}", parsed.params.alg.name(), hex(&digest)),
                pinned: format!("{}:{}", parsed.params.alg.name(), hex(pin)),
            });
        }
    }
    // Bounded by the file before any arithmetic or allocation depends on it.
    if parsed.data_size >= len {
        return Err(OpenError::Bad(format!(
            "fs-verity descriptor: data size {} does not fit a file of {len} bytes",
            parsed.data_size
        )));
    }
    let expect = Section::plan(&parsed.params, parsed.data_size);
    if expect != section {
        return Err(OpenError::Bad(format!(
            "verity trailer {section:?} does not match the descriptor's layout {expect:?}"
        )));
    }
    Ok(Tail {
        section,
        parsed,
        digest,
    })
}

/// Reads and checks the tail of `inner`, and the padding between the data and its tree;
/// bytes that fail are forgotten by `inner` (see [`ByteSource::forget`]).
fn read_tail<S: ByteSource>(
    inner: &S,
    pin: Option<&[u8]>,
) -> Result<(Tail, [u8; TAIL_SIZE as usize]), OpenError> {
    let len = inner.len();
    if len < TAIL_SIZE {
        return Err(OpenError::NoSection);
    }
    let mut bytes = [0u8; TAIL_SIZE as usize];
    inner.read_tree_at(&mut bytes, len - TAIL_SIZE)?;
    let tail =
        check_tail(&bytes, len, pin).inspect_err(|_| inner.forget(len - TAIL_SIZE, TAIL_SIZE))?;
    // The padding between the data and its tree is in no block the tree covers (the last
    // data block is hashed zero-padded, not with the file's bytes): it must be zeros, or
    // bytes no check covers would sit inside the image.
    let s = &tail.section;
    let mut pad = vec![0u8; (s.tree_offset - s.data_size) as usize];
    inner.read_tree_at(&mut pad, s.data_size)?;
    if let Some(i) = pad.iter().position(|&b| b != 0) {
        inner.forget(s.data_size, pad.len() as u64);
        return Err(OpenError::Bad(format!(
            "byte {} between the data and its Merkle tree is not zero",
            s.data_size + i as u64
        )));
    }
    Ok((tail, bytes))
}

impl<S: ByteSource> VerifiedSource<S> {
    /// Opens the section at the end of `inner`. With `pin`, the descriptor's hash must equal
    /// it before anything is read; without, the stored descriptor is believed (and
    /// [`Self::is_pinned`] says so).
    pub fn open(inner: S, pin: Option<&[u8]>) -> Result<Self, OpenError> {
        let (tail, bytes) = match read_tail(&inner, pin) {
            // What failed was forgotten below us: a copy that keeps bytes (a remote
            // image's cache) may have held wrong ones, and the network the right ones.
            Err(e) if inner.refetches() && !matches!(e, OpenError::Io(_)) => {
                read_tail(&inner, pin)?
            }
            r => r?,
        };
        let Tail {
            section,
            parsed,
            digest,
        } = tail;
        let bs = parsed.params.block_size as u64;
        let mut levels = Vec::new();
        let sizes = level_blocks(&parsed.params, parsed.data_size);
        // Stored top level first: level i starts after every level above it.
        let mut offset = section.tree_offset + sizes.iter().sum::<u64>() * bs;
        for &n in &sizes {
            offset -= n * bs;
            levels.push(Level {
                offset,
                blocks: (0..n).map(|_| OnceLock::new()).collect(),
            });
        }
        if pin.is_some() {
            // Checked now: the descriptor hashes to the pin, and the trailer is the one
            // layout the descriptor allows.
            inner.verified(section.descriptor_offset, &bytes);
        }
        Ok(VerifiedSource {
            inner,
            salt: parsed.params.padded_salt(),
            params: parsed.params,
            section,
            root: parsed.root,
            digest,
            pinned: pin.is_some(),
            levels,
            readahead: true,
            parallel: true,
            dense_blocks: AtomicU64::new(0),
            small: SmallReadCache::new(parsed.data_size.div_ceil(bs)),
        })
    }

    /// Turns tree readahead off (each tree block is then read when first needed), for
    /// measuring what readahead buys.
    pub fn set_readahead(&mut self, on: bool) {
        self.readahead = on;
    }

    /// Turns hashing large reads on several threads off. A server that already runs many
    /// requests at once (a FUSE mount) gains nothing from it and keeps its request path
    /// free of rayon's shared queues.
    pub fn set_parallel_hashing(&mut self, on: bool) {
        self.parallel = on;
    }

    /// Declares `[0, bytes)` densely packed with small structures (an EROFS image's inode
    /// area): a small-read miss there reads, verifies and keeps the aligned group of
    /// blocks around it in one I/O, since a walk's next reads land nearby.
    /// Takes `&self` so the hint can come from the image read through this very source.
    pub fn set_dense_prefix(&self, bytes: u64) {
        let blocks = bytes.min(self.section.data_size) / self.bs();
        self.dense_blocks.store(blocks, Ordering::Relaxed);
    }

    /// The fs-verity digest of the data, as `fsverity digest` prints it after `alg:`.
    pub fn digest(&self) -> &[u8] {
        &self.digest
    }

    /// The digest as `alg:hex`.
    pub fn digest_string(&self) -> String {
        format!("{}:{}", self.params.alg.name(), hex(&self.digest))
    }

    /// Whether the descriptor was checked against a pin when opened.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// Where the section's parts lie in the underlying source.
    pub fn section(&self) -> &Section {
        &self.section
    }

    /// The tree's parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The underlying source, unchecked.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn bs(&self) -> u64 {
        self.params.block_size as u64
    }

    fn per_block(&self) -> u64 {
        self.bs() / self.params.alg.digest_size() as u64
    }

    fn integrity(&self, offset: u64, what: String, data: bool) -> io::Error {
        self.inner.forget(offset, self.bs());
        io::Error::new(
            io::ErrorKind::InvalidData,
            IntegrityError { offset, what, data },
        )
    }

    /// The verified tree block `index` of `level`, reading (and verifying) it on a miss.
    fn tree_block(&self, level: usize, index: u64) -> io::Result<&[u8]> {
        let slot = &self.levels[level].blocks[index as usize];
        if let Some(b) = slot.get() {
            return Ok(b);
        }
        let mut b = vec![0u8; self.bs() as usize];
        self.inner
            .read_tree_at(&mut b, self.levels[level].offset + index * self.bs())?;
        self.install(level, index, b)
    }

    /// Verifies a tree block against its parent's hash (or the root) and keeps it.
    fn install(&self, level: usize, index: u64, block: Vec<u8>) -> io::Result<&[u8]> {
        let slot = &self.levels[level].blocks[index as usize];
        if let Some(b) = slot.get() {
            return Ok(b); // another thread got there first
        }
        let ds = self.params.alg.digest_size();
        let expected: &[u8] = if level + 1 == self.levels.len() {
            &self.root
        } else {
            let parent = self.tree_block(level + 1, index / self.per_block())?;
            let at = (index % self.per_block()) as usize * ds;
            &parent[at..at + ds]
        };
        let mut got = [0u8; 64];
        self.params
            .alg
            .hash_into(&self.salt, &block, &mut got[..ds]);
        if got[..ds] != *expected {
            return Err(self.integrity(
                self.levels[level].offset + index * self.bs(),
                format!("Merkle tree block (level {level})"),
                false,
            ));
        }
        self.inner
            .verified(self.levels[level].offset + index * self.bs(), &block);
        Ok(slot.get_or_init(|| block.into_boxed_slice()))
    }

    /// Makes sure the level-0 tree blocks covering data blocks `first..=last` are verified,
    /// fetching the missing ones in one read when readahead is on.
    fn fetch_level0(&self, first: u64, last: u64) -> io::Result<()> {
        if self.levels.is_empty() {
            return Ok(());
        }
        let per = self.per_block();
        let level0 = &self.levels[0];
        let a = first / per;
        let mut b = last / per;
        if !self.readahead {
            for i in a..=b {
                self.tree_block(0, i)?;
            }
            return Ok(());
        }
        if last - first + 1 >= READAHEAD_MIN_BLOCKS {
            // The span again, ahead: a sequential reader's next request.
            let ahead = (last + (last - first + 1)) / per;
            b = ahead.min(level0.blocks.len() as u64 - 1);
        }
        let missing = |i: &u64| level0.blocks[*i as usize].get().is_none();
        let Some(m0) = (a..=b).find(missing) else {
            return Ok(());
        };
        let m1 = (a..=b).rev().find(missing).expect("m0 is missing");
        let bs = self.bs() as usize;
        let mut buf = vec![0u8; (m1 - m0 + 1) as usize * bs];
        self.inner
            .read_tree_at(&mut buf, level0.offset + m0 * bs as u64)?;
        for (k, chunk) in buf.chunks(bs).enumerate() {
            let i = m0 + k as u64;
            if missing(&i) {
                // A bad block beyond the requested span must not fail this read.
                match self.install(0, i, chunk.to_vec()) {
                    Ok(_) => {}
                    Err(e) if i > last / per => drop(e),
                    Err(e) => {
                        // As in read_blocks: the unchecked rest of the fetch may be bad
                        // too (the blocks before it passed, and stay).
                        let at = level0.offset + i * bs as u64;
                        self.inner.forget(at, (m1 - i + 1) * bs as u64);
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// The expected hash of data block `index`.
    fn expected(&self, index: u64) -> io::Result<&[u8]> {
        let ds = self.params.alg.digest_size();
        if self.levels.is_empty() {
            return Ok(&self.root);
        }
        let b = self.tree_block(0, index / self.per_block())?;
        let at = (index % self.per_block()) as usize * ds;
        Ok(&b[at..at + ds])
    }

    /// Checks data blocks `first..` (`data` holds them, the last possibly short), hashing
    /// [`CHECK_BATCH`] at a time: the hasher is faster on several blocks than on each alone.
    fn check_blocks(&self, first: u64, data: &[u8]) -> io::Result<()> {
        let ds = self.params.alg.digest_size();
        let bs = self.bs() as usize;
        let mut got = [0u8; CHECK_BATCH * 64];
        for (b, batch) in data.chunks(bs * CHECK_BATCH).enumerate() {
            let n = batch.len().div_ceil(bs);
            crate::hash_blocks(&self.params, &self.salt, batch, &mut got[..n * ds]);
            for (k, hash) in got[..n * ds].chunks(ds).enumerate() {
                let index = first + (b * CHECK_BATCH + k) as u64;
                if hash != self.expected(index)? {
                    return Err(self.integrity(index * self.bs(), "block".into(), true));
                }
            }
        }
        Ok(())
    }

    /// Reads and verifies whole blocks `first..=last` into `span` (which holds exactly
    /// those bytes, the last block possibly short).
    fn read_blocks(&self, span: &mut [u8], first: u64, last: u64) -> io::Result<()> {
        self.inner.read_exact_at(span, first * self.bs())?;
        self.fetch_level0(first, last)?;
        let bs = self.bs() as usize;
        let checked = if self.parallel && span.len() >= PARALLEL_BYTES {
            span.par_chunks(bs * CHECK_BATCH)
                .enumerate()
                .try_for_each(|(k, b)| self.check_blocks(first + (k * CHECK_BATCH) as u64, b))
        } else {
            self.check_blocks(first, span)
        };
        if checked.is_err() {
            // The checks stop at the first bad block; the blocks after it came in the same
            // fetches and may be bad too: the source drops them all, so the next read
            // fetches the whole span again rather than failing on each in turn.
            self.inner.forget(first * self.bs(), span.len() as u64);
            return checked;
        }
        self.report_verified(first, span);
        Ok(())
    }

    /// Hands verified data blocks to the source. The short last block goes with the zero
    /// padding after it (checked at open), so the source sees whole blocks of the file.
    fn report_verified(&self, first: u64, span: &[u8]) {
        let offset = first * self.bs();
        let end = offset + span.len() as u64;
        if end == self.section.data_size && end < self.section.tree_offset {
            let mut whole = span.to_vec();
            whole.resize((self.section.tree_offset - offset) as usize, 0);
            self.inner.verified(offset, &whole);
        } else {
            self.inner.verified(offset, span);
        }
    }

    /// Reads the whole Merkle tree in one request and verifies it, top level first, when
    /// it is at most `max_bytes`: for a source where each read is a round trip (a remote
    /// image), every later read then needs its data blocks alone.
    pub fn load_tree(&self, max_bytes: u64) -> io::Result<()> {
        if self.section.tree_size == 0 || self.section.tree_size > max_bytes {
            return Ok(());
        }
        let mut tree = vec![0u8; self.section.tree_size as usize];
        self.inner
            .read_tree_at(&mut tree, self.section.tree_offset)?;
        let bs = self.bs() as usize;
        for level in (0..self.levels.len()).rev() {
            let from = (self.levels[level].offset - self.section.tree_offset) as usize;
            for index in 0..self.levels[level].blocks.len() {
                let at = from + index * bs;
                self.install(level, index as u64, tree[at..at + bs].to_vec())?;
            }
        }
        Ok(())
    }

    /// Checks `data`, the verified data's bytes at `offset` as a caller fetched them itself
    /// (a prefetch, one request per step, without the source's per-block path), and hands
    /// them to the source as verified. `offset` is block-aligned and `data` whole blocks, or
    /// reaches the data's end. A block that fails is an [`IntegrityError`] naming it; the
    /// blocks before it are handed on, nothing from it on.
    pub fn check_fetched(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let bs = self.bs();
        let end = offset.checked_add(data.len() as u64);
        let whole = offset.is_multiple_of(bs)
            && end.is_some_and(|e| {
                e <= self.section.data_size && (e.is_multiple_of(bs) || e == self.section.data_size)
            });
        if data.is_empty() || !whole {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bytes {offset}+{}: not whole blocks of the verified data",
                    data.len()
                ),
            ));
        }
        let (first, last) = (offset / bs, (offset + data.len() as u64 - 1) / bs);
        self.fetch_level0(first, last)?;
        if let Err(e) = self.check_blocks(first, data) {
            // The blocks before the bad one passed: they are kept.
            let bad = IntegrityError::find(&e)
                .filter(|i| i.data)
                .map(|i| i.offset);
            if let Some(good) = bad.map(|b| (b - offset) as usize).filter(|&g| g > 0) {
                self.report_verified(first, &data[..good]);
            }
            return Err(e);
        }
        self.report_verified(first, data);
        Ok(())
    }

    /// Verifies every data and tree block, in order, calling `progress` with the bytes done.
    pub fn verify_all(&self, progress: &dyn Fn(u64)) -> io::Result<()> {
        const CHUNK: u64 = 8 << 20;
        let mut buf = vec![0u8; CHUNK as usize];
        let mut at = 0;
        while at < self.section.data_size {
            let n = CHUNK.min(self.section.data_size - at);
            self.read_exact_at(&mut buf[..n as usize], at)?;
            at += n;
            progress(n);
        }
        Ok(())
    }
}

impl<S: ByteSource> ByteSource for VerifiedSource<S> {
    fn len(&self) -> u64 {
        self.section.data_size
    }

    /// Straight from level 0 of the tree (verified up to the root), without reading the
    /// block: what lets a claimed file digest be checked at 1/128 of the file's size.
    fn block_hash(&self, offset: u64) -> io::Result<Option<[u8; 32]>> {
        let plain_sha256_4k = self.params.alg == crate::HashAlg::Sha256
            && self.params.block_size == 4096
            && self.params.salt.is_empty();
        let whole_block = offset.is_multiple_of(4096)
            && offset
                .checked_add(4096)
                .is_some_and(|end| end <= self.section.data_size);
        if !plain_sha256_4k || !whole_block {
            return Ok(None);
        }
        let mut h = [0u8; 32];
        h.copy_from_slice(self.expected(offset / 4096)?);
        Ok(Some(h))
    }

    /// Its reads go where its source's go.
    fn refetches(&self) -> bool {
        self.inner.refetches()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self.read_once(buf, offset) {
            // The bad bytes are forgotten below us: a copy (a remote image's cache, or
            // the network) may give the right ones.
            Err(e) if IntegrityError::find(&e).is_some() && self.inner.refetches() => {
                self.read_once(buf, offset)
            }
            r => r,
        }
    }
}

impl<S: ByteSource> VerifiedSource<S> {
    fn read_once(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.section.data_size)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "range {offset}+{} outside verified data of {} bytes",
                        buf.len(),
                        self.section.data_size
                    ),
                )
            })?;
        let bs = self.bs();
        let first = offset / bs;
        let last = (end - 1) / bs;
        let span_start = first * bs;
        let span_end = ((last + 1) * bs).min(self.section.data_size);
        if offset == span_start && end == span_end {
            // Block-aligned: verify in place, and never leave unverified bytes behind.
            let r = self.read_blocks(buf, first, last);
            if r.is_err() {
                buf.fill(0);
            }
            return r;
        }
        if first == last {
            // A small read inside one block: serve it from (or into) the cache.
            let from = (offset - span_start) as usize;
            if let Some(b) = self.small.get(first) {
                buf.copy_from_slice(&b[from..from + buf.len()]);
                return Ok(());
            }
            let dense_blocks = self.dense_blocks.load(Ordering::Relaxed);
            if first < dense_blocks {
                let bs = self.bs();
                let g0 = first / DENSE_GROUP * DENSE_GROUP;
                let g1 = (g0 + DENSE_GROUP).min(dense_blocks) - 1;
                let mut group = vec![0u8; ((g1 + 1 - g0) * bs) as usize];
                // Should any block of the group fail, fall back to the one asked for.
                if g1 > g0 && self.read_blocks(&mut group, g0, g1).is_ok() {
                    let at = ((first - g0) * bs) as usize + from;
                    buf.copy_from_slice(&group[at..at + buf.len()]);
                    for (k, b) in group.chunks(bs as usize).enumerate() {
                        if self.small.put(g0 + k as u64, b.to_vec()).is_none() {
                            break;
                        }
                    }
                    return Ok(());
                }
            }
            let mut b = vec![0u8; (span_end - span_start) as usize];
            self.read_blocks(&mut b, first, last)?;
            buf.copy_from_slice(&b[from..from + buf.len()]);
            self.small.put(first, b);
            return Ok(());
        }
        let mut span = vec![0u8; (span_end - span_start) as usize];
        self.read_blocks(&mut span, first, last)?;
        let from = (offset - span_start) as usize;
        buf.copy_from_slice(&span[from..from + buf.len()]);
        Ok(())
    }
}

/// `b` in lowercase hex.
pub fn hex(b: &[u8]) -> String {
    hex::encode(b)
}
