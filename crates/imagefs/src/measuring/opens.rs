//! How one file is open through a writable mount, as IMA's violation checks need it.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

/// How one file is open through a writable mount, as IMA's `ima_rdwr_violation_check`
/// needs it: the handles that can write (the kernel's `i_writecount`), the read-only
/// handles whose open the policy measured, and the iint's two bits that let each
/// violation be recorded once per event. Only opens of layers the policy can measure
/// touch it; a mount without a policy never does.
///
/// The FUSE engine counts a FUSE inode's handles as it opens and releases them. The
/// kernel engine asks the kernel how the file is open at the moment of each open
/// ([`Opens::as_seen`]): then its counts are exact and nothing waits for them to change.
#[derive(Default)]
pub struct Opens {
    writers: AtomicU32,
    readers: AtomicU32,
    bits: Arc<AtomicU8>,
    /// Counts as seen a moment ago: no close is on its way to them.
    seen: bool,
}

/// A measured reader opened the file since the last ToMToU (`IMA_MAY_EMIT_TOMTOU`).
const MAY_EMIT_TOMTOU: u8 = 1;
/// An open_writers violation was recorded since the last writer closed
/// (`IMA_EMITTED_OPENWRITERS`).
const EMITTED_OPEN_WRITERS: u8 = 2;

impl Opens {
    /// How a file is open as the kernel sees it now (whether it has writers, whether it
    /// has read-only handles), with the file's two bits, kept from open to open.
    pub fn as_seen(writers: bool, readers: bool, bits: Arc<AtomicU8>) -> Opens {
        if !writers {
            // The last writer closed since the bit was set, if it was: as
            // ima_check_last_writer, which would have cleared it then.
            bits.fetch_and(!EMITTED_OPEN_WRITERS, Ordering::SeqCst);
        }
        Opens {
            writers: AtomicU32::new(writers.into()),
            readers: AtomicU32::new(readers.into()),
            bits,
            seen: true,
        }
    }

    /// Whether a write open now would ask for readers (`Opens::time_of_use`): a
    /// measured reader opened since the last ToMToU (`bits` as [`Opens::as_seen`] takes them).
    pub fn may_emit_tomtou(bits: &AtomicU8) -> bool {
        bits.load(Ordering::SeqCst) & MAY_EMIT_TOMTOU != 0
    }

    /// The file's two bits.
    pub fn bits(&self) -> &Arc<AtomicU8> {
        &self.bits
    }

    /// Counts seen a moment ago ([`Opens::as_seen`]): no close is on its way to them.
    pub(super) fn seen(&self) -> bool {
        self.seen
    }

    /// A handle that can write is being opened: counted before its measurement, so that
    /// keeps no digest.
    pub fn writer_opened(&self) {
        self.writers.fetch_add(1, Ordering::SeqCst);
    }

    /// A handle that can write closed (or its open failed). True when it was the last:
    /// then a measured reader records open_writers again (`ima_check_last_writer`).
    pub fn writer_closed(&self) -> bool {
        let last = self.writers.fetch_sub(1, Ordering::SeqCst) == 1;
        if last {
            self.bits.fetch_and(!EMITTED_OPEN_WRITERS, Ordering::SeqCst);
        }
        last
    }

    /// A handle [`Measured::reader`](super::Measured::reader) counted closed.
    /// True when it was the last.
    pub fn reader_closed(&self) -> bool {
        self.readers.fetch_sub(1, Ordering::SeqCst) == 1
    }

    pub(super) fn readers(&self) -> bool {
        self.readers.load(Ordering::SeqCst) > 0
    }

    pub(super) fn writers(&self) -> bool {
        self.writers.load(Ordering::SeqCst) > 0
    }

    /// A write open: whether it makes a ToMToU violation, as in the kernel: a measured
    /// reader has the file open, and one opened it since the last ToMToU.
    pub(super) fn time_of_use(&self) -> bool {
        self.readers.load(Ordering::SeqCst) > 0
            && self.bits.fetch_and(!MAY_EMIT_TOMTOU, Ordering::SeqCst) & MAY_EMIT_TOMTOU != 0
    }

    /// A read-only open the policy measures: counted (the returned guard takes the count
    /// back unless kept), and whether it makes an open_writers violation: a writer has the
    /// file open, and none was recorded since the last writer closed. Counted before the
    /// writers are looked at (and a writer counts itself before looking at the readers),
    /// so of a reader and a writer opening at once, at least one sees the other.
    pub(super) fn measured_reader(&self) -> (ReaderCount<'_>, bool) {
        self.bits.fetch_or(MAY_EMIT_TOMTOU, Ordering::SeqCst);
        // Seen for this open alone, the reader is the kernel's to count.
        if !self.seen {
            self.readers.fetch_add(1, Ordering::SeqCst);
        }
        let open_writers = self.writers()
            && self.bits.fetch_or(EMITTED_OPEN_WRITERS, Ordering::SeqCst) & EMITTED_OPEN_WRITERS
                == 0;
        (ReaderCount((!self.seen).then_some(self)), open_writers)
    }
}

/// A measured reader's count, taken back when dropped unless [`ReaderCount::keep`] says
/// the open succeeded.
pub(super) struct ReaderCount<'a>(pub(super) Option<&'a Opens>);

impl ReaderCount<'_> {
    pub(super) fn keep(mut self) -> bool {
        self.0.take().is_some()
    }
}

impl Drop for ReaderCount<'_> {
    fn drop(&mut self) {
        if let Some(o) = self.0 {
            o.reader_closed();
        }
    }
}
