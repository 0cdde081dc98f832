//! A registry, and whoever may push to it (issue 36): what a user pins must pin every byte
//! that runs.
//!
//! The attacker here may push to the repository: they cannot change the bytes behind a
//! digest, but they can add manifests, move tags and record referrers.

use crate::common::containers::*;
use crate::common::registry::Registry;
use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// Two layers: busybox, and an app layer whose `/etc/msg` says `genuine`.
fn genuine_layers(base: &Path) -> Vec<PathBuf> {
    let (l0, l1) = (base.join("base"), base.join("app"));
    sh(&format!(
        "set -e; mkdir -p {0}/bin {0}/etc {0}/tmp; cp \"$(command -v busybox)\" {0}/bin/busybox; \
         for c in sh cat; do ln -s busybox {0}/bin/$c; done; echo base > {0}/etc/os-release; \
         mkdir -p {1}/etc; echo genuine > {1}/etc/msg",
        l0.display(),
        l1.display()
    ));
    vec![l0, l1]
}

fn get(reg: &Registry, path: &str) -> Vec<u8> {
    run(Command::new("curl").args([
        "-sf",
        "-H",
        &format!("Accept: {MANIFEST}, {INDEX}"),
        &format!("http://127.0.0.1:{}/v2/{path}", reg.port),
    ]))
    .stdout
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

/// The attacker's image: the app layer with other content (`/etc/msg` says `attacker`),
/// pushed to the repository `app`.
struct Evil {
    /// Its image digest, and its blob's digest and size.
    digest: String,
    blob: String,
    size: usize,
}

fn push_evil(base: &Path, reg: &Registry) -> Evil {
    let dir = base.join("evil");
    sh(&format!(
        "mkdir -p {0}/etc && echo attacker > {0}/etc/msg",
        dir.display()
    ));
    push_image(&dir, &base.join("evil.img"), reg, "app:evil")
}

/// The directory `dir` built into `image` and pushed as `repo_tag`.
fn push_image(dir: &Path, image: &Path, reg: &Registry, repo_tag: &str) -> Evil {
    let built = build(dir, image, &["--quiet"]);
    run(verilay()
        .arg("push")
        .arg(image)
        .arg(reg.reference(repo_tag))
        .args(["--insecure", "--quiet"]));
    let bytes = std::fs::read(image).unwrap();
    Evil {
        digest: String::from_utf8_lossy(&built.stdout).trim().to_string(),
        blob: digest_of(&bytes),
        size: bytes.len(),
    }
}

/// A forged conversion of `manifest`: the genuine conversion `genuine_conv` with the app
/// layer (the second) bound to `evil`, its subject still the genuine manifest; stored with
/// its layer artifacts, and listed before the genuine one in `manifest`'s referrers index
/// (the tag schema this registry uses). Its digest.
fn forge_referrer(reg: &Registry, manifest: &str, genuine_conv: &str, evil: &Evil) -> String {
    let genuine = get(reg, &format!("app/manifests/{genuine_conv}"));
    let mut forged = json(&genuine);
    let app = &mut forged["layers"][1];
    app["digest"] = evil.blob.clone().into();
    app["size"] = evil.size.into();
    app["annotations"]["dev.verilay.image.digest"] = evil.digest.clone().into();
    let forged = serde_json::to_vec(&forged).unwrap();
    let forged_conv = digest_of(&forged);
    reg.put_manifest(
        &format!("app:{forged_conv}"),
        std::str::from_utf8(&forged).unwrap(),
        MANIFEST,
    );
    for c in oci::conversion::layers_of(&forged).unwrap() {
        let artifact = oci::conversion::layer_manifest(&c);
        reg.put_manifest(
            &format!("app:{}", digest_of(&artifact)),
            std::str::from_utf8(&artifact).unwrap(),
            MANIFEST,
        );
    }
    let referrers = serde_json::json!({
        "schemaVersion": 2, "mediaType": INDEX,
        "manifests": [
            {"mediaType": MANIFEST, "digest": forged_conv, "size": forged.len(),
             "artifactType": "application/vnd.verilay.layers.v1"},
            {"mediaType": MANIFEST, "digest": genuine_conv, "size": genuine.len(),
             "artifactType": "application/vnd.verilay.layers.v1"},
        ],
    });
    reg.put_manifest(
        &format!("app:{}", manifest.replacen(':', "-", 1)),
        &referrers.to_string(),
        INDEX,
    );
    forged_conv
}

/// `podman run IMAGE cat /etc/msg` through a store: what it printed, and whether the app
/// layer came from the store (a link to a layer mount) or was pulled the ordinary way.
fn message(pod: &Podman, image: &str, store: &Store) -> (String, bool) {
    run(pod.cmd().args(["pull", "-q", image]));
    let (code, out, err) = pod.run(image, &["cat", "/etc/msg"]);
    assert_eq!(code, 0, "{image}: {err}");
    let diffs = pod.layer_diffs(image);
    let top = diffs.last().unwrap();
    let lazy = std::fs::read_link(top).is_ok_and(|t| t.starts_with(&store.dir));
    (out.trim().to_string(), lazy)
}

/// Issue 36, item 1: a second conversion of a digest-pinned image, recorded as its
/// referrer by someone who may push (listing the genuine layer's digest, size and DiffID,
/// but an image of other content), used to run in place of the genuine layer. Now a
/// layer's image comes only from the manifest the user pinned: the forged referrer is
/// never followed, a bound manifest with a forged annotation is another digest, and two
/// images bound to one layer are refused, never "the first".
#[test]
fn a_conversion_the_pinned_manifest_does_not_name_never_runs() {
    if podman_prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let reg = Registry::start(false);
    let l = layout(t.path(), "v1", &genuine_layers(t.path()));
    let out = run(verilay().args([
        "convert",
        &format!("oci:{}:v1", l.dir.display()),
        &reg.docker("app:v1"),
        "--insecure",
        "--json",
    ]));
    let j = json(&out.stdout);
    let pinned = j["pinned"].as_str().unwrap().to_string();
    let genuine_conv = j["manifests"][0]["conversion"]
        .as_str()
        .unwrap()
        .to_string();

    // The attacker's image, and a forged conversion of the genuine manifest that binds
    // the app layer to it, listed first among its referrers.
    let evil = push_evil(t.path(), &reg);
    forge_referrer(&reg, &l.manifest, &genuine_conv, &evil);

    // A forged bound manifest (the genuine one with the evil image in the app layer's
    // annotations), moved onto the tag, and an index binding the layer twice.
    let bound = get(&reg, &format!("app/manifests/{pinned}"));
    let mut forged_bound = json(&bound);
    {
        let notes = &mut forged_bound["layers"][1]["annotations"];
        notes["dev.verilay.image.digest"] = evil.digest.clone().into();
        notes["dev.verilay.image.blob"] = evil.blob.clone().into();
        notes["dev.verilay.image.size"] = evil.size.to_string().into();
    }
    let forged_bound = serde_json::to_vec(&forged_bound).unwrap();
    let forged_bound_digest = digest_of(&forged_bound);
    reg.put_manifest(
        &format!("app:{forged_bound_digest}"),
        std::str::from_utf8(&forged_bound).unwrap(),
        MANIFEST,
    );
    reg.put_manifest(
        "app:v1",
        std::str::from_utf8(&forged_bound).unwrap(),
        MANIFEST,
    );
    let platform = serde_json::json!({"architecture": "amd64", "os": "linux"});
    let twice = serde_json::json!({
        "schemaVersion": 2, "mediaType": INDEX,
        "manifests": [
            {"mediaType": MANIFEST, "digest": pinned, "size": bound.len(), "platform": platform},
            {"mediaType": MANIFEST, "digest": forged_bound_digest, "size": forged_bound.len(),
             "platform": {"architecture": "arm64", "os": "linux"}},
        ],
    })
    .to_string();
    let twice_digest = digest_of(twice.as_bytes());
    reg.put_manifest(&format!("app:{twice_digest}"), &twice, INDEX);

    let store = Store::start(t.path(), &[], &[]);
    let name = |r: &str| reg.reference(r).replacen("oci://", "", 1);
    // A podman of its own per image: no layer one pulled is reused by the next.
    let fresh = |n: &str| Podman::new(&t.path().join(n), reg.port, Some(&store.dir));

    // The original, pinned: the forged referrer is not followed; podman pulls the layer
    // blobs the manifest names, the ordinary way.
    assert_eq!(
        message(
            &fresh("original"),
            &name(&format!("app@{}", l.manifest)),
            &store
        ),
        ("genuine".to_string(), false)
    );
    // The bound manifest, pinned: the genuine image, served lazily by the store.
    assert_eq!(
        message(&fresh("bound"), &name(&format!("app@{pinned}")), &store),
        ("genuine".to_string(), true)
    );
    // One layer bound to two images in one index: refused (pulled the ordinary way).
    assert_eq!(
        message(
            &fresh("twice"),
            &name(&format!("app@{twice_digest}")),
            &store
        ),
        ("genuine".to_string(), false)
    );
    let log = std::fs::read_to_string(t.path().join("store.log")).unwrap();
    assert!(log.contains("bound to two different images"), "{log}");
    // A forged bound manifest is another digest, which pins what it binds (whoever owns
    // a tag decides what it names, for podman as for verilay); but the store served the
    // app layer as the genuine image already, and podman would file the forged image's
    // layer under the same blob and DiffID: checked against the layer blob, the forged
    // image does not hold it, and is refused. The digest the user pinned still runs the
    // genuine layer.
    let forged = fresh("forged");
    let forged_ref = name(&format!("app@{forged_bound_digest}"));
    let (pulled, said) = pull(&forged, &forged_ref);
    assert!(!pulled && said.contains(&l.layers[1]), "{said}");
    let log = std::fs::read_to_string(t.path().join("store.log")).unwrap();
    assert!(
        log.contains(&format!("image {} (bound by", evil.digest))
            && log.contains("does not hold the layer's files"),
        "{log}"
    );
    assert_eq!(
        message(&fresh("again"), &name(&format!("app@{pinned}")), &store),
        ("genuine".to_string(), true)
    );
}

/// A base layer that two images share, packed once (busybox, `/etc/msg` saying
/// `genuine`), and the layouts of image A (that layer, then `/etc/a`) and image B (that
/// layer, then `/etc/b`): B's own layer leaves `/etc/msg` to the base.
struct Shared {
    /// The base layer's directory and blob digest.
    dir: PathBuf,
    digest: String,
    a: Layout,
    b: Layout,
}

fn shared_base(base: &Path) -> Shared {
    let dirs = base.join("dirs");
    let (d, a, b) = (dirs.join("base"), dirs.join("a"), dirs.join("b"));
    sh(&format!(
        "set -e; mkdir -p {0}/bin {0}/etc {0}/tmp; cp \"$(command -v busybox)\" {0}/bin/busybox; \
         for c in sh cat; do ln -s busybox {0}/bin/$c; done; echo genuine > {0}/etc/msg; \
         mkdir -p {1}/etc {2}/etc; echo a > {1}/etc/a; echo b > {2}/etc/b",
        d.display(),
        a.display(),
        b.display()
    ));
    let packed = pack(&base.join("packed"), "base", &d);
    let layout = |name: &str, top: &Path| {
        let at = base.join(name);
        let own = pack(&at, "top", top);
        layout_of(&at, "v1", &[packed.clone(), own])
    };
    let (a, b) = (layout("a", &a), layout("b", &b));
    assert_eq!(a.layers[0], b.layers[0], "one base layer blob");
    Shared {
        digest: a.layers[0].clone(),
        dir: d,
        a,
        b,
    }
}

/// `verilay convert` of a layout to `dest` (`REPO:TAG`) in `reg`: its JSON report.
fn convert(reg: &Registry, l: &Layout, dest: &str, extra: &[&str]) -> serde_json::Value {
    json(
        &run(verilay()
            .arg("convert")
            .arg(format!("oci:{}:v1", l.dir.display()))
            .arg(reg.docker(dest))
            .args(["--insecure", "--json", "--quiet"])
            .args(extra))
        .stdout,
    )
}

/// The bound manifest `pinned` of `repo` with its base layer (the genuine blob: digest,
/// size and DiffID) bound to `x` instead, stored with the layer artifacts it leads to:
/// an image anyone may publish, and a user may pin. Its digest.
fn rebind_base(reg: &Registry, repo: &str, pinned: &str, x: &Evil) -> String {
    let mut m = json(&get(reg, &format!("{repo}/manifests/{pinned}")));
    let notes = &mut m["layers"][0]["annotations"];
    notes["dev.verilay.image.digest"] = x.digest.clone().into();
    notes["dev.verilay.image.blob"] = x.blob.clone().into();
    notes["dev.verilay.image.size"] = x.size.to_string().into();
    let bytes = serde_json::to_vec(&m).unwrap();
    let digest = digest_of(&bytes);
    reg.put_manifest(
        &format!("{repo}:{digest}"),
        std::str::from_utf8(&bytes).unwrap(),
        MANIFEST,
    );
    for c in oci::conversion::bound_layers(&bytes).unwrap() {
        let artifact = oci::conversion::layer_manifest(&c);
        reg.put_manifest(
            &format!("{repo}:{}", digest_of(&artifact)),
            std::str::from_utf8(&artifact).unwrap(),
            MANIFEST,
        );
    }
    digest
}

/// The attacker's image A: converted, then its base layer bound to an image of D's files
/// with `/etc/msg` saying `attacker` (converted from such a layer, so that file is all
/// that differs). The bound manifest's digest, and that image.
fn attacker_image(base: &Path, reg: &Registry, s: &Shared) -> (String, Evil) {
    let a = convert(reg, &s.a, "attacker:v1", &[]);
    let x_dir = base.join("dirs/x");
    sh(&format!(
        "cp -a {} {1} && echo attacker > {1}/etc/msg",
        s.dir.display(),
        x_dir.display()
    ));
    let xl = layout_of(
        &base.join("x"),
        "v1",
        &[pack(&base.join("x"), "base", &x_dir)],
    );
    let xj = &convert(reg, &xl, "attacker:x", &[])["manifests"][0]["layers"][0];
    let x = Evil {
        digest: xj["image_digest"].as_str().unwrap().to_string(),
        blob: xj["image_blob"].as_str().unwrap().to_string(),
        size: xj["image_bytes"].as_u64().unwrap() as usize,
    };
    (
        rebind_base(reg, "attacker", a["pinned"].as_str().unwrap(), &x),
        x,
    )
}

/// `podman pull IMAGE`: whether it succeeded, and what it printed on stderr.
fn pull(pod: &Podman, image: &str) -> (bool, String) {
    let out = pod.cmd().args(["pull", "-q", image]).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether the bottom layer of `image` in podman's storage is a layer of the store.
fn base_from_store(pod: &Podman, image: &str, store: &Store) -> bool {
    let diffs = pod.layer_diffs(image);
    std::fs::read_link(&diffs[0]).is_ok_and(|t| t.starts_with(&store.dir))
}

/// Cross-image layer poisoning: containers/storage keeps a layer under its blob digest
/// and DiffID and reuses it for every later image listing either, so an image A whose
/// bound manifest binds a popular base layer D (genuine digest, size and DiffID) to an
/// image of other content decided what D held for every image pulled after it: B,
/// genuine, converted honestly or not converted at all, ran A's files. Now the store
/// keeps which images it served for each layer; asked about D for another image, it first
/// checks A's image against D's blob (rebuilt as `convert` builds it, compared file by
/// file) and, as it differs, refuses D to every other image: their pulls fail, naming D,
/// and nothing of A's image runs for them. A's user pinned A, and A still runs what it
/// binds.
#[test]
fn a_shared_layer_bound_to_other_contents_never_runs_for_another_image() {
    if podman_prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let reg = Registry::start(false);
    let s = shared_base(t.path());

    let (a_pinned, x) = attacker_image(t.path(), &reg, &s);
    // B, genuine, sharing D: converted honestly (its original copied along).
    let b = convert(&reg, &s.b, "app:v1", &[]);
    let b_pinned = b["pinned"].as_str().unwrap().to_string();

    let store = Store::start(t.path(), &[], &[]);
    let name = |r: &str| reg.reference(r).replacen("oci://", "", 1);
    // One podman, one storage: where a layer is reused.
    let pod = Podman::new(&t.path().join("pod"), reg.port, Some(&store.dir));
    let a_ref = name(&format!("attacker@{a_pinned}"));
    run(pod.cmd().args(["pull", "-q", &a_ref]));
    let (code, out, err) = pod.run(&a_ref, &["cat", "/etc/msg"]);
    assert_eq!((code, out.trim()), (0, "attacker"), "{err}");

    // B, converted and not: refused, naming D, and A's files never run for it.
    let refused = |store: &Store| {
        for b in [&b_pinned, &s.b.manifest] {
            let r = name(&format!("app@{b}"));
            let (pulled, said) = pull(&pod, &r);
            let (code, out, err) = pod.run(&r, &["cat", "/etc/msg"]);
            assert!(
                !out.contains("attacker"),
                "{r} ran A's image of its base layer {}: {out:?}",
                s.digest
            );
            assert!(!pulled, "{r}: pulled: {said}");
            assert!(said.contains(&s.digest), "{r}: {said}");
            assert_ne!(code, 0, "{r}: {out} {err}");
            assert!(!err.contains("attacker"), "{err}");
        }
        std::fs::read_to_string(store.dir.parent().unwrap().join("store.log")).unwrap()
    };
    let log = refused(&store);
    let verdict = log
        .lines()
        .find(|l| l.contains("does not hold"))
        .unwrap_or_else(|| panic!("no verdict: {log}"));
    for part in [
        s.digest.as_str(),
        x.digest.as_str(),
        "attacker@",
        "/etc/msg",
    ] {
        assert!(verdict.contains(part), "{part}: {verdict}");
    }
    // A still runs what its user pinned.
    let (code, out, err) = pod.run(&a_ref, &["cat", "/etc/msg"]);
    assert_eq!((code, out.trim()), (0, "attacker"), "{err}");

    // The verdict outlives the store: started again, it refuses B without checking again.
    drop(store);
    let store = Store::start(t.path(), &[], &[]);
    let log = refused(&store);
    assert!(!log.contains("checking"), "{log}");
    assert!(log.contains("refused"), "{log}");
}

/// The benign side of cross-image layer reuse: A binds D to an honest conversion of it,
/// and B shares D unconverted, or converted with other build options (another image of
/// the same files). Asked about D for B, the store checks A's image against D's blob
/// once, finds that it holds D's files, and lets podman reuse it (or serves B's own
/// image, checked too): B runs `genuine`.
#[test]
fn a_shared_layer_whose_image_holds_it_is_reused_after_a_check() {
    if podman_prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let reg = Registry::start(false);
    let s = shared_base(t.path());
    let a = convert(&reg, &s.a, "base:v1", &[]);
    let a_pinned = a["pinned"].as_str().unwrap().to_string();
    let b = convert(&reg, &s.b, "app:v1", &["-z", "lz4hc"]);
    let b_pinned = b["pinned"].as_str().unwrap().to_string();
    let image_of_d = |j: &serde_json::Value| j["manifests"][0]["layers"][0]["image_digest"].clone();
    assert_ne!(image_of_d(&a), image_of_d(&b), "two images of D");

    let store = Store::start(t.path(), &[], &[]);
    let name = |r: &str| reg.reference(r).replacen("oci://", "", 1);
    let pod = Podman::new(&t.path().join("pod"), reg.port, Some(&store.dir));
    for (r, lazy) in [
        (name(&format!("base@{a_pinned}")), true),
        // Unconverted: podman reuses A's layer of D once the store found it to hold D.
        (name(&format!("app@{}", s.b.manifest)), true),
        (name(&format!("app@{b_pinned}")), true),
    ] {
        let (pulled, said) = pull(&pod, &r);
        assert!(pulled, "{r}: {said}");
        let (code, out, err) = pod.run(&r, &["cat", "/etc/msg"]);
        assert_eq!((code, out.trim()), (0, "genuine"), "{r}: {err}");
        let log = || std::fs::read_to_string(t.path().join("store.log")).unwrap();
        assert_eq!(base_from_store(&pod, &r, &store), lazy, "{r}: {}", log());
    }
    let log = std::fs::read_to_string(t.path().join("store.log")).unwrap();
    let held = log
        .lines()
        .filter(|l| l.contains("holds the layer's files"));
    assert_eq!(held.count(), 2, "A's image, then B's own: {log}");
    assert!(!log.contains("does not hold"), "{log}");
}

// --- A hostile registry: a server on 127.0.0.1 that answers as the test tells it.

/// How the hostile server answers one request: status, headers, body, and how slowly
/// (`Some((bytes, pause))`: that many body bytes, then the pause, until the body ends).
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    trickle: Option<(usize, std::time::Duration)>,
}

impl Answer {
    fn ok(body: &[u8], content_type: &str) -> Answer {
        Answer {
            status: 200,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.to_vec(),
            trickle: None,
        }
    }
}

/// A server on 127.0.0.1 answering each request (method, path, headers) with `answer`;
/// it records every request's head. Stops when dropped (its connections end with it).
struct Hostile {
    port: u16,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Hostile {
    fn start(answer: impl Fn(&str, &str) -> Answer + Send + Sync + 'static) -> Hostile {
        use std::io::{BufRead, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let answer = std::sync::Arc::new(answer);
        let (h, s) = (heads.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let (h, s, answer) = (h.clone(), s.clone(), answer.clone());
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(30)));
                    let mut r = std::io::BufReader::new(conn.try_clone().unwrap());
                    loop {
                        let mut head = String::new();
                        loop {
                            let mut line = String::new();
                            if r.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            head.push_str(&line);
                        }
                        h.lock().unwrap().push(head.clone());
                        let first = head.lines().next().unwrap_or("").to_string();
                        let mut f = first.split(' ');
                        let (method, path) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
                        let a = answer(method, path);
                        let mut out = format!("HTTP/1.1 {} X\r\n", a.status);
                        for (k, v) in &a.headers {
                            out.push_str(&format!("{k}: {v}\r\n"));
                        }
                        out.push_str(&format!("Content-Length: {}\r\n\r\n", a.body.len()));
                        if conn.write_all(out.as_bytes()).is_err() {
                            return;
                        }
                        let body = if method == "HEAD" {
                            &[][..]
                        } else {
                            &a.body[..]
                        };
                        match a.trickle {
                            None => {
                                if conn.write_all(body).is_err() {
                                    return;
                                }
                            }
                            Some((n, pause)) => {
                                for piece in body.chunks(n) {
                                    if s.load(Ordering::Relaxed) || conn.write_all(piece).is_err() {
                                        return;
                                    }
                                    std::thread::sleep(pause);
                                }
                            }
                        }
                    }
                });
            }
        });
        Hostile { port, heads, stop }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A verilay image artifact as `push` stores it, of a small image: (manifest, its digest,
/// blob bytes).
fn small_artifact(base: &Path) -> (Vec<u8>, String, Vec<u8>, String) {
    let src = base.join("small-src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), vec![b'x'; 300_000]).unwrap();
    let image = base.join("small.img");
    let out = build(&src, &image, &["--quiet"]);
    let image_digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let blob = std::fs::read(&image).unwrap();
    let manifest = oci::artifact::manifest(
        &digest_of(&blob),
        blob.len() as u64,
        &image_digest,
        "small.img",
    );
    let digest = digest_of(&manifest);
    (manifest, digest, blob, image_digest)
}

/// `verilay ARGS` with an empty auth file, stopped after 60 s: (exit code, stderr, time).
fn bounded(args: &[&str], auth: &Path) -> (Option<i32>, String, std::time::Duration) {
    let start = std::time::Instant::now();
    let out = Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_verilay"))
        .args(args)
        .env("REGISTRY_AUTH_FILE", auth)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        start.elapsed(),
    )
}

/// Issue 36, item 2: a token server trickling its answer kept `mount --timeout 3` running
/// until killed; a trickled blob kept `pull --timeout 3` running and left its partial
/// file. Every request now has an overall bound from `--timeout` (a blob must bring 64 KiB
/// each period), each failure is one line, and nothing partial is left.
#[test]
fn a_trickling_server_cannot_outlast_the_timeout() {
    let t = tempfile::tempdir().unwrap();
    let auth = t.path().join("auth.json");
    std::fs::write(&auth, "{}").unwrap();
    let (manifest, digest, blob, image_digest) = small_artifact(t.path());
    let slow = std::time::Duration::from_millis(500);
    let port_cell = std::sync::Arc::new(std::sync::OnceLock::<u16>::new());
    let pc = port_cell.clone();
    let tokens = Hostile::start(move |_, path| {
        let port = *pc.get().unwrap();
        let challenge = Answer {
            status: 401,
            headers: vec![(
                "WWW-Authenticate".into(),
                format!("Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"x\""),
            )],
            body: vec![],
            trickle: None,
        };
        if path.starts_with("/token") {
            Answer {
                trickle: Some((1, slow)),
                ..Answer::ok(
                    b"{\"token\":\"abcdefghijklmnopqrstuvwxyz\"}",
                    "application/json",
                )
            }
        } else {
            challenge
        }
    });
    port_cell.set(tokens.port).unwrap();
    let (m, d, b) = (manifest.clone(), digest.clone(), blob.clone());
    let blobs = Hostile::start(move |_, path| {
        if path.contains("/manifests/") {
            Answer::ok(&m, "application/vnd.oci.image.manifest.v1+json")
        } else if path.contains("/blobs/") {
            Answer {
                trickle: Some((100, std::time::Duration::from_millis(100))),
                ..Answer::ok(&b, "application/octet-stream")
            }
        } else {
            let _ = &d;
            Answer::ok(b"{}", "application/json")
        }
    });
    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = out_dir.join("x.img");
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let at = |port: u16| format!("oci://127.0.0.1:{port}/app@{digest}");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "pull".into(),
                at(tokens.port),
                "-o".into(),
                out.display().to_string(),
            ],
            "token server",
        ),
        (
            vec![
                "mount".into(),
                at(tokens.port),
                mnt.display().to_string(),
                "--no-cache".into(),
            ],
            "token server",
        ),
        (
            vec![
                "pull".into(),
                at(blobs.port),
                "-o".into(),
                out.display().to_string(),
            ],
            "fewer than 65536",
        ),
    ];
    for (args, needle) in cases {
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["--insecure", "--timeout", "2"]);
        let (code, err, took) = bounded(&args, &auth);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            took < std::time::Duration::from_secs(15),
            "{args:?}: {took:?}"
        );
        let left: Vec<_> = std::fs::read_dir(&out_dir).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
    assert!(mount_at_none(&mnt));
    let _ = image_digest;
}

