#!/usr/bin/env python3
"""The jitter probes beside cyclictest, on this machine, in one run.

Part 1, wake-up latency beside cyclictest. The agent runs only the jitter
collector, pinned to one CPU (--cpu, default the last), at cyclictest's
default interval (1000 us), its interruption probe off (slice_us = 0: a spin
on the same CPU would delay cyclictest's wake-ups) and its budget raised to
10% so that no 1 kHz wake-up is skipped (a wake-up costs 30-40 us of CPU in
this VM). In every window of the agent (10 s, or --window-secs), cyclictest
(Debian's rt-tests) runs on the same CPU with the same interval from 0.2 s
after the window's start until 0.3 s before its end (-l 9500 for 10 s windows,
-h 20000: a 1 us histogram up to 20 ms). Longer windows hold more wake-ups, so
that each p99 rests on more of them than a handful of host stalls. Per window
the agent's p50/p99/max (from its store, table `jitter`) are printed beside
cyclictest's (from its histogram). The first --quiet windows are quiet; then a
stress-ng CPU hog pinned to the probed CPU runs for --hog windows: the first
window with the hog shows whether the probe's p99 moved within one window.
Bars: p50 and p99 within +-20% of cyclictest's, max within a factor of 2.

Part 2, the defaults. The agent runs the jitter collector with its defaults
(every CPU in turn, 10 ms wake-ups, 200 us spins, 1% of one core) for
--default-windows windows. Per window and CPU: the interruption probe's
interrupted and unexplained ratios beside the CPU's steal from /proc/stat read
by this script at the window's edges; and the probe thread's CPU time, read
from /proc/<pid>/task/<tid>/schedstat (nanoseconds on CPU), against the budget.

Usage: sudo bench/jitter/vs_cyclictest.py [--vtax target/release/vtax] [--fifo] [--window-secs 10]
Needs: cyclictest and stress-ng (apt-get install rt-tests stress-ng); root
for --fifo (both then run SCHED_FIFO priority 1).
"""
import argparse
import csv
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HZ = os.sysconf("SC_CLK_TCK")
WINDOW = 10


def need(program):
    if shutil.which(program) is None:
        sys.exit(f"{program} not found: apt-get install -y rt-tests stress-ng")


def sleep_until(t):
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


