//! The in-memory test filesystem served through fusewire on a real mount, once per
//! transport, checked with independent tools (stat, ls, getfattr, cat, diff, find, cksum)
//! and readers on every CPU; the counters show which channel carried the requests, and
//! unmounting mid-way (or stopping) ends the session with no thread left.

mod common;

use common::memfs::{self, MemFs, HELLO, SMALL_FILES};
use common::*;
use fusewire::abi::{init, op};
use fusewire::{Chosen, Config, Session, Transport, Wants};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

fn config(transport: Transport) -> Config {
    let flags = init::ASYNC_READ
        | init::PARALLEL_DIROPS
        | init::MAX_PAGES
        | init::DO_READDIRPLUS
        | init::READDIRPLUS_AUTO;
    Config {
        transport,
        workers: 4,
        poll: None,
        wants: Wants {
            flags,
            ..Wants::default()
        },
    }
}

/// Runs `test` over `transport`, one mount test at a time; skipped (and recorded) without
/// root, or over io_uring where this kernel has none.
fn on(transport: Transport, test: fn(Transport)) {
    let _serial = serial();
    if skip_unless(is_root(), "mounting FUSE needs root") {
        return;
    }
    let _uring = match transport {
        Transport::Uring => match uring_enabled() {
            Some(on) => Some(on),
            None => return,
        },
        _ => None,
    };
    test(transport);
}

/// FUSE over io_uring switched on for a test (back as it was when dropped); None, with the
/// skip recorded, where this kernel has none.
fn uring_enabled() -> Option<UringEnabled> {
    let uring = UringEnabled::new();
    skip_unless(
        uring.is_some(),
        "this kernel has no FUSE over io_uring (enable_uring)",
    );
    uring
}

/// For a test that needs root and FUSE over io_uring: io_uring switched on (back as it was
/// when dropped), or None with the skip recorded.
fn root_and_uring() -> Option<UringEnabled> {
    if skip_unless(is_root(), "mounting FUSE needs root") {
        return None;
    }
    uring_enabled()
}

/// `cat MNT/hello.txt` reads the file's contents.
fn assert_hello(mnt: &Path) {
    assert_eq!(sh("cat \"$1\"/hello.txt", &[mnt]).as_bytes(), memfs::HELLO);
}

/// Joins `session` within DEADLINE (`not_ended` if it does not end, `failed` if it ends
/// with an error), then waits for its threads to be gone.
fn join_within_deadline(session: Session, not_ended: &str, failed: &str) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(session.join()));
    rx.recv_timeout(DEADLINE).expect(not_ended).expect(failed);
    // Joined threads can still be listed a moment while the kernel finishes their exit.
    assert!(
        poll_until(DEADLINE, || session_threads().is_empty()),
        "threads left: {:?}",
        session_threads()
    );
}

/// A served mount; `forgets` counts the filesystem's FORGETs.
struct Served {
    mnt: Mountpoint,
    session: Session,
    forgets: Arc<AtomicU64>,
    panics: Arc<AtomicU64>,
}

/// Mounts the test filesystem (entries and attributes never cached, so every access is a
/// request) and starts serving it.
fn serve(transport: Transport) -> Served {
    let mnt = Mountpoint::new();
    let fd = mount_fuse(mnt.path()).expect("mount(2) of /dev/fuse");
    let fs = MemFs::new(Duration::ZERO);
    let (forgets, panics) = (fs.forgets.clone(), fs.panics.clone());
    let session = Session::start(fd, fs, &config(transport)).expect("session start");
    Served {
        mnt,
        session,
        forgets,
        panics,
    }
}

