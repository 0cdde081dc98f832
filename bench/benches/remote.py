"""remote: mounting an image straight from a registry, lazily, against pulling it first
(issue 20).

The image: a Python installation that runs chrooted (the python dataset: the host's
python3, its standard library and libraries, /etc/os-release) with the Linux 6.1 source
under /usr/src (small-files with --quick), ~1.3 GiB (~150 MiB). It is pushed to Debian's
`docker-registry` on 127.0.0.1 (`verilay push`) and served as a file by Python's
range-capable http.server as well.

Latency: this kernel may have no netem (the bench checks, `tc qdisc add dev lo root netem`
in a new network namespace, and prints what it found). The clients reach both servers
through the bench's own TCP proxy on 127.0.0.1 (harness/net.py: DelayProxy), which holds
every chunk of bytes RTT/2 in each direction and a connection's first bytes one RTT
more (the handshake), with at most the host's largest TCP window in flight; it is itself
a Python program, whose bytes going down move by splice(2) between sockets and pipes (its
throughput against a direct GET is printed).

At 0, 10 and 50 ms RTT, each run cold (caches dropped, a fresh mount, a fresh empty
`--cache` directory when `verilay mount` has that option), the modes taking turns at
going first:

  lazy-oci    `verilay mount oci://PROXY/bench/tree@sha256:MANIFEST DIR --insecure
              --engine fuse --transport T`: over io_uring where the kernel offers it
              (harness.transport), else over /dev/fuse
  lazy-oci-dev
              the same over /dev/fuse (`--transport dev`), where lazy-oci is io_uring's
  lazy-oci-kernel
              the same with `--engine kernel` (the kernel's erofs on the image file the
              daemon serves, fetching lazily, through its private FUSE mount)
  lazy-http   `verilay mount http://PROXY/tree.img DIR --digest D --engine fuse`
  pull        `verilay pull oci://PROXY/... -o IMAGE --insecure`, then `verilay mount IMAGE
              DIR --engine fuse`
  skopeo      `skopeo copy docker://PROXY/bench/tree:1 dir:DIR` (the same blob, whole)

timing, from the start: the mount being usable; `etc/os-release` read in full (first
file); `chroot DIR /usr/bin/python3 -c "import json"` done (program, after the first
file); bytes fetched (`verilay stats`; the proxy's count for pull and skopeo) and
requests. Then a sparse reader on a fresh lazy-oci mount: 200 files of the tree picked at
random (seed 0; the same every run), each read whole, checked against the source's bytes:
bytes fetched / bytes read, counting the mount's own fetches (and without them; the
Merkle tree fetched whole at open is printed apart), against the floor: the same reads
with VERILAY_FETCH_EXACT=1, one request per 4 KiB block they touch. Runs: N
at 10 ms, at most 3 (SLOW_RUNS) at 0 and 50 ms; the sparse reader at most 3 times at 0
ms and once at 10 and 50 ms (it fetches the same bytes every run; at 50 ms one run takes
~45 s); read-all at most 3 times.

Read-all: mount and `cat` of every regular file (`find | xargs cat`, cold, a fresh
`--cache`), from the registry at 0 ms (reached directly: no proxy), 10 and 50 ms RTT
(through the proxy), against the same image file mounted local (`verilay mount IMAGE`),
the modes taking turns at going first; with the kernel engine too where it serves (its
image file fetched as the FUSE engine's reads are), at 0 ms against the kernel engine's
local mount. Requests from `verilay stats`; TCP connections from the proxy's count, or at
0 ms from the kernel's count of connections opened (/proc/net/snmp Tcp ActiveOpens).

Prefetch: `verilay mount ... --prefetch` with a fresh `--cache`, timed from the start of
`verilay mount` until `verilay stats` says every byte of the image is verified and cached,
against `curl` of the same blob to /dev/null over the same path (direct at 0 ms, the proxy
at 10 and 50 ms), each after dropping the caches (the registry reads the blob from disk for
both), taking turns, at most 5 rounds; the ratio is the median of the rounds' ratios. Also
(INFO) against curl of the blob to a file beside the caches, synced: the bytes written to
the disk a prefetch writes them to (it with O_DIRECT as it goes), the disk the registry
reads.

Every mount but the kernel engine's is the FUSE engine's (`--engine fuse`).

Parts (`--parts`): sweep (the RTT sweep and the sparse readers), read-all, prefetch.

Targets: at 10 ms RTT, lazy-oci's first file in under 0.5 s and at least 10x sooner than
pull's first file and than skopeo's copy; sparse bytes fetched / bytes read <= 1.5;
read-all remote at least 0.8x local's speed at 0 ms and 0.6x at 10 ms; prefetch at least
0.5x curl's throughput at every RTT; lazy-oci-kernel's first file and program no slower
than lazy-oci's (the FUSE engine's): the median of the per-run ratios (the two run in the
same round) within 1.05x, this host's noise.
"""

import contextlib
import json
import os
import random
import shutil
import stat
import statistics
import subprocess
import time

from harness import datasets, net, report, timing, tools, transport

DESCRIPTION = "lazy mounts from a registry (0/10/50 ms RTT) vs verilay pull and skopeo copy"
USES = ["DOCKER_REGISTRY", "SKOPEO"]

RTTS_MS = (0, 10, 50)
TARGET_RTT_MS = 10
FIRST_FILE = "etc/os-release"
PROGRAM = ["/usr/bin/python3", "-c", "import json"]
SPARSE_FILES = 200
# The other sparse pattern: this many 64 KiB reads at random 4 KiB-aligned offsets of the
# tree's files of at least 1 MiB (a database's or a loader's access, not a file walk).
SPARSE_RANGES = 200
RANGE_BYTES = 64 << 10
FIRST_LIMIT_S = 0.5
SPEEDUP = 10.0
AMPLIFICATION = 1.5
# Read-all from the registry against the local image: its speed at least this fraction of
# local's, at each RTT named (none at 50 ms: measured only).
READ_ALL_RATIO = {0: 0.8, 10: 0.6}
PREFETCH_RATIO = 0.5
PARTS = ("sweep", "read-all", "prefetch")
# Rounds of prefetch and curl at each RTT: their ratio swings with the state of the
# registry's disk (the host's cache of it), which the rounds pair.
PREFETCH_RUNS = 5
# A prefetch not done by then fails the run (the image is ~1.3 GiB).
PREFETCH_TIMEOUT_S = 600
MODES = ("lazy-oci", "lazy-oci-dev", "lazy-oci-kernel", "lazy-http", "pull", "skopeo")
KERNEL_MODE = "lazy-oci-kernel"
DEV_MODE = "lazy-oci-dev"
# The kernel engine "no slower" than the FUSE engine, within this host's noise.
KERNEL_VS_FUSE = 1.05
REPO, TAG = "bench/tree", "1"
# The full run's budget (~10 min): N runs at the targets' RTT, at most this many at the
# others and of read-all; sparse reads this many at 0 ms and one at the others (they fetch
# the same bytes every run, only their time changes with the RTT).
SLOW_RUNS = 3
READ_ALL = "find . -type f -print0 | xargs -0 -r cat > /dev/null"


