//! `verilay pull REF -o IMAGE`: the image fetched whole, checked against the registry's
//! blob digest and every block against the pinned image digest, before it takes the name
//! IMAGE (docs/SECURITY.md section 9). Under a signature policy the manifest must satisfy
//! it before its blob is fetched.

use super::image::{open_verified, Pin};
use super::registry::{reference, Remote};
use crate::progress;
use anyhow::Context as _;
use erofs::read::ByteSource as _;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
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
    /// The largest image pulled (K, M, G, T): a manifest may claim any size, and the
    /// blob is written to disk before it can be verified.
    #[arg(long, value_name = "SIZE", default_value = "32G", value_parser = mountopts::parse_size)]
    max_size: u64,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    super::registry::check_output(&a.output)?;
    let r = reference(&a.reference)?;
    // Read first: a policy that cannot be used fails before the network is asked.
    let trust = a.pin.policy.load()?;
    let reg = a.remote.connect(&r)?;
    let (manifest, media_type) = reg.get_manifest(&r.repository, r.target_str())?;
    let manifest_digest = oci::registry::sha256_digest(&manifest);
    if let oci::reference::Target::Digest(want) = &r.target {
        if &manifest_digest != want {
            anyhow::bail!("{r}: the registry sent a manifest whose digest is {manifest_digest}");
        }
    }
    // The manifest in hand is what the policy judges, and the only one whose blob is
    // fetched: a tag moved after this check changes nothing here.
    let accepted = match &trust {
        Some(t) => Some(
            t.check(&reg, &r, &manifest_digest)
                .map_err(anyhow::Error::msg)?,
        ),
        None => None,
    };
    let signed = accepted.as_ref().is_some_and(|a| a.signed);
    let image =
        oci::artifact::image_of(&manifest, &media_type).map_err(|e| anyhow::anyhow!("{r}: {e}"))?;
    let pin = pin_of(&r, &a.pin, image.digest.as_deref())?;
    if image.blob.size > a.max_size {
        anyhow::bail!(
            "{r}: the image is {} bytes, more than the limit of {} (--max-size raises it)",
            image.blob.size,
            a.max_size
        );
    }
    // Unnamed until whole and verified where the filesystem allows (O_TMPFILE): a pull
    // killed on the way leaves nothing behind.
    let (file, named) = match unnamed_beside(&a.output) {
        Ok(f) => (f, None),
        Err(_) => {
            let (path, f) = create_partial(&a.output)?;
            (f, Some(path))
        }
    };
    let result = fetch(&a, &r, &reg, &image.blob, &file)
        .and_then(|()| verify(&a, &r, &pin, &file))
        .and_then(|digest| {
            let tmp = match &named {
                Some(p) => p.clone(),
                None => link_partial(&a.output, &file)?,
            };
            // Our file, still under its name (nobody swapped it), takes the output's name.
            let ours = file.metadata()?;
            let on_disk = std::fs::symlink_metadata(&tmp)?;
            if (ours.dev(), ours.ino()) != (on_disk.dev(), on_disk.ino()) {
                anyhow::bail!("{}: replaced by someone else while pulling", tmp.display());
            }
            file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            std::fs::rename(&tmp, &a.output).with_context(|| {
                let _ = std::fs::remove_file(&tmp);
                format!("naming {} {}", tmp.display(), a.output.display())
            })?;
            Ok(digest)
        });
    let digest = match result {
        Ok(d) => d,
        Err(e) => {
            if let Some(tmp) = &named {
                let _ = std::fs::remove_file(tmp);
            }
            return Err(e);
        }
    };
    if a.json {
        outln!(
            "{}",
            serde_json::json!({
                "reference": r.to_string(),
                "image": a.output,
                "image_digest": digest,
                "pinned": a.pin.digest.is_some() || matches!(r.target, oci::reference::Target::Digest(_)),
                "signed": signed,
                "bytes": image.blob.size,
            })
        );
    } else if !a.quiet {
        // The annotation of a manifest fetched by tag is the registry's word (its blob
        // digest checks the bytes' integrity, not who made them), unless a signature the
        // policy accepted vouches for that manifest.
        let pinned =
            a.pin.digest.is_some() || matches!(r.target, oci::reference::Target::Digest(_));
        let signed_by = accepted
            .as_ref()
            .filter(|acc| acc.signed)
            .map(|acc| format!("the manifest's signature accepted by policy {}", acc.scope));
        let trust = match (pinned, signed_by) {
            (true, None) => "pinned".to_string(),
            (true, Some(s)) => format!("pinned; {s}"),
            (false, Some(s)) => format!("as the signed manifest says; {s}"),
            (false, None) => "as the manifest's annotation says; not pinned: give --digest or pull by manifest digest".to_string(),
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
            ..pin.clone()
        }),
        (None, None) => anyhow::bail!(
            "{r}: the manifest records no image digest ({}); give --digest",
            oci::artifact::DIGEST_ANNOTATION
        ),
    }
}

