#!/usr/bin/env python3
"""What the `gpu` collector's NVML reads cost an 8-GPU node at 1 s (issue 34's
bar: at most 0.3% of one core), measured on a machine without a GPU.

The simulated backend, with `collectors.gpu.simulate_nvml_costs = true`, makes
each read of a simulated GPU spin the collector's thread for the CPU that the
same NVML reads cost on an H100 (the table in collectors/src/gpu/costs.rs,
from docs/gpus.md): idle figures for an idle GPU, those measured beside a copy
for a busy one. Agents run with 8 simulated H100s at 1 s, every other collector
off, and the `collector-gpu` thread's CPU time over the window (the scheduler's
nanosecond runtime, from /proc/<pid>/task/<tid>/schedstat) is its share of one core. The spin counts the
thread's own CPU clock, so a loaded machine charges the same.

Four builds of the reads, each on an idle node (every GPU `idle`) and a busy
one (every GPU `training`, one process each; with `--shared`, `mig`, three
processes each, whose shares need the driver):
  before  every read every tick: the exact energy counter, the process shares
          and the slow reads each tick (energy_interval_secs = 0,
          process_shares_interval_secs = 0, slow_reads_interval_secs = 0,
          single_process_shares_from_utilization = false);
  spaced  the exact counter every 30 s with the power integrated in between,
          quiet or not, the shares every 10 s where a GPU is shared, the slow
          reads (MIG mode, PCIe replays, NVLink state, ...) still every tick
          (slow_reads_interval_secs = 0, quiet_energy_interval_secs = 0);
  slow    as `spaced`, and the slow reads every 30 s, with a quiet GPU's
          GPM and PCIe link (quiet_energy_interval_secs = 0,
          loaded_link_interval_secs = 0);
  after   the defaults: as `slow`, a quiet GPU's exact energy counter every
          300 s, and a busy GPU's PCIe link held for 5 s while it is at its
          maximum. A window under 300 s may hold none of the quiet energy
          reads: --seconds 300 holds one per GPU, its steady share.

The eight agents run side by side for the same window. --compare OLD adds a
fifth pair, `compare`: another binary (an earlier commit's) on its own
defaults, beside the rest, for a change that has no setting of its own.

`bench/agent/gpu_overhead.py --real` measures the same on a lent GPU with the
real driver, per GPU.

Usage: bench/agent/gpu_driver_costs.py [--seconds 60] [--warmup 5] [--shared]
                                       [--vtax target/release/vtax] [--compare OLD]
"""
import argparse
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_vs_node_exporter as bench  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BUILDS = {
    "before": "energy_interval_secs = 0\nprocess_shares_interval_secs = 0\n"
              "slow_reads_interval_secs = 0\nloaded_link_interval_secs = 0\n"
              "single_process_shares_from_utilization = false\n",
    "spaced": "slow_reads_interval_secs = 0\nquiet_energy_interval_secs = 0\n"
              "loaded_link_interval_secs = 0\n",
    "slow": "quiet_energy_interval_secs = 0\nloaded_link_interval_secs = 0\n",
    "after": "",
}


def start(vtax, tmp, name, scenario, build):
    build = "after" if build == "compare" else build
    config = os.path.join(tmp, f"{name}.toml")
    with open(config, "w") as f:
        f.write("[collectors.gpu]\nsimulate_gpus = 8\ninterval_secs = 1\n"
                f"simulate_scenarios = [\"{scenario}\"]\nsimulate_nvml_costs = true\n")
        f.write(BUILDS[build])
    off = bench.only_collector("gpu")
    proc, _ = bench.start_vtax_run(
        vtax, ["--config", config, "--data-dir", os.path.join(tmp, name), *off])
    return proc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--shared", action="store_true",
                        help="busy GPUs with MIG and three processes each")
    parser.add_argument("--vtax", default=os.path.join(REPO, "target/release/vtax"))
    parser.add_argument("--compare", help="another vtax binary, run on its defaults beside the rest")
    args = parser.parse_args()
    builds = list(BUILDS) + (["compare"] if args.compare else [])
    busy = "mig" if args.shared else "training"
    runs = [(f"{build}-{load}", scenario, build)
            for build in builds for load, scenario in (("idle", "idle"), ("busy", busy))]
    with tempfile.TemporaryDirectory() as tmp:
        agents = {name: start(args.compare if build == "compare" else args.vtax,
                              tmp, name, scenario, build)
                  for name, scenario, build in runs}
        try:
            time.sleep(args.warmup)
            t0 = time.monotonic()
            c0 = {n: bench.thread_cpu_seconds(p.pid).get("collector-gpu", 0.0) for n, p in agents.items()}
            time.sleep(args.seconds)
            elapsed = time.monotonic() - t0
            c1 = {n: bench.thread_cpu_seconds(p.pid).get("collector-gpu", 0.0) for n, p in agents.items()}
        finally:
            for p in agents.values():
                p.send_signal(signal.SIGTERM)
            for p in agents.values():
                p.wait(timeout=30)
    print(f"window {elapsed:.0f} s, 8 simulated H100s at 1 s, NVML costs charged "
          f"(busy: {busy})")
    print(f"{'reads':<8} {'GPUs':<6} {'collector-gpu thread':>22}")
    for name, _, _ in runs:
        build, load = name.split("-")
        pct = 100 * (c1[name] - c0[name]) / elapsed
        print(f"{build:<8} {load:<6} {pct:17.3f} % of one core")


if __name__ == "__main__":
    main()
