#!/usr/bin/env python3
"""The fleet evaluation: does VtaxNodeSlowerThanPeers find the node that holds a
job back, soon enough, and keep quiet otherwise?

A local fleet of GROUPS peer groups (the `cluster` label) of NODES vtax agents
each (8 simulated H100s each, InfiniBand ports on fixture counters, the real jitter
probe) remote-writes to one real Prometheus (--web.enable-remote-write-receiver)
that evaluates dashboards/alerts/vtax-rules.yml. After a quiet stretch, each trial
degrades one random node of the whole fleet at a random time by one cause, holds it
HOLD_S seconds and restores it:

  thermal      one GPU thermally throttled    (the simulated GPU's scenarios file)
  hbm          one GPU's HBM at half its clock
  nvlink       one GPU's NVLink hidden
  pcie         one GPU's PCIe link trained down to Gen3 x8
  cpu          a CPU hog (stress-ng --cpu 2) started in the node's cgroup, which
               holds the node to one CPU of quota: the agent's threads wait
  infiniband   one port congested: port_xmit_wait grows by 2e7 ticks/s

Every second it asks Prometheus for the firing alerts. An alert episode (node,
signal) is true when its node is degraded at the time or was within LINGER_S
before (rate windows of a minute outlast a restore); any other is false. A trial
is detected when its node's first true episode fires before the restore plus
LINGER_S; its latency runs from the degradation to that first firing poll.
A peer group is quiet when none of its nodes is degraded or within LINGER_S of a
restore; quiet fleet-hours add up each group's quiet time (so that more groups give
more quiet hours in the same wall time, each group a fleet of NODES), and false
alerts per quiet fleet-hour count the false episodes that start in their group's
quiet time.

At the end of the first quiet stretch it also gives, per signal, how close the
quiet fleet came to alerting: the highest peer z and the share of evaluations over
2 and over 3 (the alert needs over 4 for 15 s).

Prints one line per trial and a summary; --out writes everything as JSON.

Usage: bench/fleet/evaluate.py [--nodes 6] [--groups 1] [--trials 20] [--quiet-secs 600]
       [--hold-secs 60] [--seed N] [--vtax target/release/vtax] [--out FILE]
"""

import argparse
import hashlib
import json
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(REPO, "dashboards", "alerts", "vtax-rules.yml")
IB_FIXTURE = os.path.join(REPO, "tests", "fixtures", "baremetal-node", "sys", "class", "infiniband")
GPUS = 8
ALERT = "VtaxNodeSlowerThanPeers"

# The simulated scenario each GPU cause plays on its one GPU.
GPU_CAUSES = {
    "thermal": "thermal-throttle",
    "hbm": "hbm-degraded",
    "nvlink": "nvlink-hidden",
    "pcie": "pcie-degraded",
}
CAUSES = list(GPU_CAUSES) + ["cpu", "infiniband"]
# The signals that name each cause rightly.
EXPECTED_SIGNALS = {
    "thermal": {"sm_clock_ratio", "clock_throttled_gpus_ratio"},
    "hbm": {"hbm_peak_ratio"},
    "nvlink": {"nvlink_links_up_ratio"},
    "pcie": {"pcie_link_ratio"},
    "cpu": {"jitter_wakeup_p99_seconds", "unexplained_ratio", "run_delay_ratio", "steal_ratio"},
    "infiniband": {"infiniband_xmit_wait_per_second"},
}
CONGESTED_XMIT_WAIT_PER_SECOND = 2e7
# The tables whose series the vtax-peers rules read, and `build` for the
# agents' revision: what each agent remote-writes unless --all-tables. Every
# node of a real fleet has its receiver's CPU to itself; here one Prometheus
# shares the fleet's CPUs, and the series nothing reads cost it the most.
RULE_TABLES = ["gpu", "gpu_clock_event", "jitter", "cpu", "cpu_sched", "infiniband_port", "build"]


def log(msg):
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


