"""containerd: a container started through `verilay snapshotter` against containerd's own
overlayfs snapshotter (a full pull) and stargz-snapshotter (issue 39).

The image is the containers bench's: two layers written as an OCI layout (tar, gzip -6),
a Python installation that runs chrooted and the Linux 6.1 source under /usr/src
(small-files with --quick), ~1.3 GiB unpacked. It is copied to Debian's `docker-registry`
on 127.0.0.1 and converted there (`verilay convert`), and, when stargz-snapshotter's
`containerd-stargz-grpc` is there ($STARGZ_GRPC or PATH; Debian ships only `ctr-remote`,
so it is built from its Go module outside the repository), converted to eStargz as well
(`ctr-remote image convert --estargz`) and pushed beside it; untimed.

Each run is cold: caches dropped, a fresh containerd (own root, state and sockets,
started before the clock) and a fresh snapshotter (root, `--cache`), containerd and the
snapshotters reaching the registry through the bench's latency proxy (harness/net.py
DelayProxy), the modes taking turns at going first:

  overlayfs       ctr image pull --snapshotter overlayfs (every layer fetched and unpacked)
  verilay         ctr-remote image rpull --snapshotter verilay (the layers' labels passed;
                  each layer mounted lazily from its verilay image by the FUSE engine,
                  `verilay snapshotter --engine fuse`)
  verilay-dev     the same over /dev/fuse (`--transport dev`), where verilay's layer
                  mounts are io_uring's
  verilay-kernel  the same, each layer mounted by the kernel engine (`--engine kernel`)
  stargz          ctr-remote image rpull --snapshotter stargz of the eStargz image

then `ctr run --rm --snapshotter SN IMAGE ID python3 -c "print(1)"`, timed from the pull
to the end of the run (its only line), and the bytes the proxy carried from the
registry. At 0 and 10 ms RTT (N runs at 10 ms, at most 3 at 0 ms).

Targets (issue 39): at 10 ms RTT, verilay's snapshotter starts the container >= 5x sooner
and moves >= 5x fewer bytes than the full pull, for an image of >= 500 MiB, and is no
slower than stargz-snapshotter (the median of the per-run ratios, the two run in the same
round, within 1.05x); each for the FUSE engine's layers and, on their own lines, the
kernel engine's. Targets a missing peer decides are NOT MEASURED.
"""

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time

from harness import datasets, net, report, timing, tools, transport
# The containers bench's runs, image, table and plot; its RTTs, runs and targets too.
from .containers import (FEWER_BYTES, MIN_IMAGE_MIB, PROGRAM, RTTS_MS, SPEEDUP,
                         TARGET_RTT_MS, make_image, median, plot_start_and_bytes,
                         print_results, rounds, sh)

DESCRIPTION = ("containerd: ctr run through verilay's snapshotter vs a full pull and "
               "stargz-snapshotter (0/10 ms RTT)")
USES = ["DOCKER_REGISTRY", "STARGZ_GRPC"]

NO_SLOWER = 1.05
MODES = ("overlayfs", "verilay", "verilay-dev", "verilay-kernel", "stargz")
VERILAY_ENGINE = {"verilay": "fuse", "verilay-dev": "fuse", "verilay-kernel": "kernel"}
# verilay's layer mounts over io_uring where the kernel offers it; verilay-dev's over
# /dev/fuse (measured only then).
DEV_MODE = "verilay-dev"
ENGINE_FSTYPES = {"fuse": {"fuse.verilay"}, "kernel": {"erofs"}}
REPO, TAG, ESGZ_TAG = "bench/app", "1", "1-esgz"
# How the layers are converted: $VERILAY_BENCH_CONVERT (e.g. "-z zstd"), else plain.
CONVERT = os.environ.get("VERILAY_BENCH_CONVERT", "").split()


