#!/usr/bin/env python3
"""CPU time per sample and resident memory: vtax beside prometheus-node-exporter.

Both run at the same time on this machine and are scraped once a second by the
same scraper (gzip, text format, as Prometheus does).

The heavy configuration (the default here; bars: CPU per sample at most 0.2 of
node_exporter's, resident memory under 30 MB): vtax runs the host,
cgroups and infiniband collectors at 1 s with 50 real cgroups (created under
the cgroup v1 or v2 hierarchy for the run, each holding one task: 10 run a
little every 200 ms, the rest sleep, as most services on a node do in any
given second) and 8 InfiniBand ports (the
baremetal-node fixture: this machine has no HCA). node_exporter runs with its
defaults. After a warm-up, each process's CPU time (utime + stime from
/proc/<pid>/stat) over the window is divided by the samples it exposed:
node_exporter's per scraped sample, vtax's per exported sample.

--defaults (bar: the whole agent's CPU at most 0.3 of node_exporter's): vtax
runs with no config file on this machine as it is, every collector that finds
its source, the jitter probe included; no cgroups or fixture are made. The
figure is each process's CPU time over the window, whatever it exported.
--vtax-arg passes a flag on (e.g. --no-collector.jitter, to see one part).

Usage: bench/agent/cpu_vs_node_exporter.py [--seconds 120] [--busy 10] [--vtax target/release/vtax] [--seed-day]
       bench/agent/cpu_vs_node_exporter.py --defaults [--seconds 120] [--vtax-arg=--no-collector.jitter]
Needs prometheus-node-exporter installed, and root for the heavy configuration
(to create cgroups).
"""
import argparse
import atexit
import glob
import gzip
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HZ = os.sysconf("SC_CLK_TCK")
CGROUP_COUNT = 50


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

# The agent's collectors, each with a --no-collector.<name> flag.
COLLECTORS = ["host", "cgroups", "perf", "infiniband", "platform", "gpu", "jitter",
              "block", "netdev", "filesystem", "scrape"]


def only_collector(name):
    """The flags that leave `name` the agent's one collector."""
    return [f"--no-collector.{c}" for c in COLLECTORS if c != name]


def start_vtax_run(vtax, args):
    """`vtax run ARGS` on a port of its own choosing: the process and the
    address it listens on, once its log says it. Its stderr is drained from
    then on, so that the agent never blocks on a full pipe."""
    proc = subprocess.Popen([vtax, "run", "--web.listen-address", "127.0.0.1:0", *args],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"listen_address=(\S+)", line)
        if m:
            subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)
            return proc, m.group(1)
    sys.exit(f"{vtax} run {' '.join(args)} did not start")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def thread_cpu_seconds(pid):
    """CPU seconds per thread name (collector-cgroups, renderer, web, vtax = main).

    From each thread's schedstat (the scheduler's runtime in nanoseconds)
    where the kernel has it; utime + stime come in clock ticks, 10 ms each,
    too coarse to tell a thread's 1.5 from its 1.6 ms a second in two minutes."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                name = f.read().strip()
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    seconds = int(f.read().split()[0]) / 1e9
            except FileNotFoundError:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                seconds = (int(fields[11]) + int(fields[12])) / HZ
        except OSError:
            continue  # the thread ended between listing and reading
        out[name] = out.get(name, 0.0) + seconds
    return out


def memory_kib(pid, keys=("VmRSS", "VmHWM")):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in keys:
                out[key] = int(value.split()[0])
    return out


class PeakParts(threading.Thread):
    """Polls the agent's resident size every 20 ms and keeps the split of the
    largest sample: anonymous memory (heap, stacks, written pages) against the
    pages of files it maps (its own binary and the libraries)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = None
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.02):
            try:
                now = memory_kib(self.pid, ("VmRSS", "RssAnon", "RssFile"))
            except OSError:
                return
            if self.peak is None or now["VmRSS"] > self.peak["VmRSS"]:
                self.peak = now


def scrape(port):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept-Encoding": "gzip", "Accept": "text/plain;version=0.0.4"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))


