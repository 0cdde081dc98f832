//! The persistent cache of remote images: per pinned image a sparse file and a record of its
//! verified 4 KiB units (docs/FORMAT.md, "The cache of remote images").
//!
//! - Only just-verified bytes are written, before the record.
//! - Background stores (the prefetch's) go around the page cache (`O_DIRECT`) where their
//!   buffer allows: nobody waits on them and nobody reads them soon, and copying a whole
//!   image into the page cache took a quarter of a prefetch's CPU.
//! - The record is a hint: every byte read back is checked again, a failing unit fetched again.
//! - A mount holds a shared `flock` on its entry; `prune` removes only what it locks alone.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use rustix::fs::{self as rfs, FlockOperation, Mode, OFlags};
use verity::source::DIRECT_ALIGN;

/// The cache's unit: a bit of the record.
pub const UNIT: u64 = 4096;
/// Stores whose bytes go through the page cache start their writeback at once when this
/// large (see `store`).
const WRITEBACK_NOW: usize = 256 << 10;
// Direct writes are of whole units, from buffers aligned as verity's direct reads are.
const _: () = assert!((UNIT as usize).is_multiple_of(DIRECT_ALIGN));
const MAGIC: [u8; 8] = *b"VLCACHE1";
/// Magic, the image's length, the digest's length and the digest (`alg:hex`, zero-padded).
const HEADER: u64 = 8 + 8 + 8 + 160;

/// The least room made at a time when a mount's entry outgrows its budget (64 MiB).
const ROOM_STEP: u64 = 64 << 20;

/// The largest image cached (16 TiB; its record is then 512 MiB, held in memory).
const MAX_IMAGE: u64 = 1 << 44;

/// The default directory: `$VERILAY_CACHE`, else `/var/cache/verilay` for root, else
/// `$XDG_CACHE_HOME/verilay` or `~/.cache/verilay`.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("VERILAY_CACHE").filter(|d| !d.is_empty()) {
        return Some(d.into());
    }
    if rustix::process::geteuid().is_root() {
        return Some("/var/cache/verilay".into());
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("verilay"));
    }
    std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .map(|h| PathBuf::from(h).join(".cache/verilay"))
}

/// One image's entry, open for a mount.
pub struct Cache {
    name: String,
    /// The directory (open, and its path), this entry's stem and the size limit, for
    /// making room when the budget runs out.
    dir: (OwnedFd, PathBuf),
    stem: String,
    limit: u64,
    data: File,
    /// The data file again, opened `O_DIRECT`, if its filesystem does direct I/O at
    /// [`DIRECT_ALIGN`]; `direct_refused` once a write was refused all the same.
    direct: Option<File>,
    direct_refused: AtomicBool,
    record: File,
    len: u64,
    units: Vec<AtomicU64>,
    /// Serialises writes of the record and the accounting (the bits themselves are
    /// atomics); holds, per store under way, the span of units it is writing, which
    /// others leave to it (units in it that it does not write are held already).
    writing: Mutex<Vec<std::ops::Range<u64>>>,
    /// Bytes this mount may still add before the directory passes its size limit.
    budget: AtomicU64,
    full_said: AtomicBool,
    /// Bytes of verified units held.
    pub held: AtomicU64,
    /// Bytes served from the cache.
    pub served: AtomicU64,
    /// Times this mount flushed the entry to disk as it became complete.
    flushes: AtomicU64,
}

/// An entry as `verilay cache ls` shows it.
#[derive(Debug, serde::Serialize)]
pub struct Entry {
    /// The image's digest (`alg:hex`).
    pub digest: String,
    /// The entry's `.img` file.
    pub path: PathBuf,
    /// The image's length in bytes, as its record gives it (0 if the record has none).
    pub image_bytes: u64,
    /// Bytes of the image the record says are held.
    pub cached_bytes: u64,
    /// Bytes the `.img` file takes on disk.
    pub disk_bytes: u64,
    /// Whether the whole image is held.
    pub complete: bool,
    /// Whether a mount holds it: its record could not be locked exclusively.
    pub in_use: bool,
    /// Seconds since the epoch of the last mount that used it.
    pub last_used: i64,
}

