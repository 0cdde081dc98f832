//! The builder's input model: a tree of nodes, independent of where it came from
//! (a host directory today, a tar layer later). Everything the image records is here.

use std::path::PathBuf;

pub type NodeId = usize;

/// Where a regular file's bytes come from.
#[derive(Clone, Debug)]
pub enum Content {
    /// Read from a host file at build time.
    File(PathBuf),
    /// Held in memory (small generated files, tests).
    Bytes(Vec<u8>),
    /// The node's `size` bytes at `offset` of a shared file (a tarball's contents, copied
    /// into one spill file).
    Span {
        file: std::sync::Arc<std::fs::File>,
        offset: u64,
    },
}

#[derive(Clone, Debug)]
pub enum Kind {
    /// `extents` lists the `[start, end)` byte ranges holding data, when the file is sparse.
    Regular {
        content: Content,
        extents: Option<Vec<(u64, u64)>>,
    },
    Directory {
        children: Vec<(Vec<u8>, NodeId)>,
    },
    Symlink {
        target: Vec<u8>,
    },
    CharDevice {
        major: u32,
        minor: u32,
    },
    BlockDevice {
        major: u32,
        minor: u32,
    },
    Fifo,
    Socket,
}

#[derive(Clone, Debug)]
pub struct Node {
    pub kind: Kind,
    /// Permission bits (07777); the type comes from `kind`.
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// File size (regular files and symlinks); directories are sized by the builder.
    pub size: u64,
    /// Full xattr names and values, as read from the source.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Node {
    pub fn mode(&self) -> u16 {
        use crate::format::*;
        let kind = match self.kind {
            Kind::Regular { .. } => S_IFREG,
            Kind::Directory { .. } => S_IFDIR,
            Kind::Symlink { .. } => S_IFLNK,
            Kind::CharDevice { .. } => S_IFCHR,
            Kind::BlockDevice { .. } => S_IFBLK,
            Kind::Fifo => S_IFIFO,
            Kind::Socket => S_IFSOCK,
        };
        kind | (self.perm & 0o7777)
    }

    pub fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Directory { .. })
    }
}

/// Nodes in an arena; node 0 is the root directory. Hardlinks are several directory
/// entries naming the same `NodeId`.
#[derive(Clone, Debug, Default)]
pub struct Tree {
    pub nodes: Vec<Node>,
}

impl Tree {
    pub const ROOT: NodeId = 0;

    pub fn add(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    pub fn children(&self, id: NodeId) -> &[(Vec<u8>, NodeId)] {
        match &self.nodes[id].kind {
            Kind::Directory { children } => children,
            _ => &[],
        }
    }

    /// A path of node `id` from the root ("/" for the root), for error messages: a
    /// search of the whole tree, so never on a path that is not failing anyway.
    pub fn path_of(&self, id: NodeId) -> String {
        let mut stack = vec![(Tree::ROOT, b"/".to_vec())];
        while let Some((at, path)) = stack.pop() {
            if at == id {
                return String::from_utf8_lossy(&path).into_owned();
            }
            for (name, child) in self.children(at) {
                let mut p = path.clone();
                if p.len() > 1 {
                    p.push(b'/');
                }
                p.extend_from_slice(name);
                stack.push((*child, p));
            }
        }
        format!("(node {id})")
    }
}
