//! What an image claims about its files, and bytes outside its Merkle tree (items 6, 7).
//!
//! An image's file-digest table is written by whoever built the image. A swapped entry,
//! re-sealed, is a validly sealed image whose table lies; `digest_type=verity` must still
//! log each file's true fs-verity digest (here: refuse the open), and `verify` and `fsck`
//! must say which claims are false. Bytes of the table that fail their hash, and bytes
//! between the EROFS part and its tree, must not pass any check.

use crate::common::*;
use crate::Seed;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the parts of a sealed image lie, read from its trailer and footer.
struct Layout {
    /// EROFS bytes (the trailer's data size).
    erofs: u64,
    /// The file-digest table's first entry and its entry count.
    table: u64,
    entries: u64,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn layout(image: &Path) -> Layout {
    let b = fs::read(image).unwrap();
    let t = &b[b.len() - 64..];
    assert_eq!(&t[..8], b"VLVERITY");
    let erofs = u64_at(t, 16);
    let f = &b[erofs as usize - 64..erofs as usize];
    assert_eq!(&f[..8], b"VLFDIGST");
    Layout {
        erofs,
        table: u64_at(f, 16),
        entries: u64_at(f, 24),
    }
}

/// A tree with a benign and a malicious program, and a few other shapes of file.
fn source(base: &Path) -> PathBuf {
    let src = base.join("src");
    fs::create_dir_all(src.join("bin")).unwrap();
    fs::write(src.join("bin/benign"), b"#!/bin/sh\necho benign\n").unwrap();
    fs::write(src.join("bin/evil"), b"#!/bin/sh\necho pwned\n").unwrap();
    fs::write(src.join("big"), vec![7u8; 70_000]).unwrap();
    fs::write(src.join("empty"), b"").unwrap();
    src
}

/// `src` built into `image` with its two programs' table entries exchanged, then sealed
/// again: every block verifies, only the claims lie.
fn swapped_image(base: &Path) -> PathBuf {
    let src = source(base);
    let image = base.join("swapped.img");
    build(&src, &image, &[]);
    let l = layout(&image);
    let mut b = fs::read(&image).unwrap();
    b.truncate(l.erofs as usize);
    let nid_of = |path: &str| -> u64 {
        let out = run(verilay().args(["inspect", "--json"]).arg(&image).arg(path));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["nid"].as_u64().unwrap()
    };
    let (benign, evil) = (nid_of("/bin/benign"), nid_of("/bin/evil"));
    let entry = |b: &[u8], nid: u64| -> usize {
        (0..l.entries as usize)
            .map(|i| l.table as usize + i * 40)
            .find(|&at| u64_at(b, at) == nid)
            .unwrap()
    };
    let (x, y) = (entry(&b, benign), entry(&b, evil));
    let dx: Vec<u8> = b[x + 8..x + 40].to_vec();
    let dy: Vec<u8> = b[y + 8..y + 40].to_vec();
    b[x + 8..x + 40].copy_from_slice(&dy);
    b[y + 8..y + 40].copy_from_slice(&dx);
    fs::write(&image, &b).unwrap();
    run(verilay().args(["seal", "--quiet"]).arg(&image));
    image
}

fn fsverity_digest(file: &Path) -> String {
    let out = run(Command::new("fsverity").arg("digest").arg(file));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn verify_and_fsck_name_every_false_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let image = swapped_image(tmp.path());
    let v = verilay().arg("verify").arg(&image).output().unwrap();
    assert_eq!(v.status.code(), Some(1), "verify: {}", stderr(&v));
    for f in ["/bin/benign", "/bin/evil"] {
        assert!(
            stderr(&v).contains(&format!("{f}: ")),
            "verify names {f}: {}",
            stderr(&v)
        );
    }
    let f = verilay().arg("fsck").arg(&image).output().unwrap();
    let out = String::from_utf8_lossy(&f.stdout);
    assert_eq!(f.status.code(), Some(1), "fsck: {out}");
    assert!(out.contains("/bin/evil") && out.contains("claims"), "{out}");
    let i = verilay()
        .args(["inspect"])
        .arg(&image)
        .arg("/bin/evil")
        .output()
        .unwrap();
    assert!(
        !i.status.success(),
        "inspect shows a false claim as the file's digest"
    );
}

/// The measured mount never logs the table's claim for a file whose contents differ:
/// opening either program fails (EIO, a log line), while the other files still measure
/// with the digest `fsverity digest` gives them.
#[test]
fn a_measured_open_never_logs_a_false_claim() {
    if skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(have("fsverity"), "needs fsverity")
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let image = swapped_image(tmp.path());
    let policy = tmp.path().join("policy");
    fs::write(
        &policy,
        "measure func=FILE_CHECK digest_type=verity template=ima-ngv2\n",
    )
    .unwrap();
    let (mnt, list, log) = (
        tmp.path().join("mnt"),
        tmp.path().join("list"),
        tmp.path().join("integrity.log"),
    );
    fs::create_dir_all(&mnt).unwrap();
    run(verilay()
        .arg("mount")
        .arg(&image)
        .arg(&mnt)
        .arg("--policy")
        .arg(&policy)
        .arg("--measure-log")
        .arg(&list)
        .arg("--log")
        .arg(&log));
    let _u = Unmount::fuse(&mnt);
    for f in ["bin/evil", "bin/benign"] {
        let e = fs::read(mnt.join(f)).expect_err("a file whose claim is false opens");
        assert_eq!(
            e.raw_os_error(),
            Some(rustix::io::Errno::IO.raw_os_error()),
            "{f}: {e}"
        );
    }
    assert_eq!(fs::read(mnt.join("big")).unwrap().len(), 70_000);
    // `stats` writes out what the mount has measured before it answers.
    run(verilay().arg("stats").arg(&mnt));
    let ascii = fs::read_to_string(list.join("ascii_runtime_measurements")).unwrap();
    assert!(!ascii.contains("/bin/"), "a program was logged: {ascii}");
    let big = fsverity_digest(&tmp.path().join("src/big"));
    assert!(
        ascii.contains(&format!("verity:{big} {}/big", mnt.display())),
        "{ascii}"
    );
    let logged = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("bin/evil") && logged.contains("claims"),
        "no log line names the false claim: {logged:?}"
    );
}

