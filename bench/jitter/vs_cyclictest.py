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
Bars: p50, p90 and p99 within +-20% of cyclictest's, max within a factor of 2.
The probe sets its timer slack to 1 ns: with the default 50 us slack of a
SCHED_OTHER thread its sleeps end up to 50 us late by policy. cyclictest's
measuring thread is given a slack of 1 ns too (Debian's cyclictest resets
it to the default when it sets its policy); run with
--reference-default-slack to see what the slack alone adds to it.

Two 1 ms grids on one CPU interfere: deadlines closer than the timer slack
(50 us) fire in one interrupt, and beside a hog a wake-up that fails to
preempt the hog often waits for the other sleeper's next one; which of the two
pays depends on the gap between the grids and on which started first
(bench/jitter/cyclictest_pairs.py). So each window prints the gap between cyclictest's grid and the candidate's
(from the kernel's timer:hrtimer_start events, through perf), and
--min-gap-us N restarts each window's cyclictest until the grids lie at least
N us apart, alternating which of the two comes first. --align instead puts
each window's cyclictest on the candidate's own deadlines for exactly the
window's span (cyclictest --secaligned, launched before the window at the
candidate's phase): both then measure the same wake-ups, one interrupt wakes
both, and neither waits for the other's wake-up. The probe keeps its grid's
phase for its whole life, so one measurement of it per window is enough.
--control puts a second, long-lived cyclictest in the agent's place, so the
same windows show how far cyclictest agrees with itself under the same protocol.

Part 2, the defaults. The agent runs the jitter collector with its defaults
(every CPU in turn, 10 ms wake-ups, 200 us spins, 1% of one core) for
--default-windows windows. Per window and CPU: the interruption probe's
interrupted and unexplained ratios beside the CPU's steal from /proc/stat read
by this script at the window's edges, and its busy_ratio (the regime it
measured); and the probe thread's CPU time, read from
/proc/<pid>/task/<tid>/schedstat (nanoseconds on CPU), against the budget.

Usage: sudo bench/jitter/vs_cyclictest.py [--vtax target/release/vtax] [--fifo] [--window-secs 10]
                                          [--laptop] [--min-gap-us 250 | --align] [--control]
Needs: cyclictest and stress-ng (apt-get install rt-tests stress-ng); root
for --fifo (both then run SCHED_FIFO priority 1); perf (linux-perf) for the
grid gap.
"""
import argparse
import csv
import io
import math
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


# Whether cyclictest's measuring thread gets a timer slack of 1 ns
# (--reference-default-slack turns it off).
REFERENCE_LEAST_SLACK = True


def least_timer_slack(proc):
    """Gives cyclictest's measuring thread a timer slack of 1 ns, as the
    probe has. Debian's cyclictest calls sched_setscheduler(SCHED_OTHER) in
    that thread, which puts the slack back to the default 50 us (a slack set
    before exec does not survive it), so its sleeps end up to 50 us late by
    policy; both must measure the platform's lateness. Written through
    /proc/<tid>/timerslack_ns (root) once the thread exists, again until it
    reads back 1 twice in a row: the first few wake-ups may carry the old
    slack, a few in the thousands of a window."""
    if not REFERENCE_LEAST_SLACK:
        return
    deadline, settled = time.time() + 1.0, 0
    while time.time() < deadline and settled < 2 and proc.poll() is None:
        tid = None
        try:
            tid = next((int(t) for t in os.listdir(f"/proc/{proc.pid}/task")
                        if int(t) != proc.pid), None)
            if tid is not None:
                path = f"/proc/{tid}/timerslack_ns"
                with open(path) as f:
                    if f.read().strip() == "1":
                        settled += 1
                    else:
                        settled = 0
                        with open(path, "w") as w:
                            w.write("1")
        except FileNotFoundError:
            return
        time.sleep(0.002)
    if settled < 2 and proc.poll() is None:
        sys.exit("could not set cyclictest's timer slack to 1 ns (needs root)")


def cyclictest_args(cpu, loops, fifo, laptop):
    args = ["cyclictest", "-t1", "-a", str(cpu), "-i", "1000", "-l", str(loops), "-q"]
    if laptop:
        # Without it cyclictest holds /dev/cpu_dma_latency at 0, which keeps
        # every CPU out of deep idle while it runs: the agent would then be
        # measured on a machine that cyclictest changed.
        args.append("--laptop")
    if fifo:
        args += ["-p", "1"]
    return args


def start_cyclictest(cpu, loops, fifo, laptop, *extra):
    """cyclictest for `loops` wake-ups with a 1 us histogram up to 20 ms, into
    a file that histogram_result reads once it has ended: a pipe would hold
    its 20 000 lines, and it, until someone read them."""
    out = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cyclictest_args(cpu, loops, fifo, laptop) + ["-h", "20000", *extra],
                            stdout=out, stderr=subprocess.DEVNULL, text=True)
    least_timer_slack(proc)
    proc.histogram_file = out
    return proc


def cyclictest_window(cpu, fifo, laptop, window_end):
    return start_cyclictest(cpu, max(1000, int((window_end - 0.3 - time.time()) * 1000)), fifo, laptop)


def measuring_tid(proc):
    """cyclictest's measuring thread: its one task other than the main thread."""
    for task in os.listdir(f"/proc/{proc.pid}/task"):
        if int(task) != proc.pid:
            return int(task)
    return None


