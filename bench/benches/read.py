"""read: cold sequential read of one large file through the verified reader.

A 256 MiB random file (64 MiB with --quick) is put in a sealed image. Each timed
run drops the page cache first, then reads the file once:

  sha256sum        plain hashing of the source file (the peer: same bytes, hashed)
  openssl-sha256   the same with OpenSSL's SHA-256 (SHA-NI where the CPU has it)
  cat              plain `cat` of the source file (what the disk gives)
  verified         `verilay cat IMAGE FILE`: every block hashed and checked against
                   the image's Merkle tree, tree readahead on
  verified-no-ra   the same with tree readahead off (each tree block read when needed)
  direct, direct-no-ra
                   the same two, reading the image with O_DIRECT: no page cache and so
                   no kernel readahead under the verified source, as for a remote or
                   uncached image; here every tree block the reader asks for is an I/O
  iops-direct, iops-direct-no-ra
                   the direct pair again in a blkio cgroup limiting the disk to
                   1000 read IOPS, like a small cloud volume, where each I/O costs

With the page cache, the kernel's own readahead of the image file already fetches
the tree blocks ahead, so tree readahead is measured (and targeted) where it is the
only readahead there is: direct I/O on IOPS-limited storage.

Runs are interleaved (run 1 of each mode, run 2 of each, ...) so drift hits all
alike. Needs root (dropping caches); without it, nothing is measured.
"""

import hashlib
import os
import subprocess

from harness import datasets, report, timing, tools

DESCRIPTION = "cold 256 MiB read: verilay's verified reader vs sha256sum, tree readahead on/off"

VERIFIED_TARGET = 0.95  # verified throughput at least this times sha256sum's
READAHEAD_TARGET = 1.2  # readahead on at least this times as fast as off (IOPS-limited)
IOPS = 1000
CGROUP = "verilay-bench-read"


def make_input(size, scratch, verilay):
    """DATA_DIR/read-<MiB>/src/big (random, created once) and a sealed image of it."""
    base = os.path.join(datasets.DATA_DIR, f"read-{size >> 20}M")
    src = os.path.join(base, "src")
    big = os.path.join(src, "big")
    if not os.path.exists(big) or os.path.getsize(big) != size:
        os.makedirs(src, exist_ok=True)
        with open(big + ".partial", "wb") as f:
            left = size
            while left:
                n = min(left, 1 << 24)
                f.write(os.urandom(n))
                left -= n
        os.rename(big + ".partial", big)
    image = os.path.join(scratch, "big.img")
    out = subprocess.run([verilay, "build", src, "-o", image, "--quiet"],
                         capture_output=True, text=True, check=True)
    return big, image, out.stdout.strip()


