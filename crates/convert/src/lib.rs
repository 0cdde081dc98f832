//! `verilay convert`: each layer of a container image becomes a sealed verilay image
//! (docs/FORMAT.md, "A container image converted").
//!
//! - The destination tag names the bound manifest, the one to pin.
//! - The conversion, a referrer of the original, is never trusted for being found.
//! - Blobs are checked against their digests; a fixed build time and content-derived UUID give
//!   a layer one image digest.

#![forbid(unsafe_code)]

pub mod source;

use anyhow::{bail, Context};
use erofs::builder::{self, BuildOptions};
use oci::artifact::Descriptor;
use oci::conversion::{self, ConvertedLayer, CONVERSION_TYPE};
use oci::image::{self, Parsed};
use oci::referrers::Recorded;
use oci::registry::Body;
use source::{copy_blob, docker_name, targets, Source, Target};
use std::collections::HashMap;
use std::io::Read;
use std::time::Instant;

/// How a conversion is made.
pub struct Options {
    /// The layers' images' compression (`None`: uncompressed).
    pub compression: Option<builder::compress::Settings>,
    /// The most bytes a layer may expand to (its uncompressed tar).
    pub max_layer_size: u64,
    /// The most layers an image (each image of an index) may have.
    pub max_layers: usize,
    /// The images' build time (`SOURCE_DATE_EPOCH`, else 0).
    pub build_time: u64,
}

/// What a conversion tells its caller as it goes.
pub trait Progress {
    /// A bar for one layer's steps, cleared once dropped.
    fn layer(&self) -> Box<dyn LayerProgress + '_>;
    /// A layer converted: `what` (`layer N/M DIGEST`), its tar's and its image's bytes,
    /// the image's digest and the seconds it took.
    fn layer_done(&self, what: &str, layer: &ConvertedLayer, seconds: f64);
    /// The original image copied to the destination.
    fn copied(&self, source: &str, dest: &str);
}

/// One layer's steps: fetching, copying, reading, building, pushing.
pub trait LayerProgress {
    /// The building step's progress.
    fn builder(&self) -> &dyn builder::Progress;
    /// A step over `total` bytes starts.
    fn bytes(&self, what: &str, total: u64);
    /// A step that counts (bytes read from a tar) starts.
    fn counting(&self, what: &str);
    /// Where the step is.
    fn set_position(&self, n: u64);
    /// `n` more done.
    fn inc(&self, n: u64);
}

/// One image manifest converted.
pub struct Manifest<'t> {
    /// The original.
    pub target: &'t Target,
    /// The conversion manifest's digest (a referrer of the original).
    pub conversion: String,
    /// How the referrer was recorded (the referrers API, or a fallback tag).
    pub recorded: Recorded,
    /// The bound manifest's digest.
    pub bound: String,
    /// Each layer's image.
    pub layers: Vec<ConvertedLayer>,
}

/// What a conversion stored.
pub struct Converted<'t> {
    /// The digest to pin: the bound manifest, or the bound index for an index.
    pub pinned: String,
    /// Each image manifest converted.
    pub manifests: Vec<Manifest<'t>>,
}

/// The tag the bound manifest takes in `dest`: the one given, else the source's (`TAG-verilay`
/// where that is the source's own tag in the same repository: a source tag moves only
/// when named), else `latest`. `tag_given`: the destination named one.
pub fn dest_tag(src: &Source, dest: &oci::Reference, tag_given: bool) -> anyhow::Result<String> {
    use oci::reference::Target as T;
    Ok(match (&dest.target, src) {
        (T::Digest(_), _) => bail!("{dest}: name a tag (or none), not a digest"),
        (T::Tag(t), _) if tag_given => t.clone(),
        (_, Source::Registry(_, r)) => match &r.target {
            T::Tag(t) if src.is(dest) => format!("{t}-verilay"),
            T::Tag(t) => t.clone(),
            T::Digest(_) => "latest".into(),
        },
        (_, Source::Layout(_, tag, _)) => tag.clone().unwrap_or_else(|| "latest".into()),
    })
}

/// The manifests a conversion of `src` reads: the top one and the image manifests, each
/// checked against `trust` (the source's manifest, as a pull would) and the layer limit.
pub fn plan(
    src: &Source,
    trust: Option<&signatures::Trust>,
    opts: &Options,
) -> anyhow::Result<(Vec<u8>, Descriptor, Vec<Target>)> {
    let (root, root_desc, targets) = targets(src)?;
    if let (Some(t), Source::Registry(reg, r)) = (trust, src) {
        t.check(reg, r, &root_desc.digest)
            .map_err(anyhow::Error::msg)?;
    }
    for t in &targets {
        if t.manifest.layers.len() > opts.max_layers {
            bail!(
                "{}: manifest {} has {} layers, more than the limit of {} (--max-layers raises it)",
                src.name(),
                t.desc.digest,
                t.manifest.layers.len(),
                opts.max_layers
            );
        }
    }
    Ok((root, root_desc, targets))
}

