//! Replays a measurement list written by [`crate::log`] and checks every byte of it: each
//! record of both binary lists is parsed, its template digests are recomputed from the
//! template data, the data's fields are checked against the template, the ascii lists must
//! be exactly what the binary entries render to, and both PCR banks are replayed and
//! compared with `pcrs_sha1` / `pcrs_sha256`.
//!
//! Stricter than `evmctl ima_measurement`, which stops at the first entry where the replayed
//! PCRs match and so accepts anything appended after that point: here the PCR files must
//! match after the *last* entry, and entries past a match point are reported as not covered.
//! Input is treated as hostile: lengths are capped before anything is allocated, and every
//! problem is one error naming the file, the byte offset and the entry (1-based; entry 1 is
//! boot_aggregate) or PCR line.

use crate::log::{
    template_by_name, to_hex, Bank, Entry, Pcrs, ASCII_SHA1, ASCII_SHA256, BINARY_SHA1,
    BINARY_SHA256, COUNT, MAX_PATH, MAX_SIG, NUM_PCRS, PCRS_SHA1, PCRS_SHA256,
};
use crate::policy::Template;
use sha1::{Digest, Sha1};
use sha2::Sha256;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// What a verified list holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub entries: u64,
    /// (index, sha1 value, sha256 value) of every PCR the list extended (the non-zero ones).
    pub pcrs: Vec<(u32, Vec<u8>, Vec<u8>)>,
}

