//! `oci://HOST[:PORT]/REPO[:TAG|@sha256:HEX]` (the scheme may be left out), checked with
//! the distribution spec's grammar so nothing odd reaches a URL.

use std::fmt;

/// What a reference names in its repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A tag (`latest` when none is given).
    Tag(String),
    /// `sha256:HEX` of the manifest: pins it.
    Digest(String),
}

/// A parsed reference: a registry, a repository in it, and a tag or digest there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `HOST[:PORT]`.
    pub registry: String,
    /// The repository's name (`ns/app`).
    pub repository: String,
    /// The tag or digest it names.
    pub target: Target,
}

impl Reference {
    /// Parses a reference; the error says which part is wrong.
    pub fn parse(s: &str) -> Result<Reference, String> {
        let rest = s.strip_prefix("oci://").unwrap_or(s);
        let bad = |why: &str| format!("reference {s:?}: {why}");
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("expected HOST[:PORT]/REPOSITORY[:TAG|@DIGEST]"))?;
        if !valid_host(registry) {
            return Err(bad(&format!("{registry:?} is not a host[:port]")));
        }
        let (repository, target) = match path.split_once('@') {
            Some((repo, digest)) => {
                if !valid_digest(digest) {
                    return Err(bad(&format!(
                        "{digest:?} is not a digest (sha256: and 64 lowercase hex digits)"
                    )));
                }
                (repo, Target::Digest(digest.to_string()))
            }
            None => match path.rsplit_once(':') {
                Some((repo, tag)) if !tag.contains('/') => {
                    if !valid_tag(tag) {
                        return Err(bad(&format!("{tag:?} is not a tag")));
                    }
                    (repo, Target::Tag(tag.to_string()))
                }
                _ => (path, Target::Tag("latest".to_string())),
            },
        };
        if !valid_repository(repository) {
            return Err(bad(&format!(
                "{repository:?} is not a repository name (lowercase letters, digits, and . _ - / between them)"
            )));
        }
        Ok(Reference {
            registry: registry.to_string(),
            repository: repository.to_string(),
            target,
        })
    }

    /// The tag or digest, as the manifest URL takes it.
    pub fn target_str(&self) -> &str {
        match &self.target {
            Target::Tag(t) | Target::Digest(t) => t,
        }
    }

    /// The host without its port.
    pub fn host(&self) -> &str {
        host_of(&self.registry)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = match self.target {
            Target::Tag(_) => ':',
            Target::Digest(_) => '@',
        };
        write!(
            f,
            "oci://{}/{}{sep}{}",
            self.registry,
            self.repository,
            self.target_str()
        )
    }
}

pub(crate) fn host_of(registry: &str) -> &str {
    if let Some(v6) = registry.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    registry.split(':').next().unwrap_or(registry)
}

/// `HOST[:PORT]` or `[IPv6][:PORT]`, and nothing else (no userinfo, path or junk).
pub(crate) fn valid_host(h: &str) -> bool {
    let (host_ok, port) = match h.strip_prefix('[') {
        // `[V6]` or `[V6]:PORT`, and nothing else after the bracket.
        Some(rest) => match rest.split_once(']') {
            Some((v6, after)) => (
                v6.parse::<std::net::Ipv6Addr>().is_ok(),
                match after {
                    "" => None,
                    a => match a.strip_prefix(':') {
                        Some(p) => Some(p),
                        None => return false,
                    },
                },
            ),
            None => return false,
        },
        None => {
            let (host, port) = match h.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (h, None),
            };
            let ok = !host.is_empty()
                && host.len() <= 253
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && !label.starts_with('-')
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            (ok, port)
        }
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u16>().is_ok_and(|n| n > 0)
    });
    host_ok && port_ok
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*`, at most 255.
fn valid_repository(r: &str) -> bool {
    r.len() <= 255 && !r.is_empty() && r.split('/').all(valid_component)
}

fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: &u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(&b[0]) || !alnum(&b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(&b[i]) {
            i += 1;
            continue;
        }
        let sep_start = i;
        while i < b.len() && !alnum(&b[i]) {
            i += 1;
        }
        let sep = &c[sep_start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|x| x.is_ascii_alphanumeric() || matches!(x, b'_' | b'.' | b'-'))
}

/// `sha256:` and 64 lowercase hex digits (the only algorithm verilay pins with).
pub fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|x| x.is_ascii_digit() || (b'a'..=b'f').contains(&x))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_as_the_distribution_grammar_says() {
        let r = Reference::parse("oci://127.0.0.1:5000/base/app:2").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "base/app");
        assert_eq!(r.target, Target::Tag("2".into()));
        assert_eq!(r.to_string(), "oci://127.0.0.1:5000/base/app:2");
        let r = Reference::parse("localhost/x").unwrap();
        assert_eq!(r.target, Target::Tag("latest".into()));
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("oci://h:1/r@{d}")).unwrap();
        assert_eq!(r.target, Target::Digest(d));
        assert_eq!(Reference::parse("[::1]:5000/r:t").unwrap().host(), "::1");
        for bad in [
            "oci://h",
            "oci://h/Upper",
            "oci://h/r:t/x",
            "oci://h/r@sha256:abc",
            "oci://h:0/r",
            "oci://h:99999/r",
            "oci://h/r:-t",
            "oci://h/a//b",
            "oci://h/a..b",
            "oci://h/a?x",
            "oci://h o/r",
            "oci://h/r:t#x",
            "oci://[::1]@192.0.2.2:80/r:t",
            "oci://[::1]x/r",
            "oci://[nothex]/r",
            "oci://a..b/r",
            "oci://h:+80/r",
            "oci://user@h/r",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }
}
