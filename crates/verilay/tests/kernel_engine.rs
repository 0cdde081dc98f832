//! The kernel engine (`--engine kernel`): the kernel's erofs over image files the daemon
//! serves and verifies, overlayfs for stacks. Checked against the source tree, the
//! FUSE engine's mount of the same images and the kernel's own erofs mount of the image
//! file; tampering under a live mount; what users see of the private mounts; how
//! `auto` chooses.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn prerequisites() -> bool {
    skip_unless(is_root(), "needs root (erofs mounts)")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
}

/// A `verilay mount ENGINE IMAGES… DIR` with a daemon log, unmounted (and its daemon
/// waited for) when dropped.
struct EngineMount {
    dir: PathBuf,
    said: String,
    log: PathBuf,
}

impl EngineMount {
    fn new(engine: &str, images: &[&Path], dir: &Path, extra: &[&str]) -> EngineMount {
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.with_extension("daemon.log");
        let out = run(verilay()
            .arg("mount")
            .args(images)
            .arg(dir)
            .args(["--engine", engine, "--log"])
            .arg(&log)
            .args(extra));
        EngineMount {
            dir: dir.to_path_buf(),
            said: String::from_utf8_lossy(&out.stderr).into_owned(),
            log,
        }
    }
}

impl Drop for EngineMount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Ok(text) = std::fs::read_to_string(&self.log) {
                eprintln!("daemon log of {}:\n{text}", self.dir.display());
            }
        }
        let _ = verilay().arg("umount").arg(&self.dir).status();
    }
}

/// `verilay stats --json` of the mount on `dir`.
fn stats(dir: &Path) -> serde_json::Value {
    let out = run(verilay().args(["stats", "--json"]).arg(dir));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A mount of `images` measured under `policy` into the list directory `list`, with
/// `extra` options.
fn measured_mount(
    engine: &str,
    images: &[&Path],
    mnt: &Path,
    policy: &Path,
    list: &Path,
    extra: &[&str],
) -> EngineMount {
    let mut args = vec![
        "--policy",
        policy.to_str().unwrap(),
        "--measure-log",
        list.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    EngineMount::new(engine, images, mnt, &args)
}

/// (fstype, source, options) of the mount on `dir`, from /proc/self/mountinfo.
fn mount_of(dir: &Path) -> Option<(String, String, String)> {
    let canon = std::fs::canonicalize(dir).ok()?;
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let f: Vec<&str> = left.split(' ').collect();
        (Path::new(f.get(4)?) == canon).then(|| {
            let r: Vec<&str> = right.split(' ').collect();
            (r[0].to_string(), r[1].to_string(), r[2].to_string())
        })
    })
}

/// Every mount the daemons `pids` made under the engine's private directory (one per
/// daemon, `/run/verilay/engine/PID.N`) that is still in view (the user's mount names
/// its detached image file or layers as its source or options). Other tests' daemons,
/// setting up their mounts meanwhile, have theirs in view for a moment.
fn private_mounts(pids: &[u32]) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split(' ').nth(4).is_some_and(|p| {
                pids.iter()
                    .any(|pid| p.starts_with(&format!("/run/verilay/engine/{pid}.")))
            })
        })
        .map(str::to_string)
        .collect()
}

/// One image: the kernel engine's tree equals the source, the kernel's erofs mount of
/// the image file and the FUSE engine's (contents, stat, xattrs, ACLs); the mount is
/// erofs, read-only, with none of its private mounts in view; `umount` returns once the
/// daemon is gone.
#[test]
fn one_image_is_the_kernel_erofs_tree_and_the_fuse_engine_tree() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let src = generated_src(t.path());
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let kernel = EngineMount::new("kernel", &[&image], &t.path().join("k"), &[]);
    assert!(
        kernel.said.contains("kernel engine (asked for)"),
        "{}",
        kernel.said
    );
    let (fstype, _, opts) = mount_of(&kernel.dir).expect("mounted");
    assert_eq!(fstype, "erofs");
    assert!(opts.starts_with("ro"), "{opts}");
    let pids = daemons_of(&kernel.dir);
    assert!(
        private_mounts(&pids).is_empty(),
        "{:?}",
        private_mounts(&pids)
    );
    assert_eq!(pids.len(), 1);
    let stats = stats(&kernel.dir);
    assert_eq!(stats["engine"], "kernel", "{stats}");
    assert_eq!(stats["engine_why"], "asked for", "{stats}");
    let fuse = EngineMount::new("fuse", &[&image], &t.path().join("f"), &[]);
    assert_eq!(mount_of(&fuse.dir).unwrap().0, "fuse.verilay");
    let plain = Mount::erofs(&image, &t.path().join("e"));
    assert_diff_clean(&src, &kernel.dir);
    assert_same_stats(&plain.dir, &kernel.dir);
    assert_same_stats(&fuse.dir, &kernel.dir);
    assert_eq!(xattr_dump(&fuse.dir), xattr_dump(&kernel.dir));
    assert_eq!(acl_dump(&fuse.dir), acl_dump(&kernel.dir));
    assert_eq!(ls_lr(&plain.dir), ls_lr(&kernel.dir));
    // umount waits for the daemon: it serves until the kernel lets go of the image file.
    let dir = kernel.dir.clone();
    drop(kernel);
    assert!(mount_of(&dir).is_none());
    assert!(daemons_of(&dir).is_empty(), "the daemon outlived umount");
    assert!(
        private_mounts(&pids).is_empty(),
        "{:?}",
        private_mounts(&pids)
    );
}

