//! `verilay extract IMAGE DIR`: writes the image's tree out through the reader, with
//! ownership (as root), modes, timestamps, xattrs, ACLs, hardlinks and holes.

use super::image::Img;
use super::image::{open, resolve};
use crate::progress;
use anyhow::{bail, Context};
use erofs::format::*;
use erofs::read::Inode;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    image: PathBuf,
    #[command(flatten)]
    pin: super::image::Pin,
    /// Directory to create (or an empty existing one).
    dir: PathBuf,
    /// Extract only this path of the image (a directory or a single file).
    #[arg(long, value_name = "PATH")]
    path: Option<String>,
    /// No progress bar and no summary line.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let opened = open(&a.image, &a.pin, false)?;
    let trust = opened.trust();
    let img = opened.img;
    if a.dir.exists() && fs::read_dir(&a.dir)?.next().is_some() {
        bail!("{}: exists and is not empty", a.dir.display());
    }
    let top = match &a.path {
        Some(p) => resolve(&img, p)?,
        None => img.inode(img.root_nid())?,
    };
    let pb = progress::bar(a.quiet);
    progress::bytes(&pb, "extracting", img.image_len());
    let mut x = Extractor {
        img: &img,
        pb,
        root: rustix::process::geteuid().is_root(),
        links: HashMap::new(),
        skipped: 0,
        files: 0,
    };
    x.extract(&top, &a.dir)?;
    x.pb.finish_and_clear();
    if x.skipped > 0 {
        eprintln!(
            "verilay: warning: {} ownerships or xattrs need root and were not restored",
            x.skipped
        );
    }
    if !a.quiet {
        eprintln!(
            "{}: {} entries extracted to {}, every byte verified, digest {trust}",
            a.image.display(),
            x.files,
            a.dir.display()
        );
    }
    Ok(0)
}

struct Extractor<'a> {
    img: &'a Img,
    pb: indicatif::ProgressBar,
    root: bool,
    /// First path of each non-directory nid, to recreate hardlinks.
    links: HashMap<u64, PathBuf>,
    skipped: u64,
    files: u64,
}

impl Extractor<'_> {
    fn extract(&mut self, top: &Inode, dest: &Path) -> anyhow::Result<()> {
        if !top.is_dir() {
            return self.create(top, dest);
        }
        // Directories are created writable first and get their real mode and times last,
        // deepest first, so read-only directories can still be filled.
        let mut dirs = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![(top.clone(), dest.to_path_buf())];
        while let Some((dir, path)) = stack.pop() {
            if !seen.insert(dir.nid) {
                bail!(
                    "directory inode {} is reachable twice (a cycle in the image)",
                    dir.nid
                );
            }
            fs::create_dir_all(&path).with_context(|| path.display().to_string())?;
            for e in self.img.readdir(&dir, 0)? {
                let e = e?;
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let child = self.img.inode(e.nid)?;
                let p = path.join(std::ffi::OsStr::from_bytes(&e.name));
                if child.is_dir() {
                    stack.push((child, p));
                } else {
                    self.create(&child, &p)?;
                }
            }
            dirs.push((dir, path));
        }
        for (dir, path) in dirs.iter().rev() {
            self.metadata(dir, path)?;
        }
        Ok(())
    }

    fn create(&mut self, ino: &Inode, path: &Path) -> anyhow::Result<()> {
        self.files += 1;
        let ctx = || path.display().to_string();
        if let Some(first) = self.links.get(&ino.nid) {
            fs::hard_link(first, path).with_context(ctx)?;
            return Ok(());
        }
        match ino.mode & S_IFMT {
            S_IFREG => self.write_file(ino, path).with_context(ctx)?,
            S_IFLNK => {
                let target = self.img.readlink(ino)?;
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), path)
                    .with_context(ctx)?;
            }
            t => {
                use rustix::fs::{FileType, Mode};
                let (ft, dev) = match t {
                    S_IFCHR => (
                        FileType::CharacterDevice,
                        rustix::fs::makedev(ino.rdev.0, ino.rdev.1),
                    ),
                    S_IFBLK => (
                        FileType::BlockDevice,
                        rustix::fs::makedev(ino.rdev.0, ino.rdev.1),
                    ),
                    S_IFIFO => (FileType::Fifo, 0),
                    _ => (FileType::Socket, 0),
                };
                rustix::fs::mknodat(rustix::fs::CWD, path, ft, Mode::from_raw_mode(0o600), dev)
                    .map_err(std::io::Error::from)
                    .with_context(ctx)?;
            }
        }
        self.metadata(ino, path)?;
        if ino.nlink > 1 {
            self.links.insert(ino.nid, path.to_path_buf());
        }
        Ok(())
    }

    /// Copies data extents only, so holes stay holes.
    fn write_file(&mut self, ino: &Inode, path: &Path) -> anyhow::Result<()> {
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?;
        f.set_len(ino.size)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut pos = 0;
        while pos < ino.size {
            let ext = self.img.map(ino, pos)?;
            let end = (ext.logical + ext.len).min(ino.size);
            if end <= pos {
                bail!("extent map at {pos} did not advance");
            }
            if ext.physical.is_some() {
                while pos < end {
                    let n = ((end - pos) as usize).min(buf.len());
                    let got = self.img.read(ino, pos, &mut buf[..n])?;
                    if got == 0 {
                        bail!("short read at byte {pos} of {}", ino.size);
                    }
                    f.write_all_at(&buf[..got], pos)?;
                    pos += got as u64;
                    self.pb.inc(got as u64);
                }
            }
            pos = end;
        }
        Ok(())
    }

    /// Ownership, mode, xattrs (ACLs included) and times, in the order that keeps each.
    fn metadata(&mut self, ino: &Inode, path: &Path) -> anyhow::Result<()> {
        let ctx = || path.display().to_string();
        let symlink = ino.is_symlink();
        if self.root {
            std::os::unix::fs::lchown(path, Some(ino.uid), Some(ino.gid)).with_context(ctx)?;
        } else {
            self.skipped += 1;
        }
        // After chown, which clears set-id bits.
        if !symlink {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(path, fs::Permissions::from_mode((ino.mode & 0o7777) as u32))
                .with_context(ctx)?;
        }
        for (name, value) in self.img.xattrs(ino)? {
            let cname = std::ffi::CString::new(name.clone())?;
            match rustix::fs::lsetxattr(
                path,
                cname.as_c_str(),
                &value,
                rustix::fs::XattrFlags::empty(),
            ) {
                Ok(()) => {}
                Err(rustix::io::Errno::PERM) | Err(rustix::io::Errno::NOTSUP) if !self.root => {
                    self.skipped += 1
                }
                Err(e) => {
                    return Err(std::io::Error::from(e)).with_context(|| {
                        format!(
                            "{}: setting xattr {}",
                            path.display(),
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
        rustix::fs::utimensat(
            rustix::fs::CWD,
            path,
            &times,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(std::io::Error::from)
        .with_context(ctx)?;
        Ok(())
    }
}
