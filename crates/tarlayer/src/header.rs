//! One 512-byte tar header (V7, USTAR/PAX, GNU, star), its checksum and fields, parsed
//! strictly.
//!
//! - What this accepts, GNU tar, Go's archive/tar and Python's tarfile read alike; anything
//!   else is an error (docs/SECURITY.md section 4).
//! - Numbers are octal or base-256 (0x80, or 0xff when negative).
//! - Values are i64: fit is decided where used, after PAX overrides.

use crate::stream::BLOCK;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    V7,
    Ustar,
    Gnu,
    Star,
}

#[derive(Clone, Debug)]
pub struct Header {
    pub typeflag: u8,
    /// The name, with the USTAR (or star) prefix joined to it.
    pub name: Vec<u8>,
    /// Whether the name field alone (no prefix) ends in '/': what Python's tarfile looks
    /// at to take a V7 file (typeflag NUL) for a directory.
    pub name_field_ends_in_slash: bool,
    pub linkname: Vec<u8>,
    pub mode: i64,
    pub uid: i64,
    pub gid: i64,
    pub size: i64,
    pub mtime: i64,
    pub devmajor: i64,
    pub devminor: i64,
}

/// A field up to its first NUL, as every tar reads names.
fn string(field: &[u8]) -> &[u8] {
    match field.iter().position(|&b| b == 0) {
        Some(i) => &field[..i],
        None => field,
    }
}

/// An octal field, read only where GNU tar, Go's archive/tar and Python's tarfile read
/// it alike: spaces, octal digits, then the field's end, a NUL (all three stop there,
/// whatever follows), or spaces and nothing but NULs and spaces after them; a field of
/// NULs, or of spaces then NULs, is 0. The rest they read apart: a leading NUL (GNU tar
/// skips one, Python stops there and reads 0, Go skips them all), a blank field (GNU tar
/// fails, the others read 0), bytes after digits and a space (GNU tar ignores them, Go
/// fails), NULs then digits (Go reads the digits, GNU tar and Python 0).
fn octal(field: &[u8]) -> Result<i64, String> {
    let pads_only = |s: &[u8]| s.iter().all(|&b| b == b' ' || b == 0);
    if field[0] == 0 {
        if field.iter().all(|&b| b == 0) {
            return Ok(0);
        }
        return Err(format!(
            "starts with a NUL, then holds \"{}\" (GNU tar and Go's archive/tar skip the NUL, Python's tarfile reads 0)",
            escape(field)
        ));
    }
    let start = field.iter().take_while(|&&b| b == b' ').count();
    if start == field.len() {
        return Err(
            "is blank (GNU tar fails on it, Go's archive/tar and Python's tarfile read 0)".into(),
        );
    }
    let digits = &field[start..];
    let digits = &digits[..digits
        .iter()
        .take_while(|b| b.is_ascii_digit() && **b < b'8')
        .count()];
    let rest = &field[start + digits.len()..];
    let spaces = rest.iter().take_while(|&&b| b == b' ').count();
    let tail = &rest[spaces..];
    let ended = match tail.first() {
        None => !digits.is_empty(),
        // Straight after digits a NUL ends the number for all three; after spaces,
        // Go's archive/tar reads on past it unless nothing but padding follows.
        Some(0) => (!digits.is_empty() && spaces == 0) || pads_only(tail),
        Some(_) => false,
    };
    if !ended {
        return Err(format!("is not an octal number (\"{}\")", escape(field)));
    }
    let mut v: i64 = 0;
    for &c in digits {
        v = v
            .checked_mul(8)
            .and_then(|v| v.checked_add((c - b'0') as i64))
            .ok_or("overflows 63 bits")?;
    }
    Ok(v)
}

/// A numeric field: base-256 (GNU: 0x80 then a big-endian number, or 0xff then a
/// negative one in two's complement) or octal.
fn numeric(field: &[u8]) -> Result<i64, String> {
    match field[0] {
        0x80 | 0xff => {
            let negative = field[0] == 0xff;
            // Sign-extended into 128 bits, so every 8- and 12-byte field fits.
            let mut v: i128 = if negative { -1 } else { 0 };
            for &b in &field[1..] {
                v = (v << 8) | b as i128;
            }
            i64::try_from(v).map_err(|_| format!("(base-256) holds {v}, beyond 64 bits"))
        }
        b if b & 0x80 != 0 => Err(format!(
            "starts with byte {b:#04x}, neither octal nor base-256 (0x80 or 0xff)"
        )),
        _ => octal(field),
    }
}

