//! `verilay mount`: the FUSE mount against the source tree and against the kernel's own
//! erofs mount of the same image, tampering under a live mount, concurrent readers,
//! rootless mounts, `mount -t fuse.verilay`, and the errors a user meets.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn prerequisites() -> bool {
    skip_unless(is_root(), "needs root (kernel mounts, mknod, chown)")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
}

/// A verilay FUSE mount, unmounted (and its daemon gone) when dropped.
struct FuseMount {
    dir: PathBuf,
    /// What `verilay mount` said on stderr.
    said: String,
    /// The daemon's --log file (integrity failures, panics), shown if the test fails.
    log: Option<PathBuf>,
}

impl FuseMount {
    fn new(image: &Path, dir: &Path, extra: &[&str]) -> FuseMount {
        FuseMount::stack(&[image.to_path_buf()], dir, extra)
    }

    /// A mount of several images, the first on top.
    fn stack(images: &[PathBuf], dir: &Path, extra: &[&str]) -> FuseMount {
        std::fs::create_dir_all(dir).unwrap();
        let log = (!extra.contains(&"--log")).then(|| dir.with_extension("daemon.log"));
        let mut cmd = verilay();
        cmd.arg("mount").args(images).arg(dir).args(extra);
        if let Some(l) = &log {
            cmd.arg("--log").arg(l);
        }
        let out = run(&mut cmd);
        FuseMount {
            dir: dir.to_path_buf(),
            said: String::from_utf8_lossy(&out.stderr).into_owned(),
            log,
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(text) = self
                .log
                .as_ref()
                .and_then(|l| std::fs::read_to_string(l).ok())
            {
                eprintln!("daemon log of {}:\n{text}", self.dir.display());
            }
        }
        let _ = verilay()
            .arg("umount")
            .arg("--lazy")
            .arg(&self.dir)
            .status();
    }
}

/// For a test that needs only `prerequisites`: `fixture` with one file `f` holding `data`,
/// and an empty mountpoint `mnt` beside it: (tempdir, src, image, mnt); None, with the skip
/// recorded, where it cannot run.
fn one_file_mount_fixture(data: &[u8]) -> Option<(tempfile::TempDir, PathBuf, PathBuf, PathBuf)> {
    if prerequisites() {
        return None;
    }
    let (t, src, image, _) = fixture(|src| std::fs::write(src.join("f"), data).unwrap());
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    Some((t, src, image, mnt))
}

/// `/tmp/verilay-NAME-PID`, made afresh.
fn fresh_tmp_dir(name: &str) -> PathBuf {
    let base = PathBuf::from(format!("/tmp/verilay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    base
}

/// A source tree made by `fill`, built into a sealed image: (tempdir, src, image, digest).
fn fixture(fill: impl FnOnce(&Path)) -> (tempfile::TempDir, PathBuf, PathBuf, String) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    fill(&src);
    let image = t.path().join("img");
    let out = build(&src, &image, &["--quiet"]);
    let digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    (t, src, image, digest)
}

/// The FUSE engine, for tests of what only it does (its xattr answers and request
/// counts, its statistics and their access, its SIGTERM path, mounting a hostile image
/// to serve errors: the kernel engine refuses that image at mount,
/// `kernel_engine.rs::a_pinned_image_with_hostile_metadata_never_reaches_the_kernel`).
/// The rest run on whichever engine `auto` (or $VERILAY_ENGINE) picks.
const FUSE: [&str; 2] = ["--engine", "fuse"];

/// Whether `verilay mount` said the kernel engine serves the mount.
fn kernel_engine(said: &str) -> bool {
    said.contains("kernel engine (")
}

/// The filesystem type a single image's mount shows on the engine `said` names.
fn single_image_type(said: &str) -> &'static str {
    if kernel_engine(said) {
        "erofs"
    } else {
        "fuse.verilay"
    }
}

fn mount_type(dir: &Path) -> Option<String> {
    let canon = std::fs::canonicalize(dir).ok()?;
    std::fs::read_to_string("/proc/self/mounts")
        .ok()?
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (Path::new(f[1]) == canon).then(|| f[2].to_string())
        })
}

fn compare_with_kernel(src: &Path, work: &Path) {
    let image = work.join("img");
    let digest = String::from_utf8(build(src, &image, &["--quiet"]).stdout).unwrap();
    let kernel = Mount::erofs(&image, &work.join("kernel"));
    let fuse = FuseMount::new(&image, &work.join("fuse"), &["--digest", digest.trim()]);
    assert_eq!(
        mount_type(&fuse.dir).as_deref(),
        Some(single_image_type(&fuse.said))
    );
    assert!(
        fuse.said
            .contains(&format!("digest {} (pinned)", digest.trim())),
        "{}",
        fuse.said
    );

    assert_diff_clean(src, &fuse.dir);
    assert_diff_clean(&kernel.dir, &fuse.dir);
    assert_same_stats(src, &fuse.dir);
    assert_same_stats(&kernel.dir, &fuse.dir);
    assert_eq!(
        ls_lr(&kernel.dir),
        ls_lr(&fuse.dir),
        "ls -lR differs from the kernel's"
    );
    assert_eq!(xattr_dump(&kernel.dir), xattr_dump(&fuse.dir), "getfattr");
    assert_eq!(xattr_dump(src), xattr_dump(&fuse.dir), "getfattr vs source");
    assert_eq!(acl_dump(&kernel.dir), acl_dump(&fuse.dir), "getfacl");
    // statfs: the same block and inode counts as the kernel reports.
    let df = |d: &Path| {
        let out = run(Command::new("stat")
            .args(["-f", "-c", "%S %b %f %c %l"])
            .arg(d));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(df(&kernel.dir), df(&fuse.dir), "statfs");
}

#[test]
fn generated_tree_matches_source_and_kernel_mount() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let src = generated_src(t.path());
    compare_with_kernel(&src, t.path());
}