class CpuCgroups:
    """One cgroup per node holding it to one CPU of quota (v2's cpu.max, or v1's
    cpu.cfs_quota_us), so that a hog started in it takes the node's own CPU."""

    def __init__(self, name):
        self.root, self.why_not = None, None
        if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            base, self.v2 = "/sys/fs/cgroup", True
        elif os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
            base, self.v2 = "/sys/fs/cgroup/cpu", False
        else:
            self.why_not = "neither cgroup v2 nor v1's cpu hierarchy is mounted"
            return
        root = os.path.join(base, name)
        try:
            if self.v2:
                write(os.path.join(base, "cgroup.subtree_control"), "+cpu")
            os.makedirs(root)
            if self.v2:
                write(os.path.join(root, "cgroup.subtree_control"), "+cpu")
            self.root = root
        except OSError as e:
            self.why_not = f"cannot make {root}: {e}"

    def make(self, node):
        path = os.path.join(self.root, node)
        os.makedirs(path, exist_ok=True)
        if self.v2:
            write(os.path.join(path, "cpu.max"), "100000 100000")
        else:
            write(os.path.join(path, "cpu.cfs_period_us"), "100000")
            write(os.path.join(path, "cpu.cfs_quota_us"), "100000")
        return path

    def remove(self):
        if self.root is None:
            return
        for node in sorted(os.listdir(self.root)):
            path = os.path.join(self.root, node)
            if os.path.isdir(path):
                for _ in range(50):
                    try:
                        os.rmdir(path)
                        break
                    except OSError:
                        time.sleep(0.1)
        try:
            os.rmdir(self.root)
        except OSError:
            pass


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def in_cgroup(cgroup, argv):
    """argv, started inside cgroup when there is one."""
    if cgroup is None:
        return argv
    procs = shlex.quote(os.path.join(cgroup, "cgroup.procs"))
    return ["sh", "-c", f"echo $$ > {procs} && exec {shlex.join(argv)}"]


