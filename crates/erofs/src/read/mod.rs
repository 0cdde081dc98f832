//! The hardened EROFS reader.
//!
//! Cut like Linux `fs/erofs/`: one concern per file.
//!
//! - `source`: where bytes come from ([`ByteSource`]).
//! - `sb`: superblock checks and the long xattr prefix table ([`Image::open`]).
//! - `inode`: nid → validated [`Inode`].
//! - `data`: logical file offset → image bytes (flat, inline tail, chunks) and `read`.
//! - `zmap`, `zdata`: compressed files: offset → cluster (`zmap.c`), the compression
//!   configs, decoding through a cache of decoded extents.
//! - `dir`: directory blocks, `readdir` with kernel-compatible offsets, `lookup`.
//! - `xattr`: inline and shared xattrs, long prefixes and the name bloom filter.
//! - `compare`: two images compared as the trees they show ([`compare_trees`]).
//! - `check`: `fsck` (whole-tree consistency, with or without the file data), `exercise`
//!   (bounded walk for fuzzing) and [`LazyCheck`] (what the kernel parses, checked a
//!   structure at a time as its bytes are first served).
//!
//! The image is untrusted. Every offset is computed with checked `u64` arithmetic and checked
//! against the source length before it is read; nothing is allocated from an unchecked size;
//! no input can make the reader panic, loop forever, or read outside the image. A problem is
//! reported as a one-line [`Error`] naming the byte offset where it was found.

mod check;
mod claims;
mod compare;
mod data;
mod digest;
mod dir;
mod inode;
mod locate;
mod sb;
mod source;
mod xattr;
mod zdata;
mod zmap;

pub use check::{check_kernel_metadata, exercise, fsck, fsck_structure, FsckReport, LazyCheck};
pub use claims::ClaimsReport;
pub use compare::{compare_trees, CompareError, Difference, Which};
pub use data::{Extent, LayoutInfo};
pub use dir::{DirEntry, ReadDir};
pub use inode::Inode;
pub use sb::Image;
pub use source::{ByteSource, FileSource};
pub use zdata::ZConfig;
pub use zmap::{ZExtent, ZFormat, ZStored};

use std::io;

/// Everything the reader can fail with. `Display` is a single line that names the byte offset.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The image violates the format (or points outside itself).
    #[error("corrupt image at byte {offset}: {what}")]
    Corrupt {
        /// Byte offset in the image where the problem is.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// A valid image using something this reader does not implement (extent records, 48-bit
    /// addresses, extra devices, ...). The kernel answers these with EOPNOTSUPP.
    #[error("unsupported at byte {offset}: {what}")]
    Unsupported {
        /// Byte offset in the image of the unsupported structure.
        offset: u64,
        /// What is not supported.
        what: String,
    },
    /// The byte source failed (including, later, a block that fails verification).
    #[error("I/O error reading image byte {offset}: {err}")]
    Io {
        /// Byte offset in the image of the failed read.
        offset: u64,
        /// The byte source's error.
        err: io::Error,
    },
    /// A directory operation on an inode that is not a directory.
    #[error("inode {nid} at byte {offset} is not a directory")]
    NotADirectory {
        /// Nid of the inode.
        nid: u64,
        /// Byte offset of the inode.
        offset: u64,
    },
    /// A symlink read on an inode that is not a symlink.
    #[error("inode {nid} at byte {offset} is not a symlink")]
    NotASymlink {
        /// Nid of the inode.
        nid: u64,
        /// Byte offset of the inode.
        offset: u64,
    },
}

/// Result of the reader's operations.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The errno a filesystem front end should answer with (what the kernel's erofs returns).
    pub fn errno(&self) -> i32 {
        use rustix::io::Errno;
        match self {
            // EFSCORRUPTED is EUCLEAN on Linux.
            Error::Corrupt { .. } => Errno::UCLEAN.raw_os_error(),
            Error::Unsupported { .. } => Errno::OPNOTSUPP.raw_os_error(),
            Error::Io { err, .. } => err.raw_os_error().unwrap_or(Errno::IO.raw_os_error()),
            Error::NotADirectory { .. } => Errno::NOTDIR.raw_os_error(),
            Error::NotASymlink { .. } => Errno::INVAL.raw_os_error(),
        }
    }

    /// The byte offset the error is about.
    pub fn offset(&self) -> u64 {
        match self {
            Error::Corrupt { offset, .. }
            | Error::Unsupported { offset, .. }
            | Error::Io { offset, .. }
            | Error::NotADirectory { offset, .. }
            | Error::NotASymlink { offset, .. } => *offset,
        }
    }
}

/// `parent/name` for a path from the root (`/` joins without a second slash).
pub(crate) fn child_path(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(parent.len() + 1 + name.len());
    p.extend_from_slice(parent);
    if p.len() > 1 {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

pub(crate) fn corrupt<T>(offset: u64, what: impl Into<String>) -> Result<T> {
    Err(Error::Corrupt {
        offset,
        what: what.into(),
    })
}

pub(crate) fn unsupported<T>(offset: u64, what: impl Into<String>) -> Result<T> {
    Err(Error::Unsupported {
        offset,
        what: what.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Image<Vec<u8>>>();
        assert_send_sync::<Image<FileSource>>();
        assert_send_sync::<Image<std::sync::Arc<[u8]>>>();
        assert_send_sync::<Inode>();
    }

    #[test]
    fn display_is_one_line_with_offset() {
        let e = Error::Corrupt {
            offset: 1152,
            what: "inode 36: bad".into(),
        };
        assert_eq!(e.to_string(), "corrupt image at byte 1152: inode 36: bad");
        assert_eq!(e.errno(), 117);
    }
}
