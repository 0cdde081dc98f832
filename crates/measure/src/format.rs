//! The measurement list's format, shared by the writer (`log`) and the verifier
//! (`verify`): the files a list directory holds, the banks and their PCRs, template
//! entries and their binary and ASCII records, the hashes of file contents. The layout as a
//! whole is in docs/FORMAT.md, "Measurement lists".

use crate::policy::Template;
use sha1::{Digest, Sha1};
use sha2::{Sha256, Sha512};
use std::borrow::Cow;

/// PCRs in a bank (TPM 2.0 PC client).
pub const NUM_PCRS: u32 = 24;
/// The PCR IMA extends by default (CONFIG_IMA_MEASURE_PCR_IDX).
pub const DEFAULT_PCR: u32 = 10;
/// Longest path accepted in an event. The kernel's `d_absolute_path` into a PATH_MAX buffer
/// caps real paths at 4095 bytes plus NUL; anything much longer is a caller's bug.
pub const MAX_PATH: usize = 4096;
/// Longest signature accepted: an xattr value is at most XATTR_SIZE_MAX bytes.
pub const MAX_SIG: usize = 65536;

/// The binary list with SHA-1 template digests.
pub const BINARY_SHA1: &str = "binary_runtime_measurements";
/// The ASCII list with SHA-1 template digests.
pub const ASCII_SHA1: &str = "ascii_runtime_measurements";
/// The binary list with SHA-256 template digests.
pub const BINARY_SHA256: &str = "binary_runtime_measurements_sha256";
/// The ASCII list with SHA-256 template digests.
pub const ASCII_SHA256: &str = "ascii_runtime_measurements_sha256";
/// The number of entries (`"%li\n"`).
pub const COUNT: &str = "runtime_measurements_count";
/// The SHA-1 PCR bank, as evmctl's `--pcrs` reads it.
pub const PCRS_SHA1: &str = "pcrs_sha1";
/// The SHA-256 PCR bank, as evmctl's `--pcrs` reads it.
pub const PCRS_SHA256: &str = "pcrs_sha256";
/// Locked (OFD, exclusive) by the one writer of the list; holds who that is.
pub const LOCK: &str = "verilay.lock";
/// There while a writer has the list open; removed by a clean close.
pub const IN_USE: &str = "verilay.in-use";
/// The name of the violation entry that marks a gap left by a writer that died.
pub const UNCLEAN_SHUTDOWN: &str = "verilay:unclean-shutdown";
/// The seven files of a list that hold its entries, count and PCRs (not the lock and the
/// in-use marker), in the order the `measure_list` fuzz target reads them from its input.
pub const LIST_FILES: [&str; 7] = [
    BINARY_SHA1,
    BINARY_SHA256,
    ASCII_SHA1,
    ASCII_SHA256,
    COUNT,
    PCRS_SHA1,
    PCRS_SHA256,
];

/// The templates verilay writes, for lookups by name.
pub(crate) const TEMPLATES: [Template; 4] = [
    Template::ImaNg,
    Template::ImaNgV2,
    Template::ImaSig,
    Template::ImaSigV2,
];

pub(crate) fn template_by_name(name: &[u8]) -> Option<Template> {
    TEMPLATES.into_iter().find(|t| t.name().as_bytes() == name)
}

/// File-content hash algorithms verilay can measure with (names as the kernel's hash_algo_name[]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashAlgo {
    /// SHA-1.
    Sha1,
    /// SHA-256.
    Sha256,
    /// SHA-512.
    Sha512,
}

