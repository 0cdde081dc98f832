"""latency: what one file-system call costs, in µs (median and p99), on each FUSE
transport, on verilay's kernel engine and on the kernel's own filesystems (issue 21).

One image of 10,000 files of 1 KiB (2,000 with --quick) in 50 directories, every entry
labelled `security.selinux`, mounted side by side, each afresh for every run, the mounts
taking turns at going first:

  read-only   kernel-erofs (`mount -t erofs` of the image file), verilay-uring (FUSE over
              io_uring), verilay-dev (/dev/fuse): `verilay mount IMAGE --engine fuse
              --transport T`, and verilay-kernel (`--engine kernel`: the kernel's erofs on
              the image file verilay serves and verifies)
  writable    overlay (the kernel's overlayfs over the image's kernel erofs mount),
              verilay-uring, verilay-dev and verilay-kernel with `--upper --work`; the
              upper directories on an ext4 made afresh in a loop file for every run
              (harness.stacks)

A small C program times each call alone (clock_gettime around it), once per file:

  lookup      lstat of a name not seen since `echo 2 > /proc/sys/vm/drop_caches` (dentries
              and inodes dropped, page cache kept; its directory looked up first, untimed):
              a FUSE LOOKUP each
  getattr     statx(AT_STATX_FORCE_SYNC) of a cached name: FUSE sends a GETATTR whatever
              the attribute timeout (with verilay's long timeouts a plain stat of a cached
              name never reaches the daemon, which `stat-cached` shows); the kernel's own
              filesystems answer from the inode
  stat-cached lstat of a cached name: what a caller usually pays, no round trip on FUSE
  getxattr    lgetxattr of security.selinux: the kernel caches no xattr reply from a FUSE
              server, so a GETXATTR each
  open        open(O_RDONLY) of a cached file (close not timed): a FUSE OPEN only where
              the daemon asks to see opens (an unmeasured read-only mount answers the first
              OPEN with ENOSYS and the kernel then opens without asking)
  create      open(O_CREAT|O_EXCL|O_WRONLY) of a new name in a fresh directory (close not
              timed): writable mounts only; a FUSE CREATE
  unlink      unlink of each of those: a FUSE UNLINK

Reported per mount and operation: the median over runs of each run's median and 99th
percentile (every run's percentiles 0..100 are in the JSON). The issue sets no target
here; the io_uring/dev ratio of the medians and the kernel engine's ratio to the kernel's
own mount (erofs read-only, overlayfs writable) are printed as INFO.
"""

import os
import shutil
import statistics
import subprocess

from harness import csrc, datasets, report, stacks, timing, tools, transport
from benches.mount import mounts_for, record_served_over

DESCRIPTION = "per-operation latency (µs) over io_uring, /dev/fuse, the kernel engine and the kernel"

NDIRS = 50
FILE_SIZE = 1024
READ_OPS = ("lookup", "getattr", "stat-cached", "getxattr", "open")
WRITE_OPS = ("create", "unlink")
LABEL = datasets.LABEL

LATENCY_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>
""" + csrc.NOW_US + r"""
/* One line: the op, the number of calls, failed calls, then percentiles 0..100 (µs). */
static void report(const char *op, double *v, size_t n, size_t failed) {
    qsort(v, n, sizeof *v, cmp);
    printf("%s %zu %zu", op, n, failed);
    for (int p = 0; p <= 100; p++)
        printf(" %.2f", n ? v[p == 100 ? n - 1 : n * p / 100] : 0.0);
    printf("\n");
}
""" + csrc.LINES + r"""
/* Times FAILS (nonzero when the call failed) once for each of the n paths (as paths[i]),
   into v, and reports it as OP; `failed` is left at 0 for the next. */
#define TIME_EACH(op, fails)                    \
    do {                                        \
        for (size_t i = 0; i < n; i++) {        \
            double t = now_us();                \
            failed += (fails);                  \
            v[i] = now_us() - t;                \
        }                                       \
        report(op, v, n, failed);               \
        failed = 0;                             \
    } while (0)

/* Opens P with FLAGS (mode 0644 if it creates) and closes it; the open alone is timed,
   into *us. 1 if it failed, else 0. */
static int timed_open(const char *p, int flags, double *us) {
    double t = now_us();
    int fd = open(p, flags, 0644);
    *us = now_us() - t;
    if (fd < 0)
        return 1;
    close(fd);
    return 0;
}

/* lat read LIST: the read-side ops over every path of LIST (relative to the cwd, whose
   dentries the caller has just dropped). */
