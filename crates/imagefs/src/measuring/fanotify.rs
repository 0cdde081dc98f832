//! The kernel engine's measuring front: fanotify permission events for the mount's opens and
//! execs, measured ([`Setup::measure`]), then allowed or denied EIO (docs/SECURITY.md
//! section 11).
//!
//! - A file is found by `st_dev` (layer) and `st_ino` (nid), read by the daemon's verified
//!   reader.
//! - An exec's open event passes: its exec event measured it.
//! - Violations: how it is open, asked of the kernel.

use super::{ContentKey, Opening, Opens, PositionalReader, Setup};
use crate::ops::Logger;
use anyhow::Context;
use host::fanotify::{has_writers, in_exec, open_flags, Event, Group, Open};
use rustix::fd::{AsRawFd, BorrowedFd};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};

type Img = erofs::read::Image<Arc<dyn erofs::read::ByteSource>>;

/// What the front needs: the measuring setup, each layer's image (top first) and the
/// device of its erofs mount, and where log lines go.
pub struct Front {
    /// The measuring setup.
    pub setup: Setup,
    /// Each layer's image, top first.
    pub images: Vec<Img>,
    /// Each layer's device as its files show it, where known (a single image's erofs
    /// mount); a stack's are learnt (`learnt`): overlayfs gives each lower layer's files
    /// a pseudo device of its own (`xino=off`).
    pub devices: Vec<u64>,
    /// The device overlayfs shows for each layer's files (`None`: the upper
    /// directory's), once learnt.
    pub learnt: Mutex<Vec<(u64, Option<usize>)>>,
    /// The mountpoint, absolute: where the paths events name begin.
    pub mountpoint: std::path::PathBuf,
    /// The file each thread last exec'd and when ((tid, dev, ino), time): its next open
    /// event for that file is the exec's own second event.
    pub execs: Mutex<Vec<(ExecdFile, std::time::Instant)>>,
    /// Where log lines go.
    pub log: Logger,
    /// How log lines name the mount.
    pub name: String,
    /// A writable mount's upper directory.
    pub upper: Option<rustix::fd::OwnedFd>,
    /// A writable mount's files by the device and inode the mount shows them with (the
    /// same before and after copy-up): IMA's two bits of each file a policy measured.
    pub bits: Mutex<HashMap<(u64, u64), Arc<AtomicU8>>>,
}

/// Which later opens of a file an ignore mark may spare: images never change, so a file's
/// later opens of a kind are spared when no policy rule depends on who opens.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spare {
    /// None (a regular file of a writable mount, an exec's second event): a copy-up
    /// without a write (a chmod) would keep the mark while the file's layer, so the
    /// policy's answer, changes.
    Never,
    /// Those of its kind, when no rule depends on who opens.
    IfExact,
    /// All: it is no regular file, so never measured.
    Always,
}

impl Front {
    /// The kinds of open the policy can measure on some layer of the mount (none: it
    /// needs no events at all). A write open matters to IMA's violations only once a
    /// read was measured, which needs file opens heard anyway.
    pub fn kinds(&self) -> Vec<Open> {
        let m = &self.setup.measuring;
        let fss = || self.setup.layers.iter().chain(&self.setup.upper);
        let mut kinds = Vec::new();
        if fss().any(|fs| m.may_measure_open(fs, false)) {
            kinds.push(Open::File);
        }
        if fss().any(|fs| m.may_measure_open(fs, true)) {
            kinds.push(Open::Exec);
        }
        kinds
    }
}

/// Serves `group`'s events on `workers` threads, each taking the next event and
/// answering it, until the group is closed (the process ends).
pub fn start(group: Group, front: Front, workers: usize) -> anyhow::Result<()> {
    let group = Arc::new(group);
    let front = Arc::new(front);
    // Decided once: whether an ignore mark is exact for this policy.
    let spare = !front.setup.measuring.depends_on_task();
    for i in 0..workers.max(1) {
        let (group, front) = (group.clone(), front.clone());
        let waiter = group.waiter().context("waiting for fanotify events")?;
        std::thread::Builder::new()
            .name(format!("verilay-fanotify-{i}"))
            .spawn(move || loop {
                match group.next(&waiter) {
                    Ok(event) => front.answer(&group, &event, spare),
                    Err(e) => {
                        (front.log)(&format!("{}: reading fanotify events: {e}", front.name));
                        return;
                    }
                }
            })?;
    }
    Ok(())
}

