//! What a conversion reads before it writes anything: the manifests an OCI layout's index
//! leads to (linux images only, each once, each checked against its digest), the layer
//! limit, and the tag the bound manifest takes.

use convert::source::{docker_reference, Source};
use sha2::{Digest, Sha256};
use std::path::Path;

fn digest(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// Stores `bytes` as a blob of the layout at `dir`; its digest.
fn blob(dir: &Path, bytes: &[u8]) -> String {
    let d = digest(bytes);
    let p = dir.join("blobs/sha256").join(&d[7..]);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
    d
}

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// An image manifest of `layers` layers (not fetched by the plan).
fn manifest(dir: &Path, layers: usize, tell: &str) -> (String, usize) {
    let config = blob(dir, format!("{{\"tell\":\"{tell}\"}}").as_bytes());
    let layer = format!(
        r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:{}","size":10}}"#,
        "1".repeat(64)
    );
    let m = format!(
        r#"{{"schemaVersion":2,"mediaType":"{MANIFEST}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config}","size":2}},"layers":[{}]}}"#,
        vec![layer; layers].join(",")
    );
    (blob(dir, m.as_bytes()), m.len())
}

fn layout(dir: &Path, top: &str, top_size: usize, media_type: &str) {
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        dir.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"{media_type}","digest":"{top}","size":{top_size},"annotations":{{"org.opencontainers.image.ref.name":"v1"}}}}]}}"#
        ),
    )
    .unwrap();
}

fn opts(max_layers: usize) -> convert::Options {
    convert::Options {
        compression: None,
        max_layer_size: 1 << 30,
        max_layers,
        build_time: 0,
    }
}

fn no_registry(_: &oci::Reference) -> anyhow::Result<oci::Registry> {
    anyhow::bail!("no registry in this test")
}

#[test]
fn an_index_leads_to_its_linux_images_each_once_within_the_layer_limit() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let (amd, amd_len) = manifest(dir, 2, "amd64");
    let (arm, arm_len) = manifest(dir, 3, "arm64");
    let (win, win_len) = manifest(dir, 1, "windows");
    let entry = |d: &str, len: usize, os: &str| {
        format!(
            r#"{{"mediaType":"{MANIFEST}","digest":"{d}","size":{len},"platform":{{"os":"{os}","architecture":"x"}}}}"#
        )
    };
    let index = format!(
        r#"{{"schemaVersion":2,"mediaType":"{INDEX}","manifests":[{},{},{},{}]}}"#,
        entry(&amd, amd_len, "linux"),
        entry(&arm, arm_len, "linux"),
        entry(&amd, amd_len, "linux"),
        entry(&win, win_len, "windows"),
    );
    let top = blob(dir, index.as_bytes());
    layout(dir, &top, index.len(), INDEX);
    let spec = format!("oci:{}:v1", dir.display());
    let src = Source::open(&spec, &no_registry).unwrap();
    assert_eq!(src.name(), spec);
    let (root, root_desc, targets) = convert::plan(&src, None, &opts(3)).unwrap();
    assert_eq!(root, index.as_bytes());
    assert_eq!(root_desc.digest, top);
    let got: Vec<&str> = targets.iter().map(|t| t.desc.digest.as_str()).collect();
    assert_eq!(got, [amd.as_str(), arm.as_str()]);
    let e = convert::plan(&src, None, &opts(2))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(&format!(
            "manifest {arm} has 3 layers, more than the limit of 2"
        )),
        "{e}"
    );
}

#[test]
fn a_manifest_whose_bytes_are_not_its_digest_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let (m, len) = manifest(dir, 1, "one");
    let path = dir.join("blobs/sha256").join(&m[7..]);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] = b' ';
    std::fs::write(&path, bytes).unwrap();
    layout(dir, &m, len, MANIFEST);
    let src = Source::open(&format!("oci:{}", dir.display()), &no_registry).unwrap();
    let e = convert::plan(&src, None, &opts(8))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(&format!("the manifest {m}: its bytes hash to")),
        "{e}"
    );
}

#[test]
fn the_bound_manifest_takes_the_tag_given_else_the_sources_else_latest() {
    let t = tempfile::tempdir().unwrap();
    let (m, len) = manifest(t.path(), 1, "one");
    layout(t.path(), &m, len, MANIFEST);
    let layout_src = Source::open(&format!("oci:{}:v1", t.path().display()), &no_registry).unwrap();
    let dest = |s: &str| docker_reference(s).unwrap();
    let tag = |src: &Source, d: &str, given: bool| convert::dest_tag(src, &dest(d), given);
    assert_eq!(
        tag(&layout_src, "docker://r:5000/app:x", true).unwrap(),
        "x"
    );
    assert_eq!(
        tag(&layout_src, "docker://r:5000/app", false).unwrap(),
        "v1"
    );
    let untagged = Source::open(&format!("oci:{}", t.path().display()), &no_registry).unwrap();
    assert_eq!(
        tag(&untagged, "docker://r:5000/app", false).unwrap(),
        "latest"
    );
    let pinned = format!("docker://r:5000/app@sha256:{}", "2".repeat(64));
    assert!(tag(&layout_src, &pinned, true)
        .unwrap_err()
        .to_string()
        .contains("name a tag (or none), not a digest"));
    assert!(docker_reference("oci://r/app").is_err());
    assert!(Source::open("docker://r:5000/app:1", &no_registry)
        .err()
        .unwrap()
        .to_string()
        .contains("no registry in this test"));
}
