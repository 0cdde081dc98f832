"""compressed: compressed images, `verilay build -z` against mkfs.erofs and mksquashfs, and
reading them back through verilay against the kernel's erofs and squashfs and squashfuse.

Build (per compression setting, the Linux source; usr-share with --quick): image size and
build time (median of RUNS, interleaved, same SOURCE_DATE_EPOCH) of

  verilay          `verilay build -z ALG -C PCLUSTER --no-verity` (the plain EROFS image:
                   like for like with mkfs.erofs; a sealed image adds its Merkle tree)
  verilay-none     `verilay build --no-verity`, uncompressed, for the ratio
  mkfs.erofs-1.5   Debian's (lz4/lz4hc only), `-zALG -C PCLUSTER`
  mkfs.erofs-1.9   the newest, if given (MKFS_EROFS_19 or mkfs.erofs-1.9 on PATH)
  mksquashfs       the same algorithm (lz4 -Xhc for lz4hc), its default block size

Read (lz4hc, 64 KiB pclusters): cold and warm read-all and one large compressible file
(256 MiB of the dataset's text), through verilay (each FUSE transport), the kernel's erofs
mount of the same image, the kernel's squashfs and squashfuse of the same tree.

Targets (issue 23): size <= 1.02x mkfs.erofs at the same settings; build time <= 0.5x the
newest mkfs.erofs's; reads within 1.5x of the kernel's erofs, and ahead of squashfuse
everywhere.
"""

import os
import shutil
import statistics
import subprocess

from harness import datasets, report, timing, tools, transport
from . import build as build_bench
from . import mount as mount_bench

DESCRIPTION = "compressed images: build size/time vs mkfs.erofs, mksquashfs; reads vs kernel"
USES = ["MKFS_EROFS", "MKFS_EROFS_19", "MKSQUASHFS", "SQUASHFUSE"]

SOURCE_DATE_EPOCH = "1700000000"
SIZE_TARGET = 1.02
TIME_TARGET = 0.5
READ_RATIO = 1.5
LARGE = 256 << 20

# (name, verilay/mkfs.erofs -z spelling, pcluster bytes, mksquashfs compressor args)
SETTINGS = [
    ("lz4hc-4k", "lz4hc", 4096, ["-comp", "lz4", "-Xhc"]),
    ("lz4hc-64k", "lz4hc", 65536, ["-comp", "lz4", "-Xhc"]),
    ("zstd-64k", "zstd", 65536, ["-comp", "zstd"]),
]
READ_SETTING = "lz4hc-64k"
# What `--parts` may name.
PARTS = ("build", "read")
MKFS_15_ALGORITHMS = ("lz4", "lz4hc")


def builders(verilay):
    """{tool: argv template} for one setting's builds; {tool: why missing}."""
    found, missing = {}, {}
    found["verilay"] = [verilay, "build", "--quiet", "--no-verity", "-z", "{z}", "-C", "{c}",
                        "-o", "{image}", "{src}"]
    found["verilay-none"] = [verilay, "build", "--quiet", "--no-verity", "-o", "{image}",
                             "{src}"]
    for name, env in (("mkfs.erofs-1.5", "MKFS_EROFS"), ("mkfs.erofs-1.9", "MKFS_EROFS_19")):
        path = tools.find(env)
        if path:
            found[name] = [path, "--quiet", "-z{z}", "-C{c}", "{image}", "{src}"]
        else:
            missing[name] = tools.missing(env)
    mksq = tools.find("MKSQUASHFS")
    if mksq:
        found["mksquashfs"] = [mksq, "{src}", "{image}", "-noappend", "-quiet", "-no-progress",
                               "{sq}"]
    else:
        missing["mksquashfs"] = tools.missing("MKSQUASHFS")
    return found, missing


def argv(template, setting, src, image):
    name, z, c, sq = setting
    out = []
    for a in template:
        if a == "{sq}":
            out += sq
        else:
            out.append(a.format(z=z, c=c, src=src, image=image))
    return out


def applies(tool, setting):
    return not (tool == "mkfs.erofs-1.5" and setting[1] not in MKFS_15_ALGORITHMS)


def measure_builds(ds, found, runs, scratch, env):
    """[{dataset, setting, tool, samples, size_bytes, erofs_bytes}] for every setting."""
    rows = []
    for setting in SETTINGS:
        todo = {t: a for t, a in found.items() if applies(t, setting)}
        if setting is not SETTINGS[0]:
            todo.pop("verilay-none", None)  # the same image for every setting
        res = {t: {"dataset": ds.name, "setting": setting[0], "tool": t, "samples": []}
               for t in todo}
        for i in range(runs):
            print(f"  build {setting[0]}: run {i + 1}/{runs}", flush=True)
            for tool, template in todo.items():
                r = res[tool]
                if "error" in r:
                    continue
                image = os.path.join(scratch, f"{tool}.img")
                if os.path.exists(image):
                    os.unlink(image)
                cmd = argv(template, setting, ds.path, image)
                r["cmd"] = " ".join(cmd)
                try:
                    r["samples"].append(timing.run_once(cmd, env=env)["wall_s"])
                except timing.CommandFailed as e:
                    print(f"  {tool} failed: {e}")
                    r["error"] = str(e)
                    continue
                r["size_bytes"] = os.path.getsize(image)
                r["erofs_bytes"] = build_bench.erofs_bytes(image)
        for r in res.values():
            if r["samples"]:
                r["median_s"] = statistics.median(r["samples"])
        rows += res.values()
    return rows


