//! A mount's setup: [`Mount`] holds the checked settings, [`Mount::preflight`] checks what it
//! can before a daemon exists, [`serve`] is the daemon.
//!
//! - Settings flow one way, CLI to [`MountOptions`] to [`Mount::new`] to [`serve`]; the daemon
//!   re-parses the same options and so decides the same way.
//! - Nothing in the upper or work directory is touched before the claim holds.

#![forbid(unsafe_code)]

mod measuring;
mod serve;

pub use measuring::{load_policy, Measure};
pub use serve::serve;

use anyhow::{bail, Context};
use imagefs::mount::{self as plan, Engine, Transport, MAX_TIMEOUT};
use mountopts::{check_threads, MountOptions};
use opening::{Pin, ReadOpts};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use upper::overlay::MAX_LAYERS;

/// The cache directory's size limit unless `cache_size=` says otherwise.
pub const DEFAULT_CACHE_SIZE: u64 = 10 << 30;

/// What a mount is made from: the images, the mountpoint and every option, checked.
#[derive(Clone)]
pub struct Mount {
    /// The images, top first (files or remote images).
    pub images: Vec<PathBuf>,
    /// Where the mount goes.
    pub mountpoint: PathBuf,
    /// Each image's pin, in order.
    pub pins: Vec<Pin>,
    /// Every option, flags folded in.
    pub opts: MountOptions,
    /// The caller is root.
    pub root: bool,
    /// The signature policy `oci://` images must satisfy, loaded once (`None`: none).
    pub trust: Option<Arc<signatures::Trust>>,
    /// The engine that serves the mount (never `Auto`), and why it was chosen.
    pub engine: (Engine, String),
}

impl Mount {
    /// Checks the options together, chooses the engine and loads the signature policy
    /// (before the mountpoint or any image is looked at: a FIFO or a GPG requirement in
    /// the policy fails at once; one named is read even when no image is `oci://`).
    pub fn new(
        images: Vec<PathBuf>,
        mountpoint: PathBuf,
        pins: Vec<Pin>,
        opts: MountOptions,
        root: bool,
    ) -> anyhow::Result<Mount> {
        if images.is_empty() {
            bail!("give one or more images, then the mountpoint");
        }
        if pins.len() != images.len() {
            bail!("{} pins for {} images", pins.len(), images.len());
        }
        if opts.prefetch && !images.iter().any(|i| opening::is_remote(i)) {
            bail!("prefetch: no image is remote (oci://, http://, https://)");
        }
        check(&opts, root)?;
        let engine = plan::choose_engine(opts.engine, root)?;
        let any_oci = opening::any_oci(&images);
        let trust = if any_oci || opts.signature_policy.is_some() {
            let files = opening::PolicyFiles {
                signature_policy: opts.signature_policy.clone(),
                registries_d: opts.registries_d.clone(),
            };
            files.load()?.map(Arc::new)
        } else {
            None
        };
        Ok(Mount {
            images,
            mountpoint,
            pins,
            opts,
            root,
            trust,
            engine,
        })
    }

    /// Writable: an upper directory and no `ro`.
    pub fn writable(&self) -> bool {
        self.opts.upper.is_some() && self.opts.read_only != Some(true)
    }

    /// The mount as `imagefs::mount` carries it out (`source`: what mount tables show).
    pub fn plan(&self, source: String, timeout: Duration) -> plan::Plan {
        let o = &self.opts;
        let on = |v: Option<bool>| v == Some(true);
        let access = if o.allow_other {
            plan::Access::All
        } else if o.allow_root {
            plan::Access::RootAndOwner
        } else {
            plan::Access::Owner
        };
        plan::Plan {
            source,
            mountpoint: self.mountpoint.clone(),
            writable: self.writable(),
            flags: plan::Flags {
                nosuid: on(o.nosuid),
                nodev: on(o.nodev),
                noexec: on(o.noexec),
                sync: on(o.sync),
                dirsync: on(o.dirsync),
                atime: o.atime,
                nodiratime: on(o.nodiratime),
                lazytime: on(o.lazytime),
                nosymfollow: on(o.nosymfollow),
            },
            access,
            threads: self.threads(),
            transport: self.opts.transport.unwrap_or(Transport::Auto),
            poll: self.opts.poll_us.map(Duration::from_micros),
            as_root: self.root,
            timeout,
            engine_why: self.engine.1.clone(),
        }
    }

    /// Worker threads: `threads=`, else one per CPU.
    pub fn threads(&self) -> usize {
        self.opts
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .min(mountopts::MAX_THREADS)
    }

    /// How the images are read (remote ones: plain HTTP when asked, and each request
    /// bounded by `timeout` in all).
    pub fn read_opts(&self, timeout: Duration) -> ReadOpts {
        let dir = match self.opts.nocache {
            true => None,
            false => self.opts.cache.clone().or_else(remote::cache::default_dir),
        };
        ReadOpts {
            insecure: self.opts.insecure,
            timeout: timeout.min(MAX_TIMEOUT) / 2,
            cache: dir.map(|d| (d, self.opts.cache_size.unwrap_or(DEFAULT_CACHE_SIZE))),
            default_cache: self.opts.cache.is_none(),
            trust: self.trust.clone(),
            ..ReadOpts::default()
        }
    }

    /// The measurement asked for, if any.
    pub fn measure(&self) -> anyhow::Result<Option<Measure>> {
        Measure::from_options(&self.opts)
    }

