//! Directories: block parsing (`DirBlock`), `readdir` (kernel `dir.c`) and `lookup`
//! (`namei.c`).
//!
//! - Blocks are checked one at a time: any claimed size costs one block of memory.
//! - Names are strictly sorted (the kernel binary-searches); `.` must be the directory.

use std::cmp::Ordering;
use std::ops::Range;

use super::{corrupt, ByteSource, Error, Image, Inode, Result};
use crate::format::{Dirent, DIRENT_SIZE, NAME_LEN};

/// One directory entry as returned by [`Image::readdir`] and [`Image::lookup`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Entry name, without a terminator.
    pub name: Vec<u8>,
    /// Nid of the entry's inode.
    pub nid: u64,
    /// On-disk `file_type` (`format::FT_*`); the inode's own mode is authoritative.
    pub file_type: u8,
    /// Position of this entry: `block * bs + 12 * index`, as in the kernel.
    pub offset: u64,
    /// Position to resume after this entry (stable: the image is immutable).
    pub next_offset: u64,
}

struct RawEnt {
    nid: u64,
    file_type: u8,
    name: Range<usize>,
}

/// One parsed and validated directory block: `[dirents][names][zero padding]`, with
/// `nameoff[0] / 12` dirents; a name ends where the next begins, the last at the first NUL
/// or the block's used end.
pub(crate) struct DirBlock {
    data: Vec<u8>,
    ents: Vec<RawEnt>,
}

impl DirBlock {
    fn name(&self, i: usize) -> &[u8] {
        self.ents
            .get(i)
            .and_then(|e| self.data.get(e.name.clone()))
            .unwrap_or(&[])
    }

    fn len(&self) -> usize {
        self.ents.len()
    }

    fn last_name(&self) -> &[u8] {
        self.name(self.len().saturating_sub(1))
    }
}

fn out_of_order(name: &[u8], prev: &[u8]) -> String {
    format!(
        "name {:?} does not sort after {:?} (names must be unique and sorted)",
        String::from_utf8_lossy(name),
        String::from_utf8_lossy(prev)
    )
}

impl<S: ByteSource> Image<S> {
    fn dir_blocks(&self, dir: &Inode) -> u64 {
        dir.size.div_ceil(u64::from(self.block_size()))
    }

    /// Byte offset in the image of logical position `pos` of `dir`, for error messages.
    fn dir_byte(&self, dir: &Inode, pos: u64) -> u64 {
        match self.map(dir, pos) {
            Ok(e) => e
                .physical
                .map_or(dir.offset, |p| p.saturating_add(pos - e.logical)),
            Err(_) => dir.offset,
        }
    }

    /// The last name of block `blk`, from its last dirent alone: a readdir resumed in the
    /// next block needs only that, and a full parse would double the cost of each resumed
    /// call (a FUSE readdir reply holds a few dozen entries). Block `blk`'s other checks
    /// are made whenever it is itself read.
    fn last_name_of_block(&self, dir: &Inode, blk: u64) -> Result<Vec<u8>> {
        let (start, used) = self.dir_block_span(dir, blk)?;
        let bad = || Error::Corrupt {
            offset: self.dir_byte(dir, start),
            what: format!("directory {} block {blk}: bad dirent array", dir.nid),
        };
        let mut dirent = [0u8; DIRENT_SIZE];
        let mut read_dirent = |i: usize| -> Result<usize> {
            let at = start + (i * DIRENT_SIZE) as u64;
            if (i + 1) * DIRENT_SIZE > used || self.read(dir, at, &mut dirent)? != DIRENT_SIZE {
                return Err(bad());
            }
            Ok(usize::from(Dirent::decode(&dirent).nameoff))
        };
        let nameoff0 = read_dirent(0)?;
        if nameoff0 < DIRENT_SIZE || nameoff0 >= used || nameoff0 % DIRENT_SIZE != 0 {
            return Err(bad());
        }
        let last = read_dirent(nameoff0 / DIRENT_SIZE - 1)?;
        if last < nameoff0 || last >= used {
            return Err(bad());
        }
        let mut name = vec![0u8; (used - last).min(NAME_LEN + 1)];
        let n = self.read(dir, start + last as u64, &mut name)?;
        name.truncate(n);
        if let Some(nul) = name.iter().position(|&b| b == 0) {
            name.truncate(nul);
        }
        Ok(name)
    }

