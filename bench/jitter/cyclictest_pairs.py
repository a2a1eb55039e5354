#!/usr/bin/env python3
"""Two cyclictests on one CPU, and how the gap between their grids decides
which of them pays.

Each trial starts two fresh `cyclictest -t1 -a CPU -i 1000 --laptop` a few
milliseconds apart, reads where each one's absolute deadlines fall in the 1 ms
period (the kernel's timer:hrtimer_start events, through perf), and prints the
gap (b's deadlines minus a's, folded into +-500 us) beside each one's p50, p99
and max from its own 1 us histogram. With --hog, a stress-ng CPU hog pinned
to that CPU runs through every trial.

This is the control behind bench/jitter/vs_cyclictest.py: the same reference
tool twice, so whatever separates the two columns is the method (two sleepers
sharing one CPU), not either tool.

Usage: sudo bench/jitter/cyclictest_pairs.py [--hog] [--trials 8] [--seconds 8] [--cpu N]
Needs: cyclictest, stress-ng and perf (apt-get install rt-tests stress-ng linux-perf); root.
"""
import argparse
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vs_cyclictest as bench  # noqa: E402  (the grid and histogram helpers)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", type=int, default=os.cpu_count() - 1)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--seconds", type=int, default=8, help="length of each trial")
    p.add_argument("--hog", action="store_true", help="a stress-ng CPU hog on that CPU throughout")
    a = p.parse_args()
    for program in ["cyclictest", "stress-ng", "perf"]:
        bench.need(program)
    bench.WINDOW = a.seconds
    hog = None
    if a.hog:
        hog = subprocess.Popen(["stress-ng", "--cpu", "1", "--taskset", str(a.cpu), "--timeout",
                                f"{a.trials * (a.seconds + 3) + 10}s"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
    print(f"{'load':<6} {'gap us':>7} {'p50 a':>6} {'p99 a':>6} {'max a':>7} "
          f"{'p50 b':>6} {'p99 b':>6} {'max b':>7} {'p99 b/a':>8}")
    try:
        for _ in range(a.trials):
            first = bench.start_cyclictest(a.cpu, a.seconds * 1000, False, True)
            time.sleep(random.uniform(0.001, 0.011))
            second = bench.start_cyclictest(a.cpu, a.seconds * 1000, False, True)
            time.sleep(0.1)
            gap = bench.grid_gap_us(a.cpu, bench.measuring_tid(second), bench.measuring_tid(first))
            ra, rb = bench.histogram_result(first), bench.histogram_result(second)
            gap = "-" if gap is None else f"{gap:+.0f}"
            print(f"{'hog' if a.hog else 'quiet':<6} {gap:>7} {ra['p50']:>6} {ra['p99']:>6} "
                  f"{ra['max']:>7} {rb['p50']:>6} {rb['p99']:>6} {rb['max']:>7} "
                  f"{bench.ratio(rb['p99'], ra['p99']):>8.2f}", flush=True)
    finally:
        if hog:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    main()
