//! The measurement list's inbox: a measured open leaves its event here and returns; a
//! thread of the mount's own makes each batch entries of the list (template digests, the
//! duplicate check, PCR extensions) and writes them out, `FLUSH_EVERY` after the batch
//! started, with the list free while writing.

use super::Counters;
use measure::log::{DigestKind, Entry, Event, HashAlgo, Log, LogError, DEFAULT_PCR};
use measure::policy::Template;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};

/// How long a new entry may wait in memory before it is written to the list's files.
const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// A measured open's event, owned, until it becomes an entry of the list.
pub(super) struct Raw {
    /// A violation (`ima_add_violation`): only `path` counts.
    pub violation: bool,
    pub pcr: u32,
    pub template: Template,
    pub kind: DigestKind,
    pub algo: HashAlgo,
    pub digest: Vec<u8>,
    pub path: Vec<u8>,
    pub sig: Option<Vec<u8>>,
}

/// The list and what feeds it, shared with the flusher thread, which makes each batch of
/// events entries and writes them out `FLUSH_EVERY` after the batch starts: no open
/// waits for the list's files, nor for making its entry (two template digests, the
/// duplicate check, two PCR extensions).
pub(super) struct Shared {
    log: Mutex<Log>,
    /// Measured opens' events not yet in the list, in the order they were measured.
    /// Whoever reads the list or its counters (stats, unmount) drains it first.
    pub inbox: Mutex<Vec<Raw>>,
    /// Wakes the flusher when the inbox gets its first event (an idle mount's sleeps).
    pub wake: Condvar,
    /// The list's: set once a write failed, when measured opens fail rather than go
    /// unlisted.
    pub broken: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl Shared {
    /// The inbox of `log`, with its flusher thread started.
    pub fn start(log: Log, counters: Arc<Counters>) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            broken: log.broken_flag(),
            log: Mutex::new(log),
            inbox: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            counters,
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
        shared
    }

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
    pub fn log(&self) -> std::sync::MutexGuard<'_, Log> {
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
