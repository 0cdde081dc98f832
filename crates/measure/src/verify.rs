//! Replays a list written by [`crate::log`] and checks every byte (docs/FORMAT.md, "Measurement
//! lists"): binary and ascii lists, template digests, both PCR banks.
//!
//! - Stricter than `evmctl ima_measurement`: the PCRs must match after the last entry.
//! - Input is hostile: lengths capped before allocating, files opened through [`crate::files`].
//! - Violations are reported, as is the list's [`State`].

use crate::files::{self, How, OpenError};
use crate::format::{
    template_by_name, to_hex, Bank, Entry, Pcrs, ASCII_SHA1, ASCII_SHA256, BINARY_SHA1,
    BINARY_SHA256, COUNT, IN_USE, LOCK, MAX_PATH, MAX_SIG, NUM_PCRS, PCRS_SHA1, PCRS_SHA256,
};
use crate::policy::Template;
use rustix::fd::BorrowedFd;
use sha1::{Digest, Sha1};
use sha2::Sha256;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::fd::AsFd;
use std::path::Path;

/// What a verified list holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Entries in the list, boot_aggregate and violations included.
    pub entries: u64,
    /// (index, sha1 value, sha256 value) of every PCR the list extended (the non-zero ones).
    pub pcrs: Vec<(u32, Vec<u8>, Vec<u8>)>,
    /// The violation entries, in list order: events may be missing at each.
    pub violations: Vec<Violation>,
    /// Whether a mount has the list open, and whether the last one closed it.
    pub state: State,
}

/// A violation entry: the kernel's mark that a measurement could not be trusted or made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Its place in the list, 1-based.
    pub entry: u64,
    /// The PCR it was extended into.
    pub pcr: u32,
    /// The entry's name field (verilay's: [`crate::format::UNCLEAN_SHUTDOWN`]).
    pub name: String,
}

/// Whether a mount has the list open, and whether the last one closed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// No mount has it open, and the last one closed it cleanly.
    Closed,
    /// A mount holds it open (its lock): entries may still come, and a batch being
    /// written can make the files disagree for a moment.
    Open {
        /// Who holds it, as its lock file says.
        holder: String,
    },
    /// Its in-use marker is there but no mount holds it: the mount writing it ended
    /// without closing it (killed, crashed, power lost), and events it measured after the
    /// list's last entry may be missing. A mount continuing the list records the gap.
    Unclean {
        /// Who had it, as its in-use marker says.
        holder: String,
    },
}

/// The first problem found, located: `FILE: offset N (entry K): what is wrong`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}{}", place(file, *offset, *entry, *pcr), note.as_ref().map(|n| format!("; {n}")).unwrap_or_default())]
pub struct VerifyError {
    /// The file's name inside the list directory.
    pub file: &'static str,
    /// Byte offset of the offending field or line, when there is one.
    pub offset: Option<u64>,
    /// The 1-based entry the problem is in.
    pub entry: Option<u64>,
    /// The PCR line the problem is on (PCR files).
    pub pcr: Option<u32>,
    /// What is wrong.
    pub message: String,
    /// What the list's state adds (it was not closed cleanly), if anything.
    pub note: Option<String>,
    /// A read failed (as opposed to bytes that are wrong): never a torn tail to drop.
    pub(crate) io: bool,
}

/// Where a problem is, before its message: `FILE: offset N (entry K): `, or nothing for
/// the directory itself (an empty name).
fn place(file: &str, offset: Option<u64>, entry: Option<u64>, pcr: Option<u32>) -> String {
    if file.is_empty() {
        return String::new();
    }
    let mut out = file.to_string();
    if let Some(o) = offset {
        out += &format!(": offset {o}");
    }
    if let Some(e) = entry {
        out += &format!(" (entry {e})");
    } else if let Some(p) = pcr {
        out += &format!(" (PCR-{p:02})");
    }
    out + ": "
}

fn at(file: &'static str, offset: u64, entry: u64, message: impl Into<String>) -> VerifyError {
    VerifyError {
        file,
        offset: Some(offset),
        entry: Some(entry),
        pcr: None,
        message: message.into(),
        note: None,
        io: false,
    }
}

