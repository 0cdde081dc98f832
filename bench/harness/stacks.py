"""Writable merged stacks for the benchmarks that compare verilay's upper directory with
the kernel's overlayfs and fuse-overlayfs."""

import os
import shutil
import subprocess
import time

from harness import report, tools, transport

# Room for meta's three create-1m storms (500 MiB each) and its trees, with margin.
UPPERS_SIZE = 8 << 30


def start(name, ctx, scratch, settings):
    """What the C-driven writable-stack benchmarks (meta, storm) need before they run:
    (data, verilay, fuse-overlayfs or None, C compiler), or data with the reason it was
    skipped and None for the rest."""
    verilay, why = tools.verilay(scratch)
    fov = tools.find("FUSE_OVERLAYFS")
    data = report.bench_data(name, ctx, settings,
                             {"peers": {"fuse-overlayfs": fov}, "results": {}, "targets": []})
    cc = shutil.which("cc") or shutil.which("gcc")
    if not verilay or os.geteuid() != 0 or not cc:
        reason = why or ("needs root (kernel mounts)" if cc else "needs a C compiler")
        print(f"{name} bench skipped: {reason}")
        data["targets"].append(report.target(name, None, reason))
        return data, None, None, None
    if not fov:
        print(f"fuse-overlayfs: not measured, because {tools.missing('FUSE_OVERLAYFS')}")
    return data, verilay, fov, cc


def unmount_all(mountpoints):
    """Detaches the mounts, last first, and gives their daemons a moment to exit."""
    for m in reversed(mountpoints):
        subprocess.run(["umount", "-l", m], stderr=subprocess.DEVNULL)
    if mountpoints:
        time.sleep(0.3)


class FreshFs:
    """A filesystem of type `fstype` (an mkfs type) made afresh in a loop-mounted sparse
    file in `scratch` and mounted at `mountpoint` by every `make()`, so no run inherits
    the previous one's deletions: ext4 without a journal (this machine's root) skips
    inodes freed in the last ~35 s when it allocates, which made creates 30x slower for
    whichever tool ran after a removal. `drop()` unmounts it (waiting for FUSE daemons
    to let go of directories on it) and deletes the file."""

    def __init__(self, scratch, fstype, mountpoint, size=UPPERS_SIZE):
        self.scratch, self.fstype, self.mountpoint, self.size = scratch, fstype, mountpoint, size
        self.img = None

    def make(self):
        """Makes and mounts a new, empty filesystem at self.mountpoint."""
        self.drop()
        self.img = os.path.join(self.scratch, "uppers.img")
        with open(self.img, "wb") as f:
            f.truncate(self.size)
        # Inode tables and journal written now, not by a kernel thread during the runs.
        extra = ["-E", "lazy_itable_init=0,lazy_journal_init=0"] if "ext" in self.fstype else []
        subprocess.run([f"mkfs.{self.fstype}", "-q", *extra, self.img], check=True,
                       stdout=subprocess.DEVNULL)
        os.makedirs(self.mountpoint, exist_ok=True)
        subprocess.run(["mount", "-o", "loop", self.img, self.mountpoint], check=True)

    def drop(self):
        if self.img:
            # The FUSE daemons let go of their upper directories as they exit.
            for _ in range(50):
                if subprocess.run(["umount", self.mountpoint],
                                  stderr=subprocess.DEVNULL).returncode == 0:
                    break
                time.sleep(0.1)
            else:
                subprocess.run(["umount", "-l", self.mountpoint], check=True)
            os.unlink(self.img)
            self.img = None


class WritableStacks:
    """One image as the lower layer of a writable stack, mounted side by side by the
    kernel's overlayfs and fuse-overlayfs (both over the image's kernel erofs mount) and
    `verilay mount --upper` once per FUSE transport (`verilay-uring`, `verilay-dev`), and
    with `kernel` by the kernel engine (`verilay-kernel`: harness.transport); `up()` mounts
    them afresh, with empty upper directories, and returns {tool: mountpoint}.
    fuse-overlayfs is left out when `fov` is None.
    `served_over[tool]` is what each verilay mount said it was served over, last time.

    With `fresh_fs` (an mkfs type), the upper and work directories live on a filesystem
    made afresh in a loop-mounted sparse file for every `up()` (a FreshFs: see there
    why)."""

    PEERS = ("overlay", "fuse-overlayfs")

    def __init__(self, scratch, image, verilay, fov, transports, fresh_fs=None, kernel=False):
        self.scratch, self.image, self.verilay, self.fov = scratch, image, verilay, fov
        self.fresh_fs = fresh_fs
        self.tools = [t for t in self.PEERS if t != "fuse-overlayfs" or fov]
        self.tools += transport.verilay_tools(transports, kernel)
        self.lower = os.path.join(scratch, "lower")
        os.makedirs(self.lower, exist_ok=True)
        subprocess.run(["mount", "-t", "erofs", "-o", "ro", image, self.lower], check=True)
        self.mounted = []
        self.served_over = {}
        self.uppers = os.path.join(scratch, "mounts")
        self.fresh = FreshFs(scratch, fresh_fs, self.uppers) if fresh_fs else None

    def up(self, rotate=0):
        """Mounts the stacks afresh; `rotate` shifts which tool comes first in the
        returned order, so no tool always runs right after the same other one."""
        self.down()
        if self.fresh:
            self.fresh.make()
        where = {}
        r = rotate % len(self.tools)
        for tool in self.tools[r:] + self.tools[:r]:
            base = os.path.join(self.uppers, tool)
            shutil.rmtree(base, ignore_errors=True)
            up, work, mnt = (os.path.join(base, x) for x in ("up", "work", "mnt"))
            for p in (up, work, mnt):
                os.makedirs(p)
            opts = f"lowerdir={self.lower},upperdir={up},workdir={work}"
            if tool == "overlay":
                subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, mnt],
                               check=True)
            elif tool == "fuse-overlayfs":
                subprocess.run([self.fov, "-o", opts, mnt], check=True)
            else:
                self.served_over[tool] = transport.mount_tool(
                    self.verilay, [self.image], mnt, tool, ["--upper", up, "--work", work])
            self.mounted.append(mnt)
            where[tool] = mnt
        return where

    def record(self, data):
        """Notes in the JSON what the verilay mounts said they were served over."""
        for tool, said in self.served_over.items():
            transport.record(data, tool, said)

    def down(self):
        unmount_all(self.mounted)
        self.mounted = []

    def close(self):
        self.down()
        if self.fresh:
            self.fresh.drop()
        subprocess.run(["umount", "-l", self.lower], stderr=subprocess.DEVNULL)
