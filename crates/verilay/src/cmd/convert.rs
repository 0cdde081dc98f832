//! `verilay convert SRC DEST`: every layer of a container image becomes a sealed verilay
//! image, stored in DEST's repository with the original image. DEST's tag names the bound
//! manifest (`oci::conversion::bind`: the original with each layer's verilay image in its
//! annotations), whose digest is printed: pinning it pins every image it leads to. The
//! conversion is also recorded as a referrer of the original manifest, a link that is
//! never trusted for being found (`layerstore::resolve`).
//!
//! Per layer: the blob is fetched into a temporary file and checked against its digest,
//! read as a layer tarball (whiteouts and opaque markers kept, its DiffID taken on the
//! way), built into a sealed image with a fixed build time and a content-derived UUID (the
//! same layer always gives the same image digest) and pushed.

use super::build::{Bar, CompressArgs};
use super::registry::{reference, Remote};
use crate::progress;
use anyhow::{bail, Context};
use erofs::builder::{self, BuildOptions};
use oci::artifact::Descriptor;
use oci::conversion::{self, ConvertedLayer, CONVERSION_TYPE};
use oci::image::{self, Parsed};
use oci::referrers::Recorded;
use oci::registry::Body;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The image: `docker://HOST[:PORT]/REPOSITORY[:TAG|@sha256:DIGEST]`, or
    /// `oci:DIR[:TAG]` (an OCI image layout, as `skopeo copy` writes it).
    source: String,
    /// `docker://HOST[:PORT]/REPOSITORY[:TAG]`: where the conversion is stored, next to
    /// the original image (copied there first, by digest, when the source is elsewhere).
    /// TAG names the bound manifest, the image to pin: default the source's tag (or
    /// `latest`), or `TAG-verilay` where that is the source's own tag in the same
    /// repository (a source tag moves only when named).
    dest: String,
    #[command(flatten)]
    remote: Remote,
    /// Signs the bound manifest (and each conversion manifest, which a layer store
    /// then trusts as a referrer under a policy requiring this key) as DEST.
    #[command(flatten)]
    sign: super::registry::Sign,
    /// The source's manifest must satisfy it, as a podman pull would (registries only).
    #[command(flatten)]
    signatures: super::registry::Policy,
    #[command(flatten)]
    compression: CompressArgs,
    /// The most bytes a layer may expand to (its uncompressed tar; K, M, G, T): a few KB
    /// of zstd can expand to terabytes.
    #[arg(long, value_name = "SIZE", default_value = "32G", value_parser = mountopts::parse_size)]
    max_layer_size: u64,
    /// The most layers an image (each image of an index) may have.
    #[arg(long, value_name = "N", default_value_t = 256)]
    max_layers: usize,
    /// No progress and no summary.
    #[arg(short, long)]
    quiet: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// Where the image comes from.
enum Source {
    Registry(oci::Registry, oci::Reference),
    Layout(oci::layout::Layout, Option<String>, PathBuf),
}

impl Source {
    fn open(spec: &str, remote: &Remote) -> anyhow::Result<Source> {
        if let Some(rest) = spec.strip_prefix("oci:") {
            // oci:DIR or oci:DIR:TAG (a tag has no '/').
            let (dir, tag) = match rest.rsplit_once(':') {
                Some((d, t)) if !t.contains('/') && !d.is_empty() => (d, Some(t.to_string())),
                _ => (rest, None),
            };
            let layout = oci::layout::Layout::open(Path::new(dir)).map_err(anyhow::Error::msg)?;
            return Ok(Source::Layout(layout, tag, PathBuf::from(dir)));
        }
        let r = docker_reference(spec)?;
        Ok(Source::Registry(remote.connect(&r)?, r))
    }

    fn name(&self) -> String {
        match self {
            Source::Registry(_, r) => docker_name(r),
            Source::Layout(_, tag, dir) => match tag {
                Some(t) => format!("oci:{}:{t}", dir.display()),
                None => format!("oci:{}", dir.display()),
            },
        }
    }

