//! Hostile compressed images (issue 23): a real mkfs.erofs image with its map header,
//! lcluster indexes, compression configs or cluster bytes patched, then sealed again, so
//! verity vouches for the bytes and only the reader's checks stand between them and a
//! panic, a hang or a huge allocation. Every command must end soon, within a memory
//! limit, with a one-line error naming the file (or the superblock) and an offset.

use crate::common::{have, is_root, mkfs_erofs, run, skip_unless, verilay, xorshift};
use crate::Seed;
use erofs::format;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BS: usize = 4096;
/// Address-space limit for every command on a hostile image (KiB for `ulimit -v`): far
/// below what a claimed 12 MiB-per-cluster loop or a 2^40-byte file would take.
const MEMORY_KIB: u64 = 1 << 20;

/// Hostile inputs of this module for the fuzz targets (the EROFS bytes, unsealed: the
/// `read_image` target opens them as they are).
pub fn seeds(tmp: &Path) -> Vec<Seed> {
    if !have("mkfs.erofs") {
        return Vec::new();
    }
    let dir = tmp.join("compressed-seeds");
    cases(&dir)
        .into_iter()
        .map(|c| Seed {
            target: "read_image",
            name: format!("compressed-{}", c.name),
            bytes: c.raw,
        })
        .collect()
}

/// The small tree the images hold: a text file spanning many clusters, a random one
/// (stored uncompressed), a one-cluster file.
fn tree(src: &Path) {
    std::fs::create_dir_all(src).unwrap();
    let mut text = Vec::new();
    let mut i = 0u64;
    while text.len() < 200_000 {
        text.extend_from_slice(format!("row {i}: {} lazy dogs\n", i * 31 % 977).as_bytes());
        i += 1;
    }
    std::fs::write(src.join("text"), &text).unwrap();
    let rand = xorshift::xorshift(20_000, 0x2545F4914F6CDD1D);
    std::fs::write(src.join("rand"), rand).unwrap();
    std::fs::write(src.join("small"), &text[..5000]).unwrap();
}

/// Image kinds: full indexes with 16 KiB clusters, compact indexes with 16 KiB clusters,
/// and compact with an inline (ztailpacking) tail.
const KINDS: &[(&str, &[&str])] = &[
    ("full", &["-zlz4hc", "-C16384", "-Elegacy-compress"]),
    ("compact", &["-zlz4hc", "-C16384"]),
    ("tail", &["-zlz4", "-Eztailpacking"]),
];

fn mkfs(src: &Path, out: &Path, args: &[&str]) -> Vec<u8> {
    mkfs_erofs(args, out, src);
    std::fs::read(out).unwrap()
}

/// Where things of `/text` are in a plain image.
struct Layout {
    map_header: usize,
    /// First cluster: (byte offset, stored bytes).
    cluster: (usize, usize),
    inode: usize,
}