fn mount_at_none(mnt: &Path) -> bool {
    let canon = std::fs::canonicalize(mnt).unwrap();
    !std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(canon.to_str().unwrap()))
}

/// Issue 36, item 4: a local `--insecure` registry whose token realm is plain HTTP on
/// another host received the auth file's credentials in cleartext. Credentials travel
/// over TLS, or over plain HTTP to this machine only: the token request is refused before
/// anything is sent, and the registry itself never sees them either.
#[test]
fn credentials_never_travel_in_the_clear_off_this_machine() {
    use base64::Engine as _;
    let t = tempfile::tempdir().unwrap();
    let (_, digest, _, _) = small_artifact(t.path());
    let registry = Hostile::start(|_, _| Answer {
        status: 401,
        headers: vec![(
            "WWW-Authenticate".into(),
            "Bearer realm=\"http://token.example/token\",service=\"x\"".into(),
        )],
        body: vec![],
        trickle: None,
    });
    let auth = t.path().join("auth.json");
    let secret = base64::engine::general_purpose::STANDARD.encode("u:secret");
    std::fs::write(
        &auth,
        format!(
            r#"{{"auths":{{"127.0.0.1:{}":{{"auth":"{secret}"}}}}}}"#,
            registry.port
        ),
    )
    .unwrap();
    let out = t.path().join("x.img");
    let (code, err, _) = bounded(
        &[
            "pull",
            &format!("oci://127.0.0.1:{}/app@{digest}", registry.port),
            "-o",
            out.to_str().unwrap(),
            "--insecure",
            "--timeout",
            "5",
        ],
        &auth,
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("neither https nor on this machine"), "{err}");
    let heads = registry.heads();
    assert!(!heads.is_empty());
    assert!(
        heads
            .iter()
            .all(|h| !h.to_ascii_lowercase().contains("authorization")),
        "{heads:?}"
    );
}

