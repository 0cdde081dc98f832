//! `verilay layer-store DIR`: serves DIR as an additional layer store of containers/storage
//! (`layerstore`), in the foreground until unmounted. Each layer podman uses is mounted
//! by `verilay mount` of its image artifact under the state directory, verified and
//! fetched lazily; stopping the store detaches those mounts too (containers still using
//! them keep them until they let go).

use anyhow::Context;
use imagefs::mount::{self as plan, Reporter};
use mountopts::Transport;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// The store's directory, mounted over. podman finds it through storage.conf:
    /// `additionallayerstores = ["DIR:ref"]` (under `[storage.options]`).
    dir: PathBuf,
    /// Where layers are mounted (`layers/`), original blobs kept (`blobs/`), and what was
    /// served for each layer recorded (`served.json`; `checks/` while one is checked).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/verilay/layer-store"
    )]
    state: PathBuf,
    #[command(flatten)]
    layers: LayerMounts,
}

/// How layers are found and mounted, for the layer store and the snapshotter alike.
#[derive(clap::Args)]
pub struct LayerMounts {
    /// Registries over plain HTTP: only on this machine.
    #[arg(long)]
    insecure: bool,
    /// Keep the layers' verified bytes in this cache directory (`verilay mount --cache`).
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// Measure what containers open and run as this policy says (`verilay mount
    /// --policy`); needs --measure-log.
    #[arg(long, value_name = "FILE", requires = "measure_log")]
    policy: Option<PathBuf>,
    /// Each layer's measurement list goes to DIR/IMAGE_DIGEST_HEX.
    #[arg(long, value_name = "DIR", requires = "policy")]
    measure_log: Option<PathBuf>,
    /// How the store and its layers' mounts take requests: auto, uring or dev.
    #[arg(long, value_name = "auto|uring|dev", value_parser = Transport::parse)]
    transport: Option<Transport>,
    /// What serves the layers' mounts (`verilay mount --engine`): `kernel` (the kernel's
    /// erofs over each layer's image, its metadata checked as the kernel reads it), `fuse`,
    /// or `auto` (the default, or $VERILAY_ENGINE: `kernel` as root).
    #[arg(long, value_name = "auto|kernel|fuse", value_parser = mountopts::Engine::parse)]
    engine: Option<mountopts::Engine>,
    /// The longest a registry request may take, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    timeout: u64,
    /// Every manifest layers are served of must satisfy it, as podman's pulls do; a
    /// conversion found as a referrer is used only when signed under it.
    #[command(flatten)]
    signatures: super::registry::Policy,
}

impl LayerMounts {
    /// A resolver keeping its mounts, blobs and record of bindings served in `state`
    /// (canonical), mounting layers with this program and these options.
    pub fn resolver(&self, state: &Path) -> anyhow::Result<layerstore::OciResolver> {
        let program = std::env::current_exe().context("finding this program")?;
        let mut resolver = layerstore::OciResolver::new(state.to_path_buf(), program);
        // What was served before: images may still use layers made of it.
        resolver.open_record().map_err(|e| {
            anyhow::anyhow!(
                "{e} (the record of the layers served: delete it only once no container \
                 storage holds a layer served)"
            )
        })?;
        resolver.insecure = self.insecure;
        resolver.timeout = Duration::from_secs(self.timeout.max(1));
        resolver.trust = self.signatures.load()?;
        // A layer's image artifact is mounted by the digest its (checked) manifest or
        // signed conversion gives: pinned, it needs no signature of its own, whatever the
        // policy says of its repository.
        let pinned_policy = state.join("pinned-policy.json");
        // Written new and renamed into place: a link planted there is replaced, not followed.
        let mut tmp = tempfile::NamedTempFile::new_in(state)?;
        std::io::Write::write_all(
            &mut tmp,
            br#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )?;
        tmp.persist(&pinned_policy)
            .with_context(|| format!("{}", pinned_policy.display()))?;
        resolver
            .mount_args
            .extend(["--signature-policy".into(), pinned_policy.into_os_string()]);
        if let Some(c) = &self.cache {
            resolver
                .mount_args
                .extend(["--cache".into(), c.clone().into()]);
        }
        if let Some(e) = self.engine {
            resolver
                .mount_args
                .push(format!("--engine={}", e.name()).into());
        }
        if let Some(p) = &self.policy {
            resolver
                .mount_args
                .extend(["--policy".into(), p.clone().into()]);
            resolver.measure_logs = self.measure_log.clone();
        }
        if let Some(t) = self.transport {
            resolver
                .mount_args
                .push(format!("--transport={}", t.name()).into());
        }
        Ok(resolver)
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let as_root = rustix::process::geteuid().is_root();
    std::fs::metadata(&a.dir).with_context(|| format!("store directory {}", a.dir.display()))?;
    std::fs::create_dir_all(&a.state)
        .with_context(|| format!("state directory {}", a.state.display()))?;
    let state = std::fs::canonicalize(&a.state)?;
    let _held = hold_state(&state)?;
    // Mounts a store before this one left (its options, not ours) are detached first.
    layerstore::resolve::detach_all_but(&state.join("layers"), &[]);
    let resolver = a.layers.resolver(&state)?;
    let plan = plan::Plan {
        source: "verilay-layer-store".into(),
        mountpoint: a.dir.clone(),
        // Not read-only: the kernel would refuse the driver's `use` and rmdir notices
        // itself (EROFS, which the driver logs as a failure) instead of asking the store.
        writable: true,
        flags: plan::Flags::default(),
        // Root's alone, as the layers' mounts are: the kernel's overlayfs reaches its
        // lower layers with the credentials of whoever mounted the container (root), and
        // no other user may make the store look up references (registry requests with
        // root's credentials) or fill its memory with names.
        access: plan::Access::Owner,
        threads: layerstore::STORE_THREADS,
        transport: a.layers.transport.unwrap_or(Transport::Auto),
        poll: None,
        as_root,
        timeout: Duration::from_secs(a.layers.timeout.max(1)),
        engine_why: "the layer store itself is a FUSE filesystem".into(),
    };
    let log: imagefs::Logger =
        Box::new(|line| eprintln!("verilay layer-store: {}", host::text::one_line(line)));
    let fs = layerstore::StoreFs::new(resolver, log);
    eprintln!(
        "verilay layer-store: serving {} (layers mounted under {})",
        a.dir.display(),
        state.join("layers").display()
    );
    let served = plan.serve(fs, &mut Reporter::open(plan::Report::Stderr)?, None);
    layerstore::resolve::detach_all_but(&state.join("layers"), &[]);
    served.map(|()| 0)
}

/// The state directory, ours alone while the store runs: a second store on it would
/// share its layer mounts and detach them all as it stopped.
fn hold_state(state: &Path) -> anyhow::Result<std::fs::File> {
    use rustix::fs::{flock, FlockOperation};
    let path = state.join("lock");
    let f = std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?;
    flock(&f, FlockOperation::NonBlockingLockExclusive).map_err(|e| {
        anyhow::anyhow!(
            "state directory {}: in use by another layer store ({e})",
            state.display()
        )
    })?;
    Ok(f)
}
