//! `verilay mount IMAGE... MOUNTPOINT` (images stack, first on top) and `verilay umount`.
//!
//! - Flags and `-o` become one [`MountOptions`] value first (`settings`); all after works from
//!   it.
//! - Without `--foreground`, `mount` checks the images, starts the daemon and follows its setup
//!   until the mount answers or the daemon says why not.
//! - As `mount.fuse.verilay` it takes mount(8)'s arguments (`helper.rs`).

mod helper;

pub use helper::mount_helper;

use super::measuring::MeasureArgs;
use super::registry::Policy;
use anyhow::{bail, Context};
use imagefs::mount::{self as plan, operand, MAX_TIMEOUT};
use mountd::Mount;
use mountopts::{Engine, MountOptions, Transport};
use opening::Pin;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

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

/// Parses the command line into a checked [`Mount`].
fn settings(a: &Args) -> anyhow::Result<Mount> {
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
    let any_oci = opening::any_oci(&images);
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
    let m = Mount::new(images, mountpoint, pins, opts, root)?;
    // The daemon gets the options as one string: it must read back as the same value.
    if MountOptions::parse(m.opts.render().as_bytes()).as_ref() != Ok(&m.opts) {
        bail!("a path among the options holds a double quote or is empty: rename it");
    }
    Ok(m)
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

pub fn run(a: Args) -> anyhow::Result<i32> {
    let s = settings(&a)?;
    if let Some(fd) = a.ready_fd {
        return mountd::serve(s, plan::Report::Pipe(fd), a.timeout);
    }
    // A daemon opens the images again and says how far it trusts them: remote ones are
    // left to it (their every check is a round trip to the registry).
    let daemon = !(a.fake || a.foreground);
    let trust = s.preflight(a.timeout, !daemon)?;
    if a.fake {
        return Ok(0);
    }
    if a.foreground && !a.quiet {
        // Said before serving: in the foreground, serving ends only at unmount.
        announce(&s, &trust);
    }
    if a.foreground {
        return mountd::serve(s, plan::Report::Stderr, a.timeout);
    }
    let ready = spawn_daemon(&s, &a.digests, a.timeout)?;
    if !a.quiet {
        // What the daemon verified, where it said (it opened the images last).
        let trust: Vec<Option<String>> = trust
            .into_iter()
            .enumerate()
            .map(|(i, t)| ready.trust.get(&i).cloned().or(t))
            .collect();
        announce(&s, &trust);
        let (engine, why) = &s.engine;
        eprintln!(
            "{}: served over {}, {} engine ({why})",
            s.mountpoint.display(),
            ready.transport,
            engine.name()
        );
    }
    Ok(0)
}

/// One line per image: where it is mounted, and how far it is trusted.
fn announce(s: &Mount, trust: &[Option<String>]) {
    for (image, trust) in s.images.iter().zip(trust) {
        eprintln!(
            "{}: mounted on {}, every read verified, digest {}",
            image.display(),
            s.mountpoint.display(),
            trust
                .as_deref()
                .unwrap_or("unknown (the mount daemon did not say)")
        )
    }
}

/// Starts the daemon (this binary again) and follows its setup until the mount answers:
/// the transport it serves over.
fn spawn_daemon(s: &Mount, digests: &[String], timeout: Duration) -> anyhow::Result<plan::Ready> {
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
