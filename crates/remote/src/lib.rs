//! A remote image (`oci://` or an `http(s)://` file) as a [`ByteSource`]: range requests in
//! aligned 4 KiB chunks, one fetch in flight per chunk, held in memory up to a bound.
//!
//! - Trusts no byte: the verified source above checks each block; what fails is forgotten and
//!   fetched again; what passed goes to the [`cache::Cache`].
//! - A fetch hands each chunk over as its bytes arrive: a reader waits for its own chunk,
//!   not for the rest of the range.
//! - A sequential reader gets the window after the one it is in fetched ahead of it, in
//!   pieces on several connections at once, the window doubling up to [`AHEAD_MAX`].
//! - Each try is bounded in time.

#![forbid(unsafe_code)]

pub mod cache;
pub mod prefetch;

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use verity::source::ByteSource;

/// The unit of fetching and of the memory cache: a random 4 KiB read fetches one block
/// (so a sparse reader fetches little more than it reads), a sequential one gets runs
/// of them (see [`MAX_RUN`]).
pub const CHUNK: u64 = 4096;
/// Chunks held in memory (128 MiB): fetched and not yet read, or, without a persistent
/// cache, read too. Beyond it the oldest are dropped.
const KEPT: u64 = 32768;
/// `KEPT` in bytes: what a mount holds in memory per remote image, besides the chunks
/// its fetches under way are filling.
pub const HELD_MAX: u64 = KEPT * CHUNK;
/// Chunks the table remembers (512 MiB of the image): those read and kept in the
/// persistent cache stay as empty entries, so a sequential reader is still seen as one.
const ENTRIES: usize = 4 * KEPT as usize;
/// The most chunks a reader's own request fetches (4 MiB).
pub const MAX_RUN: u64 = 1024;
/// The largest window fetched ahead of a sequential reader (32 MiB): at the speed of a
/// local disk (~300 MB/s through the verified mount) about 100 ms of reading, which covers
/// a 50 ms round trip with room to spare.
pub const AHEAD_MAX: u64 = 8192;
/// The most chunks one readahead request fetches (8 MiB): a window is fetched in pieces
/// this large, one per readahead thread and connection.
const REQUEST_MAX: u64 = 2048;
/// A neighbourhood (256 KiB) read densely once [`DENSE`] of its chunks are here.
const WINDOW: u64 = 64;
const DENSE: u64 = 8;
/// A reader with at least this many chunks right behind a miss is sequential: the
/// readahead threads fetch the next window while it reads this one.
const SEQUENTIAL: u64 = 16;
const READAHEAD_THREADS: usize = 4;
/// The least share of [`RemoteSource::fetch_in_pieces`]'s threads (256 KiB): smaller ones
/// cost a request each for little.
const PIECE_MIN: u64 = 64;
/// Attempts per chunk, and the wait before the first retry (then four times longer).
pub const ATTEMPTS: u32 = 3;
/// `VERILAY_FETCH_EXACT=1`: no runs, no readahead, one request per 4 KiB chunk a read
/// touches. Slow, but what it fetches is the least any fetcher that checks 4 KiB blocks
/// can fetch for the same reads: the floor the benchmark holds the real policy against.
pub const EXACT_ENV: &str = "VERILAY_FETCH_EXACT";
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// How long background work waits before looking again whether readers' fetches ended.
const BACKGROUND_WAIT: Duration = Duration::from_millis(20);

/// What fetching has cost, for `verilay stats` and the tests.
#[derive(Default, Debug)]
pub struct Counters {
    /// Range requests sent, retries included.
    pub requests: AtomicU64,
    /// Bytes fetched and kept (a try that failed midway keeps the chunks that came whole).
    pub fetched: AtomicU64,
    /// Requests that failed and were tried again.
    pub retries: AtomicU64,
    /// Fetches that failed: every attempt failed, or the server was down.
    pub failures: AtomicU64,
    /// Fetches under way for readers (not the prefetcher), which it yields to.
    pub demand: AtomicU64,
}

thread_local! {
    /// Set on the prefetcher's thread: its fetches do not count as demand.
    pub(crate) static BACKGROUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Where a remote image's bytes come from.
pub struct RemoteSource {
    registry: oci::Registry,
    url: String,
    /// For messages: the reference or URL as given.
    name: String,
    len: u64,
    chunks: Mutex<Chunks>,
    /// What fetching this image has cost.
    pub counters: Arc<Counters>,
    cache: Option<cache::Cache>,
    /// Chunks whose bytes are in memory (see [`Piece`]).
    memory: Arc<Memory>,
    /// Windows for the readahead threads to fetch (see [`RemoteSource::shared`]).
    ahead: OnceLock<Arc<Queue>>,
    /// Fetch only the chunks reads touch, one request each ([`EXACT_ENV`]).
    exact: bool,
    /// Whether the server answers ([`RemoteSource::fetch`]); `health_changed` wakes the
    /// requests waiting for a probe.
    health: Mutex<Health>,
    health_changed: Condvar,
}

/// Who fetches a range, for what a server that is down means to it (see `fetch`).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Fetcher {
    /// A reader whose read was asked at this instant: it waits for a try under way, or
    /// makes one, unless the last failed try answers for it.
    Reader(Instant),
    /// Readahead: fails at once while the server is down.
    Readahead,
    /// The prefetch: fails at once while the server is down, and its own failures leave
    /// the server's state alone (it waits and tries again itself).
    Prefetch,
}

