//! `verilay extract`: an image's tree written to a directory through the verified reader; the
//! image may be hostile (docs/SECURITY.md section 3).
//!
//! - An image `fsck_structure` faults is refused before DIR is touched.
//! - Every object is made beneath a descriptor opened here, never via a link.
//! - Set-id bits, devices, `trusted.*`, `security.*` go only with owners.
//! - A failure stops it, naming the path.

#![forbid(unsafe_code)]

use anyhow::{bail, Context};
use erofs::format::*;
use erofs::read::{ByteSource, Image, Inode, ReadDir};
use host::objects::{open_beneath, Handle};
use host::sparse::{write_sparse, Run, Zeros};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An image as the verified reader reads it.
pub type Img = Image<Arc<dyn ByteSource>>;

/// What an extraction may restore.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Owners, and what travels only with them: set-id bits, device nodes, `trusted.*`
    /// and `security.*` xattrs (root, without `--no-same-owner`).
    pub restore_owner: bool,
}

/// What an extraction wrote.
pub struct Report {
    /// Entries made (hardlinks included).
    pub entries: u64,
    /// What could not be restored.
    pub skipped: Skipped,
}

/// Writes `top` of `img` (`name`: the image, for messages) into `dir`: a directory's
/// contents, or a non-directory under `top_name`. `dir` is made if missing and must be
/// an empty directory, not a symlink. `progress` is told of each run of file bytes
/// written. The image is refused first if fsck's structural checks find any problem.
pub fn extract(
    img: &Img,
    name: &Path,
    top: &Inode,
    top_name: &[u8],
    dir: &Path,
    opts: Options,
    progress: &mut dyn FnMut(u64),
) -> anyhow::Result<Report> {
    refuse_unsound(img, name)?;
    raise_descriptor_limit();
    let dir: PathBuf = dir.components().collect();
    let root = open_target(&dir)?;
    let euid = rustix::process::geteuid();
    let mut x = Extractor {
        img,
        progress,
        dir,
        root,
        restore_owner: opts.restore_owner,
        euid: euid.as_raw(),
        egid: rustix::process::getegid().as_raw(),
        links: HashMap::new(),
        dirs: Vec::new(),
        skipped: Skipped::default(),
        entries: 0,
        buf: vec![0u8; 1 << 20],
    };
    if top.is_dir() {
        x.tree(top)?;
    } else {
        let root = x.root.clone();
        x.nondir(root.as_fd(), top_name, top_name, top)?;
    }
    x.finish_dirs()?;
    Ok(Report {
        entries: x.entries,
        skipped: x.skipped,
    })
}

/// Refuses, with its first problem on one line, an image `fsck` would not pass: a hostile
/// structure (two entries of one name, a directory reachable twice, a wrong `..`) must not
/// shape what is written, and checking first means nothing is.
fn refuse_unsound(img: &Img, image: &Path) -> anyhow::Result<()> {
    let report = erofs::read::fsck_structure(img, 10);
    let Some(first) = report.problems.first() else {
        return Ok(());
    };
    let more = match report.problems.len() - 1 {
        0 => String::new(),
        n => format!(" (and {n} more lines: `verilay fsck` lists them)"),
    };
    bail!(
        "{}: not extracted, fsck finds the image unsound: {first}{more}",
        image.display()
    )
}

/// Up to 4096 nested directories are each held open while their subtree is written.
fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: now.maximum,
            maximum: now.maximum,
        },
    );
}

/// Opens DIR, creating it (and its parents) if needed. It must be an empty directory, and
/// not a symlink: a link's target can be changed under us by whoever owns the link.
fn open_target(dir: &Path) -> anyhow::Result<Arc<OwnedFd>> {
    let show = dir.display();
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => {
            bail!("{show}: is a symlink; name the directory itself (extract follows no links)")
        }
        Ok(m) if !m.is_dir() => bail!("{show}: exists and is not a directory"),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).with_context(|| parent.display().to_string())?;
            }
            match rustix::fs::mkdir(dir, Mode::from_raw_mode(0o777)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(std::io::Error::from(e)).with_context(|| show.to_string()),
            }
        }
        Err(e) => return Err(e).with_context(|| show.to_string()),
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match rustix::fs::open(dir, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::LOOP) => bail!("{show}: is a symlink; name the directory itself"),
        Err(e) => return Err(std::io::Error::from(e)).with_context(|| show.to_string()),
    };
    for e in rustix::fs::Dir::read_from(&fd).with_context(|| show.to_string())? {
        let e = e
            .map_err(std::io::Error::from)
            .with_context(|| show.to_string())?;
        if ![&b"."[..], b".."].contains(&e.file_name().to_bytes()) {
            bail!("{show}: exists and is not empty");
        }
    }
    Ok(Arc::new(fd))
}

