//! containers-policy.json(5), parsed as containers/image 5.23 parses it (every unknown or
//! duplicated key, every wrongly typed value is an error), keeping what verilay evaluates:
//! `default` and the `docker` transport's scopes. Requirements verilay cannot evaluate
//! (`signedBy`, GPG) are refused where they could apply, never ignored.

use crate::dockerref::{valid_remap_prefix, DockerReference};
use crate::json::{self, J};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A parsed policy: the default requirements and the `docker` transport's scopes.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Where it was read from (or what the caller named it), for errors.
    origin: String,
    default: Vec<Requirement>,
    /// `transports.docker`, if the policy has it: scope → requirements.
    docker: Option<BTreeMap<String, Vec<Requirement>>>,
}

/// One requirement of a scope; all of a scope's must accept an image.
#[derive(Debug, Clone, PartialEq)]
pub enum Requirement {
    /// Accepts any image, signed or not.
    InsecureAcceptAnything,
    /// Refuses every image.
    Reject,
    /// Refuses every image: c/image has never implemented it.
    SignedBaseLayer,
    /// Accepts an image with at least one sigstore signature made by the key and whose
    /// payload names the image's manifest digest and an identity `signed_identity`
    /// accepts.
    SigstoreSigned {
        /// The public key (`keyPath` or `keyData`).
        key: KeySource,
        /// `signedIdentity` (`matchRepoDigestOrExact` when the policy has none).
        signed_identity: SignedIdentity,
    },
}

/// Where a `sigstoreSigned` requirement's public key is; read when an image is checked
/// (as c/image does), so a missing key file refuses images rather than the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `keyPath` (a path relative to the current directory, as c/image opens it).
    Path(PathBuf),
    /// `keyData`, the PEM itself.
    Data(Vec<u8>),
}

/// Which signed identities (the payload's `docker-reference`) a requirement accepts for
/// an image, as containers-policy.json(5) defines them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignedIdentity {
    /// The signed reference is the image's reference, tag or digest alike.
    MatchExact,
    /// As `MatchExact` for a tagged image; for an image named by digest, any signature
    /// for its repository (the digest is checked anyway). The default.
    MatchRepoDigestOrExact,
    /// Any signature for the image's repository.
    MatchRepository,
    /// The signed reference is this one (which has a tag or digest).
    ExactReference(String),
    /// The signed reference is in this repository.
    ExactRepository(String),
    /// `MatchRepoDigestOrExact` after the image's reference, if it starts with
    /// `prefix`, has had that prefix replaced by `signed_prefix`.
    RemapIdentity {
        /// `prefix`: a registry, or a repository name that starts with one.
        prefix: String,
        /// `signedPrefix`: what replaces `prefix` before matching.
        signed_prefix: String,
    },
}

impl Policy {
    /// What podman and skopeo read for the current user: `$HOME/.config/containers/
    /// policy.json` if it exists, else `/etc/containers/policy.json`.
    pub fn default_path() -> PathBuf {
        crate::files::user_or_system(
            ".config/containers/policy.json",
            "/etc/containers/policy.json",
        )
    }

    /// Reads and parses a policy file: a regular file of at most 1 MiB (opened without
    /// blocking, so a FIFO or a device is an error at once).
    pub fn from_file(path: &Path) -> Result<Policy, String> {
        let bytes = crate::files::read_bounded(path).map_err(|e| format!("policy {e}"))?;
        Policy::from_bytes(&bytes, &path.display().to_string())
    }

    /// Parses a policy; `origin` names it in errors (a file's path).
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Policy, String> {
        parse_policy(bytes, origin).map_err(|e| format!("policy {origin}: {e}"))
    }

    /// Whether every scope accepts anything (`insecureAcceptAnything` alone): such a
    /// policy judges no image, so an image it cannot name judges nothing either.
    pub fn accepts_anything(&self) -> bool {
        let open =
            |rs: &[Requirement]| rs.iter().all(|r| *r == Requirement::InsecureAcceptAnything);
        open(&self.default)
            && self
                .docker
                .iter()
                .flat_map(|d| d.values())
                .all(|rs| open(rs))
    }