#[test]
fn real_tree_matches_source_and_kernel_mount() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    compare_with_kernel(Path::new("/usr/include"), t.path());
}

#[test]
fn acls_and_trusted_xattrs_are_enforced_like_the_kernel() {
    if prerequisites() || skip_unless(have("runuser"), "runuser missing") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("open"), b"anyone").unwrap();
    std::fs::write(src.join("acl_denied"), b"secret").unwrap();
    std::fs::write(src.join("acl_allowed"), b"shared").unwrap();
    sh(&format!(
        "cd '{}' && chmod 644 open && chmod 644 acl_denied && setfacl -m u:nobody:--- acl_denied && \
         chmod 600 acl_allowed && setfacl -m u:nobody:r-- acl_allowed && \
         setfattr -n trusted.secret -v 1 open && setfattr -n user.visible -v 1 open && chmod 755 d",
        src.display()
    ));
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let kernel = Mount::erofs(&image, &t.path().join("kernel"));
    let fuse = FuseMount::new(&image, &t.path().join("fuse"), &["--allow-other"]);
    for m in [&kernel.dir, &fuse.dir] {
        let as_nobody = |script: &str| {
            Command::new("runuser")
                .args(["-u", "nobody", "--", "sh", "-c", script])
                .current_dir(m)
                .output()
                .unwrap()
        };
        assert_eq!(as_nobody("cat open").stdout, b"anyone");
        assert!(!as_nobody("cat acl_denied").status.success(), "ACL denies");
        assert_eq!(as_nobody("cat acl_allowed").stdout, b"shared", "ACL allows");
        // trusted.* is listed for root only.
        let list = String::from_utf8(as_nobody("getfattr -d -m - open").stdout).unwrap();
        assert!(
            list.contains("user.visible") && !list.contains("trusted.secret"),
            "{list}"
        );
        let root_list = run(Command::new("getfattr")
            .args(["-d", "-m", "-", "open"])
            .current_dir(m));
        assert!(String::from_utf8_lossy(&root_list.stdout).contains("trusted.secret"));
    }
}

/// How `tampered_reads` mounts the image it tampers with.
#[derive(Clone, Copy, PartialEq)]
enum Served {
    /// `verilay mount IMAGE DIR`.
    Plain,
    /// On top of a second image (overlayfs's rules, the same read-only filesystem).
    Stacked,
    /// With an upper directory (the writable filesystem).
    Upper,
}

#[test]
fn a_tampered_image_gives_eio_for_that_file_only() {
    tampered_reads(Served::Plain);
}

#[test]
fn a_tampered_stacked_image_gives_eio_for_that_file_only() {
    tampered_reads(Served::Stacked);
}

#[test]
fn a_tampered_image_under_an_upper_directory_gives_eio_for_that_file_only() {
    tampered_reads(Served::Upper);
}

