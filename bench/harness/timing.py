"""Running commands under a stopwatch, and dropping caches between cold runs."""

import os
import statistics
import subprocess
import tempfile
import time


class CommandFailed(Exception):
    pass


def drop_caches(what=3):
    """Write back dirty pages, then drop the page cache, dentries and inodes (`what` as
    /proc/sys/vm/drop_caches takes it: 3 all of them, 2 dentries and inodes only).

    Returns None on success, or the reason it could not (it needs root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(f"{what}\n")
    except OSError as e:
        return f"cannot drop caches: {e.strerror}"
    return None


def machine_cpu_s():
    """CPU seconds every CPU of the machine has spent busy since boot (user, nice, system,
    irq and softirq time from /proc/stat; idle, iowait and a virtual machine's steal time
    are not this machine's work): the difference over a run is what every process and
    kernel thread together took, the daemons serving a mount included. None where
    /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def usable_cpus():
    """The CPUs this process may run on (its affinity), which its children share."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def timed(argv, cwd=None):
    """Seconds argv takes (its output discarded), after os.sync() so that writeback left
    by whatever ran before is not charged to it."""
    os.sync()
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def run_once(argv, env=None):
    """Run argv once and return one sample: wall, user and system seconds, peak RSS.

    os.sync() first, so writeback left over from the previous run is not charged
    to this one. stdout is discarded; stderr is kept for the error message."""
    os.sync()
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
        # wait4 instead of proc.wait(): it also gives this child's own rusage.
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-5:]
            raise CommandFailed(f"{' '.join(argv)}: exit status {proc.returncode}"
                                + "".join(f"\n    {line}" for line in tail))
    return {"wall_s": wall, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
            "maxrss_kib": ru.ru_maxrss}


def summarize(samples, key="wall_s"):
    """Median, min and max of one field over a list of samples."""
    values = [s[key] for s in samples]
    return {"median": statistics.median(values), "min": min(values),
            "max": max(values), "n": len(values)}
