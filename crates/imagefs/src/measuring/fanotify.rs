//! The kernel engine's front to the measuring engine: opens and execs on the mount come
//! as fanotify permission events (`host::fanotify`), each decided and measured as the
//! FUSE filesystems' OPEN is ([`Setup::measure`]), then answered: allowed, or denied
//! (EPERM) when a measurement the policy asked for could not be made.
//!
//! What holds, and why:
//! - A file is found by what it is: its `st_ino` is its erofs nid, and its `st_dev` says
//!   which image layer serves it: the layer's erofs mount for a single image, and for a
//!   stack the pseudo device overlayfs gives each lower layer's files (`xino=off`),
//!   learnt from the first file of each layer met, found by its path (the topmost layer
//!   holding a regular file of that nid there). Its bytes and fs-verity digest come from
//!   the daemon's own verified reader of that image.
//! - Images never change, so after a file's first open of a kind (read or exec) is
//!   decided, an ignore mark spares every later one, exactly when no rule of the policy
//!   depends on who opens (uid, euid, gid, egid); otherwise every open is an event.
//! - An execve raises an exec event and then an open event: the second, seen while the
//!   thread is still in execve, is allowed unmeasured (the first measured it as IMA
//!   measures an exec: BPRM_CHECK and FILE_CHECK with MAY_EXEC).

use super::{ContentKey, Opening, Setup};
use crate::ops::Logger;
use host::fanotify::{in_exec, Event, Group, Open};
use std::io;
use std::sync::{Arc, Mutex};

type Img = erofs::read::Image<Arc<dyn erofs::read::ByteSource>>;

/// What the front needs: the measuring setup, each layer's image (top first) and the
/// device of its erofs mount, and where log lines go.
pub struct Front {
    pub setup: Setup,
    pub images: Vec<Img>,
    /// Each layer's device as its files show it, where known (a single image's erofs
    /// mount); a stack's are learnt (`learnt`).
    pub devices: Vec<u64>,
    /// The device overlayfs shows for each layer's files, once learnt.
    pub learnt: Mutex<Vec<(u64, usize)>>,
    /// The mountpoint, absolute: where the paths events name begin.
    pub mountpoint: std::path::PathBuf,
    /// The file each thread last exec'd and when ((tid, dev, ino), time): its next open
    /// event for that file is the exec's own second event.
    pub execs: Mutex<Vec<(ExecdFile, std::time::Instant)>>,
    pub log: Logger,
    /// How log lines name the mount.
    pub name: String,
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
        std::thread::Builder::new()
            .name(format!("verilay-fanotify-{i}"))
            .spawn(move || loop {
                match group.next() {
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
                (false, false)
            }
        };
        // The mark first: once answered, the opener goes on while the file we were handed
        // still holds the mount, so nothing more is done between the answer and its close.
        if allow && ignore && spare {
            let _ = group.ignore(event, event.kind());
        }
        if let Err(e) = group.answer(event, allow) {
            (self.log)(&format!("{}: answering an open: {e}", self.name));
        }
    }

    /// (allow, whether an ignore mark may spare later opens of this kind).
    fn decide(&self, event: &Event) -> io::Result<(bool, bool)> {
        let kind = event.kind();
        let fd = event.file();
        let st = rustix::fs::fstat(fd)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            // Directories and devices are never measured.
            return Ok((true, true));
        }
        let file = (event.tid(), st.st_dev, st.st_ino);
        if kind == Open::Exec {
            self.exec_seen(file);
        } else if self.exec_second_event(file, st.st_mode) {
            return Ok((true, false));
        }
        let path = || -> io::Result<std::path::PathBuf> {
            std::fs::read_link(format!(
                "/proc/self/fd/{}",
                rustix::fd::AsRawFd::as_raw_fd(&fd)
            ))
        };
        let layer = self.layer_of(st.st_dev, st.st_ino, &path)?;
        let fs = &self.setup.layers[layer];
        if !self
            .setup
            .measuring
            .may_measure_open(fs, kind == Open::Exec)
        {
            // No rule can measure this kind of open of this layer's files.
            return Ok((true, true));
        }
        let image = &self.images[layer];
        let inode = image
            .inode(st.st_ino)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let content = ImageContent {
            file: super::ImageFile {
                image,
                inode: &inode,
            },
            path: &path,
        };
        let flags = match kind {
            Open::Exec => super::engine::FMODE_EXEC,
            Open::File => 0,
        };
        let opening = Opening {
            flags,
            pid: event.tid(),
            owner: (st.st_uid, st.st_gid),
            fs,
            key: ContentKey::Image {
                layer: layer as u16,
                nid: st.st_ino,
            },
            cookie: None,
            opens: None,
        };
        match self
            .setup
            .measure(&opening, &content, &self.log, &self.name)
        {
            Ok(_) => Ok((true, true)),
            Err(_) => Ok((false, false)),
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

impl Front {
    /// The layer whose file has device `dev` and inode `nid`, at `path` on the mount.
    fn layer_of(
        &self,
        dev: u64,
        nid: u64,
        path: &dyn Fn() -> io::Result<std::path::PathBuf>,
    ) -> io::Result<usize> {
        if let Some(layer) = self.devices.iter().position(|&d| d == dev) {
            return Ok(layer);
        }
        let mut learnt = self.learnt.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(_, layer)) = learnt.iter().find(|(d, _)| *d == dev) {
            return Ok(layer);
        }
        let path = path()?;
        let unknown = || {
            io::Error::other(format!(
                "{}: on device {}:{}, in no image layer",
                path.display(),
                rustix::fs::major(dev),
                rustix::fs::minor(dev)
            ))
        };
        let inside = path.strip_prefix(&self.mountpoint).map_err(|_| unknown())?;
        let layer = (0..self.images.len())
            .filter(|&l| !learnt.iter().any(|&(_, known)| known == l))
            .find(|&l| regular_nid(&self.images[l], inside) == Some(nid))
            .ok_or_else(unknown)?;
        learnt.push((dev, layer));
        Ok(layer)
    }
}

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

/// An image file as the list names it (its path through the mount, looked up only when
/// an entry needs it) and measures it.
struct ImageContent<'a> {
    file: super::ImageFile<'a, Arc<dyn erofs::read::ByteSource>>,
    path: &'a dyn Fn() -> io::Result<std::path::PathBuf>,
}

impl super::Content for ImageContent<'_> {
    fn path(&self) -> Vec<u8> {
        let path = (self.path)().unwrap_or_default();
        std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec()
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