/// A stack of three images with whiteouts and an opaque directory: the kernel engine's
/// overlayfs tree equals the FUSE engine's; the layers' erofs mounts are out of view.
#[test]
fn a_stack_is_the_fuse_engine_stack() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let layer = |name: &str, script: &str| {
        let dir = t.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        sh(&format!("cd {} && {script}", dir.display()));
        let image = t.path().join(format!("{name}.img"));
        build(&dir, &image, &["--quiet"]);
        image
    };
    let bottom = layer(
        "bottom",
        "mkdir -p d gone keep && echo a > d/a && echo b > gone/b && echo k > keep/k && echo 1 > f",
    );
    let middle = layer(
        "middle",
        "mkdir -p d && echo a2 > d/a && mknod gone c 0 0 && echo 2 > f2 && setfattr -n user.m -v 1 f2",
    );
    let top = layer(
        "top",
        "mkdir -p keep && setfattr -n trusted.overlay.opaque -v y keep && echo n > keep/new && ln -s f2 link",
    );
    let images: [&Path; 3] = [&top, &middle, &bottom];
    let kernel = EngineMount::new("kernel", &images, &t.path().join("k"), &[]);
    assert_eq!(mount_of(&kernel.dir).unwrap().0, "overlay");
    let pids = daemons_of(&kernel.dir);
    assert!(
        private_mounts(&pids).is_empty(),
        "{:?}",
        private_mounts(&pids)
    );
    let fuse = EngineMount::new("fuse", &images, &t.path().join("f"), &[]);
    let listing = |d: &Path| find_sorted(d, "%p %y %m %s %U %G %l\\n");
    let seen = listing(&kernel.dir);
    assert_eq!(seen, listing(&fuse.dir));
    assert!(
        seen.iter().any(|l| l.starts_with("./keep/new ")),
        "{seen:?}"
    );
    assert!(!seen.iter().any(|l| l.starts_with("./keep/k ")), "{seen:?}");
    assert!(!seen.iter().any(|l| l.starts_with("./gone")), "{seen:?}");
    assert_eq!(std::fs::read(kernel.dir.join("d/a")).unwrap(), b"a2\n");
    assert_diff_clean(&fuse.dir, &kernel.dir);
    assert_eq!(xattr_dump(&fuse.dir), xattr_dump(&kernel.dir));
}

/// A byte flipped in the image file under a live kernel-engine mount: once the caches
/// are dropped the read fails with EIO, and the log names the image, the offset and the
/// file the block belongs to; the rest of the tree still reads.
#[test]
fn a_byte_flipped_under_a_live_mount_is_eio_naming_the_file() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let big: Vec<u8> = (0..1_000_000u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    std::fs::write(src.join("big"), &big).unwrap();
    std::fs::write(src.join("small"), b"still fine").unwrap();
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let m = EngineMount::new("kernel", &[&image], &t.path().join("k"), &[]);
    assert!(std::fs::read(m.dir.join("big")).unwrap() == big);
    // The file's data: where its first 4 KiB are in the image (stored uncompressed).
    let bytes = std::fs::read(&image).unwrap();
    let at = bytes
        .windows(4096)
        .position(|w| w == &big[..4096])
        .expect("the file's first block in the image") as u64;
    let flip = at + 5 * 4096 + 17;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap();
        f.write_all_at(&[bytes[flip as usize] ^ 0x40], flip)
            .unwrap();
        f.sync_all().unwrap();
    }
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let err = std::fs::read(m.dir.join("big")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_eq!(std::fs::read(m.dir.join("small")).unwrap(), b"still fine");
    let log = std::fs::read_to_string(&m.log).unwrap();
    let block = flip / 4096 * 4096;
    assert!(
        log.lines().any(|l| l.contains(&image.display().to_string())
            && l.contains("the data of /big")
            && l.contains(&format!("block at byte {block} fails its hash"))),
        "{log}"
    );
}

