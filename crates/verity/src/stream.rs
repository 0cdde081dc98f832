//! A file digest from its level-0 hashes pushed in order, in memory bounded by the tree's
//! height. An aligned run of `per^k` zero blocks is one precomputed hash at level k, so a
//! reader checks a digest an image claims for a huge, sparse file without reading its data
//! or trusting its size.

use crate::{Descriptor, Params};

/// A file digest made from the file's level-0 hashes, pushed in order.
pub struct TreeStream {
    params: Params,
    salt: Vec<u8>,
    /// Hashes per tree block.
    per: u64,
    /// Level-0 hashes pushed so far (data blocks).
    blocks: u64,
    /// Per level, the hashes of the block being filled.
    partial: Vec<Vec<u8>>,
    /// `zero[k]`: the hash at level k standing for `per^k` zero data blocks.
    zero: Vec<Vec<u8>>,
}

impl TreeStream {
    /// A stream for a tree under `params`, no block pushed yet.
    pub fn new(params: &Params) -> TreeStream {
        let salt = params.padded_salt();
        let mut z = vec![0u8; params.alg.digest_size()];
        params
            .alg
            .hash_into(&salt, &vec![0u8; params.block_size as usize], &mut z);
        TreeStream {
            per: u64::from(params.block_size) / params.alg.digest_size() as u64,
            params: params.clone(),
            salt,
            blocks: 0,
            partial: Vec::new(),
            zero: vec![z],
        }
    }

    /// The hash of the next data block (short last blocks hashed zero-padded).
    pub fn push(&mut self, hash: &[u8]) {
        self.push_at(0, hash);
        self.blocks += 1;
    }

    /// `n` data blocks of zeros.
    pub fn push_zeros(&mut self, mut n: u64) {
        while n > 0 {
            // The highest level whose whole subtree this run can fill from here: the
            // position must be a multiple of the subtree, so every level below it is
            // at a block boundary (its partial block empty).
            let (mut level, mut span) = (0, 1u64);
            while let Some(s) = span.checked_mul(self.per) {
                if s > n || !self.blocks.is_multiple_of(s) {
                    break;
                }
                level += 1;
                span = s;
            }
            let z = self.zero_hash(level);
            self.push_at(level, &z);
            self.blocks += span;
            n -= span;
        }
    }

    /// Data blocks pushed so far.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The fs-verity digest of a file of `size` bytes whose blocks were all pushed.
    pub fn digest(mut self, size: u64) -> Vec<u8> {
        let ds = self.params.alg.digest_size();
        let root = match self.blocks {
            0 => vec![0u8; ds],
            // One block: no tree, the root is that block's hash.
            1 => self.partial[0][..ds].to_vec(),
            n => {
                // The top level is the first whose hashes fit one block.
                let mut top = 1;
                let mut hashes = n.div_ceil(self.per);
                while hashes > 1 {
                    hashes = hashes.div_ceil(self.per);
                    top += 1;
                }
                for level in 0..top {
                    if self.partial.get(level).is_some_and(|p| !p.is_empty()) {
                        let h = self.hash_block(level);
                        self.push_at(level + 1, &h);
                    }
                }
                self.partial[top][..ds].to_vec()
            }
        };
        Descriptor::new(&self.params, size, &root).digest(self.params.alg)
    }

    fn push_at(&mut self, level: usize, hash: &[u8]) {
        if self.partial.len() <= level {
            self.partial.resize(level + 1, Vec::new());
        }
        self.partial[level].extend_from_slice(hash);
        if self.partial[level].len() as u64 == self.per * hash.len() as u64 {
            let h = self.hash_block(level);
            self.push_at(level + 1, &h);
        }
    }

    /// Hashes level `level`'s partial block, zero-padded, and empties it.
    fn hash_block(&mut self, level: usize) -> Vec<u8> {
        let bs = self.params.block_size as usize;
        let mut block = std::mem::take(&mut self.partial[level]);
        block.resize(bs, 0);
        let mut h = vec![0u8; self.params.alg.digest_size()];
        self.params.alg.hash_into(&self.salt, &block, &mut h);
        block.clear();
        self.partial[level] = block;
        h
    }

