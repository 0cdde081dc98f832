"""Finding the programs under test: verilay itself and the peers it is compared with.

A peer is taken from its environment variable if set, else from PATH; a missing
peer is reported and skipped, never fatal."""

import os
import re
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def find(env_var, *names):
    """Path of a program: $env_var if set, else the first of names on PATH, else None."""
    if os.environ.get(env_var):
        path = os.environ[env_var]
        return path if os.access(path, os.X_OK) else None
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def version(path, flag="--version"):
    """The first 'N.N[.N]' in the first line the program prints for flag, or 'unknown'."""
    try:
        out = subprocess.run([path, flag], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (out.stdout or out.stderr).splitlines()
    m = re.search(r"\d+\.\d+(\.\d+)?", lines[0]) if lines else None
    return m.group(0) if m else "unknown"


def verilay(snapshot_dir):
    """(path, None) for a working verilay release binary, or (None, why not).

    $VERILAY names a prebuilt binary; otherwise `cargo build --release` runs first
    so the binary measured is the one the work tree builds. The binary is copied
    into snapshot_dir, so a concurrent `cargo build` cannot swap it mid-run."""
    path = os.environ.get("VERILAY")
    if not path:
        path = os.path.join(REPO, "target", "release", "verilay")
        build = subprocess.run(["cargo", "build", "--release", "-p", "verilay"],
                               cwd=REPO, capture_output=True, text=True)
        if build.returncode != 0:
            last = (build.stderr.strip().splitlines() or ["?"])[-1]
            return None, f"cargo build --release failed: {last}"
    try:
        copy = shutil.copy2(path, os.path.join(snapshot_dir, "verilay"))
        ok = subprocess.run([copy, "build", "--help"], capture_output=True).returncode == 0
    except OSError as e:
        return None, f"{path}: {e.strerror}"
    return (copy, None) if ok else (None, f"`{path} build --help` failed")


def compile_c(cc, source, binary, flags=()):
    """Writes C `source` next to `binary` (as binary.c) and compiles it there with -O2."""
    with open(binary + ".c", "w") as f:
        f.write(source)
    subprocess.run([cc, "-O2", *flags, "-o", binary, binary + ".c"], check=True)
    return binary


def announce(found):
    """Prints each found tool ({name: {"path", "version"}}) and says whether cold-cache
    runs are possible (they need root to drop caches); returns that."""
    for name, t in found.items():
        print(f"{name}: {t['path']} (version {t['version']})")
    cold = os.geteuid() == 0
    if not cold:
        print("not root: no cold-cache runs")
    return cold


def git_revision():
    """Commit of the work tree being measured, with '+dirty' if it has changes."""
    def git(*args):
        return subprocess.run(["git", "-C", REPO, *args], capture_output=True,
                              text=True).stdout.strip()
    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock")
    return rev + ("+dirty" if dirty else "")
