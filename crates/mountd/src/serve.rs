//! The mount daemon: opens what the mount serves (the images, the upper and work
//! directories, the log file and the measurement list), builds the filesystem, and has
//! the plan (`imagefs::mount::Plan`) mount and serve it until unmounted. Each setup step
//! is announced to the waiting `verilay mount` before it starts.

use crate::measuring::{self, LayerId, Measure};
use crate::Mount;
use anyhow::Context;
use imagefs::measuring::{ExtraStats, Measuring};
use imagefs::mount::{self as plan, Reporter};
use opening::{Img, ReadOpts};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Sets up and serves mount `s` until it is unmounted, reporting each step to `report`
/// (the waiting `verilay mount`'s pipe, or stderr in the foreground): the exit status.
/// Call it before any thread exists (it reserves the descriptor table first).
pub fn serve(s: Mount, report: plan::Report, timeout: Duration) -> anyhow::Result<i32> {
    // First: no thread may exist yet (see there).
    plan::reserve_descriptor_table();
    let mut reporter = Reporter::open(report)?;
    report_panics(&s);
    match mount_and_serve(&s, &mut reporter, timeout) {
        Ok(()) => Ok(0),
        Err(e) => reporter.failed(e),
    }
}

/// What the images give the mount: the opened layers (top first), what each reports to
/// the policy, and `verilay stats` members for the remote ones.
struct Layers {
    images: Vec<Img>,
    /// Each image's verified source (the kernel engine serves these as files).
    verified: Vec<imagefs::imagefiles::Verified>,
    ids: Vec<LayerId>,
    extra: Option<ExtraStats>,
    /// How far each image is trusted ([`opening::Opened::trust`]), in the command's order.
    trust: Vec<String>,
    /// What opening them warned of ([`opening::Opened::warnings`]).
    warnings: Vec<String>,
}

fn mount_and_serve(s: &Mount, r: &mut Reporter, timeout: Duration) -> anyhow::Result<()> {
    // Held until this process exits (never closed before: the kernel lets go of it as
    // the process ends, after the list is closed), which is what `verilay umount` waits for.
    if let Some(fd) = plan::hold_mountpoint(&s.mountpoint) {
        std::mem::forget(fd);
    }
    r.step("open the images");
    let layers = open_layers(s, timeout, r)?;
    for (i, t) in layers.trust.iter().enumerate() {
        r.trust(i, t);
    }
    for w in &layers.warnings {
        r.warn(w);
    }
    let plan = s.plan(source(s), timeout);
    // Before anything in them is touched (the log file may be made, the list is): the
    // upper and work directories, checked, and locked for our life.
    let claim = match (&s.opts.upper, &s.opts.work) {
        (Some(u), Some(w)) => {
            r.step("claim the upper and work directories");
            Some(upper::Claim::take(u, w, &s.mountpoint, &outside_paths(s))?)
        }
        _ => None,
    };
    r.step("open the log file");
    let log = logger(s, r.on_stderr())?;
    let measure = s.measure()?;
    if s.engine.0 == mountopts::Engine::Kernel {
        return serve_kernel(s, &plan, layers, claim, log, measure.as_ref(), r);
    }
    match claim {
        Some(claim) => serve_writable(s, &plan, layers, claim, log, measure.as_ref(), r),
        None => serve_read_only(s, &plan, layers, log, measure.as_ref(), r),
    }
}

/// The most requests opening a remote image makes one after another (a token, the
/// manifest, signatures, the tail, the padding, the tree, the superblock and the first
/// metadata).
const REMOTE_OPEN_REQUESTS: u32 = 8;

/// How long the daemon's open of one remote image may take, for the starter's deadline:
/// each of its requests is tried up to [`remote::ATTEMPTS`] times, each try within
/// `--timeout`, and ends in its own error (naming the server and what failed) before
/// this runs out.
fn remote_open_budget(timeout: Duration) -> Duration {
    timeout * REMOTE_OPEN_REQUESTS * remote::ATTEMPTS + Duration::from_secs(1)
}