/// Printable form of a malformed field, for an error line.
pub fn escape(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

/// The sums a header's checksum may hold: of its bytes as unsigned, and as signed (some
/// old tars), the checksum field counted as spaces.
fn checksums(b: &[u8; BLOCK]) -> (i64, i64) {
    let (mut unsigned, mut signed) = (0i64, 0i64);
    for (i, &c) in b.iter().enumerate() {
        let c = if (148..156).contains(&i) { b' ' } else { c };
        unsigned += c as i64;
        signed += c as i8 as i64;
    }
    (unsigned, signed)
}

/// Whether a block's checksum is good: what tells a V7 header (which has no magic)
/// from other data.
pub fn checksum_ok(b: &[u8; BLOCK]) -> bool {
    let (unsigned, signed) = checksums(b);
    octal(&b[148..156]).is_ok_and(|stored| stored == unsigned || stored == signed)
}

fn field(b: &[u8; BLOCK], name: &str, at: usize, len: usize) -> Result<i64, String> {
    numeric(&b[at..at + len]).map_err(|e| format!("the {name} field {e}"))
}

/// Parses a header block (not all zeros).
pub fn parse(b: &[u8; BLOCK]) -> Result<Header, String> {
    let stored = octal(&b[148..156]).map_err(|e| format!("the checksum field {e}"))?;
    let (unsigned, signed) = checksums(b);
    if stored != unsigned && stored != signed {
        return Err(format!(
            "bad header checksum: the header says {stored:o}, its bytes sum to {unsigned:o}"
        ));
    }
    // Go's archive/tar tells the formats apart so; GNU tar and Python's tarfile differ
    // only where `prefix` refuses.
    let format = match (&b[257..263], &b[263..265], &b[508..512]) {
        (b"ustar\0", _, b"tar\0") => Format::Star,
        (b"ustar\0", _, _) => Format::Ustar,
        (b"ustar ", b" \0", _) => Format::Gnu,
        _ => Format::V7,
    };
    let name_field = string(&b[0..100]);
    let mut h = Header {
        typeflag: b[156],
        name: name_field.to_vec(),
        name_field_ends_in_slash: name_field.ends_with(b"/"),
        linkname: string(&b[157..257]).to_vec(),
        mode: field(b, "mode", 100, 8)?,
        uid: field(b, "uid", 108, 8)?,
        gid: field(b, "gid", 116, 8)?,
        size: field(b, "size", 124, 12)?,
        mtime: field(b, "mtime", 136, 12)?,
        devmajor: 0,
        devminor: 0,
    };
    // Python's tarfile reads the device numbers of every header (and fails on a bad
    // one); GNU tar and Go only of USTAR, GNU and star ones.
    let devmajor = field(b, "devmajor", 329, 8)?;
    let devminor = field(b, "devminor", 337, 8)?;
    if format == Format::V7 {
        if matches!(h.typeflag, b'3' | b'4') && (devmajor, devminor) != (0, 0) {
            return Err(format!(
                "a V7 device with numbers {devmajor}:{devminor}, which Python's tarfile reads and GNU tar and Go's archive/tar take for 0:0"
            ));
        }
    } else {
        (h.devmajor, h.devminor) = (devmajor, devminor);
    }
    let prefix = prefix(b, format)?;
    if !prefix.is_empty() {
        h.name = [prefix, b"/", &h.name].concat();
    }
    Ok(h)
}

/// The USTAR prefix of the name, where GNU tar, Go's archive/tar and Python's tarfile
/// agree on it. GNU tar joins the 155-byte prefix of every header with the USTAR magic
/// ("ustar\0"), Python that of every header whatever its magic, Go that of USTAR
/// headers, and of star ones (a "tar\0" trailer at byte 508) only their 131 bytes before
/// the atime and ctime fields (which must be numbers).
fn prefix(b: &[u8; BLOCK], format: Format) -> Result<&[u8], String> {
    let ustar = string(&b[345..500]);
    match format {
        Format::Ustar => Ok(ustar),
        Format::Star => {
            let star = string(&b[345..476]);
            if star != ustar {
                return Err(
                    "the prefix of a star header (\"tar\\0\" at byte 508) runs past its 131 bytes into the atime field: Go's archive/tar stops there, GNU tar and Python's tarfile read on".into(),
                );
            }
            field(b, "atime", 476, 12)?;
            field(b, "ctime", 488, 12)?;
            Ok(star)
        }
        // No prefix for GNU tar and Go (but for Go's fallback for pre-1.8 Go headers,
        // which reads a prefix in GNU atime and ctime fields that are no numbers).
        Format::Gnu if !ustar.is_empty() => Err(
            "a GNU header with bytes in its atime field (at byte 345): GNU tar reads a time there, Python's tarfile a path prefix, and so does Go's archive/tar when it is no number".into(),
        ),
        Format::V7 if !ustar.is_empty() => Err(
            "a V7 header (no USTAR magic) with bytes at 345: Python's tarfile reads them as a path prefix, GNU tar and Go's archive/tar ignore them".into(),
        ),
        Format::Gnu | Format::V7 => Ok(b""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_fields() {
        assert_eq!(octal(b"0000644\0"), Ok(0o644));
        assert_eq!(octal(b" 644 \0\0\0"), Ok(0o644));
        assert_eq!(octal(b"\0\0\0\0\0\0\0\0"), Ok(0));
        assert_eq!(octal(b"77777777777\0"), Ok(0o77777777777));
        assert!(octal(b"0006 44\0").is_err());
        assert!(octal(b"000649\0\0").is_err());
        assert!(octal(b"-1\0\0\0\0\0\0").is_err());
        assert!(octal(b"0+1\0\0\0\0\0").is_err());
        // A NUL straight after the digits ends them, whatever follows.
        assert_eq!(octal(b"644\0junk"), Ok(0o644));
        // Spaces after the digits: then only padding.
        assert_eq!(octal(b"644  \0\0 "), Ok(0o644));
        assert!(octal(b"644 \0x\0\0").is_err());
        assert!(octal(b"644 x\0\0\0").is_err());
        // Spaces then padding is 0; spaces alone are blank; a leading NUL before more
        // is read three ways.
        assert_eq!(octal(b"  \0\0\0 \0\0"), Ok(0));
        assert!(octal(b"        ").unwrap_err().contains("blank"));
        assert!(octal(b"\x00\x00000644")
            .unwrap_err()
            .starts_with("starts with a NUL"));
        assert!(octal(b"\0       ").is_err());
        assert!(octal(b" \0 1750\0").is_err());
        // No spaces but the ASCII one (GNU tar skips tabs, Go does not).
        assert!(octal(b"\t644\0\0\0\0").is_err());
    }

    /// A header block with a valid (unsigned) checksum.
    fn sealed(mut b: [u8; BLOCK]) -> [u8; BLOCK] {
        b[148..156].fill(b' ');
        let sum: u32 = b.iter().map(|&c| c as u32).sum();
        b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        b
    }

    fn gnu(name: &[u8], at345: &[u8]) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        b[..name.len()].copy_from_slice(name);
        b[156] = b'0';
        b[257..265].copy_from_slice(b"ustar  \0");
        b[345..345 + at345.len()].copy_from_slice(at345);
        sealed(b)
    }

    #[test]
    fn checksums_signed_or_unsigned() {
        let mut b = [0u8; BLOCK];
        b[..4].copy_from_slice(b"f\xe9\xe9x");
        let good = sealed(b);
        assert!(parse(&good).is_ok());
        // Old tars summed bytes as signed chars: 0xe9 counts as -23.
        let mut signed = good;
        let (_, s) = checksums(&good);
        signed[148..156].copy_from_slice(format!("{s:06o}\0 ").as_bytes());
        assert!(parse(&signed).is_ok());
        let mut bad = good;
        bad[0] = b'g';
        assert!(parse(&bad).unwrap_err().starts_with("bad header checksum"));
    }

    #[test]
    fn gnu_headers_have_no_prefix() {
        // No atime (a NUL first): no prefix, whatever the ctime field holds.
        let h = parse(&gnu(b"name", &[&[0u8; 12][..], b"junk"].concat())).unwrap();
        assert_eq!(h.name, b"name");
        // Text (old Go's prefix) or a time in the atime field: GNU tar reads no prefix,
        // Python's tarfile one.
        assert!(parse(&gnu(b"name", b"usr/lib"))
            .unwrap_err()
            .contains("atime field"));
        assert!(parse(&gnu(b"name", b"14530000000\0"))
            .unwrap_err()
            .contains("atime field"));
    }

    fn star(prefix: &[u8]) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        b[0] = b'f';
        b[156] = b'0';
        b[257..263].copy_from_slice(b"ustar\0");
        b[345..345 + prefix.len()].copy_from_slice(prefix);
        b[508..512].copy_from_slice(b"tar\0");
        sealed(b)
    }

    #[test]
    fn star_prefixes_end_within_131_bytes() {
        assert_eq!(parse(&star(b"usr")).unwrap().name, b"usr/f");
        let full = [b'p'; 131];
        assert_eq!(parse(&star(&full)).unwrap().name.len(), 133);
        let over = [b'p'; 132];
        assert!(parse(&star(&over)).unwrap_err().contains("runs past"));
        // The same bytes without the trailer are a 132-byte USTAR prefix.
        let mut b = star(&over);
        b[508..512].fill(0);
        assert_eq!(parse(&sealed(b)).unwrap().name.len(), 134);
    }

    #[test]
    fn base256_fields() {
        // 4294968296 = 2^32 + 1000: must not become 1000.
        let mut f = [0u8; 8];
        f[0] = 0x80;
        f[3..8].copy_from_slice(&[0x01, 0x00, 0x00, 0x03, 0xe8]);
        assert_eq!(numeric(&f), Ok(4_294_968_296));
        // -1 in 12 bytes.
        assert_eq!(numeric(&[0xff; 12]), Ok(-1));
        // 2^63 does not fit.
        let mut g = [0u8; 12];
        g[0] = 0x80;
        g[4] = 0x80;
        assert!(numeric(&g).is_err());
        // The most negative i64 does.
        let mut m = [0xffu8; 12];
        m[4] = 0x80;
        m[5..].fill(0);
        assert_eq!(numeric(&m), Ok(i64::MIN));
        // Other high-bit first bytes are not GNU's base-256.
        assert!(numeric(&[0x81, 0, 0, 0, 0, 0, 0, 1]).is_err());
    }
}