/// As root, `auto` serves a plain mount and a measured writable one with the kernel
/// engine and says why (what it leaves to the FUSE engine: `auto_picks_fuse_for_an_
/// ordinary_user`, and remote images, `a_remote_image_mounts_on_the_kernel_engine_…`).
#[test]
fn auto_picks_the_kernel_engine_as_root_and_says_why() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let (policy, list, mnt) = (
        t.path().join("policy"),
        t.path().join("list"),
        t.path().join("m"),
    );
    std::fs::write(&policy, "measure func=FILE_CHECK\n").unwrap();
    let d = dirs(t.path(), "w");
    let measured = [
        "--policy",
        policy.to_str().unwrap(),
        "--measure-log",
        list.to_str().unwrap(),
        "--upper",
        d.upper.to_str().unwrap(),
        "--work",
        d.work.to_str().unwrap(),
    ];
    let why = "root, and the kernel has file-backed erofs";
    for extra in [&measured[..], &[]] {
        let m = EngineMount::new("auto", &[&image], &mnt, extra);
        assert!(
            m.said.contains(&format!("kernel engine ({why})")),
            "{}",
            m.said
        );
        let stats = stats(&m.dir);
        assert_eq!(stats["engine"], "kernel", "{stats}");
        assert_eq!(stats["engine_why"], why, "{stats}");
        let fstype = if extra.is_empty() { "erofs" } else { "overlay" };
        assert_eq!(mount_of(&m.dir).unwrap().0, fstype);
    }
}

/// The writes a container makes: new files, an append to an image file, a renamed
/// image directory, deletions (a whiteout, an opaque directory made anew), a chmod, a
/// symlink, a hard link and an xattr.
const WORKLOAD: &str = "echo new > new && echo more >> d/a && mv d d2 && rm x && \
    rm -r keep && mkdir keep && echo fresh > keep/k2 && chmod 600 d2/b && \
    ln -s d2/a link && ln new hard && setfattr -n user.w -v 1 new && mkdir -p deep/er";

/// Two layers for the writable tests: (top, bottom) images.
fn writable_layers(t: &Path) -> (PathBuf, PathBuf) {
    let layer = |name: &str, script: &str| {
        let dir = t.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        sh(&format!("cd {} && {script}", dir.display()));
        let image = t.join(format!("{name}.img"));
        build(&dir, &image, &["--quiet"]);
        image
    };
    let bottom = layer(
        "bottom",
        "mkdir -p d keep && echo a > d/a && echo b > d/b && echo k > keep/k && echo x > x",
    );
    let top = layer("top", "mkdir -p d && echo c > d/c");
    (top, bottom)
}

/// `find` of a tree: path, type, mode, size, owner, link target and link count.
fn listing(dir: &Path) -> Vec<String> {
    find_sorted(dir, "%p %y %m %s %U %G %l %n\\n")
}

/// `find -printf FORMAT` of the tree at `dir`, run from inside it, lines sorted.
fn find_sorted(dir: &Path, format: &str) -> Vec<String> {
    let out = run(Command::new("find")
        .args([".", "-printf", format])
        .current_dir(dir));
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// A writable kernel-engine mount is kernel overlayfs over the erofs layers and the
/// claimed directories (locked: a second mount of them is refused by either engine);
/// the same workload on the FUSE engine gives the same tree; and each engine's upper
/// directory mounts with the other engine, showing what was written.
#[test]
fn a_writable_mount_is_kernel_overlayfs_and_its_upper_directory_is_the_fuse_engines() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let (top, bottom) = writable_layers(t.path());
    let images: [&Path; 2] = [&top, &bottom];
    let mut trees = Vec::new();
    for (engine, other) in [("kernel", "fuse"), ("fuse", "kernel")] {
        let d = dirs(t.path(), engine);
        let dirs_args = [
            "--upper",
            d.upper.to_str().unwrap(),
            "--work",
            d.work.to_str().unwrap(),
        ];
        let mnt = t.path().join(format!("m-{engine}"));
        let m = EngineMount::new(engine, &images, &mnt, &dirs_args);
        let (fstype, _, opts) = mount_of(&m.dir).unwrap();
        if engine == "kernel" {
            assert_eq!(fstype, "overlay");
            let upper = std::fs::canonicalize(&d.upper).unwrap();
            assert!(
                opts.contains(&format!("upperdir={}", upper.display())),
                "{opts}"
            );
            let pids = daemons_of(&m.dir);
            assert!(
                private_mounts(&pids).is_empty(),
                "{:?}",
                private_mounts(&pids)
            );
        }
        // Both engines' locks hold the directories: neither engine takes them again.
        for second in ["kernel", "fuse"] {
            let again = t.path().join(format!("again-{engine}-{second}"));
            std::fs::create_dir_all(&again).unwrap();
            let out = verilay()
                .arg("mount")
                .args(images)
                .arg(&again)
                .args(["--engine", second])
                .args(dirs_args)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{engine} then {second}: {err}");
            assert!(mount_of(&again).is_none(), "{engine} then {second}");
        }
        sh(&format!("cd {} && {WORKLOAD}", m.dir.display()));
        let seen = (listing(&m.dir), xattr_dump(&m.dir));
        assert!(
            seen.0.iter().any(|l| l.starts_with("./d2/a f 644 7 ")),
            "{:?}",
            seen.0
        );
        drop(m);
        // The upper directory this engine wrote, mounted by the other engine.
        let m = EngineMount::new(other, &images, &mnt, &dirs_args);
        assert_eq!(
            (listing(&m.dir), xattr_dump(&m.dir)),
            seen,
            "{engine} wrote, {other} read"
        );
        assert_eq!(std::fs::read(m.dir.join("d2/a")).unwrap(), b"a\nmore\n");
        drop(m);
        trees.push(seen);
    }
    assert_eq!(
        trees[0], trees[1],
        "the kernel engine's tree, then the FUSE engine's"
    );
}