fn layout(raw: &[u8], path: &str) -> Layout {
    let img = erofs::read::Image::open(raw.to_vec()).unwrap();
    let root = img.inode(img.root_nid()).unwrap();
    let ent = img.lookup(&root, path.as_bytes()).unwrap().unwrap();
    let ino = img.inode(ent.nid).unwrap();
    let z = img.layout_info(&ino).compressed.expect("a compressed file");
    let (at, len) = match img.zmap(&ino, 0).unwrap().stored {
        erofs::read::ZStored::Cluster { at, len, .. } => (at as usize, len as usize),
        other => panic!("{other:?}"),
    };
    Layout {
        map_header: z.map_header as usize,
        cluster: (at, len),
        inode: ino.offset() as usize,
    }
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Superblock edits must keep its crc32c right, or the checksum is all that is tested.
fn fix_sb_checksum(b: &mut [u8]) {
    let crc = format::superblock_checksum(b, BS).unwrap();
    b[1028..1032].copy_from_slice(&crc.to_le_bytes());
}

/// One hostile image: the EROFS bytes, the sealed file, and what the error must say.
struct Case {
    name: &'static str,
    raw: Vec<u8>,
    expect: &'static str,
    /// The path whose read fails (the others of the image still read).
    path: &'static str,
    /// A file offset whose read must fail (the patched lcluster's).
    read_at: u64,
}

type Patch = fn(&mut Vec<u8>, &Layout);

/// (name, image kind, patch, the phrase the error must contain). Reads at offset 0 fail,
/// except where the name says which lcluster (4 KiB) is patched: `@N`.
const PATCHES: &[(&str, &str, Patch, &str)] = &[
    // Map header.
    (
        "lcluster-bits-15",
        "compact",
        |b, l| b[l.map_header + 7] = 15,
        "compact lcluster",
    ),
    (
        "algorithm-not-in-superblock",
        "compact",
        |b, l| b[l.map_header + 6] = 0x33,
        "not among the image's",
    ),
    (
        "big-pcluster-head1-only",
        "compact",
        |b, l| {
            let at = l.map_header + 4;
            let adv = u16::from_le_bytes([b[at], b[at + 1]]) & !0x4;
            put16(b, at, adv | 0x2);
        },
        "HEAD1/HEAD2 differing",
    ),
    (
        "fragment-without-feature",
        "compact",
        |b, l| b[l.map_header + 7] |= 0x80,
        "fragment without the superblock feature",
    ),
    (
        "inline-tail-crossing-a-block@48",
        "tail",
        |b, l| put16(b, l.map_header + 2, 0xFFFF),
        "crosses a block",
    ),
    // Full indexes: lcluster 0 is HEAD1, 1 the CBLKCNT NONHEAD, 2.. NONHEAD.
    (
        "cluster-offset-past-lcluster",
        "full",
        |b, l| put16(b, l.map_header + 16 + 2, 0xF000),
        "past the lcluster size",
    ),
    (
        "cluster-past-the-image",
        "full",
        |b, l| put32(b, l.map_header + 16 + 4, 0x00FF_FFFF),
        "past the end of the image",
    ),
    (
        "cluster-over-1-mib",
        "full",
        |b, l| put16(b, l.map_header + 16 + 8 + 4, 0x0800 | 0x7FF),
        "more than the limit",
    ),
    (
        "lookback-of-zero@3",
        "full",
        |b, l| put32(b, l.map_header + 16 + 3 * 8 + 4, 0x0001_0000),
        "bad lookback distance",
    ),
    (
        "lookback-past-lcluster-0@3",
        "full",
        |b, l| put32(b, l.map_header + 16 + 3 * 8 + 4, 0x0001_0100),
        "bad lookback distance",
    ),
    (
        "no-head-at-all",
        "full",
        |b, l| {
            // Every index NONHEAD, each pointing one back: the walk must stop on its own.
            for i in 0..49 {
                let at = l.map_header + 16 + 8 * i;
                put16(b, at, 2);
                put32(b, at + 4, 0x0001_0001);
            }
        },
        "bad lookback distance",
    ),
    (
        "huge-size@60",
        "compact",
        // A compact inode's 32-bit size at +8: 4 GiB over a 200 KB index array.
        |b, l| put32(b, l.inode + 8, u32::MAX),
        "corrupt image",
    ),
    // Cluster bytes.
    (
        "cluster-garbage",
        "compact",
        |b, l| {
            let (at, len) = l.cluster;
            for (i, x) in b[at + len / 2..at + len].iter_mut().enumerate() {
                *x = (i * 131 % 251) as u8 | 1;
            }
        },
        "does not decode",
    ),
    (
        "cluster-all-zeros",
        "compact",
        |b, l| {
            let (at, len) = l.cluster;
            b[at..at + len].fill(0);
        },
        "all zeros",
    ),
    // Superblock configs (checksum kept right).
    (
        "lz4-clusters-over-1-mib",
        "compact",
        |b, _| {
            // The LZ4 record after the 128-byte superblock: le16 size, max_distance, max_pclusterblks.
            put16(b, 1024 + 128 + 4, 1000);
            fix_sb_checksum(b);
        },
        "exceed the 1 MiB limit",
    ),
    (
        "config-record-too-short",
        "compact",
        |b, _| {
            put16(b, 1024 + 128, 2);
            fix_sb_checksum(b);
        },
        "expected 14",
    ),
    (
        "unknown-algorithm-bit",
        "compact",
        |b, _| {
            put16(b, 1024 + 0x54, 0x21);
            fix_sb_checksum(b);
        },
        "unknown compression algorithms",
    ),
];

/// Every hostile image, made in `dir`.
fn cases(dir: &Path) -> Vec<Case> {
    std::fs::create_dir_all(dir).unwrap();
    let src = dir.join("src");
    tree(&src);
    let mut out = Vec::new();
    for &(kind, args) in KINDS {
        let base = mkfs(&src, &dir.join(format!("{kind}.erofs")), args);
        let l = layout(&base, "text");
        for &(name, k, patch, expect) in PATCHES {
            if k != kind {
                continue;
            }
            let mut raw = base.clone();
            patch(&mut raw, &l);
            // mkfs puts the inodes in block 0, which the superblock's crc32c covers.
            fix_sb_checksum(&mut raw);
            let read_at = name
                .split_once('@')
                .map_or(0, |(_, n)| n.parse::<u64>().unwrap() * 4096);
            out.push(Case {
                name,
                raw,
                expect,
                path: "/text",
                read_at,
            });
        }
    }
    out
}

/// Runs verilay on a hostile image with a memory limit and a time limit.
fn bounded(args: &[&str], image: &Path) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -v {MEMORY_KIB}; exec timeout 60 \"$0\" \"$@\""
        ))
        .arg(verilay().get_program());
    for (k, v) in verilay().get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    let mut full: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    full.insert(1, image.into());
    cmd.args(full).output().unwrap()
}

