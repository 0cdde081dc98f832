"""containers: podman starting a container from verilay's layer store against an ordinary
pull (issue 22).

The image, two layers written as an OCI layout by the bench (tar, gzip -6, as image
builders compress): a Python installation that runs chrooted (the python dataset) and the
Linux 6.1 source under /usr/src (small-files with --quick), ~1.3 GiB unpacked (~150 MiB).
It is copied to Debian's `docker-registry` on 127.0.0.1 and converted there (`verilay
convert`), untimed.

Each run is cold (caches dropped, a fresh podman storage, and for the store a fresh state
and `--cache` directory, the store started before the clock), podman reaching the registry
through the bench's latency proxy (harness/net.py DelayProxy; this kernel has no netem),
the modes taking turns at going first:

  ordinary     podman pull PROXY/bench/app:1 (the tar.gz layers), then podman run
  layer-store  the same, with `additionallayerstores = ["STORE:ref"]` and `verilay
               layer-store STORE` serving: layers mounted lazily from their verilay images,
               each by the FUSE engine (the store's `verilay mount`s run with
               VERILAY_ENGINE=fuse)
  layer-store-dev
               the same over /dev/fuse (VERILAY_TRANSPORT=dev), where layer-store's
               mounts are io_uring's
  layer-store-kernel
               the same, each layer mounted by the kernel engine (VERILAY_ENGINE=kernel:
               the kernel's erofs on the image file the mount's daemon serves)

timed from `podman pull` to the end of `podman run --rm IMAGE python3 -c "print(1)"` (its
only line), and the bytes the proxy carried from the registry (podman's and the store's).
At 0 and 10 ms RTT (N runs at 10 ms, at most 3 at 0 ms).

Targets (issue 22): at 10 ms RTT the layer store starts the container >= 5x sooner and
moves >= 5x fewer bytes, for an image of >= 500 MiB (a --quick run reports, targets skip);
both for the FUSE engine's layers and, on their own lines, the kernel engine's. Which engine
served each layer is checked from the layer mounts' types (erofs or overlay for the kernel
engine, fuse.verilay for the FUSE engine), recorded as `layer_mounts`.
"""

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time

from harness import datasets, net, report, timing, tools, transport

DESCRIPTION = "podman run through verilay's layer store vs an ordinary pull (0/10 ms RTT)"
USES = ["DOCKER_REGISTRY"]

RTTS_MS = (0, 10)
TARGET_RTT_MS = 10
SLOW_RUNS = 3
SPEEDUP = 5.0
FEWER_BYTES = 5.0
MIN_IMAGE_MIB = 500
MODES = ("ordinary", "layer-store", "layer-store-dev", "layer-store-kernel")
# The engine each store mode's layer mounts take (VERILAY_ENGINE in the store's environment,
# which its `verilay mount`s inherit), and the mount types that engine's mounts have.
STORE_ENGINE = {"layer-store": "fuse", "layer-store-dev": "fuse", "layer-store-kernel": "kernel"}
# The FUSE transport a store mode's mounts take (VERILAY_TRANSPORT): layer-store's is
# io_uring where the kernel offers it, layer-store-dev's /dev/fuse (measured only then).
DEV_MODE = "layer-store-dev"
ENGINE_FSTYPES = {"fuse": {"fuse.verilay"}, "kernel": {"erofs", "overlay"}}
REPO, TAG = "bench/app", "1"
PROGRAM = ["python3", "-c", "print(1)"]


def sh(argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, **kw)


def write_layout(scratch, layer_dirs):
    """An OCI layout of `layer_dirs` (bottom first), each a tar.gz made with GNU tar and
    gzip -6: (layout dir, unpacked bytes, compressed bytes)."""
    import hashlib
    lay = os.path.join(scratch, "layout")
    blobs = os.path.join(lay, "blobs", "sha256")
    os.makedirs(blobs)
    with open(os.path.join(lay, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')

    def put(path_or_bytes):
        if isinstance(path_or_bytes, bytes):
            h = hashlib.sha256(path_or_bytes).hexdigest()
            with open(os.path.join(blobs, h), "wb") as f:
                f.write(path_or_bytes)
            return f"sha256:{h}", len(path_or_bytes)
        h = hashlib.sha256()
        with open(path_or_bytes, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        os.rename(path_or_bytes, os.path.join(blobs, h.hexdigest()))
        return f"sha256:{h.hexdigest()}", os.path.getsize(os.path.join(blobs, h.hexdigest()))

    diff_ids, layers, unpacked = [], [], 0
    for i, d in enumerate(layer_dirs):
        tar = os.path.join(scratch, f"layer{i}.tar")
        sh(["tar", "--sort=name", "--mtime=@1700000000", "--owner=0", "--group=0",
            "--numeric-owner", "-C", d, "-cf", tar, "."])
        unpacked += os.path.getsize(tar)
        h = hashlib.sha256()
        with open(tar, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        diff_ids.append(f"sha256:{h.hexdigest()}")
        sh(["gzip", "-6", "-n", "-f", tar])
        layers.append(put(tar + ".gz"))
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Cmd": ["/usr/bin/python3"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    cd, cn = put(config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd,
                   "size": cn},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d,
                    "size": n} for d, n in layers]}).encode()
    md, mn = put(manifest)
    with open(os.path.join(lay, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
            "size": mn, "annotations": {"org.opencontainers.image.ref.name": TAG}}]}, f)
    return lay, unpacked, sum(n for _, n in layers)