/// An ordinary user gets the FUSE engine from `auto`, told why, and is refused `kernel`.
#[test]
fn auto_picks_fuse_for_an_ordinary_user() {
    if prerequisites() || lacks_test_user() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"rootless").unwrap();
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    sh(&format!(
        "chmod 755 {0} && chmod 644 {0}/img",
        t.path().display()
    ));
    let mnt = t.path().join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    sh(&format!("chown verilaytest {}", mnt.display()));
    let exe = env!("CARGO_BIN_EXE_verilay");
    let out = as_test_user(
        t.path(),
        &format!("{exe} mount --engine kernel img m; echo rc=$?"),
    );
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("engine=kernel: erofs mounts need root"),
        "{said}"
    );
    assert!(said.contains("rc=1"), "{said}");
    // uid 0 in a user namespace of its own (rootless podman's) is not root to erofs.
    let out = Command::new("unshare")
        .args(["-U", "-r", exe, "mount", "--engine", "kernel"])
        .arg(&image)
        .arg(&mnt)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("engine=kernel: erofs mounts need root (in the first user namespace)"),
        "{err}"
    );
    let out = as_test_user(
        t.path(),
        &format!("VERILAY_ENGINE=auto {exe} mount img m && cat m/f && {exe} umount m"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(out.stdout, b"rootless");
    assert!(err.contains("fuse engine (erofs mounts need root"), "{err}");
}

/// A stack of an image holding a program and one holding files, and a policy measuring
/// reads (FILE_CHECK) and execs (BPRM_CHECK): (tempdir, images top first, policy).
fn measured_fixture() -> (tempfile::TempDir, [PathBuf; 2], PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let bin = t.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/true", bin.join("true")).unwrap();
    let files = t.path().join("files");
    std::fs::create_dir_all(files.join("d")).unwrap();
    for n in ["a", "b", "c"] {
        std::fs::write(files.join("d").join(n), format!("file {n}\n")).unwrap();
    }
    let images = [t.path().join("bin.img"), t.path().join("files.img")];
    build(&bin, &images[0], &["--quiet"]);
    build(&files, &images[1], &["--quiet"]);
    let policy = t.path().join("policy");
    std::fs::write(
        &policy,
        "measure func=FILE_CHECK mask=MAY_READ\nmeasure func=BPRM_CHECK\n",
    )
    .unwrap();
    (t, images, policy)
}

/// The entries of `engine`'s closed list, sorted, once evmctl and `verilay log verify`
/// accept it.
fn accepted_entries(list: &Path, engine: &str) -> Vec<String> {
    assert!(
        evmctl_accepts(list),
        "evmctl rejects the {engine} engine's list"
    );
    let out = verilay()
        .args(["log", "verify"])
        .arg(list)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut e = entries(list);
    e.sort();
    e
}

/// The list's entries (ascii), without the boot aggregate.
fn entries(list: &Path) -> Vec<String> {
    std::fs::read_to_string(list.join("ascii_runtime_measurements"))
        .unwrap()
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// `workload` (a shell script run in the mount) on a measured mount of the
/// `measured_fixture` stack on each engine (kernel first; writable with `writable`), on
/// the same mountpoint; `check` sees each mount before it goes. The lists' entries,
/// sorted, once evmctl and `verilay log verify` accept them.
fn lists_of_both_engines(
    t: &Path,
    (images, policy): (&[PathBuf; 2], &Path),
    writable: bool,
    workload: &str,
    check: impl Fn(&str, &EngineMount),
) -> [Vec<String>; 2] {
    let images: Vec<&Path> = images.iter().map(PathBuf::as_path).collect();
    let mnt = t.join("m");
    ["kernel", "fuse"].map(|engine| {
        let list = t.join(format!("list-{engine}"));
        let d = dirs(t, engine);
        let rw = [
            "--upper",
            d.upper.to_str().unwrap(),
            "--work",
            d.work.to_str().unwrap(),
        ];
        let extra: &[&str] = if writable { &rw } else { &[] };
        let m = measured_mount(engine, &images, &mnt, policy, &list, extra);
        sh(&format!("cd {} && {workload}", m.dir.display()));
        check(engine, &m);
        drop(m);
        accepted_entries(&list, engine)
    })
}

/// The same measured workload (reads, an exec, each a hundred times) on both engines, on
/// the same mountpoint: the same entries, which evmctl and `verilay log verify` accept;
/// the kernel engine asks the policy once per file and kind of open (ignore marks), and
/// for every open when a rule depends on who opens.
#[test]
fn measured_opens_give_the_same_list_on_both_engines() {
    if prerequisites() || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)") {
        return;
    }
    let (t, images, policy) = measured_fixture();
    let workload = "for i in $(seq 100); do cat d/a d/b >/dev/null && ./true; done";
    let lists = lists_of_both_engines(t.path(), (&images, &policy), false, workload, |e, m| {
        let stats = stats(&m.dir);
        if e == "kernel" {
            // Two reads and an exec (BPRM_CHECK and FILE_CHECK): four checks in all.
            assert_eq!(stats["checked"], 4, "{stats}");
            assert_eq!(stats["engine"], "kernel", "{stats}");
        }
    });
    assert_eq!(lists[0].len(), 3, "{:?}", lists[0]);
    assert_eq!(
        lists[0], lists[1],
        "kernel engine's entries, then the FUSE engine's"
    );
    // A rule on who opens: no ignore mark is exact, so every open is asked about.
    let by_uid = t.path().join("by-uid");
    std::fs::write(&by_uid, "measure func=FILE_CHECK uid=0\n").unwrap();
    let list = t.path().join("list-uid");
    let images: Vec<&Path> = images.iter().map(PathBuf::as_path).collect();
    let m = measured_mount("kernel", &images, &t.path().join("m"), &by_uid, &list, &[]);
    sh(&format!(
        "cd {} && for i in $(seq 50); do cat d/a >/dev/null; done",
        m.dir.display()
    ));
    let counted = stats(&m.dir);
    assert!(counted["checked"].as_u64().unwrap() >= 50, "{counted}");
    assert_eq!(counted["logged"], 1, "{counted}");
    drop(m);
    // No rule for file opens: reads raise no event at all; the exec is measured.
    let execs = t.path().join("execs");
    std::fs::write(&execs, "measure func=BPRM_CHECK\n").unwrap();
    let list = t.path().join("list-execs");
    let m = measured_mount("kernel", &images, &t.path().join("m"), &execs, &list, &[]);
    sh(&format!(
        "cd {} && for i in $(seq 50); do cat d/a >/dev/null; done && ./true",
        m.dir.display()
    ));
    let counted = stats(&m.dir);
    // The exec's BPRM_CHECK and FILE_CHECK, and nothing for the reads.
    assert_eq!(
        (counted["checked"].as_u64(), counted["logged"].as_u64()),
        (Some(2), Some(1)),
        "{counted}"
    );
}

