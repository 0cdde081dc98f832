//! The measuring engine: the policy decides each open, and a measured one's digest goes
//! to the list (through the inbox); IMA's violations are recorded as the kernel records them.

use super::inbox::{Raw, Shared};
use super::opens::ReaderCount;
use super::task::task_ids_of;
use super::watch::MountWatch;
use super::{Content, ContentKey, Cookie, Counter, Counters, Opens};
use measure::log::{DigestKind, Event, HashAlgo, Log, LogError, DEFAULT_PCR, MAX_PATH};
use measure::policy::{Access, FsIdentity, Func, Measure, Policy, Template};
use measure::policy::{MAY_APPEND, MAY_EXEC, MAY_READ, MAY_WRITE};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// The open flag the kernel adds to an exec's open (`__FMODE_EXEC`).
pub(super) const FMODE_EXEC: i32 = 0x20;

/// How long a measured reader of a file with a writer waits for that writer's RELEASE
/// before recording open_writers (and a writer for the measured readers', before
/// ToMToU). The kernel sends RELEASE after close(2) has returned, so a file written,
/// closed and at once opened to read can still count its writer here (another worker
/// handling the RELEASE meanwhile): in the kernel it no longer would.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// How a file was opened, and by whom.
pub struct Opening<'a> {
    /// The open flags, with `FMODE_EXEC` for an exec.
    pub flags: i32,
    /// The opener's process id.
    pub pid: u32,
    /// The file's owner and group as the mount shows them.
    pub owner: (u32, u32),
    /// The identity of the filesystem the file is on, as the policy sees it.
    pub fs: &'a FsIdentity,
    /// What the file's digest is computed from.
    pub key: ContentKey,
    /// Upper files: the host inode's cookie now; `None` for image files.
    pub cookie: Option<Cookie>,
    /// How the file is open through the mount now (a writable mount's files; `None` for
    /// a read-only mount's, which nobody writes). While a writer has it, a digest is not
    /// kept, as the content can change at any moment; and IMA's violations are decided
    /// from it (see [`Opens`]).
    pub opens: Option<&'a Opens>,
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

#[derive(Clone)]
pub(super) struct Cached {
    pub cookie: Option<Cookie>,
    pub verity: bool,
    /// `None` while a hash begun at close is under way.
    pub digest: Option<Vec<u8>>,
    /// Which hash at close this entry waits for, so a later one (or a change) wins.
    pub token: u64,
}

/// A mount's measuring engine: the policy, the hash algorithm, and the digests computed so
/// far, by content.
pub struct Measuring {
    pub(super) policy: Policy,
    pub(super) shared: Arc<Shared>,
    pub(super) algo: HashAlgo,
    /// The digest of no bytes (every new file's).
    pub(super) empty: Vec<u8>,
    pub(super) cache: papaya::HashMap<ContentKey, Cached>,
    /// Hands out `Cached::token`s.
    pub(super) tokens: AtomicU64,
    /// Wakes measured opens waiting for a hash begun at close, and how many wait (no
    /// wake-up call when none does).
    pub(super) hashed: (Mutex<()>, Condvar),
    /// Signalled when a file's last writer closed (see [`RELEASE_WAIT`]).
    released: (Mutex<()>, Condvar),
    pub(super) waiting: AtomicU64,
    /// What measuring cost, for `verilay stats`.
    pub counters: Arc<Counters>,
    /// The mount measured, which a long hash watches (see `watch.rs`).
    pub(super) mount: MountWatch,
}

impl Measuring {
    /// Measures the opens of the mount on `mountpoint` (absolute, as mountinfo shows it)
    /// into `log`.
    pub fn new(policy: Policy, log: Log, algo: HashAlgo, mountpoint: &[u8]) -> Measuring {
        let counters = Arc::new(Counters::default());
        Measuring {
            policy,
            shared: Shared::start(log, counters.clone()),
            algo,
            empty: algo.hasher().finish(),
            cache: papaya::HashMap::new(),
            tokens: AtomicU64::new(1),
            hashed: (Mutex::new(()), Condvar::new()),
            released: (Mutex::new(()), Condvar::new()),
            waiting: AtomicU64::new(0),
            counters,
            mount: MountWatch::new(mountpoint),
        }
    }

    /// Whether some rule depends on who opens (uid, euid, gid, egid): then two opens of
    /// one unchanged file can be decided differently.
    pub fn depends_on_task(&self) -> bool {
        self.policy.depends_on_task()
    }

    /// Whether a layer with this identity can ever be measured (else opens of its files
    /// need no work at all).
    pub fn may_measure(&self, fs: &FsIdentity) -> bool {
        self.policy.may_measure(fs)
    }

    /// [`Measuring::may_measure`] for an open (`exec`: an exec's, checked as BPRM_CHECK and
    /// FILE_CHECK; else a file's, FILE_CHECK only).
    pub fn may_measure_open(&self, fs: &FsIdentity, exec: bool) -> bool {
        let funcs: &[Func] = if exec {
            &[Func::BprmCheck, Func::FileCheck]
        } else {
            &[Func::FileCheck]
        };
        self.policy.may_measure_any_of(fs, funcs)
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
            self.record(o, &m, content)?;
        }
        done.reader = reader.keep();
        if writes {
            // Whether the same task opening the file to read would be measured by its
            // content.
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

    /// Records the measurement `m` the policy asked for of opening `o`: the file's digest
    /// (reused or computed) in the template's event, checked now and made an entry of the
    /// list by the flusher (`Shared`), so what could fail fails this open.
    fn record(&self, o: &Opening<'_>, m: &Measure, content: &dyn Content) -> io::Result<()> {
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
        })
    }

    /// Waits (at most [`RELEASE_WAIT`]) while the file has `open` handles (writers, or
    /// measured readers), whose RELEASE may be on its way (see there).
    fn wait_for_release(&self, opens: &Opens, open: fn(&Opens) -> bool) {
        if !open(opens) || opens.seen() {
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

    /// At unmount: writes every entry measured, makes the list durable and closes it
    /// cleanly (its in-use marker goes, so the next mount continues it without a
    /// violation). Measured opens fail afterwards.
    pub fn close(&self) -> io::Result<()> {
        self.shared.log().close().map_err(io::Error::other)
    }

    /// The counters and the list's length (what `verilay stats` prints).
    pub fn stats(&self) -> crate::stats::Stats {
        let c = &self.counters;
        // Flushed first: the list's files hold every entry counted once this returns.
        let (entries, violations) = {
            let mut log = self.shared.log();
            let _ = log.flush();
            let recovered = log.recovery().map_or(0, |r| r.violations.len() as u64);
            (log.entries(), recovered + c.violations.get())
        };
        let counters: [(&str, &Counter); 11] = [
            ("checked", &c.checked),
            ("measured", &c.measured),
            ("hashed", &c.hashed),
            ("bytes_hashed", &c.bytes_hashed),
            ("hashed_at_close", &c.hashed_at_close),
            ("reused", &c.reused),
            ("verity_digests", &c.verity_digests),
            ("logged", &c.logged),
            ("duplicates", &c.duplicates),
            ("primed", &c.primed),
            ("bytes_primed", &c.bytes_primed),
        ];
        let mut s = crate::stats::Stats::new();
        s.insert("policy_rules".into(), self.policy.len().into());
        for (name, counter) in counters {
            s.insert(name.into(), counter.get().into());
        }
        s.insert("entries".into(), entries.into());
        s.insert("violations".into(), violations.into());
        s
    }
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
pub(super) fn writing(o: &Opening<'_>) -> bool {
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
