//! Where bytes come from: the reader never touches a file directly, it asks a [`ByteSource`]
//! for exact ranges (a file, a buffer, the verified source, a remote image).
//!
//! - Every range asked for is already bounds-checked against [`ByteSource::len`], so an
//!   implementation may fail an out-of-range request as a bug.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Random-access, read-only bytes. Shared by many reader threads, hence `Send + Sync` and
/// `&self` everywhere.
pub trait ByteSource: Send + Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;

    /// Fills `buf` from `offset`; fails if the range is not fully inside the source or the
    /// underlying I/O (or verification) fails.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Whether it holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The checked SHA-256 hash (no salt) of the 4 KiB block at `offset`, a multiple of
    /// 4096 with the whole block inside the source, when the source checks its bytes
    /// against a Merkle tree with those parameters: level 0 of that tree holds exactly
    /// fs-verity's hash of the block. `None` (the default) means the caller reads the
    /// block and hashes it itself.
    fn block_hash(&self, offset: u64) -> io::Result<Option<[u8; 32]>> {
        let _ = offset;
        Ok(None)
    }

    /// The `len` bytes at `offset` failed their hash: a source that keeps fetched bytes
    /// (a remote image's cache) drops them, so the next read fetches them again.
    fn forget(&self, offset: u64, len: u64) {
        let _ = (offset, len);
    }

    /// Whether a forgotten range is read afresh next time (a remote image's copy, or the
    /// network), so a read that failed its check is worth trying once more; such reads
    /// may also wait on the network.
    fn refetches(&self) -> bool {
        false
    }

    /// Fills `buf` with bytes of a verity section (its Merkle tree, descriptor or trailer)
    /// from `offset`, as [`read_exact_at`] does. A file serves them through an open file
    /// description of their own: the kernel keeps one
    /// readahead state per description, and a tree read far from a reader's sequential
    /// stream of data would reset that stream's (small split reads follow, measured at
    /// 1.4x the time of a first cold read of a large file).
    ///
    /// [`read_exact_at`]: ByteSource::read_exact_at
    fn read_tree_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_exact_at(buf, offset)
    }

    /// `bytes` at `offset` passed their check against the pinned tree (data blocks, tree
    /// blocks, the descriptor and trailer): a source with a persistent cache may keep
    /// exactly these bytes. Never called for bytes that failed.
    fn verified(&self, offset: u64, bytes: &[u8]) {
        let _ = (offset, bytes);
    }
}

fn out_of_range(offset: u64, len: usize, total: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("range {offset}+{len} outside source of {total} bytes"),
    )
}

impl ByteSource for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset)
            .map_err(|_| out_of_range(offset, buf.len(), self.len() as u64))?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or_else(|| out_of_range(offset, buf.len(), self.len() as u64))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl ByteSource for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.as_slice().read_exact_at(buf, offset)
    }
}

/// A reference or a pointer to a source reads as that source.
macro_rules! forward {
    ($($pointer:ty),*) => {$(
        impl<T: ByteSource + ?Sized> ByteSource for $pointer {
            fn len(&self) -> u64 {
                (**self).len()
            }

            fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
                (**self).read_exact_at(buf, offset)
            }

            fn read_tree_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
                (**self).read_tree_at(buf, offset)
            }

            fn block_hash(&self, offset: u64) -> io::Result<Option<[u8; 32]>> {
                (**self).block_hash(offset)
            }

            fn forget(&self, offset: u64, len: u64) {
                (**self).forget(offset, len)
            }

            fn verified(&self, offset: u64, bytes: &[u8]) {
                (**self).verified(offset, bytes)
            }

            fn refetches(&self) -> bool {
                (**self).refetches()
            }
        }
    )*};
}

forward!(&T, Arc<T>, Box<T>);

/// A local image file. The length is captured at open: images are immutable, and asking the
/// kernel on every bounds check would cost a syscall per read.
#[derive(Debug)]
pub struct FileSource {
    file: File,
    len: u64,
    /// Opened with `O_DIRECT`: reads bypass the page cache (and its readahead).
    direct: bool,
    /// The same file opened again for tree reads ([`ByteSource::read_tree_at`]), at the
    /// first one; `None` if it could not be (no /proc, or [`MAX_TWINS`] open): tree reads
    /// then share `file`.
    tree: OnceLock<Option<File>>,
}

/// The most file sources holding a second description for their tree reads at once (one
/// descriptor each): a stack of hundreds of images must not double its descriptors, and
/// a reader streams from few images at a time.
pub const MAX_TWINS: usize = 64;

/// Second descriptions open now (see [`MAX_TWINS`]).
static TWINS: AtomicUsize = AtomicUsize::new(0);