def make_cgroups(root):
    """Creates CGROUP_COUNT cgroups under vtax-bench in every writable hierarchy.

    Returns the directories made (parents first) and, per cgroup, its
    directories across the hierarchies."""
    made = []
    unified = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    hierarchies = ["/sys/fs/cgroup"] if unified else [
        f"/sys/fs/cgroup/{c}" for c in ("cpu", "cpuacct", "memory", "unified")
        if os.path.isdir(f"/sys/fs/cgroup/{c}")]
    jobs = [[] for _ in range(CGROUP_COUNT)]
    for h in hierarchies:
        base = os.path.join(h, root)
        os.makedirs(base, exist_ok=True)
        made.append(base)
        for i in range(CGROUP_COUNT):
            path = os.path.join(base, f"job{i:02d}")
            os.makedirs(path, exist_ok=True)
            made.append(path)
            jobs[i].append(path)
    return made, jobs


# A service that wakes five times a second and does a little work.
TICKER = "import time\nwhile True:\n    time.sleep(0.2)\n    sum(range(20000))\n"


def populate(jobs, busy):
    """Puts one task in each cgroup, as on a real node where most services sleep
    in any given second: the first `busy` run a little every 200 ms, the rest
    sleep. Returns the processes."""
    procs = []
    for i, dirs in enumerate(jobs):
        argv = [sys.executable, "-c", TICKER] if i < busy else ["sleep", "infinity"]
        p = subprocess.Popen(argv)
        for d in dirs:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(p.pid))
        procs.append(p)
    return procs


def bench_sysfs(parent):
    """A sysfs root for vtax: the real cgroup filesystem, the fixture's 8 HCA ports.

    It lives under `parent`, in RAM as sysfs does: this VM keeps little page cache
    and drops it every few seconds, so a copy on disk would charge the collector
    disk reads that no sysfs read makes."""
    sysfs = os.path.join(tempfile.mkdtemp(prefix="vtax-bench-sys-", dir=parent), "sys")
    os.makedirs(os.path.join(sysfs, "fs"))
    os.makedirs(os.path.join(sysfs, "class"))
    os.symlink("/sys/fs/cgroup", os.path.join(sysfs, "fs", "cgroup"))
    shutil.copytree(os.path.join(REPO, "tests/fixtures/baremetal-node/sys/class/infiniband"),
                    os.path.join(sysfs, "class", "infiniband"), symlinks=True)
    return sysfs


def write_bar_config(work, cgroup_root, extra=""):
    """Writes the bar's vtax.toml into `work`; returns its path."""
    config = os.path.join(work, "vtax.toml")
    with open(config, "w") as f:
        f.write(
            "[collectors.host]\ninterval_secs = 1\n"
            f"[collectors.cgroups]\ninterval_secs = 1\ninclude = ['^/{cgroup_root}/job']\n"
            "[collectors.infiniband]\ninterval_secs = 1\n"
            # The bar's configuration is these three collectors; the others
            # (the jitter probe above all, which spins a CPU by design) are
            # off. The detector stays on: it is part of every agent.
            + "".join(f"[collectors.{name}]\nenabled = false\n" for name in (
                "platform", "perf", "gpu", "jitter", "block", "netdev", "filesystem"))
            + extra
        )
    return config


