//! Measurement of file opens (IMA in userspace), shared by both filesystems.
//!
//! On every OPEN (and exec, which FUSE tells apart by `FMODE_EXEC` in the open flags)
//! the policy decides, from the access and the identity of the layer serving the file,
//! whether the file is measured; a measured file's digest is appended to the measurement
//! list unless the same entry is already there. The daemon sees every change to a file
//! made through the mount (opens for writing, truncation, fallocate), so a digest is
//! reused until the content may have changed: an unchanged file is never hashed twice, a
//! changed one once: as its last writer closes it if it is of a middling size (8 to
//! 256 KiB), else at its next measured open. Image files never change, and with
//! `digest_type=verity` their stored fs-verity digest is the measurement: no file data is
//! read at open.
//!
//! Nothing here runs without a policy: the per-request paths stay as they are.

use measure::log::{DigestKind, Entry, Event, HashAlgo, Log, LogError, DEFAULT_PCR, MAX_PATH};
use measure::policy::{Access, FsIdentity, Func, Policy, TaskIds, Template};
use measure::policy::{MAY_APPEND, MAY_EXEC, MAY_READ, MAY_WRITE};
use std::io::{self, Read as _};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// How long a new entry may wait in memory before it is written to the list's files.
const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// The open flag the kernel adds to an exec's open (`__FMODE_EXEC`).
const FMODE_EXEC: i32 = 0x20;

/// The EROFS superblock magic, which image layers report as their fsmagic.
pub const EROFS_MAGIC: u64 = 0xE0F5_E1E2;

/// The mount root's attribute `verilay stats` reads the counters from (outside every
/// xattr namespace, so no real attribute can have the name).
pub const STATS_XATTR: &[u8] = b"verilay.stats";

/// What a digest was computed from: an image object (immutable) or an upper file, with
/// what its host inode looked like then (a change behind our back shows there too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContentKey {
    Image { layer: u16, nid: u64 },
    Upper { dev: u64, ino: u64 },
}

/// The host inode's change cookie: ctime, mtime and size.
pub type Cookie = (i64, i64, i64, i64, u64);

/// Upper files of these sizes are hashed when their last writer closes them (see
/// [`Measuring::closed`]); others at their next measured open only. Below 8 KiB a
/// hash costs about what its bookkeeping does (a few µs), so the open might as well.
pub const HASH_AT_CLOSE: std::ops::RangeInclusive<u64> = (8 << 10)..=(256 << 10);

/// How long a measured open waits for a hash begun at close before it hashes itself.
const HASH_AT_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a measured reader of a file with a writer waits for that writer's RELEASE
/// before recording open_writers (and a writer for the measured readers', before
/// ToMToU). The kernel sends RELEASE after close(2) has returned, so a file written,
/// closed and at once opened to read can still count its writer here (another worker
/// handling the RELEASE meanwhile): in the kernel it no longer would.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

#[derive(Clone)]
struct Cached {
    cookie: Option<Cookie>,
    verity: bool,
    /// `None` while a hash begun at close is under way.
    digest: Option<Vec<u8>>,
    /// Which hash at close this entry waits for, so a later one (or a change) wins.
    token: u64,
}

/// Counters for `verilay stats`: what measuring cost. Each is sharded by worker thread
/// (a cache line per shard), so opens on several threads never write one shared line.
#[derive(Default)]
pub struct Counters {
    /// Opens and execs the policy was asked about.
    pub checked: Counter,
    /// Of those, how many it said to measure.
    pub measured: Counter,
    /// File contents hashed (a cache miss), and the bytes read for it.
    pub hashed: Counter,
    pub bytes_hashed: Counter,
    /// Of `hashed`: upper files hashed when their last writer closed them.
    pub hashed_at_close: Counter,
    /// Measurements served by a digest computed earlier.
    pub reused: Counter,
    /// Measurements that took an image file's stored fs-verity digest.
    pub verity_digests: Counter,
    /// Entries appended to the list, and entries already in it (counted as the inbox is
    /// drained, which `verilay stats` does first).
    pub logged: Counter,
    pub duplicates: Counter,
    /// Violations recorded while mounted (open_writers, ToMToU), also counted as drained.
    pub violations: Counter,
    /// Read-only mounts: image files whose bytes an open handed to the kernel's page cache
    /// (see `ImageFs::prime`), and those bytes.
    pub primed: Counter,
    pub bytes_primed: Counter,
}

const SHARDS: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Shard(AtomicU64);

#[derive(Default)]
pub struct Counter([Shard; SHARDS]);

thread_local! {
    /// This thread's shard, handed out round-robin on first use.
    static SHARD: usize = {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) as usize % SHARDS
    };
}