def make_image(ctx, scratch, data):
    """The bench image's layout in `scratch` (python, then the Linux source under usr/src;
    small-files with --quick), recorded in data["image"]; its directory."""
    py = datasets.python_install()
    src = datasets.small_files() if ctx.quick else datasets.linux()
    linux_layer = os.path.join(scratch, "src-layer")
    os.makedirs(os.path.join(linux_layer, "usr/src"))
    sh(["cp", "-al", src.path, os.path.join(linux_layer, "usr/src", src.name)])
    start = time.perf_counter()
    lay, unpacked, packed = write_layout(scratch, [py.path, linux_layer])
    data["image"] = {"layers": [py.name, f"{src.name} at usr/src"], "tar_bytes": unpacked,
                     "gz_bytes": packed, "layout_s": time.perf_counter() - start}
    print(f"image: {py.name} + {src.name}: {unpacked / 2**20:,.0f} MiB of tar, "
          f"{packed / 2**20:,.0f} MiB gzip", flush=True)
    return lay


class Podman:
    """podman with its own storage and configuration under `dir` (runc, the rlimits this
    machine allows, plain HTTP to the proxy; with `store`, the additional layer store)."""

    def __init__(self, dir, proxy_port, store=None):
        self.dir = dir
        os.makedirs(dir)
        als = (f'[storage.options]\nadditionallayerstores = ["{store}:ref"]\n'
               if store else "")
        # A short runroot: conmon's sockets under a long path (the scratch directory's)
        # fail, and `podman run` then waits out conmon's 20 s timeout after the program.
        self.runroot = tempfile.mkdtemp(prefix="vlpod", dir="/tmp")
        with open(os.path.join(dir, "storage.conf"), "w") as f:
            f.write(f'[storage]\ndriver = "overlay"\ngraphroot = "{dir}/graph"\n'
                    f'runroot = "{self.runroot}"\n{als}')
        with open(os.path.join(dir, "containers.conf"), "w") as f:
            f.write('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
                    'netns = "none"\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
                    'events_logger = "file"\n')
        with open(os.path.join(dir, "registries.conf"), "w") as f:
            f.write(f'[[registry]]\nlocation = "127.0.0.1:{proxy_port}"\ninsecure = true\n')
        self.env = dict(os.environ,
                        CONTAINERS_STORAGE_CONF=os.path.join(dir, "storage.conf"),
                        CONTAINERS_CONF=os.path.join(dir, "containers.conf"),
                        CONTAINERS_REGISTRIES_CONF=os.path.join(dir, "registries.conf"),
                        TMPDIR=dir)

    def __call__(self, *args):
        return sh(["podman", *args], env=self.env)

    def close(self):
        subprocess.run(["podman", "rmi", "-a", "-f"], env=self.env, capture_output=True)
        subprocess.run(["umount", "-l", os.path.join(self.dir, "graph", "overlay")],
                       capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.runroot, ignore_errors=True)


