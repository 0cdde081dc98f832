//! The measurement list's one writer, in IMA's formats (docs/FORMAT.md, "Measurement lists"),
//! so evmctl replays it against the PCR files beside it. No TPM: self-consistent, not attested.
//!
//! - An entry reaches the files at [`Log::flush`], after its open was answered.
//! - That gap is never silent: reopening a list in use with no holder records violations first
//!   ([`Log::open_as`]; docs/SECURITY.md 8).

use crate::files::{self, How, OpenError};
pub(crate) use crate::format::Pcrs;
pub use crate::format::*;
use crate::verify::{self, Mode, VerifyError};
use rustix::fd::{AsFd, OwnedFd};
use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// How long an open waits for another writer to let go of the list (a mount that was just
/// unmounted is still closing its list) before it refuses.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Why a list was not opened, or an entry not taken or written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A file in the list directory could not be read or written.
    #[error("{}: {err}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's error.
        err: io::Error,
    },
    /// A file in the list directory is not one to use (a symlink, not a regular file,
    /// writable by someone else).
    #[error("{}: {why}", path.display())]
    Refused {
        /// The file.
        path: PathBuf,
        /// Why it is not used.
        why: String,
    },
    /// The list already in the directory does not verify, so it is not continued.
    #[error("not continuing the measurement list in {}: {err}", dir.display())]
    Corrupt {
        /// The list's directory.
        dir: PathBuf,
        /// Where the list fails to verify.
        err: Box<VerifyError>,
    },
    /// Another writer holds the list.
    #[error(
        "the measurement list in {} is in use by another writer ({holder}); two mounts cannot share a list",
        dir.display()
    )]
    InUse {
        /// The list's directory.
        dir: PathBuf,
        /// Who holds it, as its lock file says.
        holder: String,
    },
    /// The event cannot be logged.
    #[error("cannot log measurement: {0}")]
    Invalid(String),
    /// An earlier append failed part-way; the files on disk may disagree.
    #[error("an earlier write to the measurement list failed; it takes no more entries")]
    Broken,
    /// The list was closed; it takes no more entries.
    #[error("the measurement list was closed")]
    Closed,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LogError + '_ {
    move |err| LogError::Io {
        path: path.to_path_buf(),
        err,
    }
}

fn open_err(path: &Path) -> impl FnOnce(OpenError) -> LogError + '_ {
    move |e| match e {
        OpenError::Io(err) => io_err(path)(err),
        OpenError::Refused(why) => LogError::Refused {
            path: path.to_path_buf(),
            why,
        },
    }
}

/// Who opens a list, as the lock file and the marker say it, and which PCRs its entries
/// may extend (where a violation goes if it dies).
#[derive(Clone, Debug)]
pub struct Holder {
    /// What holds it besides the process id, e.g. `mount on /mnt`.
    pub what: String,
    /// The PCRs its policy may extend.
    pub pcrs: Vec<u32>,
}

impl Default for Holder {
    fn default() -> Holder {
        Holder {
            what: String::new(),
            pcrs: vec![DEFAULT_PCR],
        }
    }
}

impl Holder {
    /// One line: `pid N` and what it is.
    fn text(&self) -> String {
        let what = self.what.replace(['\n', '\r'], " ");
        match what.is_empty() {
            true => format!("pid {}", std::process::id()),
            false => format!("pid {}, {what}", std::process::id()),
        }
    }
}

/// What opening a list that was not closed cleanly did to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The dead writer, as its marker named it.
    pub holder: String,
    /// Entries kept: all four list files agreed on them.
    pub kept: u64,
    /// The first problem past them, if the files disagreed there (a torn batch).
    pub problem: Option<String>,
    /// (file, offset, bytes) cut from the end of each list file that held more.
    pub cut: Vec<(&'static str, u64, u64)>,
    /// (entry, PCR) of each violation entry added.
    pub violations: Vec<(u64, u32)>,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the list was not closed cleanly ({}): events after entry {} may be missing",
            self.holder, self.kept
        )?;
        if let Some(p) = &self.problem {
            let cut: Vec<String> = self
                .cut
                .iter()
                .map(|(file, at, n)| format!("{n} bytes of {file} from offset {at}"))
                .collect();
            write!(
                f,
                "; a torn batch was cut ({}; first problem: {p})",
                cut.join(", ")
            )?;
        }
        let v: Vec<String> = self
            .violations
            .iter()
            .map(|(e, p)| format!("entry {e} on PCR {p}"))
            .collect();
        write!(f, "; recorded as violation {}", v.join(", "))
    }
}

/// The measurement list in a directory, appended to as entries come, with the PCR values kept beside it.
pub struct Log {
    dir: PathBuf,
    /// The directory, which every file is opened in (never by a path again).
    dirfd: OwnedFd,
    /// The lock file, locked: held for as long as the list is open.
    _lock: File,
    /// The files, written a batch at a time (see [`Log::flush_shared`]).
    files: Arc<Writer>,
    /// Entries taken but not yet handed to the files (see [`Log::flush`]).
    pending: Vec<Entry>,
    entries: u64,
    pcrs: Pcrs,
    /// (PCR, SHA-256 template digest) of every entry: the kernel's duplicate check
    /// (`ima_lookup_digest_entry` keys on the ima_hash_algo bank's digest and the PCR).
    /// Keys are digests, so a fast keyed hash will do (SipHash was a measurable part of
    /// an append).
    seen: HashSet<(u32, [u8; 32]), foldhash::fast::RandomState>,
    /// Set for good when a write failed: the files may disagree with each other.
    broken: Arc<AtomicBool>,
    /// Batches taken so far (the next one's number).
    taken: u64,
    /// Closed cleanly (the marker is gone): no more entries.
    closed: bool,
    /// Let go of as a killed process would (see [`Log::abandon`]).
    abandoned: bool,
    recovery: Option<Recovery>,
}

/// A writer that died with the list open, as its marker tells.
struct DeadWriter {
    holder: String,
    /// Bit i: its policy could extend PCR i.
    pcrs: u32,
}