    /// Where block `blk` of `dir` starts and how many of its bytes are used: the kernel
    /// uses min(i_size - pos, bs), so the last block may be partial (an inline tail).
    fn dir_block_span(&self, dir: &Inode, blk: u64) -> Result<(u64, usize)> {
        let bs = u64::from(self.block_size());
        let start = blk
            .checked_mul(bs)
            .filter(|&s| s < dir.size)
            .ok_or_else(|| Error::Corrupt {
                offset: dir.offset,
                what: format!(
                    "directory {}: block {blk} is past its size {}",
                    dir.nid, dir.size
                ),
            })?;
        Ok((start, (dir.size - start).min(bs) as usize))
    }

    /// The used bytes of block `blk` of `dir` and their logical start.
    fn dir_block_bytes(&self, dir: &Inode, blk: u64) -> Result<(Vec<u8>, u64)> {
        let (start, used) = self.dir_block_span(dir, blk)?;
        let mut data = vec![0u8; used];
        let n = self.read(dir, start, &mut data)?;
        if n != used {
            return corrupt(
                dir.offset,
                format!("directory {}: short read of block {blk}", dir.nid),
            );
        }
        if used < DIRENT_SIZE {
            return corrupt(
                self.dir_byte(dir, start),
                format!(
                    "directory {} block {blk} dirent 0: block holds {used} bytes, less than one dirent",
                    dir.nid
                ),
            );
        }
        Ok((data, start))
    }

