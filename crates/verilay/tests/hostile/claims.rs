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
    let Some(tmp) = root_and_tool_tempdir("needs root (mounts)", "fsverity", "needs fsverity")
    else {
        return;
    };
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
    run(measured_mount(&image, &mnt, &policy, &list)
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
    let mut seeds = vec![
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
    ];
    seeds.extend(false_record_seeds(&base.join("a")));
    seeds.extend(no_xattr_record_seeds(&base.join("n")));
    seeds
}

/// An image whose record says it holds no xattr, while a file has `user.note`, raw and
/// sealed; none where the filesystem under `base` takes no user xattr.
fn no_xattr_record_seeds(base: &Path) -> Vec<Seed> {
    let src = base.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("noted"), "n").unwrap();
    let noted = Command::new("setfattr")
        .args(["-n", "user.note", "-v", "x"])
        .arg(src.join("noted"))
        .status()
        .is_ok_and(|s| s.success());
    if !noted {
        return Vec::new();
    }
    let (image, _) = false_record_image(base, &src, "bare", 1 << 1);
    let sealed = fs::read(&image).unwrap();
    let raw = sealed[..layout(&image).erofs as usize].to_vec();
    [("read_image", raw), ("verified_source", sealed)]
        .into_iter()
        .map(|(target, bytes)| Seed {
            target,
            name: "false-no-xattr-record".into(),
            bytes,
        })
        .collect()
}

/// An image whose namespace record hides an ACL, raw and sealed; none where the
/// filesystem under `base` takes no ACL.
fn false_record_seeds(base: &Path) -> Vec<Seed> {
    let src = source(base);
    let acl = Command::new("setfacl")
        .args(["-m", "u:4242:---"])
        .arg(src.join("big"))
        .status()
        .is_ok_and(|s| s.success());
    if !acl {
        return Vec::new();
    }
    let (image, _) = false_record_image(base, &src, "acl", 0b1100);
    let sealed = fs::read(&image).unwrap();
    let raw = sealed[..layout(&image).erofs as usize].to_vec();
    [("read_image", raw), ("verified_source", sealed)]
        .into_iter()
        .map(|(target, bytes)| Seed {
            target,
            name: "false-namespace-record".into(),
            bytes,
        })
        .collect()
}

/// `src` built into `<name>.img` with the namespace bits `clear` cleared from its
/// footer's record, sealed again (every block verifies, only the record lies); the image
/// and its digest.
fn false_record_image(base: &Path, src: &Path, name: &str, clear: u32) -> (PathBuf, String) {
    let image = base.join(format!("{name}.img"));
    build(src, &image, &["--quiet"]);
    let l = layout(&image);
    let mut b = fs::read(&image).unwrap();
    b.truncate(l.erofs as usize);
    let word = l.erofs as usize - 64 + 32;
    let ns = u32::from_le_bytes(b[word..word + 4].try_into().unwrap());
    assert_ne!(ns & clear, 0, "{name}: the image records what it holds");
    b[word..word + 4].copy_from_slice(&(ns & !clear).to_le_bytes());
    fs::write(&image, &b).unwrap();
    let out = run(verilay().args(["seal", "--quiet"]).arg(&image));
    let digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    (image, digest)
}

/// A directory the test user can enter.
fn shared_tempdir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    tmp
}

/// A mount of `images` (top first) the test user may use, pinned, logging to `log`.
fn pinned_mount(images: &[(&Path, &str)], mnt: &Path, log: &Path) -> Unmount {
    fs::create_dir_all(mnt).unwrap();
    let mut cmd = verilay();
    cmd.args(["mount", "--quiet", "--allow-other"]);
    for (image, digest) in images {
        cmd.arg(image).args(["--digest", digest]);
    }
    run(cmd.arg(mnt).arg("--log").arg(log));
    Unmount {
        dir: mnt.to_path_buf(),
        fuse: true,
    }
}

