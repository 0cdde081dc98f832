//! `verilay build -z ALG -C BYTES`: compressed images, checked by independent readers
//! (verilay's own reader of compressed images is not the oracle here): the kernel's
//! erofs mount (`diff -r`, `getfattr`, `stat`), Debian's `fsck.erofs`, and
//! `fsverity digest` for the image digest and every file's stored digest. Then verilay
//! reads its own images back, for every algorithm, as the kernel does.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const ALGORITHMS: [&str; 5] = ["lz4", "lz4hc", "zstd", "lzma", "deflate"];
const CLUSTERS: [&str; 2] = ["4096", "65536"];
const RANDOM_FILE: &str = "random-3m";
const TEXT_FILE: &str = "text-3m";
const DENSE: &str = "sparse-dense";

fn text(n: usize) -> Vec<u8> {
    let words = [
        "static ",
        "int ",
        "struct ",
        "erofs_",
        "inode ",
        "return ",
        "{\n",
        "}\n",
        "*p; ",
        "cluster",
        "/* compressed */\n",
    ];
    let mut out = Vec::with_capacity(n + 32);
    let mut s = 1u32;
    while out.len() < n {
        s = s.wrapping_mul(1_103_515_245).wrapping_add(12345);
        out.extend_from_slice(words[(s >> 16) as usize % words.len()].as_bytes());
    }
    out.truncate(n);
    out
}

/// As root (to mount what is built), a temporary directory with `make_tree`'s tree in
/// `src`; None, with the skip recorded, where not root.
fn tree_to_mount() -> Option<(tempfile::TempDir, PathBuf)> {
    if skip_unless(is_root(), "needs root to mount") {
        return None;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src);
    Some((t, src))
}

/// Every shape a compressed file can take: around block boundaries, incompressible and
/// compressible MiBs, sparse, hard links, symlinks, xattrs, long names.
fn make_tree(root: &Path) {
    use std::fs;
    fs::create_dir_all(root.join("sizes")).unwrap();
    let t = text(3 << 20);
    for size in [
        0usize, 1, 4095, 4096, 4097, 8191, 65535, 65536, 65537, 200_000,
    ] {
        fs::write(root.join(format!("sizes/text-{size}")), &t[..size]).unwrap();
        fs::write(
            root.join(format!("sizes/random-{size}")),
            xorshift::xorshift(size, size as u64 + 1),
        )
        .unwrap();
    }
    fs::write(root.join(RANDOM_FILE), xorshift::xorshift(3 << 20, 7)).unwrap();
    fs::write(root.join(TEXT_FILE), &t).unwrap();
    // Text, then incompressible, then zeros, then text: clusters of every kind in one file.
    let mut mixed = t[..300_000].to_vec();
    mixed.extend(xorshift::xorshift(100_003, 9));
    mixed.extend(vec![0u8; 500_000]);
    mixed.extend_from_slice(&t[..123_457]);
    fs::write(root.join("mixed"), &mixed).unwrap();
    // Sparse: data, a 5 MiB hole, data (and one that is all hole but its last byte):
    // mostly holes, so left chunk-based; and one mostly data, compressed holes and all.
    sh(&format!(
        "cd {0} && head -c 300000 {1} > sparse && truncate -s 5500000 sparse && head -c 70000 {1} >> sparse \
         && truncate -s 9000000 hole && printf x >> hole \
         && head -c 2097152 {1} > {DENSE} && truncate -s 3145728 {DENSE} && head -c 1000000 {1} >> {DENSE}",
        root.display(),
        root.join(TEXT_FILE).display()
    ));
    fs::hard_link(root.join(TEXT_FILE), root.join("hardlink")).unwrap();
    fs::create_dir_all(root.join("links")).unwrap();
    std::os::unix::fs::symlink("../text-3m", root.join("links/short")).unwrap();
    std::os::unix::fs::symlink("x".repeat(4000), root.join("links/long")).unwrap();
    let long = "n".repeat(255);
    fs::write(root.join(&long), &t[..10_000]).unwrap();
    fs::create_dir_all(root.join("d".repeat(200))).unwrap();
    fs::write(root.join("d".repeat(200)).join(&long), &t[..5000]).unwrap();
    setfattr(&root.join(TEXT_FILE), "user.kind", "text");
    setfattr(&root.join("mixed"), "user.big", &"v".repeat(1000));
    setfattr(&root.join("links"), "trusted.dir", "yes");
}

