"""labelled: walking a tree whose every entry carries `security.selinux` (issue 21).

The tree (datasets.labelled: usr-share + /usr/include, ~62k entries, every one labelled,
one file in 50 with `security.capability`, one directory in 20 with ACLs) as one verilay
image, mounted side by side by the kernel (`mount -t erofs` of the image file) and by
verilay: the FUSE engine once per transport (verilay-uring, verilay-dev) and the kernel
engine (verilay-kernel: the kernel's erofs on the image file verilay serves and verifies).
Workloads, each cold (caches dropped) and warm (the same again):

  ls-lR       `ls -lR`: per entry an lstat, and the security.selinux and ACL lookups of
              coreutils (the kernel caches no xattr reply from a FUSE server, so each is a
              round trip; a tool's getxattr is two: the size, then the value)
  stat-walk   `find -printf '%s %m %u %T@'` (lstat only)
  getfattr    `getfattr -R -P -h -n security.selinux` (the label of every entry)

Then per-operation latency, warm, from a small C program timing each call over every path
(clock_gettime around the call): lstat, lgetxattr of security.selinux, open+close of
regular files; median and p99 in microseconds.

Targets, for each transport of the FUSE engine: warm ls -lR within 2x of the kernel's
erofs; every other row within 1.3x. The kernel engine: every row, cold and warm, within
1.1x of the kernel's erofs.
"""

import os
import shutil
import subprocess

from harness import csrc, datasets, report, timing, tools, transport
from benches import mount
from benches.mount import (build_images, kernel_engine_targets, mounts_for, record_served_over,
                           timed_shell)

DESCRIPTION = "a labelled tree (security.selinux on every entry): verilay vs kernel erofs"

LS_WARM_RATIO = 2.0
OTHER_RATIO = 1.3

WORKLOADS = {
    "ls-lR": "ls -lR . > /dev/null",
    "stat-walk": "find . -printf '%s %m %u %T@\\n' > /dev/null",
    "getfattr": "getfattr -R -P -h -n security.selinux . > /dev/null 2>&1",
}