/// A write open's flags are read from the opener's system call while it waits; its event
/// comes before it sleeps, so the daemon may look too early: it looks again until the
/// opener is blocked. Else a write open is taken for a read, and a measured read of a
/// file with a writer (itself) records open_writers: thousands of creates, none recorded.
#[test]
fn write_opens_are_never_taken_for_reads() {
    if prerequisites() {
        return;
    }
    let (t, images, _) = measured_fixture();
    let images: Vec<&Path> = images.iter().map(PathBuf::as_path).collect();
    let policy = t.path().join("reads");
    std::fs::write(&policy, "measure func=FILE_CHECK mask=^MAY_READ\n").unwrap();
    let d = dirs(t.path(), "w");
    let rw = [
        "--upper",
        d.upper.to_str().unwrap(),
        "--work",
        d.work.to_str().unwrap(),
    ];
    let list = t.path().join("list");
    let m = measured_mount("kernel", &images, &t.path().join("m"), &policy, &list, &rw);
    sh(&format!(
        "cd {} && python3 -c 'import os\nfor i in range(5000):\n    \
         fd = os.open(\"f%d\" % (i % 100), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)\n    \
         os.write(fd, b\"x\")\n    os.close(fd)'",
        m.dir.display()
    ));
    let stats = stats(&m.dir);
    assert_eq!(stats["violations"], 0, "{stats}");
    assert!(stats["measured"].as_u64().unwrap() >= 5000, "{stats}");
}

