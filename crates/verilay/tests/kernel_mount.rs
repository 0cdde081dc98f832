//! Images built by `verilay build`, mounted by the Linux kernel (`mount -t erofs`) and
//! compared with their source using independent tools: diff, getfattr, getfacl, fsck.erofs.

mod common;
use common::*;
use std::path::Path;

fn prerequisites() -> bool {
    !skip_unless(is_root(), "kernel mounts need root")
        && !skip_unless(
            have("getfattr") && have("getfacl") && have("setfacl"),
            "attr/acl tools missing",
        )
        && !skip_unless(have("fsck.erofs"), "fsck.erofs (erofs-utils) missing")
}

/// Builds `src`, mounts the image with the kernel and checks everything against `src`.
fn roundtrip(src: &Path, work: &Path, extra: &[&str]) {
    let image = work.join("image.erofs");
    build(src, &image, extra);
    fsck_erofs(src, &image, work, extra);
    let mnt = Mount::erofs(&image, &work.join("mnt"));
    assert_diff_clean(src, &mnt.dir);
    assert_same_stats(src, &mnt.dir);
    assert_eq!(
        xattr_dump(src),
        xattr_dump(&mnt.dir),
        "getfattr -R -d -m - differs"
    );
    assert_eq!(acl_dump(src), acl_dump(&mnt.dir), "getfacl -R differs");
    drop(mnt);

    // Our own reader agrees: fsck is clean and extract writes the same tree back.
    run(verilay().arg("fsck").arg(&image));
    let out = work.join("extracted");
    run(verilay()
        .arg("extract")
        .arg(&image)
        .arg(&out)
        .arg("--quiet"));
    assert_diff_clean(src, &out);
    assert_same_stats(src, &out);
    assert_eq!(
        xattr_dump(src),
        xattr_dump(&out),
        "getfattr of the extracted tree differs"
    );
    assert_eq!(
        acl_dump(src),
        acl_dump(&out),
        "getfacl of the extracted tree differs"
    );
}

/// `fsck.erofs` must find the image clean. Debian's erofs-utils 1.5 predates long xattr
/// prefixes (kernel 6.4) and sub-page block sizes, so with it the same tree is also built
/// without those features and checked. A newer fsck.erofs is used when one is installed
/// (`$FSCK_EROFS`, or `fsck.erofs-1.9` on PATH): it checks the image exactly as built.
fn fsck_erofs(src: &Path, image: &Path, work: &Path, extra: &[&str]) {
    let tools: Vec<String> = std::env::var("FSCK_EROFS")
        .ok()
        .into_iter()
        .chain(["fsck.erofs-1.9".to_string(), "fsck.erofs".to_string()])
        .filter(|t| have(t))
        .collect();
    let tool = tools.first().expect("fsck.erofs is a test prerequisite");
    let out = std::process::Command::new(tool).arg("-V").output().unwrap();
    let version = String::from_utf8_lossy(&[out.stdout, out.stderr].concat())
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .unwrap_or("0")
        .to_string();
    let modern = version
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0))
        .collect::<Vec<_>>()
        >= vec![1, 7];
    let small_blocks = extra
        .windows(2)
        .any(|w| w[0] == "--block-size" && w[1] != "4096");
    if modern {
        run(std::process::Command::new(tool).arg(image));
    } else if !small_blocks {
        let compat = work.join("compat.erofs");
        let mut args = extra.to_vec();
        if !args.contains(&"--no-long-prefixes") {
            args.push("--no-long-prefixes");
        }
        build(src, &compat, &args);
        run(std::process::Command::new(tool).arg(&compat));
    }
}

#[test]
fn generated_tree_roundtrips_through_the_kernel() {
    if !prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = generated_src(t.path());
    roundtrip(&src, t.path(), &[]);
}

#[test]
fn small_block_sizes_and_options_mount() {
    if !prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = generated_src(t.path());
    for (i, extra) in [
        &["--block-size", "1024"][..],
        &["--block-size", "512", "--no-inline-data"],
        &["--no-xattr-filter", "--no-long-prefixes"],
    ]
    .iter()
    .enumerate()
    {
        let work = t.path().join(format!("w{i}"));
        std::fs::create_dir_all(&work).unwrap();
        roundtrip(&src, &work, extra);
    }
}

#[test]
fn real_tree_from_usr_roundtrips() {
    if !prerequisites() {
        return;
    }
    // /usr/include: tens of thousands of real files, symlinks and directories.
    let src = Path::new("/usr/include");
    let files = walk_count(src);
    assert!(files > 3000, "/usr/include has only {files} entries");
    let t = tempfile::tempdir().unwrap();
    roundtrip(src, t.path(), &[]);
}

