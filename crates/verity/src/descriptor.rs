//! `struct fsverity_descriptor`: 256 bytes whose hash is the file digest.

use crate::{HashAlg, Params};

pub const DESCRIPTOR_SIZE: usize = 256;

pub struct Descriptor {
    pub bytes: [u8; DESCRIPTOR_SIZE],
}

impl Descriptor {
    pub fn new(params: &Params, data_size: u64, root: &[u8]) -> Descriptor {
        let mut b = [0u8; DESCRIPTOR_SIZE];
        b[0] = 1; // version
        b[1] = params.alg.id();
        b[2] = params.block_size.trailing_zeros() as u8;
        b[3] = params.salt.len() as u8;
        // Bytes 4..8 (sig_size) stay zero: the digest never covers a signature.
        b[8..16].copy_from_slice(&data_size.to_le_bytes());
        b[16..16 + root.len()].copy_from_slice(root);
        b[80..80 + params.salt.len()].copy_from_slice(&params.salt);
        Descriptor { bytes: b }
    }

    /// The fs-verity file digest: the hash of the whole descriptor.
    pub fn digest(&self, alg: HashAlg) -> Vec<u8> {
        let mut out = vec![0u8; alg.digest_size()];
        alg.hash_into(&[], &self.bytes, &mut out);
        out
    }
}