/// Issue 36, item 3: `pull` wrote whatever the server sent up to the manifest's size claim
/// (2^63-1 accepted), and a 72 KB zstd layer of zeros became a 2.1 GB image. Each limit
/// is named when hit, before the bytes are spent: an image's size, a layer's expanded
/// size, an image's layer count.
#[test]
fn what_a_registry_or_layer_claims_cannot_fill_the_disk() {
    let t = tempfile::tempdir().unwrap();
    let auth = t.path().join("auth.json");
    std::fs::write(&auth, "{}").unwrap();
    let (manifest, _, _, _) = small_artifact(t.path());
    let mut huge: serde_json::Value = json(&manifest);
    huge["layers"][0]["size"] = serde_json::json!(i64::MAX);
    let huge = serde_json::to_vec(&huge).unwrap();
    let huge_digest = digest_of(&huge);
    let registry = Hostile::start(move |_, path| {
        if path.contains("/manifests/") {
            Answer::ok(&huge, "application/vnd.oci.image.manifest.v1+json")
        } else {
            Answer::ok(&vec![0u8; 1 << 20], "application/octet-stream")
        }
    });
    let out = t.path().join("x.img");
    let (code, err, _) = bounded(
        &[
            "pull",
            &format!("oci://127.0.0.1:{}/app@{huge_digest}", registry.port),
            "-o",
            out.to_str().unwrap(),
            "--insecure",
        ],
        &auth,
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("more than the limit") && err.contains("--max-size"),
        "{err}"
    );
    assert!(registry.heads().iter().all(|h| !h.contains("/blobs/")));

    if skip_unless(
        have("docker-registry"),
        "needs docker-registry (scripts/setup)",
    ) {
        return;
    }
    // A layer of 64 MiB of zeros (64 KiB gzipped), and a second layer.
    let (l0, l1) = (t.path().join("l0"), t.path().join("l1"));
    sh(&format!(
        "mkdir -p {0} {1} && head -c 67108864 /dev/zero > {0}/zeros && echo x > {1}/x",
        l0.display(),
        l1.display()
    ));
    let l = layout(t.path(), "v1", &[l0, l1]);
    let reg = Registry::start(false);
    let src = format!("oci:{}:v1", l.dir.display());
    for (extra, needles) in [
        (
            ["--max-layer-size", "16M"],
            &[
                "layer 1/2",
                "larger than the limit of 16777216 bytes",
                "--max-layer-size",
            ][..],
        ),
        (["--max-layers", "1"], &["2 layers", "--max-layers"][..]),
    ] {
        let out = verilay()
            .args(["convert", &src, &reg.docker("app:v1"), "--insecure", "-q"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        for n in needles {
            assert!(err.contains(n), "{extra:?}: {err} lacks {n}");
        }
    }
    // A source whose manifest claims a 2^62-byte layer blob: refused before a byte of it
    // is fetched (the blob is written whole before it can be checked).
    let h = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let claim = serde_json::json!({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": h('c'), "size": 2},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": h('1'), "size": 1u64 << 62}],
    })
    .to_string();
    let source = Hostile::start(move |_, path| match path.contains("/manifests/") {
        true => Answer::ok(claim.as_bytes(), MANIFEST),
        false => Answer::ok(&vec![0u8; 1 << 20], "application/octet-stream"),
    });
    let out = verilay()
        .arg("convert")
        .arg(format!("docker://127.0.0.1:{}/app:v1", source.port))
        .args([&reg.docker("claimed:v1"), "--insecure", "-q"])
        .env("REGISTRY_AUTH_FILE", &auth)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("more than the limit") && err.contains("--max-layer-size"),
        "{err}"
    );
    assert!(source.heads().iter().all(|h| !h.contains("/blobs/")));
}

