//! Compressed EROFS images made by mkfs.erofs (Debian's erofs-utils: lz4 and lz4hc), sealed
//! with `verilay seal`, read by verilay: inspect, extract, fsck, cat, and a FUSE mount
//! compared with the kernel's mount of the same image (issue 23).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// xorshift: reproducible bytes without a dependency.
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = xorshift::XorShift(seed | 1);
    (0..n).map(|_| (x.next_u64() >> 32) as u8).collect()
}

/// Compressible text that is not one repeated line.
fn text(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 64);
    let mut i = 0u64;
    while v.len() < n {
        v.extend_from_slice(
            format!("line {i}: the quick brown fox {} jumps\n", i * 7919 % 1000).as_bytes(),
        );
        i += 1;
    }
    v.truncate(n);
    v
}

/// Every shape of file the compressed layouts treat differently.
fn tree(src: &Path) {
    let w = |name: &str, data: &[u8]| std::fs::write(src.join(name), data).unwrap();
    std::fs::create_dir_all(src.join("d/e")).unwrap();
    w("empty", b"");
    w("one", b"x");
    let t = text(4 << 20);
    w("block-1", &t[..4095]);
    w("block", &t[..4096]);
    w("block+1", &t[..4097]);
    w("text", &t[..3 << 20]);
    w("random", &noise(7, 2 << 20));
    // Random then text: clusters of both kinds (plain and compressed) in one file.
    let mut mixed = noise(9, 300_000);
    mixed.extend_from_slice(&t[..700_001]);
    w("d/mixed", &mixed);
    w("d/e/small-text", &t[..10_000]);
    sh(&format!(
        "cd {dir} && truncate -s 5M sparse && printf data | dd of=sparse bs=1 seek=3000000 conv=notrunc status=none \
         && ln text d/hardlink && ln -s text sym && ln -s d/e/small-text d/sym2 \
         && setfattr -n user.comment -v compressed text && setfattr -n user.big -v \"$(head -c 600 /dev/zero | tr '\\0' v)\" d/mixed",
        dir = src.display()
    ));
}

fn prerequisites() -> bool {
    skip_unless(have("mkfs.erofs"), "mkfs.erofs (erofs-utils) missing")
        || skip_unless(have("setfattr"), "setfattr missing")
}

/// mkfs.erofs with `args`, then a sealed copy of it: (plain image, sealed image).
fn make(src: &Path, work: &Path, name: &str, args: &[&str]) -> (PathBuf, PathBuf) {
    let plain = work.join(format!("{name}.erofs"));
    mkfs_erofs(args, &plain, src);
    let sealed = work.join(format!("{name}.sealed"));
    std::fs::copy(&plain, &sealed).unwrap();
    run(verilay().arg("seal").arg(&sealed));
    (plain, sealed)
}

fn inspect(image: &Path, path: Option<&str>) -> serde_json::Value {
    let out = run(verilay().arg("inspect").arg("--json").arg(image).args(path));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The settings the issue asks for: lz4 and lz4hc, 4 KiB to 64 KiB physical clusters
/// (big pclusters), and ztailpacking.
const CONFIGS: &[(&str, &[&str])] = &[
    ("lz4", &["-zlz4"]),
    ("lz4hc-12", &["-zlz4hc,12"]),
    ("lz4-16k", &["-zlz4", "-C16384"]),
    ("lz4hc-64k", &["-zlz4hc,12", "-C65536"]),
    ("lz4hc-tail", &["-zlz4hc", "-Eztailpacking"]),
    ("lz4-64k-tail", &["-zlz4", "-C65536", "-Eztailpacking"]),
];

/// `prerequisites`, and for a mount root (`why`: what needs it) and /dev/fuse.
fn mount_prerequisites(why: &str) -> bool {
    prerequisites()
        || skip_unless(is_root(), why)
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
}

/// `tree` made into an image `name` with big lz4hc clusters (64 KiB): (the temporary
/// directory, the source tree, the plain image, the sealed one).
fn lz4hc_image(name: &str) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let (tmp, src) = source_tree();
    let (plain, sealed) = make(&src, tmp.path(), name, &["-zlz4hc", "-C65536"]);
    (tmp, src, plain, sealed)
}

/// A temporary directory with `tree`'s files in `src`: (the directory, src).
fn source_tree() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src);
    (tmp, src)
}