/// Each file's digest is computed from its contents, whatever produced the image: sparse,
/// tail-packed, block-sized, empty and big files, 512-byte and 4 KiB blocks, and an image
/// made by mkfs.erofs (no table: nothing claimed) sealed by `verilay seal`; `fsverity
/// digest` of the source file is the oracle.
#[test]
fn content_digests_equal_fsverity_digest() {
    if skip_unless(have("fsverity"), "needs fsverity") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let files: &[(&str, u64)] = &[
        ("empty", 0),
        ("one", 1),
        ("block", 4096),
        ("block-and-a-bit", 4097),
        ("tail", 10_000),
        ("many", 1_000_000),
    ];
    for (name, size) in files {
        let data: Vec<u8> = (0..*size).map(|i| (i * 31 % 251) as u8).collect();
        fs::write(src.join(name), data).unwrap();
    }
    // Holes at the start, the middle and the end, and 64 MiB of nothing.
    sh(&format!(
        "cd {0} && truncate -s 1M sparse && printf data | dd of=sparse bs=1 seek=700000 conv=notrunc status=none \
         && printf x | dd of=sparse bs=1 seek=9000 conv=notrunc status=none && truncate -s 64M hole",
        src.display()
    ));
    let mut images = Vec::new();
    for bs in ["4096", "512"] {
        let image = tmp.path().join(format!("v{bs}.img"));
        build(&src, &image, &["--block-size", bs]);
        images.push(image);
    }
    if have("mkfs.erofs") {
        let image = tmp.path().join("mkfs.img");
        run(Command::new("mkfs.erofs")
            .arg("--quiet")
            .arg(&image)
            .arg(&src));
        run(verilay().args(["seal", "--quiet"]).arg(&image));
        images.push(image);
    }
    let mut names: Vec<&str> = files.iter().map(|f| f.0).collect();
    names.extend(["sparse", "hole"]);
    for image in &images {
        for name in &names {
            let out = run(verilay()
                .args(["inspect", "--json"])
                .arg(image)
                .arg(format!("/{name}")));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(
                v["fsverity_digest"].as_str().unwrap(),
                fsverity_digest(&src.join(name)),
                "{name} in {}",
                image.display()
            );
        }
    }
}

/// Single-byte changes anywhere in the table region of a pinned image (entries, the
/// padding after them, the footer) fail `fsck --digest` and `verify`, and a mount fails
/// with the integrity error instead of quietly ignoring the table.
#[test]
fn every_byte_of_the_table_is_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    // Enough files for a table of several blocks, most of them away from the footer.
    fs::create_dir_all(src.join("many")).unwrap();
    for i in 0..300 {
        fs::write(src.join(format!("many/{i}")), format!("file {i}")).unwrap();
    }
    let image = tmp.path().join("a.img");
    let digest = String::from_utf8(build(&src, &image, &[]).stdout).unwrap();
    let digest = digest.trim();
    let l = layout(&image);
    let clean = fs::read(&image).unwrap();
    let entries_end = l.table + l.entries * 40;
    let mut offsets: Vec<u64> = (0..l.entries * 40)
        .step_by(13)
        .map(|o| l.table + o)
        .collect();
    offsets.extend([
        entries_end,
        entries_end + 100,
        l.erofs - 100,
        l.erofs - 64,
        l.erofs - 20,
        l.erofs - 1,
    ]);
    for at in offsets {
        let mut b = clean.clone();
        b[at as usize] ^= 0x40;
        fs::write(&image, &b).unwrap();
        let f = verilay()
            .args(["fsck", "--digest", digest])
            .arg(&image)
            .output()
            .unwrap();
        assert_eq!(
            f.status.code(),
            Some(1),
            "fsck passes a flip at byte {at}: {}",
            String::from_utf8_lossy(&f.stdout)
        );
        let v = verilay()
            .args(["verify", "--quiet", "--digest", digest])
            .arg(&image)
            .output()
            .unwrap();
        assert!(!v.status.success(), "verify passes a flip at byte {at}");
    }
    if skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    // The footer is read at mount: a bad block there is the mount's error.
    let mut b = clean.clone();
    b[(l.erofs - 20) as usize] ^= 1;
    fs::write(&image, &b).unwrap();
    let mnt = tmp.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let m = verilay()
        .args(["mount", "--digest", digest])
        .arg(&image)
        .arg(&mnt)
        .output()
        .unwrap();
    let _u = Unmount::fuse(&mnt);
    assert!(!m.status.success(), "a mount ignores a bad table block");
    assert!(stderr(&m).contains("fails its hash"), "{}", stderr(&m));
}