impl Fetcher {
    /// Whether it fails at once while the server is down (see `fetch`), rather than wait
    /// for a try under way or make one: readahead and the prefetch always, a reader when
    /// the last failed try answers for it.
    fn fails_at_once(self, down: &Down) -> bool {
        match self {
            Fetcher::Reader(asked) => down.recent(asked),
            Fetcher::Readahead | Fetcher::Prefetch => true,
        }
    }
}

/// The server's state as the last requests found it.
#[derive(Default)]
struct Health {
    /// The last request failed every attempt.
    down: Option<Down>,
    /// A request is trying the server while it is down.
    probing: bool,
}

/// The last failed try of a server.
struct Down {
    why: String,
    tried: Instant,
    ended: Instant,
}

impl Down {
    /// Whether this try answers for a request `asked` then: it started after, or it
    /// ended less than its own length ago (a server that refuses at once is tried
    /// again at once; one that lets a try run into its timeout rests as long).
    fn recent(&self, asked: Instant) -> bool {
        self.tried >= asked || self.ended.elapsed() < self.ended - self.tried
    }
}

/// Chunks whose bytes are alive, and how many of them no reader has read yet.
#[derive(Default)]
struct Memory {
    held: AtomicU64,
    unread: AtomicU64,
}

/// A chunk's bytes, counted in [`Memory`] while they are alive.
pub(crate) struct Piece {
    bytes: Vec<u8>,
    memory: Arc<Memory>,
    unread: std::sync::atomic::AtomicBool,
}

impl Piece {
    fn new(bytes: Vec<u8>, memory: &Arc<Memory>) -> Piece {
        memory.held.fetch_add(1, Ordering::Relaxed);
        memory.unread.fetch_add(1, Ordering::Relaxed);
        Piece {
            bytes,
            memory: memory.clone(),
            unread: true.into(),
        }
    }

    /// A reader has its bytes.
    fn read(&self) {
        if self.unread.swap(false, Ordering::Relaxed) {
            self.memory.unread.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        self.memory.held.fetch_sub(1, Ordering::Relaxed);
        self.read();
    }
}

impl std::ops::Deref for Piece {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

type Slot = Arc<Mutex<Option<Arc<Piece>>>>;

/// Chunks for a readahead thread to fetch; `background` when the reader it is ahead of is
/// the prefetch (whose fetches do not count as demand, and wait for readers' to end).
struct Window {
    start: u64,
    n: u64,
    background: bool,
}

/// Windows waiting for the readahead threads: readers' first, the prefetch's when none of
/// theirs waits. At most [`QUEUED`] of each kind wait: past that the oldest is dropped
/// (its reader has gone on, or will fetch it itself).
#[derive(Default)]
struct Queue {
    jobs: Mutex<Jobs>,
    ready: Condvar,
}

#[derive(Default)]
struct Jobs {
    demand: VecDeque<Window>,
    background: VecDeque<Window>,
    closed: bool,
}

/// Windows waiting per kind (see [`Queue`]).
const QUEUED: usize = 64;

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, w: Window) {
        let mut jobs = self.lock();
        let q = if w.background {
            &mut jobs.background
        } else {
            &mut jobs.demand
        };
        if q.len() >= QUEUED {
            q.pop_front();
        }
        q.push_back(w);
        drop(jobs);
        self.ready.notify_one();
    }

