//! Docker references as containers/image 5.23 parses them (`docker/reference`, a copy of
//! docker/distribution's): the same regular expressions, the same normalization
//! (`busybox` is `docker.io/library/busybox`), and the strings policy scopes, signed
//! identities and registries.d namespaces are compared as.

use regex::Regex;
use std::sync::OnceLock;

/// A parsed, normalized docker reference: `DOMAIN/PATH[:TAG][@DIGEST]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerReference {
    domain: String,
    path: String,
    tag: Option<String>,
    digest: Option<String>,
}

struct Grammar {
    reference: Regex,
    name: Regex,
    identifier: Regex,
    remap_domain: Regex,
    remap_domain_prefix: Regex,
    remap_name: Regex,
}

fn grammar() -> &'static Grammar {
    static G: OnceLock<Grammar> = OnceLock::new();
    G.get_or_init(|| {
        // docker/reference/regexp.go, spelled out; ASCII classes only (Go's \w is ASCII).
        let name_component = r"[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*";
        let domain_component = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])";
        let domain = format!(r"{domain_component}(?:\.{domain_component})*(?::[0-9]+)?");
        let tag = r"[0-9A-Za-z_][0-9A-Za-z_.-]{0,127}";
        let digest = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9A-Fa-f]{32,}";
        let name = format!(r"(?:{domain}/)?{name_component}(?:/{name_component})*");
        let re = |s: &str| Regex::new(s).expect("the reference grammar compiles");
        Grammar {
            reference: re(&format!(r"^({name})(?::({tag}))?(?:@({digest}))?$")),
            name: re(&format!(
                r"^(?:({domain})/)?({name_component}(?:/{name_component})*)$"
            )),
            identifier: re(r"^[a-f0-9]{64}$"),
            remap_domain: re(&format!("^{domain}$")),
            remap_domain_prefix: re(&format!("^{domain}/")),
            remap_name: re(&format!("^{name}$")),
        }
    })
}

/// The longest name (domain and path) docker/reference takes.
const NAME_TOTAL_LENGTH_MAX: usize = 255;

impl DockerReference {
    /// `reference.ParseNormalizedNamed`: a reference as a user writes it, made fully
    /// qualified (`docker.io`, `library/`); the error says why it is not one.
    pub fn parse_normalized(s: &str) -> Result<DockerReference, String> {
        let g = grammar();
        if g.identifier.is_match(s) {
            return Err(format!(
                "invalid repository name ({s}), cannot specify 64-byte hexadecimal strings"
            ));
        }
        let (domain, remainder) = split_docker_domain(s);
        let remote_name = remainder.split(':').next().unwrap_or("");
        if remote_name.to_lowercase() != remote_name {
            return Err(format!(
                "invalid reference format {s:?}: repository name must be lowercase"
            ));
        }
        parse(&format!("{domain}/{remainder}"))
    }

    /// `reference.ParseNamed`: like [`DockerReference::parse_normalized`], and `s` must
    /// already be in its normalized form.
    pub fn parse_named(s: &str) -> Result<DockerReference, String> {
        let r = DockerReference::parse_normalized(s)?;
        if r.to_string() != s {
            return Err(format!("reference {s:?} is not in its normalized form"));
        }
        Ok(r)
    }

    /// `DOMAIN/PATH`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// The registry's host and port.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The repository's path in the registry.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The tag, if any.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest, if any.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// Neither a tag nor a digest.
    pub fn is_name_only(&self) -> bool {
        self.tag.is_none() && self.digest.is_none()
    }

    /// `reference.TagNameOnly`: `:latest` on a bare name, as the docker transport adds it.
    pub fn tag_name_only(mut self) -> DockerReference {
        if self.is_name_only() {
            self.tag = Some("latest".to_string());
        }
        self
    }

    /// The policy scope that names exactly this image (`NAME:TAG` or `NAME@DIGEST`),
    /// c/image's `PolicyConfigurationIdentity`; a reference with both is refused, as the
    /// docker transport refuses it.
    pub fn policy_identity(&self) -> Result<String, String> {
        match (&self.tag, &self.digest) {
            (Some(t), None) => Ok(format!("{}:{t}", self.name())),
            (None, Some(d)) => Ok(format!("{}@{d}", self.name())),
            (Some(_), Some(_)) => Err(format!(
                "docker reference {self} has both a tag and a digest (not supported by containers/image)"
            )),
            (None, None) => Err(format!("docker reference {self} has neither a tag nor a digest")),
        }
    }

    /// The less specific policy scopes that match this image, most specific first
    /// (c/image's `PolicyConfigurationNamespaces`): the repository, each parent
    /// namespace, the registry (with its port), then `*.DOMAIN` for each dot-separated
    /// suffix of the host without its port.
    pub fn policy_namespaces(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut name = self.name();
        loop {
            out.push(name.clone());
            match name.rfind('/') {
                Some(i) => name.truncate(i),
                None => break,
            }
        }
        if let Some(i) = name.find(':') {
            name.truncate(i);
        }
        while let Some(i) = name.find('.') {
            name = name[i + 1..].to_string();
            out.push(format!("*.{name}"));
        }
        out
    }
}