class Store:
    """`verilay layer-store` in the foreground until closed (SIGTERM: it unmounts itself
    and detaches the layers it mounted)."""

    def __init__(self, verilay, dir, engine, fuse_transport):
        self.dir = os.path.join(dir, "store")
        self.state = os.path.join(dir, "state")
        os.makedirs(self.dir)
        self.log = open(os.path.join(dir, "store.log"), "wb")
        self.proc = subprocess.Popen(
            [verilay, "layer-store", self.dir, "--state", self.state,
             "--cache", os.path.join(dir, "cache"), "--insecure"],
            stdout=subprocess.DEVNULL, stderr=self.log,
            env=dict(os.environ, VERILAY_ENGINE=engine, VERILAY_TRANSPORT=fuse_transport))
        deadline = time.time() + 20
        while not os.path.ismount(self.dir):
            if self.proc.poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError(f"verilay layer-store did not mount {self.dir}")
            time.sleep(0.05)

    def layer_mounts(self):
        """{mount type: count} of the layers mounted under the state directory."""
        types = {}
        prefix = os.path.join(self.state, "layers") + "/"
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                point = fields[4].replace("\\040", " ")
                fstype = fields[fields.index("-") + 1]
                if point.startswith(prefix):
                    types[fstype] = types.get(fstype, 0) + 1
        return types

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def one_run(mode, verilay, proxy, scratch, serial, transports):
    base = os.path.join(scratch, f"run-{serial}-{mode}")
    os.makedirs(base)
    with contextlib.ExitStack() as stack:
        store = None
        if mode in STORE_ENGINE:
            store = Store(verilay, base, STORE_ENGINE[mode],
                          "dev" if mode == DEV_MODE else transports[0])
            stack.callback(store.close)
        pod = Podman(os.path.join(base, "podman"), proxy.port, store and store.dir)
        stack.callback(pod.close)
        image = f"127.0.0.1:{proxy.port}/{REPO}:{TAG}"
        if timing.drop_caches() is not None:
            raise RuntimeError("cannot drop caches")
        proxy.reset()
        start = time.perf_counter()
        pod("pull", "-q", image)
        pulled = time.perf_counter() - start
        out = pod("run", "--rm", "--network=none", image, *PROGRAM).stdout
        wall = time.perf_counter() - start
        if out.strip() != "1":
            raise RuntimeError(f"{mode}: the container printed {out!r}")
        sample = {"pull_s": pulled, "start_s": wall, "bytes": proxy.counts["bytes_down"],
                  "requests": proxy.counts["requests"],
                  "connections": proxy.counts["connections"]}
        if store:
            # Every layer mount must be the engine asked for, else the mode measures the
            # other one.
            sample["layer_mounts"] = types = store.layer_mounts()
            want = ENGINE_FSTYPES[STORE_ENGINE[mode]]
            if not types or set(types) - want:
                raise RuntimeError(f"{mode}: the store's layer mounts are {types or 'none'}, "
                                   f"expected {' or '.join(sorted(want))} "
                                   f"({STORE_ENGINE[mode]} engine)")
    shutil.rmtree(base, ignore_errors=True)
    return sample


@transport.uring_switch
def run(ctx):
    scratch = datasets.scratch_dir("containers")
    verilay, why = tools.verilay(scratch)
    registry_bin = tools.find("DOCKER_REGISTRY")
    data = report.bench_data("containers", ctx, {"rtts_ms": list(RTTS_MS), "program": PROGRAM},
                             {"rtt": {}, "targets": []})
    reason = why
    if not reason and os.geteuid() != 0:
        reason = "needs root (podman's overlay storage, the layer store, dropping caches)"
    for tool, pkg in (("podman", "podman"), ("runc", "runc")):
        if not reason and not shutil.which(tool):
            reason = f"needs {tool} (apt-get install {pkg})"
    if not reason and not registry_bin:
        reason = "needs docker-registry (apt-get install docker-registry)"
    if reason:
        print(f"containers bench skipped: {reason}")
        data["targets"].append(report.target("containers", None, reason))
        shutil.rmtree(scratch, ignore_errors=True)
        return data

    kernel = transport.kernel_column(verilay, data)
    modes = [m for m in MODES if (STORE_ENGINE.get(m) != "kernel" or kernel)
             and (m != DEV_MODE or ctx.transports[0] != "dev")]
    lay = make_image(ctx, scratch, data)

    with contextlib.ExitStack() as stack:
        reg_dir = os.path.join(scratch, "registry")
        os.makedirs(reg_dir)
        registry = stack.enter_context(net.registry(registry_bin, reg_dir))
        start = time.perf_counter()
        sh([verilay, "convert", f"oci:{lay}:{TAG}",
            f"docker://127.0.0.1:{registry.port}/{REPO}:{TAG}", "--insecure", "--quiet"])
        data["image"]["convert_s"] = time.perf_counter() - start
        print(f"converted in {data['image']['convert_s']:.1f} s", flush=True)
        proxy = stack.enter_context(net.DelayProxy(registry.port))
        rounds(ctx, data, proxy, modes,
               lambda mode, serial: one_run(mode, verilay, proxy, scratch, serial,
                                            ctx.transports))
    shutil.rmtree(scratch, ignore_errors=True)
    print_results(data, MODES, "`podman pull`", "`podman run`")
    data["targets"] = check_targets(data, ctx.quick)
    return data


def rounds(ctx, data, proxy, modes, one_run):
    """At each RTT (N runs at TARGET_RTT_MS, at most SLOW_RUNS at the others), rounds of
    `one_run(mode, serial)` of every mode, the modes taking turns at going first; the
    samples go to data["rtt"][RTT][mode]. Shared with the containerd bench."""
    serial = 0
    for rtt in RTTS_MS:
        proxy.rtt = rtt / 1000
        runs = ctx.runs if rtt == TARGET_RTT_MS else min(ctx.runs, SLOW_RUNS)
        res = {m: [] for m in modes}
        for i in range(runs):
            order = modes[i % len(modes):] + modes[:i % len(modes)]
            for mode in order:
                serial += 1
                print(f"  {rtt} ms {mode}: run {i + 1}/{runs}", flush=True)
                res[mode].append(one_run(mode, serial))
        data["rtt"][str(rtt)] = res