LATENCY_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>
""" + csrc.NOW_US + r"""
static void report(const char *op, double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp);
    printf("%s %zu %.2f %.2f\n", op, n, v[n / 2], v[n * 99 / 100]);
}
/* argv[1]: file of paths (one per line, relative to the cwd). */
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "r");
    size_t cap = 1 << 17, n = 0;
    char **paths = malloc(cap * sizeof *paths), line[4096];
    while (fgets(line, sizeof line, f) && n < cap) {
        line[strcspn(line, "\n")] = 0;
        paths[n++] = strdup(line);
    }
    double *v = malloc(n * sizeof *v);
    size_t k = 0;
    struct stat st;
    char buf[256];
    for (size_t i = 0; i < n; i++) {
        double t = now_us();
        lstat(paths[i], &st);
        v[k++] = now_us() - t;
    }
    report("lstat", v, k);
    k = 0;
    for (size_t i = 0; i < n; i++) {
        double t = now_us();
        lgetxattr(paths[i], "security.selinux", buf, sizeof buf);
        v[k++] = now_us() - t;
    }
    report("getxattr", v, k);
    k = 0;
    for (size_t i = 0; i < n; i++) {
        if (lstat(paths[i], &st) || !S_ISREG(st.st_mode))
            continue;
        double t = now_us();
        int fd = open(paths[i], O_RDONLY);
        if (fd >= 0)
            close(fd);
        v[k++] = now_us() - t;
    }
    report("open", v, k);
    return 0;
}
"""


def latencies(binary, mnt, paths_file):
    """{op: {"n", "median_us", "p99_us"}} of one warm pass over every path."""
    out = subprocess.run([binary, paths_file], cwd=mnt, check=True, capture_output=True,
                         text=True).stdout
    res = {}
    for line in out.splitlines():
        op, n, med, p99 = line.split()
        res[op] = {"n": int(n), "median_us": float(med), "p99_us": float(p99)}
    return res


@transport.uring_switch
def run(ctx):
    scratch = datasets.scratch_dir("labelled")
    verilay, why = tools.verilay(scratch)
    cc = shutil.which("cc") or shutil.which("gcc")
    data = report.bench_data("labelled", ctx, {"transports": ctx.transports},
                             {"results": [], "latency": {}, "targets": []})
    if not verilay or not cc or timing.drop_caches() is not None:
        reason = why or ("needs a C compiler" if not cc else "needs root (mounts, caches)")
        print(f"labelled bench skipped: {reason}")
        data["targets"].append(report.target("labelled", None, reason))
        return data
    ds = datasets.labelled()
    datasets.warm(ds)
    print(ds.describe(), flush=True)
    data["dataset"] = {"name": ds.name, **ds.stats}
    images = build_images(verilay, ds.path, scratch, "tree", with_squash=False)
    kernel = transport.kernel_column(verilay, data)
    mounts = mounts_for(images, scratch, "tree", verilay, {}, ctx.transports, kernel)
    binary = tools.compile_c(cc, LATENCY_C, os.path.join(scratch, "latency"))
    paths_file = os.path.join(scratch, "paths")
    with open(paths_file, "w") as f:
        for root, dirs, files in os.walk(ds.path):
            for name in dirs + files:
                f.write(os.path.relpath(os.path.join(root, name), ds.path) + "\n")

    results = {}
    for m in mounts:
        m.mount()
    record_served_over(data, mounts)
    try:
        for wl, script in WORKLOADS.items():
            for i in range(ctx.runs):
                print(f"  {wl}: run {i + 1}/{ctx.runs}", flush=True)
                r0 = i % len(mounts)
                order = mounts[r0:] + mounts[:r0]
                for m in order:
                    r = results.setdefault((wl, m.tool), {"cold": [], "warm": []})
                    timing.drop_caches()
                    r["cold"].append(timed_shell(script, m.dir))
                    r["warm"].append(timed_shell(script, m.dir))
        for m in mounts:
            timed_shell(WORKLOADS["ls-lR"], m.dir)  # warm every entry first
            data["latency"][m.tool] = latencies(binary, m.dir, paths_file)
    finally:
        for m in mounts:
            m.umount()
    mount.record_results(data, results)
    shutil.rmtree(scratch, ignore_errors=True)
    print_results(data)
    data["targets"] = check_targets(data)
    return data


def print_results(data):
    mount.print_results(data)
    print("per-operation latency, warm (µs):")
    rows = [[op, tool, str(v["n"]), f"{v['median_us']:.1f}", f"{v['p99_us']:.1f}"]
            for tool, ops in data["latency"].items() for op, v in ops.items()]
    report.print_table(["op", "tool", "calls", "median", "p99"], rows, left=2)
    print()


def check_targets(data):
    by = {(r["workload"], r["tool"]): r for r in data["results"]}
    t = []
    for tool in transport.verilay_tools(data["settings"]["transports"]):
        for wl in WORKLOADS:
            vl, k = by.get((wl, tool)), by.get((wl, "kernel-erofs"))
            if not vl or not k:
                continue
            for temp in ("cold", "warm"):
                limit = LS_WARM_RATIO if (wl, temp) == ("ls-lR", "warm") else OTHER_RATIO
                ratio = vl[f"{temp}_median"] / k[f"{temp}_median"]
                t.append(report.target(f"{wl} {temp} {tool} vs kernel erofs", ratio <= limit,
                                       f"{ratio:.2f}x kernel's time (target <= {limit}x)"))
    return t + kernel_engine_targets(data["results"])


def plot(data, png):
    if not data.get("results"):
        return
    rows = mount.cold_warm_rows(data["results"])
    # Latency rows: the median in the first column, p99 in the second.
    lat = data.get("latency") or {}
    for op in sorted({op for v in lat.values() for op in v}):
        rows.append((f"{op}, warm (µs; left median, right p99)", {
            "cold": [{"label": tool, "value": v[op]["median_us"]}
                     for tool, v in lat.items() if op in v],
            "warm": [{"label": tool, "value": v[op]["p99_us"]}
                     for tool, v in lat.items() if op in v]}))
    report.bar_grid(png, f"labelled tree: median of {data['settings']['runs']} (min..max)",
                    rows, [("cold", "cold cache s / median µs"),
                           ("warm", "warm cache s / p99 µs")])
