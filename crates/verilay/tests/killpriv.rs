//! Setuid, setgid and `security.capability` on a writable mount, which the mount drops
//! itself (FUSE_HANDLE_KILLPRIV_V2): a write, truncate, O_TRUNC open or fallocate by an
//! ordinary user drops them, root's keep them, a chown drops them; each checked against
//! kernel overlayfs over the kernel's erofs mount of the same image, on a root mount
//! (passthrough, and a file whose opens stay cached) and a rootless one. And the kernel
//! no longer asks for `security.capability` on every write.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// `security.capability` granting cap_net_raw (VFS_CAP_REVISION_2, effective).
const CAPABILITY: &str = "0sAQAAAgAgAAAAAAAAAAAAAAAAAAA=";

fn prerequisites() -> bool {
    skip_unless(is_root(), "needs root (kernel mounts, runuser)")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
        || lacks_test_user()
}

/// The image's tree: files anyone may write, set-id (setgid with and without group
/// execute) or holding a capability, and a setgid directory.
fn privileged_tree(src: &Path) {
    sh(&format!(
        "set -e; mkdir -p {0} && cd {0}
         for f in user-append user-cached user-trunc user-otrunc user-falloc root-append \
                  root-cached root-trunc root-otrunc root-chown root-chown-none; do
             echo data > $f; chmod 6777 $f
         done
         for f in user-cap root-cap root-chown-cap; do
             echo data > $f; chmod 0777 $f; setfattr -n security.capability -v {CAPABILITY} $f
         done
         echo data > user-sgid-nox; chmod 2666 user-sgid-nox
         echo data > user-chown-none; chmod 4755 user-chown-none
         echo data > user-chown-gw; chmod 6775 user-chown-gw
         echo data > root-chgrp-nox; chmod 2666 root-chgrp-nox
         mkdir sgid-dir; chmod 2777 sgid-dir",
        src.display()
    ));
}

/// What the test user and root do to the tree at `$M`. `*-cached` is written while root
/// holds it open read-only from the image, so its opens stay cached and the write comes
/// to the mount as a WRITE (the others are passthrough on a root verilay mount).
/// `chown(-1, -1)` changes nothing but drops privileges, even root's.
const CHANGES: &str = r#"set -e
    U() { runuser -u verilaytest -- sh -c "cd $M && $1"; }
    U 'echo x >> user-append; echo x >> user-cap; truncate -s 2 user-trunc; : > user-otrunc'
    U 'fallocate -l 8192 user-falloc; echo x >> user-sgid-nox'
    U "python3 -c 'import os; os.chown(\"user-chown-none\", -1, -1)' 2>/dev/null && exit 1 || :"
    U "python3 -c 'import os; os.chown(\"user-chown-gw\", -1, -1)' 2>/dev/null && exit 1 || :"
    exec 3< "$M/user-cached"; U 'echo x >> user-cached'; exec 3<&-
    cd "$M"
    echo x >> root-append; echo x >> root-cap; truncate -s 2 root-trunc; : > root-otrunc
    exec 3< root-cached; echo x >> root-cached; exec 3<&-
    chown 1234:1234 root-chown root-chown-cap sgid-dir; chgrp 1234 root-chgrp-nox
    python3 -c 'import os; os.chown("root-chown-none", -1, -1)'
    echo n > new; chmod 6777 new; U 'echo x >> new'"#;

/// Mode, owner, size and capability (base64) of each entry of `dir`.
fn privileges(dir: &Path) -> String {
    let out = run(Command::new("sh").arg("-c").arg(format!(
        "cd {} && for f in *; do printf '%s %s\\n' \"$(stat -c '%a %u:%g %s %n' $f)\" \
         \"$(getfattr --only-values -n security.capability $f 2>/dev/null | base64)\"; done",
        dir.display()
    )));
    String::from_utf8(out.stdout).unwrap()
}