/// The first problem found, located: `FILE: offset N (entry K): what is wrong`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The file's name inside the list directory.
    pub file: &'static str,
    /// Byte offset of the offending field or line, when there is one.
    pub offset: Option<u64>,
    /// The 1-based entry the problem is in.
    pub entry: Option<u64>,
    /// The PCR line the problem is on (PCR files).
    pub pcr: Option<u32>,
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(o) = self.offset {
            write!(f, ": offset {o}")?;
        }
        if let Some(e) = self.entry {
            write!(f, " (entry {e})")?;
        } else if let Some(p) = self.pcr {
            write!(f, " (PCR-{p:02})")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for VerifyError {}

fn at(file: &'static str, offset: u64, entry: u64, message: impl Into<String>) -> VerifyError {
    VerifyError {
        file,
        offset: Some(offset),
        entry: Some(entry),
        pcr: None,
        message: message.into(),
    }
}

/// Longest template name accepted (TCG_EVENT_NAME_LEN_MAX, as evmctl).
const MAX_NAME: usize = 255;
/// Longest template data accepted: the largest `d-ngv2`, `n-ng` and `sig` fields fit with room
/// to spare; anything larger is garbage, refused before allocating.
const MAX_DATA: usize = 128 * 1024;
/// Longest PCR or count file accepted (a sha256 PCR file is 1752 bytes).
const MAX_SMALL_FILE: u64 = 16 * 1024;

/// The kernel's hash_algo_name[] with digest sizes (crypto/hash_info.c), for `d-ng` prefixes.
const HASH_ALGOS: [(&str, usize); 23] = [
    ("md4", 16),
    ("md5", 16),
    ("sha1", 20),
    ("rmd160", 20),
    ("sha256", 32),
    ("sha384", 48),
    ("sha512", 64),
    ("sha224", 28),
    ("rmd128", 16),
    ("rmd256", 32),
    ("rmd320", 40),
    ("wp256", 32),
    ("wp384", 48),
    ("wp512", 64),
    ("tgr128", 16),
    ("tgr160", 20),
    ("tgr192", 24),
    ("sm3", 32),
    ("streebog256", 32),
    ("streebog512", 64),
    ("sha3-256", 32),
    ("sha3-384", 48),
    ("sha3-512", 64),
];

/// Bytes for a message: printable ASCII as is, the rest escaped, long ones cut.
fn show(bytes: &[u8]) -> String {
    const MAX: usize = 80;
    let s = bytes[..bytes.len().min(MAX)].escape_ascii().to_string();
    if bytes.len() > MAX {
        format!("{s}...")
    } else {
        s
    }
}

/// Replays the whole list in DIR and checks it; see the module documentation.
pub fn verify(dir: &Path) -> Result<Report, VerifyError> {
    let r = replay(dir, false)?;
    let pcrs = (0..NUM_PCRS)
        .filter_map(|i| {
            let s1 = r.pcrs.get(Bank::Sha1, i)?;
            let s2 = r.pcrs.get(Bank::Sha256, i)?;
            let used = s1.iter().chain(s2).any(|&b| b != 0);
            used.then(|| (i, s1.to_vec(), s2.to_vec()))
        })
        .collect();
    Ok(Report {
        entries: r.entries,
        pcrs,
    })
}

/// A verified list's state, as [`crate::log::Log::open`] continues from it.
pub(crate) struct Replay {
    pub entries: u64,
    pub pcrs: Pcrs,
    /// (PCR, SHA-256 template digest) per entry, when asked for.
    pub keys: Vec<(u32, [u8; 32])>,
}

/// Reads a file in the list directory, refusing files too large to be what they claim.
fn open(dir: &Path, file: &'static str) -> Result<File, VerifyError> {
    File::open(dir.join(file)).map_err(|e| VerifyError {
        file,
        offset: None,
        entry: None,
        pcr: None,
        message: format!("cannot open: {e}"),
    })
}

fn read_small(dir: &Path, file: &'static str) -> Result<Vec<u8>, VerifyError> {
    let mut buf = Vec::new();
    open(dir, file)?
        .take(MAX_SMALL_FILE + 1)
        .read_to_end(&mut buf)
        .map_err(|e| VerifyError {
            file,
            offset: None,
            entry: None,
            pcr: None,
            message: format!("cannot read: {e}"),
        })?;
    if buf.len() as u64 > MAX_SMALL_FILE {
        return Err(VerifyError {
            file,
            offset: Some(MAX_SMALL_FILE),
            entry: None,
            pcr: None,
            message: format!("longer than {MAX_SMALL_FILE} bytes, which no such file is"),
        });
    }
    Ok(buf)
}

/// A PCR file's 24 values and the offset of each value's hex, parsed strictly: exactly
/// the lines `PCR-NN: <hex>\n` that [`crate::log::Log`] writes, in order.
fn read_pcr_file(
    dir: &Path,
    file: &'static str,
    bank: Bank,
) -> Result<Vec<(Vec<u8>, u64)>, VerifyError> {
    let text = read_small(dir, file)?;
    let err = |offset: usize, pcr: u32, message: String| VerifyError {
        file,
        offset: Some(offset as u64),
        entry: None,
        pcr: Some(pcr),
        message,
    };
    let mut out = Vec::with_capacity(NUM_PCRS as usize);
    let mut pos = 0;
    for i in 0..NUM_PCRS {
        let rest = &text[pos..];
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            let why = if rest.is_empty() {
                format!("the file ends after {i} lines; a PCR file has 24")
            } else {
                "the line has no newline".to_string()
            };
            return Err(err(pos, i, why));
        };
        let line = &rest[..nl];
        let label = format!("PCR-{i:02}: ");
        let Some(hex) = line.strip_prefix(label.as_bytes()) else {
            return Err(err(
                pos,
                i,
                format!("expected a line starting `{label}`, found `{}`", show(line)),
            ));
        };
        let hex_at = pos + label.len();
        match crate::log::from_hex(hex) {
            Some(v) if v.len() == bank.size() => out.push((v, hex_at as u64)),
            _ => {
                return Err(err(
                    hex_at,
                    i,
                    format!(
                        "expected {} hex digits of a {} PCR, found `{}`",
                        bank.size() * 2,
                        bank.name(),
                        show(hex)
                    ),
                ))
            }
        }
        pos += nl + 1;
    }
    if pos != text.len() {
        return Err(VerifyError {
            file,
            offset: Some(pos as u64),
            entry: None,
            pcr: None,
            message: "data after the PCR-23 line".into(),
        });
    }
    Ok(out)
}

/// One binary record, with where its parts are.
struct Record {
    start: u64,
    digest_at: u64,
    data_at: u64,
    pcr: u32,
    digest: Vec<u8>,
    name: Vec<u8>,
    data: Vec<u8>,
}

