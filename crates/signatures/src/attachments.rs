//! Sigstore attachments as c/image reads and writes them: the signatures of manifest
//! `sha256:HEX` are the layers of the OCI manifest tagged `sha256-HEX.sig` in the same
//! repository; a layer of type [`SIGSTORE_MIME`] is one signature (its blob the
//! payload, its [`SIGNATURE_ANNOTATION`] the base64 signature). Every read is bounded.

use oci::registry::Body;
use oci::Registry;
use std::collections::BTreeMap;
use std::io::Read as _;

/// The media type of a layer that is a sigstore signature.
pub const SIGSTORE_MIME: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature of the layer's blob.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// The most of one payload read (c/image allows 4 MiB; a payload is a few hundred bytes).
pub const PAYLOAD_MAX: u64 = 64 << 10;
/// The most signatures looked at for one manifest (the rest are ignored).
pub const SIGNATURES_MAX: usize = 64;
/// The most of an attachment config read (c/image's limit for configs).
const CONFIG_MAX: u64 = 4 << 20;

/// One layer of an attachment manifest.
#[derive(Debug, Clone)]
pub struct Attachment {
    /// The layer's media type (signatures are [`SIGSTORE_MIME`]).
    pub media_type: String,
    /// The payload (fetched for signatures only, and checked against the layer's
    /// digest), or why it could not be used.
    pub payload: Result<Vec<u8>, String>,
    /// The layer's annotations.
    pub annotations: BTreeMap<String, String>,
}

/// `sha256-HEX.sig`, the tag of the attachments of manifest `sha256:HEX`.
pub fn attachment_tag(manifest_digest: &str) -> String {
    format!("{}.sig", manifest_digest.replacen(':', "-", 1))
}

#[derive(serde::Deserialize)]
struct Manifest {
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    config: Option<Descriptor>,
}

#[derive(serde::Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    digest: Option<String>,
    #[serde(default)]
    size: Option<i64>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

/// The attachment manifest's bytes, if the registry has one; an error (as in c/image)
/// if it is no OCI image manifest.
fn attachment_manifest(
    registry: &Registry,
    repo: &str,
    manifest_digest: &str,
) -> Result<Option<(Vec<u8>, Manifest)>, String> {
    let tag = attachment_tag(manifest_digest);
    let Some((bytes, content_type)) = registry
        .get_manifest_if_any(repo, &tag)
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    // Go's mime.ParseMediaType: parameters dropped, case folded.
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if mime != OCI_MANIFEST {
        return Err(format!(
            "unexpected MIME type for sigstore attachment manifest {repo}:{tag}: {content_type:?}"
        ));
    }
    let m: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| format!("sigstore attachment manifest {repo}:{tag}: {e}"))?;
    // c/image refuses a manifest that could be read as another kind.
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    for field in ["manifests", "fsLayers", "history"] {
        if v.get(field).is_some_and(|x| !x.is_null()) {
            return Err(format!("sigstore attachment manifest {repo}:{tag}: rejecting ambiguous manifest with {field:?}"));
        }
    }
    Ok(Some((bytes, m)))
}

/// The attachments of `manifest_digest` in `repo`: none if there is no attachment
/// manifest. Signatures' payloads are fetched (at most [`SIGNATURES_MAX`] of them, each
/// at most [`PAYLOAD_MAX`] and checked against its digest; one that fails that is kept
/// with the reason, so it is rejected, not trusted). A registry error is an error.
pub fn fetch(
    registry: &Registry,
    repo: &str,
    manifest_digest: &str,
) -> Result<Vec<Attachment>, String> {
    let Some((_, m)) = attachment_manifest(registry, repo, manifest_digest)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut signatures = 0;
    for layer in m.layers.unwrap_or_default() {
        let media_type = layer.media_type.unwrap_or_default();
        let annotations = layer.annotations.unwrap_or_default();
        let payload = if media_type != SIGSTORE_MIME {
            // Other attachments (attestations, …) are no signatures: not fetched.
            Err("not a signature".to_string())
        } else {
            signatures += 1;
            if signatures > SIGNATURES_MAX {
                break;
            }
            let digest = layer.digest.unwrap_or_default();
            match layer.size {
                _ if !oci::reference::valid_digest(&digest) => Err(format!(
                    "signature layer digest {digest:?} is not sha256:HEX"
                )),
                Some(n) if n < 0 || n as u64 > PAYLOAD_MAX => {
                    Err(format!("signature payload {digest} is larger than 64 KiB"))
                }
                _ => fetch_payload(registry, repo, &digest)?,
            }
        };
        out.push(Attachment {
            media_type,
            payload,
            annotations,
        });
    }
    Ok(out)
}

