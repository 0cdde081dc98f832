"""ima: what measuring file opens costs (issue 6, seed 0).

Seed 0: CephFS reported a filesystem magic of 0, so Talos's `dont_measure fsmagic=` rule
missed and every open was hashed. Two parts, all mounts by `verilay mount`, made afresh
for every run, the configurations taking turns at going first; both parts run on the FUSE
engine over FUSE over io_uring, then again over /dev/fuse, then on the kernel engine
(`--engine kernel`, opens measured through fanotify; harness.transport; `bench/run ima
--parts readonly` runs part 2 only):

1. Seed 0's workloads on a writable merged tree (`--upper --work`, on an ext4 with its
   journal made afresh in a loop file for every run, as meta's), three mounts side by side:

     none           no policy
     talos          dont_measure fsmagic=0xe0f5e1e2 (the image's magic), then
                    measure func=FILE_CHECK mask=^MAY_READ uid=0, and the same with euid=0
     wrong-magic    the same with the dont_measure naming CephFS's magic (0x00c36400)

   create-0, create-1k, create-1m
                  FS-Mark style: 500 files (200 with --quick) of 0 B, 1 KiB and 1 MiB over
                  32 subdirectories, opened with O_CREAT|O_RDWR|O_TRUNC as fs_mark does (so
                  every create is a measured open: its mask has MAY_READ); files per second
                  over 24 such storms per run (2 with --quick; 3 for 1 MiB, one with
                  --quick), as fs_mark's loops, in fresh directories
   rsync          `rsync -a` of seed 0's kind of tree, ~12k mostly small files (the
                  small-files dataset: 11.5k files, 61 MiB) into the mount; files/s
   read-image     the same tree in the image, read through the mount after dropping
                  caches (`tar -cf - tree | cat`); files/s. Image files are exempt under
                  talos and hashed under wrong-magic: this is where the wrong magic pays.

   Each workload runs on the three mounts back to back before the next starts. Ratios
   are medians over runs of the ratio within a run (the host's noise comes and goes over
   seconds and so largely cancels). Target: talos at least 0.9x none's rate on every
   workload; wrong-magic's ratio is printed. The measured mounts' counters (files
   hashed, bytes) are in the JSON, and so is each daemon's CPU time per file (all its
   threads, from schedstat; printed as medians and as the measured mounts' excess over
   none's: a cost the host's noise moves far less than the rates). Each measured
   mount's list must pass `verilay log verify` (else the benchmark fails).

2. Opening image files with `digest_type=verity`, read-only mounts of one image holding
   8 files of 32 MiB and 2000 files of 4 KiB (4 of 8 MiB and 500 with --quick):

     none           no policy
     verity         measure func=FILE_CHECK digest_type=verity (the image's stored digests)
     hash           measure func=FILE_CHECK (contents hashed with SHA-256, for contrast)
     open-only      measure func=BPRM_CHECK: the FUSE engine sees every open, as a measured
                    mount must (to tell an exec), and measures none (nothing is run from
                    the mount): what the FUSE protocol alone costs a mount that measures
                    opens; the kernel engine hears execs only (no event for a file's open)

   read-big-cold    drop caches, open and read each 32 MiB file in full; MiB/s
   read-small-cold  drop caches, open, read and close each 4 KiB file; files/s
   open-warm        then open and close each 4 KiB file 5 times over, all cached; opens/s

   Target: verity at least 0.95x none's rate, on every workload (issue 6 asks it of an
   image file's open); and issue 21's: open-warm on verity at least 0.5x none's, on each
   transport of the FUSE engine; the kernel engine's open-warm on each measured mount
   (verity, hash) at least 0.85x none's. The verity mount must hash nothing (hashed =
   bytes_hashed = 0) and
   take stored digests (verity_digests > 0); the open-only mount must measure none, and
   check every open on the FUSE engine (checked > 0), none on the kernel engine.
"""

import json
import os
import shlex
import shutil
import statistics
import subprocess

from harness import csrc, datasets, report, stacks, timing, tools, transport
from harness.timing import timed

DESCRIPTION = "cost of measuring file opens (IMA policies; seed 0's wrong fsmagic, verity digests)"