/// `alg:hex` as a file name stem, refusing anything else (the name is made from it).
fn stem(digest: &str) -> io::Result<String> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{digest:?} is not a digest (ALG:HEX)"),
        )
    };
    let (alg, hex) = digest.split_once(':').ok_or_else(bad)?;
    let alg_ok = !alg.is_empty() && alg.bytes().all(|b| b.is_ascii_alphanumeric());
    let hex_ok = (2..=128).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit());
    if !alg_ok || !hex_ok {
        return Err(bad());
    }
    Ok(format!("{alg}-{}", hex.to_ascii_lowercase()))
}

/// Opens (making it, 0700, if missing) the cache directory, which must be ours and
/// writable by nobody else: its files decide what is fetched, and a planted link would
/// have a mount write through it.
pub fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    open_dir_making(dir, true)
}

/// [`open_dir`], making the directory only when `make` (a mount may; `ls` and `prune`
/// report a missing one rather than make it).
fn open_dir_making(dir: &Path, make: bool) -> io::Result<OwnedFd> {
    let ctx =
        |e: io::Error| io::Error::new(e.kind(), format!("cache directory {}: {e}", dir.display()));
    use std::os::unix::fs::DirBuilderExt;
    if make {
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
        match made {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(ctx(e)),
            _ => {}
        }
    }
    let fd = rfs::open(
        dir,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ctx(e.into()))?;
    let st = rfs::fstat(&fd).map_err(|e| ctx(e.into()))?;
    if st.st_uid != rustix::process::geteuid().as_raw() || st.st_mode & 0o022 != 0 {
        return Err(ctx(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "owned by uid {} with mode {:o}: it must be yours and writable by you alone",
                st.st_uid,
                st.st_mode & 0o7777
            ),
        )));
    }
    Ok(fd)
}

/// Opens `name` in `dir` for reading and writing, a regular file, never through a link.
fn open_file(dir: &OwnedFd, name: &str, create: bool) -> io::Result<File> {
    let mut flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if create {
        flags |= OFlags::CREATE;
    }
    let fd = rfs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?;
    let st = rfs::fstat(&fd)?;
    if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} is not a regular file"),
        ));
    }
    Ok(File::from(fd))
}

/// `name` in `dir` opened again with `O_DIRECT`, if it is still `data`'s file and its
/// filesystem says direct I/O works there at [`DIRECT_ALIGN`] (`statx`'s `STATX_DIOALIGN`:
/// where it says nothing, as tmpfs, or 0, as for ext4's journalled or encrypted files, the
/// page cache would take the bytes anyway).
fn open_direct(dir: &OwnedFd, name: &str, data: &File) -> Option<File> {
    let st = rfs::statx(
        data,
        "",
        rfs::AtFlags::EMPTY_PATH,
        rfs::StatxFlags::DIOALIGN,
    )
    .ok()?;
    let (mem, off) = (
        st.stx_dio_mem_align as usize,
        st.stx_dio_offset_align as usize,
    );
    let fits = |a: usize| a > 0 && DIRECT_ALIGN.is_multiple_of(a);
    if st.stx_mask & rfs::StatxFlags::DIOALIGN.bits() == 0 || !fits(mem) || !fits(off) {
        return None;
    }
    let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::DIRECT;
    let fd = rfs::openat(dir, name, flags, Mode::empty()).ok()?;
    let (a, b) = (rfs::fstat(&fd).ok()?, rfs::fstat(data).ok()?);
    (a.st_dev == b.st_dev && a.st_ino == b.st_ino).then(|| File::from(fd))
}

/// The runs of consecutive units of `units` that `pick` takes.
fn runs_where(
    units: std::ops::Range<u64>,
    pick: impl Fn(u64) -> bool,
) -> Vec<std::ops::Range<u64>> {
    let mut runs: Vec<std::ops::Range<u64>> = Vec::new();
    for u in units.filter(|&u| pick(u)) {
        match runs.last_mut() {
            Some(r) if r.end == u => r.end = u + 1,
            _ => runs.push(u..u + 1),
        }
    }
    runs
}