/// Issue 36, item 1: a conversion found only as a referrer is used only when it is signed
/// by a key the user trusts for that image (policy.json's `sigstoreSigned`, registries.d's
/// `use-sigstore-attachments`, signatures where `skopeo copy --sign-by-sigstore-private-key`
/// stores them). A forged conversion listed first and signed by another key is passed
/// over; the publisher's signed conversion serves the layers lazily; two conversions
/// that both verify and disagree on a layer are refused, never "the first".
#[test]
fn a_referrer_runs_only_when_signed_by_a_trusted_key() {
    if podman_prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let reg = Registry::start(false);
    let keys = |name: &str| {
        let (private, public) = signatures::generate_key(b"pass").unwrap();
        let (k, p) = (
            t.path().join(format!("{name}.key")),
            t.path().join(format!("{name}.pub")),
        );
        std::fs::write(&k, private).unwrap();
        std::fs::write(&p, public).unwrap();
        (k, p)
    };
    let (publisher, publisher_pub) = keys("publisher");
    let (attacker, _) = keys("attacker");
    let pass = t.path().join("pass");
    std::fs::write(&pass, "pass\n").unwrap();
    let l = layout(t.path(), "v1", &genuine_layers(t.path()));
    let out = run(verilay()
        .args([
            "convert",
            &format!("oci:{}:v1", l.dir.display()),
            &reg.docker("app:v1"),
        ])
        .args(["--insecure", "--json", "--sign-by-sigstore-private-key"])
        .arg(&publisher)
        .arg("--sign-passphrase-file")
        .arg(&pass));
    let j = json(&out.stdout);
    assert_eq!(j["signed"], true, "{j}");
    let genuine_conv = j["manifests"][0]["conversion"]
        .as_str()
        .unwrap()
        .to_string();
    let identity = format!("127.0.0.1:{}/app:v1", reg.port);
    let registry = oci::Registry::connect(
        &oci::Reference::parse(&reg.reference("app:v1")).unwrap(),
        true,
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    let sign = |key: &Path, digest: &str| {
        let (payload, sig) =
            signatures::sign(&std::fs::read(key).unwrap(), b"pass", &identity, digest).unwrap();
        signatures::attach(&registry, "app", digest, &payload, &sig).unwrap();
    };
    // The publisher signs the original image too (the policy covers every manifest).
    sign(&publisher, &l.manifest);

    // The attacker's conversion: the app layer bound to other content, signed with the
    // attacker's key, listed first.
    let evil = push_evil(t.path(), &reg);
    let forged_conv = forge_referrer(&reg, &l.manifest, &genuine_conv, &evil);
    sign(&attacker, &forged_conv);

    // The policy: the app repository needs the publisher's signature.
    let policy = t.path().join("policy.json");
    std::fs::write(
        &policy,
        serde_json::json!({
            "default": [{"type": "insecureAcceptAnything"}],
            "transports": {"docker": {format!("127.0.0.1:{}/app", reg.port): [
                {"type": "sigstoreSigned", "keyPath": publisher_pub}
            ]}},
        })
        .to_string(),
    )
    .unwrap();
    let regd = t.path().join("registries.d");
    std::fs::create_dir(&regd).unwrap();
    std::fs::write(
        regd.join("default.yaml"),
        "default-docker:\n  use-sigstore-attachments: true\n",
    )
    .unwrap();
    let original = reg
        .reference(&format!("app@{}", l.manifest))
        .replacen("oci://", "", 1);
    let store_args = [
        "--signature-policy",
        policy.to_str().unwrap(),
        "--registries.d",
        regd.to_str().unwrap(),
    ];
    {
        // The policy found where podman finds it ($HOME's), and the layer mounts the store
        // makes still work under it: their artifacts are pinned, not signed.
        let home = t.path().join("home");
        let conf = home.join(".config/containers");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::copy(&policy, conf.join("policy.json")).unwrap();
        std::fs::create_dir(conf.join("registries.d")).unwrap();
        std::fs::copy(
            regd.join("default.yaml"),
            conf.join("registries.d/default.yaml"),
        )
        .unwrap();
        let base = t.path().join("one");
        std::fs::create_dir(&base).unwrap();
        let store = Store::start(&base, &[], &[("HOME", home.to_str().unwrap())]);
        let pod = Podman::new(&base.join("pod"), reg.port, Some(&store.dir));
        assert_eq!(
            message(&pod, &original, &store),
            ("genuine".to_string(), true)
        );
        let log = std::fs::read_to_string(base.join("store.log")).unwrap();
        assert!(log.contains(&format!("conversion {forged_conv}")), "{log}");
    }
    // The forged conversion signed with the publisher's key as well: two signed
    // conversions disagree on the app layer, and neither is used.
    sign(&publisher, &forged_conv);
    let base = t.path().join("two");
    std::fs::create_dir(&base).unwrap();
    let store = Store::start(&base, &store_args, &[]);
    let pod = Podman::new(&base.join("pod"), reg.port, Some(&store.dir));
    assert_eq!(
        message(&pod, &original, &store),
        ("genuine".to_string(), false)
    );
    let log = std::fs::read_to_string(base.join("store.log")).unwrap();
    assert!(log.contains("two different images"), "{log}");
}

/// A bound manifest of one tar layer, `layer` of `size` bytes, whose verilay image (and
/// config, DiffID) are made-up digests: what a registry hands the store to look up.
fn bound_one_layer(layer: &str, size: u64) -> Vec<u8> {
    let h = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let original = serde_json::json!({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": h('c'), "size": 2},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": size}],
    })
    .to_string();
    let mut source = oci::artifact::Descriptor::of("application/vnd.oci.image.layer.v1.tar", b"");
    source.digest = layer.to_string();
    source.size = size;
    let converted = oci::conversion::ConvertedLayer {
        source,
        diff_id: h('d'),
        tar_size: size,
        image_blob: h('e'),
        image_size: 4096,
        image_digest: h('f'),
    };
    oci::conversion::bind(original.as_bytes(), &[converted]).unwrap()
}

