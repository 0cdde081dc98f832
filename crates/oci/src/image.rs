//! Container images as registries and OCI layouts hold them: image manifests (OCI, and
//! Docker's schema 2, which has the same shape), indexes and manifest lists, and the layer
//! media types a conversion reads.

use crate::artifact::{Descriptor, Manifest};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An OCI image manifest's media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// An OCI image index's media type.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// A Docker schema 2 manifest's media type.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// A Docker manifest list's media type.
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Layer blobs a conversion reads: tar, gzip or zstd, in OCI's and Docker's spellings.
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
];

/// Whether a layer of this media type is a tarball a conversion can read.
pub fn is_tar_layer(media_type: &str) -> bool {
    LAYER_TYPES.contains(&media_type)
}

/// An index (or Docker manifest list): the manifests it lists.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    /// The schema version (`schemaVersion`).
    pub schema_version: u32,
    /// Its own media type, if it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The manifests it lists.
    pub manifests: Vec<Descriptor>,
    /// Its annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Index {
    /// An empty OCI index.
    pub fn new() -> Index {
        Index {
            schema_version: 2,
            media_type: Some(OCI_INDEX.into()),
            manifests: Vec::new(),
            annotations: BTreeMap::new(),
        }
    }

    /// The index as JSON.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("an index serialises")
    }
}

impl Default for Index {
    fn default() -> Self {
        Index::new()
    }
}

/// What a manifest's bytes are.
#[derive(Debug, Clone)]
pub enum Parsed {
    /// An image manifest.
    Manifest(Box<Manifest>),
    /// An index or manifest list.
    Index(Index),
}

/// Parses `bytes` as what their own `mediaType` says (the bytes are what a digest pins),
/// else as what `media_type` (the registry's Content-Type, or the descriptor's) says; an
/// error says what they are not.
pub fn parse(bytes: &[u8], media_type: &str) -> Result<Parsed, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Kind {
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    let kind: Kind =
        serde_json::from_slice(bytes).map_err(|e| format!("not a manifest (JSON): {e}"))?;
    let said = kind.media_type.as_deref().unwrap_or(media_type);
    let is_index =
        matches!(said, OCI_INDEX | DOCKER_LIST) || (said.is_empty() && kind.manifests.is_some());
    if is_index {
        let i: Index =
            serde_json::from_slice(bytes).map_err(|e| format!("not an image index: {e}"))?;
        return Ok(Parsed::Index(i));
    }
    match said {
        OCI_MANIFEST | DOCKER_MANIFEST | "" => serde_json::from_slice(bytes)
            .map(|m| Parsed::Manifest(Box::new(m)))
            .map_err(|e| format!("not an image manifest: {e}")),
        other => Err(format!(
            "a manifest of type {other:?}, not an image or index"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_and_indexes_are_told_apart() {
        let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:00","size":2},
            "layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:11","size":3}]}"#;
        match parse(m, "").unwrap() {
            Parsed::Manifest(m) => assert_eq!(m.layers.len(), 1),
            _ => panic!("a manifest"),
        }
        let i = br#"{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "digest":"sha256:22","size":4,"platform":{"architecture":"amd64","os":"linux"}}]}"#;
        match parse(i, OCI_INDEX).unwrap() {
            Parsed::Index(i) => {
                assert_eq!(i.manifests[0].platform.as_ref().unwrap().os, "linux")
            }
            _ => panic!("an index"),
        }
        assert!(parse(b"[]", "").is_err());
        assert!(parse(br#"{"mediaType":"text/plain"}"#, "").is_err());
        assert!(is_tar_layer(
            "application/vnd.docker.image.rootfs.diff.tar.gzip"
        ));
        assert!(!is_tar_layer("application/vnd.verilay.image.erofs.v1"));
    }
}
