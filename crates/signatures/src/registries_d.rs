//! containers-registries.d(5): where signatures of which images are.
//!
//! - Only `use-sigstore-attachments` matters; the GPG stores are type-checked and ignored.
//! - Read as c/image reads it: YAML into JSON, then Go's lenient `encoding/json` (unknown keys
//!   ignored, case-insensitive keys, YAML 1.1 booleans).

use crate::dockerref::DockerReference;
use serde_yaml_ng::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The merged registries.d configuration.
#[derive(Debug, Clone, Default)]
pub struct RegistriesD {
    /// `default-docker`'s `use-sigstore-attachments`, if `default-docker` is there.
    default_docker: Option<Option<bool>>,
    /// `docker`: namespace → its `use-sigstore-attachments` (unset: ask the next one).
    docker: BTreeMap<String, Option<bool>>,
}

impl RegistriesD {
    /// No configuration at all: sigstore attachments are not used (c/image's default).
    pub fn empty() -> RegistriesD {
        RegistriesD::default()
    }

    /// What podman and skopeo read for the current user: `$HOME/.config/containers/
    /// registries.d` if it exists, else `/etc/containers/registries.d`.
    pub fn default_dir() -> PathBuf {
        crate::files::user_or_system(
            ".config/containers/registries.d",
            "/etc/containers/registries.d",
        )
    }

    /// Reads every `*.yaml` file of `dir` (a missing directory is an empty
    /// configuration, as in c/image); a namespace or `default-docker` defined by two
    /// files is an error, as in c/image. Each file is read as a regular file of at most
    /// 1 MiB.
    pub fn from_dir(dir: &Path) -> Result<RegistriesD, String> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RegistriesD::empty()),
            Err(e) => return Err(format!("registries.d {}: {e}", dir.display())),
        };
        let mut names = Vec::new();
        for e in entries {
            let e = e.map_err(|e| format!("registries.d {}: {e}", dir.display()))?;
            let name = e.file_name();
            if name.as_encoded_bytes().ends_with(b".yaml") {
                names.push(name);
            }
        }
        // Sorted, so which file an error names does not depend on the directory's order.
        names.sort();
        let mut merged = RegistriesD::empty();
        let mut default_from: Option<PathBuf> = None;
        let mut ns_from: BTreeMap<String, PathBuf> = BTreeMap::new();
        for name in names {
            let path = dir.join(&name);
            let bytes =
                crate::files::read_bounded(&path).map_err(|e| format!("registries.d {e}"))?;
            let file = RegistriesD::from_yaml(&bytes)
                .map_err(|e| format!("registries.d {}: {e}", path.display()))?;
            if let Some(d) = file.default_docker {
                if let Some(first) = &default_from {
                    return Err(format!(
                        "registries.d: \"default-docker\" defined both in {} and {}",
                        first.display(),
                        path.display()
                    ));
                }
                merged.default_docker = Some(d);
                default_from = Some(path.clone());
            }
            for (ns, v) in file.docker {
                if let Some(first) = ns_from.get(&ns) {
                    return Err(format!(
                        "registries.d: \"docker\" namespace {ns:?} defined both in {} and {}",
                        first.display(),
                        path.display()
                    ));
                }
                merged.docker.insert(ns.clone(), v);
                ns_from.insert(ns, path.clone());
            }
        }
        Ok(merged)
    }

    /// Parses one file's YAML.
    pub fn from_yaml(bytes: &[u8]) -> Result<RegistriesD, String> {
        let mut doc: Value = if bytes.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_yaml_ng::from_slice(bytes).map_err(|e| one_line(&format!("not YAML: {e}")))?
        };
        doc.apply_merge()
            .map_err(|e| one_line(&format!("YAML merge keys: {e}")))?;
        let top = match &doc {
            Value::Null => return Ok(RegistriesD::empty()),
            Value::Mapping(m) => m,
            _ => return Err("expected a mapping at the top".into()),
        };
        let mut out = RegistriesD::empty();
        for (k, v) in fields(top, &["default-docker", "docker"])? {
            match k {
                "default-docker" => {
                    out.default_docker = match v {
                        Value::Null => None,
                        v => Some(namespace(v, "default-docker")?),
                    }
                }
                _ => match v {
                    Value::Null => {}
                    Value::Mapping(m) => {
                        // A later `docker` key adds to the map, as Go's decoder does.
                        for (ns, nv) in m {
                            let ns = scalar_string(ns).ok_or_else(|| {
                                "docker: a namespace must be a string".to_string()
                            })?;
                            let at = format!("docker.{ns}");
                            let val = match nv {
                                Value::Null => None,
                                nv => namespace(nv, &at)?,
                            };
                            out.docker.insert(ns, val);
                        }
                    }
                    other => {
                        return Err(format!("docker: expected a mapping, got {}", kind(other)))
                    }
                },
            }
        }
        Ok(out)
    }

    /// Whether c/image reads sigstore attachments for `image`: the most specific
    /// `docker` namespace that sets `use-sigstore-attachments` (the exact reference, the
    /// repository, its parents, the registry, `*.DOMAIN`), else `default-docker`'s, else
    /// no. Also says which entry decided.
    pub fn use_sigstore_attachments(
        &self,
        image: &DockerReference,
    ) -> Result<(bool, String), String> {
        let identity = image.policy_identity()?;
        for name in std::iter::once(identity).chain(image.policy_namespaces()) {
            if let Some(Some(b)) = self.docker.get(&name) {
                return Ok((*b, format!("registries.d docker[{name:?}]")));
            }
        }
        match self.default_docker {
            Some(Some(b)) => Ok((b, "registries.d default-docker".to_string())),
            _ => Ok((false, "registries.d (not set: off)".to_string())),
        }
    }
}

