//! A mount's measurement (`policy=`, `measure_log=`, `measure_hash=`): the policy loaded,
//! the list opened and what each layer reports as its filesystem identity.

use anyhow::{bail, Context};
use imagefs::measuring::{host_identity, image_identity, Measuring, Setup};
use measure::log::{HashAlgo, Holder, Log};
use measure::policy::{Policy, MAX_POLICY_BYTES};
use mountopts::MountOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The measurement a mount asked for.
#[derive(Clone, Debug)]
pub struct Measure {
    /// The policy file (IMA's policy syntax).
    pub policy: PathBuf,
    /// The directory of the measurement list and PCR values.
    pub list: PathBuf,
    /// The hash of measured file contents.
    pub hash: HashAlgo,
}

impl Measure {
    /// The measurement `o` asks for (`None`: none); a policy without a list, or a list
    /// without a policy, is an error.
    pub fn from_options(o: &MountOptions) -> anyhow::Result<Option<Measure>> {
        let name = o.measure_hash.as_deref().unwrap_or("sha256");
        let Some(hash) = HashAlgo::from_name(name) else {
            bail!("measure_hash={name}: not one of sha256, sha512, sha1");
        };
        match (&o.policy, &o.measure_log) {
            (Some(policy), Some(list)) => Ok(Some(Measure {
                policy: policy.clone(),
                list: list.clone(),
                hash,
            })),
            (Some(_), None) => bail!("--policy needs --measure-log DIR"),
            (None, Some(_)) => bail!("--measure-log needs --policy FILE"),
            (None, None) => Ok(None),
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
pub(crate) struct LayerId {
    pub uuid: [u8; 16],
    pub digest: Vec<u8>,
}

/// The measuring setup for a mount, or `None` without measurement.
pub(crate) fn setup(
    m: Option<&Measure>,
    layers: &[LayerId],
    upper_root: Option<std::os::fd::BorrowedFd<'_>>,
    mountpoint: &Path,
) -> anyhow::Result<Option<Setup>> {
    let Some(m) = m else {
        return Ok(None);
    };
    let policy = load_policy(&m.policy)?;
    let mountpoint = std::fs::canonicalize(mountpoint)
        .with_context(|| format!("mountpoint {}", mountpoint.display()))?;
    let holder = Holder {
        what: format!("mount on {}", mountpoint.display()),
        pcrs: policy.pcrs(),
    };
    let dir = &m.list;
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
        measuring: Arc::new(Measuring::new(policy, log, m.hash, &mountpoint)),
        mountpoint,
        layers,
        upper,
    }))
}
