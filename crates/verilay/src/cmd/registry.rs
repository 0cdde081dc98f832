//! What `push` and `pull` share: a reference and how to reach its registry.

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
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            anyhow::bail!(
                "--timeout {}: expected a positive number of seconds",
                self.timeout
            );
        }
        let timeout = Duration::from_secs_f64(self.timeout.min(86_400.0));
        Ok(oci::Registry::connect(r, self.insecure, timeout)?)
    }
}

/// A reference, parsed, for a command's arguments.
pub fn reference(s: &str) -> anyhow::Result<oci::Reference> {
    oci::Reference::parse(s).map_err(anyhow::Error::msg)
}