impl Counter {
    pub fn add(&self, n: u64) {
        let i = SHARD.with(|s| *s);
        self.0[i].0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// How a file was opened, and by whom.
pub struct Opening<'a> {
    pub flags: i32,
    pub pid: u32,
    /// The file's owner and group as the mount shows them.
    pub owner: (u32, u32),
    pub fs: &'a FsIdentity,
    pub key: ContentKey,
    /// Upper files: the host inode's cookie now; `None` for image files.
    pub cookie: Option<Cookie>,
    /// How the file is open through the mount now (a writable mount's files; `None` for
    /// a read-only mount's, which nobody writes). While a writer has it, a digest is not
    /// kept, as the content can change at any moment; and IMA's violations are decided
    /// from it (see [`Opens`]).
    pub opens: Option<&'a Opens>,
}

/// How one file (a FUSE inode) is open through a writable mount, as IMA's
/// `ima_rdwr_violation_check` needs it: the handles that can write (the kernel's
/// `i_writecount`), the read-only handles whose open the policy measured, and the iint's
/// two bits that let each violation be recorded once per event. Only opens of layers the
/// policy can measure touch it; a mount without a policy never does.
#[derive(Default)]
pub struct Opens {
    writers: AtomicU32,
    readers: AtomicU32,
    bits: AtomicU8,
}

/// A measured reader opened the file since the last ToMToU (`IMA_MAY_EMIT_TOMTOU`).
const MAY_EMIT_TOMTOU: u8 = 1;
/// An open_writers violation was recorded since the last writer closed
/// (`IMA_EMITTED_OPENWRITERS`).
const EMITTED_OPEN_WRITERS: u8 = 2;

impl Opens {
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

    /// A handle [`Measured::reader`] counted closed.
    /// True when it was the last.
    pub fn reader_closed(&self) -> bool {
        self.readers.fetch_sub(1, Ordering::SeqCst) == 1
    }

    fn readers(&self) -> bool {
        self.readers.load(Ordering::SeqCst) > 0
    }

    fn writers(&self) -> bool {
        self.writers.load(Ordering::SeqCst) > 0
    }

    /// A write open: whether it makes a ToMToU violation, as in the kernel: a measured
    /// reader has the file open, and one opened it since the last ToMToU.
    fn time_of_use(&self) -> bool {
        self.readers.load(Ordering::SeqCst) > 0
            && self.bits.fetch_and(!MAY_EMIT_TOMTOU, Ordering::SeqCst) & MAY_EMIT_TOMTOU != 0
    }

    /// A read-only open the policy measures: counted (the returned guard takes the count
    /// back unless kept), and whether it makes an open_writers violation: a writer has the
    /// file open, and none was recorded since the last writer closed. Counted before the
    /// writers are looked at (and a writer counts itself before looking at the readers),
    /// so of a reader and a writer opening at once, at least one sees the other.
    fn measured_reader(&self) -> (ReaderCount<'_>, bool) {
        self.bits.fetch_or(MAY_EMIT_TOMTOU, Ordering::SeqCst);
        self.readers.fetch_add(1, Ordering::SeqCst);
        let open_writers = self.writers()
            && self.bits.fetch_or(EMITTED_OPEN_WRITERS, Ordering::SeqCst) & EMITTED_OPEN_WRITERS
                == 0;
        (ReaderCount(Some(self)), open_writers)
    }
}

/// A measured reader's count, taken back when dropped unless [`ReaderCount::keep`] says
/// the open succeeded.
struct ReaderCount<'a>(Option<&'a Opens>);