/// A problem with a whole file (no offset).
fn whole(file: &'static str, message: impl Into<String>) -> VerifyError {
    VerifyError {
        file,
        offset: None,
        entry: None,
        pcr: None,
        message: message.into(),
        note: None,
        io: false,
    }
}

/// A read that failed at `offset`.
fn read_failed(file: &'static str, offset: u64, entry: u64, e: std::io::Error) -> VerifyError {
    VerifyError {
        io: true,
        ..at(file, offset, entry, format!("cannot read: {e}"))
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

/// Replays the whole list in DIR and checks it; see the module documentation. The list's
/// state is part of the report; a list that is not [`State::Closed`] still verifies (it
/// is for the caller to say what that means), but a problem found in the files of a list
/// that was not closed cleanly says so.
pub fn verify(dir: &Path) -> Result<Report, VerifyError> {
    let dirfd = files::open_dir(dir, false, false)
        .map_err(|e| whole("", format!("cannot open the directory: {e}")))?;
    // Held (shared) while the files are read, if no mount holds the list: none can start
    // writing to it meanwhile.
    let (state, _lock) = list_state(dirfd.as_fd())?;
    let r = replay(dirfd.as_fd(), Mode::Strict, false, false).map_err(|mut e| {
        if let State::Unclean { holder } = &state {
            e.note = Some(format!(
                "the list was not closed cleanly ({holder}); a mount continuing it keeps what is consistent and records the gap"
            ));
        }
        e
    })?;
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
        violations: r.violations,
        state,
    })
}

/// Most bytes of a lock or marker file read (they hold a line or two).
pub(crate) const MAX_NOTE: u64 = 4096;

/// The list's state: a lock held by a mount, else the in-use marker. With no mount
/// holding it, the lock file comes back holding a shared lock, for the caller to keep
/// while it reads the list.
fn list_state(dir: BorrowedFd<'_>) -> Result<(State, Option<File>), VerifyError> {
    let lock = match files::open_in(dir, LOCK, How::Read, false) {
        Ok(f) => Some(f),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(open_error(LOCK, e)),
    };
    if let Some(f) = &lock {
        let free = host::lockfile::try_lock(f.as_fd(), host::lockfile::Kind::Ofd, false)
            .map_err(|e| whole(LOCK, format!("cannot lock: {e}")))?;
        if !free {
            return Ok((
                State::Open {
                    holder: read_note(f, LOCK)?,
                },
                None,
            ));
        }
    }
    let state = match files::open_in(dir, IN_USE, How::Read, false) {
        Ok(f) => State::Unclean {
            holder: read_note(&f, IN_USE)?,
        },
        Err(e) if e.is_not_found() => State::Closed,
        Err(e) => return Err(open_error(IN_USE, e)),
    };
    Ok((state, lock))
}

/// The first line of a lock or marker file, for a message.
pub(crate) fn read_note(f: &File, file: &'static str) -> Result<String, VerifyError> {
    let buf = host::lockfile::read_record(f, MAX_NOTE).map_err(|e| read_failed(file, 0, 0, e))?;
    let first = buf.split(|&b| b == b'\n').next().unwrap_or(&[]);
    Ok(match files::show_text(first) {
        s if s.is_empty() => "no holder recorded".into(),
        s => s,
    })
}

/// How a replay treats a problem in the list files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every problem is an error.
    Strict,
    /// The list was not closed cleanly: its files may end in a torn batch. The entries
    /// all four list files agree on are kept; whatever follows them (in any file) is the
    /// tail to drop, provided both PCR files match the replay after one of the kept
    /// entries (so they attest nothing that is dropped) and the count claims no more.
    /// Problems elsewhere, and read errors, are still errors.
    Recover,
}

