#!/usr/bin/env python3
"""Noisy-neighbour detection, evaluated on this machine with real antagonists.

The agent runs on its defaults (every collector, the detector with 5 s windows,
events after 3 abnormal windows) over this machine's real /proc and cgroups.
Workloads each get their own cgroup under /vtax-eval in every mounted
hierarchy (cgroup v2, or v1 cpu, cpuacct and memory plus the unified PSI tree
of a hybrid system). With --layout v1-only they get cgroups in the v1 cpu,
cpuacct and memory hierarchies only, none in the unified tree, as on a v1 host
whose container runtime or Slurm knows nothing of it: no per-workload pressure,
only the node's.

  victim   stress-ng --cpu 1 --cpu-load 50 pinned to CPU 0 (the workload that suffers;
           --victim-load sets the 50)
  steady   stress-ng --cpu 1 --cpu-load 15 pinned to the last CPU (a neighbour that never changes)
  decoy    a neighbour that switches between 5% and 40% of a CPU at random,
           every 5 to 25 s, so a ranking by "whatever changed" would be wrong

After --warmup seconds, trials run one antagonist at a time, each in its own
cgroup, for --attack seconds, then --gap seconds of quiet. The cgroups of cpu,
stream, cache and io are made before the agent starts, so the collector knows
them from its first walk; newcomer's is not:

  cpu      stress-ng --cpu 1 pinned to CPU 0: a CPU hog on the victim's CPU
  stream   stress-ng --stream 1: memory bandwidth
  cache    stress-ng --cache 1: last-level cache thrash
  io       stress-ng --hdd 1 with direct I/O: block I/O
  newcomer stress-ng --cpu 2, unpinned, in a cgroup made the moment it starts
           (/vtax-eval/newcomer-N, N the trial's number) and removed when it
           ends, as a new container or Slurm job is: the detector has no row
           of it from before the onset

Then --quiet-minutes with no antagonist at all. The agent's log says when each
event opened, its resource, victim and top suspect ("Noisy-neighbour event
opened."), and when an open event names a suspect it has not named first
before ("Noisy-neighbour event names a new suspect."): an antagonist that
starts while an event on the same signal is still open is named that way.
Per trial: detected when an event opened, or an open event named a new
suspect, between 10 s after the antagonist's start (the least time three
abnormal 5 s windows take; an event opened sooner was abnormal before the
antagonist began) and its end; latency from the start; ranked first when the
first such event that names a suspect names the antagonist's cgroup. False
events: every event opened (not a new suspect of an open one) outside
[start + 10 s, end + 45 s) of a trial (the tail lets events that began under
the antagonist close), counted per hour of the time outside [start, end + 45 s).
Bars (issue 6): detected within 30 s; ranked first in >= 90% of trials; at most
one false event per hour of quiet running.

Accusations: every suspect an event names with a score above zero (the
`neighbor_events` row written when it opened holds up to five; the log line
only the first) is audited. In an event attributed to a trial, the trial's
cgroup is the right accusation; any other workload is a wrong one. Outside the
trials every workload named is wrong, counted per quiet hour. The hypervisor
named is wrong when the harness's own steal reading over the 90 s before the
event (the mean of its highest quarter, as the detector weighs it) is under
HYPERVISOR_STEAL_MIN (1%): the bar is no such accusation, printed as a verdict
with the run's steal. `unattributed: load outside the cgroups vtax samples` (CPU
load in the root cgroup, kernel threads or cgroups left out) accuses no
workload: counted apart.

Host events: the detector names the hypervisor as a CPU suspect when the guest's
steal time moves with the victim signal. Steal is the host running someone else
on our vCPUs, a real neighbour the harness did not inject. The harness reads
/proc/stat itself every second, and an event outside the trials that names the
hypervisor counts as a host event, not a false one, only when the harness's own
reading shows the host took at least HOST_STEAL_MIN of the CPUs' time over the
15 s (three windows) before the event opened. Host events are reported apart,
with that reading.

Usage: sudo bench/detect/eval.py [--vtax target/release/vtax] [--trials 3] [--layout v1-only]
       [--kinds cpu,stream,cache,io,newcomer] [--keep --out results.json]

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
from datetime import datetime, timezone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = "vtax-eval"
TAIL_SECS = 45
# The detector opens an event on its third abnormal 5 s window in a row, so
# an event opened less than two windows after an antagonist started was
# abnormal before it: it cannot be that antagonist's doing.
CAUSAL_SECS = 10
# An open event re-ranks its suspects every 5 s window: a new suspect named
# less than a window after the antagonist started was named before it.
UPDATE_CAUSAL_SECS = 5
# What the harness's own /proc/stat reading must show for an event that
# names the hypervisor to count as the host's doing: 3% of the CPUs' time
# stolen over the three windows before it opened (a few times this VM's
# usual 0-1%).
HOST_STEAL_MIN = 0.03
HOST_SUSPECT = "hypervisor"
# The bar on accusations of the host: none where the steal the harness read
# over the detector's look-back stays under the detector's own floor for
# naming it (MIN_HYPERVISOR_STEAL_RATIO).
HYPERVISOR_STEAL_MIN = 0.01
LOOKBACK_SECS = 90
OUTSIDE_SUSPECT = "unattributed: load outside the cgroups vtax samples"
NEWCOMER = "newcomer"
OPENED = re.compile(
    r"^(\S+)\s+WARN\s.*Noisy-neighbour event (opened|names a new suspect)\..*?resource=\"?(\w+)\"?\s+victim=(\S+)\s+signal=\"?(\w+)\"?\s+suspect=(?:\"([^\"]*)\"|(\S+))"
)
# One suspect of a `neighbor_events` row: `name score=… r=… effect=…`.
SUSPECT = re.compile(r"^(.*) score=(\S+) r=(\S+) effect=(\S+)$")
# "all": every mounted hierarchy; "v1-only": the v1 cpu, cpuacct and memory ones.
LAYOUT = "all"


def hierarchies(layout=None):
    """Directories under which a cgroup must be created: v2 or v1's cpu,
    cpuacct, memory, and unified; with layout "v1-only" not the unified tree."""
    layout = layout or LAYOUT
    found = []
    with open("/proc/mounts") as f:
        for line in f:
            _, path, fstype, options = line.split()[:4]
            opts = options.split(",")
            if fstype == "cgroup2":
                if layout != "v1-only":
                    found.append(path)
            elif fstype == "cgroup" and any(c in opts for c in ("cpu", "cpuacct", "memory")):
                found.append(path)
    if not found:
        sys.exit("no cgroup v1 cpu, cpuacct or memory hierarchy mounted" if layout == "v1-only"
                 else "no cgroup hierarchy mounted")
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


def remove_one(name, tries=20):
    """Removes cgroup `name` once its tasks are gone, as a finished job's is."""
    for h in hierarchies("all"):
        path = os.path.join(h, ROOT, name)
        for _ in range(tries):
            if not os.path.isdir(path):
                break
            try:
                os.rmdir(path)
            except OSError:
                time.sleep(0.5)