impl ReaderCount<'_> {
    fn keep(mut self) -> bool {
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

/// What measuring an open did, for its filesystem.
#[derive(Debug, Default)]
pub struct Measured {
    /// An open that can write: whether the same task opening the file to read would be
    /// measured by its content (what makes hashing it after its close worthwhile, see
    /// [`Measuring::closed`]).
    pub hash_at_close: bool,
    /// A read-only open the policy measured, counted in its [`Opens`]: its close must
    /// call [`Opens::reader_closed`].
    pub reader: bool,
    /// The violation it recorded (IMA's cause: `ToMToU` or `open_writers`), if any.
    pub violation: Option<&'static str>,
}

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

/// A measured open's event, owned, until it becomes an entry of the list.
struct Raw {
    /// A violation (`ima_add_violation`): only `path` counts.
    violation: bool,
    pcr: u32,
    template: Template,
    kind: DigestKind,
    algo: HashAlgo,
    digest: Vec<u8>,
    path: Vec<u8>,
    sig: Option<Vec<u8>>,
}

/// The list and what feeds it, shared with the flusher thread, which makes each batch of
/// events entries and writes them out `FLUSH_EVERY` after the batch starts: no open
/// waits for the list's files, nor for making its entry (two template digests, the
/// duplicate check, two PCR extensions).
struct Shared {
    log: Mutex<Log>,
    /// Measured opens' events not yet in the list, in the order they were measured.
    /// Whoever reads the list or its counters (stats, unmount) drains it first.
    inbox: Mutex<Vec<Raw>>,
    /// Wakes the flusher when the inbox gets its first event (an idle mount's sleeps).
    wake: Condvar,
    /// The list's: set once a write failed, when measured opens fail rather than go
    /// unlisted.
    broken: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl Shared {
    /// Makes the inbox's events entries of `log`, in order. Held: `log` (so a batch is
    /// drained whole before the next).
    fn drain(inbox: &Mutex<Vec<Raw>>, counters: &Counters, log: &mut Log) -> Result<(), LogError> {
        let raws = std::mem::take(&mut *inbox.lock().unwrap_or_else(|p| p.into_inner()));
        for r in raws {
            if r.violation {
                log.append_entry(Entry::violation(DEFAULT_PCR, &r.path))?;
                counters.violations.add(1);
                continue;
            }
            let ev = Event {
                template: r.template,
                kind: r.kind,
                algo: r.algo,
                digest: &r.digest,
                path: &r.path,
                sig: r.sig.as_deref(),
            };
            let counter = match log.append_entry(Entry::new(r.pcr, &ev))? {
                true => &counters.logged,
                false => &counters.duplicates,
            };
            counter.add(1);
        }
        Ok(())
    }

    /// The list, with every event measured so far in it.
    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        // Fails only when the list is broken, which the caller's own use of it reports.
        let _ = Shared::drain(&self.inbox, &self.counters, &mut log);
        log
    }

    /// Drains the inbox and writes what it took, with the log free while writing.
    fn flush(&self) -> Result<(), LogError> {
        drop(self.log());
        Log::flush_shared(&self.log)
    }
}

impl Drop for Shared {
    /// Events measured but not yet drained still reach the list (`Log`'s drop writes it).
    fn drop(&mut self) {
        let log = self.log.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = Shared::drain(&self.inbox, &self.counters, log);
    }
}

pub struct Measuring {
    policy: Policy,
    shared: Arc<Shared>,
    algo: HashAlgo,
    /// The digest of no bytes (every new file's).
    empty: Vec<u8>,
    cache: papaya::HashMap<ContentKey, Cached>,
    /// Hands out `Cached::token`s.
    tokens: AtomicU64,
    /// Wakes measured opens waiting for a hash begun at close, and how many wait (no
    /// wake-up call when none does).
    hashed: (Mutex<()>, Condvar),
    /// Signalled when a file's last writer closed (see [`RELEASE_WAIT`]).
    released: (Mutex<()>, Condvar),
    waiting: AtomicU64,
    pub counters: Arc<Counters>,
    /// The mount measured, which a long hash watches (see [`Watched`]).
    mount: MountWatch,
}

impl Measuring {
    /// Measures the opens of the mount on `mountpoint` (absolute, as mountinfo shows it)
    /// into `log`.
    pub fn new(policy: Policy, log: Log, algo: HashAlgo, mountpoint: &[u8]) -> Measuring {
        let counters = Arc::new(Counters::default());
        let shared = Arc::new(Shared {
            broken: log.broken_flag(),
            log: Mutex::new(log),
            inbox: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            counters: counters.clone(),
        });
        let weak = Arc::downgrade(&shared);
        std::thread::spawn(move || {
            while let Some(sh) = weak.upgrade() {
                let idle = {
                    let q = sh.inbox.lock().unwrap_or_else(|p| p.into_inner());
                    // Idle: until a batch starts, waking now and then to notice the
                    // mount has gone.
                    q.is_empty()
                        && sh
                            .wake
                            .wait_timeout(q, std::time::Duration::from_secs(1))
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                            .is_empty()
                };
                drop(sh);
                if idle {
                    continue;
                }
                // A batch has started: let it gather, then write it with the log free
                // (opens add events meanwhile). A failure leaves the list broken: later
                // measured opens then fail.
                std::thread::sleep(FLUSH_EVERY);
                if let Some(sh) = weak.upgrade() {
                    let _ = sh.flush();
                }
            }
        });
        Measuring {
            policy,
            shared,
            algo,
            empty: algo.hasher().finish(),
            cache: papaya::HashMap::new(),
            tokens: AtomicU64::new(1),
            hashed: (Mutex::new(()), Condvar::new()),
            released: (Mutex::new(()), Condvar::new()),
            waiting: AtomicU64::new(0),
            counters,
            mount: MountWatch {
                mountpoint: mountpoint.to_vec(),
                id: std::sync::OnceLock::new(),
            },
        }
    }

    /// Whether a layer with this identity can ever be measured (else opens of its files
    /// need no work at all).
    pub fn may_measure(&self, fs: &FsIdentity) -> bool {
        self.policy.may_measure(fs)
    }

    /// Measures an open if the policy says so. An error (the file could not be read, or
    /// failed verification, or the list could not be written) fails the open: a measured
    /// open never succeeds unmeasured. Records the violations IMA records for it (see
    /// [`Opens`]), before its own entry as the kernel does.
    pub fn open(&self, o: &Opening<'_>, content: &dyn Content) -> io::Result<Measured> {
        let exec = o.flags & FMODE_EXEC != 0;
        let writes = writes(o.flags);
        let mut task_ids = None;
        let mut task = || *task_ids.get_or_insert_with(|| task_ids_of(o.pid));
        let mut done = Measured::default();
        if writes {
            if let Some(opens) = o.opens {
                done.violation = self.time_of_use(opens, || content.path())?;
            }
        }
        let mut reader = ReaderCount(None);
        // An exec is checked twice, as the kernel does: BPRM_CHECK, and FILE_CHECK with
        // the exec's access mask.
        let checks: &[(Func, u32)] = if exec {
            &[(Func::BprmCheck, MAY_EXEC), (Func::FileCheck, MAY_EXEC)]
        } else {
            &[(Func::FileCheck, access_mask(o.flags))][..]
        };
        for &(func, mask) in checks {
            self.counters.checked.add(1);
            let access = Access {
                func,
                mask,
                fowner: o.owner.0,
                fgroup: o.owner.1,
                fs: o.fs,
            };
            let Some(m) = self.policy.decide(&access, &mut task) else {
                continue;
            };
            self.counters.measured.add(1);
            // ima_rdwr_violation_check runs for FILE_CHECK: a measured reader of a file
            // a writer has open.
            if let Some(opens) = o.opens.filter(|_| func == Func::FileCheck && !writes) {
                self.wait_for_release(opens, Opens::writers);
                let open_writers;
                (reader, open_writers) = opens.measured_reader();
                if open_writers {
                    self.violation(content.path())?;
                    done.violation = Some("open_writers");
                }
            }
            let digest = self.digest(o, m.verity, content)?;
            let (kind, algo) = if m.verity {
                (DigestKind::Verity, HashAlgo::Sha256)
            } else {
                (DigestKind::Ima, self.algo)
            };
            let path = content.path();
            let sig = if m.template.has_sig() {
                content.ima_xattr().filter(|v| is_signature(v))
            } else {
                None
            };
            let ev = Event {
                template: m.template,
                kind,
                algo,
                digest: &digest,
                path: &path,
                sig: sig.as_deref(),
            };
            // Checked now, made an entry by the flusher (`Shared`): what could fail
            // fails this open.
            Log::check_event(m.pcr, &ev).map_err(io::Error::other)?;
            self.push(Raw {
                violation: false,
                pcr: m.pcr,
                template: m.template,
                kind,
                algo,
                digest,
                path,
                sig,
            })?;
        }
        done.reader = reader.keep();
        if writes {
            let access = Access {
                func: Func::FileCheck,
                mask: MAY_READ,
                fowner: o.owner.0,
                fgroup: o.owner.1,
                fs: o.fs,
            };
            done.hash_at_close = self
                .policy
                .decide(&access, &mut task)
                .is_some_and(|m| !m.verity);
        }
        Ok(done)
    }

    /// Waits (at most [`RELEASE_WAIT`]) while the file has `open` handles (writers, or
    /// measured readers), whose RELEASE may be on its way (see there).
    fn wait_for_release(&self, opens: &Opens, open: fn(&Opens) -> bool) {
        if !open(opens) {
            return;
        }
        let (lock, cv) = &self.released;
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let _ = cv.wait_timeout_while(guard, RELEASE_WAIT, |_| open(opens));
    }

    /// A file's last writer or last measured reader closed ([`Opens::writer_closed`] or
    /// [`Opens::reader_closed`] said so): wakes the opens waiting for it.
    pub fn released(&self) {
        drop(self.released.0.lock().unwrap_or_else(|p| p.into_inner()));
        self.released.1.notify_all();
    }

    /// A write open of a file whose layer no rule can measure (so [`Measuring::open`] is
    /// not asked): the kernel still records ToMToU for it, whatever the policy says of
    /// the writer (a file copied up from a measured image layer can have measured
    /// readers). Returns the violation recorded, if any.
    pub fn write_opened(
        &self,
        opens: &Opens,
        path: impl FnOnce() -> Vec<u8>,
    ) -> io::Result<Option<&'static str>> {
        self.time_of_use(opens, path)
    }

    fn time_of_use(
        &self,
        opens: &Opens,
        path: impl FnOnce() -> Vec<u8>,
    ) -> io::Result<Option<&'static str>> {
        self.wait_for_release(opens, Opens::readers);
        if !opens.time_of_use() {
            return Ok(None);
        }
        self.violation(path())?;
        Ok(Some("ToMToU"))
    }

    /// Records a violation as `ima_add_violation` does (on PCR 10, named by the file's
    /// path, or its last component when the path is too long, as `ima_d_path` falls back
    /// to the dentry's name). An event that cannot be recorded fails the open.
    fn violation(&self, mut path: Vec<u8>) -> io::Result<()> {
        if path.len() > MAX_PATH {
            let last = path.rsplit(|&b| b == b'/').next().unwrap_or(&[]);
            path = last[..last.len().min(255)].to_vec();
        }
        self.push(Raw {
            violation: true,
            pcr: DEFAULT_PCR,
            template: Template::ImaNg,
            kind: DigestKind::Ima,
            algo: HashAlgo::Sha256,
            digest: Vec::new(),
            path,
            sig: None,
        })
    }

    /// Hands an event to the flusher (`Shared`), unless the list is broken.
    fn push(&self, raw: Raw) -> io::Result<()> {
        if self.shared.broken.load(Ordering::Acquire) {
            return Err(io::Error::other(LogError::Broken));
        }
        let mut inbox = self.shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
        inbox.push(raw);
        if inbox.len() == 1 {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// The file's digest for this measurement: reused while the content cannot have
    /// changed, else computed (and kept unless a writer has the file open).
    fn digest(&self, o: &Opening<'_>, verity: bool, content: &dyn Content) -> io::Result<Vec<u8>> {
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
        self.mount.learn();
        Watched {
            inner: r,
            mount: &self.mount,
            pid,
            read: 0,
            next: WATCH_EVERY,
        }
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

    /// At unmount: writes every entry measured, makes the list durable and closes it
    /// cleanly (its in-use marker goes, so the next mount continues it without a
    /// violation). Measured opens fail afterwards.
    pub fn close(&self) -> io::Result<()> {
        self.shared.log().close().map_err(io::Error::other)
    }

    /// The counters and the list's length, as JSON (what `verilay stats` prints).
    pub fn stats_json(&self) -> String {
        let c = &self.counters;
        let get = |a: &Counter| a.get();
        // Flushed first: the list's files hold every entry counted once this returns.
        let (entries, violations) = {
            let mut log = self.shared.log();
            let _ = log.flush();
            let recovered = log.recovery().map_or(0, |r| r.violations.len() as u64);
            (log.entries(), recovered + c.violations.get())
        };
        format!(
            "{{\"policy_rules\":{},\"checked\":{},\"measured\":{},\"hashed\":{},\"bytes_hashed\":{},\"hashed_at_close\":{},\"reused\":{},\"verity_digests\":{},\"logged\":{},\"duplicates\":{},\"primed\":{},\"bytes_primed\":{},\"entries\":{},\"violations\":{}}}",
            self.policy.len(),
            get(&c.checked),
            get(&c.measured),
            get(&c.hashed),
            get(&c.bytes_hashed),
            get(&c.hashed_at_close),
            get(&c.reused),
            get(&c.verity_digests),
            get(&c.logged),
            get(&c.duplicates),
            get(&c.primed),
            get(&c.bytes_primed),
            entries,
            violations,
        )
    }
}

/// How many bytes a measured open's hash reads between looks at whether to stop: at the
/// 1-2 GB/s a hash runs, a few looks a second, each a read of two small /proc files.
const WATCH_EVERY: u64 = 64 << 20;

/// A file's bytes read for a measured open's hash. IMA hashes the whole file, and so does
/// verilay, however long that takes (a sparse file of 2^50 bytes: days); but the daemon
/// must stay stoppable. Every `WATCH_EVERY` bytes it looks whether the mount is gone (a
/// lazy unmount, which the daemon also does on SIGTERM) or the opener is being killed
/// (FUSE would send INTERRUPT, but fuser answers it ENOSYS itself, so the daemon never
/// sees one: the opener's pending signals tell instead). Then the read fails, and with
/// it the open (EIO, and a log line).
struct Watched<'a, R> {
    inner: R,
    mount: &'a MountWatch,
    pid: u32,
    read: u64,
    next: u64,
}

impl<R: io::Read> io::Read for Watched<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read >= self.next {
            self.next = self.read.saturating_add(WATCH_EVERY);
            let why = if self.mount.gone() {
                Some("the mount was unmounted")
            } else if being_killed(self.pid) {
                Some("the opener is being killed")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(io::Error::other(format!(
                    "hash stopped after {} bytes: {why}",
                    self.read
                )));
            }
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Tells whether the mount measured is still attached: by its mount id in
/// /proc/self/mountinfo, learnt before the first hash starts (the topmost FUSE mount on
/// the mountpoint then: a request came through it, so it is there unless already
/// detached). If none is found then, it is never taken for gone.
struct MountWatch {
    mountpoint: Vec<u8>,
    id: std::sync::OnceLock<Option<u64>>,
}

impl MountWatch {
    /// Learns the mount's id, once.
    fn learn(&self) {
        self.id.get_or_init(|| {
            let info = std::fs::read("/proc/self/mountinfo").ok()?;
            fuse_mount_on(&info, &self.mountpoint)
        });
    }

    fn gone(&self) -> bool {
        let Some(Some(id)) = self.id.get() else {
            return false;
        };
        std::fs::read("/proc/self/mountinfo").is_ok_and(|info| !mount_listed(&info, *id))
    }
}

/// The id of the last (topmost) FUSE mount on `mountpoint` in a mountinfo text.
fn fuse_mount_on(info: &[u8], mountpoint: &[u8]) -> Option<u64> {
    info.split(|&b| b == b'\n')
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            let sep = fields.iter().position(|f| *f == b"-")?;
            let fstype = fields.get(sep + 1)?;
            let fuse = *fstype == b"fuse" || fstype.starts_with(b"fuse.");
            (fuse && unescape(fields.get(4)?) == mountpoint)
                .then(|| std::str::from_utf8(fields[0]).ok()?.parse().ok())
                .flatten()
        })
        .next_back()
}

