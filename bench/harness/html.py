"""One self-contained HTML page of benchmark results (`bench/run --report DIR`).

The page is DIR/index.html: every table each benchmark printed, every plot it drew (PNG,
embedded as data: URIs), its PASS/FAIL/NOT MEASURED lines, the peers it used (path,
version, Debian package) or why each is not measured, the host, the kernel and the git
revision measured. No script, no stylesheet or image from elsewhere: it opens from the
file system in any browser, without a server."""

import base64
import html
import json
import os
import platform
import sys
import time

# Verdict -> CSS class of its line.
VERDICT_CLASS = {"PASS": "pass", "FAIL": "fail", "NOT MEASURED": "nm"}


def verdict(t):
    """A target's verdict; SKIP, which results from before NOT MEASURED existed say, is
    what NOT MEASURED now says."""
    v = t.get("verdict", "?")
    return "NOT MEASURED" if v == "SKIP" else v

STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 90em; color: #222; }
h1 { margin-bottom: 0.2em; }
h2 { border-bottom: 2px solid #888; padding-top: 1em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.6em; }
th { background: #eee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.nm, li.nm { color: #8a5a00; }
li.pass { color: #186a18; }
li.fail { color: #b00020; font-weight: bold; }
ul.targets { font-family: monospace; font-size: 0.9em; }
img { max-width: 100%; border: 1px solid #ccc; margin: 0.5em 0; }
.summary td { text-align: right; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


def esc(x):
    return html.escape(str(x))


def table_html(t):
    """One printed table: its header, its rows (numbers right-aligned past `left`), and a
    row per peer not measured, saying why across the remaining columns."""
    out = [f"<table class=\"result\" data-title=\"{esc(t.get('title') or '')}\">"]
    if t.get("title"):
        out.append(f"<caption>{esc(t['title'])}</caption>")
    out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in t["headers"]) + "</tr>")
    left = t.get("left", 1)
    num = ' class="num"'
    for row in t["rows"]:
        out.append("<tr>" + "".join(f"<td{num if i >= left else ''}>{esc(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>")
    for m in t.get("missing", []):
        span = len(t["headers"]) - len(m["cells"])
        out.append("<tr class=\"missing\">" + "".join(f"<td>{esc(c)}</td>" for c in m["cells"])
                   + f"<td class=\"nm\" colspan=\"{span}\">not measured, because "
                   f"{esc(m['why'])}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def peers_html(lookups):
    """The peers a benchmark looked up: found (path, version, package) or not measured."""
    if lookups is None:
        return "<p>Not recorded: these results are from a bench/run older than its peer list.</p>"
    if not lookups:
        return "<p>No peers: this benchmark compares verilay with the kernel or itself.</p>"
    out = ["<table class=\"peers\"><tr><th>peer</th><th>program</th><th>version</th>"
           "<th>where it comes from</th></tr>"]
    for r in lookups:
        if r["path"]:
            where = (f"Debian package {r['package']}" if r.get("package")
                     else f"${r['env']}" if r.get("from_env") else r.get("source") or "")
            out.append(f"<tr><td>{esc(r['peer'])}</td><td><code>{esc(r['path'])}</code></td>"
                       f"<td>{esc(r['version'])}</td><td>{esc(where)}</td></tr>")
        else:
            out.append(f"<tr><td>{esc(r['peer'])}</td><td class=\"nm\" colspan=\"3\">not "
                       f"measured, because {esc(r['not_measured_because'])}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def image_html(path):
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    return (f"<img alt=\"{esc(os.path.basename(path))}\" "
            f"src=\"data:image/png;base64,{data}\">")


def bench_html(name, description, data, pngs):
    verdicts = [verdict(t) for t in data.get("targets", [])]
    out = [f"<section class=\"bench\" id=\"{esc(name)}\">",
           f"<h2>{esc(name)}</h2>", f"<p>{esc(description)}</p>",
           f"<p>Revision <code>{esc(data.get('verilay_revision', '?'))}</code>, run "
           f"{esc(data.get('host', {}).get('date', '?'))}; settings: "
           f"<code>{esc(json.dumps(data.get('settings', {}), sort_keys=True))}</code></p>",
           "<h3>Peers</h3>", peers_html(data.get("peer_lookups"))]
    tables = data.get("tables")
    out.append("<h3>Tables</h3>" if tables else
               "<p>Tables not recorded: these results are from an older bench/run.</p>"
               if tables is None else
               "<p>No table: the benchmark did not run (see its lines below).</p>")
    out += [table_html(t) for t in tables or []]
    if pngs:
        out.append("<h3>Plots</h3>")
        out += [image_html(p) for p in pngs]
    out.append(f"<h3>Targets ({verdicts.count('PASS')} pass, {verdicts.count('FAIL')} fail, "
               f"{verdicts.count('NOT MEASURED')} not measured)</h3>")
    out.append("<ul class=\"targets\">")
    for t in data.get("targets", []):
        v = verdict(t)
        out.append(f"<li class=\"{VERDICT_CLASS.get(v, '')}\">{esc(v)}&nbsp; "
                   f"{esc(t.get('target'))}: {esc(t.get('detail'))}</li>")
    out.append("</ul></section>")
    return "\n".join(out)


def write(report_dir, benches):
    """Writes report_dir/index.html from benches: [(name, description, data, [png path])];
    returns its path."""
    os.makedirs(report_dir, exist_ok=True)
    host = next((d["host"] for _, _, d, _ in benches if d.get("host")), {})
    revisions = sorted({d.get("verilay_revision", "?") for _, _, d, _ in benches})
    rows, missing = [], {}
    for name, _, data, _ in benches:
        v = [verdict(t) for t in data.get("targets", [])]
        rows.append(f"<tr><td style=\"text-align:left\"><a href=\"#{esc(name)}\">{esc(name)}"
                    f"</a></td><td>{v.count('PASS')}</td><td>{v.count('FAIL')}</td>"
                    f"<td>{v.count('NOT MEASURED')}</td></tr>")
        for r in data.get("peer_lookups") or []:
            if not r["path"]:
                missing.setdefault((r["peer"], r["not_measured_because"]), []).append(name)
    try:
        import matplotlib
        mpl = matplotlib.__version__
    except ImportError:
        mpl = "not installed"
    page = [
        "<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<title>verilay benchmarks</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>verilay benchmarks</h1>",
        f"<p>Written {esc(time.strftime('%Y-%m-%d %H:%M:%S %z'))} by <code>bench/run</code>. "
        f"verilay revision {esc(', '.join(revisions))}. Host: {esc(host.get('cpu', '?'))}, "
        f"{esc(host.get('nproc', '?'))} CPUs, {esc(host.get('mem_gib', '?'))} GiB; Linux "
        f"{esc(host.get('kernel', platform.release()))}; "
        f"{'as root' if host.get('root') else 'not root'}; Python "
        f"{esc(platform.python_version())}, matplotlib {esc(mpl)}; "
        f"{esc(platform.platform())}.</p>",
        "<table class=\"summary\"><tr><th>benchmark</th><th>PASS</th><th>FAIL</th>"
        "<th>NOT MEASURED</th></tr>", *rows, "</table>"]
    if missing:
        page.append("<h2>Not measured</h2><ul class=\"missing-peers\">")
        for (peer, why), names in missing.items():
            page.append(f"<li class=\"nm\"><b>{esc(peer)}</b> ({esc(', '.join(names))}): "
                        f"not measured, because {esc(why)}</li>")
        page.append("</ul>")
    page += [bench_html(*b) for b in benches]
    page.append(f"<p><small>{esc(' '.join(sys.argv))}</small></p></body></html>")
    path = os.path.join(report_dir, "index.html")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(page) + "\n")
    os.rename(path + ".tmp", path)
    return path
