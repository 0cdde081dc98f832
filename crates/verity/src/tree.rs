//! Building the Merkle tree: blocks hashed with the padded salt, level after level, until
//! one block remains, whose hash is the root. Level 0 is nearly all the work: from
//! [`PAR_MIN`] bytes it is hashed on rayon's threads in [`CHUNK`]-byte buffers, never held
//! whole (a [`File`] `pread` per thread; a [`Read`]er read by the caller). The levels are
//! kept in memory.

use crate::HashAlg;
use rayon::prelude::*;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};

/// Inputs (and upper levels) smaller than this are hashed on the calling thread, without
/// handing anything to rayon.
pub const PAR_MIN: u64 = 1 << 20;
/// Data read at a time per thread, rounded up to whole blocks: small enough that what
/// was just read is still in the core's cache when it is hashed.
pub const CHUNK: usize = 1 << 20;
/// Bytes per rayon task when a buffer already in memory is hashed in parallel.
const TASK: usize = 256 << 10;

/// A Merkle tree's parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// The hash algorithm.
    pub alg: HashAlg,
    /// Power of two from 1024 to 65536 (fsverity-utils' range).
    pub block_size: u32,
    /// At most 32 bytes.
    pub salt: Vec<u8>,
}

impl Params {
    /// Parameters checked to be in range; an error names the one that is not.
    pub fn new(alg: HashAlg, block_size: u32, salt: Vec<u8>) -> Result<Params, String> {
        if !block_size.is_power_of_two() || !(1024..=65536).contains(&block_size) {
            return Err(format!(
                "block size {block_size} is not a power of two from 1024 to 65536"
            ));
        }
        if salt.len() > 32 {
            return Err(format!("salt of {} bytes is longer than 32", salt.len()));
        }
        Ok(Params {
            alg,
            block_size,
            salt,
        })
    }

    /// The salt zero-padded to the hash's block size, prepended to every hashed block.
    pub fn padded_salt(&self) -> Vec<u8> {
        let mut s = self.salt.clone();
        if !s.is_empty() {
            s.resize(s.len().next_multiple_of(self.alg.block_size()), 0);
        }
        s
    }
}

/// Hashes `data` block by block into `out` (one digest per block); a short last block is
/// hashed as if zero-padded to the block size, as fs-verity does.
pub fn hash_blocks(params: &Params, padded_salt: &[u8], data: &[u8], out: &mut [u8]) {
    let bs = params.block_size as usize;
    let ds = params.alg.digest_size();
    let whole = data.len() / bs;
    let (data, out) = if params.alg == HashAlg::Sha256 && whole > 1 {
        let (blocks, rest) = data.split_at(whole * bs);
        let (digests, after) = out.split_at_mut(whole * ds);
        crate::alg::sha256_blocks(padded_salt, blocks, bs, digests);
        (rest, after)
    } else {
        (data, out)
    };
    let mut pad = Vec::new();
    for (block, digest) in data.chunks(bs).zip(out.chunks_mut(ds)) {
        if block.len() == bs {
            params.alg.hash_into(padded_salt, block, digest);
        } else {
            pad.clear();
            pad.extend_from_slice(block);
            pad.resize(bs, 0);
            params.alg.hash_into(padded_salt, &pad, digest);
        }
    }
}

/// Blocks in each level of the tree over `data_size` bytes, level 0 (just above the data)
/// first; empty when the data fits in one block (the root is then that block's hash).
pub fn level_blocks(params: &Params, data_size: u64) -> Vec<u64> {
    let bs = params.block_size as u64;
    let per_block = bs / params.alg.digest_size() as u64;
    let mut hashes = data_size.div_ceil(bs);
    let mut out = Vec::new();
    while hashes > 1 {
        let blocks = hashes.div_ceil(per_block);
        out.push(blocks);
        hashes = blocks;
    }
    out
}