    /// The top manifest (an image manifest or an index): its bytes and descriptor.
    fn root(&self) -> anyhow::Result<(Vec<u8>, Descriptor)> {
        match self {
            Source::Registry(reg, r) => {
                let (bytes, media_type) = reg.get_manifest(&r.repository, r.target_str())?;
                if let oci::reference::Target::Digest(d) = &r.target {
                    check_digest(&bytes, d, "the manifest")?;
                }
                let media_type = media_type_of(&bytes, &media_type);
                Ok((bytes.clone(), Descriptor::of(&media_type, &bytes)))
            }
            Source::Layout(l, tag, _) => {
                let d = l.find(tag.as_deref()).map_err(anyhow::Error::msg)?;
                let bytes = l.small_blob(&d.digest).map_err(anyhow::Error::msg)?;
                check_digest(&bytes, &d.digest, "the manifest")?;
                Ok((bytes, d))
            }
        }
    }

    /// A manifest an index lists, checked against its digest.
    fn manifest(&self, d: &Descriptor) -> anyhow::Result<Vec<u8>> {
        let bytes = match self {
            Source::Registry(reg, r) => reg.get_manifest(&r.repository, &d.digest)?.0,
            Source::Layout(l, ..) => l.small_blob(&d.digest).map_err(anyhow::Error::msg)?,
        };
        check_digest(&bytes, &d.digest, "the manifest")?;
        Ok(bytes)
    }

    /// A blob's bytes (the reader checks nothing: callers hash what they read).
    fn blob(&self, digest: &str) -> anyhow::Result<Box<dyn Read + Send>> {
        Ok(match self {
            Source::Registry(reg, r) => reg.get_blob(&r.repository, digest)?,
            Source::Layout(l, ..) => Box::new(l.blob(digest).map_err(anyhow::Error::msg)?),
        })
    }

    /// Whether the source is that repository of that registry (nothing to copy there).
    fn is(&self, dest: &oci::Reference) -> bool {
        matches!(self, Source::Registry(_, r)
            if r.registry == dest.registry && r.repository == dest.repository)
    }
}

/// `docker://HOST[:PORT]/REPO[:TAG|@DIGEST]` as a reference (the host is required: no
/// default registry is assumed).
fn docker_reference(s: &str) -> anyhow::Result<oci::Reference> {
    let Some(rest) = s.strip_prefix("docker://") else {
        bail!("{s:?}: expected docker://HOST[:PORT]/REPOSITORY[:TAG|@DIGEST] or oci:DIR[:TAG]");
    };
    reference(rest)
}

fn docker_name(r: &oci::Reference) -> String {
    r.to_string().replacen("oci://", "docker://", 1)
}

/// The media type a manifest's own `mediaType` gives, else the registry's Content-Type.
fn media_type_of(bytes: &[u8], header: &str) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v.get("mediaType")?.as_str().map(str::to_string))
        .unwrap_or_else(|| header.split(';').next().unwrap_or("").trim().to_string())
}

fn check_digest(bytes: &[u8], want: &str, what: &str) -> anyhow::Result<()> {
    let got = oci::registry::sha256_digest(bytes);
    if got != want {
        bail!("{what} {want}: its bytes hash to {got}");
    }
    Ok(())
}

/// One image manifest to convert (one, or each linux one an index lists).
struct Target {
    desc: Descriptor,
    bytes: Vec<u8>,
    manifest: oci::artifact::Manifest,
}