/// Whether mount `id` is in a mountinfo text.
fn mount_listed(info: &[u8], id: u64) -> bool {
    let id = id.to_string();
    info.split(|&b| b == b'\n')
        .any(|line| line.split(|&b| b == b' ').next() == Some(id.as_bytes()))
}

/// A mountinfo path with its octal escapes (`\040` for a space...) undone.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// Whether task `pid` (a thread) has SIGKILL pending: it is being killed, by SIGKILL or
/// by any signal it does not handle (the kernel turns those into SIGKILL for each
/// thread), and waits only for its request's answer.
fn being_killed(pid: u32) -> bool {
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status.lines().any(|l| {
        let pending = l
            .strip_prefix("SigPnd:")
            .or_else(|| l.strip_prefix("ShdPnd:"));
        pending
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|v| v & SIGKILL_BIT != 0)
    })
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

/// The access mask IMA's FILE_CHECK sees for an open with these flags (fs/namei.c's
/// acc_mode, limited to read, write, exec and append).
pub fn access_mask(flags: i32) -> u32 {
    let mut mask = match flags & rustix::fs::OFlags::ACCMODE.bits() as i32 {
        0 => MAY_READ,
        1 => MAY_WRITE,
        _ => MAY_READ | MAY_WRITE,
    };
    if flags & rustix::fs::OFlags::TRUNC.bits() as i32 != 0 {
        mask |= MAY_WRITE;
    }
    if flags & rustix::fs::OFlags::APPEND.bits() as i32 != 0 {
        mask |= MAY_APPEND;
    }
    mask
}

