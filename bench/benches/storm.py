"""storm: a stat/open storm over a merged tree with 1, 2, 4 and 8 threads (seed 3).

One image of a real tree (usr-share) as the lower layer with an empty upper directory,
mounted three ways side by side:

  overlay          the kernel's overlayfs (lower: the image's kernel erofs mount)
  fuse-overlayfs   fuse-overlayfs over that same kernel erofs mount
  verilay-uring    `verilay mount IMAGE --upper --work --engine fuse --transport uring`
                   (verification on)
  verilay-dev      the same over /dev/fuse (`--transport dev`)
  verilay-kernel   the kernel engine (`--engine kernel`): the kernel's overlayfs over the
                   kernel's erofs of the image file verilay serves and verifies

Each thread walks the tree's path list from its own starting point: lstat, and for regular
files open(O_RDONLY) and close. After one warm pass, each thread count runs for a fixed
time and the total operations per second are reported. A small C program does the storm
(compiled here with cc: Python threads would measure the interpreter lock).

Targets, per FUSE transport: verilay ahead of fuse-overlayfs at every thread count, and no
drop in total throughput as threads are added (each count within 5% of the best of the
fewer ones). The kernel engine: at every thread count, the kernel's overlayfs over kernel
erofs at most 1.1x its ops/s.
"""

import os
import shutil
import statistics
import subprocess

from harness import datasets, report, stacks, tools, transport

DESCRIPTION = "stat/open storm over a merged tree, 1-8 threads: verilay vs overlayfs, fuse-overlayfs"
USES = ["FUSE_OVERLAYFS"]

THREADS = (1, 2, 4, 8)
SECONDS = 3.0
DROP_TOLERANCE = 0.95
KERNEL_ENGINE_RATIO = 1.1  # kernel overlayfs's ops/s over the kernel engine's, at most

STORM_C = r"""
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char **paths;
static size_t npaths;
static volatile int stop;

struct arg { size_t start; unsigned long ops; };

static void *worker(void *p) {
    struct arg *a = p;
    size_t i = a->start;
    unsigned long ops = 0;
    struct stat st;
    while (!stop) {
        if (lstat(paths[i], &st) == 0 && S_ISREG(st.st_mode)) {
            int fd = open(paths[i], O_RDONLY);
            if (fd >= 0)
                close(fd);
        }
        ops++;
        if (++i == npaths)
            i = 0;
    }
    a->ops = ops;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    FILE *f = fopen(argv[1], "r");
    int threads = atoi(argv[2]);
    double secs = atof(argv[3]);
    size_t cap = 1024;
    char line[4096];
    paths = malloc(cap * sizeof *paths);
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (npaths == cap)
            paths = realloc(paths, (cap *= 2) * sizeof *paths);
        paths[npaths++] = strdup(line);
    }
    if (!npaths || threads < 1)
        return 2;
    pthread_t *t = calloc(threads, sizeof *t);
    struct arg *a = calloc(threads, sizeof *a);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < threads; i++) {
        a[i].start = npaths / threads * i;
        pthread_create(&t[i], NULL, worker, &a[i]);
    }
    struct timespec d = { (time_t)secs, (long)((secs - (time_t)secs) * 1e9) };
    nanosleep(&d, NULL);
    stop = 1;
    unsigned long total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        total += a[i].ops;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.1f\n", total / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9));
    return 0;
}
"""