fn targets(src: &Source) -> anyhow::Result<(Vec<u8>, Descriptor, Vec<Target>)> {
    let (root, root_desc) = src.root()?;
    let parsed = image::parse(&root, &root_desc.media_type)
        .map_err(|e| anyhow::anyhow!("{}: {e}", src.name()))?;
    let targets = match parsed {
        Parsed::Manifest(manifest) => vec![Target {
            desc: root_desc.clone(),
            bytes: root.clone(),
            manifest: *manifest,
        }],
        Parsed::Index(index) => {
            let mut out: Vec<Target> = Vec::new();
            for d in index.manifests {
                // A manifest listed twice is converted once.
                if d.platform.as_ref().is_some_and(|p| p.os != "linux")
                    || out.iter().any(|t| t.desc.digest == d.digest)
                {
                    continue;
                }
                let bytes = src.manifest(&d)?;
                match image::parse(&bytes, &d.media_type) {
                    Ok(Parsed::Manifest(manifest)) => out.push(Target {
                        desc: d,
                        bytes,
                        manifest: *manifest,
                    }),
                    // Attestations and other artifacts an index may list are not images.
                    _ => continue,
                }
            }
            out
        }
    };
    if targets.is_empty() {
        bail!("{}: no linux image manifest to convert", src.name());
    }
    Ok((root, root_desc, targets))
}

/// Copies a blob from the source to `dest` unless it is there already.
fn copy_blob(src: &Source, reg: &oci::Registry, repo: &str, d: &Descriptor) -> anyhow::Result<()> {
    let open = || -> std::io::Result<Box<dyn Read + '_>> {
        src.blob(&d.digest)
            .map(|r| Box::new(r) as Box<dyn Read>)
            .map_err(std::io::Error::other)
    };
    reg.push_blob(repo, &d.digest, &Body::Reader(d.size, &open))
        .with_context(|| format!("copying blob {}", d.digest))
}