def remove_all():
    # Every hierarchy, whatever the layout: a run of the other layout may have left some.
    for h in hierarchies("all"):
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
        NEWCOMER: ["stress-ng", "--cpu", "2"],
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


def steal_lookback(steal, at, secs=LOOKBACK_SECS):
    """The stolen share over (at - secs, at]: its mean over the highest quarter
    of the seconds (how the detector weighs steal before naming the host);
    None without samples."""
    window = sorted((r for t, r in steal if at - secs < t <= at), reverse=True)
    if not window:
        return None
    top = window[:(len(window) + 3) // 4]
    return sum(top) / len(top)


def steal_summary(steal, since, until):
    """Mean and highest 15 s mean of the stolen share over [since, until)."""
    inside = [(t, r) for t, r in steal if since <= t < until]
    if not inside:
        return None, None
    highest = max(steal_before(inside, t) for t, _ in inside)
    return sum(r for _, r in inside) / len(inside), highest


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
                    "state": "open" if m.group(2) == "opened" else "updated",
                    "resource": m.group(3),
                    "victim": m.group(4).strip('"'),
                    "signal": m.group(5),
                    "suspect": m.group(6) if m.group(6) is not None else m.group(7),
                })
    return events


def parse_suspects(text):
    """A `neighbor_events` row's suspects: [{name, score}], best first. A
    name's `%` and `;` are stored as `%25` and `%3B`."""
    named = []
    for part in (text or "").split("; "):
        m = SUSPECT.match(part)
        if m:
            name = re.sub(r"%(25|3B)", lambda e: "%" if e.group(1) == "25" else ";", m.group(1))
            named.append({"name": name, "score": float(m.group(2))})
    return named


