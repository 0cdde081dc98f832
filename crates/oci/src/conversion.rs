//! A container image converted, one sealed verilay image per layer, and its two records
//! (docs/FORMAT.md, "A container image converted").
//!
//! - The bound manifest ([`bind`]) annotates the original's layers: pinning it pins every image
//!   ([`bound_layers`]).
//! - The conversion manifest ([`manifest`]) is a referrer anyone may push: trusted only for a
//!   signature the user's policy accepts, never for being found.

use crate::artifact::{self, Descriptor, Manifest, DIGEST_ANNOTATION, LAYER_TYPE};
use std::collections::BTreeMap;

/// The artifact type of a conversion manifest.
pub const CONVERSION_TYPE: &str = "application/vnd.verilay.layers.v1";
/// The original layer blob's digest (`sha256:…`, as the image manifest lists it).
pub const SOURCE_DIGEST: &str = "dev.verilay.source.digest";
/// The original layer blob's size, in bytes.
pub const SOURCE_SIZE: &str = "dev.verilay.source.size";
/// The original layer blob's media type.
pub const SOURCE_MEDIA_TYPE: &str = "dev.verilay.source.media-type";
/// The layer's DiffID: `sha256:…` of its uncompressed tar.
pub const SOURCE_DIFF_ID: &str = "dev.verilay.source.diff-id";
/// Bytes of the uncompressed tar.
pub const SOURCE_TAR_SIZE: &str = "dev.verilay.source.tar-size";
/// On a bound manifest's layer: the verilay image's blob (`sha256:…` of the file).
pub const IMAGE_BLOB: &str = "dev.verilay.image.blob";
/// On a bound manifest's layer: the verilay image file's size, in bytes.
pub const IMAGE_SIZE: &str = "dev.verilay.image.size";
/// On a bound manifest or index: the digest of the manifest or index it was made from.
pub const CONVERTED_FROM: &str = "dev.verilay.converted-from";

/// One layer and the verilay image made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertedLayer {
    /// The original layer blob.
    pub source: Descriptor,
    /// The layer's DiffID: `sha256:…` of its uncompressed tar.
    pub diff_id: String,
    /// The size in bytes of its uncompressed tar.
    pub tar_size: u64,
    /// The verilay image's blob (`sha256:…` of the image file).
    pub image_blob: String,
    /// The image file's size, in bytes.
    pub image_size: u64,
    /// The image digest (fs-verity digest of its EROFS part): what a mount pins.
    pub image_digest: String,
}

/// The conversion manifest of the image manifest `subject`, whose layers became `layers`
/// (in the manifest's order).
pub fn manifest(subject: &Descriptor, layers: &[ConvertedLayer]) -> Vec<u8> {
    let layers = layers
        .iter()
        .map(|l| {
            let notes = BTreeMap::from([
                (DIGEST_ANNOTATION.to_string(), l.image_digest.clone()),
                (SOURCE_DIGEST.to_string(), l.source.digest.clone()),
                (SOURCE_SIZE.to_string(), l.source.size.to_string()),
                (SOURCE_MEDIA_TYPE.to_string(), l.source.media_type.clone()),
                (SOURCE_DIFF_ID.to_string(), l.diff_id.clone()),
                (SOURCE_TAR_SIZE.to_string(), l.tar_size.to_string()),
            ]);
            let mut d = Descriptor::of(LAYER_TYPE, b"");
            d.digest = l.image_blob.clone();
            d.size = l.image_size;
            d.annotations = notes;
            d
        })
        .collect();
    let subject = Descriptor {
        annotations: BTreeMap::new(),
        artifact_type: None,
        platform: None,
        ..subject.clone()
    };
    let m = Manifest {
        schema_version: 2,
        media_type: Some(artifact::MANIFEST_TYPE.into()),
        artifact_type: Some(CONVERSION_TYPE.into()),
        config: artifact::empty_config(),
        layers,
        subject: Some(subject),
        annotations: BTreeMap::new(),
    };
    serde_json::to_vec_pretty(&m).expect("a manifest serialises")
}

/// The verilay image artifact of one converted layer (`artifact::manifest`, titled by the
/// layer it came from): stored by digest next to the conversion, it makes each layer's
/// image mountable on its own (`verilay mount oci://HOST/REPO@DIGEST`), and anyone holding
/// the conversion computes the same bytes, so its digest.
pub fn layer_manifest(l: &ConvertedLayer) -> Vec<u8> {
    let hex = l.source.digest.trim_start_matches("sha256:");
    let title = format!("layer-{hex}.verilay");
    artifact::manifest(&l.image_blob, l.image_size, &l.image_digest, &title)
}

