//! `verilay mount IMAGE... MOUNTPOINT` (several images stack, first on top, with overlayfs's
//! rules) and `verilay umount MOUNTPOINT`.
//!
//! - Flags and `-o` options become one [`MountOptions`] value first (`settings`); all after
//!   works from it.
//! - Without `--foreground`, `mount` checks the images (and pins) itself, then starts the
//!   daemon (this binary, the options rendered as one `-o`) and follows its setup
//!   (`imagefs::mount::start_daemon`) until the mount answers or the daemon says why not.
//! - The daemon (`daemon.rs`) opens what the mount serves into an `imagefs::mount::Plan`,
//!   which mounts and serves it.
//! - As `mount.fuse.verilay`, this binary takes mount(8)'s arguments (`helper.rs`).

mod daemon;
mod helper;

pub use helper::mount_helper;

use super::image::{open_with, Pin, ReadOpts};
use super::measuring::{HashName, MeasureArgs};
use super::registry::Policy;
use anyhow::{bail, Context};
use imagefs::mount::{self as plan, operand, MAX_TIMEOUT};
use mountopts::{check_threads, Engine, MountOptions, Transport};
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use upper::overlay::MAX_LAYERS;

#[derive(clap::Args, Clone, Default)]
pub struct Args {
    /// Images, top layer first, then the mountpoint.
    #[arg(required = true, value_name = "IMAGE... MOUNTPOINT")]
    paths: Vec<PathBuf>,
    /// Refuse the images unless their digests are these (`sha256:HEX`): one per image, in
    /// the same order.
    #[arg(long = "digest", value_name = "ALG:HEX")]
    digests: Vec<String>,
    /// Mount options, comma-separated (repeatable): ro, rw, nosuid, nodev, noexec, sync,
    /// dirsync, noatime, relatime, strictatime, nodiratime, lazytime, nosymfollow,
    /// allow_other, allow_root (root mounts only: root alone, as without it), and
    /// verilay's own digest=, threads=, transport=, log=, upper=, work=, policy=,
    /// measure_log=, measure_hash=, signature_policy=, registries_d=.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<OsString>,
    /// Worker threads that serve requests (default: one per CPU; at most 1024). Over
    /// /dev/fuse each reads from a descriptor of its own; over io_uring they are spread
    /// over the CPUs' queues, at least 2 each.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// What serves the mount (`-o engine=`): `kernel` (the kernel's erofs over image
    /// files verilay serves and verifies, overlayfs for stacks and --upper, measurement
    /// through fanotify; root in the first user namespace),
    /// `fuse` (verilay's own filesystem over FUSE), or `auto` (`kernel` when it can serve
    /// the mount and no image is remote, else `fuse`; the default, or $VERILAY_ENGINE). A
    /// kernel-engine mount is like `mount -t erofs`: every user reads it as the files'
    /// modes allow.
    #[arg(long, value_name = "auto|kernel|fuse", value_parser = Engine::parse)]
    engine: Option<Engine>,
    /// How requests reach the daemon (`-o transport=`): `uring` (FUSE over io_uring, or
    /// no mount), `dev` (/dev/fuse), or `auto` (io_uring when the kernel offers it, else
    /// /dev/fuse; the default, or $VERILAY_TRANSPORT). io_uring needs Linux 6.14+ and
    /// `echo Y > /sys/module/fuse/parameters/enable_uring`.
    #[arg(long, value_name = "auto|uring|dev", value_parser = Transport::parse)]
    transport: Option<Transport>,
    /// How long, in µs, a thread that has served a request keeps looking for the next
    /// one before it sleeps (`-o poll_us=`; default 50 over io_uring and 0 over
    /// /dev/fuse, at most 10000, 0: sleep at once).
    /// A caller waiting for each reply then finds it awake instead of waking it (tens of
    /// µs on a virtual machine whose idle CPUs halt); the thread yields its CPU meanwhile.
    /// Over io_uring every thread keeps looking while any got a request within that time.
    #[arg(long, value_name = "N", value_parser = parse_poll_us)]
    poll_us: Option<u64>,
    /// Serve in the foreground, logging to stderr, until unmounted.
    #[arg(short, long)]
    foreground: bool,
    /// Append log lines (integrity failures, with the file and offset) to this file.
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// No line on stderr once mounted.
    #[arg(short, long)]
    quiet: bool,
    /// Let other users use the mount (`-o allow_other`). Without it only the mounting
    /// user can, root included: a root mount is root's alone. Rootless, it needs
    /// user_allow_other in /etc/fuse.conf.
    #[arg(long)]
    allow_other: bool,
    /// Remote images (`oci://`) over plain HTTP: only from a registry on this machine
    /// (`-o insecure`).
    #[arg(long)]
    insecure: bool,
    /// Keep remote images' verified bytes in DIR, for later mounts (`-o cache=`; default
    /// $VERILAY_CACHE, else /var/cache/verilay for root, else ~/.cache/verilay; a default
    /// one that cannot be used is skipped with a warning).
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// Keep remote images' bytes in memory only (`-o nocache`).
    #[arg(long)]
    no_cache: bool,
    /// The cache directory's size limit (`-o cache_size=`; bytes, or K, M, G, T; default
    /// 10G): unused images are removed, least recently used first, to make room.
    #[arg(long, value_name = "SIZE", value_parser = mountopts::parse_size)]
    cache_size: Option<u64>,
    /// Fetch the rest of each remote image into the cache in the background, yielding to
    /// reads (`-o prefetch`; progress in `verilay stats`).
    #[arg(long)]
    prefetch: bool,
    /// A writable upper directory over the images, with overlayfs's semantics (copy-up,
    /// whiteouts); kernel overlayfs can mount the same directory. Needs --work.
    #[arg(long, value_name = "DIR")]
    upper: Option<PathBuf>,
    /// An empty directory on the same mount as --upper and outside it, for atomic
    /// copy-up; it is locked while mounted. It may hold only what verilay (verilay.lock,
    /// verilay/, emptied at every mount) or kernel overlayfs (work/, index/) made there;
    /// anything else is refused, never deleted.
    #[arg(long, value_name = "DIR")]
    work: Option<PathBuf>,
    /// Seconds to wait for each step of the daemon's setup before giving up (at most a
    /// day: more counts as a day), and for each request to a remote image's server (a
    /// read tries three times before it is EIO).
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = parse_timeout)]
    timeout: Duration,
    #[command(flatten)]
    measure: MeasureArgs,
    // The signature policy `oci://` images' manifests must satisfy (also `-o
    // signature_policy=`, `-o registries_d=`); `http(s)://` images have no manifest.
    #[command(flatten)]
    signature: Policy,
    /// Internal: the pipe to report the daemon's setup on.
    #[arg(long, hide = true)]
    ready_fd: Option<i32>,
    /// Invoked by mount(8), which says `rw` unless told `ro`.
    #[arg(skip)]
    from_mount8: bool,
    /// mount(8)'s `-f`: check everything, mount nothing.
    #[arg(skip)]
    fake: bool,
}