/// Hundreds of small directories (entries inline with their inodes) are an honest image:
/// `verilay fsck` and `extract` used to charge each a whole block of their work budget
/// and gave up at ~300 ("work limit exceeded") while fsck.erofs and the kernel accept it.
#[test]
fn many_small_directories_pass_fsck_and_extract() {
    if !prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    for i in 0..400 {
        std::fs::create_dir_all(src.join(format!("flat/d{i:04}"))).unwrap();
    }
    let mut deep = src.join("deep");
    for _ in 0..300 {
        deep.push("d");
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("leaf"), "bottom\n").unwrap();
    roundtrip(&src, t.path(), &[]);
}

/// Each directory's entries in name order, then each subdirectory's the same way (depth
/// first): the order the image is laid out in.
fn grouped_walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
    let paths: Vec<_> = names.iter().map(|n| dir.join(n)).collect();
    out.extend(paths.iter().cloned());
    for p in paths {
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            grouped_walk(&p, out);
        }
    }
}

/// The first block of `file`'s first extent (`filefrag -e`: `   0:   0..   2:   48075..`).
fn first_block(file: &Path) -> u64 {
    let out = run(std::process::Command::new("filefrag").arg("-e").arg(file));
    let out = String::from_utf8(out.stdout).unwrap();
    let first = out
        .lines()
        .find(|l| l.trim_start().starts_with("0:"))
        .unwrap_or_else(|| panic!("filefrag of {}: {out}", file.display()));
    first
        .split(':')
        .nth(2)
        .unwrap()
        .split("..")
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The image keeps a directory's entries together and its subtrees after them, depth
/// first: in that order the kernel's inode numbers (nids) never step back further than the
/// inode placement looks back for room (16 blocks), and the files' data blocks
/// (`filefrag`) only go forward. Lookups in one directory read neighbouring inodes, and a
/// walk of the tree goes forward through the image.
#[test]
fn directories_lie_together_and_a_walk_reads_the_image_forward() {
    if !prerequisites() || skip_unless(have("filefrag"), "filefrag (e2fsprogs) missing") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let image = t.path().join("image.erofs");
    build(Path::new("/usr/include"), &image, &["--quiet"]);
    let mnt = Mount::erofs(&image, &t.path().join("mnt"));
    let mut walk = Vec::new();
    grouped_walk(&mnt.dir, &mut walk);
    let (mut highest, mut last_block, mut files) = (0u64, 0u64, 0);
    for path in &walk {
        use std::os::unix::fs::MetadataExt;
        let st = std::fs::symlink_metadata(path).unwrap();
        let nid = st.ino();
        assert!(
            nid + 16 * 4096 / 32 > highest,
            "{}: nid {nid} is more than 16 blocks behind nid {highest} met before it",
            path.display()
        );
        highest = highest.max(nid);
        if !st.is_file() || st.len() < 4096 {
            continue;
        }
        let block = first_block(path);
        assert!(
            block > last_block,
            "{}: data at block {block}, before the previous file's {last_block}",
            path.display()
        );
        last_block = block;
        files += 1;
    }
    assert!(
        files > 1000,
        "only {files} files with data blocks in /usr/include"
    );
}

fn walk_count(p: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            n += 1;
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    n
}

#[test]
fn ownership_time_uuid_and_label_options() {
    if !prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = generated_src(t.path());
    let image = t.path().join("img");
    build(
        &src,
        &image,
        &[
            "--all-root",
            "--mtime",
            "1234567890.5",
            "--uuid",
            "01234567-89ab-cdef-0123-456789abcdef",
            "--label",
            "rootfs",
        ],
    );
    let mnt = Mount::erofs(&image, &t.path().join("mnt"));
    for (path, rec) in stat_tree(&mnt.dir) {
        assert_eq!((rec.uid, rec.gid), (0, 0), "{path}");
        assert_eq!(
            (rec.mtime, rec.mtime_nsec),
            (1234567890, 500_000_000),
            "{path}"
        );
    }
    // blkid (util-linux) reads EROFS superblocks: an independent reader of uuid and label.
    let blkid = run(std::process::Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(&image));
    let info = String::from_utf8_lossy(&blkid.stdout);
    assert!(
        info.contains("UUID=01234567-89ab-cdef-0123-456789abcdef"),
        "{info}"
    );
    assert!(info.contains("LABEL=rootfs"), "{info}");
    // Exclusions: a path and a regex.
    let image2 = t.path().join("img2");
    build(
        &src,
        &image2,
        &[
            "--exclude-path",
            "many",
            "--exclude-regex",
            "^sizes/f1[0-9]*$",
        ],
    );
    let mnt2 = Mount::erofs(&image2, &t.path().join("mnt2"));
    assert!(!mnt2.dir.join("many").exists());
    assert!(!mnt2.dir.join("sizes/f1000").exists());
    assert!(mnt2.dir.join("sizes/f4096").exists());
}

/// The kernel verifies the superblock crc at mount (`erofs_superblock_csum_verify`) over
/// the rest of the superblock's block, whose size varies: every block size's image claims
/// SB_CHKSUM and mounts; with one byte of the covered area changed it is refused (so the
/// kernel really checked), and re-sealed with `superblock_checksum` it mounts again.
#[test]
fn the_kernel_accepts_the_superblock_crc_at_every_block_size() {
    if !prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), b"crc").unwrap();
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounts = |image: &Path| {
        let ok = std::process::Command::new("mount")
            .args(["-t", "erofs", "-o", "ro"])
            .arg(image)
            .arg(&mnt)
            .status()
            .unwrap()
            .success();
        if ok {
            assert_eq!(std::fs::read(mnt.join("d/f")).unwrap(), b"crc");
            run(std::process::Command::new("umount").arg(&mnt));
        }
        ok
    };
    for bs in [4096usize, 2048, 1024, 512] {
        let image = t.path().join(format!("img{bs}"));
        build(&src, &image, &["--block-size", &bs.to_string()]);
        let mut bytes = std::fs::read(&image).unwrap();
        let compat = u32::from_le_bytes(bytes[1032..1036].try_into().unwrap());
        assert_ne!(
            compat & 1,
            0,
            "bs {bs}: no SB_CHKSUM, the kernel would not check"
        );
        assert!(mounts(&image), "bs {bs}: the kernel refuses the image");
        // The volume name, inside the covered area whatever the block size.
        bytes[1024 + 0x40] ^= 0x5a;
        std::fs::write(&image, &bytes).unwrap();
        assert!(!mounts(&image), "bs {bs}: a changed superblock mounts");
        let crc = erofs::format::superblock_checksum(&bytes, bs).unwrap();
        bytes[1028..1032].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&image, &bytes).unwrap();
        assert!(
            mounts(&image),
            "bs {bs}: the kernel refuses the re-sealed image"
        );
    }
}