impl HashAlgo {
    /// The kernel's name for it (`sha256`).
    pub fn name(self) -> &'static str {
        match self {
            HashAlgo::Sha1 => "sha1",
            HashAlgo::Sha256 => "sha256",
            HashAlgo::Sha512 => "sha512",
        }
    }

    /// Its digest's size, in bytes.
    pub fn size(self) -> usize {
        match self {
            HashAlgo::Sha1 => 20,
            HashAlgo::Sha256 => 32,
            HashAlgo::Sha512 => 64,
        }
    }

    /// The algorithm the kernel calls `s`.
    pub fn from_name(s: &str) -> Option<HashAlgo> {
        [HashAlgo::Sha1, HashAlgo::Sha256, HashAlgo::Sha512]
            .into_iter()
            .find(|a| a.name() == s)
    }

    /// A hasher of file contents with it.
    pub fn hasher(self) -> FileHasher {
        FileHasher(match self {
            HashAlgo::Sha1 => Hasher::Sha1(Sha1::new()),
            HashAlgo::Sha256 => Hasher::Sha256(Sha256::new()),
            HashAlgo::Sha512 => Hasher::Sha512(Sha512::new()),
        })
    }
}

/// Incremental hasher for file contents (update/finish), so callers can hash while they read.
pub struct FileHasher(Hasher);

enum Hasher {
    Sha1(Sha1),
    Sha256(Sha256),
    Sha512(Sha512),
}

impl FileHasher {
    /// Hashes `data`, after what was hashed before.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.0 {
            Hasher::Sha1(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
        }
    }

    /// The digest of everything hashed.
    pub fn finish(self) -> Vec<u8> {
        match self.0 {
            Hasher::Sha1(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Sha512(h) => h.finalize().to_vec(),
        }
    }
}

/// What a `d-ngv2` digest is: the file's content hash, or its fs-verity file digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestKind {
    /// A hash of the file's contents (`ima:`).
    Ima,
    /// The file's fs-verity digest (`verity:`).
    Verity,
}

impl DigestKind {
    /// The prefix `d-ngv2` writes (`digest_type_name[]` in ima_template_lib.c).
    pub fn name(self) -> &'static str {
        match self {
            DigestKind::Ima => "ima",
            DigestKind::Verity => "verity",
        }
    }
}

/// One measurement event.
///
/// `sig` is the file's `security.ima` signature (type 3 or 6), recorded only by templates
/// with a `sig` field and ignored by the others; `kind` is written only by the v2 templates.
#[derive(Clone, Copy, Debug)]
pub struct Event<'a> {
    /// The template the entry is made with.
    pub template: Template,
    /// What `digest` is.
    pub kind: DigestKind,
    /// The algorithm of `digest`.
    pub algo: HashAlgo,
    /// The file's digest.
    pub digest: &'a [u8],
    /// The file's path, as the entry names it.
    pub path: &'a [u8],
    /// The file's `security.ima` signature, if it has one.
    pub sig: Option<&'a [u8]>,
}

impl Event<'_> {
    /// Why the event cannot be logged as the kernel would log it, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.digest.len() != self.algo.size() {
            return Err(format!(
                "a {} digest is {} bytes, not {}",
                self.algo.name(),
                self.algo.size(),
                self.digest.len()
            ));
        }
        if self.kind == DigestKind::Verity {
            if !self.template.is_v2() {
                // d-ng has no digest type: a verity digest would pass for a file hash.
                return Err(format!(
                    "an fs-verity digest needs a v2 template (ima-ngv2, ima-sigv2), not {}",
                    self.template.name()
                ));
            }
            if self.algo == HashAlgo::Sha1 {
                return Err("fs-verity digests are sha256 or sha512, not sha1".into());
            }
        }
        if self.path.len() > MAX_PATH {
            return Err(format!(
                "path of {} bytes is longer than {MAX_PATH}",
                self.path.len()
            ));
        }
        if self.path.contains(&0) {
            return Err("path contains a NUL byte".into());
        }
        if let Some(sig) = self.sig {
            if sig.len() > MAX_SIG {
                return Err(format!(
                    "signature of {} bytes is longer than {MAX_SIG}",
                    sig.len()
                ));
            }
        }
        Ok(())
    }
}

/// A PCR bank, and with it the template-digest algorithm and the layout of a list file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bank {
    /// SHA-1: 20-byte template digests and PCRs.
    Sha1,
    /// SHA-256: 32-byte template digests and PCRs.
    Sha256,
}

