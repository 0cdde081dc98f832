//! Building the Merkle tree: data blocks hashed with the padded salt, level after level,
//! until one block remains; its hash is the root.

use crate::HashAlg;
use std::io::{self, Read};

#[derive(Clone, Debug)]
pub struct Params {
    pub alg: HashAlg,
    /// Power of two from 1024 to 65536 (fsverity-utils' range).
    pub block_size: u32,
    /// At most 32 bytes.
    pub salt: Vec<u8>,
}

impl Params {
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

pub struct Tree {
    pub root: Vec<u8>,
    /// Levels from level 0 (just above the data) up to the single top block.
    pub levels: Vec<Vec<u8>>,
}

impl Tree {
    /// Reads exactly `size` bytes (never holding more than one block of data).
    pub fn build<R: Read>(params: &Params, mut reader: R, size: u64) -> io::Result<Tree> {
        let bs = params.block_size as usize;
        let ds = params.alg.digest_size();
        let salt = params.padded_salt();
        // Level 0: one hash per data block, the last block zero-padded.
        let blocks = size.div_ceil(bs as u64);
        let mut level = vec![0u8; blocks as usize * ds];
        let mut block = vec![0u8; bs];
        for i in 0..blocks as usize {
            let n = (size - i as u64 * bs as u64).min(bs as u64) as usize;
            reader.read_exact(&mut block[..n])?;
            hash_blocks(params, &salt, &block[..n], &mut level[i * ds..(i + 1) * ds]);
        }
        Ok(Tree::from_level0(params, level))
    }

    /// Completes a tree whose level 0 (one digest per data block, in order) was computed
    /// elsewhere, e.g. by the image builder while it copied the data.
    pub fn from_level0(params: &Params, level0: Vec<u8>) -> Tree {
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
            hash_blocks(params, &salt, &padded, &mut next);
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

#[cfg(test)]
mod tests {
    use crate::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
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
}