    /// Where the policy came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The requirements for `image` and the scope they come from, most specific scope
    /// first as c/image looks them up: the exact reference, the repository, each parent
    /// namespace, the registry, `*.DOMAIN` wildcards, the transport's `""` scope, and
    /// the policy's `default`.
    pub fn requirements_for(
        &self,
        image: &DockerReference,
    ) -> Result<(String, &[Requirement]), String> {
        if let Some(scopes) = &self.docker {
            let identity = image.policy_identity()?;
            for name in std::iter::once(identity).chain(image.policy_namespaces()) {
                if let Some(r) = scopes.get(&name) {
                    return Ok((format!("transports.docker[{name:?}]"), r));
                }
            }
            if let Some(r) = scopes.get("") {
                return Ok(("transports.docker[\"\"]".to_string(), r));
            }
        }
        Ok(("default".to_string(), &self.default))
    }
}

fn parse_policy(bytes: &[u8], origin: &str) -> Result<Policy, String> {
    let doc = json::parse(bytes)?;
    let mut default = None;
    let mut docker = None;
    for (key, value) in doc.fields("the policy", &["default", "transports"], false)? {
        match key {
            "default" => default = Some(requirements(value, "default", true)?),
            _ => {
                // `null` is no object to c/image either.
                for (transport, scopes) in value.fields_any("transports")? {
                    let is_docker = transport == "docker";
                    let mut parsed = BTreeMap::new();
                    for (scope, reqs) in scopes.fields_any(&format!("transports.{transport}"))? {
                        let at = format!("transports.{transport}[{scope:?}]");
                        // Other transports are parsed (an error there is an error to
                        // c/image too) but never evaluated: verilay reads registries only.
                        parsed.insert(scope.to_string(), requirements(reqs, &at, is_docker)?);
                    }
                    if is_docker {
                        docker = Some(parsed);
                    }
                }
            }
        }
    }
    Ok(Policy {
        origin: origin.to_string(),
        default: default.ok_or("the default policy is missing")?,
        docker,
    })
}

impl J {
    /// An object's entries, any keys, each once.
    fn fields_any(&self, what: &str) -> Result<Vec<(&str, &J)>, String> {
        let J::Obj(entries) = self else {
            return Err(format!(
                "{what}: expected a JSON object, got {}",
                self.kind()
            ));
        };
        let mut seen: Vec<&str> = Vec::with_capacity(entries.len());
        for (k, _) in entries {
            if seen.contains(&k.as_str()) {
                return Err(format!("{what}: duplicate key {k:?}"));
            }
            seen.push(k);
        }
        Ok(entries.iter().map(|(k, v)| (k.as_str(), v)).collect())
    }
}