/// A registry binding one layer, `blob`, in every manifest, and sending that blob in
/// pieces of `trickle.0` bytes, `trickle.1` apart.
fn trickling_blob(blob: Vec<u8>, trickle: (usize, std::time::Duration)) -> Hostile {
    let bound = bound_one_layer(&digest_of(&blob), blob.len() as u64);
    Hostile::start(move |_, path| {
        if path.contains("/manifests/") {
            Answer::ok(&bound, MANIFEST)
        } else if path.contains("/blobs/") {
            Answer {
                trickle: Some(trickle),
                ..Answer::ok(&blob, "application/octet-stream")
            }
        } else {
            Answer::ok(b"{}", "application/json")
        }
    })
}

/// Issue 36, item 2: a trickled layer blob wedged the layer store (`info` of another,
/// already resolved reference hung until the registry died) and each concurrent reader of
/// `blob` fetched the whole blob again. Now one fetch serves every reader waiting for it
/// (its failure too), at most 4 readers take threads for blobs, the fetch ends within
/// its bound, and another reference's `info` is served meanwhile.
#[test]
fn a_trickled_blob_never_wedges_the_layer_store() {
    use base64::Engine as _;
    if skip_unless(is_root(), "the layer store is root's") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let blob = vec![7u8; 200_000];
    let layer_digest = digest_of(&blob);
    let registry = trickling_blob(blob, (100, std::time::Duration::from_millis(100)));
    let store = Store::start(t.path(), &["--timeout", "2"], &[]);
    let dir = |tag: &str| {
        let r = format!("127.0.0.1:{}/app:{tag}", registry.port);
        store
            .dir
            .join(base64::engine::general_purpose::STANDARD.encode(r))
            .join(&layer_digest)
    };
    let (one, two) = (dir("v1"), dir("v2"));
    assert!(one.join("info").exists() && two.join("info").exists());
    let start = std::time::Instant::now();
    let readers: Vec<_> = (0..6)
        .map(|_| {
            let b = one.join("blob");
            std::thread::spawn(move || std::fs::read(b).map(|v| v.len()))
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Another reference's info, while six readers wait for the trickle.
    let info_start = std::time::Instant::now();
    let info = std::fs::read(two.join("info")).unwrap();
    assert!(!info.is_empty());
    assert!(
        info_start.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        info_start.elapsed()
    );
    for r in readers {
        let err = r
            .join()
            .unwrap()
            .expect_err("a trickled blob is never served");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    }
    assert!(
        start.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let fetches = registry
        .heads()
        .iter()
        .filter(|h| h.contains("/blobs/"))
        .count();
    assert_eq!(fetches, 1, "one fetch for every reader");
}

/// A registry that paces a blob just above the per-period floor (64 KiB per `--timeout`)
/// would hold the store's blob reader, and a check's one lock, for as long as the blob
/// lasts (days for a big one, whatever size it claims). A fetch must now keep 256 KiB/s on
/// average past its first 4 periods of `--timeout`. Here, with `--timeout 2`, a 2 MiB blob
/// at 64 KiB a second (32 s whole) fails once 8 s + its bytes' 4 s per MiB have passed
/// (about 10.7 s), naming the bound, and is fetched once.
#[test]
fn a_paced_blob_fetch_ends_within_its_overall_deadline() {
    use base64::Engine as _;
    if skip_unless(is_root(), "the layer store is root's") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let blob = vec![9u8; 2 << 20];
    let layer_digest = digest_of(&blob);
    let registry = trickling_blob(blob, (64 << 10, std::time::Duration::from_secs(1)));
    let store = Store::start(t.path(), &["--timeout", "2"], &[]);
    let r = format!("127.0.0.1:{}/app:v1", registry.port);
    let dir = store
        .dir
        .join(base64::engine::general_purpose::STANDARD.encode(r))
        .join(&layer_digest);
    assert!(dir.join("info").exists());
    let start = std::time::Instant::now();
    let err = std::fs::read(dir.join("blob")).expect_err("a paced blob is never served");
    let took = start.elapsed();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        took >= std::time::Duration::from_secs(10) && took < std::time::Duration::from_secs(16),
        "the fetch ended after {took:?}, not when it fell below 256 KiB/s (about 10.7 s)"
    );
    let log = std::fs::read_to_string(t.path().join("store.log")).unwrap();
    assert!(
        log.contains("slower than 256 KiB/s on average past 4 periods of --timeout"),
        "{log}"
    );
    let fetches = registry
        .heads()
        .iter()
        .filter(|h| h.contains("/blobs/"))
        .count();
    assert_eq!(fetches, 1, "{:?}", registry.heads());
}

/// Issue 36, item 3: the store fetches an original layer blob whole before it can check
/// it, so what a bound manifest claims of its size is capped (32 GiB): a claim of 2^62
/// bytes fails the blob's read with EIO and one log line naming the limit, before a byte
/// of it is asked for.
#[test]
fn a_blob_claimed_past_the_stores_limit_is_never_fetched() {
    use base64::Engine as _;
    if skip_unless(is_root(), "the layer store is root's") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let h = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let claimed = 1u64 << 62;
    let bound = bound_one_layer(&h('1'), claimed);
    let registry = Hostile::start(move |_, path| {
        if path.contains("/manifests/") {
            Answer::ok(&bound, MANIFEST)
        } else {
            Answer::ok(&vec![0u8; 1 << 20], "application/octet-stream")
        }
    });
    let store = Store::start(t.path(), &["--timeout", "2"], &[]);
    let r = format!("127.0.0.1:{}/app:v1", registry.port);
    let layer = store
        .dir
        .join(base64::engine::general_purpose::STANDARD.encode(r))
        .join(h('1'));
    assert!(layer.join("info").exists());
    // Read into a small buffer: the node's size is the claim, which std::fs::read
    // would try to reserve.
    let mut f = std::fs::File::open(layer.join("blob")).unwrap();
    let err = std::io::Read::read(&mut f, &mut [0u8; 4096]).expect_err("a blob past the limit");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        registry.heads().iter().all(|h| !h.contains("/blobs/")),
        "{:?}",
        registry.heads()
    );
    let log = std::fs::read_to_string(t.path().join("store.log")).unwrap();
    assert!(
        log.lines().any(|l| l.contains("blob")
            && l.contains(&format!("{claimed} bytes, more than the {}", 32u64 << 30))),
        "{log}"
    );
}

/// Issue 36, items 2 and 3: a registry listing many slow manifests in an index held one
/// layer-store lookup for as long as it liked, and each concurrent lookup of the same
/// reference asked again. A lookup now has one budget (4 periods of `--timeout`), and
/// concurrent lookups of a reference share one answer.
#[test]
fn a_lookup_has_one_deadline_and_concurrent_ones_share_it() {
    use base64::Engine as _;
    if skip_unless(is_root(), "the layer store is root's") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let h = |i: usize| format!("sha256:{:064x}", i + 1);
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": h(0), "size": 2},
        "layers": [],
    })
    .to_string();
    // 32 distinct manifests (each a different annotation), each sent slowly (~0.9 s).
    let manifests: Vec<String> = (0..32)
        .map(|i| {
            manifest.replacen(
                "\"layers\"",
                &format!("\"annotations\":{{\"n\":\"{i}\"}},\"layers\""),
                1,
            )
        })
        .collect();
    let index = serde_json::json!({
        "schemaVersion": 2, "mediaType": INDEX,
        "manifests": manifests.iter().map(|m| serde_json::json!({
            "mediaType": MANIFEST, "digest": digest_of(m.as_bytes()), "size": m.len(),
            "platform": {"architecture": "amd64", "os": "linux"},
        })).collect::<Vec<_>>(),
    })
    .to_string();
    let by_digest: std::collections::HashMap<String, String> = manifests
        .iter()
        .map(|m| (digest_of(m.as_bytes()), m.clone()))
        .collect();
    let registry = Hostile::start(move |_, path| {
        match path.rsplit('/').next().and_then(|d| by_digest.get(d)) {
            Some(m) => Answer {
                trickle: Some((m.len() / 3 + 1, std::time::Duration::from_millis(300))),
                ..Answer::ok(m.as_bytes(), MANIFEST)
            },
            None if path.contains("/manifests/") => Answer::ok(index.as_bytes(), INDEX),
            None => Answer::ok(b"{}", "application/json"),
        }
    });
    let store = Store::start(t.path(), &["--timeout", "1"], &[]);
    let r = format!("127.0.0.1:{}/app:v1", registry.port);
    let dir = store
        .dir
        .join(base64::engine::general_purpose::STANDARD.encode(&r));
    let start = std::time::Instant::now();
    // Three layers of one reference (three names: the kernel merges lookups of one).
    let lookups: Vec<_> = (7..10)
        .map(|i| {
            let d = dir.join(h(i));
            std::thread::spawn(move || std::fs::metadata(d))
        })
        .collect();
    for l in lookups {
        let err = l.join().unwrap().expect_err("no such layer");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    }
    // 32 manifests at ~0.9 s each would take ~29 s; the budget is 4 s plus one request.
    assert!(
        start.elapsed() < std::time::Duration::from_secs(12),
        "{:?}",
        start.elapsed()
    );
    let index_gets = registry
        .heads()
        .iter()
        .filter(|h| h.contains("/manifests/v1"))
        .count();
    // Shared while one runs, kept (an error too) for a moment after.
    assert_eq!(index_gets, 1, "one registry lookup for three");
    let log = std::fs::read_to_string(t.path().join("store.log")).unwrap();
    assert!(log.contains("times --timeout"), "{log}");
}