/// With blocks under 4 KiB the EROFS part may end inside a 4 KiB block; the zeros that
/// pad it up to the tree are in no hashed block, so they are checked for being zeros.
#[test]
fn the_padding_before_the_tree_is_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let image = tmp.path().join("a.img");
    build(&src, &image, &["--block-size", "512"]);
    let l = layout(&image);
    assert_ne!(
        l.erofs % 4096,
        0,
        "the test needs an EROFS part that ends mid-block"
    );
    let mut b = fs::read(&image).unwrap();
    b[l.erofs as usize + 5] = 0xff;
    fs::write(&image, &b).unwrap();
    let v = verilay().args(["verify"]).arg(&image).output().unwrap();
    assert!(!v.status.success(), "verify passes a changed padding byte");
    assert!(
        stderr(&v).contains(&format!("byte {}", l.erofs + 5)),
        "{}",
        stderr(&v)
    );
}

/// The footer's record of which xattr namespaces occur is what the mount trusts to leave
/// ACLs off and answer `security.*` without looking: an image whose record hides the ACL
/// it holds (re-sealed) fails `verify` and `fsck`.
#[test]
fn verify_checks_the_namespace_record() {
    if skip_unless(have("setfacl"), "needs setfacl (acl)") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    sh(&format!(
        "setfacl -m u:4242:--- {}",
        src.join("big").display()
    ));
    let image = tmp.path().join("a.img");
    build(&src, &image, &[]);
    let l = layout(&image);
    let mut b = fs::read(&image).unwrap();
    b.truncate(l.erofs as usize);
    let word = l.erofs as usize - 64 + 32;
    let ns = u32::from_le_bytes(b[word..word + 4].try_into().unwrap());
    assert_ne!(ns & 0b1100, 0, "the image records its ACL");
    b[word..word + 4].copy_from_slice(&(ns & !0b1100).to_le_bytes());
    fs::write(&image, &b).unwrap();
    run(verilay().args(["seal", "--quiet"]).arg(&image));
    let v = verilay().arg("verify").arg(&image).output().unwrap();
    assert_eq!(v.status.code(), Some(1), "verify: {}", stderr(&v));
    assert!(stderr(&v).contains("namespaces"), "{}", stderr(&v));
    let f = verilay().arg("fsck").arg(&image).output().unwrap();
    assert_eq!(f.status.code(), Some(1));
}

/// Holes cost the claims check nothing per block: a terabyte of them (and a sparse file
/// of 8 GiB with data at both ends) verifies and passes fsck, instead of being taken for files
/// that claim more data than the image holds.
#[test]
fn a_terabyte_of_holes_is_checked_in_no_time() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    sh(&format!(
        "cd {} && truncate -s 1T hole && printf a > ends && truncate -s 8G ends && printf z >> ends",
        src.display()
    ));
    let image = tmp.path().join("a.img");
    build(&src, &image, &[]);
    let start = std::time::Instant::now();
    run(verilay().args(["verify", "--quiet"]).arg(&image));
    run(verilay().args(["fsck", "--quiet"]).arg(&image));
    assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
}

/// The swapped-claims image and a padded 512-byte-block image, raw and sealed.
pub fn seeds(tmp: &Path) -> Vec<Seed> {
    let base = tmp.join("claims");
    fs::create_dir_all(&base).unwrap();
    let swapped = swapped_image(&base);
    let sealed = fs::read(&swapped).unwrap();
    let raw = sealed[..layout(&swapped).erofs as usize].to_vec();
    let small = base.join("small.img");
    build(&source(&base.join("s")), &small, &["--block-size", "512"]);
    vec![
        Seed {
            target: "read_image",
            name: "swapped-claims".into(),
            bytes: raw,
        },
        Seed {
            target: "verified_source",
            name: "swapped-claims".into(),
            bytes: sealed,
        },
        Seed {
            target: "verified_source",
            name: "padded-512".into(),
            bytes: fs::read(&small).unwrap(),
        },
    ]
}