/// The cache directory's size limit unless `--cache-size` says otherwise.
const DEFAULT_CACHE_SIZE: u64 = 10 << 30;

/// A positive number of seconds, capped at [`MAX_TIMEOUT`].
fn parse_poll_us(s: &str) -> Result<u64, String> {
    let n = s
        .parse()
        .map_err(|_| format!("{s}: not a number of microseconds"))?;
    mountopts::check_poll_us(n)
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        // Also false for NaN.
        Ok(f) if f > 0.0 => Ok(Duration::try_from_secs_f64(f)
            .unwrap_or(MAX_TIMEOUT)
            .min(MAX_TIMEOUT)),
        _ => Err(format!("{s}: not a positive number of seconds")),
    }
}

#[derive(clap::Args)]
pub struct UmountArgs {
    mountpoint: PathBuf,
    /// Detach now and finish when the mount is no longer busy (returns at once, without
    /// waiting for the daemon).
    #[arg(short = 'l', long)]
    lazy: bool,
    /// Seconds to wait for the mount's daemon to finish (its measurement list closed)
    /// and exit.
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = parse_timeout)]
    timeout: Duration,
}

/// What a mount is made from: the images, the mountpoint and every option, checked.
#[derive(Clone)]
struct Settings {
    images: Vec<PathBuf>,
    mountpoint: PathBuf,
    pins: Vec<Pin>,
    opts: MountOptions,
    root: bool,
    /// The signature policy `oci://` images must satisfy, loaded once (`None`: none).
    trust: Option<Arc<signatures::Trust>>,
    /// The engine that serves the mount (never `Auto`), and why it was chosen.
    engine: (Engine, String),
}

impl Settings {
    /// Writable: an upper directory and no `ro`.
    fn writable(&self) -> bool {
        self.opts.upper.is_some() && self.opts.read_only != Some(true)
    }