def read_opened_rows(vtax, data_dir):
    """The `neighbor_events` rows written when events opened or named a new
    first suspect (`updated`), each with every suspect it named; [] when the
    store cannot be read."""
    try:
        out = subprocess.run(
            [vtax, "query", "neighbor_events", "--data-dir", data_dir, "--format", "json"],
            capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"neighbor_events not read: {e}", file=sys.stderr)
        return []
    if out.returncode != 0:
        print(f"neighbor_events not read: {out.stderr.strip()}", file=sys.stderr)
        return []
    rows = []
    for line in out.stdout.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("state") not in ("open", "updated"):
            continue
        stamp = row.get("time")
        if isinstance(stamp, (int, float)):
            at = stamp / 1e6
        else:
            parsed = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=timezone.utc)
            at = parsed.timestamp()
        rows.append({"time": at, "state": row.get("state"), "start": row.get("start_time_seconds"),
                     "resource": row.get("resource"), "victim": row.get("victim"),
                     "signal": row.get("signal"), "suspects": parse_suspects(row.get("suspects"))})
    return rows


def attach_suspects(events, rows, slack=15):
    """Gives each logged event the suspects of its `neighbor_events` row: the
    same resource, victim and signal, stamped nearest its log line."""
    unused = list(rows)
    for e in events:
        same = [r for r in unused if (r["state"], r["resource"], r["victim"], r["signal"])
                == (e.get("state", "open"), e["resource"], e["victim"], e["signal"])
                and abs(r["time"] - e["time"]) <= slack]
        if same:
            row = min(same, key=lambda r: abs(r["time"] - e["time"]))
            unused.remove(row)
            e["suspects"] = row["suspects"]
            e["start"] = row["start"]
    return events


def named(event):
    """The suspects an event named with a score above zero: its stored row's,
    else (an event from the log or a replay alone) its first suspect."""
    if "suspects" in event:
        return [s for s in event["suspects"] if s["score"] is None or s["score"] > 0]
    return [] if event["suspect"] == "none" else [{"name": event["suspect"], "score": None}]