/// The case sealed, or (a superblock the reader refuses) `seal`'s failure.
fn sealed(dir: &Path, c: &Case) -> Result<PathBuf, Output> {
    let image = dir.join(format!("{}.img", c.name));
    std::fs::write(&image, &c.raw).unwrap();
    let out = bounded(&["seal", "--quiet"], &image);
    if out.status.success() {
        Ok(image)
    } else {
        Err(out)
    }
}

/// Superblock cases: the image does not open at all.
fn refused_at_open(c: &Case) -> bool {
    ["1 MiB limit", "expected 14", "unknown compression"]
        .iter()
        .any(|p| c.expect.contains(p))
}

/// Checks a failed command's output: one line saying `expect`, an offset, no panic.
fn assert_clear_error(c: &Case, what: &str, out: &Output) {
    // fsck prints its problems on stdout, the commands their error on stderr.
    let mut err = String::from_utf8_lossy(&out.stderr).into_owned();
    if what == "fsck" {
        err += &String::from_utf8_lossy(&out.stdout);
    }
    let code = out.status.code();
    assert!(
        code.is_some() && code != Some(0) && code != Some(124),
        "{}: {what} exited {:?} (124: timed out):\n{err}",
        c.name,
        out.status
    );
    assert!(
        !err.contains("panicked"),
        "{}: {what} panicked:\n{err}",
        c.name
    );
    let line = err
        .lines()
        .find(|l| l.contains(c.expect))
        .unwrap_or_else(|| {
            panic!(
                "{}: {what} ({:?}) does not say {:?}:\n{err}",
                c.name, out.status, c.expect,
            )
        });
    assert!(
        line.contains("at byte "),
        "{}: {what}: no offset in {line:?}",
        c.name
    );
}

#[test]
fn hostile_indexes_are_clear_errors() {
    if skip_unless(have("mkfs.erofs"), "mkfs.erofs (erofs-utils) missing") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for c in cases(tmp.path()) {
        let image = match sealed(tmp.path(), &c) {
            Ok(image) => image,
            Err(out) => {
                // `seal` opens the image first: a superblock it refuses is refused there.
                assert!(refused_at_open(&c), "{}: seal failed", c.name);
                assert_clear_error(&c, "seal", &out);
                continue;
            }
        };
        assert!(!refused_at_open(&c), "{}: sealed", c.name);
        let fsck = bounded(&["fsck"], &image);
        assert_clear_error(&c, "fsck", &fsck);
        let cat = bounded(&["cat", "--", c.path], &image);
        if c.read_at == 0 {
            assert_clear_error(&c, "cat", &cat);
        } else {
            // cat reads from 0 and may never map the patched lcluster: it must only end.
            assert!(
                cat.status.code().is_some_and(|c| c != 124),
                "{}: cat",
                c.name
            );
            assert!(
                !String::from_utf8_lossy(&cat.stderr).contains("panicked"),
                "{}",
                c.name
            );
        }
        assert!(
            cat.stdout.len() <= 1 << 20,
            "{}: cat printed {} bytes",
            c.name,
            cat.stdout.len()
        );
        // The image's other files are untouched and still read.
        let small = bounded(&["cat", "/small"], &image);
        assert!(
            small.status.success(),
            "{}: /small: {}",
            c.name,
            String::from_utf8_lossy(&small.stderr)
        );
        assert_eq!(small.stdout.len(), 5000, "{}", c.name);
        // fsck names the file.
        assert!(
            String::from_utf8_lossy(&fsck.stdout).contains("/text: "),
            "{}: {}",
            c.name,
            String::from_utf8_lossy(&fsck.stdout)
        );
    }
}

/// Through a mount, a hostile index is an error on the read (EUCLEAN, EIO or EOPNOTSUPP),
/// the mount stays up, and the other files still read.
#[test]
fn hostile_indexes_through_a_mount() {
    if skip_unless(have("mkfs.erofs"), "mkfs.erofs (erofs-utils) missing")
        || skip_unless(is_root(), "mounting needs root here")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for c in cases(tmp.path()) {
        if refused_at_open(&c) {
            continue; // refused by seal, above
        }
        let image = sealed(tmp.path(), &c).unwrap();
        let mnt = tmp.path().join(format!("{}-mnt", c.name));
        std::fs::create_dir_all(&mnt).unwrap();
        run(verilay().arg("mount").arg("-q").arg(&image).arg(&mnt));
        let _u = crate::common::Unmount::fuse(&mnt);
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(mnt.join("text")).unwrap();
        let mut buf = vec![0u8; 8192];
        let Err(e) = f.read_at(&mut buf, c.read_at) else {
            panic!("{}: read at {} succeeded", c.name, c.read_at);
        };
        let errno = e.raw_os_error();
        assert!(
            matches!(errno, Some(5) | Some(117) | Some(95)),
            "{}: {e}",
            c.name
        );
        assert_eq!(
            std::fs::read(mnt.join("small")).unwrap().len(),
            5000,
            "{}",
            c.name
        );
    }
}
