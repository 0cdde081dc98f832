//! The layer's tree while it is read, placed as a runtime applying it to an empty directory
//! would.
//!
//! - Missing parents are root-owned 0755; a path through a non-directory is refused.
//! - A later entry wins, but never over a non-empty directory.
//! - A hardlink names an earlier non-directory, non-whiteout.
//! - A whiteout of this layer's entry is dropped; a directory made where it whited one is
//!   opaque.

use crate::Stats;
use erofs::builder::{Kind, Node, NodeId, Tree};
use std::collections::{BTreeMap, HashMap};
use upper::overlay::{OPAQUE, OPAQUE_XATTR, WHITEOUT_DEVICE};

/// One node while the layer is read: directories keep their children by name.
struct Item {
    node: Node,
    children: BTreeMap<Vec<u8>, usize>,
    /// Nothing of the layers below shows through (an opaque marker, or a directory made
    /// where this layer deleted one: see `Layer::dir`).
    opaque: bool,
}

fn dir_node() -> Node {
    Node {
        kind: Kind::Directory {
            children: Vec::new(),
        },
        perm: 0o755,
        uid: 0,
        gid: 0,
        mtime: 0,
        mtime_nsec: 0,
        size: 0,
        xattrs: Vec::new(),
    }
}

/// What overlayfs takes for a whiteout in a lower layer: a 0/0 character device.
fn is_whiteout(n: &Node) -> bool {
    matches!(n.kind, Kind::CharDevice { major, minor } if (major, minor) == WHITEOUT_DEVICE)
}

fn kind_name(n: &Node) -> &'static str {
    match n.kind {
        Kind::Regular { .. } => "a file",
        Kind::Directory { .. } => "a directory",
        Kind::Symlink { .. } => "a symlink",
        _ if is_whiteout(n) => "a whiteout",
        Kind::CharDevice { .. } | Kind::BlockDevice { .. } => "a device",
        Kind::Fifo => "a FIFO",
        Kind::Socket => "a socket",
    }
}

fn shown(parts: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(&parts.join(&b'/')).into_owned()
}

pub struct Layer {
    items: Vec<Item>,
    pub stats: Stats,
}

impl Layer {
    pub fn new() -> Self {
        Layer {
            items: vec![Item {
                node: dir_node(),
                children: BTreeMap::new(),
                opaque: false,
            }],
            stats: Stats::default(),
        }
    }

    fn push(&mut self, node: Node, opaque: bool) -> usize {
        self.items.push(Item {
            node,
            children: BTreeMap::new(),
            opaque,
        });
        self.items.len() - 1
    }

    /// The directory at `parts`, made (root-owned, 0755) where missing. A directory made
    /// where this layer whited a name out is opaque: the whiteout deleted what the layers
    /// below had there, and this layer then made a new directory (what containerd's
    /// applier leaves). Any other non-directory in the way is refused: a runtime would
    /// fail with ENOTDIR, or, for a symlink, follow it into a tree this layer cannot see
    /// (`a -> /etc` then `a/passwd` writes the lower layers' /etc).
    pub fn dir(&mut self, parts: &[Vec<u8>]) -> Result<usize, String> {
        let mut at = 0;
        for (i, p) in parts.iter().enumerate() {
            at = match self.items[at].children.get(p) {
                Some(&c) if self.items[c].node.is_dir() => c,
                Some(&c) if !is_whiteout(&self.items[c].node) => {
                    return Err(format!(
                        "the path goes through {}, which this layer made {}",
                        shown(&parts[..=i]),
                        kind_name(&self.items[c].node)
                    ));
                }
                found => {
                    let c = self.push(dir_node(), found.is_some());
                    self.items[at].children.insert(p.clone(), c);
                    c
                }
            };
        }
        Ok(at)
    }

    /// The item at `parts`, if any (through directories only).
    fn find(&self, parts: &[Vec<u8>]) -> Option<usize> {
        let mut at = 0;
        for p in parts {
            if !self.items[at].node.is_dir() {
                return None;
            }
            at = *self.items[at].children.get(p)?;
        }
        Some(at)
    }

    /// The root directory's own entry (`./`): its metadata.
    pub fn set_root(&mut self, node: Node) {
        let root = &mut self.items[0].node;
        let kind = std::mem::replace(&mut root.kind, Kind::Fifo);
        *root = Node { kind, ..node };
    }

    /// `.wh..wh..opq` in `parent`.
    pub fn opaque(&mut self, parent: usize) {
        self.items[parent].opaque = true;
        self.stats.opaque_dirs += 1;
    }

