#!/usr/bin/env python3
"""Noisy-neighbour detection, evaluated on this machine with real antagonists.

The agent runs on its defaults (every collector, the detector with 5 s windows,
events after 3 abnormal windows) over this machine's real /proc and cgroups.
Workloads each get their own cgroup under /vtax-eval in every mounted
hierarchy (cgroup v2, or v1 cpu, cpuacct and memory plus the unified PSI tree
of a hybrid system):

  victim   stress-ng --cpu 1 --cpu-load 50 pinned to CPU 0 (the workload that suffers)
  steady   stress-ng --cpu 1 --cpu-load 15 pinned to the last CPU (a neighbour that never changes)
  decoy    a neighbour that switches between 5% and 40% of a CPU at random,
           every 5 to 25 s, so a ranking by "whatever changed" would be wrong

After --warmup seconds, trials run one antagonist at a time, each in its own
cgroup, for --attack seconds, then --gap seconds of quiet:

  cpu      stress-ng --cpu 1 pinned to CPU 0: a CPU hog on the victim's CPU
  stream   stress-ng --stream 1: memory bandwidth
  cache    stress-ng --cache 1: last-level cache thrash
  io       stress-ng --hdd 1 with direct I/O: block I/O

Then --quiet-minutes with no antagonist at all. The agent's log says when each
event opened, its resource, victim and top suspect ("Noisy-neighbour event
opened."). Per trial: detected when an event opened between 10 s after the
antagonist's start (the least time three abnormal 5 s windows take; an event
opened sooner was abnormal before the antagonist began) and its end; latency
from the start; ranked first when the first such event that names a suspect
names the antagonist's cgroup. False events: every event opened outside
[start + 10 s, end + 45 s) of a trial (the tail lets events that began under
the antagonist close), counted per hour of the time outside [start, end + 45 s).
Bars (issue 6): detected within 30 s; ranked first in >= 90% of trials; at most
one false event per hour of quiet running.

Host events: the detector names the hypervisor as a CPU suspect when the guest's
steal time moves with the victim signal. Steal is the host running someone else
on our vCPUs, a real neighbour the harness did not inject. The harness reads
/proc/stat itself every second, and an event outside the trials that names the
hypervisor counts as a host event, not a false one, only when the harness's own
reading shows the host took at least HOST_STEAL_MIN of the CPUs' time over the
15 s (three windows) before the event opened. Host events are reported apart,
with that reading.

Usage: sudo bench/detect/eval.py [--vtax target/release/vtax] [--trials 3] [--keep --out results.json]

Replaying a kept run through another detector configuration or build, and
scoring what it opens against the same trials:

  vtax replay-detector --data-dir <kept>/data --since <judged_from - warm-up> \
      --until <finished> [--config vtax.toml] > replayed.jsonl
  bench/detect/eval.py --rescore results.json --events replayed.jsonl \
      [--data-dir <kept>/data: steal for runs from before the harness read it]
Needs: root (cgroups), stress-ng (apt-get install stress-ng).
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = "vtax-eval"
TAIL_SECS = 45
# The detector opens an event on its third abnormal 5 s window in a row, so
# an event opened less than two windows after an antagonist started was
# abnormal before it: it cannot be that antagonist's doing.
CAUSAL_SECS = 10
# What the harness's own /proc/stat reading must show for an event that
# names the hypervisor to count as the host's doing: 3% of the CPUs' time
# stolen over the three windows before it opened (a few times this VM's
# usual 0-1%).
HOST_STEAL_MIN = 0.03
HOST_SUSPECT = "hypervisor"
OPENED = re.compile(
    r"^(\S+)\s+WARN\s.*Noisy-neighbour event opened\..*?resource=\"?(\w+)\"?\s+victim=(\S+)\s+signal=\"?(\w+)\"?\s+suspect=\"?([^\"\s]+)\"?"
)


def hierarchies():
    """Directories under which a cgroup must be created: v2 or v1's cpu, cpuacct, memory, and unified."""
    found = []
    with open("/proc/mounts") as f:
        for line in f:
            _, path, fstype, options = line.split()[:4]
            opts = options.split(",")
            if fstype == "cgroup2":
                found.append(path)
            elif fstype == "cgroup" and any(c in opts for c in ("cpu", "cpuacct", "memory")):
                found.append(path)
    if not found:
        sys.exit("no cgroup hierarchy mounted")
    return sorted(set(found))


def create(name):
    for h in hierarchies():
        os.makedirs(os.path.join(h, ROOT, name), exist_ok=True)