    /// Reads and validates block `blk` of directory `dir` (every check of reference §9.5).
    pub(crate) fn dir_block(&self, dir: &Inode, blk: u64) -> Result<DirBlock> {
        let (data, start) = self.dir_block_bytes(dir, blk)?;
        let used = data.len();
        let bad = |i: usize, what: String| {
            let at = self.dir_byte(dir, start + (i * DIRENT_SIZE) as u64);
            Error::Corrupt {
                offset: at,
                what: format!("directory {} block {blk} dirent {i}: {what}", dir.nid),
            }
        };
        // `used` >= DIRENT_SIZE (checked with the read), so the first dirent is there.
        let nameoff0 = data
            .first_chunk()
            .map_or(0, |d| usize::from(Dirent::decode(d).nameoff));
        // nameoff0 gives the entry count, so it must point past the dirent array (≥ 12), inside
        // the block, and at a dirent boundary.
        if nameoff0 < DIRENT_SIZE || nameoff0 >= used {
            return Err(bad(0, format!("nameoff {nameoff0} outside [12, {used})")));
        }
        if nameoff0 % DIRENT_SIZE != 0 {
            return Err(bad(
                0,
                format!("nameoff {nameoff0} is not a multiple of 12"),
            ));
        }
        let count = nameoff0 / DIRENT_SIZE;
        let mut ents: Vec<RawEnt> = Vec::with_capacity(count);
        let mut prev_off = 0usize;
        for i in 0..count {
            let mut raw = [0u8; DIRENT_SIZE];
            raw.copy_from_slice(
                data.get(i * DIRENT_SIZE..(i + 1) * DIRENT_SIZE)
                    .unwrap_or(&[0; DIRENT_SIZE]),
            );
            let d = Dirent::decode(&raw);
            let off = usize::from(d.nameoff);
            // Checked before any subtraction: the kernel's out-of-bounds read (d18a3b5d337f)
            // came from computing a length from an unchecked trailing nameoff.
            if off >= used {
                return Err(bad(
                    i,
                    format!("nameoff {off} is past the block's {used} used bytes"),
                ));
            }
            if i > 0 && off <= prev_off {
                return Err(bad(
                    i,
                    format!("nameoff {off} does not increase (previous {prev_off})"),
                ));
            }
            // Lengths of earlier names are fixed by this one.
            if let Some(last) = ents.last_mut() {
                last.name.end = off;
            }
            prev_off = off;
            ents.push(RawEnt {
                nid: d.nid,
                file_type: d.file_type,
                name: off..off,
            });
        }
        // The last name runs to the first NUL, bounded by the used size and by 256 bytes so
        // an unterminated name cannot make us scan further than needed.
        if let Some(last) = ents.last_mut() {
            let limit = used.min(last.name.start + NAME_LEN + 1);
            let tail = data.get(last.name.start..limit).unwrap_or(&[]);
            last.name.end =
                last.name.start + tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        }
        let mut prev: &[u8] = &[];
        for (i, e) in ents.iter().enumerate() {
            let name = data.get(e.name.clone()).unwrap_or(&[]);
            if name.is_empty() {
                return Err(bad(i, "empty name".into()));
            }
            if name.len() > NAME_LEN {
                return Err(bad(
                    i,
                    format!("name of {} bytes exceeds {NAME_LEN}", name.len()),
                ));
            }
            // A '/' or NUL would let a name escape path semantics or be truncated by C callers.
            if name.contains(&b'/') || name.contains(&0) {
                return Err(bad(
                    i,
                    format!(
                        "name {:?} contains '/' or NUL",
                        String::from_utf8_lossy(name)
                    ),
                ));
            }
            // The kernel binary-searches names: an unsorted or repeated one makes lookups
            // miss, and readdir would show two entries of one name (extract followed such a
            // pair, a symlink then a directory, out of its target).
            if i > 0 && name <= prev {
                return Err(bad(i, out_of_order(name, prev)));
            }
            // "." is the directory itself; ".." needs the parent, which the walkers check.
            if name == b"." && e.nid != dir.nid {
                return Err(bad(
                    i,
                    format!("\".\" points to nid {}, not to the directory itself", e.nid),
                ));
            }
            prev = name;
        }
        Ok(DirBlock { data, ents })
    }