/// A namespace's settings: `use-sigstore-attachments`, and the other keys type-checked.
fn namespace(v: &Value, at: &str) -> Result<Option<bool>, String> {
    let Value::Mapping(m) = v else {
        return Err(format!("{at}: expected a mapping, got {}", kind(v)));
    };
    let mut use_attachments = None;
    let keys = [
        "lookaside",
        "lookaside-staging",
        "sigstore",
        "sigstore-staging",
        "use-sigstore-attachments",
    ];
    for (k, v) in fields(m, &keys)? {
        if k == "use-sigstore-attachments" {
            use_attachments = match v {
                Value::Null => None,
                Value::Bool(b) => Some(*b),
                // YAML 1.1's booleans (go-yaml v2 reads these unquoted words as bools).
                Value::String(s) => match s.as_str() {
                    "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
                    "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
                    _ => {
                        return Err(format!(
                            "{at}.use-sigstore-attachments: expected true or false, got {s:?}"
                        ))
                    }
                },
                other => {
                    return Err(format!(
                        "{at}.use-sigstore-attachments: expected true or false, got {}",
                        kind(other)
                    ))
                }
            };
        } else if matches!(v, Value::Sequence(_) | Value::Mapping(_)) {
            return Err(format!("{at}.{k}: expected a string, got {}", kind(v)));
        }
    }
    Ok(use_attachments)
}

/// The entries of `m` whose keys are among `known` (matched as Go's `encoding/json`
/// matches struct fields: exactly, else ignoring ASCII case), as those names, in order;
/// other keys are ignored.
fn fields<'a>(
    m: &'a serde_yaml_ng::Mapping,
    known: &[&'static str],
) -> Result<Vec<(&'static str, &'a Value)>, String> {
    let mut out = Vec::new();
    for (k, v) in m {
        let Some(k) = scalar_string(k) else { continue };
        let hit = known
            .iter()
            .find(|n| **n == k)
            .or_else(|| known.iter().find(|n| n.eq_ignore_ascii_case(&k)));
        if let Some(n) = hit {
            out.push((*n, v));
        }
    }
    Ok(out)
}

