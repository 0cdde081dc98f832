//! `verilay mount IMAGE... MOUNTPOINT` and `verilay umount MOUNTPOINT`.
//!
//! Several images are stacked, first on top, with overlayfs's rules.
//!
//! Without `--foreground`, `mount` checks the image (and its pinned digest) itself, then
//! starts the daemon (this binary again, in the foreground, in its own session) and waits
//! on a pipe until the daemon says the mount answers requests, or why it could not mount.
//! The daemon serves until the filesystem is unmounted, or unmounts it on SIGTERM,
//! SIGINT or SIGHUP. As root it mounts with mount(2); otherwise through `fusermount3`.

use super::image::{open, open_with, Pin, ReadOpts};
use super::measuring::{LayerId, MeasureArgs};
use anyhow::{bail, Context};
use imagefs::stack::MAX_LAYERS;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Images, top layer first, then the mountpoint.
    #[arg(required = true, value_name = "IMAGE... MOUNTPOINT")]
    paths: Vec<PathBuf>,
    /// Refuse the images unless their digests are these (`sha256:HEX`): one per image, in
    /// the same order.
    #[arg(long = "digest", value_name = "ALG:HEX")]
    digests: Vec<String>,
    /// Worker threads, each on its own /dev/fuse descriptor (default: one per CPU).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Serve in the foreground, logging to stderr, until unmounted.
    #[arg(short, long)]
    foreground: bool,
    /// Append log lines (integrity failures, with the file and offset) to this file.
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// No line on stderr once mounted.
    #[arg(short, long)]
    quiet: bool,
    /// Let other users access a rootless mount (needs user_allow_other in /etc/fuse.conf);
    /// root mounts always allow them.
    #[arg(long)]
    allow_other: bool,
    /// A writable upper directory over the images, with overlayfs's semantics (copy-up,
    /// whiteouts); kernel overlayfs can mount the same directory. Needs --work.
    #[arg(long, value_name = "DIR", requires = "work")]
    upper: Option<PathBuf>,
    /// An empty directory on the same filesystem as --upper, for atomic copy-up.
    #[arg(long, value_name = "DIR", requires = "upper")]
    work: Option<PathBuf>,
    #[command(flatten)]
    measure: MeasureArgs,
    /// Internal: the pipe to report readiness on.
    #[arg(long, hide = true)]
    ready_fd: Option<i32>,
}

#[derive(clap::Args)]
pub struct UmountArgs {
    mountpoint: PathBuf,
    /// Detach now and finish when the mount is no longer busy.
    #[arg(short = 'l', long)]
    lazy: bool,
}

impl Args {
    fn images(&self) -> &[PathBuf] {
        &self.paths[..self.paths.len() - 1]
    }

    fn mountpoint(&self) -> &Path {
        &self.paths[self.paths.len() - 1]
    }

