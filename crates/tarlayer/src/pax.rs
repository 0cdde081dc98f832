//! PAX extended headers: records, and what they say about the next entry.
//!
//! - Honoured: `path`, `linkpath`, `uid`, `gid`, `mtime`, `size`, `SCHILY.xattr.*`; a record
//!   given twice takes its later value.
//! - Checked, not kept: `uname`, `gname`, `atime`, `ctime`.
//! - Refused: an empty `path`, `linkpath`, id, `size` or time; `GNU.sparse.*`.
//! - Anything else changes nothing.

use std::collections::BTreeMap;

/// Longest path or link target: PATH_MAX (4096) with its NUL.
pub const PATH_MAX: usize = 4095;
/// Longest user or group name (LOGIN_NAME_MAX with its NUL).
pub const NAME_MAX: usize = 255;
/// Longest xattr name (XATTR_NAME_MAX), prefix included.
pub const XATTR_NAME_MAX: usize = 255;
/// Longest xattr value: XATTR_SIZE_MAX is 65536, but an EROFS value size is 16 bits.
pub const XATTR_VALUE_MAX: usize = 65535;
/// Names of one file's xattrs with a NUL each (XATTR_LIST_MAX): no Linux file can have
/// more, listxattr(2) could not list them.
pub const XATTR_LIST_MAX: usize = 65536;
/// Encoded xattrs of one entry (4-byte entry headers and padding included): what one
/// EROFS inode holds, its `i_xattr_icount` being 16 bits of 4-byte units.
pub const XATTR_INODE_MAX: usize = 4 * (u16::MAX as usize - 1);

/// One PAX record: key and value.
pub type Record = (Vec<u8>, Vec<u8>);

/// PAX records, `LEN KEY=VALUE\n` each, LEN counting the whole record, in order. Values
/// may hold any byte, newlines included (GNU tar's textual ACLs do), so records are cut
/// by length. As Go's archive/tar, a key is non-empty without NUL, and the values of
/// `path`, `linkpath`, `uname` and `gname` hold no NUL. Trailing NULs are padding.
pub fn records(mut data: &[u8]) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while !data.iter().all(|&b| b == 0) {
        let bad = |what: &str| format!("malformed PAX record at byte {at} of its header: {what}");
        let sp = data
            .iter()
            .take(20)
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("no length"))?;
        let len = decimal(&data[..sp]).ok_or_else(|| bad("no length"))?;
        if len < 5 || len > data.len() as u64 || len as usize <= sp + 1 {
            return Err(bad("its length runs past the header"));
        }
        let len = len as usize;
        if data[len - 1] != b'\n' {
            return Err(bad("no newline at its end"));
        }
        let kv = &data[sp + 1..len - 1];
        let eq = kv
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| bad("no '='"))?;
        let (key, value) = (&kv[..eq], &kv[eq + 1..]);
        let nul_free_value = matches!(key, b"path" | b"linkpath" | b"uname" | b"gname");
        if key.is_empty() || key.contains(&0) || (nul_free_value && value.contains(&0)) {
            return Err(bad("an empty key, or a NUL byte in a key or name"));
        }
        out.push((key.to_vec(), value.to_vec()));
        data = &data[len..];
        at += len;
    }
    Ok(out)
}

/// A decimal number: ASCII digits only (no sign, no spaces).
pub fn decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// PAX time: `[-]SECONDS[.FRACTION]`, a signed decimal number of seconds, as GNU tar and
/// Go's archive/tar write it (`-1.5` is 1.5 s before the epoch). Digits past
/// nanoseconds are dropped. Returns seconds and a non-negative nanosecond part.
pub fn time(v: &[u8]) -> Option<(i64, u32)> {
    // No '+': GNU tar refuses it (and keeps the header's time), Go and Python read it.
    let (negative, v) = match v {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, v),
    };
    let (secs, frac) = match v.iter().position(|&b| b == b'.') {
        Some(i) => (&v[..i], &v[i + 1..]),
        None => (v, &b""[..]),
    };
    let secs = decimal(secs)? as i128;
    if !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut nsec = 0i128;
    for i in 0..9 {
        nsec = nsec * 10 + frac.get(i).map_or(0, |d| (d - b'0') as i128);
    }
    let total = if negative {
        -(secs * 1_000_000_000 + nsec)
    } else {
        secs * 1_000_000_000 + nsec
    };
    let secs = i64::try_from(total.div_euclid(1_000_000_000)).ok()?;
    Some((secs, total.rem_euclid(1_000_000_000) as u32))
}