    fn zero_hash(&mut self, level: usize) -> Vec<u8> {
        while self.zero.len() <= level {
            let below = self.zero.last().expect("zero[0] exists");
            let block: Vec<u8> = below
                .iter()
                .copied()
                .cycle()
                .take(self.params.block_size as usize)
                .collect();
            let mut h = vec![0u8; self.params.alg.digest_size()];
            self.params.alg.hash_into(&self.salt, &block, &mut h);
            self.zero.push(h);
        }
        self.zero[level].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{digest_reader, hash_blocks, HashAlg};

    fn params(bs: u32) -> Params {
        Params::new(HashAlg::Sha256, bs, Vec::new()).unwrap()
    }

    /// Pushing each block's hash gives `digest_reader`'s digest, for sizes around every
    /// level boundary, with and without salt.
    #[test]
    fn equals_the_tree_builder() {
        for salt in [&b""[..], b"salty"] {
            let p = Params::new(HashAlg::Sha256, 1024, salt.to_vec()).unwrap();
            let s = p.padded_salt();
            for size in [
                0u64,
                1,
                1024,
                1025,
                32 * 1024,
                32 * 1024 + 1,
                33 * 1024 + 7,
                32 * 32 * 1024,
                32 * 32 * 1024 + 5,
                3 * 32 * 32 * 1024 - 3,
            ] {
                let data: Vec<u8> = (0..size).map(|i| (i * 7 % 253) as u8).collect();
                let mut t = TreeStream::new(&p);
                for block in data.chunks(1024) {
                    let mut h = [0u8; 32];
                    hash_blocks(&p, &s, block, &mut h);
                    t.push(&h);
                }
                let (want, _) = digest_reader(&p, &data[..], size).unwrap();
                assert_eq!(t.digest(size), want, "size {size}");
            }
        }
    }

    /// Zero runs, aligned or not, give the digest of the zeros they stand for.
    #[test]
    fn zero_runs_equal_zero_data() {
        let p = params(1024);
        let s = p.padded_salt();
        for (before, zeros, after) in [
            (0u64, 1u64, 0u64),
            (0, 32 * 32, 0),
            (1, 32 * 32 * 2 + 3, 1),
            (31, 33, 2),
            (5, 32 * 32 * 32 + 1, 0),
            (0, 7, 9),
        ] {
            let blocks = before + zeros + after;
            let size = blocks * 1024;
            let mut data = vec![0u8; size as usize];
            for (i, b) in data.iter_mut().enumerate() {
                let block = i as u64 / 1024;
                if block < before || block >= before + zeros {
                    *b = (i % 251) as u8 | 1;
                }
            }
            let mut t = TreeStream::new(&p);
            let mut h = [0u8; 32];
            for k in 0..before {
                hash_blocks(&p, &s, &data[k as usize * 1024..][..1024], &mut h);
                t.push(&h);
            }
            t.push_zeros(zeros);
            for k in before + zeros..blocks {
                hash_blocks(&p, &s, &data[k as usize * 1024..][..1024], &mut h);
                t.push(&h);
            }
            let (want, _) = digest_reader(&p, &data[..], size).unwrap();
            assert_eq!(t.digest(size), want, "{before} + {zeros} zeros + {after}");
        }
    }

    /// A claimed exabyte of holes is a few hundred hashes, not a loop over its blocks.
    #[test]
    fn huge_holes_are_cheap() {
        let p = params(4096);
        let mut t = TreeStream::new(&p);
        t.push_zeros((1u64 << 60) / 4096 + 3);
        assert_eq!(t.blocks(), (1u64 << 60) / 4096 + 3);
        assert_eq!(t.digest(1 << 60).len(), 32);
    }
}
