//! `--prefetch`: background threads fetch the whole image, a step at a time, each step in
//! one request straight into a buffer of its own, check it against the tree and store it
//! in the cache, while readers come first.
//!
//! - [`WORKERS`] threads: several steps are in flight while others are hashed, so the link
//!   stays busy across its round trip and the hashing runs on every CPU.
//! - Steps grow from [`FIRST_STEP`] to [`STEP`] with the bytes done: a cache that is full
//!   at once costs a few MiB fetched for nothing, not every thread's full step.
//! - They wait while a reader's fetch is under way, at the lowest CPU priority.
//! - They stop when the cache is full (or absent). A step whose bytes fail their hash is
//!   read again through the verified source, which fetches them anew; bytes that fail
//!   again are skipped.

use crate::{RemoteSource, BACKGROUND};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use verity::source::ByteSource;
use verity::verified::{IntegrityError, VerifiedSource};

/// The first steps' length, and what steps are multiples of.
pub const FIRST_STEP: u64 = 1 << 20;
/// The longest step: one request, and the buffer each thread holds.
pub const STEP: u64 = 16 << 20;
/// Prefetch threads: with [`STEP`], 64 MiB in flight, enough for a link of 1 GB/s and
/// 50 ms round trips.
pub const WORKERS: usize = 4;
/// How long to wait after a failed step, at first and at most (it doubles in between).
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How far a prefetch has come, for `verilay stats`.
#[derive(Default, Debug)]
pub struct Progress {
    /// Bytes of the verified data found in the cache or read so far, of `total`.
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
pub fn start<S: ByteSource + 'static>(
    remote: Arc<RemoteSource>,
    verified: Arc<VerifiedSource<S>>,
) -> std::io::Result<Arc<Progress>> {
    let progress = Arc::new(Progress::default());
    progress.total.store(verified.len(), Ordering::Relaxed);
    let next = Arc::new(AtomicU64::new(0));
    for k in 0..WORKERS {
        let (remote, verified, p, next) = (
            remote.clone(),
            verified.clone(),
            progress.clone(),
            next.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("prefetch".into())
            .spawn(move || run(&remote, &*verified, &p, &next));
        // The first thread is needed; the others only make it faster.
        if let Err(e) = spawned {
            if k == 0 {
                return Err(e);
            }
            break;
        }
    }
    Ok(progress)
}

/// One worker: takes the next step from `next` until the image is done.
fn run<S: ByteSource>(
    remote: &RemoteSource,
    verified: &VerifiedSource<S>,
    progress: &Progress,
    next: &AtomicU64,
) {
    BACKGROUND.with(|b| b.set(true));
    // Lowest priority for this thread's hashing (Linux: per thread).
    let _ = rustix::process::setpriority_process(None, 19);
    let len = verified.len();
    let mut buf = Vec::new();
    let mut backoff = FIRST_BACKOFF;
    let step = |done: u64| done.clamp(FIRST_STEP, STEP) / FIRST_STEP * FIRST_STEP;
    let mut n = step(progress.done.load(Ordering::Relaxed));
    let mut at = next.fetch_add(n, Ordering::Relaxed);
    while at < len {
        n = n.min(len - at);
        // What of the step the cache lacks, to the MiB: readers may have read some.
        let piece = |k: u64| {
            (
                at + k * FIRST_STEP,
                FIRST_STEP.min(at + n - (at + k * FIRST_STEP)),
            )
        };
        let pieces = n.div_ceil(FIRST_STEP);
        let missing = |k: &u64| {
            let (a, m) = piece(*k);
            !remote.cached(a, m)
        };
        if let Some(first) = (0..pieces).find(missing) {
            if !remote.background_turn() {
                // The cache is full: the rest is left to readers.
                return;
            }
            let last = (0..pieces).rev().find(missing).unwrap_or(first);
            let from = piece(first).0;
            let (l, m) = piece(last);
            let want = (l + m - from) as usize;
            buf.resize(want.max(buf.len()), 0);
            match fetch_checked(remote, verified, &mut buf[..want], from) {
                Ok(()) => backoff = FIRST_BACKOFF,
                // Bytes that fail their hash after the source's second fetch: the server
                // keeps them wrong, and trying again brings nothing. Readers of them get
                // EIO; the prefetch goes on.
                Err(e) if IntegrityError::find(&e).is_some() => {
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
        let done = progress.done.fetch_add(n, Ordering::Relaxed) + n;
        n = step(done);
        at = next.fetch_add(n, Ordering::Relaxed);
    }
}

/// `buf.len()` bytes at `at` fetched in one request, checked and stored; bytes that fail
/// their hash are read again through the verified source, which fetches them anew (as a
/// reader would: the wrong ones may have come from a proxy, and the server's be right).
fn fetch_checked<S: ByteSource>(
    remote: &RemoteSource,
    verified: &VerifiedSource<S>,
    buf: &mut [u8],
    at: u64,
) -> std::io::Result<()> {
    remote.fetch_into(at, buf)?;
    match verified.check_fetched(at, buf) {
        Err(e) if IntegrityError::find(&e).is_some() => verified.read_exact_at(buf, at),
        r => r,
    }
}