    /// The `--digest` pin of each image.
    fn pins(&self) -> anyhow::Result<Vec<Pin>> {
        let n = self.images().len();
        match self.digests.len() {
            0 => Ok(vec![Pin::default(); n]),
            d if d == n => Ok(self
                .digests
                .iter()
                .map(|d| Pin {
                    digest: Some(d.clone()),
                })
                .collect()),
            d => bail!("{d} --digest for {n} images: give one per image, in order, or none"),
        }
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let trust = preflight(&a)?;
    let announce = a.ready_fd.is_none() && !a.quiet;
    let say = || {
        for (image, trust) in a.images().iter().zip(&trust) {
            eprintln!(
                "{}: mounted on {}, every read verified, digest {trust}",
                image.display(),
                a.mountpoint().display()
            )
        }
    };
    // Raised here, before any daemon exists, which inherits it.
    if a.ready_fd.is_none() {
        raise_descriptor_limit();
    }
    if a.foreground || a.ready_fd.is_some() {
        // Said before serving: in the foreground, serving ends only at unmount.
        if announce {
            say();
        }
        return serve(a);
    }
    let code = spawn_daemon(&a)?;
    if announce {
        say();
    }
    Ok(code)
}

/// Everything that can be checked before a daemon exists, so its errors come out here.
/// Returns how far each image is trusted ("sha256:… (pinned)" or "… (not pinned)").
fn preflight(a: &Args) -> anyhow::Result<Vec<String>> {
    if a.paths.len() < 2 {
        bail!("give one or more images, then the mountpoint");
    }
    let mp = a.mountpoint().display();
    if a.images().len() > MAX_LAYERS {
        bail!(
            "{} images: at most {MAX_LAYERS} can be stacked",
            a.images().len()
        );
    }
    let pins = a.pins()?;
    let meta = std::fs::metadata(a.mountpoint()).with_context(|| format!("mountpoint {mp}"))?;
    if !meta.is_dir() {
        bail!("mountpoint {mp}: not a directory");
    }
    if is_mount_point(a.mountpoint())? {
        bail!("mountpoint {mp}: something is already mounted there");
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse does not exist: load the fuse module (modprobe fuse) or give the container the device");
    }
    if a.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    a.measure.check()?;
    // Opening checks the verity section, the pinned digest and the superblock.
    a.images()
        .iter()
        .zip(&pins)
        .map(|(image, pin)| Ok(open(image, pin, false)?.trust()))
        .collect()
}

/// Whether `path` is the mount point of some mount (per /proc/self/mountinfo).
fn is_mount_point(path: &Path) -> anyhow::Result<bool> {
    let canon = std::fs::canonicalize(path)?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    Ok(info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|m| Path::new(&unescape(m)) == canon)
    }))
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let (b'\\', Some(d)) = (b[i], octal) {
            out.push(((d[0] - b'0') << 6) | ((d[1] - b'0') << 3) | (d[2] - b'0'));
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn spawn_daemon(a: &Args) -> anyhow::Result<i32> {
    let (read_end, write_end) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).context("pipe")?;
    // The daemon inherits the write end only.
    rustix::io::fcntl_setfd(&write_end, rustix::io::FdFlags::empty()).context("pipe")?;
    let exe = std::env::current_exe().context("finding the verilay binary")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .args(&a.paths)
        .arg("--ready-fd")
        .arg(write_end.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for d in &a.digests {
        cmd.arg("--digest").arg(d);
    }
    if let (Some(u), Some(w)) = (&a.upper, &a.work) {
        cmd.arg("--upper").arg(u).arg("--work").arg(w);
    }
    if let Some(t) = a.threads {
        cmd.arg("--threads").arg(t.to_string());
    }
    if let Some(l) = &a.log {
        cmd.arg("--log").arg(l);
    }
    if a.allow_other {
        cmd.arg("--allow-other");
    }
    cmd.args(a.measure.to_args());
    let mut child = cmd.spawn().context("starting the mount daemon")?;
    drop(write_end);
    let mut msg = String::new();
    std::fs::File::from(read_end)
        .read_to_string(&mut msg)
        .context("waiting for the mount daemon")?;
    match msg.trim() {
        "ok" => Ok(0),
        "" => {
            let status = child.wait().ok();
            bail!("the mount daemon exited before the mount was ready ({status:?})")
        }
        err => bail!("{err}"),
    }
}

/// Log lines go to --log FILE, else stderr (foreground) or nowhere but syslog.
fn logger(a: &Args) -> anyhow::Result<imagefs::Logger> {
    let file = match &a.log {
        // 0600, never through a symlink, refused if someone else could write it.
        Some(p) => Some(std::sync::Mutex::new(
            measure::files::open_private_append(p)
                .with_context(|| format!("log file {}", p.display()))?,
        )),
        None => None,
    };
    let to_stderr = a.ready_fd.is_none();
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

/// One datagram to the system log socket, if there is one (priority: daemon.err).
fn syslog(line: &str) {
    if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
        let _ = s.send_to(format!("<27>{}", line.trim_end()).as_bytes(), "/dev/log");
    }
}

fn serve(a: Args) -> anyhow::Result<i32> {
    let ready = a.ready_fd.map(|fd| {
        // SAFETY: the parent passed this descriptor (its pipe's write end) on the command
        // line for us alone; nothing else in this process owns or closes it.
        std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) })
    });
    report_panics(&a);
    let result = mount_and_wait(&a, ready);
    match result {
        Ok(()) => Ok(0),
        Err((e, Some(mut ready))) => {
            let _ = writeln!(ready, "{}", format!("{e:#}").replace('\n', " "));
            Ok(1)
        }
        Err((e, None)) => Err(e),
    }
}

/// A detached daemon's stderr goes nowhere: a panic (a bug) is also said in the system
/// log and the --log file, so a mount that vanished leaves a trace.
fn report_panics(a: &Args) {
    let log = a.log.clone();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let line = format!(
            "verilay[{}]: panic: {}\n",
            std::process::id(),
            info.to_string().replace('\n', " ")
        );
        syslog(&line);
        if let Some(p) = &log {
            if let Ok(mut f) = measure::files::open_private_append(p) {
                let _ = f.write_all(line.as_bytes());
            }
        }
        default(info);
    }));
}

