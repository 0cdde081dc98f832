//! A remote image (`oci://` or an `http(s)://` file) as a [`ByteSource`]: range requests in
//! aligned 4 KiB chunks, one fetch in flight per chunk, held in memory up to a bound.
//!
//! - Trusts no byte: the verified source above checks each block; what fails is forgotten and
//!   fetched again; what passed goes to the [`cache::Cache`].
//! - Read-ahead stops at [`MAX_RUN`]; each try is bounded in time.

#![forbid(unsafe_code)]

pub mod cache;
pub mod prefetch;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use verity::source::ByteSource;

/// The unit of fetching and of the memory cache: a random 4 KiB read fetches one block
/// (so a sparse reader fetches little more than it reads), a sequential one gets runs
/// of them (see [`MAX_RUN`]).
pub const CHUNK: u64 = 4096;
/// Chunks kept in memory (128 MiB).
const KEPT: usize = 32768;
/// The most chunks one request fetches (4 MiB).
pub const MAX_RUN: u64 = 1024;
/// A neighbourhood (256 KiB) read densely once [`DENSE`] of its chunks are here.
const WINDOW: u64 = 64;
const DENSE: u64 = 8;
/// A reader with at least this many chunks right behind a miss is sequential: the
/// readahead threads fetch the next window while it reads this one.
const SEQUENTIAL: u64 = 16;
const READAHEAD_THREADS: usize = 2;
/// Attempts per chunk, and the wait before the first retry (then four times longer).
const ATTEMPTS: u32 = 3;
/// `VERILAY_FETCH_EXACT=1`: no runs, no readahead, one request per 4 KiB chunk a read
/// touches. Slow, but what it fetches is the least any fetcher that checks 4 KiB blocks
/// can fetch for the same reads: the floor the benchmark holds the real policy against.
pub const EXACT_ENV: &str = "VERILAY_FETCH_EXACT";
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// What fetching has cost, for `verilay stats` and the tests.
#[derive(Default, Debug)]
pub struct Counters {
    /// Range requests sent, retries included.
    pub requests: AtomicU64,
    /// Bytes the requests that succeeded fetched.
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
    /// Windows for the readahead threads to fetch (see [`RemoteSource::shared`]).
    ahead: OnceLock<Mutex<mpsc::Sender<(u64, u64)>>>,
    /// Fetch only the chunks reads touch, one request each ([`EXACT_ENV`]).
    exact: bool,
    /// Whether the server answers ([`RemoteSource::fetch`]); `health_changed` wakes the
    /// requests waiting for a probe.
    health: Mutex<Health>,
    health_changed: Condvar,
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

type Slot = Arc<Mutex<Option<Arc<Vec<u8>>>>>;

#[derive(Default)]
struct Chunks {
    slots: HashMap<u64, Slot>,
    order: VecDeque<u64>,
    /// The first chunk of each window readahead fetched, and the window's length: a
    /// reader reaching it asks for the next window, twice as long.
    marks: HashMap<u64, u64>,
}

/// The chunks one request fills: `Some` (a held lock) for each missing chunk it claims,
/// `None` for a chunk already here that it spans, fetched again and dropped. A request
/// costs a server far more than a few spare KiB (docker-registry: ~3 ms of CPU each, the
/// price of 4 MiB of body), so a run goes on past chunks another reader took, as long as
/// what it claims outweighs what it spans; it stops at a chunk being fetched.
type Claim<'a> = Vec<Option<std::sync::MutexGuard<'a, Option<Arc<Vec<u8>>>>>>;

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

/// Puts each fetched chunk of `bytes` in the slot the request claimed for it.
fn fill_claimed(claimed: &mut Claim<'_>, bytes: &[u8]) {
    for (g, piece) in claimed.iter_mut().zip(bytes.chunks(CHUNK as usize)) {
        if let Some(g) = g {
            **g = Some(Arc::new(piece.to_vec()));
        }
    }
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
        let (tx, rx) = mpsc::channel::<(u64, u64)>();
        let me = Arc::new(self);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..READAHEAD_THREADS {
            let (weak, rx) = (Arc::downgrade(&me), rx.clone());
            let worker = std::thread::Builder::new()
                .name("readahead".into())
                .spawn(move || loop {
                    let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    match (job, weak.upgrade()) {
                        (Ok((start, n)), Some(src)) => src.fill(start, n),
                        _ => return,
                    }
                });
            if worker.is_err() {
                return me; // no readahead: readers fetch for themselves
            }
        }
        let _ = me.ahead.set(Mutex::new(tx));
        me
    }

