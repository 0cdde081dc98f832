//! A mount's claim on its upper and work directories, checked as overlayfs checks them and
//! locked while it lives (docs/SECURITY.md section 6).
//!
//! - Directories are compared by device and inode, never by name.
//! - Locks are `flock`s (they go with a killed daemon): exclusive on both and
//!   `WORK/verilay.lock`, shared on every directory above, so mounts never nest.
//! - Kernel overlayfs takes none of these locks.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, StatxFlags};
use std::collections::HashSet;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LOCK_FILE: &str = "verilay.lock";

/// How long a new mount waits for a holder whose mount is already gone (its daemon is
/// exiting) to let go, before it refuses.
const EXITING_HOLDER_WAIT: Duration = Duration::from_secs(5);

/// The upper and work directories, open, checked and locked.
pub struct Claim {
    pub(crate) upper: OwnedFd,
    pub(crate) work: OwnedFd,
    record: std::fs::File,
    pub(crate) work_path: PathBuf,
    ids: [Id; 2],
    /// The shared locks on the directories above both.
    _around: Vec<OwnedFd>,
}

/// (device, inode).
type Id = (u64, u64);

/// Where a directory is: its ancestry by (device, inode), and its path in its filesystem.
struct Place {
    ancestry: Vec<Id>,
    fs_path: Option<(u64, PathBuf)>,
}

/// One of the claimed directories, for the checks and their messages.
struct Claimed<'a> {
    what: &'static str,
    path: &'a Path,
    fd: BorrowedFd<'a>,
}

fn fail(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn busy(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::ResourceBusy, msg)
}

fn id(fd: BorrowedFd<'_>) -> io::Result<Id> {
    let st = rfs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

pub(crate) fn mount_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let st = rfs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)?;
    Ok(st.stx_mnt_id)
}

/// Opens the upper or work directory, which must be the mounting user's own: another
/// owner could change it under the mount (swap a name for a link between a check and a
/// use), and a root mount would then act on that owner's behalf.
fn open_dir(what: &str, path: &Path) -> io::Result<OwnedFd> {
    let fd = rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
    })?;
    let owner = rfs::fstat(&fd)?.st_uid;
    let euid = rustix::process::geteuid().as_raw();
    if owner != euid {
        return Err(fail(format!(
            "{what} {} is owned by uid {owner}, not by the mounting user (uid {euid}): refused (its owner could change it under the mount)",
            path.display()
        )));
    }
    Ok(fd)
}

