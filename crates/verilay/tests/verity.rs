//! Sealed images against independent oracles: the image digest is `fsverity digest` of the
//! EROFS bytes, each stored file digest is `fsverity digest` of the source file, the kernel
//! still mounts the image, and a flipped byte anywhere is caught, named and never served.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn inspect(image: &Path, path: Option<&str>) -> Value {
    let mut cmd = verilay();
    cmd.arg("inspect").arg(image).arg("--json");
    if let Some(p) = path {
        cmd.arg("--").arg(p);
    }
    serde_json::from_slice(&run(&mut cmd).stdout).unwrap()
}

fn fsverity_digest(path: &Path) -> String {
    let out = run(std::process::Command::new("fsverity")
        .arg("digest")
        .arg("--compact")
        .arg(path));
    format!("sha256:{}", String::from_utf8(out.stdout).unwrap().trim())
}

/// Every regular file under `root`, as paths relative to it.
fn regular_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
                // Skip non-UTF-8 names: the CLI takes the path as a string.
                if let Some(s) = rel.to_str() {
                    out.push(s.to_string());
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn digests_equal_fsverity_and_the_kernel_still_mounts() {
    let Some(t) = root_and_tool_tempdir(
        "needs root (mknod, chown, mount)",
        "fsverity",
        "fsverity (fsverity-utils) missing",
    ) else {
        return;
    };
    let src = generated_src(t.path());
    let files = regular_files(&src);
    assert!(files.len() > 700, "the generated tree has its files");
    // 4096 reuses block hashes for file digests; 1024 and 512 put data at offsets that are
    // not 4 KiB aligned, so every file block is hashed on its own; 16384 has blocks larger
    // than the tree's.
    for bs in ["4096", "1024", "512", "16384"] {
        let image = t.path().join(format!("img{bs}"));
        let out = build(&src, &image, &["-b", bs, "--quiet"]);
        let printed = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert!(
            printed.starts_with("sha256:"),
            "build prints the digest: {printed:?}"
        );

        let sb = inspect(&image, None);
        let erofs_bytes = sb["erofs_bytes"].as_u64().unwrap();
        let total = std::fs::metadata(&image).unwrap().len();
        assert!(
            erofs_bytes < total,
            "the verity section follows the EROFS bytes"
        );
        assert_eq!(
            sb["digest"].as_str().unwrap(),
            format!("{printed} (not pinned)")
        );
        let raw = t.path().join("erofs.raw");
        let bytes = std::fs::read(&image).unwrap();
        std::fs::write(&raw, &bytes[..erofs_bytes as usize]).unwrap();
        assert_eq!(
            fsverity_digest(&raw),
            printed,
            "image digest at block size {bs}"
        );

        // Every regular file's stored digest is what fsverity computes from the source.
        let mut ours = Vec::new();
        for f in &files {
            let v = inspect(&image, Some(f));
            ours.push(v["fsverity_digest"].as_str().unwrap().to_string());
        }
        let mut cmd = std::process::Command::new("fsverity");
        cmd.arg("digest").arg("--compact").arg("--");
        for f in &files {
            cmd.arg(src.join(f));
        }
        let theirs: Vec<String> = String::from_utf8(run(&mut cmd).stdout)
            .unwrap()
            .lines()
            .map(|l| format!("sha256:{l}"))
            .collect();
        for ((f, a), b) in files.iter().zip(&ours).zip(&theirs) {
            assert_eq!(a, b, "{f} at block size {bs}");
        }
        assert_eq!(ours.len(), theirs.len());

        run(verilay()
            .arg("verify")
            .arg(&image)
            .arg("--digest")
            .arg(&printed)
            .arg("--quiet"));
        if bs != "16384" {
            // Page-sized blocks or smaller: the kernel mounts the sealed image as it is.
            let m = Mount::erofs(&image, &t.path().join("mnt"));
            assert_diff_clean(&src, &m.dir);
        }
    }
}

/// A built image of the generated tree, with what the tamper cases need to find.
struct Sealed {
    _t: tempfile::TempDir,
    src: PathBuf,
    image: PathBuf,
    digest: String,
    bytes: Vec<u8>,
}

fn sealed() -> Sealed {
    let t = tempfile::tempdir().unwrap();
    let src = generated_src(t.path());
    let image = t.path().join("img");
    let out = build(&src, &image, &["--quiet"]);
    let digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let bytes = std::fs::read(&image).unwrap();
    Sealed {
        src,
        image,
        digest,
        bytes,
        _t: t,
    }
}

impl Sealed {
    /// A copy of the image with byte `at` flipped.
    fn flipped(&self, at: u64, name: &str) -> PathBuf {
        let mut b = self.bytes.clone();
        b[at as usize] ^= 0x5a;
        let p = self.image.with_file_name(name);
        std::fs::write(&p, b).unwrap();
        p
    }

    fn trailer_u64(&self, field: usize) -> u64 {
        let t = &self.bytes[self.bytes.len() - 64..];
        assert_eq!(&t[..8], b"VLVERITY");
        u64::from_le_bytes(t[field..field + 8].try_into().unwrap())
    }
}

fn fails_with(out: &Output, needle: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "expected failure, got success: {err}"
    );
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

fn verify_json(image: &Path) -> Value {
    let out = verilay()
        .arg("verify")
        .arg(image)
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "verify fails on a flipped byte");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn holds(v: &Value, phrase: &str) -> bool {
    v["holds"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h.as_str() == Some(phrase))
}

#[test]
fn flipped_bytes_are_caught_named_and_never_served() {
    if skip_unless(is_root(), "needs root (mknod, chown in the generated tree)") {
        return;
    }
    let s = sealed();
    run(verilay().arg("verify").arg(&s.image).arg("--quiet"));
    let cat = |img: &Path, path: &str| verilay().arg("cat").arg(img).arg(path).output().unwrap();
    let info = |path: &str| inspect(&s.image, Some(path));
    let block_of = |off: u64| off / 4096 * 4096;

    // Superblock: nothing opens, verify names the superblock's block.
    let img = s.flipped(1024 + 0x10, "sb");
    fails_with(&cat(&img, "hello.txt"), "integrity error");
    let v = verify_json(&img);
    assert_eq!(v["offset"], 0);
    assert!(holds(&v, "the superblock"), "{v}");

    // An inode: reading its file fails; verify names it among its block's contents.
    let ino = info("sizes/f100000")["inode"]["offset"].as_u64().unwrap();
    let img = s.flipped(ino + 2, "inode");
    fails_with(&cat(&img, "sizes/f100000"), "integrity error");
    let v = verify_json(&img);
    assert_eq!(v["offset"], block_of(ino));
    assert!(holds(&v, "the inode of /sizes/f100000"), "{v}");

    // A directory block of a directory too big to inline.
    let many = info("many");
    let start = many["layout"]["start_block"].as_u64().unwrap();
    let img = s.flipped(start * 4096 + 200, "dir");
    let out = verilay()
        .arg("extract")
        .arg(&img)
        .arg(s.image.with_file_name("out_dir"))
        .arg("--path")
        .arg("many")
        .arg("--quiet")
        .output()
        .unwrap();
    fails_with(&out, "integrity error");
    let v = verify_json(&img);
    assert!(holds(&v, "a directory block of /many"), "{v}");

    // An xattr body: listing the file's xattrs fails.
    let f = "many/entry_with_a_longish_name_0003";
    let x = info(f)["xattr_body"]["offset"].as_u64().unwrap();
    let img = s.flipped(x + 14, "xattr");
    let out = verilay().arg("inspect").arg(&img).arg(f).output().unwrap();
    fails_with(&out, "integrity error");
    let v = verify_json(&img);
    assert!(holds(&v, &format!("the xattrs of /{f}")), "{v}");

    // File data, in the third MiB of a 3 MiB file: the first two MiB (verified) come out,
    // not one byte of the bad block.
    let f = "sizes/f3145728";
    let start = info(f)["layout"]["start_block"].as_u64().unwrap();
    let bad = start * 4096 + (2 << 20) + 5000;
    let img = s.flipped(bad, "data");
    let out = cat(&img, f);
    fails_with(&out, "integrity error");
    let source = std::fs::read(s.src.join(f)).unwrap();
    assert!(
        out.stdout.len() <= (2 << 20) + 4096,
        "nothing past the bad block"
    );
    assert!(
        out.stdout.len() < 5000 + (2 << 20),
        "the bad byte is never returned"
    );
    assert_eq!(
        out.stdout[..],
        source[..out.stdout.len()],
        "what came out is right"
    );
    let v = verify_json(&img);
    assert_eq!(v["offset"], block_of(bad));
    assert_eq!(v["holds"], serde_json::json!([format!("the data of /{f}")]));
    // Another file in another block still reads.
    assert_eq!(cat(&img, "hello.txt").stdout, b"hello, world\n");

    // An inline tail (12345 = 3 blocks + 57 bytes stored after the inode).
    let f = "sizes/f12345";
    let tail = info(f)["layout"]["inline_tail"]["offset"].as_u64().unwrap();
    let img = s.flipped(tail + 30, "tail");
    fails_with(&cat(&img, f), "integrity error");
    let v = verify_json(&img);
    assert!(holds(&v, &format!("the inline tail of /{f}")), "{v}");

    // A Merkle tree block: the level-0 block covering the 3 MiB file's data.
    let tree_offset = s.trailer_u64(24);
    let tree_size = s.trailer_u64(32);
    let f_start = info("sizes/f3145728")["layout"]["start_block"]
        .as_u64()
        .unwrap();
    // Level 0 is stored last; entry i of it is the hash of image block i.
    let erofs_blocks = inspect(&s.image, None)["erofs_bytes"].as_u64().unwrap() / 4096;
    let l0_blocks = erofs_blocks.div_ceil(128);
    let l0_start = tree_offset + tree_size - l0_blocks * 4096;
    let entry = l0_start + (f_start + 10) * 32;
    let img = s.flipped(entry, "tree");
    let out = cat(&img, "sizes/f3145728");
    fails_with(&out, "Merkle tree block");
    assert!(out.stdout.is_empty(), "no data under a bad tree block");
    let v = verify_json(&img);
    assert_eq!(v["offset"], block_of(entry));
    assert!(holds(&v, "the verity section's Merkle tree"), "{v}");
    assert_eq!(cat(&img, "hello.txt").stdout, b"hello, world\n");

    // The descriptor's root hash: pinned, refused up front; unpinned, nothing verifies.
    let desc = s.trailer_u64(40);
    let img = s.flipped(desc + 16, "desc");
    let out = verilay()
        .args(["cat", "--digest", &s.digest])
        .arg(&img)
        .arg("hello.txt")
        .output()
        .unwrap();
    fails_with(&out, "not the pinned");
    assert!(out.stdout.is_empty());
    let out = verilay()
        .args(["verify", "--digest", &s.digest])
        .arg(&img)
        .output()
        .unwrap();
    fails_with(&out, "not the pinned");
    fails_with(&cat(&img, "hello.txt"), "integrity error");
    // A reserved descriptor byte: refused whether pinned or not.
    let img = s.flipped(desc + 200, "desc_reserved");
    fails_with(&cat(&img, "hello.txt"), "reserved bytes");
}

#[test]
fn a_wrong_digest_is_refused_before_anything_is_served() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), b"contents").unwrap();
    let image = t.path().join("img");
    let digest = String::from_utf8(build(&src, &image, &["--quiet"]).stdout).unwrap();
    let digest = digest.trim();
    let mut wrong = digest.to_string();
    let last = wrong.pop().unwrap();
    wrong.push(if last == '0' { '1' } else { '0' });

    let out = verilay()
        .args(["cat", "--digest", &wrong])
        .arg(&image)
        .arg("a")
        .output()
        .unwrap();
    fails_with(
        &out,
        &format!("image digest is {digest}, not the pinned {wrong}"),
    );
    assert!(out.stdout.is_empty());
    let dest = t.path().join("out");
    let out = verilay()
        .args(["extract", "--digest", &wrong, "--quiet"])
        .arg(&image)
        .arg(&dest)
        .output()
        .unwrap();
    fails_with(&out, "not the pinned");
    assert!(!dest.exists(), "nothing extracted");
    let out = run(verilay()
        .args(["cat", "--digest", digest])
        .arg(&image)
        .arg("a"));
    assert_eq!(out.stdout, b"contents");

    // The JSON forms carry the same digest.
    let v: Value = serde_json::from_slice(
        &run(verilay()
            .args(["verify", "--json", "--digest", digest])
            .arg(&image))
        .stdout,
    )
    .unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["pinned"], true);
    assert_eq!(v["digest"], digest);
    let again = t.path().join("again");
    let j: Value = serde_json::from_slice(
        &run(verilay()
            .arg("build")
            .arg(&src)
            .arg("-o")
            .arg(&again)
            .arg("--json")
            .env("SOURCE_DATE_EPOCH", "1700000000"))
        .stdout,
    )
    .unwrap();
    assert_eq!(j["digest"], digest, "same tree, same epoch, same digest");
    assert!(j["erofs_bytes"].as_u64().unwrap() < j["image_bytes"].as_u64().unwrap());

    // Reading what is not a file is a one-line error.
    let out = verilay().arg("cat").arg(&image).arg("/").output().unwrap();
    fails_with(&out, "not a regular file");
    let out = verilay()
        .arg("cat")
        .arg(&image)
        .arg("nope")
        .output()
        .unwrap();
    fails_with(&out, "no such file");

    for bad in ["sha256:xyz", "md5:00", "sha256:00"] {
        let out = verilay()
            .args(["cat", "--digest", bad])
            .arg(&image)
            .arg("a")
            .output()
            .unwrap();
        fails_with(&out, "--digest");
    }

    // A plain EROFS image has nothing to verify: reading commands say so.
    let plain = t.path().join("plain");
    build(&src, &plain, &["--quiet", "--no-verity"]);
    for cmd in [vec!["verify"], vec!["cat"]] {
        let mut c = verilay();
        c.args(&cmd).arg(&plain);
        if cmd[0] == "cat" {
            c.arg("a");
        }
        fails_with(&c.output().unwrap(), "no verity section");
    }
    let sb = inspect(&plain, None);
    assert!(sb["digest"].as_str().unwrap().starts_with("none"));
}
