//! The mount daemon: opens what the mount serves, mounts, starts the workers and serves
//! until unmounted.
//!
//! Setup is a list of steps, each announced to the waiting `verilay mount` before it
//! starts (`step …`, then `ok` or `error …`), so the parent can say which one stalled.
//! From the moment the kernel mount exists until the mount answers, a failing step
//! unmounts it again (`kernel::Mounted`): a failed mount leaves nothing behind.

use super::kernel;
use super::Settings;
use crate::cmd::image::{open_with, ReadOpts};
use crate::cmd::measuring::LayerId;
use anyhow::{bail, Context};
use imagefs::Ops;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the daemon reports its setup.
pub enum Report {
    /// The pipe `verilay mount` follows.
    Pipe(i32),
    /// `--foreground`: errors go to stderr as the command's own.
    Stderr,
}

/// One line on the pipe.
pub enum Message {
    Step(String),
    Ok,
    Error(String),
}

impl Message {
    pub fn parse(line: &str) -> Message {
        match line {
            "ok" => Message::Ok,
            l => match l.split_once(' ') {
                Some(("step", s)) => Message::Step(s.to_string()),
                Some(("error", e)) => Message::Error(e.to_string()),
                _ => Message::Error(format!("the mount daemon said {l:?}")),
            },
        }
    }
}

/// The daemon's side of the pipe.
struct Reporter(Option<std::fs::File>);

impl Reporter {
    fn step(&mut self, what: &str) {
        if let Some(f) = &mut self.0 {
            let _ = writeln!(f, "step {what}");
        }
    }
}

pub fn serve(s: Settings, report: Report, timeout: Duration) -> anyhow::Result<i32> {
    let pipe = match report {
        Report::Pipe(fd) => {
            // SAFETY: the parent passed this descriptor (its pipe's write end) on the
            // command line for us alone; nothing else in this process owns or closes it.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // Not for fusermount3 or anything else we start: the pipe's end must mean ours.
            rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC).context("ready pipe")?;
            // Our own session: the caller's terminal closing must not hang us up.
            let _ = rustix::process::setsid();
            Some(std::fs::File::from(fd))
        }
        Report::Stderr => None,
    };
    report_panics(&s);
    let mut reporter = Reporter(pipe);
    match mount_and_serve(&s, &mut reporter, timeout) {
        Ok(()) => Ok(0),
        Err(e) => match reporter.0 {
            Some(mut f) => {
                let _ = writeln!(f, "error {}", format!("{e:#}").replace('\n', " "));
                Ok(1)
            }
            None => Err(e),
        },
    }
}

fn mount_and_serve(s: &Settings, r: &mut Reporter, timeout: Duration) -> anyhow::Result<()> {
    // Held until this process exits (never closed before: the kernel lets go of it as
    // the process ends, after the list is closed), which is what `verilay umount` waits for.
    if let Some(fd) = kernel::hold_mountpoint(&s.mountpoint) {
        std::mem::forget(fd);
    }
    r.step("open the images");
    let read_opts = ReadOpts {
        parallel_hashing: false,
        ..s.read_opts(timeout)
    };
    let mut layers = Vec::new();
    let mut ids = Vec::new();
    let mut remotes = Vec::new();
    for (image, pin) in s.images.iter().zip(&s.pins) {
        let opened = open_with(image, pin, false, &read_opts)?;
        ids.push(LayerId {
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
                    remote::prefetch::start(
                        remote.clone(),
                        v.clone() as Arc<dyn erofs::read::ByteSource>,
                    )
                    .context("starting the prefetch thread")?,
                ),
                _ => None,
            };
            remotes.push((remote, progress));
        }
        layers.push(opened.img);
    }
    let extra = remote_stats(remotes);
    // The source shown in mount tables: the images, top first, as overlayfs lists layers.
    let name = s
        .images
        .iter()
        .map(|i| {
            std::fs::canonicalize(i)
                .unwrap_or_else(|_| i.clone())
                .display()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(":");
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
    let log = logger(s, r.0.is_none())?;
    let measure = s.measure();
    match (claim, &s.opts.upper, &s.opts.work) {
        (Some(mut claim), Some(u), Some(w)) => {
            r.step("empty the work directory");
            let upper = upper::Upper::open(&claim).with_context(|| {
                format!(
                    "upper directory {} with work directory {}",
                    u.display(),
                    w.display()
                )
            })?;
            r.step("open the measurement list");
            let setup =
                crate::cmd::measuring::setup(&measure, &ids, Some(upper.root()), &s.mountpoint)?;
            r.step("read the root directories");
            let mut fs = imagefs::union::UnionFs::new(layers, upper, name.clone(), log)
                .context("reading the root directories")?;
            if let Some(e) = &extra {
                fs.set_extra_stats(e.clone());
            }
            let measuring = setup.as_ref().map(|s| s.measuring.clone());
            if let Some(setup) = setup {
                fs.set_measuring(setup);
            }
            let slot = fs.notifier_slot();
            let fs = imagefs::Fuse::new(fs);
            let served = session(s, fs, name, slot, r, Some(&mut claim), timeout);
            // The directories are ours no longer once the kernel let go of the mount.
            drop(claim);
            finish_measuring(served, measuring)
        }
        _ => {
            r.step("open the measurement list");
            let setup = crate::cmd::measuring::setup(&measure, &ids, None, &s.mountpoint)?;
            r.step("read the root directories");
            let mut fs = imagefs::ImageFs::new(layers, name.clone(), log)
                .context("reading the root directories")?;
            if let Some(e) = &extra {
                fs.set_extra_stats(e.clone());
            }
            let measuring = setup.as_ref().map(|s| s.measuring.clone());
            if let Some(setup) = setup {
                fs.set_measuring(setup);
            }
            let slot = fs.notifier_slot();
            let fs = imagefs::Fuse::new(fs);
            finish_measuring(session(s, fs, name, slot, r, None, timeout), measuring)
        }
    }
}

/// A remote image of the mount, and its prefetch's progress if `--prefetch`.
type Remote = (
    Arc<remote::RemoteSource>,
    Option<Arc<remote::prefetch::Progress>>,
);

/// `verilay stats` members for the remote images' fetching and caching (summed over the
/// remote images), if any is remote.
fn remote_stats(remotes: Vec<Remote>) -> Option<imagefs::measuring::ExtraStats> {
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
        ];
        members
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect::<Vec<_>>()
            .join(",")
    }))
}