/// The line `privileges` shows for `name`.
fn line<'a>(all: &'a str, name: &str) -> &'a str {
    all.lines()
        .find(|l| l.split(' ').nth(3) == Some(name))
        .unwrap_or_else(|| panic!("{name} missing from:\n{all}"))
}

#[test]
fn privileges_dropped_on_a_root_mount_match_kernel_overlayfs() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = t.path().join("src");
    privileged_tree(&src);
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let lower = Mount::erofs(&image, &t.path().join("lower"));
    let (ours, theirs) = (dirs(t.path(), "ours"), dirs(t.path(), "theirs"));
    let v = verilay_mount(&image, &ours, &t.path().join("v"));
    let k = overlay_mount(&lower.dir, &theirs, &t.path().join("k"));
    run(Command::new("sh").arg("-c").arg(CHANGES).env("M", &k.dir));
    let changes = format!("export M={}; {CHANGES}", v.dir.display());
    if can_count_requests() {
        // Passthrough: only the two writes through cached opens come to the mount.
        let writes = requests_during(&v.dir, WRITE, &changes);
        assert_eq!(writes, 2, "WRITE requests");
    } else {
        sh(&changes);
    }
    let (got, want) = (privileges(&v.dir), privileges(&k.dir));
    assert_eq!(
        got, want,
        "verilay (left) and kernel overlayfs (right) differ"
    );
    // What the comparison is about, spelled out.
    for (name, shown) in [
        ("user-append", "777 0:0 7"),
        ("user-cached", "777 0:0 7"),
        ("user-cap", "777 0:0 7"),
        ("user-trunc", "777 0:0 2"),
        ("user-otrunc", "777 0:0 0"),
        ("user-falloc", "777 0:0 8192"),
        ("user-sgid-nox", "666 0:0 7"),
        // chown(-1, -1) by a user who may not write it: EPERM, as the VFS answers.
        ("user-chown-none", "4755 0:0 5"),
        // Group-writable, but the user is not in the group (and no ACL names it).
        ("user-chown-gw", "6775 0:0 5"),
        ("new", "777 0:0 4"),
        ("root-append", "6777 0:0 7"),
        ("root-cached", "6777 0:0 7"),
        ("root-otrunc", "6777 0:0 0"),
        ("root-chown-none", "777 0:0 5"),
        ("root-cap", "777 0:0 7"),
        ("root-trunc", "6777 0:0 2"),
        ("root-chown", "777 1234:1234 5"),
        ("root-chown-cap", "777 1234:1234 5"),
        ("root-chgrp-nox", "2666 0:1234 5"),
        ("sgid-dir", "2777 1234:1234"),
    ] {
        let l = line(&got, name);
        assert!(l.starts_with(shown), "{name}: {l}");
        assert!(
            l.ends_with(&format!("{name} ")),
            "{name} keeps a capability: {l}"
        );
    }
    // The upper directory holds what the mount shows.
    assert_eq!(privileges(&ours.upper), privileges(&theirs.upper));
}