    /// The mount as `imagefs::mount` carries it out (`source`: what mount tables show).
    fn plan(&self, source: String, timeout: Duration) -> plan::Plan {
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

    fn threads(&self) -> usize {
        self.opts
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .min(mountopts::MAX_THREADS)
    }

    /// How the images are read (remote ones: plain HTTP when asked, and each request
    /// bounded by `timeout` in all).
    fn read_opts(&self, timeout: Duration) -> ReadOpts {
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

    fn measure(&self) -> MeasureArgs {
        MeasureArgs {
            policy: self.opts.policy.clone(),
            measure_log: self.opts.measure_log.clone(),
            measure_hash: HashName(
                self.opts
                    .measure_hash
                    .clone()
                    .unwrap_or_else(|| "sha256".into()),
            ),
        }
    }
}

/// Folds a flag into the options; a flag and an `-o` option for the same thing must not
/// both be given.
fn fold<T: Clone>(slot: &mut Option<T>, flag: &Option<T>, name: &str) -> anyhow::Result<()> {
    if let Some(v) = flag {
        if slot.is_some() {
            bail!(
                "--{name} and -o {}= both given: give one",
                name.replace(['-', '.'], "_")
            );
        }
        *slot = Some(v.clone());
    }
    Ok(())
}

/// Parses and checks the command line into [`Settings`].
fn settings(a: &Args) -> anyhow::Result<Settings> {
    if a.paths.len() < 2 {
        bail!("give one or more images, then the mountpoint");
    }
    let mut opts = MountOptions::default();
    for o in &a.options {
        opts.apply(o.as_bytes())?;
    }
    fold(&mut opts.threads, &a.threads, "threads")?;
    fold(&mut opts.transport, &a.transport, "transport")?;
    fold(&mut opts.poll_us, &a.poll_us, "poll-us")?;
    if opts.transport.is_none() {
        opts.transport = transport_from_env()?;
    }
    fold(&mut opts.engine, &a.engine, "engine")?;
    if opts.engine.is_none() {
        opts.engine = from_env("VERILAY_ENGINE", Engine::parse)?;
    }
    fold(&mut opts.log, &a.log, "log")?;
    fold(&mut opts.cache, &a.cache, "cache")?;
    fold(&mut opts.cache_size, &a.cache_size, "cache-size")?;
    opts.nocache |= a.no_cache;
    opts.prefetch |= a.prefetch;
    fold(&mut opts.upper, &a.upper, "upper")?;
    fold(&mut opts.work, &a.work, "work")?;
    fold(&mut opts.policy, &a.measure.policy, "policy")?;
    fold(&mut opts.measure_log, &a.measure.measure_log, "measure-log")?;
    if opts.measure_hash.is_none() {
        opts.measure_hash = Some(a.measure.measure_hash.0.clone());
    }
    fold(
        &mut opts.signature_policy,
        &a.signature.signature_policy,
        "signature-policy",
    )?;
    fold(
        &mut opts.registries_d,
        &a.signature.registries_d,
        "registries.d",
    )?;
    opts.allow_other |= a.allow_other;
    opts.insecure |= a.insecure;
    if a.from_mount8 && opts.upper.is_none() && opts.read_only == Some(false) {
        // mount(8)'s implicit `rw`: images alone mount read-only, as `mount -t erofs` does.
        opts.read_only = None;
    }
    let images = a.paths[..a.paths.len() - 1].to_vec();
    let mountpoint = a.paths[a.paths.len() - 1].clone();
    let pins = pins(&a.digests, opts.digest.as_deref(), images.len())?;
    if opts.prefetch && !images.iter().any(|i| is_remote(i)) {
        bail!("prefetch: no image is remote (oci://, http://, https://)");
    }
    let any_oci = images
        .iter()
        .any(|i| i.to_str().is_some_and(|s| s.starts_with("oci://")));
    if any_oci && opts.signature_policy.is_none() && a.ready_fd.is_none() {
        // The daemon opens the images again: it is told the default policy file this
        // process found, so one removed meanwhile is an error there, not "no policy".
        let default = signatures::Policy::default_path();
        // Only a policy that is not there is none (an unreadable one fails the mount).
        if std::fs::symlink_metadata(&default).is_ok() {
            opts.signature_policy = Some(default);
        }
    }
    let root = rustix::process::geteuid().is_root();
    check(&opts, root)?;
    // The daemon, given the same options, decides the same way, for the same reason.
    let engine = choose_engine(&opts, root)?;
    // The daemon gets the options as one string: it must read back as the same value.
    if MountOptions::parse(opts.render().as_bytes()).as_ref() != Ok(&opts) {
        bail!("a path among the options holds a double quote or is empty: rename it");
    }
    // Loaded before the mountpoint or any image is looked at (a FIFO or a GPG
    // requirement fails at once); a policy named is read even when no image is `oci://`,
    // so a bad one never passes unnoticed.
    let trust = if any_oci || opts.signature_policy.is_some() {
        let policy = Policy {
            signature_policy: opts.signature_policy.clone(),
            registries_d: opts.registries_d.clone(),
        };
        policy.load()?.map(Arc::new)
    } else {
        None
    };
    Ok(Settings {
        images,
        mountpoint,
        pins,
        opts,
        root,
        trust,
        engine,
    })
}

/// `$VERILAY_TRANSPORT`, the transport of mounts that do not name one.
fn transport_from_env() -> anyhow::Result<Option<Transport>> {
    from_env("VERILAY_TRANSPORT", Transport::parse)
}

/// The value of `$NAME` (unset or empty: none).
fn from_env<T>(name: &str, parse: fn(&str) -> Result<T, String>) -> anyhow::Result<Option<T>> {
    match std::env::var(name) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => parse(&v)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{name}={e}")),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => bail!("{name}: not UTF-8"),
    }
}

/// The engine that serves a mount with options `o` (`root`: the caller is root), and
/// why: `kernel` asked for a mount it cannot serve is an error naming what is missing.
fn choose_engine(o: &MountOptions, root: bool) -> anyhow::Result<(Engine, String)> {
    let asked = o.engine.unwrap_or(Engine::Auto);
    if asked == Engine::Fuse {
        return Ok((Engine::Fuse, "asked for".into()));
    }
    let unserved = if !root || !host::mounts::in_first_user_namespace() {
        Some("erofs mounts need root (in the first user namespace)".to_string())
    } else {
        host::mounts::file_backed_erofs().err()
    };
    match (asked, unserved) {
        (Engine::Kernel, Some(why)) => bail!("engine=kernel: {why}"),
        (Engine::Kernel, None) => Ok((Engine::Kernel, "asked for".into())),
        (_, Some(why)) => Ok((Engine::Fuse, why)),
        (_, None) => Ok((
            Engine::Kernel,
            "root, and the kernel has file-backed erofs".into(),
        )),
    }
}

/// The `--digest` pin of each image, or `-o digest=` for a single image.
fn pins(digests: &[String], option: Option<&str>, n: usize) -> anyhow::Result<Vec<Pin>> {
    let pin = |d: &str| Pin {
        digest: Some(d.to_string()),
        ..Pin::default()
    };
    match (digests.len(), option) {
        (0, None) => Ok(vec![Pin::default(); n]),
        (0, Some(d)) if n == 1 => Ok(vec![pin(d)]),
        (0, Some(_)) => bail!("-o digest= pins one image: give --digest once per image"),
        (_, Some(_)) => bail!("--digest and -o digest= both given: give one"),
        (d, None) if d == n => Ok(digests.iter().map(|d| pin(d)).collect()),
        (d, None) => bail!("{d} --digest for {n} images: give one per image, in order, or none"),
    }
}

/// The combinations of options that cannot be honoured.
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
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let s = settings(&a)?;
    if let Some(fd) = a.ready_fd {
        return daemon::serve(s, plan::Report::Pipe(fd), a.timeout);
    }
    let trust = preflight(&s, a.timeout)?;
    if a.fake {
        return Ok(0);
    }
    if a.foreground && !a.quiet {
        // Said before serving: in the foreground, serving ends only at unmount.
        announce(&s, &trust);
    }
    if a.foreground {
        return daemon::serve(s, plan::Report::Stderr, a.timeout);
    }
    let transport = spawn_daemon(&s, &a.digests, a.timeout)?;
    if !a.quiet {
        announce(&s, &trust);
        let (engine, why) = &s.engine;
        eprintln!(
            "{}: served over {transport}, {} engine ({why})",
            s.mountpoint.display(),
            engine.name()
        );
    }
    Ok(0)
}

