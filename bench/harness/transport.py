"""Mounting verilay with a chosen FUSE transport (issue 21): one function every benchmark
uses, and the kernel switch FUSE over io_uring needs.

`verilay mount --transport uring|dev` serves over FUSE over io_uring or /dev/fuse and says
which on stderr (`DIR: served over io_uring (2 queues x 8 entries, 2 workers)`), which
`mount` returns so a benchmark can record it. io_uring needs Linux 6.14+ and
/sys/module/fuse/parameters/enable_uring = Y; `uring_switch` turns it on for a benchmark
(as root) and puts it back as it was afterwards."""

import functools
import subprocess

URING_PARAM = "/sys/module/fuse/parameters/enable_uring"
TRANSPORTS = ("uring", "dev")


class MountFailed(Exception):
    pass


def tool_name(transport):
    """The column a transport's verilay mount gets in tables and plots."""
    return f"verilay-{transport}"


def transport_of(tool):
    """The transport of a `tool_name` column, or None for another tool."""
    prefix = "verilay-"
    t = tool.split("/")[0][len(prefix):] if tool.startswith(prefix) else None
    return t if t in TRANSPORTS else None


def verilay_tools(transports):
    return [tool_name(t) for t in transports]


def mount(verilay, operands, mnt, transport, extra=()):
    """`verilay mount OPERANDS... MNT --transport T EXTRA...`: returns what the mount says
    it is served over (the text after `served over`), and fails if it is not the transport
    asked for."""
    argv = [verilay, "mount", *operands, mnt, "--transport", transport, *extra]
    out = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise MountFailed(f"`{' '.join(argv)}` failed (exit status {out.returncode}): "
                          f"{out.stderr.strip()}")
    said = served_over(out.stderr, mnt)
    want = {"uring": "io_uring", "dev": "/dev/fuse"}.get(transport)
    if said is None or (want and not said.startswith(want)):
        raise MountFailed(f"`{' '.join(argv)}`: asked for {transport}, the mount said "
                          f"{said or out.stderr.strip()!r}")
    return said


def served_over(stderr, mnt):
    """The transport a `verilay mount` of mnt reported, from its stderr, or None."""
    key = f"{mnt}: served over "
    for line in stderr.splitlines():
        if line.startswith(key):
            return line[len(key):].strip()
    return None


def read_switch():
    """enable_uring's value ("Y"/"N"), or None where the kernel has no such parameter."""
    try:
        with open(URING_PARAM) as f:
            return f.read().strip()
    except OSError:
        return None


def write_switch(value):
    with open(URING_PARAM, "w") as f:
        f.write(value + "\n")


def uring_switch(run):
    """Decorates a benchmark's run(ctx): turns enable_uring on for the run (as root) and
    back to what it was afterwards; ctx.transports is set to the transports that can be
    measured (io_uring left out, with the reason printed, where it cannot be turned on),
    and the result's JSON gets `uring_switch`: the value before, during, and why not."""
    @functools.wraps(run)
    def wrapper(ctx):
        before = read_switch()
        state = {"param": URING_PARAM, "before": before, "during": before, "why_not": None}
        if before is None:
            state["why_not"] = f"{URING_PARAM} missing (kernel older than 6.14?)"
        elif before != "Y":
            try:
                write_switch("Y")
                state["during"] = read_switch()
            except OSError as e:
                state["why_not"] = f"cannot turn on {URING_PARAM}: {e.strerror}"
        if state["during"] != "Y" and not state["why_not"]:
            state["why_not"] = f"{URING_PARAM} reads {state['during']}"
        ctx.transports = [t for t in TRANSPORTS if t != "uring" or state["during"] == "Y"]
        if state["why_not"]:
            print(f"io_uring not measured: {state['why_not']}")
        try:
            data = run(ctx)
        finally:
            if before is not None and read_switch() != before:
                write_switch(before)
        data["uring_switch"] = state
        data.setdefault("settings", {})["transports"] = ctx.transports
        return data
    return wrapper


def record(data, tool, said):
    """Notes in data["served_over"][tool] what a mount said it was served over (each
    distinct line once: every run mounts afresh)."""
    seen = data.setdefault("served_over", {}).setdefault(tool, [])
    if said not in seen:
        seen.append(said)
