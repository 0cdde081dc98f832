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

    // The attacker's image: the app layer with other content, pushed to the repository.
    let evil_dir = t.path().join("evil");
    sh(&format!(
        "mkdir -p {0}/etc && echo attacker > {0}/etc/msg",
        evil_dir.display()
    ));
    let evil = t.path().join("evil.img");
    let built = build(&evil_dir, &evil, &["--quiet"]);
    let evil_digest = String::from_utf8_lossy(&built.stdout).trim().to_string();
    run(verilay()
        .arg("push")
        .arg(&evil)
        .arg(reg.reference("app:evil"))
        .args(["--insecure", "--quiet"]));
    let evil_bytes = std::fs::read(&evil).unwrap();
    let (evil_blob, evil_size) = (digest_of(&evil_bytes), evil_bytes.len());

    // A forged conversion: the genuine one with the app layer's image replaced, its
    // subject the genuine manifest; its layer artifact stored too, and a referrers index
    // (the tag schema this registry uses) listing it before the genuine one.
    let genuine = get(&reg, &format!("app/manifests/{genuine_conv}"));
    let mut forged = json(&genuine);
    {
        let app = &mut forged["layers"][1];
        app["digest"] = evil_blob.clone().into();
        app["size"] = evil_size.into();
        app["annotations"]["dev.verilay.image.digest"] = evil_digest.clone().into();
    }
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
        &format!("app:{}", l.manifest.replacen(':', "-", 1)),
        &referrers.to_string(),
        INDEX,
    );

    // A forged bound manifest (the genuine one with the evil image in the app layer's
    // annotations), moved onto the tag, and an index binding the layer twice.
    let bound = get(&reg, &format!("app/manifests/{pinned}"));
    let mut forged_bound = json(&bound);
    {
        let notes = &mut forged_bound["layers"][1]["annotations"];
        notes["dev.verilay.image.digest"] = evil_digest.clone().into();
        notes["dev.verilay.image.blob"] = evil_blob.clone().into();
        notes["dev.verilay.image.size"] = evil_size.to_string().into();
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
    // A forged bound manifest is another digest: it runs what that digest pins (whoever
    // owns a tag decides what it names, for podman as for verilay), and the digest the
    // user pinned still runs the genuine layer.
    assert_eq!(
        message(
            &fresh("forged"),
            &name(&format!("app@{forged_bound_digest}")),
            &store
        ),
        ("attacker".to_string(), true)
    );
    assert_eq!(
        message(&fresh("again"), &name(&format!("app@{pinned}")), &store),
        ("genuine".to_string(), true)
    );
}
