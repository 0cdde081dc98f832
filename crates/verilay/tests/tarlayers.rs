//! `verilay build LAYER.tar[.gz|.zst]`: a tarball gives the same image tree as its
//! directory (GNU tar as the writer, the kernel's erofs mount as the reader), container
//! layers with whiteouts stack as their authors meant (verilay's stacked mount against
//! kernel overlayfs), and hostile tarballs get one clear line.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

fn prerequisites() -> bool {
    skip_unless(is_root(), "needs root (kernel mounts, mknod, chown)")
        || skip_unless(have("zstd"), "zstd missing")
}

#[test]
fn a_layer_tarball_builds_the_same_tree_as_its_directory() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let src = generated_src(t.path());
    // tar cannot carry sockets.
    std::fs::remove_file(src.join("sock")).unwrap();
    let tar = t.path().join("layer.tar");
    run(Command::new("tar")
        .args(["--format=posix", "--xattrs", "--xattrs-include=*", "--acls"])
        .arg("-C")
        .arg(&src)
        .arg("-cf")
        .arg(&tar)
        .arg("."));
    sh(&format!(
        "cd {0} && gzip -k layer.tar && zstd -q layer.tar -o layer.tar.zst",
        t.path().display()
    ));
    let dir_image = t.path().join("dir.img");
    build(&src, &dir_image, &["--quiet"]);
    let reference = Mount::erofs(&dir_image, &t.path().join("ref"));
    for name in ["layer.tar", "layer.tar.gz", "layer.tar.zst"] {
        let image = t.path().join(format!("{name}.img"));
        build(&t.path().join(name), &image, &["--quiet"]);
        run(verilay().arg("fsck").arg(&image).arg("--quiet"));
        let m = Mount::erofs(&image, &t.path().join(format!("m-{name}")));
        assert_diff_clean(&reference.dir, &m.dir);
        assert_same_stats(&reference.dir, &m.dir);
        assert_eq!(ls_lr(&reference.dir), ls_lr(&m.dir), "{name}: ls -lR");
        assert_eq!(
            xattr_dump(&reference.dir),
            xattr_dump(&m.dir),
            "{name}: getfattr"
        );
        assert_eq!(
            acl_dump(&reference.dir),
            acl_dump(&m.dir),
            "{name}: getfacl"
        );
    }
}

/// Writes a tar with Python's tarfile: `(path, kind, data)`, kind one of `f` (file), `d`
/// (directory), `l` (symlink to data), `h` (hardlink to data).
fn write_tar(path: &Path, entries: &[(&str, char, &str)]) {
    let mut script = String::from(
        "import io, sys, tarfile\nt = tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT)\n",
    );
    for (name, kind, data) in entries {
        script += &format!(
            "i = tarfile.TarInfo({name:?}); i.mtime = 1700000000; i.mode = 0o755 if {kind:?} == 'd' else 0o644\n\
             if {kind:?} == 'f':\n    b = {data:?}.encode(); i.size = len(b); t.addfile(i, io.BytesIO(b))\n\
             else:\n    i.type = {{'d': tarfile.DIRTYPE, 'l': tarfile.SYMTYPE, 'h': tarfile.LNKTYPE}}[{kind:?}]\n    i.linkname = {data:?}; t.addfile(i)\n"
        );
    }
    script += "t.close()\n";
    run(Command::new("python3").arg("-c").arg(script).arg(path));
}

