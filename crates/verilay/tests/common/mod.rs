//! Shared helpers for tests that drive the `verilay` binary and real kernel mounts.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

pub fn verilay() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_verilay"));
    // Remote images are cached here unless a test says otherwise, not in /var/cache.
    c.env(
        "VERILAY_CACHE",
        concat!(env!("CARGO_TARGET_TMPDIR"), "/verilay-cache"),
    );
    c
}

/// `verilay mount IMAGE MNT --policy POLICY --measure-log LIST`, for the caller to add to
/// and run.
pub fn measured_mount(image: &Path, mnt: &Path, policy: &Path, list: &Path) -> Command {
    let mut c = verilay();
    c.arg("mount")
        .arg(image)
        .arg(mnt)
        .arg("--policy")
        .arg(policy)
        .arg("--measure-log")
        .arg(list);
    c
}

/// Runs `mkfs.erofs ARGS -T 1700000000 -U c0ffee00-… IMAGE SRC`: a fixed time and UUID, so
/// the same tree and arguments make the same image.
pub fn mkfs_erofs(args: &[&str], image: &Path, src: &Path) {
    run(Command::new("mkfs.erofs")
        .args(args)
        .args([
            "-T",
            "1700000000",
            "-U",
            "c0ffee00-0000-4000-8000-000000000023",
        ])
        .arg(image)
        .arg(src));
}

/// A temporary directory, or None where the test is `skipped` (its prerequisites, which
/// record the skip, said so).
pub fn tempdir_unless(skipped: bool) -> Option<tempfile::TempDir> {
    if skipped {
        return None;
    }
    Some(tempfile::tempdir().unwrap())
}

/// A temporary directory for a test that needs root (`root_why`: what for) and `tool`
/// (`tool_why`: the skip's words); None, with the skip recorded, where either is missing.
pub fn root_and_tool_tempdir(
    root_why: &str,
    tool: &str,
    tool_why: &str,
) -> Option<tempfile::TempDir> {
    if skip_unless(is_root(), root_why) || skip_unless(have(tool), tool_why) {
        return None;
    }
    Some(tempfile::tempdir().unwrap())
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

// Tests that need root (mount) or a peer tool call `skip_unless(cond, why)`: the skip is
// recorded for `scripts/test`, which counts it as skipped, not passed (CI fails on any).
#[path = "../../../erofs/tests/common/skip.rs"]
mod skip;
pub use skip::skip_unless;
pub mod containerd;
pub mod containers;
#[path = "../../../erofs/tests/common/poll.rs"]
mod poll;
pub mod registry;
#[path = "../../../erofs/tests/common/xorshift.rs"]
pub mod xorshift;
pub use poll::poll_until;

/// Waits until `cond` holds, panicking with `what` (what it waited for) after `timeout`.
/// Tests wait for a condition this way, never with a bare sleep.
pub fn wait_until(timeout: Duration, what: &str, cond: impl FnMut() -> bool) {
    assert!(
        poll_until(timeout, cond),
        "gave up after {timeout:?} waiting for {what}"
    );
}

/// The pids of the `verilay mount` daemons serving `mnt` (as named to `verilay mount`): their
/// argv is `verilay mount ... MNT --ready-fd N ...`.
pub fn daemons_of(mnt: &Path) -> Vec<u32> {
    let mnt = mnt.as_os_str().as_encoded_bytes();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = argv.split(|&b| b == 0).collect();
            args.len() > 2
                && args[0].ends_with(b"verilay")
                && args[1] == b"mount"
                && args.contains(&mnt)
                && args.contains(&&b"--ready-fd"[..])
        })
        .collect()
}

/// Waits until no daemon serves `mnt`: a lazy unmount returns at once, and the daemon then
/// finishes its work (writes its measurement list) and exits.
pub fn wait_daemon_gone(mnt: &Path) {
    wait_until(
        Duration::from_secs(20),
        &format!("the daemon of {} to exit", mnt.display()),
        || daemons_of(mnt).is_empty(),
    );
}

pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// True (and a SKIP line) unless tests can act as an ordinary user: `runuser` and the
/// `verilaytest` account that scripts/setup creates.
pub fn lacks_test_user() -> bool {
    skip_unless(have("runuser"), "runuser missing")
        || skip_unless(
            Command::new("id")
                .arg("verilaytest")
                .output()
                .is_ok_and(|o| o.status.success()),
            "user verilaytest missing (scripts/setup creates it)",
        )
}

