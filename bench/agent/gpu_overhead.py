#!/usr/bin/env python3
"""What 8 simulated GPUs at 1 s add to the agent's CPU (issue 4's bar: 0.3% of one core).

Two agents run side by side for the same window on this machine, each with its
own data directory and the default collectors: one without GPUs, one with
`--simulate-gpus 8` (every GPU training: 18 NVLink links up, a process each,
so every table has rows). Both are scraped every 15 s, as a Prometheus would.
After a warm-up, each process's CPU time (utime + stime from /proc/<pid>/stat)
over the window gives its share of one core; the difference is what the GPUs
cost: the collector thread, the store writing their rows (WAL, Parquet) and
/metrics rendering their series. The GPU collector thread's own CPU is printed
too, from its schedstat (the scheduler's runtime, in nanoseconds).

The simulated backend costs less than NVML calls do (a real read is a few
driver ioctls per metric); this measures the agent's side: building, storing
and exposing the rows of 8 GPUs.

With `--real` the second agent reads this machine's GPUs through NVML instead
(the first runs with `--no-collector.gpu`): what the real driver calls cost, per
GPU the machine has. Run it on a GPU machine (scripts/gpu-smoke.sh does).

`--config FILE` starts the agent with GPUs from that config file, to price a
choice (for example `gpm = false` under `[collectors.gpu]`).

Usage: bench/agent/gpu_overhead.py [--seconds 120] [--real] [--config FILE] [--vtax target/release/vtax]
"""
import argparse
import os
import signal
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_vs_node_exporter as bench  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_now(base, gpus):
    """Both agents' CPU seconds, and the GPU agent's collector and XID threads'."""
    threads = bench.thread_cpu_seconds(gpus.pid)
    return (bench.cpu_seconds(base.pid), bench.cpu_seconds(gpus.pid),
            threads.get("collector-gpu", 0.0), threads.get("gpu-xid", 0.0))


def start(vtax, data_dir, extra):
    return bench.start_vtax_run(vtax, ["--data-dir", data_dir, *extra])


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        body = r.read().decode()
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--vtax", default=os.path.join(REPO, "target/release/vtax"))
    parser.add_argument("--real", action="store_true", help="read the real GPUs through NVML")
    parser.add_argument("--config", help="config file for the agent with GPUs")
    args = parser.parse_args()
    if args.real:
        base_flags, gpu_flags, gpus_named = ["--no-collector.gpu"], [], "the real GPUs"
    else:
        base_flags, gpu_flags, gpus_named = [], ["--simulate-gpus", "8"], "8 simulated GPUs"
    if args.config:
        gpu_flags += ["--config", args.config]
    with tempfile.TemporaryDirectory() as tmp:
        base, base_addr = start(args.vtax, os.path.join(tmp, "base"), base_flags)
        gpus, gpus_addr = start(args.vtax, os.path.join(tmp, "gpus"), gpu_flags)
        try:
            time.sleep(args.warmup)
            series = (scrape(base_addr), scrape(gpus_addr))
            t0 = time.monotonic()
            c0 = cpu_now(base, gpus)
            next_scrape = t0 + 15
            while time.monotonic() - t0 < args.seconds:
                time.sleep(max(0.0, min(next_scrape, t0 + args.seconds) - time.monotonic()))
                if time.monotonic() >= next_scrape:
                    scrape(base_addr)
                    scrape(gpus_addr)
                    next_scrape += 15
            elapsed = time.monotonic() - t0
            c1 = cpu_now(base, gpus)
        finally:
            for p in (base, gpus):
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    base_pct = 100 * (c1[0] - c0[0]) / elapsed
    gpus_pct = 100 * (c1[1] - c0[1]) / elapsed
    thread_pct = 100 * (c1[2] - c0[2]) / elapsed
    print(f"window {elapsed:.0f} s, scraped every 15 s; series exposed: {series[0]} without GPUs, {series[1]} with {gpus_named}")
    print(f"agent without GPUs      {base_pct:6.3f} % of one core")
    print(f"agent with GPUs         {gpus_pct:6.3f} % of one core")
    print(f"added by {gpus_named:<14} {gpus_pct - base_pct:6.3f} % of one core (bar for 8 simulated: 0.3)")
    print(f"  collector-gpu thread  {thread_pct:6.3f} % of one core")
    print(f"  gpu-xid thread        {100 * (c1[3] - c0[3]) / elapsed:6.3f} % of one core (NVML only: it waits on the event set)")


if __name__ == "__main__":
    main()