/// How level 0 and the upper levels are cut up for threads. The constants in production;
/// the tests shrink them to put chunk and batch boundaries at small sizes.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Bytes read at a time by one thread (a multiple of the block size).
    chunk: usize,
    /// Inputs and levels below this many bytes stay on the calling thread.
    par_min: u64,
    /// Threads to plan for; `None`: rayon's (asked only when going parallel, so small
    /// inputs never start rayon's thread pool).
    threads: Option<usize>,
    /// Bytes per task when hashing a buffer in parallel (a multiple of the block size).
    task: usize,
}

impl Plan {
    fn new(params: &Params) -> Plan {
        Plan {
            chunk: CHUNK,
            par_min: PAR_MIN,
            threads: None,
            task: TASK,
        }
        .fit(params)
    }

    /// Rounds the chunk and task sizes up to whole blocks.
    fn fit(mut self, params: &Params) -> Plan {
        let bs = params.block_size as usize;
        self.chunk = self.chunk.max(1).next_multiple_of(bs);
        self.task = self.task.max(1).next_multiple_of(bs);
        self
    }

    /// Threads to use for `bytes` of input: 1 below `par_min`.
    fn threads_for(&self, bytes: u64) -> usize {
        if bytes < self.par_min {
            return 1;
        }
        self.threads
            .unwrap_or_else(rayon::current_num_threads)
            .max(1)
    }
}

/// Like [`hash_blocks`], with the blocks spread over rayon's threads.
fn hash_blocks_par(params: &Params, salt: &[u8], data: &[u8], out: &mut [u8], task: usize) {
    let per_task = task / params.block_size as usize * params.alg.digest_size();
    data.par_chunks(task)
        .zip(out.par_chunks_mut(per_task))
        .for_each(|(d, o)| hash_blocks(params, salt, d, o));
}

/// Level 0 on the calling thread: `read(offset, buf)` fills `buf` with the data at
/// `offset`; offsets come in order, one chunk at a time.
fn level0_sequential(
    params: &Params,
    salt: &[u8],
    size: u64,
    chunk: usize,
    mut read: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<Vec<u8>> {
    let bs = params.block_size as usize;
    let ds = params.alg.digest_size();
    let mut level = vec![0u8; size.div_ceil(bs as u64) as usize * ds];
    let mut buf = vec![0u8; size.min(chunk as u64) as usize];
    let mut offset = 0u64;
    for out in level.chunks_mut(chunk / bs * ds) {
        let n = (size - offset).min(chunk as u64) as usize;
        read(offset, &mut buf[..n])?;
        hash_blocks(params, salt, &buf[..n], out);
        offset += n as u64;
    }
    Ok(level)
}

/// Level 0 from a reader on `threads` threads: this thread reads chunk after chunk and
/// hands each to rayon to hash, so reading overlaps hashing; at most `threads + 1`
/// chunks are in memory (one being read, the others being hashed).
fn level0_reader_parallel<R: Read>(
    params: &Params,
    salt: &[u8],
    reader: &mut R,
    size: u64,
    plan: &Plan,
    threads: usize,
) -> io::Result<Vec<u8>> {
    let bs = params.block_size as usize;
    let ds = params.alg.digest_size();
    let chunk = plan.chunk;
    let mut level = vec![0u8; size.div_ceil(bs as u64) as usize * ds];
    let (hashed, free) = mpsc::channel();
    let mut unallocated = threads + 1;
    let mut offset = 0u64;
    rayon::in_place_scope(|s| {
        for out in level.chunks_mut(chunk / bs * ds) {
            let mut buf = if unallocated > 0 {
                unallocated -= 1;
                Vec::new()
            } else {
                next_free(&free)
            };
            buf.resize((size - offset).min(chunk as u64) as usize, 0);
            reader.read_exact(&mut buf)?;
            offset += buf.len() as u64;
            let back = GiveBack(Some(buf), hashed.clone());
            s.spawn(move |_| hash_blocks(params, salt, back.0.as_deref().unwrap(), out));
        }
        Ok::<(), io::Error>(())
    })?;
    Ok(level)
}

/// A chunk buffer on its way through hashing: sent back to the reader when dropped,
/// even if the hashing panicked (the panic then surfaces at the end of the scope).
struct GiveBack(Option<Vec<u8>>, mpsc::Sender<Vec<u8>>);

impl Drop for GiveBack {
    fn drop(&mut self) {
        if let Some(buf) = self.0.take() {
            // The receiver is gone only if the reader already returned with an error.
            let _ = self.1.send(buf);
        }
    }
}

/// The next buffer back from hashing. On a rayon thread, run other jobs (likely the
/// hashing itself) while waiting: blocking there could leave the pool with no thread.
fn next_free(free: &mpsc::Receiver<Vec<u8>>) -> Vec<u8> {
    if rayon::current_thread_index().is_none() {
        return free.recv().expect("the reader holds a sender");
    }
    loop {
        if let Ok(buf) = free.try_recv() {
            return buf;
        }
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            // Nothing to run here: the chunks are being hashed on other threads.
            std::thread::yield_now();
        }
    }
}