/// Whether someone has the file open for writing through the mount now.
fn writing(o: &Opening<'_>) -> bool {
    o.opens.is_some_and(Opens::writers)
}

/// Whether opening with these flags can change the file.
pub fn writes(flags: i32) -> bool {
    access_mask(flags) & (MAY_WRITE | MAY_APPEND) != 0
}

/// A `security.ima` value that is a signature (types 3 and 6), which ima-sig records.
fn is_signature(v: &[u8]) -> bool {
    matches!(v.first(), Some(3) | Some(6))
}

/// The ids of the task behind a request (the request carries only its fsuid and fsgid):
/// from its pidfd (`PIDFD_GET_INFO`, Linux 6.13+) when its real, effective and saved ids
/// agree (then whether it may set ids changes nothing), else from /proc, which also has
/// its capabilities. A task gone by now has every id u32::MAX, so no id rule matches it.
fn task_ids_of(pid: u32) -> TaskIds {
    task_ids_pidfd(pid).unwrap_or_else(|| task_ids_proc(pid))
}

/// Pidfds of recent requesters, one slot per `pid % PIDFD_SLOTS`: a storm of opens by one
/// task costs one ioctl each instead of pidfd_open, ioctl and close. A pidfd names one
/// task for good, and its ioctl succeeds only while that task has not been reaped, which
/// is exactly while no other task can hold its id; so a hit that answers is the
/// requester itself.
const PIDFD_SLOTS: usize = 64;
static PIDFDS: [Mutex<Option<(u32, rustix::fd::OwnedFd)>>; PIDFD_SLOTS] =
    [const { Mutex::new(None) }; PIDFD_SLOTS];

