//! `--prefetch`: one background thread reads the whole image through the verified source, so
//! every block is checked and cached, while readers come first.
//!
//! - It waits while a reader's fetch is under way, at the lowest CPU priority.
//! - It stops when the cache is full (or absent); a step whose bytes fail their hash is
//!   skipped.

use crate::{RemoteSource, BACKGROUND};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use verity::source::ByteSource;

/// Bytes read per step: one request, small enough that a reader needing one of its
/// chunks does not wait long for it.
const STEP: u64 = 1 << 20;
/// How long to wait after a failed step, at first and at most (it doubles in between).
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How far a prefetch has come, for `verilay stats`.
#[derive(Default, Debug)]
pub struct Progress {
    /// Bytes of the verified data in the cache or read so far, of `total`.
    pub done: AtomicU64,
    /// Bytes to prefetch: the verified data's length.
    pub total: AtomicU64,
    /// Steps whose read failed: a failed fetch is tried again after a wait, bytes that
    /// fail their hash are passed over.
    pub failures: AtomicU64,
}

/// Starts prefetching `verified` (the checked view of `remote`'s image, whose data is its
/// first `verified.len()` bytes); returns its progress.
/// A thread that cannot be made leaves the image to be fetched as read (`Err`).
pub fn start(
    remote: Arc<RemoteSource>,
    verified: Arc<dyn ByteSource>,
) -> std::io::Result<Arc<Progress>> {
    let progress = Arc::new(Progress::default());
    progress.total.store(verified.len(), Ordering::Relaxed);
    let p = progress.clone();
    std::thread::Builder::new()
        .name("prefetch".into())
        .spawn(move || run(&remote, &*verified, &p))?;
    Ok(progress)
}

fn run(remote: &RemoteSource, verified: &dyn ByteSource, progress: &Progress) {
    BACKGROUND.with(|b| b.set(true));
    // Lowest priority for this thread's hashing (Linux: per thread).
    let _ = rustix::process::setpriority_process(None, 19);
    let len = verified.len();
    let mut buf = vec![0u8; STEP as usize];
    let mut at = 0;
    let mut backoff = FIRST_BACKOFF;
    while at < len {
        if remote.cache().is_none_or(|c| c.full()) {
            // What it fetches could not be kept: the rest is left to readers.
            return;
        }
        let n = STEP.min(len - at);
        if !remote.cached(at, n) {
            while remote.counters.demand.load(Ordering::Relaxed) > 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            match verified.read_exact_at(&mut buf[..n as usize], at) {
                Ok(()) => backoff = FIRST_BACKOFF,
                // Bytes that fail their hash after the source's second fetch: the server
                // keeps them wrong, and trying again brings nothing. Readers of them get
                // EIO; the prefetch goes on.
                Err(e) if verity::verified::IntegrityError::find(&e).is_some() => {
                    progress.failures.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    progress.failures.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            }
        }
        at += n;
        progress.done.store(at, Ordering::Relaxed);
    }
}