impl Bank {
    /// Its digests' size, in bytes.
    pub fn size(self) -> usize {
        match self {
            Bank::Sha1 => 20,
            Bank::Sha256 => 32,
        }
    }

    /// Its algorithm's name (`sha1`, `sha256`).
    pub fn name(self) -> &'static str {
        match self {
            Bank::Sha1 => "sha1",
            Bank::Sha256 => "sha256",
        }
    }

    /// `PCR <- H(PCR || digest)`, the TPM's extend.
    pub(crate) fn extend(self, pcr: &mut [u8], digest: &[u8]) {
        match self {
            Bank::Sha1 => {
                let v = Sha1::new()
                    .chain_update(&*pcr)
                    .chain_update(digest)
                    .finalize();
                pcr.copy_from_slice(&v);
            }
            Bank::Sha256 => {
                let v = Sha256::new()
                    .chain_update(&*pcr)
                    .chain_update(digest)
                    .finalize();
                pcr.copy_from_slice(&v);
            }
        }
    }
}

/// An encoded entry: template data exactly as the kernel serializes it, plus its template digests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The PCR it extends.
    pub pcr: u32,
    /// The template's name (`ima-ng`, …).
    pub template_name: Cow<'static, str>,
    /// The template data: each field with its length before it.
    pub data: Vec<u8>,
    /// The SHA-1 template digest (zero in a violation).
    pub sha1: [u8; 20],
    /// The SHA-256 template digest (zero in a violation).
    pub sha256: [u8; 32],
}

/// Appends one template field: u32 length, then the bytes. Lengths past u32 cannot come from
/// a checked event; they are clamped rather than wrapped so the record stays parseable.
fn put_field(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(total).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    let mut left = len as usize;
    for p in parts {
        let take = p.len().min(left);
        out.extend_from_slice(&p[..take]);
        left -= take;
    }
}

impl Entry {
    /// Encodes an event as the kernel would. Call [`Event::check`] first: an unchecked event is
    /// still encoded without panicking, the path cut at its first NUL (the kernel takes
    /// `strlen`), but a digest of the wrong length makes an entry no verifier accepts.
    pub fn new(pcr: u32, ev: &Event<'_>) -> Entry {
        // One allocation: every measured open makes an entry.
        let sig = if ev.template.has_sig() {
            Some(ev.sig.unwrap_or(&[]))
        } else {
            None
        };
        let mut data =
            Vec::with_capacity(ev.digest.len() + ev.path.len() + sig.map_or(0, <[u8]>::len) + 40);
        // d-ngv2 names the digest's kind first ("verity:sha256:"), d-ng only its algorithm.
        let (kind, colon): (&[u8], &[u8]) = if ev.template.is_v2() {
            (ev.kind.name().as_bytes(), b":")
        } else {
            (b"", b"")
        };
        let algo = ev.algo.name().as_bytes();
        put_field(&mut data, &[kind, colon, algo, b":\0", ev.digest]);
        // ima_write_template_field_data: strings get every ' ' turned into '_', so that
        // the space-separated ascii list stays parseable.
        let end = ev
            .path
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(ev.path.len());
        let at = data.len();
        put_field(&mut data, &[&ev.path[..end], b"\0"]);
        for b in &mut data[at + 4..] {
            if *b == b' ' {
                *b = b'_';
            }
        }
        if let Some(sig) = sig {
            put_field(&mut data, &[sig]);
        }
        Entry::from_data(pcr, Cow::Borrowed(ev.template.name()), data)
    }

    /// An entry for already-serialized template data; computes both template digests (SHA-1
    /// and SHA-256 of the template data, length prefixes included, as
    /// `ima_calc_field_array_hash` hashes it).
    pub(crate) fn from_data(pcr: u32, template_name: Cow<'static, str>, data: Vec<u8>) -> Entry {
        let sha1 = Sha1::digest(&data).into();
        let sha256 = Sha256::digest(&data).into();
        Entry {
            pcr,
            template_name,
            data,
            sha1,
            sha256,
        }
    }

