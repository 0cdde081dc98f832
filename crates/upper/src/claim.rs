//! A mount's claim on its upper and work directories: checked the way kernel overlayfs
//! checks them (`fs/overlayfs/super.c`: one mount, separate subtrees, not in use), and
//! locked for as long as the claim (or an `Upper` made from it) lives.
//!
//! Directories are compared by device and inode after the kernel resolved them (symlinks,
//! `..` and bind mounts cannot alias one into another), never by their names. Two locks:
//! `flock` on the upper directory itself (nothing is added to the merged tree), and on
//! `WORK/verilay.lock`, which records the holder (its pid, mountpoint and, once mounted,
//! the mount's device) so a refusal can name it. Both are `flock`s, held by the open file
//! description: a killed daemon's descriptors close and its locks go with them.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, FlockOperation, Mode, OFlags, StatxFlags};
use std::io::{self, Read, Seek, Write};
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
    upper_path: PathBuf,
    work_path: PathBuf,
    ids: [Id; 2],
}

/// (device, inode).
type Id = (u64, u64);

/// Where a directory is: its ancestry by (device, inode), and its path in its filesystem.
struct Place {
    ancestry: Vec<Id>,
    fs_path: Option<(u64, PathBuf)>,
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

fn mount_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let st = rfs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)?;
    Ok(st.stx_mnt_id)
}

fn open_dir(what: &str, path: &Path) -> io::Result<OwnedFd> {
    rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
    })
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
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let line = info
        .lines()
        .find(|l| l.split(' ').next() == Some(&mnt.to_string()))?;
    let f: Vec<&str> = line.split(' ').collect();
    let (root, point) = (unescape(f.get(3)?), unescape(f.get(4)?));
    let inside = path.strip_prefix(&point).ok()?;
    Some((dev, root.join(inside)))
}

/// mountinfo escapes space, tab, newline and backslash as octal.
pub fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let (b'\\', Some(d)) = (b[i], octal) {
            out.push(((d[0] - b'0') << 6) | ((d[1] - b'0') << 3) | (d[2] - b'0'));
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&out),
    ))
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
    /// A holder whose mount is gone but whose daemon has not exited yet is waited for (a
    /// few seconds); a live one is named in the refusal.
    pub fn take(upper: &Path, work: &Path, mountpoint: &Path) -> io::Result<Claim> {
        let upper_fd = open_dir("upper directory", upper)?;
        let work_fd = open_dir("work directory", work)?;
        let (u, w) = (upper.display(), work.display());
        let (ud, wd) = (id(upper_fd.as_fd())?, id(work_fd.as_fd())?);
        if ud.0 != wd.0 {
            return Err(fail(format!(
                "work directory {w} is on another filesystem than upper directory {u} \
                 (copy-up renames from one to the other)"
            )));
        }
        if mount_id(upper_fd.as_fd())? != mount_id(work_fd.as_fd())? {
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
        let up = place(upper_fd.as_fd())?;
        let wp = place(work_fd.as_fd())?;
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
        in_use_by_overlayfs(&[("upper directory", upper, ud), ("work directory", work, wd)])?;
        let mut claim = Claim {
            record: lock_work(work_fd.as_fd(), work)?,
            upper: upper_fd,
            work: work_fd,
            upper_path: upper.to_path_buf(),
            work_path: work.to_path_buf(),
            ids: [ud, wd],
        };
        lock_upper(claim.upper.as_fd(), upper)?;
        claim.check_outside("mountpoint", mountpoint)?;
        claim.write_record(mountpoint, None)?;
        Ok(claim)
    }

    /// Refuses `path` (a mountpoint, an image) inside the upper or the work directory.
    pub fn check_outside(&self, what: &str, path: &Path) -> io::Result<()> {
        let canon = std::fs::canonicalize(path)
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
        for (name, dir_path, fd) in [
            ("upper directory", &self.upper_path, &self.upper),
            ("work directory", &self.work_path, &self.work),
        ] {
            let theirs = place(fd.as_fd())?;
            if own == theirs.ancestry[0] || is_within(&at, &theirs) {
                return Err(fail(format!(
                    "{what} {} is inside {name} {}",
                    path.display(),
                    dir_path.display()
                )));
            }
        }
        Ok(())
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
        self.record.set_len(0)?;
        self.record.rewind()?;
        self.record.write_all(text.as_bytes())
    }

    /// (device, inode) of the upper and the work directory.
    pub fn ids(&self) -> [(u64, u64); 2] {
        self.ids
    }
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
            _ => "another mount".into(),
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
        let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            return false;
        };
        info.lines().any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.get(2) == Some(&dev.as_str())
                && f.get(4).map(|p| unescape(p)) == Some(PathBuf::from(mp))
        })
    }
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
    let file = std::fs::File::from(fd);
    lock_or_wait(file.as_fd(), || {
        let mut text = String::new();
        let mut f = &file;
        let _ = f.rewind();
        let _ = f.take(4096).read_to_string(&mut text);
        Record::parse(&text)
    })
    .map_err(|holder| {
        busy(format!(
            "work directory {} is in use by {holder}",
            path.display()
        ))
    })?;
    Ok(file)
}

