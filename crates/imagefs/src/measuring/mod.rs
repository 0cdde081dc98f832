//! Measurement of file opens (IMA in userspace): one [`Hook`] both filesystems call on open
//! ([`Setup::measure`]).
//!
//! - The policy decides from the access and the serving layer; an entry is appended once.
//! - The daemon sees every change through the mount: a digest is reused until the content may
//!   have changed.
//! - With `digest_type=verity` no data is read at open.
//! - Without a policy nothing here runs.

mod content;
mod counters;
mod digests;
mod engine;
pub mod fanotify;
mod identity;
mod inbox;
mod opens;
mod task;
mod watch;

pub use crate::stats::Counter;
pub use content::{cookie, Content, ContentKey, Cookie, ImageFile, PositionalReader};
pub use counters::Counters;
pub use digests::HASH_AT_CLOSE;
pub use engine::{access_mask, writes, Measured, Measuring, Opening};
pub use identity::{host_identity, image_identity, EROFS_MAGIC};
pub use opens::Opens;

use crate::ops::{Errno, Logger};
use crate::stats::{Stats, StatsSource, XattrRequests};
use measure::policy::FsIdentity;
use serde_json::Value;
use std::io;
use std::sync::Arc;

/// The mount root's attribute holding what `verilay stats` prints (outside every xattr
/// namespace, so no real attribute can have the name), kept for readers that predate
/// the stats socket (`mount/stats.rs`); gone with the xattrs of a mount whose images
/// hold none.
pub const STATS_XATTR: &[u8] = b"verilay.stats";

/// What a filesystem needs to measure: the engine, where it is mounted (the list names
/// absolute paths), and the identity each layer reports to the policy.
pub struct Setup {
    /// The engine.
    pub measuring: Arc<Measuring>,
    /// Where the filesystem is mounted, absolute.
    pub mountpoint: Vec<u8>,
    /// Per image layer, top first.
    pub layers: Vec<FsIdentity>,
    /// The upper directory's host filesystem, for a writable mount.
    pub upper: Option<FsIdentity>,
}

impl Setup {
    /// The counters and the identity each layer reports (what `verilay stats` prints),
    /// made by a closure that holds what it needs (the stats socket's thread calls it).
    pub fn stats_source(&self) -> impl Fn() -> Stats + Send + Sync + 'static {
        let measuring = self.measuring.clone();
        let layers = self.layers.clone();
        let upper = self.upper.clone();
        move || {
            let mut s = measuring.stats();
            s.insert("layers".into(), layers.iter().map(identity).collect());
            s.insert("upper".into(), upper.as_ref().map_or(Value::Null, identity));
            s
        }
    }

    /// Measures an open (see [`Measuring::open`]); a failure is one log line and EIO,
    /// which fails the open. A violation recorded is a log line too (the kernel audits
    /// each).
    pub fn measure(
        &self,
        o: &Opening<'_>,
        content: &dyn Content,
        log: &Logger,
        name: &str,
    ) -> Result<Measured, Errno> {
        let r = self.measuring.open(o, content);
        Self::report(
            r.as_ref().map(|m| m.violation),
            || content.path(),
            log,
            name,
        )?;
        r.map_err(|_| Errno::IO)
    }

    /// [`Measuring::write_opened`], reported as [`Setup::measure`] reports.
    pub fn write_opened(
        &self,
        opens: &Opens,
        path: impl Fn() -> Vec<u8>,
        log: &Logger,
        name: &str,
    ) -> Result<(), Errno> {
        let r = self.measuring.write_opened(opens, &path);
        Self::report(r.as_ref().copied(), path, log, name)
    }

    fn report(
        r: Result<Option<&'static str>, &io::Error>,
        path: impl FnOnce() -> Vec<u8>,
        log: &Logger,
        name: &str,
    ) -> Result<(), Errno> {
        match r {
            Ok(None) => Ok(()),
            Ok(Some(cause)) => {
                let path = String::from_utf8_lossy(&path()).escape_debug().to_string();
                log(&format!(
                    "{name}: {path}: violation recorded (invalid_pcr, {cause})"
                ));
                Ok(())
            }
            Err(e) => {
                let path = String::from_utf8_lossy(&path()).escape_debug().to_string();
                log(&format!("{name}: measuring {path}: {e}"));
                Err(Errno::IO)
            }
        }
    }

    /// `mountpoint` joined with `inside` (components from the root down).
    pub fn path(&self, inside: &[&[u8]]) -> Vec<u8> {
        let len = self.mountpoint.len() + inside.iter().map(|c| c.len() + 1).sum::<usize>();
        let mut p = Vec::with_capacity(len);
        p.extend_from_slice(&self.mountpoint);
        for c in inside {
            if p.last() != Some(&b'/') {
                p.push(b'/');
            }
            p.extend_from_slice(c);
        }
        p
    }
}

/// The identity a layer reports to the policy, as `verilay stats` prints it.
fn identity(f: &FsIdentity) -> Value {
    serde_json::json!({
        "fsmagic": format!("0x{:x}", f.magic),
        "fsname": f.name,
        "fsuuid": measure::policy::uuid_text(&f.uuid),
    })
}

/// More members for `verilay stats` from outside this crate (a remote image's fetching).
pub type ExtraStats = StatsSource;

/// Measuring as each filesystem holds it, one hook for both: with a policy, `setup`
/// measures their opens ([`Setup::measure`]); `verilay stats` reports the counters, the
/// xattr requests the filesystem counts in `requests`, and the `extra` members
/// ([`Hook::source`]).
#[derive(Default)]
pub struct Hook {
    /// What measures the opens; `None` without a policy.
    pub setup: Option<Setup>,
    /// More members for `verilay stats` from outside this crate.
    pub extra: Option<ExtraStats>,
    /// The xattr requests the filesystem received.
    pub requests: Arc<XattrRequests>,
}

impl Hook {
    /// What `verilay stats` reads: the counters and each layer's identity (without a
    /// policy, none), the xattr requests received, and the extra members. Called once
    /// measuring and the extra members are set (at mount).
    pub fn source(&self) -> StatsSource {
        let measured = self.setup.as_ref().map(Setup::stats_source);
        let requests = self.requests.clone();
        let extra = self.extra.clone();
        Arc::new(move || {
            let mut s = match &measured {
                Some(measured) => measured(),
                None => Stats::from_iter([("policy_rules".to_string(), Value::from(0))]),
            };
            requests.add_to(&mut s);
            if let Some(extra) = &extra {
                s.extend(extra());
            }
            s
        })
    }

    /// [`Hook::source`]'s statistics as the root's [`STATS_XATTR`] value.
    pub fn stats(&self) -> Vec<u8> {
        serde_json::to_vec(&self.source()()).unwrap_or_default()
    }
}
