//! Hostile layer tarballs through `verilay build` and mounts: one line naming the tar and
//! its offset, no image left, bounded memory, and the numbers and whiteouts that pass
//! arrive (items 2, 8, 11). The tarballs themselves are tarlayer's test cases
//! (`crates/tarlayer/tests/cases`), whose own tests read them in-process.

#[path = "../../../tarlayer/tests/cases/mod.rs"]
mod cases;

use crate::common::*;
use crate::Seed;
use cases::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `verilay build` of `bytes` must fail with exit code 1 and one line naming the tar and
/// holding `expect`, leaving no image.
fn build_fails(name: &str, bytes: &[u8], expect: &str) {
    let t = tempfile::tempdir().unwrap();
    let tar = t.path().join(name);
    std::fs::write(&tar, bytes).unwrap();
    let img = t.path().join("out.img");
    let out = build_output(&tar, &img, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{name}: {err}");
    assert!(
        err.contains(expect),
        "{name}: expected {expect:?} in: {err}"
    );
    assert!(err.contains(name), "{name}: {err}");
    assert_eq!(err.lines().count(), 1, "{name}: {err}");
    assert!(!img.exists(), "{name}: an image was left");
}

#[test]
fn each_hostile_tarball_gets_one_line_naming_its_offset() {
    for (name, bytes, expect) in all_cases() {
        build_fails(name, &bytes, expect);
    }
}

/// Hostile inputs of this module for the fuzz targets.
pub fn seeds(_tmp: &Path) -> Vec<Seed> {
    let mut v: Vec<Seed> = all_cases()
        .into_iter()
        .map(|(name, bytes, _)| Seed {
            target: "tar_layer",
            name: name.into(),
            bytes,
        })
        .collect();
    v.extend(
        headers_all_readers_agree_on()
            .into_iter()
            .map(|(name, bytes)| Seed {
                target: "tar_layer",
                name: name.into(),
                bytes,
            }),
    );
    v.push(Seed {
        target: "tar_layer",
        name: "two-hundred-files.tar".into(),
        bytes: two_hundred_files().0,
    });
    v.push(Seed {
        target: "tar_layer",
        name: "numbers.tar".into(),
        bytes: numbers_tar(b"id-placeholder"),
    });
    v.push(Seed {
        target: "tar_layer",
        name: "whiteouts.tar".into(),
        bytes: whiteouts_top(),
    });
    v
}

#[test]
fn pax_ids_own_a_setuid_file_and_every_number_arrives() {
    if skip_unless(is_root(), "needs root (kernel erofs mount)") || lacks_test_user() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let tar = t.path().join("numbers.tar");
    std::fs::write(&tar, numbers_tar(&std::fs::read("/usr/bin/id").unwrap())).unwrap();
    let image = t.path().join("numbers.img");
    build(&tar, &image, &["--quiet"]);
    let m = Mount::erofs(&image, &t.path().join("m"));
    let meta = |p: &str| std::fs::symlink_metadata(m.dir.join(p)).unwrap();

    let id = meta("bin/id");
    assert_eq!((id.uid(), id.gid()), (3_000_000, 3_000_001));
    assert_eq!(id.mode(), 0o104755);
    assert_eq!((id.mtime(), id.mtime_nsec()), (1_700_000_000, 123_456_789));
    // An independent look for setuid-root files finds none, and finds the setuid one.
    let find = |args: &str| {
        String::from_utf8(sh(&format!("find {} -perm -4000 {args}", m.dir.display())).stdout)
            .unwrap()
    };
    assert_eq!(find("-user root"), "");
    assert_eq!(
        find("-user 3000000").trim(),
        m.dir.join("bin/id").to_str().unwrap()
    );
    // Run by an ordinary user, it runs as its owner, not as root.
    let out = as_test_user(t.path(), "m/bin/id -u; m/bin/id -ru");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "3000000\n1001\n");

    let big = meta("big-ids");
    assert_eq!((big.uid(), big.gid()), (2_147_483_653, 4_294_967_294));
    assert_eq!(meta("negative-mtime").mtime(), -86400);
    let half = meta("half-second-before-epoch");
    assert_eq!((half.mtime(), half.mtime_nsec()), (-1, 500_000_000));
    assert_eq!(
        std::fs::read(m.dir.join("sized")).unwrap(),
        vec![b'z'; 5000]
    );
    assert_eq!(meta("hard").ino(), meta("sized").ino());
    let long = format!("{}/sized", "d".repeat(200));
    assert_eq!(std::fs::read(m.dir.join(&long)).unwrap(), b"long");
    assert_eq!(
        std::fs::read_link(m.dir.join("long-link"))
            .unwrap()
            .to_str()
            .unwrap(),
        long
    );
    assert_eq!(meta("typed-mode").mode(), 0o100640);
    assert!(m.dir.join("after-global").exists());
    assert!(!m.dir.join("placeholder").exists());
}