    /// Asks the readahead threads for chunks `start..start + n`.
    fn schedule(&self, start: u64, n: u64) {
        if start < self.len.div_ceil(CHUNK) {
            if let Some(tx) = self.ahead.get() {
                let _ = tx
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .send((start, n));
            }
        }
    }

    /// A readahead thread's job: fetches what of `start..start + n` is missing and free,
    /// and marks the window so the reader reaching it asks for the next one.
    fn fill(&self, start: u64, n: u64) {
        let slots = self.slots(start, start + n);
        // Chunks here already at the window's start are skipped, not spanned.
        let lead = slots
            .iter()
            .take_while(|s| {
                s.as_ref()
                    .is_none_or(|s| s.try_lock().is_ok_and(|g| g.is_some()))
            })
            .count();
        let mut claimed = claim(&slots[lead..], 0, true);
        if claimed.is_empty() {
            return;
        }
        let from = start + lead as u64;
        let len = (CHUNK * claimed.len() as u64).min(self.len - from * CHUNK);
        let Ok(bytes) = self.fetch(from * CHUNK, len, None) else {
            return; // the reader will fetch for itself, and report what fails
        };
        fill_claimed(&mut claimed, &bytes);
        let n = claimed.len() as u64;
        drop(claimed);
        self.lock_chunks().marks.insert(from, n);
    }