/// What was cut from a recovered list's files.
#[derive(Default)]
struct Cut {
    cut: Vec<(&'static str, u64, u64)>,
    problem: Option<String>,
}

fn holder_mask(pcrs: &[u32]) -> u32 {
    pcrs.iter()
        .filter(|&&p| p < NUM_PCRS)
        .fold(0, |m, &p| m | 1 << p)
}

/// The list's files, and which batch writes next: batches are written in the order they
/// were taken, each by whoever took it, without the log held.
struct Writer {
    files: Mutex<Files>,
    turn: Condvar,
}

struct Files {
    /// The four list files, opened for append: sha1 binary, sha1 ascii, sha256 binary, sha256 ascii.
    lists: Vec<(PathBuf, File)>,
    /// The count and the two PCR files, rewritten in place as entries come: the count
    /// only grows, and a PCR file's lines have a fixed width, so one write at a fixed
    /// offset updates each (no temporary file, no rename, no sync per entry).
    state: Vec<(PathBuf, File)>,
    /// The buffer a batch is formatted into, kept between batches.
    scratch: Vec<u8>,
    /// The number of the batch whose turn it is.
    next: u64,
}

/// Entries taken from a shared log, to be written with its lock free
/// (`Log::flush_shared`).
struct Taken {
    batch: Option<Batch>,
    files: Arc<Writer>,
    broken: Arc<AtomicBool>,
}

impl Taken {
    fn write(self) -> Result<(), LogError> {
        match self.batch {
            Some(b) => self.files.write(b, &self.broken),
            None => Ok(()),
        }
    }
}

/// Entries taken from the log, with the count and PCRs as they stand after them (the
/// files' text is made by the writer, with the log free).
struct Batch {
    number: u64,
    entries: Vec<Entry>,
    count: u64,
    pcrs: Box<Pcrs>,
}

const LISTS: [(&str, Bank, bool); 4] = [
    (BINARY_SHA1, Bank::Sha1, false),
    (ASCII_SHA1, Bank::Sha1, true),
    (BINARY_SHA256, Bank::Sha256, false),
    (ASCII_SHA256, Bank::Sha256, true),
];

impl Log {
    /// [`Log::open_as`] by this process, for PCR 10.
    pub fn open(dir: &Path) -> Result<Log, LogError> {
        Log::open_as(dir, &Holder::default())
    }

    /// Opens DIR (created 0700 if missing) as the list's one writer, waiting a few seconds
    /// at most for another writer to let go of it. Empty or new → starts a list with
    /// boot_aggregate. Holding a list already (a previous mount) → continues it: if the
    /// last writer closed it, only if it verifies against its PCR files (else an error
    /// naming the file, the offset and what is wrong, and nothing is written); if the
    /// last writer died with it open, from the entries its files agree on, with violation
    /// entries marking the gap (docs/FORMAT.md, "Violations"; [`Log::recovery`]).
    ///
    /// "Empty" means none of the four list files holds a byte; anything else must verify.
    pub fn open_as(dir: &Path, holder: &Holder) -> Result<Log, LogError> {
        let dirfd = files::open_dir(dir, true, true).map_err(open_err(dir))?;
        let lock = Log::lock(dir, &dirfd, holder)?;
        let dead = Log::read_marker(dir, &dirfd)?;
        let fresh = Log::lists_empty(dir, &dirfd)?;
        let corrupt = |err| LogError::Corrupt {
            dir: dir.to_path_buf(),
            err: Box::new(err),
        };
        let replayed = match (&dead, fresh) {
            (_, true) => None,
            (None, false) => {
                Some(verify::replay(dirfd.as_fd(), Mode::Strict, true, true).map_err(corrupt)?)
            }
            (Some(_), false) => {
                Some(verify::replay(dirfd.as_fd(), Mode::Recover, true, true).map_err(corrupt)?)
            }
        };
        // In use from here on: durable before any entry is taken. A list whose last
        // writer died keeps that writer's marker until the gap is recorded durably
        // (below): killed before then, this mount leaves the next one owing violations
        // to every PCR the dead writer could extend, not to this one's alone.
        if dead.is_none() {
            Log::write_marker(dir, &dirfd, holder)?;
        }
        let opened = Log::open_lists(dir, &dirfd, replayed.as_ref());
        let (entries, pcrs, seen, used) = match replayed {
            Some(r) => (r.entries, r.pcrs, r.keys.into_iter().collect(), r.pcrs_used),
            None => (0, Pcrs::zero(), HashSet::default(), 0),
        };
        let opened = opened.and_then(|(lists, cut)| {
            Ok((lists, cut, Log::open_state(dir, &dirfd, entries, &pcrs)?))
        });
        let (lists, cut, state) = match opened {
            Ok(o) => o,
            Err(e) => {
                // Nothing was taken: the list is as it was, and so is its marker (none,
                // or the dead writer's), so the next mount records no false gap.
                if dead.is_none() {
                    Log::remove_marker(&dirfd);
                }
                return Err(e);
            }
        };
        let files = Files {
            lists,
            state,
            scratch: Vec::new(),
            next: 0,
        };
        let mut log = Log {
            dir: dir.to_path_buf(),
            dirfd,
            _lock: lock,
            files: Arc::new(Writer {
                files: Mutex::new(files),
                turn: Condvar::new(),
            }),
            pending: Vec::new(),
            entries,
            pcrs,
            seen,
            broken: Arc::new(AtomicBool::new(false)),
            taken: 0,
            closed: false,
            abandoned: false,
            recovery: None,
        };
        if entries == 0 {
            log.push(Entry::boot_aggregate())?;
        }
        if let Some((dead, problem)) = dead.map(|d| (d, cut.problem)) {
            // Every PCR the dead writer may have extended, as far as is known: its
            // policy's (from its marker; if that names none, this writer's), those the
            // list has used, and IMA's own.
            let policy = match dead.pcrs {
                0 => holder_mask(&holder.pcrs),
                named => named,
            };
            let pcrs = (policy | used | (1 << DEFAULT_PCR)) & ((1u32 << NUM_PCRS) - 1);
            let mut violations = Vec::new();
            for pcr in (0..NUM_PCRS).filter(|p| pcrs & (1 << p) != 0) {
                log.push(Entry::violation(pcr, UNCLEAN_SHUTDOWN.as_bytes()))?;
                violations.push((log.entries, pcr));
            }
            log.recovery = Some(Recovery {
                holder: dead.holder,
                kept: entries,
                problem,
                cut: cut.cut,
                violations,
            });
        }
        log.flush()?;
        if log.recovery.is_some() {
            // The gap is recorded for good: the marker becomes this writer's.
            log.sync()?;
            Log::write_marker(dir, &log.dirfd, holder)?;
        }
        Ok(log)
    }