def procs_files(name):
    return [os.path.join(h, ROOT, name, "cgroup.procs") for h in hierarchies()]


def start_in(name, argv):
    """Starts argv inside cgroup `name` in every hierarchy (before it forks its workers)."""
    create(name)
    moves = " && ".join(f"echo $$ > {p}" for p in procs_files(name))
    script = f"{moves} && exec \"$@\""
    return subprocess.Popen(
        ["sh", "-c", script, "sh", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc):
    if proc and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def remove_all():
    for h in hierarchies():
        base = os.path.join(h, ROOT)
        if not os.path.isdir(base):
            continue
        for child in os.listdir(base):
            path = os.path.join(base, child)
            if os.path.isdir(path):
                try:
                    os.rmdir(path)
                except OSError:
                    pass
        try:
            os.rmdir(base)
        except OSError:
            pass


DECOY = """
import random, time
random.seed(int(time.time()))
while True:
    duty = random.choice([0.05, 0.4])
    until = time.time() + random.uniform(5, 25)
    while time.time() < until:
        start = time.time()
        while time.time() - start < duty * 0.1:
            pass
        time.sleep((1 - duty) * 0.1)
"""


def antagonists(cpus, scratch):
    last = str(cpus - 1)
    return {
        "cpu": ["stress-ng", "--cpu", "1", "--taskset", "0"],
        "stream": ["stress-ng", "--stream", "1", "--taskset", last],
        "cache": ["stress-ng", "--cache", "1", "--taskset", last],
        "io": ["stress-ng", "--hdd", "1", "--hdd-opts", "direct", "--hdd-bytes", "256M",
               "--temp-path", scratch, "--taskset", last],
    }


def mean_steal_rates(readings):
    """Per-second steal from cumulative readings [(unix time, {cpu: stolen
    seconds})]: [[time, mean over CPUs of the share stolen since the last]]."""
    rates = []
    for (t0, s0), (t1, s1) in zip(readings, readings[1:]):
        shares = [(s1[c] - s0[c]) / (t1 - t0) for c in s1 if c in s0 and s1[c] >= s0[c]]
        if t1 > t0 and shares:
            rates.append([round(t1, 3), round(sum(shares) / len(shares), 5)])
    return rates


class StealSampler(threading.Thread):
    """Reads /proc/stat's per-CPU steal once a second, independent of the agent."""

    def __init__(self):
        super().__init__(daemon=True)
        self.readings = []
        self.halt = threading.Event()

    @staticmethod
    def read():
        ticks = os.sysconf("SC_CLK_TCK")
        steal = {}
        with open("/proc/stat") as f:
            for line in f:
                parts = line.split()
                if parts[0].startswith("cpu") and parts[0] != "cpu" and len(parts) > 8:
                    steal[parts[0]] = int(parts[8]) / ticks
        return time.time(), steal

    def run(self):
        self.readings.append(self.read())
        while not self.halt.wait(1.0):
            self.readings.append(self.read())


def steal_from_store(data_dir):
    """The same per-second steal series from a kept store's `cpu` table (the
    agent's raw /proc/stat counters), for runs from before the sampler."""
    import pyarrow.parquet as pq
    by_time = {}
    for root, _, files in os.walk(os.path.join(data_dir, "tables", "cpu")):
        for name in files:
            if not name.endswith(".parquet"):
                continue
            t = pq.read_table(os.path.join(root, name), columns=["time", "cpu", "steal_seconds"])
            for ts, cpu, steal in zip(t["time"].to_pylist(), t["cpu"].to_pylist(),
                                      t["steal_seconds"].to_pylist()):
                if steal is not None:
                    by_time.setdefault(ts.timestamp(), {})[cpu] = steal
    return mean_steal_rates(sorted(by_time.items()))


def steal_before(steal, at, secs=15):
    """Mean stolen share over (at - secs, at]; None without samples."""
    window = [r for t, r in steal if at - secs < t <= at]
    return sum(window) / len(window) if window else None


def parse_time(stamp):
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def read_events(log_path):
    events = []
    with open(log_path, errors="replace") as f:
        for line in f:
            m = OPENED.search(line)
            if m:
                events.append({
                    "time": parse_time(m.group(1)),
                    "resource": m.group(2),
                    "victim": m.group(3).strip('"'),
                    "signal": m.group(4),
                    "suspect": m.group(5),
                })
    return events


def score(trials, events, judged_from, finished, causal_secs=CAUSAL_SECS, steal=None):
    """Per trial: the first event opened while the antagonist ran, from
    causal_secs after its start (detection and its latency), and the first of
    them that names a suspect (the ranking); an event whose suspects all
    scored zero ranks nobody. Events opened outside every
    [start + causal_secs, end + TAIL_SECS) after the warm-up are false, but
    for host events: named the hypervisor, with the harness's steal reading
    (`steal`, [[time, ratio]]) at HOST_STEAL_MIN or more before they opened."""
    results = {"trials": [], "false_events": [], "events": events,
               "judged_from": judged_from, "finished": finished}
    for t in trials:
        during = sorted((e for e in events if t["start"] + causal_secs <= e["time"] < t["end"]),
                        key=lambda e: e["time"])
        first = during[0] if during else None
        named = next((e for e in during if e["suspect"] != "none"), None)
        expected = f"/{ROOT}/{t['kind']}"
        results["trials"].append({
            "kind": t["kind"], "start": t["start"], "end": t["end"],
            "detected": first is not None,
            "latency_secs": round(first["time"] - t["start"], 1) if first else None,
            "resource": first["resource"] if first else None,
            "signal": first["signal"] if first else None,
            "victim": first["victim"] if first else None,
            "top_suspect": named["suspect"] if named else None,
            "ranked_by": f"{named['resource']} {named['signal']} of {named['victim']}" if named else None,
            "ranked_first": bool(named and named["suspect"] == expected),
            "events_during": len(during),
        })
    busy = [(t["start"], t["end"] + TAIL_SECS) for t in trials]
    quiet_secs = (finished - judged_from) - sum(min(b, finished) - a for a, b in busy)
    attributed = [(t["start"] + causal_secs, t["end"] + TAIL_SECS) for t in trials]
    results["host_events"] = []
    for e in events:
        if e["time"] >= judged_from and not any(a <= e["time"] < b for a, b in attributed):
            stolen = steal_before(steal or [], e["time"]) if e["suspect"] == HOST_SUSPECT else None
            if stolen is not None and stolen >= HOST_STEAL_MIN:
                results["host_events"].append(dict(e, steal_ratio=round(stolen, 4)))
            else:
                results["false_events"].append(e)
    n = len(results["trials"])
    detected = [t for t in results["trials"] if t["detected"]]
    first = [t for t in results["trials"] if t["ranked_first"]]
    latencies = sorted(t["latency_secs"] for t in detected)
    results["summary"] = {
        "trials": n,
        "detected": len(detected),
        "detected_within_30s": len([x for x in latencies if x <= 30]),
        "latency_secs_median": latencies[len(latencies) // 2] if latencies else None,
        "latency_secs_max": latencies[-1] if latencies else None,
        "ranked_first": len(first),
        "ranked_first_fraction": round(len(first) / n, 3) if n else None,
        "quiet_hours": round(quiet_secs / 3600, 3),
        "false_events": len(results["false_events"]),
        "host_events": len(results["host_events"]),
        "false_events_per_hour": round(len(results["false_events"]) / (quiet_secs / 3600), 2) if quiet_secs > 0 else None,
    }
    return results


def report(results):
    print("\nkind     detected latency  first event (resource signal victim)             top suspect (ranked by)")
    for t in results["trials"]:
        first = f"{t['resource']} {t['signal']} {t['victim']}" if t["detected"] else "-"
        mark = "" if t["ranked_first"] else "  (wrong)"
        print(f"{t['kind']:<8} {str(t['detected']):<8} {str(t['latency_secs']):<8} {first:<48} "
              f"{t['top_suspect']} ({t['ranked_by']}){mark}")
    for e in results["false_events"]:
        print(f"false event at {e['time']:.0f}: {e['resource']} {e['victim']} {e['signal']} suspect {e['suspect']}")
    for e in results["host_events"]:
        print(f"host event at {e['time']:.0f}: {e['resource']} {e['victim']} {e['signal']} suspect {e['suspect']}, "
              f"steal {100 * e['steal_ratio']:.1f}% over the 15 s before (harness's /proc/stat)")
    print(json.dumps(results["summary"], indent=2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtax", default=os.path.join(REPO, "target/release/vtax"))
    ap.add_argument("--trials", type=int, default=3, help="trials per antagonist")
    ap.add_argument("--kinds", default="cpu,stream,cache,io")
    ap.add_argument("--warmup", type=int, default=120, help="seconds before the first trial")
    ap.add_argument("--attack", type=int, default=45)
    ap.add_argument("--gap", type=int, default=60)
    ap.add_argument("--quiet-minutes", type=float, default=20)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the agent's data directory and log")
    ap.add_argument("--causal-secs", type=float, default=CAUSAL_SECS,
                    help="events opened sooner than this after an antagonist started are not its doing "
                         "(0: the rule before session 7)")
    ap.add_argument("--rescore", metavar="RESULTS_JSON",
                    help="score the trials and events of an earlier --out file again, run nothing")
    ap.add_argument("--events", metavar="JSONL",
                    help="with --rescore: score these events instead of the run's, e.g. what "
                         "`vtax replay-detector` opened over the kept store")
    ap.add_argument("--data-dir", metavar="DIR",
                    help="with --rescore of a run from before the harness read steal itself: "
                         "take the steal series from this kept store's cpu table")
    args = ap.parse_args()
    if args.rescore:
        with open(args.rescore) as f:
            old = json.load(f)
        trials = old["trials"]
        # Files from before these keys were written: the warm-up ended as the
        # first trial began, and the run ended a gap and the quiet run after the last.
        judged_from = old.get("judged_from", trials[0]["start"])
        finished = old.get("finished", trials[-1]["end"] + args.gap + args.quiet_minutes * 60)
        events = old["events"]
        if args.events:
            with open(args.events) as f:
                events = [json.loads(line) for line in f if line.strip()]
        steal = old.get("steal")
        if steal is None and args.data_dir:
            steal = steal_from_store(args.data_dir)
        report(score(trials, events, judged_from, finished, args.causal_secs, steal))
        return
    if os.geteuid() != 0:
        sys.exit("needs root: cgroups")
    # A shell starts background jobs with SIGINT ignored, and Python then
    # never turns it into KeyboardInterrupt: ask for both signals explicitly,
    # so `kill -INT` (or -TERM) ends the quiet run early and still scores.
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    if shutil.which("stress-ng") is None:
        sys.exit("stress-ng not found: apt-get install -y stress-ng")
    cpus = os.cpu_count()
    work = tempfile.mkdtemp(prefix="vtax-eval-")
    log_path = os.path.join(work, "agent.log")
    remove_all()
    background, agent = [], None
    trials = []
    sampler = StealSampler()
    sampler.start()
    try:
        background.append(start_in("victim", ["stress-ng", "--cpu", "1", "--cpu-load", "50", "--taskset", "0"]))
        background.append(start_in("steady", ["stress-ng", "--cpu", "1", "--cpu-load", "15", "--taskset", str(cpus - 1)]))
        background.append(start_in("decoy", [sys.executable, "-c", DECOY]))
        for kind in args.kinds.split(","):
            create(kind)  # known to the collector from its first walk
        env = dict(os.environ, RUST_LOG="info", NO_COLOR="1")
        with open(log_path, "w") as log:
            agent = subprocess.Popen(
                [args.vtax, "run", "--data-dir", os.path.join(work, "data"),
                 "--web.listen-address", "127.0.0.1:0"],
                stdout=log, stderr=log, env=env, start_new_session=True)
        print(f"agent pid {agent.pid}, log {log_path}; warm-up {args.warmup} s", flush=True)
        started = time.time()
        time.sleep(args.warmup)
        commands = antagonists(cpus, work)
        order = [k for _ in range(args.trials) for k in args.kinds.split(",")]
        random.Random(6).shuffle(order)
        for n, kind in enumerate(order):
            begin = time.time()
            proc = start_in(kind, commands[kind])
            time.sleep(args.attack)
            stop(proc)
            end = time.time()
            trials.append({"kind": kind, "start": begin, "end": end})
            print(f"trial {n + 1}/{len(order)} {kind}: {begin:.0f}..{end:.0f}", flush=True)
            time.sleep(args.gap)
        print(f"quiet run: {args.quiet_minutes} min (Ctrl-C or SIGINT ends it early and still scores)",
              flush=True)
        try:
            time.sleep(args.quiet_minutes * 60)
        except KeyboardInterrupt:
            print(f"quiet run cut short after {(time.time() - trials[-1]['end'] - args.gap) / 60:.1f} min"
                  if trials else "quiet run cut short", flush=True)
        finished = time.time()
    finally:
        if agent:
            agent.send_signal(signal.SIGTERM)
            agent.wait(60)
        for proc in background:
            stop(proc)
        time.sleep(1)
        remove_all()

    sampler.halt.set()
    events = read_events(log_path)
    steal = mean_steal_rates(sampler.readings)
    results = score(trials, events, started + args.warmup, finished, args.causal_secs, steal)
    results["steal"] = steal
    report(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    if args.keep:
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