/// Flips a byte of two files' data under a live mount (one at the root, one two
/// directories down) and of a directory's last block: reading either file or listing
/// the directory is EIO, the rest of the tree reads fine, and each failure is one log line
/// that names the bad block and the file by its path in the mount (and its inode, as
/// `inspect` shows it); with an upper directory, so is a copy-up.
fn tampered_reads(served: Served) {
    if prerequisites() {
        return;
    }
    let content = |seed: u32| -> Vec<u8> {
        (0..300_000u32)
            .map(|i| ((i ^ seed) * 7 % 251) as u8)
            .collect()
    };
    let victims = ["victim", "sub/deeper/victim"];
    let (t, _src, image, _) = fixture(|src| {
        std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
        for (i, v) in victims.iter().enumerate() {
            std::fs::write(src.join(v), content(i as u32)).unwrap();
        }
        std::fs::write(src.join("bystander"), b"still fine").unwrap();
        // Several blocks of entries: a lookup of `..` (its place is checked) searches the
        // first half, the last block is only listed.
        std::fs::create_dir_all(src.join("sub/many")).unwrap();
        for i in 0..600 {
            std::fs::write(src.join(format!("sub/many/a-longish-name-{i}")), b"").unwrap();
        }
    });
    let inspect = |file: &str| -> serde_json::Value {
        let out = run(verilay().args(["inspect", "--json"]).arg(&image).arg(file));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let victims: Vec<(&str, u64, u64)> = victims
        .iter()
        .map(|v| {
            let info = inspect(v);
            let start = info["layout"]["start_block"].as_u64().unwrap() * 4096;
            (*v, start + 100_000, info["nid"].as_u64().unwrap())
        })
        .collect();
    let many = inspect("sub/many");
    let blocks = many["layout"]["blocks"].as_u64().unwrap();
    assert!(blocks >= 3, "{many}");
    let listing = (
        "sub/many",
        (many["layout"]["start_block"].as_u64().unwrap() + blocks - 1) * 4096 + 100,
        many["nid"].as_u64().unwrap(),
    );
    let log = t.path().join("log");
    let mut args = vec!["--log".to_string(), log.to_str().unwrap().to_string()];
    let mut images = vec![image.clone()];
    match served {
        Served::Plain => {}
        Served::Stacked => {
            let base = t.path().join("base");
            std::fs::create_dir_all(base.join("sub")).unwrap();
            std::fs::write(base.join("sub/from-base"), b"base").unwrap();
            let base_image = t.path().join("base.img");
            build(&base, &base_image, &["--quiet"]);
            images.push(base_image);
        }
        Served::Upper => {
            let d = dirs(t.path(), "rw");
            for (flag, dir) in [("--upper", &d.upper), ("--work", &d.work)] {
                args.push(flag.to_string());
                args.push(dir.to_str().unwrap().to_string());
            }
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let fuse = FuseMount::stack(&images, &t.path().join("fuse"), &args);
    // Flip one byte of each victim's data and of the listing's block in the image file
    // under the live mount (none has been read, so nothing of them is cached yet).
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .open(&image)
            .unwrap();
        for &(_, at, _) in victims.iter().chain([&listing]) {
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, at).unwrap();
            f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
        }
    }
    for (i, &(v, _, _)) in victims.iter().enumerate() {
        let err = std::fs::read(fuse.dir.join(v)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(5), "{v}: EIO, got {err}");
        // Blocks before the bad one read fine; none of the bad block's bytes come out.
        use std::io::Read;
        let mut f = std::fs::File::open(fuse.dir.join(v)).unwrap();
        let mut head = vec![0u8; 64 * 1024];
        f.read_exact(&mut head).unwrap();
        assert_eq!(head, content(i as u32)[..head.len()], "{v}");
    }
    let err = std::fs::read_dir(fuse.dir.join(listing.0))
        .and_then(|d| d.collect::<Result<Vec<_>, _>>())
        .expect_err("a listing with a bad block");
    assert_eq!(err.raw_os_error(), Some(5), "listing: EIO, got {err}");
    assert_eq!(
        std::fs::read(fuse.dir.join("bystander")).unwrap(),
        b"still fine"
    );
    // The FUSE engine names the request and the inode; the kernel engine, whose daemon
    // sees reads of the image file only, what the image stores at the failing offset.
    let kernel = kernel_engine(&fuse.said);
    let inode = |nid: u64| match served {
        Served::Stacked => format!("inode {nid} of layer 0"),
        _ => format!("inode {nid}"),
    };
    let named = |op: &str, name: &str, nid: u64| match (kernel, op) {
        (true, "readdir") => format!("(a directory block of /{name})"),
        (true, _) => format!("(the data of /{name})"),
        (false, _) => format!("{op} of /{name} ({}): ", inode(nid)),
    };
    let mut wanted: Vec<(String, u64)> = victims
        .iter()
        .map(|&(v, at, nid)| (named("read", v, nid), at))
        .collect();
    let (dir, at, nid) = listing;
    wanted.push((named("readdir", dir, nid), at));
    if served == Served::Upper {
        // Copying it up (an open for writing) reads the bad block too.
        let (v, at, nid) = victims[1];
        let err = std::fs::OpenOptions::new()
            .append(true)
            .open(fuse.dir.join(v))
            .expect_err("a copy-up of a tampered file");
        assert_eq!(
            err.raw_os_error(),
            Some(5),
            "copy-up of {v}: EIO, got {err}"
        );
        wanted.push((named("copy-up read", v, nid), at));
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    for (what, at) in &wanted {
        let block = at / 4096 * 4096;
        assert!(
            logged.lines().any(|l| l.contains(what)
                && l.contains("integrity error")
                && l.contains(&format!(" at byte {block} fails its hash"))),
            "no line \"{what}…\" naming block {block}: {logged}"
        );
    }
    // Each line is one failure, naming its file: none without a path.
    for l in logged.lines() {
        assert!(
            wanted.iter().any(|(what, _)| l.contains(what)),
            "a line naming no victim: {l}\n{logged}"
        );
    }
}

#[test]
fn many_concurrent_readers_all_get_the_right_bytes() {
    if prerequisites() {
        return;
    }
    let (t, src, image, _) = fixture(generate_tree);
    let fuse = FuseMount::new(&image, &t.path().join("fuse"), &["--threads", "4"]);
    // One digest of every file's path and contents, in a fixed order.
    let script = "find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum";
    let want = run(Command::new("sh").args(["-c", script]).current_dir(&src)).stdout;
    let readers: Vec<_> = (0..10)
        .map(|_| {
            Command::new("sh")
                .args(["-c", script])
                .current_dir(&fuse.dir)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for r in readers {
        let out = r.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, want, "a concurrent reader saw different bytes");
    }
}

#[test]
fn rootless_mount_by_an_ordinary_user() {
    if prerequisites() || lacks_test_user() {
        return;
    }
    // A directory the user owns, holding a copy of the binary it can run.
    let base = fresh_tmp_dir("rootless");
    std::fs::create_dir_all(base.join("mnt")).unwrap();
    let src = base.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/file"), b"rootless bytes").unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_verilay"), base.join("verilay")).unwrap();
    let image = base.join("img");
    build(&src, &image, &["--quiet"]);
    sh(&format!("chown -R verilaytest '{}'", base.display()));
    let as_user = |args: &str| as_test_user(&base, args);
    let out = as_user("./verilay mount img mnt");
    assert!(
        out.status.success(),
        "rootless mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        mount_type(&base.join("mnt")).as_deref(),
        Some("fuse.verilay")
    );
    let out = as_user("cat mnt/sub/file && stat -c '%U %a' mnt/sub/file");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("rootless bytes"), "{text}");
    let out = as_user("./verilay umount mnt");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mount_type(&base.join("mnt")), None, "unmounted");
    let _ = std::fs::remove_dir_all(&base);
}

