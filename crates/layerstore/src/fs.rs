//! The store's tree, as containers/storage's overlay driver reads an additional layer store
//! with `:ref`: `STORE/BASE64(REFERENCE)/LAYER_DIGEST/{diff,info,blob}`.
//!
//! - Nothing exists until the [`Resolver`] finds it on lookup.
//! - The driver's `use` files and removals are answered ENOENT.
//! - A refused layer's `info` and `blob` fail EIO: a missing one would let podman reuse its
//!   own.

use crate::resolve::{Found, Layer, Refused, Resolver};
use base64::Engine;
use imagefs::ops::{AddEntry, Caller, Errno, NotifierSlot, Opened, Register, Statfs, Wants};
use imagefs::{Attr, Kind, Ops};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How long the kernel keeps entries and attributes: a tag may move to another image,
/// so a reference's layers are asked again after this.
const TTL: Duration = Duration::from_secs(1);

const ROOT: u64 = 1;

enum Node {
    Root,
    Reference(String),
    Layer(Arc<Layer>),
    Diff(Arc<Layer>),
    Info(Arc<Layer>),
    Blob(Arc<Layer>),
    /// A refused layer's directory, and its `diff` (an empty directory), `info` and
    /// `blob` (empty files that fail to open).
    Refused(Arc<Refused>),
    RefusedDiff,
    RefusedFile(Arc<Refused>),
}

#[derive(Default)]
struct Nodes {
    by_ino: HashMap<u64, (u64, Vec<u8>, Arc<Node>)>,
    by_name: HashMap<(u64, Vec<u8>), u64>,
}

impl Nodes {
    /// The inode of `name` in `parent` if it has one to `keep`; otherwise a new one made
    /// by `make` (an old one lives on for the kernel, under no name).
    fn get_or_replace(
        &mut self,
        parent: u64,
        name: &[u8],
        keep: impl FnOnce(&Node) -> bool,
        make: impl FnOnce() -> Node,
    ) -> u64 {
        let key = (parent, name.to_vec());
        if let Some(&ino) = self.by_name.get(&key) {
            if self.by_ino.get(&ino).is_some_and(|(_, _, n)| keep(n)) {
                return ino;
            }
        }
        let ino = ROOT + 1 + self.by_ino.len() as u64;
        self.by_ino
            .insert(ino, (parent, name.to_vec(), Arc::new(make())));
        self.by_name.insert(key, ino);
        ino
    }

    /// Names under `parent`, in the order they were made.
    fn children(&self, parent: u64) -> Vec<(u64, Vec<u8>, Arc<Node>)> {
        let mut v: Vec<_> = self
            .by_ino
            .iter()
            .filter(|(_, (p, _, _))| *p == parent)
            .map(|(ino, (_, name, node))| (*ino, name.clone(), node.clone()))
            .collect();
        v.sort_by_key(|(ino, _, _)| *ino);
        v
    }
}

/// The store: its nodes, and what finds and mounts layers.
pub struct StoreFs<R: Resolver> {
    resolver: R,
    nodes: Mutex<Nodes>,
    notifier: NotifierSlot,
    started: SystemTime,
    log: imagefs::Logger,
}

impl<R: Resolver> StoreFs<R> {
    /// A store that finds and mounts layers with `resolver`, and logs with `log`.
    pub fn new(resolver: R, log: imagefs::Logger) -> StoreFs<R> {
        StoreFs {
            resolver,
            nodes: Mutex::new(Nodes::default()),
            notifier: NotifierSlot::default(),
            started: SystemTime::now(),
            log,
        }
    }

    fn node(&self, ino: u64) -> Result<Arc<Node>, Errno> {
        if ino == ROOT {
            return Ok(Arc::new(Node::Root));
        }
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes
            .by_ino
            .get(&ino)
            .map(|(_, _, n)| n.clone())
            .ok_or(Errno::NOENT)
    }

    fn add(&self, parent: u64, name: &[u8], make: impl FnOnce() -> Node) -> Result<Attr, Errno> {
        self.replace(parent, name, |_| true, make)
    }

    /// [`Nodes::get_or_replace`], and its attributes.
    fn replace(
        &self,
        parent: u64,
        name: &[u8],
        keep: impl FnOnce(&Node) -> bool,
        make: impl FnOnce() -> Node,
    ) -> Result<Attr, Errno> {
        let ino = self
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_replace(parent, name, keep, make);
        self.getattr(ino)
    }

    fn attr(&self, ino: u64, kind: Kind, perm: u16, size: u64) -> Attr {
        Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink: if kind == Kind::Directory { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        }
    }

