//! The payload a sigstore signature signs: "simple signing" JSON naming a manifest digest
//! and a docker reference, read as c/image's `UntrustedSigstorePayload` reads it (exact
//! keys in `critical`, duplicates refused, `optional` free-form but for the types of
//! `creator` and `timestamp`).

use crate::json::{self, J};

/// `critical.type` of every sigstore payload.
pub const SIGNATURE_TYPE: &str = "cosign container image signature";

/// A payload's claims. Untrusted until its signature has been verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// `critical.image.docker-manifest-digest`: the manifest signed.
    pub docker_manifest_digest: String,
    /// `critical.identity.docker-reference`: the reference it was signed as.
    pub docker_reference: String,
    /// `optional.creator`, if present.
    pub creator: Option<String>,
    /// `optional.timestamp` (seconds since the epoch), if present.
    pub timestamp: Option<i64>,
}

impl Payload {
    /// Parses a payload; the error says what is wrong with it.
    pub fn parse(bytes: &[u8]) -> Result<Payload, String> {
        let doc = json::parse(bytes).map_err(|e| format!("invalid signature payload: {e}"))?;
        parse_doc(&doc).map_err(|e| format!("invalid signature payload: {e}"))
    }

    /// The payload's bytes as c/image writes them (keys sorted, no spaces; `optional`
    /// holds `creator` and `timestamp` if they are set).
    pub fn to_bytes(&self) -> Vec<u8> {
        let s = |v: &str| serde_json::to_string(v).expect("strings serialize");
        let mut optional = Vec::new();
        if let Some(c) = &self.creator {
            optional.push(format!("\"creator\":{}", s(c)));
        }
        if let Some(t) = self.timestamp {
            optional.push(format!("\"timestamp\":{t}"));
        }
        format!(
            "{{\"critical\":{{\"identity\":{{\"docker-reference\":{}}},\"image\":{{\"docker-manifest-digest\":{}}},\"type\":{}}},\"optional\":{{{}}}}}",
            s(&self.docker_reference),
            s(&self.docker_manifest_digest),
            s(SIGNATURE_TYPE),
            optional.join(",")
        )
        .into_bytes()
    }
}

/// The value of key `k` among an object's checked entries.
fn get<'a>(f: &[(&str, &'a J)], k: &str) -> Option<&'a J> {
    f.iter().find(|(n, _)| *n == k).map(|(_, v)| *v)
}

fn parse_doc(doc: &J) -> Result<Payload, String> {
    let top = doc.fields("payload", &["critical", "optional"], true)?;
    let critical = get(&top, "critical").unwrap_or(&J::Null);
    let optional = get(&top, "optional").unwrap_or(&J::Null);
    let mut creator = None;
    let mut timestamp = None;
    if *optional != J::Null {
        let J::Obj(entries) = optional else {
            return Err(format!(
                "optional: expected a JSON object, got {}",
                optional.kind()
            ));
        };
        let mut seen: Vec<&str> = Vec::new();
        for (k, v) in entries {
            if seen.contains(&k.as_str()) {
                return Err(format!("optional: duplicate key {k:?}"));
            }
            seen.push(k);
            match k.as_str() {
                "creator" => creator = Some(v.string("optional.creator")?),
                "timestamp" => {
                    let t = match v {
                        J::Num(n) => *n,
                        J::Null => 0.0,
                        other => {
                            return Err(format!(
                                "optional.timestamp: expected a number, got {}",
                                other.kind()
                            ))
                        }
                    };
                    // Go: int64(t) must convert back to t.
                    if !(t.fract() == 0.0
                        && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&t))
                    {
                        return Err("field optional.timestamp is not an integer".into());
                    }
                    timestamp = Some(t as i64);
                }
                _ => {}
            }
        }
    }
    let c = critical.fields("critical", &["type", "image", "identity"], true)?;
    let ty = get(&c, "type")
        .unwrap_or(&J::Null)
        .string("critical.type")?;
    if ty != SIGNATURE_TYPE {
        return Err(format!("unrecognized signature type {ty:?}"));
    }
    let image = get(&c, "image").unwrap_or(&J::Null);
    let i = image.fields("critical.image", &["docker-manifest-digest"], true)?;
    let digest = i[0].1.string("critical.image.docker-manifest-digest")?;
    let identity = get(&c, "identity").unwrap_or(&J::Null);
    let id = identity.fields("critical.identity", &["docker-reference"], true)?;
    let reference = id[0].1.string("critical.identity.docker-reference")?;
    Ok(Payload {
        docker_manifest_digest: digest,
        docker_reference: reference,
        creator,
        timestamp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_in_c_image_s_form() {
        let p = Payload {
            docker_manifest_digest: format!("sha256:{}", "a".repeat(64)),
            docker_reference: "h.io/app:v1".into(),
            creator: Some("verilay".into()),
            timestamp: Some(1_700_000_000),
        };
        let bytes = p.to_bytes();
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            format!(
                r#"{{"critical":{{"identity":{{"docker-reference":"h.io/app:v1"}},"image":{{"docker-manifest-digest":"sha256:{}"}},"type":"cosign container image signature"}},"optional":{{"creator":"verilay","timestamp":1700000000}}}}"#,
                "a".repeat(64)
            )
        );
        assert_eq!(Payload::parse(&bytes).unwrap(), p);
    }

    #[test]
    fn malformed_payloads_are_refused_as_c_image_refuses_them() {
        let ok_critical = r#"{"identity":{"docker-reference":"h.io/a:1"},"image":{"docker-manifest-digest":"sha256:x"},"type":"cosign container image signature"}"#;
        let with = |critical: &str, optional: &str| {
            format!(r#"{{"critical":{critical},"optional":{optional}}}"#)
        };
        assert!(Payload::parse(with(ok_critical, "null").as_bytes()).is_ok());
        assert!(Payload::parse(
            with(
                ok_critical,
                r#"{"x":[1,{"y":2}],"creator":null,"timestamp":null}"#
            )
            .as_bytes()
        )
        .is_ok());
        let bad = [
            format!(r#"{{"critical":{ok_critical}}}"#),
            format!(r#"{{"critical":{ok_critical},"optional":null,"x":1}}"#),
            format!(r#"{{"critical":{ok_critical},"critical":{ok_critical},"optional":null}}"#),
            with(ok_critical, r#"{"timestamp":1.5}"#),
            with(ok_critical, r#"{"timestamp":"1"}"#),
            with(ok_critical, r#"{"timestamp":1e300}"#),
            with(ok_critical, r#"{"creator":1}"#),
            with(ok_critical, r#"{"a":1,"a":2}"#),
            with(ok_critical, "[]"),
            with(
                &ok_critical.replace("cosign container", "atomic container"),
                "null",
            ),
            with(
                &ok_critical.replace(r#","type""#, r#","extra":1,"type""#),
                "null",
            ),
            with(
                &ok_critical.replace(
                    r#""image":{"docker-manifest-digest":"sha256:x"}"#,
                    r#""image":{}"#,
                ),
                "null",
            ),
            with(
                &ok_critical.replace(
                    r#""docker-reference":"h.io/a:1""#,
                    r#""docker-reference":1"#,
                ),
                "null",
            ),
            with("null", "null"),
            format!("{} x", with(ok_critical, "null")),
            "\u{0}".to_string(),
        ];
        for b in bad {
            let err = Payload::parse(b.as_bytes()).unwrap_err();
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