/// Runs mount(8) with /sbin/mount.fuse.verilay (what it execs for this type) pointing at
/// this build for the duration.
fn mount8(cmd: &mut Command) {
    let helper = Path::new("/sbin/mount.fuse.verilay");
    let _ = std::fs::remove_file(helper);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_verilay"), helper).unwrap();
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_file(helper);
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A daemon told to stop (SIGTERM) as soon as its mount appears, before it is done
/// setting up, still takes the mount with it: signals are caught from before the mount
/// exists (their default action would leave a dead mount behind), on both engines.
#[test]
fn sigterm_as_the_mount_appears_leaves_no_mount() {
    let Some((_t, _src, image, mnt)) = one_file_mount_fixture(b"x") else {
        return;
    };
    let canon = std::fs::canonicalize(&mnt).unwrap();
    for engine in ["fuse", "kernel"] {
        for _ in 0..5 {
            let mut daemon = verilay()
                .arg("mount")
                .arg(&image)
                .arg(&mnt)
                .args(["--foreground", "--engine", engine])
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            wait_until(
                std::time::Duration::from_secs(20),
                "the mount to appear",
                || mount_type(&canon).is_some(),
            );
            let pid = rustix::process::Pid::from_raw(daemon.id() as i32).unwrap();
            rustix::process::kill_process(pid, rustix::process::Signal::Term).unwrap();
            daemon.wait().unwrap();
            assert_eq!(mount_type(&canon), None, "{engine}: a mount left behind");
        }
    }
}

#[test]
fn mount_helper_fstab_style_and_sigterm() {
    if prerequisites() {
        return;
    }
    let (t, _src, image, digest) =
        fixture(|src| std::fs::write(src.join("f"), b"via mount(8)").unwrap());
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut cmd = Command::new("mount");
    cmd.args(["-t", "fuse.verilay", "-o"])
        .arg(format!("ro,digest={}", digest.trim()))
        .arg(&image)
        .arg(&mnt);
    mount8(&mut cmd);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"via mount(8)");
    run(Command::new("umount").arg(&mnt));
    assert_eq!(mount_type(&mnt), None);

    // An fstab line (in a private fstab file: `mount -T FILE DIR`).
    let fstab = t.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{} {} fuse.verilay ro,nofail,digest={},threads=2 0 0\n",
            image.display(),
            mnt.display(),
            digest.trim()
        ),
    )
    .unwrap();
    mount8(Command::new("mount").arg("-T").arg(&fstab).arg(&mnt));
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"via mount(8)");
    run(Command::new("umount").arg(&mnt));

    // SIGTERM to the daemon unmounts cleanly.
    run(verilay().arg("mount").arg(&image).arg(&mnt));
    let pid = String::from_utf8(
        run(Command::new("pgrep").args([
            "-f",
            &format!("verilay mount {} {}", image.display(), mnt.display()),
        ]))
        .stdout,
    )
    .unwrap();
    run(Command::new("kill").args(["-TERM", pid.trim()]));
    wait_until(
        std::time::Duration::from_secs(10),
        "the mount to go after SIGTERM",
        || mount_type(&mnt).is_none(),
    );
}

/// Issue 36: SIGTERM ends a daemon within a bound. A lazily detached mount lives on while
/// a file on it is open, and its daemon with it; after its grace (10 s) the daemon aborts
/// the connection, so the open file's reads fail with ENOTCONN, and exits.
#[test]
fn sigterm_ends_the_daemon_within_a_bound_though_a_file_is_held_open() {
    use std::io::Read;
    let Some((_t, _src, image, mnt)) = one_file_mount_fixture(b"held") else {
        return;
    };
    run(verilay().arg("mount").arg(&image).arg(&mnt).args(FUSE));
    let mut held = std::fs::File::open(mnt.join("f")).unwrap();
    let daemons = daemons_of(&mnt);
    assert_eq!(daemons.len(), 1, "{daemons:?}");
    let signalled = std::time::Instant::now();
    run(Command::new("kill").args(["-TERM", &daemons[0].to_string()]));
    wait_until(
        std::time::Duration::from_secs(10),
        "the mount to be detached after SIGTERM",
        || mount_type(&mnt).is_none(),
    );
    wait_until(
        std::time::Duration::from_secs(30),
        "the daemon to end after SIGTERM with a file held open",
        || daemons_of(&mnt).is_empty(),
    );
    let took = signalled.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(9),
        "ended after {took:?}: no grace"
    );
    let err = held.read(&mut [0u8; 16]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
}

