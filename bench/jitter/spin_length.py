#!/usr/bin/env python3
"""Does the interruption probe's lost share depend on how long it spins?

On a mostly idle vCPU the probe loses a larger share of its spins than on
one that other work keeps busy (bench/jitter/vs_oslat.py). If that excess
came from the moment the vCPU wakes from a halt (each spin starts right
after a short sleep), a spin of 200 us would carry it more heavily than a
spin of 5 ms: the lost share would fall as the spin grows. If it comes from
the host's treatment of a vCPU that halts often, it would not depend on the
spin's length at all.

The agent runs only the jitter collector, pinned to --cpu, with 2 s windows,
at each --slices value of `slice_us` in each regime of --regimes, one turn
of each after the other, --turns times over (so that the host's noise, which
comes and goes over tens of seconds, falls on every length and regime
alike):
- idle: nothing else asks for the CPU;
- busy: a SCHED_IDLE spinner pinned to the CPU keeps it from halting.
The budget is raised to --budget (default 5% of one core) so that each turn
spins long enough at every length: the budget sets how often a spin comes,
not what it meets. Each length's lost share (interrupted_ratio over
spin_seconds) is pooled over its turns.

Prints one line per turn, then per regime each length's pooled lost share
and its ratio to the shortest length's.

Usage: sudo bench/jitter/spin_length.py [--vtax target/release/vtax] [--cpu N]
           [--slices 200,1000,5000] [--turns 6] [--turn-secs 10] [--regimes idle,busy]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vs_cyclictest as bench  # noqa: E402  (the agent, store and clock helpers)
import vs_oslat  # noqa: E402  (turns, pooling and the SCHED_IDLE spinner)


def probe_turn(vtax, cpu, seconds, slice_us, budget):
    """The probe alone on `cpu` for `seconds` of whole windows, spinning
    `slice_us` at a time."""
    return vs_oslat.vtax_turn(vtax, cpu, seconds,
                              f"slice_us = {slice_us}\ncpu_budget_ratio = {budget}\n")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vtax", default=os.path.join(bench.REPO, "target/release/vtax"))
    p.add_argument("--cpu", type=int, default=os.cpu_count() - 1)
    p.add_argument("--slices", default="200,1000,5000", help="slice_us values, comma-separated")
    p.add_argument("--turns", type=int, default=6, help="turns of each length per regime")
    p.add_argument("--turn-secs", type=int, default=10, help="seconds of one turn")
    p.add_argument("--budget", type=float, default=0.05, help="cpu_budget_ratio of every turn")
    p.add_argument("--regimes", default="idle,busy")
    a = p.parse_args()
    slices = [int(s) for s in a.slices.split(",")]
    regimes = a.regimes.split(",")
    if not set(regimes) <= {"idle", "busy"}:
        sys.exit("--regimes: idle, busy or both")
    turns = {(name, s): [] for name in regimes for s in slices}
    for n in range(a.turns):
        for name in regimes:
            for s in slices:
                spinner = vs_oslat.start_spinner(a.cpu) if name == "busy" else None
                try:
                    t = probe_turn(a.vtax, a.cpu, a.turn_secs, s, a.budget)
                finally:
                    vs_oslat.stop(spinner)
                turns[name, s].append(t)
                busy = f"{min(t.busy):.3f}-{max(t.busy):.3f}" if t.busy else "-"
                print(f"{name} turn {n + 1}, slice {s} us: {t.spun:.3f} s spun, lost "
                      f"{t.lost_share():.4f}, {t.gaps_per_second():.0f} gaps/s, busy_ratio "
                      f"{busy}", flush=True)
    results = {name: {s: vs_oslat.pooled(turns[name, s]) for s in slices} for name in regimes}
    for name, pooled in results.items():
        shortest = pooled[slices[0]].lost_share()
        for s in slices:
            t = pooled[s]
            ratio = f"{t.lost_share() / shortest:.2f}" if shortest else "-"
            print(f"{name} slice {s:>5} us: {t.spun:.3f} s spun, lost share pooled "
                  f"{t.lost_share():.4f} ({ratio} of {slices[0]} us's), "
                  f"{t.gaps_per_second():.0f} gaps/s spun")
    if len(results) == 2:
        for s in slices:
            busy = results["busy"][s].lost_share()
            ratio = f"{results['idle'][s].lost_share() / busy:.2f}" if busy else "-"
            print(f"slice {s:>5} us: idle / busy lost share {ratio}")


if __name__ == "__main__":
    main()