TALOS_RATIO = 0.9
VERITY_RATIO = 0.95
WARM_OPEN_RATIO = 0.5  # issue 21: a measured mount's warm open vs an unmeasured one
KERNEL_WARM_OPEN_RATIO = 0.85  # the same on the kernel engine (fanotify, ignore marks)

EROFS_MAGIC = "0xe0f5e1e2"
CEPH_MAGIC = "0x00c36400"
TALOS_RULES = ("measure func=FILE_CHECK mask=^MAY_READ uid=0\n"
               "measure func=FILE_CHECK mask=^MAY_READ euid=0\n")
WRITABLE = {"none": None,
            "talos": f"dont_measure fsmagic={EROFS_MAGIC}\n" + TALOS_RULES,
            "wrong-magic": f"dont_measure fsmagic={CEPH_MAGIC}\n" + TALOS_RULES}
READONLY_WORKLOADS = ("read-big-cold", "read-small-cold", "open-warm")
WRITABLE_WORKLOADS = ("create-0", "create-1k", "create-1m", "rsync", "read-image")
UNITS = {"read-big-cold": "MiB/s", "open-warm": "opens/s"}  # else files/s
OPEN_ROUNDS = 5
READONLY = {"none": None,
            "verity": "measure func=FILE_CHECK digest_type=verity\n",
            "hash": "measure func=FILE_CHECK\n",
            # Makes the daemon see every open (to tell an exec) and measures none (nothing
            # is run from the mount), asking the policy no more than verity's rule does:
            # what FUSE's OPEN and RELEASE cost alone.
            "open-only": "measure func=BPRM_CHECK\n"}

IMA_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
""" + csrc.NOW + csrc.CREATE + csrc.LINES + r"""
/* ima create DIR NFILES NDIRS SIZE: FS-Mark style creates (O_CREAT|O_RDWR|O_TRUNC, write,
   close); prints files per second.
   ima read LIST: opens, reads in full and closes every file named in LIST (a path a line,
   relative to the current directory); prints files, bytes and seconds.
   ima open LIST ROUNDS: opens and closes every file named in LIST, ROUNDS times over;
   prints opens and seconds. */
static int create(const char *dir, int n, int nd, long size) {
    double t0;
    int rc = create_files(dir, n, nd, size, O_RDWR, &t0);
    if (rc)
        return rc;
    printf("%.1f\n", n / (now() - t0));
    return 0;
}

static int openall(const char *list, int rounds) {
    size_t n;
    char **paths = lines(list, &n);
    if (!paths)
        return 3;
    double t0 = now();
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < n; i++) {
            int fd = open(paths[i], O_RDONLY);
            if (fd < 0)
                return 4;
            close(fd);
        }
    printf("%zu %.6f\n", n * rounds, now() - t0);
    return 0;
}

static int readall(const char *list) {
    size_t n;
    char **paths = lines(list, &n);
    if (!paths)
        return 3;
    static char buf[1 << 20];
    long long bytes = 0;
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        int fd = open(paths[i], O_RDONLY);
        if (fd < 0)
            return 4;
        ssize_t k;
        while ((k = read(fd, buf, sizeof buf)) > 0)
            bytes += k;
        if (k < 0)
            return 5;
        close(fd);
    }
    printf("%zu %lld %.6f\n", n, bytes, now() - t0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "create"))
        return create(argv[2], atoi(argv[3]), atoi(argv[4]), atol(argv[5]));
    if (argc == 3 && !strcmp(argv[1], "read"))
        return readall(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "open"))
        return openall(argv[2], atoi(argv[3]));
    return 2;
}
"""


def paired(res, wl, x, base):
    """Median over runs of x's rate / base's rate in the same run (where they ran back to
    back, so the host's noise largely cancels)."""
    r = res[wl]
    return statistics.median(a / b for a, b in zip(r[x]["per_s"], r[base]["per_s"]))


def spread(res, wl, x, base):
    """The lowest and highest of those per-run ratios, as text: how far to trust the median."""
    r = res[wl]
    ratios = [a / b for a, b in zip(r[x]["per_s"], r[base]["per_s"])]
    return f"per run {min(ratios):.2f}-{max(ratios):.2f}"


def drop_caches():
    why = timing.drop_caches()
    if why:
        raise RuntimeError(why)


def counters(verilay, mnt):
    """`verilay stats --json MNT` as a dict."""
    out = subprocess.run([verilay, "stats", "--json", mnt], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout)


def delta(after, before):
    """What a workload moved the counters by (the numbers of `verilay stats --json`)."""
    return {k: v - before[k] for k, v in after.items()
            if isinstance(v, int) and k != "policy_rules"}


def verify_log(verilay, log):
    """`verilay log verify --json LOG`, which must succeed: a list that does not verify
    is a bug in verilay, and fails the benchmark."""
    argv = [verilay, "log", "verify", "--json", log]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed (exit status {out.returncode}):\n"
                           f"{out.stdout}{out.stderr}")
    return json.loads(out.stdout)


