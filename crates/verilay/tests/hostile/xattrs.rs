//! Hidden xattrs set or removed through a mount (item 12), and the other ways a caller
//! could forge what the tree or a later mount reads from the upper directory: the owner
//! and mode a rootless mount shows (`user.containers.override_stat`), overlayfs's markers
//! (`trusted.overlay.*`, and `user.overlay.*` rootless), verilay's origin record, the
//! read-only `verilay.stats`, chown/chmod/capabilities/ACLs, and whiteout devices.

use crate::common::{
    as_test_user, build, have, is_root, lacks_test_user, root_and_tool_tempdir, sh, skip_unless,
    tempdir_unless,
};
use crate::Seed;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Hostile inputs of this module for the fuzz targets: the image whose objects carry the
/// names a mount keeps for itself (`planted_tree`).
pub fn seeds(tmp: &Path) -> Vec<Seed> {
    let mut seeds = cycle_seeds(tmp);
    if !is_root() || !have("setfattr") {
        return seeds; // the tree needs chown and user.* xattrs set by root
    }
    let src = tmp.join("xattrs-planted-src");
    let image = tmp.join("xattrs-planted.img");
    planted_tree(&src, 1001);
    build(&src, &image, &["--quiet"]);
    seeds.push(Seed {
        target: "read_image",
        name: "xattrs-planted".into(),
        bytes: std::fs::read(&image).unwrap(),
    });
    seeds
}

fn prerequisites() -> bool {
    skip_unless(is_root(), "needs root (mounts, chown, runuser)")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
        || skip_unless(have("python3"), "python3 missing")
        || skip_unless(have("setfattr"), "setfattr missing")
        || lacks_test_user()
}

/// The test user's uid and gid ("1001:1001").
fn test_ids() -> String {
    let out = Command::new("id")
        .args(["-u", "verilaytest"])
        .output()
        .unwrap();
    let uid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = Command::new("id")
        .args(["-g", "verilaytest"])
        .output()
        .unwrap();
    format!("{uid}:{}", String::from_utf8_lossy(&out.stdout).trim())
}

/// A mount of one image with an upper directory, in a directory of its own under /tmp
/// (the test user must reach it): rootless (mounted by the test user through
/// fusermount3) or as root.
struct Rig {
    base: PathBuf,
    rootless: bool,
}