/// The same tree as the test filesystem, written to disk: the oracle for diff and cmp.
fn reference_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("reference dir");
    let p = dir.path();
    std::fs::write(p.join("hello.txt"), memfs::HELLO).unwrap();
    std::os::unix::fs::symlink("hello.txt", p.join("link")).unwrap();
    std::fs::create_dir(p.join("dir")).unwrap();
    std::fs::write(p.join("dir/big.bin"), memfs::big_contents()).unwrap();
    for i in 0..SMALL_FILES {
        std::fs::write(
            p.join("dir").join(memfs::small_name(i)),
            memfs::small_contents(i),
        )
        .unwrap();
    }
    dir
}

/// What independent tools see through the mount equals the reference tree.
fn check_with_tools(mnt: &Path, reference: &Path) {
    assert_hello(mnt);
    let st = sh(
        "stat -c '%s %a %F %h %Y' \"$1\"/hello.txt \"$1\"/dir \"$1\"/link",
        &[mnt],
    );
    let want = format!(
        "16 644 regular file 1 1700000002\n4096 755 directory {} 1700000004\n9 777 symbolic link 1 1700000003\n",
        2 + 1 + SMALL_FILES
    );
    assert_eq!(st, want, "stat through the mount");
    assert_eq!(sh("readlink \"$1\"/link", &[mnt]), "hello.txt\n");
    let ls = sh("ls -l \"$1\"/dir", &[mnt]);
    assert_eq!(
        ls.lines().count(),
        2 + SMALL_FILES,
        "ls -l lists every entry:\n{ls}"
    );
    assert!(
        ls.contains("3145728") && ls.contains(&memfs::small_name(SMALL_FILES - 1)),
        "{ls}"
    );
    let xattrs = sh("getfattr -d \"$1\"/hello.txt", &[mnt]);
    assert!(
        xattrs.contains("user.color=\"blue\"") && xattrs.contains("user.empty"),
        "getfattr -d: {xattrs}"
    );
    assert_eq!(
        sh(
            "getfattr --only-values -n user.color \"$1\"/hello.txt",
            &[mnt]
        ),
        "blue"
    );
    assert_eq!(sh("stat -f -c '%b %S' \"$1\"", &[mnt]), "1000 4096\n");
    let find = "cd \"$1\" && find . | sort";
    assert_eq!(
        sh(find, &[mnt]),
        sh(find, &[reference]),
        "find lists the same tree"
    );
    sh("diff -r --no-dereference \"$1\" \"$2\"", &[mnt, reference]);
}

/// Readers pinned to every CPU at once (the kernel queues a request on its sender's CPU),
/// each checking big.bin's checksum and reading every small file.
fn read_from_every_cpu(mnt: &Path, reference: &Path) {
    let want = sh("cksum < \"$1\"/dir/big.bin", &[reference]);
    let cpus = fusewire::possible_cpus().expect("possible cpus");
    let script = "for i in 1 2 3 4 5; do cksum < \"$1\"/dir/big.bin; cat \"$1\"/dir/f* > /dev/null || exit 1; done";
    let readers: Vec<_> = (0..cpus)
        .map(|cpu| {
            Command::new("taskset")
                .args(["-c", &cpu.to_string(), "sh", "-c", script, "sh"])
                .arg(mnt)
                .stdout(Stdio::piped())
                .spawn()
                .expect("taskset")
        })
        .collect();
    for r in readers {
        let out = r.wait_with_output().expect("reader");
        assert!(out.status.success(), "a reader failed");
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out,
            want.repeat(5),
            "every read of big.bin gives its contents"
        );
    }
}

/// Drops the kernel's inodes: their FORGETs come on /dev/fuse whatever the transport.
fn forget_everything(s: &Served) {
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches");
    assert!(
        poll_until(DEADLINE, || s.forgets.load(Ordering::Relaxed) > 0),
        "no FORGET reached the filesystem"
    );
    let stats = s.session.stats();
    let forgets = stats.by_opcode(op::FORGET).0 + stats.by_opcode(op::BATCH_FORGET).0;
    assert!(forgets > 0, "FORGETs come on /dev/fuse:\n{stats}");
}