/// `as_test_user`, which must succeed (else the script and its stderr are the panic's
/// message): its stdout.
pub fn as_test_user_ok(dir: &Path, script: &str) -> String {
    let out = as_test_user(dir, script);
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a shell command as the `verilaytest` user in `dir`.
pub fn as_test_user(dir: &Path, script: &str) -> Output {
    Command::new("runuser")
        .args(["-u", "verilaytest", "--", "sh", "-c", script])
        .current_dir(dir)
        .output()
        .unwrap()
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

pub fn sh(script: &str) -> Output {
    run(Command::new("sh").arg("-c").arg(script))
}

/// Builds an image with `verilay build` and the given extra arguments.
pub fn build(src: &Path, image: &Path, extra: &[&str]) -> Output {
    run(verilay()
        .arg("build")
        .arg(src)
        .arg("-o")
        .arg(image)
        .args(extra)
        .env("SOURCE_DATE_EPOCH", "1700000000"))
}

/// `verilay build SRC -o IMAGE EXTRA...` as it ended, success or not (for refusals).
pub fn build_output(src: &Path, image: &Path, extra: &[&str]) -> Output {
    verilay()
        .arg("build")
        .arg(src)
        .arg("-o")
        .arg(image)
        .args(extra)
        .output()
        .unwrap()
}

/// A kernel mount that is unmounted when dropped.
pub struct Mount {
    pub dir: PathBuf,
}

impl Mount {
    pub fn erofs(image: &Path, dir: &Path) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        run(Command::new("mount")
            .args(["-t", "erofs", "-o", "ro"])
            .arg(image)
            .arg(dir));
        Mount {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for Mount {
    /// A FUSE daemon dropped just before may still hold files on this mount while it
    /// exits: retried for a while, then detached, so no test leaves a mount behind.
    fn drop(&mut self) {
        let umount = |lazy: bool| {
            let mut c = Command::new("umount");
            if lazy {
                c.arg("-l");
            }
            c.arg(&self.dir)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !umount(false) {
            if std::time::Instant::now() > deadline {
                umount(true);
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// Every stat field the image must preserve, per relative path.
#[derive(Debug, PartialEq, Eq)]
pub struct StatRec {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: i64,
    pub nlink: u64,
    pub rdev: u64,
    /// Index of the first path with the same inode (hardlink groups must match).
    pub link_group: String,
}

pub fn stat_tree(root: &Path) -> BTreeMap<String, StatRec> {
    let mut out = BTreeMap::new();
    let mut first_path: BTreeMap<(u64, u64), String> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut all = Vec::new();
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p.clone());
            }
            all.push((p, m));
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let root_meta = std::fs::symlink_metadata(root).unwrap();
    all.insert(0, (root.to_path_buf(), root_meta));
    for (p, m) in all {
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let group = if m.is_dir() {
            rel.clone()
        } else {
            first_path
                .entry((m.dev(), m.ino()))
                .or_insert_with(|| rel.clone())
                .clone()
        };
        out.insert(
            rel,
            StatRec {
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                size: if m.is_dir() { 0 } else { m.size() },
                mtime: m.mtime(),
                mtime_nsec: m.mtime_nsec(),
                nlink: m.nlink(),
                rdev: m.rdev(),
                link_group: group,
            },
        );
    }
    out
}

pub fn assert_same_stats(src: &Path, other: &Path) {
    let a = stat_tree(src);
    let b = stat_tree(other);
    assert_eq!(
        a.len(),
        b.len(),
        "entry counts differ between {} and {}",
        src.display(),
        other.display()
    );
    let mut bad = Vec::new();
    for (k, va) in &a {
        match b.get(k) {
            Some(vb) if vb == va => {}
            Some(vb) => bad.push(format!("{k}: {va:?} != {vb:?}")),
            None => bad.push(format!("{k}: missing")),
        }
    }
    assert!(
        bad.is_empty(),
        "{} stat mismatches, first: {:#?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}

/// `ls -lRan` of a tree, run from inside it (so the paths match between two mounts).
pub fn ls_lr(root: &Path) -> String {
    let out = run(Command::new("ls")
        .args(["-lRan", "--time-style=full-iso", "."])
        .current_dir(root));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Unmounts a directory when dropped: a verilay FUSE mount (lazily, through `verilay
/// umount`) or a kernel mount.
pub struct Unmount {
    pub dir: PathBuf,
    pub fuse: bool,
}

impl Unmount {
    /// Unmounts `dir`, a verilay FUSE mount, when dropped.
    pub fn fuse(dir: &Path) -> Unmount {
        Unmount {
            dir: dir.to_path_buf(),
            fuse: true,
        }
    }

    /// Unmounts `dir`, a kernel mount, when dropped.
    pub fn kernel(dir: &Path) -> Unmount {
        Unmount {
            dir: dir.to_path_buf(),
            fuse: false,
        }
    }

    /// Unmounts now, not lazily: a verilay mount's `umount` returns once its daemon has
    /// exited, so nothing of it still holds the filesystems under the mount.
    pub fn now(mut self) {
        let dir = std::mem::take(&mut self.dir);
        if self.fuse {
            run(verilay().arg("umount").arg(&dir));
        } else {
            run(Command::new("umount").arg(&dir));
        }
    }
}

impl Drop for Unmount {
    fn drop(&mut self) {
        if self.dir.as_os_str().is_empty() {
            return; // unmounted by `now`
        }
        let _ = if self.fuse {
            verilay().args(["umount", "--lazy"]).arg(&self.dir).status()
        } else {
            Command::new("umount").arg(&self.dir).status()
        };
    }
}

/// `diff -r` without following symlinks; special files of the same type are fine.
pub fn assert_diff_clean(a: &Path, b: &Path) {
    let out = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    // Exit 2 and anything on stderr are read errors ("diff: X: Input/output error"),
    // which the lines below would not show.
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() != Some(2) && errors.is_empty(),
        "diff -r {} {} could not read everything:\n{errors}",
        a.display(),
        b.display()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let real: Vec<&str> = text
        .lines()
        .filter(|l| {
            // "File X is a fifo while file Y is a fifo": diff cannot compare these.
            !(l.starts_with("File ") && {
                let parts: Vec<&str> = l.split(" while file ").collect();
                parts.len() == 2
                    && parts[0].split(" is a ").nth(1) == parts[1].split(" is a ").nth(1)
            })
        })
        .collect();
    assert!(
        real.is_empty(),
        "diff -r {} {}:\n{}",
        a.display(),
        b.display(),
        real.join("\n")
    );
}

/// `getfattr -R -d -m - -h` output as path -> sorted "name=value" lines. A file whose
/// listing is "Operation not supported" has none: a read-only verilay mount of images
/// without any xattr answers so (ENOSYS, after which the kernel stops asking).
pub fn xattr_dump(root: &Path) -> BTreeMap<String, Vec<String>> {
    let out = Command::new("getfattr")
        .args(["-R", "-d", "-m", "-", "-h", "-e", "hex", "."])
        .current_dir(root)
        .output()
        .unwrap();
    let unsupported = String::from_utf8_lossy(&out.stderr)
        .lines()
        .all(|l| l.ends_with(": Operation not supported"));
    assert!(
        out.status.success() || unsupported,
        "getfattr in {} failed: {out:?}",
        root.display()
    );
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cur = String::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(p) = line.strip_prefix("# file: ") {
            cur = p.to_string();
        } else if !line.is_empty() {
            map.entry(cur.clone()).or_default().push(line.to_string());
        }
    }
    for v in map.values_mut() {
        v.sort();
    }
    map
}

/// `getfacl -R -s` output, one block per file with an ACL, sorted by path (getfacl
/// walks in readdir order, which differs between filesystems).
pub fn acl_dump(root: &Path) -> Vec<String> {
    let out = run(Command::new("getfacl")
        .args(["-R", "-p", "-s", "."])
        .current_dir(root));
    let mut blocks: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split("\n\n")
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .collect();
    blocks.sort();
    blocks
}

/// `base/src`, made by `generate_tree`.
pub fn generated_src(base: &Path) -> PathBuf {
    let src = base.join("src");
    generate_tree(&src);
    src
}

/// A tree with every file type, hardlinks, xattrs in every namespace, ACLs, long names,
/// a deep path, sparse and empty files, and sizes from 0 bytes to several MiB.
pub fn generate_tree(root: &Path) {
    use std::fs;
    fs::create_dir_all(root).unwrap();
    let w = |p: &str, data: &[u8]| fs::write(root.join(p), data).unwrap();
    let mut random = xorshift::XorShift(0x1234_5678);
    fs::create_dir_all(root.join("sizes")).unwrap();
    for size in [
        0usize,
        1,
        31,
        511,
        512,
        1000,
        4095,
        4096,
        4097,
        8191,
        8192,
        12345,
        65536,
        100_000,
        1 << 20,
        3 << 20,
        (5 << 20) + 7,
    ] {
        w(&format!("sizes/f{size}"), &random.bytes(size));
    }
    w("empty", b"");
    w("hello.txt", b"hello, world\n");
    fs::hard_link(root.join("hello.txt"), root.join("hardlink1")).unwrap();
    fs::create_dir_all(root.join("links")).unwrap();
    fs::hard_link(root.join("hello.txt"), root.join("links/hardlink2")).unwrap();
    std::os::unix::fs::symlink("hello.txt", root.join("symlink")).unwrap();
    std::os::unix::fs::symlink("x".repeat(3000), root.join("long_symlink")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/dangling", root.join("dangling")).unwrap();
    let long = "L".repeat(255);
    w(&long, b"long name");
    fs::create_dir_all(root.join(format!("dir_{}", "d".repeat(250)))).unwrap();
    // Names that sort before "." and "..", and non-UTF-8 bytes.
    w("!bang", b"!");
    w("-dash", b"-");
    w(".hidden", b".");
    {
        use std::os::unix::ffi::OsStrExt;
        fs::write(
            root.join(std::ffi::OsStr::from_bytes(b"latin1_\xe9t\xe9")),
            b"bytes",
        )
        .unwrap();
    }
    // A deep path and a directory with enough entries to span several blocks.
    let mut deep = root.to_path_buf();
    for i in 0..40 {
        deep.push(format!("level{i:02}"));
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("bottom"), b"deep").unwrap();
    fs::create_dir_all(root.join("many")).unwrap();
    for i in 0..700 {
        w(
            &format!("many/entry_with_a_longish_name_{i:04}"),
            format!("{i}").as_bytes(),
        );
    }
    // Sparse files: holes at the start, middle and end, and one with no data at all.
    sh(&format!(
        "cd '{}' && truncate -s 64M sparse_all && \
         printf tail | dd of=sparse_mid bs=1 seek=5000000 conv=notrunc status=none && truncate -s 20M sparse_mid && \
         head -c 1048576 /dev/urandom > sparse_end && truncate -s 9M sparse_end && \
         truncate -s 2M sparse_start && printf end >> sparse_start",
        root.display()
    ));
    // Special files.
    sh(&format!(
        "cd '{}' && mkfifo fifo && mknod chardev c 1 3 && mknod blockdev b 8 1 && mknod bigdev c 259 300000 && \
         mknod whiteout c 0 0 && python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('sock')\"",
        root.display()
    ));
    // Ownership and modes.
    sh(&format!(
        "cd '{}' && chown 1000:1000 hello.txt && chown 70000:70001 sizes/f1 && chmod 4755 sizes/f31 && \
         chmod 2711 many && chmod 1777 links && chmod 0 sizes/f0",
        root.display()
    ));
    // Xattrs in every namespace, shared values, long common prefixes, and ACLs.
    let mut script = format!("cd '{}' && ", root.display());
    for i in 0..50 {
        script += &format!(
            "setfattr -n user.shared -v same_value_everywhere many/entry_with_a_longish_name_{i:04} && \
             setfattr -n trusted.overlay.origin -v 0x{i:02x}{i:02x} many/entry_with_a_longish_name_{i:04} && \
             setfattr -n security.test -v s{i} many/entry_with_a_longish_name_{i:04} && "
        );
    }
    script += "setfattr -n user.empty hello.txt && setfattr -n user.big -v 0x$(head -c 3000 /dev/zero | od -An -tx1 -v | tr -d ' \\n') sizes/f4096 && \
               setfattr -n trusted.overlay.opaque -v y links && setfattr -n user.dir -v d links && \
               setfacl -m u:1234:rwx,g:2345:r-x sizes/f1000 && setfacl -d -m u:1234:rx,o::- links && \
               setfacl -m u:42:r many && true";
    sh(&script);
    // Distinct nanosecond timestamps, and one before 1970.
    sh(&format!(
        "cd '{}' && touch -h -d '2001-02-03 04:05:06.123456789' symlink && touch -d '1969-07-20 20:17:40.5' sizes/f511 && \
         touch -d '2038-01-19 03:14:08' sizes/f512",
        root.display()
    ));
    fs::set_permissions(root.join("fifo"), fs::Permissions::from_mode(0o640)).unwrap();
}

/// An upper and a work directory, side by side.
pub struct Dirs {
    pub upper: PathBuf,
    pub work: PathBuf,
}

/// `BASE/TAG-upper` and `BASE/TAG-work`, created.
pub fn dirs(base: &Path, tag: &str) -> Dirs {
    let d = Dirs {
        upper: base.join(format!("{tag}-upper")),
        work: base.join(format!("{tag}-work")),
    };
    std::fs::create_dir_all(&d.upper).unwrap();
    std::fs::create_dir_all(&d.work).unwrap();
    d
}

/// `verilay mount IMAGE --upper --work MNT --allow-other` (pjdfstest acts as other
/// users), unmounted when dropped.
pub fn verilay_mount(image: &Path, d: &Dirs, mnt: &Path) -> Unmount {
    verilay_mount_with(image, d, mnt, &[])
}

/// [`verilay_mount`] on the FUSE engine, for tests of what only it promises (where the
/// kernel engine is kernel overlayfs, with overlayfs's own behaviour).
pub fn verilay_mount_fuse(image: &Path, d: &Dirs, mnt: &Path) -> Unmount {
    verilay_mount_with(image, d, mnt, &["--engine", "fuse"])
}

fn verilay_mount_with(image: &Path, d: &Dirs, mnt: &Path, extra: &[&str]) -> Unmount {
    std::fs::create_dir_all(mnt).unwrap();
    run(verilay()
        .arg("mount")
        .args(extra)
        .arg("--allow-other")
        .arg(image)
        .arg("--upper")
        .arg(&d.upper)
        .arg("--work")
        .arg(&d.work)
        .arg(mnt));
    Unmount::fuse(mnt)
}

/// Kernel overlayfs of `lower` with the same layout (directories move with redirects, as
/// verilay moves them), unmounted when dropped.
/// The kernel's overlayfs, read-only, over `lower` (the top layer first) at `mnt`;
/// unmounted when dropped.
pub fn overlay_ro(lower: &[&Path], mnt: &Path) -> Unmount {
    std::fs::create_dir_all(mnt).unwrap();
    let lower: Vec<String> = lower.iter().map(|d| d.display().to_string()).collect();
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!("ro,lowerdir={}", lower.join(":")))
        .arg(mnt));
    Unmount::kernel(mnt)
}

pub fn overlay_mount(lower: &Path, d: &Dirs, mnt: &Path) -> Unmount {
    std::fs::create_dir_all(mnt).unwrap();
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!(
            "lowerdir={},upperdir={},workdir={},redirect_dir=on",
            lower.display(),
            d.upper.display(),
            d.work.display()
        ))
        .arg(mnt));
    Unmount::kernel(mnt)
}

/// `setfattr -n NAME -v VALUE FILE`.
pub fn setfattr(file: &Path, name: &str, value: &str) {
    run(Command::new("setfattr")
        .args(["-n", name, "-v", value])
        .arg(file));
}

/// Whether `evmctl ima_measurement` (ima-evm-utils, the reference verifier) replays the
/// binary list in `log` to the PCR values beside it.
pub fn evmctl_accepts(log: &Path) -> bool {
    Command::new("evmctl")
        .arg("ima_measurement")
        .arg("--pcrs")
        .arg(format!("sha1,{}", log.join("pcrs_sha1").display()))
        .arg("--pcrs")
        .arg(format!("sha256,{}", log.join("pcrs_sha256").display()))
        .arg(log.join("binary_runtime_measurements"))
        .output()
        .unwrap()
        .status
        .success()
}
