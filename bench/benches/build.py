"""build: image build time and size, `verilay build` against mkfs.erofs and mkcomposefs.

Two verilay rows: `verilay` builds a sealed image (per-file fs-verity digests and the
image's Merkle tree appended), `verilay-plain` a plain EROFS image (`--no-verity`), the
like-for-like match for mkfs.erofs. The sealed build is compared with the peers' way
to the same result: mkfs.erofs 1.9, then `fsverity digest --out-merkle-tree` of its
image (which still lacks per-file digests).

Per dataset: one pass reading the whole tree (page cache warm), then RUNS timed
runs of every tool, interleaved (run 1 of each tool, run 2 of each tool, ...)
so drift hits all tools alike; then, as root, one cold run per tool right after
dropping caches. Every tool gets the same SOURCE_DATE_EPOCH.
"""

import os
import shutil

from harness import datasets, report, timing, tools

DESCRIPTION = "image build time and size: verilay build vs mkfs.erofs / mkcomposefs"

SOURCE_DATE_EPOCH = "1700000000"
SPEEDUP_TARGET = 2.0  # verilay at least this many times faster than each mkfs.erofs
SIZE_TARGET = 1.02  # verilay's image at most this times mkfs.erofs's


# name, env var (harness.tools.PEERS), arguments
PEERS = [
    ("mkfs.erofs-1.5", "MKFS_EROFS", ["--quiet", "{image}", "{src}"]),
    # Uncompressed, with the xattr name filters verilay also writes: the like-for-like image.
    ("mkfs.erofs-1.9", "MKFS_EROFS_19", ["--quiet", "-Exattr-name-filter", "{image}", "{src}"]),
    ("mkcomposefs", "MKCOMPOSEFS", ["{src}", "{image}"]),
]
USES = [env for _, env, _ in PEERS] + ["FSVERITY"]
VERILAY_ARGS = ["build", "{src}", "-o", "{image}", "--quiet"]
# The sealed image's peer: an mkfs.erofs 1.9 image, then its Merkle tree and digest.
SEAL_PEER = "mkfs.erofs-1.9+fsverity"
SEAL_SCRIPT = ('"$0" --quiet -Exattr-name-filter "$2" "$1" && '
               '"$3" digest --out-merkle-tree="$2.tree" "$2" >/dev/null')


def find_tools(scratch):
    """{name: {"path", "version", "args"}} of the available tools, verilay first,
    and {name: reason} of the missing ones."""
    found, missing = {}, {}
    path, why = tools.verilay(scratch)
    if path:
        version = tools.version(path)
        found["verilay"] = {"path": path, "version": version, "args": VERILAY_ARGS}
        found["verilay-plain"] = {"path": path, "version": version,
                                  "args": VERILAY_ARGS + ["--no-verity"]}
    else:
        missing["verilay"] = why
    for name, env_var, args in PEERS:
        path = tools.find(env_var)
        if path:
            found[name] = {"path": path, "version": tools.version(path), "args": args}
        else:
            missing[name] = tools.missing(env_var)
    fsverity = tools.find("FSVERITY")
    if "mkfs.erofs-1.9" in found and fsverity:
        found[SEAL_PEER] = {"path": "sh", "version": found["mkfs.erofs-1.9"]["version"],
                            "args": ["-c", SEAL_SCRIPT, found["mkfs.erofs-1.9"]["path"],
                                     "{src}", "{image}", fsverity]}
    else:
        missing[SEAL_PEER] = ("it needs mkfs.erofs-1.9 and fsverity: "
                              + (missing.get("mkfs.erofs-1.9") or tools.missing("FSVERITY")))
    return found, missing


def argv(tool, src, image):
    return [tool["path"]] + [a.format(src=src, image=image) for a in tool["args"]]


def erofs_bytes(image):
    """Size of the EROFS part of an image (superblock blocks << blkszbits), or None
    when the file does not start with an EROFS superblock. For verilay this
    leaves out the verity section that follows the EROFS bytes."""
    with open(image, "rb") as f:
        f.seek(1024)
        sb = f.read(40)
    if len(sb) < 40 or int.from_bytes(sb[0:4], "little") != 0xE0F5E1E2:
        return None
    return int.from_bytes(sb[36:40], "little") << sb[12]


def measure_dataset(ds, found, runs, cold, scratch, env):
    """Warm and cold samples of every tool on one dataset: [{dataset, tool, ...}]."""
    results = {name: {"dataset": ds.name, "tool": name, "warm": [], "cold": None}
               for name in found}

    def sample(name):
        image = os.path.join(scratch, f"{name}.img")
        for old in (image, image + ".tree"):
            if os.path.exists(old):
                os.unlink(old)
        r = results[name]
        r["cmd"] = " ".join(argv(found[name], ds.path, image))
        s = timing.run_once(argv(found[name], ds.path, image), env=env)
        r["size_bytes"] = os.path.getsize(image)
        r["erofs_bytes"] = erofs_bytes(image)
        return s

    def each_tool(fn):
        for name, r in results.items():
            if "error" not in r:
                try:
                    fn(name, r)
                except timing.CommandFailed as e:
                    print(f"  {name} failed on {ds.name}: {e}")
                    r["error"] = str(e)

    for i in range(runs):
        print(f"  {ds.name}: warm run {i + 1}/{runs}", flush=True)
        each_tool(lambda name, r: r["warm"].append(sample(name)))
    if cold:
        print(f"  {ds.name}: cold runs (caches dropped before each)", flush=True)

        def cold_run(name, r):
            timing.drop_caches()
            r["cold"] = sample(name)
        each_tool(cold_run)
    for r in results.values():
        if r["warm"] and "error" not in r:
            r["wall_s"] = timing.summarize(r["warm"])
    return list(results.values())


