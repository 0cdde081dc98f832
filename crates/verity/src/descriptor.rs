//! `struct fsverity_descriptor`: 256 bytes whose hash is the file digest.

use crate::{HashAlg, Params};

/// A descriptor's size, in bytes.
pub const DESCRIPTOR_SIZE: usize = 256;

/// A descriptor, as the bytes whose hash is the file digest.
pub struct Descriptor {
    /// Its bytes.
    pub bytes: [u8; DESCRIPTOR_SIZE],
}

impl Descriptor {
    /// The descriptor of `data_size` bytes of data whose Merkle tree under `params` has
    /// the root hash `root`.
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

/// Why a stored descriptor was refused.
#[derive(Debug, thiserror::Error)]
#[error("fs-verity descriptor: {0}")]
pub struct BadDescriptor(pub String);

/// A descriptor read back from storage, checked the way `fs/verity/open.c` checks one.
pub struct Parsed {
    /// The tree's hash algorithm, block size and salt.
    pub params: Params,
    /// Bytes of data it covers.
    pub data_size: u64,
    /// The root hash of the tree.
    pub root: Vec<u8>,
}

impl Descriptor {
    /// Parses and checks stored descriptor bytes; an error says what is wrong with them.
    pub fn parse(bytes: &[u8; DESCRIPTOR_SIZE]) -> Result<Parsed, BadDescriptor> {
        let bad = |s: &str| Err(BadDescriptor(s.to_string()));
        if bytes[0] != 1 {
            return bad(&format!("version {} is not 1", bytes[0]));
        }
        let alg = match bytes[1] {
            1 => HashAlg::Sha256,
            2 => HashAlg::Sha512,
            n => return bad(&format!("unknown hash algorithm {n}")),
        };
        let log_bs = bytes[2];
        if !(10..=16).contains(&log_bs) {
            return bad(&format!("block size 2^{log_bs} is out of range"));
        }
        let salt_len = bytes[3] as usize;
        if salt_len > 32 {
            return bad(&format!("salt of {salt_len} bytes is longer than 32"));
        }
        if bytes[4..8] != [0; 4] {
            return bad("carries a signature, which images never do");
        }
        let ds = alg.digest_size();
        // Unused root-hash bytes, unused salt bytes and the reserved tail must be zero,
        // so one image has exactly one descriptor (and one digest).
        if bytes[16 + ds..80].iter().any(|&b| b != 0)
            || bytes[80 + salt_len..].iter().any(|&b| b != 0)
        {
            return bad("reserved bytes are not zero");
        }
        let params = Params::new(alg, 1 << log_bs, bytes[80..80 + salt_len].to_vec())
            .map_err(BadDescriptor)?;
        Ok(Parsed {
            params,
            data_size: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
            root: bytes[16..16 + ds].to_vec(),
        })
    }
}
