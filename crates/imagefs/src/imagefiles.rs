//! The kernel engine's FUSE side: each image of a mount as one read-only file (`0`, `1`, …),
//! each READ answered from the verified source, so erofs sees only pinned bytes.
//!
//! - No passthrough: erofs refuses a backing file on a filesystem with a stack depth.
//! - Entries, attributes and pages are cached forever; a page failing its check never is.
//! - A failed read logs one line naming image, offset and file.

use crate::attr::{Attr, Kind};
use crate::ops::{
    AddEntry, Caller, Errno, Logger, NotifierSlot, Opened, Ops, Register, Statfs, Wants,
};
use erofs::read::{ByteSource, Image, LazyCheck};
use std::io;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};
use verity::VerifiedSource;

/// The verified source of an image.
pub type Verified = Arc<VerifiedSource<Box<dyn ByteSource>>>;

/// One image served as a file.
pub struct ImageFile {
    /// Its bytes, each block checked against the Merkle tree before it is returned.
    pub source: Verified,
    /// How log lines name it (the image's path or reference).
    pub name: String,
    /// When its metadata is checked.
    pub check: MetadataCheck,
    /// The check as the kernel reads ([`MetadataCheck::AsRead`]), once started.
    lazy: std::sync::OnceLock<LazyCheck<Verified>>,
    /// The executables' extents read whole already (by start): once is enough, the rest
    /// is in the remote source's caches.
    whole: crate::whole::ReadWhole,
}

/// When what the kernel's erofs parses of an image is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataCheck {
    /// All of it, before the mount: an image here, whose metadata is read at disk speed.
    Whole,
    /// Each inode (with its xattrs, extent map and entries) as the page holding its
    /// header is first served, and everything known in a page before it is
    /// (`erofs::read::LazyCheck`): a remote image, whose metadata would otherwise all be
    /// fetched before the first file could be read.
    AsRead,
}

/// How far a read of a remote image's file data reads on in that file's extent.
const READ_AROUND: u64 = 1 << 20;
/// How far any other read of a remote image reads on (`import json` from a registry:
/// 89 requests with none, 82 with 16 KiB, 59 with 64 KiB, 58 with 128 KiB).
const META_AROUND: u64 = 64 << 10;

/// The unchecked bytes under a verified source: only to name what a bad block holds
/// (the rest of the tree still leads to it), never to serve.
struct Unchecked(Verified);

impl ByteSource for Unchecked {
    fn len(&self) -> u64 {
        self.0.inner().len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.inner().read_exact_at(buf, offset)
    }
}

/// The most metadata of one image copied into memory to be checked (beyond it, the check
/// reads through the verified source, hashing blocks again as it meets them).
const MAX_HEAD: u64 = 512 << 20;

/// An image's first bytes (its inode area), read and checked once, in memory, and the
/// verified source for the rest: so a walk of the metadata hashes each block once.
struct HeadCopy {
    head: Vec<u8>,
    rest: Verified,
}

impl ByteSource for HeadCopy {
    fn len(&self) -> u64 {
        self.rest.len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        if end <= self.head.len() as u64 {
            buf.copy_from_slice(&self.head[offset as usize..end as usize]);
            Ok(())
        } else {
            self.rest.read_exact_at(buf, offset)
        }
    }
}

impl ImageFile {
    /// Image `source` served as file `name`, its metadata checked as `check` says.
    pub fn new(source: Verified, name: String, check: MetadataCheck) -> ImageFile {
        ImageFile {
            source,
            name,
            check,
            lazy: std::sync::OnceLock::new(),
            whole: Default::default(),
        }
    }

    /// Checks what the kernel's erofs will parse of this image (its superblock, inodes,
    /// directories, xattrs and extent maps, through the verified source) with verilay's
    /// own bounded walk (`erofs::read::check_kernel_metadata`); the first problem is the
    /// error. The inode area (where small files' data is inline too) is read first in
    /// large sequential reads, which a remote image fetches in few requests.
    /// For [`MetadataCheck::AsRead`], only the root directory and the packed inode are
    /// checked here, which the kernel reads as it mounts.
    pub fn check_metadata(&self) -> anyhow::Result<()> {
        let name = &self.name;
        let refused =
            |why: String| anyhow::anyhow!("image {name}: refused for the kernel engine: {why}");
        let img = Image::open(self.source.clone()).map_err(|e| refused(e.to_string()))?;
        if self.check == MetadataCheck::AsRead {
            let lazy = LazyCheck::new(img).map_err(refused)?;
            let _ = self.lazy.set(lazy);
            return Ok(());
        }
        let sb = img.superblock();
        let end = (u64::from(sb.xattr_blkaddr) << sb.blkszbits).min(self.source.len());
        let report = if end <= MAX_HEAD {
            let mut head = vec![0u8; end as usize];
            for (i, chunk) in head.chunks_mut(4 << 20).enumerate() {
                self.source
                    .read_exact_at(chunk, (i as u64) << 22)
                    .map_err(|e| anyhow::anyhow!("image {name}: reading its metadata: {e}"))?;
            }
            let copy = HeadCopy {
                head,
                rest: self.source.clone(),
            };
            let img = Image::open(copy).map_err(|e| refused(e.to_string()))?;
            erofs::read::check_kernel_metadata(&img, 1)
        } else {
            erofs::read::check_kernel_metadata(&img, 1)
        };
        match report.problems.into_iter().next() {
            Some(problem) => Err(refused(problem)),
            None => Ok(()),
        }
    }
}