def free_port():
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    def __init__(self, index, cluster, work, port, prom_port, vtax, cgroups, rng, tables):
        self.name = f"node-{index:02d}"
        self.cluster = cluster
        self.dir = os.path.join(work, self.name)
        self.port = port
        self.scenarios = os.path.join(self.dir, "scenarios")
        self.hog = None
        os.makedirs(os.path.join(self.dir, "sys", "class"))
        shutil.copytree(IB_FIXTURE, os.path.join(self.dir, "sys", "class", "infiniband"), symlinks=True)
        self.ports = []
        ib = os.path.join(self.dir, "sys", "class", "infiniband")
        for device in sorted(os.listdir(ib)):
            for p in sorted(os.listdir(os.path.join(ib, device, "ports"))):
                counters = os.path.join(ib, device, "ports", p, "counters")
                # Ports without the congestion counter (some fixture ports lack
                # it, as some adapters do) are left as they are.
                if os.path.exists(os.path.join(counters, "port_xmit_wait")):
                    self.ports.append(IbPort(counters, rng))
        write(self.scenarios, "training\n")
        config = os.path.join(self.dir, "vtax.toml")
        write(config, f"""\
[web]
listen_address = "127.0.0.1:{port}"

[paths]
sysfs = "{self.dir}/sys"

[store]
node = "{self.name}"

[collectors.gpu]
simulate_gpus = {GPUS}
simulate_scenarios_file = "{self.scenarios}"

[[remote_write]]
name = "fleet"
url = "http://127.0.0.1:{prom_port}/api/v1/write"
external_labels = {{ cluster = "{cluster}", instance = "{self.name}" }}
""" + (f"tables = {json.dumps(tables)}\n" if tables else ""))
        self.cgroup = None
        if cgroups.root:
            try:
                self.cgroup = cgroups.make(self.name)
            except OSError as e:
                log(f"{self.name} runs outside a cgroup of its own: {e}")
        self.log = open(os.path.join(self.dir, "agent.log"), "w")
        self.agent = subprocess.Popen(
            in_cgroup(self.cgroup, [vtax, "run", "--config", config, "--data-dir", os.path.join(self.dir, "data")]),
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def set_gpu(self, gpu, scenario):
        names = ["training"] * GPUS
        names[gpu] = scenario
        write(self.scenarios + ".new", "\n".join(names) + "\n")
        os.replace(self.scenarios + ".new", self.scenarios)

    def start_hog(self):
        if self.cgroup is None:
            raise SystemExit(f"{self.name} has no cgroup to start a CPU hog in")
        self.hog = subprocess.Popen(
            in_cgroup(self.cgroup, ["stress-ng", "--cpu", "2", "--timeout", "0", "--quiet"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop_hog(self):
        if self.hog is not None:
            os.killpg(self.hog.pid, signal.SIGTERM)
            self.hog.wait()
            self.hog = None

    def stop(self):
        self.stop_hog()
        if self.agent.poll() is None:
            os.killpg(self.agent.pid, signal.SIGTERM)
            try:
                self.agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.agent.pid, signal.SIGKILL)
                self.agent.wait()
        self.log.close()


class IbPort:
    """A port's counters, grown in place every second as a busy fabric grows
    them. In place: the collector keeps each file open and reads it again, and
    a replaced file would read as a port that went away."""

    def __init__(self, counters, rng):
        self.counters = counters
        self.rng = rng
        # Healthy ports wait a little, each its own amount.
        self.xmit_wait_per_second = rng.uniform(1e3, 5e4)
        self.data_words_per_second = rng.uniform(2e8, 6e8)
        self.congested = False
        self.values = {}
        for name in ("port_xmit_wait", "port_xmit_data", "port_rcv_data",
                     "port_xmit_packets", "port_rcv_packets"):
            if os.path.exists(os.path.join(counters, name)):
                with open(os.path.join(counters, name)) as f:
                    self.values[name] = int(f.read().strip() or 0)

    def tick(self, seconds):
        noise = lambda: max(0.0, self.rng.gauss(1.0, 0.2))
        wait = self.xmit_wait_per_second * noise()
        if self.congested:
            wait += CONGESTED_XMIT_WAIT_PER_SECOND * noise()
        data = self.data_words_per_second * noise()
        grow = {
            "port_xmit_wait": wait,
            "port_xmit_data": data,
            "port_rcv_data": data * 0.97,
            "port_xmit_packets": data / 1024,
            "port_rcv_packets": data * 0.97 / 1024,
        }
        for name, per_second in grow.items():
            if name not in self.values:
                continue
            self.values[name] += int(per_second * seconds)
            fd = os.open(os.path.join(self.counters, name), os.O_WRONLY)
            try:
                os.pwrite(fd, f"{self.values[name]}\n".encode(), 0)
            finally:
                os.close(fd)


class Prometheus:
    def __init__(self, work, port):
        self.port = port
        # Prometheus reads a copy taken now, and the result names that copy's
        # hash: an edit of the rules while a run goes on changes neither.
        rules = os.path.join(work, "vtax-rules.yml")
        shutil.copyfile(RULES, rules)
        with open(rules, "rb") as f:
            self.rules_sha256 = hashlib.sha256(f.read()).hexdigest()
        config = os.path.join(work, "prometheus.yml")
        write(config, f"""\
global:
  evaluation_interval: 5s
rule_files:
  - {rules}
""")
        self.log = open(os.path.join(work, "prometheus.log"), "w")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb",
             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2)
                return
            except OSError:
                time.sleep(1)
        raise SystemExit("prometheus did not become ready; see " + self.log.name)

    def get(self, path, **params):
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)["data"]

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.get("/api/v1/query", **params)["result"]

    def quiet_margin(self, start, end):
        """Per signal, how close the quiet fleet came to alerting between start
        and end: the highest peer z any node reached, the share of the rules'
        evaluations with a node above 2 and above 3, and the stretches a node
        stayed above 4 by how many evaluations in a row (the alert needs 4:
        over 4 for 15 s at a 5 s interval)."""
        window = f"{max(5, int(end - start))}s"
        z = 'vtax:node_signal:peer_z{cluster=~"eval-.*"}'
        def by_signal(expr):
            return {r["metric"].get("signal"): float(r["value"][1])
                    for r in self.query(expr, at=end)}
        highest = by_signal(f"max by (signal) (max_over_time({z}[{window}]))")
        evaluations = by_signal(f"sum by (signal) (count_over_time({z}[{window}]))")
        over = {level: by_signal(f"sum by (signal) (count_over_time(({z} > {level})[{window}:5s]))")
                for level in (2, 3)}
        stretches = {}
        # An hour at a time: a range query gives at most 11,000 points a series.
        for a in range(int(start), int(end), 3600):
            b = min(end, a + 3600)
            for r in self.get("/api/v1/query_range", query=f"{z} > 4", start=a, end=b, step=5)["result"]:
                counts = stretches.setdefault(r["metric"].get("signal"), {})
                for length, n in stretch_lengths([float(t) for t, _ in r["values"]], 5).items():
                    counts[length] = counts.get(length, 0) + n
        margin = {}
        for signal in sorted(highest):
            count = int(evaluations.get(signal, 0))
            row = {"highest_z": round(highest[signal], 2), "evaluations": count}
            for level in (2, 3):
                row[f"share_over_{level}"] = over[level].get(signal, 0.0) / count if count else None
            row["stretches_over_4"] = dict(sorted(stretches.get(signal, {}).items()))
            margin[signal] = row
        return margin

    def stop(self):
        self.process.terminate()
        self.process.wait()
        self.log.close()


class AlertWatch(threading.Thread):
    """Polls the firing alerts every second; keeps each episode's start and end."""

    def __init__(self, prometheus):
        super().__init__(daemon=True)
        self.prometheus = prometheus
        self.open = {}
        self.episodes = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.poll_errors = 0

    def run(self):
        while not self.stopping.wait(1.0):
            now = time.time()
            try:
                alerts = self.prometheus.get("/api/v1/alerts")["alerts"]
            except (OSError, ValueError):
                self.poll_errors += 1
                continue
            firing = {}
            for a in alerts:
                if a["labels"].get("alertname") == ALERT and a["state"] == "firing":
                    key = (a["labels"].get("instance"), a["labels"].get("signal"))
                    firing[key] = a
            with self.lock:
                for key, a in firing.items():
                    if key not in self.open:
                        self.open[key] = {"node": key[0], "signal": key[1], "start": now,
                                          "pending_since": a.get("activeAt"), "end": None,
                                          "summary": a["annotations"].get("description", "")}
                for key in list(self.open):
                    if key not in firing:
                        episode = self.open.pop(key)
                        episode["end"] = now
                        self.episodes.append(episode)

    def finish(self):
        self.stopping.set()
        self.join()
        with self.lock:
            self.episodes.extend(self.open.values())
            self.open.clear()
            return sorted(self.episodes, key=lambda e: e["start"])


def stretch_lengths(times, step):
    """How many stretches of each length (in samples `step` apart) the sorted
    sample times hold (pure: tested on its own)."""
    counts, run = {}, 0
    for i, t in enumerate(times):
        run = run + 1 if i and abs(t - times[i - 1] - step) < step / 10 else 1
        if i + 1 == len(times) or abs(times[i + 1] - t - step) >= step / 10:
            counts[run] = counts.get(run, 0) + 1
    return counts


def score(trials, episodes, start, end, linger_secs, group_of):
    """Classifies the episodes and scores the trials (pure: tested on its own).
    group_of maps each node to its peer group."""
    def degraded_then(node, at):
        # The latest degradation of the node that had begun by then.
        for t in sorted(trials, key=lambda t: -t["degraded_at"]):
            if t["node"] == node and t["degraded_at"] <= at:
                return t if at <= t["restored_at"] + linger_secs else None
        return None

    for e in episodes:
        trial = degraded_then(e["node"], e["start"])
        e["true"] = trial is not None
        e["trial"] = trials.index(trial) if trial else None
    for i, t in enumerate(trials):
        mine = [e for e in episodes if e["trial"] == i]
        t["detected"] = bool(mine)
        t["latency_secs"] = round(mine[0]["start"] - t["degraded_at"], 1) if mine else None
        t["signals"] = sorted({e["signal"] for e in mine})
        t["named_rightly"] = bool(set(t["signals"]) & EXPECTED_SIGNALS[t["cause"]])
    # A group is quiet when none of its nodes is degraded, and none within
    # linger_secs of its restore.
    groups = sorted(set(group_of.values()))
    busy = {g: sorted((t["degraded_at"], t["restored_at"] + linger_secs)
                      for t in trials if group_of[t["node"]] == g) for g in groups}
    quiet_secs = 0.0
    for g in groups:
        cursor = start
        for a, b in busy[g]:
            quiet_secs += max(0.0, min(a, end) - cursor)
            cursor = max(cursor, b)
        quiet_secs += max(0.0, end - cursor)

    def quiet_at(node, at):
        return not any(a <= at <= b for a, b in busy[group_of[node]])

    false = [e for e in episodes if not e["true"]]
    false_quiet = [e for e in false if quiet_at(e["node"], e["start"])]
    latencies = [t["latency_secs"] for t in trials if t["detected"]]
    true_count = sum(e["true"] for e in episodes)
    quiet_fleet_hours = quiet_secs / 3600.0
    return {
        "nodes": len(group_of),
        "groups": len(groups),
        "trials": len(trials),
        "detected": len(latencies),
        "recall": len(latencies) / len(trials) if trials else None,
        "precision": true_count / len(episodes) if episodes else None,
        "named_rightly": sum(t["named_rightly"] for t in trials),
        "latency_median_secs": statistics.median(latencies) if latencies else None,
        "latency_max_secs": max(latencies) if latencies else None,
        "alert_episodes": len(episodes),
        "false_episodes": len(false),
        "false_episodes_in_quiet_time": len(false_quiet),
        "quiet_fleet_hours": quiet_fleet_hours,
        "false_alerts_per_quiet_fleet_hour":
            len(false_quiet) / quiet_fleet_hours if quiet_fleet_hours else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=6, help="nodes in each peer group")
    ap.add_argument("--groups", type=int, default=1,
                    help="peer groups (cluster label eval-0, eval-1, ...); trials pick a node of any")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--quiet-secs", type=float, default=600, help="quiet stretch before the first trial")
    ap.add_argument("--hold-secs", type=float, default=60, help="how long a degradation lasts")
    ap.add_argument("--gap-secs", type=float, nargs=2, default=(60, 120),
                    help="quiet between a restore and the next degradation, drawn from this range")
    ap.add_argument("--linger-secs", type=float, default=90,
                    help="after a restore, how long its node's alerts still count as true")
    ap.add_argument("--warmup-secs", type=float, default=120)
    ap.add_argument("--causes", default=",".join(CAUSES))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--vtax", default=os.path.join(REPO, "target", "release", "vtax"))
    ap.add_argument("--prometheus-port", type=int, default=0, help="0: a free one")
    ap.add_argument("--agent-port", type=int, default=0,
                    help="the first agent's port, the next ones after it; 0: a free one each")
    ap.add_argument("--all-tables", action="store_true",
                    help="remote-write every exported table, not only those the rules read")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    causes = args.causes.split(",")
    for c in causes:
        if c not in CAUSES:
            raise SystemExit(f"unknown cause {c!r} (one of {', '.join(CAUSES)})")
    if args.nodes < 4:
        raise SystemExit("--nodes: at least 4 (the rules need 3 peers besides the slow one)")
    if args.groups < 1:
        raise SystemExit("--groups: at least 1")
    if not os.access(args.vtax, os.X_OK):
        raise SystemExit(f"{args.vtax}: not built (cargo build --release -p vtax)")

    if "cpu" in causes and args.groups > 1:
        # The hog takes one CPU of the machine, and every other node on it pays
        # too: with six groups of six on two vCPUs the hogged node's peers read
        # a wake-up p99 of 7-38 ms, and two hogs of three went unseen
        # (docs/benchmarks.md).
        log("cause cpu with several groups: the other nodes share this machine's CPUs, "
            "so a hog slows them too; run it with one group where CPUs are few")
    work = tempfile.mkdtemp(prefix="vtax-fleet-eval-")
    cgroups = CpuCgroups(os.path.basename(work))
    if "cpu" in causes and cgroups.root is None:
        log(f"cause cpu left out: {cgroups.why_not}")
        causes.remove("cpu")
    prometheus, nodes, watch = None, [], None
    stop_ticks = threading.Event()
    try:
        prometheus_port = args.prometheus_port or free_port()
        prometheus = Prometheus(work, prometheus_port)
        for i in range(args.nodes * args.groups):
            port = args.agent_port + i if args.agent_port else free_port()
            cluster = f"eval-{i // args.nodes}"
            nodes.append(Node(i, cluster, work, port, prometheus_port, args.vtax, cgroups, rng,
                              None if args.all_tables else RULE_TABLES))
            # Apart, so that the simulated GPUs' slow wobble is not in step.
            time.sleep(rng.uniform(0.5, 5.0))

        def grow_counters():
            last = time.monotonic()
            while not stop_ticks.wait(1.0):
                now = time.monotonic()
                for n in nodes:
                    for p in n.ports:
                        p.tick(now - last)
                last = now
        threading.Thread(target=grow_counters, daemon=True).start()

        log(f"{len(nodes)} agents in {args.groups} peer groups, Prometheus on :{prometheus_port}, work in {work}, seed {seed}")
        time.sleep(args.warmup_secs)
        for n in nodes:
            if n.agent.poll() is not None:
                raise SystemExit(f"{n.name} exited; see {n.log.name}")
        seen = prometheus.query('count(vtax:node_peer_z:worst{cluster=~"eval-.*"})')
        log(f"after warm-up: {seen[0]['value'][1] if seen else 0} nodes with a peer z")
        watch = AlertWatch(prometheus)
        watch.start()
        start = time.time()
        margin = None
        if args.quiet_secs > 0:
            log(f"quiet for {args.quiet_secs:.0f} s")
            time.sleep(args.quiet_secs)
            margin = prometheus.quiet_margin(start, time.time())
            for signal, row in margin.items():
                log(f"quiet margin {signal:32} highest z {row['highest_z']:6.2f}, "
                    f"over 2: {row['share_over_2']:.2e}, over 3: {row['share_over_3']:.2e} "
                    f"of {row['evaluations']} evaluations; over 4, evaluations in a row: "
                    f"{row['stretches_over_4'] or 'none'}")
        # Every cause about as often, in a random order.
        plan = [causes[i % len(causes)] for i in range(args.trials)]
        rng.shuffle(plan)
        trials = []
        for i, cause in enumerate(plan):
            if i > 0:
                time.sleep(rng.uniform(*args.gap_secs))
            node = rng.choice(nodes)
            trial = {"cause": cause, "node": node.name}
            if cause in GPU_CAUSES:
                trial["gpu"] = rng.randrange(GPUS)
                node.set_gpu(trial["gpu"], GPU_CAUSES[cause])
            elif cause == "cpu":
                node.start_hog()
            else:
                port = rng.choice(node.ports)
                trial["port"] = os.path.relpath(os.path.dirname(port.counters), node.dir)
                port.congested = True
            trial["degraded_at"] = time.time()
            time.sleep(args.hold_secs)
            if cause in GPU_CAUSES:
                node.set_gpu(trial["gpu"], "training")
            elif cause == "cpu":
                node.stop_hog()
            else:
                port.congested = False
            trial["restored_at"] = time.time()
            trials.append(trial)
            with watch.lock:
                now_firing = [e for e in watch.open.values() if e["node"] == node.name]
            first = min((e["start"] for e in now_firing), default=None)
            log(f"trial {i + 1:2}/{len(plan)}: {cause:10} on {node.name} ({node.cluster}): "
                + (f"alert after {first - trial['degraded_at']:.1f} s ({', '.join(e['signal'] for e in now_firing)})"
                   if first else "no alert firing at the restore"))
        # Let the last trial's alerts resolve before the books close.
        time.sleep(args.linger_secs)
        end = time.time()
        episodes = watch.finish()
        group_of_node = {n.name: n.cluster for n in nodes}
        result = score(trials, episodes, start, end, args.linger_secs, group_of_node)
        # The agents write their build row once, at start.
        built = prometheus.query(
            'count by (revision) (last_over_time(vtax_build_info{cluster=~"eval-.*"}[1w]))')
        revisions = sorted(r["metric"].get("revision", "unknown") for r in built)
        rules_sha256 = prometheus.rules_sha256
        result.update({"seed": seed, "hold_secs": args.hold_secs, "causes": causes,
                       "poll_errors": watch.poll_errors, "quiet_margin": margin,
                       # What the figures hold for: runs add up only where these match.
                       "vtax_revisions": revisions, "rules_sha256": rules_sha256})
        for e in episodes:
            if not e["true"]:
                log(f"false alert: {e['node']} ({group_of_node[e['node']]}) {e['signal']} "
                    f"at +{e['start'] - start:.0f} s: {e['summary']}")
        for cause in causes:
            mine = [t for t in trials if t["cause"] == cause]
            lat = [t["latency_secs"] for t in mine if t["detected"]]
            log(f"{cause:10}: {len(lat)}/{len(mine)} detected, latencies {lat}, "
                f"named rightly {sum(t['named_rightly'] for t in mine)}/{len(mine)}")
        print(json.dumps(result, indent=2))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"summary": result, "trials": trials, "episodes": episodes}, f, indent=2)
        if watch.poll_errors:
            log(f"{watch.poll_errors} polls of Prometheus failed")
    finally:
        stop_ticks.set()
        if watch is not None and watch.is_alive():
            watch.finish()
        for n in nodes:
            n.stop()
        if prometheus is not None:
            prometheus.stop()
        cgroups.remove()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