/// A writable mount holds one descriptor per upper object the kernel has cached, so the
/// daemon takes all the descriptors it may: the hard limit, and as root the system's
/// maximum (`fs.nr_open`). Past half of them, it has the kernel drop the names it looked
/// up longest ago (imagefs's `reaper`), so a low limit costs lookups, not EMFILE.
fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    let system_max = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(max) = system_max.filter(|&m| now.maximum.is_some_and(|h| m > h)) {
        let all = Rlimit {
            current: Some(max),
            maximum: Some(max),
        };
        if setrlimit(Resource::Nofile, all).is_ok() {
            return;
        }
    }
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: now.maximum,
            maximum: now.maximum,
        },
    );
}

type Ready = Option<std::fs::File>;

fn mount_and_wait(a: &Args, ready: Ready) -> Result<(), (anyhow::Error, Ready)> {
    macro_rules! try_ready {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Err((anyhow::Error::from(e), ready)),
            }
        };
    }
    if ready.is_some() {
        // Our own session: the caller's terminal closing must not hang us up.
        let _ = rustix::process::setsid();
    }
    let read_opts = ReadOpts {
        parallel_hashing: false,
        ..ReadOpts::default()
    };
    let pins = try_ready!(a.pins());
    let mut layers = Vec::new();
    let mut ids = Vec::new();
    for (image, pin) in a.images().iter().zip(&pins) {
        let opened = try_ready!(open_with(image, pin, false, &read_opts));
        ids.push(LayerId {
            uuid: opened.img.superblock().uuid,
            digest: opened
                .verified
                .as_ref()
                .map(|v| v.digest().to_vec())
                .unwrap_or_default(),
        });
        layers.push(opened.img);
    }
    // The source shown in mount tables: the images, top first, as overlayfs lists layers.
    let name = a
        .images()
        .iter()
        .map(|i| {
            std::fs::canonicalize(i)
                .unwrap_or_else(|_| i.clone())
                .display()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(":");
    let log = try_ready!(logger(a));
    match (&a.upper, &a.work) {
        (Some(u), Some(w)) => {
            let upper = try_ready!(upper::Upper::open(u, w).with_context(|| format!(
                "upper directory {} with work directory {}",
                u.display(),
                w.display()
            )));
            let setup = try_ready!(super::measuring::setup(
                &a.measure,
                &ids,
                Some(upper.root()),
                a.mountpoint()
            ));
            let mut fs = try_ready!(
                imagefs::union::UnionFs::new(layers, upper, name.clone(), log)
                    .context("reading the root directories")
            );
            let measuring = setup.as_ref().map(|s| s.measuring.clone());
            if let Some(s) = setup {
                fs.set_measuring(s);
            }
            let slot = fs.notifier_slot();
            finish_measuring(session(a, fs, name, true, slot, ready), measuring)
        }
        _ => {
            let setup = try_ready!(super::measuring::setup(
                &a.measure,
                &ids,
                None,
                a.mountpoint()
            ));
            let mut fs = try_ready!(imagefs::ImageFs::new(layers, name.clone(), log)
                .context("reading the root directories"));
            let measuring = setup.as_ref().map(|s| s.measuring.clone());
            if let Some(s) = setup {
                fs.set_measuring(s);
            }
            let slot = fs.notifier_slot();
            finish_measuring(session(a, fs, name, false, slot, ready), measuring)
        }
    }
}

/// After the session: the measurement list is made durable (a clean unmount loses none).
fn finish_measuring<T>(
    served: T,
    measuring: Option<std::sync::Arc<imagefs::measuring::Measuring>>,
) -> T {
    if let Some(m) = measuring {
        if let Err(e) = m.sync() {
            eprintln!("verilay: error: making the measurement list durable: {e}");
        }
    }
    served
}

/// Mounts `fs` and serves it until unmounted; `fs` gets the session's notifier in
/// `notify`.
fn session<F: fuser::Filesystem + Send + Sync + 'static>(
    a: &Args,
    fs: F,
    name: String,
    writable: bool,
    notify: std::sync::Arc<std::sync::OnceLock<fuser::Notifier>>,
    ready: Ready,
) -> Result<(), (anyhow::Error, Ready)> {
    macro_rules! try_ready {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Err((anyhow::Error::from(e), ready)),
            }
        };
    }
    let name_for_mount = name.clone();
    let root = rustix::process::geteuid().is_root();
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        if writable {
            fuser::MountOption::RW
        } else {
            fuser::MountOption::RO
        },
        fuser::MountOption::FSName(name),
        fuser::MountOption::Subtype("verilay".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    if root {
        // Like the kernel's own mount of the image: set-id bits and devices work.
        cfg.mount_options
            .extend([fuser::MountOption::Suid, fuser::MountOption::Dev]);
    }
    if root || a.allow_other {
        cfg.acl = fuser::SessionACL::All;
    }
    cfg.n_threads = Some(
        a.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
    );
    cfg.clone_fd = true;
    let session = if root {
        // mount(2) ourselves, so the type is "fuse.verilay" as `mount -t fuse.verilay`
        // and fstab expect.
        let fd = try_ready!(mount_root(a.mountpoint(), &name_for_mount, writable)
            .with_context(|| format!("mounting on {}", a.mountpoint().display())));
        try_ready!(
            fuser::Session::from_fd(fs, fd, cfg.acl, cfg.clone()).context("talking to the kernel")
        )
    } else {
        let fd =
            try_ready!(
                mount_fusermount(a.mountpoint(), &name_for_mount, a.allow_other, writable)
                    .with_context(|| format!("mounting on {}", a.mountpoint().display()))
            );
        // Cloning the descriptor means opening /dev/fuse, which is often root-only;
        // then the workers share the one descriptor fusermount3 gave us.
        cfg.clone_fd = rustix::fs::access(
            "/dev/fuse",
            rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
        )
        .is_ok();
        try_ready!(
            fuser::Session::from_fd(fs, fd, cfg.acl, cfg.clone()).context("talking to the kernel")
        )
    };
    let _ = notify.set(session.notifier());
    let bg = try_ready!(session.spawn().context("starting the workers"));
    raise_readahead(a.mountpoint());

    let mountpoint = a.mountpoint().to_path_buf();
    let mut signals = try_ready!(signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .context("installing signal handlers"));
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            // Detach: the session ends as soon as the kernel lets go of it.
            let _ = unmount(&mountpoint, true);
        }
    });
    if let Some(mut r) = ready {
        let _ = r.write_all(b"ok\n");
    }
    // Returns when the filesystem is unmounted (by us or anyone).
    let _ = bg.join();
    Ok(())
}

