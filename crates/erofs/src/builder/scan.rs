//! Reads a host directory into a [`Tree`]: metadata, xattrs, hardlinks and sparse extents.
//! File contents are not read here; the writer streams them later.

use super::tree::{Content, Kind, Node, NodeId, Tree};
use super::Error;
use rayon::prelude::*;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// (full name, value) pairs.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Decides whether a path (relative to the source root, `/`-separated, no leading `/`)
/// is left out of the image, with everything below it.
pub type ExcludeFn<'a> = dyn Fn(&[u8]) -> bool + Sync + 'a;

/// What the scan reports besides the tree.
pub struct ScanStats {
    /// Xattrs the kernel could not serve (no EROFS handler for their namespace), skipped.
    pub skipped_xattrs: Vec<String>,
}

/// One directory entry read from the host, before it becomes a node.
struct Scanned {
    name: Vec<u8>,
    path: PathBuf,
    rel: Vec<u8>,
    meta: Metadata,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    extents: Option<Vec<(u64, u64)>>,
    target: Vec<u8>,
    skipped: Vec<String>,
}

/// Reads the directory `root` into a tree, calling `on_node` once per entry read.
pub fn scan_dir(
    root: &Path,
    exclude: &ExcludeFn<'_>,
    on_node: &(dyn Fn() + Sync),
) -> Result<(Tree, ScanStats), Error> {
    let meta = fs::symlink_metadata(root).map_err(|e| Error::source(root, e))?;
    if !meta.is_dir() {
        return Err(Error::Input(format!("{}: not a directory", root.display())));
    }
    let mut stats = ScanStats {
        skipped_xattrs: Vec::new(),
    };
    let mut tree = Tree::default();
    let (xattrs, skipped) = read_xattrs(root)?;
    stats.skipped_xattrs.extend(skipped);
    tree.add(node_from(
        &meta,
        Kind::Directory {
            children: Vec::new(),
        },
        xattrs,
    ));
    on_node();

    let mut hardlinks: HashMap<(u64, u64), NodeId> = HashMap::new();
    // Level by level, breadth-first: the directories of one level are read in parallel
    // (on a cold cache this is where the build waits for the disk), then numbered in
    // sorted order on one thread, so the tree never depends on timing or readdir order.
    let mut level = vec![(root.to_path_buf(), Vec::new(), Tree::ROOT)];
    while !level.is_empty() {
        let listed: Vec<Vec<Scanned>> = level
            .par_iter()
            .map(|(dir, rel, _)| {
                let entries = list_dir(dir, rel, exclude)?;
                entries
                    .into_iter()
                    .map(|(path, name, rel)| scan_entry(path, &name, rel))
                    .collect()
            })
            .collect::<Result<_, Error>>()?;
        let mut next = Vec::new();
        for ((_, _, id), scanned) in level.iter().zip(listed) {
            let mut children = Vec::with_capacity(scanned.len());
            for s in scanned {
                on_node();
                stats.skipped_xattrs.extend(s.skipped.iter().cloned());
                let meta = &s.meta;
                let ft = meta.file_type();
                if !ft.is_dir() && meta.nlink() > 1 {
                    if let Some(&existing) = hardlinks.get(&(meta.dev(), meta.ino())) {
                        children.push((s.name, existing));
                        continue;
                    }
                }
                let kind = node_kind(&s)?;
                let child = tree.add(node_from(meta, kind, s.xattrs));
                if ft.is_dir() {
                    next.push((s.path, s.rel, child));
                } else if meta.nlink() > 1 {
                    hardlinks.insert((meta.dev(), meta.ino()), child);
                }
                children.push((s.name, child));
            }
            if let Kind::Directory { children: c } = &mut tree.nodes[*id].kind {
                *c = children;
            }
        }
        level = next;
    }
    Ok((tree, stats))
}

/// A directory's entries, sorted by name, without the excluded ones.
fn list_dir(
    dir: &Path,
    rel: &[u8],
    exclude: &ExcludeFn<'_>,
) -> Result<Vec<(PathBuf, OsString, Vec<u8>)>, Error> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::source(dir, e))? {
        let entry = entry.map_err(|e| Error::source(dir, e))?;
        names.push(entry.file_name());
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names
        .into_iter()
        .filter_map(|name| {
            let r = join_rel(rel, &name);
            (!exclude(&r)).then(|| (dir.join(&name), name, r))
        })
        .collect())
}

fn node_kind(s: &Scanned) -> Result<Kind, Error> {
    let ft = s.meta.file_type();
    Ok(if ft.is_dir() {
        Kind::Directory {
            children: Vec::new(),
        }
    } else if ft.is_file() {
        Kind::Regular {
            content: Content::File(s.path.clone()),
            extents: s.extents.clone(),
        }
    } else if ft.is_symlink() {
        Kind::Symlink {
            target: s.target.clone(),
        }
    } else if ft.is_char_device() || ft.is_block_device() {
        let (major, minor) = split_dev(s.meta.rdev());
        if major > 0xFFF || minor > 0xFFFFF {
            return Err(Error::Input(format!(
                "{}: device number {major}:{minor} does not fit EROFS's 12:20 bits",
                s.path.display()
            )));
        }
        if ft.is_char_device() {
            Kind::CharDevice { major, minor }
        } else {
            Kind::BlockDevice { major, minor }
        }
    } else if ft.is_fifo() {
        Kind::Fifo
    } else if ft.is_socket() {
        Kind::Socket
    } else {
        return Err(Error::Input(format!(
            "{}: unknown file type",
            s.path.display()
        )));
    })
}

