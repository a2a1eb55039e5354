#!/usr/bin/env python3
"""Where the agent's probe and cyclictest lose their wake-up time beside a hog,
from the kernel's own timestamps.

Runs the agent with only the jitter collector on one CPU (1 ms grid, no spin,
as bench/jitter/vs_cyclictest.py part 1 does), a stress-ng CPU hog pinned to
that CPU, and a long cyclictest on it. Then records, on that CPU only and on
CLOCK_MONOTONIC, the timer and scheduler events for --seconds:
timer:hrtimer_start (the deadline each thread asked for), timer:hrtimer_expire_entry
(when its timer fired) and sched:sched_switch (when it got the CPU). For each
thread it splits deadline -> on CPU into the timer's part (deadline -> fired:
timer slack and interrupt delivery) and the scheduler's (fired -> on CPU:
waiting behind the hog or the other sleeper), and prints p50/p99/max of each.
The two tools' own figures follow for comparison: the agent's windows from its
store and cyclictest's histogram over its whole run.

Usage: sudo bench/jitter/sched_trace.py [--seconds 15] [--cpu N] [--vtax target/release/vtax]
Needs: cyclictest, stress-ng, perf (apt-get install rt-tests stress-ng linux-perf); root.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vs_cyclictest as bench  # noqa: E402  (agent, cyclictest and query helpers)

EVENTS = "timer:hrtimer_start,timer:hrtimer_expire_entry,sched:sched_switch"


def split_latencies(events):
    """{tid: [(deadline->fired ns, fired->on CPU ns)]} for every thread that
    slept to an absolute deadline (mode 0x0) on the traced CPU."""
    timer_owner, pending, out = {}, {}, {}
    for tid, at_ns, event, fields in events:
        if event == "timer:hrtimer_start" and fields.get("function") == "hrtimer_wakeup" \
                and fields.get("mode") == "0x0":
            timer_owner[fields["hrtimer"]] = tid
            pending[tid] = {"deadline": int(fields["softexpires"])}
        elif event == "timer:hrtimer_expire_entry" and fields.get("hrtimer") in timer_owner:
            state = pending.get(timer_owner[fields["hrtimer"]])
            if state is not None and "fired" not in state:
                state["fired"] = int(fields["now"])
        elif event == "sched:sched_switch":
            next_tid = int(fields.get("next_pid", -1))
            state = pending.get(next_tid)
            if state is not None and "fired" in state:
                out.setdefault(next_tid, []).append((state["fired"] - state["deadline"],
                                                     at_ns - state["fired"]))
                del pending[next_tid]
    return out


def quantiles_us(values):
    values = sorted(values)
    return (f"p50 {bench.sorted_quantile(values, 0.5) / 1000:7.1f}  "
            f"p99 {bench.sorted_quantile(values, 0.99) / 1000:7.1f}  max {values[-1] / 1000:7.0f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vtax", default=os.path.join(bench.REPO, "target/release/vtax"))
    p.add_argument("--cpu", type=int, default=os.cpu_count() - 1)
    p.add_argument("--seconds", type=int, default=15)
    a = p.parse_args()
    for program in ["cyclictest", "stress-ng", "perf"]:
        bench.need(program)
    bench.WINDOW = 10
    data = tempfile.mkdtemp(prefix="vtax-sched-trace-")
    config = (f"[collectors.jitter]\ncpus = [{a.cpu}]\ninterval_us = 1000\nslice_us = 0\n"
              f"cpu_budget_ratio = 0.1\nwindow_secs = {bench.WINDOW}\n")
    agent, probe_tid = bench.start_agent(a.vtax, config, data)
    length = a.seconds + 12
    hog = subprocess.Popen(["stress-ng", "--cpu", "1", "--taskset", str(a.cpu), "--timeout", f"{length}s"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    reference = bench.start_cyclictest(a.cpu, (length - 4) * 1000, False, True)
    time.sleep(2)
    reference_tid = bench.measuring_tid(reference)
    try:
        events = bench.perf_events(a.cpu, EVENTS, a.seconds, monotonic=True)
        whole = bench.histogram_result(reference)
    finally:
        hog.kill()
        hog.wait()
        bench.stop_agent(agent)
    per_thread = split_latencies(events)
    print(f"CPU {a.cpu}, a stress-ng hog on it, {a.seconds} s traced; microseconds")
    for name, tid in [("vtax probe", probe_tid), ("cyclictest", reference_tid)]:
        rows = per_thread.get(tid, [])
        if not rows:
            print(f"{name:<11} no events")
            continue
        print(f"{name:<11} n {len(rows):6}  deadline->fired  {quantiles_us([t for t, _ in rows])}")
        print(f"{'':<11} {'':8}  fired->on CPU    {quantiles_us([s for _, s in rows])}")
        print(f"{'':<11} {'':8}  deadline->on CPU {quantiles_us([t + s for t, s in rows])}")
    print("the tools' own figures:")
    for row in bench.query(a.vtax, data, "jitter"):
        if row["cpu"] == str(a.cpu):
            print(f"  vtax window ending {row['time']}: {row['wakeups']} wake-ups, p50 "
                  f"{float(row['wakeup_p50_seconds']) * 1e6:.1f}, p99 {float(row['wakeup_p99_seconds']) * 1e6:.1f}")
    print(f"  cyclictest, its whole run: {whole['n']} wake-ups, p50 {whole['p50']}, p99 {whole['p99']}, "
          f"max {whole['max']}")
    shutil.rmtree(data)


if __name__ == "__main__":
    main()