#[test]
fn inode_numbers_are_stable_and_unique() {
    if prerequisites() {
        return;
    }
    let (t, _src, image, _) = fixture(generate_tree);
    let inos = |dir: &Path| {
        let out = run(Command::new("find")
            .args([".", "-printf", "%i %n %y %p\\n"])
            .current_dir(dir));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = {
        let m = FuseMount::new(&image, &t.path().join("a"), &FUSE);
        inos(&m.dir)
    };
    let m = FuseMount::new(&image, &t.path().join("b"), &FUSE);
    assert_eq!(first, inos(&m.dir), "inode numbers change across mounts");
    // One number per inode: distinct paths share a number only as hardlinks.
    let mut seen = std::collections::HashMap::new();
    for line in first.lines() {
        let mut f = line.splitn(4, ' ');
        let (ino, nlink, kind, path) = (
            f.next().unwrap(),
            f.next().unwrap(),
            f.next().unwrap(),
            f.next().unwrap(),
        );
        if let Some(other) = seen.insert(ino.to_string(), path.to_string()) {
            assert!(
                kind != "d" && nlink != "1",
                "{path} and {other} share inode {ino}"
            );
        }
    }
}

#[test]
fn mount_errors_are_one_clear_line() {
    let Some((t, src, image, mnt)) = one_file_mount_fixture(b"x") else {
        return;
    };
    let fails = |args: &[&str], needle: &str| {
        let out = verilay().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    };
    let img = image.to_str().unwrap();
    let m = mnt.to_str().unwrap();
    let zero = format!("sha256:{}", "0".repeat(64));
    fails(&["mount", "--digest", &zero, img, m], "not the pinned");
    fails(&["mount", "/nonexistent.img", m], "/nonexistent.img");
    fails(
        &["mount", img, "/nonexistent-dir"],
        "mountpoint /nonexistent-dir",
    );
    let plain = t.path().join("plain");
    build(&src, &plain, &["--quiet", "--no-verity"]);
    fails(&["mount", plain.to_str().unwrap(), m], "no verity section");
    let busy = FuseMount::new(&image, &mnt, &[]);
    assert!(busy.said.contains("(not pinned)"), "{}", busy.said);
    fails(&["mount", img, m], "already mounted");
    assert_eq!(
        mount_type(&mnt).as_deref(),
        Some(single_image_type(&busy.said))
    );
    fails(&["umount", "/tmp"], "/tmp");
}

/// How often `ls -l DIR` asks for `security.selinux`, and what `getfattr` says of one name.
/// How many times `ls -l DIR` asks for the xattr `name`.
fn questions(dir: &Path, name: &str) -> usize {
    let out = run(Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=lgetxattr,getxattr",
            "-o",
            "/dev/stdout",
        ])
        .args(["ls", "-l"])
        .arg(dir));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("\"{name}\"")))
        .count()
}