/// What the extracting user could not restore, for one warning line at the end.
#[derive(Default, Debug)]
pub struct Skipped {
    /// Objects left owned by the extracting user, their own owner not restored.
    pub owners: u64,
    /// Files whose set-user-ID and set-group-ID bits were cleared.
    pub setid: u64,
    /// Xattrs not set: not allowed without owners, or refused by the filesystem.
    pub xattrs: u64,
    /// Device nodes not made.
    pub devices: u64,
}

impl Skipped {
    /// One line saying what was not restored, if anything was not.
    pub fn warning(&self) -> Option<String> {
        let parts: Vec<String> = [
            (self.owners, "ownerships"),
            (self.setid, "set-id bits"),
            (self.xattrs, "xattrs"),
            (self.devices, "device nodes"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        (!parts.is_empty()).then(|| {
            format!(
                "not restored: {} (only root restores them, without --no-same-owner)",
                parts.join(", ")
            )
        })
    }
}

/// A directory being written: its descriptor, and where its listing resumes.
struct Frame<'i> {
    fd: Arc<OwnedFd>,
    dir: Inode,
    rel: Vec<u8>,
    /// Dropped while a subdirectory is written (one block in memory per level would add up
    /// over 4096 levels); recreated from `resume`.
    iter: Option<ReadDir<'i, Arc<dyn erofs::read::ByteSource>>>,
    resume: u64,
}

struct Extractor<'a> {
    img: &'a Img,
    progress: &'a mut dyn FnMut(u64),
    /// DIR as given, for messages.
    dir: PathBuf,
    root: Arc<OwnedFd>,
    restore_owner: bool,
    euid: u32,
    egid: u32,
    /// Path under DIR of the first name of each non-directory with several names.
    links: HashMap<u64, Vec<u8>>,
    /// Every directory written, in the order made, for its metadata at the end.
    dirs: Vec<(Inode, Vec<u8>)>,
    skipped: Skipped,
    entries: u64,
    /// File data on its way from the image to DIR.
    buf: Vec<u8>,
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = rel.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// `rel` as parent path and last name.
fn split_last(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[], rel),
    }
}

impl<'a> Extractor<'a> {
    fn shown(&self, rel: &[u8]) -> String {
        self.dir.join(OsStr::from_bytes(rel)).display().to_string()
    }

    /// A syscall's result, its error naming the path under DIR.
    fn io<T>(&self, rel: &[u8], r: rustix::io::Result<T>) -> anyhow::Result<T> {
        r.map_err(|e| match e {
            // From O_NOFOLLOW, O_DIRECTORY, RESOLVE_NO_SYMLINKS or RESOLVE_BENEATH on a path
            // extract made: only another process can have changed it.
            Errno::LOOP | Errno::XDEV | Errno::NOTDIR => anyhow::anyhow!(
                "{}: replaced while extracting (a symlink or other file where extract made this), not followed",
                self.shown(rel)
            ),
            e => anyhow::Error::from(std::io::Error::from(e)).context(self.shown(rel)),
        })
    }

    /// Writes the tree under `top` into DIR, depth first, holding one descriptor per level.
    /// Directories stay 0700 until `finish_dirs`, so they can be filled (and hardlinked
    /// into) whatever their final mode, and nobody else can reach inside meanwhile.
    fn tree(&mut self, top: &Inode) -> anyhow::Result<()> {
        let img = self.img;
        let mut visited = HashSet::from([top.nid]);
        self.dirs.push((top.clone(), Vec::new()));
        let mut stack = vec![Frame {
            fd: self.root.clone(),
            dir: top.clone(),
            rel: Vec::new(),
            iter: None,
            resume: 0,
        }];
        while let Some(f) = stack.last_mut() {
            if f.iter.is_none() {
                let it = img.readdir(&f.dir, f.resume);
                f.iter = Some(it.with_context(|| self.shown(&f.rel))?);
            }
            let Some(next) = f.iter.as_mut().and_then(Iterator::next) else {
                stack.pop();
                continue;
            };
            let e = next.with_context(|| self.shown(&f.rel))?;
            f.resume = e.next_offset;
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let rel = join(&f.rel, &e.name);
            let child = img.inode(e.nid).with_context(|| self.shown(&rel))?;
            if !child.is_dir() {
                let fd = f.fd.clone();
                self.nondir(fd.as_fd(), &e.name, &rel, &child)?;
                continue;
            }
            // fsck refused these already; the walk must still never loop.
            if !visited.insert(child.nid) {
                bail!(
                    "{}: directory inode {} is reachable twice (a cycle in the image)",
                    self.shown(&rel),
                    child.nid
                );
            }
            let fd = self.mkdir(f.fd.as_fd(), &e.name, &rel)?;
            f.iter = None;
            self.dirs.push((child.clone(), rel.clone()));
            stack.push(Frame {
                fd: Arc::new(fd),
                dir: child,
                rel,
                iter: None,
                resume: 0,
            });
        }
        Ok(())
    }