    /// A layer directory for `name` (a digest) of `reference`, if the layer was converted
    /// (or must be refused).
    fn lookup_layer(&self, reference: &str, name: &[u8]) -> Result<Option<Found>, Errno> {
        let Some(digest) = std::str::from_utf8(name)
            .ok()
            .filter(|d| oci::reference::valid_digest(d))
        else {
            return Ok(None);
        };
        match self.resolver.layer(reference, digest) {
            Ok(found) => Ok(found),
            Err(e) => {
                (self.log)(&format!("layer {digest} of {reference}: {e}"));
                Err(Errno::IO)
            }
        }
    }
}

/// The reference a top-level name stands for: base64 (standard alphabet, as Go's
/// `base64.StdEncoding`) of a reference the store can parse.
fn reference_of(name: &[u8]) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(name)
        .ok()?;
    let s = String::from_utf8(bytes).ok()?;
    crate::resolve::parse_reference(&s).ok()?;
    Some(s)
}

impl<R: Resolver> Ops for StoreFs<R> {
    fn wants(&self) -> Wants {
        Wants {
            ttl: TTL,
            readdirplus: false,
            cache_symlinks: false,
            posix_acl: false,
            no_open: false,
            no_opendir: true,
            dont_mask: false,
            writes: false,
            passthrough: false,
            kills_privileges: false,
            background: None,
            async_dio: false,
        }
    }

    fn notifier_slot(&self) -> NotifierSlot {
        self.notifier.clone()
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Option<Attr>, Errno> {
        let node = self.node(parent)?;
        match &*node {
            Node::Root => match reference_of(name) {
                Some(r) => self.add(parent, name, || Node::Reference(r)).map(Some),
                None => Ok(None),
            },
            // A layer's node is kept while it is served (a tag that moved to another
            // image keeps its layers until the store restarts); a layer refused since, or
            // served again after a refusal, gets a new one.
            Node::Reference(r) => match self.lookup_layer(r, name)? {
                Some(Found::Layer(layer)) => {
                    let layer = Arc::new(*layer);
                    let keep = |n: &Node| matches!(n, Node::Layer(_));
                    self.replace(parent, name, keep, || Node::Layer(layer))
                        .map(Some)
                }
                Some(Found::Refused(no)) => {
                    let no = Arc::new(no);
                    let keep = |n: &Node| matches!(n, Node::Refused(o) if o.why == no.why);
                    self.replace(parent, name, keep, || Node::Refused(no.clone()))
                        .map(Some)
                }
                None => Ok(None),
            },
            Node::Refused(no) => {
                let no = no.clone();
                match name {
                    b"diff" => self.add(parent, name, || Node::RefusedDiff).map(Some),
                    b"info" | b"blob" => self.add(parent, name, || Node::RefusedFile(no)).map(Some),
                    _ => Ok(None),
                }
            }
            Node::RefusedDiff => Ok(None),
            Node::Layer(layer) => {
                let make: fn(Arc<Layer>) -> Node = match name {
                    b"diff" => Node::Diff,
                    b"info" => Node::Info,
                    b"blob" => Node::Blob,
                    _ => return Ok(None),
                };
                let layer = layer.clone();
                self.add(parent, name, || make(layer)).map(Some)
            }
            _ => Err(Errno::NOTDIR),
        }
    }

    fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        Ok(match &*self.node(ino)? {
            Node::Root | Node::Reference(_) | Node::Layer(_) | Node::Refused(_) => {
                self.attr(ino, Kind::Directory, 0o755, 4096)
            }
            Node::RefusedDiff => self.attr(ino, Kind::Directory, 0o555, 4096),
            Node::RefusedFile(_) => self.attr(ino, Kind::RegularFile, 0o444, 0),
            Node::Diff(l) => {
                let len = self.resolver.diff_path(l).as_os_str().len() as u64;
                self.attr(ino, Kind::Symlink, 0o777, len)
            }
            Node::Info(l) => self.attr(ino, Kind::RegularFile, 0o444, l.info.len() as u64),
            Node::Blob(l) => self.attr(ino, Kind::RegularFile, 0o444, l.source.size),
        })
    }

    fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        use std::os::unix::ffi::OsStrExt;
        let Node::Diff(l) = &*self.node(ino)? else {
            return Err(Errno::INVAL);
        };
        // Followed by whoever reaches the layer's files: the layer is mounted now.
        match self.resolver.mount(l) {
            Ok(path) => Ok(path.as_os_str().as_bytes().to_vec()),
            Err(e) => {
                (self.log)(&format!("layer {}: mounting: {e}", l.source.digest));
                Err(Errno::IO)
            }
        }
    }

    fn mknod(
        &self,
        _caller: &Caller,
        parent: u64,
        _name: &[u8],
        _mode: u32,
        _umask: u32,
        _rdev: u32,
    ) -> Result<Attr, Errno> {
        self.refuse_change(parent)
    }

    fn create(
        &self,
        _caller: &Caller,
        parent: u64,
        _name: &[u8],
        _mode: u32,
        _umask: u32,
        _flags: i32,
        _register: Register<'_>,
    ) -> Result<imagefs::ops::Created, Errno> {
        self.refuse_change(parent)
    }

    fn mkdir(
        &self,
        _caller: &Caller,
        parent: u64,
        _name: &[u8],
        _mode: u32,
        _umask: u32,
    ) -> Result<Attr, Errno> {
        self.refuse_change(parent)
    }

    fn unlink(&self, parent: u64, _name: &[u8]) -> Result<(), Errno> {
        self.refuse_change(parent)
    }

    fn rmdir(&self, parent: u64, _name: &[u8]) -> Result<(), Errno> {
        self.refuse_change(parent)
    }

    fn open(
        &self,
        _caller: &Caller,
        ino: u64,
        flags: i32,
        _register: Register<'_>,
    ) -> Result<Opened, Errno> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(Errno::ROFS);
        }
        match &*self.node(ino)? {
            Node::Info(_) | Node::Blob(_) => Ok(Opened {
                keep_cache: true,
                ..Opened::default()
            }),
            Node::RefusedFile(no) => {
                (self.log)(&format!(
                    "layer {} of {}: refused: {}",
                    no.digest, no.reference, no.why
                ));
                Err(Errno::IO)
            }
            _ => Err(Errno::ISDIR),
        }
    }

    fn read(&self, ino: u64, _fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        match &*self.node(ino)? {
            Node::Info(l) => Ok(copy_at(&l.info, offset, buf)),
            Node::Blob(l) => {
                let path = self.resolver.blob(l).map_err(|e| {
                    (self.log)(&format!("layer {}: blob: {e}", l.source.digest));
                    Errno::IO
                })?;
                let f = std::fs::File::open(path).map_err(|_| Errno::IO)?;
                read_at(&f, offset, buf)
            }
            _ => Err(Errno::ISDIR),
        }
    }

    fn readdir(&self, ino: u64, _fh: u64, offset: u64, add: AddEntry<'_>) -> Result<(), Errno> {
        let node = self.node(ino)?;
        let mut entries: Vec<(u64, Vec<u8>, Kind)> = vec![(ino, b".".to_vec(), Kind::Directory)];
        let parent = {
            let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
            nodes.by_ino.get(&ino).map_or(ROOT, |(p, _, _)| *p)
        };
        entries.push((parent, b"..".to_vec(), Kind::Directory));
        match &*node {
            Node::RefusedDiff => {}
            Node::Root | Node::Reference(_) => {
                let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
                entries.extend(
                    nodes
                        .children(ino)
                        .into_iter()
                        .map(|(i, name, _)| (i, name, Kind::Directory)),
                );
            }
            Node::Layer(_) | Node::Refused(_) => {
                for (name, kind) in [
                    (&b"diff"[..], Kind::Symlink),
                    (b"info", Kind::RegularFile),
                    (b"blob", Kind::RegularFile),
                ] {
                    let attr = self.lookup(ino, name)?.ok_or(Errno::IO)?;
                    entries.push((attr.ino, name.to_vec(), kind));
                }
            }
            _ => return Err(Errno::NOTDIR),
        }
        for (i, (e_ino, name, kind)) in entries.iter().enumerate().skip(offset as usize) {
            let entry = imagefs::ops::DirEntry {
                ino: *e_ino,
                next: i as u64 + 1,
                kind: *kind,
                name,
            };
            if add(entry) {
                break;
            }
        }
        Ok(())
    }

    fn statfs(&self) -> Result<Statfs, Errno> {
        Ok(Statfs::read_only(0, 4096, 0, 0))
    }

    fn getxattr(&self, _caller: &Caller, ino: u64, _name: &[u8]) -> Result<Vec<u8>, Errno> {
        self.node(ino)?;
        Err(Errno::NODATA)
    }

    fn listxattr(&self, _caller: &Caller, ino: u64) -> Result<Vec<u8>, Errno> {
        self.node(ino)?;
        Ok(Vec::new())
    }
}