/// Converts the images `plan` found and stores them in `dest` (its tag set), through
/// `reg`: the layers' images, the original (copied first where the source is another
/// repository), the conversion manifests as its referrers, and the bound manifest (or
/// index) under the tag.
pub fn convert<'t>(
    src: &Source,
    (root, root_desc, targets): (&[u8], &Descriptor, &'t [Target]),
    dest: &oci::Reference,
    reg: &oci::Registry,
    opts: &Options,
    progress: &dyn Progress,
) -> anyhow::Result<Converted<'t>> {
    let repo = dest.repository.as_str();
    let oci::reference::Target::Tag(dest_tag) = &dest.target else {
        bail!("{dest}: the destination needs a tag");
    };
    let copy = !src.is(dest);
    let converter = Converter {
        src,
        reg,
        repo,
        opts: BuildOptions {
            // Fixed, and the UUID derived from the contents: the same layer, the same image.
            build_time: opts.build_time,
            uuid: None,
            compression: opts.compression,
            ..BuildOptions::default()
        },
        work: tempfile::tempdir().context("a temporary directory")?,
        progress,
        copy,
        max_layer_size: opts.max_layer_size,
    };
    let config = oci::artifact::empty_config();
    reg.push_blob(
        repo,
        &config.digest,
        &Body::Bytes(oci::artifact::EMPTY_BLOB),
    )?;
    let mut done: HashMap<String, ConvertedLayer> = HashMap::new();
    let mut results = Vec::new();
    for t in targets {
        let total = t.manifest.layers.len();
        let mut layers = Vec::with_capacity(total);
        for (i, l) in t.manifest.layers.iter().enumerate() {
            let c = match done.get(&l.digest) {
                Some(c) => c.clone(),
                None => {
                    let c = converter.layer(i + 1, total, l)?;
                    done.insert(l.digest.clone(), c.clone());
                    c
                }
            };
            layers.push(c);
        }
        results.push((t, layers));
    }
    // The original (its layers are there by now) before the conversions that refer to it.
    if copy {
        for t in targets {
            copy_blob(src, reg, repo, &t.manifest.config)?;
            if t.desc.digest != root_desc.digest {
                reg.put_manifest(repo, &t.desc.digest, &t.bytes, &t.desc.media_type)?;
            }
        }
        reg.put_manifest(repo, &root_desc.digest, root, &root_desc.media_type)?;
        progress.copied(&src.name(), &docker_name(dest));
    }
    // Each layer's image as an artifact of its own (mountable by digest; the layer store
    // mounts it so), before the conversions that list them.
    let mut pushed = std::collections::HashSet::new();
    for l in results.iter().flat_map(|(_, layers)| layers) {
        let bytes = conversion::layer_manifest(l);
        let digest = oci::registry::sha256_digest(&bytes);
        if pushed.insert(digest.clone()) {
            reg.put_manifest(repo, &digest, &bytes, oci::artifact::MANIFEST_TYPE)?;
        }
    }
    let mut manifests = Vec::new();
    for (t, layers) in results {
        let bytes = conversion::manifest(&t.desc, &layers);
        let (conversion, took) = reg.put_manifest_noting_subject(
            repo,
            &oci::registry::sha256_digest(&bytes),
            &bytes,
            oci::artifact::MANIFEST_TYPE,
        )?;
        let mut referrer = Descriptor::of(oci::artifact::MANIFEST_TYPE, &bytes);
        referrer.artifact_type = Some(CONVERSION_TYPE.into());
        let recorded = reg.record_referrer(repo, &t.desc.digest, referrer, took)?;
        // The bound manifest: what users pin (through the bound index, for an index).
        let bound = conversion::bind(&t.bytes, &layers)
            .map_err(|e| anyhow::anyhow!("{}: {e}", t.desc.digest))?;
        manifests.push((
            Manifest {
                target: t,
                conversion,
                recorded,
                bound: oci::registry::sha256_digest(&bound),
                layers,
            },
            bound,
        ));
    }
    for (m, bytes) in &manifests {
        reg.put_manifest(repo, &m.bound, bytes, &m.target.desc.media_type)?;
    }
    let (pinned, pinned_bytes) = match image::parse(root, &root_desc.media_type) {
        Ok(Parsed::Index(_)) => {
            let entries: Vec<_> = manifests
                .iter()
                .map(|(m, bytes)| {
                    (
                        m.target.desc.digest.clone(),
                        m.bound.clone(),
                        bytes.len() as u64,
                    )
                })
                .collect();
            let bytes = conversion::bind_index(root, &entries)
                .map_err(|e| anyhow::anyhow!("{}: {e}", src.name()))?;
            (oci::registry::sha256_digest(&bytes), bytes)
        }
        _ => (manifests[0].0.bound.clone(), manifests[0].1.clone()),
    };
    reg.put_manifest(repo, dest_tag, &pinned_bytes, &root_desc.media_type)?;
    Ok(Converted {
        pinned,
        manifests: manifests.into_iter().map(|(m, _)| m).collect(),
    })
}

