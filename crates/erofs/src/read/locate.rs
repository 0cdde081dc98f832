//! Naming the owner of an image byte, for integrity reports: "data of /usr/bin/ls".
//!
//! A diagnostic, meant to run over the raw (unverified) image after a verified read named
//! a bad block: only that block is wrong, so the rest of the tree still leads to it.

use super::{ByteSource, Image};
use crate::format;
use std::collections::{HashSet, VecDeque};

impl<S: ByteSource> Image<S> {
    /// Everything stored in `[offset, offset + len)`, as phrases ("the superblock",
    /// "the data of /a/b"), in image order of discovery; at most `max` of them.
    pub fn owners(&self, offset: u64, len: u64, max: usize) -> Vec<String> {
        let end = offset.saturating_add(len);
        let overlaps = |at: u64, n: u64| at < end && offset < at.saturating_add(n);
        let mut out = Vec::new();
        let sb = format::SUPER_OFFSET;
        if overlaps(sb, format::SUPER_SIZE as u64) {
            out.push("the superblock".to_string());
        }
        if let Ok(Some(t)) = self.digest_table() {
            if end > t.table_offset {
                out.push("the file digest table".into());
            }
        }
        self.walk(&overlaps, max, &mut out);
        // The packed inode is in no directory: the tails (fragments) of compressed files.
        let packed = self.sb.packed_nid;
        if self.sb.feature_incompat & crate::zformat::FEATURE_INCOMPAT_FRAGMENTS != 0 && packed != 0
        {
            if let Ok(inode) = self.inode(packed) {
                if overlaps(inode.offset, inode.inode_size()) {
                    out.push("the packed inode".into());
                } else if inode.is_reg() && self.zcluster_overlaps(&inode, &overlaps) {
                    out.push("the packed inode (file tails stored as fragments)".into());
                }
            }
        }
        if out.is_empty() {
            out.push("no file (shared xattrs, long xattr prefixes or padding)".into());
        }
        out
    }

    /// Breadth-first over the tree, skipping what cannot be read, bounded by the inode count.
    fn walk(&self, overlaps: &dyn Fn(u64, u64) -> bool, max: usize, out: &mut Vec<String>) {
        let bs = u64::from(self.block_size());
        let mut queue = VecDeque::from([(self.root_nid(), b"/".to_vec())]);
        let mut seen = HashSet::new();
        let budget = self.superblock().inos.saturating_mul(2).max(1 << 16);
        while let Some((nid, path)) = queue.pop_front() {
            if !seen.insert(nid) || seen.len() as u64 > budget {
                continue;
            }
            if out.len() >= max {
                return;
            }
            let name = String::from_utf8_lossy(&path).into_owned();
            let Ok(inode) = self.inode(nid) else {
                // The damage may be in this very inode: its first slot is still its own.
                let at = self.meta_base.saturating_add(nid.saturating_mul(32));
                if overlaps(at, 32) {
                    out.push(format!("the inode of {name}"));
                }
                continue;
            };
            let li = self.layout_info(&inode);
            if overlaps(li.inode_offset, li.inode_size) {
                out.push(format!("the inode of {name}"));
            }
            if li.xattr_size > 0 && overlaps(li.xattr_offset, li.xattr_size) {
                out.push(format!("the xattrs of {name}"));
            }
            if let Some((at, len)) = li.tail {
                if overlaps(at, len) {
                    out.push(format!("the inline tail of {name}"));
                }
            }
            if let Some((at, entry)) = li.chunk_index {
                if overlaps(at, li.chunk_count.saturating_mul(entry)) {
                    out.push(format!("the chunk index of {name}"));
                }
            }
            let what = if inode.is_dir() {
                "a directory block of"
            } else if inode.is_symlink() {
                "the target of"
            } else {
                "the data of"
            };
            if let Some(z) = &li.compressed {
                if let Some((at, len)) = z.inline_tail {
                    if overlaps(at, len) {
                        out.push(format!("the inline tail of {name}"));
                    }
                }
                if self.zcluster_overlaps(&inode, overlaps) {
                    out.push(format!("{what} {name}"));
                }
                continue;
            }
            let mut pos = 0;
            while pos < inode.size {
                let Ok(e) = self.map(&inode, pos) else { break };
                if e.len == 0 {
                    break;
                }
                if let Some(p) = e.physical {
                    // Whole blocks own their zero padding; an inline tail was named above.
                    if p % bs == 0 && overlaps(p, e.len.next_multiple_of(bs)) {
                        out.push(format!("{what} {name}"));
                        break;
                    }
                }
                pos = e.logical + e.len;
            }
            if inode.is_dir() {
                let Ok(entries) = self.readdir(&inode, 0) else {
                    continue;
                };
                for e in entries.map_while(Result::ok) {
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    queue.push_back((e.nid, super::child_path(&path, &e.name)));
                }
            }
        }
    }
}
