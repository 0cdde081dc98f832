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
    let out = verilay()
        .arg("build")
        .arg(t.path().join("missing"))
        .arg("-o")
        .arg(t.path().join("img"))
        .output()
        .unwrap();
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
        let out = verilay()
            .arg("build")
            .arg(t.path())
            .arg("-o")
            .arg(t.path().join("img"))
            .args(bad)
            .output()
            .unwrap();
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