/// Builds `src` with `extra` flags; returns the printed JSON summary.
fn build_json(
    src: &Path,
    image: &Path,
    extra: &[&str],
    threads: Option<&str>,
) -> serde_json::Value {
    let mut cmd = verilay();
    cmd.arg("build")
        .arg(src)
        .arg("-o")
        .arg(image)
        .arg("--json")
        .args(extra)
        .env("SOURCE_DATE_EPOCH", "1700000000");
    if let Some(n) = threads {
        cmd.env("RAYON_NUM_THREADS", n);
    }
    serde_json::from_slice(&run(&mut cmd).stdout).expect("build --json prints JSON")
}

/// `fsverity digest` of the first `len` bytes of `image` (the EROFS part).
fn fsverity_of_prefix(image: &Path, len: u64, scratch: &Path) -> String {
    let bytes = std::fs::read(image).unwrap();
    std::fs::write(scratch, &bytes[..len as usize]).unwrap();
    fsverity(scratch)
}

fn fsverity(path: &Path) -> String {
    let out = run(Command::new("fsverity")
        .arg("digest")
        .arg("--compact")
        .arg(path));
    format!("sha256:{}", String::from_utf8(out.stdout).unwrap().trim())
}

/// The image's file-digest table: nid -> "sha256:HEX".
fn digest_table(image: &Path, erofs_bytes: u64) -> BTreeMap<u64, String> {
    use erofs::format::{DigestFooter, DIGEST_ENTRY_SIZE, DIGEST_FOOTER_SIZE};
    let bytes = std::fs::read(image).unwrap();
    let end = erofs_bytes as usize;
    let raw: &[u8; DIGEST_FOOTER_SIZE as usize] = bytes[end - DIGEST_FOOTER_SIZE as usize..end]
        .try_into()
        .unwrap();
    let footer = DigestFooter::decode(raw).unwrap().expect("a digest table");
    (0..footer.entries)
        .map(|k| {
            let at = (footer.table_offset + k * DIGEST_ENTRY_SIZE) as usize;
            let nid = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            (nid, hex::encode(&bytes[at + 8..at + 40]))
        })
        .collect()
}

