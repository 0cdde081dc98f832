//! Image signatures checked and made as podman and skopeo (containers/image 5.23) do with a
//! sigstore public key (map: docs/ARCHITECTURE.md, `crates/signatures`).
//!
//! - What cannot be evaluated (GPG `signedBy`, keyless sigstore) is refused when the policy is
//!   read, never accepted.
//! - [`check`] evaluates an image; [`sign`], [`attachments::attach`] and [`generate_key`] make.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod attachments;
mod dockerref;
mod files;
mod json;
pub mod keys;
pub mod payload;
pub mod policy;
pub mod registries_d;

pub use attachments::attach;
pub use dockerref::DockerReference;
pub use keys::{encrypt_private_key, generate_key, PublicKey};
pub use payload::Payload;
pub use policy::{KeySource, Policy, Requirement, SignedIdentity};
pub use registries_d::RegistriesD;

use attachments::{Attachment, SIGNATURE_ANNOTATION, SIGSTORE_MIME};
use base64::Engine as _;
use std::path::Path;

/// An image the policy accepted, and on what grounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The policy scope whose requirements accepted it (`default`, or
    /// `transports.docker["SCOPE"]`).
    pub scope: String,
    /// Whether acceptance rests on verified signatures: the scope has at least one
    /// `sigstoreSigned` requirement, and each found a signature by its key for this
    /// manifest and identity. False when it rests on `insecureAcceptAnything` alone.
    pub signed: bool,
    /// The payload of the signature each `sigstoreSigned` requirement accepted, in
    /// order.
    pub signatures: Vec<Payload>,
}

/// The docker reference c/image would check `reference` as (`HOST[:PORT]/REPO:TAG` or
/// `@DIGEST`). A registry c/image would read differently (a host with neither a dot nor
/// a port, which it takes for a Docker Hub namespace; Docker Hub's short names; an IPv6
/// address, which its grammar lacks) is an error rather than a guess.
pub fn image_identity(reference: &oci::Reference) -> Result<DockerReference, String> {
    let sep = match reference.target {
        oci::reference::Target::Tag(_) => ':',
        oci::reference::Target::Digest(_) => '@',
    };
    let text = format!(
        "{}/{}{sep}{}",
        reference.registry,
        reference.repository,
        reference.target_str()
    );
    let parsed = DockerReference::parse_normalized(&text)
        .map_err(|e| format!("{reference}: no docker reference containers/image can name: {e}"))?;
    let name = format!("{}/{}", reference.registry, reference.repository);
    if parsed.name() != name {
        return Err(format!(
            "{reference}: containers/image reads it as {parsed}, another repository; name it so"
        ));
    }
    Ok(parsed)
}

/// Checks manifest `manifest_digest` (`sha256:HEX`, of the manifest the caller fetched
/// for `reference` and checked) against the policy, as podman does before pulling: every
/// requirement of the scope that matches `reference` must accept, in order (the first
/// that refuses decides the error). `sigstoreSigned` accepts if a signature attached to
/// the manifest in `reference`'s repository verifies with its key and its payload names
/// this manifest digest and an identity its `signedIdentity` accepts; where registries.d
/// does not turn sigstore attachments on for `reference`, there are no signatures.
/// `registry` is a connection to `reference`'s registry. The error is one line naming
/// `reference` and the reason.
pub fn check(
    policy: &Policy,
    registries_d: &RegistriesD,
    registry: &oci::Registry,
    reference: &oci::Reference,
    manifest_digest: &str,
) -> Result<Accepted, String> {
    let refused = |scope: &str, why: &str| {
        format!(
            "{reference}: refused by policy {} ({scope}): {why}",
            policy.origin()
        )
    };
    if !oci::reference::valid_digest(manifest_digest) {
        return Err(format!(
            "{reference}: {manifest_digest:?} is not a sha256 manifest digest"
        ));
    }
    if let oci::reference::Target::Digest(d) = &reference.target {
        if d != manifest_digest {
            return Err(format!("{reference}: the manifest checked is {manifest_digest}, not the one the reference names"));
        }
    }
    let image = match image_identity(reference) {
        Ok(i) => i,
        // A reference c/image would read as another repository (a host with neither a
        // dot nor a port) is refused only where the policy would judge it.
        Err(_) if policy.accepts_anything() => {
            return Ok(Accepted {
                scope: "default".into(),
                signed: false,
                signatures: Vec::new(),
            })
        }
        Err(e) => return Err(e),
    };
    let (scope, requirements) = policy.requirements_for(&image)?;
    let mut fetch = || -> Result<Vec<Attachment>, String> {
        let (on, _) = registries_d.use_sigstore_attachments(&image)?;
        if !on {
            return Ok(Vec::new());
        }
        attachments::fetch(registry, &reference.repository, manifest_digest)
    };
    evaluate(requirements, &image, manifest_digest, &mut fetch)
        .map(|signatures| Accepted {
            scope: scope.clone(),
            signed: !signatures.is_empty(),
            signatures,
        })
        .map_err(|why| refused(&scope, &why))
}

