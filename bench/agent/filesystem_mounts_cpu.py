#!/usr/bin/env python3
"""What each mount costs the `filesystem` collector, a second.

A Kubernetes GPU node mounts a volume per pod, so the collector may stat
dozens of mounts every second, each on a thread that a hung network mount
cannot hold up. Two agents run side by side, only the `filesystem` collector
on, each reading a mount table of its own (a procfs made for the bench, whose
`self/mountinfo` lists --mounts ext4 mounts, or one, at directories under a
temporary folder: `statvfs` answers for any directory). The difference of the
two processes' CPU over their lives (the rusage of each once it has ended:
every thread that ran, in microseconds; start-up is the same for both),
divided by the extra mounts and the seconds, is one mount's cost a tick.
Several --vtax binaries run side by side, two agents each, in one window.

Usage: bench/agent/filesystem_mounts_cpu.py [--mounts 40] [--seconds 120]
                                            [--vtax BIN [--vtax BIN ...]]
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
    off = bench.only_collector("filesystem")
    proc, _ = bench.start_vtax_run(
        vtax, ["--data-dir", os.path.join(work, "data"), "--path.procfs", procfs, *off])
    return proc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mounts", type=int, default=40)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--vtax", action="append",
                        help="a vtax binary; repeat to run several side by side "
                             "(default target/release/vtax)")
    args = parser.parse_args()
    binaries = args.vtax or [os.path.join(REPO, "target/release/vtax")]
    if args.mounts < 2:
        sys.exit("--mounts: at least 2")
    runs = [(b, n, mounts) for b, binary in enumerate(binaries)
            for n, mounts in (("many", args.mounts), ("one", 1))]
    with tempfile.TemporaryDirectory(prefix="vtax-mounts-bench-") as root:
        t0 = time.monotonic()
        agents = {(b, n): start(binaries[b], root, f"{b}-{n}", mounts) for b, n, mounts in runs}
        time.sleep(args.seconds)
        for p in agents.values():
            p.send_signal(signal.SIGTERM)
        # Each agent's CPU over its whole life, every thread that ever ran
        # counted, in microseconds: the rusage of the child once reaped.
        cpu = {}
        for key, p in agents.items():
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            cpu[key] = usage.ru_utime + usage.ru_stime
        elapsed = time.monotonic() - t0
    print(f"{elapsed:.0f} s of each agent's life, the filesystem collector alone at 1 s: "
          f"{args.mounts} mounts beside 1")
    for b, binary in enumerate(binaries):
        many, one = cpu[b, "many"], cpu[b, "one"]
        per_mount_us = 1e6 * (many - one) / (args.mounts - 1) / elapsed
        print(f"{binary}: the agent {1000 * many / elapsed:.2f} ms of CPU a second with "
              f"{args.mounts} mounts, {1000 * one / elapsed:.2f} with 1; "
              f"each mount {per_mount_us:.1f} us a tick")


if __name__ == "__main__":
    main()