/// Unmounts while readers run: the session ends by itself and leaves no thread behind.
fn unmount_midway(s: Served) {
    let stats = s.session.stats();
    let reads = || stats.by_opcode(op::READ).0 + stats.by_opcode(op::READ).1.iter().sum::<u64>();
    let before = reads();
    let script = "while cat \"$1\"/dir/big.bin > /dev/null 2>&1; do :; done";
    let mut reader = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(s.mnt.path())
        .spawn()
        .expect("reader");
    assert!(
        poll_until(DEADLINE, || reads() > before + 3),
        "the reader is not reading"
    );
    unmount(s.mnt.path()).expect("umount2");
    assert!(reader.wait().is_ok());
    join_within_deadline(
        s.session,
        "the session did not end after the unmount",
        "the session ended with an error",
    );
}

fn exercise(transport: Transport) {
    let s = serve(transport);
    let reference = reference_tree();
    check_with_tools(s.mnt.path(), reference.path());
    read_from_every_cpu(s.mnt.path(), reference.path());
    let stats = s.session.stats();
    let queues = stats.queue_requests();
    let chosen = s.session.transport();
    eprintln!("{chosen}, requests per channel:\n{stats}");
    assert_eq!(
        matches!(chosen, Chosen::Uring { .. }),
        transport == Transport::Uring,
        "{chosen}"
    );
    match chosen {
        Chosen::Dev { .. } => {
            assert!(
                queues.is_empty(),
                "a /dev/fuse session has no queues:\n{stats}"
            );
            assert!(stats.dev_requests() > 0);
        }
        Chosen::Uring { queues: n, .. } => {
            assert_eq!(n, queues.len());
            assert!(
                queues.iter().all(|&q| q > 0),
                "every ring served requests:\n{stats}"
            );
            let (dev_lookups, ring_lookups) = stats.by_opcode(op::LOOKUP);
            assert_eq!(dev_lookups, 0, "no LOOKUP on /dev/fuse:\n{stats}");
            assert!(ring_lookups.iter().sum::<u64>() > 0);
        }
    }
    forget_everything(&s);
    unmount_midway(s);
}

#[test]
fn dev_transport_serves_real_tools() {
    on(Transport::Dev, exercise);
}

#[test]
fn uring_transport_serves_real_tools() {
    on(Transport::Uring, exercise);
}

/// Auto says what it chose: io_uring when the kernel offers it, /dev/fuse when not.
#[test]
fn auto_reports_the_transport_it_chose() {
    let _serial = serial();
    let Some(uring) = root_and_uring() else {
        return;
    };
    let on = serve(Transport::Auto);
    assert!(
        matches!(on.session.transport(), Chosen::Uring { .. }),
        "{}",
        on.session.transport()
    );
    assert!(on.session.negotiated().has(init::OVER_IO_URING));
    unmount_midway(on);
    std::fs::write("/sys/module/fuse/parameters/enable_uring", "N").expect("enable_uring=N");
    let off = serve(Transport::Auto);
    assert!(
        matches!(off.session.transport(), Chosen::Dev { .. }),
        "{}",
        off.session.transport()
    );
    assert!(!off.session.negotiated().has(init::OVER_IO_URING));
    assert_hello(off.mnt.path());
    unmount_midway(off);
    drop(uring);
}