impl Rig {
    /// `tree` fills the image's source directory (run as root).
    fn new(tag: &str, rootless: bool, tree: impl FnOnce(&Path)) -> Rig {
        let base = PathBuf::from(format!(
            "/tmp/verilay-hostile-xattrs-{tag}-{}",
            std::process::id()
        ));
        unmount(&base.join("mnt"));
        let _ = std::fs::remove_dir_all(&base);
        for d in ["src", "up", "work", "mnt"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        tree(&base.join("src"));
        std::fs::copy(env!("CARGO_BIN_EXE_verilay"), base.join("verilay")).unwrap();
        build(&base.join("src"), &base.join("img"), &["--quiet"]);
        std::fs::write(base.join("probe.py"), PROBE).unwrap();
        sh(&format!("chmod 755 {}", base.display()));
        if rootless {
            sh(&format!(
                "chown verilaytest {0} {0}/up {0}/work {0}/mnt {0}/img {0}/verilay",
                base.display()
            ));
        }
        let rig = Rig { base, rootless };
        rig.mount();
        rig
    }

    /// Runs `script` in the base directory as the mount's owner (the test user rootless,
    /// else root), or as the test user when `as_user`; its output, whatever the status.
    fn run_as(&self, as_user: bool, script: &str) -> Output {
        if as_user {
            as_test_user(&self.base, script)
        } else {
            Command::new("sh")
                .args(["-c", script])
                .current_dir(&self.base)
                .output()
                .unwrap()
        }
    }

    /// `run_as` the mount's owner, which must succeed; its stdout.
    fn owner(&self, script: &str) -> String {
        let out = self.run_as(self.rootless, script);
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A root mount lets other users in (`--allow-other`), so the test user can try too.
    fn mount(&self) {
        let other = if self.rootless { "" } else { " --allow-other" };
        self.owner(&format!(
            "./verilay mount img --upper up --work work mnt --quiet{other}"
        ));
    }

    fn remount(&self) {
        self.owner("./verilay umount mnt");
        self.mount();
    }

    fn stat(&self, paths: &str) -> String {
        self.owner(&format!("cd mnt && stat -c '%u:%g %a %n' {paths}"))
    }

    /// The host's value of `name` on `path` in the upper directory, if it has one.
    fn host_xattr(&self, path: &str, name: &str) -> Option<String> {
        let out = Command::new("getfattr")
            .args(["--only-values", "-h", "-n", name])
            .arg(self.base.join("up").join(path))
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs the probe on `paths` (relative to the mount) for `names`: one line per
    /// answer that gives a hidden name away or lets it change.
    fn probe(&self, as_user: bool, names: &[&str], paths: &[&str]) -> String {
        let out = self.run_as(
            as_user,
            &format!(
                "cd mnt && python3 ../probe.py {} {}",
                names.join(","),
                paths.join(" ")
            ),
        );
        assert!(
            out.status.success(),
            "probe: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        unmount(&self.base.join("mnt"));
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// Detaches whatever is mounted on `dir`, if anything.
fn unmount(dir: &Path) {
    let _ = Command::new("umount")
        .arg("-l")
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status();
}

/// For each path and name: getxattr must not answer, listxattr must not list it, and
/// setxattr (flags 0, XATTR_CREATE, XATTR_REPLACE) and removexattr must fail with EPERM.
/// Prints one line per other answer, nothing when all is as it should be.
const PROBE: &str = r#"
import errno, os, sys
names = sys.argv[1].split(",")
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
for path in sys.argv[2:]:
    listed = os.listxattr(path, follow_symlinks=False)
    for name in names:
        value = b"0:0:0104755" if "override" in name else b"y"
        if name in listed:
            print(path, name, "listed")
        got = err(lambda: os.getxattr(path, name, follow_symlinks=False))
        if got not in (errno.errorcode[errno.EOPNOTSUPP], "ENODATA"):
            print(path, name, "get:", got)
        for flag, label in ((0, "set"), (os.XATTR_CREATE, "create"), (os.XATTR_REPLACE, "replace")):
            got = err(lambda: os.setxattr(path, name, value, flag, follow_symlinks=False))
            if got != "EPERM":
                print(path, name, label + ":", got)
        got = err(lambda: os.removexattr(path, name, follow_symlinks=False))
        if got != "EPERM":
            print(path, name, "remove:", got)
"#;

/// Every kind of object, owned by root in the image and writable by all (so the test
/// user's requests reach the daemon, not only the kernel's permission check): a directory
/// (the test user makes things in it, copying it up) with a file (copied up by a write),
/// a file and a directory left in the image, a symlink and a FIFO. The file claims an
/// owner and mode that copy-up must not carry into the upper directory.
fn shared_tree(src: &Path) {
    sh(&format!(
        "set -e; cd {}; mkdir -p shared/sub; echo theirs > shared/file; echo img > shared/img_only
         echo x > shared/sub/x; ln -s file shared/link; mkfifo shared/fifo
         chmod 0777 shared shared/sub; chmod 0666 shared/file shared/fifo shared/img_only
         setfattr -n user.containers.override_stat -v 0:0:0104777 shared/file",
        src.display()
    ));
}

/// The objects `shared_tree` has, and the kinds the mount makes: a copied-up directory
/// and file, image-only file, directory, symlink and FIFO, and a directory and a file made
/// through the mount.
const OBJECTS: &[&str] = &[
    "shared",
    "shared/file",
    "shared/img_only",
    "shared/sub",
    "shared/link",
    "shared/fifo",
    "shared/newdir",
    "shared/mine",
];

/// Copies `shared` and `shared/file` up and makes `shared/newdir` (opaque: made in a
/// merged directory) and `shared/mine`, as the mount's owner.
fn populate(rig: &Rig) {
    rig.owner("cd mnt/shared && echo mine >> file && mkdir newdir && echo mine > mine");
}

#[test]
fn a_rootless_user_cannot_forge_the_owner_the_tree_shows() {
    if prerequisites() {
        return;
    }
    let rig = Rig::new("forge", true, shared_tree);
    populate(&rig);
    let me = test_ids();
    let truth = format!(
        "0:0 777 shared\n0:0 666 shared/file\n{me} 644 shared/mine\n{me} 755 shared/newdir\n"
    );
    assert_eq!(
        rig.stat("shared shared/file shared/mine shared/newdir"),
        truth
    );
    // Item 12: set on the user's own file (with every flag), removed from someone else's.
    let said = rig.probe(
        true,
        &["user.containers.override_stat"],
        &["shared/mine", "shared/newdir", "shared/file", "shared"],
    );
    assert_eq!(said, "", "override_stat through the mount");
    // The host keeps the true record, and the tree shows it after a remount.
    assert_eq!(
        rig.host_xattr("shared/file", "user.containers.override_stat")
            .as_deref(),
        Some("0:0:0100666")
    );
    assert_eq!(
        rig.host_xattr("shared/mine", "user.containers.override_stat"),
        None
    );
    rig.remount();
    assert_eq!(
        rig.stat("shared shared/file shared/mine shared/newdir"),
        truth
    );
}

#[test]
fn a_rootless_mount_refuses_and_hides_its_own_names_on_every_kind_of_object() {
    if prerequisites() {
        return;
    }
    let rig = Rig::new("rootless", true, shared_tree);
    populate(&rig);
    let names = [
        "user.overlay.opaque",
        "user.overlay.redirect",
        "user.overlay.whiteout",
        "user.overlay.origin",
        "user.overlay.metacopy",
        "user.overlay.verilay.origin",
        "user.overlay.overlay.escaped",
        "user.containers.override_stat",
        "user.containers.override_other",
        "trusted.overlay.opaque",
        "trusted.overlay.verilay.origin",
    ];
    assert_eq!(rig.probe(true, &names, OBJECTS), "");
    // Nothing was copied up to answer, and the mount's own records are intact.
    assert!(!rig.base.join("up/shared/img_only").exists());
    assert!(!rig.base.join("up/shared/sub").exists());
    assert!(rig
        .host_xattr("shared/file", "user.overlay.verilay.origin")
        .is_some());
    assert_eq!(
        rig.host_xattr("shared/newdir", "user.overlay.opaque")
            .as_deref(),
        Some("y")
    );
    // The read-only stats attribute reads, and cannot be set or removed.
    verilay_stats_is_read_only(&rig, true);
    rig.remount();
    assert_eq!(
        rig.owner("ls mnt/shared/sub mnt/shared/newdir"),
        "mnt/shared/newdir:\n\nmnt/shared/sub:\nx\n"
    );
}

#[test]
fn a_root_mount_refuses_and_hides_its_own_names_on_every_kind_of_object() {
    if prerequisites() {
        return;
    }
    let rig = Rig::new("root", false, shared_tree);
    populate(&rig);
    let names = [
        "trusted.overlay.opaque",
        "trusted.overlay.redirect",
        "trusted.overlay.whiteout",
        "trusted.overlay.origin",
        "trusted.overlay.metacopy",
        "trusted.overlay.verilay.origin",
        "trusted.overlay.overlay.escaped",
        "user.containers.override_stat",
    ];
    assert_eq!(rig.probe(false, &names, OBJECTS), "");
    // An ordinary user on the root mount (allow_other), on a file of their own.
    rig.run_as(true, "echo theirs > mnt/shared/users");
    assert_eq!(
        rig.probe(true, &["user.containers.override_stat"], &["shared/users"]),
        ""
    );
    assert_eq!(
        rig.host_xattr("shared/users", "user.containers.override_stat"),
        None
    );
    assert!(!rig.base.join("up/shared/img_only").exists());
    assert_eq!(
        rig.host_xattr("shared/file", "user.containers.override_stat"),
        None,
        "copied up from the image"
    );
    assert!(rig
        .host_xattr("shared/file", "trusted.overlay.verilay.origin")
        .is_some());
    assert_eq!(
        rig.host_xattr("shared/newdir", "trusted.overlay.opaque")
            .as_deref(),
        Some("y")
    );
    verilay_stats_is_read_only(&rig, false);
    verilay_stats_is_read_only(&rig, true);
}

/// `verilay.stats` on the mount root answers (JSON), and cannot be set or removed.
fn verilay_stats_is_read_only(rig: &Rig, as_user: bool) {
    let out = rig.run_as(
        as_user,
        "python3 -c 'import os; print(os.getxattr(\"mnt\", \"verilay.stats\").decode())'",
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with('{'),
        "{out:?}"
    );
    let said = rig.probe(as_user, &["verilay.stats"], &["."]);
    // The probe expects a hidden name; this one is read, and only a change must fail
    // (with EPERM, or EACCES from the kernel for a caller who may not write the root).
    let changes: Vec<&str> = said
        .lines()
        .filter(|l| !l.contains(" get: ") && !l.ends_with(": EACCES"))
        .collect();
    assert!(changes.is_empty(), "verilay.stats: {changes:?}");
}

/// An image whose objects, owned by `uid`, carry the names a rootless mount reads from its
/// upper directory: a file claiming to be root's and setuid, a directory claiming to be
/// opaque, one redirected to another, and a file with an origin record.
fn planted_tree(src: &Path, uid: u32) {
    sh(&format!(
        "set -e; mkdir -p {0}; cd {0}; mkdir -p opaque redirected other; echo f > file
         echo keep > opaque/keep; echo own > redirected/own; echo other > other/o
         setfattr -n user.containers.override_stat -v 0:0:0104755 file
         setfattr -n user.overlay.verilay.origin -v 7 file
         setfattr -n user.overlay.opaque -v y opaque
         setfattr -n user.overlay.redirect -v /other redirected
         setfattr -n user.containers.override_stat -v 0:0:040755 redirected
         chown -R {uid}:{uid} .",
        src.display()
    ));
}

#[test]
fn an_image_cannot_plant_an_owner_or_markers_in_a_rootless_upper_by_copy_up() {
    if prerequisites() {
        return;
    }
    let me = test_ids();
    let uid: u32 = me.split(':').next().unwrap().parse().unwrap();
    let rig = Rig::new("planted", true, |src| planted_tree(src, uid));
    // Copy-up of each: a write, and a file made in each directory.
    rig.owner("cd mnt && echo more >> file && touch opaque/new redirected/new");
    rig.remount();
    assert_eq!(
        rig.stat("file opaque redirected"),
        format!("{me} 644 file\n{me} 755 opaque\n{me} 755 redirected\n")
    );
    assert_eq!(
        rig.owner("ls mnt/opaque mnt/redirected"),
        "mnt/opaque:\nkeep\nnew\n\nmnt/redirected:\nnew\nown\n"
    );
    for (path, name) in [
        ("file", "user.containers.override_stat"),
        ("opaque", "user.overlay.opaque"),
        ("redirected", "user.overlay.redirect"),
        ("redirected", "user.containers.override_stat"),
    ] {
        assert_eq!(rig.host_xattr(path, name), None, "{path}: {name} planted");
    }
    // The origin record is the mount's own, not the image's.
    assert_ne!(
        rig.host_xattr("file", "user.overlay.verilay.origin")
            .as_deref(),
        Some("7")
    );
}

#[test]
fn a_rootless_user_cannot_take_ownership_or_privileges_another_way() {
    if prerequisites() {
        return;
    }
    let rig = Rig::new("siblings", true, shared_tree);
    populate(&rig);
    let me = test_ids();
    // Each must fail; the kernel refuses most before the daemon sees them (default
    // permissions against the owner the tree shows), the daemon the whiteout.
    // vfs_cap_data v2, effective, cap_setuid permitted.
    let cap = "0x0100000280000000000000000000000000000000";
    for attempt in [
        "chown 0:0 mnt/shared/mine",
        "chgrp 0 mnt/shared/mine",
        "chown verilaytest mnt/shared/file",
        "chmod u+s mnt/shared/file",
        "chmod 4777 mnt/shared",
        &format!("setfattr -n security.capability -v {cap} mnt/shared/mine"),
        &format!("setfattr -n security.capability -v {cap} mnt/shared/file"),
        "setfacl -m u:verilaytest:rwx mnt/shared/img_only",
        "mknod mnt/shared/whiteout c 0 0",
        "mknod mnt/shared/null c 1 3",
    ] {
        let out = rig.run_as(true, attempt);
        assert!(!out.status.success(), "{attempt} succeeded");
    }
    rig.remount();
    assert_eq!(
        rig.stat("shared shared/file shared/mine shared/img_only"),
        format!(
            "0:0 777 shared\n0:0 666 shared/file\n{me} 644 shared/mine\n0:0 666 shared/img_only\n"
        )
    );
    assert_eq!(rig.host_xattr("shared/mine", "security.capability"), None);
    assert!(!rig.base.join("up/shared/whiteout").exists());
}

// Directory cycles and deep trees. A mount keeps each directory's parent (for measured
// paths, copy-up and redirects), so an image whose dirents make a cycle, or put one
// directory under two parents, must not reach those walks: such a directory is EIO with
// a log line, everything else is served, and every walk up is bounded and iterative.

/// The EROFS part of a sealed image (its trailer's data size).
fn erofs_part(image: &Path) -> Vec<u8> {
    let mut b = std::fs::read(image).unwrap();
    let t = b.len() - 64;
    assert_eq!(&b[t..t + 8], b"VLVERITY");
    let len = u64::from_le_bytes(b[t + 16..t + 24].try_into().unwrap());
    b.truncate(len as usize);
    b
}

/// The inode number of `path` in the EROFS bytes `raw`.
fn nid_at(raw: &[u8], path: &str) -> u64 {
    let img = erofs::read::Image::open(raw).unwrap();
    let mut nid = img.root_nid();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let dir = img.inode(nid).unwrap();
        nid = img.lookup(&dir, part.as_bytes()).unwrap().unwrap().nid;
    }
    nid
}

/// Points entry `name` of directory `dir` of the EROFS bytes `raw` at inode `nid`,
/// keeping the superblock checksum (block 0 may hold the dirent) right.
fn repoint_entry(raw: &mut [u8], dir: &str, name: &str, nid: u64) {
    let at = {
        let img = erofs::read::Image::open(&*raw).unwrap();
        let d = img.inode(nid_at(raw, dir)).unwrap();
        let e = img
            .readdir(&d, 0)
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.name == name.as_bytes())
            .unwrap_or_else(|| panic!("{dir} has no {name}"));
        let ext = img.map(&d, e.offset).unwrap();
        (ext.physical.unwrap() + (e.offset - ext.logical)) as usize
    };
    raw[at..at + 8].copy_from_slice(&nid.to_le_bytes());
    let bs = 1usize << raw[1024 + 12];
    if let Some(crc) = erofs::format::superblock_checksum(&raw[..bs.max(2048)], bs) {
        raw[1028..1032].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Writes the EROFS bytes `raw` to `image` and seals it: every block verifies.
fn seal_raw(raw: &[u8], image: &Path) {
    std::fs::write(image, raw).unwrap();
    crate::common::run(
        crate::common::verilay()
            .args(["seal", "--quiet"])
            .arg(image),
    );
}

/// An image whose dirents make `/a/b` the directory `/a` itself, `/y/d` the directory
/// `/x/d` (a second parent), and `/z/up` the root; `/a/f` and `/x/d/in` are plain files.
/// Every block verifies; `fsck` reports the cycle.
fn cyclic_image(base: &Path) -> PathBuf {
    let src = base.join("cyclic-src");
    sh(&format!(
        "set -e; mkdir -p {0}/a/b {0}/x/d {0}/y/d {0}/z/up; echo data > {0}/a/f; echo in > {0}/x/d/in",
        src.display()
    ));
    let built = base.join("cyclic-built.img");
    build(&src, &built, &["--quiet"]);
    let mut raw = erofs_part(&built);
    let (a, xd, root) = (nid_at(&raw, "/a"), nid_at(&raw, "/x/d"), nid_at(&raw, "/"));
    repoint_entry(&mut raw, "/a", "b", a);
    repoint_entry(&mut raw, "/y", "d", xd);
    repoint_entry(&mut raw, "/z", "up", root);
    let image = base.join("cyclic.img");
    seal_raw(&raw, &image);
    image
}

/// `verilay mount ARGS` with the daemon's address space capped (2 GB), so a daemon that
/// grows without bound fails instead of taking the machine; unmounted when dropped.
fn capped_mount(mnt: &Path, args: &str) -> crate::common::Unmount {
    std::fs::create_dir_all(mnt).unwrap();
    sh(&format!(
        "ulimit -v 2000000 && {} mount --quiet {args} {}",
        env!("CARGO_BIN_EXE_verilay"),
        mnt.display()
    ));
    crate::common::Unmount {
        dir: mnt.to_path_buf(),
        fuse: true,
    }
}

fn errno_of(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// Mounts `cyclic_image` in each way the mount keeps parents (read-only measured, the
/// same stacked on another image, and writable), each capped and logging, and hands
/// `check` the mode's name, mountpoint and log file.
fn each_mount_of_the_cyclic_image(check: impl Fn(&str, &Path, &Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let image = cyclic_image(base);
    let fsck = crate::common::verilay()
        .arg("fsck")
        .arg(&image)
        .output()
        .unwrap();
    assert_eq!(fsck.status.code(), Some(1), "fsck finds the cycle");
    // A second image to stack it under (overlayfs's rules: another code path).
    let other = base.join("other-src");
    sh(&format!(
        "mkdir -p {0}/top && echo t > {0}/top/t",
        other.display()
    ));
    build(&other, &base.join("other.img"), &["--quiet"]);
    std::fs::write(base.join("policy"), "measure func=FILE_CHECK\n").unwrap();
    sh(&format!("mkdir -p {0}/up {0}/work", base.display()));
    let b = base.display();
    let modes = [
        (
            "measured",
            format!("{b}/cyclic.img --policy {b}/policy --measure-log {b}/list1"),
        ),
        (
            "stacked",
            format!("{b}/other.img {b}/cyclic.img --policy {b}/policy --measure-log {b}/list2"),
        ),
        (
            "writable",
            format!("{b}/cyclic.img --upper {b}/up --work {b}/work"),
        ),
    ];
    for (mode, args) in modes {
        let log = base.join(format!("{mode}.log"));
        let mnt = base.join(format!("mnt-{mode}"));
        let _u = capped_mount(&mnt, &format!("{args} --log {}", log.display()));
        // The kernel meets the misplaced names first (listings), as the attack did: what
        // the mount keeps must not change because of them. A listing is whole (names only,
        // as a writable mount lists them) or EIO (with their inodes, as READDIRPLUS
        // gives them): never short.
        for (dir, name) in [("a", "b"), ("y", "d"), ("z", "up")] {
            let listed =
                std::fs::read_dir(mnt.join(dir)).and_then(|d| d.collect::<Result<Vec<_>, _>>());
            match listed {
                Ok(v) => assert!(
                    v.iter().any(|e| e.file_name() == name),
                    "{mode}: /{dir} listed without {name}"
                ),
                Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{mode}: /{dir}"),
            }
        }
        check(mode, &mnt, &log);
        assert!(
            !crate::common::daemons_of(&mnt).is_empty(),
            "{mode}: the daemon died"
        );
    }
}

/// Whether `log` has the line refusing entry `name` of `/dir`.
fn logs_refusal(log: &Path, dir: &str, name: &str) -> bool {
    let logged = std::fs::read_to_string(log).unwrap_or_default();
    let entry = format!("is \"{name}\" in directory inode");
    let found = logged
        .lines()
        .any(|l| l.contains(&entry) && l.contains("refused"));
    if !found {
        eprintln!("no log line refuses /{dir}/{name}: {logged}");
    }
    found
}

fn mount_prerequisites() -> bool {
    skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
}

/// `/a/b` is `/a` and `/z/up` the root: looking them up is EIO and a log line, while a
/// measured open (which walks the parents for its path) and a write (which copies the
/// parents up) of `/a/f` work, and the daemon lives on, in every mode.
#[test]
fn a_directory_cycle_is_eio_and_the_daemon_serves_on() {
    if mount_prerequisites() {
        return;
    }
    each_mount_of_the_cyclic_image(|mode, mnt, log| {
        let tries = ["a/b", "z/up", "a/b/f", "a/b/b/b", "z/up/a"];
        let got: Vec<_> = tries
            .iter()
            .map(|p| errno_of(std::fs::symlink_metadata(mnt.join(p))))
            .collect();
        if mode == "writable" {
            sh(&format!("echo more >> {}/a/f", mnt.display()));
        }
        let f = std::fs::read_to_string(mnt.join("a/f"));
        assert!(
            f.is_ok(),
            "{mode}: /a/f after the cycle was looked up: {f:?}"
        );
        let eio = Some(rustix::io::Errno::IO.raw_os_error());
        assert_eq!(got, vec![eio; tries.len()], "{mode}: {tries:?}");
        if mode == "stacked" {
            assert_eq!(std::fs::read_to_string(mnt.join("top/t")).unwrap(), "t\n");
        }
        assert!(
            logs_refusal(log, "a", "b") && logs_refusal(log, "z", "up"),
            "{mode}"
        );
    });
}

/// `/y/d` names the directory `/x/d` (a directory hardlinked under two parents): the
/// name its `..` does not name is EIO and a log line, whichever is looked up first; the
/// other serves its files.
#[test]
fn a_directory_under_two_parents_is_eio_at_the_second() {
    if mount_prerequisites() {
        return;
    }
    each_mount_of_the_cyclic_image(|mode, mnt, log| {
        let second = errno_of(std::fs::symlink_metadata(mnt.join("y/d")));
        let first = std::fs::read_to_string(mnt.join("x/d/in"));
        let again = errno_of(std::fs::read_to_string(mnt.join("y/d/in")));
        let eio = Some(rustix::io::Errno::IO.raw_os_error());
        assert_eq!((second, again), (eio, eio), "{mode}: /y/d");
        assert_eq!(first.unwrap(), "in\n", "{mode}");
        assert!(logs_refusal(log, "y", "d"), "{mode}");
    });
}

/// `depth` directories `d` nested in one another, the deepest holding `f` ("deep\n").
/// Built from an in-memory tree: a directory tree this deep has paths longer than
/// PATH_MAX, which `verilay build` cannot scan.
fn deep_image(image: &Path, depth: usize) {
    use erofs::builder::{Content, Kind, Node, Tree};
    let node = |kind, size| Node {
        kind,
        perm: 0o755,
        uid: 0,
        gid: 0,
        mtime: 1_700_000_000,
        mtime_nsec: 0,
        size,
        xattrs: Vec::new(),
    };
    let dir = || {
        node(
            Kind::Directory {
                children: Vec::new(),
            },
            0,
        )
    };
    let mut tree = Tree::default();
    let mut at = tree.add(dir());
    for _ in 0..depth {
        let child = tree.add(dir());
        if let Kind::Directory { children } = &mut tree.nodes[at].kind {
            children.push((b"d".to_vec(), child));
        }
        at = child;
    }
    let file = Kind::Regular {
        content: Content::Bytes(b"deep\n".to_vec()),
        extents: None,
    };
    let f = tree.add(node(file, 5));
    if let Kind::Directory { children } = &mut tree.nodes[at].kind {
        children.push((b"f".to_vec(), f));
    }
    erofs::builder::build_tree(
        &tree,
        &erofs::builder::BuildOptions::default(),
        image,
        &erofs::builder::Silent,
    )
    .unwrap();
}

/// The deepest directory of a `deep_image` tree under `root`, opened one level at a time.
fn open_deep(root: &Path, depth: usize) -> rustix::fd::OwnedFd {
    use rustix::fs::{open, openat, Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut fd = open(root, flags, Mode::empty()).unwrap();
    for level in 0..depth {
        fd = openat(&fd, "d", flags, Mode::empty())
            .unwrap_or_else(|e| panic!("level {level} under {}: {e}", root.display()));
    }
    fd
}

fn read_deep(root: &Path, depth: usize) -> String {
    use rustix::fs::{openat, Mode, OFlags};
    let dir = open_deep(root, depth);
    let f = openat(&dir, "f", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
    std::io::read_to_string(std::fs::File::from(f)).unwrap()
}

/// A legitimate tree 10,000 levels deep: appending to its deepest file copies up every
/// directory above it (kernel overlayfs reads the result), and a measured open there works.
#[test]
fn a_ten_thousand_level_tree_is_copied_up_and_measured_without_recursion() {
    if mount_prerequisites() {
        return;
    }
    const DEPTH: usize = 10_000;
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let image = base.join("deep.img");
    deep_image(&image, DEPTH);
    let d = crate::common::dirs(base, "deep");
    {
        // Appending to the deepest file copies up all 10,000 directories above it.
        let mnt = base.join("mnt");
        let _u = capped_mount(
            &mnt,
            &format!(
                "{} --upper {} --work {}",
                image.display(),
                d.upper.display(),
                d.work.display()
            ),
        );
        use rustix::fs::{openat, Mode, OFlags};
        let dir = open_deep(&mnt, DEPTH);
        let wrote = openat(&dir, "f", OFlags::WRONLY | OFlags::APPEND, Mode::empty())
            .map_err(std::io::Error::from)
            .and_then(|f| std::io::Write::write_all(&mut std::fs::File::from(f), b"more\n"));
        assert!(wrote.is_ok(), "append at depth {DEPTH}: {wrote:?}");
        assert_eq!(read_deep(&mnt, DEPTH), "deep\nmore\n");
        assert!(
            !crate::common::daemons_of(&mnt).is_empty(),
            "the daemon died"
        );
    }
    crate::common::wait_daemon_gone(&base.join("mnt"));
    // The kernel's overlayfs reads the same copy from the upper directory.
    let lower = crate::common::Mount::erofs(&image, &base.join("lower"));
    {
        let _o = crate::common::overlay_mount(&lower.dir, &d, &base.join("ovl"));
        assert_eq!(read_deep(&base.join("ovl"), DEPTH), "deep\nmore\n");
    }
    // A measured open that deep: its path is longer than PATH_MAX, so the list names the
    // file as the kernel's IMA does then, by its name alone.
    let policy = base.join("policy");
    std::fs::write(&policy, "measure func=FILE_CHECK\n").unwrap();
    let mnt = base.join("mnt-measured");
    let list = base.join("list");
    let _u = capped_mount(
        &mnt,
        &format!(
            "{} --policy {} --measure-log {}",
            image.display(),
            policy.display(),
            list.display()
        ),
    );
    assert_eq!(read_deep(&mnt, DEPTH), "deep\n");
    crate::common::run(crate::common::verilay().arg("stats").arg(&mnt));
    let ascii = std::fs::read_to_string(list.join("ascii_runtime_measurements")).unwrap();
    assert!(
        ascii.lines().any(|l| l.ends_with(" f")),
        "no entry names the deep file: {ascii}"
    );
}

/// The cyclic image (a directory inside itself, one under two parents, the root under a
/// name), raw and sealed.
fn cycle_seeds(tmp: &Path) -> Vec<Seed> {
    let base = tmp.join("xattrs-cycle");
    std::fs::create_dir_all(&base).unwrap();
    let image = cyclic_image(&base);
    let sealed = std::fs::read(&image).unwrap();
    let raw = erofs_part(&image);
    vec![
        Seed {
            target: "read_image",
            name: "directory-cycle".into(),
            bytes: raw,
        },
        Seed {
            target: "verified_source",
            name: "directory-cycle".into(),
            bytes: sealed,
        },
    ]
}

/// The abstract socket name `verilay stats` reads the mount at `mnt` from.
fn stats_socket(mnt: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mnt).unwrap().dev();
    format!(
        "verilay/stats/{}:{}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    )
}

/// A read-only mount (`--allow-other`) of an image without xattrs in a fresh directory
/// the test user can enter: (tempdir, mountpoint), unmounted when the first is dropped.
fn stats_rig() -> (tempfile::TempDir, PathBuf, crate::common::Unmount) {
    let t = tempfile::tempdir().unwrap();
    sh(&format!("chmod 755 '{}'", t.path().display()));
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("file"), b"still served\n").unwrap();
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    crate::common::run(
        crate::common::verilay()
            .args(["mount", "--quiet", "--allow-other"])
            .arg(&image)
            .arg(&mnt),
    );
    let u = crate::common::Unmount::fuse(&mnt);
    (t, mnt, u)
}

/// Runs `verilay stats --json DIR` as root or the test user: its output, and how long it
/// took.
fn stats_now(dir: &Path, as_user: bool) -> (Output, std::time::Duration) {
    let start = std::time::Instant::now();
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", if as_user { "verilaytest" } else { "root" }, "--"]);
    cmd.arg(env!("CARGO_BIN_EXE_verilay"))
        .args(["stats", "--json"]);
    let out = cmd.arg(dir).output().unwrap();
    (out, start.elapsed())
}

/// A client of the stats socket, run as the test user: 300 connections that never send
/// (more than the daemon keeps waiting), one flooding a megabyte of garbage, one sending
/// no descriptor, one a descriptor of another directory, one an O_PATH descriptor of the
/// mount's root, and one hanging up at once. Prints the replies of the immediate ones,
/// then `ready`, then, once its stdin closes, the replies of the idle ones.
const HOSTILE_CLIENTS: &str = r#"
import os, socket, sys
name, mnt = "\0" + sys.argv[1], sys.argv[2]
def conn():
    s = socket.socket(socket.AF_UNIX)
    s.connect(name)  # blocking: a full backlog waits (a timeout would make it EAGAIN)
    s.settimeout(10)
    return s
def reply(s):
    try:
        return s.recv(100000).decode()
    except OSError as e:
        return "error " + e.strerror
idle = [conn() for _ in range(300)]
s = conn()
try:
    s.sendall(b"x" * (1 << 20))
except OSError:
    pass
print("flood", reply(s))
s = conn(); s.sendall(b"s"); print("no-fd", reply(s))
s = conn(); socket.send_fds(s, [b"s"], [os.open("/", os.O_RDONLY)]); print("other", reply(s))
s = conn(); socket.send_fds(s, [b"s"], [os.open(mnt, os.O_PATH)]); print("o_path", reply(s))
conn().close()
print("ready", flush=True)
sys.stdin.read()
for s in idle:
    print("idle", reply(s))
"#;

/// Clients that connect and send nothing, flood garbage or pass the wrong descriptor get
/// an error or nothing, never statistics; meanwhile `verilay stats` answers root and the
/// test user at once and the mount serves files. An idle connection is closed after 2
/// seconds, and one the mount's access rules do not admit is answered at once.
#[test]
fn verilay_stats_answers_beside_hostile_clients() {
    if prerequisites() {
        return;
    }
    let (t, mnt, _u) = stats_rig();
    let mut clients = Command::new("runuser")
        .args(["-u", "verilaytest", "--", "python3", "-c", HOSTILE_CLIENTS])
        .arg(stats_socket(&mnt))
        .arg(&mnt)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(clients.stdout.take().unwrap());
    let mut said = String::new();
    while !said.ends_with("ready\n") {
        let before = said.len();
        std::io::BufRead::read_line(&mut out, &mut said).unwrap();
        assert!(said.len() > before, "the clients died: {said}");
    }
    for (client, why) in [
        ("flood", "a request is one byte and a descriptor"),
        ("no-fd", "a request is one byte and a descriptor"),
        ("other", "not this mount's root"),
        ("o_path", "not open for reading"),
    ] {
        let line = said.lines().find(|l| l.starts_with(client)).unwrap();
        assert!(line.contains(why) && !line.contains("stats"), "{said}");
    }
    // With 256 idle connections waiting: answered, well before they time out.
    for as_user in [false, true] {
        let (got, took) = stats_now(&mnt, as_user);
        assert!(got.status.success(), "as user {as_user}: {got:?}");
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
    }
    assert_eq!(
        std::fs::read_to_string(mnt.join("file")).unwrap(),
        "still served\n"
    );
    drop(clients.stdin.take());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(clients.wait().unwrap().success());
    let idle: Vec<&str> = rest.lines().collect();
    assert_eq!(idle.len(), 300, "{rest}");
    let timed_out = idle
        .iter()
        .filter(|l| l.contains("no request within"))
        .count();
    assert!(
        timed_out >= 200,
        "idle connections not closed by the daemon: {rest}"
    );
    assert!(idle.iter().all(|l| !l.contains("stats")), "{rest}");
    drop(t);
}

/// On a mount only root may use, the test user's connections are refused at once.
#[test]
fn verilay_stats_refuses_a_user_the_mount_does_not_admit_at_once() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    sh(&format!("chmod 755 '{}'", t.path().display()));
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"f").unwrap();
    build(&src, &t.path().join("img"), &["--quiet"]);
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    crate::common::run(
        crate::common::verilay()
            .args(["mount", "--quiet"])
            .arg(t.path().join("img"))
            .arg(&mnt),
    );
    let _u = crate::common::Unmount::fuse(&mnt);
    let script = r#"
import socket, sys
for _ in range(100):
    s = socket.socket(socket.AF_UNIX)
    s.connect("\0" + sys.argv[1])
    s.settimeout(10)
    print(s.recv(1000).decode())
"#;
    let out = Command::new("runuser")
        .args(["-u", "verilaytest", "--", "python3", "-c", script])
        .arg(stats_socket(&mnt))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("may not use this mount"))
            .count(),
        100,
        "{out:?}"
    );
    let (got, _) = stats_now(&mnt, false);
    assert!(got.status.success(), "{got:?}");
}

/// Binds `verilay/stats/MAJOR:MINOR` for MINOR from FIRST to LAST, prints `ready`, and
/// once its stdin closes, how many descriptors its callers sent it.
const SQUATTER: &str = r#"
import os, socket, sys
major, first, last = (int(a) for a in sys.argv[1:])
held = []
for minor in range(first, last):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind("\0verilay/stats/%d:%d" % (major, minor))
    except OSError:
        continue
    s.listen(8)
    s.setblocking(False)
    held.append(s)
print("ready", len(held), flush=True)
sys.stdin.read()
fds = 0
for s in held:
    while True:
        try:
            c, _ = s.accept()
        except BlockingIOError:
            break
        c.setblocking(False)
        try:
            _, got, _, _ = socket.recv_fds(c, 16, 4)
            fds += len(got)
        except OSError:
            pass
print("fds", fds)
"#;

/// A process of the test user binding the names the next mounts' sockets may get (an
/// abstract name is anyone's to take): the mounts still mount and serve, and `verilay
/// stats` refuses to ask a listener that is not the mount owner's, naming it, and reads
/// the root's `verilay.stats` instead where the mount answers xattrs; the squatter never
/// receives the descriptor of a mount's root.
#[test]
fn a_squatted_stats_name_costs_the_mount_its_statistics_only() {
    if prerequisites() {
        return;
    }
    // Where anonymous device numbers are handed out now: around a mount's.
    let (t, mnt, u) = stats_rig();
    let dev = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&mnt).unwrap().dev()
    };
    drop(u);
    crate::common::wait_daemon_gone(&mnt);
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let mut squatter = Command::new("runuser")
        .args(["-u", "verilaytest", "--", "python3", "-c", SQUATTER])
        .arg(major.to_string())
        // The kernel hands out the lowest free number, and the tests running beside this
        // one free and take numbers too (a full run missed a range starting 20 below).
        .arg(minor.saturating_sub(300).to_string())
        .arg((minor + 300).to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(squatter.stdout.take().unwrap());
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut out, &mut ready).unwrap();
    assert!(ready.starts_with("ready"), "{ready}");
    crate::common::run(
        crate::common::verilay()
            .args(["mount", "--quiet", "--allow-other"])
            .arg(t.path().join("img"))
            .arg(&mnt),
    );
    let _u = crate::common::Unmount::fuse(&mnt);
    assert_eq!(
        std::fs::read_to_string(mnt.join("file")).unwrap(),
        "still served\n"
    );
    let squatted = stats_socket(&mnt);
    for as_user in [false, true] {
        let (got, _) = stats_now(&mnt, as_user);
        let err = String::from_utf8_lossy(&got.stderr);
        assert!(
            !got.status.success()
                && err.contains(&squatted)
                && err.contains("not by the mount's daemon"),
            "as user {as_user}: {got:?}"
        );
    }
    // A mount that answers xattrs: read through the root's attribute, which the kernel,
    // not a name, leads to.
    let src = t.path().join("labelled");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"f").unwrap();
    sh(&format!(
        "setfattr -n user.x -v 1 '{}'",
        src.join("f").display()
    ));
    build(&src, &t.path().join("labelled.img"), &["--quiet"]);
    let mnt2 = t.path().join("mnt2");
    std::fs::create_dir_all(&mnt2).unwrap();
    crate::common::run(
        crate::common::verilay()
            .args(["mount", "--quiet", "--allow-other"])
            .arg(t.path().join("labelled.img"))
            .arg(&mnt2),
    );
    let _u2 = crate::common::Unmount::fuse(&mnt2);
    let (got, _) = stats_now(&mnt2, true);
    let err = String::from_utf8_lossy(&got.stderr);
    assert!(
        got.status.success()
            && err.contains(&stats_socket(&mnt2))
            && err.contains("read the root's verilay.stats instead"),
        "{got:?}"
    );
    drop(squatter.stdin.take());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(squatter.wait().unwrap().success());
    assert_eq!(rest.trim(), "fds 0", "the squatter got a descriptor");
}

/// Issue 36, item 5: a root writable mount listed and copied up `user.overlay.*` xattrs
/// an image carried, while they are markers to a rootless mount (and kernel overlayfs
/// with `userxattr`) of the same upper directory: an image could plant an opaque marker
/// or a redirect there. Both of overlayfs's namespaces are the mount's own on every
/// writable mount: not listed, not read, not set, never copied up.
#[test]
fn a_root_mount_never_copies_up_an_images_user_overlay_markers() {
    let Some(t) = root_and_tool_tempdir("needs root (mounts)", "setfattr", "setfattr missing")
    else {
        return;
    };
    let (src, up, work, mnt) = (
        t.path().join("src"),
        t.path().join("u"),
        t.path().join("w"),
        t.path().join("m"),
    );
    for d in [&src, &up, &work, &mnt] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(src.join("f"), "image\n").unwrap();
    std::fs::create_dir(src.join("d")).unwrap();
    sh(&format!(
        "setfattr -n user.overlay.opaque -v y {0}/f && setfattr -n user.overlay.redirect -v /x {0}/d && setfattr -n user.keep -v 1 {0}/f",
        src.display()
    ));
    let image = t.path().join("i.img");
    build(&src, &image, &["--quiet"]);
    crate::common::run(
        crate::common::verilay()
            .arg("mount")
            .arg(&image)
            .arg(&mnt)
            .arg("--upper")
            .arg(&up)
            .arg("--work")
            .arg(&work),
    );
    let _m = crate::common::Unmount::fuse(&mnt);
    let listed = sh(&format!("getfattr -d -m- {0}/f {0}/d", mnt.display()));
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(!listed.contains("user.overlay"), "{listed}");
    assert!(listed.contains("user.keep"), "{listed}");
    let set = Command::new("setfattr")
        .args(["-n", "user.overlay.opaque", "-v", "y"])
        .arg(mnt.join("f"))
        .output()
        .unwrap();
    assert!(
        !set.status.success(),
        "set user.overlay.opaque through the mount"
    );
    // Copy-up of both (a write, a chmod): no user.overlay.* lands in the upper directory.
    sh(&format!(
        "echo more >> {0}/f && chmod 700 {0}/d",
        mnt.display()
    ));
    let upper = sh(&format!("getfattr -d -m- {0}/f {0}/d", up.display()));
    let upper = String::from_utf8_lossy(&upper.stdout);
    assert!(!upper.contains("user.overlay"), "{upper}");
    assert!(upper.contains("user.keep"), "{upper}");
}