/// All of `requirements` for `image`, in order; `fetch` gives the attachments, asked
/// once, when a `sigstoreSigned` requirement first needs them. The payloads accepted,
/// one per `sigstoreSigned` requirement.
fn evaluate(
    requirements: &[Requirement],
    image: &DockerReference,
    manifest_digest: &str,
    fetch: &mut dyn FnMut() -> Result<Vec<Attachment>, String>,
) -> Result<Vec<Payload>, String> {
    let mut fetched: Option<Vec<Attachment>> = None;
    let mut accepted = Vec::new();
    for r in requirements {
        match r {
            Requirement::InsecureAcceptAnything => {}
            Requirement::Reject => {
                return Err(format!("running image {image} is rejected by policy"))
            }
            Requirement::SignedBaseLayer => {
                return Err(
                    "signedBaseLayer not implemented (containers/image refuses it too)".into(),
                )
            }
            Requirement::SigstoreSigned {
                key,
                signed_identity,
            } => {
                if fetched.is_none() {
                    fetched = Some(fetch()?);
                }
                let sigs = fetched.as_deref().unwrap_or_default();
                accepted.push(sigstore_signed(
                    key,
                    signed_identity,
                    image,
                    manifest_digest,
                    sigs,
                )?);
            }
        }
    }
    Ok(accepted)
}

/// One `sigstoreSigned` requirement: the payload of the first signature it accepts, or
/// why none (c/image's summary of the rejections).
fn sigstore_signed(
    key: &KeySource,
    signed_identity: &SignedIdentity,
    image: &DockerReference,
    manifest_digest: &str,
    attachments: &[Attachment],
) -> Result<Payload, String> {
    let signatures: Vec<&Attachment> = attachments
        .iter()
        .filter(|a| a.media_type == SIGSTORE_MIME)
        .collect();
    let others = attachments.len() - signatures.len();
    if signatures.is_empty() {
        return Err(if others == 0 {
            "a signature was required, but no signature exists".to_string()
        } else {
            format!("a signature was required, but no signature exists ({others} sigstore non-signature attachments)")
        });
    }
    let public = load_key(key)?;
    let mut reasons = Vec::new();
    for a in signatures {
        match accept_one(&public, signed_identity, image, manifest_digest, a) {
            Ok(p) => return Ok(p),
            Err(why) => reasons.push(why),
        }
    }
    Err(if reasons.len() == 1 {
        reasons.remove(0)
    } else {
        format!(
            "none of the signatures were accepted, reasons: {}",
            reasons.join("; ")
        )
    })
}

fn load_key(key: &KeySource) -> Result<PublicKey, String> {
    match key {
        KeySource::Data(pem) => PublicKey::from_pem(pem).map_err(|e| format!("keyData: {e}")),
        KeySource::Path(path) => {
            let pem = files::read_bounded(path).map_err(|e| format!("public key {e}"))?;
            PublicKey::from_pem(&pem).map_err(|e| format!("public key {}: {e}", path.display()))
        }
    }
}

/// c/image's `isSignatureAccepted` for one signature: the annotation, the cryptographic
/// signature, the payload's form, its digest, then its identity.
fn accept_one(
    public: &PublicKey,
    signed_identity: &SignedIdentity,
    image: &DockerReference,
    manifest_digest: &str,
    a: &Attachment,
) -> Result<Payload, String> {
    let b64 = a
        .annotations
        .get(SIGNATURE_ANNOTATION)
        .ok_or_else(|| format!("missing {SIGNATURE_ANNOTATION} annotation"))?;
    let payload = a.payload.as_ref().map_err(Clone::clone)?;
    let signature =
        keys::go_base64(b64).map_err(|e| format!("invalid signature: base64 decoding: {e}"))?;
    public.verify(payload, &signature)?;
    let p = Payload::parse(payload)?;
    if p.docker_manifest_digest != manifest_digest {
        return Err(format!(
            "signature for digest {} does not match",
            p.docker_manifest_digest
        ));
    }
    if !signed_identity.matches(image, &p.docker_reference) {
        return Err(format!(
            "signature for identity {} is not accepted",
            p.docker_reference
        ));
    }
    Ok(p)
}

