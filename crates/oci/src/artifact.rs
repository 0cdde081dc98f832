//! How a verilay image is stored in a registry: an OCI image manifest (artifact form:
//! `artifactType`, the empty config) whose one layer is the image file, with the image's
//! fs-verity digest in an annotation of the manifest and of the layer, so a pull by tag
//! can still be pinned.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An OCI image manifest's media type.
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The artifact's type: a verilay image.
pub const ARTIFACT_TYPE: &str = "application/vnd.verilay.image.v1";
/// The media type of the layer that is the image file: a sealed EROFS image.
pub const LAYER_TYPE: &str = "application/vnd.verilay.image.erofs.v1";
/// The image digest (`sha256:…`, as `verilay build` prints it).
pub const DIGEST_ANNOTATION: &str = "dev.verilay.image.digest";
/// OCI's title annotation: on the layer, the image file's name.
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
/// OCI's empty descriptor: the config of an artifact.
pub const EMPTY_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The bytes of OCI's empty descriptor.
pub const EMPTY_BLOB: &[u8] = b"{}";

/// An OCI descriptor: what a manifest or index says of a blob or manifest it lists.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Its media type.
    pub media_type: String,
    /// Its digest (`alg:hex`).
    pub digest: String,
    /// Its size, in bytes.
    pub size: u64,
    /// Its annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// In an index: what kind of artifact the manifest is (referrers list it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// In an index: which machine the image is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

/// An index entry's platform (`os`, `architecture`, optional `variant`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Platform {
    /// The CPU architecture (`amd64`, `arm64`, …).
    pub architecture: String,
    /// The operating system (`linux`, …).
    pub os: String,
    /// The CPU variant (`v8`, …), if one is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Descriptor {
    /// A descriptor of `bytes` (a manifest, a config) of type `media_type`.
    pub fn of(media_type: &str, bytes: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.into(),
            digest: crate::registry::sha256_digest(bytes),
            size: bytes.len() as u64,
            annotations: BTreeMap::new(),
            artifact_type: None,
            platform: None,
        }
    }
}

/// An OCI image manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The schema version (`schemaVersion`).
    pub schema_version: u32,
    /// Its own media type, if it says.
    #[serde(default)]
    pub media_type: Option<String>,
    /// An artifact's type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layers, in order.
    pub layers: Vec<Descriptor>,
    /// The manifest this one refers to (OCI 1.1 referrers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    /// The manifest's own annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The config descriptor every verilay artifact has.
pub fn empty_config() -> Descriptor {
    Descriptor::of(EMPTY_TYPE, EMPTY_BLOB)
}

/// The manifest of an image blob (`blob_digest`, `size`) whose image digest is
/// `image_digest`, titled `title` (its file name).
pub fn manifest(blob_digest: &str, size: u64, image_digest: &str, title: &str) -> Vec<u8> {
    let digest = BTreeMap::from([(DIGEST_ANNOTATION.to_string(), image_digest.to_string())]);
    let mut layer_notes = digest.clone();
    layer_notes.insert(TITLE_ANNOTATION.into(), title.into());
    let m = Manifest {
        schema_version: 2,
        media_type: Some(MANIFEST_TYPE.into()),
        artifact_type: Some(ARTIFACT_TYPE.into()),
        config: empty_config(),
        layers: vec![Descriptor {
            media_type: LAYER_TYPE.into(),
            digest: blob_digest.into(),
            size,
            annotations: layer_notes,
            artifact_type: None,
            platform: None,
        }],
        subject: None,
        annotations: digest,
    };
    serde_json::to_vec_pretty(&m).expect("a manifest serialises")
}

/// What a pull needs from a manifest: the image blob, and the image digest the manifest
/// records (if it records one).
#[derive(Debug)]
pub struct Image {
    /// The image file's blob.
    pub blob: Descriptor,
    /// The image digest the manifest records (`sha256:…`).
    pub digest: Option<String>,
}

/// The verilay image a manifest describes; an error says why this is not one.
pub fn image_of(bytes: &[u8], media_type: &str) -> Result<Image, String> {
    if media_type.contains("index") || media_type.contains("manifest.list") {
        return Err(format!(
            "the reference names an index ({media_type}), not a verilay image"
        ));
    }
    let m: Manifest = serde_json::from_slice(bytes)
        .map_err(|e| format!("the manifest is not an OCI image manifest: {e}"))?;
    // Another kind of artifact (a conversion also lists verilay images, one per layer) is
    // not an image, whatever its layers are.
    if let Some(t) = m.artifact_type.as_deref().filter(|t| *t != ARTIFACT_TYPE) {
        return Err(format!(
            "the manifest is an artifact of type {t:?}, not a verilay image ({ARTIFACT_TYPE})"
        ));
    }
    let mine: Vec<&Descriptor> = m
        .layers
        .iter()
        .filter(|l| l.media_type == LAYER_TYPE)
        .collect();
    let blob = match mine.as_slice() {
        [one] => (*one).clone(),
        [] => {
            return Err(format!(
            "the manifest holds no verilay image (no layer of type {LAYER_TYPE}; artifactType {})",
            m.artifact_type.as_deref().unwrap_or("none")
        ))
        }
        _ => return Err("the manifest holds more than one verilay image".into()),
    };
    if !crate::reference::valid_digest(&blob.digest) {
        return Err(format!(
            "the image layer's digest {:?} is not sha256",
            blob.digest
        ));
    }
    let digest = m.annotations.get(DIGEST_ANNOTATION).cloned();
    if let (Some(d), Some(l)) = (&digest, blob.annotations.get(DIGEST_ANNOTATION)) {
        if d != l {
            return Err(format!(
                "the manifest's {DIGEST_ANNOTATION} ({d}) and its layer's ({l}) differ"
            ));
        }
    }
    let digest = digest.or_else(|| blob.annotations.get(DIGEST_ANNOTATION).cloned());
    Ok(Image { blob, digest })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_others_are_named() {
        let d = format!("sha256:{}", "b".repeat(64));
        let bytes = manifest(&d, 12, "sha256:00", "x.img");
        let img = image_of(&bytes, MANIFEST_TYPE).unwrap();
        assert_eq!(img.blob.digest, d);
        assert_eq!(img.digest.as_deref(), Some("sha256:00"));
        assert!(image_of(b"{}", MANIFEST_TYPE).is_err());
        assert!(image_of(&bytes, "application/vnd.oci.image.index.v1+json").is_err());
    }
}
