//! `verilay snapshotter --root DIR --address SOCKET`: a containerd proxy snapshotter with
//! the semantics of containerd's overlayfs snapshotter (`snapshotter`), in the foreground
//! until SIGTERM or SIGINT, which remove its socket.

use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Where snapshots are kept: `metadata.json` and `snapshots/ID/{fs,work}`; one
    /// snapshotter at a time (it is locked).
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
    /// Log only what fails (no start and stop lines).
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let quiet = a.quiet;
    let log: snapshotter::Logger = Box::new(move |line| {
        // Refusals say what failed and why; the stop lines are news only without --quiet.
        if !quiet || !line.ends_with(": stopping") {
            eprintln!("verilay snapshotter: {line}");
        }
    });
    let (root, address) = (a.root.clone(), a.address.clone());
    snapshotter::run(&a.root, &a.address, log, || {
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