/// Signs `manifest_digest` (`sha256:HEX`) as `docker_reference` (normalized, as c/image
/// writes it; it must have a tag or digest) with an encrypted cosign/sigstore private
/// key (PEM `ENCRYPTED COSIGN PRIVATE KEY` or `ENCRYPTED SIGSTORE PRIVATE KEY`, as
/// [`generate_key`] writes): the payload and its base64 signature, for
/// [`attachments::attach`].
pub fn sign(
    private_key_pem: &[u8],
    passphrase: &[u8],
    docker_reference: &str,
    manifest_digest: &str,
) -> Result<(Vec<u8>, String), String> {
    let reference = DockerReference::parse_normalized(docker_reference)
        .map_err(|e| format!("signing as {docker_reference:?}: {e}"))?;
    if reference.is_name_only() {
        return Err(format!(
            "reference {reference} can't be signed, it has neither a tag nor a digest"
        ));
    }
    if !oci::reference::valid_digest(manifest_digest) {
        return Err(format!(
            "{manifest_digest:?} is not a sha256 manifest digest"
        ));
    }
    let key = keys::load_private_key(private_key_pem, passphrase)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let payload = Payload {
        docker_manifest_digest: manifest_digest.to_string(),
        docker_reference: reference.to_string(),
        creator: Some(concat!("verilay ", env!("CARGO_PKG_VERSION")).to_string()),
        timestamp: Some(now),
    }
    .to_bytes();
    let signature = key.sign(&payload)?;
    Ok((
        payload,
        base64::engine::general_purpose::STANDARD.encode(signature),
    ))
}

/// A signature policy and registries.d, loaded once, as podman loads them for a pull.
pub struct Trust {
    /// The policy every manifest fetched must satisfy.
    pub policy: Policy,
    /// Where signatures are looked for.
    pub registries_d: RegistriesD,
}