/// READs whose handler panics get EIO, and their threads go on serving: more panics than
/// a queue has threads, every read from one CPU (whose queue then serves them all), and
/// that CPU's next read is served.
fn a_panicking_handler_answers_eio(transport: Transport) {
    let s = serve(transport);
    let hello = s.mnt.path().join("hello.txt");
    let panics = 6;
    s.panics.store(panics, Ordering::SeqCst);
    let mut served = None;
    for _ in 0..2 * panics {
        let cat = Command::new("taskset")
            .args(["-c", "0", "cat"])
            .arg(&hello)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("taskset cat");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut cat = cat;
        while cat.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                // Unstick the reader before failing, or the test would hang with it.
                let ctl = Path::new("/sys/fs/fuse/connections");
                let minor = fuse_connection(s.mnt.path());
                let _ = std::fs::write(ctl.join(minor.to_string()).join("abort"), "1");
                panic!("a read hung after a handler panicked ({transport:?})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = cat.wait_with_output().expect("cat output");
        if out.status.success() {
            served = Some(out.stdout);
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Input/output error"), "{err}");
    }
    assert_eq!(s.panics.load(Ordering::SeqCst), 0, "every panic happened");
    assert_eq!(served.as_deref(), Some(HELLO), "the read after the panics");
    s.session.stopper().stop();
    join_within_deadline(s.session, "the session did not end after stop", "join");
    unmount(s.mnt.path()).expect("umount2");
}

#[test]
fn a_panicking_handler_answers_eio_over_dev() {
    on(Transport::Dev, a_panicking_handler_answers_eio);
}

#[test]
fn a_panicking_handler_answers_eio_over_uring() {
    on(Transport::Uring, a_panicking_handler_answers_eio);
}

/// The caller's stop ends every thread; the mount can then be unmounted.
fn stop_then_unmount(transport: Transport) {
    let s = serve(transport);
    assert_hello(s.mnt.path());
    s.session.stopper().stop();
    join_within_deadline(s.session, "the session did not end after stop", "join");
    unmount(s.mnt.path()).expect("umount2 after stop");
}

/// An abort through fusectl ends the session without an error: the kernel answers the
/// daemon's reads ECONNABORTED (ABORT_ERROR is asked for), and the same errno comes
/// from a read that races an ordinary unmount.
fn abort_through_fusectl(transport: Transport) {
    let s = serve(transport);
    assert_hello(s.mnt.path());
    let granted = s.session.negotiated().granted;
    assert_ne!(granted & init::ABORT_ERROR, 0, "ABORT_ERROR not granted");
    let minor = fuse_connection(s.mnt.path());
    let ctl = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(ctl).map_or(true, |mut d| d.next().is_none()) {
        let status = Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(ctl)
            .status()
            .expect("mount fusectl");
        assert!(status.success(), "mount -t fusectl failed");
    }
    std::fs::write(ctl.join(minor.to_string()).join("abort"), "1").expect("abort");
    join_within_deadline(
        s.session,
        "the session did not end after the abort",
        "the session ended with an error after the abort",
    );
    // The aborted mount answers ENOTCONN until it is unmounted.
    let err = std::fs::read(s.mnt.path().join("hello.txt")).expect_err("read after abort");
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    unmount(s.mnt.path()).expect("umount2 after abort");
}

/// The FUSE connection number (the mount's minor device number) behind `mnt`, from
/// mountinfo: a stat of the mountpoint would ask the daemon.
fn fuse_connection(mnt: &Path) -> u32 {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mnt = mnt.to_str().expect("utf-8 mountpoint");
    info.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(4) == Some(&mnt)).then(|| f[2].split(':').nth(1)?.parse().ok())?
        })
        .expect("the mount in mountinfo")
}

#[test]
fn an_abort_ends_a_dev_session() {
    on(Transport::Dev, abort_through_fusectl);
}

#[test]
fn an_abort_ends_a_uring_session() {
    on(Transport::Uring, abort_through_fusectl);
}

#[test]
fn stop_ends_a_dev_session() {
    on(Transport::Dev, stop_then_unmount);
}

#[test]
fn stop_ends_a_uring_session() {
    on(Transport::Uring, stop_then_unmount);
}

/// Counts the GETATTRs it serves per calling thread.
struct CountingGetattr {
    inner: MemFs,
    served: Arc<Mutex<HashMap<u32, u64>>>,
}