    /// Iterates `dir` from position `offset` (0, or any `next_offset` returned earlier).
    /// Includes `.` and `..` wherever they sort. A name not strictly greater than the one
    /// before it, in its block or at the end of the previous block (read for that when the
    /// iteration starts past block 0), ends the iteration with `Error::Corrupt`.
    pub fn readdir(&self, dir: &Inode, offset: u64) -> Result<ReadDir<'_, S>> {
        if !dir.is_dir() {
            return Err(Error::NotADirectory {
                nid: dir.nid,
                offset: dir.offset,
            });
        }
        let bs = u64::from(self.block_size());
        let nblocks = self.dir_blocks(dir);
        // Like the kernel, round a position inside a dirent up to the next one; a position past
        // the dirent array moves on to the next block when that block is read.
        let blk = offset / bs;
        let idx = ((offset % bs).div_ceil(DIRENT_SIZE as u64)) as usize;
        Ok(ReadDir {
            img: self,
            dir: dir.clone(),
            nblocks,
            blk,
            idx,
            block: None,
            prev_last: None,
            done: offset >= dir.size,
        })
    }

    /// Block `blk` of `dir`, checked to start after `prev_last`, the last name of block
    /// `blk - 1` (read here when the caller has not: a readdir resumed at `blk`), so names
    /// are strictly increasing across blocks as well as inside them.
    fn dir_block_after(&self, dir: &Inode, blk: u64, prev_last: Option<&[u8]>) -> Result<DirBlock> {
        let b = self.dir_block(dir, blk)?;
        if blk == 0 {
            return Ok(b);
        }
        let prev_name;
        let prev = match prev_last {
            Some(p) => p,
            None => {
                prev_name = self.last_name_of_block(dir, blk - 1)?;
                prev_name.as_slice()
            }
        };
        if b.name(0) <= prev {
            let bs = u64::from(self.block_size());
            return corrupt(
                self.dir_byte(dir, blk * bs),
                format!(
                    "directory {} block {blk} dirent 0: {}, the last name of block {}",
                    dir.nid,
                    out_of_order(b.name(0), prev),
                    blk - 1
                ),
            );
        }
        Ok(b)
    }

    /// Finds `name` in `dir` the way the kernel does: binary search over blocks by their first
    /// name, then inside the chosen block (unsigned bytewise order, a prefix sorts first).
    /// Every block it parses must hold strictly sorted names (else `Error::Corrupt`), so it
    /// never answers from a block with a repeated or misplaced name.
    pub fn lookup(&self, dir: &Inode, name: &[u8]) -> Result<Option<DirEntry>> {
        if !dir.is_dir() {
            return Err(Error::NotADirectory {
                nid: dir.nid,
                offset: dir.offset,
            });
        }
        if name.is_empty() || name.len() > NAME_LEN || name.contains(&b'/') || name.contains(&0) {
            return Ok(None);
        }
        let (mut lo, mut hi) = (0u64, self.dir_blocks(dir));
        let mut candidate: Option<(u64, DirBlock)> = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let b = self.dir_block(dir, mid)?;
            match name.cmp(b.name(0)) {
                Ordering::Less => hi = mid,
                Ordering::Equal => return Ok(Some(self.entry(dir, mid, &b, 0))),
                Ordering::Greater => {
                    lo = mid + 1;
                    candidate = Some((mid, b));
                }
            }
        }
        let Some((blk, b)) = candidate else {
            return Ok(None);
        };
        // Entry 0 is known to be smaller.
        let (mut lo, mut hi) = (1usize, b.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match name.cmp(b.name(mid)) {
                Ordering::Less => hi = mid,
                Ordering::Equal => return Ok(Some(self.entry(dir, blk, &b, mid))),
                Ordering::Greater => lo = mid + 1,
            }
        }
        Ok(None)
    }

    fn entry(&self, dir: &Inode, blk: u64, b: &DirBlock, i: usize) -> DirEntry {
        let bs = u64::from(self.block_size());
        let base = blk * bs;
        let next_offset = if i + 1 < b.len() {
            base + ((i + 1) * DIRENT_SIZE) as u64
        } else {
            // After a block's last entry the kernel moves its position to the next block.
            (base + bs).min(dir.size)
        };
        let (nid, file_type) = b.ents.get(i).map_or((0, 0), |e| (e.nid, e.file_type));
        DirEntry {
            name: b.name(i).to_vec(),
            nid,
            file_type,
            offset: base + (i * DIRENT_SIZE) as u64,
            next_offset,
        }
    }
}

/// Iterator over a directory, one block in memory at a time. After an error it ends.
pub struct ReadDir<'a, S: ByteSource> {
    img: &'a Image<S>,
    dir: Inode,
    nblocks: u64,
    blk: u64,
    idx: usize,
    block: Option<DirBlock>,
    /// Last name of the block before `blk`, once this iterator has read that block.
    prev_last: Option<Vec<u8>>,
    done: bool,
}

impl<S: ByteSource> Iterator for ReadDir<'_, S> {
    type Item = Result<DirEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            if self.block.is_none() {
                if self.blk >= self.nblocks {
                    self.done = true;
                    return None;
                }
                match self
                    .img
                    .dir_block_after(&self.dir, self.blk, self.prev_last.as_deref())
                {
                    Ok(b) => self.block = Some(b),
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
            }
            let Some(b) = self.block.as_ref() else { break };
            if self.idx < b.len() {
                let e = self.img.entry(&self.dir, self.blk, b, self.idx);
                self.idx += 1;
                return Some(Ok(e));
            }
            self.prev_last = Some(b.last_name().to_vec());
            self.block = None;
            self.blk += 1;
            self.idx = 0;
        }
        None
    }
}
