//! The importer on hostile and odd layer tarballs, in this process: every refused case
//! names its byte offset, every cut of a layer fails, and where GNU tar, Python's
//! tarfile and Go's archive/tar read a header alike the importer reads it so too (GNU tar
//! and Python as oracles; docs/SECURITY.md section 4).

mod cases;
#[path = "../../erofs/tests/common/skip.rs"]
mod skip;

use cases::*;
use erofs::builder::{Kind, Node, Tree};
use skip::skip_unless;
use std::path::Path;
use std::process::Command;

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn sh(script: &str) {
    run(Command::new("sh").arg("-c").arg(script));
}

#[test]
fn each_hostile_tarball_is_refused_naming_its_offset() {
    for (name, bytes, expect) in all_cases() {
        let e = import(&bytes).map(drop).expect_err(name);
        assert!(e.contains(expect), "{name}: expected {expect:?} in: {e}");
        assert!(e.starts_with("layer.tar: "), "{name}: {e}");
        assert_eq!(e.lines().count(), 1, "{name}: {e}");
    }
}

/// Numbers as other tar writers write them: Python's tarfile (GNU base-256 and PAX
/// records) and GNU tar, read by the importer.
#[test]
fn other_writers_numbers_are_read_as_written() {
    if skip_unless(have("python3"), "python3 missing") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let script = r#"
import io, sys, tarfile
for fmt, name in [(tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax")]:
    t = tarfile.open(sys.argv[1] + "/" + name + ".tar", "w", format=fmt)
    i = tarfile.TarInfo("f"); i.uid = 3000000; i.gid = 4294967294; i.mode = 0o4755
    i.mtime = -2 if fmt == tarfile.GNU_FORMAT else -1.5
    i.size = 3; t.addfile(i, io.BytesIO(b"abc"))
    i = tarfile.TarInfo("d" * 120 + "/long"); i.size = 1; t.addfile(i, io.BytesIO(b"L"))
    t.close()
"#;
    run(Command::new("python3").arg("-c").arg(script).arg(t.path()));
    for (name, mtime) in [("gnu", (-2, 0)), ("pax", (-2, 500_000_000))] {
        let tree = import(&std::fs::read(t.path().join(format!("{name}.tar"))).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let f = lookup(&tree, "f").unwrap();
        assert_eq!(
            (f.uid, f.gid, f.perm),
            (3_000_000, 4_294_967_294, 0o4755),
            "{name}"
        );
        assert_eq!((f.mtime, f.mtime_nsec), mtime, "{name}");
        assert!(
            lookup(&tree, &format!("{}/long", "d".repeat(120))).is_some(),
            "{name}"
        );
    }
    // GNU tar: base-256 ids in its own format, PAX records in POSIX's.
    std::fs::write(t.path().join("f"), "x").unwrap();
    for format in ["gnu", "posix"] {
        let tar = t.path().join(format!("gnutar-{format}.tar"));
        run(Command::new("tar")
            .arg(format!("--format={format}"))
            .args(["--owner=:3000000", "--group=:4294967294", "--mode=4755"])
            .arg("-C")
            .arg(t.path())
            .arg("-cf")
            .arg(&tar)
            .arg("f"));
        let tree =
            import(&std::fs::read(&tar).unwrap()).unwrap_or_else(|e| panic!("{format}: {e}"));
        let f = lookup(&tree, "f").unwrap();
        assert_eq!(
            (f.uid, f.gid, f.perm),
            (3_000_000, 4_294_967_294, 0o4755),
            "{format}"
        );
    }
}

#[test]
fn every_cut_of_a_layer_fails_naming_an_offset() {
    let (full, end, _) = two_hundred_files();
    let count = |tree: &Tree| tree.children(lookup_id(tree, "dir")).len();
    assert_eq!(count(&import(&full).unwrap()), 200);
    let mut cuts: Vec<usize> = (0..2 * BLOCK).collect();
    for b in (0..full.len()).step_by(BLOCK) {
        cuts.extend([b, b + 1, b + 100, b + 511]);
    }
    cuts.retain(|&c| c <= full.len());
    let mut failed = 0;
    for cut in cuts {
        match import(&full[..cut]) {
            Ok(tree) => {
                assert!(cut >= end, "cut at {cut} (of {}) gave a tree", full.len());
                assert_eq!(count(&tree), 200, "cut at {cut}");
            }
            Err(e) => {
                assert!(cut < end, "cut at {cut} after the end marker failed: {e}");
                assert!(e.starts_with("layer.tar: "), "{e}");
                assert!(e.contains("at byte "), "cut at {cut}: {e}");
                failed += 1;
            }
        }
    }
    assert!(failed > 1000, "{failed}");
}

/// Compressed layers cut anywhere, or with a flipped byte, fail and say so; the offset
/// is the uncompressed one.
#[test]
fn every_cut_of_a_compressed_layer_fails() {
    if skip_unless(have("gzip") && have("zstd"), "gzip and zstd") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let tar = t.path().join("l.tar");
    std::fs::write(&tar, two_hundred_files().0).unwrap();
    sh(&format!(
        "cd {} && gzip -k l.tar && zstd -q l.tar -o l.tar.zst",
        t.path().display()
    ));
    for (name, codec) in [("l.tar.gz", "gzip"), ("l.tar.zst", "zstd")] {
        let full = std::fs::read(t.path().join(name)).unwrap();
        assert!(import(&full).is_ok(), "{name}");
        let step = (full.len() / 500).max(1);
        let mut cuts: Vec<usize> = (0..full.len()).step_by(step).collect();
        cuts.extend(full.len() - 20..full.len());
        for cut in cuts {
            let e = import(&full[..cut]).expect_err(&format!("{name} cut at {cut}"));
            assert!(e.contains("at byte "), "{name} cut at {cut}: {e}");
        }
        // The report's case: a cut compressed layer names its codec.
        let cut = &full[..full.len() / 2];
        let e = import(cut).unwrap_err();
        assert!(e.contains(&format!("reading the {codec} stream")), "{e}");
        let mut garbage = full.clone();
        garbage.extend_from_slice(b"garbage");
        let e = import(&garbage).unwrap_err();
        assert!(
            e.contains(&format!("{codec} stream")),
            "{name} + garbage: {e}"
        );
    }
}

#[test]
fn accepted_oddities_keep_their_meaning() {
    // A V7 header (no magic) with a NUL type and a trailing slash is a directory.
    let mut v7 = Hdr::new("old/", 0).raw(257, &[0; 8]);
    v7 = v7.mode(0o755);
    let tree = import(&Tar::default().header(v7).file("old/f", b"x").end()).unwrap();
    assert!(lookup(&tree, "old").unwrap().is_dir());
    // Absolute and dotted paths land under the root, as GNU tar and containerd put them.
    let tree = import(&Tar::default().file("/./abs//f", b"x").end()).unwrap();
    assert_eq!(names(&tree, "abs"), ["f"]);
    // A symlink replaced by a directory entry is a directory (GNU tar, containerd).
    let tree = import(
        &Tar::default()
            .symlink("a", "/etc")
            .dir("a")
            .file("a/f", b"x")
            .end(),
    )
    .unwrap();
    assert!(matches!(
        lookup(&tree, "a").unwrap().kind,
        Kind::Directory { .. }
    ));
    // A later PAX record of the same key wins (an empty one is refused: Go keeps the
    // header's value, Python reads 0).
    let tree = import(
        &Tar::default()
            .pax(&[("uid", b"1"), ("uid", b"2")])
            .entry(Hdr::new("f", b'0').octal(116, 8, 7), b"x")
            .end(),
    )
    .unwrap();
    let f = lookup(&tree, "f").unwrap();
    assert_eq!((f.uid, f.gid), (2, 7));
    // Symlinks are 0777 whatever their header says.
    let tree = import(
        &Tar::default()
            .header(Hdr::new("l", b'2').link("t").mode(0o600))
            .end(),
    )
    .unwrap();
    assert_eq!(lookup(&tree, "l").unwrap().perm, 0o777);
    // An empty directory replaced by a file is the file (every reader replaces it).
    let tree = import(&Tar::default().dir("d").file("d", b"f").end()).unwrap();
    assert!(matches!(
        lookup(&tree, "d").unwrap().kind,
        Kind::Regular { .. }
    ));
}

/// What GNU tar lists (`tar -tv --numeric-owner`): a line "TYPE MODE UID/GID SIZE NAME" per
/// member (TYPE the mode column's first letter, MODE octal, SIZE "major,minor" for a
/// device, NAME with " -> target" or " link to target"), then "exit N" if it failed.
fn gnu_reading(tar: &Path) -> Vec<String> {
    let out = Command::new("tar")
        .args(["--numeric-owner", "--quoting-style=literal", "-tvf"])
        .arg(tar)
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let ty = &f[0][..1];
            let mode = perm_bits(&f[0][1..]);
            format!("{ty} {mode:o} {} {} {}", f[1], f[2], after_fields(l, 5))
        })
        .collect();
    if !out.status.success() {
        lines.push(format!("exit {}", out.status.code().unwrap_or(-1)));
    }
    lines
}

/// What `tar -x` (as root: owners kept) makes of `tar`: "TYPE PATH UID/GID" per file
/// (`find -printf '%y %P %U/%G'`, sorted), then "exit N" if it failed.
fn gnu_extraction(tar: &Path) -> Vec<String> {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new("tar")
        .args(["--numeric-owner", "-xf"])
        .arg(tar)
        .arg("-C")
        .arg(d.path())
        .output()
        .unwrap();
    let found = run(Command::new("find").arg(d.path()).args([
        "-mindepth",
        "1",
        "-printf",
        "%y %P %U/%G\\n",
    ]));
    let mut lines: Vec<String> = String::from_utf8_lossy(&found.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    if !out.status.success() {
        lines.push(format!("exit {}", out.status.code().unwrap_or(-1)));
    }
    lines
}

/// `line` after its first `n` whitespace-separated fields and the one space after them.
fn after_fields(line: &str, n: usize) -> &str {
    let mut rest = line;
    for _ in 0..n {
        rest = rest.trim_start();
        rest = &rest[rest.find(' ').unwrap_or(rest.len())..];
    }
    rest.strip_prefix(' ').unwrap_or(rest)
}

/// "rwsr-xr-T" as permission bits.
fn perm_bits(s: &str) -> u32 {
    let mut bits = 0;
    for (i, c) in s.chars().enumerate() {
        let who = 2 - i as u32 / 3;
        bits |= match (i % 3, c) {
            (0, 'r') => 4 << (3 * who),
            (1, 'w') => 2 << (3 * who),
            (2, 'x') => 1 << (3 * who),
            (2, 's' | 't') => (1 << (3 * who)) | (0o1000 << who),
            (2, 'S' | 'T') => 0o1000 << who,
            _ => 0,
        };
    }
    bits
}

/// The same lines from Python's tarfile, or "fails: WHY" when it refuses the archive.
fn python_reading(tar: &Path) -> Vec<String> {
    let script = r#"
import sys, tarfile
out = []
try:
    for m in tarfile.open(sys.argv[1]):
        t = ('-' if m.isreg() else 'd' if m.isdir() else 'l' if m.issym() else
             'h' if m.islnk() else 'c' if m.ischr() else 'b' if m.isblk() else
             'p' if m.isfifo() else '?')
        size = '%d,%d' % (m.devmajor, m.devminor) if t in 'cb' else str(m.size)
        link = ' -> ' if t == 'l' else ' link to ' if t == 'h' else None
        name = m.name + (link + m.linkname if link else '')
        out.append('%s %o %d/%d %s %s' % (t, m.mode & 0o7777, m.uid, m.gid, size, name))
except Exception as e:
    out.append('fails: ' + str(e).splitlines()[-1])
sys.stdout.buffer.write(''.join(l + '\n' for l in out).encode('utf-8', 'surrogateescape'))
"#;
    let out = run(Command::new("python3").arg("-c").arg(script).arg(tar));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Lines a reader gives (`gnu_reading`, `gnu_extraction`, `python_reading`).
type Lines<'a> = Vec<&'a str>;

/// GNU tar and Python's tarfile on each refused header: they read it apart, or where
/// they agree, Go's archive/tar reads it otherwise (the case's comment says how), which
/// is why the importer refuses it rather than pick a reading. Each row: the case, GNU
/// tar's listing, what its extraction makes, Python's listing.
#[test]
fn readers_disagree_on_each_refused_header() {
    if skip_unless(have("tar") && have("python3"), "GNU tar and python3")
        || skip_unless(is_root(), "needs root (tar -x keeps owners)")
    {
        return;
    }
    let sudo = format!("{}usr/bin{}/sudo", "/".repeat(124), " ".repeat(24));
    let star_t = format!("- 644 0/0 5 {sudo}");
    let star_x = [
        "d usr 0/0".to_string(),
        format!("d usr/bin{} 0/0", " ".repeat(24)),
        format!("f usr/bin{}/sudo 0/0", " ".repeat(24)),
    ];
    let f = "- 644 0/0 1 f";
    let f_x = "f f 0/0";
    #[rustfmt::skip]
    let cases: Vec<(&str, Lines, Lines, Lines)> = vec![
        ("star-prefix-past-131-bytes.tar", vec![&star_t], vec![&star_x[0], &star_x[1], &star_x[2]], vec![&star_t]),
        ("gnu-header-text-in-atime.tar", vec!["- 644 0/0 5 passwd"], vec!["f passwd 0/0"], vec!["- 644 0/0 5 etc/passwd"]),
        ("gnu-header-numeric-atime.tar", vec![f], vec![f_x], vec!["- 644 0/0 1 14530000000/f"]),
        ("v7-header-with-prefix.tar", vec![f], vec![f_x], vec!["- 644 0/0 1 etc/f"]),
        ("v7-device-numbers.tar", vec!["c 644 0/0 0,0 c"], vec!["c c 0/0"], vec!["c 644 0/0 1,3 c"]),
        ("uid-leading-nul.tar", vec!["- 644 1000/0 1 f"], vec!["f f 1000/0"], vec![f]),
        ("uid-space-nul-digits.tar", vec![f], vec![f_x], vec![f]),
        ("mtime-blank.tar", vec![f, "exit 2"], vec![f_x, "exit 2"], vec![f]),
        ("checksum-leading-nul.tar", vec![f], vec![f_x], vec!["fails: - method tar: ReadError('bad checksum')"]),
        ("file-with-trailing-slash.tar", vec!["d 644 0/0 5 evil/"], vec!["d evil 0/0", "exit 2"], vec!["- 644 0/0 5 evil/"]),
        ("pax-path-file-trailing-slash.tar", vec!["d 644 0/0 1 f/"], vec!["d f 0/0", "exit 2"], vec!["- 644 0/0 1 f"]),
        ("longname-file-trailing-slash.tar", vec!["d 644 0/0 0 d/"], vec!["d d 0/0"], vec!["- 644 0/0 0 d/"]),
        ("file-named-dot.tar", vec!["- 644 0/0 1 f/."], vec!["d f 0/0", "exit 2"], vec!["- 644 0/0 1 f/."]),
        ("v7-file-named-by-prefix.tar", vec!["d 644 0/0 0 d/"], vec!["d d 0/0"], vec!["- 644 0/0 0 d/"]),
        ("v7-file-longname-trailing-slash.tar", vec!["d 644 0/0 0 d/"], vec!["d d 0/0"], vec!["- 644 0/0 0 d/"]),
        ("contiguous-file.tar", vec!["C 644 0/0 1 f"], vec![f_x], vec![f]),
        ("symlink-trailing-slash.tar", vec!["l 777 0/0 0 l/ -> t"], vec!["l l 0/0"], vec!["l 777 0/0 0 l/ -> t"]),
        ("hardlink-named-with-trailing-slash.tar", vec![f, "h 644 0/0 0 h/ link to f"], vec![f_x, "f h 0/0"], vec![f, "h 644 0/0 0 h/ link to f"]),
        ("hardlink-to-trailing-slash.tar", vec![f, "h 644 0/0 0 h link to f/"], vec![f_x, "exit 2"], vec![f, "h 644 0/0 0 h link to f/"]),
        ("hardlink-to-dot.tar", vec![f, "h 644 0/0 0 h link to f/."], vec![f_x, "exit 2"], vec![f, "h 644 0/0 0 h link to f/."]),
        ("pax-empty-uid.tar", vec!["- 644 1000/0 1 f", "exit 2"], vec!["f f 1000/0", "exit 2"], vec![f]),
        ("pax-empty-gid-after-a-value.tar", vec!["- 644 0/9 1 f", "exit 2"], vec!["f f 0/9", "exit 2"], vec![f]),
        ("pax-empty-path.tar", vec!["- 644 0/0 1 "], vec!["exit 2"], vec!["- 644 0/0 1 "]),
        ("pax-empty-size.tar", vec![f, "exit 2"], vec![f_x, "exit 2"], vec!["- 644 0/0 0 f"]),
        ("pax-uid-over-a-header-uid-beyond-32-bits.tar", vec!["- 644 7/0 1 f", "exit 2"], vec!["f f 7/0", "exit 2"], vec!["- 644 7/0 1 f"]),
        ("pax-size-over-a-negative-header-size.tar", vec!["exit 2"], vec!["exit 2"], vec![f]),
        ("pax-mtime-plus-sign.tar", vec![f, "exit 2"], vec![f_x, "exit 2"], vec![f]),
        ("pax-empty-atime.tar", vec![f, "exit 2"], vec![f_x, "exit 2"], vec![f]),
        ("global-header-at-the-end.tar", vec![f], vec![f_x], vec![f, "fails: end of file header"]),
    ];
    let t = tempfile::tempdir().unwrap();
    for (name, gnu_t, gnu_x, python) in cases {
        let tar = t.path().join(name);
        let bytes = disagreeing(name);
        std::fs::write(&tar, &bytes).unwrap();
        let refused = import(&bytes).map(|_| ()).expect_err(name);
        assert!(refused.contains("entry at byte"), "{name}: {refused}");
        assert_eq!(gnu_reading(&tar), gnu_t, "{name}: tar -t");
        assert_eq!(gnu_extraction(&tar), gnu_x, "{name}: tar -x");
        assert_eq!(python_reading(&tar), python, "{name}: Python's tarfile");
    }
}

/// The kind of a tree node as `tar -tv` shows it.
fn kind_letter(n: &Node) -> char {
    match n.kind {
        Kind::Regular { .. } => '-',
        Kind::Directory { .. } => 'd',
        Kind::Symlink { .. } => 'l',
        Kind::CharDevice { .. } => 'c',
        Kind::BlockDevice { .. } => 'b',
        Kind::Fifo => 'p',
        Kind::Socket => 's',
    }
}

#[test]
fn headers_all_readers_agree_on_are_read_their_way() {
    if skip_unless(have("tar") && have("python3"), "GNU tar and python3") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    for (name, bytes) in headers_all_readers_agree_on() {
        let tar = t.path().join(name);
        std::fs::write(&tar, &bytes).unwrap();
        let tree = import(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let gnu = gnu_reading(&tar);
        let python = python_reading(&tar);
        assert!(!gnu.is_empty(), "{name}: GNU tar lists nothing");
        assert_eq!(gnu.len(), python.len(), "{name}: {gnu:?} {python:?}");
        for line in gnu.iter().chain(&python) {
            // "TYPE MODE UID/GID SIZE NAME"; a directory's name with or without its slash.
            let f: Vec<&str> = line.splitn(5, ' ').collect();
            let path = f[4].trim_end_matches('/');
            let node = lookup(&tree, path).unwrap_or_else(|| panic!("{name}: no {path:?}"));
            let size = if node.is_dir() {
                f[3].to_string()
            } else {
                node.size.to_string()
            };
            let ours = format!(
                "{} {:o} {}/{} {size} {}",
                kind_letter(node),
                node.perm,
                node.uid,
                node.gid,
                f[4]
            );
            assert_eq!(&ours, line, "{name}");
        }
    }
}
