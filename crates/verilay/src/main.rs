//! `verilay`: one thin binary over single-purpose crates. Each subcommand lives in
//! `cmd/` and only parses options, calls a library, and reports.

/// `println!` for command output: a closed pipe (`verilay inspect … | head`) ends the
/// program quietly instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        // Whatever a line quotes (a file name in an image, a registry's words) is shown,
        // never obeyed by the terminal; JSON stays JSON.
        let line = format!($($arg)*);
        if let Err(e) = writeln!(out, "{}", host::text::shown(&line)) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            eprintln!("verilay: error: writing output: {e}");
            std::process::exit(1);
        }
    }};
}

mod cmd;
mod progress;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "verilay",
    version,
    about = "Verified, measured, layered filesystem images"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a sealed EROFS image of a directory and print its digest.
    Build(Box<cmd::build::Args>),
    /// Append a verity section to a plain EROFS image (mkfs.erofs's) and print its digest.
    Seal(cmd::seal::Args),
    /// Print fs-verity file digests, as `fsverity digest` does.
    Digest(cmd::digest::Args),
    /// Show an image's superblock, or one inode's metadata, layout and xattrs.
    Inspect(cmd::inspect::Args),
    /// Check an image's structure; exit 1 with one line per problem.
    Fsck(cmd::fsck::Args),
    /// Write an image's tree back out to a directory.
    Extract(cmd::extract::Args),
    /// Store an image in an OCI registry; prints the manifest digest.
    Push(cmd::push::Args),
    /// Fetch an image from an OCI registry whole, and verify it against its pinned digest.
    Pull(cmd::pull::Args),
    /// Convert a container image's layers to verilay images, stored next to it in a
    /// registry and tied to its manifest (as a referrer); prints the conversion's digest.
    Convert(cmd::convert::Args),
    /// Serve a directory as an additional layer store of containers/storage (podman):
    /// converted layers mounted verified and lazily, in the foreground until unmounted.
    LayerStore(cmd::layer_store::Args),
    /// Serve containerd's snapshots API on a unix socket (a proxy snapshotter with
    /// overlayfs's semantics), in the foreground until SIGTERM.
    Snapshotter(cmd::snapshotter::Args),
    /// The cache of remote images' verified bytes: `ls`, `prune`.
    Cache(cmd::cache::Args),
    /// Check every block of an image against its Merkle tree (and a pinned digest).
    Verify(cmd::verify::Args),
    /// Print files from an image, verified.
    Cat(cmd::cat::Args),
    /// Mount an image (read-only, every byte verified) with FUSE; returns once it is usable.
    Mount(Box<cmd::mount::Args>),
    /// Unmount a verilay mount (the daemon then exits).
    Umount(cmd::mount::UmountArgs),
    /// Show what measuring has cost a mount: opens checked, files hashed, entries logged.
    Stats(cmd::stats::Args),
    /// Measurement lists: `verify DIR` replays one and checks it against its PCR files.
    Log(cmd::log::Args),
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let invoked_as = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned());
    if invoked_as.as_deref() == Some("mount.fuse.verilay") {
        finish(cmd::mount::mount_helper(&argv[1..]));
    }
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Mount(_)
            | Command::Umount(_)
            | Command::LayerStore(_)
            | Command::Snapshotter(_)
            | Command::Stats(_)
    ) {
        end_quietly_on_closed_pipes();
    }
    let result = match cli.command {
        Command::Build(a) => cmd::build::run(*a),
        Command::Seal(a) => cmd::seal::run(a),
        Command::Digest(a) => cmd::digest::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Fsck(a) => cmd::fsck::run(a),
        Command::Extract(a) => cmd::extract::run(a),
        Command::Push(a) => cmd::push::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::LayerStore(a) => cmd::layer_store::run(a),
        Command::Snapshotter(a) => cmd::snapshotter::run(a),
        Command::Pull(a) => cmd::pull::run(a),
        Command::Cache(a) => cmd::cache::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Cat(a) => cmd::cat::run(a),
        Command::Mount(a) => cmd::mount::run(*a),
        Command::Umount(a) => cmd::mount::run_umount(a),
        Command::Stats(a) => cmd::stats::run(a),
        Command::Log(a) => cmd::log::run(a),
    };
    finish(result)
}

/// A command whose reader goes away (`verilay verify IMG | head -1`) ends as coreutils do,
/// by SIGPIPE's default action: Rust ignores SIGPIPE, so the next write to stderr would
/// panic. Daemons and socket clients keep it ignored: to them a closed socket is an error
/// they handle.
#[allow(unsafe_code)] // signal(2), a syscall
fn end_quietly_on_closed_pipes() {
    // SAFETY: signal(2) with SIG_DFL installs no handler; no other thread runs yet.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn finish(result: anyhow::Result<i32>) -> ! {
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One line: the chain of causes joined, never a backtrace.
            eprintln!(
                "verilay: error: {}",
                host::text::one_line(&format!("{e:#}"))
            );
            std::process::exit(1);
        }
    }
}