    /// `.wh.NAME` in `parent`. Whiteouts apply to the layers below only (OCI image
    /// spec): where this layer already has NAME, that entry hides the lower one and
    /// stays; otherwise NAME becomes a whiteout device.
    pub fn whiteout(&mut self, parent: usize, name: Vec<u8>, mut node: Node) {
        self.stats.whiteouts += 1;
        if self.items[parent].children.contains_key(&name) {
            return;
        }
        let (major, minor) = WHITEOUT_DEVICE;
        node.kind = Kind::CharDevice { major, minor };
        node.perm = 0;
        node.xattrs.clear();
        let id = self.push(node, false);
        self.items[parent].children.insert(name, id);
    }

    /// A hardlink named `name` in `parent` to the earlier non-directory at `target`.
    pub fn link(&mut self, parent: usize, name: Vec<u8>, target: &[Vec<u8>]) -> Result<(), String> {
        let Some(t) = self.find(target) else {
            return Err(format!(
                "hardlink to {:?}, which is not an earlier file",
                shown(target)
            ));
        };
        let node = &self.items[t].node;
        if node.is_dir() || is_whiteout(node) {
            return Err(format!(
                "hardlink to {:?}, which is not an earlier file but {}",
                shown(target),
                kind_name(node)
            ));
        }
        self.check_replace(parent, &name, false)?;
        self.items[parent].children.insert(name, t);
        Ok(())
    }

    /// A non-directory given where this layer already has a directory with entries is
    /// refused: GNU tar fails on it and keeps the directory's files, Python fails, and
    /// containerd removes the whole directory, so there is no one reading of it. (An empty
    /// one is replaced by all that extract it.)
    fn check_replace(&self, parent: usize, name: &[u8], dir: bool) -> Result<(), String> {
        match self.items[parent].children.get(name) {
            Some(&old) if !dir && self.items[old].node.is_dir() => {
                if self.items[old].children.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "{:?} replaces a directory of this layer that has entries (GNU tar keeps them, containerd drops them)",
                        String::from_utf8_lossy(name)
                    ))
                }
            }
            _ => Ok(()),
        }
    }

    /// Any other entry: a path given again takes the later entry (but see
    /// `check_replace`), except that a
    /// directory given again keeps its contents (and stays opaque if it was), and a
    /// directory replacing a whiteout of this layer is opaque (see `dir`).
    pub fn add(&mut self, parent: usize, name: Vec<u8>, node: Node) -> Result<(), String> {
        self.check_replace(parent, &name, node.is_dir())?;
        match self.items[parent].children.get(&name) {
            Some(&old) if node.is_dir() && self.items[old].node.is_dir() => {
                self.items[old].node = node;
            }
            old => {
                let opaque =
                    node.is_dir() && old.is_some_and(|&o| is_whiteout(&self.items[o].node));
                let id = self.push(node, opaque);
                self.items[parent].children.insert(name, id);
            }
        }
        Ok(())
    }

    /// The tree reachable from the root, hardlinks shared, names sorted.
    pub fn into_tree(self) -> Tree {
        let mut tree = Tree::default();
        let mut ids: HashMap<usize, NodeId> = HashMap::new();
        let mut items: Vec<Option<Item>> = self.items.into_iter().map(Some).collect();
        let root = items[0].take().expect("root");
        tree.add(root.node);
        ids.insert(0, Tree::ROOT);
        let mut pending: Vec<(NodeId, BTreeMap<Vec<u8>, usize>)> =
            vec![(Tree::ROOT, root.children)];
        while let Some((id, children)) = pending.pop() {
            let mut list = Vec::with_capacity(children.len());
            for (name, c) in children {
                let cid = match ids.get(&c) {
                    Some(&cid) => cid,
                    None => {
                        let mut item = items[c].take().expect("each item is placed once");
                        if item.opaque {
                            let x = &mut item.node.xattrs;
                            x.retain(|(n, _)| n != OPAQUE_XATTR);
                            x.push((OPAQUE_XATTR.to_vec(), OPAQUE.to_vec()));
                            x.sort();
                        }
                        let cid = tree.add(item.node);
                        ids.insert(c, cid);
                        if tree.nodes[cid].is_dir() {
                            pending.push((cid, item.children));
                        }
                        cid
                    }
                };
                list.push((name, cid));
            }
            tree.nodes[id].kind = Kind::Directory { children: list };
        }
        tree
    }
}