impl Front {
    /// Decides `event`, answers it, and (with `spare`: no rule depends on who opens)
    /// spares later opens of its kind of the file where the decision allows it.
    fn answer(&self, group: &Group, event: &Event, spare: bool) {
        let (allow, ignore) = match self.decide(event) {
            Ok(decided) => decided,
            Err(e) => {
                (self.log)(&format!("{}: measuring an open: {e}", self.name));
                (false, Spare::Never)
            }
        };
        // The mark first: once answered, the opener goes on while the file we were handed
        // still holds the mount, so nothing more is done between the answer and its close.
        if allow && (ignore == Spare::Always || (ignore == Spare::IfExact && spare)) {
            let _ = group.ignore(event, event.kind());
        }
        if let Err(e) = group.answer(event, allow) {
            (self.log)(&format!("{}: answering an open: {e}", self.name));
        }
    }

    /// (allow, which later opens an ignore mark may spare).
    fn decide(&self, event: &Event) -> io::Result<(bool, Spare)> {
        let kind = event.kind();
        let fd = event.file();
        let st = rustix::fs::fstat(fd)?;
        if !is_regular(st.st_mode) {
            // Directories and devices are never measured.
            return Ok((true, Spare::Always));
        }
        let writable = self.upper.is_some();
        let shown = (st.st_dev, st.st_ino);
        let file = (event.tid(), st.st_dev, st.st_ino);
        if kind == Open::Exec {
            self.exec_seen(file);
        } else if self.exec_second_event(file, st.st_mode) {
            return Ok((true, Spare::Never));
        }
        let flags = match kind {
            Open::Exec => super::engine::FMODE_EXEC,
            // Unknown (an io_uring worker's open): taken as a read, the open measurement
            // cannot skip (its writes still show to later opens: it has the file open
            // for writing, and its cookie changes).
            Open::File if writable => {
                open_flags(event.tid()).unwrap_or(libc::O_RDONLY) & !super::engine::FMODE_EXEC
            }
            // A read-only mount's files open for reading only.
            Open::File => 0,
        };
        // The path the opener used, taken once (a detached mount's later shows no
        // mountpoint): the list and log lines name the file by it.
        let named = std::cell::OnceCell::new();
        let path = || -> io::Result<std::path::PathBuf> {
            if let Some(p) = named.get() {
                return Ok(std::path::PathBuf::clone(p));
            }
            let p = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
            Ok(named.get_or_init(|| p).clone())
        };
        let writer = matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR);
        // A write open copies an image file up: it is measured as the upper file it
        // becomes (the same bytes, the upper filesystem's identity), as the FUSE engine
        // measures it once it has copied it up.
        let what = match self.what(&st, &path)? {
            What::Image { .. } if writable && writer => What::Upper,
            what => what,
        };
        let spare = if writable {
            Spare::Never
        } else {
            Spare::IfExact
        };
        if writer {
            // Whatever was kept of the file's content is no longer sure.
            self.setup.measuring.changed(ContentKey::Upper {
                dev: shown.0,
                ino: shown.1,
            });
        }
        let allow = self.measure(event, &what, flags, &st, &path)?;
        Ok((allow, spare))
    }

    /// How the file a writable mount shows as `shown` (open on `fd`) is open now, for an
    /// open with `flags`: whether it has writers (counting a writer opening it), and, for
    /// a write open that could record ToMToU, whether it has read-only handles.
    fn opens(&self, fd: BorrowedFd<'_>, shown: (u64, u64), flags: i32) -> io::Result<Opens> {
        let bits = self
            .bits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&shown)
            .cloned()
            .unwrap_or_default();
        let readers = super::writes(flags)
            && Opens::may_emit_tomtou(&bits)
            && host::holders::open_read_only_elsewhere(shown.0, shown.1);
        Ok(Opens::as_seen(has_writers(fd)?, readers, bits))
    }

    /// Keeps the file's bits once one is set (a file no policy measured keeps none).
    fn keep_bits(&self, shown: (u64, u64), o: &Opens) {
        let set = o.bits();
        if set.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return;
        }
        let mut bits = self.bits.lock().unwrap_or_else(|p| p.into_inner());
        let kept = bits.entry(shown).or_insert_with(|| set.clone());
        if !Arc::ptr_eq(kept, set) {
            // Another open of the file kept its own meanwhile: both count.
            kept.fetch_or(
                set.load(std::sync::atomic::Ordering::SeqCst),
                std::sync::atomic::Ordering::SeqCst,
            );
        }
    }

    /// Measures the open (with `flags`) of the file `what` says, whose descriptor and
    /// status the event gave: allowed, or refused when the measurement failed. How a
    /// writable mount's file is open is asked of the kernel only for an open that can
    /// be measured or record ToMToU.
    fn measure(
        &self,
        event: &Event,
        what: &What,
        flags: i32,
        st: &rustix::fs::Stat,
        path: &dyn Fn() -> io::Result<std::path::PathBuf>,
    ) -> io::Result<bool> {
        let shown = (st.st_dev, st.st_ino);
        let opens = || -> io::Result<Option<Opens>> {
            match self.upper.is_some() {
                true => Ok(Some(self.opens(event.file(), shown, flags)?)),
                false => Ok(None),
            }
        };
        let exec = flags & super::engine::FMODE_EXEC != 0;
        let fs = match what {
            What::Image { layer, .. } => &self.setup.layers[*layer],
            What::Upper => self.setup.upper.as_ref().ok_or_else(|| {
                io::Error::other("a writable mount measured with no upper identity")
            })?,
        };
        if !self.setup.measuring.may_measure_open(fs, exec) {
            // No rule can measure this kind of open of this layer's files; a write open
            // still records ToMToU for measured readers the file has.
            if !super::writes(flags) {
                return Ok(true);
            }
            let Some(o) = opens()? else {
                return Ok(true);
            };
            let p = || lossy(path());
            let allowed = self
                .setup
                .write_opened(&o, p, &self.log, &self.name)
                .is_ok();
            self.keep_bits(shown, &o);
            return Ok(allowed);
        }
        let opens = opens()?;
        let image;
        let upper;
        let (content, key, cookie): (&dyn super::Content, _, _) = match what {
            What::Image { layer, inode } => {
                image = ImageContent {
                    file: super::ImageFile {
                        image: &self.images[*layer],
                        inode,
                    },
                    path,
                };
                let key = ContentKey::Image {
                    layer: *layer as u16,
                    nid: st.st_ino,
                };
                (&image, key, None)
            }
            What::Upper => {
                upper = UpperContent {
                    fd: event.file(),
                    path,
                };
                let key = ContentKey::Upper {
                    dev: st.st_dev,
                    ino: st.st_ino,
                };
                (&upper, key, Some(super::cookie(st)))
            }
        };
        // Named now: a hash can outlast the mount.
        let _ = path();
        let opening = Opening {
            flags,
            pid: event.tid(),
            owner: (st.st_uid, st.st_gid),
            fs,
            key,
            cookie,
            opens: opens.as_ref(),
        };
        let allowed = self
            .setup
            .measure(&opening, content, &self.log, &self.name)
            .is_ok();
        if let Some(o) = &opens {
            self.keep_bits(shown, o);
        }
        Ok(allowed)
    }

    /// Whose file the mount shows with status `st` (at `path`): an image layer's, or (a
    /// writable mount's) the upper directory's. A writable mount's file is the image's
    /// only while it is pristine, reached by a path that still names it, and the upper
    /// directory has nothing there: a copied-up file shows its layer's device and nid,
    /// and an upper directory made elsewhere can hold any ctime. A device is learnt from
    /// a file that is surely its: a layer's from a file of that layer at that path with
    /// that nid, the upper directory's from a file of its there with that inode.
    fn what(
        &self,
        st: &rustix::fs::Stat,
        path: &dyn Fn() -> io::Result<std::path::PathBuf>,
    ) -> io::Result<What> {
        let (dev, ino) = (st.st_dev, st.st_ino);
        let known = self
            .devices
            .iter()
            .position(|&d| d == dev)
            .map(Some)
            .or_else(|| {
                let learnt = self.learnt.lock().unwrap_or_else(|p| p.into_inner());
                learnt.iter().find(|(d, _)| *d == dev).map(|&(_, l)| l)
            });
        let inode = |layer: usize| {
            self.images[layer]
                .inode(ino)
                .map_err(|e| io::Error::other(e.to_string()))
        };
        match (known, &self.upper) {
            (Some(None), _) => return Ok(What::Upper),
            (Some(Some(layer)), None) => {
                let inode = inode(layer)?;
                return Ok(What::Image { layer, inode });
            }
            _ => {}
        }
        let path = path()?;
        let deleted = path.as_os_str().as_encoded_bytes().ends_with(b" (deleted)");
        let inside = path
            .strip_prefix(&self.mountpoint)
            .ok()
            .filter(|_| !deleted);
        // What the upper directory holds there: beneath it, through no symlink, so that
        // whoever writes it cannot point the look-up elsewhere.
        let in_upper = |upper: &rustix::fd::OwnedFd| {
            use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};
            let fd = openat2(
                upper,
                inside?,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV,
            )
            .ok()?;
            rustix::fs::fstat(fd).ok()
        };
        let layer = match known {
            Some(layer) => layer,
            None => inside.and_then(|inside| {
                let learnt = self
                    .learnt
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                (0..self.images.len())
                    .filter(|&l| !learnt.iter().any(|&(_, known)| known == Some(l)))
                    .find(|&l| regular_nid(&self.images[l], inside) == Some(ino))
            }),
        };
        let learn = |as_: Option<usize>| {
            let mut learnt = self.learnt.lock().unwrap_or_else(|p| p.into_inner());
            if !learnt.iter().any(|&(d, _)| d == dev) {
                learnt.push((dev, as_));
            }
        };
        match (layer, &self.upper) {
            (Some(layer), upper) => {
                let inode = inode(layer)?;
                let image = match upper {
                    None => true,
                    Some(u) => pristine(st, &inode) && inside.is_some() && in_upper(u).is_none(),
                };
                if !image {
                    // Copied up: its device is its layer's, not learnt from it.
                    return Ok(What::Upper);
                }
                if known.is_none() {
                    learn(Some(layer));
                }
                Ok(What::Image { layer, inode })
            }
            (None, Some(upper)) => {
                if in_upper(upper).is_some_and(|u| u.st_ino == ino && is_regular(u.st_mode)) {
                    learn(None);
                }
                Ok(What::Upper)
            }
            (None, None) => Err(io::Error::other(format!(
                "{}: on device {}:{}, in no image layer",
                path.display(),
                rustix::fs::major(dev),
                rustix::fs::minor(dev)
            ))),
        }
    }

    /// Notes that thread `file.0` is exec'ing the file `(file.1, file.2)`.
    fn exec_seen(&self, file: ExecdFile) {
        let now = std::time::Instant::now();
        let mut execs = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        execs.retain(|&(f, at)| f.0 != file.0 && now.duration_since(at) < EXEC_WINDOW);
        execs.push((file, now));
    }

    /// Whether this open of `file` is an exec's second event: its thread exec'd it a
    /// moment ago (the record is taken), or, for an executable file no record explains
    /// (the exec's own event spared by an ignore mark), the thread is inside execve now.
    fn exec_second_event(&self, file: ExecdFile, mode: u32) -> bool {
        let now = std::time::Instant::now();
        let mut execs = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = execs
            .iter()
            .position(|&(f, at)| f == file && now.duration_since(at) < EXEC_WINDOW)
        {
            execs.swap_remove(i);
            return true;
        }
        drop(execs);
        mode & 0o111 != 0 && in_exec(file.0)
    }
}

