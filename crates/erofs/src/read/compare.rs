//! Two images compared as the trees they show ([`compare_trees`]): paths, metadata, xattrs,
//! contents and hardlinks; how either was built does not matter.
//!
//! - `b` is trusted, `a` not: both are walked together with an explicit stack, stopping at the
//!   first difference, so `a` costs at most what `b` holds.
//! - A file's bytes are read only once its size matched; a directory reached twice is a
//!   difference.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use super::{child_path, ByteSource, DirEntry, Error, Image, Inode};

/// The first way the trees differ: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// Path of the first differing entry.
    pub path: String,
    /// How it differs.
    pub what: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.what)
    }
}

/// Which image a read failed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// The first image.
    A,
    /// The second image.
    B,
}

/// A read that failed, in which image and at which path: the comparison could not be
/// finished.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {err}")]
pub struct CompareError {
    /// The image the read failed in.
    pub which: Which,
    /// Path being read.
    pub path: String,
    /// The reader's error.
    #[source]
    pub err: Error,
}

/// Bytes of file contents read from each image at a time.
const CHUNK: usize = 128 << 10;

/// The first difference between the trees of `a` and `b`, or `None` when they show the
/// same files.
///
/// Of every path: type, mode, owner, mtime, link count, device number, size, symlink
/// target, xattrs (whiteouts and opaque markers as stored) and contents; hardlinks must link
/// the same paths. Block size, compression, layout, shared xattrs and tails do not matter.
/// `b` is the trusted one (the layer store's rebuild of a layer blob). Directories are
/// listed in lockstep, names strictly sorted in both (checked by `readdir`).
pub fn compare_trees<A: ByteSource, B: ByteSource>(
    a: &Image<A>,
    b: &Image<B>,
) -> Result<Option<Difference>, CompareError> {
    Walk {
        a,
        b,
        links: HashMap::new(),
        back: HashMap::new(),
        dirs_a: HashSet::new(),
        dirs_b: HashSet::new(),
    }
    .run()
}

struct Walk<'x, A: ByteSource, B: ByteSource> {
    a: &'x Image<A>,
    b: &'x Image<B>,
    /// Non-directories met: nid in `a` → nid in `b`, and back, so a hardlink in one must
    /// be the same hardlink in the other.
    links: HashMap<u64, (u64, Vec<u8>)>,
    back: HashMap<u64, u64>,
    dirs_a: HashSet<u64>,
    dirs_b: HashSet<u64>,
}

type Step = Result<Option<Difference>, CompareError>;

fn differ(path: &[u8], what: impl Into<String>) -> Step {
    Ok(Some(Difference {
        path: String::from_utf8_lossy(path).into_owned(),
        what: what.into(),
    }))
}

fn failed(which: Which, path: &[u8]) -> impl FnOnce(Error) -> CompareError + '_ {
    move |err| CompareError {
        which,
        path: String::from_utf8_lossy(path).into_owned(),
        err,
    }
}

/// A directory's entries other than `.` and `..`, in the order stored (strictly sorted).
fn entries<'x, S: ByteSource>(
    img: &'x Image<S>,
    dir: &Inode,
) -> super::Result<impl Iterator<Item = super::Result<DirEntry>> + 'x> {
    Ok(img
        .readdir(dir, 0)?
        .filter(|e| !matches!(e, Ok(e) if e.name == b"." || e.name == b"..")))
}

