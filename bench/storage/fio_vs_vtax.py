#!/usr/bin/env python3
"""Checkpoint write throughput: vtax's `block` collector against fio's own figure.

fio (Debian's package) writes a checkpoint-sized file with direct I/O, in 4 MiB
blocks, to the disk under test while vtax runs beside it with only the `block`
collector, every 100 ms. fio's window is taken from its own bandwidth log
(Unix epoch milliseconds, one entry per 100 ms): from the first entry's start
to the last entry. vtax's write throughput over that window is the change of
`written_bytes` between its first and last rows inside the window, over the
time between them, read back from vtax's Parquet store with `vtax query`
(the rows' own timestamps, not a scraper's). The bar: within 5% of fio's
`bw_bytes` (io_bytes over fio's runtime).

Usage: bench/storage/fio_vs_vtax.py [--size 4G] [--dir /var/tmp/vtax-fio]
           [--vtax target/release/vtax] [--runs 3]
Needs: fio (apt-get install -y fio); a disk-backed --dir (not tmpfs).
"""
import argparse
import csv
import glob
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def disk_of(path):
    """The whole-disk name (vda, nvme0n1) holding `path`, from /sys/dev/block."""
    st = os.stat(path)
    sys_dir = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if os.path.exists(os.path.join(sys_dir, "partition")):
        sys_dir = os.path.dirname(sys_dir)
    return os.path.basename(sys_dir)


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def run_once(args, device, work):
    data = os.path.join(work, "data")
    config = os.path.join(work, "vtax.toml")
    with open(config, "w") as f:
        f.write("[collectors.block]\ninterval_secs = 0.1\n")
    port = free_port()
    others = ["host", "cgroups", "infiniband", "platform", "netdev", "filesystem"]
    agent = subprocess.Popen(
        [args.vtax, "run", "--config", config, "--data-dir", data,
         "--web.listen-address", f"127.0.0.1:{port}"]
        + [f"--no-collector.{c}" for c in others],
        stderr=subprocess.DEVNULL,
    )
    try:
        series = f'vtax_block_written_bytes_total{{device="{device}"}}'
        deadline = time.time() + 30
        while True:
            try:
                if series in scrape(port):
                    break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit(f"vtax never showed {series}")
            time.sleep(0.2)
        time.sleep(0.5)
        target = os.path.join(args.dir, "checkpoint.bin")
        log_prefix = os.path.join(work, "fio")
        out = subprocess.run(
            ["fio", "--name=checkpoint", f"--filename={target}", "--rw=write", "--bs=4M",
             f"--size={args.size}", "--direct=1", "--ioengine=libaio", "--iodepth=8",
             "--end_fsync=1", f"--write_bw_log={log_prefix}", "--log_avg_msec=100",
             "--log_unix_epoch=1", "--output-format=json"],
            check=True, capture_output=True, text=True,
        ).stdout
        time.sleep(0.5)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
    os.unlink(target)
    job = json.loads(out[out.index("{"):])["jobs"][0]
    fio_bw = job["write"]["bw_bytes"]
    (log,) = glob.glob(log_prefix + "_bw*.log")
    stamps = [int(row[0]) for row in csv.reader(open(log)) if row]
    window = ((stamps[0] - 100) / 1000.0, stamps[-1] / 1000.0)

    rows = subprocess.run(
        [args.vtax, "query", "block", "--data-dir", data, "--where", f"device={device}",
         "--fields", "written_bytes", "--format", "csv"],
        check=True, capture_output=True, text=True,
    ).stdout
    points = []
    for row in csv.DictReader(io.StringIO(rows)):
        t = datetime.fromisoformat(row["time"].replace("Z", "+00:00")).timestamp()
        points.append((t, int(row["written_bytes"])))
    inside = [p for p in points if window[0] <= p[0] <= window[1]]
    if len(inside) < 2:
        sys.exit(f"fewer than two vtax rows in fio's window {window}: {len(inside)}")
    (t0, b0), (t1, b1) = inside[0], inside[-1]
    vtax_bw = (b1 - b0) / (t1 - t0)
    return {
        "fio_bw": fio_bw,
        "fio_io_bytes": job["write"]["io_bytes"],
        "fio_runtime_s": job["write"]["runtime"] / 1000.0,
        "vtax_bw": vtax_bw,
        "vtax_rows": len(inside),
        "vtax_span_s": t1 - t0,
        "diff": vtax_bw / fio_bw - 1.0,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="4G")
    parser.add_argument("--dir", default="/var/tmp/vtax-fio")
    parser.add_argument("--vtax", default=os.path.join(REPO, "target/release/vtax"))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not shutil.which("fio"):
        sys.exit("fio is not installed: apt-get install -y fio")
    os.makedirs(args.dir, exist_ok=True)
    device = disk_of(args.dir)
    print(f"fio {args.size} direct 4 MiB sequential writes to {args.dir} on {device}; "
          f"vtax block collector every 100 ms")
    print("| run | fio bw (MB/s) | vtax bw (MB/s) | difference | fio runtime | vtax rows in window |")
    print("|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as work:
            r = run_once(args, device, work)
        worst = max(worst, abs(r["diff"]))
        print(f"| {run} | {r['fio_bw'] / 1e6:.1f} | {r['vtax_bw'] / 1e6:.1f} | "
              f"{r['diff'] * 100:+.2f}% | {r['fio_runtime_s']:.2f} s | {r['vtax_rows']} |")
    verdict = "met" if worst <= 0.05 else "NOT met"
    print(f"worst difference {worst * 100:.2f}%: bar (within 5%) {verdict}")
    sys.exit(0 if worst <= 0.05 else 1)


if __name__ == "__main__":
    main()