/// What the PAX records before an entry say about it; a record given twice takes its
/// later value (as in GNU tar, Go's archive/tar and Python's tarfile).
#[derive(Default, Debug)]
pub struct Local {
    pub path: Option<Vec<u8>>,
    pub linkpath: Option<Vec<u8>>,
    pub uid: Option<u64>,
    pub gid: Option<u64>,
    pub mtime: Option<(i64, u32)>,
    pub size: Option<u64>,
    /// `SCHILY.xattr.NAME`: full xattr names (an empty value is a value).
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Keys this importer honours; a global header may not set them (see `lib.rs`).
pub fn is_meaningful(key: &[u8]) -> bool {
    matches!(
        key,
        b"path"
            | b"linkpath"
            | b"uid"
            | b"gid"
            | b"uname"
            | b"gname"
            | b"mtime"
            | b"atime"
            | b"ctime"
            | b"size"
    ) || key.starts_with(b"SCHILY.xattr.")
        || key.starts_with(b"GNU.sparse.")
}

/// Reads the records of one extended header ('x').
pub fn interpret(records: Vec<Record>) -> Result<Local, String> {
    let mut l = Local::default();
    for (key, value) in records {
        let shown = || String::from_utf8_lossy(&key).into_owned();
        let bad = || {
            format!(
                "PAX record {}={:?} is malformed",
                shown(),
                super::header::escape(&value[..value.len().min(40)])
            )
        };
        if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
            if name.len() > XATTR_NAME_MAX || value.len() > XATTR_VALUE_MAX {
                return Err(format!(
                    "xattr {} is too large ({} byte name, {} byte value; at most {XATTR_NAME_MAX} and {XATTR_VALUE_MAX})",
                    String::from_utf8_lossy(name),
                    name.len(),
                    value.len()
                ));
            }
            l.xattrs.insert(name.to_vec(), value);
            continue;
        }
        if key.starts_with(b"GNU.sparse.") {
            return Err("sparse entries (tar -S) are not supported".into());
        }
        let read_apart_when_empty = matches!(
            key.as_slice(),
            b"path" | b"linkpath" | b"uid" | b"gid" | b"size" | b"mtime" | b"atime" | b"ctime"
        );
        if read_apart_when_empty && value.is_empty() {
            // POSIX: the header's field stands. So Go's archive/tar reads it; Python's
            // tarfile reads 0 or an empty path, GNU tar an empty path, or fails on a
            // number and keeps the value before.
            return Err(format!(
                "PAX record {} is empty: Go's archive/tar keeps the header's value, Python's tarfile reads 0 or an empty path, GNU tar an empty path or an error",
                shown()
            ));
        }
        match key.as_slice() {
            b"path" => l.path = Some(value),
            b"linkpath" => l.linkpath = Some(value),
            b"uid" => l.uid = Some(decimal(&value).ok_or_else(bad)?),
            b"gid" => l.gid = Some(decimal(&value).ok_or_else(bad)?),
            b"size" => {
                let s = decimal(&value).filter(|&s| s <= i64::MAX as u64);
                l.size = Some(s.ok_or_else(bad)?);
            }
            b"mtime" => l.mtime = Some(time(&value).ok_or_else(bad)?),
            // EROFS keeps no atime and no ctime of its own; they must still be times.
            b"atime" | b"ctime" => {
                time(&value).ok_or_else(bad)?;
            }
            // Container layers own files by number (containerd and podman ignore the
            // names), and looking names up in the build host's /etc/passwd would make the
            // image depend on the machine that built it: they are checked, not used.
            b"uname" | b"gname" if value.len() > NAME_MAX => {
                return Err(format!("PAX {} is longer than {NAME_MAX} bytes", shown()));
            }
            // Anything else (comment, charset, hdrcharset, vendor records such as
            // SCHILY.acl.* or LIBARCHIVE.*) changes nothing here.
            _ => {}
        }
    }
    check_xattr_totals(&l.xattrs)?;
    Ok(l)
}

