"""Mounting verilay with a chosen engine and FUSE transport (issue 21): one function every
benchmark uses, and the kernel switch FUSE over io_uring needs.

Columns: `verilay-uring` and `verilay-dev` are the FUSE engine (`verilay mount --engine fuse
--transport uring|dev`: verilay's own filesystem over FUSE over io_uring or /dev/fuse);
`verilay-kernel` is the kernel engine (`--engine kernel --transport auto`: the kernel's erofs
on image files the daemon serves and verifies through a private FUSE mount, a kernel
overlayfs for stacks and `--upper`). Each mount says what serves it on stderr (`DIR: served
over io_uring (2 queues x 2 threads), kernel engine (asked for)`), which `mount` returns so a
benchmark can record it, and checks. io_uring needs Linux 6.14+ and
/sys/module/fuse/parameters/enable_uring = Y; `uring_switch` turns it on for a benchmark
(as root) and puts it back as it was afterwards. The kernel engine needs root and a kernel
with file-backed erofs: `kernel_column` tries it once."""

import functools
import os
import shutil
import subprocess
import tempfile

URING_PARAM = "/sys/module/fuse/parameters/enable_uring"
TRANSPORTS = ("uring", "dev")
KERNEL = "verilay-kernel"


class MountFailed(Exception):
    pass


def tool_name(transport):
    """The column a transport's FUSE-engine verilay mount gets in tables and plots."""
    return f"verilay-{transport}"


def transport_of(tool):
    """The transport of a FUSE-engine `tool_name` column, or None for another tool (the
    kernel engine's column included)."""
    prefix = "verilay-"
    t = tool.split("/")[0][len(prefix):] if tool.startswith(prefix) else None
    return t if t in TRANSPORTS else None


def engine_of(tool):
    """"kernel" for the kernel engine's column (`verilay-kernel`, also with a `/variant`),
    "fuse" for a transport's column, None for another tool."""
    if tool.split("/")[0] == KERNEL:
        return "kernel"
    return "fuse" if transport_of(tool) else None


def verilay_tools(transports, kernel=False):
    """The verilay columns: the FUSE engine once per transport, then the kernel engine's
    if `kernel`."""
    return [tool_name(t) for t in transports] + ([KERNEL] if kernel else [])


def mount(verilay, operands, mnt, transport, extra=(), engine="fuse"):
    """`verilay mount OPERANDS... MNT --engine E --transport T EXTRA...`: returns what the
    mount says it is served over (the text after `served over`, the engine included), and
    fails if it is not the transport and engine asked for."""
    argv = [verilay, "mount", *operands, mnt, "--engine", engine, "--transport", transport,
            *extra]
    out = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise MountFailed(f"`{' '.join(argv)}` failed (exit status {out.returncode}): "
                          f"{out.stderr.strip()}")
    said = served_over(out.stderr, mnt)
    want = {"uring": "io_uring", "dev": "/dev/fuse"}.get(transport)
    if (said is None or (want and not said.startswith(want))
            or f", {engine} engine" not in said):
        raise MountFailed(f"`{' '.join(argv)}`: asked for {transport}, {engine} engine, "
                          f"the mount said {said or out.stderr.strip()!r}")
    return said


def mount_tool(verilay, operands, mnt, tool, extra=()):
    """Mounts for one verilay column (`verilay_tools`): the FUSE engine on the column's
    transport, or the kernel engine over the default transport (`auto`)."""
    engine = engine_of(tool)
    if engine is None:
        raise ValueError(f"{tool} is no verilay column")
    return mount(verilay, operands, mnt, transport_of(tool) or "auto", extra, engine)


@functools.lru_cache(maxsize=None)
def kernel_engine_why_not(verilay):
    """None if `verilay mount --engine kernel` mounts here (tried once on a one-file image),
    else why not."""
    if os.geteuid() != 0:
        return "the kernel engine needs root"
    tmp = tempfile.mkdtemp(prefix="verilay-kernel-probe-", dir="/var/tmp")
    try:
        src, img, mnt = (os.path.join(tmp, x) for x in ("src", "probe.img", "mnt"))
        os.makedirs(src)
        os.makedirs(mnt)
        with open(os.path.join(src, "f"), "w") as f:
            f.write("probe\n")
        subprocess.run([verilay, "build", src, "-o", img, "--quiet"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            mount(verilay, [img], mnt, "auto", engine="kernel")
        except MountFailed as e:
            return str(e)
        subprocess.run([verilay, "umount", mnt], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return None
    finally:
        subprocess.run(["umount", "-l", os.path.join(tmp, "mnt")], stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)


def kernel_column(verilay, data):
    """Whether a benchmark gets the kernel engine's column: True where it mounts here, else
    False with the reason printed; noted in data["settings"]["kernel_engine"]."""
    why = kernel_engine_why_not(verilay)
    data.setdefault("settings", {})["kernel_engine"] = {"measured": why is None,
                                                        "why_not": why}
    if why:
        print(f"kernel engine not measured: {why}")
    return why is None


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
