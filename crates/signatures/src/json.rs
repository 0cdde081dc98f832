//! JSON read the way containers/image's `ParanoidUnmarshalJSONObject` reads policies and
//! signature payloads: every key of an object in order, so a duplicated key is seen (and
//! refused) instead of the last one silently winning, as `serde_json::Value` would do.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A JSON value whose objects keep every key, duplicates included.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum J {
    Null,
    Bool(bool),
    /// As Go decodes a number into a `float64`.
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = J;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_none<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<J, E> {
                Ok(J::Bool(b))
            }
            fn visit_u64<E>(self, n: u64) -> Result<J, E> {
                Ok(J::Num(n as f64))
            }
            fn visit_i64<E>(self, n: i64) -> Result<J, E> {
                Ok(J::Num(n as f64))
            }
            fn visit_f64<E>(self, n: f64) -> Result<J, E> {
                Ok(J::Num(n))
            }
            fn visit_str<E>(self, s: &str) -> Result<J, E> {
                Ok(J::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<J, E> {
                Ok(J::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(J::Arr(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = a.next_entry::<String, J>()? {
                    v.push((k, x));
                }
                Ok(J::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses a whole document (trailing data is an error, as `json.Unmarshal` says).
pub(crate) fn parse(bytes: &[u8]) -> Result<J, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))
}

impl J {
    /// What Go's decoder calls this kind of value, for errors.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            J::Null => "null",
            J::Bool(_) => "a boolean",
            J::Num(_) => "a number",
            J::Str(_) => "a string",
            J::Arr(_) => "an array",
            J::Obj(_) => "an object",
        }
    }

    /// The entries of an object, each key once: an error names a duplicate, a key `known`
    /// does not take, or (for `exact`) a key of `known` that is missing.
    pub(crate) fn fields<'a>(
        &'a self,
        what: &str,
        known: &[&str],
        exact: bool,
    ) -> Result<Vec<(&'a str, &'a J)>, String> {
        let J::Obj(entries) = self else {
            return Err(format!(
                "{what}: expected a JSON object, got {}",
                self.kind()
            ));
        };
        let mut out: Vec<(&str, &J)> = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            if out.iter().any(|(seen, _)| *seen == k) {
                return Err(format!("{what}: duplicate key {k:?}"));
            }
            if !known.contains(&k.as_str()) {
                return Err(format!("{what}: unknown key {k:?}"));
            }
            out.push((k, v));
        }
        if exact {
            if let Some(missing) = known.iter().find(|k| !out.iter().any(|(s, _)| s == *k)) {
                return Err(format!("{what}: key {missing:?} missing"));
            }
        }
        Ok(out)
    }

    /// A string as Go decodes one into a `string`: `null` leaves it empty.
    pub(crate) fn string(&self, what: &str) -> Result<String, String> {
        match self {
            J::Str(s) => Ok(s.clone()),
            J::Null => Ok(String::new()),
            other => Err(format!("{what}: expected a string, got {}", other.kind())),
        }
    }
}