/// The verilay image of one layer: fetched, checked, read, built, pushed.
struct Converter<'a> {
    src: &'a Source,
    reg: &'a oci::Registry,
    repo: &'a str,
    opts: BuildOptions,
    work: tempfile::TempDir,
    progress: &'a dyn Progress,
    /// The source is another repository: each layer blob, once checked, is stored in
    /// the destination too.
    copy: bool,
    /// `--max-layer-size`.
    max_layer_size: u64,
}

/// Counts what is read through it on a layer's bar.
struct Counted<'p, R> {
    inner: R,
    pb: &'p dyn LayerProgress,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pb.inc(n as u64);
        Ok(n)
    }
}

impl Converter<'_> {
    fn layer(&self, n: usize, total: usize, d: &Descriptor) -> anyhow::Result<ConvertedLayer> {
        let start = Instant::now();
        let what = format!("layer {n}/{total} {}", d.digest);
        if !image::is_tar_layer(&d.media_type) {
            bail!(
                "{what}: media type {:?} is not a layer tarball",
                d.media_type
            );
        }
        // The blob is written whole before it is checked: its size is the manifest's claim,
        // bounded as what it expands to is (a compressed tar is never much larger).
        if d.size > self.max_layer_size {
            bail!(
                "{what}: the blob is {} bytes, more than the limit of {} (--max-layer-size raises it)",
                d.size,
                self.max_layer_size
            );
        }
        let bar = self.progress.layer();
        let pb = bar.as_ref();
        pb.bytes(&format!("layer {n}/{total}: fetching"), d.size);
        // Fetched whole and checked before anything reads it.
        let blob_path = self.work.path().join("layer");
        let file = std::fs::File::create(&blob_path)?;
        let reader = self.src.blob(&d.digest)?;
        // One byte more than listed is read, to see a blob that runs on.
        let (got, size) = oci::sha256_copy(reader, &file, d.size.saturating_add(1), &|k| pb.inc(k))
            .with_context(|| format!("{what}: fetching"))?;
        drop(file);
        if got != d.digest || size != d.size {
            bail!(
                "{what}: the blob fetched ({size} bytes) hashes to {got}: not the blob the \
                 manifest lists ({} bytes)",
                d.size
            );
        }
        let push = |path: &std::path::Path| -> std::io::Result<Box<dyn Read + '_>> {
            pb.set_position(0);
            Ok(Box::new(Counted {
                inner: std::fs::File::open(path)?,
                pb,
            }))
        };
        if self.copy {
            pb.bytes(&format!("layer {n}/{total}: copying"), size);
            let open = || push(&blob_path);
            self.reg
                .push_blob(self.repo, &d.digest, &Body::Reader(size, &open))
                .with_context(|| format!("{what}: copying it"))?;
        }
        pb.counting(&format!("layer {n}/{total}: reading"));
        let (mut tree, stats) =
            tarlayer::read_layer(&blob_path, self.work.path(), self.max_layer_size, &|k| {
                pb.set_position(k)
            })
            .with_context(|| format!("{what} (--max-layer-size raises the limit)"))?;
        std::fs::remove_file(&blob_path)?;
        builder::apply_overrides(&mut tree, &self.opts.overrides);
        let image_path = self.work.path().join("image");
        let summary = builder::build_tree(&tree, &self.opts, &image_path, pb.builder())
            .with_context(|| format!("{what}: building"))?;
        drop(tree);
        let image_digest = summary
            .digest
            .map(|d| format!("sha256:{}", verity::verified::hex(&d)))
            .ok_or_else(|| anyhow::anyhow!("{what}: the image was built unsealed"))?;
        let (image_blob, image_size) = oci::sha256_of(std::fs::File::open(&image_path)?, &|_| {})?;
        pb.bytes(&format!("layer {n}/{total}: pushing"), image_size);
        let open = || push(&image_path);
        self.reg
            .push_blob(self.repo, &image_blob, &Body::Reader(image_size, &open))
            .with_context(|| format!("{what}: pushing its image"))?;
        std::fs::remove_file(&image_path)?;
        drop(bar);
        let layer = ConvertedLayer {
            source: d.clone(),
            diff_id: stats.diff_id,
            tar_size: stats.tar_bytes,
            image_blob,
            image_size,
            image_digest,
        };
        self.progress
            .layer_done(&what, &layer, start.elapsed().as_secs_f64());
        Ok(layer)
    }
}
