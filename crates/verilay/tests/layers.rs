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
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
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
    let lower: Vec<&Path> = kernel.iter().map(|m| m.dir.as_path()).collect();
    let ovl = overlay_ro(&lower, &t.path().join("overlay"));

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
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
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

/// The images stacked by verilay (the engine the run asks for) and by kernel overlayfs
/// over the kernel's erofs mounts of the same images, compared whole; `check` runs on
/// verilay's mount first. `tag` names the step in failures and mountpoints.
fn stacks_agree(base: &Path, tag: &str, images: &[PathBuf], check: &dyn Fn(&Path)) {
    let kernel: Vec<Mount> = images
        .iter()
        .enumerate()
        .map(|(i, image)| Mount::erofs(image, &base.join(format!("{tag}-k{i}"))))
        .collect();
    let lower: Vec<String> = kernel.iter().map(|m| m.dir.display().to_string()).collect();
    let ovl = Unmount::kernel(&base.join(format!("{tag}-overlay")));
    std::fs::create_dir_all(&ovl.dir).unwrap();
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!("ro,lowerdir={}", lower.join(":")))
        .arg(&ovl.dir));
    let ours = Unmount::fuse(&base.join(format!("{tag}-verilay")));
    std::fs::create_dir_all(&ours.dir).unwrap();
    run(verilay().arg("mount").args(images).arg(&ours.dir));
    check(&ours.dir);
    check(&ovl.dir);
    assert_diff_clean(&ovl.dir, &ours.dir);
    assert_eq!(
        ls_lr(&ovl.dir),
        ls_lr(&ours.dir),
        "{tag}: ls -lR differs from overlayfs's"
    );
}

/// Sorted names in `dir`, space-separated ("-" when it cannot be listed).
fn names_in(dir: &Path) -> String {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return "-".into();
    };
    let mut v: Vec<String> = rd
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v.join(" ")
}

/// `script` run in a writable FUSE-engine mount of `images` over `upper` (verilay writes
/// the redirects overlayfs's `redirect_dir=on` would, and follows the images' own: the
/// scripts `test` what they show), then the upper directory built into `out`.
fn commit_changes(base: &Path, images: &[PathBuf], upper: &str, script: &str, out: &Path) {
    let (u, w, m) = (
        base.join(upper),
        base.join(format!("{upper}-work")),
        base.join(format!("{upper}-mnt")),
    );
    for d in [&u, &w, &m] {
        std::fs::create_dir_all(d).unwrap();
    }
    let mounted = Unmount::fuse(&m);
    run(verilay()
        .args(["mount", "--engine", "fuse", "--upper"])
        .arg(&u)
        .arg("--work")
        .arg(&w)
        .args(images)
        .arg(&m));
    sh(&format!("set -e; cd '{}'; {script}", m.display()));
    mounted.now();
    build(&u, out, &["--quiet"]);
}

#[test]
fn redirects_in_image_layers_are_followed_as_overlayfs_follows_them() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let base = t.path();
    let lo = base.join("lo");
    sh(&format!(
        "set -e; mkdir -p {0}/d {0}/new {0}/e {0}/p/q; echo A > {0}/d/a; echo B > {0}/e/b; echo Q > {0}/p/q/q",
        lo.display()
    ));
    let lo_img = base.join("lo.img");
    build(&lo, &lo_img, &["--quiet"]);
    // The case: a relative redirect (d2 -> d), and a directory moved over a
    // deleted one (e, its contents those of new).
    let u1 = base.join("u1.img");
    commit_changes(
        base,
        std::slice::from_ref(&lo_img),
        "u1",
        "mv d d2; rm -rf e; mv new e; mv p/q q2",
        &u1,
    );
    let redirect = |dir: &Path| {
        let out = Command::new("getfattr")
            .args(["--only-values", "-n", "trusted.overlay.redirect"])
            .arg(dir)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        redirect(&base.join("u1/d2")),
        "d",
        "verilay wrote the redirect"
    );
    assert_eq!(
        redirect(&base.join("u1/q2")),
        "/p/q",
        "an absolute one for a move between directories"
    );
    stacks_agree(base, "one", &[u1.clone(), lo_img.clone()], &|m| {
        assert_eq!(names_in(&m.join("d2")), "a", "{}", m.display());
        assert_eq!(names_in(&m.join("e")), "", "{}", m.display());
        assert_eq!(names_in(&m.join("q2")), "q", "{}", m.display());
        assert_eq!(names_in(m), "d2 e p q2", "{}", m.display());
        assert_eq!(names_in(&m.join("p")), "", "{}", m.display());
    });
    // A second commit renames again, through the first one's redirects: three layers.
    let u2 = base.join("u2.img");
    let two = [u1.clone(), lo_img.clone()];
    commit_changes(
        base,
        &two,
        "u2",
        "test -f d2/a; test -f q2/q; mv d2 d3; mkdir -p z; mv q2 z/q3; echo C > d3/c",
        &u2,
    );
    stacks_agree(
        base,
        "two",
        &[u2.clone(), u1.clone(), lo_img.clone()],
        &|m| {
            assert_eq!(names_in(&m.join("d3")), "a c", "{}", m.display());
            assert_eq!(names_in(&m.join("z/q3")), "q", "{}", m.display());
            assert_eq!(names_in(m), "d3 e p z", "{}", m.display());
        },
    );
    // And once more, over the third layer.
    let u3 = base.join("u3.img");
    let three = [u2.clone(), u1.clone(), lo_img.clone()];
    commit_changes(
        base,
        &three,
        "u3",
        "test -f z/q3/q; test -f d3/a; mv z/q3 q4; mv d3 z/d4",
        &u3,
    );
    stacks_agree(base, "three", &[u3, u2, u1, lo_img], &|m| {
        assert_eq!(names_in(&m.join("q4")), "q", "{}", m.display());
        assert_eq!(names_in(&m.join("z/d4")), "a c", "{}", m.display());
        assert_eq!(names_in(m), "e p q4 z", "{}", m.display());
    });
}