/// Opens every image of the mount (remote ones prefetching with `--prefetch`).
fn open_layers(s: &Mount, timeout: Duration, r: &mut Reporter) -> anyhow::Result<Layers> {
    let read_opts = ReadOpts {
        parallel_hashing: false,
        ..s.read_opts(timeout)
    };
    let mut layers = Layers {
        images: Vec::new(),
        verified: Vec::new(),
        ids: Vec::new(),
        extra: None,
        trust: Vec::new(),
        warnings: Vec::new(),
    };
    let mut remotes = Vec::new();
    for (image, pin) in s.images.iter().zip(&s.pins) {
        if opening::is_remote(image) {
            r.step_within(
                &format!("open {}", image.display()),
                remote_open_budget(timeout),
            );
        }
        let opened = opening::open(image, pin, false, &read_opts)?;
        layers.trust.push(opened.trust());
        layers.warnings.extend(opened.warnings.iter().cloned());
        layers.ids.push(LayerId {
            uuid: opened.img.superblock().uuid,
            digest: opened
                .verified
                .as_ref()
                .map(|v| v.digest().to_vec())
                .unwrap_or_default(),
        });
        if let Some(remote) = opened.remote {
            let progress = match (&opened.verified, s.opts.prefetch) {
                (Some(v), true) => Some(
                    remote::prefetch::start(remote.clone(), v.clone())
                        .context("starting the prefetch thread")?,
                ),
                _ => None,
            };
            remotes.push((remote, progress));
        }
        if let Some(v) = &opened.verified {
            layers.verified.push(v.clone());
        }
        layers.images.push(opened.img);
    }
    layers.extra = remote_stats(remotes);
    Ok(layers)
}