/// A list's state as replayed, as [`crate::log::Log::open`] continues from it.
pub(crate) struct Replay {
    pub entries: u64,
    pub pcrs: Pcrs,
    /// (PCR, SHA-256 template digest) per entry but violations.
    pub keys: Vec<(u32, [u8; 32])>,
    pub violations: Vec<Violation>,
    /// Bit i set: some entry extended PCR i.
    pub pcrs_used: u32,
    /// Where the kept entries end in each list file, and how long the file is (`LISTS`
    /// order: sha1 binary, sha1 ascii, sha256 binary, sha256 ascii).
    pub ends: [(u64, u64); 4],
    /// Recover mode: the first problem past the kept entries, if any.
    pub torn: Option<VerifyError>,
}

fn open_error(file: &'static str, e: OpenError) -> VerifyError {
    match e {
        OpenError::Io(e) => VerifyError {
            io: true,
            ..whole(file, format!("cannot open: {e}"))
        },
        OpenError::Refused(why) => whole(file, why),
    }
}

/// Opens a file of the list directory to read it: a regular file, not through a symlink;
/// with `private`, one that no one else can write.
fn open(dir: BorrowedFd<'_>, file: &'static str, private: bool) -> Result<File, VerifyError> {
    files::open_in(dir, file, How::Read, private).map_err(|e| open_error(file, e))
}

/// Reads a small file of the list directory, refusing one too large to be what it claims.
fn read_small(
    dir: BorrowedFd<'_>,
    file: &'static str,
    private: bool,
) -> Result<Vec<u8>, VerifyError> {
    let mut f = open(dir, file, private)?;
    match files::read_capped(&mut f, MAX_SMALL_FILE) {
        Ok(Ok(buf)) => Ok(buf),
        Ok(Err(size)) => Err(VerifyError {
            offset: Some(MAX_SMALL_FILE),
            ..whole(
                file,
                format!("{size} bytes, longer than the {MAX_SMALL_FILE} such a file can be"),
            )
        }),
        Err(e) => Err(read_failed(file, 0, 0, e)),
    }
}

