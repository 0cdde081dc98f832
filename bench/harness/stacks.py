"""Writable merged stacks for the benchmarks that compare verilay's upper directory with
the kernel's overlayfs and fuse-overlayfs."""

import os
import shutil
import subprocess
import time

from harness import report, tools


def start(name, ctx, scratch, settings):
    """What the C-driven writable-stack benchmarks (meta, storm) need before they run:
    (data, verilay, fuse-overlayfs or None, C compiler), or data with the reason it was
    skipped and None for the rest."""
    verilay, why = tools.verilay(scratch)
    fov = tools.find("FUSE_OVERLAYFS", "fuse-overlayfs")
    data = {"bench": name, "host": report.host_info(),
            "verilay_revision": tools.git_revision(),
            "settings": {"runs": ctx.runs, "quick": ctx.quick, **settings},
            "peers": {"fuse-overlayfs": fov}, "results": {}, "targets": []}
    cc = shutil.which("cc") or shutil.which("gcc")
    if not verilay or os.geteuid() != 0 or not cc:
        reason = why or ("needs root (kernel mounts)" if cc else "needs a C compiler")
        print(f"{name} bench skipped: {reason}")
        data["targets"].append(report.target(name, None, reason))
        return data, None, None, None
    if not fov:
        print("fuse-overlayfs: not found (apt-get install fuse-overlayfs); its rows are skipped")
    return data, verilay, fov, cc


class WritableStacks:
    """One image as the lower layer of a writable stack, mounted side by side by the
    kernel's overlayfs and fuse-overlayfs (both over the image's kernel erofs mount) and
    `verilay mount --upper`; `up()` mounts them afresh, with empty upper directories, and
    returns {tool: mountpoint}. fuse-overlayfs is left out when `fov` is None."""

    def __init__(self, scratch, image, verilay, fov):
        self.scratch, self.image, self.verilay, self.fov = scratch, image, verilay, fov
        self.lower = os.path.join(scratch, "lower")
        os.makedirs(self.lower, exist_ok=True)
        subprocess.run(["mount", "-t", "erofs", "-o", "ro", image, self.lower], check=True)
        self.mounted = []

    def up(self):
        self.down()
        where = {}
        for tool in ("overlay", "fuse-overlayfs", "verilay"):
            if tool == "fuse-overlayfs" and not self.fov:
                continue
            base = os.path.join(self.scratch, "mounts", tool)
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
                subprocess.run([self.verilay, "mount", self.image, "--upper", up, "--work",
                                work, mnt, "--quiet"], check=True)
            self.mounted.append(mnt)
            where[tool] = mnt
        return where

    def down(self):
        for m in reversed(self.mounted):
            subprocess.run(["umount", "-l", m], stderr=subprocess.DEVNULL)
        if self.mounted:
            time.sleep(0.3)
        self.mounted = []

    def close(self):
        self.down()
        subprocess.run(["umount", "-l", self.lower], stderr=subprocess.DEVNULL)