/// The footer's record says no ACL occurs, but a 0644 file has one denying the test user:
/// the kernel's erofs enforces it, so the mount must not let that user read the file (the
/// record would have it leave ACLs off and check the mode alone). The inode is EIO, one
/// log line names the image and inode, and the rest of the tree is served; also with the
/// image under another one in a stack.
#[test]
fn a_false_namespace_record_never_lets_a_user_read_what_the_kernel_denies() {
    if skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(
            have("setfacl") && have("setfattr"),
            "needs setfacl and setfattr",
        )
        || lacks_test_user()
    {
        return;
    }
    let tmp = shared_tempdir();
    let base = tmp.path();
    let src = base.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("secret"), "top secret\n").unwrap();
    fs::write(src.join("open"), "open\n").unwrap();
    // `open` has an xattr too, so the check reads its body rather than skipping it.
    sh(&format!(
        "chmod 644 {0}/secret {0}/open && setfacl -m u:verilaytest:--- {0}/secret \
         && setfattr -n user.note -v x {0}/open",
        src.display()
    ));
    let (image, digest) = false_record_image(base, &src, "acl", 0b1100);
    // The oracle: the kernel's erofs, which reads the ACL whatever the record says.
    let k = Mount::erofs(&image, &base.join("k"));
    let kernel = as_test_user(base, "cat k/secret");
    assert!(
        !kernel.status.success(),
        "the kernel lets the user read the file"
    );
    assert!(as_test_user(base, "cat k/open").status.success());
    drop(k);
    let other = base.join("other-src");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("t"), "t\n").unwrap();
    let top = base.join("other.img");
    let top_digest = String::from_utf8(build(&other, &top, &["--quiet"]).stdout).unwrap();
    let stacks: [&[(&Path, &str)]; 2] = [
        &[(&image, &digest)],
        &[(&top, top_digest.trim()), (&image, &digest)],
    ];
    // Each stack twice: the file found by a lookup, and handed over by readdirplus first.
    let cases = stacks
        .into_iter()
        .flat_map(|stack| [(stack, ""), (stack, "ls -l M >/dev/null; ")]);
    for (i, (stack, list)) in cases.enumerate() {
        let mnt = base.join(format!("m{i}"));
        let log = base.join(format!("m{i}.log"));
        let _u = pinned_mount(stack, &mnt, &log);
        let script = format!("{list}cat M/secret").replace('M', &format!("m{i}"));
        let user = as_test_user(base, &script);
        assert!(
            !user.status.success(),
            "mount {i} ({script}): the test user reads the file its ACL denies it: {}",
            String::from_utf8_lossy(&user.stdout)
        );
        let e = fs::read(mnt.join("secret")).expect_err("root reads a refused inode");
        assert_eq!(e.raw_os_error(), Some(rustix::io::Errno::IO.raw_os_error()));
        assert_eq!(fs::read_to_string(mnt.join("open")).unwrap(), "open\n");
        assert!(as_test_user(base, &format!("cat m{i}/open"))
            .status
            .success());
        let logged = fs::read_to_string(&log).unwrap_or_default();
        assert!(
            logged.lines().any(|l| l.contains("acl.img")
                && l.contains("system.posix_acl_access")
                && l.contains("inode ")
                && l.contains("refused")),
            "mount {i}: no log line names the image and inode: {logged}"
        );
    }
}

/// The same for `security.*`: the record says the image is unlabelled (so the mount
/// answers every `security.*` name with EOPNOTSUPP), but one file carries a label the
/// kernel's erofs serves. That inode is EIO; its unlabelled siblings are served.
#[test]
fn a_false_namespace_record_hides_no_security_label() {
    if skip_unless(is_root(), "needs root (mounts, security.* xattrs)")
        || skip_unless(have("setfattr"), "needs setfattr")
    {
        return;
    }
    let tmp = shared_tempdir();
    let base = tmp.path();
    let src = base.join("src");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::write(src.join("dir/labelled"), "l\n").unwrap();
    fs::write(src.join("dir/plain"), "p\n").unwrap();
    sh(&format!(
        "setfattr -n security.selinux -v system_u:object_r:usr_t:s0 {0}/dir/labelled \
         && setfattr -n user.note -v x {0}/dir/plain",
        src.display()
    ));
    let (image, digest) = false_record_image(base, &src, "label", 1 << 6);
    let k = Mount::erofs(&image, &base.join("k"));
    let label = run(Command::new("getfattr")
        .args(["--only-values", "-n", "security.selinux"])
        .arg(k.dir.join("dir/labelled")));
    assert_eq!(label.stdout, b"system_u:object_r:usr_t:s0");
    drop(k);
    let mnt = base.join("m");
    let log = base.join("m.log");
    let _u = pinned_mount(&[(&image, &digest)], &mnt, &log);
    let got = Command::new("getfattr")
        .args(["--only-values", "-n", "security.selinux"])
        .arg(mnt.join("dir/labelled"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&got.stderr).contains("Input/output error"),
        "the label is hidden, not refused: {}{}",
        String::from_utf8_lossy(&got.stdout),
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(fs::read_to_string(mnt.join("dir/plain")).unwrap(), "p\n");
    let logged = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("label.img") && logged.contains("security.selinux"),
        "{logged}"
    );
}

