//! fs-verity in userspace: the Merkle tree, the descriptor and the file digest, computed
//! exactly as `fs/verity/` and fsverity-utils do (see `docs/FORMAT.md` for the layout).
//!
//! One concern per module:
//! - `alg`: the hash algorithms.
//! - `tree`: building the Merkle tree; `stream`: a digest from level-0 hashes in order,
//!   in memory bounded by the tree's height.
//! - `descriptor`: the 256-byte descriptor whose hash is the file digest.
//! - `appended`: the verity section appended to an image (tree, descriptor, trailer).
//! - `source`: where bytes come from (`ByteSource`: exact ranges of a file or buffer).
//! - `verified`: the verified block source, every byte returned checked against a
//!   pinned Merkle tree.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod alg;
pub mod appended;
pub mod descriptor;
pub mod source;
pub mod stream;
pub mod tree;
pub mod verified;

pub use alg::HashAlg;
pub use descriptor::Descriptor;
pub use stream::TreeStream;
pub use tree::{hash_blocks, level_blocks, Params, Tree};
pub use verified::{IntegrityError, OpenError, VerifiedSource};

/// Computes a file's fs-verity digest and tree from a reader of exactly `size` bytes.
pub fn digest_reader<R: std::io::Read>(
    params: &Params,
    reader: R,
    size: u64,
) -> std::io::Result<(Vec<u8>, Tree)> {
    let tree = Tree::build(params, reader, size)?;
    let desc = Descriptor::new(params, size, &tree.root);
    Ok((desc.digest(params.alg), tree))
}

/// Computes a file's fs-verity digest and tree from its first `size` bytes (its length),
/// read with `pread` by several threads at once: faster than [`digest_reader`].
pub fn digest_file(
    params: &Params,
    file: &std::fs::File,
    size: u64,
) -> std::io::Result<(Vec<u8>, Tree)> {
    let tree = Tree::build_file(params, file, size)?;
    let desc = Descriptor::new(params, size, &tree.root);
    Ok((desc.digest(params.alg), tree))
}