def daemon_of(mnt):
    """The pid of the daemon serving mountpoint `mnt` (its argv names the mountpoint and
    the descriptor it reports readiness on)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.fsencode(mnt) in argv and b"--ready-fd" in argv:
            return int(pid)
    raise RuntimeError(f"no verilay daemon found for {mnt}")


def cpu_seconds(pid):
    """CPU time of all of a process's threads so far (schedstat: nanoseconds on a CPU)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # a thread that just ended
    return total / 1e9


class Recorder:
    """Rates {(workload, config): [per run]}; for the measured mounts, what each workload
    moved their counters by {(workload, config): [per run]}; and the daemon CPU time each
    workload took per file {(workload, config): [per run, µs]}, which the host's noise
    moves far less than the rates."""

    def __init__(self, verilay):
        self.verilay, self.samples, self.counted, self.last = verilay, {}, {}, {}
        self.cpu_us, self.cpu_last, self.pids = {}, {}, {}

    def start(self, where, measured):
        """A run on freshly made mounts {config: mountpoint}; `measured` have a policy."""
        self.where = where
        self.last = {c: counters(self.verilay, where[c]) for c in measured}
        self.pids = {c: daemon_of(m) for c, m in where.items()}
        self.cpu_last = {c: cpu_seconds(p) for c, p in self.pids.items()}

    def note(self, wl, cfg, rate, files=None):
        """Workload wl ran on cfg at `rate`; over `files` files, if given, for the CPU time
        per file."""
        if files:
            self.cpu_us.setdefault((wl, cfg), []).append(
                (cpu_seconds(self.pids[cfg]) - self.cpu_last[cfg]) / files * 1e6)
        self.samples.setdefault((wl, cfg), []).append(rate)
        if cfg in self.last:
            now = counters(self.verilay, self.where[cfg])
            self.counted.setdefault((wl, cfg), []).append(delta(now, self.last[cfg]))
            self.last[cfg] = now
        # After `verilay stats`, whose own cost is no workload's.
        self.cpu_last[cfg] = cpu_seconds(self.pids[cfg])


def each_run(ctx, mounts, rec, verilay, logs, what):
    """Mounts afresh for each of the runs and yields {config: mountpoint}; once a run is
    done, appends each measured mount's counters and `verilay log verify` report to
    logs[config]."""
    for i in range(ctx.runs):
        print(f"  {what}, run {i + 1}/{ctx.runs}", flush=True)
        where = mounts.up(i, rotate=i)
        rec.start(where, mounts.logs)
        yield where
        for cfg, log in mounts.logs.items():
            logs.setdefault(cfg, []).append({"stats": rec.last[cfg],
                                             "verify": verify_log(verilay, log)})