fn getfattr_says(file: &Path, name: &str) -> String {
    let out = Command::new("getfattr")
        .args(["--absolute-names", "--only-values", "-n", name])
        .arg(file)
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn an_image_without_labels_or_acls_says_those_xattrs_are_unsupported() {
    if prerequisites()
        || skip_unless(have("strace"), "strace missing")
        || skip_unless(have("runuser"), "runuser missing")
    {
        return;
    }
    let files = |src: &Path| {
        for i in 0..40 {
            std::fs::write(src.join(format!("f{i:02}")), format!("{i}")).unwrap();
        }
        setfattr(&src.join("f00"), "user.note", "kept");
        sh(&format!("chmod 600 '{}'", src.join("f02").display()));
    };
    // No security.* and no ACL anywhere: every such name is "not supported", and ls asks
    // only once for each; getfacl still shows the mode, and the mode alone decides access.
    let (t, _src, image, _) = fixture(files);
    let m = FuseMount::new(
        &image,
        &t.path().join("fuse"),
        &["--allow-other", FUSE[0], FUSE[1]],
    );
    let f = m.dir.join("f00");
    for name in ["security.selinux", "system.posix_acl_access"] {
        let said = getfattr_says(&f, name);
        assert!(said.contains("Operation not supported"), "{name}: {said}");
    }
    assert!(getfattr_says(&f, "user.absent").contains("No such attribute"));
    assert_eq!(getfattr_says(&f, "user.note"), "kept");
    assert_eq!(questions(&m.dir, "security.selinux"), 1);
    assert_eq!(questions(&m.dir, "system.posix_acl_access"), 1);
    let facl = run(Command::new("getfacl").arg("-c").arg(m.dir.join("f02")));
    assert_eq!(
        String::from_utf8_lossy(&facl.stdout),
        "user::rw-\ngroup::---\nother::---\n\n"
    );
    let as_nobody = |script: &str| {
        Command::new("runuser")
            .args(["-u", "nobody", "--", "sh", "-c", script])
            .current_dir(&m.dir)
            .output()
            .unwrap()
    };
    assert_eq!(as_nobody("cat f01").stdout, b"1");
    assert!(!as_nobody("cat f02").status.success(), "mode 600 denies");

    // One label and one ACL in the image: the others are merely absent, and ls asks for
    // every file.
    let (t, _src, image, _) = fixture(|src| {
        files(src);
        setfattr(&src.join("f01"), "security.test", "label");
        sh(&format!(
            "setfacl -m u:nobody:r-- '{}'",
            src.join("f02").display()
        ));
    });
    let m = FuseMount::new(
        &image,
        &t.path().join("fuse"),
        &["--allow-other", FUSE[0], FUSE[1]],
    );
    for name in ["security.selinux", "system.posix_acl_access"] {
        let said = getfattr_says(&m.dir.join("f00"), name);
        assert!(said.contains("No such attribute"), "{name}: {said}");
    }
    assert_eq!(getfattr_says(&m.dir.join("f01"), "security.test"), "label");
    assert!(questions(&m.dir, "security.selinux") >= 40);
    assert!(questions(&m.dir, "system.posix_acl_access") >= 40);
    let as_nobody = Command::new("runuser")
        .args(["-u", "nobody", "--", "cat", "f02"])
        .current_dir(&m.dir)
        .output()
        .unwrap();
    assert_eq!(as_nobody.stdout, b"2", "the ACL allows");
}

/// Re-seals `image` after changing its EROFS bytes: the verity section then vouches for the
/// damaged bytes, as it would for a hostile image built on purpose.
fn reseal(image: &Path, change: impl FnOnce(&mut Vec<u8>)) {
    let bytes = std::fs::read(image).unwrap();
    let t = &bytes[bytes.len() - 64..];
    let erofs_len = u64::from_le_bytes(t[16..24].try_into().unwrap()) as usize;
    let mut erofs = bytes[..erofs_len].to_vec();
    change(&mut erofs);
    let params = verity::Params::new(verity::HashAlg::Sha256, 4096, Vec::new()).unwrap();
    let mut level0 = vec![0u8; erofs.len().div_ceil(4096) * 32];
    verity::hash_blocks(&params, &[], &erofs, &mut level0);
    std::fs::write(image, &erofs).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    verity::appended::append(&f, &params, erofs.len() as u64, level0).unwrap();
}

#[test]
fn a_hostile_image_gives_errors_not_a_dead_daemon() {
    if prerequisites() {
        return;
    }
    let (t, _src, image, _) = fixture(|src| {
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("d/victim"), vec![7u8; 10_000]).unwrap();
        std::fs::write(src.join("fine"), b"fine").unwrap();
    });
    let info: serde_json::Value = serde_json::from_slice(
        &run(verilay()
            .args(["inspect", "--json"])
            .arg(&image)
            .arg("d/victim"))
        .stdout,
    )
    .unwrap();
    let ino = info["inode"]["offset"].as_u64().unwrap() as usize;
    // A hostile inode: an unknown format and layout, and a size pointing far outside,
    // with the superblock checksum fixed up as a deliberate attacker would.
    reseal(&image, |b| {
        b[ino] = 0xFF;
        b[ino + 1] = 0xFF;
        b[ino + 8..ino + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = erofs::format::superblock_checksum(b, 4096).unwrap();
        b[1028..1032].copy_from_slice(&crc.to_le_bytes());
    });
    run(verilay().arg("verify").arg(&image).arg("--quiet"));
    let m = FuseMount::new(&image, &t.path().join("fuse"), &FUSE);
    for _ in 0..3 {
        let err = std::fs::read(m.dir.join("d/victim")).unwrap_err();
        assert!(err.raw_os_error().is_some(), "{err}");
    }
    // The daemon is alive and everything else still serves.
    assert_eq!(std::fs::read(m.dir.join("fine")).unwrap(), b"fine");
    let out = Command::new("ls").arg("-lR").arg(&m.dir).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("fine"));
    assert_eq!(mount_type(&m.dir).as_deref(), Some("fuse.verilay"));
}