/// Reads records from a binary list, never trusting a length before it is checked.
struct ListReader {
    file: &'static str,
    r: BufReader<File>,
    off: u64,
    bank: Bank,
}

impl ListReader {
    fn open(dir: &Path, file: &'static str, bank: Bank) -> Result<ListReader, VerifyError> {
        Ok(ListReader {
            file,
            r: BufReader::new(open(dir, file)?),
            off: 0,
            bank,
        })
    }

    /// Reads until BUF is full or the file ends; returns how much was read.
    fn fill(&mut self, buf: &mut [u8], entry: u64) -> Result<usize, VerifyError> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(at(
                        self.file,
                        self.off + got as u64,
                        entry,
                        format!("cannot read: {e}"),
                    ))
                }
            }
        }
        Ok(got)
    }

    /// Exactly N bytes of the field WHAT, or a truncation error at the field's offset.
    fn take(&mut self, n: usize, what: &str, entry: u64) -> Result<Vec<u8>, VerifyError> {
        let mut buf = vec![0; n];
        let got = self.fill(&mut buf, entry)?;
        if got < n {
            return Err(at(
                self.file,
                self.off,
                entry,
                format!("truncated record: the {what} needs {n} bytes, the file ends after {got}"),
            ));
        }
        self.off += n as u64;
        Ok(buf)
    }

    fn take_u32(&mut self, what: &str, entry: u64) -> Result<u32, VerifyError> {
        let b = self.take(4, what, entry)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The next record, or `None` at a clean end of file.
    fn next(&mut self, entry: u64) -> Result<Option<Record>, VerifyError> {
        let start = self.off;
        let mut pcr = [0u8; 4];
        match self.fill(&mut pcr, entry)? {
            0 => return Ok(None),
            4 => self.off += 4,
            got => {
                return Err(at(
                    self.file,
                    start,
                    entry,
                    format!(
                        "truncated record: the PCR index needs 4 bytes, the file ends after {got}"
                    ),
                ))
            }
        }
        let pcr = u32::from_le_bytes(pcr);
        if pcr >= NUM_PCRS {
            return Err(at(
                self.file,
                start,
                entry,
                format!("PCR index {pcr} does not exist (0-{})", NUM_PCRS - 1),
            ));
        }
        let digest_at = self.off;
        let digest = self.take(self.bank.size(), "template digest", entry)?;
        let name_at = self.off;
        let name_len = self.take_u32("template name length", entry)? as usize;
        if name_len == 0 || name_len > MAX_NAME {
            return Err(at(
                self.file,
                name_at,
                entry,
                format!("template name length {name_len} is not 1-{MAX_NAME}"),
            ));
        }
        let name = self.take(name_len, "template name", entry)?;
        let len_at = self.off;
        let data_len = self.take_u32("template data length", entry)? as usize;
        if data_len > MAX_DATA {
            return Err(at(
                self.file,
                len_at,
                entry,
                format!("template data length {data_len} is implausible (more than {MAX_DATA})"),
            ));
        }
        let data_at = self.off;
        let data = self.take(data_len, "template data", entry)?;
        Ok(Some(Record {
            start,
            digest_at,
            data_at,
            pcr,
            digest,
            name,
            data,
        }))
    }
}