class Mounts:
    """One image mounted by verilay once per policy ({name: policy text or None}), side
    by side; `up()` mounts them afresh, with fresh measurement lists (and with
    `writable`, empty upper directories on an ext4 made afresh, see stacks.FreshFs), and
    returns {name: mountpoint} in turn order. `logs[name]` is the list's directory. Every
    mount is verilay column `tool` (harness.transport: an engine and transport); `served_over` is what the
    last one said."""

    def __init__(self, scratch, image, verilay, policies, writable, tool):
        self.scratch, self.image, self.verilay = scratch, image, verilay
        self.writable, self.tool = writable, tool
        self.served_over = None
        self.base = os.path.join(scratch, "mounts" if writable else "ro-mounts")
        self.fresh = stacks.FreshFs(scratch, "ext4", self.base) if writable else None
        self.policies = {}
        for name, text in policies.items():
            if text is not None:
                self.policies[name] = os.path.join(scratch, f"{name}.policy")
                with open(self.policies[name], "w") as f:
                    f.write(text)
        self.names = list(policies)
        self.mounted, self.logs = [], {}

    def up(self, run, rotate=0):
        self.down()
        if self.fresh:
            self.fresh.make()
        where = {}
        r = rotate % len(self.names)
        for name in self.names[r:] + self.names[:r]:
            base = os.path.join(self.base, name)
            shutil.rmtree(base, ignore_errors=True)
            mnt = os.path.join(base, "mnt")
            os.makedirs(mnt)
            extra = []
            if self.writable:
                up, work = os.path.join(base, "up"), os.path.join(base, "work")
                os.makedirs(up)
                os.makedirs(work)
                extra += ["--upper", up, "--work", work]
            if name in self.policies:
                log = os.path.join(self.scratch, "logs", f"{os.path.basename(self.base)}-"
                                   f"{self.tool}-run{run}-{name}")
                os.makedirs(log)
                self.logs[name] = log
                extra += ["--policy", self.policies[name], "--measure-log", log]
            self.served_over = transport.mount_tool(self.verilay, [self.image], mnt,
                                                    self.tool, extra)
            self.mounted.append(mnt)
            where[name] = mnt
        return where

    def down(self):
        stacks.unmount_all(self.mounted)
        self.mounted, self.logs = [], {}

    def close(self):
        self.down()
        if self.fresh:
            self.fresh.drop()


def measured_writable_refused(verilay, image, scratch, tool):
    """Why verilay column `tool` cannot make a measured writable mount, or None if it can:
    tries one (talos's policy)."""
    base = os.path.join(scratch, "probe")
    shutil.rmtree(base, ignore_errors=True)
    dirs = {x: os.path.join(base, x) for x in ("up", "work", "mnt", "log")}
    for d in dirs.values():
        os.makedirs(d)
    policy = os.path.join(base, "policy")
    with open(policy, "w") as f:
        f.write(WRITABLE["talos"])
    try:
        transport.mount_tool(verilay, [image], dirs["mnt"], tool,
                             ["--upper", dirs["up"], "--work", dirs["work"],
                              "--policy", policy, "--measure-log", dirs["log"]])
    except transport.MountFailed as e:
        return str(e).split("): ", 1)[-1]
    stacks.unmount_all([dirs["mnt"]])
    shutil.rmtree(base, ignore_errors=True)
    return None


