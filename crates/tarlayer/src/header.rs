//! One 512-byte tar header: its checksum, its format (V7, USTAR/PAX, GNU, star) and
//! every field, parsed strictly. Numeric fields are octal or, as GNU tar and Go's
//! archive/tar write numbers too large for octal, base-256 (first byte 0x80, or 0xff for
//! a negative number); a field that is neither is an error, never a guess. Values are
//! returned as i64 (what both formats can express); whether a value fits what the image
//! stores is decided where the value is used, after PAX records have overridden it.

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

/// An octal field: digits, with leading and trailing spaces or NULs (writers pad both
/// ways; all-NUL is 0), as GNU tar and Go's archive/tar read them.
fn octal(field: &[u8]) -> Result<i64, String> {
    let pad = |b: &u8| *b == b' ' || *b == 0;
    let start = field.iter().position(|b| !pad(b)).unwrap_or(field.len());
    let end = field.iter().rposition(|b| !pad(b)).map_or(start, |i| i + 1);
    let mut v: i64 = 0;
    for &c in &field[start..end] {
        if !(b'0'..=b'7').contains(&c) {
            return Err(format!("is not an octal number ({:?})", escape(field)));
        }
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
    let format = match (&b[257..263], &b[263..265], &b[508..512]) {
        (b"ustar\0", _, b"tar\0") => Format::Star,
        (b"ustar\0", _, _) => Format::Ustar,
        (b"ustar ", b" \0", _) => Format::Gnu,
        _ => Format::V7,
    };
    let mut h = Header {
        typeflag: b[156],
        name: string(&b[0..100]).to_vec(),
        linkname: string(&b[157..257]).to_vec(),
        mode: field(b, "mode", 100, 8)?,
        uid: field(b, "uid", 108, 8)?,
        gid: field(b, "gid", 116, 8)?,
        size: field(b, "size", 124, 12)?,
        mtime: field(b, "mtime", 136, 12)?,
        devmajor: 0,
        devminor: 0,
    };
    if format == Format::V7 {
        // V7 headers end at byte 257; the rest is not theirs to define.
        return Ok(h);
    }
    h.devmajor = field(b, "devmajor", 329, 8)?;
    h.devminor = field(b, "devminor", 337, 8)?;
    let prefix: &[u8] = match format {
        Format::Ustar => string(&b[345..500]),
        Format::Star => {
            field(b, "atime", 476, 12)?;
            field(b, "ctime", 488, 12)?;
            string(&b[345..476])
        }
        _ => gnu_times_or_prefix(b)?,
    };
    if !prefix.is_empty() {
        h.name = [prefix, b"/", &h.name].concat();
    }
    Ok(h)
}

/// A GNU header has atime and ctime where USTAR has its prefix (EROFS keeps neither,
/// but they must be numbers). Go before 1.8 wrote GNU headers with a USTAR prefix
/// there; as Go's archive/tar does, such a field that is no number but plain ASCII is
/// read as that prefix. Anything else is refused.
fn gnu_times_or_prefix(b: &[u8; BLOCK]) -> Result<&[u8], String> {
    let time = |at: usize| b[at] == 0 || numeric(&b[at..at + 12]).is_ok();
    if time(345) && time(357) {
        return Ok(b"");
    }
    let prefix = string(&b[345..500]);
    if prefix.is_ascii() {
        Ok(prefix)
    } else {
        Err("the GNU atime/ctime fields hold neither numbers nor a name prefix".into())
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
    fn gnu_times_or_an_old_go_prefix() {
        // GNU atime/ctime that are numbers: no prefix.
        let h = parse(&gnu(b"name", b"14530000000\0")).unwrap();
        assert_eq!(h.name, b"name");
        // Go before 1.8 wrote a USTAR prefix there: read as one, as Go does.
        let h = parse(&gnu(b"name", b"usr/lib")).unwrap();
        assert_eq!(h.name, b"usr/lib/name");
        // Neither (a base-256 number past 64 bits, and not ASCII): refused.
        assert!(parse(&gnu(b"name", b"\xff\x01zz")).is_err());
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
