//! Where an object's attributes, bytes, link target and xattrs come from: an image object,
//! read through the verified reader, or an upper file, which is the host's. A read-only
//! mount's objects are all image objects; a writable mount's nodes are either.

use crate::attr::Attr;
use crate::ops::Errno;
use erofs::read::{ByteSource, Image, Inode};
use rustix::fd::BorrowedFd;
use rustix::fs::{self as rfs, Mode, OFlags};
use std::ffi::{CStr, CString};

pub(crate) enum Backing<'a, S: ByteSource> {
    Image {
        image: &'a Image<S>,
        inode: &'a Inode,
    },
    /// The node's descriptor of its upper object (`O_PATH` but for directories).
    Upper(BorrowedFd<'a>),
}

/// A backing read that failed: the image's error (which the caller logs, naming the
/// file), or the host's errno.
pub(crate) enum Failed {
    Image(erofs::read::Error),
    Host(Errno),
}

impl From<Errno> for Failed {
    fn from(e: Errno) -> Failed {
        Failed::Host(e)
    }
}

impl<S: ByteSource> Backing<'_, S> {
    /// The object's attributes as the host or the image has them, as inode `ino`.
    pub fn attr(&self, ino: u64) -> Result<Attr, Errno> {
        match self {
            Backing::Image { image, inode } => Ok(Attr::of_inode(ino, inode, image.block_size())),
            Backing::Upper(fd) => Ok(Attr::of_stat(ino, &rfs::fstat(fd)?)),
        }
    }

    pub fn readlink(&self) -> Result<Vec<u8>, Failed> {
        match self {
            Backing::Image { image, inode } => image.readlink(inode).map_err(Failed::Image),
            Backing::Upper(fd) => Ok(rfs::readlinkat(fd, "", Vec::new())?.into_bytes()),
        }
    }

    /// Reads at `offset`; an upper file through a descriptor of its own.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Failed> {
        match self {
            Backing::Image { image, inode } => {
                image.read(inode, offset, buf).map_err(Failed::Image)
            }
            Backing::Upper(fd) => {
                let f = rfs::open(
                    upper::fd_path(*fd).as_c_str(),
                    OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                Ok(rustix::io::pread(&f, buf, offset)?)
            }
        }
    }

    /// The value of `name`; `None` when the object has none.
    pub fn getxattr(&self, name: &[u8]) -> Result<Option<Vec<u8>>, Failed> {
        match self {
            Backing::Image { image, inode } => image.getxattr(inode, name).map_err(Failed::Image),
            Backing::Upper(fd) => {
                let name = CString::new(name).map_err(|_| Errno::INVAL)?;
                Ok(host_xattr(upper::fd_path(*fd).as_c_str(), name.as_c_str())?)
            }
        }
    }

    pub fn listxattr(&self) -> Result<Vec<Vec<u8>>, Failed> {
        match self {
            Backing::Image { image, inode } => image.listxattr(inode).map_err(Failed::Image),
            Backing::Upper(fd) => {
                let buf = host_xattr_list(upper::fd_path(*fd).as_c_str())?;
                Ok(buf
                    .split(|&b| b == 0)
                    .filter(|n| !n.is_empty())
                    .map(|n| n.to_vec())
                    .collect())
            }
        }
    }
}

/// Most host files have few and small attributes, or none (the kernel asks for
/// `security.capability` of every file written): a small buffer on the stack first, the
/// largest value Linux allows (64 KiB) only when that is too small.
const SMALL_XATTR: usize = 1024;
const XATTR_SIZE_MAX: usize = 65536;

/// `get` (a getxattr or listxattr into the buffer it is given, returning the length)
/// with the small buffer, then only on ERANGE with the largest.
fn small_then_big(
    get: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
) -> rustix::io::Result<Vec<u8>> {
    let mut small = [0u8; SMALL_XATTR];
    match get(&mut small) {
        Ok(len) => Ok(small[..len].to_vec()),
        Err(rustix::io::Errno::RANGE) => {
            let mut buf = vec![0u8; XATTR_SIZE_MAX];
            let len = get(&mut buf)?;
            buf.truncate(len);
            Ok(buf)
        }
        Err(e) => Err(e),
    }
}

/// Attribute `name` of the host file at `path`; `None` when it has none.
pub(crate) fn host_xattr(path: &CStr, name: &CStr) -> rustix::io::Result<Option<Vec<u8>>> {
    match small_then_big(|buf| rfs::getxattr(path, name, buf)) {
        Ok(v) => Ok(Some(v)),
        Err(rustix::io::Errno::NODATA) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The attribute names of the host file at `path`, NUL-separated, as listxattr(2) gives them.
fn host_xattr_list(path: &CStr) -> rustix::io::Result<Vec<u8>> {
    small_then_big(|buf| rfs::listxattr(path, buf))
}