/// A measured workload on a writable stack (new files written and read, an image file
/// appended to and read, a program copied into the upper directory and run, a file
/// read, rewritten and read again) gives the same entries on both engines, which
/// evmctl and `verilay log verify` accept; files copied up are measured by their new
/// bytes and named by their paths.
#[test]
fn a_measured_writable_mount_gives_the_same_list_on_both_engines() {
    if prerequisites() || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)") {
        return;
    }
    let (t, images, policy) = measured_fixture();
    let workload = "echo new > n && cat n d/a >/dev/null && echo more >> d/b && \
        cat d/b >/dev/null && cp true t2 && ./t2 && echo one > r && cat r >/dev/null && \
        echo two > r && cat r >/dev/null && for i in $(seq 20); do cat n d/b >/dev/null; done";
    let lists = lists_of_both_engines(t.path(), (&images, &policy), true, workload, |_, _| {});
    let named = |n: &str| {
        lists[0]
            .iter()
            .filter(|l| l.ends_with(&format!("/m/{n}")))
            .count()
    };
    // n, d/a, d/b (its new bytes), true (read by cp), t2 (run), r twice (two contents).
    assert_eq!(lists[0].len(), 7, "{:?}", lists[0]);
    assert_eq!(
        (named("r"), named("d/b"), named("t2")),
        (2, 1, 1),
        "{:?}",
        lists[0]
    );
    assert_eq!(
        lists[0], lists[1],
        "kernel engine's entries, then the FUSE engine's"
    );
}

/// fanotify fails open: `kill -9` of a measured kernel-engine mount's daemon lets later
/// opens through unmeasured. The list shows it: `log verify` refuses it as not closed
/// cleanly, and the next mount records the gap as a violation entry first, which
/// evmctl replays only when told to ignore violations.
#[test]
fn a_killed_kernel_engine_daemon_leaves_a_gap_the_next_mount_records() {
    if prerequisites() || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)") {
        return;
    }
    let (t, images, policy) = measured_fixture();
    let images: Vec<&Path> = images.iter().map(PathBuf::as_path).collect();
    let (mnt, list) = (t.path().join("m"), t.path().join("list"));
    let measured = [
        "--policy",
        policy.to_str().unwrap(),
        "--measure-log",
        list.to_str().unwrap(),
    ];
    let m = EngineMount::new("kernel", &images, &mnt, &measured);
    assert_eq!(std::fs::read(m.dir.join("d/a")).unwrap(), b"file a\n");
    let daemons = daemons_of(&m.dir);
    assert_eq!(daemons.len(), 1);
    run(Command::new("kill").args(["-9", &daemons[0].to_string()]));
    wait_until(
        std::time::Duration::from_secs(10),
        "the killed daemon to be gone",
        || daemons_of(&m.dir).is_empty(),
    );
    drop(m);
    let out = verilay()
        .args(["log", "verify"])
        .arg(&list)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not closed cleanly"), "{err}");
    let m = EngineMount::new("kernel", &images, &mnt, &measured);
    assert_eq!(std::fs::read(m.dir.join("d/b")).unwrap(), b"file b\n");
    drop(m);
    let out = verilay()
        .args(["log", "verify", "--ignore-violations", "--json"])
        .arg(&list)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["state"], "closed", "{json}");
    assert_eq!(
        json["violations"][0]["name"], "verilay:unclean-shutdown",
        "{json}"
    );
    assert!(!evmctl_accepts(&list), "evmctl missed the violation");
    let last = entries(&list).pop().unwrap();
    assert!(last.ends_with(&format!("{}/d/b", mnt.display())), "{last}");
}

/// A validly sealed image whose metadata is hostile: a file's size claims 256 MiB of
/// inline data in a one-block image. Returns the image, its digest and that file's inode
/// offset.
fn image_with_hostile_metadata(t: &Path) -> (PathBuf, String, u64) {
    let src = t.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    // Enough files that the last one's inode is past the superblock's block (which
    // its checksum covers: a change there the kernel refuses itself).
    for i in 0..300 {
        std::fs::write(src.join(format!("d/f{i:03}")), b"hello\n").unwrap();
    }
    std::fs::write(src.join("ok"), b"fine\n").unwrap();
    let image = t.join("img");
    build(&src, &image, &["--quiet", "--no-verity"]);
    let out = run(verilay()
        .args(["inspect", "--json"])
        .arg(&image)
        .arg("d/f299"));
    let inode: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let at = inode["inode"]["offset"].as_u64().unwrap() as usize + 8;
    assert!(at > 4096, "{inode}");
    // i_size: 32 bits in a compact inode, 64 in an extended one.
    let mut raw = std::fs::read(&image).unwrap();
    let size = 256u64 << 20;
    match inode["inode"]["version"].as_str() {
        Some("compact") => raw[at..at + 4].copy_from_slice(&(size as u32).to_le_bytes()),
        _ => raw[at..at + 8].copy_from_slice(&size.to_le_bytes()),
    }
    std::fs::write(&image, &raw).unwrap();
    let digest = run(verilay().args(["seal", "--quiet"]).arg(&image)).stdout;
    let digest = String::from_utf8(digest).unwrap().trim().to_string();
    (image, digest, at as u64 - 8)
}