/// A thread and the file it exec'd: (tid, dev, ino).
pub type ExecdFile = (u32, u64, u64);

/// How long after an exec event its open event may come (it comes at once: the thread
/// waits for the first answer, then opens).
const EXEC_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

/// The nid of the regular file at `path` (relative) in `image`, if there is one.
fn regular_nid(image: &Img, path: &std::path::Path) -> Option<u64> {
    let mut inode = image.inode(image.root_nid()).ok()?;
    let mut nid = image.root_nid();
    for c in path.components() {
        let std::path::Component::Normal(name) = c else {
            return None;
        };
        let name = std::os::unix::ffi::OsStrExt::as_bytes(name);
        let entry = image.lookup(&inode, name).ok()??;
        nid = entry.nid;
        inode = image.inode(nid).ok()?;
    }
    inode.is_reg().then_some(nid)
}

/// Whether a file of a writable mount, shown with status `st`, is still its image's
/// `inode` (ctime, mtime and size): erofs shows ctime = mtime, and a copy-up takes a
/// ctime of its own, which no caller can set back.
fn pristine(st: &rustix::fs::Stat, inode: &erofs::read::Inode) -> bool {
    let image = (inode.mtime, inode.mtime_nsec as i64);
    (st.st_ctime as i64, st.st_ctime_nsec as i64) == image
        && (st.st_mtime as i64, st.st_mtime_nsec as i64) == image
        && st.st_size as u64 == inode.size
}

