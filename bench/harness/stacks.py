"""Writable merged stacks for the benchmarks that compare verilay's upper directory with
the kernel's overlayfs and fuse-overlayfs."""

import os
import shutil
import subprocess
import time


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