/// Checks template data field by field against its template; returns the path (without NUL).
fn check_fields<'d>(
    template: Template,
    data: &'d [u8],
    data_at: u64,
    file: &'static str,
    entry: u64,
) -> Result<&'d [u8], VerifyError> {
    let count = if template.has_sig() { 3 } else { 2 };
    let mut pos = 0usize;
    let mut path: &[u8] = &[];
    for i in 0..count {
        let field_at = data_at + pos as u64;
        let Some(len) = data.get(pos..pos + 4) else {
            return Err(at(
                file,
                field_at,
                entry,
                format!(
                    "template data ends after {i} of the {count} fields of {}",
                    template.name()
                ),
            ));
        };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let Some(field) = data.get(pos + 4..).and_then(|r| r.get(..len)) else {
            return Err(at(
                file,
                field_at,
                entry,
                format!(
                    "field length {len} runs past the template data ({} bytes left)",
                    data.len() - pos - 4
                ),
            ));
        };
        let body_at = field_at + 4;
        match i {
            0 => check_digest_field(template, field, body_at, file, entry)?,
            1 => path = check_path_field(field, body_at, file, entry)?,
            _ => {
                if field.len() > MAX_SIG {
                    return Err(at(
                        file,
                        body_at,
                        entry,
                        format!(
                            "signature of {} bytes is longer than {MAX_SIG}",
                            field.len()
                        ),
                    ));
                }
            }
        }
        pos += 4 + len;
    }
    if pos != data.len() {
        return Err(at(
            file,
            data_at + pos as u64,
            entry,
            format!(
                "{} bytes after the last field of {}",
                data.len() - pos,
                template.name()
            ),
        ));
    }
    Ok(path)
}

/// `d-ng` (`algo:` NUL digest) or `d-ngv2` (`ima:algo:` / `verity:algo:` NUL digest).
fn check_digest_field(
    template: Template,
    field: &[u8],
    at_: u64,
    file: &'static str,
    entry: u64,
) -> Result<(), VerifyError> {
    let kind = if template.is_v2() { "d-ngv2" } else { "d-ng" };
    let Some(nul) = field.iter().position(|&b| b == 0) else {
        return Err(at(
            file,
            at_,
            entry,
            format!("{kind} field has no NUL after its prefix"),
        ));
    };
    let prefix = &field[..nul];
    let Some(body) = prefix.strip_suffix(b":") else {
        return Err(at(
            file,
            at_,
            entry,
            format!("{kind} prefix `{}` does not end with ':'", show(prefix)),
        ));
    };
    let parts: Vec<&[u8]> = body.split(|&b| b == b':').collect();
    let (digest_type, algo) = match (template.is_v2(), parts.as_slice()) {
        (false, [algo]) => (None, *algo),
        (true, [t, algo]) => (Some(*t), *algo),
        _ => {
            let want = if template.is_v2() {
                "type:algo:"
            } else {
                "algo:"
            };
            return Err(at(
                file,
                at_,
                entry,
                format!("{kind} prefix `{}` is not `{want}`", show(prefix)),
            ));
        }
    };
    if let Some(t) = digest_type {
        if t != b"ima" && t != b"verity" {
            return Err(at(
                file,
                at_,
                entry,
                format!("digest type `{}` is neither ima nor verity", show(t)),
            ));
        }
        if t == b"verity" && algo != b"sha256" && algo != b"sha512" {
            return Err(at(
                file,
                at_,
                entry,
                format!(
                    "fs-verity digests are sha256 or sha512, not `{}`",
                    show(algo)
                ),
            ));
        }
    }
    let Some(&(name, size)) = HASH_ALGOS.iter().find(|(n, _)| n.as_bytes() == algo) else {
        return Err(at(
            file,
            at_,
            entry,
            format!("unknown hash algorithm `{}`", show(algo)),
        ));
    };
    let digest_len = field.len() - nul - 1;
    if digest_len != size {
        return Err(at(
            file,
            at_ + nul as u64 + 1,
            entry,
            format!("a {name} digest is {size} bytes, this one is {digest_len}"),
        ));
    }
    Ok(())
}

/// `n-ng`: the path and its NUL, spaces already turned into `_` by the kernel.
fn check_path_field<'d>(
    field: &'d [u8],
    at_: u64,
    file: &'static str,
    entry: u64,
) -> Result<&'d [u8], VerifyError> {
    let Some((&0, path)) = field.split_last() else {
        return Err(at(file, at_, entry, "n-ng field does not end with NUL"));
    };
    if let Some(i) = path.iter().position(|&b| b == 0) {
        return Err(at(
            file,
            at_ + i as u64,
            entry,
            "path has a NUL before its end",
        ));
    }
    if path.len() > MAX_PATH {
        return Err(at(
            file,
            at_,
            entry,
            format!("path of {} bytes is longer than {MAX_PATH}", path.len()),
        ));
    }
    if let Some(i) = path.iter().position(|&b| b == b' ') {
        return Err(at(
            file,
            at_ + i as u64,
            entry,
            "path contains a space (the kernel writes spaces as '_')",
        ));
    }
    Ok(path)
}