    /// The first entry of every list: boot_aggregate, ima-ng, a sha256 all-zero digest (no TPM), PCR 10.
    ///
    /// Without a TPM, `ima_add_boot_aggregate` (ima_init.c) leaves the digest zeroed in the
    /// default hash algorithm, sha256; it is not a violation, so the PCR is extended normally.
    pub fn boot_aggregate() -> Entry {
        Entry::new(
            DEFAULT_PCR,
            &Event {
                template: Template::ImaNg,
                kind: DigestKind::Ima,
                algo: HashAlgo::Sha256,
                digest: &[0; 32],
                path: b"boot_aggregate",
                sig: None,
            },
        )
    }

    /// A violation entry as `ima_add_violation` makes one: template data of ima-ng (the
    /// kernel's default template) with the digest field's digest all zero and `name` as
    /// the file name, and the template digests left zero in both banks.
    pub fn violation(pcr: u32, name: &[u8]) -> Entry {
        let mut e = Entry::new(
            pcr,
            &Event {
                template: Template::ImaNg,
                kind: DigestKind::Ima,
                algo: HashAlgo::Sha256,
                digest: &[0; 32],
                path: name,
                sig: None,
            },
        );
        e.sha1 = [0; 20];
        e.sha256 = [0; 32];
        e
    }

    /// Whether this is a violation: its SHA-1 template digest is zero, which no hash of
    /// template data is (evmctl's test).
    pub fn is_violation(&self) -> bool {
        self.sha1 == [0; 20]
    }

    /// The entry's name field (`n-ng`), without its NUL.
    pub fn name_field(&self) -> &[u8] {
        let name = fields(&self.data).nth(1).unwrap_or(&[]);
        name.strip_suffix(b"\0").unwrap_or(name)
    }

    /// Extends the PCR banks with this entry: with its template digests, or for a
    /// violation with all 0xff bytes (`ima_add_template_entry`: "invalidate pcr").
    pub(crate) fn extend(&self, pcrs: &mut Pcrs) {
        if self.is_violation() {
            pcrs.extend(self.pcr, &[0xff; 20], &[0xff; 32]);
        } else {
            pcrs.extend(self.pcr, &self.sha1, &self.sha256);
        }
    }

    /// The template digest for a bank.
    pub fn digest(&self, bank: Bank) -> &[u8] {
        match bank {
            Bank::Sha1 => &self.sha1,
            Bank::Sha256 => &self.sha256,
        }
    }

    /// The record as in the bank's binary list file.
    pub fn binary_record(&self, bank: Bank) -> Vec<u8> {
        let mut out = Vec::new();
        self.put_binary_record(bank, &mut out);
        out
    }

    /// [`Entry::binary_record`], appended to `out`.
    pub fn put_binary_record(&self, bank: Bank, out: &mut Vec<u8>) {
        let name = self.template_name.as_bytes();
        out.reserve(12 + bank.size() + name.len() + self.data.len());
        out.extend_from_slice(&self.pcr.to_le_bytes());
        out.extend_from_slice(self.digest(bank));
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(self.data.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.data);
    }

    /// The line as in the bank's ascii list file, byte for byte (paths need not be UTF-8).
    pub fn ascii_bytes(&self, bank: Bank) -> Vec<u8> {
        let mut out = Vec::new();
        self.put_ascii(bank, &mut out);
        out
    }