/// The kernel caps FUSE readahead at the mount's bdi setting (128 KiB by default) whatever
/// INIT negotiated; let sequential reads arrive as 1 MiB requests. Root only; best effort.
fn raise_readahead(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = m.dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let _ = std::fs::write(
        format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"),
        b"1024",
    );
}

/// Opens /dev/fuse and mounts it read-only on `mountpoint` as "fuse.verilay".
fn mount_root(mountpoint: &Path, source: &str, writable: bool) -> anyhow::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .context("opening /dev/fuse")?;
    let data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other,max_read={}",
        dev.as_raw_fd(),
        1 << 20
    );
    rustix::mount::mount(
        source,
        mountpoint,
        "fuse.verilay",
        if writable {
            rustix::mount::MountFlags::empty()
        } else {
            rustix::mount::MountFlags::RDONLY
        },
        data.as_str(),
    )?;
    Ok(OwnedFd::from(dev))
}

/// Rootless: the setuid `fusermount3` opens /dev/fuse, mounts it, and hands the
/// descriptor back over a socket (libfuse's `_FUSE_COMMFD` protocol).
fn mount_fusermount(
    mountpoint: &Path,
    source: &str,
    allow_other: bool,
    writable: bool,
) -> anyhow::Result<OwnedFd> {
    use rustix::net::{
        recvmsg, socketpair, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
        SocketFlags, SocketType,
    };
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .context("socketpair")?;
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty()).context("socketpair")?;
    let mut opts = format!(
        "{},nosuid,nodev,default_permissions,fsname={},subtype=verilay,max_read={}",
        if writable { "rw" } else { "ro" },
        source.replace(',', "\\,"),
        1 << 20
    );
    if allow_other {
        opts.push_str(",allow_other");
    }
    let child = Command::new("fusermount3")
        .arg("-o")
        .arg(&opts)
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running fusermount3 (is the fuse3 package installed?)")?;
    drop(theirs);
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let got = recvmsg(
        &ours,
        &mut [std::io::IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    );
    let fd = match got {
        Ok(_) => control.drain().find_map(|m| match m {
            RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
            _ => None,
        }),
        Err(_) => None,
    };
    let out = child
        .wait_with_output()
        .context("waiting for fusermount3")?;
    match fd {
        Some(fd) if out.status.success() => Ok(fd),
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            bail!(
                "fusermount3: {}",
                err.trim()
                    .lines()
                    .last()
                    .unwrap_or("failed without a message")
            )
        }
    }
}

