"""digest: fs-verity file digest time, `verilay digest` against `fsverity digest`.

Per file (random bytes, created once under $VERILAY_BENCH_DATA/digest/): read it
once (page cache warm), run each tool once untimed and check that both print the
same digest, then RUNS timed runs of each tool, interleaved (run 1 of each tool,
run 2 of each tool, ...); then, as root, one cold run per tool right after
dropping caches. Both tools get the same arguments: SHA-256, 4 KiB blocks, no salt.
"""

import os
import shutil
import subprocess

from harness import datasets, report, timing, tools

DESCRIPTION = "fs-verity file digest time: verilay digest vs fsverity digest"
USES = ["FSVERITY"]

SPEEDUP_TARGET = 1.5  # verilay at least this many times faster than fsverity digest
ARGS = ["digest", "--hash-alg", "sha256", "--block-size", "4096", "{file}"]
# name, size: the files a full run measures; --quick takes the first only.
FILES = [("256MiB", 256 << 20), ("1GiB", 1 << 30)]
FILE_DIR = os.path.join(datasets.DATA_DIR, "digest")


def random_file(name, size):
    """FILE_DIR/random-NAME: SIZE random bytes, written once (under a temporary name,
    renamed when complete) and reused after."""
    path = os.path.join(FILE_DIR, f"random-{name}")
    if os.path.exists(path) and os.path.getsize(path) == size:
        return path
    os.makedirs(FILE_DIR, exist_ok=True)
    print(f"preparing {path} ({size:,} random bytes, once)", flush=True)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        left = size
        while left:
            n = min(left, 1 << 20)
            f.write(os.urandom(n))
            left -= n
    os.rename(tmp, path)
    return path


def warm(path):
    """Read the whole file once, so the timed runs find it in the page cache."""
    buf = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def find_tools(scratch):
    """{name: {"path", "version"}} of the available tools, verilay first, and
    {name: reason} of the missing ones."""
    found, missing = {}, {}
    path, why = tools.verilay(scratch)
    if path:
        found["verilay"] = {"path": path, "version": tools.version(path)}
    else:
        missing["verilay"] = why
    path = tools.find("FSVERITY")
    if path:
        found["fsverity"] = {"path": path, "version": tools.version(path, "--version")}
    else:
        missing["fsverity"] = tools.missing("FSVERITY")
    return found, missing


def argv(tool, path):
    return [tool["path"]] + [a.format(file=path) for a in ARGS]


def digest_of(tool, path):
    """Run the tool once (untimed) and return the digest it prints ("sha256:HEX")."""
    out = subprocess.run(argv(tool, path), capture_output=True, text=True)
    if out.returncode != 0:
        raise timing.CommandFailed(f"{' '.join(argv(tool, path))}: exit status "
                                   f"{out.returncode}: {out.stderr.strip()}")
    return out.stdout.split()[0] if out.stdout.split() else ""


def measure_file(name, path, found, runs, cold):
    """Digests and warm and cold samples of every tool on one file: [{file, tool, ...}]."""
    results = {t: {"file": name, "tool": t, "cmd": " ".join(argv(found[t], path)),
                   "warm": [], "cold": None} for t in found}
    for t, r in results.items():
        try:
            r["digest"] = digest_of(found[t], path)
            print(f"  {t:9} {r['digest']}", flush=True)
        except timing.CommandFailed as e:
            print(f"  {t} failed on {name}: {e}")
            r["error"] = str(e)
    if len({r["digest"] for r in results.values() if "digest" in r}) > 1:
        print(f"  !!! {name}: THE DIGESTS DIFFER !!!", flush=True)

    def each_tool(fn):
        for t, r in results.items():
            if "error" not in r:
                try:
                    fn(found[t], r)
                except timing.CommandFailed as e:
                    print(f"  {t} failed on {name}: {e}")
                    r["error"] = str(e)

    for i in range(runs):
        print(f"  {name}: warm run {i + 1}/{runs}", flush=True)
        each_tool(lambda tool, r: r["warm"].append(timing.run_once(argv(tool, path))))
    if cold:
        print(f"  {name}: cold runs (caches dropped before each)", flush=True)

        def cold_run(tool, r):
            timing.drop_caches()
            r["cold"] = timing.run_once(argv(tool, path))
        each_tool(cold_run)
        warm(path)  # leave it cached for what comes next
    for r in results.values():
        if r["warm"] and "error" not in r:
            r["wall_s"] = timing.summarize(r["warm"])
            r["user_s"] = timing.summarize(r["warm"], "user_s")
            r["sys_s"] = timing.summarize(r["warm"], "sys_s")
    return list(results.values())


