//! File I/O: image files read through the node (cached), upper files through a handle of
//! their own, or by the kernel itself (passthrough, root mounts).

use super::nodes::{Lower, IO_CACHED, IO_PASSTHROUGH};
use super::{libc_trunc, UnionFs};
use crate::ops::{Caller, Errno, Opened, Passthrough, Register};
use erofs::read::ByteSource;
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self as rfs, Mode, OFlags};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Marks a measured reader's handle served from the image, as handle 0 is (`measured`).
pub(super) const IMAGE_HANDLE: u64 = 1 << 63;

/// Whether handle `fh` is served from the node (an image file's), not a descriptor.
pub(super) fn from_node(fh: u64) -> bool {
    fh == 0 || fh & IMAGE_HANDLE != 0
}

impl<S: ByteSource + 'static> UnionFs<S> {
    pub(super) fn open_real(&self, fd: BorrowedFd<'_>, flags: i32) -> Result<u64, Errno> {
        // O_DIRECT is not passed on: FUSE hands us unaligned buffers and lets callers use
        // any alignment, which the host's direct I/O refuses. O_SYNC and O_DSYNC are, so
        // writes are as durable as asked.
        let keep = OFlags::from_bits_truncate(flags as u32)
            & (OFlags::ACCMODE | OFlags::APPEND | OFlags::TRUNC | OFlags::SYNC | OFlags::DSYNC);
        let f = rfs::open(
            Self::real_path(fd).as_c_str(),
            keep | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.pin().insert(fh, f);
        Ok(fh)
    }

    /// The passthrough registration of node `id`, opened as handle `fh`: made on first
    /// use (the kernel takes only the file's path from the descriptor, and `O_PATH` ones
    /// it refuses); `None` for image files, or when the kernel refuses.
    pub(super) fn passthrough_of(
        &self,
        id: u64,
        fh: u64,
        register: Register<'_>,
    ) -> Option<Arc<Passthrough>> {
        let guard = self.nodes.guard();
        let files = self.files.pin();
        let (n, open) = (self.nodes.get(&id, &guard)?, files.get(&fh)?);
        if !self.passthrough || n.upper.is_none() || !n.io.enter(IO_PASSTHROUGH) {
            return None;
        }
        n.io.backing
            .get_or_init(|| register(open.as_fd()).ok().map(Arc::new))
            .clone()
    }

    pub(super) fn with_file<T>(
        &self,
        fh: u64,
        f: impl FnOnce(BorrowedFd<'_>) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let files = self.files.pin();
        let fd = files.get(&fh).ok_or(Errno::BADF)?;
        f(fd.as_fd())
    }

    pub(super) fn open_file(
        &self,
        caller: &Caller,
        id: u64,
        flags: i32,
        register: Register<'_>,
    ) -> Result<Opened, Errno> {
        let writes =
            flags & (rustix::fs::OFlags::ACCMODE.bits() as i32) != 0 || flags & libc_trunc() != 0;
        let run = || -> Result<u64, Errno> {
            if writes && self.with_node(id, |n| Ok(n.upper.is_none()))? {
                let _l = self.lock();
                self.copy_up(id)?;
            }
            // Read-only from the images: served from the node, no descriptor, cached I/O.
            // Marked before the node is read again, so a racing copy-up keeps its opens
            // cached too; if one already went passthrough, the file is upper by now.
            let image_open =
                self.with_node(id, |n| Ok(n.upper.is_none() && n.io.enter(IO_CACHED)))?;
            if image_open {
                return Ok(0);
            }
            self.with_room(|| {
                self.with_node(id, |n| match &n.upper {
                    Some(fd) => self.open_real(fd.as_fd(), flags),
                    None => Err(Errno::IO),
                })
            })
        };
        let fh = self.measured(id, flags, caller.pid, run()?, None)?;
        if from_node(fh) {
            return Ok(Opened {
                fh,
                keep_cache: true,
                ..Opened::default()
            });
        }
        Ok(Opened {
            fh,
            passthrough: self.passthrough_of(id, fh, register),
            ..Opened::default()
        })
    }

    pub(super) fn read_file(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno> {
        if !from_node(fh) {
            return self.with_file(fh, |fd| rustix::io::pread(fd, buf, offset));
        }
        // Opened from the image; once copied up (by a writer), the copy is the file,
        // as in overlayfs.
        self.with_node(ino, |n| {
            self.backing(n)?
                .read(offset, buf)
                .map_err(|e| self.failed("read", Lower::Node(ino), e))
        })
    }

    pub(super) fn write_file(&self, fh: u64, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        self.with_file(fh, |fd| {
            let mut done = 0;
            while done < data.len() {
                done += rustix::io::pwrite(fd, &data[done..], offset + done as u64)?;
            }
            Ok(done)
        })
    }

    pub(super) fn release_file(&self, fh: u64, answer: &mut dyn FnMut()) {
        // Answered first: nobody waits for a release, and a writer's may hash its file.
        answer();
        if fh != 0 {
            let files = self.files.pin();
            let handle = files.remove(&fh);
            self.measure_release(fh, handle.map(|f| f.as_fd()));
        }
    }

    pub(super) fn sync_file(&self, fh: u64, datasync: bool) -> Result<(), Errno> {
        if from_node(fh) {
            return Ok(());
        }
        self.with_file(fh, |fd| {
            if datasync {
                rfs::fdatasync(fd)
            } else {
                rfs::fsync(fd)
            }
        })
    }

    pub(super) fn allocate(
        &self,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        // The modes FUSE forwards (fs/fuse/file.c refuses COLLAPSE_RANGE and INSERT_RANGE
        // itself), passed to the host as they are: none of them exposes old data, as the
        // host zeroes or marks unwritten what it allocates. Anything else is refused.
        let known = rfs::FallocateFlags::KEEP_SIZE
            | rfs::FallocateFlags::PUNCH_HOLE
            | rfs::FallocateFlags::ZERO_RANGE;
        let flags = rfs::FallocateFlags::from_bits_retain(mode as u32);
        if !known.contains(flags) {
            return Err(Errno::OPNOTSUPP);
        }
        self.with_file(fh, |fd| rfs::fallocate(fd, flags, offset, length))
    }
}