/// `verilay stats --json DIR`, run as `as_user` (the test user) or root.
fn stats_as(dir: &Path, as_user: bool) -> Result<serde_json::Value, String> {
    let mut cmd = if as_user {
        let mut c = Command::new("runuser");
        c.args(["-u", "verilaytest", "--"]);
        c.arg(env!("CARGO_BIN_EXE_verilay"));
        c
    } else {
        verilay()
    };
    let out = cmd.args(["stats", "--json"]).arg(dir).output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

/// The GETXATTR and LISTXATTR requests the mount at `dir` has received.
fn xattr_requests(dir: &Path) -> (u64, u64) {
    let s = stats_as(dir, false).unwrap();
    let r = &s["xattr_requests"];
    (
        r["getxattr"].as_u64().unwrap_or_else(|| panic!("{s}")),
        r["listxattr"].as_u64().unwrap(),
    )
}

/// Whatever a tree of `ls -lR`, `getfattr -R -d`, `getfacl -R`, `find -exec` and an exec
/// asks of a mount's xattrs (each tool asks in its own way).
fn walk_everything(dir: &Path) {
    for script in [
        "ls -lR . >/dev/null",
        "getfattr -R -d -m - . >/dev/null 2>&1 || true",
        "getfacl -R . >/dev/null 2>&1 || true",
        "find . -type f -exec getfattr -n security.capability {} + >/dev/null 2>&1 || true",
        "./tool",
    ] {
        run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
    }
}

/// An image without a single xattr (in a stack of two such, and measured too): the mount
/// answers GETXATTR and LISTXATTR with ENOSYS, so every xattr call says "Operation not
/// supported" and, after the first of each, none reaches the daemon any more: not for
/// `ls -lR`, getfattr, getfacl nor an exec, as the stats' request counts show. Contents,
/// listings and modes are the kernel's erofs's.
#[test]
fn an_image_without_xattrs_answers_enosys_and_the_kernel_stops_asking() {
    if prerequisites() || skip_unless(have("getfattr"), "getfattr missing") {
        return;
    }
    let (t, _src, image, _) = fixture(|src| {
        std::fs::create_dir_all(src.join("d/e")).unwrap();
        for i in 0..30 {
            std::fs::write(src.join(format!("d/f{i:02}")), format!("{i}")).unwrap();
        }
        std::fs::write(src.join("d/e/deep"), b"deep").unwrap();
        std::fs::write(src.join("tool"), b"#!/bin/sh\nexit 0\n").unwrap();
        sh(&format!("chmod 755 '{}'", src.join("tool").display()));
        std::os::unix::fs::symlink("d/f00", src.join("link")).unwrap();
    });
    let info = run(verilay().args(["inspect", "--json"]).arg(&image));
    let info = String::from_utf8_lossy(&info.stdout).into_owned();
    let kernel = Mount::erofs(&image, &t.path().join("kernel"));
    // The oracle's own answer for a name no file has.
    let said = getfattr_says(&kernel.dir.join("d/f00"), "user.x");
    assert!(said.contains("No such attribute"), "kernel: {said}");
    let policy = t.path().join("policy");
    std::fs::write(&policy, "measure func=FILE_CHECK\n").unwrap();
    let list = t.path().join("list");
    std::fs::create_dir_all(&list).unwrap();
    let measured = [
        "--policy",
        policy.to_str().unwrap(),
        "--measure-log",
        list.to_str().unwrap(),
    ];
    let mounts: [(&str, Vec<PathBuf>, &[&str]); 3] = [
        ("one", vec![image.clone()], &[]),
        ("stack", vec![image.clone(), image.clone()], &[]),
        ("measured", vec![image.clone()], &measured),
    ];
    for (name, images, extra) in mounts {
        let m = FuseMount::stack(&images, &t.path().join(name), &[extra, &FUSE].concat());
        let f = m.dir.join("d/f00");
        let before = xattr_requests(&m.dir);
        for (what, args) in [
            ("get", &["-n", "user.x"][..]),
            ("get", &["-n", "security.selinux"]),
            ("list", &["-d"]),
        ] {
            let out = Command::new("getfattr")
                .args(args)
                .arg(&f)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("Operation not supported"),
                "{name}: getfattr {args:?} ({what}): {err} (image {info})"
            );
        }
        let first = xattr_requests(&m.dir);
        assert_eq!(
            (first.0 - before.0, first.1 - before.1),
            (1, 1),
            "{name}: one GETXATTR and one LISTXATTR reach the daemon"
        );
        // ACL names: no ACL, from the kernel alone (`__fuse_get_acl` once `no_getxattr`),
        // which is the kernel's erofs's answer too.
        for acl in ["system.posix_acl_access", "system.posix_acl_default"] {
            let said =
                |d: &Path| getfattr_says(&d.join("d"), acl).replace(&*d.to_string_lossy(), "M");
            assert_eq!(said(&m.dir), said(&kernel.dir), "{name}: {acl}");
        }
        if images.len() == 1 {
            assert_eq!(acl_dump(&m.dir), acl_dump(&kernel.dir), "{name}: getfacl");
        }
        walk_everything(&m.dir);
        assert_eq!(
            xattr_requests(&m.dir),
            first,
            "{name}: the kernel asks again"
        );
        if images.len() == 1 {
            assert_eq!(ls_lr(&m.dir), ls_lr(&kernel.dir), "{name}");
            assert_diff_clean(&kernel.dir, &m.dir);
        }
        if name == "measured" {
            let s = stats_as(&m.dir, false).unwrap();
            assert!(s["checked"].as_u64().unwrap() > 0, "{s}");
        }
        drop(m);
        wait_daemon_gone(&t.path().join(name));
    }
}

/// One xattr on one file is enough to keep today's answers: every file's xattrs equal
/// the kernel's erofs's, an absent name is ENODATA as there, and the kernel goes on
/// asking (each `ls -lR` reaches the daemon again).
#[test]
fn an_image_with_one_xattr_keeps_answering_like_the_kernel() {
    if prerequisites() || skip_unless(have("getfattr"), "getfattr missing") {
        return;
    }
    let (t, _src, image, _) = fixture(|src| {
        for i in 0..10 {
            std::fs::write(src.join(format!("f{i}")), format!("{i}")).unwrap();
        }
        setfattr(&src.join("f3"), "user.x", "1");
    });
    let kernel = Mount::erofs(&image, &t.path().join("kernel"));
    let m = FuseMount::new(&image, &t.path().join("fuse"), &FUSE);
    assert_eq!(xattr_dump(&m.dir), xattr_dump(&kernel.dir));
    for (file, name) in [("f3", "user.x"), ("f3", "user.y"), ("f4", "user.x")] {
        assert_eq!(
            getfattr_says(&m.dir.join(file), name).replace(&*m.dir.to_string_lossy(), "M"),
            getfattr_says(&kernel.dir.join(file), name)
                .replace(&*kernel.dir.to_string_lossy(), "M"),
            "{file} {name}"
        );
    }
    let before = xattr_requests(&m.dir);
    run(Command::new("ls").arg("-lR").arg(&m.dir));
    let after = xattr_requests(&m.dir);
    assert!(
        after.0 > before.0,
        "ls -lR asked nothing: {before:?} {after:?}"
    );
}