/// An image with hostile metadata ([`image_with_hostile_metadata`]): the kernel's erofs
/// would parse it, so the kernel engine refuses it before mounting, naming the file;
/// the FUSE engine, whose reader is verilay's own, serves the rest of the tree and fails
/// that file alone.
#[test]
fn a_pinned_image_with_hostile_metadata_never_reaches_the_kernel() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let (image, digest, _) = image_with_hostile_metadata(t.path());
    let mnt = t.path().join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    let out = verilay()
        .arg("mount")
        .arg(&image)
        .arg(&mnt)
        .args(["--engine", "kernel", "--digest", &digest])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("refused for the kernel engine"), "{err}");
    assert!(err.contains("d/f299"), "{err}");
    assert!(mount_of(&mnt).is_none());
    assert!(daemons_of(&mnt).is_empty());
    let m = EngineMount::new("fuse", &[&image], &mnt, &["--digest", &digest]);
    assert_eq!(std::fs::read(m.dir.join("ok")).unwrap(), b"fine\n");
    assert!(std::fs::read(m.dir.join("d/f299")).is_err());
}

/// A registry holding `image` as `name`, and its reference.
fn pushed(image: &Path, name: &str) -> (common::registry::Registry, String) {
    let reg = common::registry::Registry::start(false);
    let reference = reg.reference(name);
    run(verilay()
        .args(["push", "-q", "--insecure"])
        .arg(image)
        .arg(&reference));
    (reg, reference)
}

/// [`prerequisites`] and a registry to push to.
fn registry_prerequisites() -> bool {
    prerequisites()
        || skip_unless(
            have("docker-registry"),
            "needs docker-registry (scripts/setup)",
        )
}

/// The same image from a registry: a remote image's metadata is checked as the kernel
/// comes to read it (an inode with all it leads to, before the page holding it is first
/// served), so the mount comes up, the rest of the tree reads back, and what reaches the
/// hostile inode fails with EIO and a log line naming it; the kernel never parses it.
#[test]
fn a_remote_image_with_hostile_metadata_fails_where_the_kernel_would_parse_it() {
    if registry_prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (image, digest, hostile) = image_with_hostile_metadata(t.path());
    let out = run(verilay()
        .args(["inspect", "--json"])
        .arg(&image)
        .arg("d/f000"));
    let inode: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f000 = inode["inode"]["offset"].as_u64().unwrap();
    assert_ne!(hostile / 4096, f000 / 4096, "the test reads d/f000");
    let (_reg, reference) = pushed(&image, "hostile:1");
    let mnt = t.path().join("m");
    let remote: &Path = Path::new(&reference);
    let pinned = ["--insecure", "--no-cache", "--digest", &digest];
    let m = EngineMount::new("kernel", &[remote], &mnt, &pinned);
    assert_eq!(mount_of(&m.dir).unwrap().0, "erofs");
    assert_eq!(std::fs::read(m.dir.join("ok")).unwrap(), b"fine\n");
    // The directory's entries were checked, not yet its files.
    let names = std::fs::read_dir(m.dir.join("d")).unwrap().count();
    assert_eq!(names, 300);
    assert_eq!(std::fs::read(m.dir.join("d/f000")).unwrap(), b"hello\n");
    let err = std::fs::metadata(m.dir.join("d/f299")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let log = std::fs::read_to_string(&m.log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("refused for the kernel engine"))
        .unwrap_or_else(|| panic!("no refusal in the log:\n{log}"));
    assert!(
        line.contains("/d/f299") && line.contains(&reference),
        "{line}"
    );
    // Refused for good: asked again, the same answer, and nothing else breaks.
    assert!(std::fs::read(m.dir.join("d/f299")).is_err());
    assert_eq!(std::fs::read(m.dir.join("ok")).unwrap(), b"fine\n");
}

/// mount(8) and the generic options on the kernel engine: `mount -t fuse.verilay -o
/// ro,nosuid,nodev,noexec,engine=kernel,digest=…` gives an erofs mount with those flags,
/// util-linux's `umount` ends the daemon; `verilay umount --lazy` of a busy mount
/// detaches it at once, an open file still reads, and the daemon ends once it is closed.
#[test]
fn mount8_options_and_a_lazy_umount_work_on_the_kernel_engine() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"via mount(8)").unwrap();
    let image = t.path().join("img");
    let digest = String::from_utf8(build(&src, &image, &["--quiet"]).stdout).unwrap();
    let mnt = t.path().join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    let helper = Path::new("/sbin/mount.fuse.verilay");
    let _ = std::fs::remove_file(helper);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_verilay"), helper).unwrap();
    let out = Command::new("mount")
        .args(["-t", "fuse.verilay", "-o"])
        .arg(format!(
            "ro,nosuid,nodev,noexec,engine=kernel,digest={}",
            digest.trim()
        ))
        .arg(&image)
        .arg(&mnt)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(helper);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (fstype, _, _) = mount_of(&mnt).expect("mounted");
    assert_eq!(fstype, "erofs");
    let canon = std::fs::canonicalize(&mnt).unwrap();
    let line = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == canon.to_str())
        .unwrap()
        .to_string();
    let per_mount = line.split(' ').nth(5).unwrap();
    for flag in ["ro", "nosuid", "nodev", "noexec"] {
        assert!(per_mount.split(',').any(|f| f == flag), "{flag}: {line}");
    }
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"via mount(8)");
    run(Command::new("umount").arg(&mnt));
    wait_daemon_gone(&mnt);

    run(verilay()
        .args(["mount", "-q", "--engine", "kernel"])
        .arg(&image)
        .arg(&mnt));
    let mut held = std::fs::File::open(mnt.join("f")).unwrap();
    run(verilay().args(["umount", "--lazy"]).arg(&mnt));
    assert!(mount_of(&mnt).is_none(), "still in the mount table");
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut held, &mut got).unwrap();
    assert_eq!(got, b"via mount(8)");
    assert_eq!(daemons_of(&mnt).len(), 1, "the daemon serves the open file");
    drop(held);
    wait_daemon_gone(&mnt);
}