/// The verilay image of one layer: fetched, checked, read, built, pushed.
struct Converter<'a> {
    src: &'a Source,
    reg: &'a oci::Registry,
    repo: &'a str,
    opts: BuildOptions,
    work: tempfile::TempDir,
    quiet: bool,
    /// The source is another repository: each layer blob, once checked, is stored in
    /// the destination too.
    copy: bool,
    /// `--max-layer-size`.
    max_layer_size: u64,
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
        let pb = progress::bar(self.quiet);
        progress::bytes(&pb, &format!("layer {n}/{total}: fetching"), d.size);
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
        if self.copy {
            progress::bytes(&pb, &format!("layer {n}/{total}: copying"), size);
            let open = || -> std::io::Result<Box<dyn Read + '_>> {
                pb.set_position(0);
                Ok(Box::new(pb.wrap_read(std::fs::File::open(&blob_path)?)))
            };
            self.reg
                .push_blob(self.repo, &d.digest, &Body::Reader(size, &open))
                .with_context(|| format!("{what}: copying it"))?;
        }
        progress::counting(&pb, &format!("layer {n}/{total}: reading"));
        let (mut tree, stats) =
            tarlayer::read_layer(&blob_path, self.work.path(), self.max_layer_size, &|k| {
                pb.set_position(k)
            })
            .with_context(|| format!("{what} (--max-layer-size raises the limit)"))?;
        std::fs::remove_file(&blob_path)?;
        builder::apply_overrides(&mut tree, &self.opts.overrides);
        let image_path = self.work.path().join("image");
        let summary = builder::build_tree(&tree, &self.opts, &image_path, &Bar(pb.clone()))
            .with_context(|| format!("{what}: building"))?;
        drop(tree);
        let image_digest = summary
            .digest
            .map(|d| format!("sha256:{}", verity::verified::hex(&d)))
            .ok_or_else(|| anyhow::anyhow!("{what}: the image was built unsealed"))?;
        let (image_blob, image_size) = oci::sha256_of(std::fs::File::open(&image_path)?, &|_| {})?;
        progress::bytes(&pb, &format!("layer {n}/{total}: pushing"), image_size);
        let open = || -> std::io::Result<Box<dyn Read + '_>> {
            pb.set_position(0);
            Ok(Box::new(pb.wrap_read(std::fs::File::open(&image_path)?)))
        };
        self.reg
            .push_blob(self.repo, &image_blob, &Body::Reader(image_size, &open))
            .with_context(|| format!("{what}: pushing its image"))?;
        std::fs::remove_file(&image_path)?;
        pb.finish_and_clear();
        if !self.quiet {
            eprintln!(
                "{what}: {} tar, image {} ({image_digest}), {:.1} s",
                progress::human(stats.tar_bytes),
                progress::human(image_size),
                start.elapsed().as_secs_f64()
            );
        }
        Ok(ConvertedLayer {
            source: d.clone(),
            diff_id: stats.diff_id,
            tar_size: stats.tar_bytes,
            image_blob,
            image_size,
            image_digest,
        })
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let start = Instant::now();
    let quiet = a.quiet || a.json;
    let compression = match a.compression.settings(BuildOptions::default().block_size) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("verilay: error: {msg}");
            return Ok(2);
        }
    };
    let key = a.sign.key()?;
    let trust = a.signatures.load()?;
    let src = Source::open(&a.source, &a.remote)?;
    let mut dest = docker_reference(&a.dest)?;
    // The last path element holds the tag, if one was given (a port is in the first).
    let tag_given = a.dest.rsplit('/').next().is_some_and(|l| l.contains(':'));
    let dest_tag = match (&dest.target, &src) {
        (oci::reference::Target::Digest(_), _) => {
            bail!("{}: name a tag (or none), not a digest", a.dest)
        }
        (oci::reference::Target::Tag(t), _) if tag_given => t.clone(),
        (_, Source::Registry(_, r)) => match &r.target {
            oci::reference::Target::Tag(t) if src.is(&dest) => format!("{t}-verilay"),
            oci::reference::Target::Tag(t) => t.clone(),
            oci::reference::Target::Digest(_) => "latest".into(),
        },
        (_, Source::Layout(_, tag, _)) => tag.clone().unwrap_or_else(|| "latest".into()),
    };
    dest.target = oci::reference::Target::Tag(dest_tag.clone());
    let reg = a.remote.connect(&dest)?;
    let repo = dest.repository.as_str();

    let (root, root_desc, targets) = targets(&src)?;
    if let (Some(t), Source::Registry(reg, r)) = (&trust, &src) {
        t.check(reg, r, &root_desc.digest)
            .map_err(anyhow::Error::msg)?;
    }
    for t in &targets {
        if t.manifest.layers.len() > a.max_layers {
            bail!(
                "{}: manifest {} has {} layers, more than the limit of {} (--max-layers raises it)",
                src.name(),
                t.desc.digest,
                t.manifest.layers.len(),
                a.max_layers
            );
        }
    }
    let copy = !src.is(&dest);
    let env_epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number"))?,
        Err(_) => 0,
    };
    let converter = Converter {
        src: &src,
        reg: &reg,
        repo,
        opts: BuildOptions {
            // Fixed, and the UUID derived from the contents: the same layer, the same image.
            build_time: env_epoch,
            uuid: None,
            compression,
            ..BuildOptions::default()
        },
        work: tempfile::tempdir().context("a temporary directory")?,
        quiet,
        copy,
        max_layer_size: a.max_layer_size,
    };
    let config = oci::artifact::empty_config();
    reg.push_blob(
        repo,
        &config.digest,
        &Body::Bytes(oci::artifact::EMPTY_BLOB),
    )?;
    let mut done: HashMap<String, ConvertedLayer> = HashMap::new();
    let mut results = Vec::new();
    for t in &targets {
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
        for t in &targets {
            copy_blob(&src, &reg, repo, &t.manifest.config)?;
            if t.desc.digest != root_desc.digest {
                reg.put_manifest(repo, &t.desc.digest, &t.bytes, &t.desc.media_type)?;
            }
        }
        reg.put_manifest(repo, &root_desc.digest, &root, &root_desc.media_type)?;
        if !quiet {
            eprintln!("{}: copied to {}", src.name(), docker_name(&dest));
        }
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
    let mut recorded = Vec::new();
    for (t, layers) in results {
        let bytes = conversion::manifest(&t.desc, &layers);
        let (digest, took) = reg.put_manifest_noting_subject(
            repo,
            &oci::registry::sha256_digest(&bytes),
            &bytes,
            oci::artifact::MANIFEST_TYPE,
        )?;
        let mut referrer = Descriptor::of(oci::artifact::MANIFEST_TYPE, &bytes);
        referrer.artifact_type = Some(CONVERSION_TYPE.into());
        let how = reg.record_referrer(repo, &t.desc.digest, referrer, took)?;
        recorded.push((t, digest, how, layers));
    }
    let results = recorded;

    // The bound manifests, then (for an index) the bound index, under DEST's tag: what
    // users pin.
    let mut bound = Vec::new();
    for (t, _, _, layers) in &results {
        let bytes = conversion::bind(&t.bytes, layers)
            .map_err(|e| anyhow::anyhow!("{}: {e}", t.desc.digest))?;
        let digest = oci::registry::sha256_digest(&bytes);
        reg.put_manifest(repo, &digest, &bytes, &t.desc.media_type)?;
        bound.push((t.desc.digest.clone(), digest, bytes));
    }
    let (pinned, pinned_bytes) = match image::parse(&root, &root_desc.media_type) {
        Ok(Parsed::Index(_)) => {
            let entries: Vec<_> = bound
                .iter()
                .map(|(from, to, bytes)| (from.clone(), to.clone(), bytes.len() as u64))
                .collect();
            let bytes = conversion::bind_index(&root, &entries)
                .map_err(|e| anyhow::anyhow!("{}: {e}", src.name()))?;
            (oci::registry::sha256_digest(&bytes), bytes)
        }
        _ => (bound[0].1.clone(), bound[0].2.clone()),
    };
    reg.put_manifest(repo, &dest_tag, &pinned_bytes, &root_desc.media_type)?;
    let pinned_name = format!("{}@{pinned}", docker_name(&dest));
    if let Some(key) = &key {
        let identity = format!("{}/{}:{dest_tag}", dest.registry, dest.repository);
        super::registry::sign_manifest(&reg, &dest, &identity, &pinned, key)?;
        for (_, conv, _, _) in &results {
            super::registry::sign_manifest(&reg, &dest, &identity, conv, key)?;
        }
    }

    if a.json {
        let manifests: Vec<serde_json::Value> = results
            .iter()
            .map(|(t, digest, how, layers)| {
                serde_json::json!({
                    "manifest": t.desc.digest,
                    "platform": t.desc.platform,
                    "conversion": digest,
                    "bound": bound.iter().find(|b| b.0 == t.desc.digest).map(|b| b.1.clone()),
                    "recorded": match how {
                        Recorded::Api => "referrers API".to_string(),
                        Recorded::Tag => format!("tag {}", oci::referrers::fallback_tag(&t.desc.digest).unwrap_or_default()),
                    },
                    "layers": layers.iter().map(|l| serde_json::json!({
                        "digest": l.source.digest,
                        "diff_id": l.diff_id,
                        "image_digest": l.image_digest,
                        "image_blob": l.image_blob,
                        "image_bytes": l.image_size,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        outln!(
            "{}",
            serde_json::json!({
                "source": src.name(),
                "dest": docker_name(&dest),
                "pinned": pinned,
                "signed": key.is_some(),
                "pinned_reference": pinned_name,
                "manifests": manifests,
                "seconds": start.elapsed().as_secs_f64(),
            })
        );
    } else {
        outln!("{pinned}");
        if !a.quiet {
            for (t, digest, how, layers) in &results {
                let recorded = match how {
                    Recorded::Api => "the registry's referrers API".to_string(),
                    Recorded::Tag => format!(
                        "tag {}",
                        oci::referrers::fallback_tag(&t.desc.digest).unwrap_or_default()
                    ),
                };
                eprintln!(
                    "{}: {} layers converted; conversion {digest} refers to manifest {} (recorded by {recorded})",
                    docker_name(&dest),
                    layers.len(),
                    t.desc.digest,
                );
            }
            eprintln!(
                "{pinned_name}: the converted image, {:.1} s; pin this digest (through it the layer store takes each layer's image)",
                start.elapsed().as_secs_f64()
            );
        }
    }
    Ok(0)
}