def build_targets(rows, missing):
    by = {(r["setting"], r["tool"]): r for r in rows}
    t = []
    for setting, *_ in SETTINGS:
        vl = by.get((setting, "verilay"))
        if not vl or "median_s" not in vl:
            continue
        size = vl["erofs_bytes"] or vl["size_bytes"]
        for peer in ("mkfs.erofs-1.5", "mkfs.erofs-1.9"):
            if peer in missing:
                t.append(report.not_measured(f"{setting} size vs {peer}", missing[peer]))
                if peer == "mkfs.erofs-1.9":
                    t.append(report.not_measured(f"{setting} build time vs {peer}",
                                                 missing[peer]))
            p = by.get((setting, peer))
            if not p or "median_s" not in p:
                continue
            ratio = size / p["size_bytes"]
            t.append(report.target(f"{setting} size vs {peer}", ratio <= SIZE_TARGET,
                                   f"{ratio:.4f}x its image (target <= {SIZE_TARGET}x)"))
        newest = by.get((setting, "mkfs.erofs-1.9")) or by.get((setting, "mkfs.erofs-1.5"))
        if newest and "median_s" in newest:
            ratio = vl["median_s"] / newest["median_s"]
            t.append(report.target(f"{setting} build time vs {newest['tool']}",
                                   ratio <= TIME_TARGET,
                                   f"{ratio:.2f}x its time (target <= {TIME_TARGET}x)"))
    return t


def print_builds(rows, missing):
    none = next((r for r in rows if r["tool"] == "verilay-none" and "size_bytes" in r), None)
    table = []
    for r in rows:
        if "median_s" not in r:
            table.append([r["setting"], r["tool"], "failed", "", "", ""])
            continue
        table.append([r["setting"], r["tool"], f"{r['median_s']:.2f}",
                      f"{min(r['samples']):.2f}..{max(r['samples']):.2f}",
                      f"{r['size_bytes']:,}",
                      f"{r['size_bytes'] / none['size_bytes']:.3f}" if none else "-"])
    report.print_table(["setting", "tool", "median s", "min..max", "bytes",
                        "vs uncompressed"], table, left=2,
                       missing=[([s[0], tool], why) for s in SETTINGS
                                for tool, why in missing.items()])


def large_tree(src, scratch):
    """A tree of one 256 MiB compressible file: the dataset's files, concatenated."""
    d = os.path.join(scratch, "large-src")
    os.makedirs(d, exist_ok=True)
    left = LARGE
    with open(os.path.join(d, "big"), "wb") as out:
        while left > 0:
            for root, _, files in os.walk(src):
                for f in files:
                    p = os.path.join(root, f)
                    if os.path.islink(p) or left <= 0:
                        continue
                    with open(p, "rb") as i:
                        chunk = i.read(left)
                    out.write(chunk)
                    left -= len(chunk)
    return d


def read_mounts(verilay, src, scratch, tag, transports, squashfuse, kernel):
    """The mounts of one tree: kernel erofs and verilay (the same lz4hc image; each FUSE
    transport, and the kernel engine if `kernel`), kernel squashfs and squashfuse (one
    squashfs image)."""
    _, z, c, sq = next(s for s in SETTINGS if s[0] == READ_SETTING)
    img = os.path.join(scratch, f"{tag}.img")
    subprocess.run([verilay, "build", "--quiet", "-z", z, "-C", str(c), "-o", img, src],
                   check=True, env=dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH))
    ms = mount_bench.mounts_for({"erofs": img}, scratch, tag, verilay, {}, transports, kernel)
    mksq = tools.find("MKSQUASHFS")
    if mksq:
        sqfs = os.path.join(scratch, f"{tag}.sqfs")
        subprocess.run([mksq, src, sqfs, "-noappend", "-quiet", "-no-progress"] + sq,
                       check=True, stdout=subprocess.DEVNULL)
        d = os.path.join(scratch, f"{tag}-squashfs")
        ms.append(mount_bench.Mounted("kernel-squashfs", sqfs, d,
                                      ["mount", "-t", "squashfs", "-o", "ro,loop", sqfs, d],
                                      ["umount", d]))
        if squashfuse:
            d = os.path.join(scratch, f"{tag}-squashfuse")
            ms.append(mount_bench.Mounted("squashfuse", sqfs, d, [squashfuse, sqfs, d],
                                          mount_bench.fuse_umount(d)))
    return ms


