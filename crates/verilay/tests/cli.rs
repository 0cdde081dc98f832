//! Command-line behaviour: bad input gets one clear line and a non-zero exit, never a panic.

mod common;
use common::*;

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_flags_and_missing_inputs() {
    let out = verilay()
        .args(["build", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));

    let t = tempfile::tempdir().unwrap();
    let out = build_output(&t.path().join("missing"), &t.path().join("img"), &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("missing") && err.starts_with("verilay: error:"),
        "{err}"
    );
    assert!(
        !t.path().join("img").exists(),
        "a failed build must not leave an image"
    );

    for bad in [
        &["--block-size", "3000"][..],
        &["--label", "a-label-longer-than-15"],
        &["--uuid", "xyz"],
        &["--mtime", "1.x"],
    ] {
        let out = build_output(t.path(), &t.path().join("img"), bad);
        assert_eq!(out.status.code(), Some(1), "{bad:?}: {}", stderr_of(&out));
        assert_eq!(
            stderr_of(&out).lines().count(),
            1,
            "{bad:?}: {}",
            stderr_of(&out)
        );
    }
}

#[test]
fn hostile_images_get_one_line_and_exit_1() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..50 {
        std::fs::write(
            src.join("d").join(format!("file{i:02}")),
            vec![b'a' + (i % 26) as u8; i * 100],
        )
        .unwrap();
    }
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let good = std::fs::read(&image).unwrap();
    run(verilay().arg("fsck").arg(&image));

    let garbage = t.path().join("garbage");
    std::fs::write(&garbage, b"not an image at all").unwrap();
    let truncated = t.path().join("truncated");
    std::fs::write(&truncated, &good[..good.len() / 3]).unwrap();
    // Swap two names inside a directory block: lookups would fail, fsck must say so.
    let unsorted = t.path().join("unsorted");
    let mut bytes = good.clone();
    let pos = bytes.windows(6).position(|w| w == b"file00").unwrap();
    bytes[pos + 5] = b'9';
    std::fs::write(&unsorted, &bytes).unwrap();

    for (img, expect) in [
        (&garbage, "garbage"),
        (&truncated, "truncated"),
        (&unsorted, "unsorted"),
    ] {
        let out = verilay().arg("fsck").arg(img).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(1),
            "fsck {expect}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.is_empty() && text.lines().all(|l| l.contains(expect)),
            "fsck {expect}: {text}"
        );
        for cmd in [&["inspect"][..], &["inspect", "/d/file10"], &["extract"]] {
            let mut c = verilay();
            c.arg(cmd[0]).arg(img);
            if cmd[0] == "extract" {
                c.arg(t.path().join(format!("x-{expect}")));
            } else {
                c.args(&cmd[1..]);
            }
            let out = c.output().unwrap();
            let err = stderr_of(&out);
            assert!(!err.contains("panicked"), "{cmd:?} {expect}: {err}");
            if !out.status.success() {
                assert_eq!(out.status.code(), Some(1), "{cmd:?} {expect}: {err}");
                assert_eq!(err.lines().count(), 1, "{cmd:?} {expect}: {err}");
            }
        }
    }
}

/// Issue 36: `verify IMAGE 2>&1 | head -1` exited 101 (a panic writing to the closed
/// pipe). A closed pipe ends a command quietly, as in coreutils: by SIGPIPE, or exit 0.
#[test]
fn a_closed_output_pipe_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..50 {
        std::fs::write(src.join(format!("f{i}")), "x").unwrap();
    }
    let image = t.path().join("x.img");
    common::build(&src, &image, &["--quiet"]);
    for args in [
        vec!["verify".into(), image.clone().into_os_string()],
        vec!["inspect".into(), image.clone().into_os_string(), "/".into()],
        vec!["fsck".into(), image.clone().into_os_string()],
    ] {
        // Both outputs to a pipe nobody reads: the first write fails with EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = common::verilay()
            .args(&args)
            .stdout(writer.try_clone().unwrap())
            .stderr(writer)
            .status()
            .unwrap();
        assert!(
            status.signal() == Some(libc::SIGPIPE) || status.code() == Some(0),
            "{args:?}: {status}"
        );
    }
}