impl<A: ByteSource, B: ByteSource> Walk<'_, A, B> {
    fn run(mut self) -> Step {
        let path = b"/".to_vec();
        let ia = self
            .a
            .inode(self.a.root_nid())
            .map_err(failed(Which::A, &path))?;
        let ib = self
            .b
            .inode(self.b.root_nid())
            .map_err(failed(Which::B, &path))?;
        let mut stack = vec![(ia, ib, path)];
        while let Some((ia, ib, path)) = stack.pop() {
            if let Some(d) = self.inode(&ia, &ib, &path)? {
                return Ok(Some(d));
            }
            if !ia.is_dir() {
                continue;
            }
            if !self.dirs_a.insert(ia.nid) || !self.dirs_b.insert(ib.nid) {
                return differ(&path, "a directory reached twice");
            }
            let mut ea = entries(self.a, &ia).map_err(failed(Which::A, &path))?;
            let mut eb = entries(self.b, &ib).map_err(failed(Which::B, &path))?;
            let mut children = Vec::new();
            loop {
                let na = ea.next().transpose().map_err(failed(Which::A, &path))?;
                let nb = eb.next().transpose().map_err(failed(Which::B, &path))?;
                // Both lists are sorted: the smaller name is the one the other lacks.
                let (na, nb) = match (na, nb) {
                    (None, None) => break,
                    (Some(na), Some(nb)) if na.name == nb.name => (na, nb),
                    (Some(na), Some(nb)) if nb.name < na.name => {
                        return differ(&child_path(&path, &nb.name), "only in the second tree")
                    }
                    (Some(na), _) => {
                        return differ(&child_path(&path, &na.name), "only in the first tree")
                    }
                    (None, Some(nb)) => {
                        return differ(&child_path(&path, &nb.name), "only in the second tree")
                    }
                };
                let child = child_path(&path, &na.name);
                let ca = self.a.inode(na.nid).map_err(failed(Which::A, &child))?;
                let cb = self.b.inode(nb.nid).map_err(failed(Which::B, &child))?;
                children.push((ca, cb, child));
            }
            // Popped in name order: the first difference is the first in path order.
            stack.extend(children.into_iter().rev());
        }
        Ok(None)
    }

    /// The differences of one pair of inodes at `path`, short of a directory's entries.
    fn inode(&mut self, ia: &Inode, ib: &Inode, path: &[u8]) -> Step {
        let fields: [(&str, String, String); 6] = [
            ("mode", format!("{:o}", ia.mode), format!("{:o}", ib.mode)),
            ("uid", ia.uid.to_string(), ib.uid.to_string()),
            ("gid", ia.gid.to_string(), ib.gid.to_string()),
            (
                "mtime",
                format!("{}.{:09}", ia.mtime, ia.mtime_nsec),
                format!("{}.{:09}", ib.mtime, ib.mtime_nsec),
            ),
            ("link count", ia.nlink.to_string(), ib.nlink.to_string()),
            (
                "device number",
                format!("{}:{}", ia.rdev.0, ia.rdev.1),
                format!("{}:{}", ib.rdev.0, ib.rdev.1),
            ),
        ];
        for (what, x, y) in fields {
            if x != y {
                return differ(path, format!("{what} {x}, not {y}"));
            }
        }
        // A directory's size is its dirent blocks': the builder's choice.
        if !ia.is_dir() && ia.size != ib.size {
            return differ(path, format!("size {}, not {}", ia.size, ib.size));
        }
        let mut xa = self.a.xattrs(ia).map_err(failed(Which::A, path))?;
        let mut xb = self.b.xattrs(ib).map_err(failed(Which::B, path))?;
        xa.sort();
        xb.sort();
        if xa != xb {
            let name = |x: &[(Vec<u8>, Vec<u8>)]| -> Vec<String> {
                x.iter()
                    .map(|(n, _)| String::from_utf8_lossy(n).into_owned())
                    .collect()
            };
            return differ(
                path,
                format!(
                    "xattrs {:?}, not {:?} (or their values)",
                    name(&xa),
                    name(&xb)
                ),
            );
        }
        if ia.is_dir() {
            return Ok(None);
        }
        // A non-directory met before (a hardlink) must be the same one in both trees.
        match (self.links.entry(ia.nid), self.back.entry(ib.nid)) {
            (Entry::Vacant(la), Entry::Vacant(lb)) => {
                la.insert((ib.nid, path.to_vec()));
                lb.insert(ia.nid);
            }
            (Entry::Occupied(la), _) if la.get().0 == ib.nid => return Ok(None),
            (Entry::Occupied(la), _) => {
                let first = String::from_utf8_lossy(&la.get().1).into_owned();
                return differ(
                    path,
                    format!("a hardlink of {first} in the first tree only"),
                );
            }
            (Entry::Vacant(_), Entry::Occupied(_)) => {
                return differ(path, "a hardlink of another path in the second tree only")
            }
        }
        if ia.is_symlink() {
            let ta = self.a.readlink(ia).map_err(failed(Which::A, path))?;
            let tb = self.b.readlink(ib).map_err(failed(Which::B, path))?;
            if ta != tb {
                return differ(
                    path,
                    format!(
                        "symlink to {:?}, not {:?}",
                        String::from_utf8_lossy(&ta),
                        String::from_utf8_lossy(&tb)
                    ),
                );
            }
        }
        if ia.is_reg() {
            return self.contents(ia, ib, path);
        }
        Ok(None)
    }

    /// Two regular files of the same size: the first byte where their contents differ.
    fn contents(&self, ia: &Inode, ib: &Inode, path: &[u8]) -> Step {
        let (mut ba, mut bb) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
        let mut at = 0u64;
        while at < ib.size {
            let want = (ib.size - at).min(CHUNK as u64) as usize;
            let na = self
                .a
                .read(ia, at, &mut ba[..want])
                .map_err(failed(Which::A, path))?;
            let nb = self
                .b
                .read(ib, at, &mut bb[..want])
                .map_err(failed(Which::B, path))?;
            // `read` is short only at the end of the file, and both sizes are `ib.size`.
            if na != want || nb != want {
                return differ(path, format!("contents end early at byte {at}"));
            }
            if let Some(i) = ba[..want].iter().zip(&bb[..want]).position(|(x, y)| x != y) {
                return differ(path, format!("contents differ at byte {}", at + i as u64));
            }
            at += want as u64;
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{self, BuildOptions, Content, Kind, Node, Tree};
    use crate::read::FileSource;

    fn node(kind: Kind, perm: u16, size: u64) -> Node {
        Node {
            kind,
            perm,
            uid: 0,
            gid: 0,
            mtime: 1_700_000_000,
            mtime_nsec: 5,
            size,
            xattrs: Vec::new(),
        }
    }

    fn file(bytes: &[u8]) -> Node {
        let content = Content::Bytes(bytes.to_vec());
        node(
            Kind::Regular {
                content,
                extents: None,
            },
            0o644,
            bytes.len() as u64,
        )
    }

    /// A small layer: /etc/msg, a hardlink to it, a symlink, a whiteout (char 0:0), an
    /// opaque directory, and a file of several chunks.
    fn layer() -> Tree {
        let mut t = Tree::default();
        let dir = |children| node(Kind::Directory { children }, 0o755, 0);
        t.add(dir(Vec::new()));
        let msg = t.add(file(b"genuine\n"));
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let big = t.add(file(&big));
        let link = t.add(node(
            Kind::Symlink {
                target: b"msg".to_vec(),
            },
            0o777,
            3,
        ));
        let gone = t.add(node(Kind::CharDevice { major: 0, minor: 0 }, 0, 0));
        let mut opaque = dir(vec![(b"gone".to_vec(), gone)]);
        opaque.xattrs = vec![(b"trusted.overlay.opaque".to_vec(), b"y".to_vec())];
        let opaque = t.add(opaque);
        let etc = t.add(dir(vec![
            (b"big".to_vec(), big),
            (b"link".to_vec(), link),
            (b"msg".to_vec(), msg),
            (b"msg2".to_vec(), msg),
        ]));
        t.nodes[0].kind = Kind::Directory {
            children: vec![(b"etc".to_vec(), etc), (b"var".to_vec(), opaque)],
        };
        sort_children(&mut t);
        t
    }

    /// Children by name, as a scan lists them.
    fn sort_children(t: &mut Tree) {
        for n in &mut t.nodes {
            if let Kind::Directory { children } = &mut n.kind {
                children.sort();
            }
        }
    }

    fn image(
        t: &Tree,
        opts: &BuildOptions,
        dir: &std::path::Path,
        name: &str,
    ) -> Image<FileSource> {
        let path = dir.join(name);
        builder::build_tree(t, opts, &path, &builder::Silent).unwrap();
        Image::open(FileSource::open(&path).unwrap()).unwrap()
    }

    fn differs(t: &Tree, change: impl FnOnce(&mut Tree)) -> Option<Difference> {
        let d = tempfile::tempdir().unwrap();
        let mut other = t.clone();
        change(&mut other);
        let a = image(&other, &BuildOptions::default(), d.path(), "a");
        let b = image(t, &BuildOptions::default(), d.path(), "b");
        compare_trees(&a, &b).unwrap()
    }

    fn id(t: &Tree, path: &[u8]) -> usize {
        let mut at = Tree::ROOT;
        for part in path.split(|&c| c == b'/').filter(|p| !p.is_empty()) {
            at = t
                .children(at)
                .iter()
                .find(|(n, _)| n == part)
                .map(|(_, c)| *c)
                .unwrap();
        }
        at
    }

    #[test]
    fn the_same_tree_built_two_ways_is_the_same() {
        let d = tempfile::tempdir().unwrap();
        let t = layer();
        let plain = BuildOptions::default();
        let other = BuildOptions {
            block_size: 1024,
            xattr_filter: false,
            long_prefixes: false,
            inline_data: false,
            verity: false,
            build_time: 12345,
            compression: Some(builder::compress::Settings {
                compression: "lz4hc".parse().unwrap(),
                pcluster: 16384,
            }),
            ..BuildOptions::default()
        };
        let a = image(&t, &plain, d.path(), "a");
        let b = image(&t, &other, d.path(), "b");
        assert_eq!(compare_trees(&a, &b).unwrap(), None);
        assert_eq!(compare_trees(&b, &a).unwrap(), None);
    }

    #[test]
    fn each_difference_is_named_by_its_path() {
        let t = layer();
        let at = |path: &str, what: &str| (path.to_string(), what.to_string());
        let got = |d: Option<Difference>| {
            let d = d.expect("a difference");
            (d.path, d.what)
        };
        let msg = id(&t, b"/etc/msg");
        let big = id(&t, b"/etc/big");
        let var = id(&t, b"/var");
        let gone = id(&t, b"/var/gone");
        let link = id(&t, b"/etc/link");
        let etc = id(&t, b"/etc");

        let d = differs(&t, |t| {
            t.nodes[msg].kind = Kind::Regular {
                content: Content::Bytes(b"attack\n".to_vec()),
                extents: None,
            };
            t.nodes[msg].size = 7;
        });
        assert_eq!(got(d), at("/etc/msg", "size 7, not 8"));
        let d = differs(&t, |t| {
            t.nodes[msg].kind = Kind::Regular {
                content: Content::Bytes(b"attack!\n".to_vec()),
                extents: None,
            };
        });
        assert_eq!(got(d), at("/etc/msg", "contents differ at byte 0"));
        let d = differs(&t, |t| {
            let mut bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            bytes[200_000] ^= 1;
            t.nodes[big].kind = Kind::Regular {
                content: Content::Bytes(bytes),
                extents: None,
            };
        });
        assert_eq!(got(d), at("/etc/big", "contents differ at byte 200000"));
        let d = differs(&t, |t| t.nodes[msg].perm = 0o4755);
        assert_eq!(got(d), at("/etc/msg", "mode 104755, not 100644"));
        let d = differs(&t, |t| t.nodes[msg].uid = 1000);
        assert_eq!(got(d), at("/etc/msg", "uid 1000, not 0"));
        let d = differs(&t, |t| t.nodes[etc].gid = 5);
        assert_eq!(got(d), at("/etc", "gid 5, not 0"));
        let d = differs(&t, |t| t.nodes[msg].mtime_nsec = 6);
        assert_eq!(
            got(d),
            at(
                "/etc/msg",
                "mtime 1700000000.000000006, not 1700000000.000000005"
            )
        );
        let d = differs(&t, |t| {
            t.nodes[gone].kind = Kind::CharDevice { major: 1, minor: 3 }
        });
        assert_eq!(got(d), at("/var/gone", "device number 1:3, not 0:0"));
        // A whiteout as an empty file with overlayfs's xattr is not a 0:0 device.
        let d = differs(&t, |t| {
            t.nodes[gone] = file(b"");
            t.nodes[gone].perm = 0;
            t.nodes[gone].xattrs = vec![(b"trusted.overlay.whiteout".to_vec(), Vec::new())];
        });
        assert_eq!(got(d), at("/var/gone", "mode 100000, not 20000"));
        // The opaque marker lost, or a redirect added.
        let d = differs(&t, |t| t.nodes[var].xattrs.clear());
        assert!(got(d).1.starts_with("xattrs []"));
        let d = differs(&t, |t| {
            t.nodes[msg]
                .xattrs
                .push((b"security.capability".to_vec(), b"\x01".to_vec()))
        });
        assert_eq!(got(d).0, "/etc/msg");
        let d = differs(&t, |t| {
            t.nodes[var].xattrs[0].1 = b"x".to_vec();
        });
        assert_eq!(got(d).0, "/var");
        let d = differs(&t, |t| {
            t.nodes[link].kind = Kind::Symlink {
                target: b"big".to_vec(),
            }
        });
        assert_eq!(got(d), at("/etc/link", "symlink to \"big\", not \"msg\""));
        // A name added, or taken away.
        let d = differs(&t, |t| {
            let extra = t.add(file(b"x"));
            if let Kind::Directory { children } = &mut t.nodes[etc].kind {
                children.push((b"extra".to_vec(), extra));
                children.sort();
            }
        });
        assert_eq!(got(d), at("/etc/extra", "only in the first tree"));
        let d = differs(&t, |t| {
            if let Kind::Directory { children } = &mut t.nodes[etc].kind {
                children.retain(|(n, _)| n != b"link");
            }
        });
        assert_eq!(got(d), at("/etc/link", "only in the second tree"));
        // The same contents, but the hardlink broken into two files.
        let d = differs(&t, |t| {
            let copy = t.add(file(b"genuine\n"));
            if let Kind::Directory { children } = &mut t.nodes[etc].kind {
                children.iter_mut().find(|(n, _)| n == b"msg2").unwrap().1 = copy;
            }
        });
        let (path, what) = got(d);
        assert!(path.starts_with("/etc/msg"), "{path}: {what}");
        assert!(what.starts_with("link count"), "{path}: {what}");
    }
}