/// Compares an ascii list with the lines the binary entries render to.
struct AsciiReader {
    file: &'static str,
    r: BufReader<File>,
    off: u64,
}

impl AsciiReader {
    fn expect(&mut self, line: &[u8], entry: u64) -> Result<(), VerifyError> {
        let mut buf = vec![0; line.len()];
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(at(self.file, self.off, entry, format!("cannot read: {e}"))),
            }
        }
        if let Some(i) = (0..got).find(|&i| buf[i] != line[i]) {
            return Err(at(
                self.file,
                self.off + i as u64,
                entry,
                format!(
                    "differs from the binary list, whose entry renders as `{}`",
                    show(line.strip_suffix(b"\n").unwrap_or(line))
                ),
            ));
        }
        if got < line.len() {
            return Err(at(
                self.file,
                self.off + got as u64,
                entry,
                "the file ends inside the entry's line",
            ));
        }
        self.off += line.len() as u64;
        Ok(())
    }

    fn finish(&mut self, entries: u64) -> Result<(), VerifyError> {
        let mut b = [0u8; 1];
        match self.r.read(&mut b) {
            Ok(0) => Ok(()),
            Ok(_) => Err(at(
                self.file,
                self.off,
                entries + 1,
                format!("data after the line of the last entry ({entries})"),
            )),
            Err(e) => Err(at(
                self.file,
                self.off,
                entries + 1,
                format!("cannot read: {e}"),
            )),
        }
    }
}

/// How many (bank, PCR) pairs of the replay differ from the files.
struct Compare {
    want1: Vec<(Vec<u8>, u64)>,
    want2: Vec<(Vec<u8>, u64)>,
    differing: usize,
}

impl Compare {
    fn differs(&self, pcrs: &Pcrs, i: u32) -> usize {
        let i_ = i as usize;
        usize::from(pcrs.sha1[i_][..] != self.want1[i_].0[..])
            + usize::from(pcrs.sha256[i_][..] != self.want2[i_].0[..])
    }
}

