//! The kernel engine: the kernel's erofs serves each image over a file verilay serves verified
//! ([`ImageFiles`]); a stack or upper directory adds kernel overlayfs.
//!
//! - Users see only the result: its mounts are made in a private directory (`host::private`)
//!   and detached once held.
//! - The daemon serves until the kernel lets go of the image files.
//! - A failing step leaves nothing mounted.

use super::{kernel, Plan, Reporter};
use crate::fuse;
use crate::imagefiles::ImageFiles;
use crate::ops::Access;
use anyhow::Context;
use host::mounts::{detach, erofs, overlay};
use host::private::PrivateDir;
use mountopts::Engine;
use rustix::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Told, before the mount is attached on the mountpoint (so before anyone can open a
/// file on it), its root, its device and the device of each image layer's erofs mount
/// (top first): what watches opens is in place before the first.
pub type BeforeAttach<'a> = &'a mut dyn FnMut(BorrowedFd<'_>, u64, &[u64]) -> anyhow::Result<()>;

/// The engine that serves a mount (never `Auto`) when `asked` (`None`: auto) and the
/// caller is root or not, and why: `kernel` asked for where it cannot serve is an error
/// naming what is missing.
pub fn choose(asked: Option<Engine>, root: bool) -> anyhow::Result<(Engine, String)> {
    let asked = asked.unwrap_or(Engine::Auto);
    if asked == Engine::Fuse {
        return Ok((Engine::Fuse, "asked for".into()));
    }
    let unserved = if !root || !host::mounts::in_first_user_namespace() {
        Some("erofs mounts need root (in the first user namespace)".to_string())
    } else {
        host::mounts::file_backed_erofs().err()
    };
    match (asked, unserved) {
        (Engine::Kernel, Some(why)) => anyhow::bail!("engine=kernel: {why}"),
        (Engine::Kernel, None) => Ok((Engine::Kernel, "asked for".into())),
        (_, Some(why)) => Ok((Engine::Fuse, why)),
        (_, None) => Ok((
            Engine::Kernel,
            "root, and the kernel has file-backed erofs".into(),
        )),
    }
}

/// Mounts detached again on drop unless kept (a setup step failed).
struct Detach(Vec<PathBuf>);

impl Drop for Detach {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = detach(p);
        }
    }
}

impl Plan {
    /// Serves `files` (one per image, top first) to the kernel, mounts erofs over each
    /// and, for a stack or under `upper` (the upper and work directories, claimed by the
    /// caller), overlayfs over those on the mountpoint, and serves until the kernel lets
    /// go of the files. `before_attach`, if given, is told about the mount first.
    pub fn serve_kernel(
        &self,
        files: ImageFiles,
        upper: Option<(&Path, &Path)>,
        before_attach: Option<BeforeAttach<'_>>,
        report: &mut Reporter,
    ) -> anyhow::Result<()> {
        let count = files.len();
        // The kernel's erofs parses what it mounts: only metadata verilay's own checks
        // accept reaches it (a hostile but validly pinned image is refused here).
        // Caught from here on: a signal during the set-up is acted on once it is done.
        let signals = super::caught_signals()?;
        report.step("check the images' metadata");
        files.check_metadata()?;
        report.step("make the private directory for the image files");
        let private = PrivateDir::new()?;
        let files_dir = private.subdir("files")?;
        let files_plan = Plan {
            source: "verilay-image-files".into(),
            mountpoint: files_dir.clone(),
            writable: false,
            flags: super::Flags {
                nosuid: true,
                nodev: true,
                noexec: true,
                ..super::Flags::default()
            },
            access: Access::Owner,
            ..self.clone()
        };
        report.step("mount the image files");
        let (fd, guard) = kernel::mount(&files_plan)
            .with_context(|| format!("mounting the image files on {}", files_dir.display()))?;
        report.step(&format!(
            "answer the kernel's first request and start {} workers",
            self.threads.max(1)
        ));
        let config = fuse::Config {
            access: Access::Owner,
            workers: self.threads,
            transport: self.transport,
            poll: self.poll,
        };
        let stats = crate::ops::Ops::stats(&files);
        let lazily: Vec<bool> = (0..count).map(|i| files.checked_as_read(i)).collect();
        let session = fuse::Session::start(files, fd, &config)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("talking to the kernel")?;
        let fuse_dev = std::fs::metadata(&files_dir)
            .context("the image files' mount")?
            .dev();
        let flags = kernel::mount_flags(&self.flags, self.writable);
        let mut mounted = Detach(Vec::new());
        let file = |i: usize| files_dir.join(ImageFiles::file_name(i));
        let dev_of = |fd: BorrowedFd<'_>| -> anyhow::Result<u64> {
            Ok(rustix::fs::fstat(fd).context("the new mount")?.st_dev)
        };
        let mut lowers = Vec::new();
        let mut devices = Vec::new();
        let top = if count == 1 && upper.is_none() {
            report.step("mount erofs");
            let m = erofs(&file(0), flags)?;
            read_ahead(&m, lazily[0]);
            devices.push(dev_of(m.fd())?);
            m
        } else {
            for (i, &lazily) in lazily.iter().enumerate() {
                report.step(&format!("mount erofs for layer {i}"));
                let lower = private.subdir(&format!("layer-{i}"))?;
                let m = erofs(&file(i), rustix::mount::MountFlags::empty())?;
                read_ahead(&m, lazily);
                devices.push(dev_of(m.fd())?);
                m.attach(&lower)?;
                mounted.0.push(lower.clone());
                lowers.push(lower);
            }
            report.step("mount overlayfs");
            let refs: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();
            overlay(&refs, upper, flags)?
        };
        if let Some(hook) = before_attach {
            let root = top.open_root()?;
            hook(rustix::fd::AsFd::as_fd(&root), dev_of(top.fd())?, &devices)?;
        }
        report.step("attach the mount on the mountpoint");
        top.attach(&self.mountpoint)?;
        mounted.0.push(self.mountpoint.clone());
        // The overlay holds its layers: their own mounts go from view.
        if !lowers.is_empty() {
            report.step("detach the layers' erofs mounts");
            for l in &lowers {
                detach(l)?;
            }
        }
        report.step("detach the image files' mount");
        // From here the erofs mounts hold the files; the FUSE mount goes from view.
        guard.keep();
        detach(&files_dir)?;
        drop(private);
        report.step("listen for verilay stats");
        // The mount is open to every user the files' modes admit, as erofs is.
        let stats = super::with_engine(session.add_to_stats(stats), "kernel", &self.engine_why);
        let _stats = super::stats::Channel::start(&self.mountpoint, Access::All, stats)?;
        report.step("act on signals");
        self.unmount_on_signals(signals, fuse_dev);
        mounted.0.clear();
        report.ready(&session.transport().to_string());
        // Returns when the kernel has let go of the image files.
        session.join().context("serving")
    }
}

/// How far the kernel reads ahead in a remote image's files: one FUSE request (1 MiB),
/// where erofs's default (128 KiB) would cost a round trip to the registry per 128 KiB
/// of a file read in order.
const REMOTE_READ_AHEAD_KIB: u32 = 1024;

/// Sets a remote image's erofs mount's read-ahead; where the kernel cannot be told, it
/// reads ahead as it would anyway.
fn read_ahead(m: &host::mounts::Detached, remote: bool) {
    if remote {
        let _ = m.set_read_ahead(REMOTE_READ_AHEAD_KIB);
    }
}
