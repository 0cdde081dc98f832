"""Finding the programs under test: verilay itself and the peers it is compared with.

Every peer is declared once, in PEERS: what it is, where a user gets it, and why a run may
lack it. A peer is taken from its environment variable if set, else from PATH. A missing
peer is never fatal: each lookup is recorded (`looked_up`), `bench/run` names the missing
ones at the top of the run and in the JSON and report, and the benchmarks print its cells
and targets as NOT MEASURED."""

import collections
import os
import re
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

# A peer: its name in tables, the programs looked for on PATH, where a package registry
# offers it (None: none does), and why it cannot be had that way.
Peer = collections.namedtuple("Peer", "label names source unavailable")

_SETUP = "Debian 12 package {}, installed by `./scripts/setup`"
_SETUP_BENCH = "Debian 12 package {}, installed by `./scripts/setup --bench`"
_EROFS_19 = ("Debian 12 packages erofs-utils 1.5 only (1.8 and later are in Debian 13, built "
             "for its newer C library), and no other registry offers it; set ${} to a build "
             "of erofs-utils 1.9")
_COMPOSEFS = ("composefs is not packaged for Debian 12, and crates.io's composefs-fuse 0.9.4 "
              "is a library with no program; set ${} to a build of composefs")

PEERS = {
    "MKFS_EROFS": Peer("mkfs.erofs 1.5", ("/usr/bin/mkfs.erofs",),
                       _SETUP.format("erofs-utils"), None),
    "MKFS_EROFS_19": Peer("mkfs.erofs 1.9", ("mkfs.erofs-1.9",), None,
                          _EROFS_19.format("MKFS_EROFS_19")),
    "EROFSFUSE_19": Peer("erofsfuse 1.9", ("erofsfuse-1.9",), None,
                         _EROFS_19.format("EROFSFUSE_19")),
    "MKCOMPOSEFS": Peer("mkcomposefs", ("mkcomposefs",), None,
                        _COMPOSEFS.format("MKCOMPOSEFS")),
    "COMPOSEFS_FUSE": Peer("composefs-fuse", ("composefs-fuse",), None,
                           _COMPOSEFS.format("COMPOSEFS_FUSE")),
    "SQUASHFUSE": Peer("squashfuse", ("squashfuse",), _SETUP_BENCH.format("squashfuse"), None),
    "MKSQUASHFS": Peer("mksquashfs", ("mksquashfs",), _SETUP_BENCH.format("squashfs-tools"),
                       None),
    "FUSE_OVERLAYFS": Peer("fuse-overlayfs", ("fuse-overlayfs",),
                           _SETUP_BENCH.format("fuse-overlayfs"), None),
    "FSVERITY": Peer("fsverity", ("fsverity",), _SETUP.format("fsverity"), None),
    "DOCKER_REGISTRY": Peer("docker-registry", ("docker-registry",),
                            _SETUP.format("docker-registry"), None),
    "SKOPEO": Peer("skopeo", ("skopeo",), _SETUP.format("skopeo"), None),
    "STARGZ_GRPC": Peer(
        "containerd-stargz-grpc", ("containerd-stargz-grpc",), None,
        "Debian 12's stargz-snapshotter 0.12 ships only ctr-remote, and `go install "
        "github.com/containerd/stargz-snapshotter/cmd/containerd-stargz-grpc@VERSION` is "
        "refused: that module has replace directives (and this machine's Go proxy serves no "
        "version of it); set $STARGZ_GRPC to a build of stargz-snapshotter"),
}

# env var -> the record of its last lookup, in lookup order; bench/run takes them per bench.
_LOOKED_UP = {}


def find(env_var, *names):
    """Path of a program: $env_var if set, else the first of names (PEERS' if none are
    given) on PATH, else None. The lookup is recorded for `looked_up`."""
    peer = PEERS.get(env_var, Peer(env_var.lower(), names, None, None))
    names = names or peer.names
    path, why, short = None, None, None
    if os.environ.get(env_var):
        given = os.environ[env_var]
        if os.access(given, os.X_OK):
            path = given
        else:
            why = short = f"${env_var} = {given} is not an executable program"
    else:
        path = next(filter(None, map(shutil.which, names)), None)
        if not path:
            why = (f"{' or '.join(names)} not on PATH: " +
                   (peer.unavailable or f"install it with `./scripts/setup --bench` "
                                        f"({peer.source})"))
            short = (f"{peer.label} is missing: " +
                     (f"no registry offers it for Debian 12 (set ${env_var})"
                      if peer.unavailable else "`./scripts/setup --bench` installs it"))
    _LOOKED_UP[env_var] = {"peer": peer.label, "env": env_var, "path": path,
                           "from_env": bool(path and os.environ.get(env_var)),
                           "version": version(path) if path else None,
                           "package": package_of(path) if path else None,
                           "source": peer.source, "not_measured_because": why,
                           "short": short}
    return path


def looked_up(reset=False):
    """The records of the peers looked up so far (each: peer, env, path, version, package,
    source, and not_measured_because for a missing one); `reset` starts a new list."""
    out = list(_LOOKED_UP.values())
    if reset:
        _LOOKED_UP.clear()
    return out


def missing(env_var):
    """Why the peer of env_var was not found in its last lookup, in a few words (the whole
    story is in the run's peer summary and the report), or None."""
    r = _LOOKED_UP.get(env_var)
    return r and r["short"]


def package_of(path):
    """"PACKAGE VERSION" of the Debian package that installed path, or None."""
    real = os.path.realpath(path)
    if not shutil.which("dpkg-query"):
        return None
    for p in dict.fromkeys((real, path, re.sub(r"^/usr(?=/s?bin/)", "", real))):
        out = subprocess.run(["dpkg-query", "-S", p], capture_output=True, text=True)
        if out.returncode == 0:
            pkg = out.stdout.split(":", 1)[0].strip()
            ver = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg],
                                 capture_output=True, text=True).stdout.strip()
            return f"{pkg} {ver}"
    return None


def peer_summary(env_vars):
    """Lines naming each peer of env_vars: found (its path and version) or not measured,
    and why; looks each up."""
    lines = []
    for env in env_vars:
        find(env)
        r = _LOOKED_UP[env]
        if r["path"]:
            pkg = f", Debian {r['package']}" if r["package"] else ""
            lines.append(f"  {r['peer']}: {r['path']} (version {r['version']}{pkg})")
        else:
            lines.append(f"  {r['peer']}: NOT MEASURED, because {r['not_measured_because']}")
    return lines


def version(path, flag="--version"):
    """The program's version: the first 'N.N[.N]' after its own name in what it prints for
    flag (else for -version, then --help: programs differ), else the first in the first
    line it prints for flag; 'unknown' if none."""
    name = re.escape(os.path.basename(path))
    first = None
    for f in dict.fromkeys((flag, "-version", "--help")):
        try:
            out = subprocess.run([path, f], capture_output=True, text=True, timeout=10,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        text = out.stdout + "\n" + out.stderr
        m = re.search(name + r"[^\n\d]*?(\d+\.\d+(\.\d+)?)", text)
        if m:
            return m.group(1)
        if first is None:
            lines = (out.stdout or out.stderr).splitlines()
            m = re.search(r"\d+\.\d+(\.\d+)?", lines[0]) if lines else None
            first = m.group(0) if m else "unknown"
    return first


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
