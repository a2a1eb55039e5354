#!/usr/bin/env python3
"""The agent's resident peak around a day merge, split by mapping: a quick A/B.

cpu_vs_node_exporter.py --seed-day measures the bar (7 minutes, the merge 5 minutes
in). This runs the same configuration (host, 50 cgroups, 8 InfiniBand ports at 1 s,
scraped once a second) with `store.compact_interval_secs` set by --compact-secs, so
the seeded day merges that many seconds in, and polls /proc every 20 ms. At each new
peak it reads /proc/<pid>/smaps, and prints the resident split (anonymous against
file-backed, and the largest mappings) before the merge, at the peak and at the end.
For comparing builds or allocator settings, not for the bar's figures: a peak seen
30 s in misses the rows an agent buffers in its first minutes.

    sudo bench/agent/day_merge_peak.py [--vtax target/release/vtax] [--compact-secs 30]
        [--env MALLOC_MMAP_THRESHOLD_=131072 ...] [--wrap "valgrind --tool=callgrind"]

--wrap runs the agent under another program (hot_text_profile.py profiles it so);
the memory figures are then that program's.

It also prints the longest pause of the agent's main loop: the largest gap between
rows of the `store` table, which the loop writes every second.

The seeded day is written once into --seed-cache (the agent's ignored seed test) and
copied for each run. Needs root (cgroups).
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_vs_node_exporter as bench  # noqa: E402

REPO = bench.REPO


def rss_by_mapping(pid):
    """Resident KiB per mapping: file mappings by file name, the rest by kind."""
    parts = {}
    name = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split(None, 5)
            if "-" in fields[0] and not fields[0].endswith(":"):
                name = fields[5].strip() if len(fields) > 5 else "[anon]"
                if name.startswith("/"):
                    name = os.path.basename(name)
            elif fields[0] == "Rss:":
                parts[name] = parts.get(name, 0) + int(fields[1])
    return parts


def longest_store_row_gap(vtax, data):
    """The longest time between two rows of the `store` table, which the main
    loop writes once a second: how long the loop stalled. Returns (seconds,
    how long before the last row the gap ended)."""
    out = subprocess.run([vtax, "query", "--data-dir", data, "--format", "json", "store"],
                         check=True, capture_output=True, text=True).stdout
    times = sorted(datetime.fromisoformat(json.loads(line)["time"].replace("Z", "+00:00"))
                   .timestamp() for line in out.splitlines())
    gaps = [(b - a, times[-1] - b) for a, b in zip(times, times[1:])]
    return max(gaps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vtax", default=os.path.join(REPO, "target/release/vtax"))
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the agent")
    parser.add_argument("--compact-secs", type=int, default=30)
    parser.add_argument("--after-secs", type=int, default=15, help="how long to run once the day merged")
    parser.add_argument("--keep-store", action="store_true",
                        help="keep the agent's store (350 MB) in the work dir")
    parser.add_argument("--wrap", default="", help="a command line to run the agent under")
    parser.add_argument("--seed-cache", default=os.path.join(tempfile.gettempdir(), "vtax-seeded-day"))
    args = parser.parse_args()
    seeding = not os.path.isdir(args.seed_cache)
    vtax_binary = bench.frozen_copy(args.vtax, seeding)
    work = tempfile.mkdtemp(prefix="vtax-merge-peak-")
    data = os.path.join(work, "data")
    bench.clean_up_at_exit(data, vtax_binary, args.vtax, args.keep_store)
    if seeding:
        bench.seed_day(args.seed_cache)
    shutil.copytree(args.seed_cache, data)
    sysfs = bench.bench_sysfs("/dev/shm")
    cgroups, jobs = bench.make_cgroups("vtax-merge-peak")
    tasks = bench.populate(jobs, 10)
    config = bench.write_bar_config(work, "vtax-merge-peak",
                                    f"[store]\ncompact_interval_secs = {args.compact_secs}\n")
    env = dict(os.environ)
    for assignment in args.env:
        key, _, value = assignment.partition("=")
        env[key] = value
    port = bench.free_port()
    started = time.monotonic()
    vtax = subprocess.Popen(
        args.wrap.split() + [vtax_binary, "run", "--config", config, "--data-dir", data,
         "--web.listen-address", f"127.0.0.1:{port}", "--path.sysfs", sysfs],
        stderr=open(os.path.join(work, "vtax.log"), "w"), env=env)
    stop = threading.Event()

    def scrape_every_second():
        time.sleep(2)
        while not stop.wait(1):
            try:
                bench.scrape(port)
            except OSError:
                pass  # not listening yet

    threading.Thread(target=scrape_every_second, daemon=True).start()
    seeded_day = bench.seeded_day_dir(data)
    keys = ("VmRSS", "RssAnon", "RssFile")
    before = peak = None
    merged_at = None
    try:
        while True:
            time.sleep(0.02)
            elapsed = time.monotonic() - started
            now = bench.memory_kib(vtax.pid, keys)
            if peak is None or now["VmRSS"] > peak["VmRSS"]:
                peak = dict(now, at=elapsed, parts=rss_by_mapping(vtax.pid))
            if before is None and elapsed > args.compact_secs - 3:
                before = dict(now, at=elapsed, parts=rss_by_mapping(vtax.pid))
            if merged_at is None and len(glob.glob(os.path.join(seeded_day, "*.parquet"))) == 1:
                merged_at = elapsed
            if merged_at is not None and elapsed > merged_at + args.after_secs:
                break
            if elapsed > args.compact_secs + 600:
                sys.exit(f"the seeded day did not merge; see {work}/vtax.log")
        end = dict(bench.memory_kib(vtax.pid, keys), at=time.monotonic() - started,
                   parts=rss_by_mapping(vtax.pid))
        cpu = bench.cpu_seconds(vtax.pid)
    finally:
        stop.set()
        vtax.send_signal(signal.SIGTERM)
        vtax.wait(timeout=30)
        bench.tear_down(tasks, sysfs, cgroups)
    print(f"vtax={args.vtax} env={args.env} day merged {merged_at:.0f} s in; cpu_s={cpu:.2f}")
    gap, at = longest_store_row_gap(vtax_binary, data)
    print(f"main loop: longest gap between the store table's rows {gap:.2f} s "
          f"(ending {at:.0f} s before the last row; the rows are due every second)")
    for label, sample in (("before merge", before), ("peak", peak), ("end", end)):
        largest = sorted(sample["parts"].items(), key=lambda kv: -kv[1])[:6]
        print(f"{label:12s} {sample['at']:5.1f}s  {sample['VmRSS'] / 1024:.1f} MiB = anonymous "
              f"{sample['RssAnon'] / 1024:.1f} + file-backed {sample['RssFile'] / 1024:.1f} | "
              + ", ".join(f"{name} {kib / 1024:.1f}" for name, kib in largest))
    print(f"work dir (logs): {work}")


if __name__ == "__main__":
    main()
