//! Registry credentials as containerd's CRI plugin is given them in its config.toml
//! (`[plugins."io.containerd.grpc.v1.cri".registry.configs."HOST".auth]`: `username` and
//! `password`, or `auth`, base64 of `user:password`), written as an auth file in docker's
//! `config.json` format, which verilay's registry clients read (`REGISTRY_AUTH_FILE`).

use base64::Engine as _;
use std::collections::BTreeMap;
use std::path::Path;

/// The largest config read: containerd's are a few KiB.
const CONFIG_MAX: u64 = 1 << 20;

/// Each registry's `auth` (base64 of `user:password`) from the config at `path`, and a
/// line for each entry passed over (an identity token, which verilay does not send).
pub fn from_config(path: &Path) -> Result<(BTreeMap<String, String>, Vec<String>), String> {
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    // A regular file of at most CONFIG_MAX bytes, opened without waiting (a FIFO there
    // would hold the snapshotter's start forever).
    let bytes = verity::source::read_input(path, CONFIG_MAX).map_err(|e| what(&e))?;
    let text = String::from_utf8(bytes).map_err(|_| what(&"not UTF-8"))?;
    parse(&text).map_err(|e| what(&e))
}

fn parse(text: &str) -> Result<(BTreeMap<String, String>, Vec<String>), String> {
    let config: toml::Value = text
        .parse::<toml::Table>()
        .map(toml::Value::Table)
        .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())?;
    // The CRI plugin's table: `io.containerd.grpc.v1.cri` in a version 2 config, `cri`
    // in a version 1 config.
    let configs = ["io.containerd.grpc.v1.cri", "cri"]
        .iter()
        .find_map(|plugin| {
            ["plugins", plugin, "registry", "configs"]
                .iter()
                .try_fold(&config, |v, k| v.get(k))
        });
    let mut found = BTreeMap::new();
    let mut passed = Vec::new();
    let Some(configs) = configs.and_then(|c| c.as_table()) else {
        return Ok((found, passed));
    };
    for (host, c) in configs {
        let Some(auth) = c.get("auth").and_then(|a| a.as_table()) else {
            continue;
        };
        let field = |k: &str| {
            auth.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .trim()
        };
        let key = format!("registry.configs.{host:?}.auth");
        let encoded = if !field("username").is_empty() {
            base64::engine::general_purpose::STANDARD.encode(format!(
                "{}:{}",
                field("username"),
                field("password")
            ))
        } else if !field("auth").is_empty() {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(field("auth"))
                .map_err(|e| format!("{key}: auth: {e}"))?;
            if !raw.contains(&b':') {
                return Err(format!("{key}: auth is not base64 of user:password"));
            }
            field("auth").to_string()
        } else {
            if !field("identitytoken").is_empty() {
                passed.push(format!(
                    "{key}: an identity token is not sent by verilay: passed over"
                ));
            }
            continue;
        };
        found.insert(host.clone(), encoded);
    }
    Ok((found, passed))
}

/// Writes `found` to `path` (mode 0600, replaced whole) as docker's `config.json`, with
/// the entries of `also` (an auth file in the same format) for registries `found` lacks.
pub fn write(
    path: &Path,
    found: &BTreeMap<String, String>,
    also: Option<&Path>,
) -> Result<(), String> {
    let mut auths = serde_json::Map::new();
    if let Some(also) = also {
        let what = |e: &dyn std::fmt::Display| format!("{}: {e}", also.display());
        let text = std::fs::read(also).map_err(|e| what(&e))?;
        let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| what(&e))?;
        if let Some(a) = v.get("auths").and_then(|a| a.as_object()) {
            auths = a.clone();
        }
    }
    for (host, auth) in found {
        auths.insert(host.clone(), serde_json::json!({ "auth": auth }));
    }
    let bytes = serde_json::to_vec_pretty(&serde_json::json!({ "auths": auths }))
        .map_err(|e| e.to_string())?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| what(&e))?;
    std::io::Write::write_all(&mut tmp, &bytes).map_err(|e| what(&e))?;
    tmp.persist(path).map_err(|e| what(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_as_cri_reads_them() {
        let (found, passed) = parse(
            r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".registry.configs."127.0.0.1:5000".auth]
  username = "u"
  password = "secret"
[plugins."io.containerd.grpc.v1.cri".registry.configs."b.example".auth]
  auth = "dTpwdw=="
[plugins."io.containerd.grpc.v1.cri".registry.configs."c.example".auth]
  identitytoken = "t"
[plugins."io.containerd.grpc.v1.cri".registry.configs."d.example".tls]
  insecure_skip_verify = true
"#,
        )
        .unwrap();
        assert_eq!(found["127.0.0.1:5000"], "dTpzZWNyZXQ="); // u:secret
        assert_eq!(found["b.example"], "dTpwdw==");
        assert_eq!(found.len(), 2);
        assert!(passed[0].contains("c.example") && passed[0].contains("identity token"));
        assert!(parse("version = 2\n").unwrap().0.is_empty());
        // A version 1 config names the plugin `cri`.
        let (v1, _) =
            parse("[plugins.cri.registry.configs.\"h\".auth]\nauth = \" dTpwdw== \"\n").unwrap();
        assert_eq!(v1["h"], "dTpwdw==");
        let e = parse("[plugins\n").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = parse(
            "[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.h.auth]\nauth = \"eA==\"\n",
        )
        .unwrap_err();
        assert!(e.contains("not base64 of user:password"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let also = dir.path().join("also.json");
        std::fs::write(
            &also,
            r#"{"auths":{"other":{"auth":"eDp5"},"b.example":{"auth":"old"}}}"#,
        )
        .unwrap();
        let out = dir.path().join("auth.json");
        write(&out, &found, Some(&also)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(v["auths"]["other"]["auth"], "eDp5");
        assert_eq!(v["auths"]["b.example"]["auth"], "dTpwdw==");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