/// The directory and every directory above it, up to the root, as the kernel walks `..`
/// (crossing mounts).
fn ancestry(dir: BorrowedFd<'_>) -> io::Result<Vec<Id>> {
    let mut ids = vec![id(dir)?];
    let mut cur = rfs::openat(
        dir,
        "..",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // Bounded: PATH_MAX allows at most 2048 levels.
    for _ in 0..4096 {
        let i = id(cur.as_fd())?;
        if ids.last() == Some(&i) {
            break;
        }
        ids.push(i);
        cur = rfs::openat(
            &cur,
            "..",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
    }
    Ok(ids)
}

/// Where `fd` is in its filesystem: its device and its path from the filesystem's root
/// (the mount's root from /proc/self/mountinfo, then the path inside the mount). This sees
/// through bind mounts, which the `..` walk cannot (`..` of a mount's root leaves it).
fn fs_path(fd: BorrowedFd<'_>) -> Option<(u64, PathBuf)> {
    use std::os::fd::AsRawFd;
    let (dev, _) = id(fd).ok()?;
    let mnt = mount_id(fd).ok()?;
    let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    if !path.is_absolute() || path.as_os_str().as_bytes().ends_with(b" (deleted)") {
        return None;
    }
    let table = host::mountinfo::table(None).ok()?;
    let mount = table.iter().find(|m| m.id == mnt)?;
    let inside = path.strip_prefix(&mount.point).ok()?;
    Some((dev, mount.root.join(inside)))
}

/// Whether `inner` is `outer` or below it.
fn is_within(inner: &Place, outer: &Place) -> bool {
    let by_path = match (&inner.fs_path, &outer.fs_path) {
        (Some((di, pi)), Some((d, p))) => di == d && pi.starts_with(p),
        _ => false,
    };
    inner.ancestry.contains(&outer.ancestry[0]) || by_path
}

fn place(fd: BorrowedFd<'_>) -> io::Result<Place> {
    Ok(Place {
        ancestry: ancestry(fd)?,
        fs_path: fs_path(fd),
    })
}

impl Claim {
    /// Opens and checks `upper` and `work` for a mount on `mountpoint`, and locks them.
    /// `outside` are the other paths the mount uses (images, its log file, its
    /// measurement list), which must not be in either directory. A holder whose mount is
    /// gone but whose daemon has not exited yet is waited for (a few seconds); a live one
    /// is named in the refusal.
    pub fn take(
        upper: &Path,
        work: &Path,
        mountpoint: &Path,
        outside: &[(&str, &Path)],
    ) -> io::Result<Claim> {
        let upper_fd = open_dir("upper directory", upper)?;
        let work_fd = open_dir("work directory", work)?;
        let dirs = [
            Claimed {
                what: "upper directory",
                path: upper,
                fd: upper_fd.as_fd(),
            },
            Claimed {
                what: "work directory",
                path: work,
                fd: work_fd.as_fd(),
            },
        ];
        let ids = check_apart(&dirs)?;
        check_outside(&dirs, "mountpoint", mountpoint)?;
        for (what, path) in outside {
            check_outside(&dirs, what, path)?;
        }
        in_use_by_overlayfs(&[
            ("upper directory", upper, ancestry(upper_fd.as_fd())?),
            ("work directory", work, ancestry(work_fd.as_fd())?),
        ])?;
        // All locks first: nothing in the work directory is looked at or made before
        // it, and everything around it, is ours.
        lock_dir(&dirs[1])?;
        lock_dir(&dirs[0])?;
        let around = lock_around(&dirs)?;
        check_work_contents(&dirs[1])?;
        let record = lock_work(work_fd.as_fd(), work)?;
        let mut claim = Claim {
            record,
            work_path: work.to_path_buf(),
            ids,
            _around: around,
            upper: upper_fd,
            work: work_fd,
        };
        claim.write_record(mountpoint, None)?;
        Ok(claim)
    }

    /// Records that the mount now exists, as device `dev` (`st_dev` of its root).
    pub fn mounted(&mut self, mountpoint: &Path, dev: u64) -> io::Result<()> {
        self.write_record(mountpoint, Some(dev))
    }

    fn write_record(&mut self, mountpoint: &Path, dev: Option<u64>) -> io::Result<()> {
        let mut text = format!(
            "pid {}\nmountpoint {}\n",
            std::process::id(),
            mountpoint
                .canonicalize()
                .unwrap_or_else(|_| mountpoint.to_path_buf())
                .display()
        );
        if let Some(dev) = dev {
            text += &format!("device {}:{}\n", rfs::major(dev), rfs::minor(dev));
        }
        host::lockfile::write_record(&self.record, &text)
    }

    /// (device, inode) of the upper and the work directory.
    pub fn ids(&self) -> [(u64, u64); 2] {
        self.ids
    }
}

/// Refuses what kernel overlayfs refuses: upper and work on different filesystems or
/// mounts, the same directory, or one inside the other. Returns their ids.
fn check_apart(dirs: &[Claimed<'_>; 2]) -> io::Result<[Id; 2]> {
    let (u, w) = (dirs[0].path.display(), dirs[1].path.display());
    let (ud, wd) = (id(dirs[0].fd)?, id(dirs[1].fd)?);
    if ud.0 != wd.0 {
        return Err(fail(format!(
            "work directory {w} is on another filesystem than upper directory {u} \
             (copy-up renames from one to the other)"
        )));
    }
    if mount_id(dirs[0].fd)? != mount_id(dirs[1].fd)? {
        return Err(fail(format!(
            "work directory {w} and upper directory {u} are on different mounts \
             (copy-up renames from one to the other, and rename does not cross mounts)"
        )));
    }
    if ud == wd {
        return Err(fail(format!(
            "upper directory {u} and work directory {w} are the same directory"
        )));
    }
    let up = place(dirs[0].fd)?;
    let wp = place(dirs[1].fd)?;
    if is_within(&wp, &up) {
        return Err(fail(format!(
            "work directory {w} is inside upper directory {u}"
        )));
    }
    if is_within(&up, &wp) {
        return Err(fail(format!(
            "upper directory {u} is inside work directory {w}"
        )));
    }
    Ok([ud, wd])
}

/// Refuses `path` (a mountpoint, an image, a log file, a measurement list) inside the
/// upper or the work directory. A path that does not exist yet is where its nearest
/// existing parent is.
fn check_outside(dirs: &[Claimed<'_>; 2], what: &str, path: &Path) -> io::Result<()> {
    let canon = existing_part(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display())))?;
    let dir = if canon.is_dir() {
        canon.as_path()
    } else {
        canon.parent().unwrap_or(Path::new("/"))
    };
    let fd = rfs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let at = place(fd.as_fd())?;
    let mut own = id(fd.as_fd())?;
    if dir != canon {
        own = rfs::stat(&canon)
            .map(|s| (s.st_dev, s.st_ino))
            .unwrap_or(own);
    }
    for d in dirs {
        let theirs = place(d.fd)?;
        if own == theirs.ancestry[0] || is_within(&at, &theirs) {
            return Err(fail(format!(
                "{what} {} is inside {} {}",
                path.display(),
                d.what,
                d.path.display()
            )));
        }
    }
    Ok(())
}

/// `path` resolved, or its nearest parent that exists. The part that does not exist yet
/// may not go up (`..`): it would be resolved only once made, perhaps into the upper
/// directory.
fn existing_part(path: &Path) -> io::Result<PathBuf> {
    let mut p = path;
    loop {
        match std::fs::canonicalize(p) {
            Ok(c) => return Ok(c),
            Err(e) if e.kind() == io::ErrorKind::NotFound && p != Path::new(".") => {
                if p.file_name().is_none() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "`..` after a directory that does not exist",
                    ));
                }
                p = match p.parent() {
                    Some(q) if !q.as_os_str().is_empty() => q,
                    _ => Path::new("."),
                };
            }
            Err(e) => return Err(e),
        }
    }
}

