"""Servers on 127.0.0.1 for the remote benchmarks: Debian's `docker-registry`, a static
web server with range requests, and a TCP proxy that adds latency; plus the check for
the kernel's netem, which the proxy stands in for where it is missing."""

import collections
import contextlib
import fcntl
import gzip
import http.client
import os
import socket
import subprocess
import threading
import time

# Python's own range-capable static server (as crates/verilay/tests/registry.rs's STATIC):
# `python3 -c STATIC PORT ROOT` serves ROOT's files, answering `Range: bytes=A-B` with 206.
STATIC = r'''
import http.server, os, re, sys
port, root = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def serve(self, head):
        path = os.path.join(root, self.path.lstrip("/"))
        if not os.path.isfile(path):
            self.send_response(404); self.send_header("Content-Length", "0")
            self.end_headers(); return
        size = os.path.getsize(path)
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        start, end = (int(m[1]), min(int(m[2] or size - 1), size - 1)) if m else (0, size - 1)
        self.send_response(206 if m else 200)
        if m: self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1)); self.end_headers()
        if not head:
            with open(path, "rb") as f:
                f.seek(start); self.wfile.write(f.read(end - start + 1))
    def do_GET(self): self.serve(False)
    def do_HEAD(self): self.serve(True)
class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
    def handle_error(self, *a): pass  # a client that hangs up is not news
S(("127.0.0.1", port), H).serve_forever()
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(port, path):
    """The status of `GET path` on 127.0.0.1:port, or None if nothing answers."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", path)
        status = c.getresponse().status
        c.close()
        return status
    except OSError:
        return None


class Server:
    """A child process serving HTTP on 127.0.0.1:port; `stop()` ends it (also on error:
    use it as a context manager)."""

    def __init__(self, argv, port, log, probe="/"):
        self.port = port
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + 20
        while http_status(port, probe) is None:
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"{argv[0]} did not start on port {port} (log: {log})")
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def registry(binary, root):
    """Debian's docker-registry (CNCF distribution) storing in root/data, on a free port."""
    port = free_port()
    config = os.path.join(root, "config.yml")
    with open(config, "w") as f:
        f.write(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
                f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
    return Server([binary, "serve", config], port, os.path.join(root, "log"), probe="/v2/")


def static_server(root, log):
    """Python's http.server with range requests, serving root's files."""
    port = free_port()
    return Server(["/usr/bin/python3", "-c", STATIC, str(port), root], port, log)


def tcp_window():
    """The largest TCP receive window Linux's autotuning may give a socket here
    (net.ipv4.tcp_rmem's maximum), 6 MiB if it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/tcp_rmem") as f:
            return int(f.read().split()[2])
    except (OSError, IndexError, ValueError):
        return 6 << 20


def netem_check():
    """(available, evidence): whether `tc ... netem` works here, tried on the loopback of
    a new network namespace (the host's own is left alone), with the kernel config's
    CONFIG_NET_SCH_NETEM line when /proc/config.gz has one."""
    evidence = []
    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            evidence += [line.strip() for line in f if "CONFIG_NET_SCH_NETEM" in line]
    except OSError:
        pass
    cmd = "ip link set lo up && tc qdisc add dev lo root netem delay 5ms"
    try:
        out = subprocess.run(["unshare", "--net", "sh", "-c", cmd], capture_output=True,
                             text=True, timeout=20)
        ok = out.returncode == 0
        said = (out.stderr.strip() or "ok").splitlines()[-1]
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, said = False, str(e)
    evidence.append(f"`unshare --net sh -c '{cmd}'`: {said}")
    return ok, evidence


class DelayProxy:
    """A TCP proxy on 127.0.0.1 in front of 127.0.0.1:upstream_port that holds every chunk
    of bytes for rtt/2 in each direction before passing it on: a one-way delay as netem
    adds, order kept and reading never stalled by it, so a stream flows at full speed and
    only each exchange waits (a request and its answer cost one RTT). A connection's first
    bytes towards the server wait one RTT more: the TCP handshake a real link costs before
    a client can send. Bytes in flight per direction are capped at the host's largest TCP
    receive window (tcp_rmem's maximum, what autotuning may grow one to), so a stream
    moves at most that much per RTT, as over a real link once slow start is over (slow
    start itself is not modelled).
    Each chunk waits in a pipe of its own, moved in and out with splice(2): the bytes
    never pass through Python, so the proxy takes little of the CPUs that the clients it
    measures use (a copying proxy took about 1 CPU-s per GB on this host, which a link with
    netem would not). The way up is read (it is small), to count requests.
    Counts, since `reset()`: connections, bytes each way and HTTP requests (request lines
    seen going up). Threads per connection; `rtt` may be changed between runs (a
    connection keeps the one it opened with); `close()` ends it."""

    CHUNK = 1 << 20

    def __init__(self, upstream_port, rtt=0.0):
        self.upstream_port, self.rtt = upstream_port, rtt
        self.window = tcp_window()
        self.lock = threading.Lock()
        self.reset()
        self.socks = set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def reset(self):
        with self.lock:
            self.counts = {"connections": 0, "requests": 0, "bytes_up": 0, "bytes_down": 0}

    def _count(self, key, n):
        with self.lock:
            self.counts[key] += n

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(client,), daemon=True).start()

    def _client(self, client):
        opened, rtt = time.monotonic(), self.rtt
        self._count("connections", 1)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        except OSError:
            client.close()
            return
        pair = (client, upstream)
        with self.lock:
            self.socks.update(pair)
        for s in pair:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up = threading.Thread(target=self._pipe,
                              args=(client, upstream, rtt / 2, opened + rtt, "up"), daemon=True)
        up.start()
        self._pipe(upstream, client, rtt / 2, 0.0, "down")
        up.join()
        with self.lock:
            self.socks.difference_update(pair)
        for s in pair:
            s.close()

    def _pipe(self, src, dst, delay, not_before, way):
        """Moves src's bytes to dst, each chunk delivered `delay` after it was read (and not
        before `not_before` + delay), at most a window's bytes in flight; a broken end
        closes the other."""
        held, lines = [0, False], collections.deque()
        ready = threading.Condition()

        def deliver():
            broken = False
            while True:
                with ready:
                    while not lines and not held[1]:
                        ready.wait()
                    if not lines:
                        break
                    at, r, w, n = lines.popleft()
                if (wait := at - time.monotonic()) > 0:
                    time.sleep(wait)
                left = n
                while left and not broken:
                    try:
                        moved = os.splice(r, dst.fileno(), left)
                    except OSError:
                        moved = 0
                    if moved == 0:
                        broken = True
                        with contextlib.suppress(OSError):
                            src.shutdown(socket.SHUT_RDWR)
                    left -= moved
                os.close(r)
                os.close(w)
                with ready:
                    held[0] -= n
                    ready.notify_all()
            if not broken:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=deliver, daemon=True)
        sender.start()
        while True:
            with ready:
                while held[0] >= self.window:
                    ready.wait()
            r, w = os.pipe()
            with contextlib.suppress(OSError):
                fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, self.CHUNK)
            # What the pipe holds, so that filling it never waits for its reader.
            room = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
            try:
                if way == "up":
                    data = src.recv(room)
                    self._count("requests", data.count(b" HTTP/1.1\r\n"))
                    n = os.write(w, data) if data else 0
                else:
                    n = os.splice(src.fileno(), w, room)
            except OSError:
                n = 0
            if n == 0:
                os.close(r)
                os.close(w)
                break
            self._count(f"bytes_{way}", n)
            with ready:
                lines.append((max(time.monotonic(), not_before) + delay, r, w, n))
                held[0] += n
                ready.notify_all()
        with ready:
            held[1] = True
            ready.notify_all()
        sender.join()

    def close(self):
        self.listener.close()
        with self.lock:
            socks = list(self.socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