    fn mkdir(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        rel: &[u8],
    ) -> anyhow::Result<OwnedFd> {
        self.entries += 1;
        self.io(
            rel,
            rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)),
        )?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY;
        self.io(rel, open_beneath(parent, name, flags, Mode::empty()))
    }

    /// Makes a non-directory `name` in `parent` (`rel` under DIR) with its metadata, or a
    /// hardlink to the first name it was made under.
    fn nondir(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        rel: &[u8],
        ino: &Inode,
    ) -> anyhow::Result<()> {
        self.entries += 1;
        if let Some(first) = self.links.get(&ino.nid) {
            let (first_dir, first_name) = split_last(first);
            let src = if first_dir.is_empty() {
                None
            } else {
                let flags = OFlags::PATH | OFlags::DIRECTORY;
                Some(self.io(
                    first_dir,
                    open_beneath(self.root.as_fd(), first_dir, flags, Mode::empty()),
                )?)
            };
            let src = src.as_ref().map_or(self.root.as_fd(), |f| f.as_fd());
            // Flags 0: a symlink is linked, not followed.
            let r = rustix::fs::linkat(src, first_name, parent, name, AtFlags::empty());
            return self.io(rel, r);
        }
        let made = match ino.mode & S_IFMT {
            S_IFREG => {
                let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
                let fd = self.io(
                    rel,
                    open_beneath(parent, name, flags, Mode::from_raw_mode(0o600)),
                )?;
                let file = std::fs::File::from(fd);
                self.write_file(ino, &file)
                    .with_context(|| self.shown(rel))?;
                self.metadata(Handle::Open(file.as_fd()), ino, rel)?;
                true
            }
            S_IFLNK => {
                let target = self.img.readlink(ino).with_context(|| self.shown(rel))?;
                self.io(rel, rustix::fs::symlinkat(target.as_slice(), parent, name))?;
                self.special_metadata(parent, name, rel, ino, FileType::Symlink)?;
                true
            }
            t => self.mknod(parent, name, rel, ino, t)?,
        };
        if made && ino.nlink > 1 {
            self.links.insert(ino.nid, rel.to_vec());
        }
        Ok(())
    }

    /// A device, FIFO or socket. Devices need CAP_MKNOD; without it (an ordinary user, or
    /// root in a user namespace) they are skipped and counted (the 0/0 character device,
    /// overlayfs's whiteout, can be made by anyone, and is).
    fn mknod(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        rel: &[u8],
        ino: &Inode,
        t: u16,
    ) -> anyhow::Result<bool> {
        let dev = rustix::fs::makedev(ino.rdev.0, ino.rdev.1);
        let (ft, dev) = match t {
            S_IFCHR => (FileType::CharacterDevice, dev),
            S_IFBLK => (FileType::BlockDevice, dev),
            S_IFIFO => (FileType::Fifo, 0),
            S_IFSOCK => (FileType::Socket, 0),
            _ => bail!("{}: unknown file type {:#o}", self.shown(rel), ino.mode),
        };
        // A device node gives access to what it names (0/0 names nothing): made only with
        // owners restored, as a set-id bit is.
        let device = matches!(ft, FileType::CharacterDevice | FileType::BlockDevice);
        if device && dev != 0 && !self.restore_owner {
            self.skipped.devices += 1;
            return Ok(false);
        }
        match rustix::fs::mknodat(parent, name, ft, Mode::from_raw_mode(0o600), dev) {
            Err(Errno::PERM) if device => {
                self.skipped.devices += 1;
                return Ok(false);
            }
            r => self.io(rel, r)?,
        }
        self.special_metadata(parent, name, rel, ino, ft)?;
        Ok(true)
    }

    /// Metadata of a symlink or special file just made as `name`: through an `O_PATH`
    /// descriptor of it, once it is checked to still be what was made.
    fn special_metadata(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        rel: &[u8],
        ino: &Inode,
        want: FileType,
    ) -> anyhow::Result<()> {
        let fd = self.io(rel, open_beneath(parent, name, OFlags::PATH, Mode::empty()))?;
        let st = self.io(rel, rustix::fs::fstat(&fd))?;
        if FileType::from_raw_mode(st.st_mode) != want {
            bail!(
                "{}: replaced by another process while extracting",
                self.shown(rel)
            );
        }
        self.metadata(Handle::Path(fd.as_fd()), ino, rel)
    }

    /// Copies the extents the image maps, every byte of them, so its holes stay holes.
    fn write_file(&mut self, ino: &Inode, f: &std::fs::File) -> anyhow::Result<()> {
        let (img, progress) = (self.img, &mut self.progress);
        let mut runs = |pos| {
            let ext = img.map(ino, pos).map_err(io::Error::other)?;
            Ok(Run {
                end: ext.logical + ext.len,
                data: ext.physical.is_some(),
            })
        };
        let mut read = |pos, buf: &mut [u8]| {
            let got = img.read(ino, pos, buf).map_err(io::Error::other)?;
            progress(got as u64);
            Ok(got)
        };
        let (buf, size) = (&mut self.buf, ino.size);
        write_sparse(f.as_fd(), size, buf, Zeros::Write, &mut runs, &mut read)?;
        Ok(())
    }

    /// The mode to give: a set-id bit grants its owner's identity to whoever runs the file,
    /// so it is restored only with the owner. Without (an ordinary user, `--no-same-owner`)
    /// it would grant the extracting user's instead, root's if root extracts.
    fn mode(&mut self, ino: &Inode) -> u32 {
        let mut mode = u32::from(ino.mode & 0o7777);
        if !self.restore_owner && !ino.is_dir() && mode & 0o6000 != 0 {
            mode &= !0o6000;
            self.skipped.setid += 1;
        }
        mode
    }

    /// Which xattrs are restored: all with the owner, else only `user.*` and ACLs. The
    /// others carry privilege or trust (`security.capability`, `security.selinux`,
    /// `security.ima`, `trusted.overlay.*`) that is the image owner's to grant.
    fn xattr_allowed(&self, name: &[u8]) -> bool {
        self.restore_owner
            || name.starts_with(b"user.")
            || name == b"system.posix_acl_access"
            || name == b"system.posix_acl_default"
    }

    /// Ownership, mode, xattrs (ACLs included) and times, in the order that keeps each:
    /// chown clears set-id bits and capabilities, and everything before the times changes
    /// the ctime only.
    fn metadata(&mut self, h: Handle<'_>, ino: &Inode, rel: &[u8]) -> anyhow::Result<()> {
        if self.restore_owner {
            self.io(rel, h.chown(ino.uid, ino.gid))?;
        } else if (ino.uid, ino.gid) != (self.euid, self.egid) {
            self.skipped.owners += 1;
        }
        if !ino.is_symlink() {
            let mode = self.mode(ino);
            self.io(rel, h.chmod(mode))?;
        }
        for (name, value) in self.img.xattrs(ino).with_context(|| self.shown(rel))? {
            if !self.xattr_allowed(&name) {
                self.skipped.xattrs += 1;
                continue;
            }
            match h.setxattr(&name, &value) {
                Ok(()) => {}
                // Not permitted here (user.* on a symlink, a filesystem without the namespace).
                Err(Errno::PERM | Errno::NOTSUP) => self.skipped.xattrs += 1,
                Err(e) => {
                    return Err(std::io::Error::from(e)).with_context(|| {
                        format!(
                            "{}: setting xattr {}",
                            self.shown(rel),
                            String::from_utf8_lossy(&name)
                        )
                    })
                }
            }
        }
        let ts = rustix::fs::Timespec {
            tv_sec: ino.mtime,
            tv_nsec: ino.mtime_nsec as _,
        };
        let times = rustix::fs::Timestamps {
            last_access: ts,
            last_modification: ts,
        };
        self.io(rel, h.set_times(&times))
    }

    /// Gives every directory its metadata, deepest first (a read-only or unsearchable
    /// directory must not stop its subdirectories getting theirs), each reopened under DIR
    /// without following links.
    fn finish_dirs(&mut self) -> anyhow::Result<()> {
        let dirs = std::mem::take(&mut self.dirs);
        for (ino, rel) in dirs.iter().rev() {
            let fd = if rel.is_empty() {
                self.root.clone()
            } else {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY;
                Arc::new(self.io(
                    rel,
                    open_beneath(self.root.as_fd(), rel, flags, Mode::empty()),
                )?)
            };
            self.metadata(Handle::Open(fd.as_fd()), ino, rel)?;
        }
        Ok(())
    }
}