/// The header a record for this image must start with.
fn header(digest: &str, len: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER as usize);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&(digest.len() as u64).to_le_bytes());
    h.extend_from_slice(digest.as_bytes());
    h.resize(HEADER as usize, 0);
    h
}

/// Bytes the units marked in `bits` stand for (the short last unit counted whole).
fn held_bytes(bits: &[u64]) -> u64 {
    bits.iter().map(|w| u64::from(w.count_ones())).sum::<u64>() * UNIT
}

/// Bytes a file takes on disk (a sparse entry takes what it holds).
fn on_disk(m: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::blocks(m) * 512
}

fn words_for(len: u64) -> u64 {
    len.div_ceil(UNIT).div_ceil(64)
}

/// Whether `record` (not yet read) is this image's, and its bits if so.
fn load_record(record: &File, digest: &str, len: u64) -> io::Result<Option<Vec<u64>>> {
    // A length no entry can have (a damaged or planted record) is not loaded: the
    // bitmap it asks for could be any size.
    if len > MAX_IMAGE {
        return Ok(None);
    }
    let words = words_for(len);
    if record.metadata()?.len() != HEADER + words * 8 {
        return Ok(None);
    }
    let mut h = vec![0u8; HEADER as usize];
    record.read_exact_at(&mut h, 0)?;
    if h != header(digest, len) {
        return Ok(None);
    }
    let mut raw = vec![0u8; (words * 8) as usize];
    record.read_exact_at(&mut raw, HEADER)?;
    let mut bits: Vec<u64> = raw
        .chunks(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect();
    // Bits past the last unit (a damaged record) stand for nothing: counted, they would
    // make the entry look complete before it is.
    let units = len.div_ceil(UNIT);
    if let Some(last) = bits.last_mut().filter(|_| !units.is_multiple_of(64)) {
        *last &= (1 << (units % 64)) - 1;
    }
    Ok(Some(bits))
}

impl Cache {
    /// Opens the entry for the image `digest` (`alg:hex`) of `len` bytes in `dir`, making
    /// it if missing or not this image's, after pruning unused entries so that this
    /// directory fits under `limit` bytes in all if it can (more room is made, the same
    /// way, as the mount fills its entry).
    pub fn open(dir: &Path, digest: &str, len: u64, limit: u64) -> io::Result<Cache> {
        let stem = stem(digest)?;
        if len > MAX_IMAGE {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("an image of {len} bytes is too large to cache (at most {MAX_IMAGE})"),
            ));
        }
        let dfd = open_dir(dir)?;
        let name = dir.join(format!("{stem}.img")).display().to_string();
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("cache {name}: {e}"));
        let map = dir.join(format!("{stem}.map"));
        let record = lock_shared(&dfd, &format!("{stem}.map"))
            .map_err(|e| io::Error::new(e.kind(), format!("cache {}: {e}", map.display())))?;
        let data = open_file(&dfd, &format!("{stem}.img"), true).map_err(ctx)?;
        let direct = open_direct(&dfd, &format!("{stem}.img"), &data);
        let bits = match load_record(&record, digest, len).map_err(ctx)? {
            Some(bits) if data.metadata().map_err(ctx)?.len() == len => bits,
            _ => {
                // A new entry (or one for other bytes): start empty.
                data.set_len(0).map_err(ctx)?;
                data.set_len(len).map_err(ctx)?;
                record.set_len(0).map_err(ctx)?;
                record.set_len(HEADER + words_for(len) * 8).map_err(ctx)?;
                record.write_all_at(&header(digest, len), 0).map_err(ctx)?;
                vec![0; words_for(len) as usize]
            }
        };
        // Its use is recorded, for least-recently-used pruning.
        rfs::futimens(
            &record,
            &rfs::Timestamps {
                last_access: now(),
                last_modification: now(),
            },
        )
        .map_err(|e| ctx(e.into()))?;
        let held = held_bytes(&bits);
        let mine = on_disk(&data.metadata().map_err(ctx)?);
        let others = prune_dir(&dfd, dir, limit.saturating_sub(mine), Some(&stem))?
            .iter()
            .map(|e| e.disk_bytes)
            .sum::<u64>();
        Ok(Cache {
            name,
            dir: (dfd, dir.to_path_buf()),
            stem,
            limit,
            data,
            direct,
            record,
            len,
            units: bits.into_iter().map(AtomicU64::new).collect(),
            writing: Mutex::new(Vec::new()),
            direct_refused: AtomicBool::new(false),
            budget: AtomicU64::new(limit.saturating_sub(others + mine)),
            full_said: AtomicBool::new(false),
            // Whole units, the short last one too, as `store` counts them (`held()` clamps):
            // clamped here, a complete entry whose unit failed and came again would end
            // short of the count that flushes it.
            held: AtomicU64::new(held),
            served: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        })
    }

    /// The entry's `.img` file, for messages.
    pub fn path(&self) -> &str {
        &self.name
    }

    fn has_unit(&self, u: u64) -> bool {
        self.units[(u / 64) as usize].load(Ordering::Relaxed) & (1 << (u % 64)) != 0
    }

    /// Whether every unit that `[offset, offset + len)` touches is held.
    pub fn has(&self, offset: u64, len: u64) -> bool {
        let last = (offset + len.max(1) - 1) / UNIT;
        (offset / UNIT..=last).all(|u| self.has_unit(u))
    }

    /// Reads held bytes (the caller checked [`Cache::has`]).
    pub fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.data.read_exact_at(buf, offset)?;
        self.served.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The units `[offset, offset + len)` covers whole (the image's short last unit
    /// counts as whole when the range reaches the image's end).
    fn whole_units(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let end = offset + len;
        let first = offset.div_ceil(UNIT);
        let last = if end == self.len {
            end.div_ceil(UNIT)
        } else {
            end / UNIT
        };
        first..last.max(first)
    }

    /// Keeps `bytes` at `offset`, which the verified source has just checked; `around`:
    /// around the page cache where the buffer's alignment allows (see the module docs).
    /// Only units neither held nor being written by another store are written, and with
    /// the lock released: a direct write lasts until the disk has the bytes, and a reader's
    /// store must not wait behind the prefetch's.
    pub fn store(&self, offset: u64, bytes: &[u8], around: bool) {
        let units = self.whole_units(offset, bytes.len() as u64);
        if units.clone().all(|u| self.has_unit(u)) {
            return;
        }
        let (runs, span, claimed) = {
            let mut w = self.writing.lock().unwrap_or_else(|p| p.into_inner());
            // Neither held nor being written by another store.
            let runs = runs_where(units, |u| {
                !self.has_unit(u) && !w.iter().any(|r| r.contains(&u))
            });
            let span = match (runs.first(), runs.last()) {
                (Some(a), Some(b)) => a.start..b.end,
                // Other stores of the same bytes got here first.
                _ => return,
            };
            let new = runs.iter().map(|r| r.end - r.start).sum::<u64>() * UNIT;
            let take = |c: &Cache| {
                c.budget
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(new))
                    .is_ok()
            };
            // The other stores' spans (what they write, and held units between).
            let pending = w.iter().map(|r| r.end - r.start).sum::<u64>() * UNIT;
            if self.full() || !(take(self) || self.make_room(new, pending) && take(self)) {
                if !self.full_said.swap(true, Ordering::Relaxed) {
                    eprintln!("cache {}: size limit reached, caching no more", self.name);
                }
                return;
            }
            w.push(span.clone());
            (runs, span, new)
        };
        // Data first, then the record: a crash in between leaves bytes unrecorded.
        let written: Vec<_> = runs
            .iter()
            .filter_map(|run| {
                let from = (run.start * UNIT - offset) as usize;
                let to = ((run.end * UNIT).min(self.len) - offset) as usize;
                let buffered = self.write_data(&bytes[from..to], run.start * UNIT, around);
                Some((run.clone(), buffered.ok()?))
            })
            .collect();
        let mut w = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = w.iter().position(|r| *r == span) {
            w.swap_remove(i);
        }
        let kept = written.iter().map(|(r, _)| r.end - r.start).sum::<u64>() * UNIT;
        // What could not be written is not held: its room goes back.
        self.budget.fetch_add(claimed - kept, Ordering::Relaxed);
        if kept > 0 {
            let held = self.held.fetch_add(kept, Ordering::Relaxed) + kept;
            let whole = self.len.div_ceil(UNIT) * UNIT;
            if held - kept < whole && held >= whole {
                // Complete: the file is now the image, and `cache ls` will say so. The
                // record's last bits go to disk after the data, so no power cut can leave
                // "complete" over bytes that never reached the disk.
                let _ = self.data.sync_data();
                self.flushes.fetch_add(1, Ordering::Relaxed);
            }
            for u in written.iter().flat_map(|(r, _)| r.clone()) {
                self.units[(u / 64) as usize].fetch_or(1 << (u % 64), Ordering::Relaxed);
            }
            for (r, _) in &written {
                self.write_record(r.clone());
            }
        }
        drop(w);
        for (at, n) in written.iter().filter_map(|(_, b)| *b) {
            if n >= WRITEBACK_NOW as u64 {
                // Written out now, not all at once when a prefetch's last store syncs the
                // file: its bytes reach the disk as it fetches, and dirty pages do not pile
                // up to the gigabytes of a whole image.
                host::writeback::start(&self.data, at, n);
            }
        }
    }

    /// Writes `bytes` at `at` (a unit's start): with `O_DIRECT` when `around` and the
    /// buffer is aligned, its whole units at least; returns the part written through the
    /// page cache, if any, as (offset, length). A direct write that fails leaves the bytes
    /// to the page cache, and one the filesystem refuses (`EINVAL`) ends direct writes.
    fn write_data(&self, bytes: &[u8], at: u64, around: bool) -> io::Result<Option<(u64, u64)>> {
        let whole = bytes.len() / DIRECT_ALIGN * DIRECT_ALIGN;
        let aligned = (bytes.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN);
        let mut done = 0;
        if let Some(d) = &self.direct {
            if around && aligned && whole > 0 && !self.direct_refused.load(Ordering::Relaxed) {
                match d.write_all_at(&bytes[..whole], at) {
                    Ok(()) => done = whole,
                    Err(e) => {
                        if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) {
                            self.direct_refused.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        let rest = &bytes[done..];
        if rest.is_empty() {
            return Ok(None);
        }
        let at = at + done as u64;
        self.data.write_all_at(rest, at)?;
        Ok(Some((at, rest.len() as u64)))
    }

    /// Prunes other unused entries, least recently used first, so this one can grow by
    /// `need` bytes (at least [`ROOM_STEP`], so pruning is rare); resets the budget to
    /// what the directory then allows, `pending` bytes being written counted as held.
    /// The caller holds `writing`.
    fn make_room(&self, need: u64, pending: u64) -> bool {
        let on_file = self.data.metadata().map_or(self.len, |m| on_disk(&m));
        let mine = on_file.saturating_add(pending);
        let want = need.max(ROOM_STEP).min(self.len);
        let keep = self.limit.saturating_sub(mine + want);
        let Ok(left) = prune_dir(&self.dir.0, &self.dir.1, keep, Some(&self.stem)) else {
            return false;
        };
        let others: u64 = left.iter().map(|e| e.disk_bytes).sum();
        let budget = self.limit.saturating_sub(others + mine);
        self.budget.store(budget, Ordering::Relaxed);
        budget >= need
    }

    /// Drops the units `[offset, offset + len)` touches: they failed their check.
    pub fn forget(&self, offset: u64, len: u64) {
        let last = (offset + len.max(1) - 1) / UNIT;
        let _w = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        for u in offset / UNIT..=last.min(self.len.div_ceil(UNIT) - 1) {
            let old = self.units[(u / 64) as usize].fetch_and(!(1 << (u % 64)), Ordering::Relaxed);
            if old & (1 << (u % 64)) != 0 {
                self.held.fetch_sub(UNIT, Ordering::Relaxed);
            }
        }
        self.write_record(offset / UNIT..last + 1);
    }

    /// Writes the record's words that hold `units` (the caller holds `writing`).
    fn write_record(&self, units: std::ops::Range<u64>) {
        if units.is_empty() {
            return;
        }
        let w0 = units.start / 64;
        let w1 = ((units.end - 1) / 64).min(self.units.len() as u64 - 1);
        let raw: Vec<u8> = (w0..=w1)
            .flat_map(|w| self.units[w as usize].load(Ordering::Relaxed).to_le_bytes())
            .collect();
        // A record that cannot be written only costs fetches later.
        let _ = self.record.write_all_at(&raw, HEADER + w0 * 8);
    }

    /// Whether the size limit has refused bytes: the cache takes no more.
    pub fn full(&self) -> bool {
        self.full_said.load(Ordering::Relaxed)
    }

    /// Whether the whole image fits under the directory's size limit: what a store
    /// needs beyond the budget is then made by pruning other entries, unless other mounts
    /// use them.
    pub fn fits_whole(&self) -> bool {
        self.len <= self.limit
    }

    /// Bytes of the image held (verified) in the cache.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed).min(self.len)
    }
}

fn now() -> rfs::Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfs::Timespec {
        tv_sec: d.as_secs() as i64,
        tv_nsec: d.subsec_nanos() as _,
    }
}

/// Opens (making it) a record and takes a shared lock on it, reopening if `prune`
/// removed the file while we waited.
fn lock_shared(dir: &OwnedFd, name: &str) -> io::Result<File> {
    loop {
        let f = open_file(dir, name, true)?;
        rfs::flock(&f, FlockOperation::LockShared)?;
        let ours = rfs::fstat(&f)?;
        match rfs::statat(dir, name, rfs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_ino == ours.st_ino && st.st_dev == ours.st_dev => return Ok(f),
            Ok(_) | Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Every entry in `dir`, oldest use first.
pub fn list(dir: &Path) -> io::Result<Vec<Entry>> {
    let dfd = open_dir_making(dir, false)?;
    entries(&dfd, dir)
}

fn entries(dfd: &OwnedFd, dir: &Path) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".map")) else {
            continue;
        };
        let Some((alg, hex)) = stem.split_once('-') else {
            continue;
        };
        let digest = format!("{alg}:{hex}");
        if self::stem(&digest).ok().as_deref() != Some(stem) {
            continue;
        }
        let Ok(record) = open_file(dfd, &format!("{stem}.map"), false) else {
            continue;
        };
        let in_use = rfs::flock(&record, FlockOperation::NonBlockingLockExclusive).is_err();
        let _ = rfs::flock(&record, FlockOperation::Unlock);
        let mut h = [0u8; 16];
        let len = match record.read_exact_at(&mut h, 0) {
            Ok(()) if h[..8] == MAGIC => u64::from_le_bytes(h[8..16].try_into().expect("8")),
            _ => 0,
        };
        let bits = load_record(&record, &digest, len)?.unwrap_or_default();
        let cached = held_bytes(&bits).min(len);
        let img = dir.join(format!("{stem}.img"));
        let disk = std::fs::symlink_metadata(&img).map_or(0, |m| on_disk(&m));
        let last_used = std::os::unix::fs::MetadataExt::mtime(&record.metadata()?);
        out.push(Entry {
            digest,
            path: img,
            image_bytes: len,
            cached_bytes: cached,
            disk_bytes: disk,
            complete: len > 0 && cached == len,
            in_use,
            last_used,
        });
    }
    out.sort_by_key(|e| (e.last_used, e.digest.clone()));
    Ok(out)
}

