//! Opening images from files: the pin, plain images, and what a path resolves to.

use erofs::builder::{build_dir, BuildOptions, Silent};
use opening::{open, open_verified, parse_digest, resolve, Pin, ReadOpts};
use std::path::{Path, PathBuf};

/// A tree with one file, built into an image (`verity`: sealed), and its digest.
fn image(dir: &Path, verity: bool) -> (PathBuf, String) {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), b"hello\n").unwrap();
    let out = dir.join(if verity { "sealed.img" } else { "plain.img" });
    let opts = BuildOptions {
        verity,
        ..BuildOptions::default()
    };
    let summary = build_dir(&src, &|_| false, &opts, &out, &Silent).unwrap();
    let digest = summary.digest.map(|d| format!("sha256:{}", hex::encode(d)));
    (out, digest.unwrap_or_default())
}

fn pinned(digest: &str) -> Pin {
    Pin {
        digest: Some(digest.into()),
        ..Pin::default()
    }
}

fn read_all(img: &opening::Img, path: &str) -> Vec<u8> {
    let inode = resolve(img, path).unwrap();
    let mut buf = vec![0; inode.size as usize];
    let n = img.read(&inode, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn a_sealed_image_opens_verified_pinned_or_not() {
    let t = tempfile::tempdir().unwrap();
    let (path, digest) = image(t.path(), true);
    let free = open(&path, &Pin::default(), false, &ReadOpts::default()).unwrap();
    assert_eq!(free.trust(), format!("{digest} (not pinned)"));
    let held = open(&path, &pinned(&digest), false, &ReadOpts::default()).unwrap();
    assert_eq!(held.trust(), format!("{digest} (pinned)"));
    assert!(held.remote.is_none());
    assert_eq!(read_all(&held.img, "/d/f"), b"hello\n");
    assert!(open_verified(&path, &pinned(&digest)).unwrap().is_pinned());
}

#[test]
fn a_wrong_pin_is_refused_naming_the_image() {
    let t = tempfile::tempdir().unwrap();
    let (path, digest) = image(t.path(), true);
    let last = digest.chars().last().unwrap();
    let wrong = format!(
        "{}{}",
        &digest[..digest.len() - 1],
        if last == '0' { '1' } else { '0' }
    );
    for e in [
        open(&path, &pinned(&wrong), false, &ReadOpts::default()).err(),
        open_verified(&path, &pinned(&wrong)).err(),
    ] {
        let e = format!("{:#}", e.expect("a wrong pin opens nothing"));
        assert!(e.contains(&path.display().to_string()), "{e}");
    }
}

#[test]
fn a_plain_image_opens_only_where_allowed_and_never_pinned() {
    let t = tempfile::tempdir().unwrap();
    let (path, _) = image(t.path(), false);
    let e = open(&path, &Pin::default(), false, &ReadOpts::default())
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("no verity section"), "{e:#}");
    let plain = open(&path, &Pin::default(), true, &ReadOpts::default()).unwrap();
    assert!(plain.verified.is_none());
    assert!(plain.trust().starts_with("none"), "{}", plain.trust());
    assert_eq!(read_all(&plain.img, "d/f"), b"hello\n");
    let any = format!("sha256:{}", "ab".repeat(32));
    assert!(open(&path, &pinned(&any), true, &ReadOpts::default()).is_err());
}

#[test]
fn digests_parse_strictly() {
    assert_eq!(parse_digest(&"ab".repeat(32)).unwrap(), vec![0xab; 32]);
    assert_eq!(
        parse_digest(&format!("sha512:{}", "CD".repeat(64))).unwrap(),
        vec![0xcd; 64]
    );
    for bad in [
        "md5:00".to_string(),
        format!("sha256:{}", "ab".repeat(31)),
        format!("sha256:{}", "+a".repeat(32)),
        format!("sha256:{}", "é".repeat(32)),
    ] {
        assert!(parse_digest(&bad).is_err(), "{bad}");
    }
}

#[test]
fn paths_resolve_without_following_links_and_say_what_is_missing() {
    let t = tempfile::tempdir().unwrap();
    let (path, _) = image(t.path(), true);
    let img = open(&path, &Pin::default(), false, &ReadOpts::default())
        .unwrap()
        .img;
    assert!(resolve(&img, "/").unwrap().is_dir());
    assert!(resolve(&img, "./d/./f").unwrap().is_reg());
    let e = resolve(&img, "d/nothing").unwrap_err().to_string();
    assert!(e.contains("no such file"), "{e}");
    let e = resolve(&img, "d/f/g").unwrap_err().to_string();
    assert!(e.contains("not a directory"), "{e}");
}

#[test]
fn remote_operands_are_told_from_files() {
    assert!(opening::is_remote(Path::new(
        "oci://localhost:5000/a@sha256:00"
    )));
    assert!(opening::is_remote(Path::new("https://example.com/i.img")));
    assert!(!opening::is_remote(Path::new("oci.img")));
}