/// A PCR file's 24 values and the offset of each value's hex, parsed strictly: exactly
/// the lines `PCR-NN: <hex>\n` that [`crate::log::Log`] writes, in order.
fn read_pcr_file(
    dir: BorrowedFd<'_>,
    file: &'static str,
    bank: Bank,
    private: bool,
) -> Result<Vec<(Vec<u8>, u64)>, VerifyError> {
    let text = read_small(dir, file, private)?;
    let err = |offset: usize, pcr: u32, message: String| VerifyError {
        offset: Some(offset as u64),
        pcr: Some(pcr),
        ..whole(file, message)
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
        match crate::format::from_hex(hex) {
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
            offset: Some(pos as u64),
            ..whole(file, "data after the PCR-23 line")
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
    fn open(
        dir: BorrowedFd<'_>,
        file: &'static str,
        bank: Bank,
        private: bool,
    ) -> Result<ListReader, VerifyError> {
        Ok(ListReader {
            file,
            r: BufReader::new(open(dir, file, private)?),
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
                Err(e) => return Err(read_failed(self.file, self.off + got as u64, entry, e)),
            }
        }
        Ok(got)
    }

    /// Exactly N bytes of the field WHAT, or a truncation error at the field's offset.
    /// N is a checked length: at most `MAX_DATA`.
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

/// Checks template data field by field against its template; returns the file digest
/// (the digest field's bytes after its prefix) and the path (without NUL).
fn check_fields<'d>(
    template: Template,
    data: &'d [u8],
    data_at: u64,
    file: &'static str,
    entry: u64,
) -> Result<(&'d [u8], &'d [u8]), VerifyError> {
    let count = if template.has_sig() { 3 } else { 2 };
    let mut pos = 0usize;
    let mut path: &[u8] = &[];
    let mut digest: &[u8] = &[];
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
            0 => {
                check_digest_field(template, field, body_at, file, entry)?;
                let nul = field.iter().position(|&b| b == 0).unwrap_or(field.len());
                digest = field.get(nul + 1..).unwrap_or(&[]);
            }
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
    Ok((digest, path))
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
    fn open(
        dir: BorrowedFd<'_>,
        file: &'static str,
        private: bool,
    ) -> Result<AsciiReader, VerifyError> {
        Ok(AsciiReader {
            file,
            r: BufReader::new(open(dir, file, private)?),
            off: 0,
        })
    }

    /// LINE is rendered from a checked entry, so its length is bounded.
    fn expect(&mut self, line: &[u8], entry: u64) -> Result<(), VerifyError> {
        let mut buf = vec![0; line.len()];
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(read_failed(self.file, self.off, entry, e)),
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
            Err(e) => Err(read_failed(self.file, self.off, entries + 1, e)),
        }
    }
}

/// How many PCRs of a bank the replay has that differ from its PCR file.
struct BankCompare {
    want: Vec<(Vec<u8>, u64)>,
    differing: usize,
    /// Whether the replay has equalled the file after some entry (or before the first).
    matched: bool,
}

impl BankCompare {
    fn new(want: Vec<(Vec<u8>, u64)>, bank: Bank, pcrs: &Pcrs) -> BankCompare {
        let mut c = BankCompare {
            want,
            differing: 0,
            matched: false,
        };
        c.differing = (0..NUM_PCRS).map(|i| c.differs(bank, pcrs, i)).sum();
        c.matched = c.differing == 0;
        c
    }

    fn differs(&self, bank: Bank, pcrs: &Pcrs, i: u32) -> usize {
        let got = pcrs.get(bank, i).unwrap_or(&[]);
        usize::from(got != &self.want[i as usize].0[..])
    }
}

/// The two banks' comparisons, updated one extension at a time.
struct Compare {
    banks: [(Bank, BankCompare); 2],
}

impl Compare {
    fn extend(&mut self, pcrs: &mut Pcrs, entry: &Entry) {
        for (bank, c) in &mut self.banks {
            c.differing -= c.differs(*bank, pcrs, entry.pcr);
        }
        entry.extend(pcrs);
        for (bank, c) in &mut self.banks {
            c.differing += c.differs(*bank, pcrs, entry.pcr);
            c.matched |= c.differing == 0;
        }
    }

    fn all_equal(&self) -> bool {
        self.banks.iter().all(|(_, c)| c.differing == 0)
    }
}

/// Parses, checks and replays the list in DIR; the body of [`verify`] and of `Log::open`.
/// With `private`, every file must be one no one else can write.
pub(crate) fn replay(
    dir: BorrowedFd<'_>,
    mode: Mode,
    private: bool,
    keep_keys: bool,
) -> Result<Replay, VerifyError> {
    let mut pcrs = Pcrs::zero();
    let mut cmp = Compare {
        banks: [
            (
                Bank::Sha1,
                BankCompare::new(
                    read_pcr_file(dir, PCRS_SHA1, Bank::Sha1, private)?,
                    Bank::Sha1,
                    &pcrs,
                ),
            ),
            (
                Bank::Sha256,
                BankCompare::new(
                    read_pcr_file(dir, PCRS_SHA256, Bank::Sha256, private)?,
                    Bank::Sha256,
                    &pcrs,
                ),
            ),
        ],
    };
    let mut bin1 = ListReader::open(dir, BINARY_SHA1, Bank::Sha1, private)?;
    let mut asc1 = AsciiReader::open(dir, ASCII_SHA1, private)?;
    let mut bin2 = ListReader::open(dir, BINARY_SHA256, Bank::Sha256, private)?;
    let mut asc2 = AsciiReader::open(dir, ASCII_SHA256, private)?;
    let mut keys = Vec::new();
    let mut violations = Vec::new();
    let mut pcrs_used = 0u32;
    // The last entry after which the replay equalled the PCR files, and where the next begins.
    let mut matched: Option<(u64, u64)> = None;
    let mut n = 0u64;
    let mut torn = None;
    let mut ends;
    loop {
        ends = [bin1.off, asc1.off, bin2.off, asc2.off];
        let k = n + 1;
        let entry = match next_entry(k, &mut bin1, &mut bin2, &mut asc1, &mut asc2) {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) if mode == Mode::Recover && !e.io => {
                torn = Some(e);
                break;
            }
            Err(e) => return Err(e),
        };
        cmp.extend(&mut pcrs, &entry);
        if cmp.all_equal() {
            matched = Some((k, bin1.off));
        }
        pcrs_used |= 1 << entry.pcr;
        if entry.is_violation() {
            violations.push(Violation {
                entry: k,
                pcr: entry.pcr,
                name: String::from_utf8_lossy(entry.name_field()).into_owned(),
            });
        } else if keep_keys {
            keys.push((entry.pcr, entry.sha256));
        }
        n = k;
    }
    let mut rest = || -> Result<(), VerifyError> {
        if let Some(r2) = bin2.next(n + 1)? {
            return Err(at(
                BINARY_SHA256,
                r2.start,
                n + 1,
                format!("the list holds more entries than the {n} of {BINARY_SHA1}"),
            ));
        }
        asc1.finish(n)?;
        asc2.finish(n)
    };
    match mode {
        Mode::Strict => rest()?,
        Mode::Recover => {
            if torn.is_none() {
                match rest() {
                    Ok(()) => {}
                    Err(e) if !e.io => torn = Some(e),
                    Err(e) => return Err(e),
                }
            }
            // Even with no torn tail, the count and PCR files may lag the lists.
            return recovered(
                dir, n, pcrs, keys, violations, pcrs_used, ends, torn, &cmp, private,
            );
        }
    }
    if n == 0 {
        return Err(at(
            BINARY_SHA1,
            0,
            1,
            "the list is empty; every list starts with boot_aggregate",
        ));
    }
    if !cmp.all_equal() {
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
        return Err(pcr_mismatch(&cmp, &pcrs, n));
    }
    check_count(dir, n, private, false)?;
    Ok(Replay {
        entries: n,
        pcrs,
        keys,
        violations,
        pcrs_used,
        ends: [
            (ends[0], ends[0]),
            (ends[1], ends[1]),
            (ends[2], ends[2]),
            (ends[3], ends[3]),
        ],
        torn: None,
    })
}

