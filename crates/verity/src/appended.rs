//! The verity section appended to a file (verilay images): the data's Merkle tree, its
//! descriptor and a trailer that finds both (layout: docs/FORMAT.md).
//!
//! - The data's digest is the descriptor's hash, exactly `fsverity digest` of the data.
//! - The trailer is not trusted: every field is checked against the descriptor, whose hash
//!   callers pin.

use crate::{level_blocks, Descriptor, Params, Tree};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The trailer's first bytes.
pub const TRAILER_MAGIC: [u8; 8] = *b"VLVERITY";
/// The trailer's size, in bytes.
pub const TRAILER_SIZE: u64 = 64;
/// The trailer version written, and the only one read.
pub const TRAILER_VERSION: u32 = 1;
/// The descriptor's size, in bytes.
pub const DESCRIPTOR_SIZE: u64 = crate::descriptor::DESCRIPTOR_SIZE as u64;

/// Where the parts of a section lie (all offsets absolute in the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    /// Bytes of data, from the start of the file.
    pub data_size: u64,
    /// Where the Merkle tree starts.
    pub tree_offset: u64,
    /// The tree's size, in bytes.
    pub tree_size: u64,
    /// Where the descriptor starts.
    pub descriptor_offset: u64,
}

impl Section {
    /// The only layout a section for `data_size` bytes under `params` may have.
    pub fn plan(params: &Params, data_size: u64) -> Section {
        let bs = params.block_size as u64;
        let tree_offset = data_size.next_multiple_of(bs);
        let tree_size = level_blocks(params, data_size).iter().sum::<u64>() * bs;
        Section {
            data_size,
            tree_offset,
            tree_size,
            descriptor_offset: tree_offset + tree_size,
        }
    }

    /// The file's length: data, padding, tree, descriptor and trailer.
    pub fn file_len(&self) -> u64 {
        self.descriptor_offset + DESCRIPTOR_SIZE + TRAILER_SIZE
    }

    /// The trailer recording this section.
    pub fn encode_trailer(&self) -> [u8; TRAILER_SIZE as usize] {
        let mut t = [0u8; TRAILER_SIZE as usize];
        t[0..8].copy_from_slice(&TRAILER_MAGIC);
        t[8..12].copy_from_slice(&TRAILER_VERSION.to_le_bytes());
        t[16..24].copy_from_slice(&self.data_size.to_le_bytes());
        t[24..32].copy_from_slice(&self.tree_offset.to_le_bytes());
        t[32..40].copy_from_slice(&self.tree_size.to_le_bytes());
        t[40..48].copy_from_slice(&self.descriptor_offset.to_le_bytes());
        t
    }

    /// Reads the trailer at the end of a file of `file_len` bytes; `None` when there is no
    /// trailer magic (a plain file), an error when there is one but it is inconsistent.
    pub fn decode_trailer(t: &[u8; TRAILER_SIZE as usize]) -> Result<Option<Section>, String> {
        if t[0..8] != TRAILER_MAGIC {
            return Ok(None);
        }
        let u64_at = |i: usize| u64::from_le_bytes(t[i..i + 8].try_into().expect("8 bytes"));
        let version = u32::from_le_bytes(t[8..12].try_into().expect("4 bytes"));
        if version != TRAILER_VERSION {
            return Err(format!("verity section version {version} is not supported"));
        }
        if t[12..16] != [0; 4] || t[48..] != [0; 16] {
            return Err("verity trailer has non-zero reserved bytes".into());
        }
        Ok(Some(Section {
            data_size: u64_at(16),
            tree_offset: u64_at(24),
            tree_size: u64_at(32),
            descriptor_offset: u64_at(40),
        }))
    }
}

/// Appends the section for the first `data_size` bytes of `file`, given their level-0
/// hashes (one per tree block, as the builder computed them while writing), and returns
/// the data's fs-verity digest.
pub fn append(
    file: &File,
    params: &Params,
    data_size: u64,
    level0: Vec<u8>,
) -> io::Result<Vec<u8>> {
    append_tree(file, params, data_size, &Tree::from_level0(params, level0))
}

/// Appends the section for the first `data_size` bytes of `file`, given their tree, and
/// returns the data's fs-verity digest. Whatever followed the data is replaced.
pub fn append_tree(
    file: &File,
    params: &Params,
    data_size: u64,
    tree: &Tree,
) -> io::Result<Vec<u8>> {
    let section = Section::plan(params, data_size);
    let tree_bytes = tree.bytes();
    assert_eq!(
        tree_bytes.len() as u64,
        section.tree_size,
        "tree size matches its plan"
    );
    let desc = Descriptor::new(params, data_size, &tree.root);
    let mut tail = Vec::with_capacity((section.file_len() - section.tree_offset) as usize);
    tail.extend_from_slice(&tree_bytes);
    tail.extend_from_slice(&desc.bytes);
    tail.extend_from_slice(&section.encode_trailer());
    // Cut back to the data first, so the padding up to the tree is zeros whatever the
    // file held there.
    file.set_len(data_size)?;
    file.set_len(section.tree_offset)?;
    file.write_all_at(&tail, section.tree_offset)?;
    Ok(desc.digest(params.alg))
}
