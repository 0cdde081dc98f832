//! Text for a terminal or a log: what a registry, an image or a tarball says is shown, never
//! obeyed.
//!
//! - Errors and log lines quote what others sent (a registry's error message, a file name in
//!   an image, a tar entry's name). Their control characters would act on a terminal
//!   (retitle it, clear it, hide the rest of a line) and their line breaks would forge
//!   lines of a log: every sink of such text writes it through [`one_line`] or [`shown`].
//! - No crate does this for terminals (the `Debug` escape also quotes and escapes quotes
//!   and backslashes, which reads badly in a message).

use std::borrow::Cow;

/// Whether `c` would act on a terminal, or reorder what it shows, rather than be shown:
/// the control characters (C0, DEL, C1) and Unicode's bidirectional formatting characters
/// and line and paragraph separators.
pub fn acts(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `s` as one line of plain text: line breaks become spaces, and every other character that
/// [`acts`] is written as its Rust escape (`\u{1b}`).
pub fn one_line(s: &str) -> Cow<'_, str> {
    if !s.chars().any(acts) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\n' | '\r' => out.push(' '),
            c if acts(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `s` as lines of plain text: every character that [`acts`] but the line feed is written
/// as JSON writes it (`\u001b`), so JSON stays JSON (outside its strings JSON text is
/// ASCII) and a table stays a table.
pub fn shown(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c != '\n' && acts(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if c != '\n' && acts(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes_what_acts_and_joins_lines() {
        assert_eq!(one_line("plain ünïcode"), "plain ünïcode");
        assert!(matches!(one_line("plain"), Cow::Borrowed(_)));
        assert_eq!(
            one_line("a\u{1b}]0;t\u{7}b\r\nc\u{9b}2J\u{202e}d\te"),
            "a\\u{1b}]0;t\\u{7}b  c\\u{9b}2J\\u{202e}d\\u{9}e"
        );
    }

    #[test]
    fn shown_keeps_line_feeds_and_json_valid() {
        assert_eq!(shown("a\nb"), "a\nb");
        let json = serde_json::json!({"name": "x\u{9b}y\u{7f}\u{2066}"}).to_string();
        let out = shown(&json);
        assert_eq!(out, r#"{"name":"x\u009by\u007f\u2066"}"#);
        let back: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back["name"], "x\u{9b}y\u{7f}\u{2066}");
    }
}