/// A scope's list of requirements (never empty). `evaluated`: verilay may evaluate these,
/// so a requirement it cannot evaluate is refused here.
fn requirements(v: &J, at: &str, evaluated: bool) -> Result<Vec<Requirement>, String> {
    let list = match v {
        J::Arr(items) => items.as_slice(),
        J::Null => &[],
        other => {
            return Err(format!(
                "{at}: expected a list of requirements, got {}",
                other.kind()
            ))
        }
    };
    if list.is_empty() {
        return Err(format!("{at}: the list of requirements must not be empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, r)| requirement(r, &format!("{at}[{i}]"), evaluated))
        .collect()
}

fn requirement(v: &J, at: &str, evaluated: bool) -> Result<Requirement, String> {
    let J::Obj(entries) = v else {
        return Err(format!(
            "{at}: expected a requirement object, got {}",
            v.kind()
        ));
    };
    // The type is looked up first, as c/image does, to know which fields to allow.
    let ty = match entries.iter().rev().find(|(k, _)| k == "type") {
        Some((_, t)) => t.string(&format!("{at}.type"))?,
        None => String::new(),
    };
    match ty.as_str() {
        "insecureAcceptAnything" | "reject" => {
            v.fields(at, &["type"], true)?;
            Ok(if ty == "reject" {
                Requirement::Reject
            } else {
                Requirement::InsecureAcceptAnything
            })
        }
        "signedBaseLayer" => {
            let f = v.fields(at, &["type", "baseLayerIdentity"], true)?;
            let bli = f
                .iter()
                .find(|(k, _)| *k == "baseLayerIdentity")
                .map(|(_, v)| *v);
            signed_identity(bli.unwrap_or(&J::Null), &format!("{at}.baseLayerIdentity"))?;
            Ok(Requirement::SignedBaseLayer)
        }
        "signedBy" => {
            signed_by(v, at)?;
            if evaluated {
                return Err(format!(
                    "{at}: \"signedBy\" (GPG signatures) is not supported by verilay; use \"sigstoreSigned\" with a public key"
                ));
            }
            // Never evaluated: verilay reads no other transport.
            Ok(Requirement::Reject)
        }
        "sigstoreSigned" => sigstore_signed(v, at),
        other => Err(format!("{at}: unknown policy requirement type {other:?}")),
    }
}

/// `signedBy`, checked as c/image checks it (so a policy c/image refuses is refused).
fn signed_by(v: &J, at: &str) -> Result<(), String> {
    let f = v.fields(
        at,
        &[
            "type",
            "keyType",
            "keyPath",
            "keyPaths",
            "keyData",
            "signedIdentity",
        ],
        false,
    )?;
    let get = |k: &str| f.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let key_type = get("keyType")
        .map(|t| t.string(&format!("{at}.keyType")))
        .transpose()?;
    if !matches!(
        key_type.as_deref().unwrap_or(""),
        "GPGKeys" | "signedByGPGKeys" | "X509Certificates" | "signedByX509CAs"
    ) {
        return Err(format!(
            "{at}: invalid keyType {:?}",
            key_type.unwrap_or_default()
        ));
    }
    if let Some(si) = get("signedIdentity") {
        signed_identity(si, &format!("{at}.signedIdentity"))?;
    }
    if let Some(p) = get("keyPath") {
        p.string(&format!("{at}.keyPath"))?;
    }
    if let Some(d) = get("keyData") {
        key_data(d, &format!("{at}.keyData"))?;
    }
    if let Some(ps) = get("keyPaths") {
        match ps {
            J::Arr(items) => {
                for (i, p) in items.iter().enumerate() {
                    p.string(&format!("{at}.keyPaths[{i}]"))?;
                }
            }
            J::Null => {}
            other => {
                return Err(format!(
                    "{at}.keyPaths: expected a list, got {}",
                    other.kind()
                ))
            }
        }
    }
    let sources = ["keyPath", "keyPaths", "keyData"]
        .iter()
        .filter(|k| get(k).is_some())
        .count();
    if sources != 1 {
        return Err(format!(
            "{at}: exactly one of keyPath, keyPaths and keyData must be specified"
        ));
    }
    Ok(())
}

fn sigstore_signed(v: &J, at: &str) -> Result<Requirement, String> {
    // Keyless signing and Rekor came after c/image 5.23 (which calls them unknown keys);
    // verilay names them so a policy written for a newer podman fails plainly.
    if let J::Obj(entries) = v {
        for (k, _) in entries {
            if matches!(
                k.as_str(),
                "fulcio" | "rekorPublicKeyPath" | "rekorPublicKeyData"
            ) {
                return Err(format!(
                    "{at}: sigstoreSigned with {k:?} (keyless/Rekor verification) is not supported by verilay; use keyPath or keyData"
                ));
            }
        }
    }
    let f = v.fields(at, &["type", "keyPath", "keyData", "signedIdentity"], false)?;
    let get = |k: &str| f.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let key = match (get("keyPath"), get("keyData")) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: keyPath and keyData cannot be used simultaneously"
            ))
        }
        (Some(p), None) => KeySource::Path(PathBuf::from(p.string(&format!("{at}.keyPath"))?)),
        (None, Some(d)) => match key_data(d, &format!("{at}.keyData"))? {
            Some(d) => KeySource::Data(d),
            // `"keyData": null` leaves c/image reading keyPath "", which fails.
            None => KeySource::Path(PathBuf::new()),
        },
        (None, None) => {
            return Err(format!(
                "{at}: at least one of keyPath and keyData must be specified"
            ))
        }
    };
    let signed_identity = match get("signedIdentity") {
        Some(si) => signed_identity(si, &format!("{at}.signedIdentity"))?,
        None => SignedIdentity::MatchRepoDigestOrExact,
    };
    Ok(Requirement::SigstoreSigned {
        key,
        signed_identity,
    })
}

/// `keyData`: base64 (Go's `[]byte` in JSON); `null` is none.
fn key_data(v: &J, at: &str) -> Result<Option<Vec<u8>>, String> {
    match v {
        J::Null => Ok(None),
        J::Str(s) => crate::keys::go_base64(s)
            .map(Some)
            .map_err(|_| format!("{at}: not base64")),
        other => Err(format!(
            "{at}: expected a base64 string, got {}",
            other.kind()
        )),
    }
}

