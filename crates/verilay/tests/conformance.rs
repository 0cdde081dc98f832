//! Independent conformance suites on a writable verilay mount (an image under an upper
//! directory): pjdfstest, the POSIX semantics of every write operation, checked against
//! kernel overlayfs on the same image; and fsx, random I/O verified byte for byte.
//! scripts/setup builds both from their upstream releases on crates.io.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn prerequisites(tool: &str) -> bool {
    skip_unless(is_root(), "needs root (kernel mounts, pjdfstest's chown)")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
        || skip_unless(
            have(tool),
            &format!("{tool} missing (scripts/setup builds it)"),
        )
}

fn config(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name)
}

/// An image whose tree holds the directory the suites run in, so their files are made in
/// a merged directory copied up from the image.
/// A temporary directory and the lower image in it, for a test that runs `tool`; None,
/// with the skip recorded, where it cannot run.
fn fixture(tool: &str) -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    if prerequisites(tool) {
        return None;
    }
    let t = tempfile::tempdir().unwrap();
    let image = lower_image(t.path());
    Some((t, image))
}

fn lower_image(t: &Path) -> std::path::PathBuf {
    let src = t.join("src");
    std::fs::create_dir_all(src.join("suite")).unwrap();
    std::fs::write(src.join("suite/from-image"), b"lower").unwrap();
    let lower: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(src.join("lower.bin"), lower).unwrap();
    let image = t.join("lower.img");
    build(&src, &image, &["--quiet"]);
    image
}

/// Runs pjdfstest in `dir`: each failed case with the first line of its message, and the
/// summary line.
fn pjdfstest(dir: &Path, secondary: &Path) -> (BTreeMap<String, String>, String) {
    let out = Command::new("pjdfstest")
        .arg("-c")
        .arg(config("pjdfstest.toml"))
        .arg("-p")
        .arg(dir)
        .arg("-s")
        .arg(secondary)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = text
        .lines()
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or_else(|| {
            panic!(
                "pjdfstest did not finish: {text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_owned();
    let mut failed = BTreeMap::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if let Some(name) = l.strip_suffix("FAILED").map(str::trim) {
            let why = lines.next_if(|l| l.starts_with('\t')).unwrap_or("");
            failed.insert(name.to_owned(), why.trim().to_owned());
        }
    }
    (failed, summary)
}

/// pjdfstest's Rust port makes its character devices with device number 0/0, which in an
/// upper directory is a whiteout: overlayfs refuses to make one (EPERM), and so does
/// verilay, so the cases on such devices fail on both. Those are the only failures
/// allowed, and verilay must fail exactly where kernel overlayfs does.
fn only_whiteout_devices(failed: &BTreeMap<String, String>) -> Vec<(&String, &String)> {
    failed
        .iter()
        .filter(|(name, why)| !(name.ends_with("::char") && why.contains("EPERM")))
        .collect()
}

#[test]
fn pjdfstest_passes_on_a_merged_mount_as_on_kernel_overlayfs() {
    let Some((t, image)) = fixture("pjdfstest") else {
        return;
    };
    // Cross-device cases (EXDEV) need a second filesystem.
    let secondary = t.path().join("secondary");
    std::fs::create_dir_all(&secondary).unwrap();
    run(Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&secondary));
    let _secondary = Unmount::kernel(&secondary);
    let (kernel, kernel_summary) = {
        let lower = Mount::erofs(&image, &t.path().join("erofs"));
        let m = overlay_mount(
            &lower.dir,
            &dirs(t.path(), "overlay"),
            &t.path().join("ovl"),
        );
        pjdfstest(&m.dir.join("suite"), &secondary)
    };
    let m = verilay_mount(&image, &dirs(t.path(), "verilay"), &t.path().join("m"));
    let (ours, summary) = pjdfstest(&m.dir.join("suite"), &secondary);
    eprintln!("kernel overlayfs: {kernel_summary}\nverilay:          {summary}");
    assert_eq!(
        only_whiteout_devices(&ours),
        Vec::<(&String, &String)>::new(),
        "verilay fails these ({summary})"
    );
    assert_eq!(
        only_whiteout_devices(&kernel),
        Vec::<(&String, &String)>::new(),
        "kernel overlayfs fails these ({kernel_summary})"
    );
    let names = |f: &BTreeMap<String, String>| f.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&ours),
        names(&kernel),
        "verilay fails where overlayfs passes"
    );
    // The suite really ran: 343 of its 398 cases pass on both.
    let passed = |s: &str| -> usize {
        let words: Vec<&str> = s.split([',', ' ']).filter(|w| !w.is_empty()).collect();
        let at = words.iter().position(|w| *w == "passed").unwrap();
        words[at - 1].parse().unwrap()
    };
    assert!(passed(&summary) >= 340, "{summary}");
    assert_eq!(passed(&summary), passed(&kernel_summary));
}

#[test]
fn fsx_finds_no_miscompare_on_an_upper_and_a_copied_up_file() {
    let Some((t, image)) = fixture("fsx") else {
        return;
    };
    let d = dirs(t.path(), "fsx");
    let m = verilay_mount(&image, &d, &t.path().join("m"));
    let artifacts = t.path().join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    // A file made in the upper directory, and one of the image's, copied up by fsx's open.
    for (file, seed) in [("new.bin", "7"), ("lower.bin", "11")] {
        let out = Command::new("fsx")
            .arg("-f")
            .arg(config("fsx.toml"))
            .args(["-N", "100000", "-S", seed, "-P"])
            .arg(&artifacts)
            .arg(m.dir.join(file))
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        let tail: Vec<_> = String::from_utf8_lossy(&out.stderr)
            .lines()
            .rev()
            .take(60)
            .map(str::to_owned)
            .collect();
        assert!(
            out.status.success(),
            "fsx on {file} (seed {seed}) failed:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        assert!(d.upper.join(file).is_file(), "{file} is in the upper dir");
    }
}