#[test]
fn container_layers_stack_with_their_whiteouts() {
    if prerequisites() || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base.tar");
    write_tar(
        &base,
        &[
            ("etc", 'd', ""),
            ("etc/passwd", 'f', "root:x:0:0\n"),
            ("etc/hosts", 'f', "127.0.0.1 localhost\n"),
            ("etc/old.d", 'd', ""),
            ("etc/old.d/a.conf", 'f', "a\n"),
            ("etc/old.d/b.conf", 'f', "b\n"),
            ("usr/bin/tool", 'f', "v1\n"),
            ("usr/bin/alias", 'l', "tool"),
            ("usr/lib/keep", 'f', "keep\n"),
            ("var/cache/x", 'f', "cached\n"),
            ("var/data", 'f', "a file that becomes a directory\n"),
        ],
    );
    let top = t.path().join("top.tar");
    write_tar(
        &top,
        &[
            ("etc/.wh.hosts", 'f', ""),
            ("etc/old.d/.wh..wh..opq", 'f', ""),
            ("etc/old.d/c.conf", 'f', "c\n"),
            ("usr/bin/tool", 'f', "v2\n"),
            ("usr/bin/tool2", 'h', "usr/bin/tool"),
            ("var/.wh.cache", 'f', ""),
            ("var/data", 'd', ""),
            ("var/data/inside", 'f', "now a directory\n"),
        ],
    );
    sh(&format!(
        "cd {} && gzip base.tar && zstd -q --rm top.tar",
        t.path().display()
    ));
    let mut images = Vec::new();
    let mut kernel = Vec::new();
    for (i, name) in ["top.tar.zst", "base.tar.gz"].iter().enumerate() {
        let image = t.path().join(format!("{name}.img"));
        build(&t.path().join(name), &image, &["--quiet"]);
        kernel.push(Mount::erofs(&image, &t.path().join(format!("k{i}"))));
        images.push(image);
    }
    let fuse = t.path().join("fuse");
    std::fs::create_dir_all(&fuse).unwrap();
    run(verilay().arg("mount").args(&images).arg(&fuse));
    let _f = Unmount::fuse(&fuse);
    let read = |p: &str| std::fs::read_to_string(fuse.join(p)).unwrap();
    assert_eq!(read("etc/passwd"), "root:x:0:0\n");
    assert!(!fuse.join("etc/hosts").exists());
    assert!(!fuse.join("var/cache").exists());
    assert_eq!(read("usr/bin/tool"), "v2\n");
    assert_eq!(read("usr/bin/tool2"), "v2\n");
    assert_eq!(read("usr/bin/alias"), "v2\n");
    assert_eq!(read("usr/lib/keep"), "keep\n");
    assert_eq!(read("var/data/inside"), "now a directory\n");
    let mut names: Vec<String> = std::fs::read_dir(fuse.join("etc/old.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["c.conf"]);

    // The kernel's overlayfs over the kernel's erofs mounts agrees on everything.
    let ovl = t.path().join("overlay");
    let _o = overlay_ro(&[&kernel[0].dir, &kernel[1].dir], &ovl);
    assert_diff_clean(&ovl, &fuse);
    assert_same_stats(&ovl, &fuse);
    assert_eq!(ls_lr(&ovl), ls_lr(&fuse));
}

#[test]
fn hostile_tarballs_get_one_clear_line() {
    if skip_unless(have("python3"), "python3 missing") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    type Entries<'a> = &'a [(&'a str, char, &'a str)];
    let cases: [(&str, Entries, &str); 3] = [
        (
            "escape.tar",
            &[("../outside", 'f', "x")],
            "entry at byte 0: path climbs out with \"..\"",
        ),
        (
            "dangling.tar",
            &[("a", 'f', "x"), ("b", 'h', "missing")],
            "hardlink to \"missing\", which is not an earlier file",
        ),
        (
            "dirlink.tar",
            &[("d", 'd', ""), ("b", 'h', "d")],
            "hardlink to \"d\", which is not an earlier file",
        ),
    ];
    for (name, entries, expect) in cases {
        let tar = t.path().join(name);
        write_tar(&tar, entries);
        let out = build_output(&tar, &t.path().join("out.img"), &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(expect), "{name}: {err}");
        assert!(err.contains(name), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(!t.path().join("out.img").exists());
    }
    // A truncated, compressed layer.
    sh(&format!(
        "cd {} && head -c 100000 /dev/urandom > f && tar -cf big.tar f && gzip big.tar && \
         head -c 30000 big.tar.gz > cut.tar.gz",
        t.path().display()
    ));
    let out = build_output(&t.path().join("cut.tar.gz"), &t.path().join("out.img"), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cut.tar.gz"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