/// What a work directory may hold: what verilay made (`verilay.lock`, and `verilay/`,
/// which every mount empties) and what kernel overlayfs makes (`work/`, `index/`), so a
/// directory given as `--work` by mistake loses nothing. `verilay/` counts as verilay's
/// when it is empty or has `verilay.lock` beside it.
fn check_work_contents(work: &Claimed<'_>) -> io::Result<()> {
    let refuse = |name: &str, why: &str| {
        fail(format!(
            "work directory {} holds {name}, which verilay did not make{why}: give an \
             empty directory (or one only verilay or kernel overlayfs used)",
            work.path.display()
        ))
    };
    let (mut lock_file, mut own_dir_used) = (false, false);
    for entry in rfs::Dir::read_from(work.fd)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let st = rfs::statat(work.fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        match name.to_bytes() {
            b"verilay.lock" if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                lock_file = true
            }
            b"verilay" if is_dir => own_dir_used = !is_empty_dir(work.fd, name)?,
            b"work" | b"index" if is_dir => {}
            other => return Err(refuse(&String::from_utf8_lossy(other), "")),
        }
    }
    if own_dir_used && !lock_file {
        return Err(refuse(
            "verilay/",
            " (it is not empty and has no verilay.lock beside it; every mount empties it)",
        ));
    }
    Ok(())
}

fn is_empty_dir(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> io::Result<bool> {
    let fd = crate::open_subdir(dir, name)?;
    for entry in rfs::Dir::read_from(&fd)? {
        let n = entry?.file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What a lock file says of its holder.
#[derive(Debug, Default)]
struct Record {
    pid: Option<u32>,
    mountpoint: Option<String>,
    device: Option<String>,
}

impl Record {
    fn parse(text: &str) -> Record {
        let mut r = Record::default();
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("pid", v)) => r.pid = v.parse().ok(),
                Some(("mountpoint", v)) => r.mountpoint = Some(v.to_string()),
                Some(("device", v)) => r.device = Some(v.to_string()),
                _ => {}
            }
        }
        r
    }

    fn describe(&self) -> String {
        match (&self.mountpoint, self.pid) {
            (Some(m), Some(p)) => format!("the verilay mount on {m} (process {p})"),
            (None, Some(p)) => format!("process {p}"),
            _ => "another process (not visible from here)".into(),
        }
    }

    /// Whether the holder's mount still exists, in the holder's own mount table. A holder
    /// that has not mounted yet counts as serving (it is a mount being made).
    fn serving(&self) -> bool {
        let (Some(pid), Some(mp)) = (self.pid, &self.mountpoint) else {
            return true;
        };
        let Some(dev) = &self.device else {
            return rfs::access(format!("/proc/{pid}"), rfs::Access::EXISTS).is_ok();
        };
        let Ok(table) = host::mountinfo::table(Some(pid)) else {
            return false;
        };
        table
            .iter()
            .any(|m| m.dev == *dev && m.point == Path::new(mp))
    }
}