def disk_of(path):
    """'MAJ:MIN' of the whole disk holding path (throttling rules name disks)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sys_dev = f"/sys/dev/block/{dev}"
    if os.path.exists(os.path.join(sys_dev, "partition")):
        with open(os.path.join(os.path.realpath(sys_dev), "..", "dev")) as f:
            dev = f.read().strip()
    return dev


def iops_cgroup(path):
    """A cgroup limiting reads from path's disk to IOPS: its cgroup.procs file, or
    (None, why not). cgroup v1 blkio or v2 io.max."""
    dev = disk_of(path)
    v1 = "/sys/fs/cgroup/blkio"
    v2 = "/sys/fs/cgroup"
    try:
        if os.path.isdir(v1):
            cg = os.path.join(v1, CGROUP)
            os.makedirs(cg, exist_ok=True)
            with open(os.path.join(cg, "blkio.throttle.read_iops_device"), "w") as f:
                f.write(f"{dev} {IOPS}\n")
        elif os.path.exists(os.path.join(v2, "cgroup.controllers")):
            with open(os.path.join(v2, "cgroup.subtree_control"), "w") as f:
                f.write("+io\n")
            cg = os.path.join(v2, CGROUP)
            os.makedirs(cg, exist_ok=True)
            with open(os.path.join(cg, "io.max"), "w") as f:
                f.write(f"{dev} riops={IOPS}\n")
        else:
            return None, "no cgroup blkio/io controller"
    except OSError as e:
        return None, f"cannot set up an IOPS limit on {dev}: {e.strerror}"
    return os.path.join(cg, "cgroup.procs"), None


def modes(verilay, big, image, procs):
    cat = [verilay, "cat", image, "big"]
    m = {
        "sha256sum": ["sha256sum", big],
        "cat": ["cat", big],
        # OpenSSL's SHA-256 uses the CPU's SHA extensions: a stricter single-thread peer.
        "openssl-sha256": ["openssl", "dgst", "-sha256", big],
        "verified": cat,
        "verified-no-ra": cat + ["--no-readahead"],
        "direct": cat + ["--direct-io"],
        "direct-no-ra": cat + ["--direct-io", "--no-readahead"],
    }
    if procs:
        jail = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs]
        m["iops-direct"] = jail + m["direct"]
        m["iops-direct-no-ra"] = jail + m["direct-no-ra"]
    return m


def check_output(verilay, big, image):
    """The verified reader returns exactly the file (untimed, once per mode family)."""
    want = hashlib.sha256()
    with open(big, "rb") as f:
        while chunk := f.read(1 << 20):
            want.update(chunk)
    for extra in ([], ["--direct-io"], ["--no-readahead"]):
        got = hashlib.sha256()
        with subprocess.Popen([verilay, "cat", image, "big"] + extra,
                              stdout=subprocess.PIPE) as p:
            while chunk := p.stdout.read(1 << 20):
                got.update(chunk)
        if p.returncode != 0 or got.digest() != want.digest():
            raise SystemExit(f"verilay cat {' '.join(extra)} returned wrong bytes")


def run(ctx):
    size = (64 if ctx.quick else 256) << 20
    scratch = datasets.scratch_dir("read")
    verilay, why = tools.verilay(scratch)
    data = report.bench_data("read", ctx, {"bytes": size},
                             {"results": {}, "targets": []})
    if not verilay:
        print(f"verilay not available: {why}")
        data["targets"].append(report.target("read", None, why))
        return data
    if timing.drop_caches() is not None:
        print("not root: cannot drop caches, so no cold reads are measured")
        data["targets"].append(report.target("read", None, "needs root"))
        return data
    big, image, digest = make_input(size, scratch, verilay)
    print(f"input: {size >> 20} MiB random file, image {image} ({digest})")
    check_output(verilay, big, image)
    procs, why = iops_cgroup(image)
    if not procs:
        print(f"no IOPS-limited runs: {why}")
    data["settings"]["iops_limit"] = IOPS if procs else None
    argvs = modes(verilay, big, image, procs)
    samples = {m: [] for m in argvs}
    for i in range(ctx.runs):
        print(f"  cold run {i + 1}/{ctx.runs}", flush=True)
        for m, argv in argvs.items():
            timing.drop_caches()
            samples[m].append(timing.run_once(argv))
    for m, s in samples.items():
        t = timing.summarize(s)
        data["results"][m] = {"cmd": " ".join(argvs[m]), "samples": s, "wall_s": t,
                              "mib_s": (size >> 20) / t["median"]}
    res = data["results"]

    rows = [[m, f"{r['wall_s']['median']:.3f}", f"{r['wall_s']['min']:.3f}",
             f"{r['wall_s']['max']:.3f}", f"{r['mib_s']:.0f}",
             f"{r['mib_s'] / res['sha256sum']['mib_s']:.2f}"] for m, r in res.items()]
    print()
    report.print_table(["mode", "median s", "min s", "max s", "MiB/s", "vs sha256sum"],
                       rows)
    print()
    t = data["targets"]
    for m in ("verified", "direct"):
        ratio = res[m]["mib_s"] / res["sha256sum"]["mib_s"]
        t.append(report.target(
            f"{m} vs sha256sum", ratio >= VERIFIED_TARGET,
            f"{ratio:.2f}x sha256sum's throughput (target >= {VERIFIED_TARGET}x)"))
    ratio = res["verified"]["mib_s"] / res["openssl-sha256"]["mib_s"]
    print(f"INFO  verified vs openssl dgst -sha256: {ratio:.2f}x its throughput")
    for m in ("verified", "direct", "iops-direct"):
        if m not in res:
            t.append(report.target(f"{m} readahead on vs off", None, why))
            continue
        ratio = res[m]["mib_s"] / res[f"{m}-no-ra"]["mib_s"]
        data[f"{m}_readahead_ratio"] = ratio
        if m == "iops-direct":
            t.append(report.target(
                f"tree readahead on vs off ({IOPS} IOPS, direct I/O)",
                ratio >= READAHEAD_TARGET,
                f"{ratio:.2f}x as fast (target >= {READAHEAD_TARGET}x)"))
        else:
            # With cheap I/O (and, buffered, the kernel's own readahead) this is
            # reported, not targeted.
            print(f"INFO  {m} tree readahead on/off: {ratio:.2f}x")
    return data


def plot(data, png):
    res = data.get("results")
    if not res:
        return
    bars = [{"label": m, "value": r["mib_s"],
             "lo": (data["settings"]["bytes"] >> 20) / r["wall_s"]["max"],
             "hi": (data["settings"]["bytes"] >> 20) / r["wall_s"]["min"]}
            for m, r in res.items()]
    report.bar_grid(png, f"read: cold sequential read of {data['settings']['bytes'] >> 20} "
                         f"MiB (median of {data['settings']['runs']}, min..max)",
                    [("throughput", {"mib_s": bars})], [("mib_s", "MiB/s")])