    /// Everything that can be checked before a daemon exists, so its errors come out in
    /// the caller. Returns how far each image is trusted ("sha256:… (pinned)" or "…
    /// (not pinned)"). Raises the descriptor limit, which a daemon started after inherits.
    /// Remote images are opened only with `remote`: a daemon about to open them again
    /// reports their errors and trust on its pipe as well, and each open costs a registry
    /// round trip per step (manifest, length, tree, superblock: 0.3 s at 50 ms RTT). The
    /// trust of those left is `None`.
    pub fn preflight(
        &self,
        timeout: Duration,
        remote: bool,
    ) -> anyhow::Result<Vec<Option<String>>> {
        let mp = self.mountpoint.display();
        if self.images.len() > MAX_LAYERS {
            bail!(
                "{} images: at most {MAX_LAYERS} can be stacked",
                self.images.len()
            );
        }
        let meta =
            std::fs::metadata(&self.mountpoint).with_context(|| format!("mountpoint {mp}"))?;
        if !meta.is_dir() {
            bail!("mountpoint {mp}: not a directory");
        }
        if plan::is_mount_point(&self.mountpoint)? {
            bail!("mountpoint {mp}: something is already mounted there");
        }
        if !Path::new("/dev/fuse").exists() {
            bail!("/dev/fuse does not exist: load the fuse module (modprobe fuse) or give the container the device");
        }
        for image in self.images.iter().filter(|i| !opening::is_remote(i)) {
            check_image_file(image)?;
        }
        if let Some(m) = self.measure()? {
            load_policy(&m.policy)?;
        }
        plan::raise_descriptor_limit();
        if self.writable() {
            let limit = descriptor_limit();
            if limit < MIN_WRITABLE_DESCRIPTORS {
                bail!(
                    "a writable mount needs at least {MIN_WRITABLE_DESCRIPTORS} descriptors (ulimit -n; 1024 for storms of creations in one directory, and 4 more for each file kept open through it at once), and this process may have {limit}: with fewer, creations stall for seconds and fail with EMFILE; raise ulimit -n"
                );
            }
        }
        check_descriptor_budget(self.threads())?;
        // Opening checks the verity section, the pinned digest and the superblock.
        let read = self.read_opts(timeout);
        self.images
            .iter()
            .zip(&self.pins)
            .map(|(image, pin)| {
                if !remote && opening::is_remote(image) {
                    return Ok(None);
                }
                let opened = opening::open(image, pin, false, &read)?;
                opened.say_warnings();
                Ok(Some(opened.trust()))
            })
            .collect()
    }
}

/// The combinations of options that cannot be honoured (`root`: the caller is root).
fn check(o: &MountOptions, root: bool) -> anyhow::Result<()> {
    match (&o.upper, &o.work) {
        (Some(_), None) => bail!("--upper needs --work (an empty directory beside it)"),
        (None, Some(_)) => bail!("--work needs --upper"),
        (None, None) if o.read_only == Some(false) => {
            bail!("rw: a writable mount needs --upper and --work (images are read-only)")
        }
        _ => {}
    }
    if o.nocache && (o.cache.is_some() || o.cache_size.is_some()) {
        bail!("nocache with cache= or cache_size=: give one");
    }
    if o.prefetch && o.nocache {
        bail!("prefetch fills the cache: it cannot go with nocache");
    }
    if o.allow_other && o.allow_root {
        bail!("allow_other and allow_root: give one (allow_other includes root)");
    }
    if o.allow_root && !root {
        // The kernel knows allow_other only, and FUSE's check of the caller skips reads
        // (and cached entries and attributes need no request): every user would read.
        bail!(
            "allow_root: a mount by an ordinary user cannot be limited to root and its \
             owner, it would amount to allow_other (every user): give allow_other, or neither"
        );
    }
    if let Some(t) = o.threads {
        check_threads(t).map_err(|e| anyhow::anyhow!("--threads {t}: {e}"))?;
    }
    if !root {
        // fusermount3 makes every ordinary user's mount nosuid,nodev.
        for (asked, name) in [(o.nosuid, "suid"), (o.nodev, "dev")] {
            if asked == Some(false) {
                bail!("{name}: a mount by an ordinary user is always no{name} (fusermount3)");
            }
        }
    }
    Measure::from_options(o).map(drop)
}

/// An image is a regular file or a block device: opening a FIFO would wait forever.
fn check_image_file(image: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata(image)
        .with_context(|| format!("image {}", image.display()))?
        .file_type();
    if !(t.is_file() || t.is_block_device()) {
        bail!("image {}: not a regular file", image.display());
    }
    Ok(())
}

fn descriptor_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// Every worker but the first holds its own /dev/fuse descriptor; they may take at most a
/// quarter of the descriptor limit, since a writable mount keeps one descriptor per upper
/// object the kernel has cached and starts dropping names at half the limit.
fn check_descriptor_budget(threads: usize) -> anyhow::Result<()> {
    let limit = descriptor_limit();
    let most = (limit / 4).max(1);
    if threads as u64 > most {
        bail!(
            "--threads {threads}: each worker takes a /dev/fuse descriptor, and with a \
             descriptor limit of {limit} (ulimit -n) a mount may have at most {most}"
        );
    }
    Ok(())
}

/// The fewest descriptors a writable mount works with: its nodes hold a descriptor per
/// upper object the kernel keeps, and past half the limit the reaper has the kernel drop
/// names, whose floor of 64 leaves too little below this. Storms of creations in one
/// directory need 1,024 (docs/SECURITY.md section 6), and each file held open pins two
/// more.
const MIN_WRITABLE_DESCRIPTORS: u64 = 256;