def writable_part(ctx, verilay, binary, scratch, data, sub, tool):
    """Part 1: seed 0's workloads under none / talos / wrong-magic, on verilay column tool
    (a Recorder, or None where the column cannot make measured writable mounts: the reason
    then goes to sub["not_measured"]["writable"]); the measured mounts' counters and lists
    go to sub["mount_stats"]."""
    ds = datasets.small_files()
    tree = ds.path
    nfiles = sum(len(fs) for _, _, fs in os.walk(tree))
    nregular = sum(1 for root, _, fs in os.walk(tree) for f in fs
                   if os.path.isfile(os.path.join(root, f))
                   and not os.path.islink(os.path.join(root, f)))
    lower_src = os.path.join(scratch, "lower-src")
    os.makedirs(lower_src)
    shutil.copytree(tree, os.path.join(lower_src, "tree"), symlinks=True)
    image = os.path.join(scratch, "lower.img")
    subprocess.run([verilay, "build", lower_src, "-o", image, "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    shutil.rmtree(lower_src)
    why = measured_writable_refused(verilay, image, scratch, tool)
    if why:
        print(f"  writable tree on {tool}: not measured: {why}", flush=True)
        sub["not_measured"]["writable"] = why
        os.unlink(image)
        return None
    n = 200 if ctx.quick else 500
    # (file size, storms per run): as fs_mark's loops (-L), so that a measurement lasts
    # long enough for this host's noise to average out: a storm of 500 small files takes
    # about 50 ms, and with 8 a run's talos/none swung 0.80-1.00. A 500 MiB storm goes
    # to the page cache in about 0.25 s, too short alone; three of them fit the upper
    # filesystem.
    loops = 2 if ctx.quick else 24
    loops_1m = 1 if ctx.quick else 3
    storms = {"create-0": (0, loops), "create-1k": (1024, loops),
              "create-1m": (1 << 20, loops_1m)}
    data["settings"].update(storm_files=n, storm_dirs=32, storm_loops=loops,
                            storm_loops_1m=loops_1m,
                            tree=ds.origin, tree_files=nfiles,
                            image_tree_regular_files=nregular, writable_policies=WRITABLE)
    rec, logs = Recorder(verilay), {}
    mounts = Mounts(scratch, image, verilay, WRITABLE, writable=True, tool=tool)
    try:
        for where in each_run(ctx, mounts, rec, verilay, logs, "writable tree"):

            def storm(wl, k, mnt):
                """Seconds one storm of workload wl took (the k-th on this mount)."""
                d = os.path.join(mnt, f"{wl}-{k}")
                os.makedirs(d)
                os.sync()
                out = subprocess.run([binary, "create", d, str(n), "32", str(storms[wl][0])],
                                     check=True, capture_output=True, text=True)
                return n / float(out.stdout.split()[0])

            def rate(wl, mnt):
                if wl == "rsync":
                    return nfiles / timed(["rsync", "-a", tree + "/",
                                           os.path.join(mnt, "rsync") + "/"])
                drop_caches()
                # Not `tar -f /dev/null`: GNU tar then skips reading the files.
                return nregular / timed(["bash", "-o", "pipefail", "-c",
                                         f"tar -C {shlex.quote(mnt)} -cf - tree | cat >/dev/null"])

            # Workload by workload, the mounts one after the other, and a workload's
            # storms taking turns on them (each round in a new order): the host's noise
            # (its load comes and goes over seconds) hits the three alike.
            cfgs = list(where)
            for wl, (_, loops) in storms.items():
                secs = dict.fromkeys(cfgs, 0.0)
                for k in range(loops):
                    for cfg in cfgs[k % len(cfgs):] + cfgs[:k % len(cfgs)]:
                        secs[cfg] += storm(wl, k, where[cfg])
                for cfg in cfgs:
                    rec.note(wl, cfg, n * loops / secs[cfg], n * loops)
            for wl in ["rsync", "read-image"]:
                for cfg, mnt in where.items():
                    rec.note(wl, cfg, rate(wl, mnt),
                             nfiles if wl == "rsync" else nregular)
    finally:
        mounts.close()
    sub["mount_stats"]["writable"] = logs
    transport.record(data, tool, mounts.served_over)
    return rec


def write_random(path, size):
    with open(path, "wb") as f:
        for off in range(0, size, 1 << 20):
            f.write(os.urandom(min(1 << 20, size - off)))


def readonly_part(ctx, verilay, binary, scratch, data, sub, tool):
    """Part 2: opening image files under none / verity / hash / open-only, read-only
    mounts of verilay column tool (a Recorder)."""
    nbig, big_size = (4, 8 << 20) if ctx.quick else (8, 32 << 20)
    nsmall, small_size = (500, 4096) if ctx.quick else (2000, 4096)
    data["settings"].update(big_files=nbig, big_size=big_size, small_files=nsmall,
                            small_size=small_size, open_rounds=OPEN_ROUNDS,
                            readonly_policies=READONLY)
    src = os.path.join(scratch, "ro-src")
    big = [f"big/b{i}" for i in range(nbig)]
    small = [f"small/d{i % 32:02d}/f{i:05d}" for i in range(nsmall)]
    for p in big:
        os.makedirs(os.path.dirname(os.path.join(src, p)), exist_ok=True)
        write_random(os.path.join(src, p), big_size)
    for p in small:
        os.makedirs(os.path.dirname(os.path.join(src, p)), exist_ok=True)
        write_random(os.path.join(src, p), small_size)
    image = os.path.join(scratch, "ro.img")
    subprocess.run([verilay, "build", src, "-o", image, "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    shutil.rmtree(src)
    lists = {}
    for wl, paths in (("read-big-cold", big), ("read-small-cold", small)):
        lists[wl] = os.path.join(scratch, f"{wl}.list")
        with open(lists[wl], "w") as f:
            f.write("".join(p + "\n" for p in sorted(paths)))
    expect = {"read-big-cold": (nbig, nbig * big_size),
              "read-small-cold": (nsmall, nsmall * small_size)}
    rec, logs = Recorder(verilay), {}
    mounts = Mounts(scratch, image, verilay, READONLY, writable=False, tool=tool)
    try:
        for where in each_run(ctx, mounts, rec, verilay, logs, "read-only image"):
            for wl, listfile in lists.items():
                for cfg, mnt in where.items():
                    drop_caches()
                    out = subprocess.run([binary, "read", listfile], cwd=mnt, check=True,
                                         capture_output=True, text=True).stdout.split()
                    files, nbytes, secs = int(out[0]), int(out[1]), float(out[2])
                    if (files, nbytes) != expect[wl]:
                        raise RuntimeError(f"{wl} through {cfg}: read {files} files, "
                                           f"{nbytes} bytes; expected {expect[wl]}")
                    rec.note(wl, cfg, nbytes / secs / 2**20 if wl == "read-big-cold"
                             else files / secs)
                    if wl != "read-small-cold":
                        continue
                    # The same files again, their dentries and pages now cached: an
                    # unmeasured mount serves no request at all, a measured one an OPEN
                    # and a RELEASE per open.
                    out = subprocess.run([binary, "open", listfile, str(OPEN_ROUNDS)],
                                         cwd=mnt, check=True, capture_output=True,
                                         text=True).stdout.split()
                    opens, secs = int(out[0]), float(out[1])
                    if opens != nsmall * OPEN_ROUNDS:
                        raise RuntimeError(f"open-warm through {cfg}: {opens} opens; "
                                           f"expected {nsmall * OPEN_ROUNDS}")
                    rec.note("open-warm", cfg, opens / secs)
            s = rec.last["verity"]
            # digest_type=verity takes the image's stored digests: no file data at open.
            if s["hashed"] != 0 or s["bytes_hashed"] != 0 or s["verity_digests"] <= 0:
                raise RuntimeError(f"verity mount hashed file data or took no stored "
                                   f"digests: verilay stats --json {where['verity']}: {s}")
            s = rec.last["open-only"]
            # Measures none, else it is no control. The FUSE engine sees every open
            # (checked); the kernel engine raises no event for a file's open when no rule
            # is for file opens (checked 0).
            kernel = transport.engine_of(tool) == "kernel"
            if (s["checked"] == 0) != kernel or s["measured"] != 0:
                raise RuntimeError(f"open-only mount checked opens it should not have, or "
                                   f"none it should, or measured some: "
                                   f"verilay stats --json {where['open-only']}: {s}")
    finally:
        mounts.close()
    sub["mount_stats"]["readonly"] = logs
    transport.record(data, tool, mounts.served_over)
    return rec


PARTS = ("writable", "readonly")


@transport.uring_switch
def run(ctx):
    scratch = datasets.scratch_dir("ima")
    verilay, why = tools.verilay(scratch)
    data = report.bench_data("ima", ctx, {},
                             {"transports": {}, "targets": []})
    cc = shutil.which("cc") or shutil.which("gcc")
    if not verilay or os.geteuid() != 0 or not cc:
        reason = why or ("needs root (mounts, dropping caches)" if cc else "needs a C compiler")
        print(f"ima bench skipped: {reason}")
        data["targets"].append(report.target("ima", None, reason))
        return data
    binary = tools.compile_c(cc, IMA_C, os.path.join(scratch, "ima"))
    parts = report.selected_parts("ima", ctx, PARTS)
    data["settings"]["parts"] = parts

    # Each part on one column (the FUSE engine on each transport, then the kernel engine),
    # then on the next: a ratio compares mounts of the same column within one run. The
    # FUSE engine's results go to data["transports"][transport], the kernel engine's to
    # data["kernel_engine"].
    kernel = transport.kernel_column(verilay, data)
    for tool in transport.verilay_tools(ctx.transports, kernel):
        print(f" {tool}", flush=True)
        sub = {"results": {}, "units": {}, "counters": {}, "daemon_cpu_us_per_file": {},
               "mount_stats": {}, "not_measured": {}}
        recs = []
        if "writable" in parts:
            recs.append((writable_part(ctx, verilay, binary, scratch, data, sub, tool),
                         list(WRITABLE)))
        if "readonly" in parts:
            recs.append((readonly_part(ctx, verilay, binary, scratch, data, sub, tool),
                         list(READONLY)))
        t = transport.transport_of(tool)
        if t:
            data["transports"][t] = sub
        else:
            data["kernel_engine"] = sub
        print(f"\n{tool}: served over "
              f"{', '.join(data.get('served_over', {}).get(tool, ['-']))}")
        for rec, cfgs in recs:
            if rec:
                summarize_part(sub, rec, cfgs)
    shutil.rmtree(scratch, ignore_errors=True)
    for t, sub in data["transports"].items():
        data["targets"] += targets_for(sub, transport.tool_name(t))
    if "kernel_engine" in data:
        data["targets"] += targets_for(data["kernel_engine"], transport.KERNEL)
    return data


def summarize_part(sub, rec, cfgs):
    """Fills sub's results, counters and daemon CPU from one part's Recorder and prints
    its tables: rates with each measured mount's ratio to the unmeasured one, files and
    bytes hashed, daemon CPU per file."""
    # The unmeasured mount, then the measured ones, each compared with it.
    a, *others = cfgs
    workloads = list(dict.fromkeys(wl for wl, _ in rec.samples))
    for wl in workloads:
        sub["units"][wl] = UNITS.get(wl, "files/s")
        sub["results"][wl] = {x: {"per_s": rec.samples[(wl, x)],
                                  "median": statistics.median(rec.samples[(wl, x)])}
                              for x in cfgs}
        sub["counters"][wl] = {x: rec.counted[(wl, x)] for x in others}
        if (wl, a) in rec.cpu_us:
            sub["daemon_cpu_us_per_file"][wl] = {x: rec.cpu_us[(wl, x)] for x in cfgs}
    rows = []
    for wl in workloads:
        r = sub["results"][wl]
        rows.append([wl, sub["units"][wl]] + [f"{r[x]['median']:,.1f}" for x in cfgs]
                    + [f"{paired(sub['results'], wl, x, a):.2f}" for x in others])
    report.print_table(["workload", "unit", *cfgs, *(f"{x}/{a}" for x in others)], rows,
                       left=2)
    print()
    rows = []
    for wl in workloads:
        med = {x: {k: statistics.median(d[k] for d in sub["counters"][wl][x])
                   for k in ("hashed", "bytes_hashed")} for x in others}
        rows.append([wl] + [f"{med[x]['hashed']:,.0f} / {med[x]['bytes_hashed'] / 2**20:,.1f}"
                            for x in others])
    report.print_table(["files hashed / MiB hashed, per run", *others], rows)
    print()
    cpu = sub["daemon_cpu_us_per_file"]
    rows = [[wl] + [f"{statistics.median(cpu[wl][x]):.1f}" for x in cfgs]
            + [f"{statistics.median(p - q for p, q in zip(cpu[wl][x], cpu[wl][a])):+.1f}"
               for x in others]
            for wl in workloads if wl in cpu]
    if rows:
        report.print_table(["daemon CPU, µs per file (median)", *cfgs,
                            *(f"{x}-{a}" for x in others)], rows)
        print()


def targets_for(sub, tool):
    """PASS/FAIL (and NOT MEASURED) lines of one verilay column's results, and its INFO
    lines."""
    targets = []
    res = sub["results"]
    kernel = transport.engine_of(tool) == "kernel"
    writable_workloads = [wl for wl in res if wl not in READONLY_WORKLOADS]
    why = sub.get("not_measured", {}).get("writable")
    for wl in WRITABLE_WORKLOADS if why else ():
        targets.append(report.not_measured(
            f"{wl} {tool}: talos vs none",
            f"needs a measured writable mount, which {tool} cannot make yet ({why})"))
    for wl in writable_workloads:
        ratio = paired(res, wl, "talos", "none")
        targets.append(report.target(
            f"{wl} {tool}: talos vs none", ratio >= TALOS_RATIO,
            f"{ratio:.3f}x none's rate (target >= {TALOS_RATIO}x; "
            f"{spread(res, wl, 'talos', 'none')})"))
    # Issue 6's target is for any image file's open: big files (the open's cost spread
    # over the read), small ones (where a measured open's OPEN and RELEASE round trips,
    # which an unmeasured mount never makes, weigh most) and cached ones (where they are
    # all there is).
    for wl in READONLY_WORKLOADS if "open-warm" in res else ():
        unit = UNITS.get(wl, "files/s")
        ratio = paired(res, wl, "verity", "none")
        targets.append(report.target(
            f"{wl} {tool}: verity vs none", ratio >= VERITY_RATIO,
            f"{ratio:.3f}x none's {unit} (target >= {VERITY_RATIO}x; "
            f"{spread(res, wl, 'verity', 'none')})"))
    if "open-warm" in res and kernel:
        # The kernel engine's: a warm open of each measured mount (fanotify, the file's
        # later opens spared by an ignore mark) at least 0.85x an unmeasured one's.
        for cfg in ("verity", "hash"):
            ratio = paired(res, "open-warm", cfg, "none")
            targets.append(report.target(
                f"open-warm {tool}: {cfg} vs none (kernel engine's measured warm opens)",
                ratio >= KERNEL_WARM_OPEN_RATIO,
                f"{ratio:.3f}x none's opens/s (target >= {KERNEL_WARM_OPEN_RATIO}x; "
                f"{spread(res, 'open-warm', cfg, 'none')})"))
    elif "open-warm" in res:
        # Issue 21's: a warm open of a measured mount at least half as fast.
        ratio = paired(res, "open-warm", "verity", "none")
        targets.append(report.target(
            f"open-warm {tool}: verity vs none (issue 21)", ratio >= WARM_OPEN_RATIO,
            f"{ratio:.3f}x none's opens/s (target >= {WARM_OPEN_RATIO}x; "
            f"{spread(res, 'open-warm', 'verity', 'none')})"))
    for wl in writable_workloads:
        print(f"INFO  {wl} {tool}: wrong-magic "
              f"{paired(res, wl, 'wrong-magic', 'none'):.2f}x none's rate "
              f"({spread(res, wl, 'wrong-magic', 'none')})")
    if "open-warm" not in res:
        return targets
    print(f"INFO  read-big-cold {tool}: hash "
          f"{paired(res, 'read-big-cold', 'hash', 'none'):.2f}x none's MiB/s")
    print(f"INFO  read-small-cold {tool}: hash "
          f"{paired(res, 'read-small-cold', 'hash', 'none'):.2f}x none's files/s "
          + ("(measured mounts: a fanotify permission event per file's first open)" if kernel
             else "(measured mounts: a FUSE OPEN, which carries the file's bytes, and a "
                  "RELEASE per file; unmeasured: a READ per file)"))
    for wl in READONLY_WORKLOADS:
        print(f"INFO  {wl} {tool}: open-only "
              f"{paired(res, wl, 'open-only', 'none'):.2f}x none's rate "
              f"({spread(res, wl, 'open-only', 'none')}), verity/open-only "
              f"{paired(res, wl, 'verity', 'open-only'):.2f}x: what seeing every open "
              "costs, and what measuring adds to it")
    return targets


def plot(data, png_path):
    subs = dict(data.get("transports") or {})
    if data.get("kernel_engine"):
        subs["kernel"] = data["kernel_engine"]
    if not subs:
        return
    workloads = list(dict.fromkeys(wl for sub in subs.values() for wl in sub["results"]))
    rows = []
    for wl in workloads:
        bars = [{"label": f"{c}/{t}", "value": r["median"], "lo": min(r["per_s"]),
                 "hi": max(r["per_s"])}
                for t, sub in subs.items()
                for c, r in sub["results"].get(wl, {}).items()]
        unit = next(sub["units"][wl] for sub in subs.values() if wl in sub["units"])
        rows.append((f"{wl} ({unit}); bars: policy/transport (kernel: the kernel engine)", {"rate": bars}))
    report.bar_grid(png_path, "cost of measuring file opens (higher is better)",
                    rows, [("rate", "per second")])