    /// The next window, or `None` once the source is gone.
    fn next(&self) -> Option<Window> {
        let mut jobs = self.lock();
        loop {
            if jobs.closed {
                return None;
            }
            if let Some(w) = jobs
                .demand
                .pop_front()
                .or_else(|| jobs.background.pop_front())
            {
                return Some(w);
            }
            jobs = self.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Readers' windows waiting for a thread.
    fn demand_waiting(&self) -> usize {
        self.lock().demand.len()
    }

    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

#[derive(Default)]
struct Chunks {
    slots: HashMap<u64, Slot>,
    order: VecDeque<u64>,
    /// The chunk of each window scheduled ahead where its reader first asks for one (its
    /// first not in the cache), and the window's length from there: the reader reaching
    /// it asks for the next window (see `next_window`).
    marks: HashMap<u64, u64>,
}

/// The chunks one request fills: `Some` (a held lock) for each missing chunk it claims,
/// `None` for a chunk already here that it spans, fetched again and dropped. A request
/// costs a server far more than a few spare KiB (docker-registry: ~3 ms of CPU each, the
/// price of 4 MiB of body), so a run goes on past chunks another reader took, as long as
/// what it claims outweighs what it spans; it stops at a chunk being fetched.
type Claim<'a> = Vec<Option<std::sync::MutexGuard<'a, Option<Arc<Piece>>>>>;

/// Claims from `slots` (`None`: in the persistent cache) for a request that has already
/// claimed `got` chunks before them; never ends with a spanned chunk. Only a sequential
/// reader's runs and readahead `span`: a sparse reader's would fetch what it has.
fn claim(slots: &[Option<Slot>], mut got: usize, span: bool) -> Claim<'_> {
    let mut out = Vec::new();
    let mut spanned = 0;
    for s in slots {
        let guard = match s.as_ref().map(|s| s.try_lock()) {
            Some(Ok(g)) if g.is_none() => Some(g),
            Some(Err(std::sync::TryLockError::WouldBlock)) => break,
            _ => None, // here already
        };
        match guard {
            Some(g) => {
                got += 1;
                out.push(Some(g));
            }
            None if span && spanned < got => {
                spanned += 1;
                out.push(None);
            }
            None => break,
        }
    }
    while matches!(out.last(), Some(None)) {
        out.pop();
    }
    out
}

/// Where a fetch's bytes go as they arrive; a try after a failed one asks only for what
/// has not been taken yet.
trait Sink {
    /// Bytes taken so far, from the range's start.
    fn taken(&self) -> u64;
    /// Reads the rest of the range from `body`.
    fn take(&mut self, body: &mut dyn Read) -> io::Result<()>;
}

/// The range's bytes into a buffer of its length.
struct ToSlice<'b> {
    buf: &'b mut [u8],
    taken: usize,
}

impl Sink for ToSlice<'_> {
    fn taken(&self) -> u64 {
        self.taken as u64
    }

    fn take(&mut self, body: &mut dyn Read) -> io::Result<()> {
        // Counted as they come: what came before a failure is kept.
        if !fill(body, self.buf, &mut self.taken)? {
            return Err(oci::registry::short_body(self.taken as u64));
        }
        Ok(())
    }
}

/// Each chunk into the slot claimed for it, whose lock is let go as soon as the chunk is
/// in: a reader waiting for it goes on while the rest of the range comes. A chunk the
/// request spans but did not claim is read and dropped.
struct ToSlots<'c, 'g> {
    claimed: &'c mut Claim<'g>,
    memory: &'c Arc<Memory>,
    /// The first chunk's bytes once taken: a reader's own chunk, which another reader may
    /// take out of its slot (into the cache) before the range ends.
    first: Option<Arc<Piece>>,
    /// Chunks taken.
    done: usize,
    /// The range's length: its last chunk is short at the image's end.
    len: u64,
}

impl<'c, 'g> ToSlots<'c, 'g> {
    /// For `claimed`, the chunks from chunk `first` on of an image of `image` bytes.
    fn new(claimed: &'c mut Claim<'g>, memory: &'c Arc<Memory>, first: u64, image: u64) -> Self {
        let len = (CHUNK * claimed.len() as u64).min(image - first * CHUNK);
        ToSlots {
            claimed,
            memory,
            first: None,
            done: 0,
            len,
        }
    }
}

impl Sink for ToSlots<'_, '_> {
    fn taken(&self) -> u64 {
        (self.done as u64 * CHUNK).min(self.len)
    }

    fn take(&mut self, body: &mut dyn Read) -> io::Result<()> {
        while self.done < self.claimed.len() {
            let n = CHUNK.min(self.len - self.taken()) as usize;
            let mut piece = vec![0u8; n];
            let mut got = 0;
            if !fill(body, &mut piece, &mut got)? {
                return Err(oci::registry::short_body(self.taken() + got as u64));
            }
            let piece = Arc::new(Piece::new(piece, self.memory));
            if self.done == 0 {
                self.first = Some(piece.clone());
            }
            if let Some(mut g) = self.claimed[self.done].take() {
                *g = Some(piece);
            }
            self.done += 1;
        }
        Ok(())
    }
}

