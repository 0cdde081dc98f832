//! `verilay convert SRC DEST`: the `convert` crate's pipeline, with progress bars, the
//! signatures and the summary (the pinned digest on stdout; `--json`).

use super::build::{Bar, CompressArgs};
use super::registry::Remote;
use crate::progress;
use anyhow::Context;
use convert::source::{docker_name, docker_reference, Source};
use convert::{LayerProgress, Manifest};
use erofs::builder::{self, BuildOptions};
use oci::conversion::ConvertedLayer;
use oci::referrers::Recorded;
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

/// Each layer's steps on a bar of its own (hidden with `--quiet`), and a line per layer.
struct Bars {
    quiet: bool,
}

impl convert::Progress for Bars {
    fn layer(&self) -> Box<dyn LayerProgress + '_> {
        Box::new(LayerBar(Bar(progress::bar(self.quiet))))
    }

    fn layer_done(&self, what: &str, l: &ConvertedLayer, seconds: f64) {
        if !self.quiet {
            eprintln!(
                "{what}: {} tar, image {} ({}), {seconds:.1} s",
                progress::human(l.tar_size),
                progress::human(l.image_size),
                l.image_digest,
            );
        }
    }

    fn copied(&self, source: &str, dest: &str) {
        if !self.quiet {
            eprintln!("{source}: copied to {dest}");
        }
    }
}

/// One layer's bar, cleared when the layer is done.
struct LayerBar(Bar);

impl Drop for LayerBar {
    fn drop(&mut self) {
        self.0 .0.finish_and_clear();
    }
}

impl LayerProgress for LayerBar {
    fn builder(&self) -> &dyn builder::Progress {
        &self.0
    }
    fn bytes(&self, what: &str, total: u64) {
        progress::bytes(&self.0 .0, what, total)
    }
    fn counting(&self, what: &str) {
        progress::counting(&self.0 .0, what)
    }
    fn set_position(&self, n: u64) {
        self.0 .0.set_position(n)
    }
    fn inc(&self, n: u64) {
        self.0 .0.inc(n)
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
    let src = Source::open(&a.source, &|r| a.remote.connect(r))?;
    let mut dest = docker_reference(&a.dest)?;
    // The last path element holds the tag, if one was given (a port is in the first).
    let tag_given = a.dest.rsplit('/').next().is_some_and(|l| l.contains(':'));
    let dest_tag = convert::dest_tag(&src, &dest, tag_given)?;
    dest.target = oci::reference::Target::Tag(dest_tag.clone());
    let reg = a.remote.connect(&dest)?;
    let build_time = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number"))?,
        Err(_) => 0,
    };
    let opts = convert::Options {
        compression,
        max_layer_size: a.max_layer_size,
        max_layers: a.max_layers,
        build_time,
    };
    let (root, root_desc, targets) = convert::plan(&src, trust.as_ref(), &opts)?;
    let done = convert::convert(
        &src,
        (&root, &root_desc, &targets),
        &dest,
        &reg,
        &opts,
        &Bars { quiet },
    )?;
    let pinned = done.pinned.clone();
    let pinned_name = format!("{}@{pinned}", docker_name(&dest));
    if let Some(key) = &key {
        let identity = format!("{}/{}:{dest_tag}", dest.registry, dest.repository);
        super::registry::sign_manifest(&reg, &dest, &identity, &pinned, key)?;
        for m in &done.manifests {
            super::registry::sign_manifest(&reg, &dest, &identity, &m.conversion, key)?;
        }
    }
    let results: Vec<(
        &convert::source::Target,
        &String,
        &Recorded,
        &Vec<ConvertedLayer>,
    )> = done
        .manifests
        .iter()
        .map(|m: &Manifest| (m.target, &m.conversion, &m.recorded, &m.layers))
        .collect();
    let bound: Vec<(String, String)> = done
        .manifests
        .iter()
        .map(|m| (m.target.desc.digest.clone(), m.bound.clone()))
        .collect();

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
