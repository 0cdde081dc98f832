"""The benchmark table. Each benchmark is a module with:

    DESCRIPTION   one line
    run(ctx)      measure, print a human table and PASS/FAIL lines, and return
                  a JSON-serialisable dict with every raw sample (plus "targets")
    plot(data, png_path)

ctx has .quick (bool: small dataset, fewer runs), .runs (timed runs per
measurement) and .out (results directory). To add a benchmark, write
benches/NAME.py and list it below.
"""

from . import (build, compressed, containerd, containers, digest, fallocate, ima, labelled,
               latency, meta, mount, read, remote, storm)

BENCHES = {
    "build": build,
    "digest": digest,
    "read": read,
    "mount": mount,
    "labelled": labelled,
    "fallocate": fallocate,
    "storm": storm,
    "meta": meta,
    "ima": ima,
    "latency": latency,
    "remote": remote,
    "compressed": compressed,
    "containers": containers,
    "containerd": containerd,
}