/// Removes entries not in use, least recently used first, until the rest take at most
/// `keep` bytes on disk; returns what is left. `spare`: a stem never removed.
fn prune_dir(dfd: &OwnedFd, dir: &Path, keep: u64, spare: Option<&str>) -> io::Result<Vec<Entry>> {
    let mut left = Vec::new();
    let all = entries(dfd, dir)?;
    let mut total: u64 = all.iter().map(|e| e.disk_bytes).sum();
    for e in all {
        let stem = stem(&e.digest)?;
        if total > keep && Some(stem.as_str()) != spare && !e.in_use && remove(dfd, &stem) {
            total -= e.disk_bytes;
            continue;
        }
        if Some(stem.as_str()) != spare {
            left.push(e);
        }
    }
    Ok(left)
}

/// Removes an entry if no mount holds it (its record locked exclusively meanwhile).
fn remove(dfd: &OwnedFd, stem: &str) -> bool {
    let Ok(record) = open_file(dfd, &format!("{stem}.map"), false) else {
        return false;
    };
    if rfs::flock(&record, FlockOperation::NonBlockingLockExclusive).is_err() {
        return false;
    }
    let _ = rfs::unlinkat(dfd, format!("{stem}.img"), rfs::AtFlags::empty());
    rfs::unlinkat(dfd, format!("{stem}.map"), rfs::AtFlags::empty()).is_ok()
}