#[test]
fn redirects_overlayfs_refuses_fail_the_lookup_and_the_last_layers_are_not_read() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let base = t.path();
    let (top, bottom) = (base.join("top"), base.join("bottom"));
    // Layers written by hand: a redirect with a slash but not absolute (refused), one
    // through `..` (refused), an opaque directory's (not read), an absolute one through
    // an opaque directory, and one in the bottom layer (never read).
    sh(&format!(
        "set -e; mkdir -p {t}/bad {t}/dots {t}/opq {t}/abs {b}/x/y {b}/src {b}/opq {b}/bad {b}/last
         echo y > {b}/x/y/f; echo s > {b}/src/s; echo o > {b}/opq/o; echo l > {b}/last/l
         setfattr -n trusted.overlay.redirect -v x/y {t}/bad
         setfattr -n trusted.overlay.redirect -v .. {t}/dots
         setfattr -n trusted.overlay.opaque -v y {t}/opq; setfattr -n trusted.overlay.redirect -v src {t}/opq
         setfattr -n trusted.overlay.redirect -v /x/y {t}/abs
         setfattr -n trusted.overlay.redirect -v nowhere/at/all {b}/last",
        t = top.display(),
        b = bottom.display()
    ));
    let images: Vec<PathBuf> = [&top, &bottom]
        .iter()
        .map(|d| {
            let image = d.with_extension("img");
            build(d, &image, &["--quiet"]);
            image
        })
        .collect();
    let kernel: Vec<Mount> = images
        .iter()
        .enumerate()
        .map(|(i, image)| Mount::erofs(image, &base.join(format!("k{i}"))))
        .collect();
    let ovl = Unmount::kernel(&base.join("overlay"));
    std::fs::create_dir_all(&ovl.dir).unwrap();
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!(
            "ro,lowerdir={}:{}",
            kernel[0].dir.display(),
            kernel[1].dir.display()
        ))
        .arg(&ovl.dir));
    let ours = Unmount::fuse(&base.join("verilay"));
    std::fs::create_dir_all(&ours.dir).unwrap();
    run(verilay().arg("mount").args(&images).arg(&ours.dir));
    for m in [&ovl.dir, &ours.dir] {
        for refused in ["bad", "dots"] {
            assert!(
                std::fs::symlink_metadata(m.join(refused)).is_err(),
                "{}: {refused} should fail its lookup",
                m.display()
            );
        }
        assert_eq!(
            names_in(&m.join("opq")),
            "",
            "{}: opaque, no redirect read",
            m.display()
        );
        assert_eq!(names_in(&m.join("abs")), "f", "{}", m.display());
        assert_eq!(names_in(&m.join("last")), "l", "{}", m.display());
    }
}