fn join_rel(parent: &[u8], name: &OsStr) -> Vec<u8> {
    let mut rel = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        rel.extend_from_slice(parent);
        rel.push(b'/');
    }
    rel.extend_from_slice(name.as_bytes());
    rel
}

fn scan_entry(path: PathBuf, name: &OsStr, rel: Vec<u8>) -> Result<Scanned, Error> {
    let name = name.as_bytes().to_vec();
    if name.len() > crate::format::NAME_LEN {
        return Err(Error::Input(format!(
            "{}: name longer than 255 bytes",
            path.display()
        )));
    }
    let meta = fs::symlink_metadata(&path).map_err(|e| Error::source(&path, e))?;
    let (xattrs, skipped) = read_xattrs(&path)?;
    let mut extents = None;
    let mut target = Vec::new();
    let ft = meta.file_type();
    if ft.is_file() && meta.blocks() * 512 < meta.size() {
        // Fewer allocated bytes than the size: the file may have holes worth keeping.
        extents = data_extents(&path, meta.size())?;
    } else if ft.is_symlink() {
        target = fs::read_link(&path)
            .map_err(|e| Error::source(&path, e))?
            .as_os_str()
            .as_bytes()
            .to_vec();
        // The kernel reads symlinks through one page and stops at 4095 bytes.
        if target.len() > 4095 {
            return Err(Error::Input(format!(
                "{}: symlink target of {} bytes exceeds 4095",
                path.display(),
                target.len()
            )));
        }
    }
    Ok(Scanned {
        name,
        path,
        rel,
        meta,
        xattrs,
        extents,
        target,
        skipped,
    })
}

fn node_from(meta: &Metadata, kind: Kind, xattrs: Vec<(Vec<u8>, Vec<u8>)>) -> Node {
    let size = match &kind {
        Kind::Regular { .. } => meta.size(),
        Kind::Symlink { target } => target.len() as u64,
        _ => 0,
    };
    Node {
        kind,
        perm: (meta.mode() & 0o7777) as u16,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime: meta.mtime(),
        mtime_nsec: meta.mtime_nsec() as u32,
        size,
        xattrs,
    }
}

/// glibc's `gnu_dev_major`/`gnu_dev_minor`.
fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xFFF) | ((dev >> 32) & !0xFFF);
    let minor = (dev & 0xFF) | ((dev >> 12) & !0xFF);
    (major as u32, minor as u32)
}

/// All xattrs of a path (not following symlinks), sorted by name. Names in namespaces the
/// kernel's EROFS cannot serve are returned separately so the caller can warn.
pub fn read_xattrs(path: &Path) -> Result<(Xattrs, Vec<String>), Error> {
    use rustix::io::Errno;
    let mut list = vec![0u8; 1024];
    let len = loop {
        match rustix::fs::llistxattr(path, &mut list) {
            Ok(n) => break n,
            Err(Errno::RANGE) => {
                let need = rustix::fs::llistxattr(path, &mut [])
                    .map_err(|e| Error::source(path, e.into()))?;
                list.resize(need.max(list.len() * 2), 0);
            }
            Err(Errno::NOTSUP) => return Ok((Vec::new(), Vec::new())),
            Err(e) => return Err(Error::source(path, e.into())),
        }
    };
    let mut xattrs = Vec::new();
    let mut skipped = Vec::new();
    for name in list[..len].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if crate::format::split_xattr_name(name).is_none() {
            skipped.push(format!(
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(name)
            ));
            continue;
        }
        let mut value = vec![0u8; 256];
        let cname =
            std::ffi::CString::new(name).map_err(|_| Error::Input("xattr name with NUL".into()))?;
        let n = loop {
            match rustix::fs::lgetxattr(path, cname.as_c_str(), &mut value) {
                Ok(n) => break n,
                Err(Errno::RANGE) => {
                    let need = rustix::fs::lgetxattr(path, cname.as_c_str(), &mut [])
                        .map_err(|e| Error::source(path, e.into()))?;
                    value.resize(need.max(value.len() * 2), 0);
                }
                // Removed between list and get: it is simply not there.
                Err(Errno::NODATA) => break usize::MAX,
                Err(e) => return Err(Error::source(path, e.into())),
            }
        };
        if n == usize::MAX {
            continue;
        }
        if n > u16::MAX as usize {
            return Err(Error::Input(format!(
                "{}: xattr {} value of {n} bytes exceeds EROFS's 65535",
                path.display(),
                String::from_utf8_lossy(name)
            )));
        }
        value.truncate(n);
        xattrs.push((name.to_vec(), value));
    }
    xattrs.sort();
    Ok((xattrs, skipped))
}

/// Data extents of a sparse file via SEEK_DATA/SEEK_HOLE, or `None` if it has no holes.
fn data_extents(path: &Path, size: u64) -> Result<Option<Vec<(u64, u64)>>, Error> {
    use rustix::fs::SeekFrom;
    let file = fs::File::open(path).map_err(|e| Error::source(path, e))?;
    let mut extents = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let start = match rustix::fs::seek(&file, SeekFrom::Data(pos as i64)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(Error::source(path, e.into())),
        };
        if start >= size {
            break;
        }
        let end = rustix::fs::seek(&file, SeekFrom::Hole(start as i64))
            .map_err(|e| Error::source(path, e.into()))?;
        let end = end.min(size);
        if end <= start {
            break;
        }
        extents.push((start, end));
        pos = end;
    }
    if extents.len() == 1 && extents[0] == (0, size) {
        return Ok(None);
    }
    Ok(Some(extents))
}