impl Drop for FileSource {
    fn drop(&mut self) {
        if let Some(Some(_)) = self.tree.get() {
            TWINS.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// `O_DIRECT` alignment of offsets, lengths and memory; 4 KiB satisfies every common device.
pub const DIRECT_ALIGN: usize = 4096;

/// `n` bytes of `raw` (made larger if it must be) at an address aligned as `file_offset`
/// is, modulo [`DIRECT_ALIGN`], for direct I/O of the file's bytes there: a `Vec` has no
/// alignment to ask for, so it holds two alignments more and the part that lines up is
/// used.
pub fn aligned_for(raw: &mut Vec<u8>, n: usize, file_offset: u64) -> &mut [u8] {
    let a = DIRECT_ALIGN;
    if raw.len() < n + 2 * a {
        *raw = vec![0; n + 2 * a];
    }
    let at = (a - raw.as_ptr() as usize % a) % a + (file_offset % a as u64) as usize;
    &mut raw[at..at + n]
}

/// Opens `path` for reading as an input file: without waiting (`O_NONBLOCK`: opening a
/// FIFO would wait for a writer, forever) and only if it is a regular file, or a block
/// device where `devices` allows one. Nothing else (a FIFO, a character device such as
/// /dev/zero, a directory, a socket) may stand for an image, a tarball or a manifest:
/// it could hang a command or stream without end.
pub fn open_input(path: &Path, devices: bool) -> io::Result<File> {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if t.is_file() || (devices && t.is_block_device()) {
        // O_NONBLOCK changes nothing for these: reads wait for the disk as usual.
        Ok(f)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ))
    }
}

/// The whole of the input file `path` (a regular file, [`open_input`]) if it has at most
/// `max` bytes: small inputs (manifests, policies, keys, auth files) are read whole, so
/// their size, not what they say, bounds the memory they take. Errors keep the I/O
/// error's kind (a caller tells "not found" apart).
pub fn read_input(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    open_input(path, false)?
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        let limit = match max % (1 << 20) {
            0 => format!("{} MiB", max >> 20),
            _ => format!("{max} bytes"),
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {limit}"),
        ));
    }
    Ok(bytes)
}

impl FileSource {
    /// An image file (or a block device holding one: a plain EROFS image, since a sealed
    /// one's trailer is not where a device of 512-byte sectors ends).
    pub fn open(path: impl AsRef<Path>) -> io::Result<FileSource> {
        FileSource::new(open_input(path.as_ref(), true)?)
    }

    /// Opens with `O_DIRECT`, so image bytes are not cached a second time under a mount
    /// whose own page cache keeps what it serves. Fails (`EINVAL`) where the filesystem
    /// cannot do direct I/O, e.g. tmpfs.
    pub fn open_direct(path: impl AsRef<Path>) -> io::Result<FileSource> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(path)?;
        let mut s = FileSource::new(file)?;
        s.direct = true;
        Ok(s)
    }

    /// The bytes of `file`, as long as its length is now (a block device's from its end:
    /// its metadata says 0).
    pub fn new(file: File) -> io::Result<FileSource> {
        let meta = file.metadata()?;
        let len = if std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type()) {
            rustix::fs::seek(&file, rustix::fs::SeekFrom::End(0))?
        } else {
            meta.len()
        };
        // Twice the device's readahead window for the data. Where that window is at
        // least half a request (1 MiB from a FUSE mount; this VM's disk reads 1 MiB
        // ahead), the next request's bytes are then on their way before it comes, where
        // a window no larger than a request keeps the disk one request behind. On a
        // smaller window the kernel reads a large request's own size anyway, and the
        // advice changes nothing. The tree's description (`tree`) keeps the device's.
        let _ = rustix::fs::fadvise(&file, 0, 0, rustix::fs::Advice::Sequential);
        Ok(FileSource {
            file,
            len,
            direct: false,
            tree: OnceLock::new(),
        })
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Reads `buf` at `offset` through `file` (`self.file` or its twin for tree reads).
    fn read_from(&self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // A file that shrank under us must not turn into a short read the caller trusts.
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(out_of_range(offset, buf.len(), self.len));
        }
        if self.direct {
            return self.read_direct(buf, offset);
        }
        FileExt::read_exact_at(file, buf, offset)
    }

    /// The same file, in an open file description of its own, or `None` once
    /// [`MAX_TWINS`] are open: opened through the descriptor's /proc link, which names
    /// the inode itself, not a path that may since name another file, as
    /// [`open_input`] opens (a /proc that is not procfs must not hang the open).
    fn reopen(&self) -> Option<File> {
        use rustix::fs::{open, Mode, OFlags};
        use std::os::fd::AsRawFd as _;
        use std::os::unix::fs::MetadataExt as _;
        let taken = TWINS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_TWINS).then_some(n + 1)
        });
        taken.ok()?;
        let link = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let again = open(link.as_str(), flags, Mode::empty())
            .ok()
            .map(File::from)
            .filter(|again| {
                let (Ok(a), Ok(b)) = (self.file.metadata(), again.metadata()) else {
                    return false;
                };
                (a.dev(), a.ino(), a.file_type()) == (b.dev(), b.ino(), b.file_type())
            });
        if again.is_none() {
            TWINS.fetch_sub(1, Ordering::AcqRel);
        }
        again
    }

    /// Direct I/O needs aligned offsets, lengths and memory: read the aligned span that
    /// covers the request into an aligned bounce buffer, then copy out.
    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let a = DIRECT_ALIGN as u64;
        let start = offset / a * a;
        let end = (offset + buf.len() as u64).next_multiple_of(a);
        let span = (end - start) as usize;
        let mut raw = Vec::new();
        let bounce = aligned_for(&mut raw, span, 0);
        let need = (offset - start) as usize + buf.len();
        let mut got = 0;
        while got < need {
            // Whole aligned blocks only; the file's unaligned end comes back as a short read.
            match FileExt::read_at(&self.file, &mut bounce[got..], start + got as u64) {
                Ok(0) => return Err(out_of_range(offset, buf.len(), self.len)),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            if got % DIRECT_ALIGN != 0 && got < need {
                return Err(out_of_range(offset, buf.len(), self.len));
            }
        }
        let from = (offset - start) as usize;
        buf.copy_from_slice(&bounce[from..from + buf.len()]);
        Ok(())
    }
}

impl ByteSource for FileSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_from(&self.file, buf, offset)
    }

    fn read_tree_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.direct {
            // No readahead state to keep apart.
            return self.read_exact_at(buf, offset);
        }
        let tree = self.tree.get_or_init(|| self.reopen());
        self.read_from(tree.as_ref().unwrap_or(&self.file), buf, offset)
    }
}
