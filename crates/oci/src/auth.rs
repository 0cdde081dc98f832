//! Registry credentials, found where the container tools keep them, and the
//! `WWW-Authenticate` challenge a registry answers an anonymous request with.

use base64::Engine as _;
use std::path::PathBuf;

/// A user name and password (or identity token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    /// The password, or identity token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <hidden>)", self.user)
    }
}

impl Credentials {
    /// `Basic BASE64(user:password)`.
    pub fn basic(&self) -> String {
        let raw = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// The auth files searched, first match wins, as podman and skopeo search them:
/// `$REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`,
/// `~/.config/containers/auth.json`, `~/.docker/config.json`.
pub fn auth_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(f) = env("REGISTRY_AUTH_FILE") {
        files.push(PathBuf::from(f));
    }
    if let Some(d) = env("XDG_RUNTIME_DIR") {
        files.push(PathBuf::from(d).join("containers/auth.json"));
    }
    if let Some(h) = env("HOME") {
        let home = PathBuf::from(h);
        files.push(home.join(".config/containers/auth.json"));
        files.push(home.join(".docker/config.json"));
    }
    files
}

/// The most of an auth file read: they hold a few entries.
const AUTH_FILE_MAX: u64 = 1 << 20;

/// Credentials for `registry` (`HOST[:PORT]`) from the first auth file that has an entry
/// for it. A file that exists but cannot be read or parsed is an error naming it.
pub fn lookup(registry: &str) -> Result<Option<Credentials>, String> {
    for file in auth_files() {
        let text = match read_bounded(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", file.display())),
        };
        if let Some(c) =
            from_auth_json(&text, registry).map_err(|e| format!("{}: {e}", file.display()))?
        {
            return Ok(Some(c));
        }
    }
    Ok(None)
}

fn read_bounded(file: &std::path::Path) -> std::io::Result<String> {
    String::from_utf8(verity::source::read_input(file, AUTH_FILE_MAX)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
}

/// The entry for `registry` in an auth file's `auths` (keys may carry a scheme or a
/// path, as docker writes `https://index.docker.io/v1/`).
pub fn from_auth_json(text: &str, registry: &str) -> Result<Option<Credentials>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Some(auths) = v.get("auths").and_then(|a| a.as_object()) else {
        return Ok(None);
    };
    for (key, entry) in auths {
        let k = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let k = k.split('/').next().unwrap_or(k);
        if k != registry {
            continue;
        }
        let Some(auth) = entry.get("auth").and_then(|a| a.as_str()) else {
            continue;
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| format!("auths.{key}.auth is not base64"))?;
        let raw = String::from_utf8(raw).map_err(|_| format!("auths.{key}.auth is not text"))?;
        let (user, password) = raw
            .split_once(':')
            .ok_or_else(|| format!("auths.{key}.auth is not user:password"))?;
        return Ok(Some(Credentials {
            user: user.to_string(),
            password: password.to_string(),
        }));
    }
    Ok(None)
}

/// A `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
pub enum Challenge {
    /// `Basic`: the credentials go with each request.
    Basic,
    /// The token server and what to ask it for.
    Bearer {
        /// The token server's URL.
        realm: String,
        /// The `service` to ask a token for.
        service: Option<String>,
        /// The `scope` to ask a token for.
        scope: Option<String>,
    },
}

/// Parses `Basic realm="…"` or `Bearer realm="…",service="…",scope="…"`.
pub fn parse_challenge(h: &str) -> Option<Challenge> {
    let (scheme, params) = h.trim().split_once(' ').unwrap_or((h.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut realm = None;
    let mut service = None;
    let mut scope = None;
    for (k, v) in params_of(params) {
        match k.to_ascii_lowercase().as_str() {
            "realm" => realm = Some(v),
            "service" => service = Some(v),
            "scope" => scope = Some(v),
            _ => {}
        }
    }
    Some(Challenge::Bearer {
        realm: realm?,
        service,
        scope,
    })
}

/// `k="v", k2=v2` pairs; quoted values may hold commas.
fn params_of(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((k, after)) = rest.split_once('=') else {
            break;
        };
        let k = k.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (q[..end].to_string(), &q[end + 1..]),
                None => (q.to_string(), ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (after[..end].trim().to_string(), &after[end..]),
                None => (after.trim().to_string(), ""),
            }
        };
        out.push((k, v));
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry",scope="repository:a/b:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="x""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Digest x"), None);
    }

    #[test]
    fn auth_files_are_read_as_docker_writes_them() {
        let text = r#"{"auths":{"https://127.0.0.1:5000/v1/":{"auth":"dTpwOmM="}}}"#;
        let c = from_auth_json(text, "127.0.0.1:5000").unwrap().unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("u", "p:c"));
        assert_eq!(from_auth_json(text, "127.0.0.1:5001").unwrap(), None);
        assert!(from_auth_json("{", "x").is_err());
        assert!(from_auth_json(r#"{"auths":{"x":{"auth":"!!"}}}"#, "x").is_err());
    }

    #[test]
    fn an_auth_file_that_is_no_file_is_refused_at_once() {
        assert!(read_bounded(std::path::Path::new("/dev/zero")).is_err());
        let dir = std::env::temp_dir().join(format!("verilay-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let err = read_bounded(&fifo).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