/// Takes the lock on the upper directory itself (the directory's own flock).
fn lock_upper(upper: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let (dev, ino) = id(upper)?;
    lock_or_wait(upper, || holder_of(dev, ino)).map_err(|holder| {
        busy(format!(
            "upper directory {} is in use by {holder}",
            path.display()
        ))
    })
}

/// Locks `fd`; while another holds it and that holder's mount is gone, retries until
/// [`EXITING_HOLDER_WAIT`] passes. Err: the holder, described.
fn lock_or_wait(fd: BorrowedFd<'_>, holder: impl Fn() -> Record) -> Result<(), String> {
    let deadline = Instant::now() + EXITING_HOLDER_WAIT;
    loop {
        match rfs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(e) => return Err(format!("an unlockable lock ({e})")),
        }
        let h = holder();
        if h.serving() {
            return Err(h.describe());
        }
        if Instant::now() >= deadline {
            return Err(format!("{}, unmounted but still busy", h.describe()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The holder of the flock on (dev, ino), from /proc/locks, and its record (the lock file
/// it holds open).
fn holder_of(dev: u64, ino: u64) -> Record {
    let want = format!("{:02x}:{:02x}:{ino}", rfs::major(dev), rfs::minor(dev));
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let pid = locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse::<u32>().ok())
            .flatten()
    });
    let Some(pid) = pid else {
        return Record::default();
    };
    let record = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.file_name() == Some(std::ffi::OsStr::new(LOCK_FILE)))
        })
        .and_then(|e| std::fs::read_to_string(e.path()).ok());
    match record {
        Some(text) => Record::parse(&text),
        None => Record {
            pid: Some(pid),
            ..Record::default()
        },
    }
}

/// Refuses a directory that a kernel overlayfs mount (in this mount namespace) uses as its
/// upperdir or workdir; overlayfs shows both in its mount options.
fn in_use_by_overlayfs(ours: &[(&str, &Path, Id)]) -> io::Result<()> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in info.lines() {
        let Some((_, after)) = line.split_once(" - ") else {
            continue;
        };
        let f: Vec<&str> = after.split(' ').collect();
        if f.first() != Some(&"overlay") {
            continue;
        }
        let point = line.split(' ').nth(4).map(unescape).unwrap_or_default();
        for opt in f.get(2).copied().unwrap_or("").split(',') {
            let Some((key, value)) = opt.split_once('=') else {
                continue;
            };
            if key != "upperdir" && key != "workdir" {
                continue;
            }
            let Ok(st) = rfs::stat(unescape(value)) else {
                continue;
            };
            for (what, path, ours) in ours {
                if (st.st_dev, st.st_ino) == *ours {
                    return Err(busy(format!(
                        "{what} {} is in use as the {key} of the overlayfs mount on {}",
                        path.display(),
                        point.display()
                    )));
                }
            }
        }
    }
    Ok(())
}
