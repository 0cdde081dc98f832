//! The digest cache: a file is hashed once per content version, and an upper file's last
//! writer may hash it at close so the measured open that follows finds it ready.

use super::engine::{writing, Cached};
use super::watch::Watched;
use super::{Content, ContentKey, Cookie, Measuring, Opening};
use std::io::{self, Read as _};
use std::sync::atomic::Ordering;

/// Upper files of these sizes are hashed when their last writer closes them (see
/// [`Measuring::closed`]); others at their next measured open only. Below 8 KiB a
/// hash costs about what its bookkeeping does (a few µs), so the open might as well.
pub const HASH_AT_CLOSE: std::ops::RangeInclusive<u64> = (8 << 10)..=(256 << 10);

/// How long a measured open waits for a hash begun at close before it hashes itself.
const HASH_AT_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Measuring {
    /// The file's digest for this measurement: reused while the content cannot have
    /// changed, else computed (and kept unless a writer has the file open).
    pub(super) fn digest(
        &self,
        o: &Opening<'_>,
        verity: bool,
        content: &dyn Content,
    ) -> io::Result<Vec<u8>> {
        if let Some(c) = self.settled(&o.key) {
            if let Some(d) = c.digest {
                if c.verity == verity && c.cookie == o.cookie && !writing(o) {
                    self.counters.reused.add(1);
                    return Ok(d);
                }
            }
        }
        let stored = match (verity, o.key) {
            (true, ContentKey::Image { .. }) => content.verity_digest()?,
            _ => None,
        };
        let digest = match stored {
            Some(d) => {
                self.counters.verity_digests.add(1);
                d.to_vec()
            }
            None if verity => {
                // An upper file has no stored fs-verity digest: compute one from its bytes.
                let (r, size) = content.reader(o.cookie.map(|c| c.4))?;
                let d = verity_digest(self.watched(r.take(size), o.pid), size)?;
                self.count_hash(size);
                d
            }
            // An empty upper file (every new one): nothing to open or read.
            None if o.cookie.is_some_and(|c| c.4 == 0) => {
                self.count_hash(0);
                self.empty.clone()
            }
            // The size the cookie was taken with, and no more, as the kernel hashes
            // i_size bytes (also saving the read that would find the end).
            None => {
                let (r, size) = content.reader(o.cookie.map(|c| c.4))?;
                self.hash(Box::new(self.watched(r.take(size), o.pid)), size)?
            }
        };
        if !writing(o) {
            self.cache.pin().insert(
                o.key,
                Cached {
                    cookie: o.cookie,
                    verity,
                    digest: Some(digest.clone()),
                    token: 0,
                },
            );
        }
        Ok(digest)
    }

    /// `r`, read for a measured open by `pid`: a hash long enough to be worth stopping
    /// stops when the mount is gone or the opener is being killed (see [`Watched`]).
    fn watched<'r, R: io::Read + 'r>(&'r self, r: R, pid: u32) -> Watched<'r, R> {
        Watched::new(r, &self.mount, pid)
    }

    /// The file's bytes hashed with the list's algorithm.
    fn hash(&self, mut r: Box<dyn io::Read + '_>, size: u64) -> io::Result<Vec<u8>> {
        thread_local! {
            /// This worker's read buffer, grown to the biggest file it hashed (up to
            /// 1 MiB): no allocation or zeroing per hash.
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut h = self.algo.hasher();
        let n = BUF.with_borrow_mut(|buf| -> io::Result<u64> {
            let want = size.clamp(4096, 1 << 20) as usize;
            if buf.len() < want {
                buf.resize(want, 0);
            }
            let buf = &mut buf[..want];
            let mut n = 0u64;
            loop {
                match r.read(buf) {
                    Ok(0) => return Ok(n),
                    Ok(k) => {
                        h.update(&buf[..k]);
                        n += k as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        })?;
        self.count_hash(n);
        Ok(h.finish())
    }

    /// The cache's entry for `key` once no hash begun at close is under way for it
    /// (waiting for one at most `HASH_AT_CLOSE_WAIT`).
    fn settled(&self, key: &ContentKey) -> Option<Cached> {
        let cache = self.cache.pin();
        let c = cache.get(key)?;
        if c.digest.is_some() {
            return Some(c.clone());
        }
        let deadline = std::time::Instant::now() + HASH_AT_CLOSE_WAIT;
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut lock = self.hashed.0.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = std::time::Instant::now();
            let c = cache.get(key);
            if c.is_none_or(|c| c.digest.is_some()) || now >= deadline {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                return c.filter(|c| c.digest.is_some()).cloned();
            }
            // Timed, so a wake-up sent before this wait began costs a millisecond at most.
            let wait = (deadline - now).min(std::time::Duration::from_millis(1));
            lock = self
                .hashed
                .1
                .wait_timeout(lock, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The last writer of an upper file (content key `key`, cookie `cookie` now) closed
    /// it: a file of `HASH_AT_CLOSE` size is hashed now, on this worker thread, after the
    /// close was answered, so the measured open that often follows (a copy's reopen, an editor's,
    /// a build's) finds its digest ready instead of hashing while the opener waits.
    /// Nothing is kept if the content changes meanwhile. `read` gives the file's bytes
    /// from the start; exactly the cookie's size is read (had the file grown since, the
    /// cookie no longer matches and the digest is never used).
    pub fn closed<'r>(
        &self,
        key: ContentKey,
        cookie: Cookie,
        read: impl FnOnce() -> io::Result<Box<dyn io::Read + 'r>>,
    ) {
        if !HASH_AT_CLOSE.contains(&cookie.4) {
            return;
        }
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let cache = self.cache.pin();
        cache.insert(
            key,
            Cached {
                cookie: Some(cookie),
                verity: false,
                digest: None,
                token,
            },
        );
        let digest = read().and_then(|r| self.hash(Box::new(r.take(cookie.4)), cookie.4));
        match digest {
            // Kept only if nothing replaced or removed the entry meanwhile; a content-
            // preserving change of attributes may have moved its cookie on (`touched`).
            Ok(d) => {
                self.counters.hashed_at_close.add(1);
                cache.update(key, |c| {
                    if c.token == token && c.digest.is_none() {
                        Cached {
                            digest: Some(d.clone()),
                            ..c.clone()
                        }
                    } else {
                        c.clone()
                    }
                });
            }
            Err(_) => {
                let _ = cache.remove_if(&key, |_, c| c.token == token && c.digest.is_none());
            }
        }
        // Pairs with the waiter's count going up before it looks at the entry.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            let _lock = self.hashed.0.lock().unwrap_or_else(|p| p.into_inner());
            self.hashed.1.notify_all();
        }
    }

    /// Whether a digest is kept for `key` with a cookie, or being made at close (else
    /// `touched` has nothing to move).
    pub fn keeps(&self, key: ContentKey) -> bool {
        self.cache
            .pin()
            .get(&key)
            .is_some_and(|c| c.cookie.is_some())
    }

    /// Attributes of an upper file changed through the mount, its content did not (a
    /// chmod, chown or utimes): a digest kept for the cookie it had just before still
    /// holds for the cookie it has now.
    pub fn touched(&self, key: ContentKey, before: Cookie, after: Cookie) {
        if before == after {
            return;
        }
        self.cache.pin().update(key, |c| {
            if c.cookie == Some(before) {
                Cached {
                    cookie: Some(after),
                    ..c.clone()
                }
            } else {
                c.clone()
            }
        });
    }

    fn count_hash(&self, bytes: u64) {
        self.counters.hashed.add(1);
        self.counters.bytes_hashed.add(bytes);
    }

    /// The content under `key` may have changed (a write, a truncation, a writer opening
    /// or closing): its digest is computed afresh next time.
    pub fn changed(&self, key: ContentKey) {
        self.cache.pin().remove(&key);
    }
}

/// The fs-verity digest (SHA-256, 4 KiB blocks, no salt) of `size` bytes read from `r`,
/// in memory bounded by the tree's height (`verity::TreeStream`), not its size.
fn verity_digest(mut r: impl io::Read, size: u64) -> io::Result<Vec<u8>> {
    const BS: usize = 4096;
    let params = verity::Params::new(verity::HashAlg::Sha256, BS as u32, Vec::new())
        .map_err(io::Error::other)?;
    let salt = params.padded_salt();
    let mut tree = verity::TreeStream::new(&params);
    let mut buf = vec![0u8; 256 * BS];
    let mut hashes = vec![0u8; 256 * 32];
    let mut left = size;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        r.read_exact(&mut buf[..want])?;
        let blocks = want.div_ceil(BS);
        verity::hash_blocks(&params, &salt, &buf[..want], &mut hashes[..blocks * 32]);
        for h in hashes[..blocks * 32].chunks(32) {
            tree.push(h);
        }
        left -= want as u64;
    }
    Ok(tree.digest(size))
}
