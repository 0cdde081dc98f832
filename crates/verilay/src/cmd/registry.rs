//! What the commands that reach a registry share: a reference, how to reach its registry,
//! signing what is stored and the policy what is fetched must satisfy.

use std::time::Duration;

#[derive(clap::Args, Clone)]
pub struct Remote {
    /// Plain HTTP instead of HTTPS; only for a registry on this machine.
    #[arg(long)]
    pub insecure: bool,
    /// Seconds to wait for the registry to connect or answer.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub timeout: f64,
}

impl Remote {
    pub fn connect(&self, r: &oci::Reference) -> anyhow::Result<oci::Registry> {
        Ok(oci::Registry::connect(r, self.insecure, self.timeout()?)?)
    }

    /// `--timeout`, checked (at most a day).
    pub fn timeout(&self) -> anyhow::Result<Duration> {
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            anyhow::bail!(
                "--timeout {}: expected a positive number of seconds",
                self.timeout
            );
        }
        Ok(Duration::from_secs_f64(self.timeout.min(86_400.0)))
    }
}

/// A reference, parsed, for a command's arguments.
pub fn reference(s: &str) -> anyhow::Result<oci::Reference> {
    oci::Reference::parse(s).map_err(anyhow::Error::msg)
}

/// Signing what a command stores, as `skopeo copy --sign-by-sigstore-private-key` signs.
#[derive(clap::Args, Clone, Default)]
pub struct Sign {
    /// Sign what is stored with this sigstore (cosign) private key: the signature goes
    /// beside it (`sha256-HEX.sig`), where podman and verilay look when registries.d
    /// turns on `use-sigstore-attachments`.
    #[arg(long, value_name = "KEY")]
    pub sign_by_sigstore_private_key: Option<std::path::PathBuf>,
    /// The key's passphrase: the first line of FILE (default: an empty passphrase).
    #[arg(long, value_name = "FILE", requires = "sign_by_sigstore_private_key")]
    pub sign_passphrase_file: Option<std::path::PathBuf>,
}

impl Sign {
    /// The key and passphrase, read now (so a bad one fails before anything is stored).
    pub fn key(&self) -> anyhow::Result<Option<(Vec<u8>, Vec<u8>)>> {
        let Some(key) = &self.sign_by_sigstore_private_key else {
            return Ok(None);
        };
        let read = |p: &std::path::Path| {
            verity::source::read_input(p, 1 << 20)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
        };
        let pem = read(key)?;
        let pass = match &self.sign_passphrase_file {
            Some(f) => {
                let text = read(f)?;
                let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
                line.strip_suffix(b"\r").unwrap_or(line).to_vec()
            }
            None => Vec::new(),
        };
        // A wrong passphrase or a key of another format: refused before anything is stored.
        signatures::sign(
            &pem,
            &pass,
            "localhost/check:check",
            &oci::registry::sha256_digest(b""),
        )
        .map_err(|e| anyhow::anyhow!("{}: {e}", key.display()))?;
        Ok(Some((pem, pass)))
    }
}

/// Signs manifest `digest` of `r`'s repository as `identity` (`HOST/REPO:TAG`) with
/// `key` (from [`Sign::key`]) and stores the signature beside it.
pub fn sign_manifest(
    reg: &oci::Registry,
    r: &oci::Reference,
    identity: &str,
    digest: &str,
    key: &(Vec<u8>, Vec<u8>),
) -> anyhow::Result<()> {
    let (payload, signature) =
        signatures::sign(&key.0, &key.1, identity, digest).map_err(anyhow::Error::msg)?;
    signatures::attach(reg, &r.repository, digest, &payload, &signature)
        .map_err(|e| anyhow::anyhow!("{r}: storing the signature of {digest}: {e}"))
}

/// The signature policy manifests fetched must satisfy, as podman's.
#[derive(clap::Args, Clone, Default)]
pub struct Policy {
    /// containers-policy.json(5) every manifest fetched must satisfy (default:
    /// ~/.config/containers/policy.json, else /etc/containers/policy.json, when there is
    /// one; sigstore keys only).
    #[arg(long, value_name = "FILE")]
    pub signature_policy: Option<std::path::PathBuf>,
    /// containers-registries.d(5): where `use-sigstore-attachments` says signatures are
    /// (default: ~/.config/containers/registries.d, else /etc/containers/registries.d).
    #[arg(long = "registries.d", value_name = "DIR")]
    pub registries_d: Option<std::path::PathBuf>,
}

impl Policy {
    /// The files as `opening` takes them.
    pub fn files(&self) -> opening::PolicyFiles {
        opening::PolicyFiles {
            signature_policy: self.signature_policy.clone(),
            registries_d: self.registries_d.clone(),
        }
    }

    /// The policy, read now (`None`: no policy file where one was looked for).
    pub fn load(&self) -> anyhow::Result<Option<signatures::Trust>> {
        self.files().load()
    }
}

/// Refuses an output path where something other than a regular file is: `build` and
/// `pull` rename their result over it, which would replace a device (`-o /dev/null`), a
/// FIFO or a socket with a file.
pub fn check_output(out: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(out) {
        Ok(m) if !m.is_file() => anyhow::bail!(
            "-o {}: exists and is not a regular file (the output is written beside it and renamed over it)",
            out.display()
        ),
        _ => Ok(()),
    }
}