/// Who holds a lock we could not take.
struct Holder {
    record: Record,
    /// Its lock is shared: the directory holds one of its directories.
    shared: bool,
    /// Its mount is gone, but it did not let go within [`EXITING_HOLDER_WAIT`].
    exiting: bool,
}

impl Holder {
    fn describe(&self) -> String {
        let mut d = self.record.describe();
        if self.exiting {
            d += ", unmounted but still busy";
        }
        d
    }

    /// A verilay mount of root's or of our own user's: one whose directories ours must
    /// stay out of. Another ordinary user's mount can do nothing there its user could not
    /// do anyway, and must not keep everyone else's mounts out (by holding `/`).
    fn binds_us(&self) -> bool {
        let me = rustix::process::geteuid().as_raw();
        self.record.mountpoint.is_some()
            && self
                .record
                .pid
                .and_then(euid_of)
                .is_some_and(|uid| uid == 0 || uid == me)
    }
}

/// Why a lock was not taken.
enum NotLocked {
    Held(Holder),
    Failed(rustix::io::Errno),
}

/// Takes `WORK/verilay.lock`, waiting only for a holder that is exiting.
fn lock_work(work: BorrowedFd<'_>, path: &Path) -> io::Result<std::fs::File> {
    let fd = rfs::openat(
        work,
        LOCK_FILE,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("work directory {}: {LOCK_FILE}: {e}", path.display()),
        )
    })?;
    let st = rfs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(fail(format!(
            "work directory {}: {LOCK_FILE} is not a regular file",
            path.display()
        )));
    }
    // The record is rewritten in place: a second name for the file could be any file
    // (one its planter could not write), and another owner's could change under us.
    let euid = rustix::process::geteuid().as_raw();
    if st.st_nlink != 1 || st.st_uid != euid {
        return Err(fail(format!(
            "work directory {}: {LOCK_FILE} has {} links and owner uid {} (one link and uid {euid} expected): refused",
            path.display(),
            st.st_nlink,
            st.st_uid
        )));
    }
    let file = std::fs::File::from(fd);
    let read_record = || {
        let text = host::lockfile::read_record(&file, RECORD_MAX).unwrap_or_default();
        Holder {
            record: Record::parse(&String::from_utf8_lossy(&text)),
            shared: false,
            exiting: false,
        }
    };
    match lock_or_wait(file.as_fd(), true, read_record) {
        Ok(()) => Ok(file),
        Err(NotLocked::Held(h)) => Err(busy(format!(
            "work directory {} is in use by {}",
            path.display(),
            h.describe()
        ))),
        Err(NotLocked::Failed(e)) => Err(busy(format!(
            "work directory {}: {LOCK_FILE}: cannot be locked ({e})",
            path.display()
        ))),
    }
}

/// Takes the exclusive lock on a claimed directory itself.
fn lock_dir(d: &Claimed<'_>) -> io::Result<()> {
    let (dev, ino) = id(d.fd)?;
    let path = d.path.display();
    match lock_or_wait(d.fd, true, || holder_of(dev, ino)) {
        Ok(()) => Ok(()),
        Err(NotLocked::Held(h)) if h.shared => Err(busy(format!(
            "{} {path} holds a directory {} uses",
            d.what,
            h.describe()
        ))),
        Err(NotLocked::Held(h)) => Err(busy(format!(
            "{} {path} is in use by {}",
            d.what,
            h.describe()
        ))),
        Err(NotLocked::Failed(e)) => {
            Err(busy(format!("{} {path}: cannot be locked ({e})", d.what)))
        }
    }
}