    /// Removes the in-use marker (as it was before a failed open) and makes that durable;
    /// a failure leaves it, which costs at worst a violation no event needed.
    fn remove_marker(dirfd: &OwnedFd) {
        if rustix::fs::unlinkat(dirfd, IN_USE, rustix::fs::AtFlags::empty()).is_ok() {
            let _ = rustix::fs::fsync(dirfd);
        }
    }

    /// Takes the list's lock, waiting up to `LOCK_WAIT` for another holder to let go, and
    /// records the holder in the lock file.
    fn lock(dir: &Path, dirfd: &OwnedFd, holder: &Holder) -> Result<File, LogError> {
        use host::lockfile::{self, Kind};
        let path = dir.join(LOCK);
        let f =
            files::open_in(dirfd.as_fd(), LOCK, How::ReadWrite, true).map_err(open_err(&path))?;
        let start = std::time::Instant::now();
        let taken = lockfile::lock(f.as_fd(), Kind::Ofd, true, || start.elapsed() < LOCK_WAIT)
            .map_err(io_err(&path))?;
        if !taken {
            let holder = verify::read_note(&f, LOCK).unwrap_or_else(|e| e.to_string());
            return Err(LogError::InUse {
                dir: dir.to_path_buf(),
                holder,
            });
        }
        lockfile::write_record(&f, &(holder.text() + "\n")).map_err(io_err(&path))?;
        Ok(f)
    }

    /// The marker a writer that died with the list open left, if there is one.
    fn read_marker(dir: &Path, dirfd: &OwnedFd) -> Result<Option<DeadWriter>, LogError> {
        let path = dir.join(IN_USE);
        let mut f = match files::open_in(dirfd.as_fd(), IN_USE, How::Read, true) {
            Ok(f) => f,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(open_err(&path)(e)),
        };
        // Garbage is a marker too (the writer died): what it says is only a help.
        let text = files::read_capped(&mut f, verify::MAX_NOTE)
            .map_err(io_err(&path))?
            .unwrap_or_default();
        let mut lines = text.split(|&b| b == b'\n');
        let first = lines.next().unwrap_or(&[]);
        let holder = match files::show_text(first) {
            s if s.is_empty() => "no holder recorded".to_string(),
            s => s,
        };
        let pcrs = lines
            .find_map(|l| l.strip_prefix(b"pcrs:"))
            .map(|l| {
                String::from_utf8_lossy(l)
                    .split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok())
                    .filter(|&p| p < NUM_PCRS)
                    .fold(0u32, |m, p| m | 1 << p)
            })
            .unwrap_or(0);
        Ok(Some(DeadWriter { holder, pcrs }))
    }

    /// Writes the in-use marker (holder, then its PCRs) and makes it durable.
    fn write_marker(dir: &Path, dirfd: &OwnedFd, holder: &Holder) -> Result<(), LogError> {
        let path = dir.join(IN_USE);
        let f =
            files::open_in(dirfd.as_fd(), IN_USE, How::ReadWrite, true).map_err(open_err(&path))?;
        let pcrs: Vec<String> = holder.pcrs.iter().map(u32::to_string).collect();
        let text = format!("{}\npcrs: {}\n", holder.text(), pcrs.join(" "));
        f.set_len(0)
            .and_then(|()| f.write_all_at(text.as_bytes(), 0))
            .and_then(|()| f.sync_all())
            .map_err(io_err(&path))?;
        rustix::fs::fsync(dirfd)
            .map_err(io::Error::from)
            .map_err(io_err(dir))
    }

    /// Whether none of the four list files holds a byte (or exists). A file that is not
    /// one to read (a symlink, a FIFO...) is something: the replay then refuses it.
    fn lists_empty(dir: &Path, dirfd: &OwnedFd) -> Result<bool, LogError> {
        for (name, _, _) in LISTS {
            let path = dir.join(name);
            match files::open_in(dirfd.as_fd(), name, How::Read, true) {
                Ok(f) => {
                    if f.metadata().map_err(io_err(&path))?.len() != 0 {
                        return Ok(false);
                    }
                }
                Err(e) if e.is_not_found() => {}
                Err(OpenError::Refused(_)) => return Ok(false),
                Err(e) => return Err(open_err(&path)(e)),
            }
        }
        Ok(true)
    }

    /// The four list files, opened to append to: emptied for a new list, cut back to the
    /// entries they agree on for a recovered one.
    fn open_lists(
        dir: &Path,
        dirfd: &OwnedFd,
        replayed: Option<&verify::Replay>,
    ) -> Result<(Vec<(PathBuf, File)>, Cut), LogError> {
        let mut lists = Vec::with_capacity(LISTS.len());
        let mut cut = Cut::default();
        for (i, (name, _, _)) in LISTS.into_iter().enumerate() {
            let path = dir.join(name);
            let f =
                files::open_in(dirfd.as_fd(), name, How::Append, true).map_err(open_err(&path))?;
            // Empty already for a new list; truncating keeps a file made by someone else
            // meanwhile honest.
            let (end, len) = replayed.map_or((0, 0), |r| r.ends[i]);
            let now = f.metadata().map_err(io_err(&path))?.len();
            if now != end {
                f.set_len(end).map_err(io_err(&path))?;
                if replayed.is_some() {
                    cut.cut.push((name, end, len.max(now) - end));
                }
            }
            lists.push((path, f));
        }
        cut.problem = replayed.and_then(|r| r.torn.as_ref().map(ToString::to_string));
        Ok((lists, cut))
    }