fn signed_identity(v: &J, at: &str) -> Result<SignedIdentity, String> {
    let ty = match v {
        J::Obj(entries) => match entries.iter().rev().find(|(k, _)| k == "type") {
            Some((_, t)) => t.string(&format!("{at}.type"))?,
            None => String::new(),
        },
        J::Null => String::new(),
        other => return Err(format!("{at}: expected an object, got {}", other.kind())),
    };
    let field = |name: &str| -> Result<String, String> {
        let f = match ty.as_str() {
            "remapIdentity" => v.fields(at, &["type", "prefix", "signedPrefix"], true)?,
            _ => v.fields(at, &["type", name], true)?,
        };
        f.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.string(&format!("{at}.{name}")))
            .unwrap_or_else(|| Ok(String::new()))
    };
    match ty.as_str() {
        "matchExact" | "matchRepoDigestOrExact" | "matchRepository" => {
            v.fields(at, &["type"], true)?;
            Ok(match ty.as_str() {
                "matchExact" => SignedIdentity::MatchExact,
                "matchRepository" => SignedIdentity::MatchRepository,
                _ => SignedIdentity::MatchRepoDigestOrExact,
            })
        }
        "exactReference" => {
            let r = field("dockerReference")?;
            let parsed = DockerReference::parse_normalized(&r)
                .map_err(|e| format!("{at}: invalid dockerReference {r:?}: {e}"))?;
            if parsed.is_name_only() {
                return Err(format!(
                    "{at}: dockerReference {r:?} has neither a tag nor a digest"
                ));
            }
            Ok(SignedIdentity::ExactReference(r))
        }
        "exactRepository" => {
            let r = field("dockerRepository")?;
            DockerReference::parse_normalized(&r)
                .map_err(|e| format!("{at}: invalid dockerRepository {r:?}: {e}"))?;
            Ok(SignedIdentity::ExactRepository(r))
        }
        "remapIdentity" => {
            let prefix = field("prefix")?;
            let signed_prefix = field("signedPrefix")?;
            for p in [&prefix, &signed_prefix] {
                if !valid_remap_prefix(p) {
                    return Err(format!("{at}: prefix {p:?} is not valid"));
                }
            }
            Ok(SignedIdentity::RemapIdentity {
                prefix,
                signed_prefix,
            })
        }
        other => Err(format!("{at}: unknown signedIdentity type {other:?}")),
    }
}

impl SignedIdentity {
    /// Whether a signature claiming `signed` (its payload's `docker-reference`) is
    /// acceptable for `image` (the reference the image was asked for), as c/image's
    /// `matchesDockerReference` decides; anything unparsable is no match.
    pub fn matches(&self, image: &DockerReference, signed: &str) -> bool {
        let Ok(signed) = DockerReference::parse_normalized(signed) else {
            return false;
        };
        match self {
            SignedIdentity::MatchExact => {
                !image.is_name_only()
                    && !signed.is_name_only()
                    && signed.to_string() == image.to_string()
            }
            SignedIdentity::MatchRepoDigestOrExact => repo_digest_or_exact(image, &signed),
            SignedIdentity::MatchRepository => signed.name() == image.name(),
            SignedIdentity::ExactReference(r) => match DockerReference::parse_normalized(r) {
                Ok(intended) => {
                    !intended.is_name_only()
                        && !signed.is_name_only()
                        && signed.to_string() == intended.to_string()
                }
                Err(_) => false,
            },
            SignedIdentity::ExactRepository(r) => match DockerReference::parse_normalized(r) {
                Ok(intended) => signed.name() == intended.name(),
                Err(_) => false,
            },
            SignedIdentity::RemapIdentity {
                prefix,
                signed_prefix,
            } => match remap(image, prefix, signed_prefix) {
                Some(intended) => repo_digest_or_exact(&intended, &signed),
                None => false,
            },
        }
    }
}

/// `matchRepoDigestOrExactReferenceValues`.
fn repo_digest_or_exact(intended: &DockerReference, signed: &DockerReference) -> bool {
    if signed.is_name_only() {
        return false;
    }
    if intended.tag().is_some() {
        // Tagged, or tagged and digested: the whole reference.
        signed.to_string() == intended.to_string()
    } else if intended.digest().is_some() {
        signed.name() == intended.name()
    } else {
        false
    }
}