fn announce(s: &Settings, trust: &[String]) {
    for (image, trust) in s.images.iter().zip(trust) {
        eprintln!(
            "{}: mounted on {}, every read verified, digest {trust}",
            image.display(),
            s.mountpoint.display()
        )
    }
}

/// Everything that can be checked before a daemon exists, so its errors come out here.
/// Returns how far each image is trusted ("sha256:… (pinned)" or "… (not pinned)").
fn preflight(s: &Settings, timeout: Duration) -> anyhow::Result<Vec<String>> {
    let mp = s.mountpoint.display();
    if s.images.len() > MAX_LAYERS {
        bail!(
            "{} images: at most {MAX_LAYERS} can be stacked",
            s.images.len()
        );
    }
    let meta = std::fs::metadata(&s.mountpoint).with_context(|| format!("mountpoint {mp}"))?;
    if !meta.is_dir() {
        bail!("mountpoint {mp}: not a directory");
    }
    if plan::is_mount_point(&s.mountpoint)? {
        bail!("mountpoint {mp}: something is already mounted there");
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse does not exist: load the fuse module (modprobe fuse) or give the container the device");
    }
    for image in s.images.iter().filter(|i| !is_remote(i)) {
        check_image_file(image)?;
    }
    s.measure().check()?;
    // The daemon inherits the limit raised here.
    plan::raise_descriptor_limit();
    if s.writable() {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        if limit < MIN_WRITABLE_DESCRIPTORS {
            bail!(
                "a writable mount needs at least {MIN_WRITABLE_DESCRIPTORS} descriptors (ulimit -n; 1024 for storms of creations in one directory, and 4 more for each file kept open through it at once), and this process may have {limit}: with fewer, creations stall for seconds and fail with EMFILE; raise ulimit -n"
            );
        }
    }
    check_descriptor_budget(s.threads())?;
    // Opening checks the verity section, the pinned digest and the superblock.
    s.images
        .iter()
        .zip(&s.pins)
        .map(|(image, pin)| Ok(open_with(image, pin, false, &s.read_opts(timeout))?.trust()))
        .collect()
}

