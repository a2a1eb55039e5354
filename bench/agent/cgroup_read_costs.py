#!/usr/bin/env python3
"""What one read of each file the cgroups collector reads costs, on this kernel.

Makes a cgroup `vtax-read-cost` in every hierarchy there is (v2, or the v1
cpu, cpuacct, memory and unified ones), puts one sleeping task in it, and
times --reads `pread`s at offset 0 of each file through one descriptor, as
the collector reads them. The figure includes Python's own cost per call; the
`lseek` line is that floor (a syscall that formats nothing). Removes the
cgroup at the end.

Usage: sudo python3 bench/agent/cgroup_read_costs.py [--reads 20000]
"""
import argparse
import os
import subprocess
import time

NAME = "vtax-read-cost"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reads", type=int, default=20000)
    args = parser.parse_args()
    unified = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    if unified:
        dirs = {"": f"/sys/fs/cgroup/{NAME}"}
        files = ["cpu.stat", "memory.current", "memory.stat", "memory.events",
                 "cpu.pressure", "memory.pressure", "io.pressure"]
        where = {f: "" for f in files}
    else:
        dirs = {h: f"/sys/fs/cgroup/{h}/{NAME}" for h in ("cpu", "cpuacct", "memory", "unified")
                if os.path.isdir(f"/sys/fs/cgroup/{h}")}
        where = {"cpuacct.usage": "cpuacct", "cpuacct.stat": "cpuacct", "cpu.stat": "cpu",
                 "memory.usage_in_bytes": "memory", "memory.stat": "memory",
                 "memory.oom_control": "memory", "memory.kmem.usage_in_bytes": "memory",
                 "cpu.pressure": "unified", "memory.pressure": "unified", "io.pressure": "unified"}
    sleeper = subprocess.Popen(["sleep", "infinity"])
    try:
        for d in dirs.values():
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(sleeper.pid))
        print(f"{'file':<30} {'us/read':>8} {'bytes':>6}   ({args.reads} reads each)")
        for name, hierarchy in where.items():
            if hierarchy not in dirs:
                continue
            try:
                fd = os.open(os.path.join(dirs[hierarchy], name), os.O_RDONLY)
            except OSError as e:
                print(f"{name:<30} {e}")
                continue
            start = time.process_time_ns()
            for _ in range(args.reads):
                os.pread(fd, 8192, 0)
            us = (time.process_time_ns() - start) / args.reads / 1000
            print(f"{name:<30} {us:>8.2f} {len(os.pread(fd, 8192, 0)):>6}")
            os.close(fd)
        fd = os.open("/proc/loadavg", os.O_RDONLY)
        start = time.process_time_ns()
        for _ in range(args.reads):
            os.lseek(fd, 0, os.SEEK_SET)
        print(f"{'lseek (the floor)':<30} {(time.process_time_ns() - start) / args.reads / 1000:>8.2f}")
        os.close(fd)
    finally:
        sleeper.kill()
        sleeper.wait()
        for d in dirs.values():
            try:
                os.rmdir(d)
            except OSError:
                pass


if __name__ == "__main__":
    main()