/// The digest of the image manifest a conversion manifest's `subject` names, if any.
pub fn subject_of(bytes: &[u8]) -> Option<String> {
    let m: Manifest = serde_json::from_slice(bytes).ok()?;
    m.subject.map(|s| s.digest)
}

/// A layer descriptor's annotations, read for one of ours: each value named in errors.
struct Notes<'a> {
    layer: usize,
    d: &'a Descriptor,
}

impl Notes<'_> {
    fn text(&self, k: &str) -> Result<String, String> {
        let i = self.layer;
        self.d
            .annotations
            .get(k)
            .cloned()
            .ok_or_else(|| format!("layer {i}: no {k} annotation"))
    }

    fn digest(&self, k: &str) -> Result<String, String> {
        let (i, v) = (self.layer, self.text(k)?);
        match crate::reference::valid_digest(&v) {
            true => Ok(v),
            false => Err(format!("layer {i}: {k} {v:?} is not a sha256 digest")),
        }
    }

    fn number(&self, k: &str) -> Result<u64, String> {
        let (i, v) = (self.layer, self.text(k)?);
        v.parse::<u64>()
            .map_err(|_| format!("layer {i}: {k} {v:?} is not a number"))
    }
}

/// The layers a conversion manifest lists; an error says why `bytes` is not one (every
/// field checked: what the layer store serves comes from here).
pub fn layers_of(bytes: &[u8]) -> Result<Vec<ConvertedLayer>, String> {
    let m: Manifest =
        serde_json::from_slice(bytes).map_err(|e| format!("not a conversion manifest: {e}"))?;
    if m.artifact_type.as_deref() != Some(CONVERSION_TYPE) {
        return Err(format!(
            "artifactType {:?}, not {CONVERSION_TYPE}",
            m.artifact_type.as_deref().unwrap_or("")
        ));
    }
    m.layers
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let n = Notes { layer: i, d };
            if d.media_type != LAYER_TYPE {
                return Err(format!("layer {i}: media type {:?}", d.media_type));
            }
            if !crate::reference::valid_digest(&d.digest) {
                return Err(format!(
                    "layer {i}: blob {:?} is not a sha256 digest",
                    d.digest
                ));
            }
            let mut source = Descriptor::of(&n.text(SOURCE_MEDIA_TYPE)?, b"");
            source.digest = n.digest(SOURCE_DIGEST)?;
            source.size = n.number(SOURCE_SIZE)?;
            Ok(ConvertedLayer {
                source,
                diff_id: n.digest(SOURCE_DIFF_ID)?,
                tar_size: n.number(SOURCE_TAR_SIZE)?,
                image_blob: d.digest.clone(),
                image_size: d.size,
                image_digest: n.digest(DIGEST_ANNOTATION)?,
            })
        })
        .collect()
}

/// The bound manifest of the image manifest `original` (its bytes), whose layers became
/// `layers` (in its order): the same JSON with each layer descriptor annotated with its
/// verilay image, and the manifest with the digest it was made from. Every field of the
/// original is kept, so engines that know nothing of verilay pull it as that image.
pub fn bind(original: &[u8], layers: &[ConvertedLayer]) -> Result<Vec<u8>, String> {
    use serde_json::Value;
    let mut m: Value =
        serde_json::from_slice(original).map_err(|e| format!("not a manifest: {e}"))?;
    let listed = m
        .get_mut("layers")
        .and_then(Value::as_array_mut)
        .ok_or("the manifest lists no layers")?;
    if listed.len() != layers.len() {
        return Err(format!(
            "the manifest lists {} layers, the conversion {}",
            listed.len(),
            layers.len()
        ));
    }
    for (i, (d, l)) in listed.iter_mut().zip(layers).enumerate() {
        if d.get("digest").and_then(Value::as_str) != Some(l.source.digest.as_str()) {
            return Err(format!("layer {i}: not the layer {}", l.source.digest));
        }
        annotate(d, layer_notes(l)).map_err(|e| format!("layer {i}: {e}"))?;
    }
    let from = crate::registry::sha256_digest(original);
    annotate(&mut m, [(CONVERTED_FROM, from)])?;
    Ok(serde_json::to_vec_pretty(&m).expect("a manifest serialises"))
}

/// The annotations a bound manifest gives a converted layer.
const BOUND_KEYS: [&str; 5] = [
    DIGEST_ANNOTATION,
    IMAGE_BLOB,
    IMAGE_SIZE,
    SOURCE_DIFF_ID,
    SOURCE_TAR_SIZE,
];