fn task_ids_pidfd(pid: u32) -> Option<TaskIds> {
    let mut slot = PIDFDS[pid as usize % PIDFD_SLOTS]
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some((had, fd)) = slot.as_ref() {
        if *had == pid {
            if let Some(ids) = pidfd_ids(fd) {
                return Some(ids);
            }
        }
    }
    // A request's pid is a thread's (creds are per thread): PIDFD_THREAD (O_EXCL).
    const PIDFD_THREAD: u32 = 0o200;
    let p = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    let fd = rustix::process::pidfd_open(
        p,
        rustix::process::PidfdFlags::from_bits_retain(PIDFD_THREAD),
    )
    .ok()?;
    let ids = pidfd_ids(&fd);
    *slot = Some((pid, fd));
    ids
}

/// The task's ids from its pidfd (`PIDFD_GET_INFO`), when its real, effective and saved
/// ids agree; `None` otherwise, or when the task is gone or the kernel lacks the ioctl.
fn pidfd_ids(fd: &rustix::fd::OwnedFd) -> Option<TaskIds> {
    use rustix::fd::AsRawFd;
    // _IOWR(0xFF, 11, struct pidfd_info), the 64-byte first version of the struct.
    const PIDFD_GET_INFO: libc::c_ulong = 0xC040_FF0B;
    const PIDFD_INFO_CREDS: u64 = 1 << 1;
    let mut info = [0u8; 64];
    info[..8].copy_from_slice(&PIDFD_INFO_CREDS.to_ne_bytes());
    // SAFETY: the ioctl reads and writes at most 64 bytes (the size encoded in the request
    // number) of `info`, which is that large, and `fd` is open for the whole call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), PIDFD_GET_INFO, info.as_mut_ptr()) };
    let word = |at: usize| u32::from_ne_bytes(info[at..at + 4].try_into().expect("4 bytes"));
    let mask = u64::from_ne_bytes(info[..8].try_into().expect("8 bytes"));
    if r != 0 || mask & PIDFD_INFO_CREDS == 0 {
        return None;
    }
    // struct pidfd_info: mask, cgroupid, pid, tgid, ppid, ruid, rgid, euid, egid, suid,
    // sgid, fsuid, fsgid.
    let (uid, gid, euid, egid, suid, sgid) =
        (word(28), word(32), word(36), word(40), word(44), word(48));
    if uid != euid || uid != suid || gid != egid || gid != sgid {
        return None;
    }
    Some(TaskIds {
        uid,
        euid,
        suid,
        gid,
        egid,
        sgid,
        cap_setuid: false,
        cap_setgid: false,
    })
}