/// Whether an image operand is a remote image (`oci://`, `http(s)://`), not a file.
pub fn is_remote(image: &Path) -> bool {
    image.to_str().is_some_and(remote::is_remote)
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

/// Every worker but the first holds its own /dev/fuse descriptor; they may take at most a
/// quarter of the descriptor limit, since a writable mount keeps one descriptor per upper
/// object the kernel has cached and starts dropping names at half the limit.
fn check_descriptor_budget(threads: usize) -> anyhow::Result<()> {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let most = (limit / 4).max(1);
    if threads as u64 > most {
        bail!(
            "--threads {threads}: each worker takes a /dev/fuse descriptor, and with a \
             descriptor limit of {limit} (ulimit -n) a mount may have at most {most}"
        );
    }
    Ok(())
}

/// The fewest descriptors a writable mount works with. Its nodes hold a descriptor per
/// upper object the kernel keeps, and past half the limit the reaper has the kernel drop
/// names, which waits for the directories callers hold. At 256 a tree of thousands of
/// files is still written whole (`upper.rs`:
/// `a_tree_of_more_objects_than_descriptors_is_written_whole`); below, the reaper's
/// floor of 64 leaves too little. Storms of creations in one directory need 1,024
/// (docs/SECURITY.md section 6), and each file held open pins two more.
const MIN_WRITABLE_DESCRIPTORS: u64 = 256;

/// Starts the daemon (this binary again) and follows its setup until the mount answers:
/// the transport it serves over.
fn spawn_daemon(s: &Settings, digests: &[String], timeout: Duration) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("finding the verilay binary")?;
    plan::start_daemon(&s.mountpoint, timeout, |ready_fd| {
        let mut cmd = Command::new(exe);
        // Nothing the user named can read as a flag to the daemon (an image called
        // `-oallow_other`): paths never start with `-`, values are attached to their
        // flags. (The paths stay first: `verilay mount IMAGE... MNT --ready-fd N` is how
        // tools find a mount's daemon.)
        cmd.arg("mount")
            .args(s.images.iter().map(|i| operand(i)))
            .arg(operand(&s.mountpoint))
            .arg("--ready-fd")
            .arg(ready_fd.to_string())
            .arg(format!("--timeout={}", timeout.as_secs_f64()));
        let rendered = s.opts.render();
        if !rendered.is_empty() {
            let mut o = OsString::from("-o");
            o.push(rendered);
            cmd.arg(o);
        }
        for d in digests {
            cmd.arg(format!("--digest={d}"));
        }
        cmd
    })
}

pub fn run_umount(a: UmountArgs) -> anyhow::Result<i32> {
    plan::unmount(&a.mountpoint, a.lazy)?;
    if !a.lazy {
        // "The daemon exits": once this returns, its measurement list is closed.
        plan::wait_for_daemon(&a.mountpoint, a.timeout)?;
    }
    Ok(0)
}
