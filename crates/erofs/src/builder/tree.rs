//! The builder's input model: a tree of nodes, independent of where it came from
//! (a host directory today, a tar layer later). Everything the image records is here.

use std::path::PathBuf;

/// Index of a node in [`Tree::nodes`].
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
        /// The shared file.
        file: std::sync::Arc<std::fs::File>,
        /// Byte offset of the node's bytes in `file`.
        offset: u64,
    },
}

/// What a node is, with its type-specific contents.
#[derive(Clone, Debug)]
pub enum Kind {
    /// `extents` lists the `[start, end)` byte ranges holding data, when the file is sparse.
    Regular {
        /// Where the bytes come from.
        content: Content,
        /// Data ranges of a sparse file.
        extents: Option<Vec<(u64, u64)>>,
    },
    /// A directory.
    Directory {
        /// Entries: name and node.
        children: Vec<(Vec<u8>, NodeId)>,
    },
    /// A symbolic link.
    Symlink {
        /// Link target.
        target: Vec<u8>,
    },
    /// A character device.
    CharDevice {
        /// Major device number.
        major: u32,
        /// Minor device number.
        minor: u32,
    },
    /// A block device.
    BlockDevice {
        /// Major device number.
        major: u32,
        /// Minor device number.
        minor: u32,
    },
    /// A FIFO.
    Fifo,
    /// A socket.
    Socket,
}

/// One inode of the tree.
#[derive(Clone, Debug)]
pub struct Node {
    /// Type and type-specific contents.
    pub kind: Kind,
    /// Permission bits (07777); the type comes from `kind`.
    pub perm: u16,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: u32,
    /// File size (regular files and symlinks); directories are sized by the builder.
    pub size: u64,
    /// Full xattr names and values, as read from the source.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Node {
    /// Full mode: the type bits of `kind` plus `perm`.
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

    /// Whether the node is a directory.
    pub fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Directory { .. })
    }
}

/// Nodes in an arena; node 0 is the root directory. Hardlinks are several directory
/// entries naming the same `NodeId`.
#[derive(Clone, Debug, Default)]
pub struct Tree {
    /// All nodes, indexed by `NodeId`.
    pub nodes: Vec<Node>,
}

impl Tree {
    /// Id of the root directory.
    pub const ROOT: NodeId = 0;

    /// Adds a node and returns its id.
    pub fn add(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Entries of directory `id`: name and node (empty for other nodes).
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