/// A remote image on the kernel engine (asked for, and `auto`'s choice as root): the
/// mount fetches a sliver of it (its metadata is checked as the kernel reads it), its
/// tree is the local image's, and bytes are fetched as first read, verified.
#[test]
fn a_remote_image_mounts_on_the_kernel_engine_fetched_as_read() {
    if registry_prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = generated_src(t.path());
    let image = t.path().join("img");
    let digest = String::from_utf8(build(&src, &image, &["--quiet"]).stdout).unwrap();
    let (_reg, reference) = pushed(&image, "tree:1");
    let mnt = t.path().join("m");
    let remote: &Path = Path::new(&reference);
    let pinned = ["--insecure", "--no-cache", "--digest", digest.trim()];
    let m = EngineMount::new("kernel", &[remote], &mnt, &pinned);
    assert_eq!(mount_of(&m.dir).unwrap().0, "erofs");
    let before = stats(&m.dir)["remote_bytes_fetched"].as_u64().unwrap();
    let size = std::fs::metadata(&image).unwrap().len();
    assert!(
        before < size / 4,
        "mounting fetched {before} of {size} bytes"
    );
    let local = Mount::erofs(&image, &t.path().join("e"));
    assert_diff_clean(&local.dir, &m.dir);
    assert_same_stats(&local.dir, &m.dir);
    assert_eq!(xattr_dump(&local.dir), xattr_dump(&m.dir));
    assert!(stats(&m.dir)["remote_bytes_fetched"].as_u64().unwrap() > before);
    drop(m);
    let m = EngineMount::new("auto", &[remote], &mnt, &pinned);
    assert!(m.said.contains("kernel engine (root, "), "{}", m.said);
    assert_eq!(mount_of(&m.dir).unwrap().0, "erofs");
}

/// SIGTERM ends a kernel-engine daemon within its bound too: the mount is detached at
/// once, and though a file on it stays open, 10 s later the image files' connection is
/// aborted and the daemon exits; the open file's reads past the page cache then fail
/// with EIO (erofs's backing file is gone), never with other bytes.
#[test]
fn sigterm_ends_a_kernel_engine_daemon_within_its_bound() {
    use std::io::{Read, Seek};
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("f"), &data).unwrap();
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let mnt = t.path().join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    run(verilay()
        .args(["mount", "-q", "--engine", "kernel"])
        .arg(&image)
        .arg(&mnt));
    let mut held = std::fs::File::open(mnt.join("f")).unwrap();
    let daemons = daemons_of(&mnt);
    assert_eq!(daemons.len(), 1, "{daemons:?}");
    let signalled = std::time::Instant::now();
    run(Command::new("kill").args(["-TERM", &daemons[0].to_string()]));
    wait_until(
        std::time::Duration::from_secs(10),
        "the mount to be detached after SIGTERM",
        || mount_of(&mnt).is_none(),
    );
    wait_daemon_gone(&mnt);
    let took = signalled.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(9),
        "ended after {took:?}: no grace"
    );
    assert!(
        took < std::time::Duration::from_secs(20),
        "ended after {took:?}"
    );
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    held.seek(std::io::SeekFrom::Start(2_000_000)).unwrap();
    let err = held.read(&mut [0u8; 4096]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
}
