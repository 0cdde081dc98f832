//! `verilay pull REF -o IMAGE`: the image fetched whole from an OCI registry, checked
//! against the registry's blob digest and then every block against the pinned image
//! digest (`--digest`, or the manifest's annotation), before it takes the name IMAGE.

use super::image::{open_verified, Pin};
use super::registry::{reference, Remote};
use crate::progress;
use anyhow::Context as _;
use erofs::read::ByteSource as _;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// `oci://HOST[:PORT]/REPOSITORY[:TAG|@sha256:MANIFEST]`.
    reference: String,
    /// Where the image goes (replaced only once it verifies).
    #[arg(short, long, value_name = "IMAGE")]
    output: PathBuf,
    #[command(flatten)]
    pin: Pin,
    #[command(flatten)]
    remote: Remote,
    /// No progress bar and no summary line.
    #[arg(short, long)]
    quiet: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let r = reference(&a.reference)?;
    let reg = a.remote.connect(&r)?;
    let (manifest, media_type) = reg.get_manifest(&r.repository, r.target_str())?;
    if let oci::reference::Target::Digest(want) = &r.target {
        let got = oci::registry::sha256_digest(&manifest);
        if &got != want {
            anyhow::bail!("{r}: the registry sent a manifest whose digest is {got}");
        }
    }
    let image =
        oci::artifact::image_of(&manifest, &media_type).map_err(|e| anyhow::anyhow!("{r}: {e}"))?;
    let pin = pin_of(&r, &a.pin, image.digest.as_deref())?;
    let tmp = partial_path(&a.output)?;
    let result = fetch(&a, &r, &reg, &image.blob, &tmp).and_then(|()| {
        let v = open_verified(&tmp, &pin)
            .map_err(|e| anyhow::anyhow!("{r}: the blob is not the pinned verilay image: {e:#}"))?;
        let pb = progress::bar(a.quiet || a.json);
        progress::bytes(&pb, "verifying", v.len());
        v.verify_all(&|n| pb.inc(n))
            .map_err(|e| anyhow::anyhow!("{r}: {e}"))?;
        pb.finish_and_clear();
        Ok(v.digest_string())
    });
    let digest = match result {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, &a.output)
        .with_context(|| format!("naming {} {}", tmp.display(), a.output.display()))?;
    if a.json {
        outln!(
            "{}",
            serde_json::json!({
                "reference": r.to_string(),
                "image": a.output,
                "image_digest": digest,
                "pinned": a.pin.digest.is_some() || matches!(r.target, oci::reference::Target::Digest(_)),
                "bytes": image.blob.size,
            })
        );
    } else if !a.quiet {
        // The annotation of a manifest fetched by tag is the registry's word: it checks
        // the bytes' integrity, not who made them.
        let trust = if a.pin.digest.is_some()
            || matches!(r.target, oci::reference::Target::Digest(_))
        {
            "pinned"
        } else {
            "as the manifest's annotation says; not pinned: give --digest or pull by manifest digest"
        };
        eprintln!(
            "{}: pulled from {r} ({}), every block verified, digest {digest} ({trust})",
            a.output.display(),
            progress::human(image.blob.size)
        );
    }
    Ok(0)
}

/// The digest the pulled image must have: `--digest`, else the manifest's annotation.
fn pin_of(r: &oci::Reference, pin: &Pin, annotated: Option<&str>) -> anyhow::Result<Pin> {
    match (&pin.digest, annotated) {
        (Some(given), Some(noted)) if !given.eq_ignore_ascii_case(noted) => {
            anyhow::bail!("{r}: the manifest records image digest {noted}, not --digest {given}")
        }
        (Some(_), _) => Ok(pin.clone()),
        (None, Some(noted)) => Ok(Pin {
            digest: Some(noted.to_string()),
        }),
        (None, None) => anyhow::bail!(
            "{r}: the manifest records no image digest ({}); give --digest",
            oci::artifact::DIGEST_ANNOTATION
        ),
    }
}

/// `DIR/.NAME.partial`, beside the output so the rename is atomic.
fn partial_path(out: &Path) -> anyhow::Result<PathBuf> {
    let name = out
        .file_name()
        .with_context(|| format!("-o {}: not a file name", out.display()))?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(".partial");
    Ok(out.with_file_name(tmp))
}

/// The blob into `tmp`, exactly its size, checked against its digest.
fn fetch(
    a: &Args,
    r: &oci::Reference,
    reg: &oci::Registry,
    blob: &oci::artifact::Descriptor,
    tmp: &Path,
) -> anyhow::Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    let body = reg.get_blob(&r.repository, &blob.digest)?;
    let pb = progress::bar(a.quiet || a.json);
    progress::bytes(&pb, "pulling", blob.size);
    // One byte more than announced is read, to see a blob that runs on.
    let tee = Tee {
        from: body.take(blob.size + 1),
        to: &mut out,
    };
    let (digest, n) = oci::sha256_of(tee, &|n| pb.inc(n))
        .map_err(|e| anyhow::anyhow!("{r}: fetching blob {}: {e}", blob.digest))?;
    pb.finish_and_clear();
    if n != blob.size {
        anyhow::bail!(
            "{r}: blob {} is {n} bytes, not the {} its manifest says",
            blob.digest,
            blob.size
        );
    }
    if digest != blob.digest {
        anyhow::bail!(
            "{r}: the registry sent bytes whose digest is {digest}, not blob {}",
            blob.digest
        );
    }
    out.sync_all()?;
    Ok(())
}

/// A reader that writes what it reads to `to`.
struct Tee<'a, R> {
    from: R,
    to: &'a mut std::fs::File,
}

impl<R: std::io::Read> std::io::Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.from.read(buf)?;
        self.to.write_all(&buf[..n])?;
        Ok(n)
    }
}
