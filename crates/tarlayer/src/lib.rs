//! A container layer tarball (plain, gzip or zstd; OCI and Docker layouts) read into an
//! image tree that stacks the way the layer means it to.
//!
//! The layer's deletions become what overlayfs reads in a lower layer:
//! - `.wh.NAME` (NAME deleted from the layers below) becomes a character device 0/0 named
//!   NAME;
//! - `.wh..wh..opq` in a directory (nothing below shows through) becomes
//!   `trusted.overlay.opaque = y` on that directory.
//!
//! Entries keep their mode, owner, nanosecond mtime (PAX), xattrs (PAX `SCHILY.xattr.*`,
//! ACLs included), hardlinks, symlinks, devices and FIFOs. A path given twice takes the
//! later entry (a directory given twice keeps its contents); parents missing from the tar
//! are made as root-owned 0755 directories. File contents are copied once, into one
//! unlinked spill file in `spill_dir`, and read from there when the image is written.

use erofs::build::{Content, Kind, Node, NodeId, Tree};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::Arc;

pub const WHITEOUT_PREFIX: &[u8] = b".wh.";
pub const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
pub const OPAQUE_XATTR: &[u8] = b"trusted.overlay.opaque";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {err}")]
    Io {
        path: String,
        #[source]
        err: std::io::Error,
    },
    /// A malformed or hostile entry: names the tar and the entry's header offset (in the
    /// uncompressed stream).
    #[error("{path}: entry at byte {offset}: {what}")]
    Entry {
        path: String,
        offset: u64,
        what: String,
    },
    /// The archive itself is broken after `entries` good entries.
    #[error("{path}: after {entries} entries: {what}")]
    Archive {
        path: String,
        entries: u64,
        what: String,
    },
}

/// What a layer held, besides its tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub entries: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Xattrs left out because EROFS has no namespace for them.
    pub skipped_xattrs: Vec<String>,
}

/// How the tar is compressed, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