/// The same attack on containerd through `verilay snapshotter`. containerd files a layer
/// under its chain ID and reuses it, without asking the snapshotter, for every later image
/// of the namespace with the same chain. So:
/// - by default, a layer served for A is checked when containerd asks for it again (B in
///   another namespace): A's image differs from the blob, so containerd unpacks the
///   genuine blob for B, and B runs `genuine`, while A runs what its user pinned;
/// - with `--check-layers`, A's conversion is checked before it is first served: it is not
///   served at all, A's base is the genuine blob too, and B, in A's namespace, runs
///   `genuine`.
#[test]
fn a_containerd_layer_bound_to_other_contents_never_runs_for_another_image() {
    use crate::common::containerd::*;
    if remote_prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let reg = Registry::start(false);
    let s = shared_base(t.path());
    let (a_pinned, x) = attacker_image(t.path(), &reg, &s);
    convert(&reg, &s.b, "app:v1", &[]);
    let a_ref = format!("127.0.0.1:{}/attacker@{a_pinned}", reg.port);
    let b_ref = format!("127.0.0.1:{}/app@{}", reg.port, s.b.manifest);
    // `cat /etc/msg` in a container of `image` pulled into namespace `ns`.
    let msg = |c: &Setup, ns: &str, image: &str, id: &str| -> String {
        let out = c.rpull_in(ns, "verilay", image);
        assert!(out.status.success(), "{out:?}\n{}", c.logs());
        let out = run(c.containerd.ctr().args([
            "--namespace",
            ns,
            "run",
            "--rm",
            "--snapshotter",
            "verilay",
            image,
            &format!("{id}-{}", std::process::id()),
            "cat",
            "/etc/msg",
        ]));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };

    let c = Setup::start_with(&["--insecure"]);
    assert_eq!(msg(&c, "default", &a_ref, "a"), "attacker");
    assert_eq!(msg(&c, "other", &b_ref, "b"), "genuine", "{}", c.logs());
    let log = c.log();
    assert!(
        log.contains(&format!("layer {}", s.digest))
            && log.contains("does not hold")
            && log.contains("containerd pulls and unpacks it"),
        "{log}"
    );
    drop(c);

    let c = Setup::start_with(&["--insecure", "--check-layers"]);
    assert_eq!(msg(&c, "default", &a_ref, "a"), "genuine", "{}", c.logs());
    assert_eq!(msg(&c, "default", &b_ref, "b"), "genuine", "{}", c.logs());
    let log = c.log();
    assert!(
        log.contains(&format!(
            "its conversion (image {}) does not hold",
            x.digest
        )),
        "{log}"
    );
}