/// The first PCR whose file value differs from the replay of all `n` entries.
fn pcr_mismatch(cmp: &Compare, pcrs: &Pcrs, n: u64) -> VerifyError {
    let file = |bank| {
        if bank == Bank::Sha1 {
            PCRS_SHA1
        } else {
            PCRS_SHA256
        }
    };
    for (bank, c) in &cmp.banks {
        for i in 0..NUM_PCRS {
            let got = pcrs.get(*bank, i).unwrap_or(&[]);
            let (value, value_at) = &c.want[i as usize];
            if got != &value[..] {
                return VerifyError {
                    offset: Some(*value_at),
                    pcr: Some(i),
                    ..whole(
                        file(*bank),
                        format!(
                            "replaying all {n} entries gives {}, the file has {}",
                            to_hex(got),
                            to_hex(value)
                        ),
                    )
                };
            }
        }
    }
    whole(PCRS_SHA1, "the PCR files do not match the replay")
}

/// The count file must say `n` (or, with `at_most`, a number no larger: a batch's count
/// is written after its entries).
fn check_count(
    dir: BorrowedFd<'_>,
    n: u64,
    private: bool,
    at_most: bool,
) -> Result<(), VerifyError> {
    let count = read_small(dir, COUNT, private)?;
    let text = count.strip_suffix(b"\n").unwrap_or(&count);
    let said = std::str::from_utf8(text)
        .ok()
        .filter(|t| {
            !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) && count.ends_with(b"\n")
        })
        .and_then(|t| t.parse::<u64>().ok());
    let fine = match said {
        Some(c) if at_most => c <= n,
        Some(c) => c == n,
        None => false,
    };
    if fine {
        return Ok(());
    }
    Err(VerifyError {
        offset: Some(0),
        ..whole(
            COUNT,
            if at_most {
                format!(
                    "says `{}`, more than the {n} entries the list files agree on",
                    show(text)
                )
            } else {
                format!("says `{}`, the list holds {n} entries", show(text))
            },
        )
    })
}