fn unmount(mountpoint: &Path, lazy: bool) -> anyhow::Result<()> {
    if rustix::process::geteuid().is_root() {
        let flags = if lazy {
            rustix::mount::UnmountFlags::DETACH
        } else {
            rustix::mount::UnmountFlags::empty()
        };
        return rustix::mount::unmount(mountpoint, flags).map_err(|e| match e {
            rustix::io::Errno::BUSY => {
                anyhow::anyhow!("{}: busy (try --lazy)", mountpoint.display())
            }
            rustix::io::Errno::INVAL => {
                anyhow::anyhow!("{}: not a mount point", mountpoint.display())
            }
            e => anyhow::anyhow!("unmounting {}: {e}", mountpoint.display()),
        });
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg(mountpoint)
        .output()
        .context("running fusermount3 -u")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "unmounting {}: {}",
            mountpoint.display(),
            err.trim().lines().last().unwrap_or("fusermount3 failed")
        );
    }
    Ok(())
}

pub fn run_umount(a: UmountArgs) -> anyhow::Result<i32> {
    unmount(&a.mountpoint, a.lazy)?;
    Ok(0)
}

/// `mount -t fuse.verilay IMAGE DIR -o OPTS` runs `/sbin/mount.fuse.verilay IMAGE DIR -o
/// OPTS` (a link to this binary). Options: `digest=sha256:…`, `threads=N`, `log=FILE`,
/// `allow_other`; the generic ones mount(8) adds (`ro`, `rw`, `defaults`, `nosuid`, …)
/// are accepted and the mount stays read-only.
pub fn mount_helper(args: &[String]) -> anyhow::Result<i32> {
    let mut pos = Vec::new();
    let mut opts = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => opts.extend(
                it.next()
                    .context("-o needs options")?
                    .split(',')
                    .map(str::to_string),
            ),
            // mount(8)'s own flags: fake, no mtab, sloppy, verbose.
            "-f" | "-n" | "-s" | "-v" => {}
            s if s.starts_with("-o") => opts.extend(s[2..].split(',').map(str::to_string)),
            s if s.starts_with('-') => bail!("mount.fuse.verilay: unknown flag {s}"),
            s => pos.push(s.to_string()),
        }
    }
    let [image, mountpoint] = pos.as_slice() else {
        bail!("usage: mount.fuse.verilay IMAGE MOUNTPOINT [-o digest=sha256:…,threads=N,log=FILE]");
    };
    let mut a = Args {
        paths: vec![image.into(), mountpoint.into()],
        digests: Vec::new(),
        upper: None,
        work: None,
        threads: None,
        foreground: false,
        log: None,
        allow_other: false,
        quiet: true,
        measure: MeasureArgs::default(),
        ready_fd: None,
    };
    for o in opts.iter().filter(|o| !o.is_empty()) {
        if let Some((k, v)) = o.split_once('=') {
            if a.measure.set_option(k, v)? {
                continue;
            }
        }
        match o.split_once('=') {
            Some(("digest", v)) => a.digests = vec![v.to_string()],
            Some(("threads", v)) => {
                a.threads = Some(v.parse().with_context(|| format!("threads={v}"))?)
            }
            Some(("log", v)) => a.log = Some(v.into()),
            None if o == "allow_other" => a.allow_other = true,
            None if matches!(
                o.as_str(),
                "ro" | "rw"
                    | "defaults"
                    | "auto"
                    | "noauto"
                    | "user"
                    | "nouser"
                    | "users"
                    | "nosuid"
                    | "suid"
                    | "nodev"
                    | "dev"
                    | "exec"
                    | "noexec"
                    | "atime"
                    | "noatime"
                    | "relatime"
                    | "nofail"
                    | "_netdev"
            ) => {}
            _ if o.starts_with("x-") || o.starts_with("comment=") => {}
            _ => bail!("mount.fuse.verilay: unknown option {o:?}"),
        }
    }
    run(a)
}