def seed_day(data_dir):
    """Writes yesterday's day of the `cgroup` table for 50 cgroups into `data_dir`,
    through the agent's seed_day example, with the agent's own store options."""
    subprocess.run(
        ["cargo", "run", "-q", "--release", "-p", "vtax", "--example", "seed_day", "--", data_dir],
        cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def frozen_copy(binary, seeding):
    """The binary to run: a copy when `seeding` will replace it (the caller deletes
    it). Seeding runs `cargo run --release --example seed_day` in the same target
    directory, with the dev-dependencies' features: the copy keeps the binary
    measured apart from whatever that build writes. Other paths are kept, so that a
    profiler's output still names the caller's file."""
    cargo_binary = os.path.realpath(os.path.join(REPO, "target/release/vtax"))
    if not seeding or os.path.realpath(binary) != cargo_binary:
        return binary
    copy = os.path.join(tempfile.mkdtemp(prefix="vtax-bench-bin-"), "vtax")
    shutil.copy(binary, copy)
    return copy


def remove_frozen_copy(binary, original):
    if binary != original:
        shutil.rmtree(os.path.dirname(binary), ignore_errors=True)


def clean_up_at_exit(data_dir, binary, original, keep_store):
    """However the script ends (a failed check's sys.exit, an exception, ^C), removes
    the store (a seeded one is 350 MB) unless keep_store, and the binary's copy."""
    def clean_up():
        if not keep_store:
            shutil.rmtree(data_dir, ignore_errors=True)
        remove_frozen_copy(binary, original)
    atexit.register(clean_up)


def seeded_day_dir(data_dir):
    """The seeded day's partition: it sorts first. One file left there means it merged."""
    return sorted(glob.glob(os.path.join(data_dir, "tables", "cgroup", "date=*")))[0]


def tear_down(tasks, sysfs, cgroups):
    """Stops the cgroups' tasks, removes the sysfs root and the cgroups."""
    for p in tasks:
        p.kill()
        p.wait()
    if sysfs:
        shutil.rmtree(os.path.dirname(sysfs), ignore_errors=True)
    for path in reversed(cgroups):
        try:
            os.rmdir(path)
        except OSError:
            pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--busy", type=int, default=10,
                        help="cgroups whose task runs every 200 ms (the others' task sleeps)")
    parser.add_argument("--vtax", default=os.path.join(REPO, "target/release/vtax"))
    parser.add_argument("--sysfs-parent", default="/dev/shm",
                        help="where the fixture sysfs tree goes (a RAM filesystem, as sysfs is)")
    parser.add_argument("--seed-day", action="store_true",
                        help="seed vtax's store with yesterday's 24 hours of a 50-cgroup table, so that "
                             "its first compaction pass (5 minutes in) is a day merge; run --seconds 420 or more")
    parser.add_argument("--keep-store", action="store_true",
                        help="keep vtax's store in the work dir (a seeded one is 350 MB)")
    parser.add_argument("--node-exporter", default=shutil.which("prometheus-node-exporter") or shutil.which("node_exporter"))
    parser.add_argument("--defaults", action="store_true",
                        help="run vtax with no config file on this machine as it is; "
                             "compare the whole agent's CPU with node_exporter's")
    parser.add_argument("--vtax-arg", action="append", default=[],
                        help="one more flag for `vtax run` (repeatable)")
    args = parser.parse_args()
    if not args.node_exporter:
        sys.exit("prometheus-node-exporter is not installed (apt-get install prometheus-node-exporter)")
    if args.defaults and args.seed_day:
        sys.exit("--seed-day seeds the heavy configuration's cgroup table; not with --defaults")

    work = tempfile.mkdtemp(prefix="vtax-bench-")
    vtax_binary = frozen_copy(args.vtax, args.seed_day)
    clean_up_at_exit(os.path.join(work, "data"), vtax_binary, args.vtax, args.keep_store)
    vtax_port, ne_port = free_port(), free_port()
    argv = [vtax_binary, "run", "--data-dir", os.path.join(work, "data"),
            "--web.listen-address", f"127.0.0.1:{vtax_port}"]
    if args.defaults:
        sysfs, busy, cgroups, tasks = None, 0, [], []
    else:
        sysfs = bench_sysfs(args.sysfs_parent)
        busy = min(args.busy, CGROUP_COUNT)
        cgroups, jobs = make_cgroups("vtax-bench")
        tasks = populate(jobs, busy)
        argv += ["--config", write_bar_config(work, "vtax-bench"), "--path.sysfs", sysfs]
        if args.seed_day:
            seed_day(os.path.join(work, "data"))
    vtax = subprocess.Popen(argv + args.vtax_arg, stderr=open(os.path.join(work, "vtax.log"), "w"))
    ne = subprocess.Popen(
        [args.node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"],
        stderr=open(os.path.join(work, "node_exporter.log"), "w"))
    try:
        time.sleep(2)
        for _ in range(args.warmup):
            scrape(vtax_port), scrape(ne_port)
            time.sleep(1)
        start = {p.pid: cpu_seconds(p.pid) for p in (vtax, ne)}
        threads_start = thread_cpu_seconds(vtax.pid)
        peak_kib = 0
        peaks = []
        peak_parts = PeakParts(vtax.pid)
        peak_parts.start()
        samples = {vtax.pid: 0, ne.pid: 0}
        scrapes = 0
        t0 = time.monotonic()
        next_tick = t0
        while time.monotonic() - t0 < args.seconds:
            samples[vtax.pid] += scrape(vtax_port)
            samples[ne.pid] += scrape(ne_port)
            scrapes += 1
            hwm = memory_kib(vtax.pid)["VmHWM"]
            if hwm > peak_kib + 1024:  # rises of a MiB or more
                peak_kib = hwm
                peaks.append((time.monotonic() - t0, hwm))
            next_tick += 1
            time.sleep(max(0.0, next_tick - time.monotonic()))
        wall = time.monotonic() - t0
        peak_parts.done.set()
        peak_parts.join()
        used = {pid: cpu_seconds(pid) - start[pid] for pid in start}
        threads_end = thread_cpu_seconds(vtax.pid)
        mem = memory_kib(vtax.pid)
        ne_mem = memory_kib(ne.pid)
    finally:
        for p in (vtax, ne):
            p.send_signal(signal.SIGTERM)
        for p in (vtax, ne):
            p.wait(timeout=30)
        tear_down(tasks, sysfs, cgroups)
    v_per = used[vtax.pid] / samples[vtax.pid]
    n_per = used[ne.pid] / samples[ne.pid]
    if args.defaults:
        print(f"window_s={wall:.0f} scrapes={scrapes} vtax on defaults, no config file"
              + "".join(f" {a}" for a in args.vtax_arg))
    else:
        print(f"window_s={wall:.0f} scrapes={scrapes} cgroups={CGROUP_COUNT} "
              f"(a task running every 200 ms in {busy}, a sleeping one in the rest)")
    print(f"vtax:          cpu_s={used[vtax.pid]:.3f} samples_exported={samples[vtax.pid]} "
          f"({samples[vtax.pid] / scrapes:.0f}/scrape) cpu_us_per_sample={v_per * 1e6:.3f} "
          f"rss_mib={mem['VmRSS'] / 1024:.1f} peak_rss_mib={mem['VmHWM'] / 1024:.1f}")
    print(f"node_exporter: cpu_s={used[ne.pid]:.3f} samples_scraped={samples[ne.pid]} "
          f"({samples[ne.pid] / scrapes:.0f}/scrape) cpu_us_per_sample={n_per * 1e6:.3f} "
          f"rss_mib={ne_mem['VmRSS'] / 1024:.1f}")
    if args.defaults:
        print(f"ratio vtax/node_exporter, whole process CPU: "
              f"{used[vtax.pid] / used[ne.pid]:.3f} (bar: <= 0.300)")
    else:
        print(f"ratio vtax/node_exporter per sample: {v_per / n_per:.3f} (bar: <= 0.200); "
              f"peak resident {mem['VmHWM'] * 1024 / 1e6:.1f} MB (bar: < 30 MB)")
    per_thread = sorted(
        ((name, threads_end[name] - threads_start.get(name, 0.0)) for name in threads_end),
        key=lambda t: -t[1])
    print("vtax per thread, ms of CPU per second: " + ", ".join(
        f"{name} {1000 * cpu / wall:.2f}" for name, cpu in per_thread))
    print("vtax peak resident rises (s into the window, MiB): " + ", ".join(
        f"{t:.0f}s {kib / 1024:.1f}" for t, kib in peaks))
    if peak_parts.peak:
        p = peak_parts.peak
        print(f"vtax largest sample (every 20 ms): {p['VmRSS'] / 1024:.1f} MiB = anonymous "
              f"{p['RssAnon'] / 1024:.1f} + file-backed {p['RssFile'] / 1024:.1f}")
    if args.seed_day:
        seeded_day = seeded_day_dir(os.path.join(work, "data"))
        left = len(glob.glob(os.path.join(seeded_day, "*.parquet")))
        print(f"seeded day: {left} file(s) left in {seeded_day} (1 once the day merge ran)")
    print(f"work dir (logs): {work}")


if __name__ == "__main__":
    main()
