//! `verilay digest` against the real `fsverity digest`: same output, same tree, same descriptor.

mod common;
use common::*;

#[test]
fn digests_trees_and_descriptors_match_fsverity_utils() {
    if skip_unless(have("fsverity"), "fsverity (fsverity-utils) missing") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mut random = xorshift::XorShift(7);
    let mut files = Vec::new();
    // 0, 1, block-1, block, block+1 for each block size, several tree levels, and > 100 MB.
    let mut sizes = vec![
        0usize,
        1,
        1023,
        1024,
        1025,
        4095,
        4096,
        4097,
        65535,
        65536,
        65537,
        3 << 20,
    ];
    sizes.push(2 * 1024 * 1024 + 12345); // three levels with 1 KiB blocks and SHA-512
    sizes.push(105 * 1024 * 1024 + 7);
    for size in sizes {
        let data = random.bytes(size);
        let p = t.path().join(format!("f{size}"));
        std::fs::write(&p, &data).unwrap();
        files.push((p, size));
    }
    for (path, size) in &files {
        for alg in ["sha256", "sha512"] {
            for bs in ["1024", "4096", "65536"] {
                // The 100 MB file with small blocks only once per algorithm: it is the slow one.
                if *size > 100 << 20 && bs != "4096" {
                    continue;
                }
                for salt in [
                    None,
                    Some("deadbeef"),
                    Some("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"),
                ] {
                    let mut args = vec!["--hash-alg", alg, "--block-size", bs];
                    if let Some(s) = salt {
                        args.extend(["--salt", s]);
                    }
                    let theirs_tree = t.path().join("theirs.tree");
                    let theirs_desc = t.path().join("theirs.desc");
                    let ours_tree = t.path().join("ours.tree");
                    let ours_desc = t.path().join("ours.desc");
                    let theirs = run(std::process::Command::new("fsverity")
                        .arg("digest")
                        .arg(path)
                        .args(&args)
                        .arg(format!("--out-merkle-tree={}", theirs_tree.display()))
                        .arg(format!("--out-descriptor={}", theirs_desc.display())));
                    let ours = run(verilay()
                        .arg("digest")
                        .arg(path)
                        .args(&args)
                        .arg("--out-merkle-tree")
                        .arg(&ours_tree)
                        .arg("--out-descriptor")
                        .arg(&ours_desc));
                    let what = format!("{size} bytes, {args:?}");
                    assert_eq!(
                        String::from_utf8_lossy(&ours.stdout),
                        String::from_utf8_lossy(&theirs.stdout),
                        "{what}"
                    );
                    assert!(
                        std::fs::read(&ours_tree).unwrap() == std::fs::read(&theirs_tree).unwrap(),
                        "tree differs: {what}"
                    );
                    assert_eq!(
                        std::fs::read(&ours_desc).unwrap(),
                        std::fs::read(&theirs_desc).unwrap(),
                        "{what}"
                    );
                }
            }
        }
    }
    // Several files at once and --compact, as fsverity prints them.
    let paths: Vec<_> = files.iter().take(4).map(|(p, _)| p.clone()).collect();
    for extra in [&[][..], &["--compact"]] {
        let theirs = run(std::process::Command::new("fsverity")
            .arg("digest")
            .args(&paths)
            .args(extra));
        let ours = run(verilay().arg("digest").args(&paths).args(extra));
        assert_eq!(ours.stdout, theirs.stdout, "{extra:?}");
    }
}

#[test]
fn bad_digest_options_are_one_line_errors() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    for bad in [
        &["--hash-alg", "md5"][..],
        &["--block-size", "3000"],
        &["--salt", "xyz"],
        &["--salt", &"00".repeat(33)],
    ] {
        let out = verilay().arg("digest").arg(&f).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{bad:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).lines().count(),
            1,
            "{bad:?}"
        );
    }
    let out = verilay()
        .arg("digest")
        .arg(t.path().join("missing"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}