impl Trust {
    /// `policy` (else [`Policy::default_path`], where a missing file means no policy: a
    /// verilay command does not require one, as podman does) and `registries_d` (else
    /// [`RegistriesD::default_dir`]). A policy named but missing or unreadable is an
    /// error.
    pub fn load(
        policy: Option<&Path>,
        registries_d: Option<&Path>,
    ) -> Result<Option<Trust>, String> {
        let policy = match policy {
            Some(p) => Policy::from_file(p)?,
            None => {
                let p = Policy::default_path();
                // Only a policy that is not there is no policy: one that cannot be read
                // (EACCES, a dangling link) is an error, as podman makes it.
                match std::fs::symlink_metadata(&p) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    _ => Policy::from_file(&p)?,
                }
            }
        };
        let dir = registries_d.map_or_else(RegistriesD::default_dir, Path::to_path_buf);
        Ok(Some(Trust {
            policy,
            registries_d: RegistriesD::from_dir(&dir)?,
        }))
    }

    /// [`check`] under this policy.
    pub fn check(
        &self,
        registry: &oci::Registry,
        reference: &oci::Reference,
        manifest_digest: &str,
    ) -> Result<Accepted, String> {
        check(
            &self.policy,
            &self.registries_d,
            registry,
            reference,
            manifest_digest,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn signature(key_pem: &[u8], reference: &str, manifest: &str) -> Attachment {
        let (payload, sig) = sign(key_pem, b"p", reference, manifest).unwrap();
        Attachment {
            media_type: SIGSTORE_MIME.into(),
            payload: Ok(payload),
            annotations: [(SIGNATURE_ANNOTATION.to_string(), sig)].into(),
        }
    }

    #[test]
    fn requirements_all_must_accept() {
        let (private, public) = generate_key(b"p").unwrap();
        let (_, other_public) = generate_key(b"p").unwrap();
        let image = DockerReference::parse_normalized("h.io/app:v1").unwrap();
        let good = Requirement::SigstoreSigned {
            key: KeySource::Data(public.clone()),
            signed_identity: SignedIdentity::MatchRepoDigestOrExact,
        };
        let wrong_key = Requirement::SigstoreSigned {
            key: KeySource::Data(other_public),
            signed_identity: SignedIdentity::MatchRepoDigestOrExact,
        };
        let sigs = vec![
            Attachment {
                media_type: "application/vnd.in-toto+json".into(),
                payload: Err("not a signature".into()),
                annotations: Default::default(),
            },
            signature(&private, "h.io/app:v1", &digest('b')),
            signature(&private, "h.io/app:v1", &digest('a')),
        ];
        let run = |reqs: &[Requirement], sigs: &[Attachment]| {
            let mut calls = 0;
            let r = evaluate(reqs, &image, &digest('a'), &mut || {
                calls += 1;
                Ok(sigs.to_vec())
            });
            (r, calls)
        };
        let (r, calls) = run(
            &[
                Requirement::InsecureAcceptAnything,
                good.clone(),
                good.clone(),
            ],
            &sigs,
        );
        assert_eq!(r.unwrap().len(), 2);
        assert_eq!(calls, 1, "attachments are fetched once");
        let (r, calls) = run(&[Requirement::InsecureAcceptAnything], &sigs);
        assert!(r.unwrap().is_empty());
        assert_eq!(
            calls, 0,
            "nothing fetched when no requirement needs signatures"
        );
        let err = run(&[good.clone(), Requirement::Reject], &sigs)
            .0
            .unwrap_err();
        assert!(err.contains("rejected by policy"), "{err}");
        let err = run(&[good.clone(), wrong_key], &sigs).0.unwrap_err();
        assert!(
            err.contains("none of the signatures were accepted")
                && err.contains("verification failed"),
            "{err}"
        );
        let err = run(std::slice::from_ref(&good), &sigs[..2]).0.unwrap_err();
        assert!(
            err.contains("signature for digest") && err.contains("does not match"),
            "{err}"
        );
        let err = run(std::slice::from_ref(&good), &sigs[..1]).0.unwrap_err();
        assert!(
            err.contains("no signature exists (1 sigstore non-signature"),
            "{err}"
        );
        let err = run(std::slice::from_ref(&good), &[]).0.unwrap_err();
        assert_eq!(err, "a signature was required, but no signature exists");
        let err = run(&[Requirement::SignedBaseLayer], &[]).0.unwrap_err();
        assert!(err.contains("signedBaseLayer"), "{err}");
    }

    #[test]
    fn a_signature_is_rejected_for_any_flaw() {
        let (private, public) = generate_key(b"p").unwrap();
        let image = DockerReference::parse_normalized("h.io/app:v1").unwrap();
        let key = PublicKey::from_pem(&public).unwrap();
        let ok = signature(&private, "h.io/app:v1", &digest('a'));
        let one =
            |a: &Attachment, si: &SignedIdentity| accept_one(&key, si, &image, &digest('a'), a);
        assert!(one(&ok, &SignedIdentity::MatchRepoDigestOrExact).is_ok());
        let err = one(&ok, &SignedIdentity::ExactReference("h.io/app:v2".into())).unwrap_err();
        assert_eq!(err, "signature for identity h.io/app:v1 is not accepted");
        let mut tampered = ok.clone();
        if let Ok(p) = &mut tampered.payload {
            let at = p.len() - 3;
            p[at] = if p[at] == b'1' { b'2' } else { b'1' };
        }
        assert!(one(&tampered, &SignedIdentity::MatchRepoDigestOrExact)
            .unwrap_err()
            .contains("verification failed"));
        let mut no_annotation = ok.clone();
        no_annotation.annotations.clear();
        assert!(one(&no_annotation, &SignedIdentity::MatchRepoDigestOrExact)
            .unwrap_err()
            .contains("missing"));
        let mut bad_b64 = ok.clone();
        bad_b64
            .annotations
            .insert(SIGNATURE_ANNOTATION.into(), "!".into());
        assert!(one(&bad_b64, &SignedIdentity::MatchRepoDigestOrExact)
            .unwrap_err()
            .contains("base64"));
        let mut unread = ok.clone();
        unread.payload = Err("signature payload x is larger than 64 KiB".into());
        assert!(one(&unread, &SignedIdentity::MatchRepoDigestOrExact)
            .unwrap_err()
            .contains("64 KiB"));
        // Signed as a short name: normalized in the payload.
        let (payload, _) = sign(&private, b"p", "busybox:1", &digest('a')).unwrap();
        assert_eq!(
            Payload::parse(&payload).unwrap().docker_reference,
            "docker.io/library/busybox:1"
        );
    }

    #[test]
    fn sign_refuses_what_c_image_refuses() {
        let (private, _) = generate_key(b"p").unwrap();
        assert!(sign(&private, b"p", "h.io/app", &digest('a'))
            .unwrap_err()
            .contains("neither a tag nor a digest"));
        assert!(sign(&private, b"p", "h.io/App:1", &digest('a')).is_err());
        assert!(sign(&private, b"p", "h.io/app:1", "sha256:x").is_err());
        assert!(sign(&private, b"q", "h.io/app:1", &digest('a'))
            .unwrap_err()
            .contains("decryption failed"));
    }

    /// Valid inputs bent at random (bytes flipped, cut, repeated, spliced): every parser
    /// answers, none panics.
    #[test]
    fn hostile_inputs_never_panic() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut bend = |s: &[u8]| -> Vec<u8> {
            let mut v = s.to_vec();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % (v.len() + 1);
                match next() % 5 {
                    0 if at < v.len() => v[at] = next() as u8,
                    1 => v.truncate(at),
                    2 => {
                        let pool = b"{}[]\":,\\-\n0aZ\x00\xff";
                        v.insert(at, pool[(next() as usize) % pool.len()]);
                    }
                    3 if at < v.len() => {
                        let end = (at + (next() as usize) % 32).min(v.len());
                        let piece = v[at..end].to_vec();
                        v.splice(at..at, piece);
                    }
                    _ => v.retain(|_| next() % 64 != 0),
                }
            }
            v
        };
        let (private, public) = generate_key(b"p").unwrap();
        let (payload, _) = sign(&private, b"p", "h.io/app:v1", &digest('a')).unwrap();
        let policy = br#"{"default":[{"type":"reject"}],"transports":{"docker":{"h.io":[{"type":"sigstoreSigned","keyPath":"/k","signedIdentity":{"type":"remapIdentity","prefix":"h.io/a","signedPrefix":"g.io/a"}}],"h.io/x":[{"type":"signedBy","keyType":"GPGKeys","keyPaths":["/a"]}]}}}"#;
        let yaml = b"default-docker:\n  use-sigstore-attachments: yes\ndocker:\n  h.io/app:\n    lookaside: x\n    use-sigstore-attachments: false\n  base: &b {use-sigstore-attachments: true}\n  h.io/b:\n    <<: *b\n";
        let image = DockerReference::parse_normalized("h.io/app:v1").unwrap();
        for _ in 0..3000 {
            if let Ok(p) = Policy::from_bytes(&bend(policy), "fuzz") {
                let _ = p.requirements_for(&image);
            }
            if let Ok(p) = Payload::parse(&bend(&payload)) {
                let _ = SignedIdentity::MatchRepoDigestOrExact.matches(&image, &p.docker_reference);
                let _ = SignedIdentity::RemapIdentity {
                    prefix: "h.io".into(),
                    signed_prefix: "g.io/x".into(),
                }
                .matches(&image, &p.docker_reference);
            }
            if let Ok(k) = PublicKey::from_pem(&bend(&public)) {
                let _ = k.verify(&payload, &bend(b"0E\x02\x20"));
            }
            if let Ok(d) = RegistriesD::from_yaml(&bend(yaml)) {
                let _ = d.use_sigstore_attachments(&image);
            }
            let text =
                String::from_utf8_lossy(&bend(b"h.io:5000/a/b-c__d:v1.0@sha256:")).into_owned();
            if let Ok(r) = DockerReference::parse_normalized(&text) {
                let _ = (r.policy_identity(), r.policy_namespaces());
            }
        }
        // Decrypting runs scrypt when the structure survives: fewer rounds.
        for _ in 0..40 {
            let _ = keys::load_private_key(&bend(&private), b"p");
        }
    }

    #[test]
    fn oci_references_map_to_docker_references_or_are_refused() {
        let id = |s: &str| image_identity(&oci::Reference::parse(s).unwrap());
        assert_eq!(
            id("oci://127.0.0.1:5000/a/b:v1").unwrap().to_string(),
            "127.0.0.1:5000/a/b:v1"
        );
        assert_eq!(
            id("oci://localhost/a").unwrap().to_string(),
            "localhost/a:latest"
        );
        let d = digest('c');
        assert_eq!(
            id(&format!("oci://r.io/a@{d}")).unwrap().to_string(),
            format!("r.io/a@{d}")
        );
        for bad in [
            "oci://myhost/app:v1",
            "oci://docker.io/busybox",
            "oci://[::1]:5000/a:v1",
        ] {
            let err = id(bad).unwrap_err();
            assert!(err.starts_with(bad), "{err}");
        }
    }
}