def wait_for(what, ready, proc, timeout=30):
    deadline = time.time() + timeout
    while not ready():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Containerd:
    """containerd with its own root, state and sockets under `dir` (socket paths under a
    short directory in /tmp), CRI off, the snapshotters `plugins` ({name: socket}) as
    proxy plugins; closed with its shims and every mount under its directories."""

    def __init__(self, dir, plugins):
        self.dir = dir
        self.sock = os.path.join(dir, "c.sock")
        proxies = "".join(f'[proxy_plugins.{n}]\n  type = "snapshot"\n  address = "{s}"\n'
                          for n, s in plugins.items())
        config = os.path.join(dir, "config.toml")
        with open(config, "w") as f:
            f.write(f'version = 2\nroot = "{dir}/root"\nstate = "{dir}/state"\n'
                    f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
                    f'[grpc]\n  address = "{self.sock}"\n[ttrpc]\n  address = "{self.sock}.ttrpc"\n'
                    f'{proxies}')
        self.log = open(os.path.join(dir, "containerd.log"), "wb")
        self.proc = subprocess.Popen(["containerd", "--config", config],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        wait_for("containerd", lambda: subprocess.run(
            ["ctr", "--address", self.sock, "version"], capture_output=True).returncode == 0,
            self.proc)

    def ctr(self, *args, tool="ctr"):
        return sh(["timeout", "600", tool, "--address", self.sock, *args])

    def close(self):
        stop(self.proc)
        self.log.close()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read()
            except OSError:
                continue
            if b"containerd-shim" in argv.split(b"\0")[0] and self.sock.encode() in argv:
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
        umount_under(self.dir)


def umount_under(dir):
    with open("/proc/self/mountinfo") as f:
        points = [ln.split()[4].replace("\\040", " ") for ln in f]
    for p in sorted((p for p in points if p.startswith(dir + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", p], capture_output=True)


class Verilay:
    """`verilay snapshotter` on a fresh root and cache, its layers mounted by `engine`."""

    def __init__(self, verilay, dir, engine, fuse_transport):
        self.root = os.path.join(dir, "verilay")
        self.sock = os.path.join(dir, "verilay.sock")
        self.log = open(os.path.join(dir, "verilay.log"), "wb")
        self.proc = subprocess.Popen(
            [verilay, "snapshotter", "--root", self.root, "--address", self.sock,
             "--cache", os.path.join(dir, "cache"), "--insecure", "--engine", engine,
             "--transport", fuse_transport],
            stdout=subprocess.DEVNULL, stderr=self.log)
        wait_for("verilay snapshotter", lambda: os.path.exists(self.sock), self.proc)

    def layer_mounts(self):
        """{mount type: count} of its layer mounts."""
        types = {}
        prefix = os.path.realpath(os.path.join(self.root, "remote", "layers")) + "/"
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if fields[4].replace("\\040", " ").startswith(prefix):
                    fstype = fields[fields.index("-") + 1]
                    types[fstype] = types.get(fstype, 0) + 1
        return types

    def close(self):
        stop(self.proc)
        self.log.close()
        # Its layers outlive it, for running containers: none runs now.
        umount_under(os.path.realpath(self.root))


class Stargz:
    """stargz-snapshotter's `containerd-stargz-grpc` on a fresh root, reaching the
    registry (through the proxy) over plain HTTP."""

    def __init__(self, binary, dir, proxy_port):
        self.root = os.path.join(dir, "stargz")
        self.sock = os.path.join(dir, "stargz.sock")
        config = os.path.join(dir, "stargz.toml")
        host = f"127.0.0.1:{proxy_port}"
        with open(config, "w") as f:
            f.write(f'[[resolver.host."{host}".mirrors]]\nhost = "{host}"\ninsecure = true\n')
        self.log = open(os.path.join(dir, "stargz.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, "--address", self.sock, "--root", self.root, "--config", config,
             "--log-level", "info"], stdout=subprocess.DEVNULL, stderr=self.log)
        wait_for("containerd-stargz-grpc", lambda: os.path.exists(self.sock), self.proc)

    def close(self):
        stop(self.proc)
        self.log.close()
        umount_under(self.root)


def one_run(mode, verilay, stargz, proxy, serial, transports):
    # Socket paths must stay under 108 bytes: a short directory in /tmp.
    base = tempfile.mkdtemp(prefix=f"vlctd{serial}-", dir="/tmp")
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        snap = None
        plugins = {}
        if mode in VERILAY_ENGINE:
            snap = Verilay(verilay, base, VERILAY_ENGINE[mode],
                           "dev" if mode == DEV_MODE else transports[0])
            plugins["verilay"] = snap.sock
        elif mode == "stargz":
            snap = Stargz(stargz, base, proxy.port)
            plugins["stargz"] = snap.sock
        if snap:
            stack.callback(snap.close)
        c = Containerd(base, plugins)
        stack.callback(c.close)
        sn = {"overlayfs": "overlayfs", "stargz": "stargz"}.get(mode, "verilay")
        tag = ESGZ_TAG if mode == "stargz" else TAG
        image = f"127.0.0.1:{proxy.port}/{REPO}:{tag}"
        if timing.drop_caches() is not None:
            raise RuntimeError("cannot drop caches")
        proxy.reset()
        start = time.perf_counter()
        if mode == "overlayfs":
            c.ctr("image", "pull", "--plain-http", "--snapshotter", sn, image)
        else:
            c.ctr("image", "rpull", "--plain-http", "--snapshotter", sn, image,
                  tool="ctr-remote")
        pulled = time.perf_counter() - start
        out = c.ctr("run", "--rm", "--snapshotter", sn, image, f"b{serial}", *PROGRAM).stdout
        wall = time.perf_counter() - start
        if out.strip() != "1":
            raise RuntimeError(f"{mode}: the container printed {out!r}")
        sample = {"pull_s": pulled, "start_s": wall, "bytes": proxy.counts["bytes_down"],
                  "requests": proxy.counts["requests"],
                  "connections": proxy.counts["connections"]}
        if mode in VERILAY_ENGINE:
            # Every layer must be a remote layer of the engine asked for, else the mode
            # measures something else (an unpacked layer, or the other engine).
            sample["layer_mounts"] = types = snap.layer_mounts()
            want = ENGINE_FSTYPES[VERILAY_ENGINE[mode]]
            if sum(types.values()) != 2 or set(types) - want:
                raise RuntimeError(f"{mode}: the layer mounts are {types or 'none'}, "
                                   f"expected 2 of {' or '.join(sorted(want))}")
    return sample


def prepare_esgz(verilay_bin, registry_port, scratch):
    """The image converted to eStargz with Debian's ctr-remote, pushed as ESGZ_TAG."""
    base = tempfile.mkdtemp(prefix="vlesgz-", dir="/tmp")
    c = Containerd(base, {})
    try:
        src = f"127.0.0.1:{registry_port}/{REPO}:{TAG}"
        dst = f"127.0.0.1:{registry_port}/{REPO}:{ESGZ_TAG}"
        c.ctr("image", "pull", "--plain-http", src)
        c.ctr("image", "convert", "--estargz", "--oci", src, dst, tool="ctr-remote")
        c.ctr("image", "push", "--plain-http", dst)
    finally:
        c.close()
        shutil.rmtree(base, ignore_errors=True)


@transport.uring_switch
def run(ctx):
    scratch = datasets.scratch_dir("containerd")
    verilay, why = tools.verilay(scratch)
    registry_bin = tools.find("DOCKER_REGISTRY")
    stargz = tools.find("STARGZ_GRPC")
    data = report.bench_data("containerd", ctx, {"rtts_ms": list(RTTS_MS), "program": PROGRAM,
                                                 "convert": CONVERT,
                                                 "transports": ctx.transports},
                             {"rtt": {}, "targets": [], "peers": {}})
    reason = why
    if not reason and os.geteuid() != 0:
        reason = "needs root (containerd, dropping caches)"
    for tool, pkg in (("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"),
                      ("ctr-remote", "stargz-snapshotter")):
        if not reason and not shutil.which(tool):
            reason = f"needs {tool} (apt-get install {pkg})"
    if not reason and not registry_bin:
        reason = "needs docker-registry (apt-get install docker-registry)"
    if reason:
        data["targets"].append(report.not_measured("containerd", reason))
        shutil.rmtree(scratch, ignore_errors=True)
        return data
    stargz_why = tools.missing("STARGZ_GRPC")
    data["peers"] = {"containerd": tools.version("containerd"),
                     "stargz": tools.version(stargz, "--version") if stargz else stargz_why}
    if stargz_why:
        print(f"stargz: not measured, because {stargz_why}")
    kernel = transport.kernel_column(verilay, data)
    modes = [m for m in MODES
             if (VERILAY_ENGINE.get(m) != "kernel" or kernel) and (m != "stargz" or stargz)
             and (m != DEV_MODE or ctx.transports[0] != "dev")]
    lay = make_image(ctx, scratch, data)

    with contextlib.ExitStack() as stack:
        reg_dir = os.path.join(scratch, "registry")
        os.makedirs(reg_dir)
        registry = stack.enter_context(net.registry(registry_bin, reg_dir))
        start = time.perf_counter()
        sh([verilay, "convert", f"oci:{lay}:{TAG}",
            f"docker://127.0.0.1:{registry.port}/{REPO}:{TAG}", "--insecure", "--quiet",
            *CONVERT])
        data["image"]["convert_s"] = time.perf_counter() - start
        if stargz:
            start = time.perf_counter()
            prepare_esgz(verilay, registry.port, scratch)
            data["image"]["estargz_s"] = time.perf_counter() - start
        print(f"converted in {data['image']['convert_s']:.1f} s", flush=True)
        proxy = stack.enter_context(net.DelayProxy(registry.port))
        rounds(ctx, data, proxy, modes,
               lambda mode, serial: one_run(mode, verilay, stargz, proxy, serial,
                                            ctx.transports))
    shutil.rmtree(scratch, ignore_errors=True)
    print_results(data, MODES, "the pull", "`ctr run`")
    data["targets"] = check_targets(data, stargz_why)
    return data


def check_targets(data, stargz_why):
    t = []
    res = data["rtt"][str(TARGET_RTT_MS)]
    size_mib = data["image"]["tar_bytes"] / 2**20
    big = size_mib >= MIN_IMAGE_MIB
    why = "" if big else f" (image {size_mib:,.0f} MiB < {MIN_IMAGE_MIB}: no verdict)"
    o = res["overlayfs"]
    for mode, engine in VERILAY_ENGINE.items():
        s = res.get(mode)
        name = "verilay snapshotter" + (" (kernel engine)" if engine == "kernel" else
                                        " (/dev/fuse)" if mode == DEV_MODE else "")
        if mode == DEV_MODE and not s and data["settings"].get("transports") == ["dev"]:
            continue  # "verilay" is /dev/fuse's already
        if not s:
            t.append(report.not_measured(f"start at {TARGET_RTT_MS} ms RTT, {name}",
                                         "the kernel engine cannot serve here"))
            continue
        faster = median(o, "start_s") / median(s, "start_s")
        fewer = median(o, "bytes") / max(1, median(s, "bytes"))
        t.append(report.target(
            f"start at {TARGET_RTT_MS} ms RTT, {name} vs full pull",
            (faster >= SPEEDUP) if big else None,
            f"{faster:.1f}x sooner ({median(s, 'start_s'):.2f} s vs "
            f"{median(o, 'start_s'):.2f} s; target >= {SPEEDUP:g}x){why}"))
        t.append(report.target(
            f"bytes at {TARGET_RTT_MS} ms RTT, {name} vs full pull",
            (fewer >= FEWER_BYTES) if big else None,
            f"{fewer:.1f}x fewer ({median(s, 'bytes') / 2**20:,.1f} MiB vs "
            f"{median(o, 'bytes') / 2**20:,.1f} MiB; target >= {FEWER_BYTES:g}x){why}"))
        z = res.get("stargz")
        label = f"start at {TARGET_RTT_MS} ms RTT, {name} vs stargz-snapshotter"
        if not z:
            t.append(report.not_measured(label, stargz_why or "no stargz runs"))
            continue
        ratios = [a["start_s"] / b["start_s"] for a, b in zip(s, z)]
        r = statistics.median(ratios)
        t.append(report.target(
            label, r <= NO_SLOWER,
            f"{r:.2f}x stargz's time (median of {len(ratios)} runs' ratios, "
            f"{min(ratios):.2f}..{max(ratios):.2f}; target <= {NO_SLOWER:g}x); bytes "
            f"{median(s, 'bytes') / max(1, median(z, 'bytes')):.2f}x stargz's"))
    return t


def plot(data, png):
    # A full pull takes 10-20x the lazy modes' time and bytes: log scales keep both legible.
    plot_start_and_bytes(data, png, MODES, "the pull", "container start (containerd)", log=True)