/// What the image's own tree says is stored at `[offset, offset + len)`.
fn owners(source: &Verified, offset: u64, len: u64) -> String {
    match Image::open(Unchecked(source.clone())) {
        Ok(img) => img.owners(offset, len, 4).join(", "),
        Err(_) => "the superblock cannot be read".into(),
    }
}

/// The image files of one mount.
pub struct ImageFiles {
    files: Vec<ImageFile>,
    log: Logger,
    notifier: NotifierSlot,
    /// What `verilay stats` reports besides the session's counts (measuring, fetching).
    stats: Vec<crate::stats::StatsSource>,
}

/// The root directory's inode; file `i` is inode `FIRST_FILE + i`.
const ROOT: u64 = 1;
const FIRST_FILE: u64 = 2;
/// "Forever" for the kernel's caches: the files never change.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl ImageFiles {
    /// Serves `files` as the mount's root directory's files; errors go to `log`.
    pub fn new(files: Vec<ImageFile>, log: Logger) -> ImageFiles {
        ImageFiles {
            files,
            log,
            notifier: NotifierSlot::default(),
            stats: Vec::new(),
        }
    }

    /// Adds members to what `verilay stats` reports.
    pub fn add_stats(&mut self, source: crate::stats::StatsSource) {
        self.stats.push(source);
    }

    /// Checks every image's metadata ([`ImageFile::check_metadata`]).
    pub fn check_metadata(&self) -> anyhow::Result<()> {
        self.files.iter().try_for_each(ImageFile::check_metadata)
    }

    /// A read the lazy metadata check refuses: logged, and EIO.
    fn refused(&self, f: &ImageFile, offset: u64, n: usize, why: &str) -> Errno {
        (self.log)(&format!(
            "{}: read of {n} bytes at offset {offset} refused for the kernel engine: {why}",
            f.name
        ));
        Errno::IO
    }

    /// Whether image `i`'s metadata is checked as the kernel reads it (a remote image).
    pub fn checked_as_read(&self, i: usize) -> bool {
        self.files
            .get(i)
            .is_some_and(|f| f.check == MetadataCheck::AsRead)
    }

    /// How many image files there are.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether there are no image files.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The name of file `i` under the mount's root.
    pub fn file_name(i: usize) -> String {
        i.to_string()
    }

    fn file(&self, ino: u64) -> Result<&ImageFile, Errno> {
        ino.checked_sub(FIRST_FILE)
            .and_then(|i| self.files.get(i as usize))
            .ok_or(Errno::NOENT)
    }

    fn attr(&self, ino: u64) -> Result<Attr, Errno> {
        let (kind, perm, size, nlink) = if ino == ROOT {
            (Kind::Directory, 0o500, 0, 2)
        } else {
            let f = self.file(ino)?;
            (Kind::RegularFile, 0o400, f.source.len(), 1)
        };
        Ok(Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        })
    }
}

impl Ops for ImageFiles {
    fn wants(&self) -> Wants {
        Wants {
            ttl: FOREVER,
            readdirplus: false,
            cache_symlinks: false,
            posix_acl: false,
            no_open: false,
            no_opendir: true,
            dont_mask: false,
            writes: false,
            passthrough: false,
            kills_privileges: false,
            background: Some((64, 48)),
            async_dio: true,
        }
    }

    fn notifier_slot(&self) -> NotifierSlot {
        self.notifier.clone()
    }

    fn stats(&self) -> crate::stats::StatsSource {
        let sources = self.stats.clone();
        Arc::new(move || {
            let mut s = crate::stats::Stats::new();
            for source in &sources {
                s.extend(source());
            }
            s
        })
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Option<Attr>, Errno> {
        if parent != ROOT {
            return Err(Errno::NOTDIR);
        }
        let found = std::str::from_utf8(name)
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&i| i < self.files.len() && Self::file_name(i).as_bytes() == name);
        match found {
            Some(i) => self.attr(FIRST_FILE + i as u64).map(Some),
            None => Ok(None),
        }
    }

    fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        self.attr(ino)
    }

    fn readlink(&self, _ino: u64) -> Result<Vec<u8>, Errno> {
        Err(Errno::INVAL)
    }

    fn open(
        &self,
        _caller: &Caller,
        ino: u64,
        _flags: i32,
        _register: Register<'_>,
    ) -> Result<Opened, Errno> {
        self.file(ino)?;
        // erofs reads data through read_iter (into its own page cache: caching it here
        // too would hold every byte twice) and metadata through read_folio, which
        // caches here whatever this says.
        Ok(Opened {
            keep_cache: true,
            direct_io: true,
            ..Opened::default()
        })
    }

    fn read(&self, ino: u64, _fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let f = self.file(ino)?;
        let source = &f.source;
        let len = source.len();
        if offset >= len {
            return Ok(0);
        }
        let n = buf.len().min((len - offset) as usize);
        let lazy = match f.check {
            MetadataCheck::Whole => None,
            MetadataCheck::AsRead => match f.lazy.get() {
                Some(lazy) => Some(lazy),
                None => return Err(self.refused(f, offset, n, "its check has not started")),
            },
        };
        // A remote image's bytes come a round trip at a time, so a read takes more with
        // it in the same request: a read of a file's data the rest of the file's extent,
        // up to the read-ahead the FUSE engine gets (erofs asks in pieces of at most 16
        // pages); any other read, of metadata (erofs reads it a page at a time), what
        // follows it, where the inodes, entries and inline data read next mostly lie.
        let extent = lazy.and_then(|l| l.file_extent(offset));
        // An executable's start: its extent whole, once (`whole`), held until read.
        let reading = match &extent {
            Some((e, true)) if offset == e.start => f.whole.start(e.start, e.end - e.start),
            _ => None,
        };
        let (from, end) = match (extent, &reading) {
            (Some((e, _)), Some(_)) => (e.start, e.end),
            (Some((e, _)), None) => (offset, e.end.min(offset.saturating_add(READ_AROUND))),
            (None, _) if lazy.is_some() => (offset, offset.saturating_add(META_AROUND)),
            (None, _) => (offset, 0),
        };
        let end = end.min(len);
        let at = (offset - from) as usize;
        let mut around = vec![0u8; end.saturating_sub(from) as usize];
        let more = around.len() > n && around.len() >= at + n;
        let read = if more && source.read_exact_at(&mut around, from).is_ok() {
            buf[..n].copy_from_slice(&around[at..at + n]);
            Ok(())
        } else {
            // Without what lies beyond, which may be what failed.
            source.read_exact_at(&mut buf[..n], offset)
        };
        if let Err(e) = read {
            (self.log)(&format!(
                "{}: read of {n} bytes at offset {offset} ({}) failed: {e}",
                f.name,
                owners(source, offset, n as u64)
            ));
            return Err(Errno::IO);
        }
        // Checked once read (outside the check's lock, so fetches overlap), and before a
        // byte is handed over.
        if let Some(Err(why)) = lazy.map(|l| l.serve(offset, n as u64)) {
            return Err(self.refused(f, offset, n, &why));
        }
        Ok(n)
    }

    fn readdir(&self, ino: u64, _fh: u64, offset: u64, add: AddEntry<'_>) -> Result<(), Errno> {
        if ino != ROOT {
            return Err(Errno::NOTDIR);
        }
        for i in offset as usize..self.files.len() {
            let name = Self::file_name(i);
            let full = add(crate::ops::DirEntry {
                ino: FIRST_FILE + i as u64,
                next: i as u64 + 1,
                kind: Kind::RegularFile,
                name: name.as_bytes(),
            });
            if full {
                break;
            }
        }
        Ok(())
    }

    fn statfs(&self) -> Result<Statfs, Errno> {
        let blocks = self
            .files
            .iter()
            .map(|f| f.source.len().div_ceil(4096))
            .sum();
        Ok(Statfs::read_only(
            blocks,
            4096,
            self.files.len() as u64 + 1,
            0,
        ))
    }

    fn getxattr(&self, _caller: &Caller, ino: u64, _name: &[u8]) -> Result<Vec<u8>, Errno> {
        self.attr(ino)?;
        Err(Errno::NODATA)
    }

    fn listxattr(&self, _caller: &Caller, ino: u64) -> Result<Vec<u8>, Errno> {
        self.attr(ino)?;
        Ok(Vec::new())
    }
}
