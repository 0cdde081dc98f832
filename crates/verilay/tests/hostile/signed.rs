//! Signed images: `pull` and `mount` of an `oci://` reference under a signature policy
//! (containers-policy.json with a sigstore key, registries.d turning attachments on, as
//! podman reads them).
//!
//! The attacker may push to the registry (manifests, tags, signature attachments) but
//! holds no key the policy names. Nothing they store is pulled or mounted: each refusal
//! is exit 1 and one line naming the reference and the reason, and leaves no file, no
//! mount and no daemon.

use crate::common::registry::Registry;
use crate::common::*;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A registry, two key pairs (`key` the policy's, `other` not), the policy, a
/// registries.d and a small image.
struct Rig {
    t: tempfile::TempDir,
    reg: Registry,
    key: PathBuf,
    other: PathBuf,
    pass: PathBuf,
    policy: PathBuf,
    registries_d: PathBuf,
    image: PathBuf,
    image_digest: String,
    content: Vec<u8>,
}

const PASSPHRASE: &[u8] = b"sesame";

impl Rig {
    fn new() -> Rig {
        let t = tempfile::tempdir().unwrap();
        let reg = Registry::start(false);
        let pair = |name: &str| {
            let (private, public) = signatures::generate_key(PASSPHRASE).unwrap();
            let (k, p) = (t.path().join(name), t.path().join(format!("{name}.pub")));
            std::fs::write(&k, private).unwrap();
            std::fs::write(&p, public).unwrap();
            (k, p)
        };
        let (key, public) = pair("key");
        let (other, _) = pair("other");
        let pass = t.path().join("pass");
        std::fs::write(&pass, [PASSPHRASE, b"\n"].concat()).unwrap();
        let port = reg.port;
        let policy = t.path().join("policy.json");
        let scopes = serde_json::json!({
            "default": [{"type": "reject"}],
            "transports": {"docker": {
                format!("127.0.0.1:{port}/signed"): [{
                    "type": "sigstoreSigned",
                    "keyPath": public,
                    "signedIdentity": {"type": "matchRepoDigestOrExact"},
                }],
                format!("127.0.0.1:{port}/open"): [{"type": "insecureAcceptAnything"}],
            }},
        });
        std::fs::write(&policy, scopes.to_string()).unwrap();
        let registries_d = t.path().join("registries.d");
        std::fs::create_dir(&registries_d).unwrap();
        std::fs::write(
            registries_d.join("default.yaml"),
            "default-docker:\n  use-sigstore-attachments: true\n",
        )
        .unwrap();
        let src = t.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let content = b"signed bytes\n".repeat(1000);
        std::fs::write(src.join("f"), &content).unwrap();
        let image = t.path().join("app.img");
        let out = build(&src, &image, &["--quiet"]);
        let image_digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Rig {
            t,
            reg,
            key,
            other,
            pass,
            policy,
            registries_d,
            image,
            image_digest,
            content,
        }
    }

    /// The image under another file name: the same bytes, another manifest (the title
    /// annotation is the file name).
    fn copy(&self, name: &str) -> PathBuf {
        let p = self.t.path().join(name);
        std::fs::copy(&self.image, &p).unwrap();
        p
    }

    /// Pushes `image` to `repo_tag`, signed with `key` if given: the manifest digest.
    fn push(&self, image: &Path, repo_tag: &str, key: Option<&Path>) -> String {
        let mut cmd = verilay();
        cmd.arg("push")
            .arg(image)
            .arg(self.reg.reference(repo_tag))
            .args(["--insecure", "--json"]);
        if let Some(k) = key {
            cmd.arg("--sign-by-sigstore-private-key")
                .arg(k)
                .arg("--sign-passphrase-file")
                .arg(&self.pass);
        }
        let j: serde_json::Value = serde_json::from_slice(&run(&mut cmd).stdout).unwrap();
        let identity = key.map(|_| format!("127.0.0.1:{}/{repo_tag}", self.reg.port));
        assert_eq!(j["signed"], key.is_some(), "{j}");
        assert_eq!(j["signed_as"], serde_json::json!(identity), "{j}");
        j["manifest"].as_str().unwrap().to_string()
    }

    fn policy_args(&self) -> Vec<OsString> {
        vec![
            "--signature-policy".into(),
            self.policy.clone().into(),
            "--registries.d".into(),
            self.registries_d.clone().into(),
        ]
    }

    /// `verilay pull REFERENCE -o OUT --insecure` under the policy, into a new directory.
    fn pull(&self, reference: &str, out: &Path) -> Output {
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        bounded(
            [
                "pull".into(),
                reference.into(),
                "-o".into(),
                out.into(),
                "--insecure".into(),
                "--json".into(),
            ]
            .into_iter()
            .chain(self.policy_args()),
        )
    }

    /// `verilay mount REFERENCE MNT --insecure --no-cache EXTRA...` (the policy is in
    /// EXTRA, as flags or `-o`).
    fn mount(&self, reference: &str, mnt: &Path, extra: Vec<OsString>) -> Output {
        std::fs::create_dir_all(mnt).unwrap();
        bounded(
            [
                "mount".into(),
                reference.into(),
                mnt.into(),
                "--insecure".into(),
                "--no-cache".into(),
                "--timeout".into(),
                "20".into(),
            ]
            .into_iter()
            .chain(extra),
        )
    }

    /// `reference` (by tag or digest of image `image_digest`) refused by pull and, as
    /// root, by mount: exit 1, one line naming the reference and every needle, and
    /// nothing left.
    fn assert_refused(&self, reference: &str, image_digest: &str, needles: &[&str]) {
        let dir = self.t.path().join(format!("out-{}", short(reference)));
        let out = self.pull(reference, &dir.join("x.img"));
        assert_one_line_error(&out, reference, needles);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "pull {reference} left {left:?}");
        // The commands that read an image where it is check the same policy.
        let into = dir.join("extracted");
        let reads: [Vec<OsString>; 4] = [
            vec!["cat".into(), reference.into(), "f".into()],
            vec!["inspect".into(), reference.into()],
            vec!["fsck".into(), reference.into()],
            vec!["extract".into(), reference.into(), into.clone().into()],
        ];
        for read in reads {
            let name = read[0].clone();
            let out = bounded(
                read.into_iter()
                    .chain(["--insecure".into(), "--digest".into(), image_digest.into()])
                    .chain(self.policy_args()),
            );
            if name == "fsck" {
                // fsck reports an image it cannot open as its one problem, on stdout.
                let out = Output {
                    stderr: out.stdout,
                    stdout: vec![],
                    ..out
                };
                assert_one_line_error(&out, reference, needles);
                continue;
            }
            assert!(
                out.stdout.is_empty(),
                "{name:?} {reference} printed something"
            );
            assert_one_line_error(&out, reference, needles);
        }
        assert!(
            !into.exists(),
            "extract {reference} made {}",
            into.display()
        );
        if !can_mount() {
            return;
        }
        let mnt = self.t.path().join(format!("mnt-{}", short(reference)));
        let mut extra = self.policy_args();
        extra.extend(["--digest".into(), image_digest.into()]);
        let out = self.mount(reference, &mnt, extra);
        // A mount wrongly made is taken away however the assertions end.
        let _made = mounted(&mnt).then(|| Unmount::fuse(&mnt));
        assert_one_line_error(&out, reference, needles);
        assert!(!mounted(&mnt), "a mount was left on {}", mnt.display());
        let daemons = daemons_of(&mnt);
        assert!(daemons.is_empty(), "a daemon was left: {daemons:?}");
    }

    /// `reference` pulled (its bytes the image's) and, as root, mounted (a file read back
    /// through the mount) with `extra`: whether the pull says it was signed.
    fn assert_accepted(&self, reference: &str, extra: Vec<OsString>) -> bool {
        let out_file = self
            .t
            .path()
            .join(format!("in-{}", short(reference)))
            .join("x.img");
        let out = self.pull(reference, &out_file);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "pull {reference}: {err}");
        assert!(std::fs::read(&out_file).unwrap() == std::fs::read(&self.image).unwrap());
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // `cat` where the image is, under the same policy and pin as the mount.
        let digest = extra.iter().skip_while(|a| *a != "--digest").take(2);
        let cat = bounded(
            [
                "cat".into(),
                reference.into(),
                "f".into(),
                "--insecure".into(),
            ]
            .into_iter()
            .chain(digest.cloned())
            .chain(self.policy_args()),
        );
        let err = String::from_utf8_lossy(&cat.stderr);
        assert_eq!(cat.status.code(), Some(0), "cat {reference}: {err}");
        assert!(cat.stdout == self.content, "cat {reference}: other bytes");
        if can_mount() {
            let mnt = self.t.path().join(format!("mnt-{}", short(reference)));
            let out = self.mount(reference, &mnt, extra);
            let _u = mounted(&mnt).then(|| Unmount::fuse(&mnt));
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "mount {reference}: {err}");
            assert!(std::fs::read(mnt.join("f")).unwrap() == self.content);
        }
        j["signed"].as_bool().unwrap()
    }
}