def audit(events, expected, steal, seen=None):
    """The accusations of `events`, sorted: `expected` (the antagonist's
    cgroup, None outside the trials) is right, any other workload wrong, the
    hypervisor wrong when the harness read less than HYPERVISOR_STEAL_MIN over
    the look-back (or read nothing), and the unattributed load apart. A
    suspect an event names again (in a later `updated` row of the same event)
    is one accusation: `seen` holds those already counted."""
    seen = set() if seen is None else seen
    found = {"events": len(events), "right": 0, "wrong": [], "hypervisor": [],
             "hypervisor_wrong": 0, "unattributed": 0, "no_suspect": 0}
    for e in events:
        suspects = named(e)
        if not suspects:
            found["no_suspect"] += 1
        for s in suspects:
            if e.get("start") is not None:
                accusation = (e["resource"], e["victim"], e["signal"], e["start"], s["name"])
                if accusation in seen:
                    continue
                seen.add(accusation)
            if s["name"] == expected:
                found["right"] += 1
            elif s["name"] == HOST_SUSPECT:
                stolen = steal_lookback(steal or [], e["time"])
                wrong = stolen is None or stolen < HYPERVISOR_STEAL_MIN
                found["hypervisor"].append({
                    "time": e["time"], "resource": e["resource"], "victim": e["victim"],
                    "signal": e["signal"], "score": s["score"], "wrong": wrong,
                    "steal_ratio": None if stolen is None else round(stolen, 4)})
                found["hypervisor_wrong"] += wrong
            elif s["name"] == OUTSIDE_SUSPECT:
                found["unattributed"] += 1
            else:
                found["wrong"].append({
                    "time": e["time"], "resource": e["resource"], "victim": e["victim"],
                    "signal": e["signal"], "suspect": s["name"], "score": s["score"]})
    return found


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
    seen = set()

    def causal(e):
        # An event opens on its third abnormal window; an open event names a
        # new suspect on any window, so one window of the antagonist can do.
        return causal_secs if e.get("state", "open") == "open" else UPDATE_CAUSAL_SECS

    for t in trials:
        during = sorted((e for e in events if t["start"] + causal(e) <= e["time"] < t["end"]),
                        key=lambda e: e["time"])
        first = during[0] if during else None
        named = next((e for e in during if e["suspect"] != "none"), None)
        expected = f"/{ROOT}/{t.get('cgroup', t['kind'])}"
        mean_steal, top_steal = steal_summary(steal or [], t["start"], t["end"] + TAIL_SECS)
        results["trials"].append({
            "kind": t["kind"], "cgroup": t.get("cgroup", t["kind"]), "start": t["start"], "end": t["end"],
            "detected": first is not None,
            "latency_secs": round(first["time"] - t["start"], 1) if first else None,
            "resource": first["resource"] if first else None,
            "signal": first["signal"] if first else None,
            "victim": first["victim"] if first else None,
            "top_suspect": named["suspect"] if named else None,
            "ranked_by": f"{named['resource']} {named['signal']} of {named['victim']}" if named else None,
            "ranked_first": bool(named and named["suspect"] == expected),
            "events_during": len(during),
            "accusations": audit([e for e in events if t["start"] + causal(e) <= e["time"]
                                  < t["end"] + TAIL_SECS], expected, steal, seen),
            "steal_mean": None if mean_steal is None else round(mean_steal, 5),
            "steal_max_15s": None if top_steal is None else round(top_steal, 5),
        })
    busy = [(t["start"], t["end"] + TAIL_SECS) for t in trials]
    quiet_secs = (finished - judged_from) - sum(min(b, finished) - a for a, b in busy)
    def attributed(e):
        return any(t["start"] + causal(e) <= e["time"] < t["end"] + TAIL_SECS for t in trials)

    results["host_events"] = []
    quiet_events = [e for e in events if e["time"] >= judged_from and not attributed(e)]
    results["quiet_accusations"] = audit(quiet_events, None, steal, seen)
    for e in events:
        if e.get("state", "open") != "open":
            continue  # a new suspect of an open event: audited above, not a new event
        if e["time"] >= judged_from and not attributed(e):
            stolen = steal_before(steal or [], e["time"]) if e["suspect"] == HOST_SUSPECT else None
            if stolen is not None and stolen >= HOST_STEAL_MIN:
                results["host_events"].append(dict(e, steal_ratio=round(stolen, 4)))
            else:
                results["false_events"].append(e)
    n = len(results["trials"])
    detected = [t for t in results["trials"] if t["detected"]]
    first = [t for t in results["trials"] if t["ranked_first"]]
    latencies = sorted(t["latency_secs"] for t in detected)
    audits = [t["accusations"] for t in results["trials"]] + [results["quiet_accusations"]]
    hypervisor = [h for a in audits for h in a["hypervisor"]]
    quiet = results["quiet_accusations"]
    mean_steal, top_steal = steal_summary(steal or [], judged_from, finished)
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
        "wrong_accusations_in_trials": sum(len(t["accusations"]["wrong"]) for t in results["trials"]),
        "wrong_accusations_quiet": len(quiet["wrong"]),
        "wrong_accusations_per_quiet_hour":
            round(len(quiet["wrong"]) / (quiet_secs / 3600), 2) if quiet_secs > 0 else None,
        "hypervisor_accusations": len(hypervisor),
        "hypervisor_accusations_wrong": sum(h["wrong"] for h in hypervisor),
        "unattributed_in_trials": sum(t["accusations"]["unattributed"] for t in results["trials"]),
        "unattributed_quiet": quiet["unattributed"],
        "steal_mean_percent": None if mean_steal is None else round(100 * mean_steal, 3),
        "steal_max_15s_percent": None if top_steal is None else round(100 * top_steal, 3),
        "hypervisor_bar": "pass" if steal and not any(h["wrong"] for h in hypervisor)
                          else "fail" if any(h["wrong"] for h in hypervisor) else "no steal reading",
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
    print("\naccusations (every suspect named with a score above zero, in the events of each trial"
          f" and its {TAIL_SECS} s tail)")
    print("kind     cgroup          events right wrong hypervisor(wrong) unattributed no-suspect"
          "  steal mean/max 15 s (harness)")
    for t in results["trials"]:
        a = t["accusations"]
        steal = (f"{100 * t['steal_mean']:.2f}%/{100 * t['steal_max_15s']:.2f}%"
                 if t.get("steal_mean") is not None else "-")
        print(f"{t['kind']:<8} {t['cgroup']:<15} {a['events']:<6} {a['right']:<5} {len(a['wrong']):<5} "
              f"{len(a['hypervisor'])}({a['hypervisor_wrong']}){'':<12} {a['unattributed']:<12} "
              f"{a['no_suspect']:<10} {steal}")
    quiet = results["quiet_accusations"]
    summary = results["summary"]
    print(f"quiet    {summary['quiet_hours']} h    {quiet['events']:<6} -     {len(quiet['wrong']):<5} "
          f"{len(quiet['hypervisor'])}({quiet['hypervisor_wrong']}){'':<12} {quiet['unattributed']:<12} "
          f"{quiet['no_suspect']:<10} ({summary['wrong_accusations_per_quiet_hour']} wrong per quiet hour)")
    for where, a in [(t["kind"] + " " + t["cgroup"], t["accusations"]) for t in results["trials"]] + \
            [("quiet", quiet)]:
        for w in a["wrong"]:
            print(f"wrong accusation ({where}) at {w['time']:.0f}: {w['suspect']} score {w['score']} "
                  f"for {w['resource']} {w['signal']} of {w['victim']}")
        for h in a["hypervisor"]:
            steal = "no reading" if h["steal_ratio"] is None else f"{100 * h['steal_ratio']:.2f}%"
            print(f"hypervisor accused ({where}) at {h['time']:.0f}: score {h['score']} for {h['resource']} "
                  f"{h['signal']} of {h['victim']}, steal {steal} (highest quarter of the {LOOKBACK_SECS} s "
                  f"before){' WRONG' if h['wrong'] else ''}")
    steal = ("no steal reading" if summary["steal_mean_percent"] is None else
             f"the harness read steal {summary['steal_mean_percent']:.2f}% on average, "
             f"{summary['steal_max_15s_percent']:.2f}% at most over 15 s"
             + (" (under 1% throughout)" if summary["steal_max_15s_percent"] < 100 * HYPERVISOR_STEAL_MIN
                else ""))
    print(f"\nBar, no accusation of the hypervisor with steal under {100 * HYPERVISOR_STEAL_MIN:.0f}%: "
          f"{summary['hypervisor_bar'].upper()} ({summary['hypervisor_accusations_wrong']} wrong of "
          f"{summary['hypervisor_accusations']} hypervisor accusations; {steal})")
    print(json.dumps(summary, indent=2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtax", default=os.path.join(REPO, "target/release/vtax"))
    ap.add_argument("--trials", type=int, default=3, help="trials per antagonist")
    ap.add_argument("--kinds", default="cpu,stream,cache,io",
                    help=f"antagonists, of cpu,stream,cache,io,{NEWCOMER}")
    ap.add_argument("--layout", choices=["all", "v1-only"], default="all",
                    help="cgroups for the workloads in every mounted hierarchy, or (v1-only) in the "
                         "v1 cpu, cpuacct and memory ones only, none in the unified tree")
    ap.add_argument("--victim-load", type=int, default=50, help="the victim's percent of CPU 0")
    ap.add_argument("--warmup", type=int, default=120, help="seconds before the first trial")
    ap.add_argument("--attack", type=int, default=45)
    ap.add_argument("--gap", type=int, default=60)
    ap.add_argument("--quiet-minutes", type=float, default=20)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the agent's data directory and log")
    ap.add_argument("--causal-secs", type=float, default=CAUSAL_SECS,
                    help="events opened sooner than this after an antagonist started are not its doing "
                         "(0: count events from the antagonist's start, as scoring did before "
                         "a827b25)")
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
    global LAYOUT
    LAYOUT = args.layout
    kinds = args.kinds.split(",")
    unknown = set(kinds) - {"cpu", "stream", "cache", "io", NEWCOMER}
    if unknown:
        sys.exit(f"unknown kinds: {','.join(sorted(unknown))}")
    print(f"layout {LAYOUT}: workload cgroups under {', '.join(hierarchies())}", flush=True)
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
    running = []
    trials = []
    sampler = StealSampler()
    sampler.start()
    try:
        background.append(start_in("victim", ["stress-ng", "--cpu", "1", "--cpu-load", str(args.victim_load),
                                              "--taskset", "0"]))
        background.append(start_in("steady", ["stress-ng", "--cpu", "1", "--cpu-load", "15", "--taskset", str(cpus - 1)]))
        background.append(start_in("decoy", [sys.executable, "-c", DECOY]))
        for kind in kinds:
            if kind != NEWCOMER:  # made when it starts, as a new container or job is
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
        order = [k for _ in range(args.trials) for k in kinds]
        random.Random(6).shuffle(order)
        for n, kind in enumerate(order):
            # A newcomer's cgroup is new each time, as a job's is: mkdir, then move in.
            cgroup = f"{NEWCOMER}-{n + 1}" if kind == NEWCOMER else kind
            begin = time.time()
            proc = start_in(cgroup, commands[kind])
            running.append(proc)
            time.sleep(args.attack)
            stop(proc)
            end = time.time()
            running.remove(proc)
            if kind == NEWCOMER:
                remove_one(cgroup)
            trials.append({"kind": kind, "cgroup": cgroup, "start": begin, "end": end})
            print(f"trial {n + 1}/{len(order)} {kind} in /{ROOT}/{cgroup}: {begin:.0f}..{end:.0f}", flush=True)
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
        # The agent first, so that it sees no workload end.
        if agent and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(60)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        for proc in running + background:
            try:
                stop(proc)
            except (OSError, subprocess.SubprocessError) as e:
                print(f"stopping {proc.pid}: {e}", file=sys.stderr)
        time.sleep(1)
        remove_all()

    sampler.halt.set()
    events = attach_suspects(read_events(log_path),
                             read_opened_rows(args.vtax, os.path.join(work, "data")))
    steal = mean_steal_rates(sampler.readings)
    results = score(trials, events, started + args.warmup, finished, args.causal_secs, steal)
    results["steal"] = steal
    results["layout"] = LAYOUT
    results["victim_load"] = args.victim_load
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