def storm(binary, listfile, cwd, threads, secs):
    out = subprocess.run([binary, listfile, str(threads), str(secs)], cwd=cwd,
                         check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


@transport.uring_switch
def run(ctx):
    scratch = datasets.scratch_dir("storm")
    data, verilay, fov, cc = stacks.start("storm", ctx, scratch,
                                          {"threads": THREADS, "seconds": SECONDS})
    if not verilay:
        return data
    ds = datasets.usr_share()
    data["dataset"] = {"name": ds.name, **ds.stats}
    binary = tools.compile_c(cc, STORM_C, os.path.join(scratch, "storm"), ["-pthread"])
    image = os.path.join(scratch, "tree.img")
    subprocess.run([verilay, "build", ds.path, "-o", image, "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    listfile = os.path.join(scratch, "paths")
    with open(listfile, "w") as f:
        for root, dirs, files in os.walk(ds.path):
            rel = os.path.relpath(root, ds.path)
            for name in sorted(dirs + files):
                f.write(os.path.normpath(os.path.join(rel, name)) + "\n")
    secs = 1.0 if ctx.quick else SECONDS
    kernel = transport.kernel_column(verilay, data)
    mounts = stacks.WritableStacks(scratch, image, verilay, fov, ctx.transports,
                                   kernel=kernel)
    try:
        where = mounts.up()
        mounts.record(data)
        for path in where.values():
            storm(binary, listfile, path, 1, 0.5)  # warm: every entry looked up once
        samples = {(w, n): [] for w in where for n in THREADS}
        for i in range(ctx.runs):
            print(f"  run {i + 1}/{ctx.runs}", flush=True)
            for n in THREADS:
                for w, path in where.items():
                    samples[(w, n)].append(storm(binary, listfile, path, n, secs))
    finally:
        mounts.close()
    shutil.rmtree(scratch, ignore_errors=True)

    tools_seen = list(dict.fromkeys(w for w, _ in samples))
    for w in tools_seen:
        data["results"][w] = {str(n): {"ops_s": samples[(w, n)],
                                       "median": statistics.median(samples[(w, n)])} for n in THREADS}
    rows = [[w] + [f"{data['results'][w][str(n)]['median']:,.0f}" for n in THREADS]
            for w in tools_seen]
    print()
    report.print_table(["ops/s"] + [f"{n} thr" for n in THREADS], rows,
                       missing=[] if "fuse-overlayfs" in tools_seen else
                       [(["fuse-overlayfs"], tools.missing("FUSE_OVERLAYFS") or "it did not run")])
    print()
    r = data["results"]
    for tool in (t for t in tools_seen if transport.transport_of(t)):
        data["targets"] += targets_for(r, tool)
    if transport.KERNEL in r:
        data["targets"] += kernel_targets(r)
    return data


def kernel_targets(r):
    """The kernel engine at every thread count: the kernel's overlayfs (over kernel erofs)
    at most KERNEL_ENGINE_RATIO times its ops/s; its ratio to the FUSE engine alongside."""
    t = []
    k = r[transport.KERNEL]
    fuse = next((transport.tool_name(x) for x in transport.TRANSPORTS
                 if transport.tool_name(x) in r), None)
    for n in THREADS:
        v = k[str(n)]["median"]
        ratio = r["overlay"][str(n)]["median"] / v
        vs = f"; {v / r[fuse][str(n)]['median']:.2f}x {fuse}'s ops/s" if fuse else ""
        t.append(report.target(
            f"{n} threads {transport.KERNEL} vs kernel overlayfs", ratio <= KERNEL_ENGINE_RATIO,
            f"overlayfs {ratio:.2f}x its ops/s (target <= {KERNEL_ENGINE_RATIO}x{vs})"))
    return t


def targets_for(r, tool):
    """Ahead of fuse-overlayfs at every thread count, and no drop with more threads, for
    one verilay column; the ratio to the kernel's overlayfs as INFO."""
    t = []
    if "fuse-overlayfs" in r:
        for n in THREADS:
            ratio = r[tool][str(n)]["median"] / r["fuse-overlayfs"][str(n)]["median"]
            t.append(report.target(
                f"{n} threads {tool} vs fuse-overlayfs", ratio > 1.0,
                f"verilay {ratio:.2f}x fuse-overlayfs's ops/s (target > 1x)"))
    else:
        t += [report.not_measured(f"{n} threads {tool} vs fuse-overlayfs",
                                  tools.missing("FUSE_OVERLAYFS") or "it did not run")
              for n in THREADS]
    best = 0.0
    for n in THREADS:
        v = r[tool][str(n)]["median"]
        t.append(report.target(
            f"{n} threads {tool}: no drop", v >= best * DROP_TOLERANCE,
            f"{v:,.0f} ops/s vs best of fewer threads {best:,.0f}"))
        best = max(best, v)
    for n in THREADS:
        print(f"INFO  {n} threads: {tool} "
              f"{r[tool][str(n)]['median'] / r['overlay'][str(n)]['median']:.2f}x "
              "kernel overlayfs's ops/s")
    return t


def plot(data, png_path):
    if not data["results"]:
        return
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for w, per in data["results"].items():
        xs = [int(n) for n in per]
        ax.plot(xs, [per[n]["median"] for n in per], marker="o", label=w,
                color={"verilay-uring": "tab:red", "verilay-dev": "tab:orange",
                       transport.KERNEL: "tab:purple"}.get(w))
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(THREADS), [str(n) for n in THREADS])
    ax.set_xlabel("threads")
    ax.set_ylabel("lstat+open+close per second")
    ax.set_title("stat/open storm over a merged tree (higher is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
