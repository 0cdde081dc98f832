//! Naming the owner of an image byte, for integrity reports: "data of /usr/bin/ls".
//!
//! A diagnostic, meant to run over the raw (unverified) image after a verified read named
//! a bad block: only that block is wrong, so the rest of the tree still leads to it.

use super::{ByteSource, Image};
use crate::format;
use std::collections::{HashSet, VecDeque};

impl<S: ByteSource> Image<S> {
    /// What the byte at `offset` belongs to, as a phrase ("the superblock", "data of /a/b").
    pub fn owner_of(&self, offset: u64) -> String {
        let sb = format::SUPER_OFFSET;
        if (sb..sb + format::SUPER_SIZE as u64).contains(&offset) {
            return "the superblock".into();
        }
        if offset >= self.erofs_len() {
            return "bytes past the EROFS image".into();
        }
        if let Ok(Some(t)) = self.digest_table() {
            if offset >= t.table_offset {
                return "the file digest table".into();
            }
        }
        self.walk_for(offset).unwrap_or_else(|| {
            if offset < sb {
                "the unused head of block 0".into()
            } else {
                "no file (shared xattrs, long xattr prefixes or padding)".into()
            }
        })
    }

    /// Breadth-first over the tree, skipping what cannot be read, bounded by the inode count.
    fn walk_for(&self, offset: u64) -> Option<String> {
        let bs = u64::from(self.block_size());
        let mut queue = VecDeque::from([(self.root_nid(), b"/".to_vec())]);
        let mut seen = HashSet::new();
        let budget = self.superblock().inos.saturating_mul(2).max(1 << 16);
        while let Some((nid, path)) = queue.pop_front() {
            if !seen.insert(nid) || seen.len() as u64 > budget {
                continue;
            }
            let name = String::from_utf8_lossy(&path).into_owned();
            let Ok(inode) = self.inode(nid) else {
                continue;
            };
            let li = self.layout_info(&inode);
            let within = |at: u64, len: u64| at <= offset && offset - at < len;
            if within(li.inode_offset, li.inode_size) {
                return Some(format!("the inode of {name}"));
            }
            if within(li.xattr_offset, li.xattr_size) {
                return Some(format!("the xattrs of {name}"));
            }
            if let Some((at, len)) = li.tail {
                if within(at, len) {
                    return Some(format!("the inline tail of {name}"));
                }
            }
            if let Some((at, entry)) = li.chunk_index {
                if within(at, li.chunk_count.saturating_mul(entry)) {
                    return Some(format!("the chunk index of {name}"));
                }
            }
            let what = if inode.is_dir() {
                "a directory block of"
            } else if inode.is_symlink() {
                "the target of"
            } else {
                "the data of"
            };
            let mut pos = 0;
            while pos < inode.size {
                let Ok(e) = self.map(&inode, pos) else { break };
                if e.len == 0 {
                    break;
                }
                if let Some(p) = e.physical {
                    // Whole blocks own their zero padding; an inline tail owns only itself.
                    let span = if p % bs == 0 {
                        e.len.next_multiple_of(bs)
                    } else {
                        e.len
                    };
                    if within(p, span) {
                        return Some(format!("{what} {name}"));
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
                    let mut child = path.clone();
                    if child.len() > 1 {
                        child.push(b'/');
                    }
                    child.extend_from_slice(&e.name);
                    queue.push_back((e.nid, child));
                }
            }
        }
        None
    }
}