/// One entry's xattrs must fit one Linux file and one EROFS inode.
fn check_xattr_totals(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<(), String> {
    let names: usize = x.keys().map(|n| n.len() + 1).sum();
    let encoded: usize = x
        .iter()
        .map(|(n, v)| (4 + n.len() + v.len()).next_multiple_of(4))
        .sum();
    if names > XATTR_LIST_MAX || encoded > XATTR_INODE_MAX {
        return Err(format!(
            "{} xattrs too many or too large for one file ({names} bytes of names, at most {XATTR_LIST_MAX}; {encoded} bytes encoded, at most {XATTR_INODE_MAX})",
            x.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_times() {
        assert_eq!(time(b"1700000000"), Some((1700000000, 0)));
        assert_eq!(time(b"1700000000.5"), Some((1700000000, 500_000_000)));
        assert_eq!(
            time(b"1700000000.1234567891"),
            Some((1700000000, 123_456_789))
        );
        assert_eq!(time(b"1700000000."), Some((1700000000, 0)));
        assert_eq!(time(b"-1.5"), Some((-2, 500_000_000)));
        // -0.5 s is before the epoch, though its whole seconds read as 0.
        assert_eq!(time(b"-0.5"), Some((-1, 500_000_000)));
        assert_eq!(time(b"-0.000000001"), Some((-1, 999_999_999)));
        assert_eq!(time(b"-5"), Some((-5, 0)));
        assert_eq!(
            time(b"-9223372036854775807.5"),
            Some((i64::MIN, 500_000_000))
        );
        assert_eq!(time(b"-9223372036854775808"), Some((i64::MIN, 0)));
        assert_eq!(time(b"-9223372036854775808.1"), None);
        assert_eq!(time(b"9223372036854775808"), None);
        assert_eq!(time(b"x"), None);
        assert_eq!(time(b"1.-5"), None);
        assert_eq!(time(b".5"), None);
        assert_eq!(time(b"-"), None);
        assert_eq!(time(b""), None);
        assert_eq!(time(b"1 "), None);
        assert_eq!(time(b"+1"), None);
    }

    #[test]
    fn pax_records_are_cut_by_length() {
        let data = b"28 SCHILY.acl.access=a\nb\nc\n\n18 path=some/name\n\0\0";
        let recs = records(data).unwrap();
        assert_eq!(
            recs[0],
            (b"SCHILY.acl.access".to_vec(), b"a\nb\nc\n".to_vec())
        );
        assert_eq!(recs[1], (b"path".to_vec(), b"some/name".to_vec()));
        assert!(records(b"99 path=x\n").is_err());
        assert!(records(b"9 pathx\n").is_err());
        assert!(records(b"x path=x\n").is_err());
        assert!(records(b"+9 path=x\n").is_err());
        assert!(records(b"10 path=x\n\0x").is_err());
        assert!(records(b"11 path=\0x\n").is_err());
        assert!(records(b"7 =abc\n").is_err());
        // A NUL in an xattr value is fine.
        assert_eq!(records(b"20 SCHILY.xattr.a=\0\n").unwrap()[0].1, b"\0");
    }

    #[test]
    fn later_records_win_and_empty_ones_are_refused() {
        let l = interpret(vec![
            (b"uid".to_vec(), b"5".to_vec()),
            (b"uid".to_vec(), b"3000000".to_vec()),
            (b"SCHILY.xattr.user.a".to_vec(), b"1".to_vec()),
            (b"SCHILY.xattr.user.a".to_vec(), b"2".to_vec()),
            (b"comment".to_vec(), b"".to_vec()),
        ])
        .unwrap();
        assert_eq!(l.uid, Some(3000000));
        assert_eq!(l.xattrs[&b"user.a"[..]], b"2");
        for key in [
            "path", "linkpath", "uid", "gid", "size", "mtime", "atime", "ctime",
        ] {
            let r = interpret(vec![(key.into(), b"7".to_vec()), (key.into(), vec![])]);
            assert!(r.unwrap_err().contains("is empty"), "{key}");
        }
    }

    #[test]
    fn numbers_are_strict() {
        for (k, v) in [
            ("uid", "-1"),
            ("uid", "+1"),
            ("uid", " 1"),
            ("gid", "1e3"),
            ("size", "-5"),
            ("size", "9223372036854775808"),
            ("mtime", "abc"),
            ("atime", "1.x"),
            ("ctime", "--1"),
        ] {
            let r = interpret(vec![(k.into(), v.into())]);
            assert!(r.is_err(), "{k}={v}");
        }
    }
}
