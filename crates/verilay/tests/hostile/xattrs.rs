//! Hidden xattrs set or removed through a mount (item 12), and the other ways a caller
//! could forge what the tree or a later mount reads from the upper directory: the owner
//! and mode a rootless mount shows (`user.containers.override_stat`), overlayfs's markers
//! (`trusted.overlay.*`, and `user.overlay.*` rootless), verilay's origin record, the
//! read-only `verilay.stats`, chown/chmod/capabilities/ACLs, and whiteout devices.

use crate::common::{as_test_user, build, have, is_root, lacks_test_user, sh, skip_unless};
use crate::Seed;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Hostile inputs of this module for the fuzz targets: the image whose objects carry the
/// names a mount keeps for itself (`planted_tree`).
pub fn seeds(tmp: &Path) -> Vec<Seed> {
    if !is_root() || !have("setfattr") {
        return Vec::new(); // the tree needs chown and user.* xattrs set by root
    }
    let src = tmp.join("xattrs-planted-src");
    let image = tmp.join("xattrs-planted.img");
    planted_tree(&src, 1001);
    build(&src, &image, &["--quiet"]);
    vec![Seed {
        target: "read_image",
        name: "xattrs-planted".into(),
        bytes: std::fs::read(&image).unwrap(),
    }]
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