/// A YAML scalar as ghodss/yaml turns a key into a JSON string.
fn scalar_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Null => Some("null".to_string()),
        _ => None,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses(d: &RegistriesD, image: &str) -> bool {
        let r = DockerReference::parse_normalized(image)
            .unwrap()
            .tag_name_only();
        d.use_sigstore_attachments(&r).unwrap().0
    }

    #[test]
    fn the_most_specific_namespace_that_says_decides() {
        let d = RegistriesD::from_yaml(
            b"default-docker:\n  use-sigstore-attachments: true\n\
              docker:\n  a.io/off:\n    use-sigstore-attachments: false\n\
              \x20 a.io/off/on:\n    use-sigstore-attachments: yes\n\
              \x20 a.io/off/unset:\n    lookaside: https://sigs.example/\n\
              \x20 '*.b.io':\n    use-sigstore-attachments: false\n\
              unknown-key: [1, 2]\n",
        )
        .unwrap();
        assert!(uses(&d, "c.io/x"));
        assert!(!uses(&d, "a.io/off/x"));
        assert!(uses(&d, "a.io/off/on/x"));
        assert!(
            !uses(&d, "a.io/off/unset/x"),
            "an unset namespace defers to its parent"
        );
        assert!(!uses(&d, "reg.b.io:5000/x"));
        assert!(!uses(&RegistriesD::empty(), "c.io/x"));
        let d = RegistriesD::from_yaml(b"Docker:\n  c.io:\n    USE-SIGSTORE-ATTACHMENTS: true\n")
            .unwrap();
        assert!(
            uses(&d, "c.io/x"),
            "keys match as Go's encoding/json matches them"
        );
        assert!(!uses(&RegistriesD::from_yaml(b"").unwrap(), "c.io/x"));
        assert!(!uses(
            &RegistriesD::from_yaml(b"docker:\n  c.io:\n").unwrap(),
            "c.io/x"
        ));
    }

    #[test]
    fn bad_yaml_is_one_line_naming_what() {
        for (text, want) in [
            (&b"[1]"[..], "mapping at the top"),
            (b"docker: [1]", "docker: expected a mapping"),
            (b"docker:\n  a.io: 3", "docker.a.io: expected a mapping"),
            (
                b"docker:\n  a.io:\n    use-sigstore-attachments: 'true'",
                "expected true or false",
            ),
            (
                b"docker:\n  a.io:\n    use-sigstore-attachments: 1",
                "expected true or false",
            ),
            (b"docker:\n  a.io:\n    lookaside: [x]", "expected a string"),
            (b"default-docker: x", "default-docker: expected a mapping"),
            (b"a: [\n", "not YAML"),
            (b"a: 1\na: 2\n", "not YAML"),
        ] {
            let err = RegistriesD::from_yaml(text).unwrap_err();
            assert!(
                err.contains(want),
                "{}: {err}",
                String::from_utf8_lossy(text)
            );
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn files_merge_and_clash_as_in_c_image() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!uses(
            &RegistriesD::from_dir(&dir.path().join("none")).unwrap(),
            "a.io/x"
        ));
        std::fs::write(
            dir.path().join("a.yaml"),
            "docker:\n  a.io:\n    use-sigstore-attachments: true\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.yaml"),
            "default-docker:\n  use-sigstore-attachments: false\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("c.yml"), "nonsense: [").unwrap();
        let d = RegistriesD::from_dir(dir.path()).unwrap();
        assert!(uses(&d, "a.io/x") && !uses(&d, "b.io/x"));
        std::fs::write(
            dir.path().join("d.yaml"),
            "docker:\n  a.io:\n    use-sigstore-attachments: false\n",
        )
        .unwrap();
        let err = RegistriesD::from_dir(dir.path()).unwrap_err();
        assert!(
            err.contains("\"a.io\" defined both in")
                && err.contains("a.yaml")
                && err.contains("d.yaml"),
            "{err}"
        );
        std::fs::remove_file(dir.path().join("d.yaml")).unwrap();
        std::fs::create_dir(dir.path().join("e.yaml")).unwrap();
        let err = RegistriesD::from_dir(dir.path()).unwrap_err();
        assert!(
            err.contains("e.yaml") && err.contains("not a regular file"),
            "{err}"
        );
    }
}