impl std::fmt::Display for DockerReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// `splitDockerDomain`: the first component is a registry only if it has a `.` or a
/// `:` or is `localhost`; Docker Hub's names get `docker.io` and `library/`.
fn split_docker_domain(name: &str) -> (String, String) {
    let (mut domain, mut remainder) = match name.find('/') {
        Some(i) if name[..i].contains(['.', ':']) || &name[..i] == "localhost" => {
            (name[..i].to_string(), name[i + 1..].to_string())
        }
        _ => ("docker.io".to_string(), name.to_string()),
    };
    if domain == "index.docker.io" {
        domain = "docker.io".to_string();
    }
    if domain == "docker.io" && !remainder.contains('/') {
        remainder = format!("library/{remainder}");
    }
    (domain, remainder)
}

/// `reference.Parse` of a string that has a domain.
fn parse(s: &str) -> Result<DockerReference, String> {
    let g = grammar();
    let Some(m) = g.reference.captures(s) else {
        if s.is_empty() {
            return Err("repository name must have at least one component".into());
        }
        if g.reference.is_match(&s.to_lowercase()) {
            return Err(format!(
                "invalid reference format {s:?}: repository name must be lowercase"
            ));
        }
        return Err(format!("invalid reference format {s:?}"));
    };
    let name = m.get(1).map_or("", |x| x.as_str());
    if name.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(format!(
            "repository name {name:?} must not be more than 255 characters"
        ));
    }
    let n = g
        .name
        .captures(name)
        .ok_or_else(|| format!("invalid reference format {s:?}"))?;
    let domain = n.get(1).map_or("", |x| x.as_str());
    let path = n.get(2).map_or("", |x| x.as_str());
    if domain.is_empty() {
        // Cannot happen after normalization; refused rather than guessed.
        return Err(format!("reference {s:?} has no registry"));
    }
    let tag = m.get(2).map(|x| x.as_str().to_string());
    let digest = match m.get(3) {
        Some(d) => Some(validate_digest(d.as_str())?),
        None => None,
    };
    Ok(DockerReference {
        domain: domain.to_string(),
        path: path.to_string(),
        tag,
        digest,
    })
}

/// go-digest's `Digest.Validate`: an algorithm c/image has (sha256, sha384, sha512)
/// and that many lowercase hex digits.
pub(crate) fn validate_digest(d: &str) -> Result<String, String> {
    let (alg, hex) = d
        .split_once(':')
        .filter(|(a, h)| !a.is_empty() && !h.is_empty())
        .ok_or_else(|| format!("invalid digest {d:?}"))?;
    let len = match alg {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err(format!("unsupported digest algorithm in {d:?}")),
    };
    if hex.len() != len
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!("invalid digest {d:?}"));
    }
    Ok(d.to_string())
}

/// `validateIdentityRemappingPrefix`: a registry, or a name that starts with one.
pub(crate) fn valid_remap_prefix(s: &str) -> bool {
    let g = grammar();
    g.remap_domain.is_match(s) || (g.remap_name.is_match(s) && g.remap_domain_prefix.is_match(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalize_as_docker_reference_does() {
        let n = |s: &str| DockerReference::parse_normalized(s).map(|r| r.to_string());
        assert_eq!(n("busybox").unwrap(), "docker.io/library/busybox");
        assert_eq!(
            n("index.docker.io/busybox:1").unwrap(),
            "docker.io/library/busybox:1"
        );
        assert_eq!(n("myhost/app").unwrap(), "docker.io/myhost/app");
        assert_eq!(n("localhost/app").unwrap(), "localhost/app");
        assert_eq!(n("127.0.0.1:5000/a/b:v1").unwrap(), "127.0.0.1:5000/a/b:v1");
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            n(&format!("h.io/a:t@{d}")).unwrap(),
            format!("h.io/a:t@{d}")
        );
        assert_eq!(n("Example.COM/app").unwrap(), "Example.COM/app");
        for bad in [
            "",
            "h.io/App",
            "UPPER",
            &"a".repeat(64),
            "h.io/a:t@sha256:abc",
            &format!("h.io/a@sha256:{}", "A".repeat(64)),
            &format!("h.io/a@md5:{}", "a".repeat(32)),
            "h.io/a b",
            "[::1]:5000/a",
            "h.io/a//b",
            &format!("h.io/{}", "a".repeat(255)),
        ] {
            assert!(DockerReference::parse_normalized(bad).is_err(), "{bad:?}");
        }
        assert!(DockerReference::parse_named("busybox").is_err());
        assert!(DockerReference::parse_named("docker.io/library/busybox").is_ok());
    }

    #[test]
    fn namespaces_go_from_the_repository_to_wildcard_domains() {
        let r = DockerReference::parse_normalized("reg.example.com:5000/ns/app:v1").unwrap();
        assert_eq!(
            r.policy_identity().unwrap(),
            "reg.example.com:5000/ns/app:v1"
        );
        assert_eq!(
            r.policy_namespaces(),
            [
                "reg.example.com:5000/ns/app",
                "reg.example.com:5000/ns",
                "reg.example.com:5000",
                "*.example.com",
                "*.com",
            ]
        );
        let r = DockerReference::parse_normalized("localhost/app@sha256:".to_string().as_str());
        assert!(r.is_err());
        let r = DockerReference::parse_normalized("localhost/app").unwrap();
        assert_eq!(r.policy_namespaces(), ["localhost/app", "localhost"]);
    }

    #[test]
    fn remap_prefixes_are_validated_as_c_image_does() {
        for ok in [
            "example.com",
            "example.com/ns",
            "localhost:5000/a/b",
            "foo/bar",
        ] {
            assert!(valid_remap_prefix(ok), "{ok}");
        }
        for bad in ["", "example.com/", "example.com/UP", "a:b:c", "/x"] {
            assert!(!valid_remap_prefix(bad), "{bad}");
        }
    }
}