/// `find`'s type letter and inode number of every object under `root` but the root, by
/// path.
fn inode_numbers(root: &Path) -> Vec<(String, char, u64)> {
    let out = run(Command::new("find")
        .arg(".")
        .args(["-mindepth", "1", "-printf", "%y %i %p\\n"])
        .current_dir(root));
    let mut v: Vec<(String, char, u64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let mut f = l.splitn(3, ' ');
            let kind = f.next().unwrap().chars().next().unwrap();
            let ino = f.next().unwrap().parse().unwrap();
            (f.next().unwrap().to_string(), kind, ino)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn inode_numbers_survive_a_remount_as_overlayfs_keeps_them() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let base = t.path();
    let src = base.join("src");
    sh(&format!(
        "set -e; mkdir -p {0}/a/d; echo foo > {0}/a/foo; echo keep > {0}/a/keep; ln -s foo {0}/a/sym
         echo other > {0}/a/other; mkfifo {0}/a/fifo; echo in > {0}/a/d/in",
        src.display()
    ));
    let image = base.join("img");
    build(&src, &image, &["--quiet"]);
    let changes = "mv a/foo a/bar; chown -h 1234 a/sym; chmod 600 a/keep; mkdir a/newdir; \
                   echo n > a/newdir/n; echo f > a/newfile; chmod 600 a/fifo; mv a/d/in a/in2; \
                   rm a/other; echo o > a/other";
    // Kernel overlayfs over the kernel's erofs mount of the image: the oracle.
    let lower = Mount::erofs(&image, &base.join("lower"));
    let (ku, kw, km) = (base.join("ku"), base.join("kw"), base.join("km"));
    for d in [&ku, &kw, &km] {
        std::fs::create_dir_all(d).unwrap();
    }
    let overlay = |then: &str| {
        run(Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o"])
            .arg(format!(
                "lowerdir={},upperdir={},workdir={}",
                lower.dir.display(),
                ku.display(),
                kw.display()
            ))
            .arg(&km));
        sh(&format!("set -e; cd '{}'; {then}", km.display()));
        let numbers = inode_numbers(&km);
        run(Command::new("umount").arg(&km));
        numbers
    };
    // Over two filesystems (erofs below, this upper) overlayfs numbers directories afresh
    // at every mount; every other object keeps its number. verilay keeps them all.
    let kernel_before = overlay(changes);
    let files =
        |v: Vec<(String, char, u64)>| v.into_iter().filter(|o| o.1 != 'd').collect::<Vec<_>>();
    assert_eq!(
        files(overlay("true")),
        files(kernel_before.clone()),
        "kernel overlayfs keeps them"
    );
    // verilay (the engine the run asks for), the same changes over its own upper.
    let (u, w, m) = (base.join("u"), base.join("w"), base.join("m"));
    for d in [&u, &w, &m] {
        std::fs::create_dir_all(d).unwrap();
    }
    let verilay_mount = |then: &str| {
        let mounted = Unmount::fuse(&m);
        run(verilay()
            .arg("mount")
            .arg("--upper")
            .arg(&u)
            .arg("--work")
            .arg(&w)
            .arg(&image)
            .arg(&m));
        sh(&format!("set -e; cd '{}'; {then}", m.display()));
        let numbers = inode_numbers(&m);
        // The kernel engine is overlayfs, which numbers directories afresh (above).
        let kernel_engine = std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(1) == m.to_str() && l.split(' ').nth(2) == Some("overlay"));
        mounted.now();
        match kernel_engine {
            true => files(numbers),
            false => numbers,
        }
    };
    let before = verilay_mount(changes);
    let paths =
        |v: &[(String, char, u64)]| v.iter().map(|o| (o.0.clone(), o.1)).collect::<Vec<_>>();
    assert_eq!(
        paths(&files(before.clone())),
        paths(&files(kernel_before)),
        "the same tree as overlayfs's"
    );
    let mut distinct: Vec<u64> = before.iter().map(|o| o.2).collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        before.len(),
        "one number, one object: {before:?}"
    );
    for round in 0..2 {
        assert_eq!(verilay_mount("true"), before, "after remount {round}");
    }
}

/// A moved file's record (`ID INO PATH`) whose path leads out of the tree (`..`) keeps no
/// image id: the file gets the upper directory's own number, and nothing outside is read.
#[test]
fn a_record_whose_path_leaves_the_tree_keeps_no_image_id() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let base = t.path();
    let src = base.join("src");
    sh(&format!(
        "set -e; mkdir -p {0}/a; echo foo > {0}/a/foo",
        src.display()
    ));
    let image = base.join("img");
    build(&src, &image, &["--quiet"]);
    let (u, w, m) = (base.join("u"), base.join("w"), base.join("m"));
    for d in [&u, &w, &m] {
        std::fs::create_dir_all(d).unwrap();
    }
    let bar_ino = |then: &str| {
        let mounted = Unmount::fuse(&m);
        run(verilay()
            .args(["mount", "--engine", "fuse", "--upper"])
            .arg(&u)
            .arg("--work")
            .arg(&w)
            .arg(&image)
            .arg(&m));
        sh(&format!("set -e; cd '{}'; {then}", m.display()));
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(m.join("a/bar")).unwrap());
        mounted.now();
        ino
    };
    let kept = bar_ino("mv a/foo a/bar");
    assert_eq!(bar_ino("true"), kept, "the record holds");
    assert!(kept < 1 << 62, "an image id: {kept}");
    let name = "trusted.overlay.verilay.origin";
    let record = run(Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(u.join("a/bar")));
    let record = String::from_utf8(record.stdout).unwrap();
    let (id_ino, path) = record.rsplit_once(' ').unwrap();
    assert_eq!(path, "a/foo", "{record}");
    run(Command::new("setfattr")
        .args(["-n", name, "-v", &format!("{id_ino} a/../a/foo")])
        .arg(u.join("a/bar")));
    let own = bar_ino("true");
    assert!(own >= 1 << 62, "the upper's own number: {own}");
}