def ok(r):
    return r is not None and "wall_s" in r


def add_ratios(results):
    """Give each peer's row verilay/peer ratios of median time and image size: the
    sealed build against the sealing peer, the plain build against the others."""
    by = {(r["dataset"], r["tool"]): r for r in results}
    for r in results:
        if r["tool"].startswith("verilay"):
            continue
        ours = "verilay" if r["tool"] == SEAL_PEER else "verilay-plain"
        vl = by.get((r["dataset"], ours))
        if ok(r) and ok(vl):
            r["vs"] = ours
            r["time_ratio"] = vl["wall_s"]["median"] / r["wall_s"]["median"]
            r["size_ratio"] = vl["size_bytes"] / r["size_bytes"]


def check_targets(results, missing):
    """PASS/FAIL lines against each mkfs.erofs version, per dataset; NOT MEASURED ones
    against a version that is missing."""
    targets = []
    for ds in dict.fromkeys(r["dataset"] for r in results):
        for peer in ("mkfs.erofs-1.5", "mkfs.erofs-1.9"):
            if peer in missing:
                for what in ("time", "size"):
                    targets.append(report.not_measured(f"{ds} vs {peer} {what}",
                                                       missing[peer]))
    for r in results:
        if not r["tool"].startswith("mkfs.erofs") or r["tool"] == SEAL_PEER or not ok(r):
            continue
        where = f"{r['dataset']} vs {r['tool']}"
        if "time_ratio" not in r:
            targets.append(report.not_measured(where, "verilay was not measured"))
            continue
        speedup = 1 / r["time_ratio"]
        targets.append(report.target(
            f"{where} time", speedup >= SPEEDUP_TARGET,
            f"verilay --no-verity is {speedup:.2f}x as fast (target >= {SPEEDUP_TARGET}x)"))
        targets.append(report.target(
            f"{where} size", r["size_ratio"] <= SIZE_TARGET,
            f"verilay image is {r['size_ratio']:.4f}x the size (target <= {SIZE_TARGET}x)"))
    for r in results:
        if r["tool"] == SEAL_PEER and "time_ratio" in r:
            print(f"INFO  {r['dataset']} sealed: verilay build is {1 / r['time_ratio']:.2f}x "
                  f"as fast as mkfs.erofs 1.9 + fsverity digest (no target)")
    return targets


def print_results(results, missing):
    rows = report.wall_rows(results, "dataset", ok, 10, lambda r: [
        report.secs(r["cold"] and r["cold"]["wall_s"]),
        f"{r['size_bytes']:,}",
        f"{r['erofs_bytes']:,}" if r["erofs_bytes"] else "-",
        f"{r['time_ratio']:.3f}" if "time_ratio" in r else "-",
        f"{r['size_ratio']:.4f}" if "size_ratio" in r else "-"])
    report.print_table(["dataset", "tool", "median s", "min s", "max s", "cold s",
                        "image bytes", "erofs bytes", "vl/peer time",
                        "vl/peer size"], rows, left=2,
                       missing=[([ds, tool], why)
                                for ds in dict.fromkeys(r["dataset"] for r in results)
                                for tool, why in missing.items() if tool != "verilay"])
    if any(r["tool"] == "mkcomposefs" for r in results):
        print("(mkcomposefs images hold metadata only, file data stays outside: "
              "its size is not comparable)")


def run(ctx):
    scratch = datasets.scratch_dir("build")
    found, missing = find_tools(scratch)
    for name, reason in missing.items():
        print(f"{name}: not measured, because {reason}" if name != "verilay"
              else f"verilay: not available ({reason}); measuring peers only")
    cold = tools.announce(found)
    env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)

    data = report.bench_data("build", ctx, {"cold": cold, "source_date_epoch": SOURCE_DATE_EPOCH},
                             {"tools": found, "missing": missing, "datasets": {}, "results": []})
    for ds in datasets.for_run(ctx.quick):
        datasets.warm(ds)
        print(ds.describe(), flush=True)
        data["datasets"][ds.name] = {"path": ds.path, "origin": ds.origin, **ds.stats}
        data["results"] += measure_dataset(ds, found, ctx.runs, cold, scratch, env)
    shutil.rmtree(scratch)

    add_ratios(data["results"])
    print()
    print_results(data["results"], missing)
    print()
    data["targets"] = check_targets(data["results"], missing)
    return data


def plot(data, png):
    rows = []
    for ds in data["datasets"]:
        rs = [r for r in data["results"] if r["dataset"] == ds and ok(r)]
        time_bars = [report.wall_bar(r) for r in rs]
        size_bars = [{"label": r["tool"], "value": r["size_bytes"] / 2**20} for r in rs]
        rows.append((f"{ds} ({data['datasets'][ds]['files']:,} files)",
                     {"time": time_bars, "size": size_bars}))
    report.bar_grid(png, f"build: image build (median of {data['settings']['runs']}, "
                         f"min..max; x = cold cache)", rows,
                    [("time", "wall time, s"), ("size", "image size, MiB")])