/// Reads into `buf[*got..]` until `buf` is full, counting in `got` as bytes come (what
/// came before an error stays counted); `false` if the body ended first.
fn fill(body: &mut dyn Read, buf: &mut [u8], got: &mut usize) -> io::Result<bool> {
    while *got < buf.len() {
        match body.read(&mut buf[*got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => *got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Whether `s` names a remote image rather than a file.
pub fn is_remote(s: &str) -> bool {
    s.starts_with("oci://") || s.starts_with("http://") || s.starts_with("https://")
}

/// What a remote image's reference pins, besides `--digest`.
pub struct Opened {
    /// The remote image.
    pub source: RemoteSource,
    /// The image digest a manifest named by its own digest records (it pins the image).
    pub pinned: Option<String>,
}

impl RemoteSource {
    /// Opens `spec`: an `oci://` reference (its manifest fetched now; a verilay image
    /// artifact, see `oci::artifact`) or an `http(s)://` URL of an image file.
    /// `insecure`: plain HTTP to a registry on this machine. With `trust`, the manifest
    /// of an `oci://` reference must satisfy its policy before the manifest is even read
    /// for its blob (a URL has no manifest: the policy does not apply to it).
    pub fn open(
        spec: &str,
        insecure: bool,
        timeout: Duration,
        trust: Option<&signatures::Trust>,
    ) -> Result<Opened, String> {
        if spec.starts_with("oci://") {
            let r = oci::Reference::parse(spec)?;
            let registry =
                oci::Registry::connect(&r, insecure, timeout).map_err(|e| e.to_string())?;
            let (manifest, media_type) = registry
                .get_manifest(&r.repository, r.target_str())
                .map_err(|e| e.to_string())?;
            let by_digest = matches!(r.target, oci::reference::Target::Digest(_));
            let digest = oci::registry::sha256_digest(&manifest);
            if by_digest && digest != r.target_str() {
                return Err(format!(
                    "{r}: the registry sent another manifest than the one pinned"
                ));
            }
            // The digest of the bytes in hand, not of whatever the tag names by now: the
            // manifest accepted is the one whose blob is read.
            if let Some(trust) = trust {
                trust.check(&registry, &r, &digest)?;
            }
            let image =
                oci::artifact::image_of(&manifest, &media_type).map_err(|e| format!("{r}: {e}"))?;
            let url = registry.blob_url(&r.repository, &image.blob.digest);
            let source = RemoteSource::new(registry, url, spec, image.blob.size);
            Ok(Opened {
                source,
                pinned: image.digest.filter(|_| by_digest),
            })
        } else {
            let registry = oci::Registry::for_url(spec, timeout).map_err(|e| e.to_string())?;
            let len = registry.size_of(spec).map_err(|e| e.to_string())?;
            Ok(Opened {
                source: RemoteSource::new(registry, spec.to_string(), spec, len),
                pinned: None,
            })
        }
    }

    fn new(registry: oci::Registry, url: String, name: &str, len: u64) -> RemoteSource {
        RemoteSource {
            registry,
            url,
            name: name.to_string(),
            len,
            chunks: Mutex::new(Chunks::default()),
            counters: Arc::new(Counters::default()),
            memory: Arc::default(),
            cache: None,
            ahead: OnceLock::new(),
            exact: std::env::var_os(EXACT_ENV).is_some_and(|v| v == "1"),
            health: Mutex::default(),
            health_changed: Condvar::new(),
        }
    }

    /// The source, shared, with `READAHEAD_THREADS` threads fetching ahead of
    /// sequential readers (a reader then finds its next chunks fetched while it worked
    /// on the last ones). The threads end with the source.
    pub fn shared(self) -> Arc<RemoteSource> {
        let me = Arc::new(self);
        let queue = Arc::new(Queue::default());
        for _ in 0..READAHEAD_THREADS {
            let (weak, q) = (Arc::downgrade(&me), queue.clone());
            let worker = std::thread::Builder::new()
                .name("readahead".into())
                .spawn(move || {
                    while let Some(w) = q.next() {
                        let Some(src) = weak.upgrade() else {
                            return;
                        };
                        BACKGROUND.with(|b| b.set(w.background));
                        src.fill(w.start, w.n);
                    }
                });
            if worker.is_err() {
                queue.close();
                return me; // no readahead: readers fetch for themselves
            }
        }
        let _ = me.ahead.set(queue);
        me
    }

    /// Asks the readahead threads for the window of chunks `start..start + n`, in pieces
    /// of at most [`REQUEST_MAX`] fetched at once, and marks its first chunk: the reader
    /// reaching it asks for the next window, twice as long (at most [`AHEAD_MAX`]).
    fn schedule(&self, start: u64, n: u64) {
        self.push_windows(start, n, true);
    }

    /// [`schedule`](Self::schedule), the mark only if `marked`.
    fn push_windows(&self, start: u64, n: u64, marked: bool) {
        let end = (start + n).min(self.len.div_ceil(CHUNK));
        let Some(queue) = self.ahead.get() else {
            return;
        };
        // The mark goes where the reader will ask for a chunk: a chunk the persistent
        // cache holds is read from there.
        let Some(mark) = (start..end).find(|&j| !self.chunk_cached(j)) else {
            return;
        };
        if marked {
            self.lock_chunks().marks.insert(mark, end - mark);
        }
        let background = BACKGROUND.with(|b| b.get());
        for piece in (mark..end).step_by(REQUEST_MAX as usize) {
            queue.push(Window {
                start: piece,
                n: REQUEST_MAX.min(end - piece),
                background,
            });
        }
    }

    /// Asks the readahead threads for the chunks holding `[offset, offset + len)`, to be
    /// fetched while the caller waits for something else (the image's head while its
    /// tree comes: a mount's first reads, one round trip each otherwise). Unmarked: a
    /// reader reaching them asks for no window after them (a walk of the metadata is no
    /// sequential reader, and windows doubling from there would fetch file data).
    pub fn fetch_ahead(&self, offset: u64, len: u64) {
        if !self.exact && len > 0 {
            let first = offset / CHUNK;
            self.push_windows(first, (offset + len).div_ceil(CHUNK) - first, false);
        }
    }

    /// Fetches `[offset, offset + len)` now on `READAHEAD_THREADS - 1` connections at
    /// once, each reading its share (at least 256 KiB) in runs of at most [`MAX_RUN`]
    /// chunks, and returns when they ended: for bytes wanted whole at once (the tree,
    /// at open), which one reader would fetch in runs one after another. Only a head
    /// start: what fails is fetched when it is read.
    pub fn fetch_in_pieces(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.len);
        if self.exact || offset >= end {
            return;
        }
        let first = offset / CHUNK;
        let n = end.div_ceil(CHUNK) - first;
        let share = n.div_ceil(READAHEAD_THREADS as u64 - 1).max(PIECE_MIN);
        let fetch = |at: u64| {
            let to = ((at + share) * CHUNK).min(end);
            let mut buf = vec![0u8; (MAX_RUN * CHUNK).min(to - at * CHUNK) as usize];
            let mut from = at * CHUNK;
            while from < to {
                let m = buf.len().min((to - from) as usize);
                if self.read_exact_at(&mut buf[..m], from).is_err() {
                    return;
                }
                from += m as u64;
            }
        };
        std::thread::scope(|s| {
            for at in (first..first + n).step_by(share as usize).skip(1) {
                // A share whose thread cannot be made is fetched here.
                if std::thread::Builder::new()
                    .spawn_scoped(s, move || fetch(at))
                    .is_err()
                {
                    fetch(at);
                }
            }
            fetch(first);
        });
    }

    /// The window after a sequential reader's `n` chunks ending at chunk `end`: twice as
    /// long, at most [`AHEAD_MAX`], and at most half the room left in memory by chunks
    /// fetched and not yet read (so readers' windows never push out each other's).
    fn next_window(&self, end: u64, n: u64) {
        let n = self.window_len(n);
        if n > 0 {
            self.schedule(end, n);
        }
    }

    /// The length of the window after a run of `n` (see `next_window`).
    fn window_len(&self, n: u64) -> u64 {
        let unread = self.memory.unread.load(Ordering::Relaxed);
        let room = KEPT.saturating_sub(unread) / 2;
        (2 * n).clamp(1, AHEAD_MAX).min(room)
    }

    /// A readahead thread's job: fetches what of `start..start + n` is missing and free,
    /// in as few requests as the chunks other fetches hold allow.
    fn fill(&self, start: u64, n: u64) {
        let mut slots = self.slots(start, start + n);
        let mut at = 0;
        while at < slots.len() {
            if BACKGROUND.with(|b| b.get()) && !self.background_turn() {
                return;
            }
            if at > 0 {
                // Looked at again after each fetch: a reader may have fetched, checked and
                // cached chunks of the window meanwhile, and emptied their slots.
                let rest = self.slots(start + at as u64, start + n);
                slots.truncate(at);
                slots.extend(rest);
            }
            // Chunks here already or coming are skipped, not spanned.
            at += slots[at..]
                .iter()
                .take_while(|s| {
                    s.as_ref()
                        .is_none_or(|s| s.try_lock().map_or(true, |g| g.is_some()))
                })
                .count();
            let mut claimed = claim(&slots[at..], 0, true);
            if claimed.is_empty() {
                return;
            }
            let from = start + at as u64;
            at += claimed.len();
            let mut sink = ToSlots::new(&mut claimed, &self.memory, from, self.len);
            if self
                .fetch(from * CHUNK, sink.len, Fetcher::Readahead, &mut sink)
                .is_err()
            {
                return; // the reader will fetch for itself, and report what fails
            }
        }
    }

    /// The slots of chunks `from..to` (within the image), `None` for those the persistent
    /// cache holds: what a request starting at `from` may fetch.
    fn slots(&self, from: u64, to: u64) -> Vec<Option<Slot>> {
        let mut c = self.lock_chunks();
        (from..to.min(self.len.div_ceil(CHUNK)))
            .map(|j| (!self.chunk_cached(j)).then(|| self.slot_in(&mut c, j)))
            .collect()
    }

    fn lock_chunks(&self) -> std::sync::MutexGuard<'_, Chunks> {
        self.chunks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps verified bytes in (and serves them from) `cache`, the entry for this image.
    pub fn with_cache(mut self, cache: cache::Cache) -> RemoteSource {
        self.cache = Some(cache);
        self
    }

    /// Whether background work (the prefetch, and the readahead ahead of it) may fetch
    /// now: it waits while a reader's fetch is under way, and stops once the cache is full
    /// or absent (what it fetched could not be kept).
    pub(crate) fn background_turn(&self) -> bool {
        loop {
            if self.cache().is_none_or(|c| c.full()) {
                return false;
            }
            if self.counters.demand.load(Ordering::Relaxed) == 0 {
                return true;
            }
            std::thread::sleep(BACKGROUND_WAIT);
        }
    }

    /// Bytes of fetched chunks in memory.
    pub fn held_bytes(&self) -> u64 {
        self.memory.held.load(Ordering::Relaxed) * CHUNK
    }

    /// The persistent cache entry verified bytes are kept in, if there is one.
    pub fn cache(&self) -> Option<&cache::Cache> {
        self.cache.as_ref()
    }

    /// `buf.len()` bytes at `offset` fetched in one request straight into `buf`, around
    /// memory and the cache: for the prefetch, which checks and stores what it fetched
    /// itself (`VerifiedSource::check_fetched`).
    /// With the bytes that came, from the start, also when it failed.
    pub(crate) fn fetch_into(&self, offset: u64, buf: &mut [u8]) -> (io::Result<()>, usize) {
        let len = buf.len() as u64;
        let mut sink = ToSlice { buf, taken: 0 };
        let r = self.fetch(offset, len, Fetcher::Prefetch, &mut sink);
        (r, sink.taken)
    }

    /// Chunk `j`'s offset and length (short at the image's end).
    fn chunk_range(&self, j: u64) -> (u64, u64) {
        (j * CHUNK, CHUNK.min(self.len - j * CHUNK))
    }

    /// Whether the persistent cache holds chunk `j`.
    fn chunk_cached(&self, j: u64) -> bool {
        let (at, n) = self.chunk_range(j);
        self.cached(at, n)
    }

    /// Whether `[offset, offset + len)` is in the persistent cache.
    pub fn cached(&self, offset: u64, len: u64) -> bool {
        self.cache.as_ref().is_some_and(|c| c.has(offset, len))
    }

    /// Chunk `i`, from memory or fetched (one fetch per chunk at a time: a second reader
    /// of the same chunk waits for the first's).
    fn chunk(&self, i: u64, wanted: u64, asked: Instant) -> io::Result<Arc<Piece>> {
        // One look at the table: the slot, and whether readahead marked it (a reader
        // reaching a window's first chunk asks for the next window).
        let (slot, mark) = {
            let mut c = self.lock_chunks();
            (self.slot_in(&mut c, i), c.marks.remove(&i))
        };
        let held = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = &*held {
            let b = b.clone();
            drop(held);
            if let Some(n) = mark {
                self.next_window(i + n, n);
            }
            return Ok(b);
        }
        // Emptied once the cache kept it (see `verified`) since the reader looked there.
        if let Some(piece) = self.cached_chunk(i) {
            return Ok(piece);
        }
        // The chunks after this one that this request fetches too: free (no fetch under
        // way), missing, and as many as the read still wants or the run of chunks
        // already here behind it, whichever is more.
        let behind = if self.exact { 0 } else { self.run_behind(i) };
        let run = if self.exact {
            1
        } else {
            behind.max(wanted).max(self.dense_run(i)).min(MAX_RUN)
        };
        let sequential = behind >= SEQUENTIAL;
        // A sequential reader fetches what its read wants; the rest of its run comes on
        // the readahead threads, in the next window, while it reads (it would otherwise
        // wait for all of the run, up to 4 MiB, before its first chunk). Unless that
        // window would not cover the run (memory is short) or would wait (readers' windows
        // are queued already): then it fetches the run itself, as one request.
        let window = if sequential { self.window_len(run) } else { 0 };
        let wants = wanted.clamp(1, run);
        let own = match self.ahead.get() {
            Some(q) if window >= run - wants && q.demand_waiting() < READAHEAD_THREADS => wants,
            _ => run,
        };
        let ahead = self.slots(i + 1, i + own);
        let mut claimed = claim(&ahead, 1, sequential);
        claimed.insert(0, Some(held));
        let n = claimed.len() as u64;
        if window > 0 {
            // The next window, from right after this fetch, sized by the whole run.
            self.schedule(i + n, window);
        }
        let mut sink = ToSlots::new(&mut claimed, &self.memory, i, self.len);
        let fetched = self.fetch(i * CHUNK, sink.len, Fetcher::Reader(asked), &mut sink);
        // The first chunk is the reader's even when a later one failed to come.
        match (sink.first.take(), fetched) {
            (Some(b), _) => Ok(b),
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Err(io::Error::other(format!(
                "{}: chunk {i} came empty",
                self.name
            ))),
        }
    }

    /// Chunk `i` read from the persistent cache, if it holds it.
    fn cached_chunk(&self, i: u64) -> Option<Arc<Piece>> {
        let (at, n) = self.chunk_range(i);
        let cache = self.cache.as_ref().filter(|c| c.has(at, n))?;
        let mut bytes = vec![0u8; n as usize];
        cache.read(&mut bytes, at).ok()?;
        Some(Arc::new(Piece::new(bytes, &self.memory)))
    }

    /// The slot of chunk `i` in the table `c`, made if missing. Making one drops the
    /// oldest entries while the table has more than [`ENTRIES`], or more than [`KEPT`]
    /// chunks are held (dropping an entry drops its bytes once no reader holds them).
    fn slot_in(&self, c: &mut Chunks, i: u64) -> Slot {
        if let Some(s) = c.slots.get(&i) {
            return s.clone();
        }
        let s: Slot = Arc::default();
        c.slots.insert(i, s.clone());
        c.order.push_back(i);
        let mut freed = 0;
        while c.order.len() > ENTRIES
            || self
                .memory
                .held
                .load(Ordering::Relaxed)
                .saturating_sub(freed)
                > KEPT
        {
            let Some(old) = c.order.pop_front() else {
                break;
            };
            if let Some(gone) = c.slots.remove(&old) {
                freed += gone.try_lock().map_or(0, |g| g.is_some() as u64);
            }
            c.marks.remove(&old);
        }
        s
    }

    /// How many chunks to fetch at `i`: one more than the chunks right before it that
    /// are in memory or being fetched (a sequential reader's), at most [`MAX_RUN`].
    /// Chunks in the persistent cache do not count: earlier mounts read them, which says
    /// nothing of where this reader goes next.
    fn run_behind(&self, i: u64) -> u64 {
        let c = self.lock_chunks();
        1 + (1..MAX_RUN)
            .take_while(|&k| i >= k && self.here(&c, i - k))
            .count() as u64
    }

    /// How many chunks to fetch at `i` when the reader goes over its neighbourhood in no
    /// particular order (a walk of the inode area, a directory's small files): up to the
    /// end of the aligned [`WINDOW`] if at least [`DENSE`] of its chunks are already in
    /// memory or coming; else 1 (a sparse reader's miss).
    fn dense_run(&self, i: u64) -> u64 {
        let w0 = i / WINDOW * WINDOW;
        let c = self.lock_chunks();
        let here = (w0..w0 + WINDOW).filter(|&j| self.here(&c, j)).count() as u64;
        if here >= DENSE {
            w0 + WINDOW - i
        } else {
            1
        }
    }

    /// Whether chunk `j` is in memory, being fetched, or was read and kept in the
    /// persistent cache by this mount (its entry is still in the table).
    fn here(&self, c: &Chunks, j: u64) -> bool {
        c.slots
            .get(&j)
            .is_some_and(|s| s.try_lock().map_or(true, |g| g.is_some()) || self.chunk_cached(j))
    }

    /// One range, retried with backoff; an error names the image and the range.
    ///
    /// Once a request has failed every attempt the server counts as down. Until a
    /// request succeeds again, one request at a time tries it, once; the others wait for
    /// that try, and fail at once while the last failed try is recent (it started after
    /// they were `asked`, or ended less than its own length ago). So a reader queued
    /// behind many requests (the kernel's read-ahead, a piece at a time) gets its error
    /// within two tries, and a read after the server is back waits at most for one try
    /// already under way. Readahead and the prefetch never try a server that is down;
    /// the prefetch's failures (a long step on a slow link) do not mark it down either,
    /// nor does a reply naming other bytes than asked (see [`Fetcher`]).
    fn fetch(&self, offset: u64, len: u64, by: Fetcher, sink: &mut dyn Sink) -> io::Result<()> {
        let mut h = self.lock_health();
        let probe = loop {
            match &h.down {
                None => break false,
                Some(d) if by.fails_at_once(d) => {
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                    return Err(io::Error::other(format!(
                        "{}: bytes {offset}+{len}: the server is down ({})",
                        self.name, d.why
                    )));
                }
                _ if h.probing => {
                    h = self
                        .health_changed
                        .wait(h)
                        .unwrap_or_else(|p| p.into_inner());
                }
                _ => {
                    h.probing = true;
                    break true;
                }
            }
        };
        drop(h);
        let demand = !BACKGROUND.with(|b| b.get());
        if demand {
            self.counters.demand.fetch_add(1, Ordering::Relaxed);
        }
        let r = self.fetch_retrying(offset, len, if probe { 1 } else { ATTEMPTS }, sink);
        if demand {
            self.counters.demand.fetch_sub(1, Ordering::Relaxed);
        }
        let mut h = self.lock_health();
        if probe {
            h.probing = false;
        }
        match &r {
            Ok(()) => h.down = None,
            Err((e, Some(tried))) if by != Fetcher::Prefetch => {
                h.down = Some(Down {
                    why: e.to_string(),
                    tried: *tried,
                    ended: Instant::now(),
                })
            }
            Err(_) => {}
        }
        drop(h);
        self.health_changed.notify_all();
        r.map_err(|(e, _)| e)
    }

    fn lock_health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The range, in up to `attempts` tries; an error comes with its last try's start,
    /// `None` for a reply that says nothing of whether the server is up (other bytes than
    /// asked: the answer is wrong, not missing).
    fn fetch_retrying(
        &self,
        offset: u64,
        len: u64,
        attempts: u32,
        sink: &mut dyn Sink,
    ) -> Result<(), (io::Error, Option<Instant>)> {
        let mut wait = FIRST_RETRY;
        let mut attempt = 1;
        loop {
            let from = sink.taken();
            if from == len {
                // Every byte came before the last try failed (past the range's end).
                return Ok(());
            }
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let tried = Instant::now();
            let r =
                self.registry
                    .get_range_into(&self.url, offset + from, len - from, &mut |body| {
                        sink.take(body)
                    });
            self.counters
                .fetched
                .fetch_add(sink.taken() - from, Ordering::Relaxed);
            match r {
                Ok(()) => return Ok(()),
                Err(_) if sink.taken() == len => return Ok(()),
                Err(oci::registry::RangeError::OtherBytes(e)) => {
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                    let e = format!("{}: bytes {offset}+{len}: {e}", self.name);
                    return Err((io::Error::new(io::ErrorKind::InvalidData, e), None));
                }
                Err(e) if attempt >= attempts => {
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                    return Err((
                        io::Error::other(format!("{}: bytes {offset}+{len}: {e}", self.name)),
                        Some(tried),
                    ));
                }
                Err(_) => {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(wait);
                    wait *= 4;
                    attempt += 1;
                }
            }
        }
    }
}

impl Drop for RemoteSource {
    fn drop(&mut self) {
        // The readahead threads wait for windows: they end with the source.
        if let Some(q) = self.ahead.get() {
            q.close();
        }
    }
}

impl ByteSource for RemoteSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let asked = Instant::now();
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{}: range {offset}+{} outside {} bytes",
                        self.name,
                        buf.len(),
                        self.len
                    ),
                )
            })?;
        let mut at = offset;
        while at < end {
            let i = at / CHUNK;
            let seg_end = end.min((i + 1) * CHUNK);
            if let Some(c) = self.cache.as_ref().filter(|c| c.has(at, seg_end - at)) {
                let into = (at - offset) as usize;
                let part = &mut buf[into..into + (seg_end - at) as usize];
                match c.read(part, at) {
                    Ok(()) => {
                        at = seg_end;
                        continue;
                    }
                    // A cache file cut short under us: fetch instead.
                    Err(_) => c.forget(at, seg_end - at),
                }
            }
            let chunk = self.chunk(i, (end - 1) / CHUNK - i + 1, asked)?;
            chunk.read();
            let from = (at - i * CHUNK) as usize;
            let n = (chunk.len() - from).min((end - at) as usize);
            let into = (at - offset) as usize;
            buf[into..into + n].copy_from_slice(&chunk[from..from + n]);
            at += n as u64;
        }
        Ok(())
    }

    fn refetches(&self) -> bool {
        true
    }

    fn verified(&self, offset: u64, bytes: &[u8]) {
        let Some(cache) = &self.cache else {
            return;
        };
        // The prefetch's stores go around the page cache (see `cache`).
        cache.store(offset, bytes, BACKGROUND.with(|b| b.get()));
        // Chunks now in the cache leave memory, where they would push out chunks
        // fetched ahead and not yet read; their entries stay (see `here`).
        let end = offset + bytes.len() as u64;
        let last = if end == self.len {
            end.div_ceil(CHUNK)
        } else {
            end / CHUNK
        };
        let c = self.lock_chunks();
        for j in offset.div_ceil(CHUNK)..last {
            let Some(slot) = c.slots.get(&j) else {
                continue;
            };
            if self.chunk_cached(j) {
                if let Ok(mut g) = slot.try_lock() {
                    g.take();
                }
            }
        }
    }

    fn forget(&self, offset: u64, len: u64) {
        if let Some(c) = &self.cache {
            c.forget(offset, len);
        }
        let mut c = self.lock_chunks();
        let (first, last) = (offset / CHUNK, (offset + len.max(1) - 1) / CHUNK);
        for i in first..=last {
            c.slots.remove(&i);
        }
        c.order.retain(|&o| o < first || o > last);
    }
}

#[cfg(test)]
mod tests {
    use super::Down;
    use std::time::{Duration, Instant};

    fn down(tried_ago: u64, ended_ago: u64) -> Down {
        let now = Instant::now();
        Down {
            why: String::new(),
            tried: now - Duration::from_millis(tried_ago),
            ended: now - Duration::from_millis(ended_ago),
        }
    }

    #[test]
    fn a_failed_try_answers_for_requests_asked_before_it_started_or_while_it_is_recent() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        // Started after the request was asked: it answers, however long ago it ended.
        assert!(down(5_000, 4_000).recent(now - ms(6_000)));
        // A 2 s try that ended 1 s ago: recent for a request asked just now.
        assert!(down(3_000, 1_000).recent(now));
        // A refusal that took no time, ended 1 s ago: the server is tried again.
        assert!(!down(1_000, 1_000).recent(now));
        // A 1 s try that ended 2 s ago: tried again.
        assert!(!down(3_000, 2_000).recent(now - ms(10)));
    }
}
