//! fs-verity in userspace: the Merkle tree, the descriptor and the file digest, computed
//! exactly as `fs/verity/` and fsverity-utils do (layout: docs/FORMAT.md). One concern per
//! module: `alg`, `tree`, `stream` (a digest from level-0 hashes, memory bounded by the
//! tree's height), `descriptor`, `appended` (the section after an image), `source`
//! ([`source::ByteSource`]), `verified` (every byte checked against a pinned tree).

#![forbid(unsafe_code)]

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