    /// The slots of chunks `from..to` (within the image), `None` for those the persistent
    /// cache holds: what a request starting at `from` may fetch.
    fn slots(&self, from: u64, to: u64) -> Vec<Option<Slot>> {
        let mut c = self.lock_chunks();
        (from..to.min(self.len.div_ceil(CHUNK)))
            .map(|j| {
                (!self.cached(j * CHUNK, CHUNK.min(self.len - j * CHUNK)))
                    .then(|| Self::slot_in(&mut c, j))
            })
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

    /// The persistent cache entry verified bytes are kept in, if there is one.
    pub fn cache(&self) -> Option<&cache::Cache> {
        self.cache.as_ref()
    }

    /// `[offset, offset + len)` fetched in one request, around memory and the cache: for
    /// checks made before a cache is chosen (the length the server claims, say).
    pub fn fetch_fresh(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        self.fetch(offset, len, Some(Instant::now()))
    }

    /// Whether `[offset, offset + len)` is in the persistent cache.
    pub fn cached(&self, offset: u64, len: u64) -> bool {
        self.cache.as_ref().is_some_and(|c| c.has(offset, len))
    }

    /// Chunk `i`, from memory or fetched (one fetch per chunk at a time: a second reader
    /// of the same chunk waits for the first's).
    fn chunk(&self, i: u64, wanted: u64, asked: Instant) -> io::Result<Arc<Vec<u8>>> {
        // One look at the table: the slot, and whether readahead marked it (a reader
        // reaching a window's first chunk asks for the next window).
        let (slot, mark) = {
            let mut c = self.lock_chunks();
            (Self::slot_in(&mut c, i), c.marks.remove(&i))
        };
        let mut held = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = &*held {
            let b = b.clone();
            drop(held);
            if let Some(n) = mark {
                self.schedule(i + n, (2 * n).min(MAX_RUN));
            }
            return Ok(b);
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
        let ahead = self.slots(i + 1, i + run);
        let mut claimed = claim(&ahead, 1, behind >= SEQUENTIAL);
        let start = i * CHUNK;
        let len = (CHUNK * (1 + claimed.len() as u64)).min(self.len - start);
        let bytes = self.fetch(start, len, Some(asked))?;
        let first = Arc::new(bytes[..(CHUNK as usize).min(bytes.len())].to_vec());
        *held = Some(first.clone());
        fill_claimed(
            &mut claimed,
            bytes.get(CHUNK as usize..).unwrap_or_default(),
        );
        let n = 1 + claimed.len() as u64;
        drop(claimed);
        drop(held);
        if behind >= SEQUENTIAL {
            // A sequential reader: the next window is fetched while it reads this one.
            self.schedule(i + n, (2 * n).min(MAX_RUN));
        }
        Ok(first)
    }

    /// The slot of chunk `i` in the table `c`, made (and the oldest dropped) if missing.
    fn slot_in(c: &mut Chunks, i: u64) -> Slot {
        if let Some(s) = c.slots.get(&i) {
            return s.clone();
        }
        let s: Slot = Arc::default();
        c.slots.insert(i, s.clone());
        c.order.push_back(i);
        while c.order.len() > KEPT {
            if let Some(old) = c.order.pop_front() {
                c.slots.remove(&old);
                c.marks.remove(&old);
            }
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
            .take_while(|&k| i >= k && Self::here(&c, i - k))
            .count() as u64
    }

    /// How many chunks to fetch at `i` when the reader goes over its neighbourhood in no
    /// particular order (a walk of the inode area, a directory's small files): up to the
    /// end of the aligned [`WINDOW`] if at least [`DENSE`] of its chunks are already in
    /// memory or coming; else 1 (a sparse reader's miss).
    fn dense_run(&self, i: u64) -> u64 {
        let w0 = i / WINDOW * WINDOW;
        let c = self.lock_chunks();
        let here = (w0..w0 + WINDOW).filter(|&j| Self::here(&c, j)).count() as u64;
        if here >= DENSE {
            w0 + WINDOW - i
        } else {
            1
        }
    }

    /// Whether chunk `j` is in memory or being fetched.
    fn here(c: &Chunks, j: u64) -> bool {
        c.slots
            .get(&j)
            .is_some_and(|s| s.try_lock().map_or(true, |g| g.is_some()))
    }

    /// One range, retried with backoff; an error names the image and the range.
    ///
    /// Once a request has failed every attempt the server counts as down. Until a
    /// request succeeds again, one request at a time tries it, once; the others wait for
    /// that try, and fail at once while the last failed try is recent (it started after
    /// they were `asked`, or ended less than its own length ago). So a reader queued
    /// behind many requests (the kernel's read-ahead, a piece at a time) gets its error
    /// within two tries, and a read after the server is back waits at most for one try
    /// already under way. `asked: None` (readahead) never tries a server that is down.
    fn fetch(&self, offset: u64, len: u64, asked: Option<Instant>) -> io::Result<Vec<u8>> {
        let mut h = self.lock_health();
        let probe = loop {
            match &h.down {
                None => break false,
                Some(d) if asked.is_none_or(|a| d.recent(a)) => {
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
        let r = self.fetch_retrying(offset, len, if probe { 1 } else { ATTEMPTS });
        if demand {
            self.counters.demand.fetch_sub(1, Ordering::Relaxed);
        }
        let mut h = self.lock_health();
        if probe {
            h.probing = false;
        }
        h.down = r.as_ref().err().map(|(e, tried)| Down {
            why: e.to_string(),
            tried: *tried,
            ended: Instant::now(),
        });
        drop(h);
        self.health_changed.notify_all();
        r.map_err(|(e, _)| e)
    }

    fn lock_health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The range, in up to `attempts` tries; an error comes with its last try's start.
    fn fetch_retrying(
        &self,
        offset: u64,
        len: u64,
        attempts: u32,
    ) -> Result<Vec<u8>, (io::Error, Instant)> {
        let mut wait = FIRST_RETRY;
        let mut attempt = 1;
        loop {
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let tried = Instant::now();
            match self.registry.get_range(&self.url, offset, len) {
                Ok(b) => {
                    self.counters.fetched.fetch_add(len, Ordering::Relaxed);
                    return Ok(b);
                }
                Err(e) if attempt >= attempts => {
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                    return Err((
                        io::Error::other(format!("{}: bytes {offset}+{len}: {e}", self.name)),
                        tried,
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
            let from = (at - i * CHUNK) as usize;
            let n = (Vec::len(&chunk) - from).min((end - at) as usize);
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
        if let Some(c) = &self.cache {
            c.store(offset, bytes);
        }
    }

    fn forget(&self, offset: u64, len: u64) {
        if let Some(c) = &self.cache {
            c.forget(offset, len);
        }
        let mut c = self.lock_chunks();
        let last = (offset + len.max(1) - 1) / CHUNK;
        for i in offset / CHUNK..=last {
            c.slots.remove(&i);
            c.order.retain(|&o| o != i);
        }
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
