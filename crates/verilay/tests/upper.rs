//! `verilay mount IMAGE --upper DIR --work DIR`: the same changes made through verilay and
//! through the kernel's overlayfs (over the kernel's erofs mount of the same image) give
//! the same merged tree and the same markers in the upper directory; and each one mounts
//! what the other wrote.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn prerequisites() -> bool {
    skip_unless(is_root(), "needs root (kernel mounts, chown)")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
}

fn lower_tree(src: &Path) {
    sh(&format!(
        "set -e; mkdir -p {0} && cd {0}
         mkdir -p olddir replaced sub/deep keepdir
         echo keep > keep.txt; echo gone > gone.txt; echo a > olddir/a; echo b > olddir/b
         echo old > replaced/old; echo m > mode.txt; echo o > owned.txt; echo r > renamed.txt
         echo 0123456789 > trunc.txt; echo deep > sub/deep/file; echo k > keepdir/k
         echo acl > acl.txt; setfacl -m u:1234:r-- acl.txt; setfattr -n user.lower -v 1 keep.txt
         head -c 300000 /dev/urandom > big.bin",
        src.display()
    ));
}

/// What a user does to the merged tree.
const CHANGES: &str = "set -e
    echo more >> keep.txt
    echo new > newfile
    mkdir -p newdir/sub && echo x > newdir/sub/x
    rm gone.txt
    rm -r olddir
    rm -r replaced && mkdir replaced && echo r > replaced/r
    chmod 0600 mode.txt
    chown 1234:5678 owned.txt
    setfattr -n user.added -v yes keep.txt
    ln -s newfile link
    ln newfile hard
    mv renamed.txt moved.txt
    truncate -s 3 trunc.txt
    mkfifo fifo
    dd if=/dev/zero of=big.bin bs=4096 seek=10 count=2 conv=notrunc status=none
    setfacl -m u:4321:rw- keep.txt
    touch -d '2020-01-01 00:00:00' keep.txt newdir";

/// The merged tree as the user sees it: names, types, modes, owners, sizes, link counts
/// (`ls`, without times: the two runs make their changes at different moments), contents,
/// xattrs and ACLs.
fn view(root: &Path) -> String {
    let ls = run(Command::new("ls")
        .args(["-lRAn", "--time-style=+", "."])
        .current_dir(root));
    let sums = run(Command::new("sh")
        .arg("-c")
        .arg("find . -type f -print0 | sort -z | xargs -0 sha256sum")
        .current_dir(root));
    format!(
        "{}\n{}\n{:?}\n{:?}",
        String::from_utf8_lossy(&ls.stdout),
        String::from_utf8_lossy(&sums.stdout),
        xattr_dump(root),
        acl_dump(root)
    )
}

/// The upper directory's entries and overlayfs markers (whiteouts, opaque directories).
fn markers(upper: &Path) -> String {
    let out = run(Command::new("sh")
        .arg("-c")
        .arg(
            "find . -mindepth 1 -printf '%P %y %m %U:%G\\n' | sort; \
             for d in $(find . -type d); do v=$(getfattr --only-values -n trusted.overlay.opaque $d 2>/dev/null); \
             [ -n \"$v\" ] && echo \"opaque $d $v\"; done; true",
        )
        .current_dir(upper));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Dirs {
    upper: PathBuf,
    work: PathBuf,
}

fn dirs(base: &Path, tag: &str) -> Dirs {
    let d = Dirs {
        upper: base.join(format!("{tag}-upper")),
        work: base.join(format!("{tag}-work")),
    };
    std::fs::create_dir_all(&d.upper).unwrap();
    std::fs::create_dir_all(&d.work).unwrap();
    d
}

fn verilay_mount(image: &Path, d: &Dirs, mnt: &Path) -> Unmount {
    std::fs::create_dir_all(mnt).unwrap();
    run(verilay()
        .arg("mount")
        .arg(image)
        .arg("--upper")
        .arg(&d.upper)
        .arg("--work")
        .arg(&d.work)
        .arg(mnt));
    Unmount {
        dir: mnt.to_path_buf(),
        fuse: true,
    }
}

fn overlay_mount(lower: &Path, d: &Dirs, mnt: &Path) -> Unmount {
    std::fs::create_dir_all(mnt).unwrap();
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            d.upper.display(),
            d.work.display()
        ))
        .arg(mnt));
    Unmount {
        dir: mnt.to_path_buf(),
        fuse: false,
    }
}

#[test]
fn changes_through_verilay_match_kernel_overlayfs_both_ways() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    lower_tree(&src);
    let image = t.path().join("lower.img");
    build(&src, &image, &["--quiet"]);
    let lower = Mount::erofs(&image, &t.path().join("lower"));

    let ours = dirs(t.path(), "ours");
    let theirs = dirs(t.path(), "theirs");
    let (ours_view, theirs_view) = {
        let v = verilay_mount(&image, &ours, &t.path().join("v"));
        let k = overlay_mount(&lower.dir, &theirs, &t.path().join("k"));
        sh(&format!("cd {} && {CHANGES}", v.dir.display()));
        sh(&format!("cd {} && {CHANGES}", k.dir.display()));
        let (a, b) = (view(&v.dir), view(&k.dir));
        assert_eq!(a, b, "the merged trees differ");
        // Spot checks that the comparison is about something.
        assert!(a.contains("newdir"), "{a}");
        assert!(!a.contains("gone.txt"), "{a}");
        (a, b)
    };
    assert_eq!(
        markers(&ours.upper),
        markers(&theirs.upper),
        "the upper directories differ"
    );
    // Each mounts the other's upper directory.
    let v = verilay_mount(&image, &theirs, &t.path().join("v2"));
    assert_eq!(view(&v.dir), theirs_view, "verilay over overlayfs's upper");
    drop(v);
    let k = overlay_mount(&lower.dir, &ours, &t.path().join("k2"));
    assert_eq!(view(&k.dir), ours_view, "overlayfs over verilay's upper");
}