/// Mounting needs root and /dev/fuse; without them the pull half still runs (and the
/// skip is recorded).
fn can_mount() -> bool {
    !skip_unless(
        is_root() && Path::new("/dev/fuse").exists(),
        "the mount half needs root and /dev/fuse",
    )
}

/// `verilay ARGS`, stopped after 60 s: a hang fails the test instead of stalling it.
fn bounded(args: impl IntoIterator<Item = OsString>) -> Output {
    Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_verilay"))
        .args(args)
        .output()
        .unwrap()
}

fn assert_one_line_error(out: &Output, reference: &str, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{reference}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for n in std::iter::once(reference).chain(needles.iter().copied()) {
        assert!(err.contains(n), "expected {n:?} in: {err}");
    }
}

/// Whether something is mounted on `dir` (per /proc/self/mountinfo).
fn mounted(dir: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(dir) else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4).map(Path::new) == Some(canon.as_path()))
}

/// A short name for `reference`'s own output file or mountpoint.
fn short(reference: &str) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(reference.as_bytes())[..8])
}

/// The policy's scope for repository `signed`, as refusals name it.
fn signed_scope(reg: &Registry) -> String {
    format!("transports.docker[\"127.0.0.1:{}/signed\"]", reg.port)
}

/// An image signed with the policy's key, pushed to `signed:v1`: pulled and mounted by
/// tag (with `--signature-policy`) and by digest (with `-o signature_policy=`, which must
/// reach the daemon); pull says it was signed.
#[test]
fn a_signed_image_is_pulled_and_mounted_by_tag_and_by_digest() {
    let rig = Rig::new();
    let m = rig.push(&rig.image, "signed:v1", Some(&rig.key));
    let mut by_tag = rig.policy_args();
    by_tag.extend(["--digest".into(), rig.image_digest.clone().into()]);
    assert!(rig.assert_accepted(&rig.reg.reference("signed:v1"), by_tag));
    let mut o = OsString::from("-osignature_policy=");
    o.push(&rig.policy);
    o.push(",registries_d=");
    o.push(&rig.registries_d);
    assert!(rig.assert_accepted(&rig.reg.reference(&format!("signed@{m}")), vec![o]));
}

