//! fs-verity in userspace: the Merkle tree, descriptor and file digest, exactly as `fs/verity/`
//! and fsverity-utils compute them (layout: docs/FORMAT.md; modules: docs/ARCHITECTURE.md).
//!
//! - `verified` checks every byte against a pinned tree; [`source::ByteSource`] is what it
//!   reads.
//! - `stream` bounds memory by the tree's height.

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
