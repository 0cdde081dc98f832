"""Output shared by all benchmarks: host facts, JSON results, tables, targets, plots."""

import json
import os
import platform
import time

from harness import tools


def host_info():
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return {"kernel": platform.release(), "cpu": cpu, "nproc": os.cpu_count(),
            "mem_gib": round(mem_kib / 2**20, 1), "root": os.geteuid() == 0,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_json(path, data):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.rename(path + ".tmp", path)


# The tables printed since the last `take_tables`, for the JSON and the HTML report.
_TABLES = []


def print_table(headers, rows, left=1, title=None, missing=()):
    """Print rows of strings as aligned columns; the first `left` columns are
    left-aligned, the rest (numbers) right-aligned. `missing` are the rows of peers that
    could not be measured: (first cells, why); each is printed with "not measured" after
    its first cells, and the reasons below the table. The table is kept for the JSON and
    the report, under `title`."""
    missing = [(list(cells), why) for cells, why in missing]
    shown = rows + [cells + ["not measured"] + [""] * (len(headers) - len(cells) - 1)
                    for cells, _ in missing]
    table = [headers] + shown
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    if title:
        print(title)
    for i, row in enumerate(table):
        flush_left = left if i <= len(rows) else len(row)  # a missing row's note too
        print("  ".join(c.ljust(w) if j < flush_left else c.rjust(w)
                        for j, (c, w) in enumerate(zip(row, widths))).rstrip())
    for cells, why in missing:
        print(f"  {' '.join(c for c in cells if c)}: not measured, because {why}")
    _TABLES.append({"title": title, "headers": headers, "rows": rows, "left": left,
                    "missing": [{"cells": cells, "why": why} for cells, why in missing]})


def take_tables():
    """The tables printed since the last call."""
    out = list(_TABLES)
    _TABLES.clear()
    return out


def secs(x):
    """Seconds with three decimals, or "-" for none."""
    return f"{x:.3f}" if x is not None else "-"


def wall_rows(results, key, ok, width, more):
    """Table rows of `width` columns, one per result r: r[key], its tool, its median, min
    and max wall seconds, then the columns more(r); "failed" and blanks where not ok(r)."""
    rows = []
    for r in results:
        if not ok(r):
            rows.append([r[key], r["tool"], "failed"] + [""] * (width - 3))
            continue
        t = r["wall_s"]
        rows.append([r[key], r["tool"], secs(t["median"]), secs(t["min"]), secs(t["max"])]
                    + more(r))
    return rows


def wall_bar(r):
    """The bar_grid bar of result r: its tool, median wall seconds, min..max, and the cold
    run's as the marker."""
    return {"label": r["tool"], "value": r["wall_s"]["median"], "lo": r["wall_s"]["min"],
            "hi": r["wall_s"]["max"], "marker": r["cold"] and r["cold"]["wall_s"]}


def target(name, ok, detail):
    """One PASS/FAIL line (ok is True or False) and its JSON record; ok None is a target
    the run could not measure: a NOT MEASURED line, detail saying why."""
    if ok is None:
        return not_measured(name, detail)
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict}  {name}: {detail}")
    return {"target": name, "verdict": verdict, "detail": detail}


def not_measured(name, why):
    """One NOT MEASURED line (a target the run could not measure, and why) and its JSON
    record."""
    print(f"NOT MEASURED  {name}: {why}")
    return {"target": name, "verdict": "NOT MEASURED", "detail": why}


def pyplot():
    """matplotlib.pyplot, drawing to files (the Agg backend: no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def bar_grid(path, title, rows, columns):
    """Save a PNG with one bar chart per (row, column) cell.

    rows: [(row_label, {column: [bar, ...]})] where each bar is a dict with
    "label", "value" and optionally "lo"/"hi" (drawn as a min..max range) and
    "marker" (an extra point, e.g. the cold-cache run).
    columns: [(column_key, axis_label)]."""
    plt = pyplot()

    fig, axes = plt.subplots(len(rows), len(columns), squeeze=False,
                             figsize=(5.5 * len(columns), 3.2 * len(rows)))
    for (row_label, cells), ax_row in zip(rows, axes):
        for (key, axis_label), ax in zip(columns, ax_row):
            bars = cells.get(key, [])
            xs = range(len(bars))
            values = [b["value"] for b in bars]
            ranged = any("lo" in b for b in bars)
            err = [[b["value"] - b.get("lo", b["value"]) for b in bars],
                   [b.get("hi", b["value"]) - b["value"] for b in bars]]
            ax.bar(xs, values, yerr=err if ranged else None, capsize=4,
                   color=["tab:red" if b["label"].startswith("verilay") else "tab:blue"
                          for b in bars])
            marks = [(x, b["marker"]) for x, b in zip(xs, bars) if b.get("marker")]
            if marks:
                ax.plot(*zip(*marks), "kx", label="cold cache")
                ax.legend(fontsize="small")
            for x, b in zip(xs, bars):
                ax.annotate(f"{b['value']:.3g}", (x, b.get("hi", b["value"])),
                            xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=8)
            ax.margins(y=0.12)
            ax.set_xticks(list(xs), [b["label"] for b in bars], rotation=15,
                          fontsize=8)
            ax.set_ylabel(axis_label)
            ax.set_title(row_label, fontsize=9)
    fig.suptitle(title)
    # Room at the top for the title, whatever the number of rows.
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def selected_parts(bench, ctx, known):
    """The parts of `bench` that `bench/run BENCH --parts A,B` names (all of `known` by
    default), in `known`'s order; an unknown one ends the run naming those there are."""
    parts = getattr(ctx, "parts", None) or known
    unknown = sorted(set(parts) - set(known))
    if unknown:
        raise SystemExit(f"{bench}: unknown part {', '.join(unknown)} "
                         f"(have: {', '.join(known)})")
    return [p for p in known if p in parts]


def bench_data(bench, ctx, settings, fields):
    """A bench's JSON record as it starts: its name, the host, the revision measured, its
    settings (the runs and quick of `ctx`, then `settings`), then `fields` (what it fills
    in as it runs)."""
    return {"bench": bench, "host": host_info(), "verilay_revision": tools.git_revision(),
            "settings": {"runs": ctx.runs, "quick": ctx.quick, **settings}, **fields}