impl fusewire::Filesystem for CountingGetattr {
    fn init(&mut self, n: &fusewire::Negotiated, c: &fusewire::Channel) {
        self.inner.init(n, c)
    }
    fn request(
        &self,
        ctx: &fusewire::Context,
        req: fusewire::Request<'_>,
        reply: fusewire::Reply<'_>,
    ) {
        if matches!(req, fusewire::Request::GetAttr { .. }) {
            *self
                .served
                .lock()
                .unwrap()
                .entry(ctx.caller.pid)
                .or_default() += 1;
        }
        self.inner.request(ctx, req, reply)
    }
}

/// A stop in the middle of a storm of GETATTRs (six threads calling fstat, attributes
/// never cached): every thread ends, and every request served was answered: each caller
/// got exactly as many answers as the filesystem served for it (its next request waits
/// unserved until the connection closes).
#[allow(unsafe_code)] // gettid(2), a syscall
fn stop_under_load_answers_what_it_served(transport: Transport) {
    for round in 0..20u64 {
        let mnt = Mountpoint::new();
        let fd = mount_fuse(mnt.path()).expect("mount(2) of /dev/fuse");
        let served = Arc::new(Mutex::new(HashMap::new()));
        let fs = CountingGetattr {
            inner: MemFs::new(Duration::ZERO),
            served: served.clone(),
        };
        let session = Session::start(fd, fs, &config(transport)).expect("session start");
        let path = mnt.path().join("hello.txt");
        let callers: Vec<_> = (0..6)
            .map(|_| {
                let path = path.clone();
                let (tid_tx, tid_rx) = mpsc::channel();
                let answered = Arc::new(AtomicU64::new(0));
                let count = answered.clone();
                let caller = std::thread::spawn(move || {
                    // SAFETY: gettid has no arguments and cannot fail.
                    tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
                    let f = std::fs::File::open(&path).expect("open");
                    // Ends when the connection closes under a waiting fstat.
                    while f.metadata().is_ok() {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                });
                (caller, tid_rx.recv().unwrap(), answered)
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20 + (round % 7) * 5));
        session.stopper().stop();
        assert!(
            poll_until(DEADLINE, || session_threads().is_empty()),
            "{transport:?}, round {round}: threads left after stop: {:?}",
            session_threads()
        );
        // A caller answered is counted a moment after its answer.
        std::thread::sleep(Duration::from_millis(100));
        let served = served.lock().unwrap().clone();
        for (_, tid, answered) in &callers {
            let (s, a) = (
                served.get(tid).copied().unwrap_or(0),
                answered.load(Ordering::SeqCst),
            );
            assert_eq!(
                s, a,
                "{transport:?}, round {round}: a caller's GETATTRs served / answered"
            );
        }
        drop(session);
        for (caller, _, _) in callers {
            caller.join().unwrap();
        }
        unmount(mnt.path()).expect("umount2 after stop");
    }
}

#[test]
fn a_dev_stop_under_load_answers_what_it_served() {
    on(Transport::Dev, stop_under_load_answers_what_it_served);
}

#[test]
fn a_uring_stop_under_load_answers_what_it_served() {
    on(Transport::Uring, stop_under_load_answers_what_it_served);
}

/// Asking for io_uring where the kernel does not offer it is an error, and the mount
/// fails its requests instead of hanging them.
#[test]
fn uring_refused_when_not_offered() {
    let _serial = serial();
    let Some(uring) = root_and_uring() else {
        return;
    };
    std::fs::write("/sys/module/fuse/parameters/enable_uring", "N").expect("enable_uring=N");
    let mnt = Mountpoint::new();
    let fd = mount_fuse(mnt.path()).expect("mount(2) of /dev/fuse");
    let started = Session::start(fd, MemFs::new(Duration::ZERO), &config(Transport::Uring));
    assert!(
        matches!(started, Err(fusewire::StartError::UringUnavailable(_))),
        "{:?}",
        started.err()
    );
    let err = std::fs::metadata(mnt.path().join("hello.txt"))
        .expect_err("a refused mount serves nothing");
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    drop(uring);
}
