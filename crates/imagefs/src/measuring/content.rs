//! Where a measured file's bytes and digests come from, and what a digest was computed
//! from (its content key, and an upper file's change cookie).

use std::io;

/// What a digest was computed from: an image object (immutable) or an upper file, with
/// what its host inode looked like then (a change behind our back shows there too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContentKey {
    /// An image object.
    Image {
        /// Its layer in the stack, 0 = top.
        layer: u16,
        /// Its inode number in that layer's image.
        nid: u64,
    },
    /// An upper file, by its host inode.
    Upper {
        /// The host device.
        dev: u64,
        /// The host inode number.
        ino: u64,
    },
}

/// The host inode's change cookie: ctime, mtime and size.
pub type Cookie = (i64, i64, i64, i64, u64);

/// Where a measured file's bytes and digests come from.
pub trait Content {
    /// The path the list names: the mountpoint joined with the path inside the mount.
    fn path(&self) -> Vec<u8>;
    /// The file's bytes from the start (verified, for image files), and how many. `size`
    /// is the file's size when the caller has just taken it (an upper file's cookie).
    fn reader(&self, size: Option<u64>) -> io::Result<(Box<dyn io::Read + '_>, u64)>;
    /// The file's stored fs-verity digest (SHA-256, 4 KiB blocks, no salt), if any.
    fn verity_digest(&self) -> io::Result<Option<[u8; 32]>>;
    /// The file's `security.ima` value, for the ima-sig templates.
    fn ima_xattr(&self) -> Option<Vec<u8>>;
}

/// An image file as both filesystems measure it: its bytes (verified), its stored
/// fs-verity digest and its `security.ima`.
pub struct ImageFile<'a, S: erofs::read::ByteSource> {
    /// The image holding the file.
    pub image: &'a erofs::read::Image<S>,
    /// The file's inode.
    pub inode: &'a erofs::read::Inode,
}

impl<'a, S: erofs::read::ByteSource> ImageFile<'a, S> {
    /// The file's bytes from the start (each block verified), and how many.
    pub fn reader(&self) -> (Box<dyn io::Read + 'a>, u64) {
        let r = ImageReader {
            image: self.image,
            inode: self.inode,
            at: 0,
        };
        (Box::new(r), self.inode.size)
    }

    /// Checked against the file's contents before it is used (`Image::file_digest`): a
    /// digest the image's table merely claims never reaches the list.
    pub fn verity_digest(&self) -> io::Result<Option<[u8; 32]>> {
        self.image
            .file_digest(self.inode)
            .map(Some)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// The file's `security.ima` value, if it has one (an error reading it counts as none).
    pub fn ima_xattr(&self) -> Option<Vec<u8>> {
        self.image
            .getxattr(self.inode, b"security.ima")
            .ok()
            .flatten()
    }
}

/// An image file's bytes as a reader, each block verified on the way (the image's own
/// reads); an integrity failure is an error, so a measured open of a tampered file fails.
struct ImageReader<'a, S: erofs::read::ByteSource> {
    image: &'a erofs::read::Image<S>,
    inode: &'a erofs::read::Inode,
    at: u64,
}

impl<S: erofs::read::ByteSource> io::Read for ImageReader<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self
            .image
            .read(self.inode, self.at, buf)
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.at += n as u64;
        Ok(n)
    }
}

/// An upper file's change cookie (see [`Cookie`]).
pub fn cookie(st: &rustix::fs::Stat) -> Cookie {
    (
        st.st_ctime as i64,
        st.st_ctime_nsec as i64,
        st.st_mtime as i64,
        st.st_mtime_nsec as i64,
        st.st_size as u64,
    )
}

/// Reads a descriptor from the start with pread, leaving its offset alone.
pub struct PositionalReader<'a> {
    /// The descriptor read.
    pub fd: rustix::fd::BorrowedFd<'a>,
    /// Where the next read starts, in bytes.
    pub at: u64,
}

impl std::io::Read for PositionalReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = rustix::io::pread(self.fd, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}