def ok(r):
    return r is not None and "wall_s" in r


def add_speedups(results):
    """Give each fsverity row the speedup of verilay over it: fsverity / verilay median
    time, warm and (if measured) cold."""
    verilay = {r["file"]: r for r in results if r["tool"] == "verilay"}
    for r in results:
        vl = verilay.get(r["file"])
        if r["tool"] != "verilay" and ok(r) and ok(vl):
            r["speedup"] = r["wall_s"]["median"] / vl["wall_s"]["median"]
            if r["cold"] and vl["cold"]:
                r["cold_speedup"] = r["cold"]["wall_s"] / vl["cold"]["wall_s"]


def check_digests(results, missing):
    """One PASS/FAIL line per file: do all tools print the same digest?"""
    targets = []
    for name in dict.fromkeys(r["file"] for r in results):
        digests = {r["tool"]: r["digest"] for r in results
                   if r["file"] == name and "digest" in r}
        if len(digests) < 2:
            why = "; ".join(f"{t}: {w}" for t, w in missing.items()) or "a tool failed"
            targets.append(report.not_measured(f"{name} same digest", why))
        elif len(set(digests.values())) == 1:
            targets.append(report.target(f"{name} same digest", True,
                                         f"all print {next(iter(digests.values()))}"))
        else:
            targets.append(report.target(
                f"{name} same digest", False, "DIGESTS DIFFER: " + ", ".join(
                    f"{t} printed {d}" for t, d in digests.items())))
    return targets


def check_targets(results, missing):
    targets = []
    if "fsverity" in missing:
        for name in dict.fromkeys(r["file"] for r in results):
            targets.append(report.not_measured(f"{name} vs fsverity time", missing["fsverity"]))
    for r in results:
        if r["tool"] == "verilay" or not ok(r):
            continue
        where = f"{r['file']} vs {r['tool']}"
        if "speedup" not in r:
            targets.append(report.not_measured(where, "verilay was not measured"))
            continue
        targets.append(report.target(
            f"{where} time", r["speedup"] >= SPEEDUP_TARGET,
            f"verilay is {r['speedup']:.2f}x as fast, warm median "
            f"(target >= {SPEEDUP_TARGET}x)"))
    return targets


def print_results(results, missing):
    rows = report.wall_rows(results, "file", ok, 9, lambda r: [
        report.secs(r["user_s"]["median"]),
        report.secs(r["sys_s"]["median"]),
        report.secs(r["cold"] and r["cold"]["wall_s"]),
        f"{r['speedup']:.2f}x" if "speedup" in r else "-"])
    report.print_table(["file", "tool", "median s", "min s", "max s", "user s",
                        "sys s", "cold s", "vl speedup"], rows, left=2,
                       missing=[([f, t], why) for f in dict.fromkeys(r["file"] for r in results)
                                for t, why in missing.items()])


def run(ctx):
    scratch = datasets.scratch_dir("digest")
    found, missing = find_tools(scratch)
    for name, reason in missing.items():
        print(f"{name}: not measured, because {reason}")
    cold = tools.announce(found)

    files = FILES[:1] if ctx.quick else FILES
    data = report.bench_data("digest", ctx, {"cold": cold, "args": ARGS},
                             {"tools": found, "missing": missing, "files": {}, "results": []})
    for name, size in files:
        path = random_file(name, size)
        warm(path)
        print(f"{name}: {path}, {size:,} bytes", flush=True)
        data["files"][name] = {"path": path, "bytes": size}
        data["results"] += measure_file(name, path, found, ctx.runs, cold)
    shutil.rmtree(scratch)

    add_speedups(data["results"])
    print()
    print_results(data["results"], missing)
    print()
    data["targets"] = (check_targets(data["results"], missing)
                       + check_digests(data["results"], missing))
    return data


def plot(data, png):
    rows = []
    for name in data["files"]:
        rs = [r for r in data["results"] if r["file"] == name and ok(r)]
        wall = [report.wall_bar(r) for r in rs]
        cpu = [{"label": r["tool"],
                "value": r["user_s"]["median"] + r["sys_s"]["median"]} for r in rs]
        rows.append((f"{name} file", {"wall": wall, "cpu": cpu}))
    report.bar_grid(png, f"digest: fs-verity digest, sha256 / 4 KiB (median of "
                         f"{data['settings']['runs']}, min..max; x = cold cache)", rows,
                    [("wall", "wall time, s"), ("cpu", "CPU time (user + sys), s")])