/// Takes a shared lock on every directory above the claimed ones (each once), refusing
/// when one is a directory another verilay mount (root's, or our user's) holds. A
/// directory we may not read (so cannot lock) is passed over, as is one locked by any
/// other process (not verilay, another user's, or one we cannot see).
fn lock_around(dirs: &[Claimed<'_>; 2]) -> io::Result<Vec<OwnedFd>> {
    let mut held = Vec::new();
    let mut seen = HashSet::new();
    let up = |fd: BorrowedFd<'_>| {
        rfs::openat(
            fd,
            "..",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    for d in dirs {
        let mut cur = up(d.fd)?;
        // Bounded: PATH_MAX allows at most 2048 levels.
        for _ in 0..4096 {
            let i = id(cur.as_fd())?;
            if seen.insert(i) {
                held.extend(lock_above(d, cur.as_fd(), i)?);
            }
            let next = up(cur.as_fd())?;
            if id(next.as_fd())? == i {
                break;
            }
            cur = next;
        }
    }
    Ok(held)
}

/// The shared lock on `above` (an `O_PATH` descriptor of a directory above `d`), or why
/// `d` cannot be claimed.
fn lock_above(
    d: &Claimed<'_>,
    above: BorrowedFd<'_>,
    (dev, ino): Id,
) -> io::Result<Option<OwnedFd>> {
    let Ok(fd) = rfs::open(
        crate::fd_path(above).as_c_str(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Ok(None);
    };
    match lock_or_wait(fd.as_fd(), false, || holder_of(dev, ino)) {
        Ok(()) => Ok(Some(fd)),
        Err(NotLocked::Held(h)) if h.binds_us() => {
            let link = crate::fd_path(fd.as_fd());
            let shown = std::fs::read_link(std::ffi::OsStr::from_bytes(link.as_bytes()))
                .unwrap_or_default();
            Err(busy(format!(
                "{} {} is inside {}, which is in use by {}",
                d.what,
                d.path.display(),
                shown.display(),
                h.describe()
            )))
        }
        Err(_) => Ok(None),
    }
}

/// Takes the `flock` on `fd` (`exclusive`, else shared); while another holds it and that
/// holder's mount is gone, retries until [`EXITING_HOLDER_WAIT`] passes.
fn lock_or_wait(
    fd: BorrowedFd<'_>,
    exclusive: bool,
    holder: impl Fn() -> Holder,
) -> Result<(), NotLocked> {
    let deadline = Instant::now() + EXITING_HOLDER_WAIT;
    let mut last = None;
    let taken = host::lockfile::lock(fd, host::lockfile::Kind::Flock, exclusive, || {
        let h = last.insert(holder());
        if h.record.serving() {
            return false;
        }
        h.exiting = Instant::now() >= deadline;
        !h.exiting
    });
    match (taken, last) {
        (Ok(true), _) => Ok(()),
        (Ok(false), Some(h)) => Err(NotLocked::Held(h)),
        (Ok(false), None) => Err(NotLocked::Failed(rustix::io::Errno::WOULDBLOCK)),
        (Err(e), _) => Err(NotLocked::Failed(
            rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
        )),
    }
}

/// The holder of the flock on (dev, ino), and its record (the lock file it holds open);
/// a verilay mount is preferred when several processes hold it.
fn holder_of(dev: u64, ino: u64) -> Holder {
    let holders = host::lockfile::flock_holders(dev, ino);
    let mut first = None;
    for &(pid, shared) in &holders {
        let record = record_of(pid);
        let h = Holder {
            record,
            shared,
            exiting: false,
        };
        if h.record.mountpoint.is_some() {
            return h;
        }
        first.get_or_insert(h);
    }
    first.unwrap_or(Holder {
        record: Record::default(),
        shared: false,
        exiting: false,
    })
}

/// The effective uid of process `pid`.
fn euid_of(pid: u32) -> Option<u32> {
    Some(host::status::of(pid).ok()?.uid[1]).filter(|&u| u != u32::MAX)
}

/// What process `pid` records in the verilay lock file it holds, if it holds one: a
/// regular file named `verilay.lock` it has open and holds the exclusive flock of (as a
/// verilay mount holds its own), read up to [`RECORD_MAX`] bytes. Anything else (a file of
/// that name another user merely keeps open, a FIFO, a record naming another process) is
/// no record: the holder is then only its pid, so nobody can pose as another's mount.
fn record_of(pid: u32) -> Record {
    let own = || {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
        fds.flatten().find_map(|e| held_record(pid, &e.path()))
    };
    match own() {
        Some(r) if r.pid == Some(pid) => r,
        _ => Record {
            pid: Some(pid),
            ..Record::default()
        },
    }
}

/// The most of a lock file read: a record is three short lines.
const RECORD_MAX: u64 = 4096;

/// The record in `fd` (a `/proc/PID/fd/N` link), if it is a regular file named
/// `verilay.lock` whose exclusive flock `pid` holds.
fn held_record(pid: u32, fd: &Path) -> Option<Record> {
    let target = std::fs::read_link(fd).ok()?;
    if target.file_name() != Some(std::ffi::OsStr::new(LOCK_FILE)) {
        return None;
    }
    // Opened without blocking (a FIFO's open would wait for a writer) and checked to be
    // the regular file whose lock `pid` holds before a byte is read.
    let f = rfs::open(
        fd,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = rfs::fstat(&f).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
        || !host::lockfile::flock_holders(st.st_dev, st.st_ino).contains(&(pid, false))
    {
        return None;
    }
    let mut text = String::new();
    std::fs::File::from(f)
        .take(RECORD_MAX)
        .read_to_string(&mut text)
        .ok()?;
    Some(Record::parse(&text))
}

/// Every mount table this process can read: its own, then one per other mount namespace
/// of the processes it may inspect (all of them, as root), each with the directory its
/// absolute paths resolve from (`/proc/PID/root`).
fn mount_tables() -> Vec<(Vec<host::mountinfo::Mount>, PathBuf, Option<u32>)> {
    let mut tables = vec![(
        host::mountinfo::table(None).unwrap_or_default(),
        PathBuf::from("/"),
        None,
    )];
    let mut seen = HashSet::new();
    if let Ok(ns) = std::fs::read_link("/proc/self/ns/mnt") {
        seen.insert(ns);
    }
    let pids = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    for pid in pids {
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
            continue;
        };
        if !seen.insert(ns) {
            continue;
        }
        if let Ok(table) = host::mountinfo::table(Some(pid)) {
            tables.push((table, PathBuf::from(format!("/proc/{pid}/root")), Some(pid)));
        }
    }
    tables
}

/// Refuses a directory that is, is inside, or holds one a kernel overlayfs mount uses as
/// its upperdir or workdir, in any mount namespace this process can see: overlayfs shows
/// both in its mount options.
/// A path it shows relative (as given to mount) is resolved from here in our own
/// namespace only.
fn in_use_by_overlayfs(ours: &[(&str, &Path, Vec<Id>)]) -> io::Result<()> {
    for (table, root, pid) in mount_tables() {
        for mount in table.iter().filter(|m| m.fs_type == "overlay") {
            let point = &mount.point;
            for (key, value) in mount.options() {
                let (Some(key), Some(value)) = (key.to_str(), value) else {
                    continue;
                };
                if key != "upperdir" && key != "workdir" {
                    continue;
                }
                let resolved = match value.strip_prefix("/") {
                    Ok(rel) => root.join(rel),
                    Err(_) if pid.is_none() => value,
                    Err(_) => continue,
                };
                let Ok(theirs) = rfs::open(
                    &resolved,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                ) else {
                    continue;
                };
                let Ok(their_line) = ancestry(theirs.as_fd()) else {
                    continue;
                };
                // Ours is theirs, inside theirs, or holds theirs: each would have two
                // writers of one tree.
                for (what, path, our_line) in ours {
                    if our_line.contains(&their_line[0]) || their_line.contains(&our_line[0]) {
                        let whose = match pid {
                            Some(p) => format!(" (in the mount namespace of process {p})"),
                            None => String::new(),
                        };
                        let how = if our_line[0] == their_line[0] {
                            "is"
                        } else if our_line.contains(&their_line[0]) {
                            "is inside"
                        } else {
                            "holds"
                        };
                        return Err(busy(format!(
                            "{what} {} {how} the {key} of the overlayfs mount on {}{whose}",
                            path.display(),
                            point.display()
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}