fn is_regular(mode: u32) -> bool {
    rustix::fs::FileType::from_raw_mode(mode) == rustix::fs::FileType::RegularFile
}

/// Whose a file is (see [`Front::what`]).
enum What {
    Image {
        layer: usize,
        inode: erofs::read::Inode,
    },
    /// The upper directory's: new, or copied up.
    Upper,
}

/// A path as the list names it (none when it cannot be had: a log line says why).
fn lossy(path: io::Result<std::path::PathBuf>) -> Vec<u8> {
    std::os::unix::ffi::OsStrExt::as_bytes(path.unwrap_or_default().as_os_str()).to_vec()
}

/// An upper file (new or copied up) as the list names it and measures it: the bytes the
/// mount reads, through the descriptor the event gave, under the upper filesystem's
/// identity. Its digest is kept by the device and inode the mount shows (the same before
/// and after copy-up) and its change cookie.
struct UpperContent<'a> {
    fd: BorrowedFd<'a>,
    path: &'a dyn Fn() -> io::Result<std::path::PathBuf>,
}

impl super::Content for UpperContent<'_> {
    fn path(&self) -> Vec<u8> {
        lossy((self.path)())
    }

    fn reader(&self, size: Option<u64>) -> io::Result<(Box<dyn io::Read + '_>, u64)> {
        let size = match size {
            Some(s) => s,
            None => rustix::fs::fstat(self.fd)?.st_size as u64,
        };
        let r = PositionalReader { fd: self.fd, at: 0 };
        Ok((Box::new(r), size))
    }

    fn verity_digest(&self) -> io::Result<Option<[u8; 32]>> {
        Ok(None)
    }

    fn ima_xattr(&self) -> Option<Vec<u8>> {
        let path = std::ffi::CString::new(format!("/proc/self/fd/{}", self.fd.as_raw_fd())).ok()?;
        crate::backing::host_xattr(&path, c"security.ima").ok()?
    }
}

/// An image file as the list names it (its path through the mount, looked up only when
/// an entry needs it) and measures it.
struct ImageContent<'a> {
    file: super::ImageFile<'a, Arc<dyn erofs::read::ByteSource>>,
    path: &'a dyn Fn() -> io::Result<std::path::PathBuf>,
}

impl super::Content for ImageContent<'_> {
    fn path(&self) -> Vec<u8> {
        lossy((self.path)())
    }

    fn reader(&self, _size: Option<u64>) -> io::Result<(Box<dyn io::Read + '_>, u64)> {
        Ok(self.file.reader())
    }

    fn verity_digest(&self) -> io::Result<Option<[u8; 32]>> {
        self.file.verity_digest()
    }

    fn ima_xattr(&self) -> Option<Vec<u8>> {
        self.file.ima_xattr()
    }
}