/// The root's ACL hidden by the record: the mount has nothing to serve and refuses,
/// naming the root inode and the ACL, where the kernel's erofs denies the test user.
#[test]
fn a_false_namespace_record_about_the_root_fails_the_mount() {
    if skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(have("setfacl"), "needs setfacl (acl)")
        || lacks_test_user()
    {
        return;
    }
    let tmp = shared_tempdir();
    let base = tmp.path();
    let src = base.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), "f\n").unwrap();
    sh(&format!(
        "chmod 755 {0} && setfacl -m u:verilaytest:--- {0}",
        src.display()
    ));
    let (image, digest) = false_record_image(base, &src, "root", 0b1100);
    let k = Mount::erofs(&image, &base.join("k"));
    assert!(!as_test_user(base, "ls k").status.success());
    drop(k);
    let mnt = base.join("m");
    fs::create_dir_all(&mnt).unwrap();
    let out = verilay()
        .args(["mount", "--quiet", "--allow-other"])
        .arg(&image)
        .args(["--digest", &digest])
        .arg(&mnt)
        .output()
        .unwrap();
    let _u = out.status.success().then(|| Unmount {
        dir: mnt.clone(),
        fuse: true,
    });
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("root.img")
            && err.contains("system.posix_acl_access")
            && err.contains("inode "),
        "the mount serves a root whose ACL its record hides: {err}"
    );
}

/// A directory's default ACL alone (record bit 3, ACL bit 2 never set) hidden by the
/// record: the kernel's erofs shows it, so the mount refuses the directory (EIO) rather
/// than answer that it has none.
#[test]
fn a_false_namespace_record_hides_no_default_acl() {
    if skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(
            have("setfacl") && have("getfacl"),
            "needs setfacl and getfacl",
        )
    {
        return;
    }
    let tmp = shared_tempdir();
    let base = tmp.path();
    let src = base.join("src");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::create_dir_all(src.join("other")).unwrap();
    sh(&format!("setfacl -d -m u:4242:r-x {}/dir", src.display()));
    let (image, digest) = false_record_image(base, &src, "default", 1 << 3);
    let k = Mount::erofs(&image, &base.join("k"));
    let acl = run(Command::new("getfacl")
        .args(["-d", "-p", "-n"])
        .arg(k.dir.join("dir")));
    assert!(String::from_utf8_lossy(&acl.stdout).contains("user:4242:r-x"));
    drop(k);
    let mnt = base.join("m");
    let log = base.join("m.log");
    let _u = pinned_mount(&[(&image, &digest)], &mnt, &log);
    let e = fs::metadata(mnt.join("dir")).expect_err("a directory whose ACL is hidden");
    assert_eq!(e.raw_os_error(), Some(rustix::io::Errno::IO.raw_os_error()));
    assert!(fs::metadata(mnt.join("other")).unwrap().is_dir());
    let logged = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("default.img") && logged.contains("system.posix_acl_default"),
        "{logged}"
    );
}