/// The paths a mount uses besides its upper and work directories, which must not be in
/// either: the work directory's cleanup would delete them, the upper one would show them.
fn outside_paths(s: &Settings) -> Vec<(&'static str, &Path)> {
    let mut v: Vec<(&str, &Path)> = s
        .images
        .iter()
        .filter(|i| !super::is_remote(i))
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
fn logger(s: &Settings, to_stderr: bool) -> anyhow::Result<imagefs::Logger> {
    let file = match &s.opts.log {
        Some(p) => Some(std::sync::Mutex::new(open_log(p)?)),
        None => None,
    };
    Ok(Box::new(move |line: &str| {
        let line = format!("verilay[{}]: {line}\n", std::process::id());
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
fn report_panics(s: &Settings) {
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
fn finish_measuring<T>(
    served: T,
    measuring: Option<std::sync::Arc<imagefs::measuring::Measuring>>,
) -> T {
    if let Some(m) = measuring {
        if let Err(e) = m.close() {
            eprintln!("verilay: error: making the measurement list durable: {e}");
        }
    }
    served
}

/// Mounts `fs` and serves it until unmounted; `fs` gets the session's notifier in
/// `notify`; `claim` records the mount once it exists.
fn session<F: fuser::Filesystem + Send + Sync + 'static>(
    s: &Settings,
    fs: F,
    name: String,
    notify: imagefs::ops::NotifierSlot,
    r: &mut Reporter,
    claim: Option<&mut upper::Claim>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let acl = if s.opts.allow_other {
        fuser::SessionACL::All
    } else if s.opts.allow_root {
        fuser::SessionACL::RootAndOwner
    } else {
        fuser::SessionACL::Owner
    };
    let threads = s.threads();
    let mut cfg = fuser::Config::default();
    cfg.acl = acl;
    cfg.n_threads = Some(threads);
    // Cloning the descriptor means opening /dev/fuse, which rootless may not be allowed
    // to; then the workers share the one descriptor fusermount3 gave us.
    cfg.clone_fd = s.root
        || rustix::fs::access(
            "/dev/fuse",
            rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
        )
        .is_ok();
    r.step("mount");
    let (fd, mounted) = kernel::mount(s, &name)
        .with_context(|| format!("mounting on {}", s.mountpoint.display()))?;
    r.step("answer the kernel's first request");
    let session =
        fuser::Session::from_fd(fs, fd, acl, cfg.clone()).context("talking to the kernel")?;
    let _ = notify.set(Box::new(session.notifier()));
    r.step(&format!("start {threads} workers"));
    let bg = session.spawn().context("starting the workers")?;
    let bg = wait_for_workers(bg, threads, timeout)?;
    kernel::raise_readahead(&s.mountpoint);
    if let Some(claim) = claim {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(&s.mountpoint)
            .context("the new mount")?
            .dev();
        claim
            .mounted(&s.mountpoint, dev)
            .context("recording the mount in the work directory's lock")?;
    }
    r.step("install signal handlers");
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .context("installing signal handlers")?;
    let mountpoint = s.mountpoint.clone();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            // Detach: the session ends as soon as the kernel lets go of it.
            let _ = kernel::unmount(&mountpoint, true);
        }
    });
    // Serving: from here on the mount is the user's to unmount.
    mounted.keep();
    if let Some(mut f) = r.0.take() {
        let _ = f.write_all(b"ok\n");
    }
    // Returns when the filesystem is unmounted (by us or anyone).
    let _ = bg.join();
    Ok(())
}

/// Waits until all `n` workers run: fuser clones every /dev/fuse descriptor, then starts
/// the threads one by one, and its session thread ends with the error if any of that
/// fails (with the workers started so far left serving, which unmounting stops).
fn wait_for_workers(
    bg: fuser::BackgroundSession,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<fuser::BackgroundSession> {
    let deadline = super::deadline_after(timeout);
    loop {
        if bg.guard.is_finished() {
            let e = match bg.join() {
                Err(e) => format!("{e}"),
                Ok(()) => "the session ended".into(),
            };
            bail!("starting {n} workers: {e}");
        }
        if running_workers() >= n {
            return Ok(bg);
        }
        if Instant::now() >= deadline {
            bail!("starting {n} workers: not all running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The threads of this process named as fuser names its workers (`fuser-N`).
fn running_workers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| {
                c.trim_end()
                    .strip_prefix("fuser-")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .count()
}