/// A layer cut between two entries (the report: it built an image of the first 115
/// files) builds no image.
#[test]
fn a_layer_cut_between_entries_builds_no_image() {
    let (full, _, before_116) = two_hundred_files();
    build_fails(
        "cut-between-entries.tar",
        &full[..before_116],
        "the archive ends without its end-of-archive marker",
    );
}

/// A hostile header fails at once, without the memory its size field asks for.
#[test]
fn huge_headers_fail_fast_in_little_memory() {
    let t = tempfile::tempdir().unwrap();
    let mut cases = unbounded();
    cases.push(("control.tar", Tar::default().file("f", b"x").end(), ""));
    for (name, bytes, expect) in cases {
        let tar = t.path().join(name);
        std::fs::write(&tar, bytes).unwrap();
        let start = Instant::now();
        // 256 MiB of address space: the header asks for an exbibyte.
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#"ulimit -v 262144 && exec "$0" build "$1" -o "$2" --quiet"#)
            .arg(env!("CARGO_BIN_EXE_verilay"))
            .arg(&tar)
            .arg(t.path().join("out.img"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{name} took {:?}",
            start.elapsed()
        );
        if expect.is_empty() {
            assert!(out.status.success(), "{name}: {err}");
        } else {
            assert_eq!(out.status.code(), Some(1), "{name}: {err}");
            assert!(err.contains(expect), "{name}: {err}");
        }
    }
}

#[test]
fn whiteouts_stack_as_overlayfs_reads_them() {
    if skip_unless(is_root(), "needs root (kernel mounts)")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
    {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let base = Tar::default()
        .file("d/old", b"old")
        .file("e/lower", b"lower")
        .file("f", b"base f")
        .file("g/bottom", b"bottom")
        .file("only-below", b"below")
        .end();
    let mut images = Vec::new();
    let mut kernel = Vec::new();
    for (i, (name, bytes)) in [("top.tar", whiteouts_top()), ("base.tar", base)]
        .into_iter()
        .enumerate()
    {
        let tar = t.path().join(name);
        std::fs::write(&tar, bytes).unwrap();
        let image = t.path().join(format!("{name}.img"));
        build(&tar, &image, &["--quiet"]);
        kernel.push(Mount::erofs(&image, &t.path().join(format!("k{i}"))));
        images.push(image);
    }
    let ovl = t.path().join("overlay");
    let _o = overlay_ro(&[&kernel[0].dir, &kernel[1].dir], &ovl);
    let fuse = t.path().join("fuse");
    std::fs::create_dir_all(&fuse).unwrap();
    run(verilay().arg("mount").args(&images).arg(&fuse));
    let _f = Unmount::fuse(&fuse);
    for root in [&ovl, &fuse] {
        let ls = |d: &str| {
            let mut v: Vec<String> = std::fs::read_dir(root.join(d))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(ls("d"), ["new"], "{}", root.display());
        assert_eq!(ls("e"), ["mine"], "{}", root.display());
        assert_eq!(ls("g"), ["top"], "{}", root.display());
        assert_eq!(std::fs::read(root.join("f")).unwrap(), b"top f");
        assert_eq!(std::fs::read(root.join("only-below")).unwrap(), b"below");
    }
    assert_diff_clean(&ovl, &fuse);
}
