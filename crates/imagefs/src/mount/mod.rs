//! Mounting from a typed plan: [`Plan::serve`] mounts as the CLI's [`Plan`] says (mount(2)
//! as root, `fusermount3` otherwise: `kernel.rs`), starts the workers and serves until
//! unmounted. Once the kernel mount exists, a failing step unmounts it: a failed mount
//! leaves nothing. `daemon.rs`: a background daemon's setup report; `stats.rs`.

mod daemon;
mod engine;
pub use engine::{choose as choose_engine, BeforeAttach};
pub use mountopts::Engine;
mod kernel;
pub mod stats;

pub use daemon::{start as start_daemon, Ready, Report, Reporter};
pub use kernel::{
    detach_leftover, hold_mountpoint, is_mount_point, operand, raise_descriptor_limit,
    reserve_descriptor_table, unmount, wait_for_daemon,
};

use crate::fuse;
pub use crate::fuse::Transport;
pub use crate::ops::Access;
use crate::ops::Ops;
use anyhow::Context;
/// How long serving threads look for the next request unless told (`Plan::poll`).
pub use mountopts::Atime;
use signal_hook::iterator::Signals;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest wait any step may be given (a longer one counts as this).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// `timeout` from now (never overflowing).
pub fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout.min(MAX_TIMEOUT)).unwrap_or(now)
}

/// The generic mount options the kernel honours (each false: not asked for).
#[derive(Clone, Copy, Debug, Default)]
pub struct Flags {
    /// Setuid, setgid and file capabilities ignored (`nosuid`).
    pub nosuid: bool,
    /// Device files refused (`nodev`).
    pub nodev: bool,
    /// Programs not executed (`noexec`).
    pub noexec: bool,
    /// Writes synchronous (`sync`).
    pub sync: bool,
    /// Directory changes synchronous (`dirsync`).
    pub dirsync: bool,
    /// How access times are updated (`None`: the kernel's default).
    pub atime: Option<Atime>,
    /// Directories' access times not updated (`nodiratime`).
    pub nodiratime: bool,
    /// Times updated in memory only, written out lazily (`lazytime`).
    pub lazytime: bool,
    /// Symlinks not followed when paths are resolved (`nosymfollow`).
    pub nosymfollow: bool,
}

/// Told the new mount's path and device once it exists (a writable mount records itself
/// in its work directory's lock).
pub type Mounted<'a> = &'a mut dyn FnMut(&Path, u64) -> anyhow::Result<()>;

/// A mount, as the CLI fills it in.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The source mount tables show (the images, top first).
    pub source: String,
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Mounted read-write (an upper directory), else read-only.
    pub writable: bool,
    /// Generic mount options.
    pub flags: Flags,
    /// Who may use the mount.
    pub access: Access,
    /// Worker threads.
    pub threads: usize,
    /// How requests reach the workers: /dev/fuse, io_uring, or io_uring when the kernel
    /// offers it.
    pub transport: Transport,
    /// How long a serving thread looks for the next request before it sleeps
    /// (`fusewire::Config::poll`; `None`: the transport's default).
    pub poll: Option<Duration>,
    /// Mounted with mount(2) by root, else through fusermount3.
    pub as_root: bool,
    /// The longest each setup step may take.
    pub timeout: Duration,
    /// Why this engine serves the mount, for `verilay stats` ("asked for", …).
    pub engine_why: String,
}

/// `stats` with the engine that serves the mount, and why.
fn with_engine(
    stats: crate::stats::StatsSource,
    engine: &'static str,
    why: &str,
) -> crate::stats::StatsSource {
    let why = why.to_string();
    std::sync::Arc::new(move || {
        let mut s = stats();
        s.insert("engine".into(), engine.into());
        s.insert("engine_why".into(), why.clone().into());
        s
    })
}

/// How long a signalled daemon lets readers and open files finish before it aborts the
/// connection.
pub const SIGNAL_GRACE: Duration = Duration::from_secs(10);
/// How long after aborting the connection the daemon waits for its session to end.
pub const ABORT_GRACE: Duration = Duration::from_secs(5);

/// SIGTERM, SIGINT and SIGHUP, caught (each kept until taken) from the moment this returns.
fn caught_signals() -> anyhow::Result<Signals> {
    Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .context("installing signal handlers")
}

impl Plan {
    /// Mounts `fs` as planned and serves it until it is unmounted (by us on SIGTERM,
    /// SIGINT or SIGHUP, or by anyone). `report` hears of each step, and that the mount
    /// answers; `mounted`, if given, is told the new mount's device once it exists.
    pub fn serve<O: Ops>(
        &self,
        fs: O,
        report: &mut Reporter,
        mounted: Option<Mounted<'_>>,
    ) -> anyhow::Result<()> {
        let mp = &self.mountpoint;
        // Caught from before the mount exists: a signal while it is being set up is
        // acted on once it is (else its default action would leave the mount behind).
        let signals = caught_signals()?;
        report.step("mount");
        let (fd, guard) =
            kernel::mount(self).with_context(|| format!("mounting on {}", mp.display()))?;
        // The count is named here too: a daemon that runs out of memory while its threads
        // start is aborted by the allocator, and the caller then says only this step.
        report.step(&format!(
            "answer the kernel's first request and start {} workers",
            self.threads.max(1)
        ));
        let config = fuse::Config {
            access: self.access,
            workers: self.threads,
            transport: self.transport,
            poll: self.poll,
        };
        let stats = fs.stats();
        let session = fuse::Session::start(fs, fd, &config)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("talking to the kernel")?;
        kernel::raise_readahead(mp);
        if let Some(mounted) = mounted {
            use std::os::unix::fs::MetadataExt;
            let dev = std::fs::metadata(mp).context("the new mount")?.dev();
            mounted(mp, dev)?;
        }
        report.step("listen for verilay stats");
        let stats = with_engine(session.add_to_stats(stats), "fuse", &self.engine_why);
        let _stats = stats::Channel::start(mp, self.access, stats)?;
        report.step("act on signals");
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(mp).context("the new mount")?.dev();
        self.unmount_on_signals(signals, dev);
        // Serving: from here on the mount is the user's to unmount.
        guard.keep();
        report.ready(&session.transport().to_string());
        // Returns when the filesystem is unmounted (by us or anyone).
        session.join().context("serving")
    }

    /// SIGTERM, SIGINT and SIGHUP detach the mount: the session ends as soon as the
    /// kernel lets go of it, or [`SIGNAL_GRACE`] later whatever holds it (a file left
    /// open, a reader waiting on a registry): the connection is aborted, so every waiting
    /// and later request fails with ENOTCONN, and if the session still has not ended
    /// [`ABORT_GRACE`] after that, the daemon exits. `dev` is the mount's device.
    fn unmount_on_signals(&self, mut signals: Signals, dev: u64) {
        let mountpoint = self.mountpoint.clone();
        std::thread::spawn(move || {
            let Some(signal) = signals.forever().next() else {
                return;
            };
            let _ = kernel::unmount(&mountpoint, true);
            std::thread::sleep(SIGNAL_GRACE);
            let name = mountpoint.display();
            eprintln!(
                "verilay: {name}: still in use {}s after signal {signal}: aborting the connection",
                SIGNAL_GRACE.as_secs()
            );
            if let Err(e) = kernel::abort_connection(dev) {
                eprintln!("verilay: {name}: {e}");
            }
            std::thread::sleep(ABORT_GRACE);
            eprintln!("verilay: {name}: the session did not end: exiting");
            std::process::exit(1);
        });
    }
}
