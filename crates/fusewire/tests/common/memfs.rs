//! A tiny read-only in-memory filesystem served through fusewire:
//!
//! ```text
//! /hello.txt   "hello, fusewire\n", xattrs user.color=blue, user.empty=""
//! /link        -> hello.txt
//! /dir/big.bin 3 MiB of a pattern (several 1 MiB reads)
//! /dir/fNNN_   150 small files, names of every length mod 8 (listing alignment)
//! ```

use fusewire::{
    abi, dirent_type, Attr, Context, DirEntry, Entry, Filesystem, Negotiated, Open, Reply, Request,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const HELLO: &[u8] = b"hello, fusewire\n";
pub const BIG_SIZE: usize = 3 << 20;
pub const SMALL_FILES: usize = 150;

enum Kind {
    Dir(Vec<u64>),
    File(Vec<u8>),
    Symlink(Vec<u8>),
}

struct Node {
    parent: u64,
    name: Vec<u8>,
    kind: Kind,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

pub struct MemFs {
    nodes: Vec<Node>,
    ttl: Duration,
    /// FORGETs seen (shared: the session owns the filesystem).
    pub forgets: Arc<AtomicU64>,
    pub inits: Arc<AtomicU64>,
    /// The next this many READs panic (a handler's bug).
    pub panics: Arc<AtomicU64>,
}

/// The contents of /dir/big.bin.
pub fn big_contents() -> Vec<u8> {
    (0..BIG_SIZE)
        .map(|i| (i.wrapping_mul(131) ^ (i >> 9)) as u8)
        .collect()
}

pub fn small_name(i: usize) -> String {
    format!("f{i:03}{}", "_".repeat(i % 11))
}

pub fn small_contents(i: usize) -> String {
    format!("file {i}\n")
}

impl MemFs {
    pub fn new(ttl: Duration) -> MemFs {
        let node = |parent, name: &str, kind| Node {
            parent,
            name: name.into(),
            kind,
            xattrs: Vec::new(),
        };
        // Index = inode number; 0 is unused.
        let mut nodes = vec![
            node(0, "", Kind::Dir(Vec::new())),
            node(1, "", Kind::Dir(vec![2, 3, 4])),
            node(1, "hello.txt", Kind::File(HELLO.to_vec())),
            node(1, "link", Kind::Symlink(b"hello.txt".to_vec())),
            node(1, "dir", Kind::Dir(Vec::new())),
            node(4, "big.bin", Kind::File(big_contents())),
        ];
        nodes[2].xattrs = vec![
            (b"user.color".to_vec(), b"blue".to_vec()),
            (b"user.empty".to_vec(), Vec::new()),
        ];
        let mut children = vec![5];
        for i in 0..SMALL_FILES {
            children.push(nodes.len() as u64);
            nodes.push(node(
                4,
                &small_name(i),
                Kind::File(small_contents(i).into_bytes()),
            ));
        }
        nodes[4].kind = Kind::Dir(children);
        MemFs {
            nodes,
            ttl,
            forgets: Arc::default(),
            inits: Arc::default(),
            panics: Arc::default(),
        }
    }

    fn node(&self, ino: u64) -> Result<&Node, i32> {
        match self.nodes.get(ino as usize) {
            Some(n) if ino > 0 => Ok(n),
            _ => Err(libc::ENOENT),
        }
    }

    fn attr(&self, ino: u64) -> Result<Attr, i32> {
        let n = self.node(ino)?;
        let (mode, size, nlink) = match &n.kind {
            Kind::Dir(c) => (libc::S_IFDIR | 0o755, 4096, 2 + c.len() as u32),
            Kind::File(d) => (libc::S_IFREG | 0o644, d.len() as u64, 1),
            Kind::Symlink(t) => (libc::S_IFLNK | 0o777, t.len() as u64, 1),
        };
        let t = 1_700_000_000 + ino;
        Ok(Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            mode,
            nlink,
            blksize: 4096,
            ..Attr::default()
        })
    }

    fn entry(&self, ino: u64) -> Result<Entry, i32> {
        let attr = self.attr(ino)?;
        Ok(Entry {
            nodeid: ino,
            attr,
            entry_ttl: self.ttl,
            attr_ttl: self.ttl,
            ..Entry::default()
        })
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Entry, i32> {
        let Kind::Dir(children) = &self.node(parent)?.kind else {
            return Err(libc::ENOTDIR);
        };
        let child = children
            .iter()
            .find(|&&c| self.nodes[c as usize].name == name);
        self.entry(*child.ok_or(libc::ENOENT)?)
    }

    /// A directory's listing: ".", "..", then its children.
    fn listing(&self, ino: u64) -> Result<Vec<(u64, Vec<u8>)>, i32> {
        let n = self.node(ino)?;
        let Kind::Dir(children) = &n.kind else {
            return Err(libc::ENOTDIR);
        };
        let mut list = vec![(ino, b".".to_vec()), (n.parent.max(1), b"..".to_vec())];
        list.extend(
            children
                .iter()
                .map(|&c| (c, self.nodes[c as usize].name.clone())),
        );
        Ok(list)
    }

    fn readdir(&self, ino: u64, offset: u64, plus: bool, reply: Reply<'_>) {
        let list = match self.listing(ino) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let mut dir = if plus { reply.dir_plus() } else { reply.dir() };
        for (i, (child, name)) in list.iter().enumerate().skip(offset as usize) {
            let Ok(attr) = self.attr(*child) else {
                return dir.error(libc::EIO);
            };
            let e = DirEntry {
                ino: *child,
                next: i as u64 + 1,
                typ: dirent_type(attr.mode),
                name,
            };
            let added = if plus {
                // "." and ".." are not looked up by the kernel: nodeid 0.
                let entry = if i < 2 {
                    Entry::default()
                } else {
                    self.entry(*child).unwrap_or_default()
                };
                dir.add_plus(&e, &entry)
            } else {
                dir.add(&e)
            };
            if !added {
                break;
            }
        }
        dir.finish()
    }

    fn xattr(&self, ino: u64, name: &[u8], size: u32, reply: Reply<'_>) {
        match self
            .node(ino)
            .map(|n| n.xattrs.iter().find(|(k, _)| k == name))
        {
            Ok(Some((_, v))) => reply.xattr(size, v),
            Ok(None) => reply.error(libc::ENODATA),
            Err(e) => reply.error(e),
        }
    }

    fn list_xattrs(&self, ino: u64, size: u32, reply: Reply<'_>) {
        match self.node(ino) {
            Ok(n) => {
                let list: Vec<u8> = n
                    .xattrs
                    .iter()
                    .flat_map(|(k, _)| k.iter().copied().chain([0]))
                    .collect();
                reply.xattr(size, &list)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(&self, ino: u64, offset: u64, reply: Reply<'_>) {
        let panics = self
            .panics
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        assert!(panics.is_err(), "a READ that panics, as asked");
        let data = match self.node(ino).map(|n| &n.kind) {
            Ok(Kind::File(d)) => d,
            Ok(_) => return reply.error(libc::EISDIR),
            Err(e) => return reply.error(e),
        };
        let start = (offset as usize).min(data.len());
        reply.data_with(|buf| {
            let n = buf.len().min(data.len() - start);
            buf[..n].copy_from_slice(&data[start..start + n]);
            Ok(n)
        })
    }
}

fn answer<T>(reply: Reply<'_>, r: Result<T, i32>, ok: impl FnOnce(Reply<'_>, T)) {
    match r {
        Ok(v) => ok(reply, v),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for MemFs {
    fn init(&mut self, _negotiated: &Negotiated, _channel: &fusewire::Channel) {
        self.inits.fetch_add(1, Ordering::Relaxed);
    }

    fn request(&self, _ctx: &Context, req: Request<'_>, reply: Reply<'_>) {
        let ttl = self.ttl;
        match req {
            Request::Lookup { parent, name } => {
                answer(reply, self.lookup(parent, name), |r, e| r.entry(&e))
            }
            Request::GetAttr { ino, .. } => answer(reply, self.attr(ino), |r, a| r.attr(&a, ttl)),
            Request::ReadLink { ino } => match self.node(ino).map(|n| &n.kind) {
                Ok(Kind::Symlink(t)) => reply.data(t),
                Ok(_) => reply.error(libc::EINVAL),
                Err(e) => reply.error(e),
            },
            Request::Open { ino, flags, .. } => match self.attr(ino) {
                Ok(_) if flags & libc::O_ACCMODE != libc::O_RDONLY => reply.error(libc::EROFS),
                Ok(a) if a.mode & libc::S_IFMT == libc::S_IFDIR => reply.error(libc::EISDIR),
                Ok(_) => reply.opened(&Open {
                    fh: ino,
                    ..Open::default()
                }),
                Err(e) => reply.error(e),
            },
            Request::OpenDir { ino, .. } => {
                answer(reply, self.listing(ino), |r, _| r.opened(&Open::default()))
            }
            Request::Read { ino, offset, .. } => self.read(ino, offset, reply),
            Request::ReadDir { ino, offset, .. } => self.readdir(ino, offset, false, reply),
            Request::ReadDirPlus { ino, offset, .. } => self.readdir(ino, offset, true, reply),
            Request::GetXattr { ino, name, size } => self.xattr(ino, name, size, reply),
            Request::ListXattr { ino, size } => self.list_xattrs(ino, size, reply),
            Request::StatFs { .. } => reply.statfs(&abi::Kstatfs {
                blocks: 1000,
                files: self.nodes.len() as u64,
                bsize: 4096,
                frsize: 4096,
                namelen: 255,
                ..abi::Kstatfs::default()
            }),
            Request::Release { .. } | Request::ReleaseDir { .. } | Request::Flush { .. } => {
                reply.ok()
            }
            Request::Access { .. } => reply.ok(),
            _ => reply.error(libc::ENOSYS),
        }
    }

    fn forget(&self, _ino: u64, _nlookup: u64) {
        self.forgets.fetch_add(1, Ordering::Relaxed);
    }
}