def read_targets(results, transports, kernel):
    """Each verilay column against kernel erofs (the kernel engine within the mount
    bench's 1.1x, the FUSE engine within READ_RATIO) and against squashfuse (ahead);
    NOT MEASURED where squashfuse is missing."""
    by = {(r["workload"], r["tool"]): r for r in results}
    t = []
    for wl in ("read-all", "large-file"):
        k, sf = by.get((wl, "kernel-erofs")), by.get((wl, "squashfuse"))
        for tool in transport.verilay_tools(transports, kernel):
            vl = by.get((wl, tool))
            if not vl:
                continue
            limit = (mount_bench.KERNEL_ENGINE_RATIO if transport.engine_of(tool) == "kernel"
                     else READ_RATIO)
            for temp in ("cold", "warm"):
                if k:
                    ratio = vl[f"{temp}_median"] / k[f"{temp}_median"]
                    t.append(report.target(f"{wl} {temp} {tool} vs kernel erofs",
                                           ratio <= limit,
                                           f"{ratio:.2f}x its time (target <= {limit}x)"))
                if sf:
                    ratio = vl[f"{temp}_median"] / sf[f"{temp}_median"]
                    t.append(report.target(f"{wl} {temp} {tool} vs squashfuse", ratio < 1.0,
                                           f"{ratio:.2f}x its time (target: ahead)"))
                else:
                    t.append(report.not_measured(
                        f"{wl} {temp} {tool} vs squashfuse",
                        tools.missing("SQUASHFUSE") or tools.missing("MKSQUASHFS")
                        or "squashfuse did not run"))
    return t


@transport.uring_switch
def run(ctx):
    scratch = datasets.scratch_dir("compressed")
    verilay, why = tools.verilay(scratch)
    data = report.bench_data("compressed", ctx,
                             {"transports": ctx.transports,
                              "compression": [s[0] for s in SETTINGS], "read": READ_SETTING},
                             {"builds": [], "results": [], "targets": []})
    if not verilay:
        print(f"compressed bench skipped: {why}")
        data["targets"].append(report.target("compressed", None, why))
        return data
    ds = datasets.for_run(ctx.quick)[0]
    datasets.warm(ds)
    print(ds.describe(), flush=True)
    data["dataset"] = {"name": ds.name, **ds.stats}

    parts = report.selected_parts("compressed", ctx, PARTS)
    if "build" in parts:
        found, missing = builders(verilay)
        for name, reason in missing.items():
            print(f"{name}: not measured, because {reason}")
        data["missing"] = missing
        env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)
        data["builds"] = measure_builds(ds, found, ctx.runs, scratch, env)
        print()
        print_builds(data["builds"], missing)
        print()
        data["targets"] += build_targets(data["builds"], missing)

    if "read" in parts:
        if timing.drop_caches() is not None:
            data["targets"].append(report.not_measured(
                "compressed reads", "not root: the read part mounts and drops caches"))
        else:
            measure_reads(ctx, verilay, ds, scratch, data)
    shutil.rmtree(scratch, ignore_errors=True)
    return data


def measure_reads(ctx, verilay, ds, scratch, data):
    """The read part: verilay's and the peers' mounts of one compressed image, read-all
    and one large file, cold and warm."""
    squashfuse = tools.find("SQUASHFUSE")
    kernel = transport.kernel_column(verilay, data)
    results = {}
    mount_bench.measure(read_mounts(verilay, ds.path, scratch, "tree", ctx.transports,
                                    squashfuse, kernel),
                        {"read-all": mount_bench.WORKLOADS["read-all"]}, ctx.runs,
                        results, ds.name, data)
    big = large_tree(ds.path, scratch)
    mount_bench.measure(read_mounts(verilay, big, scratch, "large", ctx.transports,
                                    squashfuse, kernel),
                        {"large-file": "cat big > /dev/null"}, ctx.runs, results,
                        "large", data)
    for (wl, tool), r in results.items():
        data["results"].append({"workload": wl, "tool": tool, "cold": r["cold"],
                                "warm": r["warm"],
                                "cold_median": statistics.median(r["cold"]),
                                "warm_median": statistics.median(r["warm"])})
    mount_bench.print_results(data, {"kernel-squashfs": tools.missing("MKSQUASHFS"),
                                     "squashfuse": tools.missing("SQUASHFUSE")})
    data["targets"] += read_targets(data["results"], ctx.transports, kernel)


def plot(data, png):
    rows = []
    for setting in data["settings"]["compression"]:
        rs = [r for r in data["builds"] if r["setting"] == setting and "median_s" in r]
        if not rs:
            continue
        rows.append((f"build {setting}", {
            "time": [{"label": r["tool"], "value": r["median_s"], "lo": min(r["samples"]),
                      "hi": max(r["samples"])} for r in rs],
            "size": [{"label": r["tool"], "value": r["size_bytes"] / 2**20} for r in rs]}))
    if rows:
        report.bar_grid(png.replace(".png", "-build.png"),
                        f"compressed build: median of {data['settings']['runs']} (min..max)",
                        rows, [("time", "wall time, s"), ("size", "image size, MiB")])
    if data.get("results"):
        report.bar_grid(png, f"compressed reads ({READ_SETTING}): median of "
                             f"{data['settings']['runs']} (min..max)",
                        mount_bench.cold_warm_rows(data["results"]),
                        [("cold", "cold cache, s"), ("warm", "warm cache, s")])