/// A registry's error text reaches the user's terminal in verilay's error line: its
/// escape sequences (here a window title and a screen clear, as JSON escapes) come out
/// as escapes, on one line, and the registry's words are still there.
#[test]
fn a_registrys_escape_sequences_never_reach_the_terminal() {
    let t = tempfile::tempdir().unwrap();
    let auth = t.path().join("auth.json");
    std::fs::write(&auth, "{}").unwrap();
    let evil = Hostile::start(|_, _| {
        Answer {
        status: 404,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: br#"{"errors":[{"code":"NAME_UNKNOWN","message":"gone\u001b]0;pwned\u0007\u001b[2J\r\nfake: ok"}]}"#.to_vec(),
        trickle: None,
    }
    });
    let reference = format!("oci://127.0.0.1:{}/app:v1", evil.port);
    let out = t.path().join("out.img");
    let args = ["pull", "--insecure", "--timeout", "10", "-o"];
    let mut args: Vec<&str> = args.to_vec();
    let out_s = out.display().to_string();
    args.extend([out_s.as_str(), reference.as_str()]);
    let (code, stderr, _) = bounded(&args, &auth);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    assert!(
        !stderr.contains(['\u{1b}', '\u{7}', '\r']),
        "control characters reached the terminal: {stderr:?}"
    );
    assert!(
        stderr.contains("NAME_UNKNOWN gone\\u{1b}]0;pwned\\u{7}\\u{1b}[2J  fake: ok"),
        "{stderr:?}"
    );
    assert!(!out.exists());
    // `fsck` reports an image that does not open on stdout, itself.
    let pinned = format!(
        "oci://127.0.0.1:{}/app@sha256:{}",
        evil.port,
        "0".repeat(64)
    );
    let fsck = Command::new(env!("CARGO_BIN_EXE_verilay"))
        .args(["fsck", "--insecure", "--timeout", "10", &pinned])
        .env("REGISTRY_AUTH_FILE", &auth)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&fsck.stdout);
    assert_eq!(fsck.status.code(), Some(1), "{said}");
    assert!(said.contains("NAME_UNKNOWN gone\\u{1b}"), "{said:?}");
    assert!(!said.contains(['\u{1b}', '\u{7}', '\r']), "{said:?}");
}
