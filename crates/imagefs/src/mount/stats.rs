//! `verilay stats` over the mount's own abstract unix socket, `verilay/stats/MAJOR:MINOR` of
//! the mount's device.
//!
//! - Anyone can bind that name, so neither side trusts it: the client asks only a listener
//!   running as the mount's owner ([`query`]); the daemon answers only a client its [`Access`]
//!   admits that passes a descriptor of the mount root.
//! - A squatted name costs only the statistics.

use crate::ops::Access;
use crate::stats::{Stats, StatsSource};
use anyhow::{bail, Context};
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, Dev, OFlags, StatxFlags};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde_json::{json, Value};
use std::io::{IoSlice, IoSliceMut};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a connection may wait for its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections waiting for their request at once; one more closes the oldest.
pub const MAX_WAITING: usize = 256;
/// Threads closing descriptors of other filesystems at once (see `close_foreign`).
const MAX_CLOSING: usize = 4;
/// The most a reply may be (the client's bound on what it reads).
const MAX_REPLY: u64 = 16 << 20;
/// How long binding waits for the name to be released, if taken: by the daemon of an
/// unmounted filesystem that had the same device number, still closing its list.
const BIND_PATIENCE: Duration = Duration::from_secs(1);

/// The abstract socket name of the mount with device `dev`.
pub fn socket_name(dev: Dev) -> String {
    format!(
        "verilay/stats/{}:{}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    )
}

/// The listening channel; dropping it stops the listener and releases the name (at
/// unmount, before the daemon closes its measurement list).
pub struct Channel {
    _stop: OwnedFd,
}

/// Who may read the statistics: the users the session lets in.
#[derive(Clone, Copy)]
struct Admits {
    access: Access,
    owner: u32,
}

impl Admits {
    /// As the session checks a request's uid (and the kernel let the client open the
    /// root, which the descriptor shows).
    fn uid(&self, uid: u32) -> bool {
        match self.access {
            Access::All => true,
            Access::RootAndOwner => uid == 0 || uid == self.owner,
            Access::Owner => uid == self.owner,
        }
    }
}

/// The mount's root as the daemon saw it once mounted: what a client's descriptor must be.
#[derive(Clone, Copy)]
struct Root {
    dev: u64,
    ino: u64,
}

impl Channel {
    /// Listens for `verilay stats` on the mount at `mountpoint` (which answers already),
    /// answering `access`'s users with what `source` makes. `None` when another process
    /// holds the name (a squatter): the mount then has no statistics, and `verilay stats`
    /// says who holds it.
    pub fn start(
        mountpoint: &Path,
        access: Access,
        source: StatsSource,
    ) -> anyhow::Result<Option<Channel>> {
        let st = rustix::fs::stat(mountpoint).context("the new mount's root")?;
        let root = Root {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let Some(listener) = listen(&socket_name(st.st_dev))? else {
            return Ok(None);
        };
        let admits = Admits {
            access,
            owner: rustix::process::getuid().as_raw(),
        };
        let (stop_read, stop) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .context("the stats channel's pipe")?;
        std::thread::Builder::new()
            .name("verilay-stats".into())
            .spawn(move || serve(listener, stop_read, admits, root, source))
            .context("starting the stats channel's thread")?;
        Ok(Some(Channel { _stop: stop }))
    }
}

/// A listening socket bound to the abstract `name`; `None` if another process keeps it
/// longer than [`BIND_PATIENCE`].
fn listen(name: &str) -> anyhow::Result<Option<OwnedFd>> {
    let addr = SocketAddrUnix::new_abstract_name(name.as_bytes())?;
    let deadline = Instant::now() + BIND_PATIENCE;
    loop {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .context("the stats socket")?;
        match rustix::net::bind_unix(&fd, &addr) {
            Ok(()) => {
                rustix::net::listen(&fd, 64).context("listening on the stats socket")?;
                return Ok(Some(fd));
            }
            Err(Errno::ADDRINUSE) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(Errno::ADDRINUSE) => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("binding @{name}")),
        }
    }
}

/// A connection waiting for its request.
struct Waiting {
    conn: OwnedFd,
    since: Instant,
}

/// Serves the socket until `stop` hangs up (the [`Channel`] dropped), so that no client
/// can stall it: this one thread, never a worker of the mount, serves it; a connection
/// waits in a poll set at most [`REQUEST_TIMEOUT`] for its request (one byte and the
/// root's descriptor, read once: nothing else a client sends is read); the reply
/// (`{"stats": {...}}` or `{"error": "why"}`) is written once without blocking (a client
/// that does not read it loses it); at most [`MAX_WAITING`] connections wait, one more
/// closes the oldest, so idle ones delay nobody's request; a client the mount does not
/// admit is answered at once, before it can hold anything.
fn serve(listener: OwnedFd, stop: OwnedFd, admits: Admits, root: Root, source: StatsSource) {
    let mut waiting: Vec<Waiting> = Vec::new();
    loop {
        let timeout = waiting.first().map_or(-1, |w| {
            let left = REQUEST_TIMEOUT.saturating_sub(w.since.elapsed());
            i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
        });
        let mut fds = vec![
            PollFd::new(&listener, PollFlags::IN),
            PollFd::new(&stop, PollFlags::IN),
        ];
        fds.extend(waiting.iter().map(|w| PollFd::new(&w.conn, PollFlags::IN)));
        match rustix::event::poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => return,
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        let new = !fds[0].revents().is_empty();
        let ready: Vec<bool> = fds[2..].iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        // Answered, or waited too long: either way done with.
        let mut i = 0;
        waiting.retain(|w| {
            let ready = ready.get(i).copied().unwrap_or(false);
            i += 1;
            if ready {
                answer(&w.conn, admitted(&w.conn, root), &source);
                return false;
            }
            if w.since.elapsed() >= REQUEST_TIMEOUT {
                answer(&w.conn, Err("no request within 2 seconds".into()), &source);
                return false;
            }
            true
        });
        if new {
            accept(&listener, admits, &mut waiting, &source);
        }
    }
}

/// Takes the connections the listener holds: a client the mount does not admit is told
/// so at once; the others wait for their request.
fn accept(listener: &OwnedFd, admits: Admits, waiting: &mut Vec<Waiting>, source: &StatsSource) {
    let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
    // Gone before we took it, or out of descriptors for now: nothing to answer.
    while let Ok(conn) = rustix::net::accept_with(listener, flags) {
        if let Err(why) = admitted_uid(&conn, admits) {
            answer(&conn, Err(why), source);
            continue;
        }
        if waiting.len() >= MAX_WAITING {
            waiting.remove(0);
        }
        waiting.push(Waiting {
            conn,
            since: Instant::now(),
        });
    }
}

/// Writes the reply for a client admitted (`Ok`) or not, once, without waiting.
fn answer(conn: &OwnedFd, admitted: Result<(), String>, source: &StatsSource) {
    let reply = match admitted {
        Ok(()) => json!({ "stats": source() }),
        Err(why) => json!({ "error": why }),
    };
    let bytes = serde_json::to_vec(&reply).unwrap_or_default();
    let _ = rustix::net::send(conn, &bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

/// Whether the client's uid may use the mount, as the session checks each request's.
fn admitted_uid(conn: &OwnedFd, admits: Admits) -> Result<(), String> {
    let cred = rustix::net::sockopt::get_socket_peercred(conn).map_err(|e| e.to_string())?;
    let uid = cred.uid.as_raw();
    if !admits.uid(uid) {
        return Err(format!("uid {uid} may not use this mount"));
    }
    Ok(())
}

/// Whether the client, admitted by uid, may read the statistics: its request holds a
/// descriptor of the mount's root, open for reading (see the module comment).
fn admitted(conn: &OwnedFd, root: Root) -> Result<(), String> {
    let fd = request(conn)?;
    // From what the kernel has cached: asking the filesystem could wait on another
    // (a FUSE daemon the client serves and stalls).
    let flags = AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC;
    let st = rustix::fs::statx(&fd, "", flags, StatxFlags::INO).map_err(|e| e.to_string())?;
    let dev = rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor);
    if (dev, st.stx_ino) != (root.dev, root.ino) {
        close_foreign(fd);
        return Err("the descriptor sent is not this mount's root".into());
    }
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| e.to_string())?;
    let mode = flags & OFlags::RWMODE;
    if flags.contains(OFlags::PATH) || !(mode == OFlags::RDONLY || mode == OFlags::RDWR) {
        return Err("the descriptor sent is not open for reading".into());
    }
    Ok(())
}

/// Closes a descriptor of another filesystem on a thread of its own: closing a FUSE file
/// waits for its daemon's answer to FLUSH, which a client serving that filesystem could
/// withhold. At most [`MAX_CLOSING`] such threads at once; past that the serving thread
/// closes it, so a user the mount admits can stall its statistics that way, never the
/// mount itself.
fn close_foreign(fd: OwnedFd) {
    static CLOSING: AtomicUsize = AtomicUsize::new(0);
    if CLOSING.fetch_add(1, Ordering::AcqRel) < MAX_CLOSING {
        let spawned = std::thread::Builder::new()
            .name("verilay-stats-close".into())
            .spawn(move || {
                drop(fd);
                CLOSING.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_ok() {
            return;
        }
    }
    CLOSING.fetch_sub(1, Ordering::AcqRel);
}

/// The request: one byte and one descriptor (any others are closed unused).
fn request(conn: &OwnedFd) -> Result<OwnedFd, String> {
    let mut byte = [0u8; 1];
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        conn,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
    )
    .map_err(|e| e.to_string())?;
    let mut fds = control.drain().filter_map(|m| match m {
        RecvAncillaryMessage::ScmRights(fds) => Some(fds),
        _ => None,
    });
    let fd = fds.next().and_then(|mut fds| fds.next());
    match (got.bytes, fd) {
        (1, Some(fd)) => Ok(fd),
        (0, _) => Err("no request".into()),
        _ => Err("a request is one byte and a descriptor of the mount's root".into()),
    }
}

/// What the mount's statistics socket said.
pub enum Answer {
    /// The statistics.
    Stats(Stats),
    /// Nothing listens: a daemon of an older verilay, which has only the root's
    /// `verilay.stats` attribute.
    NoSocket,
    /// Another process holds the name (this says which); it was not asked.
    Squatted(String),
}

/// Asks the daemon of the mount at `mountpoint` for its statistics, passing a descriptor
/// of the mount's root as proof of access. Only a listener whose SO_PEERCRED uid is the
/// mount's owner (`user_id=` in the mount table) is asked; another is [`Answer::Squatted`]
/// (the caller may read the root's `verilay.stats` attribute instead, where the mount
/// answers xattrs: the kernel leads there, not a name). Errors say why not, naming the
/// mountpoint.
pub fn query(mountpoint: &Path, timeout: Duration) -> anyhow::Result<Answer> {
    let mp = mountpoint.display();
    // The proof that we may use the mount: its root, open for reading.
    let root = rustix::fs::open(
        mountpoint,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .with_context(|| format!("{mp}: opening the mount's root"))?;
    let dev = rustix::fs::fstat(&root)
        .with_context(|| format!("{mp}: stat"))?
        .st_dev;
    let Some(owner) = mount_owner(dev) else {
        bail!("{mp}: not a verilay mount (no statistics)");
    };
    let name = socket_name(dev);
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let addr = SocketAddrUnix::new_abstract_name(name.as_bytes())?;
    match rustix::net::connect_unix(&sock, &addr) {
        Ok(()) => {}
        Err(Errno::CONNREFUSED) => return Ok(Answer::NoSocket),
        Err(e) => return Err(e).with_context(|| format!("{mp}: connecting to @{name}")),
    }
    let server = rustix::net::sockopt::get_socket_peercred(&sock)?;
    if server.uid.as_raw() != owner {
        return Ok(Answer::Squatted(format!(
            "{mp}: its statistics socket @{name} is held by process {} of uid {}, not by the mount's daemon (uid {owner}): not asked",
            server.pid.as_raw_nonzero(),
            server.uid.as_raw()
        )));
    }
    use rustix::net::sockopt::{set_socket_timeout, Timeout};
    set_socket_timeout(&sock, Timeout::Recv, Some(timeout))?;
    set_socket_timeout(&sock, Timeout::Send, Some(timeout))?;
    send_request(&sock, root.as_fd()).with_context(|| format!("{mp}: asking @{name}"))?;
    let reply = read_reply(&sock).with_context(|| format!("{mp}: reading @{name}'s reply"))?;
    let reply: Value = serde_json::from_slice(&reply)
        .with_context(|| format!("{mp}: the daemon's reply is not JSON"))?;
    match reply {
        Value::Object(mut o) => match (o.remove("stats"), o.remove("error")) {
            (Some(Value::Object(stats)), _) => Ok(Answer::Stats(stats)),
            (_, Some(Value::String(why))) => bail!("{mp}: the mount's daemon refused: {why}"),
            _ => bail!("{mp}: the daemon's reply holds no statistics"),
        },
        _ => bail!("{mp}: the daemon's reply is not a JSON object"),
    }
}

fn send_request(sock: &OwnedFd, root: BorrowedFd<'_>) -> std::io::Result<()> {
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [root];
    control.push(SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(
        sock,
        &[IoSlice::new(b"s")],
        &mut control,
        SendFlags::empty(),
    )?;
    Ok(())
}

/// The reply, read to its end (at most [`MAX_REPLY`] bytes).
fn read_reply(sock: &OwnedFd) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    let file = std::fs::File::from(sock.try_clone()?);
    file.take(MAX_REPLY).read_to_end(&mut out)?;
    Ok(out)
}

/// The uid of the daemon a verilay mount with device `dev` would have: a FUSE mount's
/// `user_id=` in the mount table, root for the kernel engine's erofs or overlayfs (only
/// root mounts them); `None` for any other mount.
fn mount_owner(dev: Dev) -> Option<u32> {
    let want = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
    let table = host::mountinfo::table(None).ok()?;
    let mount = table.iter().find(|m| m.dev == want)?;
    match mount.fs_name() {
        "erofs" | "overlay" => Some(0),
        "fuse" => mount.option("user_id")?.to_str()?.parse().ok(),
        _ => None,
    }
}