static int readside(const char *list) {
    size_t n, failed = 0;
    char **paths = lines(list, &n);
    if (!paths)
        return 3;
    double *v = malloc(n * sizeof *v);
    struct stat st;
    struct statx stx;
    char buf[256], dir[4096];
    for (size_t i = 0; i < n; i++) { /* parents first, untimed */
        strcpy(dir, paths[i]);
        stat(dirname(dir), &st);
    }
    TIME_EACH("lookup", lstat(paths[i], &st) != 0);
    TIME_EACH("getattr", statx(AT_FDCWD, paths[i], AT_SYMLINK_NOFOLLOW | AT_STATX_FORCE_SYNC,
                               STATX_BASIC_STATS, &stx) != 0);
    TIME_EACH("stat-cached", lstat(paths[i], &st) != 0);
    TIME_EACH("getxattr", lgetxattr(paths[i], "security.selinux", buf, sizeof buf) <= 0);
    for (size_t i = 0; i < n; i++)
        failed += timed_open(paths[i], O_RDONLY, &v[i]);
    report("open", v, n, failed);
    return 0;
}

/* lat write DIR N: creates N new files in DIR (which exists), then unlinks them. */
static int writeside(const char *d, size_t n) {
    double *v = malloc(n * sizeof *v);
    char p[4096];
    size_t failed = 0;
    for (size_t i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/c%06zu", d, i);
        failed += timed_open(p, O_CREAT | O_EXCL | O_WRONLY, &v[i]);
    }
    report("create", v, n, failed);
    failed = 0;
    for (size_t i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/c%06zu", d, i);
        double t = now_us();
        failed += unlink(p) != 0;
        v[i] = now_us() - t;
    }
    report("unlink", v, n, failed);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "read"))
        return readside(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "write"))
        return writeside(argv[2], strtoul(argv[3], NULL, 10));
    return 2;
}
"""


def make_tree(src, nfiles):
    """nfiles files of FILE_SIZE bytes in NDIRS directories, every entry labelled; returns
    their paths relative to src."""
    paths = [f"d{i % NDIRS:02d}/f{i:06d}" for i in range(nfiles)]
    body = b"x" * FILE_SIZE
    for d in range(NDIRS):
        os.makedirs(os.path.join(src, f"d{d:02d}"))
        os.setxattr(os.path.join(src, f"d{d:02d}"), "security.selinux", LABEL)
    for p in paths:
        full = os.path.join(src, p)
        with open(full, "wb") as f:
            f.write(body)
        os.setxattr(full, "security.selinux", LABEL)
    os.setxattr(src, "security.selinux", LABEL)
    return paths


def parse(out):
    """{op: {"n", "failed", "pct": [p0..p100]}} from the C program's lines."""
    res = {}
    for line in out.splitlines():
        op, n, failed, *pct = line.split()
        res[op] = {"n": int(n), "failed": int(failed), "pct": [float(x) for x in pct]}
    return res


def read_side(binary, mnt, listfile):
    why = timing.drop_caches(2)
    if why:
        raise RuntimeError(why)
    out = subprocess.run([binary, "read", listfile], cwd=mnt, check=True,
                         capture_output=True, text=True).stdout
    return parse(out)


def write_side(binary, mnt, run, n):
    d = os.path.join(mnt, f"new-{run}")
    os.mkdir(d)
    os.sync()
    out = subprocess.run([binary, "write", d, str(n)], check=True, capture_output=True,
                         text=True).stdout
    return parse(out)


def check(res, where, ops):
    """Every call must have succeeded, else the numbers time an error path."""
    for op in ops:
        if res[op]["failed"]:
            raise RuntimeError(f"{where}: {res[op]['failed']} of {res[op]['n']} {op} "
                               "calls failed")