/// The record says the image holds no xattr at all (so the mount answers every xattr
/// request with ENOSYS and the kernel stops asking), but one file carries `user.note`,
/// which the kernel's erofs serves. That inode is EIO and one log line; its siblings are
/// served, without xattrs.
#[test]
fn a_false_record_of_no_xattr_at_all_hides_none() {
    if skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(have("setfattr"), "needs setfattr")
    {
        return;
    }
    let tmp = shared_tempdir();
    let base = tmp.path();
    let src = base.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("noted"), "n\n").unwrap();
    fs::write(src.join("plain"), "p\n").unwrap();
    setfattr(&src.join("noted"), "user.note", "x");
    let (image, digest) = false_record_image(base, &src, "bare", 1 << 1);
    let k = Mount::erofs(&image, &base.join("k"));
    let note = run(Command::new("getfattr")
        .args(["--only-values", "-n", "user.note"])
        .arg(k.dir.join("noted")));
    assert_eq!(note.stdout, b"x");
    drop(k);
    let mnt = base.join("m");
    let log = base.join("m.log");
    let _u = pinned_mount(&[(&image, &digest)], &mnt, &log);
    let e = fs::metadata(mnt.join("noted")).expect_err("a file whose xattr is hidden");
    assert_eq!(e.raw_os_error(), Some(rustix::io::Errno::IO.raw_os_error()));
    assert_eq!(fs::read_to_string(mnt.join("plain")).unwrap(), "p\n");
    let plain = Command::new("getfattr")
        .args(["-n", "user.note"])
        .arg(mnt.join("plain"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&plain.stderr);
    assert!(said.contains("Operation not supported"), "{said}");
    let logged = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("bare.img") && logged.contains("user.note") && logged.contains("refused"),
        "{logged}"
    );
}

/// Issue 36, item 5: two files of `conf.d/` share one xattr (stored once, in the shared
/// xattr block); one byte of that block flipped. The listing used to come back without
/// the two files (readdirplus gave them no inode, and readdir(3) skipped them), so a
/// program enumerating config fragments or deny lists silently missed them. A listing
/// whose entries cannot all be served fails with EIO; the intact file is still read by
/// name; both damaged files are named in the log. Alone and in a stack.
#[test]
fn a_tampered_shared_xattr_block_fails_the_listing_never_shortens_it() {
    let Some(t) = root_and_tool_tempdir(
        "needs root (mounts, user.* xattrs)",
        "setfattr",
        "setfattr missing",
    ) else {
        return;
    };
    let src = t.path().join("src");
    fs::create_dir_all(src.join("conf.d")).unwrap();
    for f in ["a", "b", "c"] {
        fs::write(src.join("conf.d").join(f), f).unwrap();
    }
    for f in ["a", "b"] {
        setfattr(&src.join("conf.d").join(f), "user.tag", "sharedvalue");
    }
    let image = t.path().join("x.img");
    build(&src, &image, &["--quiet"]);
    let mut bytes = fs::read(&image).unwrap();
    let at = bytes
        .windows(11)
        .position(|w| w == b"sharedvalue")
        .expect("the shared value is stored once");
    assert_eq!(
        bytes.windows(11).filter(|w| *w == b"sharedvalue").count(),
        1,
        "shared, not inline"
    );
    bytes[at] ^= 1;
    let tampered = t.path().join("tampered.img");
    fs::write(&tampered, bytes).unwrap();
    let other_src = t.path().join("other");
    fs::create_dir_all(other_src.join("conf.d")).unwrap();
    fs::write(other_src.join("conf.d/z"), "z").unwrap();
    let other = t.path().join("other.img");
    build(&other_src, &other, &["--quiet"]);

    for (n, stack) in [vec![&tampered], vec![&other, &tampered]]
        .iter()
        .enumerate()
    {
        let mnt = t.path().join(format!("m{n}"));
        fs::create_dir(&mnt).unwrap();
        let log = t.path().join(format!("log{n}"));
        run(verilay()
            .arg("mount")
            .args(stack.iter())
            .arg(&mnt)
            .arg("--log")
            .arg(&log));
        let _m = Unmount::fuse(&mnt);
        let dir = mnt.join("conf.d");
        let err = fs::read_dir(&dir)
            .and_then(|d| d.collect::<Result<Vec<_>, _>>())
            .map(|v| v.iter().map(|e| e.file_name()).collect::<Vec<_>>())
            .expect_err("a listing of conf.d");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{stack:?}: {err}");
        for tool in ["ls", "find"] {
            let out = Command::new(tool).arg(&dir).output().unwrap();
            assert!(!out.status.success(), "{tool} {stack:?} succeeded");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("Input/output error"),
                "{tool}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert_eq!(fs::read(dir.join("c")).unwrap(), b"c");
        for f in ["a", "b"] {
            let err = fs::metadata(dir.join(f)).expect_err("stat of a damaged file");
            assert_eq!(err.raw_os_error(), Some(libc::EIO), "{f}: {err}");
        }
        let logged = fs::read_to_string(&log).unwrap();
        for f in ["/conf.d/a", "/conf.d/b"] {
            assert!(logged.contains(f), "{logged} lacks {f}");
        }
    }
}