fn task_ids_proc(pid: u32) -> TaskIds {
    let gone = TaskIds {
        uid: u32::MAX,
        euid: u32::MAX,
        suid: u32::MAX,
        gid: u32::MAX,
        egid: u32::MAX,
        sgid: u32::MAX,
        cap_setuid: false,
        cap_setgid: false,
    };
    // One read into a stack buffer: this runs on the open path.
    let mut buf = [0u8; 8192];
    let Ok(n) = rustix::fs::open(
        format!("/proc/{pid}/status").as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .and_then(|f| rustix::io::read(&f, &mut buf)) else {
        return gone;
    };
    let Ok(status) = std::str::from_utf8(&buf[..n]) else {
        return gone;
    };
    let mut t = gone;
    for line in status.lines() {
        let (key, rest) = line.split_once(':').unwrap_or((line, ""));
        let ids: Vec<u32> = rest
            .split_whitespace()
            .filter_map(|s| s.parse().ok())
            .collect();
        match (key, ids.as_slice()) {
            ("Uid", [r, e, s, ..]) => (t.uid, t.euid, t.suid) = (*r, *e, *s),
            ("Gid", [r, e, s, ..]) => (t.gid, t.egid, t.sgid) = (*r, *e, *s),
            ("CapEff", _) => {
                let caps = u64::from_str_radix(rest.trim(), 16).unwrap_or(0);
                t.cap_setgid = caps & (1 << 6) != 0;
                t.cap_setuid = caps & (1 << 7) != 0;
            }
            _ => {}
        }
    }
    t
}

/// What a filesystem needs to measure: the engine, where it is mounted (the list names
/// absolute paths), and the identity each layer reports to the policy.
pub struct Setup {
    pub measuring: std::sync::Arc<Measuring>,
    pub mountpoint: Vec<u8>,
    /// Per image layer, top first.
    pub layers: Vec<FsIdentity>,
    /// The upper directory's host filesystem, for a writable mount.
    pub upper: Option<FsIdentity>,
}

impl Setup {
    /// The counters and the identity each layer reports (what `verilay stats` prints).
    pub fn stats_json(&self) -> String {
        let id = |f: &FsIdentity| {
            format!(
                "{{\"fsmagic\":\"0x{:x}\",\"fsname\":\"{}\",\"fsuuid\":\"{}\"}}",
                f.magic,
                f.name.escape_default(),
                measure::policy::uuid_text(&f.uuid)
            )
        };
        let layers: Vec<String> = self.layers.iter().map(id).collect();
        let counters = self.measuring.stats_json();
        format!(
            "{},\"layers\":[{}],\"upper\":{}}}",
            counters.trim_end_matches('}'),
            layers.join(","),
            self.upper.as_ref().map_or("null".to_string(), id)
        )
    }

    /// Measures an open (see [`Measuring::open`]); a failure is one log line and EIO,
    /// which fails the open. A violation recorded is a log line too (the kernel audits
    /// each).
    pub fn measure(
        &self,
        o: &Opening<'_>,
        content: &dyn Content,
        log: &crate::Logger,
        name: &str,
    ) -> Result<Measured, fuser::Errno> {
        let r = self.measuring.open(o, content);
        Self::report(
            r.as_ref().map(|m| m.violation),
            || content.path(),
            log,
            name,
        )?;
        r.map_err(|_| fuser::Errno::EIO)
    }

    /// [`Measuring::write_opened`], reported as [`Setup::measure`] reports.
    pub fn write_opened(
        &self,
        opens: &Opens,
        path: impl Fn() -> Vec<u8>,
        log: &crate::Logger,
        name: &str,
    ) -> Result<(), fuser::Errno> {
        let r = self.measuring.write_opened(opens, &path);
        Self::report(r.as_ref().copied(), path, log, name)
    }

    fn report(
        r: Result<Option<&'static str>, &io::Error>,
        path: impl FnOnce() -> Vec<u8>,
        log: &crate::Logger,
        name: &str,
    ) -> Result<(), fuser::Errno> {
        match r {
            Ok(None) => Ok(()),
            Ok(Some(cause)) => {
                let path = String::from_utf8_lossy(&path()).escape_debug().to_string();
                log(&format!(
                    "{name}: {path}: violation recorded (invalid_pcr, {cause})"
                ));
                Ok(())
            }
            Err(e) => {
                let path = String::from_utf8_lossy(&path()).escape_debug().to_string();
                log(&format!("{name}: measuring {path}: {e}"));
                Err(fuser::Errno::EIO)
            }
        }
    }

    /// `mountpoint` joined with `inside` (components from the root down).
    pub fn path(&self, inside: &[&[u8]]) -> Vec<u8> {
        let len = self.mountpoint.len() + inside.iter().map(|c| c.len() + 1).sum::<usize>();
        let mut p = Vec::with_capacity(len);
        p.extend_from_slice(&self.mountpoint);
        for c in inside {
            if p.last() != Some(&b'/') {
                p.push(b'/');
            }
            p.extend_from_slice(c);
        }
        p
    }
}

/// More members for `verilay stats` from outside this crate (a remote image's fetching):
/// a JSON object's members, `"key":value,…`, or nothing.
pub type ExtraStats = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// `verilay stats`: what the mount root answers for [`STATS_XATTR`] (`None` for any other
/// inode or name).
pub fn stats_xattr(
    setup: Option<&Setup>,
    extra: Option<&ExtraStats>,
    ino: u64,
    name: &[u8],
) -> Option<Vec<u8>> {
    if ino != 1 || name != STATS_XATTR {
        return None;
    }
    let mut json = match setup {
        Some(s) => s.stats_json(),
        None => "{\"policy_rules\":0}".to_string(),
    };
    let more = extra.map(|f| f()).unwrap_or_default();
    if !more.is_empty() && json.ends_with('}') {
        json.pop();
        json.push(',');
        json.push_str(&more);
        json.push('}');
    }
    Some(json.into_bytes())
}

/// The identity an image layer reports: the EROFS magic, `erofs`, and the image's uuid
/// (or, for an image built without one, the first 16 bytes of its `digest`, so it is
/// never zero).
pub fn image_identity(uuid: [u8; 16], digest: &[u8]) -> FsIdentity {
    let mut id = uuid;
    if uuid == [0; 16] {
        let n = digest.len().min(16);
        id[..n].copy_from_slice(&digest[..n]);
    }
    FsIdentity {
        magic: EROFS_MAGIC,
        name: "erofs".into(),
        uuid: id,
    }
}

/// The identity of the host filesystem holding `dir`: its magic (statfs), its type's name
/// as the kernel knows it (`fuse.sshfs` is `fuse`), and its uuid (FS_IOC_GETFSUUID); a
/// filesystem without a uuid gets one derived from its magic and device number, so it is
/// never zero (and stable while the device is).
pub fn host_identity(dir: rustix::fd::BorrowedFd<'_>) -> io::Result<FsIdentity> {
    let sfs = rustix::fs::fstatfs(dir)?;
    let magic = sfs.f_type as u64;
    let st = rustix::fs::fstat(dir)?;
    let name = fs_type_name(dir).unwrap_or_else(|| format!("0x{magic:x}"));
    let uuid = match fs_uuid(dir) {
        Some(u) if u != [0; 16] => u,
        _ => {
            let mut h = HashAlgo::Sha256.hasher();
            h.update(b"verilay host filesystem\0");
            h.update(&magic.to_le_bytes());
            h.update(&st.st_dev.to_le_bytes());
            let d = h.finish();
            let mut u = [0u8; 16];
            u.copy_from_slice(&d[..16]);
            u
        }
    };
    Ok(FsIdentity { magic, name, uuid })
}

/// The filesystem type of the mount holding `dir`, from /proc/self/mountinfo.
fn fs_type_name(dir: rustix::fd::BorrowedFd<'_>) -> Option<String> {
    let sx = rustix::fs::statx(
        dir,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::MNT_ID,
    )
    .ok()?;
    let id = sx.stx_mnt_id.to_string();
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let line = info
        .lines()
        .find(|l| l.split(' ').next() == Some(id.as_str()))?;
    let after = line.split(" - ").nth(1)?;
    let fstype = after.split(' ').next()?;
    // A FUSE filesystem's subtype is not part of the kernel's name for it.
    Some(fstype.split('.').next().unwrap_or(fstype).to_string())
}

/// The filesystem's uuid as the kernel holds it (`FS_IOC_GETFSUUID`, Linux 6.5+).
fn fs_uuid(dir: rustix::fd::BorrowedFd<'_>) -> Option<[u8; 16]> {
    use rustix::fd::AsRawFd;
    // struct fsuuid2 { __u8 len; __u8 uuid[16]; }; _IOR(0x15, 0, struct fsuuid2)
    const FS_IOC_GETFSUUID: libc::c_ulong = 0x8011_1500;
    let mut buf = [0u8; 17];
    // SAFETY: the ioctl writes at most size_of::<fsuuid2>() = 17 bytes into `buf`, which
    // is that large, and `dir` is a valid descriptor for the duration of the call.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), FS_IOC_GETFSUUID, buf.as_mut_ptr()) };
    if r != 0 || buf[0] as usize > 16 {
        return None;
    }
    let mut u = [0u8; 16];
    u[..buf[0] as usize].copy_from_slice(&buf[1..1 + buf[0] as usize]);
    Some(u)
}

/// An image file as both filesystems measure it: its bytes (verified), its stored
/// fs-verity digest and its `security.ima`.
pub struct ImageFile<'a, S: erofs::read::ByteSource> {
    pub image: &'a erofs::read::Image<S>,
    pub inode: &'a erofs::read::Inode,
}

impl<'a, S: erofs::read::ByteSource> ImageFile<'a, S> {
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