/// The kernel trusts the xattr name filter: a wrong bit makes it answer ENODATA for an
/// xattr that exists. Ask the kernel for every present name one by one (64 names spread
/// over every filter bit and namespace), and check that absent names are flagged.
#[test]
fn kernel_honours_the_xattr_name_filter() {
    if !prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let names: Vec<String> = (0..64)
        .map(|i| match i % 3 {
            0 => format!("user.attr{i}"),
            1 => format!("trusted.overlay.x{i}"),
            _ => format!("security.label{i}"),
        })
        .collect();
    // Every fourth name has one value on all its files: those pairs go to the shared pool.
    let value = |f: usize, i: usize| {
        if i.is_multiple_of(4) {
            format!("same{i}")
        } else {
            format!("v{f}_{i}")
        }
    };
    let mut script = format!("cd '{}'", src.display());
    for f in 0..64usize {
        script += &format!(" && touch f{f}");
        for (i, n) in names.iter().enumerate() {
            if (f * 7 + i * 3) % 11 < 3 {
                script += &format!(" && setfattr -n {n} -v {} f{f}", value(f, i));
            }
        }
    }
    sh(&script);
    let image = t.path().join("img");
    build(&src, &image, &[]);
    let mnt = Mount::erofs(&image, &t.path().join("mnt"));
    let img = erofs::read::Image::open(erofs::read::FileSource::open(&image).unwrap()).unwrap();
    let root = img.inode(img.root_nid()).unwrap();
    let (mut present, mut absent, mut flagged) = (0, 0, 0);
    for f in 0..64usize {
        let ino = img
            .inode(
                img.lookup(&root, format!("f{f}").as_bytes())
                    .unwrap()
                    .unwrap()
                    .nid,
            )
            .unwrap();
        for (i, n) in names.iter().enumerate() {
            let out = std::process::Command::new("getfattr")
                .args(["--only-values", "-n", n])
                .arg(mnt.dir.join(format!("f{f}")))
                .output()
                .unwrap();
            if (f * 7 + i * 3) % 11 < 3 {
                present += 1;
                assert!(
                    out.status.success(),
                    "kernel hides f{f} {n}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(String::from_utf8_lossy(&out.stdout), value(f, i));
                assert!(!img.xattr_filter_says_absent(&ino, n.as_bytes()));
            } else {
                absent += 1;
                assert!(!out.status.success(), "f{f} {n} should be absent");
                flagged += img.xattr_filter_says_absent(&ino, n.as_bytes()) as usize;
            }
        }
    }
    assert!(
        present > 1000 && absent > 2000,
        "{present} present, {absent} absent"
    );
    // ~17 names per inode leave several of the 32 bits set: a real share must be flagged.
    assert!(
        flagged * 10 >= absent,
        "only {flagged} of {absent} absent names flagged"
    );
    eprintln!(
        "filter: {present} present names all served; {flagged} of {absent} absent names flagged"
    );
}
