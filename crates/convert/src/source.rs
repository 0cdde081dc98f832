//! Where a conversion's image comes from (a registry or an OCI layout), and the image
//! manifests it converts: the one named, or each linux one an index lists, every manifest
//! checked against its digest.

use anyhow::bail;
use oci::artifact::Descriptor;
use oci::image::{self, Parsed};
use oci::registry::Body;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where the image comes from.
pub enum Source {
    /// A repository of a registry, connected, and the reference given.
    Registry(oci::Registry, oci::Reference),
    /// An OCI image layout, the tag given (if any) and its directory.
    Layout(oci::layout::Layout, Option<String>, PathBuf),
}

impl Source {
    /// Opens `spec`: `docker://HOST[:PORT]/REPO[:TAG|@DIGEST]` (a registry, connected by
    /// `connect`) or `oci:DIR[:TAG]` (an OCI image layout).
    pub fn open(
        spec: &str,
        connect: &dyn Fn(&oci::Reference) -> anyhow::Result<oci::Registry>,
    ) -> anyhow::Result<Source> {
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
        Ok(Source::Registry(connect(&r)?, r))
    }

    /// The source as the user names it.
    pub fn name(&self) -> String {
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
    pub fn blob(&self, digest: &str) -> anyhow::Result<Box<dyn Read + Send>> {
        Ok(match self {
            Source::Registry(reg, r) => reg.get_blob(&r.repository, digest)?,
            Source::Layout(l, ..) => Box::new(l.blob(digest).map_err(anyhow::Error::msg)?),
        })
    }

    /// Whether the source is that repository of that registry (nothing to copy there).
    pub fn is(&self, dest: &oci::Reference) -> bool {
        matches!(self, Source::Registry(_, r)
            if r.registry == dest.registry && r.repository == dest.repository)
    }
}

/// `docker://HOST[:PORT]/REPO[:TAG|@DIGEST]` as a reference (the host is required: no
/// default registry is assumed).
pub fn docker_reference(s: &str) -> anyhow::Result<oci::Reference> {
    let Some(rest) = s.strip_prefix("docker://") else {
        bail!("{s:?}: expected docker://HOST[:PORT]/REPOSITORY[:TAG|@DIGEST] or oci:DIR[:TAG]");
    };
    oci::Reference::parse(rest).map_err(anyhow::Error::msg)
}

/// `r` as `docker://…`, as skopeo and podman name it.
pub fn docker_name(r: &oci::Reference) -> String {
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
pub struct Target {
    /// Its descriptor (in the index, or made from its bytes).
    pub desc: Descriptor,
    /// Its bytes, checked against `desc.digest`.
    pub bytes: Vec<u8>,
    /// Its parsed form.
    pub manifest: oci::artifact::Manifest,
}

/// The top manifest (bytes, descriptor) and the image manifests to convert.
pub fn targets(src: &Source) -> anyhow::Result<(Vec<u8>, Descriptor, Vec<Target>)> {
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
pub fn copy_blob(
    src: &Source,
    reg: &oci::Registry,
    repo: &str,
    d: &Descriptor,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let open = || -> std::io::Result<Box<dyn Read + '_>> {
        src.blob(&d.digest)
            .map(|r| Box::new(r) as Box<dyn Read>)
            .map_err(std::io::Error::other)
    };
    reg.push_blob(repo, &d.digest, &Body::Reader(d.size, &open))
        .with_context(|| format!("copying blob {}", d.digest))
}