pub fn detect(magic: &[u8]) -> Compression {
    if magic.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// Whether `path` looks like a tar (any compression): what `verilay build` checks to tell
/// a layer from a directory.
pub fn is_archive(path: &Path) -> bool {
    let Ok(mut f) = File::open(path) else {
        return false;
    };
    let mut head = [0u8; 512];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    match detect(&head[..n]) {
        Compression::None => n == 512 && &head[257..262] == b"ustar",
        _ => true,
    }
}

/// One node while the layer is read: directories keep their children by name.
struct Item {
    node: Node,
    children: BTreeMap<Vec<u8>, usize>,
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

struct Reader {
    items: Vec<Item>,
    spill: Arc<File>,
    spill_len: u64,
    stats: Stats,
    path: String,
}

impl Reader {
    fn bad(&self, offset: u64, what: impl Into<String>) -> Error {
        Error::Entry {
            path: self.path.clone(),
            offset,
            what: what.into(),
        }
    }

    /// The components of an archive path: `./` and empty parts dropped; `..` refused.
    fn components(&self, raw: &[u8], offset: u64) -> Result<Vec<Vec<u8>>, Error> {
        let mut out = Vec::new();
        for c in raw.split(|&b| b == b'/') {
            match c {
                b"" | b"." => {}
                b".." => return Err(self.bad(offset, "path climbs out with \"..\"")),
                c if c.len() > 255 || c.contains(&0) => {
                    return Err(self.bad(offset, "path has an invalid name"))
                }
                c => out.push(c.to_vec()),
            }
        }
        Ok(out)
    }

    /// The directory at `parts`, made (root-owned, 0755) where missing; a non-directory in
    /// the way is replaced, as a later tar entry would.
    fn dir(&mut self, parts: &[Vec<u8>]) -> usize {
        let mut at = 0;
        for p in parts {
            let next = match self.items[at].children.get(p) {
                Some(&c) if self.items[c].node.is_dir() => c,
                _ => {
                    self.items.push(Item {
                        node: dir_node(),
                        children: BTreeMap::new(),
                    });
                    let c = self.items.len() - 1;
                    self.items[at].children.insert(p.clone(), c);
                    c
                }
            };
            at = next;
        }
        at
    }

    /// The item at `parts`, if any.
    fn find(&self, parts: &[Vec<u8>]) -> Option<usize> {
        let mut at = 0;
        for p in parts {
            at = *self.items[at].children.get(p)?;
        }
        Some(at)
    }

    /// Adds one entry, with the PAX records and GNU long names that came before it.
    fn add<R: Read>(&mut self, mut entry: tar::Entry<'_, R>, ext: Extended) -> Result<(), Error> {
        let offset = entry.raw_header_position();
        self.stats.entries += 1;
        let pax = |key: &[u8]| ext.pax.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v);
        let raw_path = match (pax(b"path"), &ext.long_name) {
            (Some(p), _) | (None, Some(p)) => p.clone(),
            _ => entry.header().path_bytes().into_owned(),
        };
        let link_name = match (pax(b"linkpath"), &ext.long_link) {
            (Some(p), _) | (None, Some(p)) => Some(p.clone()),
            _ => entry.header().link_name_bytes().map(|l| l.into_owned()),
        };
        if let Some(size) = pax(b"size") {
            if std::str::from_utf8(size)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                != Some(entry.size())
            {
                return Err(self.bad(
                    offset,
                    "PAX size records (files over 8 GiB) are not supported",
                ));
            }
        }
        let parts = self.components(&raw_path, offset)?;
        let h = entry.header().clone();
        let ty = h.entry_type();
        let path = self.path.clone();
        let io = move |e: std::io::Error| Error::Entry {
            path: path.clone(),
            offset,
            what: e.to_string(),
        };
        let mut xattrs = Vec::new();
        let mut mtime_nsec = 0u32;
        let mut mtime = h.mtime().map_err(&io)? as i64;
        for (key, value) in &ext.pax {
            if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                if erofs::format::split_xattr_name(name).is_none() {
                    self.stats
                        .skipped_xattrs
                        .push(String::from_utf8_lossy(name).into_owned());
                    continue;
                }
                xattrs.push((name.to_vec(), value.clone()));
            } else if key == b"mtime" {
                (mtime, mtime_nsec) = parse_pax_time(value)
                    .ok_or_else(|| self.bad(offset, "unreadable PAX mtime"))?;
            } else if key.starts_with(b"GNU.sparse.") {
                return Err(self.bad(offset, "sparse entries (tar -S) are not supported"));
            }
        }
        xattrs.sort();
        xattrs.dedup_by(|a, b| a.0 == b.0);

        let Some((name, parent_parts)) = parts.split_last() else {
            // The root itself ("./"): its metadata only.
            let root = &mut self.items[0].node;
            if ty.is_dir() {
                root.perm = (h.mode().map_err(&io)? & 0o7777) as u16;
                root.uid = h.uid().map_err(&io)? as u32;
                root.gid = h.gid().map_err(&io)? as u32;
                (root.mtime, root.mtime_nsec) = (mtime, mtime_nsec);
                root.xattrs = xattrs;
            }
            return Ok(());
        };
        let parent = self.dir(parent_parts);

        if name.as_slice() == OPAQUE_MARKER {
            let node = &mut self.items[parent].node;
            node.xattrs.retain(|(n, _)| n != OPAQUE_XATTR);
            node.xattrs.push((OPAQUE_XATTR.to_vec(), b"y".to_vec()));
            node.xattrs.sort();
            self.stats.opaque_dirs += 1;
            return Ok(());
        }
        let mut node = Node {
            kind: Kind::Fifo,
            perm: (h.mode().map_err(&io)? & 0o7777) as u16,
            uid: h.uid().map_err(&io)? as u32,
            gid: h.gid().map_err(&io)? as u32,
            mtime,
            mtime_nsec,
            size: 0,
            xattrs,
        };
        let (name, whiteout) = match name.strip_prefix(WHITEOUT_PREFIX) {
            Some(hidden) if !hidden.is_empty() => (hidden.to_vec(), true),
            _ => (name.clone(), false),
        };
        if whiteout {
            // As container tools write it in an overlayfs upper directory.
            self.stats.whiteouts += 1;
            node.kind = Kind::CharDevice { major: 0, minor: 0 };
            node.perm = 0;
            node.xattrs.clear();
        } else {
            use tar::EntryType as T;
            node.kind = match ty {
                T::GNUSparse => {
                    return Err(self.bad(offset, "sparse entries (tar -S) are not supported"))
                }
                T::Regular | T::Continuous => {
                    let size = entry.size();
                    let start = self.spill_len;
                    let copied = std::io::copy(&mut entry, &mut &*self.spill)
                        .map_err(|e| self.bad(offset, format!("reading the contents: {e}")))?;
                    if copied != size {
                        return Err(self.bad(offset, "archive ends inside this file"));
                    }
                    self.spill_len += size;
                    self.stats.bytes += size;
                    node.size = size;
                    Kind::Regular {
                        content: Content::Span {
                            file: self.spill.clone(),
                            offset: start,
                        },
                        extents: None,
                    }
                }
                T::Directory => Kind::Directory {
                    children: Vec::new(),
                },
                T::Symlink => {
                    let target =
                        link_name.ok_or_else(|| self.bad(offset, "symlink without a target"))?;
                    if target.is_empty() || target.len() > 4095 {
                        return Err(self.bad(offset, "symlink target is empty or too long"));
                    }
                    node.size = target.len() as u64;
                    Kind::Symlink { target }
                }
                T::Link => {
                    let target =
                        link_name.ok_or_else(|| self.bad(offset, "hardlink without a target"))?;
                    let tparts = self.components(&target, offset)?;
                    let Some(t) = self.find(&tparts).filter(|&t| !self.items[t].node.is_dir())
                    else {
                        return Err(self.bad(
                            offset,
                            format!(
                                "hardlink to {:?}, which is not an earlier file",
                                String::from_utf8_lossy(&target)
                            ),
                        ));
                    };
                    self.items[parent].children.insert(name, t);
                    return Ok(());
                }
                T::Char | T::Block => {
                    let major = h.device_major().map_err(&io)?.unwrap_or(0);
                    let minor = h.device_minor().map_err(&io)?.unwrap_or(0);
                    if major > 0xFFF || minor > 0xFFFFF {
                        return Err(self.bad(offset, "device number too large for EROFS"));
                    }
                    if ty == T::Char {
                        Kind::CharDevice { major, minor }
                    } else {
                        Kind::BlockDevice { major, minor }
                    }
                }
                T::Fifo => Kind::Fifo,
                other => return Err(self.bad(offset, format!("unsupported entry type {other:?}"))),
            };
        }
        match self.items[parent].children.get(&name) {
            // A directory given again: new metadata, same contents.
            Some(&old) if node.is_dir() && self.items[old].node.is_dir() => {
                self.items[old].node = node;
            }
            _ => {
                self.items.push(Item {
                    node,
                    children: BTreeMap::new(),
                });
                let id = self.items.len() - 1;
                self.items[parent].children.insert(name, id);
            }
        }
        Ok(())
    }

    /// The tree reachable from the root, hardlinks shared, names sorted.
    fn into_tree(self) -> Tree {
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
                        let item = items[c].take().expect("each item is placed once");
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

/// What extension headers said about the next entry.
#[derive(Default)]
struct Extended {
    pax: Vec<(Vec<u8>, Vec<u8>)>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
}

/// PAX records, `LEN KEY=VALUE\n` each, LEN counting the whole record. Values may hold
/// any byte, newlines included (GNU tar's textual ACLs do), so records are cut by length.
fn parse_pax(mut data: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    while !data.is_empty() && data[0] != 0 {
        let sp = data.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&data[..sp]).ok()?.parse().ok()?;
        if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
            return None;
        }
        let kv = &data[sp + 1..len - 1];
        let eq = kv.iter().position(|&b| b == b'=')?;
        out.push((kv[..eq].to_vec(), kv[eq + 1..].to_vec()));
        data = &data[len..];
    }
    Some(out)
}