    /// The count and PCR files, rewritten whole as the list says (it verified, was
    /// recovered, or is new).
    fn open_state(
        dir: &Path,
        dirfd: &OwnedFd,
        entries: u64,
        pcrs: &Pcrs,
    ) -> Result<Vec<(PathBuf, File)>, LogError> {
        let mut state = Vec::with_capacity(3);
        for (name, text) in [
            (COUNT, format!("{entries}\n")),
            (PCRS_SHA1, pcrs.file_text(Bank::Sha1)),
            (PCRS_SHA256, pcrs.file_text(Bank::Sha256)),
        ] {
            let path = dir.join(name);
            let f = files::open_in(dirfd.as_fd(), name, How::ReadWrite, true)
                .map_err(open_err(&path))?;
            f.write_all_at(text.as_bytes(), 0).map_err(io_err(&path))?;
            f.set_len(text.len() as u64).map_err(io_err(&path))?;
            state.push((path, f));
        }
        Ok(state)
    }

    /// What opening the list recovered from, if its last writer died with it open.
    pub fn recovery(&self) -> Option<&Recovery> {
        self.recovery.as_ref()
    }

    /// Appends unless an entry with the same SHA-256 template digest and PCR is already in the list (then false,
    /// nothing written, PCRs unchanged — the kernel's duplicate suppression).
    pub fn append(&mut self, pcr: u32, ev: &Event<'_>) -> Result<bool, LogError> {
        let entry = Log::entry(pcr, ev)?;
        self.append_entry(entry)
    }

    /// The entry `append` would add for this event, checked; computed without the log, so a
    /// shared log is held only for the append itself.
    pub fn entry(pcr: u32, ev: &Event<'_>) -> Result<Entry, LogError> {
        Log::check_event(pcr, ev)?;
        Ok(Entry::new(pcr, ev))
    }

    /// The checks `entry` makes, without making the entry (which can then be made later,
    /// elsewhere, and cannot fail).
    pub fn check_event(pcr: u32, ev: &Event<'_>) -> Result<(), LogError> {
        if pcr >= NUM_PCRS {
            return Err(LogError::Invalid(format!(
                "PCR {pcr} does not exist (0-{})",
                NUM_PCRS - 1
            )));
        }
        ev.check().map_err(LogError::Invalid)
    }

    /// Set for good once a write of the list failed (then appends fail): for those who
    /// hand entries over later and must refuse what would fail now.
    pub fn broken_flag(&self) -> Arc<AtomicBool> {
        self.broken.clone()
    }

    /// Appends an entry made by [`Log::entry`], unless the list has it (then false).
    /// A violation (see [`Entry::violation`]) is always appended: the kernel skips the
    /// duplicate check for them.
    pub fn append_entry(&mut self, entry: Entry) -> Result<bool, LogError> {
        self.check()?;
        if !entry.is_violation() && self.seen.contains(&(entry.pcr, entry.sha256)) {
            return Ok(false);
        }
        self.push(entry)?;
        Ok(true)
    }

    /// Takes the entry into the list: the PCRs are extended and the entry waits in memory
    /// for [`Log::flush`], which writes any number of entries with seven writes.
    fn push(&mut self, entry: Entry) -> Result<(), LogError> {
        entry.extend(&mut self.pcrs);
        self.entries += 1;
        if !entry.is_violation() {
            self.seen.insert((entry.pcr, entry.sha256));
        }
        self.pending.push(entry);
        Ok(())
    }

    /// Writes the entries taken since the last flush: their records appended to the four
    /// list files, then the count and both PCR files rewritten in place (the count only
    /// grows, the PCR files keep their length). Returns once every entry taken so far is
    /// in the files, also those of a batch another thread is writing (`flush_shared`).
    pub fn flush(&mut self) -> Result<(), LogError> {
        match self.take_batch()? {
            Some(b) => self.files.write(b, &self.broken),
            None => {
                let last = self.taken;
                self.files.wait_for(last);
                self.check()
            }
        }
    }

    /// `flush` for a log shared behind a mutex: the entries are taken with it held, and
    /// written with it free, so appends never wait for the files.
    pub fn flush_shared(log: &Mutex<Log>) -> Result<(), LogError> {
        Log::take_shared(log)?.write()
    }

    /// `flush_shared`'s first half, under the lock: the pending entries and where they go.
    fn take_shared(log: &Mutex<Log>) -> Result<Taken, LogError> {
        let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
        Ok(Taken {
            batch: l.take_batch()?,
            files: l.files.clone(),
            broken: l.broken.clone(),
        })
    }

    fn check(&self) -> Result<(), LogError> {
        if self.broken.load(Ordering::Acquire) {
            return Err(LogError::Broken);
        }
        if self.closed {
            return Err(LogError::Closed);
        }
        Ok(())
    }

    /// The pending entries, numbered for their turn at the files; `None` if there are none.
    fn take_batch(&mut self) -> Result<Option<Batch>, LogError> {
        self.check()?;
        if self.pending.is_empty() {
            return Ok(None);
        }
        let number = self.taken;
        self.taken += 1;
        Ok(Some(Batch {
            number,
            entries: std::mem::take(&mut self.pending),
            count: self.entries,
            pcrs: Box::new(self.pcrs.clone()),
        }))
    }

    /// Makes everything written so far durable (fsync of the files and the directory).
    pub fn sync(&mut self) -> Result<(), LogError> {
        self.flush()?;
        {
            let f = self.files.files.lock().unwrap_or_else(|p| p.into_inner());
            for (path, f) in f.lists.iter().chain(&f.state) {
                f.sync_data().map_err(io_err(path))?;
            }
        }
        // The directory holds the files' names (new at the first mount).
        rustix::fs::fsync(&self.dirfd)
            .map_err(io::Error::from)
            .map_err(io_err(&self.dir))
    }

    /// Closes the list cleanly: every entry taken is written and durable, then the in-use
    /// marker is removed (and that made durable), so the next writer continues it without
    /// a violation. Takes no entries afterwards. A list whose writes failed is not closed
    /// cleanly: it keeps its marker.
    pub fn close(&mut self) -> Result<(), LogError> {
        if self.closed {
            return Ok(());
        }
        self.sync()?;
        rustix::fs::unlinkat(&self.dirfd, IN_USE, rustix::fs::AtFlags::empty())
            .map_err(io::Error::from)
            .map_err(io_err(&self.dir.join(IN_USE)))?;
        rustix::fs::fsync(&self.dirfd)
            .map_err(io::Error::from)
            .map_err(io_err(&self.dir))?;
        self.closed = true;
        Ok(())
    }