def perf_events(cpu, events, seconds, monotonic=False):
    """Kernel tracepoint events on one CPU for `seconds`, through perf, as
    (tid, time in ns, event name, {field: value}). Empty without perf."""
    if shutil.which("perf") is None:
        return []
    fd, trace = tempfile.mkstemp(prefix="vtax-jitter-bench-", suffix=".perf")
    os.close(fd)
    clock = ["-k", "CLOCK_MONOTONIC"] if monotonic else []
    try:
        subprocess.run(["perf", "record", "-q", *clock, "-e", events, "-C", str(cpu), "-o", trace,
                        "--", "sleep", str(seconds)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        out = subprocess.run(["perf", "script", "-i", trace, "-F", "tid,time,event,trace", "--ns"],
                             capture_output=True, text=True, check=True).stdout
    except (subprocess.CalledProcessError, OSError):
        return []
    finally:
        os.unlink(trace)
    parsed = []
    for line in out.splitlines():
        words = line.split(None, 3)
        if len(words) < 4 or not words[0].isdigit():
            continue
        parsed.append((int(words[0]), int(words[1].rstrip(":").replace(".", "")), words[2].rstrip(":"),
                       dict(w.split("=", 1) for w in words[3].split() if "=" in w)))
    return parsed


def grid_phases_ns(cpu, tids, interval_ns=1_000_000):
    """Where in the interval each thread's absolute-deadline timer falls,
    from the kernel's own hrtimer_start events (softexpires is the deadline
    the thread asked for, before timer slack)."""
    phases = {}
    for tid, _, event, fields in perf_events(cpu, "timer:hrtimer_start", 0.1):
        if tid in tids and fields.get("function") == "hrtimer_wakeup" and "softexpires" in fields:
            phases.setdefault(tid, int(fields["softexpires"]) % interval_ns)
    return phases


def signed_gap_us(reference_ns, candidate_ns, interval_ns=1_000_000):
    """The reference's deadlines relative to the candidate's, in (-interval/2, interval/2]."""
    gap = (reference_ns - candidate_ns) % interval_ns
    if gap > interval_ns // 2:
        gap -= interval_ns
    return gap / 1000


def start_reference(cpu, fifo, laptop, window_start, candidate_tid, min_gap_us, sign):
    """A fresh cyclictest for one window, restarted while its grid lies
    within min_gap_us of the candidate's or on the wrong side of it (sign +1:
    its deadlines after the candidate's; -1: before), for at most the first
    30% of the window. Returns it and the gap (None without perf)."""
    while True:
        proc = cyclictest_window(cpu, fifo, laptop, window_start + WINDOW)
        time.sleep(0.05)
        gap = grid_gap_us(cpu, measuring_tid(proc), candidate_tid)
        if (gap is None or not min_gap_us or (abs(gap) >= min_gap_us and gap * sign > 0)
                or time.time() > window_start + 0.3 * WINDOW):
            return proc, gap
        proc.kill()
        proc.wait()


def launch_aligned_reference(cpu, fifo, laptop, window_start, phase_ns):
    """A cyclictest whose deadlines are exactly the candidate's deadlines in
    one window, so both measure the same wake-ups over the same span: one
    timer interrupt wakes both, and neither's wake-up is the other's
    reschedule point. The agent counts a window's wake-ups from the one after
    its first deadline at or after the window's start to the first at or
    after its end (it records a wake-up before it looks at the clock for the
    window's end), and so does this cyclictest.

    cyclictest --secaligned=USEC takes the whole second of CLOCK_MONOTONIC
    after it starts (the one after that within 0.1 s of it), adds USEC, and
    wakes one interval later; so it is launched 0.7 s before the whole second
    it should take, up to 1.7 s before the window. Its histogram goes to a
    file (start_cyclictest), so the next window's copy can be launched while
    this one runs. Returns None when it is too late to launch it in time."""
    wall_minus_monotonic = time.time() - time.monotonic()
    start_ns = int((window_start - wall_minus_monotonic) * 1e9)
    end_ns = int((window_start + WINDOW - wall_minus_monotonic) * 1e9)
    first_ns = start_ns + (phase_ns - start_ns) % 1_000_000
    loops = (end_ns - first_ns + 999_999) // 1_000_000
    whole_second = first_ns // 1_000_000_000
    offset_us = round((first_ns - whole_second * 1_000_000_000) / 1000)
    sleep_until(whole_second - 0.7 + wall_minus_monotonic)
    if time.monotonic() > whole_second - 0.3:
        return None
    return start_cyclictest(cpu, loops, fifo, laptop, f"--secaligned={offset_us}")


def grid_gap_us(cpu, reference_tid, candidate_tid):
    phases = grid_phases_ns(cpu, {reference_tid, candidate_tid}) if reference_tid else {}
    if reference_tid in phases and candidate_tid in phases:
        return signed_gap_us(phases[reference_tid], phases[candidate_tid])
    return None


def histogram_result(proc):
    """p50, p90, p99 and max of a start_cyclictest run, once it has ended."""
    proc.wait(timeout=WINDOW + 60)
    proc.histogram_file.seek(0)
    out = proc.histogram_file.read()
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

    return {"n": total, "p50": quantile(0.5), "p90": quantile(0.9), "p99": quantile(0.99),
            "max": maximum}


def sorted_quantile(values, q):
    """The q-quantile of an ascending list (the value at rank q * n)."""
    return values[min(len(values) - 1, int(q * len(values)))]


def ratio(a, b):
    return a / b if b else float("nan")


def geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


class AgentCandidate:
    """The agent's probe: only the jitter collector, pinned to the CPU."""
    name = "vtax"

    def __init__(self, vtax, cpu, fifo, laptop):
        self.vtax, self.cpu = vtax, cpu
        self.data = tempfile.mkdtemp(prefix="vtax-jitter-bench-")
        config = (f"[collectors.jitter]\ncpus = [{cpu}]\ninterval_us = 1000\nslice_us = 0\n"
                  f"cpu_budget_ratio = 0.1\nwindow_secs = {WINDOW}\n"
                  f"sched_fifo = {'true' if fifo else 'false'}\n")
        self.agent, self.tid = start_agent(vtax, config, self.data)

    def stop(self):
        stop_agent(self.agent)
        rows = {window_end(r): r for r in query(self.vtax, self.data, "jitter")
                if r["cpu"] == str(self.cpu)}
        shutil.rmtree(self.data)
        self.windows = {end: {"n": int(row["wakeups"]),
                              **{k: float(row[f"wakeup_{k}_seconds"]) * 1e6
                                 for k in ["p50", "p90", "p99", "max"]}}
                        for end, row in rows.items()}


class CyclictestCandidate:
    """The control: a second cyclictest in the agent's place, living through
    every window as the agent's probe thread does; per-loop latencies (-v)
    are cut into the same windows by loop number."""
    name = "ct2"

    def __init__(self, cpu, fifo, laptop, first, windows):
        loops = int((first + windows * WINDOW + 1 - time.time()) * 1000)
        # -v streams the latencies out of a 16384-entry ring: into a file,
        # since a pipe nobody drains would stall the printer and let the ring wrap.
        self.out = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cyclictest_args(cpu, loops, fifo, laptop) + ["-v"],
                                     stdout=self.out, stderr=subprocess.DEVNULL, text=True)
        least_timer_slack(self.proc)
        self.started = time.time()
        time.sleep(0.05)
        self.tid = measuring_tid(self.proc)

    def stop(self):
        self.proc.wait(timeout=60)
        self.out.seek(0)
        per_window = {}
        for line in self.out:
            words = line.split(":")
            if len(words) == 3 and all(w.strip().isdigit() for w in words):
                at = self.started + (int(words[1]) + 1) / 1000
                end = (int(at) // WINDOW + 1) * WINDOW
                per_window.setdefault(end, []).append(int(words[2]))
        self.windows = {}
        for end, lat in per_window.items():
            lat.sort()
            self.windows[end] = {"n": len(lat), "p50": sorted_quantile(lat, 0.5),
                                 "p90": sorted_quantile(lat, 0.9),
                                 "p99": sorted_quantile(lat, 0.99), "max": lat[-1]}


def part1(vtax, cpu, quiet, hog, fifo, laptop, min_gap_us, control, align):
    who = "a second, long-lived cyclictest (the control)" if control else "the agent"
    grids = (", cyclictest on the candidate's grid" if align
             else f", grids at least {min_gap_us} us apart" if min_gap_us else "")
    print(f"== Part 1: wake-up latency, {who} beside cyclictest, CPU {cpu}, 1000 us, "
          f"{'SCHED_FIFO 1' if fifo else 'SCHED_OTHER'}{grids} ==")
    # --align launches each window's cyclictest up to 1.7 s before the window,
    # after the candidate has started and perf has read its phase.
    first = next_boundary(time.time() + (6 if align else 2))
    candidate = (CyclictestCandidate(cpu, fifo, laptop, first, quiet + hog) if control
                 else AgentCandidate(vtax, cpu, fifo, laptop))
    # Window end -> (load, gap, its cyclictest); the histograms are read once
    # every run has ended, since an aligned copy is launched before the last ends.
    results, hog_proc = {}, None
    try:
        for w in range(quiet + hog):
            start = first + w * WINDOW
            end = start + WINDOW
            load = "hog" if w >= quiet else "quiet"
            if align:
                phase = grid_phases_ns(cpu, {candidate.tid}).get(candidate.tid)
                if phase is None:
                    sys.exit("--align needs the candidate's phase from perf (linux-perf)")
                proc = launch_aligned_reference(cpu, fifo, laptop, start, phase)
                if proc is None:
                    print(f"window {w}: too late to launch cyclictest on the candidate's grid; skipped")
                else:
                    results[end] = (load, None, proc)
            if w == quiet:
                sleep_until(start)
                hog_proc = subprocess.Popen(["stress-ng", "--cpu", "1", "--taskset", str(cpu),
                                             "--timeout", f"{hog * WINDOW + 5}s"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            sleep_until(start + 0.2)
            if align:
                if end in results:
                    proc = results[end][2]
                    results[end] = (load, grid_gap_us(cpu, measuring_tid(proc), candidate.tid), proc)
                continue
            # Beside a hog, a sleeper's tail depends on where the other's
            # deadlines fall in its period: alternate which grid comes first
            # so that the phase does not always favour the same side.
            sign = 1 if (w if w < quiet else w - quiet) % 2 == 0 else -1
            proc, gap = start_reference(cpu, fifo, laptop, start, candidate.tid, min_gap_us, sign)
            results[end] = (load, gap, proc)
        sleep_until(first + (quiet + hog) * WINDOW + 1.5)
    finally:
        for proc in [hog_proc, *(proc for _, _, proc in results.values())]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        candidate.stop()
    results = {end: (load, gap, histogram_result(proc)) for end, (load, gap, proc) in results.items()}
    name = candidate.name
    print(f"{'window end (UTC)':<17} {'load':<6} {'gap us':>7} {'n ' + name:>7} {'n ct':>6} "
          f"{'p50 ' + name:>9} {'p50 ct':>7} {'ratio':>6} {'p90 ' + name:>9} {'p90 ct':>7} {'ratio':>6} "
          f"{'p99 ' + name:>9} {'p99 ct':>7} {'ratio':>6} "
          f"{'max ' + name:>9} {'max ct':>7} {'ratio':>6}")
    verdicts = []
    for end in sorted(results):
        load, gap, ct = results[end]
        v = candidate.windows.get(end)
        if v is None or ct["p50"] is None:
            print(f"{time.strftime('%H:%M:%S', time.gmtime(end)):<17} {load:<6} "
                  f"no {name if v is None else 'cyclictest'} result")
            continue
        r = {k: ratio(v[k], ct[k]) for k in ["p50", "p90", "p99", "max"]}
        verdicts.append((load, r))
        gap_text = "-" if gap is None else f"{gap:+.0f}"
        print(f"{time.strftime('%H:%M:%S', time.gmtime(end)):<17} {load:<6} {gap_text:>7} {v['n']:>7} "
              f"{ct['n']:>6} {v['p50']:>9.1f} {ct['p50']:>7} {r['p50']:>6.2f} {v['p90']:>9.1f} "
              f"{ct['p90']:>7} {r['p90']:>6.2f} {v['p99']:>9.1f} "
              f"{ct['p99']:>7} {r['p99']:>6.2f} {v['max']:>9.1f} {ct['max']:>7} {r['max']:>6.2f}")
    for load in ["quiet", "hog"]:
        rs = [r for l, r in verdicts if l == load]
        if not rs:
            continue
        within = {k: sum(0.8 <= r[k] <= 1.2 for r in rs) for k in ["p50", "p90", "p99"]}
        ok = sum(1 for r in rs if all(0.8 <= r[k] <= 1.2 for k in ["p50", "p90", "p99"])
                 and 0.5 <= r["max"] <= 2)
        print(f"{load}: {ok}/{len(rs)} windows meet all four bars "
              f"(p50 {within['p50']}, p90 {within['p90']}, p99 {within['p99']}, "
              f"max {sum(0.5 <= r['max'] <= 2 for r in rs)}); geometric mean of the ratios: "
              + ", ".join(f"{k} {geometric_mean([r[k] for r in rs]):.2f}"
                          for k in ["p50", "p90", "p99", "max"]))
    ends = sorted(e for e in results if e in candidate.windows)
    last_quiet = [e for e in ends if results[e][0] == "quiet"][-1:]
    first_hog = [e for e in ends if results[e][0] == "hog"][:1]
    if last_quiet and first_hog:
        a = candidate.windows[last_quiet[0]]["p99"]
        b = candidate.windows[first_hog[0]]["p99"]
        print(f"hog pinned to CPU {cpu}: {name} p99 {a:.1f} us in the last quiet window -> "
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
          f"{'steal /proc/stat (whole window)':>31} {'probe cpu %':>11} {'busy':>7}")
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
            # A dash for a null, and for a column a binary predates (busy_ratio).
            return f"{float(row[k]) * 100:.3f}%" if row.get(k) else "-"

        print(f"{time.strftime('%H:%M:%S', time.gmtime(end)):<10} {cpu:>3} {probed:>8.2f} "
              f"{float(row['spin_seconds']) * 1e3:>8.1f} {row['gaps']:>6} {pct('interrupted_ratio'):>11} "
              f"{pct('run_delay_ratio'):>9} {pct('irq_ratio'):>7} {pct('steal_ratio'):>7} "
              f"{pct('unexplained_ratio'):>11} {steal * 100:>30.3f}% "
              f"{float(row['probe_cpu_seconds']) / probed * 100 if probed else 0:>10.3f}% "
              f"{pct('busy_ratio'):>7}")
    share = (cpu1 - cpu0) / ((t1 - t0) * 1e9)
    print(f"probe thread CPU over {t1 - t0:.1f} s, from /proc/{agent.pid}/task/{tid}/schedstat: "
          f"{share * 100:.3f}% of one core (budget 1%); the agent's own probe_cpu_seconds sum: "
          f"{probe_cpu:.3f} s")


def main():
    global WINDOW, REFERENCE_LEAST_SLACK
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
    p.add_argument("--min-gap-us", type=int, default=0,
                   help="restart each window's cyclictest until its 1 ms grid lies at least this "
                        "far from the candidate's (needs perf)")
    p.add_argument("--align", action="store_true",
                   help="each window's cyclictest on the candidate's own deadlines over the "
                        "whole window (cyclictest --secaligned at the candidate's phase, "
                        "from perf)")
    p.add_argument("--control", action="store_true",
                   help="part 1 with a second, long-lived cyclictest in the agent's place")
    p.add_argument("--reference-default-slack", action="store_true",
                   help="leave cyclictest at the default 50 us timer slack of a SCHED_OTHER "
                        "thread instead of 1 ns (shows what the slack alone adds)")
    p.add_argument("--window-secs", type=int, default=WINDOW,
                   help="the agent's window_secs, and each cyclictest run's length less 0.5 s "
                        "(less again when --min-gap-us restarts it; all of it with --align)")
    a = p.parse_args()
    if a.align and a.min_gap_us:
        p.error("--align puts the grids together; --min-gap-us keeps them apart: choose one")
    WINDOW = a.window_secs
    REFERENCE_LEAST_SLACK = not a.reference_default_slack
    need("cyclictest")
    need("stress-ng")
    print("load average at start: %.2f %.2f %.2f (other work on this machine shares its CPUs)"
          % os.getloadavg())
    part1(a.vtax, a.cpu, a.quiet, a.hog, a.fifo, a.laptop, a.min_gap_us, a.control, a.align)
    if not a.skip_part2:
        part2(a.vtax, a.default_windows)
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
