"""meta: small-file and metadata storms on a writable merged tree.

One image of a small tree as the lower layer with an empty upper directory, mounted three
ways side by side, each freshly for every run, with the upper directories on an ext4
(with its journal, as mkfs makes it) made afresh in a loop file for that run, and the
tools taking turns at going first:

  overlay          the kernel's overlayfs (lower: the image's kernel erofs mount)
  fuse-overlayfs   fuse-overlayfs over that same kernel erofs mount
  verilay-uring    `verilay mount IMAGE --upper --work --engine fuse --transport uring`
                   (FUSE over io_uring)
  verilay-dev      the same with `--transport dev` (/dev/fuse)
  verilay-kernel   the kernel engine (`--engine kernel`): the kernel's overlayfs over the
                   kernel's erofs of the image file verilay serves and verifies

Workloads (a small C program for the storms, so the harness is not what is measured):

  create-0, create-1k, create-1m
                 FS-Mark style: 500 files of 0 B, 1 KiB and 1 MiB spread over 32
                 subdirectories (no fsync); files per second
  stat, rename, remove
                 mdtest style: 8000 files (2000 with --quick) in 32 directories, then each
                 one stat()ed (right after the creates), renamed within its directory, and
                 unlinked; operations per second
  rsync          `rsync -a` of a real tree of small files into the mount; seconds
  untar, rm-rf   `tar -x` of that tree into the mount, then `rm -rf` of it; seconds

Targets (issue 21), for each transport of the FUSE engine: every workload within 1.5x of
the kernel's overlayfs's rate, and ahead of fuse-overlayfs's; issue 5's "2x fuse-overlayfs"
is printed as INFO. The kernel engine: every workload within 1.1x of the kernel's
overlayfs's rate.
"""

import os
import shutil
import statistics
import subprocess

from harness import csrc, datasets, report, stacks, tools, transport
from harness.timing import timed

DESCRIPTION = "small-file and metadata storms on a writable merged tree vs overlayfs, fuse-overlayfs"
USES = ["FUSE_OVERLAYFS"]

PEER_SPEEDUP = 2.0
KERNEL_RATIO = 1.5
KERNEL_ENGINE_RATIO = 1.1  # kernel overlayfs's rate over the kernel engine's, at most

META_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
""" + csrc.NOW + csrc.CREATE + r"""
/* meta DIR NFILES NDIRS SIZE: creates, stats (right after creating), renames (within
   their directory) and removes; prints four rates. */
