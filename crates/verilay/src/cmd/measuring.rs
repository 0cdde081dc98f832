//! The measurement flags of `verilay mount` (`--policy`, `--measure-log`,
//! `--measure-hash`; `mountd` acts on them), and how `inspect` shows an identity.

use measure::log::HashAlgo;
use std::path::PathBuf;

#[derive(clap::Args, Clone, Default)]
pub struct MeasureArgs {
    /// Measure file opens and execs as this policy says (IMA's policy syntax: measure /
    /// dont_measure rules with func, mask, uid, euid, fsmagic, fsname, fsuuid, pcr,
    /// template, digest_type=verity). Needs --measure-log.
    #[arg(long, value_name = "FILE", requires = "measure_log")]
    pub policy: Option<PathBuf>,
    /// The directory the measurement list and PCR values are written to (continued if it
    /// holds a list that verifies).
    #[arg(long, value_name = "DIR", requires = "policy")]
    pub measure_log: Option<PathBuf>,
    /// The hash of measured file contents: sha256 (default), sha512 or sha1.
    #[arg(long, value_name = "ALG", default_value = "sha256", value_parser = parse_hash)]
    pub measure_hash: HashName,
}

/// A content hash algorithm's name, checked.
#[derive(Clone, Debug)]
pub struct HashName(pub String);

impl Default for HashName {
    fn default() -> Self {
        HashName("sha256".into())
    }
}

pub fn parse_hash(s: &str) -> Result<HashName, String> {
    match HashAlgo::from_name(s) {
        Some(_) => Ok(HashName(s.to_string())),
        None => Err(format!("{s}: not one of sha256, sha512, sha1")),
    }
}

/// An identity as `verilay inspect` shows it, in the policy's own terms.
pub fn describe(fs: &measure::policy::FsIdentity) -> String {
    format!(
        "fsmagic=0x{:x} fsname={} fsuuid={}",
        fs.magic,
        fs.name,
        measure::policy::uuid_text(&fs.uuid)
    )
}