class Mounts:
    """verilay mounts made by the bench, each unmounted by `down` (and by `close`, on any
    error), waiting for the daemon to exit so a cache directory can go."""

    def __init__(self, verilay):
        self.verilay, self.up = verilay, set()

    def mount(self, argv, mnt, env=None, engine="fuse", transport_name=None):
        os.makedirs(mnt, exist_ok=True)
        self.up.add(mnt)
        how = ["--transport", transport_name] if transport_name else []
        subprocess.run([self.verilay, "mount", *argv, mnt, "--quiet", "--engine", engine, *how],
                       check=True, stdout=subprocess.DEVNULL, env=env)

    def down(self, mnt):
        if subprocess.run([self.verilay, "umount", mnt], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        self.up.discard(mnt)

    def close(self):
        for mnt in list(self.up):
            self.down(mnt)


def stats(verilay, mnt):
    out = subprocess.run([verilay, "stats", mnt, "--json"], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def build_tree(scratch, quick):
    """scratch/tree: the Python installation with the Linux source (small-files with
    --quick) at usr/src/NAME, both hard-linked from the datasets (nothing copied)."""
    py = datasets.python_install()
    src = datasets.small_files() if quick else datasets.linux()
    tree = os.path.join(scratch, "tree")
    subprocess.run(["cp", "-al", py.path, tree], check=True)
    os.makedirs(os.path.join(tree, "usr/src"), exist_ok=True)
    subprocess.run(["cp", "-al", src.path, os.path.join(tree, "usr/src", src.name)], check=True)
    return tree, f"{py.name} ({py.origin}) + {src.name} at usr/src/{src.name}"


def tree_files(tree):
    """(relative path, size) of every non-empty regular file, sorted."""
    out = []
    for root, _, files in os.walk(tree):
        for name in files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size:
                out.append((os.path.relpath(path, tree), st.st_size))
    return sorted(out)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def read_range(path, at):
    with open(path, "rb") as f:
        return os.pread(f.fileno(), RANGE_BYTES, at)


class Bench:
    """Everything one run of the benchmark sets up; `close()` takes it all down."""

    def __init__(self, ctx, verilay, registry_bin, skopeo, scratch, cache_option, kernel):
        self.ctx, self.verilay, self.skopeo, self.kernel = ctx, verilay, skopeo, kernel
        self.scratch, self.cache_option = scratch, cache_option
        self.registry_bin = registry_bin
        self.stack = contextlib.ExitStack()
        self.mounts = Mounts(verilay)
        self.stack.callback(self.mounts.close)
        self.mnt = os.path.join(scratch, "mnt")
        self.serial = 0

    def close(self):
        self.stack.close()

    def setup(self, data):
        tree, origin = build_tree(self.scratch, self.ctx.quick)
        self.tree = tree
        self.files = tree_files(tree)
        data["dataset"] = {"origin": origin, "files": len(self.files),
                           "bytes": sum(s for _, s in self.files)}
        self.image = os.path.join(self.scratch, "tree.img")
        start = time.perf_counter()
        out = subprocess.run([self.verilay, "build", tree, "-o", self.image, "--quiet"],
                             check=True, capture_output=True, text=True,
                             env=dict(os.environ, SOURCE_DATE_EPOCH="1700000000"))
        self.digest = out.stdout.strip()
        data["image"] = {"bytes": os.path.getsize(self.image), "digest": self.digest,
                         "build_s": time.perf_counter() - start}
        print(f"image: {data['dataset']['files']:,} files, "
              f"{data['image']['bytes'] / 2**20:,.0f} MiB, {self.digest}", flush=True)

        reg_dir = os.path.join(self.scratch, "registry")
        os.makedirs(reg_dir)
        self.registry = self.stack.enter_context(net.registry(self.registry_bin, reg_dir))
        start = time.perf_counter()
        out = subprocess.run([self.verilay, "push", self.image,
                              f"oci://127.0.0.1:{self.registry.port}/{REPO}:{TAG}",
                              "--insecure", "--quiet"], check=True, capture_output=True,
                             text=True)
        self.manifest = out.stdout.strip()
        data["image"]["push_s"] = time.perf_counter() - start
        data["image"]["manifest"] = self.manifest
        web_dir = os.path.join(self.scratch, "web")
        os.makedirs(web_dir)
        os.link(self.image, os.path.join(web_dir, "tree.img"))
        self.web = self.stack.enter_context(
            net.static_server(web_dir, os.path.join(self.scratch, "web.log")))
        self.reg_proxy = self.stack.enter_context(net.DelayProxy(self.registry.port))
        self.web_proxy = self.stack.enter_context(net.DelayProxy(self.web.port))
        self.curl = shutil.which("curl")
        if self.curl:
            layer = json.loads(subprocess.run(
                [self.curl, "-s", "-H", "Accept: application/vnd.oci.image.manifest.v1+json",
                 f"http://127.0.0.1:{self.registry.port}/v2/{REPO}/manifests/{TAG}"],
                check=True, capture_output=True, text=True).stdout)["layers"][0]
            self.blob, self.blob_size = layer["digest"], layer["size"]
        rnd = random.Random(0)
        self.sparse = rnd.sample(self.files, min(SPARSE_FILES, len(self.files)))
        big = [(p, n) for p, n in self.files if n >= 1 << 20]
        self.ranges = [(p, rnd.randrange(0, (n - RANGE_BYTES) // 4096) * 4096)
                       for p, n in (rnd.choice(big) for _ in range(SPARSE_RANGES if big else 0))]

    # --- one cold run of each mode -------------------------------------------------

    def fresh_cache(self):
        """`--cache DIR` with a new empty DIR, if verilay mount has the option."""
        if not self.cache_option:
            return [], None
        self.serial += 1
        d = os.path.join(self.scratch, f"cache-{self.serial}")
        os.makedirs(d)
        return ["--cache", d], d

    def oci_ref(self, port, by_digest=True):
        target = f"@{self.manifest}" if by_digest else f":{TAG}"
        return f"oci://127.0.0.1:{port}/{REPO}{target}"

    def lazy_argv(self, mode, port):
        if mode in ("lazy-oci", DEV_MODE, KERNEL_MODE):
            return [self.oci_ref(port), "--insecure"]
        return [f"http://127.0.0.1:{port}/tree.img", "--digest", self.digest]

    def first_and_program(self, start, sample):
        body = read_file(os.path.join(self.mnt, FIRST_FILE))
        sample["first_s"] = time.perf_counter() - start
        if body != read_file(os.path.join(self.tree, FIRST_FILE)):
            raise RuntimeError(f"{FIRST_FILE} read through the mount differs from the source")
        subprocess.run(["chroot", self.mnt, *PROGRAM], check=True)
        sample["program_s"] = time.perf_counter() - start

    def run_lazy(self, mode):
        proxy = self.web_proxy if mode == "lazy-http" else self.reg_proxy
        engine = "kernel" if mode == KERNEL_MODE else "fuse"
        fuse_transport = ("dev" if mode == DEV_MODE else
                          None if engine == "kernel" else self.ctx.transports[0])
        cache, cache_dir = self.fresh_cache()
        timing.drop_caches()
        proxy.reset()
        sample = {}
        try:
            start = time.perf_counter()
            self.mounts.mount([*self.lazy_argv(mode, proxy.port), *cache], self.mnt,
                              engine=engine, transport_name=fuse_transport)
            sample["mount_s"] = time.perf_counter() - start
            s = stats(self.verilay, self.mnt)
            if s.get("engine", "fuse") != engine:
                raise RuntimeError(f"{mode}: asked for the {engine} engine, verilay stats "
                                   f"says {s.get('engine')}")
            sample["mount_fetched"], sample["mount_requests"] = (s["remote_bytes_fetched"],
                                                                 s["remote_requests"])
            self.first_and_program(start, sample)
            s = stats(self.verilay, self.mnt)
            sample["fetched"], sample["requests"] = s["remote_bytes_fetched"], s["remote_requests"]
        finally:
            self.mounts.down(self.mnt)
            if cache_dir:
                shutil.rmtree(cache_dir, ignore_errors=True)
        sample["proxy"] = dict(proxy.counts)
        return sample

    def run_pull(self):
        pulled = os.path.join(self.scratch, "pulled.img")
        timing.drop_caches()
        self.reg_proxy.reset()
        sample = {}
        try:
            start = time.perf_counter()
            subprocess.run([self.verilay, "pull", self.oci_ref(self.reg_proxy.port), "-o", pulled,
                            "--insecure", "--quiet"], check=True, stdout=subprocess.DEVNULL)
            sample["pull_s"] = time.perf_counter() - start
            self.mounts.mount([pulled], self.mnt)
            sample["mount_s"] = time.perf_counter() - start
            self.first_and_program(start, sample)
        finally:
            self.mounts.down(self.mnt)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pulled)
        sample["proxy"] = dict(self.reg_proxy.counts)
        sample["fetched"] = sample["proxy"]["bytes_down"]
        sample["requests"] = sample["proxy"]["requests"]
        return sample

    def run_skopeo(self):
        dest = os.path.join(self.scratch, "skopeo-copy")
        timing.drop_caches()
        self.reg_proxy.reset()
        try:
            start = time.perf_counter()
            subprocess.run([self.skopeo, "copy", "--quiet", "--src-tls-verify=false",
                            f"docker://127.0.0.1:{self.reg_proxy.port}/{REPO}:{TAG}",
                            f"dir:{dest}"], check=True, stdout=subprocess.DEVNULL)
            copy_s = time.perf_counter() - start
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        counts = dict(self.reg_proxy.counts)
        return {"copy_s": copy_s, "proxy": counts, "fetched": counts["bytes_down"],
                "requests": counts["requests"]}

    def run_sparse(self, check, exact=False):
        """A fresh lazy-oci mount, then SPARSE_FILES random files read whole. `exact`:
        with VERILAY_FETCH_EXACT=1, one request per 4 KiB block read (the floor)."""
        cache, cache_dir = self.fresh_cache()
        timing.drop_caches()
        self.reg_proxy.reset()
        sample = {}
        env = dict(os.environ, VERILAY_FETCH_EXACT="1" if exact else "0")
        try:
            start = time.perf_counter()
            self.mounts.mount([*self.lazy_argv("lazy-oci", self.reg_proxy.port), *cache],
                              self.mnt, env=env)
            sample["mount_s"] = time.perf_counter() - start
            # What the proxy carried before the first read: the Merkle tree (fetched
            # whole at open), superblock and manifest, counted whichever process fetched.
            sample["proxy_at_mount"] = dict(self.reg_proxy.counts)
            before = stats(self.verilay, self.mnt)
            start = time.perf_counter()
            bodies = [read_file(os.path.join(self.mnt, p)) for p, _ in self.sparse]
            sample["read_s"] = time.perf_counter() - start
            after = stats(self.verilay, self.mnt)
            pieces = [read_range(os.path.join(self.mnt, p), at) for p, at in self.ranges]
            ranged = stats(self.verilay, self.mnt)
        finally:
            self.mounts.down(self.mnt)
            if cache_dir:
                shutil.rmtree(cache_dir, ignore_errors=True)
        if check:
            for (p, _), body in zip(self.sparse, bodies):
                if body != read_file(os.path.join(self.tree, p)):
                    raise RuntimeError(f"{p} read through the lazy mount differs from the source")
            for (p, at), piece in zip(self.ranges, pieces):
                if piece != read_range(os.path.join(self.tree, p), at):
                    raise RuntimeError(f"{p} at {at} read through the lazy mount differs")
        sample["range_bytes_read"] = sum(len(b) for b in pieces)
        sample["range_fetched"] = ranged["remote_bytes_fetched"] - after["remote_bytes_fetched"]
        sample["bytes_read"] = sum(len(b) for b in bodies)
        sample["mount_fetched"] = before["remote_bytes_fetched"]
        sample["fetched"] = after["remote_bytes_fetched"]
        sample["requests"] = after["remote_requests"]
        sample["read_requests"] = after["remote_requests"] - before["remote_requests"]
        sample["proxy"] = dict(self.reg_proxy.counts)
        return sample

    def port_at(self, rtt_ms):
        """The registry's port as seen at `rtt_ms`: direct at 0 ms, else the proxy's (set to
        that RTT)."""
        if not rtt_ms:
            return self.registry.port
        self.reg_proxy.rtt = rtt_ms / 1000
        return self.reg_proxy.port

    def connections(self, rtt_ms, opened_before):
        """TCP connections made since `opened_before` (`active_opens()` then): the proxy's
        count, or at 0 ms the kernel's."""
        if rtt_ms:
            return self.reg_proxy.counts["connections"]
        return active_opens() - opened_before

    @contextlib.contextmanager
    def cold_mount(self, argv, engine="fuse", cache=False):
        """A cold mount of `argv` (caches dropped, the proxy's counts reset, a fresh
        `--cache` when `cache`): yields (sample, start), the sample holding `mount_s` and
        the connections opened before it (`opened`); unmounts and removes the cache
        after."""
        extra, cache_dir = self.fresh_cache() if cache else ([], None)
        timing.drop_caches()
        self.reg_proxy.reset()
        sample = {"opened": active_opens()}
        try:
            start = time.perf_counter()
            self.mounts.mount([*argv, *extra], self.mnt, engine=engine)
            sample["mount_s"] = time.perf_counter() - start
            yield sample, start
        finally:
            self.mounts.down(self.mnt)
            if cache_dir:
                shutil.rmtree(cache_dir, ignore_errors=True)

    def fetch_counts(self, sample, s, rtt_ms):
        """Adds what the mount fetched (its `verilay stats` `s`) and over how many TCP
        connections to `sample`."""
        sample["fetched"], sample["requests"] = s["remote_bytes_fetched"], s["remote_requests"]
        sample["connections"] = self.connections(rtt_ms, sample.pop("opened"))

    def run_read_all(self, mode, rtt_ms=0, engine="fuse"):
        """Mount (the registry at `rtt_ms`, or the local image file) and read every file."""
        remote = mode == "remote"
        argv = [self.oci_ref(self.port_at(rtt_ms)), "--insecure"] if remote else [self.image]
        with self.cold_mount(argv, engine, cache=remote) as (sample, start):
            subprocess.run(["sh", "-c", READ_ALL], cwd=self.mnt, check=True)
            sample["wall_s"] = time.perf_counter() - start
            if remote:
                s = stats(self.verilay, self.mnt)
                if s.get("engine", "fuse") != engine:
                    raise RuntimeError(f"read-all: asked for the {engine} engine, verilay "
                                       f"stats says {s.get('engine')}")
                self.fetch_counts(sample, s, rtt_ms)
        sample.pop("opened", None)
        return sample

    def run_prefetch(self, rtt_ms):
        """A fresh --prefetch mount, timed from its start until every byte is verified and
        cached."""
        argv = [self.oci_ref(self.port_at(rtt_ms)), "--insecure", "--prefetch"]
        cpu0 = sum(os.times()[:2])
        machine0 = timing.machine_cpu_s()
        with self.cold_mount(argv, cache=True) as (sample, start):
            deadline = start + PREFETCH_TIMEOUT_S
            while True:
                s = stats(self.verilay, self.mnt)
                if s["prefetch_bytes_total"] and (
                        s["prefetch_bytes_done"] >= s["prefetch_bytes_total"]):
                    break
                now = time.perf_counter()
                if now > deadline:
                    sample["error"] = (f"not done after {PREFETCH_TIMEOUT_S} s "
                                       f"({s['prefetch_bytes_done']:,} of "
                                       f"{s['prefetch_bytes_total']:,} bytes)")
                    break
                # Each look is a `verilay stats` process, which takes CPU from the
                # prefetch: a quarter of the time left at the rate so far, 20-500 ms.
                done, total = s["prefetch_bytes_done"], s["prefetch_bytes_total"]
                left = (now - start) * (total - done) / done if done else 0.5
                time.sleep(min(0.5, max(0.02, left / 4)))
            sample["wall_s"] = time.perf_counter() - start
            # This process's CPU time: its latency proxy's (at 10 and 50 ms) and its
            # polling's.
            sample["bench_cpu_s"] = sum(os.times()[:2]) - cpu0
            machine1 = timing.machine_cpu_s()
            if machine0 is not None and machine1 is not None:
                sample["machine_cpu_s"] = machine1 - machine0
            # The blob, as curl's: the data, its Merkle tree and the trailer.
            sample["bytes"] = self.blob_size
            sample["failures"] = s["prefetch_failures"]
            if s["prefetch_failures"]:
                sample["error"] = f"{s['prefetch_failures']} steps failed"
            self.fetch_counts(sample, s, rtt_ms)
        return sample

    def run_curl(self, rtt_ms, to_file=False):
        """curl of the image's blob, cold, over the path lazy mounts take: to /dev/null, or
        `to_file` (in the scratch directory, where the caches are) and synced, as a
        prefetch's bytes are."""
        port = self.port_at(rtt_ms)
        out = os.path.join(self.scratch, "blob") if to_file else "/dev/null"
        timing.drop_caches()
        self.reg_proxy.reset()
        opened = active_opens()
        start = time.perf_counter()
        cpu0 = sum(os.times()[:2])
        machine0 = timing.machine_cpu_s()
        subprocess.run([self.curl, "-s", "-f", "-o", out,
                        f"http://127.0.0.1:{port}/v2/{REPO}/blobs/{self.blob}"], check=True)
        if to_file:
            fd = os.open(out, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        machine1 = timing.machine_cpu_s()
        sample = {"wall_s": time.perf_counter() - start, "bytes": self.blob_size,
                  "bench_cpu_s": sum(os.times()[:2]) - cpu0,
                  "requests": 1, "connections": self.connections(rtt_ms, opened)}
        if machine0 is not None and machine1 is not None:
            sample["machine_cpu_s"] = machine1 - machine0
        if to_file:
            os.unlink(out)
        return sample

    # --- the schedule ---------------------------------------------------------------

    def sweep(self, data):
        for rtt_ms in RTTS_MS:
            self.reg_proxy.rtt = self.web_proxy.rtt = rtt_ms / 1000
            runs = self.ctx.runs if rtt_ms == TARGET_RTT_MS else min(self.ctx.runs, SLOW_RUNS)
            sparse_runs = min(self.ctx.runs, SLOW_RUNS) if rtt_ms == 0 else 1
            res = {m: [] for m in MODES}
            res["sparse"] = []
            modes = [m for m in MODES if (m != "skopeo" or self.skopeo)
                     and (m != KERNEL_MODE or self.kernel)
                     and (m != DEV_MODE or self.ctx.transports[0] != "dev")]
            for i in range(runs):
                print(f"  rtt {rtt_ms} ms: run {i + 1}/{runs}", flush=True)
                r = i % len(modes)
                for mode in modes[r:] + modes[:r]:
                    if mode.startswith("lazy"):
                        res[mode].append(self.run_lazy(mode))
                    elif mode == "pull":
                        res[mode].append(self.run_pull())
                    else:
                        res[mode].append(self.run_skopeo())
                if i < sparse_runs:
                    res["sparse"].append(self.run_sparse(check=(i == 0)))
            if rtt_ms == 0:
                print("  rtt 0 ms: sparse floor (VERILAY_FETCH_EXACT=1)", flush=True)
                res["sparse_exact"] = [self.run_sparse(check=True, exact=True)]
            data["rtt"][str(rtt_ms)] = res

    def read_all(self, data):
        """Read-all of the local image and from the registry at each RTT (and with the
        kernel engine at 0 ms), the modes taking turns at going first."""
        modes = [m for m in READ_ALL_MODES if m[2] == "fuse" or self.kernel]
        res = {read_all_key(*m): [] for m in modes}
        runs = min(self.ctx.runs, SLOW_RUNS)
        for i in range(runs):
            print(f"  read-all: run {i + 1}/{runs}", flush=True)
            r = i % len(modes)
            for mode, rtt_ms, engine in modes[r:] + modes[:r]:
                res[read_all_key(mode, rtt_ms, engine)].append(
                    self.run_read_all(mode, rtt_ms, engine))
        data["read_all"] = res

    def prefetch(self, data):
        """--prefetch against curl of the blob (to /dev/null, and to a synced file) at
        each RTT, taking turns."""
        res = {}
        runs = min(self.ctx.runs, PREFETCH_RUNS)
        modes = {"prefetch": self.run_prefetch, "curl": self.run_curl,
                 "curl-file": lambda rtt_ms: self.run_curl(rtt_ms, to_file=True)}
        names = list(modes)
        for rtt_ms in RTTS_MS:
            res[str(rtt_ms)] = {m: [] for m in modes}
            for i in range(runs):
                print(f"  prefetch: rtt {rtt_ms} ms, run {i + 1}/{runs}", flush=True)
                r = i % len(names)
                for mode in names[r:] + names[:r]:
                    res[str(rtt_ms)][mode].append(modes[mode](rtt_ms))
        data["prefetch"] = res

    def proxy_throughput(self, data):
        """A GET of the whole blob with curl, directly and through the proxy at 0 ms."""
        curl = self.curl
        if not curl:
            return
        blob = self.blob
        self.reg_proxy.rtt = 0
        out = {}
        for via, port in (("direct", self.registry.port), ("proxy", self.reg_proxy.port)):
            samples = []
            for _ in range(3):
                start = time.perf_counter()
                subprocess.run([curl, "-s", "-f", "-o", "/dev/null",
                                f"http://127.0.0.1:{port}/v2/{REPO}/blobs/{blob}"], check=True)
                samples.append(time.perf_counter() - start)
            out[via] = samples
        data["proxy_throughput"] = out


# Read-all's modes: (image, RTT in ms, engine); the kernel engine's where it serves.
READ_ALL_MODES = ([("local", 0, "fuse")] + [("remote", r, "fuse") for r in RTTS_MS]
                  + [("local", 0, "kernel"), ("remote", 0, "kernel")])


def read_all_key(mode, rtt_ms, engine):
    """The name of a read-all mode: `local`, `remote-0ms`, `local-kernel`,
    `remote-0ms-kernel`."""
    name = mode if mode == "local" else f"{mode}-{rtt_ms}ms"
    return name if engine == "fuse" else f"{name}-kernel"


def active_opens():
    """TCP connections this host has opened since boot (/proc/net/snmp, Tcp ActiveOpens)."""
    with open("/proc/net/snmp") as f:
        tcp = [line.split() for line in f if line.startswith("Tcp:")]
    return int(tcp[1][tcp[0].index("ActiveOpens")])


def median(samples, key):
    values = [s[key] for s in samples if s.get(key) is not None]
    return statistics.median(values) if values else None


@transport.uring_switch
def run(ctx):
    scratch = datasets.scratch_dir("remote")
    verilay, why = tools.verilay(scratch)
    registry_bin = tools.find("DOCKER_REGISTRY")
    skopeo = tools.find("SKOPEO")
    data = report.bench_data("remote", ctx,
                             {"rtts_ms": list(RTTS_MS), "first_file": FIRST_FILE,
                              "program": PROGRAM, "sparse_files": SPARSE_FILES},
                             {"peers": {"docker-registry": registry_bin, "skopeo": skopeo,
                                        "skopeo_version": tools.version(skopeo) if skopeo
                                        else None},
                              "rtt": {}, "targets": []})
    reason = why
    if not reason and (os.geteuid() != 0 or timing.drop_caches() is not None):
        reason = "needs root (mounts, chroot, dropping caches)"
    if not reason and not registry_bin:
        reason = "needs docker-registry (apt-get install docker-registry)"
    if reason:
        print(f"remote bench skipped: {reason}")
        data["targets"].append(report.target("remote", None, reason))
        shutil.rmtree(scratch, ignore_errors=True)
        return data
    print(f"docker-registry: {registry_bin}")
    print(f"skopeo: {skopeo or 'not measured, because ' + tools.missing('SKOPEO')}")

    netem, evidence = net.netem_check()
    data["latency"] = {"netem": netem, "evidence": evidence,
                       "method": "userspace delaying TCP proxy, splice(2) (harness/net.py DelayProxy)"}
    print(f"netem: {'available' if netem else 'NOT available in this kernel'}")
    for line in evidence:
        print(f"  {line}")
    print("  latency is added by the bench's own TCP proxy on 127.0.0.1 instead "
          "(RTT/2 each way per chunk, +1 RTT per new connection)")

    help_text = subprocess.run([verilay, "mount", "--help"], capture_output=True,
                               text=True).stdout
    cache_option = "--cache" in help_text
    data["settings"]["cache_used"] = cache_option
    data["settings"]["cache"] = ("--cache with a fresh empty directory for every cold mount"
                                 if cache_option else
                                 "none: `verilay mount` has no --cache option in this build "
                                 "(fetched chunks are kept in the daemon's memory only)")
    print(f"cache: {data['settings']['cache']}", flush=True)

    kernel = transport.kernel_column(verilay, data)
    parts = report.selected_parts("remote", ctx, PARTS)
    data["settings"]["parts"] = sorted(parts)
    bench = Bench(ctx, verilay, registry_bin, skopeo, scratch, cache_option, kernel)
    try:
        bench.setup(data)
        bench.proxy_throughput(data)
        if "sweep" in parts:
            bench.sweep(data)
        if "read-all" in parts:
            bench.read_all(data)
        if "prefetch" in parts:
            if bench.curl:
                bench.prefetch(data)
            else:
                data["prefetch_missing"] = "curl is missing (apt-get install curl)"
    finally:
        bench.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print_results(data)
    data["targets"] = check_targets(data)
    return data


def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def print_results(data):
    if "proxy_throughput" in data:
        size = data["image"]["bytes"]
        pt = {k: size / statistics.median(v) / 2**20 for k, v in data["proxy_throughput"].items()}
        data["proxy_mib_s"] = pt
        print(f"\nproxy calibration, GET of the whole blob with curl: direct {pt['direct']:,.0f} "
              f"MiB/s, through the proxy at 0 ms {pt['proxy']:,.0f} MiB/s")
    if data["rtt"]:
        print_sweep(data)
    if data.get("read_all"):
        print_read_all(data["read_all"])
    if data.get("prefetch"):
        print_prefetch(data["prefetch"])
    print()


def read_all_ratio(ra, rtt_ms, engine="fuse"):
    """Read-all's speed from the registry at `rtt_ms` as a fraction of local's (medians),
    or None if either did not run."""
    local, remote = ra.get(read_all_key("local", 0, engine)), ra.get(
        read_all_key("remote", rtt_ms, engine))
    if not local or not remote:
        return None
    return median(local, "wall_s") / median(remote, "wall_s")


def print_read_all(ra):
    n = max(len(v) for v in ra.values())
    rows = []
    for mode, rtt_ms, engine in READ_ALL_MODES:
        s = ra.get(read_all_key(mode, rtt_ms, engine))
        if not s:
            continue
        remote = mode == "remote"
        ratio = read_all_ratio(ra, rtt_ms, engine) if remote else None
        rows.append([mode, engine, f"{rtt_ms} ms" if remote else "-", str(len(s)),
                     fmt(median(s, "mount_s")), fmt(median(s, "wall_s")),
                     fmt(min(x["wall_s"] for x in s)), fmt(max(x["wall_s"] for x in s)),
                     fmt(ratio, ".2f"),
                     fmt(median(s, "fetched") and median(s, "fetched") / 2**20, ",.0f"),
                     fmt(median(s, "requests"), ".0f"), fmt(median(s, "connections"), ".0f")])
    report.print_table(["image", "engine", "rtt", "n", "mount s", "wall s", "min", "max",
                        "x local's speed", "fetched MiB", "requests", "connections"], rows,
                       title=f"read-all: mount + cat of every file, cold (medians of {n})")
    print("(0 ms: the registry reached directly; 10 and 50 ms: through the proxy. "
          "connections: the proxy's count, at 0 ms the kernel's TCP ActiveOpens)")


def prefetch_ratios(res, peer="curl"):
    """--prefetch's throughput as a fraction of `peer`'s, per round (they ran one after
    the other: the registry's disk, which both read cold, is in the same state); rounds
    whose prefetch failed are left out (`prefetch_errors`)."""
    return [(p["bytes"] / p["wall_s"]) / (c["bytes"] / c["wall_s"])
            for p, c in zip(res["prefetch"], res[peer]) if "error" not in p]


def prefetch_errors(res):
    return [p["error"] for p in res["prefetch"] if "error" in p]


def print_prefetch(pf):
    rows = []
    for rtt, res in pf.items():
        for mode in ("prefetch", "curl", "curl-file"):
            s = res.get(mode)
            if not s:
                continue
            rate = median(s, "bytes") / median(s, "wall_s") / 2**20
            ratios = prefetch_ratios(res, mode) if mode != "prefetch" else []
            rows.append([f"{rtt} ms", mode, str(len(s)), fmt(median(s, "wall_s")),
                         fmt(min(x["wall_s"] for x in s)), fmt(max(x["wall_s"] for x in s)),
                         f"{rate:,.0f}", fmt(statistics.median(ratios), ".2f") if ratios else "",
                         fmt(median(s, "requests"), ".0f"), fmt(median(s, "connections"), ".0f"),
                         fmt(median(s, "bench_cpu_s"), ".2f"),
                         fmt(median(s, "machine_cpu_s"), ".2f")])
    report.print_table(["rtt", "mode", "n", "s", "min", "max", "MiB/s", "prefetch x this",
                        "requests", "connections", "bench CPU s", "machine CPU s"], rows,
                       title="prefetch: --prefetch until every byte is verified and cached, "
                             "against curl of the blob (both cold)")
    print("(prefetch x this: the prefetch's throughput over this mode's, the median of the "
          "rounds' ratios; the modes take turns in each round. curl-file: curl -o FILE in the "
          "scratch directory, then fsync: the blob's bytes written to the disk a prefetch's go to; bench "
          "CPU s: the CPU time this benchmark's own process took meanwhile, its latency "
          "proxy's at 10 and 50 ms and its polling of `verilay stats`, on the CPUs the "
          "prefetch and curl also use; machine CPU s: what every process and kernel thread "
          "took meanwhile, the registry's, the proxy's and the network's included)")


def print_sweep(data):
    """The RTT sweep's tables: every mode's times, bytes and requests; the sparse readers."""
    print(f"\nimage {data['image']['bytes'] / 2**20:,.0f} MiB; times in s from the start "
          f"(medians of n runs); first = {FIRST_FILE} read; "
          f"program = chroot python3 -c 'import json' after it")
    rows = []
    for rtt, res in data["rtt"].items():
        lazy_first = median(res["lazy-oci"], "first_s")
        for mode in MODES:
            s = res.get(mode)
            if not s:
                continue
            first = median(s, "first_s") if mode != "skopeo" else median(s, "copy_s")
            conns = statistics.median(x["proxy"]["connections"] for x in s)
            rows.append([f"{rtt} ms", mode, str(len(s)), fmt(median(s, "mount_s")),
                         fmt(median(s, "first_s")),
                         fmt(median(s, "program_s")), fmt(median(s, "copy_s")),
                         fmt(median(s, "fetched") / 2**20, ",.1f"),
                         fmt(median(s, "mount_requests"), ".0f"),
                         fmt(median(s, "requests"), ".0f"), f"{conns:.0f}",
                         fmt(first / lazy_first, ".2f" if mode in (KERNEL_MODE, DEV_MODE)
                             else ".1f")
                         if mode in ("pull", "skopeo", KERNEL_MODE, DEV_MODE) else ""])
    report.print_table(["rtt", "mode", "n", "mount", "first", "program", "copy", "fetched MiB",
                        "mount req", "requests", "connections", "x lazy-oci first"], rows,
                       left=2)
    print("(requests: verilay stats' remote_requests for lazy mounts, HTTP request lines "
          "the proxy saw for pull and skopeo; connections: TCP connections through the "
          "proxy)")
    print(f"\nsparse: {SPARSE_FILES} random files read whole on a fresh lazy-oci mount "
          "(medians of n runs)")
    rows = []
    for rtt, res in data["rtt"].items():
        s = res["sparse"]
        read = median(s, "bytes_read")
        rows.append([f"{rtt} ms", str(len(s)), fmt(median(s, "read_s")), fmt(read / 2**20, ",.2f"),
                     fmt(median(s, "mount_fetched") / 2**20, ",.2f"),
                     fmt(median(s, "fetched") / 2**20, ",.2f"),
                     fmt(median(s, "read_requests"), ".0f"),
                     f"{statistics.median(x['proxy']['connections'] for x in s):.0f}",
                     fmt(median(s, "fetched") / read, ".2f"),
                     fmt((median(s, "fetched") - median(s, "mount_fetched")) / read, ".2f")])
    report.print_table(["rtt", "n", "read s", "read MiB", "mount fetched MiB", "fetched MiB",
                        "read requests", "connections", "fetched/read", "without mount's"], rows)
    exact = data["rtt"].get("0", {}).get("sparse_exact")
    if exact:
        e = exact[0]
        print(f"floor (VERILAY_FETCH_EXACT=1: one request per 4 KiB block the reads touch): "
              f"{e['fetched'] / 2**20:,.2f} MiB fetched in {e['read_requests']} requests, "
              f"{e['fetched'] / e['bytes_read']:.2f}x the bytes read")
    at_mount = [x["proxy_at_mount"]["bytes_down"] for r in data["rtt"].values()
                for x in r["sparse"] if "proxy_at_mount" in x]
    if at_mount:
        print(f"before the first read (Merkle tree, superblock, manifest; proxy count, "
              f"headers included): {statistics.median(at_mount) / 2**20:,.2f} MiB, "
              f"not in the ratios above")


def check_targets(data):
    t = []
    size_mib = data["image"]["bytes"] / 2**20
    res = data["rtt"].get(str(TARGET_RTT_MS))
    if res and res["lazy-oci"]:
        first = median(res["lazy-oci"], "first_s")
        t.append(report.target(
            f"first file at {TARGET_RTT_MS} ms RTT", first < FIRST_LIMIT_S,
            f"{first:.3f} s from `verilay mount` to {FIRST_FILE} read, image {size_mib:,.0f} MiB "
            f"(target < {FIRST_LIMIT_S} s for ~1 GiB)"))
        pull = median(res["pull"], "first_s")
        t.append(report.target(
            f"first file vs verilay pull at {TARGET_RTT_MS} ms RTT", pull / first >= SPEEDUP,
            f"{pull / first:.1f}x sooner ({pull:.3f} s pull + mount + read; "
            f"target >= {SPEEDUP:g}x)"))
        if res.get("skopeo"):
            copy = median(res["skopeo"], "copy_s")
            t.append(report.target(
                f"first file vs skopeo copy at {TARGET_RTT_MS} ms RTT", copy / first >= SPEEDUP,
                f"{copy / first:.1f}x sooner ({copy:.3f} s skopeo copy alone; "
                f"target >= {SPEEDUP:g}x)"))
        else:
            t.append(report.not_measured(f"first file vs skopeo copy at {TARGET_RTT_MS} ms RTT",
                                         tools.missing("SKOPEO") or "skopeo did not run"))
        print(f"INFO  program at {TARGET_RTT_MS} ms RTT: lazy-oci "
              f"{median(res['lazy-oci'], 'program_s'):.3f} s, pull "
              f"{median(res['pull'], 'program_s'):.3f} s to `python3 -c 'import json'` done")
    for rtt, r in data["rtt"].items():
        if r.get(KERNEL_MODE) and r.get("lazy-oci"):
            t += kernel_vs_fuse(r, rtt, int(rtt) == TARGET_RTT_MS)
    base = data["rtt"].get("0", {}).get("lazy-oci")
    for rtt, r in data["rtt"].items():
        lazy = r["lazy-oci"]
        if base and lazy and int(rtt):
            reqs = median(lazy, "requests")
            conns = statistics.median(x["proxy"]["connections"] for x in lazy)
            extra = median(lazy, "program_s") - median(base, "program_s")
            print(f"INFO  lazy-oci at {rtt} ms: {reqs:.0f} requests over {conns:.0f} TCP "
                  f"connections to the program's end; the latency added {extra:.2f} s, "
                  f"{extra / reqs / (int(rtt) / 1000):.2f} RTT per request")
    sparse = [s for r in data["rtt"].values() for s in r["sparse"]]
    if sparse:
        ratios = [s["fetched"] / s["bytes_read"] for s in sparse]
        ratio = statistics.median(ratios)
        bare = statistics.median((s["fetched"] - s["mount_fetched"]) / s["bytes_read"]
                                 for s in sparse)
        ranged = [s for s in sparse if s.get("range_bytes_read")]
        if ranged:
            r = statistics.median(s["range_fetched"] / s["range_bytes_read"] for s in ranged)
            t.append(report.target(
                f"sparse ranges: bytes fetched / bytes read, {SPARSE_RANGES} reads of "
                f"{RANGE_BYTES >> 10} KiB in files >= 1 MiB", r <= AMPLIFICATION,
                f"{r:.2f} (target <= {AMPLIFICATION})"))
        exact = data["rtt"].get("0", {}).get("sparse_exact")
        floor = (f"; floor {exact[0]['fetched'] / exact[0]['bytes_read']:.2f} (only the 4 KiB "
                 f"blocks read, VERILAY_FETCH_EXACT=1)") if exact else ""
        t.append(report.target(
            "sparse files: bytes fetched / bytes read", ratio <= AMPLIFICATION,
            f"{ratio:.2f} (range {min(ratios):.2f}..{max(ratios):.2f} over every RTT; "
            f"{bare:.2f} without the mount's own fetches{floor}; target <= {AMPLIFICATION})"))
    ra = data.get("read_all")
    for rtt_ms, want in READ_ALL_RATIO.items() if ra else ():
        speed = read_all_ratio(ra, rtt_ms)
        if speed is not None:
            remote = ra[read_all_key("remote", rtt_ms, "fuse")]
            t.append(report.target(
                f"read-all from the registry at {rtt_ms} ms RTT vs the local image",
                speed >= want,
                f"{speed:.2f}x local's speed ({median(remote, 'wall_s'):.2f} s vs "
                f"{median(ra['local'], 'wall_s'):.2f} s, medians; target >= {want}x)"))
    for rtt, res in (data.get("prefetch") or {}).items():
        ratios, errors = prefetch_ratios(res), prefetch_errors(res)
        if errors:
            t.append(report.target(f"--prefetch vs curl of the blob at {rtt} ms RTT", False,
                                   f"{len(errors)} of {len(res['prefetch'])} prefetches "
                                   f"failed: {errors[0]}"))
            continue
        ratio = statistics.median(ratios)
        p, c = res["prefetch"], res["curl"]
        t.append(report.target(
            f"--prefetch vs curl of the blob at {rtt} ms RTT", ratio >= PREFETCH_RATIO,
            f"{ratio:.2f}x curl's throughput, median of {len(ratios)} rounds' ratios "
            f"({min(ratios):.2f}..{max(ratios):.2f}; {median(p, 'wall_s'):.2f} s vs "
            f"{median(c, 'wall_s'):.2f} s; target >= {PREFETCH_RATIO}x)"))
        cpu, curl_cpu = median(p, "machine_cpu_s"), median(c, "machine_cpu_s")
        if cpu and curl_cpu is not None:
            # The least time the CPU the prefetch took allows on this host's CPUs, all of
            # them busy: where that is near the prefetch's time, only less work per byte
            # (here or in the registry and the network beside it) makes it faster.
            cpus = timing.usable_cpus()
            floor = cpu / cpus
            print(f"INFO  --prefetch's CPU at {rtt} ms RTT: {cpu:.2f} s over the machine "
                  f"({curl_cpu:.2f} s for curl's GET), at least "
                  f"{floor:.2f} s on {cpus} CPUs: {median(c, 'wall_s') / floor:.2f}x "
                  f"curl's throughput at most, where the prefetch took "
                  f"{median(p, 'wall_s'):.2f} s")
        if res.get("curl-file"):
            stored = prefetch_ratios(res, "curl-file")
            print(f"INFO  --prefetch vs curl of the blob to a synced file at {rtt} ms RTT: "
                  f"{statistics.median(stored):.2f}x its throughput "
                  f"({median(res['curl-file'], 'wall_s'):.2f} s)")
    if data.get("prefetch_missing"):
        t.append(report.not_measured("--prefetch vs curl of the blob", data["prefetch_missing"]))
    return t


def kernel_vs_fuse(res, rtt, verdict):
    """lazy-oci-kernel's first file and program against lazy-oci's (the FUSE engine's) at
    one RTT: the median of the per-run ratios (the two ran in the same round), no slower
    within KERNEL_VS_FUSE. A target at the targets' RTT (`verdict`), INFO lines at the
    others."""
    t = []
    for key, what in (("first_s", "first file"), ("program_s", "`import json`")):
        k, f = res[KERNEL_MODE], res["lazy-oci"]
        ratios = [a[key] / b[key] for a, b in zip(k, f)]
        ratio = statistics.median(ratios)
        detail = (f"{ratio:.2f}x the FUSE engine's time, median of {len(ratios)} runs' ratios "
                  f"({min(ratios):.2f}..{max(ratios):.2f}; {median(k, key):.3f} s vs "
                  f"{median(f, key):.3f} s; target <= {KERNEL_VS_FUSE}x)")
        name = f"{what} at {rtt} ms RTT: kernel engine vs FUSE engine (lazy-oci)"
        if verdict:
            t.append(report.target(name, ratio <= KERNEL_VS_FUSE, detail))
        else:
            print(f"INFO  {name}: {detail}")
    return t


def plot_sweep(data, rtts, ax_t, ax_b):
    """The sweep's panels: time to first byte and bytes fetched against RTT."""
    lines = [("lazy-oci", "first_s", "lazy-oci: first file", "tab:red", "o-"),
             ("lazy-oci", "program_s", "lazy-oci: program", "tab:red", "s--"),
             (DEV_MODE, "first_s", "lazy-oci over /dev/fuse: first file", "tab:pink", "o-"),
             (DEV_MODE, "program_s", "lazy-oci over /dev/fuse: program", "tab:pink", "s--"),
             (KERNEL_MODE, "first_s", "lazy-oci, kernel engine: first file", "tab:brown", "o-"),
             (KERNEL_MODE, "program_s", "lazy-oci, kernel engine: program", "tab:brown",
              "s--"),
             ("lazy-http", "first_s", "lazy-http: first file", "tab:orange", "o-"),
             ("lazy-http", "program_s", "lazy-http: program", "tab:orange", "s--"),
             ("pull", "first_s", "pull + mount: first file", "tab:blue", "o-"),
             ("pull", "program_s", "pull + mount: program", "tab:blue", "s--"),
             ("skopeo", "copy_s", "skopeo copy", "tab:green", "^-")]
    for mode, key, label, color, style in lines:
        ys = [median(data["rtt"][str(r)].get(mode) or [], key) for r in rtts]
        if all(y is not None for y in ys):
            ax_t.plot(rtts, ys, style, color=color, label=label)
    ax_t.set_yscale("log")
    ax_t.set_xlabel("RTT, ms")
    ax_t.set_ylabel("seconds from start (median)")
    ax_t.set_title("time to first byte")
    ax_t.legend(fontsize="small")

    bars = [("lazy-oci", "lazy-oci: first + program", "tab:red", "o-"),
            (DEV_MODE, "lazy-oci over /dev/fuse: first + program", "tab:pink", "x--"),
            (KERNEL_MODE, "lazy-oci, kernel engine: first + program", "tab:brown", "x--"),
            ("lazy-http", "lazy-http: first + program", "tab:orange", "x--"),
            ("sparse", f"sparse: {SPARSE_FILES} random files", "tab:purple", "o-"),
            ("pull", "pull", "tab:blue", "o-"), ("skopeo", "skopeo copy", "tab:green", "x--")]
    for mode, label, color, style in bars:
        ys = [median(data["rtt"][str(r)].get(mode) or [], "fetched") for r in rtts]
        if all(y is not None for y in ys):
            ax_b.plot(rtts, [y / 2**20 for y in ys], style, color=color, label=label)
    sparse_read = median(data["rtt"][str(rtts[0])]["sparse"], "bytes_read")
    ax_b.axhline(sparse_read / 2**20, color="tab:purple", ls=":", label="sparse: bytes read")
    ax_b.set_yscale("log")
    ax_b.set_xlabel("RTT, ms")
    ax_b.set_ylabel("MiB fetched (median)")
    ax_b.set_title(f"bytes fetched (image {data['image']['bytes'] / 2**20:,.0f} MiB)")
    ax_b.legend(fontsize="small")


def plot(data, png):
    if not (data.get("rtt") or data.get("read_all") or data.get("prefetch")):
        return
    plt = report.pyplot()

    rtts = [int(r) for r in data["rtt"]]
    if rtts:
        fig, (ax_t, ax_b, ax_r) = plt.subplots(1, 3, figsize=(17, 4.8))
        plot_sweep(data, rtts, ax_t, ax_b)
    else:
        fig, ax_r = plt.subplots(1, 1, figsize=(7, 4.8))

    ra = data.get("read_all") or {}
    local = ra.get("local")
    if local:
        ax_r.axhline(median(local, "wall_s"), color="tab:blue", ls=":",
                     label="local image (FUSE engine)")
        xs = [r for r in RTTS_MS if ra.get(read_all_key("remote", r, "fuse"))]
        ax_r.plot(xs, [median(ra[read_all_key("remote", r, "fuse")], "wall_s") for r in xs],
                  "o-", color="tab:red", label="from the registry (FUSE engine)")
    if ra.get("remote-0ms-kernel"):
        ax_r.axhline(median(ra["local-kernel"], "wall_s"), color="tab:brown", ls=":",
                     label="local image (kernel engine)")
        ax_r.plot([0], [median(ra["remote-0ms-kernel"], "wall_s")], "s", color="tab:brown",
                  label="from the registry (kernel engine)")
    pf = data.get("prefetch") or {}
    if pf:
        rtts_p = [int(r) for r in pf]
        ax_r.plot(rtts_p, [median(pf[str(r)]["prefetch"], "wall_s") for r in rtts_p], "^--",
                  color="tab:purple", label="--prefetch until all cached")
        ax_r.plot(rtts_p, [median(pf[str(r)]["curl"], "wall_s") for r in rtts_p], "v--",
                  color="tab:green", label="curl of the blob")
        if all(pf[str(r)].get("curl-file") for r in rtts_p):
            ax_r.plot(rtts_p, [median(pf[str(r)]["curl-file"], "wall_s") for r in rtts_p],
                      "v:", color="tab:olive", label="curl of the blob to a synced file")
    ax_r.set_xlabel("RTT, ms")
    ax_r.set_ylabel("s (median, cold)")
    ax_r.set_title("read-all (mount + cat of every file); prefetch")
    ax_r.legend(fontsize="small")
    fig.suptitle("remote: lazy mount vs pull, medians "
                 "(latency from the bench's delaying TCP proxy)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
