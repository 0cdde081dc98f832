//! `verilay push IMAGE REF`: the image, checked whole, stored in an OCI registry as one
//! blob of an artifact manifest recording its digest; prints the manifest's digest.
//! With `--sign-by-sigstore-private-key`, the manifest is signed as the reference pushed
//! (`HOST/REPO:TAG`) and the signature stored beside it, as skopeo stores one.

use super::image::{open_verified, Pin};
use super::registry::{reference, sign_manifest, Remote, Sign};
use crate::progress;
use erofs::read::ByteSource as _;
use oci::registry::Body;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    image: PathBuf,
    /// `oci://HOST[:PORT]/REPOSITORY[:TAG]` (the tag defaults to `latest`).
    reference: String,
    #[command(flatten)]
    remote: Remote,
    #[command(flatten)]
    sign: Sign,
    /// No progress bar and no summary line.
    #[arg(short, long)]
    quiet: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let r = reference(&a.reference)?;
    let tag = match &r.target {
        oci::reference::Target::Tag(t) => t.clone(),
        oci::reference::Target::Digest(_) => {
            anyhow::bail!("{r}: push to a tag; a manifest digest is what push prints")
        }
    };
    // The key and the identity signed, checked before anything is read or stored: a bad
    // key, a wrong passphrase or a reference containers/image would read as another
    // repository fails here, with nothing pushed.
    let key = a.sign.key()?;
    let identity = match &key {
        Some(_) => Some(
            signatures::image_identity(&r)
                .map_err(anyhow::Error::msg)?
                .to_string(),
        ),
        None => None,
    };
    let name = a.image.display();
    // What is pushed verifies: every block against the image's own tree.
    let v = open_verified(&a.image, &Pin::default())?;
    let pb = progress::bar(a.quiet || a.json);
    progress::bytes(&pb, "verifying", v.len());
    v.verify_all(&|n| pb.inc(n))
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let image_digest = v.digest_string();
    pb.set_position(0);
    let file = std::fs::File::open(&a.image)?;
    progress::bytes(&pb, "hashing", file.metadata()?.len());
    let (blob, size) =
        oci::sha256_of(&file, &|n| pb.inc(n)).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let reg = a.remote.connect(&r)?;
    pb.set_position(0);
    progress::bytes(&pb, "pushing", size);
    let open = || -> std::io::Result<Box<dyn std::io::Read + '_>> {
        pb.set_position(0);
        Ok(Box::new(pb.wrap_read(std::fs::File::open(&a.image)?)))
    };
    reg.push_blob(&r.repository, &blob, &Body::Reader(size, &open))?;
    pb.finish_and_clear();
    let config = oci::artifact::empty_config();
    reg.push_blob(
        &r.repository,
        &config.digest,
        &Body::Bytes(oci::artifact::EMPTY_BLOB),
    )?;
    let title = a
        .image
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let manifest = oci::artifact::manifest(&blob, size, &image_digest, &title);
    let manifest_digest =
        reg.put_manifest(&r.repository, &tag, &manifest, oci::artifact::MANIFEST_TYPE)?;
    if let (Some(key), Some(identity)) = (&key, &identity) {
        sign_manifest(&reg, &r, identity, &manifest_digest, key).map_err(|e| {
            e.context(format!(
                "manifest {manifest_digest} is pushed, but not signed"
            ))
        })?;
    }
    if a.json {
        outln!(
            "{}",
            serde_json::json!({
                "reference": r.to_string(),
                "manifest": manifest_digest,
                "image_digest": image_digest,
                "blob": blob,
                "bytes": size,
                "signed": identity.is_some(),
                "signed_as": identity,
            })
        );
        return Ok(0);
    }
    outln!("{manifest_digest}");
    if !a.quiet {
        let signed = identity
            .as_ref()
            .map(|i| format!(", signed as {i}"))
            .unwrap_or_default();
        eprintln!(
            "{name}: pushed to {r} ({}), manifest {manifest_digest}, image digest {image_digest}{signed}",
            progress::human(size)
        );
    }
    Ok(0)
}