/// A payload blob: `Err` inside if it is too large or is not what its digest says; the
/// outer error is the registry's.
fn fetch_payload(
    registry: &Registry,
    repo: &str,
    digest: &str,
) -> Result<Result<Vec<u8>, String>, String> {
    let reader = registry.get_blob(repo, digest).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    reader
        .take(PAYLOAD_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading signature payload {digest} in {repo}: {e}"))?;
    if bytes.len() as u64 > PAYLOAD_MAX {
        return Ok(Err(format!(
            "signature payload {digest} is larger than 64 KiB"
        )));
    }
    if oci::registry::sha256_digest(&bytes) != digest {
        return Ok(Err(format!(
            "signature payload {digest}: the registry sent other bytes"
        )));
    }
    Ok(Ok(bytes))
}

/// Stores a signature (a payload and its base64 signature, as [`crate::sign`] makes them)
/// for `manifest_digest` in `repo` as c/image does: the payload as a blob, a layer for it
/// appended to the `sha256-HEX.sig` manifest (made if there is none; the signatures
/// already there are kept), and the manifest's config's `rootfs.diff_ids` extended. A
/// signature already there is not added again. Two writers at once: the last one's
/// manifest wins, as with c/image.
pub fn attach(
    registry: &Registry,
    repo: &str,
    manifest_digest: &str,
    payload: &[u8],
    signature: &str,
) -> Result<(), String> {
    if !oci::reference::valid_digest(manifest_digest) {
        return Err(format!(
            "{manifest_digest:?} is not a sha256 manifest digest"
        ));
    }
    if payload.len() as u64 > PAYLOAD_MAX {
        return Err("a signature payload is at most 64 KiB".into());
    }
    let payload_digest = oci::registry::sha256_digest(payload);
    let annotations: BTreeMap<String, String> =
        [(SIGNATURE_ANNOTATION.to_string(), signature.to_string())].into();
    let layer = serde_json::json!({
        "mediaType": SIGSTORE_MIME,
        "digest": payload_digest,
        "size": payload.len(),
        "annotations": annotations,
    });
    let (mut manifest, mut config) = match attachment_manifest(registry, repo, manifest_digest)? {
        None => (
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {}, "layers": []}),
            serde_json::json!({"architecture": "", "os": "", "config": {}, "rootfs": {"type": "layers", "diff_ids": []}}),
        ),
        Some((bytes, m)) => {
            let existing = m.layers.unwrap_or_default();
            if existing.iter().any(|l| {
                l.media_type.as_deref() == Some(SIGSTORE_MIME)
                    && l.digest.as_deref() == Some(payload_digest.as_str())
                    && l.size == Some(payload.len() as i64)
                    && l.annotations.as_ref() == Some(&annotations)
            }) {
                return Ok(());
            }
            let manifest: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
            let config_digest = m.config.and_then(|c| c.digest).unwrap_or_default();
            if !oci::reference::valid_digest(&config_digest) {
                return Err(format!("sigstore attachment manifest in {repo}: config digest {config_digest:?} is not sha256:HEX"));
            }
            let mut bytes = Vec::new();
            registry
                .get_blob(repo, &config_digest)
                .map_err(|e| e.to_string())?
                .take(CONFIG_MAX + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| {
                    format!("sigstore attachment config {config_digest} in {repo}: {e}")
                })?;
            if bytes.len() as u64 > CONFIG_MAX
                || oci::registry::sha256_digest(&bytes) != config_digest
            {
                return Err(format!("sigstore attachment config {config_digest} in {repo}: not the blob its digest names"));
            }
            let config: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
                format!("parsing sigstore attachment config {config_digest} in {repo}: {e}")
            })?;
            (manifest, config)
        }
    };
    let (Some(m), Some(c)) = (manifest.as_object_mut(), config.as_object_mut()) else {
        return Err(format!(
            "sigstore attachment manifest or config in {repo} is no JSON object"
        ));
    };
    registry
        .push_blob(repo, &payload_digest, &Body::Bytes(payload))
        .map_err(|e| e.to_string())?;
    match m.entry("layers").or_insert_with(|| serde_json::json!([])) {
        serde_json::Value::Array(layers) => layers.push(layer),
        v @ serde_json::Value::Null => *v = serde_json::json!([layer]),
        _ => {
            return Err(format!(
                "sigstore attachment manifest in {repo}: layers is no list"
            ))
        }
    }
    let rootfs = c
        .entry("rootfs")
        .or_insert_with(|| serde_json::json!({"type": "layers"}));
    let Some(rootfs) = rootfs.as_object_mut() else {
        return Err(format!(
            "sigstore attachment config in {repo}: rootfs is no object"
        ));
    };
    match rootfs
        .entry("diff_ids")
        .or_insert_with(|| serde_json::json!([]))
    {
        serde_json::Value::Array(ids) => ids.push(serde_json::json!(payload_digest)),
        v @ serde_json::Value::Null => *v = serde_json::json!([payload_digest]),
        _ => {
            return Err(format!(
                "sigstore attachment config in {repo}: rootfs.diff_ids is no list"
            ))
        }
    }
    let config_bytes = serde_json::to_vec(&config).map_err(|e| e.to_string())?;
    let config_digest = oci::registry::sha256_digest(&config_bytes);
    registry
        .push_blob(repo, &config_digest, &Body::Bytes(&config_bytes))
        .map_err(|e| e.to_string())?;
    manifest["config"] = serde_json::json!({
        "mediaType": OCI_CONFIG,
        "digest": config_digest,
        "size": config_bytes.len(),
    });
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(|e| e.to_string())?;
    registry
        .put_manifest(
            repo,
            &attachment_tag(manifest_digest),
            &manifest_bytes,
            OCI_MANIFEST,
        )
        .map_err(|e| e.to_string())?;
    Ok(())
}