/// Parses, checks and replays the list in DIR; the body of [`verify`] and of `Log::open`.
pub(crate) fn replay(dir: &Path, keep_keys: bool) -> Result<Replay, VerifyError> {
    let mut cmp = Compare {
        want1: read_pcr_file(dir, PCRS_SHA1, Bank::Sha1)?,
        want2: read_pcr_file(dir, PCRS_SHA256, Bank::Sha256)?,
        differing: 0,
    };
    let mut pcrs = Pcrs::zero();
    cmp.differing = (0..NUM_PCRS).map(|i| cmp.differs(&pcrs, i)).sum();
    let mut bin1 = ListReader::open(dir, BINARY_SHA1, Bank::Sha1)?;
    let mut bin2 = ListReader::open(dir, BINARY_SHA256, Bank::Sha256)?;
    let mut asc1 = AsciiReader {
        file: ASCII_SHA1,
        r: BufReader::new(open(dir, ASCII_SHA1)?),
        off: 0,
    };
    let mut asc2 = AsciiReader {
        file: ASCII_SHA256,
        r: BufReader::new(open(dir, ASCII_SHA256)?),
        off: 0,
    };
    let mut keys = Vec::new();
    // The last entry after which the replay equalled the PCR files, and where the next begins.
    let mut matched: Option<(u64, u64)> = None;
    let mut n = 0u64;
    loop {
        let k = n + 1;
        let Some(r1) = bin1.next(k)? else { break };
        let Some(template) = template_by_name(&r1.name) else {
            return Err(at(
                BINARY_SHA1,
                r1.start + 4 + 20 + 4,
                k,
                format!(
                    "template `{}` is not one verilay writes (ima-ng, ima-ngv2, ima-sig, ima-sigv2)",
                    show(&r1.name)
                ),
            ));
        };
        let sha1: [u8; 20] = Sha1::digest(&r1.data).into();
        if r1.digest[..] != sha1[..] {
            return Err(at(
                BINARY_SHA1,
                r1.digest_at,
                k,
                "template digest does not match its data",
            ));
        }
        let path = check_fields(template, &r1.data, r1.data_at, BINARY_SHA1, k)?;
        if k == 1 && path != b"boot_aggregate" {
            return Err(at(
                BINARY_SHA1,
                r1.data_at,
                k,
                format!("the first entry is `{}`, not boot_aggregate", show(path)),
            ));
        }
        let Some(r2) = bin2.next(k)? else {
            return Err(at(
                BINARY_SHA256,
                bin2.off,
                k,
                format!("the list ends after {n} entries, {BINARY_SHA1} holds more"),
            ));
        };
        if (r2.pcr, &r2.name, &r2.data) != (r1.pcr, &r1.name, &r1.data) {
            return Err(at(
                BINARY_SHA256,
                r2.start,
                k,
                format!("the entry is not the one in {BINARY_SHA1} (PCR, template or data differ)"),
            ));
        }
        let sha256: [u8; 32] = Sha256::digest(&r2.data).into();
        if r2.digest[..] != sha256[..] {
            return Err(at(
                BINARY_SHA256,
                r2.digest_at,
                k,
                "template digest does not match its data",
            ));
        }
        let entry = Entry {
            pcr: r1.pcr,
            template_name: template.name().into(),
            data: r1.data,
            sha1,
            sha256,
        };
        asc1.expect(&entry.ascii_bytes(Bank::Sha1), k)?;
        asc2.expect(&entry.ascii_bytes(Bank::Sha256), k)?;
        cmp.differing -= cmp.differs(&pcrs, entry.pcr);
        pcrs.extend(entry.pcr, &sha1, &sha256);
        cmp.differing += cmp.differs(&pcrs, entry.pcr);
        if cmp.differing == 0 {
            matched = Some((k, bin1.off));
        }
        if keep_keys {
            keys.push((entry.pcr, sha256));
        }
        n = k;
    }
    if let Some(r2) = bin2.next(n + 1)? {
        return Err(at(
            BINARY_SHA256,
            r2.start,
            n + 1,
            format!("the list holds more entries than the {n} of {BINARY_SHA1}"),
        ));
    }
    asc1.finish(n)?;
    asc2.finish(n)?;
    if n == 0 {
        return Err(at(
            BINARY_SHA1,
            0,
            1,
            "the list is empty; every list starts with boot_aggregate",
        ));
    }
    if cmp.differing != 0 {
        if let Some((k, next_at)) = matched {
            // evmctl would stop at entry k and accept; the rest is unverified.
            let which = if n - k == 1 {
                format!("entry {n} is")
            } else {
                format!("entries {}-{n} are", k + 1)
            };
            return Err(at(
                BINARY_SHA1,
                next_at,
                k + 1,
                format!(
                    "{which} not covered: the PCR files match the replay after entry {k}, so only {k} of the {n} entries are verified"
                ),
            ));
        }
        for (bank, file, want) in [
            (Bank::Sha1, PCRS_SHA1, &cmp.want1),
            (Bank::Sha256, PCRS_SHA256, &cmp.want2),
        ] {
            for i in 0..NUM_PCRS {
                let got = pcrs.get(bank, i).unwrap_or(&[]);
                let (value, value_at) = &want[i as usize];
                if got != &value[..] {
                    return Err(VerifyError {
                        file,
                        offset: Some(*value_at),
                        entry: None,
                        pcr: Some(i),
                        message: format!(
                            "replaying all {n} entries gives {}, the file has {}",
                            to_hex(got),
                            to_hex(value)
                        ),
                    });
                }
            }
        }
    }
    let count = read_small(dir, COUNT)?;
    if count != format!("{n}\n").as_bytes() {
        return Err(VerifyError {
            file: COUNT,
            offset: Some(0),
            entry: None,
            pcr: None,
            message: format!(
                "says `{}`, the list holds {n} entries",
                show(count.strip_suffix(b"\n").unwrap_or(&count))
            ),
        });
    }
    Ok(Replay {
        entries: n,
        pcrs,
        keys,
    })
}