#[test]
fn privileges_dropped_on_a_rootless_mount_leave_the_override_xattr() {
    if prerequisites() {
        return;
    }
    let base = std::env::temp_dir().join(format!("verilay-killpriv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("src")).unwrap();
    privileged_tree(&base.join("src"));
    build(&base.join("src"), &base.join("img"), &["--quiet"]);
    std::fs::copy(env!("CARGO_BIN_EXE_verilay"), base.join("verilay")).unwrap();
    sh(&format!(
        "set -e; cd {0}; mkdir up work mnt; chown verilaytest . up work mnt img verilay",
        base.display()
    ));
    let as_user = |script: &str| as_test_user_ok(&base, script);
    let mount = "./verilay mount img --upper up --work work mnt --quiet";
    as_user(mount);
    // Unmounted however the assertions end.
    let _unmount = Unmount::fuse(&base.join("mnt"));
    as_user(
        "set -e; cd mnt; echo x >> user-append; truncate -s 2 user-trunc; : > user-otrunc
         fallocate -l 8192 user-falloc; echo x >> user-sgid-nox
         echo n > new; chmod 6755 new; echo x >> new",
    );
    // As kernel overlayfs shows them for the same changes (the root mount's test).
    let me = as_user("echo $(id -u):$(id -g)");
    let want = format!(
        "755 {} new\n777 0:0 user-append\n777 0:0 user-falloc\n777 0:0 user-otrunc\n\
         666 0:0 user-sgid-nox\n777 0:0 user-trunc\n",
        me.trim()
    );
    let shown = "cd mnt && stat -c '%a %u:%g %n' new user-append user-falloc user-otrunc \
                 user-sgid-nox user-trunc";
    assert_eq!(as_user(shown), want);
    // Kept in the override xattr, not only in the kernel's cache: the same after a remount.
    as_user("./verilay umount mnt");
    as_user(mount);
    assert_eq!(as_user(shown), want);
    as_user("./verilay umount mnt");
    let _ = std::fs::remove_dir_all(&base);
}

const WRITE: u32 = 16;
const GETXATTR: u32 = 22;

/// Whether `requests_during` can count: perf, and the kernel's FUSE tracepoints.
fn can_count_requests() -> bool {
    have("perf") && Path::new("/sys/kernel/tracing/events/fuse/fuse_request_send").exists()
}

/// The device number of the filesystem mounted at `mnt`, as the kernel's FUSE
/// tracepoints name its connection.
fn connection(mnt: &Path) -> u32 {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dev = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap()))
        .and_then(|l| l.split(' ').nth(2))
        .unwrap_or_else(|| panic!("{} is not mounted", mnt.display()));
    let (major, minor) = dev.split_once(':').unwrap();
    (major.parse::<u32>().unwrap() << 20) | minor.parse::<u32>().unwrap()
}

/// How many `opcode` requests the kernel sends the mount at `mnt` while `script` runs
/// (`perf stat` on the fuse_request_send tracepoint).
fn requests_during(mnt: &Path, opcode: u32, script: &str) -> u64 {
    let filter = format!("opcode == {opcode} && connection == {}", connection(mnt));
    let out = run(Command::new("perf")
        .args(["stat", "-x,", "-e", "fuse:fuse_request_send", "--filter"])
        .arg(filter)
        .args(["-a", "--", "sh", "-c", script]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let count = stderr
        .lines()
        .find(|l| l.contains("fuse:fuse_request_send"))
        .and_then(|l| l.split(',').next())
        .unwrap_or_else(|| panic!("no count from perf stat: {stderr}"));
    count
        .parse()
        .unwrap_or_else(|_| panic!("perf stat: {stderr}"))
}

#[test]
fn small_writes_by_a_user_no_longer_ask_for_the_capability_each() {
    if prerequisites()
        || skip_unless(
            can_count_requests(),
            "perf or the fuse tracepoints (Linux 6.15+, tracefs) missing",
        )
    {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = t.path().join("src");
    sh(&format!(
        "mkdir -p {0} && echo data > {0}/file && chmod 666 {0}/file",
        src.display()
    ));
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let v = verilay_mount(&image, &dirs(t.path(), "up"), &t.path().join("v"));
    let file = v.dir.join("file");
    let writes = |n: u32| {
        let dd = format!(
            "runuser -u verilaytest -- dd if=/dev/zero of={} bs=1 count={n} conv=notrunc \
             status=none",
            file.display()
        );
        requests_during(&v.dir, GETXATTR, &dd)
    };
    // Opening the file asks for some (ACLs, and the capability once: the kernel then
    // knows the file has nothing to drop); the writes ask for none of their own.
    let (one, thousand) = (writes(1), writes(1000));
    assert!(
        thousand <= one + 1,
        "{thousand} GETXATTR requests for 1000 writes, {one} for one"
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 1000);
}