/// What a bound manifest says of a layer ([`BOUND_KEYS`]), besides the descriptor's own
/// fields.
fn layer_notes(l: &ConvertedLayer) -> [(&'static str, String); 5] {
    let values = [
        l.image_digest.clone(),
        l.image_blob.clone(),
        l.image_size.to_string(),
        l.diff_id.clone(),
        l.tar_size.to_string(),
    ];
    std::array::from_fn(|i| (BOUND_KEYS[i], values[i].clone()))
}

/// Sets `notes` in the annotations of `m` (a manifest, an index or a descriptor), keeping
/// the others it has.
fn annotate<const N: usize>(
    m: &mut serde_json::Value,
    notes: [(&str, String); N],
) -> Result<(), String> {
    use serde_json::Value;
    let annotations = m
        .as_object_mut()
        .ok_or("not a JSON object")?
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
        .ok_or("its annotations are not an object")?;
    for (k, v) in notes {
        annotations.insert(k.into(), Value::String(v));
    }
    Ok(())
}

/// The bound index of the index `original`: the entries of the manifests converted
/// (`bound`: original digest, bound manifest's digest and size), pointing at the bound
/// manifests, and no other entry (a platform not converted is not in the conversion).
pub fn bind_index(original: &[u8], bound: &[(String, String, u64)]) -> Result<Vec<u8>, String> {
    use serde_json::Value;
    let mut i: Value =
        serde_json::from_slice(original).map_err(|e| format!("not an index: {e}"))?;
    let listed = i
        .get_mut("manifests")
        .and_then(Value::as_array_mut)
        .ok_or("the index lists no manifests")?;
    let mut kept = Vec::new();
    for d in listed.drain(..) {
        let was = d.get("digest").and_then(Value::as_str).unwrap_or_default();
        let Some((_, digest, size)) = bound.iter().find(|(o, ..)| o == was) else {
            continue;
        };
        if kept
            .iter()
            .any(|k: &Value| k.get("digest").and_then(Value::as_str) == Some(digest))
        {
            continue; // listed twice in the original: once here
        }
        let mut d = d;
        let o = d.as_object_mut().ok_or("an index entry is not an object")?;
        o.insert("digest".into(), Value::String(digest.clone()));
        o.insert("size".into(), Value::from(*size));
        kept.push(d);
    }
    *listed = kept;
    annotate(
        &mut i,
        [(CONVERTED_FROM, crate::registry::sha256_digest(original))],
    )?;
    Ok(serde_json::to_vec_pretty(&i).expect("an index serialises"))
}

/// The verilay images a bound manifest lists, each with the layer it stands for (a layer
/// with no verilay annotation is not converted, and not listed). Every field is checked,
/// and a layer listed twice with two images is an error: what the layer store serves
/// comes from here.
pub fn bound_layers(bytes: &[u8]) -> Result<Vec<ConvertedLayer>, String> {
    let m: Manifest =
        serde_json::from_slice(bytes).map_err(|e| format!("not an image manifest: {e}"))?;
    let mut out: Vec<ConvertedLayer> = Vec::new();
    for (i, d) in m.layers.iter().enumerate() {
        let ours = BOUND_KEYS
            .iter()
            .filter(|k| d.annotations.contains_key(**k))
            .count();
        if ours == 0 {
            continue;
        }
        let n = Notes { layer: i, d };
        if !crate::reference::valid_digest(&d.digest) {
            return Err(format!("layer {i}: digest {:?} is not sha256", d.digest));
        }
        let mut source = d.clone();
        source.annotations.clear();
        let l = ConvertedLayer {
            source,
            diff_id: n.digest(SOURCE_DIFF_ID)?,
            tar_size: n.number(SOURCE_TAR_SIZE)?,
            image_blob: n.digest(IMAGE_BLOB)?,
            image_size: n.number(IMAGE_SIZE)?,
            image_digest: n.digest(DIGEST_ANNOTATION)?,
        };
        if let Err(o) = add_layer(&mut out, l) {
            return Err(format!(
                "layer {i}: {} is listed twice, with two different images",
                o.source.digest
            ));
        }
    }
    Ok(out)
}

/// Adds `l` to `layers` unless the same layer is there already; the same layer with
/// another image is refused (the one there is returned), never "the first": a layer
/// stands for one image wherever several manifests or conversions list it.
pub fn add_layer(
    layers: &mut Vec<ConvertedLayer>,
    l: ConvertedLayer,
) -> Result<(), &ConvertedLayer> {
    match layers
        .iter()
        .position(|o| o.source.digest == l.source.digest)
    {
        Some(i) if layers[i] != l => Err(&layers[i]),
        Some(_) => Ok(()),
        None => {
            layers.push(l);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_round_trips_and_a_bad_one_is_named() {
        let h = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let mut src = Descriptor::of("application/vnd.oci.image.layer.v1.tar+gzip", b"");
        src.digest = h('1');
        src.size = 10;
        let l = ConvertedLayer {
            source: src,
            diff_id: h('2'),
            tar_size: 20,
            image_blob: h('3'),
            image_size: 30,
            image_digest: h('4'),
        };
        let subject = Descriptor::of(crate::image::OCI_MANIFEST, b"{}");
        let bytes = manifest(&subject, std::slice::from_ref(&l));
        assert_eq!(layers_of(&bytes).unwrap(), vec![l.clone()]);
        assert_eq!(subject_of(&bytes), Some(subject.digest.clone()));
        let one = layer_manifest(&l);
        assert_eq!(layer_manifest(&l), one);
        let image = artifact::image_of(&one, artifact::MANIFEST_TYPE).unwrap();
        assert_eq!(image.blob.digest, l.image_blob);
        assert_eq!(image.digest.as_deref(), Some(l.image_digest.as_str()));
        let m: Manifest = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(m.subject.unwrap().digest, subject.digest);
        let bad = String::from_utf8(bytes)
            .unwrap()
            .replace(&h('2'), "sha256:zz");
        assert!(layers_of(bad.as_bytes()).unwrap_err().contains("diff-id"));
        assert!(layers_of(&artifact::manifest(&h('5'), 1, &h('6'), "x")).is_err());
    }

    #[test]
    fn a_bound_manifest_keeps_the_original_and_names_each_layers_image() {
        let h = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let original = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":2}},
            "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":3,
                        "annotations":{{"keep":"me"}}}},
                      {{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{}","size":4}}],
            "annotations":{{"org.example":"x"}},"unknown":[1]}}"#,
            h('0'),
            h('1'),
            h('2')
        );
        let layer = |d: char, size: u64, media: &str, image: char| ConvertedLayer {
            source: {
                let mut s = Descriptor::of(media, b"");
                s.digest = h(d);
                s.size = size;
                s
            },
            diff_id: h('d'),
            tar_size: 9,
            image_blob: h(image),
            image_size: 99,
            image_digest: h('e'),
        };
        let layers = [
            layer('1', 3, "application/vnd.oci.image.layer.v1.tar+gzip", 'a'),
            layer('2', 4, "application/vnd.oci.image.layer.v1.tar", 'b'),
        ];
        let bound = bind(original.as_bytes(), &layers).unwrap();
        assert_eq!(bound_layers(&bound).unwrap(), layers);
        let v: serde_json::Value = serde_json::from_slice(&bound).unwrap();
        assert_eq!(v["unknown"], serde_json::json!([1]));
        assert_eq!(v["annotations"]["org.example"], "x");
        assert_eq!(
            v["annotations"][CONVERTED_FROM].as_str(),
            Some(crate::registry::sha256_digest(original.as_bytes()).as_str())
        );
        assert_eq!(v["layers"][0]["annotations"]["keep"], "me");
        // The original lists no image; a layer of the wrong count or digest is refused.
        assert_eq!(bound_layers(original.as_bytes()).unwrap(), vec![]);
        assert!(bind(original.as_bytes(), &layers[..1]).is_err());
        assert!(bind(original.as_bytes(), &[layers[1].clone(), layers[0].clone()]).is_err());
        // Half an annotation set, a bad number or digest: named.
        let text = String::from_utf8(bound.clone()).unwrap();
        let no_blob = text.replacen(IMAGE_BLOB, "x-other", 1);
        assert!(bound_layers(no_blob.as_bytes())
            .unwrap_err()
            .contains(IMAGE_BLOB));
        let bad_size = text.replacen("\"99\"", "\"-1\"", 1);
        assert!(bound_layers(bad_size.as_bytes())
            .unwrap_err()
            .contains("not a number"));
        // One layer listed twice with two images: an error, never the first.
        let twice = bind(
            original.replace(&h('2'), &h('1')).as_bytes(),
            &[
                layers[0].clone(),
                layer('1', 3, "application/vnd.oci.image.layer.v1.tar+gzip", 'c'),
            ],
        );
        let twice = twice.unwrap_or_else(|e| panic!("{e}"));
        assert!(bound_layers(&twice).unwrap_err().contains("twice"));

        // An index keeps the converted entries only, pointing at the bound manifests.
        let index = format!(
            r#"{{"schemaVersion":2,"manifests":[
              {{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":5,
                "platform":{{"architecture":"amd64","os":"linux"}}}},
              {{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":6,
                "platform":{{"architecture":"amd64","os":"windows"}}}}]}}"#,
            h('5'),
            h('6')
        );
        let bound = bind_index(index.as_bytes(), &[(h('5'), h('7'), 70)]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bound).unwrap();
        let listed = v["manifests"].as_array().unwrap();
        assert_eq!(listed.len(), 1, "{v}");
        assert_eq!(listed[0]["digest"].as_str(), Some(h('7').as_str()));
        assert_eq!(listed[0]["size"], 70);
        assert_eq!(listed[0]["platform"]["os"], "linux");
    }
}