/// Unsigned, in a scope that requires a signature: refused, by tag and by digest. The
/// signed manifest pushed again (unsigned) under another tag: its signature names `v1`,
/// so by that tag it is refused, and by digest (the repository matches) accepted.
#[test]
fn an_unsigned_image_is_refused_and_a_signature_names_its_tag() {
    let rig = Rig::new();
    let m2 = rig.push(&rig.copy("v2.img"), "signed:v2", None);
    let none = "a signature was required, but no signature exists";
    let scope = signed_scope(&rig.reg);
    for r in ["signed:v2".to_string(), format!("signed@{m2}")] {
        let r = rig.reg.reference(&r);
        rig.assert_refused(&r, &rig.image_digest, &[none, &scope]);
    }
    let m1 = rig.push(&rig.image, "signed:v1", Some(&rig.key));
    assert_eq!(rig.push(&rig.image, "signed:again", None), m1);
    let v1 = format!(
        "signature for identity 127.0.0.1:{}/signed:v1 is not accepted",
        rig.reg.port
    );
    rig.assert_refused(
        &rig.reg.reference("signed:again"),
        &rig.image_digest,
        &[&v1],
    );
    let mut extra = rig.policy_args();
    extra.extend(["--digest".into(), rig.image_digest.clone().into()]);
    assert!(rig.assert_accepted(&rig.reg.reference(&format!("signed@{m1}")), extra));
}

/// Signed with a key the policy does not name: refused.
#[test]
fn a_signature_by_another_key_is_refused() {
    let rig = Rig::new();
    let m = rig.push(&rig.copy("v3.img"), "signed:v3", Some(&rig.other));
    for r in ["signed:v3".to_string(), format!("signed@{m}")] {
        let r = rig.reg.reference(&r);
        rig.assert_refused(&r, &rig.image_digest, &["verification failed"]);
    }
}

/// The attacker copies v1's genuine signature (payload and signature, as stored) onto
/// their manifest: the key verifies it, but it names v1's digest.
#[test]
fn a_signature_copied_onto_another_manifest_is_refused() {
    let rig = Rig::new();
    let m1 = rig.push(&rig.image, "signed:v1", Some(&rig.key));
    let m2 = rig.push(&rig.copy("forged.img"), "signed:v2", None);
    let r = oci::Reference::parse(&rig.reg.reference("signed:v1")).unwrap();
    let conn = oci::Registry::connect(&r, true, Duration::from_secs(10)).unwrap();
    let genuine = signatures::attachments::fetch(&conn, "signed", &m1).unwrap();
    assert_eq!(genuine.len(), 1);
    let payload = genuine[0].payload.as_ref().unwrap();
    let sig = &genuine[0].annotations[signatures::attachments::SIGNATURE_ANNOTATION];
    signatures::attach(&conn, "signed", &m2, payload, sig).unwrap();
    let wrong = format!("signature for digest {m1} does not match");
    for r in ["signed:v2".to_string(), format!("signed@{m2}")] {
        let r = rig.reg.reference(&r);
        rig.assert_refused(&r, &rig.image_digest, &[&wrong]);
    }
}