/// An unnamed file (O_TMPFILE, 0600) in the output's directory, so it can be linked there.
fn unnamed_beside(out: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir)
}

/// Names `DIR/.NAME.partial.RANDOM` beside the output (so a rename is atomic), tried in
/// turn by `make` until one is free; never a file or link someone else put there.
fn partial_name<T>(
    out: &Path,
    make: impl Fn(&Path) -> std::io::Result<T>,
) -> anyhow::Result<(PathBuf, T)> {
    let name = out
        .file_name()
        .with_context(|| format!("-o {}: not a file name", out.display()))?;
    let mut seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    for _ in 0..16 {
        let mut tmp = std::ffi::OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".partial.{:016x}", seed));
        let path = out.with_file_name(tmp);
        match make(&path) {
            Ok(t) => return Ok((path, t)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                seed = seed.rotate_left(17).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 1;
            }
            Err(e) => return Err(anyhow::anyhow!("creating {}: {e}", path.display())),
        }
    }
    anyhow::bail!(
        "{}: no free name for a partial file beside it",
        out.display()
    )
}

/// A new file under a partial name, created exclusively and 0600.
fn create_partial(out: &Path) -> anyhow::Result<(PathBuf, std::fs::File)> {
    partial_name(out, |path| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
    })
}

/// The unnamed `file`, linked under a partial name (the rename to the output follows).
fn link_partial(out: &Path, file: &std::fs::File) -> anyhow::Result<PathBuf> {
    let own = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let (path, ()) = partial_name(out, |path| {
        rustix::fs::linkat(
            rustix::fs::CWD,
            &own,
            rustix::fs::CWD,
            path,
            rustix::fs::AtFlags::SYMLINK_FOLLOW,
        )
        .map_err(std::io::Error::from)
    })?;
    Ok(path)
}

/// Every block of the fetched file (read through its descriptor, whatever its name now
/// is) against the pinned digest; the image digest.
fn verify(a: &Args, r: &oci::Reference, pin: &Pin, file: &std::fs::File) -> anyhow::Result<String> {
    let own = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let v = open_verified(&own, pin).map_err(|e| {
        let why = format!("{e:#}").replace(&format!("{}: ", own.display()), "");
        anyhow::anyhow!("{r}: the blob is not the pinned verilay image: {why}")
    })?;
    let pb = progress::bar(a.quiet || a.json);
    progress::bytes(&pb, "verifying", v.len());
    v.verify_all(&|n| pb.inc(n))
        .map_err(|e| anyhow::anyhow!("{r}: {e}"))?;
    pb.finish_and_clear();
    Ok(v.digest_string())
}

/// The blob into `file`, exactly its size, checked against its digest.
fn fetch(
    a: &Args,
    r: &oci::Reference,
    reg: &oci::Registry,
    blob: &oci::artifact::Descriptor,
    file: &std::fs::File,
) -> anyhow::Result<()> {
    let body = reg.get_blob(&r.repository, &blob.digest)?;
    let pb = progress::bar(a.quiet || a.json);
    progress::bytes(&pb, "pulling", blob.size);
    // One byte more than announced is read, to see a blob that runs on.
    let (digest, n) = oci::sha256_copy(body, file, blob.size.saturating_add(1), &|n| pb.inc(n))
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
    file.sync_all()?;
    Ok(())
}