/// `remapReferencePrefix`: `image` with `prefix` replaced by `signed_prefix` if its name
/// is `prefix` or under it; `None` if the result is no normalized reference.
fn remap(image: &DockerReference, prefix: &str, signed_prefix: &str) -> Option<DockerReference> {
    let name = image.name();
    let under = name == prefix
        || (name.len() > prefix.len()
            && name.starts_with(prefix)
            && name.as_bytes()[prefix.len()] == b'/');
    if !under {
        return Some(image.clone());
    }
    let whole = image.to_string();
    DockerReference::parse_named(&whole.replacen(prefix, signed_prefix, 1)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Policy, String> {
        Policy::from_bytes(s.as_bytes(), "test.json")
    }

    fn scope_of(p: &Policy, image: &str) -> String {
        let r = DockerReference::parse_normalized(image)
            .unwrap()
            .tag_name_only();
        p.requirements_for(&r).unwrap().0
    }

    #[test]
    fn the_most_specific_scope_wins() {
        let p = parse(
            r#"{"default":[{"type":"reject"}],"transports":{"docker":{
                "reg.example.com:5000/ns/app:v1":[{"type":"insecureAcceptAnything"}],
                "reg.example.com:5000/ns/app":[{"type":"insecureAcceptAnything"}],
                "reg.example.com:5000/ns":[{"type":"insecureAcceptAnything"}],
                "reg.example.com:5000":[{"type":"insecureAcceptAnything"}],
                "reg.example.com":[{"type":"insecureAcceptAnything"}],
                "*.example.com":[{"type":"insecureAcceptAnything"}],
                "*.com":[{"type":"insecureAcceptAnything"}]
            },"docker-daemon":{"":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k"}]}}}"#,
        )
        .unwrap();
        let d = |s: &str| format!("transports.docker[{s:?}]");
        assert_eq!(
            scope_of(&p, "reg.example.com:5000/ns/app:v1"),
            d("reg.example.com:5000/ns/app:v1")
        );
        assert_eq!(
            scope_of(&p, "reg.example.com:5000/ns/app:v2"),
            d("reg.example.com:5000/ns/app")
        );
        assert_eq!(
            scope_of(&p, "reg.example.com:5000/ns/other"),
            d("reg.example.com:5000/ns")
        );
        assert_eq!(
            scope_of(&p, "reg.example.com:5000/top"),
            d("reg.example.com:5000")
        );
        // A host without its port is no scope of its own: the wildcard matches first.
        assert_eq!(scope_of(&p, "reg.example.com/x"), d("reg.example.com"));
        assert_eq!(scope_of(&p, "reg.example.com:6000/x"), d("*.example.com"));
        assert_eq!(scope_of(&p, "other.com/x"), d("*.com"));
        assert_eq!(scope_of(&p, "other.org/x"), "default");
        let digest = format!("reg.example.com:5000/ns/app@sha256:{}", "0".repeat(64));
        assert_eq!(scope_of(&p, &digest), d("reg.example.com:5000/ns/app"));
        let p = parse(r#"{"default":[{"type":"reject"}],"transports":{"docker":{"":[{"type":"insecureAcceptAnything"}]}}}"#).unwrap();
        assert_eq!(scope_of(&p, "other.org/x"), "transports.docker[\"\"]");
    }

    #[test]
    fn requirements_parse_with_their_identities() {
        let p = parse(
            r#"{"default":[{"type":"sigstoreSigned","keyData":"LS0t","signedIdentity":{"type":"remapIdentity","prefix":"a.io/x","signedPrefix":"b.io/y"}},
                {"type":"sigstoreSigned","keyPath":"/k.pub"},
                {"type":"sigstoreSigned","keyPath":"/k.pub","signedIdentity":{"type":"exactReference","dockerReference":"a.io/x:1"}},
                {"type":"sigstoreSigned","keyPath":"/k.pub","signedIdentity":{"type":"exactRepository","dockerRepository":"busybox"}},
                {"type":"sigstoreSigned","keyPath":"/k.pub","signedIdentity":{"type":"matchExact"}},
                {"type":"sigstoreSigned","keyPath":"/k.pub","signedIdentity":{"type":"matchRepository"}}]}"#,
        )
        .unwrap();
        assert_eq!(
            p.default[0],
            Requirement::SigstoreSigned {
                key: KeySource::Data(b"---".to_vec()),
                signed_identity: SignedIdentity::RemapIdentity {
                    prefix: "a.io/x".into(),
                    signed_prefix: "b.io/y".into()
                }
            }
        );
        assert_eq!(
            p.default[1],
            Requirement::SigstoreSigned {
                key: KeySource::Path("/k.pub".into()),
                signed_identity: SignedIdentity::MatchRepoDigestOrExact
            }
        );
        assert_eq!(p.default.len(), 6);
    }

    #[test]
    fn what_c_image_refuses_is_refused_with_a_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "not JSON"),
            ("[]", "expected a JSON object"),
            (r#"{}"#, "default policy is missing"),
            (r#"{"default":[]}"#, "must not be empty"),
            (r#"{"default":null}"#, "must not be empty"),
            (
                r#"{"default":[{"type":"reject"}],"extra":1}"#,
                "unknown key \"extra\"",
            ),
            (
                r#"{"default":[{"type":"reject"}],"default":[{"type":"reject"}]}"#,
                "duplicate key",
            ),
            (r#"{"default":[{"type":"reject"}]} x"#, "not JSON"),
            (
                r#"{"default":[{"type":"rejectt"}]}"#,
                "unknown policy requirement type \"rejectt\"",
            ),
            (
                r#"{"default":[{"type":"reject","x":1}]}"#,
                "unknown key \"x\"",
            ),
            (
                r#"{"default":[{}]}"#,
                "unknown policy requirement type \"\"",
            ),
            (r#"{"default":["reject"]}"#, "expected a requirement object"),
            (
                r#"{"default":[{"type":"reject"}],"transports":null}"#,
                "expected a JSON object",
            ),
            (
                r#"{"default":[{"type":"reject"}],"transports":{"docker":{"a":[],"b":[{"type":"reject"}]}}}"#,
                "must not be empty",
            ),
            (
                r#"{"default":[{"type":"reject"}],"transports":{"docker":{"a":[{"type":"reject"}],"a":[{"type":"reject"}]}}}"#,
                "duplicate key \"a\"",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned"}]}"#,
                "at least one of keyPath and keyData",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","keyData":""}]}"#,
                "simultaneously",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":1}]}"#,
                "expected a string",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyData":"!!"}]}"#,
                "not base64",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","keyPaths":["/b"]}]}"#,
                "unknown key \"keyPaths\"",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","signedIdentity":null}]}"#,
                "unknown signedIdentity type \"\"",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","signedIdentity":{"type":"matchExact","x":1}}]}"#,
                "unknown key \"x\"",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","signedIdentity":{"type":"exactReference","dockerReference":"a.io/x"}}]}"#,
                "neither a tag nor a digest",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","signedIdentity":{"type":"exactReference"}}]}"#,
                "key \"dockerReference\" missing",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","signedIdentity":{"type":"exactRepository","dockerRepository":"A"}}]}"#,
                "invalid dockerRepository",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","signedIdentity":{"type":"remapIdentity","prefix":"a.io/","signedPrefix":"b.io"}}]}"#,
                "prefix \"a.io/\" is not valid",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","signedIdentity":{"type":"remapIdentity","prefix":"a.io"}}]}"#,
                "key \"signedPrefix\" missing",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","signedIdentity":{"type":"nope"}}]}"#,
                "unknown signedIdentity type \"nope\"",
            ),
            (
                r#"{"default":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k"}]}"#,
                "\"signedBy\" (GPG signatures) is not supported by verilay",
            ),
            (
                r#"{"default":[{"type":"reject"}],"transports":{"docker":{"a.io":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k"}]}}}"#,
                "transports.docker[\"a.io\"][0]: \"signedBy\"",
            ),
            (
                r#"{"default":[{"type":"reject"}],"transports":{"atomic":{"":[{"type":"signedBy","keyType":"nope","keyPath":"/k"}]}}}"#,
                "invalid keyType",
            ),
            (
                r#"{"default":[{"type":"reject"}],"transports":{"atomic":{"":[{"type":"signedBy","keyType":"GPGKeys"}]}}}"#,
                "exactly one of keyPath",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","fulcio":{}}]}"#,
                "\"fulcio\" (keyless/Rekor verification) is not supported by verilay",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/a","rekorPublicKeyPath":"/r"}]}"#,
                "not supported by verilay",
            ),
            (
                r#"{"default":[{"type":"signedBaseLayer"}]}"#,
                "key \"baseLayerIdentity\" missing",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
            assert!(err.starts_with("policy test.json: "), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
        // GPG requirements elsewhere are checked but never evaluated.
        let p = parse(
            r#"{"default":[{"type":"reject"}],"transports":{"atomic":{"":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k"}]}}}"#,
        );
        assert!(p.is_ok(), "{p:?}");
    }

    #[test]
    fn policies_that_are_no_files_fail_at_once() {
        let err = Policy::from_file(Path::new("/dev/zero")).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let err = Policy::from_file(&fifo).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b' '; (1 << 20) + 1]).unwrap();
        let err = Policy::from_file(&big).unwrap_err();
        assert!(err.contains("larger than 1 MiB"), "{err}");
        let err = Policy::from_file(&dir.path().join("none")).unwrap_err();
        assert!(err.contains("none") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn identities_match_as_c_image_matches_them() {
        let r = |s: &str| DockerReference::parse_normalized(s).unwrap();
        let tagged = r("a.io/ns/app:v1");
        let digested = r(&format!("a.io/ns/app@sha256:{}", "1".repeat(64)));
        use SignedIdentity::*;
        let yes: &[(&SignedIdentity, &DockerReference, &str)] = &[
            (&MatchExact, &tagged, "a.io/ns/app:v1"),
            (&MatchRepoDigestOrExact, &tagged, "a.io/ns/app:v1"),
            (&MatchRepoDigestOrExact, &digested, "a.io/ns/app:v9"),
            (&MatchRepository, &tagged, "a.io/ns/app:v9"),
            (&MatchRepository, &tagged, "a.io/ns/app"),
            (
                &ExactRepository("a.io/ns/app:x".into()),
                &tagged,
                "a.io/ns/app:y",
            ),
            (
                &ExactReference("busybox:latest".into()),
                &tagged,
                "docker.io/library/busybox:latest",
            ),
        ];
        for (si, image, signed) in yes {
            assert!(si.matches(image, signed), "{si:?} {image} {signed}");
        }
        let exact_busybox = ExactReference("busybox:latest".into());
        let no: &[(&SignedIdentity, &DockerReference, &str)] = &[
            (&MatchExact, &tagged, "a.io/ns/app:v2"),
            (&MatchExact, &digested, "a.io/ns/app:v1"),
            (&MatchRepoDigestOrExact, &tagged, "a.io/ns/app:v2"),
            (&MatchRepoDigestOrExact, &digested, "a.io/ns/app"),
            (&MatchRepository, &tagged, "a.io/ns/other:v1"),
            (&MatchRepository, &tagged, "NOT A REFERENCE"),
            (&exact_busybox, &tagged, "docker.io/library/busybox"),
            (&exact_busybox, &tagged, "docker.io/library/busybox:1"),
        ];
        for (si, image, signed) in no {
            assert!(!si.matches(image, signed), "{si:?} {image} {signed}");
        }
        let remap = RemapIdentity {
            prefix: "mirror.io/ns".into(),
            signed_prefix: "a.io/ns".into(),
        };
        assert!(remap.matches(&r("mirror.io/ns/app:v1"), "a.io/ns/app:v1"));
        assert!(!remap.matches(&r("mirror.io/ns/app:v1"), "mirror.io/ns/app:v1"));
        // Not under the prefix: matched as it is.
        assert!(remap.matches(&r("mirror.io/nsx/app:v1"), "mirror.io/nsx/app:v1"));
        // The remapped reference must be normalized (a short name is not).
        let short = RemapIdentity {
            prefix: "mirror.io/library/busybox".into(),
            signed_prefix: "busybox".into(),
        };
        assert!(!short.matches(
            &r("mirror.io/library/busybox:1"),
            "docker.io/library/busybox:1"
        ));
    }

    #[test]
    fn a_policy_that_judges_nothing_is_told_apart() {
        let p = |text: &str| Policy::from_bytes(text.as_bytes(), "t").unwrap();
        assert!(p(r#"{"default":[{"type":"insecureAcceptAnything"}]}"#).accepts_anything());
        assert!(p(r#"{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{"a.b/c":[{"type":"insecureAcceptAnything"}]}}}"#).accepts_anything());
        assert!(!p(r#"{"default":[{"type":"reject"}]}"#).accepts_anything());
        assert!(!p(r#"{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{"a.b/c":[{"type":"reject"}]}}}"#).accepts_anything());
    }
}