/// `open` accepts anything: unsigned, pulled and mounted (and not called signed); a
/// repository no scope names falls to `default`, `reject`, signed or not.
#[test]
fn an_open_scope_accepts_and_an_unnamed_repository_is_rejected() {
    let rig = Rig::new();
    rig.push(&rig.image, "open:v1", None);
    let mut extra = rig.policy_args();
    extra.extend(["--digest".into(), rig.image_digest.clone().into()]);
    assert!(!rig.assert_accepted(&rig.reg.reference("open:v1"), extra));
    let m = rig.push(&rig.image, "elsewhere:v1", Some(&rig.key));
    for r in ["elsewhere:v1".to_string(), format!("elsewhere@{m}")] {
        let r = rig.reg.reference(&r);
        rig.assert_refused(&r, &rig.image_digest, &["(default)", "rejected by policy"]);
    }
}

/// A policy that cannot be used is one line at once, before the registry is asked (the
/// reference names a port nothing listens on): a FIFO (whose open would wait for a
/// writer), and a GPG `signedBy` requirement verilay cannot evaluate.
#[test]
fn an_unusable_policy_is_refused_at_once() {
    let t = tempfile::tempdir().unwrap();
    let fifo = t.path().join("fifo.json");
    sh(&format!("mkfifo '{}'", fifo.display()));
    let gpg = t.path().join("gpg.json");
    std::fs::write(
        &gpg,
        r#"{"default":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k.gpg"}]}"#,
    )
    .unwrap();
    let reference = "oci://127.0.0.1:1/signed:v1";
    let digest = format!("sha256:{}", "0".repeat(64));
    let out = t.path().join("x.img");
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    for (policy, why) in [(&fifo, "not a regular file"), (&gpg, "\"signedBy\"")] {
        let mut o = OsString::from("-osignature_policy=");
        o.push(policy);
        // `verilay mount REFERENCE MNT --digest DIGEST` and the policy as `policy_args`.
        let mount = |policy_args: Vec<OsString>| -> Vec<OsString> {
            let mut v: Vec<OsString> = vec![
                "mount".into(),
                reference.into(),
                mnt.clone().into(),
                "--digest".into(),
                digest.clone().into(),
            ];
            v.extend(policy_args);
            v
        };
        let runs: Vec<Vec<OsString>> = vec![
            vec![
                "pull".into(),
                reference.into(),
                "-o".into(),
                out.clone().into(),
                "--signature-policy".into(),
                policy.into(),
            ],
            mount(vec!["--signature-policy".into(), policy.into()]),
            mount(vec![o]),
        ];
        for args in runs {
            let start = Instant::now();
            let res = bounded(args.clone());
            let err = String::from_utf8_lossy(&res.stderr);
            assert_eq!(res.status.code(), Some(1), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
            let name = policy.display().to_string();
            assert!(err.contains(why) && err.contains(&name), "{args:?}: {err}");
            assert!(start.elapsed() < Duration::from_secs(10), "{args:?}");
            assert!(!out.exists() && !mounted(&mnt) && daemons_of(&mnt).is_empty());
        }
    }
}

/// A wrong passphrase fails the push before anything is stored: no tag, no blob.
#[test]
fn a_wrong_passphrase_pushes_nothing() {
    let rig = Rig::new();
    let wrong = rig.t.path().join("wrong");
    std::fs::write(&wrong, "open sesame\n").unwrap();
    let out = bounded([
        "push".into(),
        rig.image.clone().into(),
        rig.reg.reference("signed:v1").into(),
        "--insecure".into(),
        "--sign-by-sigstore-private-key".into(),
        rig.key.clone().into(),
        "--sign-passphrase-file".into(),
        wrong.into(),
    ]);
    let name = rig.key.display().to_string();
    assert_one_line_error(&out, &name, &["decryption failed"]);
    let status = |path: &str| {
        let out = run(Command::new("curl").args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("http://127.0.0.1:{}/v2/{path}", rig.reg.port),
        ]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(status("signed/manifests/v1"), "404");
    let blob = oci::registry::sha256_digest(&std::fs::read(&rig.image).unwrap());
    assert_eq!(status(&format!("signed/blobs/{blob}")), "404");
}