#[test]
fn mkfs_images_read_back_exactly() {
    if prerequisites() {
        return;
    }
    let (tmp, src) = source_tree();
    for (name, args) in CONFIGS {
        let (_, sealed) = make(&src, tmp.path(), name, args);
        // The superblock names the algorithm; a compressible file shows its clusters.
        let sb = inspect(&sealed, None);
        assert_eq!(
            sb["compression"]["algorithms"],
            serde_json::json!(["lz4"]),
            "{name}: {sb}"
        );
        let f = inspect(&sealed, Some("/text"));
        let z = &f["compression"];
        assert!(z["ratio"].as_f64().unwrap() < 0.5, "{name}: {f}");
        assert!(z["stored_bytes"].as_u64().unwrap() > 0, "{name}: {f}");
        // `-C` bounds the physical cluster; above one block they are big pclusters.
        let max_pcluster: u64 = args
            .iter()
            .find_map(|a| a.strip_prefix("-C"))
            .map_or(4096, |c| c.parse().unwrap());
        let largest = z["largest_pcluster"].as_u64().unwrap();
        assert!(largest <= max_pcluster, "{name}: {f}");
        assert_eq!(
            z["big_pclusters"].as_bool().unwrap(),
            max_pcluster > 4096,
            "{name}: {f}"
        );
        if max_pcluster > 4096 {
            assert!(largest > 4096, "{name}: {f}");
        }
        // The file's fs-verity digest is that of its decoded contents.
        let fsv = run(Command::new("fsverity").arg("digest").arg(src.join("text")));
        let fsv = String::from_utf8_lossy(&fsv.stdout);
        assert_eq!(
            fsv.split_whitespace().next().unwrap(),
            f["fsverity_digest"].as_str().unwrap(),
            "{name}"
        );

        let fsck = run(verilay().arg("fsck").arg(&sealed));
        let said = String::from_utf8_lossy(&fsck.stderr) + String::from_utf8_lossy(&fsck.stdout);
        assert!(said.contains(": clean,"), "{name}: {said}");

        let out = tmp.path().join(format!("{name}-extracted"));
        run(verilay()
            .arg("extract")
            .arg("--quiet")
            .arg(&sealed)
            .arg(&out));
        assert_diff_clean(&src, &out);
        assert_eq!(xattr_dump(&src), xattr_dump(&out), "{name}: xattrs");

        for file in ["d/mixed", "block+1", "one", "empty", "sparse"] {
            let cat = run(verilay().arg("cat").arg(&sealed).arg(format!("/{file}")));
            assert!(
                cat.stdout == std::fs::read(src.join(file)).unwrap(),
                "{name}: cat /{file} differs"
            );
        }
    }
}

/// verilay's FUSE mount of the sealed image equals the kernel's mount of the plain one:
/// contents, `ls -lRn` (sizes, st_blocks, links, times), xattrs.
#[test]
fn mount_equals_the_kernels() {
    if mount_prerequisites("kernel mounts need root") {
        return;
    }
    let (tmp, src) = source_tree();
    for (name, args) in CONFIGS {
        let (plain, sealed) = make(&src, tmp.path(), name, args);
        let kernel = Mount::erofs(&plain, &tmp.path().join(format!("{name}-kernel")));
        let mnt = tmp.path().join(format!("{name}-fuse"));
        std::fs::create_dir_all(&mnt).unwrap();
        run(verilay().arg("mount").arg("-q").arg(&sealed).arg(&mnt));
        let _fuse = Unmount::fuse(&mnt);
        assert_diff_clean(&kernel.dir, &mnt);
        assert_diff_clean(&src, &mnt);
        assert_eq!(ls_lr(&kernel.dir), ls_lr(&mnt), "{name}: ls -lRan differs");
        assert_eq!(
            xattr_dump(&kernel.dir),
            xattr_dump(&mnt),
            "{name}: xattrs differ"
        );
        // Reads at odd offsets and sizes across cluster boundaries.
        let want = std::fs::read(src.join("d/mixed")).unwrap();
        let f = std::fs::File::open(mnt.join("d/mixed")).unwrap();
        use std::os::unix::fs::FileExt;
        for (off, len) in [
            (0, 1),
            (4095, 2),
            (299_999, 70_000),
            (65_535, 65_538),
            (999_000, 5000),
        ] {
            let mut buf = vec![0u8; len];
            let n = f.read_at(&mut buf, off).unwrap();
            let end = (off as usize + len).min(want.len());
            assert_eq!(
                &buf[..n],
                &want[off as usize..end],
                "{name}: pread {off}+{len}"
            );
        }
    }
}

