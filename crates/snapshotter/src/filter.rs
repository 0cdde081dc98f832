//! containerd's filter language (`filters/parser.go`), as List receives it: selectors
//! `FIELD[.FIELD…] [OP VALUE]` joined by `,` (all must hold), OP one of `==`, `!=`, `~=`
//! (a regular expression), a field or value bare or double-quoted. Snapshots have the
//! fields `kind`, `name`, `parent` and `labels.KEY`, as containerd's metadata adaptor
//! gives them. Written here: no crate parses this language.

use containerd_snapshots::{Info, Kind};

/// The longest filter accepted (bytes); containerd's own are a few hundred.
const MAX_FILTER: usize = 16 << 10;
/// The most memory one regular expression may compile to.
const REGEX_BYTES: usize = 1 << 20;
/// The most regular expressions one filter may hold.
const MAX_REGEXES: usize = 4;

#[derive(Debug)]
enum Op {
    Present,
    Equal(String),
    NotEqual(String),
    Matches(regex::Regex),
}

/// One parsed filter: every selector must hold.
#[derive(Debug)]
pub struct Filter(Vec<(Vec<String>, Op)>);

impl Filter {
    /// Whether every selector holds for `i`.
    pub fn selects(&self, i: &Info) -> bool {
        self.0.iter().all(|(path, op)| {
            let value = field(i, path);
            match op {
                Op::Present => value.is_some(),
                Op::Equal(v) => value.as_deref() == Some(v),
                Op::NotEqual(v) => value.as_deref() != Some(v),
                Op::Matches(r) => value.is_some_and(|s| r.is_match(&s)),
            }
        })
    }
}

fn field(i: &Info, path: &[String]) -> Option<String> {
    match path.first()?.as_str() {
        "kind" if path.len() == 1 => Some(
            match i.kind {
                Kind::Active => "active",
                Kind::View => "view",
                Kind::Committed => "committed",
                Kind::Unknown => "unknown",
            }
            .to_string(),
        ),
        "name" if path.len() == 1 => Some(i.name.clone()),
        "parent" if path.len() == 1 => Some(i.parent.clone()),
        "labels" if path.len() > 1 => i.labels.get(&path[1..].join(".")).cloned(),
        _ => None,
    }
}

/// Parses filter `s`; the error names what is wrong and where.
pub fn parse(s: &str) -> Result<Filter, String> {
    if s.len() > MAX_FILTER {
        return Err(format!("filter longer than {MAX_FILTER} bytes"));
    }
    let mut p = Parser { s, at: 0 };
    let mut selectors = Vec::new();
    loop {
        p.skip_space();
        let mut path = vec![p.word("a field")?];
        while p.eat(".") {
            path.push(p.word("a field")?);
        }
        p.skip_space();
        let op = if p.eat("==") {
            Op::Equal(p.value()?)
        } else if p.eat("!=") {
            Op::NotEqual(p.value()?)
        } else if p.eat("~=") {
            let at = p.at;
            let regexes = selectors
                .iter()
                .filter(|(_, op)| matches!(op, Op::Matches(_)))
                .count();
            if regexes >= MAX_REGEXES {
                return Err(p.error_at(at, &format!("more than {MAX_REGEXES} regular expressions")));
            }
            let v = p.value()?;
            let r = regex::RegexBuilder::new(&v)
                .size_limit(REGEX_BYTES)
                .build()
                .map_err(|e| p.error_at(at, &format!("bad regular expression ({e})")))?;
            Op::Matches(r)
        } else {
            Op::Present
        };
        selectors.push((path, op));
        p.skip_space();
        if p.at == s.len() {
            return Ok(Filter(selectors));
        }
        if !p.eat(",") {
            return Err(p.error_at(p.at, "expected `,`, `==`, `!=` or `~=`"));
        }
    }
}

struct Parser<'a> {
    s: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.s[self.at..]
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, token: &str) -> bool {
        let hit = self.rest().starts_with(token);
        if hit {
            self.at += token.len();
        }
        hit
    }

    fn error_at(&self, at: usize, what: &str) -> String {
        let shown: String = self.s.chars().take(120).collect();
        format!("filter {shown:?}: at byte {at}: {what}")
    }

    /// A field: letters, digits and `_` (a letter first), or quoted.
    fn word(&mut self, what: &str) -> Result<String, String> {
        if self.rest().starts_with('"') {
            return self.quoted();
        }
        let n = self
            .rest()
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(self.rest().len());
        if n == 0 || !self.rest().starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(self.error_at(self.at, &format!("expected {what}")));
        }
        let w = self.rest()[..n].to_string();
        self.at += n;
        Ok(w)
    }

    /// A value: quoted, or up to the next `,` or space.
    fn value(&mut self) -> Result<String, String> {
        self.skip_space();
        if self.rest().starts_with('"') {
            return self.quoted();
        }
        let n = self
            .rest()
            .find(|c: char| c == ',' || c.is_whitespace())
            .unwrap_or(self.rest().len());
        if n == 0 {
            return Err(self.error_at(self.at, "expected a value"));
        }
        let v = self.rest()[..n].to_string();
        self.at += n;
        Ok(v)
    }

    /// A double-quoted string with Go's escapes `\"`, `\\`, `\n`, `\t`, `\r`, `\/`.
    fn quoted(&mut self) -> Result<String, String> {
        let start = self.at;
        self.at += 1;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.at += i + 1;
                    return Ok(out);
                }
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('"') => out.push('"'),
                    Some('\\') => out.push('\\'),
                    Some('/') => out.push('/'),
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('r') => out.push('\r'),
                    _ => return Err(self.error_at(self.at + i, "unknown escape")),
                },
                c => out.push(c),
            }
        }
        Err(self.error_at(start, "unterminated quoted string"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn info(kind: Kind, name: &str, parent: &str, labels: &[(&str, &str)]) -> Info {
        Info {
            kind,
            name: name.into(),
            parent: parent.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            ..Info::default()
        }
    }

    #[test]
    fn selects_as_containerd_filters() {
        let target = "sha256:aaaa";
        let i = info(
            Kind::Committed,
            "ns/1/x",
            "ns/0/p",
            &[("containerd.io/snapshot.ref", target), ("a.b", "c d")],
        );
        let yes = [
            format!(r#"labels."containerd.io/snapshot.ref"=={target},parent=="ns/0/p""#),
            "kind==committed".into(),
            "labels.a.b==\"c d\"".into(),
            "labels.a.b".into(),
            "name~=^ns/[0-9]+/x$".into(),
            " kind != active , parent ".into(),
        ];
        for f in &yes {
            assert!(parse(f).unwrap().selects(&i), "{f}");
        }
        let no = [
            r#"labels."containerd.io/snapshot.ref"==sha256:bbbb"#,
            "parent==ns/0/p,kind==active",
            "labels.missing",
            "nosuchfield",
        ];
        for f in no {
            assert!(!parse(f).unwrap().selects(&i), "{f}");
        }
        for (bad, why) in [
            ("", "expected a field"),
            ("kind==", "expected a value"),
            ("kind==a b", "expected `,`"),
            ("labels.\"x", "unterminated"),
            ("name~=(", "bad regular expression"),
            ("labels.\"\\q\"", "unknown escape"),
            ("9kind", "expected a field"),
            (
                "a~=1,b~=2,c~=3,d~=4,e~=5",
                "more than 4 regular expressions",
            ),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(why) && e.contains("at byte"), "{bad}: {e}");
        }
        assert!(parse(&"a".repeat(MAX_FILTER + 1))
            .unwrap_err()
            .contains("longer"));
    }
}