@transport.uring_switch
def run(ctx):
    scratch = datasets.scratch_dir("latency")
    verilay, why = tools.verilay(scratch)
    nfiles = 2000 if ctx.quick else 10000
    data = report.bench_data("latency", ctx,
                             {"files": nfiles, "dirs": NDIRS, "file_size": FILE_SIZE},
                             {"samples": {"ro": {}, "rw": {}}, "results": {"ro": {}, "rw": {}},
                              "targets": []})
    cc = shutil.which("cc") or shutil.which("gcc")
    if not verilay or not cc or timing.drop_caches(2) is not None:
        reason = why or ("needs a C compiler" if not cc else "needs root (mounts, caches)")
        print(f"latency bench skipped: {reason}")
        data["targets"].append(report.target("latency", None, reason))
        return data
    binary = tools.compile_c(cc, LATENCY_C, os.path.join(scratch, "lat"))
    src = os.path.join(scratch, "src")
    paths = make_tree(src, nfiles)
    listfile = os.path.join(scratch, "paths")
    with open(listfile, "w") as f:
        f.write("".join(p + "\n" for p in paths))
    image = os.path.join(scratch, "tree.img")
    subprocess.run([verilay, "build", src, "-o", image, "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    shutil.rmtree(src)

    kernel = transport.kernel_column(verilay, data)
    ro = mounts_for({"erofs": image}, scratch, "ro", verilay, {}, ctx.transports, kernel)
    rw = stacks.WritableStacks(scratch, image, verilay, None, ctx.transports,
                               fresh_fs="ext4", kernel=kernel)
    samples = data["samples"]
    try:
        for i in range(ctx.runs):
            print(f"  run {i + 1}/{ctx.runs}", flush=True)
            for m in ro:
                m.mount()
            record_served_over(data, ro)
            try:
                r0 = i % len(ro)
                for m in ro[r0:] + ro[:r0]:
                    res = read_side(binary, m.dir, listfile)
                    check(res, f"{m.tool} {m.dir}", READ_OPS)
                    for op, v in res.items():
                        samples["ro"].setdefault(m.tool, {}).setdefault(op, []).append(v)
            finally:
                for m in ro:
                    m.umount()
            where = rw.up(rotate=i)
            rw.record(data)
            for tool, mnt in where.items():
                res = read_side(binary, mnt, listfile)
                res.update(write_side(binary, mnt, i, nfiles))
                check(res, f"{tool} {mnt}", READ_OPS + WRITE_OPS)
                for op, v in res.items():
                    samples["rw"].setdefault(tool, {}).setdefault(op, []).append(v)
            rw.down()
    finally:
        rw.close()
    shutil.rmtree(scratch, ignore_errors=True)

    for mode, per_tool in samples.items():
        for tool, ops in per_tool.items():
            data["results"][mode][tool] = {
                op: {"median_us": statistics.median(r["pct"][50] for r in runs),
                     "p99_us": statistics.median(r["pct"][99] for r in runs),
                     "calls_per_run": runs[0]["n"]}
                for op, runs in ops.items()}
    print_results(data)
    return data


MODES = {"ro": "read-only mounts", "rw": "writable mounts (upper on ext4)"}
KERNEL_OWN = {"ro": "kernel-erofs", "rw": "overlay"}  # the kernel's own mount, per mode


def print_results(data):
    for mode, per_tool in data["results"].items():
        tools_seen = list(per_tool)
        ops = [op for op in READ_OPS + WRITE_OPS if any(op in v for v in per_tool.values())]
        print(f"\n{MODES[mode]}: µs per call, median / p99 (median over runs)")
        rows = [[op] + [f"{per_tool[t][op]['median_us']:.1f} / {per_tool[t][op]['p99_us']:.1f}"
                        if op in per_tool[t] else "-" for t in tools_seen] for op in ops]
        report.print_table(["op", *tools_seen], rows)
        u, d = (per_tool.get(transport.tool_name(t)) for t in ("uring", "dev"))
        if u and d:
            for op in ops:
                print(f"INFO  {mode} {op}: io_uring median {u[op]['median_us']:.1f} µs, "
                      f"/dev/fuse {d[op]['median_us']:.1f} µs "
                      f"({u[op]['median_us'] / d[op]['median_us']:.2f}x)")
        k, own = per_tool.get(transport.KERNEL), per_tool.get(KERNEL_OWN[mode])
        if k and own:
            for op in ops:
                print(f"INFO  {mode} {op}: kernel engine median {k[op]['median_us']:.1f} µs, "
                      f"{KERNEL_OWN[mode]} {own[op]['median_us']:.1f} µs "
                      f"({k[op]['median_us'] / max(own[op]['median_us'], 0.01):.2f}x)")
    print()


def plot(data, png):
    res = data.get("results") or {}
    if not any(res.values()):
        return
    short = {"ro": "", "rw": "+upper"}
    rows = []
    for op in READ_OPS + WRITE_OPS:
        bars = {"median": [], "p99": []}
        for mode, per_tool in res.items():
            for tool, ops in per_tool.items():
                if op in ops:
                    label = tool + short[mode]
                    bars["median"].append({"label": label, "value": ops[op]["median_us"]})
                    bars["p99"].append({"label": label, "value": ops[op]["p99_us"]})
        if bars["median"]:
            rows.append((op, bars))
    report.bar_grid(png, f"per-call latency, µs (median over {data['settings']['runs']} runs)",
                    rows, [("median", "median µs"), ("p99", "p99 µs")])