def next_boundary(after):
    return (int(after) // WINDOW + 1) * WINDOW


def start_agent(vtax, config_text, data):
    config = os.path.join(data, "vtax.toml")
    with open(config, "w") as f:
        f.write(config_text)
    args = [vtax, "run", "--config", config, "--data-dir", os.path.join(data, "store"),
            "--web.listen-address", "127.0.0.1:0"]
    # Only the jitter collector: the others' threads would share the probed CPU.
    for name in ["host", "cgroups", "perf", "infiniband", "platform", "gpu", "block",
                 "netdev", "filesystem", "scrape"]:
        args.append(f"--no-collector.{name}")
    agent = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        tid = probe_tid(agent.pid)
        if tid:
            return agent, tid
        time.sleep(0.1)
    agent.kill()
    sys.exit("the agent's vtax-jitter thread did not start")


def probe_tid(pid):
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                if f.read().strip() == "vtax-jitter":
                    return int(task)
        except OSError:
            pass
    return None


def task_cpu_ns(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def stop_agent(agent):
    agent.send_signal(signal.SIGTERM)
    agent.wait(timeout=60)


def query(vtax, data, table):
    out = subprocess.run([vtax, "query", table, "--data-dir", os.path.join(data, "store"),
                          "--format", "csv"], check=True, capture_output=True, text=True).stdout
    return list(csv.DictReader(io.StringIO(out)))


def window_end(row):
    """Unix seconds of a row's time (the window's end)."""
    t = row["time"]
    return int(time.mktime(time.strptime(t[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone)


def cyclictest_window(cpu, fifo, laptop):
    loops = int((WINDOW - 0.5) * 1000)
    args = ["cyclictest", "-t1", "-a", str(cpu), "-i", "1000", "-l", str(loops), "-q", "-h", "20000"]
    if laptop:
        # Without it cyclictest holds /dev/cpu_dma_latency at 0, which keeps
        # every CPU out of deep idle while it runs: the agent would then be
        # measured on a machine that cyclictest changed.
        args.append("--laptop")
    if fifo:
        args += ["-p", "1"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def cyclictest_result(proc):
    out, _ = proc.communicate(timeout=WINDOW + 60)
    counts, overflows, maximum = {}, 0, None
    for line in out.splitlines():
        if line.startswith("# Max Latencies:"):
            maximum = int(line.split(":")[1])
        elif line.startswith("# Histogram Overflows:"):
            overflows = int(line.split(":")[1])
        elif line[:1].isdigit():
            us, n = line.split()[:2]
            counts[int(us)] = int(n)
    total = sum(counts.values()) + overflows

    def quantile(q):
        rank, seen = q * total, 0
        for us in sorted(counts):
            seen += counts[us]
            if seen >= rank:
                return us
        return maximum

    return {"n": total, "p50": quantile(0.5), "p99": quantile(0.99), "max": maximum}


def ratio(a, b):
    return a / b if b else float("nan")


def part1(vtax, cpu, quiet, hog, fifo, laptop):
    print(f"== Part 1: wake-up latency beside cyclictest, CPU {cpu}, 1000 us, "
          f"{'SCHED_FIFO 1' if fifo else 'SCHED_OTHER'} ==")
    data = tempfile.mkdtemp(prefix="vtax-jitter-bench-")
    config = (f"[collectors.jitter]\ncpus = [{cpu}]\ninterval_us = 1000\nslice_us = 0\n"
              f"cpu_budget_ratio = 0.1\nwindow_secs = {WINDOW}\n"
              f"sched_fifo = {'true' if fifo else 'false'}\n")
    agent, tid = start_agent(vtax, config, data)
    first = next_boundary(time.time() + 1)
    results, hog_proc = {}, None
    try:
        for w in range(quiet + hog):
            start = first + w * WINDOW
            if w == quiet:
                sleep_until(start)
                hog_proc = subprocess.Popen(["stress-ng", "--cpu", "1", "--taskset", str(cpu),
                                             "--timeout", f"{hog * WINDOW + 5}s"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            sleep_until(start + 0.2)
            results[start + WINDOW] = ("hog" if w >= quiet else "quiet",
                                       cyclictest_result(cyclictest_window(cpu, fifo, laptop)))
        sleep_until(first + (quiet + hog) * WINDOW + 1.5)
    finally:
        if hog_proc:
            hog_proc.kill()
            hog_proc.wait()
        stop_agent(agent)
    rows = {window_end(r): r for r in query(vtax, data, "jitter") if r["cpu"] == str(cpu)}
    shutil.rmtree(data)
    print(f"{'window end (UTC)':<20} {'load':<6} {'n vtax':>7} {'n ct':>6} "
          f"{'p50 vtax':>9} {'p50 ct':>7} {'ratio':>6} {'p99 vtax':>9} {'p99 ct':>7} {'ratio':>6} "
          f"{'max vtax':>9} {'max ct':>7} {'ratio':>6}")
    verdicts = []
    for end in sorted(results):
        load, ct = results[end]
        row = rows.get(end)
        if row is None:
            print(f"{time.strftime('%H:%M:%S', time.gmtime(end)):<20} {load:<6} no agent row")
            continue
        v = {k: float(row[f"wakeup_{k}_seconds"]) * 1e6 for k in ["p50", "p99", "max"]}
        r = {k: ratio(v[k], ct[k]) for k in v}
        verdicts.append((load, r))
        print(f"{time.strftime('%H:%M:%S', time.gmtime(end)):<20} {load:<6} {row['wakeups']:>7} {ct['n']:>6} "
              f"{v['p50']:>9.1f} {ct['p50']:>7} {r['p50']:>6.2f} {v['p99']:>9.1f} {ct['p99']:>7} {r['p99']:>6.2f} "
              f"{v['max']:>9.1f} {ct['max']:>7} {r['max']:>6.2f}")
    for load in ["quiet", "hog"]:
        rs = [r for l, r in verdicts if l == load]
        ok = sum(1 for r in rs if 0.8 <= r["p50"] <= 1.2 and 0.8 <= r["p99"] <= 1.2 and 0.5 <= r["max"] <= 2)
        print(f"{load}: {ok}/{len(rs)} windows meet all three bars "
              f"(p50 {sum(0.8 <= r['p50'] <= 1.2 for r in rs)}, p99 {sum(0.8 <= r['p99'] <= 1.2 for r in rs)}, "
              f"max {sum(0.5 <= r['max'] <= 2 for r in rs)})")
    ends = sorted(e for e in results if e in rows)
    last_quiet = [e for e in ends if results[e][0] == "quiet"][-1:]
    first_hog = [e for e in ends if results[e][0] == "hog"][:1]
    if last_quiet and first_hog:
        a = float(rows[last_quiet[0]]["wakeup_p99_seconds"]) * 1e6
        b = float(rows[first_hog[0]]["wakeup_p99_seconds"]) * 1e6
        print(f"hog pinned to CPU {cpu}: probe p99 {a:.1f} us in the last quiet window -> "
              f"{b:.1f} us in the first window with the hog ({ratio(b, a):.1f}x)")


def read_stat():
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            w = line.split()
            if w[0].startswith("cpu") and w[0] != "cpu":
                out[int(w[0][3:])] = (int(w[6]) + int(w[7]), int(w[8]))
    return out


def part2(vtax, windows):
    print(f"\n== Part 2: defaults (every CPU in turn, 10 ms wake-ups, 200 us spins, 1% budget), "
          f"{windows} windows ==")
    data = tempfile.mkdtemp(prefix="vtax-jitter-bench-")
    agent, tid = start_agent(vtax, f"[collectors.jitter]\nwindow_secs = {WINDOW}\n", data)
    first = next_boundary(time.time() + 1)
    sleep_until(first)
    stats = {first: read_stat()}
    cpu0, t0 = task_cpu_ns(agent.pid, tid), time.monotonic()
    try:
        for w in range(1, windows + 1):
            sleep_until(first + w * WINDOW)
            stats[first + w * WINDOW] = read_stat()
        cpu1, t1 = task_cpu_ns(agent.pid, tid), time.monotonic()
        sleep_until(first + windows * WINDOW + 1.5)
    finally:
        stop_agent(agent)
    rows = query(vtax, data, "jitter")
    shutil.rmtree(data)
    print(f"{'window end':<10} {'cpu':>3} {'probed s':>8} {'spin ms':>8} {'gaps':>6} "
          f"{'interrupted':>11} {'run delay':>9} {'irq':>7} {'steal':>7} {'unexplained':>11} "
          f"{'steal /proc/stat (whole window)':>31} {'probe cpu %':>11}")
    probe_cpu = 0.0
    for row in sorted(rows, key=lambda r: (r["time"], r["cpu"])):
        end = window_end(row)
        if end - WINDOW not in stats or end not in stats:
            continue
        cpu = int(row["cpu"])
        before, after = stats[end - WINDOW][cpu], stats[end][cpu]
        steal = (after[1] - before[1]) / HZ / WINDOW
        probed = float(row["probed_seconds"])
        probe_cpu += float(row["probe_cpu_seconds"])

        def pct(k):
            return f"{float(row[k]) * 100:.3f}%" if row[k] else "-"

        print(f"{time.strftime('%H:%M:%S', time.gmtime(end)):<10} {cpu:>3} {probed:>8.2f} "
              f"{float(row['spin_seconds']) * 1e3:>8.1f} {row['gaps']:>6} {pct('interrupted_ratio'):>11} "
              f"{pct('run_delay_ratio'):>9} {pct('irq_ratio'):>7} {pct('steal_ratio'):>7} "
              f"{pct('unexplained_ratio'):>11} {steal * 100:>30.3f}% "
              f"{float(row['probe_cpu_seconds']) / probed * 100 if probed else 0:>10.3f}%")
    share = (cpu1 - cpu0) / ((t1 - t0) * 1e9)
    print(f"probe thread CPU over {t1 - t0:.1f} s, from /proc/{agent.pid}/task/{tid}/schedstat: "
          f"{share * 100:.3f}% of one core (budget 1%); the agent's own probe_cpu_seconds sum: "
          f"{probe_cpu:.3f} s")


def main():
    global WINDOW
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vtax", default=os.path.join(REPO, "target/release/vtax"))
    p.add_argument("--cpu", type=int, default=os.cpu_count() - 1)
    p.add_argument("--quiet", type=int, default=3, help="quiet windows in part 1")
    p.add_argument("--hog", type=int, default=3, help="windows with the hog in part 1")
    p.add_argument("--default-windows", type=int, default=6)
    p.add_argument("--fifo", action="store_true", help="both probes SCHED_FIFO priority 1")
    p.add_argument("--skip-part2", action="store_true")
    p.add_argument("--laptop", action="store_true",
                   help="cyclictest --laptop: it leaves /dev/cpu_dma_latency alone")
    p.add_argument("--window-secs", type=int, default=WINDOW,
                   help="the agent's window_secs, and each cyclictest run's length less 0.5 s")
    a = p.parse_args()
    WINDOW = a.window_secs
    need("cyclictest")
    need("stress-ng")
    print("load average at start: %.2f %.2f %.2f (other work on this machine shares its CPUs)"
          % os.getloadavg())
    part1(a.vtax, a.cpu, a.quiet, a.hog, a.fifo, a.laptop)
    if not a.skip_part2:
        part2(a.vtax, a.default_windows)
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