impl<R: Resolver> StoreFs<R> {
    /// What a change gets: in a layer directory ENOENT, as the driver's use and release
    /// notifications expect of a store that keeps count (`use` made, the directory
    /// removed); anywhere else the store is read-only.
    fn refuse_change<T>(&self, parent: u64) -> Result<T, Errno> {
        match &*self.node(parent)? {
            Node::Layer(_) | Node::Reference(_) | Node::Refused(_) => Err(Errno::NOENT),
            _ => Err(Errno::ROFS),
        }
    }
}

fn copy_at(data: &[u8], offset: u64, buf: &mut [u8]) -> usize {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(data.len());
    let n = buf.len().min(data.len() - start);
    buf[..n].copy_from_slice(&data[start..start + n]);
    n
}

fn read_at(f: &std::fs::File, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Errno::IO),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Refused;
    use std::path::PathBuf;

    /// Answers every layer with what `answer` holds at the time.
    struct Fixed {
        answer: Mutex<Option<Found>>,
    }

    impl Resolver for Fixed {
        fn layer(&self, _: &str, _: &str) -> Result<Option<Found>, String> {
            Ok(self.answer.lock().unwrap().clone())
        }
        fn diff_path(&self, _: &Layer) -> PathBuf {
            PathBuf::from("/nowhere")
        }
        fn mount(&self, _: &Layer) -> Result<PathBuf, String> {
            Err("no".into())
        }
        fn blob(&self, _: &Layer) -> Result<PathBuf, String> {
            Err("no".into())
        }
    }

    /// A refused layer: `diff`, `info` and `blob` stat, so the driver does not take it
    /// for a missing one (and reuse what it holds), and `info` fails to open, naming why.
    #[test]
    fn a_refused_layer_is_there_and_fails_to_open() {
        let refused = Found::Refused(Refused {
            reference: "127.0.0.1:5000/app@sha256:0".into(),
            digest: format!("sha256:{}", "d".repeat(64)),
            why: "image X does not hold it".into(),
        });
        let logged = Arc::new(Mutex::new(Vec::new()));
        let log = logged.clone();
        let fs = StoreFs::new(
            Fixed {
                answer: Mutex::new(Some(refused)),
            },
            Box::new(move |l: &str| log.lock().unwrap().push(l.to_string())),
        );
        let enc = base64::engine::general_purpose::STANDARD.encode("127.0.0.1:5000/app:v1");
        let r = fs.lookup(ROOT, enc.as_bytes()).unwrap().unwrap().ino;
        let digest = format!("sha256:{}", "d".repeat(64));
        let layer = fs.lookup(r, digest.as_bytes()).unwrap().unwrap().ino;
        let diff = fs.lookup(layer, b"diff").unwrap().unwrap();
        assert_eq!(diff.kind, Kind::Directory);
        let caller = Caller {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        let register: Register<'_> = &|_| Err(std::io::Error::other("no"));
        for name in [&b"info"[..], b"blob"] {
            let f = fs.lookup(layer, name).unwrap().unwrap();
            assert_eq!(f.kind, Kind::RegularFile);
            assert_eq!(
                fs.open(&caller, f.ino, libc::O_RDONLY, register).err(),
                Some(Errno::IO)
            );
        }
        assert!(logged.lock().unwrap()[0].contains("does not hold it"));
        // The driver's use and release notices get ENOENT, as on a served layer.
        assert_eq!(fs.rmdir(r, digest.as_bytes()).err(), Some(Errno::NOENT));
        assert_eq!(fs.rmdir(layer, b"use").err(), Some(Errno::NOENT));
        // Answered otherwise later: a new node, which the kernel learns at its next lookup.
        *fs.resolver.answer.lock().unwrap() = None;
        assert!(fs.lookup(r, digest.as_bytes()).unwrap().is_none());
    }

    #[test]
    fn names_decode_to_references_only() {
        let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            reference_of(enc("127.0.0.1:5000/app:v1").as_bytes()).as_deref(),
            Some("127.0.0.1:5000/app:v1")
        );
        assert_eq!(reference_of(b"not base64!"), None);
        assert_eq!(reference_of(enc("no/host/../x").as_bytes()), None);
        let mut buf = [0u8; 4];
        assert_eq!(copy_at(b"abcdef", 4, &mut buf), 2);
        assert_eq!(&buf[..2], b"ef");
        assert_eq!(copy_at(b"abc", 10, &mut buf), 0);
    }
}