    /// Lets go of the list as a killed process would: entries not yet written are lost,
    /// and the marker stays, so the next writer records the gap. For tests.
    pub fn abandon(mut self) {
        self.abandoned = true;
    }

    /// Entries in the list, those not yet written to the files included.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// PCR `index` of a bank as replayed so far; empty for an index past 23.
    pub fn pcr(&self, bank: Bank, index: u32) -> Vec<u8> {
        self.pcrs.get(bank, index).unwrap_or(&[]).to_vec()
    }

    /// The list's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Writer {
    /// Writes batch `b` once the batches taken before it are written. A failure leaves
    /// the list broken for good (`broken`): later appends fail, so measured opens do.
    fn write(&self, b: Batch, broken: &AtomicBool) -> Result<(), LogError> {
        let mut f = self.files.lock().unwrap_or_else(|p| p.into_inner());
        while f.next != b.number {
            f = self.turn.wait(f).unwrap_or_else(|p| p.into_inner());
        }
        let r = f.put(&b);
        if r.is_err() {
            broken.store(true, Ordering::Release);
        }
        f.next += 1;
        self.turn.notify_all();
        r
    }

    /// Waits until the batches before number `n` are written.
    fn wait_for(&self, n: u64) {
        let mut f = self.files.lock().unwrap_or_else(|p| p.into_inner());
        while f.next < n {
            f = self.turn.wait(f).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Files {
    fn put(&mut self, b: &Batch) -> Result<(), LogError> {
        let mut bytes = std::mem::take(&mut self.scratch);
        for ((path, f), (_, bank, ascii)) in self.lists.iter_mut().zip(LISTS) {
            bytes.clear();
            for entry in &b.entries {
                if ascii {
                    entry.put_ascii(bank, &mut bytes);
                } else {
                    entry.put_binary_record(bank, &mut bytes);
                }
            }
            f.write_all(&bytes).map_err(io_err(path))?;
        }
        self.scratch = bytes;
        let state = [
            format!("{}\n", b.count),
            b.pcrs.file_text(Bank::Sha1),
            b.pcrs.file_text(Bank::Sha256),
        ];
        for ((path, f), text) in self.state.iter().zip(&state) {
            f.write_all_at(text.as_bytes(), 0).map_err(io_err(path))?;
        }
        Ok(())
    }
}

impl Drop for Log {
    /// A list let go of is closed cleanly ([`Log::close`]), unless it was abandoned.
    fn drop(&mut self) {
        if !self.abandoned {
            let _ = self.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Template;

    fn le(n: u32) -> [u8; 4] {
        n.to_le_bytes()
    }

    fn hex(s: &str) -> Vec<u8> {
        from_hex(s.as_bytes()).unwrap()
    }

    /// The expected template data and digests below were built by hand (and hashed with
    /// Python's hashlib), not with this module.
    fn check(e: &Entry, name: &str, data: &[u8], sha1: &str, sha256: &str) {
        assert_eq!(e.template_name, name);
        assert_eq!(e.data, data, "template data of {name}");
        assert_eq!(to_hex(&e.sha1), sha1);
        assert_eq!(to_hex(&e.sha256), sha256);
        let record = [
            &le(e.pcr)[..],
            &hex(sha1),
            &le(name.len() as u32),
            name.as_bytes(),
            &le(data.len() as u32),
            data,
        ]
        .concat();
        assert_eq!(e.binary_record(Bank::Sha1), record);
        let record = [
            &le(e.pcr)[..],
            &hex(sha256),
            &le(name.len() as u32),
            name.as_bytes(),
            &le(data.len() as u32),
            data,
        ]
        .concat();
        assert_eq!(e.binary_record(Bank::Sha256), record);
    }

    fn ev<'a>(
        template: Template,
        kind: DigestKind,
        algo: HashAlgo,
        digest: &'a [u8],
        path: &'a [u8],
        sig: Option<&'a [u8]>,
    ) -> Event<'a> {
        Event {
            template,
            kind,
            algo,
            digest,
            path,
            sig,
        }
    }

    const ZERO64: &str = "0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn boot_aggregate_is_the_kernels() {
        let e = Entry::boot_aggregate();
        assert_eq!(e.pcr, 10);
        let data = [
            &le(40)[..],
            b"sha256:\0",
            &[0; 32],
            &le(15),
            b"boot_aggregate\0",
        ]
        .concat();
        check(
            &e,
            "ima-ng",
            &data,
            "0adefe762c149c7cec19da62f0da1297fcfbffff",
            "36f1cd67a730bc4137870c4d00dbc7430b51b1ebdaa130744297cf65339078a0",
        );
        assert_eq!(
            e.ascii_line(Bank::Sha1),
            "10 0adefe762c149c7cec19da62f0da1297fcfbffff ima-ng sha256:0000000000000000000000000000000000000000000000000000000000000000 boot_aggregate\n"
        );
        assert_eq!(
            e.ascii_line(Bank::Sha256),
            format!("10 36f1cd67a730bc4137870c4d00dbc7430b51b1ebdaa130744297cf65339078a0 ima-ng sha256:{ZERO64} boot_aggregate\n")
        );
    }

    #[test]
    fn ima_ng_encoding_turns_spaces_into_underscores() {
        let digest: Vec<u8> = (0..32).collect();
        let e = Entry::new(
            10,
            &ev(
                Template::ImaNg,
                DigestKind::Ima,
                HashAlgo::Sha256,
                &digest,
                b"/usr/bin/my tool",
                Some(b"\x03ignored: ima-ng has no sig field"),
            ),
        );
        let data = [
            &le(40)[..],
            b"sha256:\0",
            &digest,
            &le(17),
            b"/usr/bin/my_tool\0",
        ]
        .concat();
        check(
            &e,
            "ima-ng",
            &data,
            "59a8ea0a9348ecb4b3bb6ce2f39f4f88cbada9f7",
            "0468d141c238985cde68ba0dc4f8891682a8fe13b0eed9f130f717a6ed83c731",
        );
        assert_eq!(
            e.ascii_line(Bank::Sha1),
            "10 59a8ea0a9348ecb4b3bb6ce2f39f4f88cbada9f7 ima-ng sha256:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f /usr/bin/my_tool\n"
        );
    }

    #[test]
    fn ima_ngv2_encodes_the_digest_type() {
        let e = Entry::new(
            11,
            &ev(
                Template::ImaNgV2,
                DigestKind::Ima,
                HashAlgo::Sha1,
                &[0xab; 20],
                b"/etc/passwd",
                None,
            ),
        );
        let data = [
            &le(30)[..],
            b"ima:sha1:\0",
            &[0xab; 20],
            &le(12),
            b"/etc/passwd\0",
        ]
        .concat();
        check(
            &e,
            "ima-ngv2",
            &data,
            "b4a7edc17ecef1daaa8dbfdee1a9ab0a90c24a77",
            "ac50e6516965f7d6ed9fbf58e4bc5a82ecfae76be9250fea0117aa2e37af1cb1",
        );
        assert_eq!(
            e.ascii_line(Bank::Sha1),
            format!(
                "11 b4a7edc17ecef1daaa8dbfdee1a9ab0a90c24a77 ima-ngv2 ima:sha1:{} /etc/passwd\n",
                "ab".repeat(20)
            )
        );

        let e = Entry::new(
            10,
            &ev(
                Template::ImaNgV2,
                DigestKind::Verity,
                HashAlgo::Sha512,
                &[0x5a; 64],
                b"/bin/sh",
                None,
            ),
        );
        let data = [
            &le(79)[..],
            b"verity:sha512:\0",
            &[0x5a; 64],
            &le(8),
            b"/bin/sh\0",
        ]
        .concat();
        check(
            &e,
            "ima-ngv2",
            &data,
            "169ed5a9cf018fa40effc8300e63369806cde244",
            "536a1716f38411bb3d9cff1626f1906b94c8b25845025e299ca1117aff566895",
        );
        assert_eq!(
            e.ascii_line(Bank::Sha256),
            format!(
                "10 536a1716f38411bb3d9cff1626f1906b94c8b25845025e299ca1117aff566895 ima-ngv2 verity:sha512:{} /bin/sh\n",
                "5a".repeat(64)
            )
        );
    }

    #[test]
    fn ima_sig_with_and_without_signature() {
        let digest = [0x11; 32];
        let base = [&le(40)[..], b"sha256:\0", &digest, &le(10), b"/lib/x.so\0"].concat();
        for sig in [None, Some(&b""[..])] {
            let e = Entry::new(
                10,
                &ev(
                    Template::ImaSig,
                    DigestKind::Ima,
                    HashAlgo::Sha256,
                    &digest,
                    b"/lib/x.so",
                    sig,
                ),
            );
            check(
                &e,
                "ima-sig",
                &[&base[..], &le(0)].concat(),
                "92bad0b8352a34366bb3ab5fa145514c662b748d",
                "cb4bea2013a87719fa3f8e7b836f6db7118d5546c5ff23d22e14c3c82b7d69bc",
            );
            // An empty field still gets its separating space: the line ends in " \n".
            assert_eq!(
                e.ascii_line(Bank::Sha1),
                format!(
                    "10 92bad0b8352a34366bb3ab5fa145514c662b748d ima-sig sha256:{} /lib/x.so \n",
                    "11".repeat(32)
                )
            );
        }
        let sig = b"\x03\x02\x04\xde\xad\xbe\xef";
        let e = Entry::new(
            10,
            &ev(
                Template::ImaSig,
                DigestKind::Ima,
                HashAlgo::Sha256,
                &digest,
                b"/lib/x.so",
                Some(sig),
            ),
        );
        check(
            &e,
            "ima-sig",
            &[&base[..], &le(7), sig].concat(),
            "50487aa50b717ba703446393d8168015097d99b4",
            "9179cb660f6e27840a20127687cbac186a10aa631063efa1839e4ed7e31d33f8",
        );
        assert_eq!(
            e.ascii_line(Bank::Sha1),
            format!(
                "10 50487aa50b717ba703446393d8168015097d99b4 ima-sig sha256:{} /lib/x.so 030204deadbeef\n",
                "11".repeat(32)
            )
        );

        let e = Entry::new(
            10,
            &ev(
                Template::ImaSigV2,
                DigestKind::Verity,
                HashAlgo::Sha256,
                &[0x22; 32],
                b"/a b c",
                Some(b"\x06\x01"),
            ),
        );
        let data = [
            &le(47)[..],
            b"verity:sha256:\0",
            &[0x22; 32],
            &le(7),
            b"/a_b_c\0",
            &le(2),
            b"\x06\x01",
        ]
        .concat();
        check(
            &e,
            "ima-sigv2",
            &data,
            "d3a2228d357785d924cbc18825fd0c8b6bf5b5ad",
            "e6075866aabec7c84c02cd2073fcd66474685f28610796d50c110a2fa9fa40bf",
        );
        assert_eq!(
            e.ascii_line(Bank::Sha1),
            format!(
                "10 d3a2228d357785d924cbc18825fd0c8b6bf5b5ad ima-sigv2 verity:sha256:{} /a_b_c 0601\n",
                "22".repeat(32)
            )
        );
    }

    fn read(dir: &Path, name: &str) -> Vec<u8> {
        std::fs::read(dir.join(name)).unwrap()
    }

    fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Appends from four threads while one writes batches with the log free and another
    /// flushes with it held: every entry reaches the files once, in the order taken, so
    /// the list replays to the PCRs the log has.
    #[test]
    fn batches_written_without_the_log_held_keep_the_list_whole() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("log");
        let log = Arc::new(Mutex::new(Log::open(&dir).unwrap()));
        let done = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let (log, done) = (log.clone(), done.clone());
                std::thread::spawn(move || {
                    while !done.load(Ordering::Acquire) {
                        if w == 0 {
                            // Taken, then written a moment later: the gap in which the
                            // other writer can take the next batch, made wide.
                            let taken = Log::take_shared(&log).unwrap();
                            std::thread::sleep(std::time::Duration::from_micros(20));
                            taken.write().unwrap();
                        } else {
                            log.lock().unwrap().flush().unwrap();
                        }
                    }
                })
            })
            .collect();
        let appenders: Vec<_> = (0..4u8)
            .map(|a| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u32 {
                        let (path, digest) = (format!("/a{a}/f{i}"), [a; 32]);
                        let e = ev(
                            Template::ImaNg,
                            DigestKind::Ima,
                            HashAlgo::Sha256,
                            &digest,
                            path.as_bytes(),
                            None,
                        );
                        let entry = Log::entry(10, &e).unwrap();
                        assert!(log.lock().unwrap().append_entry(entry).unwrap());
                    }
                })
            })
            .collect();
        for a in appenders {
            a.join().unwrap();
        }
        done.store(true, Ordering::Release);
        for w in writers {
            w.join().unwrap();
        }
        let mut log = log.lock().unwrap();
        log.flush().unwrap();
        assert_eq!(log.entries(), 8001);
        let d = files::open_dir(&dir, false, false).unwrap();
        let r = verify::replay(d.as_fd(), Mode::Strict, false, false).unwrap();
        assert_eq!(r.entries, 8001);
        assert_eq!(
            r.pcrs.get(Bank::Sha256, 10).unwrap(),
            &log.pcr(Bank::Sha256, 10)[..]
        );
    }

    #[test]
    fn new_list_pcr_extension_and_files() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("log");
        let mut log = Log::open(&dir).unwrap();
        assert_eq!(log.entries(), 1);
        // PCR 10 after boot_aggregate: H(0 || 0adefe76...) by hand.
        assert_eq!(
            to_hex(&log.pcr(Bank::Sha1, 10)),
            "5141100982188d48fb6fa0f19a8d27e3eabd703b"
        );
        assert_eq!(
            to_hex(&log.pcr(Bank::Sha256, 10)),
            "35d08f4de6c76c315d9ea3e5fea0305fc1e902506504f80d7c98d6d4e6e33072"
        );
        let digest: Vec<u8> = (0..32).collect();
        let ng = ev(
            Template::ImaNg,
            DigestKind::Ima,
            HashAlgo::Sha256,
            &digest,
            b"/usr/bin/my tool",
            None,
        );
        assert!(log.append(10, &ng).unwrap());
        let v2 = ev(
            Template::ImaNgV2,
            DigestKind::Ima,
            HashAlgo::Sha1,
            &[0xab; 20],
            b"/etc/passwd",
            None,
        );
        assert!(log.append(11, &v2).unwrap());
        assert_eq!(log.entries(), 3);
        let (p10_1, p10_2) = (
            "c02ec03e53d2650c4ef189bcca97eac521619da0",
            "db5a72493122bff8475874584f2ecfc873f19eefe37cae2120830556acc82c12",
        );
        let (p11_1, p11_2) = (
            "114f6f64ed14c96b48e6be6eb6be7c30cfa9b951",
            "9cc7d154f26f024ab1b2022b0a2a5d95cc4192ce73fb1857596040bd0ce230d6",
        );
        assert_eq!(to_hex(&log.pcr(Bank::Sha1, 10)), p10_1);
        assert_eq!(to_hex(&log.pcr(Bank::Sha256, 10)), p10_2);
        assert_eq!(to_hex(&log.pcr(Bank::Sha1, 11)), p11_1);
        assert_eq!(to_hex(&log.pcr(Bank::Sha256, 11)), p11_2);
        assert_eq!(log.pcr(Bank::Sha1, 0), vec![0; 20]);
        assert_eq!(log.pcr(Bank::Sha1, 24), Vec::<u8>::new());
        log.sync().unwrap();

        // The PCR files, line by line, as evmctl's --pcrs reads them.
        let mut want1 = String::new();
        let mut want2 = String::new();
        for i in 0..24 {
            let (a, b) = match i {
                10 => (p10_1.to_string(), p10_2.to_string()),
                11 => (p11_1.to_string(), p11_2.to_string()),
                _ => ("00".repeat(20), "00".repeat(32)),
            };
            want1 += &format!("PCR-{i:02}: {a}\n");
            want2 += &format!("PCR-{i:02}: {b}\n");
        }
        assert_eq!(String::from_utf8(read(&dir, PCRS_SHA1)).unwrap(), want1);
        assert_eq!(String::from_utf8(read(&dir, PCRS_SHA256)).unwrap(), want2);
        assert_eq!(read(&dir, COUNT), b"3\n");

        // Every list file is exactly the concatenation of its entries' renderings.
        let entries = [
            Entry::boot_aggregate(),
            Entry::new(10, &ng),
            Entry::new(11, &v2),
        ];
        for (name, bank, ascii) in LISTS {
            let want: Vec<u8> = entries
                .iter()
                .flat_map(|e| {
                    if ascii {
                        e.ascii_bytes(bank)
                    } else {
                        e.binary_record(bank)
                    }
                })
                .collect();
            assert_eq!(read(&dir, name), want, "{name}");
        }
        // No temporary file is left behind.
        let names: Vec<String> = snapshot(&dir).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                ASCII_SHA1,
                ASCII_SHA256,
                BINARY_SHA1,
                BINARY_SHA256,
                PCRS_SHA1,
                PCRS_SHA256,
                COUNT,
                IN_USE,
                LOCK
            ]
        );
        // The marker goes with a clean close; the lock file stays.
        drop(log);
        assert!(!dir.join(IN_USE).exists());
        assert!(dir.join(LOCK).exists());
    }

    #[test]
    fn duplicates_are_not_appended() {
        let t = tempfile::tempdir().unwrap();
        let mut log = Log::open(t.path()).unwrap();
        let e = ev(
            Template::ImaNg,
            DigestKind::Ima,
            HashAlgo::Sha256,
            &[7; 32],
            b"/x y",
            None,
        );
        assert!(log.append(10, &e).unwrap());
        let before = snapshot(t.path());
        let pcr = log.pcr(Bank::Sha256, 10);
        assert!(!log.append(10, &e).unwrap());
        // "/x_y" is the same template data as "/x y" (the kernel writes spaces as '_').
        let spaced = Event { path: b"/x_y", ..e };
        assert!(!log.append(10, &spaced).unwrap());
        assert_eq!(log.entries(), 2);
        assert_eq!(log.pcr(Bank::Sha256, 10), pcr);
        assert_eq!(snapshot(t.path()), before);
        // boot_aggregate itself is in the duplicate set.
        let ba = ev(
            Template::ImaNg,
            DigestKind::Ima,
            HashAlgo::Sha256,
            &[0; 32],
            b"boot_aggregate",
            None,
        );
        assert!(!log.append(10, &ba).unwrap());
        // Same data on another PCR is another entry, as in the kernel.
        assert!(log.append(11, &e).unwrap());
        assert_eq!(log.entries(), 3);
    }

    #[test]
    fn reopening_continues_the_list() {
        let t = tempfile::tempdir().unwrap();
        let a = ev(
            Template::ImaNg,
            DigestKind::Ima,
            HashAlgo::Sha256,
            &[1; 32],
            b"/a",
            None,
        );
        let b = ev(
            Template::ImaSigV2,
            DigestKind::Verity,
            HashAlgo::Sha256,
            &[2; 32],
            b"/b",
            Some(b"\x06sig"),
        );
        let (p1, p2) = {
            let mut log = Log::open(t.path()).unwrap();
            assert!(log.append(10, &a).unwrap());
            log.sync().unwrap();
            (log.pcr(Bank::Sha1, 10), log.pcr(Bank::Sha256, 10))
        };
        let mut log = Log::open(t.path()).unwrap();
        assert_eq!(log.entries(), 2);
        assert_eq!(log.pcr(Bank::Sha1, 10), p1);
        assert_eq!(log.pcr(Bank::Sha256, 10), p2);
        assert!(
            !log.append(10, &a).unwrap(),
            "duplicate set rebuilt on open"
        );
        assert!(log.append(10, &b).unwrap());
        drop(log);
        // One continuous list: the same bytes as a list written in one go.
        let t2 = tempfile::tempdir().unwrap();
        let mut log2 = Log::open(t2.path()).unwrap();
        log2.append(10, &a).unwrap();
        log2.append(10, &b).unwrap();
        drop(log2);
        assert_eq!(snapshot(t.path()), snapshot(t2.path()));
        let report = crate::verify::verify(t.path()).unwrap();
        assert_eq!(report.entries, 3);
        assert_eq!(Log::open(t.path()).unwrap().entries(), 3);
    }

    #[test]
    fn bad_events_are_errors() {
        let t = tempfile::tempdir().unwrap();
        let mut log = Log::open(t.path()).unwrap();
        let long = vec![b'a'; MAX_PATH + 1];
        let max = vec![b'a'; MAX_PATH];
        let ok = ev(
            Template::ImaNg,
            DigestKind::Ima,
            HashAlgo::Sha256,
            &[3; 32],
            b"/f",
            None,
        );
        let big_sig = vec![3u8; MAX_SIG + 1];
        let cases: Vec<(u32, Event, &str)> = vec![
            (24, ok, "PCR 24 does not exist (0-23)"),
            (
                10,
                Event { path: &long, ..ok },
                "path of 4097 bytes is longer than 4096",
            ),
            (
                10,
                Event {
                    path: b"/a\0b",
                    ..ok
                },
                "path contains a NUL byte",
            ),
            (
                10,
                Event {
                    digest: &[3; 20],
                    ..ok
                },
                "a sha256 digest is 32 bytes, not 20",
            ),
            (
                10,
                Event {
                    kind: DigestKind::Verity,
                    ..ok
                },
                "an fs-verity digest needs a v2 template (ima-ngv2, ima-sigv2), not ima-ng",
            ),
            (
                10,
                Event {
                    template: Template::ImaNgV2,
                    kind: DigestKind::Verity,
                    algo: HashAlgo::Sha1,
                    digest: &[3; 20],
                    ..ok
                },
                "fs-verity digests are sha256 or sha512, not sha1",
            ),
            (
                10,
                Event {
                    template: Template::ImaSig,
                    sig: Some(&big_sig),
                    ..ok
                },
                "signature of 65537 bytes is longer than 65536",
            ),
        ];
        let before = snapshot(t.path());
        for (pcr, e, why) in cases {
            let err = log.append(pcr, &e).unwrap_err();
            assert_eq!(err.to_string(), format!("cannot log measurement: {why}"));
        }
        assert_eq!(snapshot(t.path()), before);
        assert!(log.append(10, &Event { path: &max, ..ok }).unwrap());
        log.flush().unwrap();
        assert_eq!(crate::verify::verify(t.path()).unwrap().entries, 2);
        // Unchecked input to Entry::new still encodes without panicking.
        let e = Entry::new(
            99,
            &Event {
                path: b"/a\0b",
                ..ok
            },
        );
        assert!(e.ascii_line(Bank::Sha1).ends_with(" /a\n"));
    }

    #[test]
    fn hash_algos() {
        for (a, name, size) in [
            (HashAlgo::Sha1, "sha1", 20),
            (HashAlgo::Sha256, "sha256", 32),
            (HashAlgo::Sha512, "sha512", 64),
        ] {
            assert_eq!(a.name(), name);
            assert_eq!(a.size(), size);
            assert_eq!(HashAlgo::from_name(name), Some(a));
            let mut h = a.hasher();
            h.update(b"a");
            h.update(b"bc");
            assert_eq!(h.finish().len(), size);
        }
        assert_eq!(HashAlgo::from_name("md5"), None);
        let mut h = HashAlgo::Sha256.hasher();
        h.update(b"abc");
        assert_eq!(
            to_hex(&h.finish()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(from_hex(b"00ffAb"), Some(vec![0, 0xff, 0xab]));
        assert_eq!(from_hex(b"0"), None);
        assert_eq!(from_hex(b"0g"), None);
    }
}