/// Issue 36: `convert oci:DIR` hung forever when `DIR/index.json` was a FIFO, and so did
/// `verify` of one. Every file input is refused at once unless it is a regular file (or,
/// for an image, a block device), in one line naming it.
#[test]
fn special_files_as_inputs_are_refused_at_once() {
    let t = tempfile::tempdir().unwrap();
    let fifo = t.path().join("fifo");
    sh(&format!("mkfifo '{}'", fifo.display()));
    let layout = t.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    sh(&format!("mkfifo '{}'", layout.join("index.json").display()));
    let fifo_s = fifo.to_str().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["verify".into(), fifo_s.into()], "not a regular file"),
        (vec!["inspect".into(), fifo_s.into()], "not a regular file"),
        (
            vec!["cat".into(), fifo_s.into(), "/x".into()],
            "not a regular file",
        ),
        (
            vec![
                "build".into(),
                fifo_s.into(),
                "-o".into(),
                t.path().join("o.img").to_str().unwrap().into(),
            ],
            "neither a directory nor a layer tarball",
        ),
        (
            vec![
                "convert".into(),
                format!("oci:{}:v1", layout.display()),
                "docker://127.0.0.1:1/x".into(),
                "--insecure".into(),
            ],
            "index.json: not a regular file",
        ),
        (
            vec![
                "convert".into(),
                format!("oci:{fifo_s}:v1"),
                "docker://127.0.0.1:1/x".into(),
            ],
            "not a directory",
        ),
        // An output: build renames its result over it (`-o /dev/null` replaced the device).
        (
            vec![
                "build".into(),
                layout.to_str().unwrap().into(),
                "-o".into(),
                fifo_s.into(),
            ],
            "exists and is not a regular file",
        ),
        (
            vec![
                "pull".into(),
                "oci://127.0.0.1:1/x:v1".into(),
                "-o".into(),
                fifo_s.into(),
            ],
            "exists and is not a regular file",
        ),
    ];
    for (args, needle) in cases {
        let start = std::time::Instant::now();
        let out = verilay().args(&args).output().unwrap();
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(needle) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "{args:?}"
        );
    }
    use std::os::unix::fs::FileTypeExt as _;
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

/// An image on a block device reads as the image file does: its length is the device's
/// (a block device's metadata says 0 bytes). A plain EROFS image (a sealed one's trailer
/// would not fit the device's 512-byte sectors).
#[test]
fn an_image_on_a_block_device_reads_as_its_file_does() {
    let Some(t) = root_and_tool_tempdir(
        "needs root (a loop device)",
        "mkfs.erofs",
        "needs mkfs.erofs (erofs-utils)",
    ) else {
        return;
    };
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("hello"), b"hello\n").unwrap();
    let image = t.path().join("img");
    run(std::process::Command::new("mkfs.erofs")
        .arg(&image)
        .arg(&src));
    let out = run(std::process::Command::new("losetup")
        .args(["--find", "--show", "--read-only"])
        .arg(&image));
    let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &self.0])
                .status();
        }
    }
    let _detach = Detach(dev.clone());
    let out = verilay().args(["fsck", &dev]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("clean, 2 inodes"), "{out:?}");
}

/// What an image says (its label, a link's target) is shown by `inspect`, never obeyed by
/// the terminal: escape sequences and bidi overrides come out as escapes, in text and in
/// JSON, and the JSON still reads back as what the image holds.
#[test]
fn inspect_shows_an_images_escape_sequences_as_escapes() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let target = "x\u{1b}[2J\u{9b}31my\u{202e}z";
    std::os::unix::fs::symlink(target, src.join("link")).unwrap();
    let img = t.path().join("img");
    let label = "\u{1b}]0;pwn\u{7}";
    let out = build_output(&src, &img, &["--label", label]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let acting = ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}'];
    for (path, raw, escaped) in [
        (None, label, "\\u{1b}]0;pwn\\u{7}"),
        (Some("/link"), target, "x\\u{1b}[2J\\u{9b}31my\\u{202e}z"),
    ] {
        for json in [false, true] {
            let mut c = verilay();
            c.arg("inspect");
            if json {
                c.arg("--json");
            }
            c.arg(&img).args(path);
            let out = c.output().unwrap();
            assert!(out.status.success(), "{}", stderr_of(&out));
            let text = String::from_utf8(out.stdout).unwrap();
            assert!(!text.contains(acting), "{path:?} json={json}: {text:?}");
            if json {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                let found = v.to_string().contains(&serde_json::json!(raw).to_string());
                assert!(found, "{path:?}: {raw:?} not in {v}");
            } else {
                assert!(text.contains(escaped), "{path:?}: {escaped} not in {text}");
            }
        }
    }
}