    /// [`Entry::ascii_bytes`], appended to `out` (the flusher's path: no allocation).
    pub fn put_ascii(&self, bank: Bank, out: &mut Vec<u8>) {
        use std::io::Write as _;
        if self.pcr < 100 {
            // `%2d`, without the formatting machinery (every list's PCRs are below 24).
            let tens = match self.pcr / 10 {
                0 => b' ',
                t => b'0' + t as u8,
            };
            out.extend_from_slice(&[tens, b'0' + (self.pcr % 10) as u8, b' ']);
        } else {
            // Writing into a Vec cannot fail.
            let _ = write!(out, "{} ", self.pcr);
        }
        put_hex(out, self.digest(bank));
        out.push(b' ');
        out.extend_from_slice(self.template_name.as_bytes());
        let template = template_by_name(self.template_name.as_bytes());
        for (i, field) in fields(&self.data).enumerate() {
            // ima_ascii_measurements_show: a space before every field, nothing for an empty one.
            out.push(b' ');
            if field.is_empty() {
                continue;
            }
            match (template, i) {
                (Some(_), 0) => {
                    // ima_show_template_data_ascii, DATA_FMT_DIGEST_WITH_(TYPE_AND_)ALGO: the
                    // prefix as a string, then the digest after ':' NUL in hex.
                    let nul = field.iter().position(|&b| b == 0).unwrap_or(field.len());
                    out.extend_from_slice(&field[..nul]);
                    put_hex(out, field.get(nul + 1..).unwrap_or(&[]));
                }
                (Some(_), 1) => {
                    // DATA_FMT_STRING: printed with %s, up to the NUL.
                    let nul = field.iter().position(|&b| b == 0).unwrap_or(field.len());
                    out.extend_from_slice(&field[..nul]);
                }
                _ => put_hex(out, field),
            }
        }
        out.push(b'\n');
    }

    /// [`Entry::ascii_bytes`] as a string (with trailing '\n'); a non-UTF-8 path is shown lossily.
    pub fn ascii_line(&self, bank: Bank) -> String {
        String::from_utf8_lossy(&self.ascii_bytes(bank)).into_owned()
    }
}

/// The length-prefixed fields of template data; stops at the first one that does not fit.
pub(crate) fn fields(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let field = rest.get(4..4 + len)?;
        rest = &rest[4 + len..];
        Some(field)
    })
}

/// Lowercase hex, as the kernel's `%02x`.
pub fn to_hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// [`to_hex`], appended to `out` (no string between: the lists' lines are built so).
fn put_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    let start = out.len();
    out.resize(start + bytes.len() * 2, 0);
    hex::encode_to_slice(bytes, &mut out[start..]).expect("room for two digits a byte");
}

/// Hex (either case) to bytes; `None` for odd lengths or other characters.
pub fn from_hex(s: &[u8]) -> Option<Vec<u8>> {
    hex::decode(s).ok()
}

/// The two PCR banks, all 24 registers each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pcrs {
    pub sha1: [[u8; 20]; NUM_PCRS as usize],
    pub sha256: [[u8; 32]; NUM_PCRS as usize],
}

impl Pcrs {
    pub fn zero() -> Pcrs {
        Pcrs {
            sha1: [[0; 20]; NUM_PCRS as usize],
            sha256: [[0; 32]; NUM_PCRS as usize],
        }
    }

    /// Extends both banks with an entry's template digests. `pcr` must be < 24.
    pub fn extend(&mut self, pcr: u32, sha1: &[u8], sha256: &[u8]) {
        let i = pcr as usize;
        Bank::Sha1.extend(&mut self.sha1[i], sha1);
        Bank::Sha256.extend(&mut self.sha256[i], sha256);
    }

    pub fn get(&self, bank: Bank, index: u32) -> Option<&[u8]> {
        let i = index as usize;
        match bank {
            Bank::Sha1 => self.sha1.get(i).map(|p| &p[..]),
            Bank::Sha256 => self.sha256.get(i).map(|p| &p[..]),
        }
    }

    /// A bank as evmctl's `--pcrs` file: `PCR-NN: <hex>` for all 24.
    pub fn file_text(&self, bank: Bank) -> String {
        let mut s = String::new();
        for i in 0..NUM_PCRS {
            let v = self.get(bank, i).unwrap_or(&[]);
            s.push_str(&format!("PCR-{i:02}: {}\n", to_hex(v)));
        }
        s
    }
}