/// `verilay cache prune`: removes entries not in use, oldest use first, until the rest
/// take at most `keep` bytes (0: every entry not in use); returns the removed ones.
pub fn prune(dir: &Path, keep: u64) -> io::Result<Vec<Entry>> {
    let dfd = open_dir_making(dir, false)?;
    let before = entries(&dfd, dir)?;
    let left: Vec<String> = prune_dir(&dfd, dir, keep, None)?
        .into_iter()
        .map(|e| e.digest)
        .collect();
    Ok(before
        .into_iter()
        .filter(|e| !left.contains(&e.digest))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_claiming_a_huge_image_is_listed_not_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let digest = format!("sha256:{}", "ab".repeat(32));
        let len = 1u64 << 56;
        let name = format!("{}.map", stem(&digest).unwrap());
        let record = File::create(dir.path().join(name)).unwrap();
        record.write_all_at(&header(&digest, len), 0).unwrap();
        // Sparse: the length its header asks for (2 TiB).
        record.set_len(HEADER + words_for(len) * 8).unwrap();
        let entries = list(dir.path()).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].cached_bytes, 0);
        assert!(!entries[0].complete);
        // A mount's opening (which lists the entries, to prune) is not stopped either.
        let other = format!("sha256:{}", "cd".repeat(32));
        Cache::open(dir.path(), &other, 1 << 20, 1 << 30).unwrap();
    }

    /// Stores racing over the same units, around the page cache and through it, from
    /// aligned buffers and not: every unit is written and counted once, the entry ends
    /// complete and flushed once, and the file is the image.
    #[test]
    fn racing_stores_around_the_page_cache_keep_every_unit_once() {
        let len = (8 << 20) + 100;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let n = len as usize;
        let (mut a, mut u) = (Vec::new(), Vec::new());
        let aligned = verity::source::aligned_for(&mut a, n, 0);
        aligned.copy_from_slice(&bytes);
        let unaligned = verity::source::aligned_for(&mut u, n, 1);
        unaligned.copy_from_slice(&bytes);
        let (aligned, unaligned) = (&*aligned, &*unaligned);
        for round in 0..8 {
            let dir = tempfile::tempdir().unwrap();
            let digest = format!("sha256:{}", "34".repeat(32));
            let cache = Cache::open(dir.path(), &digest, len, 1 << 30).unwrap();
            let start = std::sync::Barrier::new(6);
            std::thread::scope(|s| {
                for k in 0..6usize {
                    let (cache, start) = (&cache, &start);
                    s.spawn(move || {
                        // Each from its own start to the end: the first covers every unit.
                        let from = k * (256 << 10) + k * 100;
                        let src = if k % 2 == 0 { aligned } else { unaligned };
                        start.wait();
                        cache.store(from as u64, &src[from..], k < 4);
                    });
                }
            });
            let whole = len.div_ceil(UNIT) * UNIT;
            assert_eq!(cache.held.load(Ordering::Relaxed), whole, "round {round}");
            assert_eq!(cache.flushes.load(Ordering::Relaxed), 1, "round {round}");
            assert!(cache.writing.lock().unwrap().is_empty());
            let file = dir.path().join(format!("{}.img", stem(&digest).unwrap()));
            assert!(
                std::fs::read(file).unwrap() == bytes,
                "round {round}: the entry differs"
            );
            assert!(list(dir.path()).unwrap()[0].complete, "round {round}");
        }
    }

    /// A record with every bit past the image's last unit set: they count for nothing,
    /// so the entry is neither complete nor flushed before its last unit is stored.
    #[test]
    fn bits_past_the_last_unit_count_for_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let digest = format!("sha256:{}", "56".repeat(32));
        // 257 units: the record's fifth word holds one.
        let len = (1 << 20) + 100;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
        drop(Cache::open(dir.path(), &digest, len, 1 << 30).unwrap());
        let record = dir.path().join(format!("{}.map", stem(&digest).unwrap()));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&record)
            .unwrap();
        f.write_all_at(&(!1u64).to_le_bytes(), HEADER + 4 * 8)
            .unwrap();
        let cache = Cache::open(dir.path(), &digest, len, 1 << 30).unwrap();
        assert_eq!(cache.held(), 0);
        assert_eq!(list(dir.path()).unwrap()[0].cached_bytes, 0);
        cache.store(0, &bytes[..1 << 20], false);
        assert_eq!(
            cache.flushes.load(Ordering::Relaxed),
            0,
            "flushed before complete"
        );
        assert!(!list(dir.path()).unwrap()[0].complete);
        cache.store(1 << 20, &bytes[1 << 20..], false);
        assert_eq!(cache.flushes.load(Ordering::Relaxed), 1);
        assert!(list(dir.path()).unwrap()[0].complete);
    }

    #[test]
    fn an_entry_stored_to_its_end_is_recorded_complete_and_again_after_a_unit_failed() {
        let dir = tempfile::tempdir().unwrap();
        let digest = format!("sha256:{}", "12".repeat(32));
        // Not a multiple of the unit, as every image (its trailer ends it).
        let len = (1 << 20) + 100;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let cache = Cache::open(dir.path(), &digest, len, 1 << 30).unwrap();
        cache.store(0, &bytes[..1 << 19], false);
        assert!(!list(dir.path()).unwrap()[0].complete);
        cache.store(1 << 19, &bytes[1 << 19..], false);
        cache.store(1 << 19, &bytes[1 << 19..], false);
        assert_eq!(cache.held(), len);
        assert!(list(dir.path()).unwrap()[0].complete);
        assert_eq!(
            cache.flushes.load(Ordering::Relaxed),
            1,
            "flushed once, as it completed"
        );
        drop(cache);

        let again = Cache::open(dir.path(), &digest, len, 1 << 30).unwrap();
        assert!(again.has(0, len));
        let mut back = vec![0; len as usize];
        again.read(&mut back, 0).unwrap();
        assert!(back == bytes);
        // A unit fails its check and is fetched again: the entry is complete once more.
        again.forget(8192, 4096);
        assert!(!list(dir.path()).unwrap()[0].complete);
        again.store(8192, &bytes[8192..12288], false);
        assert_eq!(again.held(), len);
        assert!(list(dir.path()).unwrap()[0].complete);
        assert_eq!(
            again.flushes.load(Ordering::Relaxed),
            1,
            "complete again: flushed before it says so"
        );
    }

    #[test]
    fn a_record_that_is_no_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let digest = format!("sha256:{}", "ef".repeat(32));
        let map = dir.path().join(format!("{}.map", stem(&digest).unwrap()));
        let plant: [&dyn Fn(); 2] = [&|| std::fs::create_dir(&map).unwrap(), &|| {
            std::os::unix::fs::symlink("/etc/passwd", &map).unwrap()
        }];
        for plant in plant {
            plant();
            let e = Cache::open(dir.path(), &digest, 1 << 20, 1 << 30)
                .err()
                .unwrap();
            assert!(e.to_string().contains(&*map.to_string_lossy()), "{e}");
            let _ = std::fs::remove_dir(&map).or_else(|_| std::fs::remove_file(&map));
        }
    }
}
