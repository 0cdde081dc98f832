//! Xattr planning: which (name, value) pairs go to the shared pool, which long name
//! prefixes earn a table entry, and each inode's inline body with its name filter.

use super::tree::Tree;
use crate::format::*;
use std::collections::HashMap;
use zerocopy::IntoBytes;

/// A long prefix: a short namespace index plus an infix such as `overlay.`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LongPrefix {
    /// Short name index (`XATTR_INDEX_*`) the prefix extends.
    pub base_index: u8,
    /// Bytes after the short prefix, e.g. `overlay.`.
    pub infix: Vec<u8>,
}

/// The inline xattr body of one inode, ready to be copied after its inode.
#[derive(Clone, Debug, Default)]
pub struct InodeXattrs {
    /// Indexes into `XattrPlan::shared_offsets`.
    pub shared: Vec<u32>,
    /// Encoded inline entries.
    pub inline: Vec<u8>,
    /// Name filter for the ibody header (`h_name_filter`).
    pub filter: u32,
}

impl InodeXattrs {
    /// Bytes of the ibody (0 when the inode has no xattrs).
    pub fn ibody_size(&self) -> usize {
        if self.shared.is_empty() && self.inline.is_empty() {
            0
        } else {
            XATTR_IBODY_HEADER_SIZE + 4 * self.shared.len() + self.inline.len()
        }
    }

    /// `i_xattr_icount` for this body; `None` when the body is larger than that 16-bit
    /// count can describe ([`MAX_IBODY`]).
    pub fn icount(&self) -> Option<u16> {
        match self.ibody_size() {
            0 => Some(0),
            n => u16::try_from((n - XATTR_IBODY_HEADER_SIZE) / 4 + 1).ok(),
        }
    }

    /// Writes the ibody given the byte offset of each shared entry's id.
    pub fn encode(&self, shared_ids: &[u32], out: &mut Vec<u8>) {
        if self.ibody_size() == 0 {
            return;
        }
        let header = raw::XattrIbodyHeader {
            h_name_filter: self.filter.into(),
            h_shared_count: self.shared.len() as u8,
            ..Default::default()
        };
        out.extend_from_slice(header.as_bytes());
        for &s in &self.shared {
            out.extend_from_slice(&shared_ids[s as usize].to_le_bytes());
        }
        out.extend_from_slice(&self.inline);
    }
}

/// Where every xattr goes: long prefixes, shared pool, each node's inline body.
pub struct XattrPlan {
    /// Long name prefixes, in table order.
    pub prefixes: Vec<LongPrefix>,
    /// Encoded shared entries, concatenated.
    pub shared_pool: Vec<u8>,
    /// Byte offset of each shared entry inside `shared_pool`.
    pub shared_offsets: Vec<u32>,
    /// Inline xattr body per node.
    pub per_node: Vec<InodeXattrs>,
    /// Bit `i` set when some xattr with short name index `i` occurs (see `DigestFooter`).
    pub namespaces: u32,
}

impl XattrPlan {
    /// The prefix table as stored: per record `le16 len, u8 base_index, infix`, 4-aligned.
    pub fn encode_prefix_table(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for p in &self.prefixes {
            out.extend_from_slice(&((1 + p.infix.len()) as u16).to_le_bytes());
            out.push(p.base_index);
            out.extend_from_slice(&p.infix);
            out.resize(out.len().next_multiple_of(4), 0);
        }
        out
    }
}

/// The largest inline xattr body an inode can have: `i_xattr_icount` is 16 bits and
/// counts 4-byte units after the header's first.
pub const MAX_IBODY: usize = XATTR_IBODY_HEADER_SIZE + 4 * (u16::MAX as usize - 1);

/// An inode may reference at most this many shared entries (`h_shared_count` is a u8).
const MAX_SHARED_PER_INODE: usize = 255;
/// A long prefix must save at least this many bytes beyond its table record.
const PREFIX_MIN_GAIN: usize = 64;