/// `diff -r` that also fails on read errors (EIO from a bad cluster), which
/// `assert_diff_clean` does not see: diff reports them on stderr, with exit status 2.
fn assert_same_tree(a: &Path, b: &Path, what: &str) {
    let out = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: diff -r {} {}: {}{}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The algorithms a `fsck.erofs` decodes, from its `--help` ("Supported algorithms are:
/// lz4hc, lz4" in 1.5; "... the following algorithms: lz4, lz4hc, lzma, ..." later).
fn fsck_algorithms(fsck: &std::ffi::OsStr) -> Vec<String> {
    let out = Command::new(fsck).arg("--help").output().unwrap();
    let help =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    help.lines()
        .filter(|l| l.contains("algorithms"))
        .filter_map(|l| l.rsplit_once(':'))
        .flat_map(|(_, list)| list.split(',').map(|a| a.trim().to_string()))
        .filter(|a| !a.is_empty())
        .collect()
}

fn regular_files(root: &Path) -> Vec<PathBuf> {
    let out = run(Command::new("find").arg(root).args(["-type", "f"]));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect()
}

#[test]
fn every_algorithm_and_cluster_size_mounts_and_verifies() {
    if skip_unless(is_root(), "needs root to mount")
        || skip_unless(have("fsverity"), "needs fsverity (fsverity-utils)")
        || skip_unless(have("fsck.erofs"), "needs fsck.erofs (erofs-utils)")
    {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src);
    let plain = t.path().join("plain.img");
    let plain_json = build_json(&src, &plain, &[], None);
    let plain_bytes = plain_json["erofs_bytes"].as_u64().unwrap();
    let source_xattrs = xattr_dump(&src);
    let random_size = std::fs::metadata(src.join(RANDOM_FILE)).unwrap().len();
    let fsck = std::env::var_os("VERILAY_FSCK_EROFS").unwrap_or("fsck.erofs".into());
    let fsck_algs = fsck_algorithms(&fsck);
    assert!(fsck_algs.iter().any(|a| a == "lz4"), "{fsck_algs:?}");

    for alg in ALGORITHMS {
        for cluster in CLUSTERS {
            let what = format!("-z {alg} -C {cluster}");
            let image = t.path().join(format!("{alg}-{cluster}.img"));
            let j = build_json(&src, &image, &["-z", alg, "-C", cluster], None);
            assert_eq!(j["compression"], alg, "{what}: {j}");
            assert!(j["ratio"].as_f64().unwrap() > 1.0, "{what}: {j}");
            let erofs_bytes = j["erofs_bytes"].as_u64().unwrap();
            assert!(
                erofs_bytes < plain_bytes,
                "{what}: {erofs_bytes} bytes, uncompressed {plain_bytes}"
            );

            // The kernel reads back exactly the source: contents, xattrs.
            let m = Mount::erofs(&image, &t.path().join(format!("m-{alg}-{cluster}")));
            assert_same_tree(&src, &m.dir, &what);
            assert_eq!(source_xattrs, xattr_dump(&m.dir), "{what}: getfattr");
            // Incompressible data stays FLAT (all its blocks); text is compressed.
            let random = std::fs::metadata(m.dir.join(RANDOM_FILE)).unwrap();
            assert_eq!(
                random.blocks() * 512,
                random_size.div_ceil(4096) * 4096,
                "{what}"
            );
            for name in [TEXT_FILE, DENSE] {
                let text = std::fs::metadata(m.dir.join(name)).unwrap();
                assert!(
                    text.blocks() * 512 < text.len() / 2,
                    "{what}: {name} takes {} blocks of 512",
                    text.blocks()
                );
            }
            // (A chunk-based file's st_blocks is its size, so the sparse files' layout is
            // not visible here; their contents are, through diff.)

            // The image digest is fs-verity's over the EROFS part, whose Merkle tree thus
            // covers the compressed bytes as stored.
            let digest = j["digest"].as_str().unwrap();
            let scratch = t.path().join("erofs-part");
            assert_eq!(
                fsverity_of_prefix(&image, erofs_bytes, &scratch),
                digest,
                "{what}"
            );
            // Each file's stored digest is that of its uncompressed contents (the kernel
            // mount's inode numbers are the nids the table is keyed by).
            let table = digest_table(&image, erofs_bytes);
            for f in regular_files(&m.dir) {
                let nid = std::fs::metadata(&f).unwrap().ino();
                let rel = f.strip_prefix(&m.dir).unwrap();
                let theirs = fsverity(&src.join(rel));
                assert_eq!(
                    Some(&theirs),
                    table.get(&nid).map(|h| format!("sha256:{h}")).as_ref(),
                    "{what}: {}",
                    rel.display()
                );
            }
            drop(m);

            // Debian's erofs-utils 1.5 decodes only LZ4 (and LZ4HC, the same format);
            // a newer one (VERILAY_FSCK_EROFS=path, e.g. 1.9) checks every algorithm.
            if fsck_algs.iter().any(|a| a == alg) {
                let out = Command::new(&fsck)
                    .arg("--extract")
                    .arg(&image)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{what}: fsck.erofs: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

#[test]
fn same_bytes_whatever_the_thread_count() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src);
    for alg in ALGORITHMS {
        let mut images = Vec::new();
        for (run_no, threads) in [Some("1"), Some("2"), None].into_iter().enumerate() {
            let image = t.path().join(format!("{alg}-{run_no}.img"));
            build_json(&src, &image, &["-z", alg, "-C", "65536"], threads);
            images.push(std::fs::read(&image).unwrap());
        }
        assert!(images[0] == images[1], "{alg}: 1 vs 2 threads differ");
        assert!(images[0] == images[2], "{alg}: two runs differ");
    }
}

#[test]
fn layer_tarballs_compress_too() {
    let Some((t, src)) = tree_to_mount() else {
        return;
    };
    let tar = t.path().join("layer.tar");
    run(Command::new("tar")
        .args(["--format=posix", "--xattrs", "--xattrs-include=*"])
        .arg("-C")
        .arg(&src)
        .arg("-cf")
        .arg(&tar)
        .arg("."));
    let image = t.path().join("layer.img");
    let j = build_json(&tar, &image, &["-z", "lz4hc", "-C", "16384"], None);
    assert!(j["compressed_files"].as_u64().unwrap() > 10, "{j}");
    let m = Mount::erofs(&image, &t.path().join("m"));
    assert_same_tree(&src, &m.dir, "layer");
    assert_eq!(xattr_dump(&src), xattr_dump(&m.dir));
}

#[test]
fn bad_compression_flags_are_one_line_and_exit_2() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("f"), b"x").unwrap();
    for bad in [
        &["-z", "lz5"][..],
        &["-z", "zstd,99"],
        &["-z", "lz4,3"],
        &["-z", "lz4", "-C", "5000"],
        &["-z", "lz4", "-C", "2097152"],
        &["-z", "lz4", "-C", "0"],
        &["-z", "lz4", "-C", "x"],
        &["-z", "lz4", "-b", "8192", "-C", "4096"],
        &["-C", "65536"],
    ] {
        let out = build_output(t.path(), &t.path().join("img"), bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{bad:?}: {err}");
        assert!(err.starts_with("verilay: error: "), "{bad:?}: {err}");
        assert!(!t.path().join("img").exists());
    }
}

#[test]
fn blocks_smaller_than_a_page_compress_too() {
    let Some((t, src)) = tree_to_mount() else {
        return;
    };
    for (bs, cluster, alg) in [("1024", "1024", "lz4"), ("2048", "16384", "zstd")] {
        let image = t.path().join(format!("{bs}.img"));
        let j = build_json(&src, &image, &["-b", bs, "-z", alg, "-C", cluster], None);
        assert!(j["compressed_files"].as_u64().unwrap() > 10, "{j}");
        let m = Mount::erofs(&image, &t.path().join(format!("m-{bs}")));
        assert_same_tree(&src, &m.dir, &format!("-b {bs} -z {alg} -C {cluster}"));
    }
}

/// verilay's reader on verilay's images: `fsck`, `extract` and `cat`, a read-only mount
/// equal to the kernel's (contents, `ls -lRan`, xattrs), and a writable one whose copy-up
/// of a compressed file keeps every byte, for every algorithm.
#[test]
fn verilay_reads_its_own_images_as_the_kernel_does() {
    if skip_unless(is_root(), "needs root to mount")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
    {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src);
    let text = std::fs::read(src.join(TEXT_FILE)).unwrap();
    for alg in ALGORITHMS {
        let what = format!("-z {alg} -C 65536");
        let image = t.path().join(format!("{alg}.img"));
        build_json(&src, &image, &["-z", alg, "-C", "65536"], None);
        let out = run(verilay().arg("fsck").arg(&image));
        assert!(out.status.success(), "{what}: fsck");
        let x = t.path().join(format!("x-{alg}"));
        run(verilay().arg("extract").arg(&image).arg(&x));
        assert_same_tree(&src, &x, &format!("{what}: extract"));
        let cat = run(verilay()
            .arg("cat")
            .arg(&image)
            .arg(format!("/{TEXT_FILE}")));
        assert!(cat.stdout == text, "{what}: cat differs");

        let kernel = Mount::erofs(&image, &t.path().join(format!("k-{alg}")));
        let mnt = t.path().join(format!("m-{alg}"));
        std::fs::create_dir_all(&mnt).unwrap();
        run(verilay().args(["mount", "-q"]).arg(&image).arg(&mnt));
        let fuse = Unmount::fuse(&mnt);
        assert_same_tree(&kernel.dir, &mnt, &what);
        assert_eq!(ls_lr(&kernel.dir), ls_lr(&mnt), "{what}: ls -lRan differs");
        assert_eq!(xattr_dump(&kernel.dir), xattr_dump(&mnt), "{what}: xattrs");
        drop(fuse);

        // Copy-up: a write into the middle of a compressed file keeps the rest.
        let d = dirs(t.path(), &format!("rw-{alg}"));
        let rw = t.path().join(format!("rw-mnt-{alg}"));
        let fuse = verilay_mount(&image, &d, &rw);
        let mut want = text.clone();
        want[100_000..100_005].copy_from_slice(b"HELLO");
        {
            use std::io::{Seek, Write};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(rw.join(TEXT_FILE))
                .unwrap();
            f.seek(std::io::SeekFrom::Start(100_000)).unwrap();
            f.write_all(b"HELLO").unwrap();
        }
        assert!(
            std::fs::read(rw.join(TEXT_FILE)).unwrap() == want,
            "{what}: copy-up"
        );
        drop(fuse);
        assert!(
            std::fs::read(d.upper.join(TEXT_FILE)).unwrap() == want,
            "{what}: the upper copy"
        );
    }
}
