//! The measurement options of `verilay mount` (`--policy`, `--measure-log`,
//! `--measure-hash`): loading the policy, opening the list, and what each layer reports
//! as its filesystem identity.

use anyhow::{bail, Context};
use imagefs::measuring::{host_identity, image_identity, Measuring, Setup};
use measure::log::{HashAlgo, Holder, Log};
use measure::policy::{Policy, MAX_POLICY_BYTES};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

impl MeasureArgs {
    /// Parses the policy, so its errors come out before a daemon exists.
    pub fn check(&self) -> anyhow::Result<()> {
        match (&self.policy, &self.measure_log) {
            (Some(p), Some(_)) => load_policy(p).map(|_| ()),
            (Some(_), None) => bail!("--policy needs --measure-log DIR"),
            (None, Some(_)) => bail!("--measure-log needs --policy FILE"),
            (None, None) => Ok(()),
        }
    }
}

/// Reads and parses a policy file; errors name the file and the line. Only a regular
/// file of at most `MAX_POLICY_BYTES` is read (a FIFO or device is refused unread).
pub fn load_policy(path: &Path) -> anyhow::Result<Policy> {
    let bytes = measure::files::read_regular(path, MAX_POLICY_BYTES)
        .map_err(|e| anyhow::anyhow!("policy {}: {e}", path.display()))?;
    Policy::parse_bytes(&bytes).map_err(|e| anyhow::anyhow!("policy {}: {e}", path.display()))
}

/// One image layer as the measurement needs it: its superblock uuid, and its digest
/// (whose first 16 bytes stand in for a missing uuid).
pub struct LayerId {
    pub uuid: [u8; 16],
    pub digest: Vec<u8>,
}

/// The measuring setup for a mount, or `None` without a policy.
pub fn setup(
    m: &MeasureArgs,
    layers: &[LayerId],
    upper_root: Option<std::os::fd::BorrowedFd<'_>>,
    mountpoint: &Path,
) -> anyhow::Result<Option<Setup>> {
    let (Some(policy), Some(dir)) = (&m.policy, &m.measure_log) else {
        return Ok(None);
    };
    let policy = load_policy(policy)?;
    let algo = HashAlgo::from_name(&m.measure_hash.0).context("--measure-hash")?;
    let mountpoint = std::fs::canonicalize(mountpoint)
        .with_context(|| format!("mountpoint {}", mountpoint.display()))?;
    let holder = Holder {
        what: format!("mount on {}", mountpoint.display()),
        pcrs: policy.pcrs(),
    };
    let log = Log::open_as(dir, &holder)
        .with_context(|| format!("measurement list {}", dir.display()))?;
    if let Some(r) = log.recovery() {
        // A foreground mount shows it; the list itself records it for every verifier.
        eprintln!("verilay: measurement list {}: {r}", dir.display());
    }
    let layers = layers
        .iter()
        .map(|l| image_identity(l.uuid, &l.digest))
        .collect();
    let upper = upper_root
        .map(|fd| host_identity(fd).context("the upper directory's filesystem"))
        .transpose()?;
    let mountpoint = std::os::unix::ffi::OsStrExt::as_bytes(mountpoint.as_os_str()).to_vec();
    Ok(Some(Setup {
        measuring: Arc::new(Measuring::new(policy, log, algo, &mountpoint)),
        mountpoint,
        layers,
        upper,
    }))
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
