//! `verilay snapshotter --root DIR --address SOCKET`: a containerd proxy snapshotter with
//! the semantics of containerd's overlayfs snapshotter, serving converted layers from
//! their verilay images (`snapshotter`), in the foreground until SIGTERM or SIGINT, which
//! remove its socket and leave its layers mounted for the containers using them.

use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// Where snapshots are kept: `metadata.json`, `snapshots/ID/{fs,work}`, and remote
    /// layers' mounts and record under `remote/`; one snapshotter at a time (it is locked).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/verilay/snapshotter"
    )]
    root: PathBuf,
    /// The unix socket containerd dials: `address` of `[proxy_plugins.NAME]`, with
    /// `type = "snapshot"`, in containerd's config.toml.
    #[arg(
        long,
        value_name = "SOCKET",
        default_value = "/run/verilay/snapshotter.sock"
    )]
    address: PathBuf,
    /// Unpack every layer as containerd's overlayfs snapshotter does: no remote layers.
    #[arg(long)]
    no_remote: bool,
    /// containerd's config.toml: the registry credentials CRI is given there
    /// (`registry.configs."HOST".auth`) are used for remote layers too, before the auth
    /// files `verilay mount` reads (`$REGISTRY_AUTH_FILE`, `~/.docker/config.json`, …).
    #[arg(long, value_name = "FILE")]
    containerd_config: Option<PathBuf>,
    /// Check each conversion against its layer blob before first serving it (the blob
    /// fetched whole once; the verdict kept): containerd reuses a layer, without asking,
    /// for every image in its namespace whose layers below and DiffID are the same, so
    /// where images of different publishers share a namespace (a multi-tenant node), a
    /// conversion that lies about its layer must not be served (docs/SECURITY.md).
    #[arg(long)]
    check_layers: bool,
    #[command(flatten)]
    layers: super::layer_store::LayerMounts,
    /// Log only what fails (no start, stop and per-layer lines).
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let quiet = a.quiet;
    let log: snapshotter::Logger = Box::new(move |line| {
        // Refusals and failures are always news; what was served, and stops, only
        // without --quiet.
        let news = line.ends_with(": stopping")
            || line.contains(": served from verilay image ")
            || line.ends_with(": containerd pulls and unpacks it");
        if !quiet || !news {
            eprintln!("verilay snapshotter: {}", host::text::one_line(line));
        }
    });
    // Locked first: the remote layers' state is this root's.
    let store = snapshotter::Store::open(&a.root)
        .with_context(|| format!("snapshotter on {}", a.address.display()))?;
    let remote: Option<Arc<dyn snapshotter::Remote>> = if a.no_remote {
        None
    } else {
        let state = store.root().join("remote");
        std::fs::create_dir_all(&state)
            .with_context(|| format!("state directory {}", state.display()))?;
        let state = std::fs::canonicalize(&state)?;
        if let Some(config) = &a.containerd_config {
            use_cri_credentials(config, &state.join("auth.json"))?;
        }
        Some(Arc::new(snapshotter::remote::OciLayers {
            resolver: a.layers.resolver(&state)?,
            check_first: a.check_layers,
        }))
    };
    let (root, address) = (a.root.clone(), a.address.clone());
    snapshotter::run(store, &a.address, log, remote, || {
        if !quiet {
            eprintln!(
                "verilay snapshotter: serving {} (snapshots under {})",
                address.display(),
                root.display()
            );
        }
    })
    .with_context(|| format!("snapshotter on {}", a.address.display()))?;
    Ok(0)
}

/// Makes the registry credentials in containerd's `config` the first ones this process and
/// the layer mounts it starts look up: written to `file` with those of `$REGISTRY_AUTH_FILE`
/// (for other registries), which then names `file`.
fn use_cri_credentials(config: &std::path::Path, file: &std::path::Path) -> anyhow::Result<()> {
    let (found, passed) = snapshotter::cri_auth::from_config(config).map_err(anyhow::Error::msg)?;
    for line in passed {
        eprintln!("verilay snapshotter: {line}");
    }
    let also = std::env::var_os("REGISTRY_AUTH_FILE")
        .filter(|f| !f.is_empty())
        .map(PathBuf::from)
        .filter(|f| f.exists());
    snapshotter::cri_auth::write(file, &found, also.as_deref()).map_err(anyhow::Error::msg)?;
    // Set before any thread is started: the runtime and the mounts' daemons come later.
    std::env::set_var("REGISTRY_AUTH_FILE", file);
    Ok(())
}