/// Level 0 from a file on `threads` threads: each takes the next chunk, `pread`s it into
/// its own buffer and hashes it.
fn level0_file_parallel(
    params: &Params,
    salt: &[u8],
    file: &File,
    size: u64,
    plan: &Plan,
    threads: usize,
) -> io::Result<Vec<u8>> {
    let bs = params.block_size as usize;
    let ds = params.alg.digest_size();
    let chunk = plan.chunk;
    let mut level = vec![0u8; size.div_ceil(bs as u64) as usize * ds];
    let jobs = Mutex::new(level.chunks_mut(chunk / bs * ds).enumerate());
    let failed = AtomicBool::new(false);
    (0..threads).into_par_iter().try_for_each(|_| {
        let mut buf = Vec::new();
        while !failed.load(Ordering::Relaxed) {
            let Some((i, out)) = jobs.lock().unwrap().next() else {
                break;
            };
            let offset = i as u64 * chunk as u64;
            buf.resize((size - offset).min(chunk as u64) as usize, 0);
            if let Err(e) = file.read_exact_at(&mut buf, offset) {
                failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
            hash_blocks(params, salt, &buf, out);
        }
        Ok(())
    })?;
    Ok(level)
}

/// A Merkle tree, built.
pub struct Tree {
    /// The root hash: the hash of the top block.
    pub root: Vec<u8>,
    /// Levels from level 0 (just above the data) up to the single top block.
    pub levels: Vec<Vec<u8>>,
}

impl Tree {
    /// Reads exactly `size` bytes, streaming: at most one [`CHUNK`] per thread, plus
    /// one, is held at a time. Large inputs are hashed on rayon's threads while this
    /// thread reads on.
    pub fn build<R: Read>(params: &Params, reader: R, size: u64) -> io::Result<Tree> {
        Tree::build_with(params, reader, size, &Plan::new(params))
    }

    fn build_with<R: Read>(
        params: &Params,
        mut reader: R,
        size: u64,
        plan: &Plan,
    ) -> io::Result<Tree> {
        let salt = params.padded_salt();
        let level0 = match plan.threads_for(size) {
            1 => level0_sequential(params, &salt, size, plan.chunk, |_, buf| {
                reader.read_exact(buf)
            })?,
            threads => level0_reader_parallel(params, &salt, &mut reader, size, plan, threads)?,
        };
        Ok(Tree::from_level0_with(params, level0, plan))
    }

    /// The tree over the first `size` bytes of `file`, read with `pread` (the file
    /// offset is left alone), each thread reading and hashing its own [`CHUNK`] at a
    /// time. The fastest way from a file.
    pub fn build_file(params: &Params, file: &File, size: u64) -> io::Result<Tree> {
        Tree::build_file_with(params, file, size, &Plan::new(params))
    }

    fn build_file_with(params: &Params, file: &File, size: u64, plan: &Plan) -> io::Result<Tree> {
        let salt = params.padded_salt();
        let level0 = match plan.threads_for(size) {
            1 => level0_sequential(params, &salt, size, plan.chunk, |offset, buf| {
                file.read_exact_at(buf, offset)
            })?,
            threads => level0_file_parallel(params, &salt, file, size, plan, threads)?,
        };
        Ok(Tree::from_level0_with(params, level0, plan))
    }

    /// Completes a tree whose level 0 (one digest per data block, in order) was computed
    /// elsewhere, e.g. by the image builder while it copied the data. Large levels are
    /// hashed on rayon's threads.
    pub fn from_level0(params: &Params, level0: Vec<u8>) -> Tree {
        Tree::from_level0_with(params, level0, &Plan::new(params))
    }

    fn from_level0_with(params: &Params, level0: Vec<u8>, plan: &Plan) -> Tree {
        let bs = params.block_size as usize;
        let ds = params.alg.digest_size();
        let salt = params.padded_salt();
        match level0.len() / ds {
            0 => {
                return Tree {
                    root: vec![0u8; ds],
                    levels: Vec::new(),
                }
            }
            1 => {
                return Tree {
                    root: level0,
                    levels: Vec::new(),
                }
            }
            _ => {}
        }
        // Upper levels: the digests of a level, cut into zero-padded blocks, hashed.
        let mut level = level0;
        let mut levels = Vec::new();
        loop {
            let mut padded = level;
            padded.resize(padded.len().next_multiple_of(bs), 0);
            let n = padded.len() / bs;
            let mut next = vec![0u8; n * ds];
            if plan.threads_for(padded.len() as u64) > 1 {
                hash_blocks_par(params, &salt, &padded, &mut next, plan.task);
            } else {
                hash_blocks(params, &salt, &padded, &mut next);
            }
            levels.push(padded);
            if n == 1 {
                return Tree { root: next, levels };
            }
            level = next;
        }
    }

    /// The tree as `FS_IOC_READ_VERITY_METADATA` returns it: top level first.
    pub fn bytes(&self) -> Vec<u8> {
        self.levels
            .iter()
            .rev()
            .flat_map(|l| l.iter().copied())
            .collect()
    }
}

/// Pseudo-random test data, shared with the other crates' tests.
#[cfg(test)]
#[path = "../../erofs/tests/common/xorshift.rs"]
mod xorshift;

#[cfg(test)]
mod tests {
    use super::xorshift::xorshift as random;
    use super::{Plan, CHUNK, PAR_MIN};
    use crate::*;
    use std::io::{Seek, Write};

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    fn hex(b: &[u8]) -> String {
        hex::encode(b)
    }

    #[test]
    fn blocks_hashed_together_equal_blocks_hashed_one_by_one() {
        // Batch edges (1, 31-33, 64-65 blocks), a short last block, no salt and two salts.
        let data: Vec<u8> = (0..70 * 4096u32 + 1000)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for bs in [1024u32, 4096] {
            for salt in [vec![], vec![7u8; 3], vec![9u8; 32]] {
                let p = Params::new(HashAlg::Sha256, bs, salt).unwrap();
                let padded = p.padded_salt();
                for blocks in [1usize, 2, 31, 32, 33, 64, 65, 70] {
                    let len = (blocks * bs as usize + 1000).min(data.len());
                    let n = len.div_ceil(bs as usize);
                    let mut together = vec![0u8; n * 32];
                    hash_blocks(&p, &padded, &data[..len], &mut together);
                    for (k, block) in data[..len].chunks(bs as usize).enumerate() {
                        let mut one = vec![0u8; bs as usize];
                        one[..block.len()].copy_from_slice(block);
                        let mut h = [0u8; 32];
                        HashAlg::Sha256.hash_into(&padded, &one, &mut h);
                        assert_eq!(together[k * 32..][..32], h, "bs {bs} blocks {blocks} #{k}");
                    }
                }
            }
        }
    }

    fn digest(n: usize, alg: HashAlg, bs: u32, salt: &[u8]) -> (String, usize) {
        let data = pattern(n);
        let p = Params::new(alg, bs, salt.to_vec()).unwrap();
        let (d, t) = digest_reader(&p, &data[..], n as u64).unwrap();
        (hex(&d), t.bytes().len())
    }

    /// Vectors produced by the real `fsverity digest` (recorded in the project's reference).
    #[test]
    fn matches_fsverity_utils_vectors() {
        let s = HashAlg::Sha256;
        assert_eq!(
            digest(0, s, 4096, b"").0,
            "3d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95"
        );
        assert_eq!(
            digest(1, s, 4096, b"").0,
            "b803429503d95915829b29fdbc8bbad142f3abfd11b1cadf5526582e685c0551"
        );
        assert_eq!(
            digest(4096, s, 4096, b"").0,
            "13e9b8848ae484a36acb3f3cac0ceb2f7601e96633d15c92f9bd3dd44e492157"
        );
        let salt = [0xde, 0xad, 0xbe, 0xef];
        assert_eq!(
            digest(4096, s, 4096, &salt).0,
            "7e0849f6faffd3ec69f083b8467089d12654d8a58380eafed0439ce213725661"
        );
        assert_eq!(
            digest(4097, s, 4096, b"").0,
            "b0d074abef4d544404facfab6ba242f6a8ccbde90f1325cd286f3c8aa8d0f8aa"
        );
        assert_eq!(
            digest(1 << 20, s, 4096, b""),
            (
                "93c995656d665b81c3a87eed032fcf06a8f9cecef51e3f5e5af7fa59fef1d439".into(),
                12288
            )
        );
        assert_eq!(
            digest(1 << 20, s, 1024, b""),
            (
                "66623e1cad28f91bbd92dc493db9d2f945006459920ef15a63a44319dd1799d4".into(),
                33792
            )
        );
    }

    /// The tree the plain way: every block hashed in order on this thread, no chunks.
    fn reference(p: &Params, data: &[u8]) -> (Vec<u8>, Vec<Vec<u8>>) {
        let bs = p.block_size as usize;
        let ds = p.alg.digest_size();
        let salt = p.padded_salt();
        let hash = |block: &[u8]| {
            let mut b = block.to_vec();
            b.resize(bs, 0);
            let mut d = vec![0u8; ds];
            p.alg.hash_into(&salt, &b, &mut d);
            d
        };
        let mut level: Vec<u8> = data.chunks(bs).flat_map(hash).collect();
        let mut levels = Vec::new();
        if level.is_empty() {
            return (vec![0u8; ds], levels);
        }
        while level.len() > ds {
            level.resize(level.len().next_multiple_of(bs), 0);
            let next = level.chunks(bs).flat_map(hash).collect();
            levels.push(std::mem::replace(&mut level, next));
        }
        (level, levels)
    }

    /// Builds the tree over `data` from a reader and from a file with `plan`, and checks
    /// both against the reference.
    fn check(p: &Params, data: &[u8], plan: &Plan, file: &mut std::fs::File) {
        let what = format!(
            "{} bytes, {:?} {} salt {:?}, {plan:?}",
            data.len(),
            p.alg,
            p.block_size,
            p.salt
        );
        let (root, levels) = reference(p, data);
        let size = data.len() as u64;
        let t = Tree::build_with(p, data, size, plan).unwrap();
        assert_eq!(hex(&t.root), hex(&root), "reader, {what}");
        assert!(t.levels == levels, "reader levels, {what}");
        file.set_len(0).unwrap();
        file.rewind().unwrap();
        file.write_all(data).unwrap();
        let t = Tree::build_file_with(p, file, size, plan).unwrap();
        assert_eq!(hex(&t.root), hex(&root), "file, {what}");
        assert!(t.levels == levels, "file levels, {what}");
    }

    /// Small chunks and tasks and no threshold, so every chunk, batch and task boundary
    /// (and the parallel upper levels) is crossed at sizes a test can afford.
    #[test]
    fn parallel_matches_sequential_at_chunk_boundaries() {
        let mut file = tempfile::tempfile().unwrap();
        let data = random(1 << 20 | 1, 1);
        for alg in [HashAlg::Sha256, HashAlg::Sha512] {
            for bs in [1024u32, 4096, 65536] {
                for salt in [&b""[..], &[0xde, 0xad, 0xbe, 0xef]] {
                    let p = Params::new(alg, bs, salt.to_vec()).unwrap();
                    let bs = bs as usize;
                    let per_block = bs / alg.digest_size();
                    for threads in [1, 3] {
                        let plan = Plan {
                            chunk: 2 * bs,
                            par_min: 0,
                            threads: Some(threads),
                            task: bs,
                        }
                        .fit(&p);
                        let chunk = plan.chunk;
                        let batch = chunk * threads;
                        let mut sizes = vec![
                            0,
                            1,
                            bs,
                            chunk - 1,
                            chunk,
                            chunk + 1,
                            batch - 1,
                            batch,
                            batch + 1,
                            2 * batch + bs + bs / 2,
                        ];
                        if bs == 1024 && threads > 1 {
                            // Three levels above the data.
                            sizes.push(per_block * per_block * bs + 1);
                        }
                        for size in sizes {
                            check(&p, &data[..size], &plan, &mut file);
                        }
                    }
                }
            }
        }
    }

    /// The real plan (rayon's threads, `CHUNK`, `PAR_MIN`) on both sides of the threshold
    /// and around the chunk boundaries.
    #[test]
    fn default_plan_matches_sequential() {
        let mut file = tempfile::tempfile().unwrap();
        let threads = rayon::current_num_threads();
        let data = random(2 * threads * CHUNK + 3 * 4096 + 5, 2);
        for salt in [&b""[..], &[7; 32]] {
            let p = Params::new(HashAlg::Sha256, 4096, salt.to_vec()).unwrap();
            let plan = Plan::new(&p);
            let min = PAR_MIN as usize;
            for size in [
                min - 1,
                min,
                min + 1,
                CHUNK - 1,
                CHUNK,
                CHUNK + 1,
                2 * threads * CHUNK + 3 * 4096 + 5,
            ] {
                check(&p, &data[..size], &plan, &mut file);
            }
        }
    }

    /// Trees built on rayon's threads themselves (as a parallel image builder would),
    /// more of them than threads: no deadlock, same trees.
    #[test]
    fn parallel_inside_rayon() {
        use rayon::prelude::*;
        let p = Params::new(HashAlg::Sha256, 1024, Vec::new()).unwrap();
        let data = random(100 * 1024 + 5, 3);
        let (root, _) = reference(&p, &data);
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&data).unwrap();
        let plan = Plan {
            chunk: 4096,
            par_min: 0,
            threads: Some(2),
            task: 2048,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| {
            (0..8).into_par_iter().for_each(|i| {
                let t = if i % 2 == 0 {
                    Tree::build_with(&p, &data[..], data.len() as u64, &plan).unwrap()
                } else {
                    Tree::build_file_with(&p, &file, data.len() as u64, &plan).unwrap()
                };
                assert_eq!(t.root, root);
            })
        });
    }

    #[test]
    fn short_input_is_an_error() {
        let p = Params::new(HashAlg::Sha256, 4096, Vec::new()).unwrap();
        let data = random(3 << 20, 1);
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&data).unwrap();
        for threads in [1, 2] {
            let plan = Plan {
                chunk: 1 << 20,
                par_min: 0,
                threads: Some(threads),
                task: 1 << 16,
            };
            let size = data.len() as u64 + 1;
            let e = Tree::build_with(&p, &data[..], size, &plan).err().unwrap();
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
            let e = Tree::build_file_with(&p, &file, size, &plan).err().unwrap();
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        }
    }
}
