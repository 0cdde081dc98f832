//! Measured opens of a read-only mount: the open is measured (see `measuring`), and a
//! small file's verified bytes are handed to the kernel's page cache with it (`prime`).

use super::ImageFs;
use crate::measuring;
use crate::ops::Errno;
use crate::paths::measured_path;
use crate::stack::Obj;
use erofs::read::{ByteSource, Inode};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Files up to this size are handed to the kernel with their first open (see `prime`):
/// the kernel's default readahead window, what one READ would have fetched.
const PRIME_MAX: u64 = 128 << 10;

/// An inode's open handles (the low bits of its `opens` value), and whether the kernel
/// was handed its bytes (see `prime`).
const OPEN_HANDLES: u64 = u32::MAX as u64;
const PRIMED: u64 = 1 << 32;

thread_local! {
    /// Per worker thread: the buffer a file's bytes are handed over from.
    static PRIME_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl<S: ByteSource + 'static> ImageFs<S> {
    /// A measured open costs a round trip that an unmeasured one (`no_open`) does not;
    /// for a small file it also carries the file's verified bytes into the kernel's page
    /// cache (FUSE_NOTIFY_STORE), so the read that usually follows needs no round trip.
    /// Called before the open is answered, so its own opener cannot be reading yet.
    ///
    /// Only when no other handle is open on the inode: storing locks the inode's pages,
    /// and a reader holding one of those locks while its READ waits for a worker could
    /// otherwise leave every worker stuck here (every reader holds a handle, and the
    /// kernel sends RELEASE only after its reads are done). Once per inode until the
    /// kernel learns it again (`forget_primed`): an inode the kernel keeps keeps its
    /// pages, unless reclaimed, when a read just asks. Best effort: a failure leaves the
    /// cache cold and the read asks.
    pub(super) fn prime(&self, ino: u64, o: Obj, inode: &Inode, flags: i32) {
        let was = {
            let opens = self.opens.pin();
            let o = opens.get_or_insert_with(ino, || AtomicU64::new(0));
            let one_more = |v: u64| Some(((v & OPEN_HANDLES) + 1).min(OPEN_HANDLES) | PRIMED);
            o.fetch_update(Ordering::AcqRel, Ordering::Acquire, one_more)
                .unwrap_or_else(|v| v)
        };
        let first = was & OPEN_HANDLES == 0 && was & PRIMED == 0;
        // Over both transports; how many stores may wait at once is the transport's
        // (`fusewire::Channel::store`). A cold read of 2,000 measured 4 KiB files over
        // io_uring: 9.2k -> 12.3k files/s with it (bench ima).
        if !first || flags & libc::O_DIRECT != 0 {
            return;
        }
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        if !inode.is_reg() || inode.size == 0 || inode.size > PRIME_MAX {
            return;
        }
        let stored = PRIME_BUF.with(|b| {
            // Not worth reading the file for a store that would be refused.
            if !notifier.may_store() {
                return None;
            }
            let mut buf = b.borrow_mut();
            let want = inode.size as usize;
            if buf.len() < want {
                buf.resize(want, 0);
            }
            let n = self.image(o).read(inode, 0, &mut buf[..want]).ok()?;
            notifier.store(ino, 0, &buf[..n]).ok().map(|()| n)
        });
        match (stored, &self.hook.setup) {
            (Some(n), Some(s)) => {
                s.measuring.counters.primed.add(1);
                s.measuring.counters.bytes_primed.add(n as u64);
            }
            (Some(_), None) => {}
            // Refused (too many stores under way) or failed: a later first open tries.
            (None, _) => self.forget_primed(ino),
        }
    }

    /// A handle on `ino` is closed.
    pub(super) fn closed(&self, ino: u64) {
        if let Some(o) = self.opens.pin().get(&ino) {
            let one_less = |v: u64| (v & OPEN_HANDLES > 0).then(|| v - 1);
            let _ = o.fetch_update(Ordering::AcqRel, Ordering::Acquire, one_less);
        }
    }

    /// The kernel learns `ino` (again, perhaps after evicting it and its pages): its next
    /// first open hands its bytes over again.
    pub(super) fn forget_primed(&self, ino: u64) {
        if let Some(o) = self.opens.pin().get(&ino) {
            o.fetch_and(!PRIMED, Ordering::AcqRel);
        }
    }

    /// With a policy: measures an open of `ino` (see `measuring`).
    pub(super) fn measure_open(
        &self,
        ino: u64,
        o: Obj,
        inode: &Inode,
        flags: i32,
        pid: u32,
    ) -> Result<(), Errno> {
        let Some(s) = &self.hook.setup else {
            return Ok(());
        };
        let fs = &s.layers[o.layer as usize];
        if !s.measuring.may_measure(fs) {
            return Ok(());
        }
        let opening = measuring::Opening {
            flags,
            pid,
            owner: (inode.uid, inode.gid),
            fs,
            key: measuring::ContentKey::Image {
                layer: o.layer,
                nid: o.nid,
            },
            cookie: None,
            opens: None,
        };
        let content = ImageContent {
            fs: self,
            ino,
            file: measuring::ImageFile {
                image: self.image(o),
                inode,
            },
            setup: s,
        };
        s.measure(&opening, &content, &self.log, &self.name)
            .map(|_| ())
    }
}

/// An image file's content, for measuring.
pub(super) struct ImageContent<'a, S: ByteSource> {
    fs: &'a ImageFs<S>,
    ino: u64,
    file: measuring::ImageFile<'a, S>,
    setup: &'a measuring::Setup,
}

impl<S: ByteSource + 'static> measuring::Content for ImageContent<'_, S> {
    fn path(&self) -> Vec<u8> {
        measured_path(self.setup, self.ino, |at| self.fs.names.get(at))
    }

    fn reader(&self, _size: Option<u64>) -> std::io::Result<(Box<dyn std::io::Read + '_>, u64)> {
        Ok(self.file.reader())
    }

    fn verity_digest(&self) -> std::io::Result<Option<[u8; 32]>> {
        self.file.verity_digest()
    }

    fn ima_xattr(&self) -> Option<Vec<u8>> {
        self.file.ima_xattr()
    }
}