def median(samples, key):
    return statistics.median(s[key] for s in samples)


def print_results(data, modes, pulled, ran):
    """The table of medians of every mode at every RTT, timed from `pulled` to `ran`'s
    end."""
    print(f"\ntimes in s from {pulled} (medians of n runs); start = {ran} of "
          f"{' '.join(PROGRAM)} done; MiB carried from the registry")
    rows = []
    for rtt, res in data["rtt"].items():
        for mode in modes:
            s = res.get(mode)
            if not s:
                continue
            rows.append([f"{rtt} ms", mode, str(len(s)), f"{median(s, 'pull_s'):.2f}",
                         f"{median(s, 'start_s'):.2f}", f"{min(x['start_s'] for x in s):.2f}",
                         f"{max(x['start_s'] for x in s):.2f}",
                         f"{median(s, 'bytes') / 2**20:,.1f}", f"{median(s, 'requests'):.0f}"])
    report.print_table(["rtt", "mode", "n", "pull", "start", "min", "max", "MiB",
                        "requests"], rows, left=2)
    print()


def check_targets(data, quick):
    t = []
    res = data["rtt"][str(TARGET_RTT_MS)]
    size_mib = data["image"]["tar_bytes"] / 2**20
    big = size_mib >= MIN_IMAGE_MIB
    why = "" if big else f" (image {size_mib:,.0f} MiB < {MIN_IMAGE_MIB}: no verdict)"
    o = res["ordinary"]
    for mode, engine in STORE_ENGINE.items():
        s = res.get(mode)
        if not s:
            continue
        # The FUSE engine's lines keep their names; the kernel engine's and /dev/fuse's
        # say so.
        name = "layer store" + (" (kernel engine)" if engine == "kernel" else
                                " (/dev/fuse)" if mode == DEV_MODE else "")
        faster = median(o, "start_s") / median(s, "start_s")
        fewer = median(o, "bytes") / max(1, median(s, "bytes"))
        t.append(report.target(
            f"start at {TARGET_RTT_MS} ms RTT, {name} vs ordinary pull",
            (faster >= SPEEDUP) if big else None,
            f"{faster:.1f}x sooner ({median(s, 'start_s'):.2f} s vs "
            f"{median(o, 'start_s'):.2f} s; target >= {SPEEDUP:g}x){why}"))
        t.append(report.target(
            f"bytes at {TARGET_RTT_MS} ms RTT, {name} vs ordinary pull",
            (fewer >= FEWER_BYTES) if big else None,
            f"{fewer:.1f}x fewer ({median(s, 'bytes') / 2**20:,.1f} MiB vs "
            f"{median(o, 'bytes') / 2**20:,.1f} MiB; target >= {FEWER_BYTES:g}x){why}"))
    for rtt, r in data["rtt"].items():
        k, f = r.get("layer-store-kernel"), r.get("layer-store")
        if k and f:
            ratios = [a["start_s"] / b["start_s"] for a, b in zip(k, f)]
            print(f"INFO  start at {rtt} ms RTT: layer store, kernel engine "
                  f"{statistics.median(ratios):.2f}x the FUSE engine's time (median of "
                  f"{len(ratios)} runs' ratios, {min(ratios):.2f}..{max(ratios):.2f}); bytes "
                  f"{median(k, 'bytes') / max(1, median(f, 'bytes')):.2f}x")
    return t


def plot(data, png):
    plot_start_and_bytes(data, png, MODES, "podman pull", "container start", log=False)


def plot_start_and_bytes(data, png, modes, pulled, title, log):
    """Start time and bytes of each mode against RTT (log scales with `log`)."""
    if not data.get("rtt"):
        return
    plt = report.pyplot()

    rtts = [int(r) for r in data["rtt"]]
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = ("tab:blue", "tab:red", "tab:pink", "tab:purple", "tab:green")
    for mode, color in zip(modes, colors):
        if not all(data["rtt"][str(r)].get(mode) for r in rtts):
            continue
        ys = [median(data["rtt"][str(r)][mode], "start_s") for r in rtts]
        ax_t.plot(rtts, ys, "o-", color=color, label=mode)
        bs = [median(data["rtt"][str(r)][mode], "bytes") / 2**20 for r in rtts]
        ax_b.plot(rtts, bs, "o-", color=color, label=mode)
    ax_t.set(xlabel="RTT, ms", ylabel=f"s from {pulled} to the program's output",
             title=title)
    ax_b.set(xlabel="RTT, ms", ylabel="MiB from the registry", title="bytes moved")
    for ax in (ax_t, ax_b):
        ax.legend()
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
