"""Real input trees, prepared once and cached outside the repository.

Cache directory: $VERILAY_BENCH_DATA, default /var/tmp/verilay-bench.
  linux-source-6.1/  Debian's linux-source-6.1 tarball, extracted (~78k files)
  usr-share/         a copy of a few /usr/share directories (~35k files), for --quick
  small-files/       Documentation/ and include/linux/ of the Linux source (~11.5k files)
  labelled/          usr-share + /usr/include, every entry with security.selinux (~62k)
A tree is built under a temporary name and renamed into place when complete,
so an interrupted preparation is redone rather than half-used.
"""

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field

DATA_DIR = os.environ.get("VERILAY_BENCH_DATA", "/var/tmp/verilay-bench")

LINUX_PACKAGE = "linux-source-6.1"
LINUX_TARBALL = f"/usr/src/{LINUX_PACKAGE}.tar.xz"
SMALL_FILES_PARTS = ["Documentation", "include/linux"]
USR_SHARE_PARTS = ["/usr/share/doc", "/usr/share/locale", "/usr/share/man",
                   "/usr/share/perl"]


@dataclass
class Dataset:
    name: str
    path: str
    origin: str
    stats: dict = field(default_factory=dict)  # filled in by warm()

    def describe(self):
        s = self.stats
        return (f"{self.name}: {s['files']:,} files, {s['dirs']:,} dirs, "
                f"{s['symlinks']:,} symlinks, {s['bytes'] / 2**20:,.0f} MiB")


def _prepare(name, fill):
    """Return DATA_DIR/name, creating it with fill(tmpdir) the first time."""
    path = os.path.join(DATA_DIR, name)
    if not os.path.isdir(path):
        tmp = os.path.join(DATA_DIR, f".{name}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        print(f"preparing dataset {name} in {path} (once)", flush=True)
        fill(tmp)
        os.rename(tmp, path)
    return path


def linux():
    def fill(tmp):
        if not os.path.exists(LINUX_TARBALL):
            print(f"{LINUX_TARBALL} missing: apt-get install {LINUX_PACKAGE}", flush=True)
            subprocess.run(["apt-get", "install", "-y", "-q", LINUX_PACKAGE], check=True,
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        subprocess.run(["tar", "-xf", LINUX_TARBALL, "-C", tmp], check=True)
        # The tarball holds one top directory; make it the dataset root.
        (top,) = os.listdir(tmp)
        for entry in os.listdir(os.path.join(tmp, top)):
            os.rename(os.path.join(tmp, top, entry), os.path.join(tmp, entry))
        os.rmdir(os.path.join(tmp, top))

    return Dataset(LINUX_PACKAGE, _prepare(LINUX_PACKAGE, fill), LINUX_TARBALL)


def usr_share():
    def fill(tmp):
        for src in USR_SHARE_PARTS:
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(tmp, os.path.basename(src)),
                                symlinks=True)

    return Dataset("usr-share", _prepare("usr-share", fill), " ".join(USR_SHARE_PARTS))


def small_files():
    """Seed 0's rsync tree ("a 55 MiB directory with ~12k of mostly small files"): the
    Linux 6.1 source's Documentation/ and include/linux/, ~11.5k files, ~61 MiB (median
    file 2 KiB)."""
    def fill(tmp):
        src = linux().path
        for part in SMALL_FILES_PARTS:
            shutil.copytree(os.path.join(src, part), os.path.join(tmp, part), symlinks=True)

    return Dataset("small-files", _prepare("small-files", fill),
                   " + ".join(f"{LINUX_PACKAGE}/{p}" for p in SMALL_FILES_PARTS))


def python_install():
    """A Python installation that runs chrooted, as a container image's would: the host's
    /usr/bin/python3.X (and the python3 link), its standard library /usr/lib/python3.X
    without dist-packages, /etc/python3.X, every shared library the interpreter and its
    extension modules load (ldd, symlink chains kept), the merged-/usr links (/lib, ...)
    and /etc/os-release. ~60 MiB, ~1k files."""
    exe = os.path.realpath("/usr/bin/python3")
    name = os.path.basename(exe)
    stdlib = f"/usr/lib/{name}"

    def fill(tmp):
        for d in ("usr/bin", "usr/lib", "usr/lib64", "usr/sbin", "etc"):
            os.makedirs(os.path.join(tmp, d))
        for top in ("/bin", "/sbin", "/lib", "/lib64"):
            if os.path.islink(top):
                os.symlink(os.readlink(top), os.path.join(tmp, top[1:]))
        shutil.copy2(exe, os.path.join(tmp, "usr/bin", name))
        os.symlink(name, os.path.join(tmp, "usr/bin/python3"))
        shutil.copytree(stdlib, os.path.join(tmp, stdlib[1:]), symlinks=True,
                        ignore=shutil.ignore_patterns("dist-packages"))
        if os.path.isdir(f"/etc/{name}"):
            shutil.copytree(f"/etc/{name}", os.path.join(tmp, "etc", name), symlinks=True)
        shutil.copyfile("/etc/os-release", os.path.join(tmp, "etc/os-release"))
        modules = os.path.join(stdlib, "lib-dynload")
        for binary in [exe] + [os.path.join(modules, m) for m in sorted(os.listdir(modules))]:
            for lib in _shared_libraries(binary):
                _copy_chain(lib, tmp)

    return Dataset("python", _prepare(f"python-{name}", fill),
                   f"{exe}, {stdlib} (no dist-packages), /etc/{name}, their libraries")


def _shared_libraries(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    return [w for line in out.splitlines() for w in line.split() if w.startswith("/")]


def _copy_chain(path, root):
    """Copies path into root at the same place, and if it is a symlink, what it points
    to as well (each link kept as a link)."""
    while True:
        dest = os.path.join(root, path.lstrip("/"))
        if os.path.lexists(dest):
            return
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.islink(path):
            shutil.copy2(path, dest)
            return
        target = os.readlink(path)
        os.symlink(target, dest)
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))