/// The source shown in mount tables: the images, top first, as overlayfs lists layers.
fn source(s: &Mount) -> String {
    s.images
        .iter()
        .map(|i| {
            std::fs::canonicalize(i)
                .unwrap_or_else(|_| i.clone())
                .display()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// The images under the claimed upper and work directories.
fn serve_writable(
    s: &Mount,
    plan: &plan::Plan,
    layers: Layers,
    mut claim: upper::Claim,
    log: imagefs::Logger,
    measure: Option<&Measure>,
    r: &mut Reporter,
) -> anyhow::Result<()> {
    r.step("empty the work directory");
    let dirs = (s.opts.upper.clone(), s.opts.work.clone());
    let upper = upper::Upper::open(&claim).with_context(|| {
        format!(
            "upper directory {} with work directory {}",
            dirs.0.unwrap_or_default().display(),
            dirs.1.unwrap_or_default().display()
        )
    })?;
    r.step("open the measurement list");
    let setup = measuring::setup(measure, &layers.ids, Some(upper.root()), &s.mountpoint)?;
    let measuring = setup.as_ref().map(|s| s.measuring.clone());
    r.step("read the root directories");
    let mut fs = imagefs::UnionFs::new(layers.images, upper, plan.source.clone(), log)
        .context("reading the root directories")?;
    if let Some(e) = layers.extra {
        fs.set_extra_stats(e);
    }
    if let Some(setup) = setup {
        fs.set_measuring(setup);
    }
    let mut record = |mp: &Path, dev: u64| {
        claim
            .mounted(mp, dev)
            .context("recording the mount in the work directory's lock")
    };
    let served = plan.serve(fs, r, Some(&mut record));
    // The directories are ours no longer once the kernel let go of the mount.
    drop(claim);
    finish_measuring(served, measuring)
}

/// The images by the kernel's erofs over the image files this daemon serves, and
/// overlayfs for a stack or under the claimed upper and work directories.
fn serve_kernel(
    s: &Mount,
    plan: &plan::Plan,
    layers: Layers,
    mut claim: Option<upper::Claim>,
    log: imagefs::Logger,
    measure: Option<&Measure>,
    r: &mut Reporter,
) -> anyhow::Result<()> {
    use imagefs::imagefiles::{ImageFile, ImageFiles, MetadataCheck};
    use imagefs::measuring::fanotify;
    // Opens are measured from fanotify's events, on as many threads as the mount serves
    // requests with.
    let dirs = match (&s.opts.upper, &s.opts.work, &claim) {
        (Some(u), Some(w), Some(c)) => Some(claimed_paths(u, w, c)?),
        _ => None,
    };
    // A writable mount's upper directory: its filesystem's identity is its files' (asked
    // by ioctl, which an O_PATH descriptor cannot take).
    let upper = match &dirs {
        Some((u, _)) => Some(
            rustix::fs::open(
                u.as_path(),
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .with_context(|| format!("upper directory {}", u.display()))?,
        ),
        None => None,
    };
    r.step("open the measurement list");
    let setup = measuring::setup(
        measure,
        &layers.ids,
        upper.as_ref().map(std::os::fd::AsFd::as_fd),
        &s.mountpoint,
    )?;
    let measuring = setup.as_ref().map(|s| s.measuring.clone());
    let mut stats: Vec<imagefs::stats::StatsSource> = Vec::new();
    if let Some(setup) = &setup {
        stats.push(Arc::new(setup.stats_source()));
    }
    stats.extend(layers.extra.clone());
    let log = Arc::new(log);
    let log_to = |log: &Arc<imagefs::Logger>| -> imagefs::Logger {
        let log = log.clone();
        Box::new(move |line: &str| log(line))
    };
    let mut front = setup.map(|setup| fanotify::Front {
        setup,
        images: layers.images,
        devices: Vec::new(),
        learnt: Default::default(),
        execs: Default::default(),
        mountpoint: std::fs::canonicalize(&s.mountpoint).unwrap_or_else(|_| s.mountpoint.clone()),
        log: log_to(&log),
        name: plan.source.clone(),
        upper,
        bits: Default::default(),
    });
    // Every image of a mount is opened verified (plain images are refused), so each
    // has its source.
    anyhow::ensure!(
        layers.verified.len() == s.images.len(),
        "the kernel engine serves verified images only"
    );
    let files = layers
        .verified
        .into_iter()
        .zip(&s.images)
        .map(|(source, image)| {
            // A remote image's metadata is checked as the kernel reads it, fetched as
            // the FUSE engine would fetch it.
            let check = if opening::is_remote(image) {
                MetadataCheck::AsRead
            } else {
                MetadataCheck::Whole
            };
            ImageFile::new(source, image.display().to_string(), check)
        })
        .collect();
    let dirs = dirs.as_ref().map(|(u, w)| (u.as_path(), w.as_path()));
    let threads = plan.threads;
    let mut before_attach = |root: std::os::fd::BorrowedFd<'_>, dev: u64, devices: &[u64]| {
        if let Some(c) = claim.as_mut() {
            c.mounted(&s.mountpoint, dev)
                .context("recording the mount in the work directory's lock")?;
        }
        if let Some(mut front) = front.take() {
            // A single image's erofs filesystem is this mount's alone: marked whole, so
            // opens through an overlayfs stacked on it (a container's, when the layer
            // store mounted it) are measured too, named as that overlay shows them. Its
            // files show its device. A stack's files show overlayfs's pseudo devices,
            // learnt as they come, and its mount is marked.
            let single = devices.len() == 1 && dirs.is_none();
            if single {
                front.devices = devices.to_vec();
            }
            // Only the opens the policy can measure raise events: with no rule for file
            // opens (only BPRM_CHECK), a read costs nothing.
            let kinds = front.kinds();
            if !kinds.is_empty() {
                let group = host::fanotify::Group::on_mount(root, single, &kinds)?;
                fanotify::start(group, front, threads).context("starting the fanotify threads")?;
            }
        }
        Ok(())
    };
    let mut files = ImageFiles::new(files, log_to(&log));
    for source in stats {
        files.add_stats(source);
    }
    let served = plan.serve_kernel(files, dirs, Some(&mut before_attach), r);
    // The directories are ours no longer once the kernel let go of the mount.
    drop(claim);
    finish_measuring(served, measuring)
}

/// The upper and work directories as overlayfs is told them: absolute (mount tables
/// show them as given, and other mounts' checks read them there), and still the
/// directories claimed (a path moved since names another directory: refused).
fn claimed_paths(
    upper: &Path,
    work: &Path,
    claim: &upper::Claim,
) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for ((name, dir), id) in [("upper", upper), ("work", work)]
        .into_iter()
        .zip(claim.ids())
    {
        let abs = std::fs::canonicalize(dir)
            .with_context(|| format!("{name} directory {}", dir.display()))?;
        let m = std::fs::metadata(&abs)
            .with_context(|| format!("{name} directory {}", abs.display()))?;
        anyhow::ensure!(
            (m.dev(), m.ino()) == id,
            "{name} directory {}: another directory since it was claimed",
            dir.display()
        );
        out.push(abs);
    }
    let work = out.pop().expect("two paths");
    Ok((out.pop().expect("two paths"), work))
}

/// The images alone, read-only.
fn serve_read_only(
    s: &Mount,
    plan: &plan::Plan,
    layers: Layers,
    log: imagefs::Logger,
    measure: Option<&Measure>,
    r: &mut Reporter,
) -> anyhow::Result<()> {
    r.step("open the measurement list");
    let setup = measuring::setup(measure, &layers.ids, None, &s.mountpoint)?;
    let measuring = setup.as_ref().map(|s| s.measuring.clone());
    r.step("read the root directories");
    let mut fs = imagefs::ImageFs::new(layers.images, plan.source.clone(), log)
        .context("reading the root directories")?;
    if s.images.iter().any(|i| opening::is_remote(i)) {
        fs.read_executables_whole();
    }
    if let Some(e) = layers.extra {
        fs.set_extra_stats(e);
    }
    if let Some(setup) = setup {
        fs.set_measuring(setup);
    }
    finish_measuring(plan.serve(fs, r, None), measuring)
}

/// A remote image of the mount, and its prefetch's progress if `--prefetch`.
type Remote = (
    Arc<remote::RemoteSource>,
    Option<Arc<remote::prefetch::Progress>>,
);

/// `verilay stats` members for the remote images' fetching and caching (summed over the
/// remote images), if any is remote.
fn remote_stats(remotes: Vec<Remote>) -> Option<ExtraStats> {
    use std::sync::atomic::Ordering::Relaxed;
    if remotes.is_empty() {
        return None;
    }
    Some(Arc::new(move || {
        let sum = |f: &dyn Fn(&Remote) -> u64| -> u64 { remotes.iter().map(f).sum() };
        let cache =
            |f: fn(&remote::cache::Cache) -> u64| move |(r, _): &Remote| r.cache().map_or(0, f);
        let prefetch = |f: fn(&remote::prefetch::Progress) -> u64| {
            move |(_, p): &Remote| p.as_deref().map_or(0, f)
        };
        let c = |(r, _): &Remote| r.counters.clone();
        let members = [
            ("remote_requests", sum(&|r| c(r).requests.load(Relaxed))),
            ("remote_bytes_fetched", sum(&|r| c(r).fetched.load(Relaxed))),
            ("remote_retries", sum(&|r| c(r).retries.load(Relaxed))),
            ("remote_failures", sum(&|r| c(r).failures.load(Relaxed))),
            (
                "remote_image_bytes",
                sum(&|(r, _)| erofs::read::ByteSource::len(&**r)),
            ),
            ("cache_bytes_verified", sum(&cache(|c| c.held()))),
            (
                "cache_bytes_served",
                sum(&cache(|c| c.served.load(Relaxed))),
            ),
            (
                "prefetch_bytes_done",
                sum(&prefetch(|p| p.done.load(Relaxed))),
            ),
            (
                "prefetch_bytes_total",
                sum(&prefetch(|p| p.total.load(Relaxed))),
            ),
            (
                "prefetch_failures",
                sum(&prefetch(|p| p.failures.load(Relaxed))),
            ),
        ];
        members
            .into_iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
            .collect()
    }))
}

/// The paths a mount uses besides its upper and work directories, which must not be in
/// either: the work directory's cleanup would delete them, the upper one would show them.
fn outside_paths(s: &Mount) -> Vec<(&'static str, &Path)> {
    let mut v: Vec<(&str, &Path)> = s
        .images
        .iter()
        .filter(|i| !opening::is_remote(i))
        .map(|i| ("image", i.as_path()))
        .collect();
    if let Some(log) = &s.opts.log {
        v.push(("log file", log));
    }
    if let Some(list) = &s.opts.measure_log {
        v.push(("measurement list", list));
    }
    v
}

/// Log lines go to the log file (`--log`), else stderr (foreground) or nowhere but syslog.
fn logger(s: &Mount, to_stderr: bool) -> anyhow::Result<imagefs::Logger> {
    let file = match &s.opts.log {
        Some(p) => Some(std::sync::Mutex::new(open_log(p)?)),
        None => None,
    };
    Ok(Box::new(move |line: &str| {
        // One line each, whatever a registry or an image put in it.
        let line = format!(
            "verilay[{}]: {}\n",
            std::process::id(),
            host::text::one_line(line)
        );
        if let Some(f) = &file {
            if let Ok(mut f) = f.lock() {
                let _ = f.write_all(line.as_bytes());
            }
        }
        if to_stderr {
            eprint!("{line}");
        }
        syslog(&line);
    }))
}

/// Opens the log file for appending: created 0600 if new, never through a symlink, and
/// refused unless it is a regular file no one else can write. Asked first by path, so a
/// FIFO is named as such (its write-only open would fail with ENXIO, not say why).
fn open_log(p: &Path) -> anyhow::Result<std::fs::File> {
    if std::fs::symlink_metadata(p).is_ok_and(|m| !m.is_file() && !m.is_symlink()) {
        anyhow::bail!("log file {}: not a regular file", p.display());
    }
    measure::files::open_private_append(p).with_context(|| format!("log file {}", p.display()))
}

/// One datagram to the system log socket, if there is one (priority: daemon.err).
fn syslog(line: &str) {
    if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
        let _ = s.send_to(format!("<27>{}", line.trim_end()).as_bytes(), "/dev/log");
    }
}

/// A detached daemon's stderr goes nowhere: a panic (a bug) is also said in the system
/// log and the log file, so a mount that vanished leaves a trace.
fn report_panics(s: &Mount) {
    let log = s.opts.log.clone();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let line = format!(
            "verilay[{}]: panic: {}\n",
            std::process::id(),
            info.to_string().replace('\n', " ")
        );
        syslog(&line);
        if let Some(p) = &log {
            if let Ok(mut f) = open_log(p) {
                let _ = f.write_all(line.as_bytes());
            }
        }
        default(info);
    }));
}

/// After the session: the measurement list is made durable (a clean unmount loses none).
fn finish_measuring<T>(served: T, measuring: Option<Arc<Measuring>>) -> T {
    if let Some(m) = measuring {
        if let Err(e) = m.close() {
            eprintln!("verilay: error: making the measurement list durable: {e}");
        }
    }
    served
}
