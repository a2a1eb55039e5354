#!/usr/bin/env python3
"""What nvidia-smi costs the CPU to read a node's GPUs once a second: the peer
the `gpu` collector's cost is set beside (docs/gpus.md).

Two ways operators run it, each for `--seconds`:
- `loop`: one `nvidia-smi --query-gpu=... -lms 1000` process, NVML loaded
  once (what a sidecar that tails it pays);
- `spawn`: a new `nvidia-smi --query-gpu=...` each second, NVML loaded
  every time (what an exporter that shells out on each scrape pays, such as
  nvidia_gpu_exporter scraped each second).
The fields are those of the agent's tick that nvidia-smi has: utilisation,
memory, power, clocks, temperature and the PCIe link. nvidia-smi has no GPM
and no process shares, so it does less than the collector per tick.

CPU is the process's threads' time from schedstat (for `spawn`, each child's
user + system time, from wait4's rusage). Prints one line per way: share of one core, and per GPU.

Usage: bench/gpu/nvidia_smi_cost.py [--seconds 30] [--ways loop,spawn]
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agent"))
import cpu_vs_node_exporter as bench  # noqa: E402

FIELDS = (
    "timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "power.draw,clocks.sm,clocks.mem,temperature.gpu,pcie.link.gen.current,"
    "pcie.link.width.current"
)


def process_cpu_seconds(pid):
    """CPU time of all the process's threads, from schedstat in nanoseconds:
    utime + stime count 10 ms ticks, and a 30 s window of a process that
    spends well under 1% of a core is then a tick or two."""
    return sum(bench.thread_cpu_seconds(pid).values())


def loop(seconds):
    proc = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", "-lms", "1000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Let it load NVML and settle before the window opens.
    time.sleep(3)
    if proc.poll() is not None:
        sys.exit(f"nvidia-smi exited {proc.returncode}: {proc.stderr.read().strip()}")
    c0, t0 = process_cpu_seconds(proc.pid), time.monotonic()
    time.sleep(seconds)
    c1, t1 = process_cpu_seconds(proc.pid), time.monotonic()
    proc.terminate()
    proc.wait(timeout=10)
    return (c1 - c0) / (t1 - t0), None


def spawn(seconds):
    t0 = time.monotonic()
    cpu, runs, wall = 0.0, 0, 0.0
    next_at = t0
    while next_at < t0 + seconds:
        time.sleep(max(0.0, next_at - time.monotonic()))
        started = time.monotonic()
        proc = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
            stdout=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = status
        if status != 0:
            sys.exit(f"nvidia-smi exited with status {status}")
        wall += time.monotonic() - started
        cpu += usage.ru_utime + usage.ru_stime
        runs += 1
        next_at += 1.0
    elapsed = max(time.monotonic() - t0, seconds)
    return cpu / elapsed, (runs, wall / runs, cpu / runs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--ways", default="loop,spawn")
    args = parser.parse_args()
    gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    count = sum(1 for line in gpus.stdout.splitlines() if line.startswith("GPU "))
    print(f"nvidia-smi reading {count} GPU(s) once a second, {args.seconds:.0f} s a way; fields: {FIELDS}")
    for way in args.ways.split(","):
        share, runs = {"loop": loop, "spawn": spawn}[way](args.seconds)
        line = f"{way:<6} {100 * share:7.3f} % of one core, {100 * share / max(count, 1):7.3f} % per GPU"
        if runs:
            line += f" ({runs[0]} runs: {1e3 * runs[1]:.1f} ms wall, {1e3 * runs[2]:.1f} ms CPU each)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
