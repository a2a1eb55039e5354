#!/usr/bin/env python3
"""What each mount costs the `filesystem` collector, a second.

A Kubernetes GPU node mounts a volume per pod, so the collector may stat
dozens of mounts every second, each on a thread that a hung network mount
cannot hold up. Two agents run side by side, only the `filesystem` collector
on, each reading a mount table of its own (a procfs made for the bench, whose
`self/mountinfo` lists --mounts ext4 mounts, or one, at directories under a
temporary folder: `statvfs` answers for any directory). The difference of the
two processes' CPU over the window (utime + stime from /proc/<pid>/stat,
which counts threads that have ended too), divided by the extra mounts, is one
mount's cost a tick.

Usage: bench/agent/filesystem_mounts_cpu.py [--mounts 40] [--seconds 60] [--warmup 5]
                                            [--vtax target/release/vtax]
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
COLLECTORS = ["host", "cgroups", "perf", "infiniband", "platform", "gpu", "jitter",
              "block", "netdev", "filesystem", "scrape"]


def make_procfs(root, mounts):
    """A procfs holding only `self/mountinfo`, listing `mounts` ext4 mounts
    at directories made under `root`."""
    procfs = os.path.join(root, "proc")
    os.makedirs(os.path.join(procfs, "self"))
    lines = []
    for n in range(mounts):
        point = os.path.join(root, f"mnt{n}")
        os.makedirs(point)
        lines.append(f"{100 + n} 1 259:{n} / {point} rw,relatime shared:{n} - ext4 "
                     f"/dev/nvme{n}n1 rw\n")
    with open(os.path.join(procfs, "self", "mountinfo"), "w") as f:
        f.writelines(lines)
    return procfs


def start(vtax, root, name, mounts):
    work = os.path.join(root, name)
    procfs = make_procfs(work, mounts)
    off = [f"--no-collector.{c}" for c in COLLECTORS if c != "filesystem"]
    proc, _ = bench.start_vtax_run(
        vtax, ["--data-dir", os.path.join(work, "data"), "--path.procfs", procfs, *off])
    return proc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mounts", type=int, default=40)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--vtax", default=os.path.join(REPO, "target/release/vtax"))
    args = parser.parse_args()
    if args.mounts < 2:
        sys.exit("--mounts: at least 2")
    with tempfile.TemporaryDirectory(prefix="vtax-mounts-bench-") as root:
        agents = {"many": start(args.vtax, root, "many", args.mounts),
                  "one": start(args.vtax, root, "one", 1)}
        try:
            time.sleep(args.warmup)
            t0 = time.monotonic()
            c0 = {n: bench.cpu_seconds(p.pid) for n, p in agents.items()}
            time.sleep(args.seconds)
            elapsed = time.monotonic() - t0
            c1 = {n: bench.cpu_seconds(p.pid) for n, p in agents.items()}
        finally:
            for p in agents.values():
                p.send_signal(signal.SIGTERM)
            for p in agents.values():
                p.wait(timeout=30)
    ms = {n: 1000 * (c1[n] - c0[n]) / elapsed for n in agents}
    per_mount_us = 1000 * (ms["many"] - ms["one"]) / (args.mounts - 1)
    print(f"window {elapsed:.0f} s, the filesystem collector alone at 1 s")
    print(f"{args.mounts} mounts: {ms['many']:.2f} ms of CPU a second; 1 mount: {ms['one']:.2f}")
    print(f"each mount: {per_mount_us:.1f} us of CPU a tick")


if __name__ == "__main__":
    main()