def for_run(quick):
    """The datasets a run uses: the small tree only with --quick."""
    return [usr_share()] if quick else [linux(), usr_share()]


def warm(ds):
    """Read every file of the tree once (page cache warm) and count what is there."""
    stats = {"files": 0, "dirs": 0, "symlinks": 0, "other": 0, "bytes": 0}
    buf = bytearray(1 << 20)
    for root, dirs, files in os.walk(ds.path):
        stats["dirs"] += 1
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                stats["symlinks"] += 1
            elif stat.S_ISREG(mode):
                stats["files"] += 1
                with open(path, "rb", buffering=0) as f:
                    while n := f.readinto(buf):
                        stats["bytes"] += n
            else:
                stats["other"] += 1
    ds.stats = stats
    return stats


def scratch_dir(name):
    """An empty directory for outputs, on the same filesystem as the datasets. What a run
    that was killed left mounted there is unmounted first (lazily, deepest first)."""
    path = os.path.join(DATA_DIR, "scratch", name)
    left = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == path or point.startswith(path + "/"):
                left.append(point)
    for point in sorted(left, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


LABEL = b"system_u:object_r:usr_t:s0"
# A v2 file capability (vfs_cap_data, VFS_CAP_REVISION_2) granting cap_net_raw, as
# /usr/bin/ping carries on distributions without setuid.
CAPABILITY = bytes.fromhex("0100000200200000000000000000000000000000")


def labelled():
    """A tree as Fedora/RHEL images have them (issue 21): a copy of usr-share and
    /usr/include where every entry (symlinks too) carries `security.selinux`, one
    regular file in 50 `security.capability`, and one directory in 20 a POSIX ACL
    (access and default). ~62k entries."""
    def fill(tmp):
        shutil.copytree(usr_share().path, os.path.join(tmp, "share"), symlinks=True)
        shutil.copytree("/usr/include", os.path.join(tmp, "include"), symlinks=True)
        n = 0
        acl_dirs = []
        for root, dirs, files in os.walk(tmp):
            for name in dirs + files:
                p = os.path.join(root, name)
                os.setxattr(p, "security.selinux", LABEL, follow_symlinks=False)
                n += 1
                if name in files and not os.path.islink(p) and n % 50 == 0:
                    os.setxattr(p, "security.capability", CAPABILITY)
                if name in dirs and n % 20 == 0:
                    acl_dirs.append(p)
        os.setxattr(tmp, "security.selinux", LABEL)
        for i in range(0, len(acl_dirs), 200):
            subprocess.run(["setfacl", "-m", "u:nobody:rx,d:u:nobody:rx", *acl_dirs[i:i + 200]],
                           check=True)

    return Dataset("labelled", _prepare("labelled", fill),
                   "usr-share + /usr/include, every entry with security.selinux")