/// `verilay stats` reaches every kind of mount through its socket: read-only with and
/// without xattrs, writable, rootless; and answers exactly whom getxattr of the mount root
/// answered: the mount's owner alone by default, every user with `--allow-other` unless
/// the root's mode shuts them out, never root on an ordinary user's mount.
#[test]
fn verilay_stats_answers_every_mount_and_only_whom_the_mount_lets_in() {
    if prerequisites() || lacks_test_user() {
        return;
    }
    let base = fresh_tmp_dir("stats");
    let tree = |name: &str, xattr: bool, root_mode: u32| {
        let src = base.join(format!("{name}-src"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("f"), b"f").unwrap();
        if xattr {
            setfattr(&src.join("f"), "user.x", "1");
        }
        sh(&format!("chmod {root_mode:o} '{}'", src.display()));
        let image = base.join(format!("{name}.img"));
        build(&src, &image, &["--quiet"]);
        image
    };
    let labelled = tree("labelled", true, 0o755);
    let bare = tree("bare", false, 0o755);
    let closed = tree("closed", false, 0o700);
    let d = dirs(&base, "rw");
    let cases: [(&str, &Path, &[&str], bool); 5] = [
        ("labelled", &labelled, &[], false),
        ("bare", &bare, &["--allow-other"], true),
        ("closed", &closed, &["--allow-other"], false),
        ("writable", &labelled, &[], false),
        ("writable-all", &bare, &["--allow-other"], true),
    ];
    for (name, image, extra, others) in cases {
        let mnt = base.join(name);
        let mut extra = extra.to_vec();
        let (up, work) = (d.upper.to_str().unwrap(), d.work.to_str().unwrap());
        if name.starts_with("writable") {
            extra.extend(["--upper", up, "--work", work]);
        }
        let m = FuseMount::new(image, &mnt, &[&extra[..], &FUSE].concat());
        let root = stats_as(&m.dir, false).unwrap_or_else(|e| panic!("{name}: root: {e}"));
        assert_eq!(root["policy_rules"], 0, "{name}: {root}");
        let user = stats_as(&m.dir, true);
        assert_eq!(user.is_ok(), others, "{name}: the test user: {user:?}");
        if let Err(e) = user {
            assert!(e.contains("Permission denied"), "{name}: {e}");
        }
        // Today's channel answers the same users where the mount answers xattrs at all.
        if image == labelled.as_path() || name.starts_with("writable") {
            let script = format!("getfattr --only-values -n verilay.stats {name}");
            let xattr = as_test_user(&base, &script);
            assert_eq!(xattr.status.success(), others, "{name}: {xattr:?}");
        }
        drop(m);
        wait_daemon_gone(&mnt);
    }
    // An ordinary user's mount: theirs to read, not root's (the kernel lets nobody else
    // in without allow_other).
    std::fs::create_dir_all(base.join("rootless")).unwrap();
    sh(&format!("chown -R verilaytest '{}'", base.display()));
    let verilay = env!("CARGO_BIN_EXE_verilay");
    let out = as_test_user(&base, &format!("{verilay} mount bare.img rootless"));
    assert!(out.status.success(), "{out:?}");
    let u = Unmount::fuse(&base.join("rootless"));
    let theirs = stats_as(&u.dir, true);
    let root = stats_as(&u.dir, false);
    as_test_user(&base, &format!("{verilay} umount rootless"));
    let theirs = theirs.unwrap();
    assert_eq!(theirs["xattr_requests"]["getxattr"], 0, "{theirs}");
    let e = root.unwrap_err();
    assert!(e.contains("Permission denied"), "root: {e}");
    drop(u);
    let _ = std::fs::remove_dir_all(&base);
}

/// The kernel reads two 1 MiB requests ahead of a sequential reader of a FUSE-engine
/// mount (one is served while the other is verified), over either transport: the mount's
/// bdi says so, where the kernel's default for FUSE is 128 KiB.
#[test]
fn a_fuse_mount_reads_two_requests_ahead() {
    let Some((_t, _src, image, mnt)) = one_file_mount_fixture(b"x") else {
        return;
    };
    for transport in ["uring", "dev"] {
        let m = FuseMount::new(
            &image,
            &mnt,
            &[&FUSE[..], &["--transport", transport]].concat(),
        );
        use std::os::unix::fs::MetadataExt as _;
        let dev = std::fs::metadata(&m.dir).unwrap().dev();
        let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
        let kib = std::fs::read_to_string(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"))
            .unwrap();
        assert_eq!(kib.trim(), "2048", "{transport}: {}", m.said);
    }
}
