//! Stacked images: `verilay mount TOP MIDDLE BOTTOM DIR` against the kernel's overlayfs
//! over the kernel's erofs mounts of the same three images. Whiteouts (character devices
//! and xattr whiteouts), opaque directories, files replacing directories and the other way
//! round, merged directories, hardlinks, symlinks, xattrs and ACLs.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn prerequisites() -> bool {
    skip_unless(
        is_root(),
        "needs root (kernel mounts, whiteouts, trusted xattrs)",
    ) || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
}

/// Three layer trees as container layers carry them, top first.
fn layer_trees(base: &Path) -> Vec<PathBuf> {
    let dirs: Vec<PathBuf> = ["top", "middle", "bottom"]
        .iter()
        .map(|n| base.join(n))
        .collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    let (top, middle, bottom) = (&dirs[0], &dirs[1], &dirs[2]);
    sh(&format!(
        "set -e; cd {}
         mkdir -p a/sub c d f/deep x
         echo one > a/1; echo two > a/2; echo x > a/sub/x
         echo 'bottom b' > b; echo keep > c/keep; echo gone > c/gone; echo old > d/old
         echo e > e; echo z > f/deep/z; echo stay > x/stay; echo gone > x/gone
         echo linked > hard1; ln hard1 hard2; ln -s b lnk
         echo acl > acl; setfacl -m u:1234:r-- acl; setfattr -n user.layer -v bottom a",
        bottom.display()
    ));
    sh(&format!(
        "set -e; cd {}
         mkdir -p a c e/inner x
         echo three > a/3; mknod a/1 c 0 0; mknod b c 0 0
         setfattr -n trusted.overlay.opaque -v y c; echo new > c/new
         echo 'now a file' > d; echo inner > e/inner/i
         setfattr -n trusted.overlay.opaque -v x x; touch x/gone
         setfattr -n trusted.overlay.whiteout -v '' x/gone; echo mid > x/mid
         setfattr -n user.layer -v middle a",
        middle.display()
    ));
    sh(&format!(
        "set -e; cd {}
         mkdir -p a/sub f
         echo 'two, changed' > a/2; echo y > a/sub/y; echo newtop > newtop
         echo 'top b' > b; mknod f/deep c 0 0; chmod 0750 a",
        top.display()
    ));
    dirs
}

#[test]
fn stacked_images_match_kernel_overlayfs() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let trees = layer_trees(t.path());
    let mut images = Vec::new();
    let mut digests = Vec::new();
    let mut kernel = Vec::new();
    for (i, tree) in trees.iter().enumerate() {
        let image = t.path().join(format!("layer{i}.img"));
        let out = build(tree, &image, &["--quiet"]);
        digests.push(String::from_utf8(out.stdout).unwrap().trim().to_string());
        kernel.push(Mount::erofs(&image, &t.path().join(format!("k{i}"))));
        images.push(image);
    }
    let ovl = Unmount {
        dir: t.path().join("overlay"),
        fuse: false,
    };
    std::fs::create_dir_all(&ovl.dir).unwrap();
    let lower: Vec<String> = kernel.iter().map(|m| m.dir.display().to_string()).collect();
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!("ro,lowerdir={}", lower.join(":")))
        .arg(&ovl.dir));

    let fuse = Unmount {
        dir: t.path().join("fuse"),
        fuse: true,
    };
    std::fs::create_dir_all(&fuse.dir).unwrap();
    let mut cmd = verilay();
    cmd.arg("mount").args(&images).arg(&fuse.dir);
    for d in &digests {
        cmd.arg("--digest").arg(d);
    }
    run(&mut cmd);

    // What the layers add up to, checked by hand, then everything against the kernel.
    let f = &fuse.dir;
    let read = |p: &str| std::fs::read_to_string(f.join(p)).unwrap();
    assert_eq!(read("a/2"), "two, changed\n");
    assert_eq!(read("a/3"), "three\n");
    assert_eq!(read("b"), "top b\n");
    assert_eq!(read("d"), "now a file\n");
    assert_eq!(read("x/mid"), "mid\n");
    assert_eq!(read("lnk"), "top b\n");
    for gone in ["a/1", "c/keep", "c/gone", "e/", "f/deep", "x/gone"] {
        let p = f.join(gone.trim_end_matches('/'));
        if gone.ends_with('/') {
            assert!(p.is_dir(), "{gone} should be a directory now");
        } else {
            assert!(!p.exists(), "{gone} should be hidden");
        }
    }
    let names = |d: &str| {
        let mut v: Vec<String> = std::fs::read_dir(f.join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v.join(" ")
    };
    assert_eq!(names("a"), "2 3 sub");
    assert_eq!(names("a/sub"), "x y");
    assert_eq!(names("c"), "new");
    assert_eq!(names("x"), "mid stay");
    assert_eq!(names("f"), "");

    assert_diff_clean(&ovl.dir, f);
    assert_same_stats(&ovl.dir, f);
    assert_eq!(ls_lr(&ovl.dir), ls_lr(f), "ls -lR differs from overlayfs's");
    assert_eq!(xattr_dump(&ovl.dir), xattr_dump(f), "getfattr");
    assert_eq!(acl_dump(&ovl.dir), acl_dump(f), "getfacl");
    // overlayfs's own xattrs stay hidden: asked for by name, the FUSE engine refuses them
    // (EOPNOTSUPP), the kernel engine (overlayfs itself) says there is none (ENODATA).
    let asked = |dir: &Path| {
        let out = Command::new("getfattr")
            .args(["-n", "trusted.overlay.opaque"])
            .arg(dir.join("c"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let kernel_engine = std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == f.to_str() && l.split(' ').nth(2) == Some("overlay"));
    if kernel_engine {
        assert!(asked(&ovl.dir).contains("No such attribute"));
        assert_eq!(
            asked(f).replace(f.to_str().unwrap(), ""),
            asked(&ovl.dir).replace(ovl.dir.to_str().unwrap(), "")
        );
    } else {
        assert!(asked(f).contains("Operation not supported"), "{}", asked(f));
    }
}

#[test]
fn stacking_errors_are_one_clear_line() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), "f").unwrap();
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let out = verilay()
        .arg("mount")
        .args([&image, &image, &mnt])
        .args(["--digest", "sha256:00"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1 --digest for 2 images: give one per image, in order, or none"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