/// PAX time: `SECONDS[.FRACTION]`, possibly negative.
fn parse_pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = secs.parse().ok()?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nsec: u32 = digits.parse().ok()?;
    if secs < 0 && nsec > 0 {
        // -1.5 means 1.5 s before the epoch: -2 s + 0.5 s.
        return Some((secs - 1, 1_000_000_000 - nsec));
    }
    Some((secs, nsec))
}

/// Reads the layer at `path` (tar, .tar.gz or .tar.zst, told apart by content) into a
/// tree, copying file contents into an unlinked file in `spill_dir`. `progress` is called
/// with the number of entries read, every 1024 entries.
pub fn read_layer(
    path: &Path,
    spill_dir: &Path,
    progress: &dyn Fn(u64),
) -> Result<(Tree, Stats), Error> {
    let name = path.display().to_string();
    let file = File::open(path).map_err(|err| Error::Io {
        path: name.clone(),
        err,
    })?;
    read_from(file, &name, spill_dir, progress)
}

/// [`read_layer`] from any reader; `name` is what errors call it.
pub fn read_from<R: Read>(
    input: R,
    name: &str,
    spill_dir: &Path,
    progress: &dyn Fn(u64),
) -> Result<(Tree, Stats), Error> {
    let name = name.to_string();
    let ioerr = |err| Error::Io {
        path: name.clone(),
        err,
    };
    let mut input = BufReader::with_capacity(1 << 16, input);
    let magic = input.fill_buf().map_err(ioerr)?;
    let input: Box<dyn Read + '_> = match detect(magic) {
        Compression::None => Box::new(input),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(input)),
        Compression::Zstd => Box::new(zstd::Decoder::with_buffer(input).map_err(ioerr)?),
    };
    let spill = tempfile::tempfile_in(spill_dir).map_err(|err| Error::Io {
        path: spill_dir.display().to_string(),
        err,
    })?;
    let mut r = Reader {
        items: vec![Item {
            node: dir_node(),
            children: BTreeMap::new(),
        }],
        spill: Arc::new(spill),
        spill_len: 0,
        stats: Stats::default(),
        path: name.clone(),
    };
    let mut archive = tar::Archive::new(input);
    // Raw: extension headers are read here, by length (see `parse_pax`).
    let entries = archive.entries().map_err(ioerr)?.raw(true);
    let mut ext = Extended::default();
    for entry in entries {
        let broken = |what: String| Error::Archive {
            path: name.clone(),
            entries: r.stats.entries,
            what,
        };
        let mut entry = entry.map_err(|e| broken(format!("unreadable tar header: {e}")))?;
        let ty = entry.header().entry_type();
        if ty.is_pax_global_extensions()
            || ty.is_pax_local_extensions()
            || ty.is_gnu_longname()
            || ty.is_gnu_longlink()
        {
            if entry.size() > 1 << 20 {
                return Err(broken("an extension header over 1 MiB".into()));
            }
            let mut data = Vec::new();
            entry
                .read_to_end(&mut data)
                .map_err(|e| broken(format!("reading an extension header: {e}")))?;
            if ty.is_pax_local_extensions() {
                let records =
                    parse_pax(&data).ok_or_else(|| broken("malformed PAX record".into()))?;
                ext.pax.extend(records);
            } else if !ty.is_pax_global_extensions() {
                while data.last() == Some(&0) {
                    data.pop();
                }
                if ty.is_gnu_longname() {
                    ext.long_name = Some(data);
                } else {
                    ext.long_link = Some(data);
                }
            }
            continue;
        }
        r.add(entry, std::mem::take(&mut ext))?;
        if r.stats.entries.is_multiple_of(1024) {
            progress(r.stats.entries);
        }
    }
    (&*r.spill).flush().map_err(ioerr)?;
    let stats = r.stats.clone();
    Ok((r.into_tree(), stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_times() {
        assert_eq!(parse_pax_time(b"1700000000"), Some((1700000000, 0)));
        assert_eq!(
            parse_pax_time(b"1700000000.5"),
            Some((1700000000, 500_000_000))
        );
        assert_eq!(
            parse_pax_time(b"1700000000.1234567891"),
            Some((1700000000, 123_456_789))
        );
        assert_eq!(parse_pax_time(b"-1.5"), Some((-2, 500_000_000)));
        assert_eq!(parse_pax_time(b"x"), None);
        assert_eq!(parse_pax_time(b"1.-5"), None);
    }

    #[test]
    fn pax_records_are_cut_by_length() {
        let data = b"28 SCHILY.acl.access=a\nb\nc\n\n18 path=some/name\n\0\0";
        let recs = parse_pax(data).unwrap();
        assert_eq!(
            recs[0],
            (b"SCHILY.acl.access".to_vec(), b"a\nb\nc\n".to_vec())
        );
        assert_eq!(recs[1], (b"path".to_vec(), b"some/name".to_vec()));
        assert!(parse_pax(b"99 path=x\n").is_none());
        assert!(parse_pax(b"9 pathx\n").is_none());
        assert!(parse_pax(b"x path=x\n").is_none());
    }

    #[test]
    fn compression_by_magic() {
        assert_eq!(detect(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(detect(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(detect(b"abc"), Compression::None);
    }
}