/// Plans every node's xattrs; `filter` adds name filters, `long_prefixes` allows a prefix table.
pub fn plan(tree: &Tree, filter: bool, long_prefixes: bool) -> XattrPlan {
    // How often each (name, value) pair occurs: pairs on two or more inodes are shared.
    let mut counts: HashMap<(&[u8], &[u8]), u32> = HashMap::new();
    for node in &tree.nodes {
        for (n, v) in &node.xattrs {
            *counts.entry((n.as_slice(), v.as_slice())).or_default() += 1;
        }
    }
    let prefixes = if long_prefixes {
        choose_prefixes(&counts)
    } else {
        Vec::new()
    };

    let mut shared_keys: Vec<(&[u8], &[u8])> = counts
        .iter()
        .filter(|(_, &c)| c >= 2)
        .map(|(&k, _)| k)
        .collect();
    // Pool order is part of the image: sort for reproducibility.
    shared_keys.sort_unstable();
    let mut shared_pool = Vec::new();
    let mut shared_offsets = Vec::with_capacity(shared_keys.len());
    let mut shared_index: HashMap<(&[u8], &[u8]), u32> = HashMap::new();
    for (i, &(n, v)) in shared_keys.iter().enumerate() {
        shared_offsets.push(shared_pool.len() as u32);
        encode_entry(&prefixes, n, v, &mut shared_pool);
        shared_index.insert((n, v), i as u32);
    }

    let namespaces = counts
        .keys()
        .filter_map(|(n, _)| split_xattr_name(n))
        .fold(0u32, |m, (index, _)| m | 1 << index);
    let per_node = tree
        .nodes
        .iter()
        .map(|node| {
            let mut x = InodeXattrs::default();
            let mut bits = Vec::new();
            for (n, v) in &node.xattrs {
                if let Some((index, suffix)) = split_xattr_name(n) {
                    bits.push(xattr_filter_bit(index, suffix));
                }
                match shared_index.get(&(n.as_slice(), v.as_slice())) {
                    Some(&i) if x.shared.len() < MAX_SHARED_PER_INODE => x.shared.push(i),
                    _ => encode_entry(&prefixes, n, v, &mut x.inline),
                }
            }
            // Without xattrs there is no ibody, so the filter is not stored at all.
            x.filter = if filter { xattr_filter_value(bits) } else { 0 };
            x
        })
        .collect();
    XattrPlan {
        prefixes,
        shared_pool,
        shared_offsets,
        per_node,
        namespaces,
    }
}

/// The candidate infix of a name: its suffix up to and including the first dot.
fn candidate(name: &[u8]) -> Option<LongPrefix> {
    let (index, suffix) = split_xattr_name(name)?;
    let dot = suffix.iter().position(|&b| b == b'.')?;
    // Leave at least one byte of name after the prefix.
    (dot + 1 < suffix.len()).then(|| LongPrefix {
        base_index: index,
        infix: suffix[..=dot].to_vec(),
    })
}

fn choose_prefixes(counts: &HashMap<(&[u8], &[u8]), u32>) -> Vec<LongPrefix> {
    let mut gain: HashMap<LongPrefix, usize> = HashMap::new();
    for (&(n, _), &c) in counts {
        if let Some(p) = candidate(n) {
            // A shared pair is written once; an inline one once per inode.
            let copies = if c >= 2 { 1 } else { c as usize };
            *gain.entry(p.clone()).or_default() += copies * p.infix.len();
        }
    }
    let mut chosen: Vec<(usize, LongPrefix)> = gain
        .into_iter()
        .filter(|(p, g)| *g >= (3 + p.infix.len()).next_multiple_of(4) + PREFIX_MIN_GAIN)
        .map(|(p, g)| (g, p))
        .collect();
    // Most valuable first, then by name, so the table is reproducible.
    chosen.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    chosen.truncate(XATTR_LONG_PREFIX_MASK as usize + 1);
    chosen.into_iter().map(|(_, p)| p).collect()
}

/// Appends one entry (header, stored name, value, padding).
fn encode_entry(prefixes: &[LongPrefix], name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    let (index, suffix) = split_xattr_name(name).expect("scanner keeps only known namespaces");
    let (index, stored) = match candidate(name).and_then(|c| prefixes.iter().position(|p| *p == c))
    {
        Some(i) => (
            XATTR_LONG_PREFIX | i as u8,
            &suffix[prefixes[i].infix.len()..],
        ),
        None => (index, suffix),
    };
    let start = out.len();
    let header = XattrEntry {
        name_len: stored.len() as u8,
        name_index: index,
        value_size: value.len() as u16,
    };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(stored);
    out.extend_from_slice(value);
    out.resize(start + xattr_entry_size(stored.len(), value.len()), 0);
}