int main(int argc, char **argv) {
    if (argc != 5)
        return 2;
    const char *dir = argv[1];
    int n = atoi(argv[2]), nd = atoi(argv[3]);
    long size = atol(argv[4]);
    double t0;
    int rc = create_files(dir, n, nd, size, O_WRONLY, &t0);
    if (rc)
        return rc;
    double t1 = now();
    char p[4096];
    struct stat st;
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/d%02d/f%06d", dir, i % nd, i);
        if (stat(p, &st))
            return 6;
    }
    double t2 = now();
    char q[4096];
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/d%02d/f%06d", dir, i % nd, i);
        snprintf(q, sizeof q, "%s/d%02d/r%06d", dir, i % nd, i);
        if (rename(p, q))
            return 8;
    }
    double t3 = now();
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/d%02d/r%06d", dir, i % nd, i);
        if (unlink(p))
            return 7;
    }
    double t4 = now();
    printf("%.1f %.1f %.1f %.1f\n", n / (t1 - t0), n / (t2 - t1), n / (t3 - t2),
           n / (t4 - t3));
    return 0;
}
"""


@transport.uring_switch
def run(ctx):
    scratch = datasets.scratch_dir("meta")
    data, verilay, fov, cc = stacks.start("meta", ctx, scratch, {})
    if not verilay:
        return data
    binary = tools.compile_c(cc, META_C, os.path.join(scratch, "meta"))
    # The real tree of small files: /usr/share/doc from the usr-share dataset.
    tree = os.path.join(datasets.usr_share().path, "doc")
    tarball = os.path.join(scratch, "tree.tar")
    subprocess.run(["tar", "-C", tree, "-cf", tarball, "."], check=True)
    nfiles = sum(len(fs) for _, _, fs in os.walk(tree))
    data["settings"]["tree_files"] = nfiles
    lower_src = os.path.join(scratch, "lower-src")
    os.makedirs(os.path.join(lower_src, "etc"))
    with open(os.path.join(lower_src, "etc", "hostname"), "w") as f:
        f.write("bench\n")
    image = os.path.join(scratch, "lower.img")
    subprocess.run([verilay, "build", lower_src, "-o", image, "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    storms = {"create-0": (500, 0), "create-1k": (500, 1024), "create-1m": (500, 1 << 20)}
    n_md = 2000 if ctx.quick else 8000
    samples = {}
    kernel = transport.kernel_column(verilay, data)
    mounts = stacks.WritableStacks(scratch, image, verilay, fov, ctx.transports,
                                   fresh_fs="ext4", kernel=kernel)
    try:
        for i in range(ctx.runs):
            print(f"  run {i + 1}/{ctx.runs}", flush=True)
            where = mounts.up(rotate=i)
            mounts.record(data)
            for tool, mnt in where.items():
                for wl, (n, size) in storms.items():
                    d = os.path.join(mnt, wl)
                    os.makedirs(d)
                    os.sync()
                    out = subprocess.run([binary, d, str(n), "32", str(size)], check=True,
                                         capture_output=True, text=True).stdout.split()
                    samples.setdefault((wl, tool), []).append(float(out[0]))
                d = os.path.join(mnt, "md")
                os.makedirs(d)
                os.sync()
                out = subprocess.run([binary, d, str(n_md), "32", "0"], check=True,
                                     capture_output=True, text=True).stdout.split()
                samples.setdefault(("stat", tool), []).append(float(out[1]))
                samples.setdefault(("rename", tool), []).append(float(out[2]))
                samples.setdefault(("remove", tool), []).append(float(out[3]))
                dst = os.path.join(mnt, "rsync")
                secs = timed(["rsync", "-a", tree + "/", dst + "/"])
                samples.setdefault(("rsync", tool), []).append(nfiles / secs)
                dst = os.path.join(mnt, "untar")
                os.makedirs(dst)
                secs = timed(["tar", "-xf", tarball, "-C", dst])
                samples.setdefault(("untar", tool), []).append(nfiles / secs)
                secs = timed(["rm", "-rf", dst])
                samples.setdefault(("rm-rf", tool), []).append(nfiles / secs)
    finally:
        mounts.close()
    shutil.rmtree(scratch, ignore_errors=True)

    workloads = list(dict.fromkeys(wl for wl, _ in samples))
    tools_seen = [t for t in mounts.tools if any(t == u for _, u in samples)]
    for wl in workloads:
        data["results"][wl] = {t: {"per_s": samples[(wl, t)], "median": statistics.median(samples[(wl, t)])}
                               for t in tools_seen}
    both = all(transport.tool_name(t) in tools_seen for t in transport.TRANSPORTS)
    kernel = transport.KERNEL in tools_seen
    fuse = next((t for t in tools_seen if transport.transport_of(t)), None)
    rows = [[wl] + [f"{data['results'][wl][t]['median']:,.0f}" for t in tools_seen]
            + ([f"{uring_over_dev(data['results'][wl]):.2f}"] if both else [])
            + ([f"{overlay_over_kernel(data['results'][wl]):.2f}"] if kernel else [])
            + ([f"{data['results'][wl][transport.KERNEL]['median'] / data['results'][wl][fuse]['median']:.2f}"]
               if kernel and fuse else [])
            for wl in workloads]
    print()
    report.print_table(["per second"] + tools_seen + (["uring/dev"] if both else [])
                       + (["overlay/kernel-engine"] if kernel else [])
                       + ([f"kernel-engine/{fuse}"] if kernel and fuse else []), rows)
    if "fuse-overlayfs" not in tools_seen:
        print("fuse-overlayfs: not measured, because "
              f"{tools.missing('FUSE_OVERLAYFS') or 'it did not run'}")
    print()
    vtools = [t for t in tools_seen if transport.transport_of(t)]
    for tool in vtools:
        for wl in workloads:
            data["targets"] += targets_for(data["results"][wl], wl, tool)
    if kernel:
        for wl in workloads:
            ratio = overlay_over_kernel(data["results"][wl])
            data["targets"].append(report.target(
                f"{wl} {transport.KERNEL} vs kernel overlayfs", ratio <= KERNEL_ENGINE_RATIO,
                f"overlayfs {ratio:.2f}x its rate (target <= {KERNEL_ENGINE_RATIO}x)"))
    for tool in vtools:
        for wl in workloads:
            r = data["results"][wl]
            if "fuse-overlayfs" in r:
                ratio = r[tool]["median"] / r["fuse-overlayfs"]["median"]
                print(f"INFO  {wl} {tool}: {ratio:.2f}x fuse-overlayfs's rate (issue 5 asked "
                      f">= {PEER_SPEEDUP}x)")
    return data


def overlay_over_kernel(r):
    """The kernel overlayfs's median rate over the kernel engine's."""
    return r["overlay"]["median"] / r[transport.KERNEL]["median"]


def uring_over_dev(r):
    """io_uring's median rate over /dev/fuse's."""
    return (r[transport.tool_name("uring")]["median"]
            / r[transport.tool_name("dev")]["median"])


def targets_for(r, wl, tool):
    """Issue 21's targets for one workload and one verilay column: within 1.5x of the
    kernel's overlayfs, and ahead of fuse-overlayfs."""
    t = []
    v = r[tool]["median"]
    ratio = r["overlay"]["median"] / v
    t.append(report.target(
        f"{wl} {tool} vs kernel overlayfs", ratio <= KERNEL_RATIO,
        f"overlayfs {ratio:.2f}x verilay's rate (target <= {KERNEL_RATIO}x)"))
    if "fuse-overlayfs" in r:
        ratio = v / r["fuse-overlayfs"]["median"]
        t.append(report.target(
            f"{wl} {tool} vs fuse-overlayfs", ratio > 1.0,
            f"verilay {ratio:.2f}x its rate (target > 1x)"))
    else:
        t.append(report.not_measured(f"{wl} {tool} vs fuse-overlayfs",
                                     tools.missing("FUSE_OVERLAYFS") or "it did not run"))
    return t


def plot(data, png_path):
    if not data["results"]:
        return
    rows = [(wl, {"rate": [{"label": t, "value": r["median"], "lo": min(r["per_s"]),
                            "hi": max(r["per_s"])} for t, r in per.items()]})
            for wl, per in data["results"].items()]
    report.bar_grid(png_path, "metadata storms on a writable merged tree (higher is better)",
                    rows, [("rate", "per second")])