/// Recover mode, once the list files disagree past entry `n`: the state to continue from,
/// if the PCR and count files attest nothing past it.
#[allow(clippy::too_many_arguments)]
fn recovered(
    dir: BorrowedFd<'_>,
    n: u64,
    pcrs: Pcrs,
    keys: Vec<(u32, [u8; 32])>,
    violations: Vec<Violation>,
    pcrs_used: u32,
    ends: [u64; 4],
    torn: Option<VerifyError>,
    cmp: &Compare,
    private: bool,
) -> Result<Replay, VerifyError> {
    let problem = torn.as_ref().map(ToString::to_string).unwrap_or_default();
    for (bank, c) in &cmp.banks {
        if !c.matched {
            let file = if *bank == Bank::Sha1 {
                PCRS_SHA1
            } else {
                PCRS_SHA256
            };
            return Err(whole(
                file,
                format!(
                    "matches the replay after none of the {n} entries the list files agree on, so the list cannot be recovered to them (past them: {problem})"
                ),
            ));
        }
    }
    check_count(dir, n, private, true)?;
    let mut lens = [0u64; 4];
    for (i, file) in [BINARY_SHA1, ASCII_SHA1, BINARY_SHA256, ASCII_SHA256]
        .into_iter()
        .enumerate()
    {
        let f = open(dir, file, private)?;
        lens[i] = f
            .metadata()
            .map_err(|e| read_failed(file, 0, n + 1, e))?
            .len();
    }
    Ok(Replay {
        entries: n,
        pcrs,
        keys,
        violations,
        pcrs_used,
        ends: [
            (ends[0], lens[0]),
            (ends[1], lens[1]),
            (ends[2], lens[2]),
            (ends[3], lens[3]),
        ],
        torn,
    })
}

/// Reads entry `k` from all four list files and checks that they agree on it; `None`
/// when the SHA-1 binary list ends cleanly before it.
fn next_entry(
    k: u64,
    bin1: &mut ListReader,
    bin2: &mut ListReader,
    asc1: &mut AsciiReader,
    asc2: &mut AsciiReader,
) -> Result<Option<Entry>, VerifyError> {
    let Some(r1) = bin1.next(k)? else {
        return Ok(None);
    };
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
    // ima_add_violation: the template digest is left zero (and the PCR extended with 0xff).
    let violation = r1.digest.iter().all(|&b| b == 0);
    let sha1: [u8; 20] = if violation {
        [0; 20]
    } else {
        Sha1::digest(&r1.data).into()
    };
    if r1.digest[..] != sha1[..] {
        return Err(at(
            BINARY_SHA1,
            r1.digest_at,
            k,
            "template digest does not match its data",
        ));
    }
    let (file_digest, path) = check_fields(template, &r1.data, r1.data_at, BINARY_SHA1, k)?;
    if k == 1 && (violation || path != b"boot_aggregate") {
        return Err(at(
            BINARY_SHA1,
            r1.data_at,
            k,
            format!(
                "the first entry is {}`{}`, not boot_aggregate",
                if violation { "a violation, " } else { "" },
                show(path)
            ),
        ));
    }
    if violation && file_digest.iter().any(|&b| b != 0) {
        // The kernel leaves a violation's file digest zero too.
        return Err(at(
            BINARY_SHA1,
            r1.data_at + 4,
            k,
            "a violation entry (zero template digest) with a file digest that is not zero",
        ));
    }
    let Some(r2) = bin2.next(k)? else {
        return Err(at(
            BINARY_SHA256,
            bin2.off,
            k,
            format!(
                "the list ends after {} entries, {BINARY_SHA1} holds more",
                k - 1
            ),
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
    let sha256: [u8; 32] = if violation {
        [0; 32]
    } else {
        Sha256::digest(&r2.data).into()
    };
    if r2.digest[..] != sha256[..] {
        return Err(at(
            BINARY_SHA256,
            r2.digest_at,
            k,
            if violation {
                "template digest of a violation (zero in the SHA-1 list) is not zero"
            } else {
                "template digest does not match its data"
            },
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
    Ok(Some(entry))
}