/// With an upper directory, writing to a compressed file copies its decoded bytes up.
#[test]
fn copy_up_of_a_compressed_file() {
    if mount_prerequisites("needs root for the upper directory's ownership") {
        return;
    }
    let (tmp, src, _, sealed) = lz4hc_image("up");
    let d = dirs(tmp.path(), "up");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    run(verilay()
        .arg("mount")
        .arg("-q")
        .arg(&sealed)
        .arg("--upper")
        .arg(&d.upper)
        .arg("--work")
        .arg(&d.work)
        .arg(&mnt));
    let _u = Unmount::fuse(&mnt);
    let mut want = std::fs::read(src.join("d/mixed")).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(mnt.join("d/mixed"))
            .unwrap();
        f.write_all(b"appended").unwrap();
    }
    want.extend_from_slice(b"appended");
    assert!(
        std::fs::read(mnt.join("d/mixed")).unwrap() == want,
        "through the mount"
    );
    assert!(
        std::fs::read(d.upper.join("d/mixed")).unwrap() == want,
        "in the upper directory"
    );
}

/// Where the first cluster of `path` is stored in `image` (a compressed file).
fn first_cluster(image: &Path, path: &str) -> (u64, u64) {
    let f = std::fs::File::open(image).unwrap();
    let img = erofs::read::Image::open(erofs::read::FileSource::new(f).unwrap()).unwrap();
    let mut ino = img.inode(img.root_nid()).unwrap();
    for name in path.trim_start_matches('/').split('/') {
        let ent = img.lookup(&ino, name.as_bytes()).unwrap().unwrap();
        ino = img.inode(ent.nid).unwrap();
    }
    match img.zmap(&ino, 0).unwrap().stored {
        erofs::read::ZStored::Cluster { at, len, .. } => (at, len),
        other => panic!("{path}: {other:?}"),
    }
}

/// A changed byte in a compressed cluster of a sealed image is an integrity error: `cat`
/// fails, a mount answers EIO, never other bytes; the other files still read.
#[test]
fn tampered_cluster_is_eio() {
    if prerequisites() {
        return;
    }
    let (tmp, src, _, sealed) = lz4hc_image("tamper");
    let (at, len) = first_cluster(&sealed, "/text");
    assert!(len > 4096, "a big pcluster: {len}");
    let mut bytes = std::fs::read(&sealed).unwrap();
    bytes[(at + len - 100) as usize] ^= 0x40;
    std::fs::write(&sealed, &bytes).unwrap();

    let out = verilay()
        .arg("cat")
        .arg(&sealed)
        .arg("/text")
        .output()
        .unwrap();
    assert!(!out.status.success(), "cat of a tampered cluster succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("integrity"), "{err}");
    assert!(
        out.stdout.len() < 65536 * 2,
        "bytes past the bad cluster were printed"
    );
    assert!(
        src.join("text").exists()
            && std::fs::read(src.join("text"))
                .unwrap()
                .starts_with(&out.stdout),
        "cat printed wrong bytes"
    );
    // The integrity report names what the bad block holds.
    let verify = verilay().arg("verify").arg(&sealed).output().unwrap();
    let said = String::from_utf8_lossy(&verify.stderr);
    assert!(
        !verify.status.success() && said.contains("the data of /text"),
        "{said}"
    );
    let ok = run(verilay().arg("cat").arg(&sealed).arg("/d/mixed"));
    assert!(ok.stdout == std::fs::read(src.join("d/mixed")).unwrap());

    if skip_unless(is_root(), "mounting needs root here")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
    {
        return;
    }
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    run(verilay().arg("mount").arg("-q").arg(&sealed).arg(&mnt));
    let _u = Unmount::fuse(&mnt);
    let e = std::fs::read(mnt.join("text")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5), "{e}");
    assert!(
        std::fs::read(mnt.join("d/mixed")).unwrap() == std::fs::read(src.join("d/mixed")).unwrap()
    );
}

/// 4 KiB reads through a 64 KiB cluster decode it once: the cache holds decoded extents.
#[test]
fn small_reads_decode_each_extent_once() {
    if prerequisites() {
        return;
    }
    let (_tmp, src, plain, _) = lz4hc_image("cache");
    let f = std::fs::File::open(&plain).unwrap();
    let img = erofs::read::Image::open(erofs::read::FileSource::new(f).unwrap()).unwrap();
    let root = img.inode(img.root_nid()).unwrap();
    let ino = img
        .inode(img.lookup(&root, b"text").unwrap().unwrap().nid)
        .unwrap();
    let extents = img.layout_info(&ino).compressed.unwrap().extents;
    let want = std::fs::read(src.join("text")).unwrap();
    let before = img.zdecodes();
    // Two threads, as the FUSE daemon reads.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = img.read(&ino, got.len() as u64, &mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                assert!(got == want);
            });
        }
    });
    let decodes = img.zdecodes() - before;
    assert_eq!(
        decodes,
        extents,
        "{} KiB read in 4 KiB reads by 2 threads",
        want.len() / 1024
    );
}
